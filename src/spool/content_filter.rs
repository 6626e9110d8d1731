//! Content filters on subscriptions: which of the events a queue's
//! patterns take it keeps, by the event's JSON payload and headers
//! (docs/contract.md §4 "Content filters").
//!
//! The syntax is Amazon SNS's filter policies, which many teams already
//! write: a filter is `{"payload": POLICY, "headers": POLICY}` (either
//! may be left out), and a policy is a JSON object whose keys name keys
//! of the payload (of its headers: lower-case names), each holding either
//! a nested policy (for a nested object) or a list of conditions, any of
//! which may hold:
//!
//! - `"text"`, `12.5`, `true`, `null`: the value equals it (numbers as
//!   numbers: `5` equals `5.0`);
//! - `{"prefix": "a"}`, `{"suffix": "z"}`, `{"equals-ignore-case": "Ab"}`;
//! - `{"anything-but": [values]}` (or one value, or `{"prefix": "a"}`):
//!   the key is there and its value is none of them;
//! - `{"numeric": [">", 0, "<=", 100]}`: a number within every bound
//!   (`=`, `<`, `<=`, `>`, `>=`);
//! - `{"exists": true}` / `{"exists": false}`: the key is there, or not.
//!
//! Every key of a policy must hold (AND); `"$or": [POLICY, …]` holds when
//! one of its policies does. A value that is an array holds a condition
//! when one of its elements does (`exists` asks about the key itself). A
//! nested policy over a missing key is asked of an empty object, so
//! `{"a": {"b": [{"exists": false}]}}` holds when `a` is missing.
//!
//! Bounds, checked when the setting is written (a `400` names the part):
//! [`FILTER_BYTES_MAX`] of JSON, [`FILTER_DEPTH_MAX`] levels of nesting,
//! [`FILTER_CONDITIONS_MAX`] conditions in all (each value of an
//! `anything-but` list counts). So a filter costs at most its conditions
//! times the elements of the values it reads, once per candidate queue
//! per published event.

use serde_json::{Map, Value};

/// Most bytes of a filter's JSON.
pub(crate) const FILTER_BYTES_MAX: usize = 16 << 10;
/// Most levels of nested policies (and `$or`s) below the top.
pub(crate) const FILTER_DEPTH_MAX: usize = 8;
/// Most conditions of one filter, all its policies counted.
pub(crate) const FILTER_CONDITIONS_MAX: usize = 150;
/// Largest payload a filter reads: a bigger one is not parsed, and passes
/// no filter on the payload (parsing happens while the fan-out holds the
/// spool's lock).
pub(crate) const FILTER_PAYLOAD_BYTES_MAX: usize = 1 << 20;

/// A subscription's content filter, checked and compiled. Written and
/// read as its JSON (a queue setting, `queue_upsert` records): reading
/// one checks it again, so a filter the bounds refuse is refused wherever
/// it comes from (a config file, the API).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "Value", into = "Value")]
pub struct ContentFilter {
    /// As it was written (compact JSON): what is journaled and shown.
    source: Value,
    payload: Option<Policy>,
    headers: Option<Policy>,
}

/// Why a filter was refused: where (`payload.amount[0].numeric`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter{at}: {why}")]
pub struct FilterError {
    /// The path of the bad part (empty: the whole filter), each step with
    /// its leading `.` or `[n]`.
    pub at: String,
    pub why: String,
}

/// One policy object: every key's test holds, and each `$or` holds.
#[derive(Debug, Clone, PartialEq)]
struct Policy {
    keys: Vec<(String, Test)>,
    ors: Vec<Vec<Policy>>,
}

#[derive(Debug, Clone, PartialEq)]
enum Test {
    Nested(Policy),
    AnyOf(Vec<Condition>),
}

#[derive(Debug, Clone, PartialEq)]
enum Condition {
    Equals(Scalar),
    Prefix(String),
    Suffix(String),
    EqualsIgnoreCase(String),
    AnythingBut(Vec<Scalar>),
    AnythingButPrefix(String),
    Numeric(Vec<(Bound, f64)>),
    Exists(bool),
}

#[derive(Debug, Clone, PartialEq)]
enum Scalar {
    Text(String),
    Number(f64),
    Bool(bool),
    Null,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Scalar {
    fn of(value: &Value) -> Option<Scalar> {
        Some(match value {
            Value::String(s) => Scalar::Text(s.clone()),
            Value::Number(n) => Scalar::Number(n.as_f64()?),
            Value::Bool(b) => Scalar::Bool(*b),
            Value::Null => Scalar::Null,
            Value::Array(_) | Value::Object(_) => return None,
        })
    }

    fn matches(&self, value: &Value) -> bool {
        match (self, value) {
            (Scalar::Text(a), Value::String(b)) => a == b,
            (Scalar::Number(a), Value::Number(b)) => b.as_f64() == Some(*a),
            (Scalar::Bool(a), Value::Bool(b)) => a == b,
            (Scalar::Null, Value::Null) => true,
            _ => false,
        }
    }
}

impl Bound {
    fn holds(self, value: f64, bound: f64) -> bool {
        match self {
            Bound::Eq => value == bound,
            Bound::Lt => value < bound,
            Bound::Le => value <= bound,
            Bound::Gt => value > bound,
            Bound::Ge => value >= bound,
        }
    }
}

/// Checks a filter as it is parsed: the path so far, the conditions
/// counted.
struct Checker {
    conditions: usize,
}

fn refuse<T>(at: &str, why: impl Into<String>) -> Result<T, FilterError> {
    Err(FilterError {
        at: at.to_owned(),
        why: why.into(),
    })
}

impl Checker {
    fn count(&mut self, at: &str, n: usize) -> Result<(), FilterError> {
        self.conditions += n;
        if self.conditions > FILTER_CONDITIONS_MAX {
            return refuse(
                at,
                format!("more than {FILTER_CONDITIONS_MAX} conditions in the filter"),
            );
        }
        Ok(())
    }

    fn policy(&mut self, value: &Value, at: &str, depth: usize) -> Result<Policy, FilterError> {
        let Value::Object(object) = value else {
            return refuse(at, "a policy must be an object");
        };
        if depth > FILTER_DEPTH_MAX {
            return refuse(at, format!("nested deeper than {FILTER_DEPTH_MAX} levels"));
        }
        if object.is_empty() {
            return refuse(at, "a policy must name at least one key");
        }
        let mut policy = Policy {
            keys: Vec::new(),
            ors: Vec::new(),
        };
        for (key, test) in object {
            let here = format!("{at}.{key}");
            if key == "$or" {
                let Value::Array(choices) = test else {
                    return refuse(&here, "`$or` takes a list of policies");
                };
                if choices.len() < 2 {
                    return refuse(&here, "`$or` takes at least two policies");
                }
                let choices = choices
                    .iter()
                    .enumerate()
                    .map(|(i, c)| self.policy(c, &format!("{here}[{i}]"), depth + 1))
                    .collect::<Result<_, _>>()?;
                policy.ors.push(choices);
                continue;
            }
            let test = match test {
                Value::Object(_) => Test::Nested(self.policy(test, &here, depth + 1)?),
                Value::Array(conditions) => {
                    if conditions.is_empty() {
                        return refuse(&here, "a list of conditions must hold at least one");
                    }
                    let conditions = conditions
                        .iter()
                        .enumerate()
                        .map(|(i, c)| self.condition(c, &format!("{here}[{i}]")))
                        .collect::<Result<_, _>>()?;
                    Test::AnyOf(conditions)
                }
                _ => {
                    return refuse(&here, "a key takes a list of conditions or a nested policy");
                }
            };
            policy.keys.push((key.clone(), test));
        }
        Ok(policy)
    }

    fn condition(&mut self, value: &Value, at: &str) -> Result<Condition, FilterError> {
        if let Some(scalar) = Scalar::of(value) {
            self.count(at, 1)?;
            return Ok(Condition::Equals(scalar));
        }
        let Value::Object(object) = value else {
            return refuse(at, "a condition is a value or an object with one operator");
        };
        let mut operators = object.iter();
        let (Some((operator, operand)), None) = (operators.next(), operators.next()) else {
            return refuse(at, "a condition object names exactly one operator");
        };
        let here = format!("{at}.{operator}");
        let text = |operand: &Value| match operand {
            Value::String(s) => Ok(s.clone()),
            _ => refuse(&here, format!("`{operator}` takes a string")),
        };
        let condition = match operator.as_str() {
            "prefix" => Condition::Prefix(text(operand)?),
            "suffix" => Condition::Suffix(text(operand)?),
            "equals-ignore-case" => Condition::EqualsIgnoreCase(text(operand)?.to_lowercase()),
            "exists" => match operand {
                Value::Bool(b) => Condition::Exists(*b),
                _ => return refuse(&here, "`exists` takes true or false"),
            },
            "numeric" => Condition::Numeric(numeric(operand, &here)?),
            "anything-but" => match operand {
                Value::Object(inner) => match (inner.len(), inner.get("prefix")) {
                    (1, Some(Value::String(p))) => Condition::AnythingButPrefix(p.clone()),
                    _ => {
                        return refuse(
                            &here,
                            "`anything-but` takes values, or {\"prefix\": \"…\"}",
                        );
                    }
                },
                Value::Array(values) => {
                    if values.is_empty() {
                        return refuse(&here, "`anything-but` takes at least one value");
                    }
                    let scalars = values
                        .iter()
                        .enumerate()
                        .map(|(i, v)| {
                            Scalar::of(v).ok_or_else(|| FilterError {
                                at: format!("{here}[{i}]"),
                                why: "`anything-but` takes values, not lists or objects".into(),
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    self.count(&here, scalars.len())?;
                    return Ok(Condition::AnythingBut(scalars));
                }
                scalar => Condition::AnythingBut(vec![
                    Scalar::of(scalar).expect("not an array or an object"),
                ]),
            },
            other => return refuse(&here, format!("unknown operator {other:?}")),
        };
        self.count(at, 1)?;
        Ok(condition)
    }
}

/// `[">", 0, "<=", 100]`: one or two bounds.
fn numeric(operand: &Value, at: &str) -> Result<Vec<(Bound, f64)>, FilterError> {
    let Value::Array(items) = operand else {
        return refuse(at, "`numeric` takes [operator, number, …]");
    };
    if items.is_empty() || items.len() % 2 != 0 || items.len() > 4 {
        return refuse(at, "`numeric` takes one or two [operator, number] pairs");
    }
    items
        .chunks(2)
        .map(|pair| {
            let bound = match pair[0].as_str() {
                Some("=") => Bound::Eq,
                Some("<") => Bound::Lt,
                Some("<=") => Bound::Le,
                Some(">") => Bound::Gt,
                Some(">=") => Bound::Ge,
                _ => return refuse(at, format!("{} is not =, <, <=, > or >=", pair[0])),
            };
            match pair[1].as_f64() {
                Some(n) if n.is_finite() => Ok((bound, n)),
                _ => refuse(at, format!("{} is not a number", pair[1])),
            }
        })
        .collect()
}

impl TryFrom<Value> for ContentFilter {
    type Error = FilterError;

    fn try_from(value: Value) -> Result<ContentFilter, FilterError> {
        ContentFilter::parse(&value)
    }
}

impl From<ContentFilter> for Value {
    fn from(filter: ContentFilter) -> Value {
        filter.source
    }
}

impl ContentFilter {
    /// Whether it reads the payload (which must then be parsed).
    pub(crate) fn reads_payload(&self) -> bool {
        self.payload.is_some()
    }

    /// Checks and compiles a filter: `{"payload": …, "headers": …}`.
    pub(crate) fn parse(value: &Value) -> Result<ContentFilter, FilterError> {
        let bytes = serde_json::to_vec(value).map_or(usize::MAX, |v| v.len());
        if bytes > FILTER_BYTES_MAX {
            return refuse("", format!("{bytes} bytes: at most {FILTER_BYTES_MAX}"));
        }
        let Value::Object(parts) = value else {
            return refuse(
                "",
                "a filter is an object: {\"payload\": …, \"headers\": …}",
            );
        };
        if parts.is_empty() {
            return refuse("", "a filter names \"payload\", \"headers\" or both");
        }
        let mut checker = Checker { conditions: 0 };
        let mut filter = ContentFilter {
            source: value.clone(),
            payload: None,
            headers: None,
        };
        for (part, policy) in parts {
            let at = format!(".{part}");
            let policy = checker.policy(policy, &at, 0)?;
            match part.as_str() {
                "payload" => filter.payload = Some(policy),
                "headers" => filter.headers = Some(policy),
                _ => return refuse(&at, "a filter has only \"payload\" and \"headers\""),
            }
        }
        Ok(filter)
    }

    /// The filter as it was written.
    pub(crate) fn source(&self) -> &Value {
        &self.source
    }

    /// Whether an event with `payload` (`None`: not JSON, or past the
    /// parse bound) and `headers` (lower-case names) passes. A filter on
    /// the payload never passes an event whose payload is not a JSON
    /// object.
    pub(crate) fn matches(&self, payload: Option<&Value>, headers: &Map<String, Value>) -> bool {
        let payload_ok = match (&self.payload, payload) {
            (None, _) => true,
            (Some(policy), Some(Value::Object(object))) => policy.matches(object),
            (Some(_), _) => false,
        };
        payload_ok
            && self
                .headers
                .as_ref()
                .is_none_or(|policy| policy.matches(headers))
    }
}

impl Policy {
    fn matches(&self, object: &Map<String, Value>) -> bool {
        self.keys
            .iter()
            .all(|(key, test)| test.matches(object.get(key)))
            && self
                .ors
                .iter()
                .all(|choices| choices.iter().any(|p| p.matches(object)))
    }
}

impl Test {
    fn matches(&self, value: Option<&Value>) -> bool {
        match self {
            Test::Nested(policy) => match value {
                Some(Value::Object(inner)) => policy.matches(inner),
                Some(Value::Array(items)) => items
                    .iter()
                    .any(|item| matches!(item, Value::Object(inner) if policy.matches(inner))),
                Some(_) => false,
                None => policy.matches(&Map::new()),
            },
            Test::AnyOf(conditions) => conditions.iter().any(|c| c.matches(value)),
        }
    }
}

impl Condition {
    fn matches(&self, value: Option<&Value>) -> bool {
        match (self, value) {
            (Condition::Exists(wanted), _) => *wanted == value.is_some(),
            (_, None) => false,
            (_, Some(Value::Array(items))) => items.iter().any(|item| self.holds(item)),
            (_, Some(item)) => self.holds(item),
        }
    }

    /// Whether one (non-array) value holds it.
    fn holds(&self, value: &Value) -> bool {
        let text = value.as_str();
        match self {
            Condition::Equals(scalar) => scalar.matches(value),
            Condition::Prefix(p) => text.is_some_and(|t| t.starts_with(p.as_str())),
            Condition::Suffix(s) => text.is_some_and(|t| t.ends_with(s.as_str())),
            Condition::EqualsIgnoreCase(lower) => text.is_some_and(|t| t.to_lowercase() == *lower),
            Condition::AnythingBut(values) => !values.iter().any(|v| v.matches(value)),
            Condition::AnythingButPrefix(p) => text.is_some_and(|t| !t.starts_with(p.as_str())),
            Condition::Numeric(bounds) => value
                .as_f64()
                .is_some_and(|n| bounds.iter().all(|(b, bound)| b.holds(n, *bound))),
            Condition::Exists(_) => unreachable!("answered by `matches`"),
        }
    }
}

#[cfg(test)]
mod tests;
