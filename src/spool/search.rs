//! Search terms on what a message carries (docs/contract.md §4
//! "Search"): its event's type and tenant, a substring of its body, and
//! JSON-path equality on a JSON body. Peek (messages, dead letters) and
//! history apply them to each message's stored record; what one page may
//! cost (records, bytes, time) is the API's budget (`api/search.rs`).
//!
//! Each term costs at most linear time in the body: the substring test is
//! `memchr::memmem` (a needle of at most [`CONTAINS_BYTES_MAX`]), and a
//! JSON path is followed through borrowed raw values, only in bodies of
//! at most [`MATCH_BODY_BYTES_MAX`].

use memchr::memmem;
use serde_json::Value;
use serde_json::value::RawValue;

use super::command::Payload;

/// Most messages one page of a search reads.
pub const SEARCH_SCAN_MAX: usize = 10_000;
/// The longest `contains` text: a search term, not a document.
pub const CONTAINS_BYTES_MAX: usize = 1024;
/// Most steps of a `match` path.
pub const MATCH_PATH_STEPS_MAX: usize = 32;
/// The largest body a `match` parses as JSON; a larger one is not
/// searched by it (a page counts such bodies in `unsearched`).
pub const MATCH_BODY_BYTES_MAX: usize = 1 << 20;

/// What a search selects; every term must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Search {
    pub event_type: Option<String>,
    pub tenant: Option<String>,
    /// Bytes the body contains.
    pub contains: Option<String>,
    /// A JSON body whose value at the path equals this value.
    pub json_path: Option<(Vec<PathStep>, Value)>,
}

/// One step of a JSON path: a member or an array index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathStep {
    Member(String),
    Index(usize),
}

/// How a payload fares against a search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Match,
    NoMatch,
    /// The body is larger than [`MATCH_BODY_BYTES_MAX`] and a `match` term
    /// would have to parse it: not searched.
    TooLarge,
}

impl Search {
    pub fn is_empty(&self) -> bool {
        self == &Search::default()
    }

    /// Whether `payload` holds every term.
    pub fn matches(&self, payload: &Payload) -> bool {
        self.judge(payload) == Verdict::Match
    }

    /// Whether `payload` holds every term, or could not be searched.
    pub fn judge(&self, payload: &Payload) -> Verdict {
        let tag = payload.event.as_ref();
        if let Some(t) = &self.event_type
            && tag.is_none_or(|e| &e.event_type != t)
        {
            return Verdict::NoMatch;
        }
        if let Some(t) = &self.tenant
            && tag.is_none_or(|e| e.tenant.as_ref() != Some(t))
        {
            return Verdict::NoMatch;
        }
        if let Some(needle) = &self.contains
            && memmem::find(&payload.body, needle.as_bytes()).is_none()
        {
            return Verdict::NoMatch;
        }
        if let Some((path, expected)) = &self.json_path {
            if payload.body.len() > MATCH_BODY_BYTES_MAX {
                return Verdict::TooLarge;
            }
            if value_at(&payload.body, path).as_ref() != Some(expected) {
                return Verdict::NoMatch;
            }
        }
        Verdict::Match
    }

    /// Parses `match=PATH=VALUE`: a path of dotted members and `[n]`
    /// indexes (`$.customer.id`, `items[0].sku`, the `$.` optional) and a
    /// value compared as JSON (`42`, `true`, `"x"`), or as a string when it
    /// is not JSON.
    pub fn parse_match(text: &str) -> Result<(Vec<PathStep>, Value), MatchError> {
        let (path, value) = text.split_once('=').ok_or(MatchError::NoValue)?;
        let path = path.strip_prefix("$.").unwrap_or(path).trim();
        let path = path.strip_prefix('$').unwrap_or(path);
        if path.is_empty() {
            return Err(MatchError::EmptyPath);
        }
        let mut steps = Vec::new();
        for part in path.split('.') {
            let (name, mut rest) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            if !name.is_empty() {
                steps.push(PathStep::Member(name.to_owned()));
            } else if rest.is_empty() {
                return Err(MatchError::EmptyMember { path: path.into() });
            }
            while let Some(inner) = rest.strip_prefix('[') {
                let end = inner
                    .find(']')
                    .ok_or_else(|| MatchError::Unclosed { path: path.into() })?;
                let index = inner[..end].parse().map_err(|_| MatchError::NotAnIndex {
                    index: inner[..end].into(),
                })?;
                steps.push(PathStep::Index(index));
                rest = &inner[end + 1..];
            }
            if !rest.is_empty() {
                return Err(MatchError::AfterIndex {
                    rest: rest.into(),
                    path: path.into(),
                });
            }
        }
        if steps.len() > MATCH_PATH_STEPS_MAX {
            return Err(MatchError::TooLong { steps: steps.len() });
        }
        let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
        Ok((steps, value))
    }
}

/// Why a `match` term is not `PATH=VALUE` (`path` as written, without
/// its `$.`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatchError {
    #[error("a JSON path, `=`, and a value: $.customer.id=42")]
    NoValue,
    #[error("the path is empty")]
    EmptyPath,
    /// Two dots in a row, or one at an end.
    #[error("an empty member in {path:?}")]
    EmptyMember { path: String },
    #[error("an unclosed [ in {path:?}")]
    Unclosed { path: String },
    #[error("{index:?} is not an array index")]
    NotAnIndex { index: String },
    #[error("{rest:?} after an index in {path:?}")]
    AfterIndex { rest: String, path: String },
    /// Over [`MATCH_PATH_STEPS_MAX`] steps.
    #[error("a path of {steps} steps: at most {MATCH_PATH_STEPS_MAX}")]
    TooLong { steps: usize },
}

/// The value at `path` in the JSON document `body`, if it is one. Each
/// step scans only the raw text of the value it stands on and borrows the
/// next one from it: nothing but the value found is built.
fn value_at(body: &[u8], path: &[PathStep]) -> Option<Value> {
    let mut at: &RawValue = serde_json::from_slice(body).ok()?;
    for step in path {
        let mut de = serde_json::Deserializer::from_str(at.get());
        at = match step {
            PathStep::Member(name) => {
                serde::de::DeserializeSeed::deserialize(Member(name), &mut de)
            }
            PathStep::Index(i) => serde::de::DeserializeSeed::deserialize(Item(*i), &mut de),
        }
        .ok()??;
    }
    serde_json::from_str(at.get()).ok()
}

/// Finds member `.0` of an object, left raw (the last of a repeated name
/// wins, as `serde_json::Value` has it); `None` if there is none.
struct Member<'n>(&'n str);

impl<'de> serde::de::DeserializeSeed<'de> for Member<'_> {
    type Value = Option<&'de RawValue>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Member<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(wanted) = map.next_key_seed(KeyIs(self.0))? {
            let value: &'de RawValue = map.next_value()?;
            if wanted {
                found = Some(value);
            }
        }
        Ok(found)
    }
}

/// Whether an object's key is `.0`, told without copying the key.
struct KeyIs<'n>(&'n str);

impl<'de> serde::de::DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl serde::de::Visitor<'_> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == self.0)
    }
}

/// Finds item `.0` of an array, left raw; `None` if there is none.
struct Item(usize);

impl<'de> serde::de::DeserializeSeed<'de> for Item {
    type Value = Option<&'de RawValue>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Item {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        let mut i = 0;
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            if i == self.0 {
                found = Some(item);
            }
            i += 1;
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::spool::command::{EventTag, MessageId};

    fn payload(body: &str, event: Option<(&str, Option<&str>)>) -> Payload {
        Payload {
            content_type: "application/json".into(),
            request: None,
            event: event.map(|(t, tenant)| EventTag {
                id: MessageId(1),
                event_type: t.into(),
                tenant: tenant.map(Into::into),
            }),
            resent_from: None,
            trace: None,
            hops: 0,
            ordering_key: None,
            body: Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    #[test]
    fn every_term_must_hold() {
        let p = payload(
            r#"{"customer": {"id": 42}, "items": [{"sku": "A-1"}], "note": "late"}"#,
            Some(("invoice.paid", Some("cus_42"))),
        );
        let search = |s: Search| s.matches(&p);
        assert!(search(Search::default()));
        let by_type = Search {
            event_type: Some("invoice.paid".into()),
            ..Search::default()
        };
        assert!(search(by_type.clone()));
        assert!(!search(Search {
            event_type: Some("invoice.sent".into()),
            ..Search::default()
        }));
        assert!(search(Search {
            tenant: Some("cus_42".into()),
            contains: Some("late".into()),
            ..by_type.clone()
        }));
        assert!(!search(Search {
            contains: Some("early".into()),
            ..Search::default()
        }));
        for (text, hit) in [
            ("$.customer.id=42", true),
            ("customer.id=42", true),
            ("$.customer.id=\"42\"", false),
            ("$.items[0].sku=A-1", true),
            ("$.items[1].sku=A-1", false),
            ("$.note=late", true),
        ] {
            let json_path = Some(Search::parse_match(text).unwrap());
            let s = Search {
                json_path,
                ..Search::default()
            };
            assert_eq!(search(s), hit, "{text}");
        }
        for bad in ["no-equals", "=1", "$.a[x]=1", "$.a[0=1", "a..b=1"] {
            assert!(Search::parse_match(bad).is_err(), "{bad}");
        }
        // Not an event: no type or tenant matches; not JSON: no path does.
        let plain = payload("late", None);
        assert!(!by_type.matches(&plain));
        let path = Search {
            json_path: Some(Search::parse_match("a=1").unwrap()),
            ..Search::default()
        };
        assert!(!path.matches(&plain));
    }

    /// The reference: the whole document parsed, the path walked on it.
    fn reference(body: &[u8], path: &[PathStep]) -> Option<Value> {
        let doc: Value = serde_json::from_slice(body).ok()?;
        path.iter()
            .try_fold(&doc, |v, step| match step {
                PathStep::Member(name) => v.get(name),
                PathStep::Index(i) => v.get(i),
            })
            .cloned()
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-c\\\\\"é]{0,4}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c\\\\\"é]{0,2}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn path() -> impl Strategy<Value = Vec<PathStep>> {
        prop::collection::vec(
            prop_oneof![
                "[a-c\\\\\"é]{0,2}".prop_map(PathStep::Member),
                (0usize..4).prop_map(PathStep::Index),
            ],
            0..4,
        )
    }

    proptest! {
        /// The borrowed walk finds exactly what the whole parse finds, on
        /// any document (keys with escapes included) and any path, and on
        /// bytes that are not JSON.
        #[test]
        fn the_raw_walk_agrees_with_the_whole_parse(doc in json(), path in path(), cut in any::<prop::sample::Index>()) {
            let body = serde_json::to_vec(&doc).unwrap();
            prop_assert_eq!(value_at(&body, &path), reference(&body, &path));
            let torn = &body[..cut.index(body.len() + 1)];
            prop_assert_eq!(value_at(torn, &path), reference(torn, &path));
        }
    }

    #[test]
    fn a_repeated_member_is_the_last_one_as_in_a_whole_parse() {
        let body = br#"{"a": 1, "b": {"c": [true]}, "a": 2, "d\u0041": 3}"#;
        for path in [
            vec![PathStep::Member("a".into())],
            vec![PathStep::Member("dA".into())],
            vec![
                PathStep::Member("b".into()),
                PathStep::Member("c".into()),
                PathStep::Index(0),
            ],
        ] {
            assert_eq!(value_at(body, &path), reference(body, &path), "{path:?}");
        }
        assert_eq!(
            value_at(body, &[PathStep::Member("a".into())]),
            Some(Value::from(2))
        );
    }

    #[test]
    fn a_match_on_a_body_past_its_bound_is_not_searched() {
        let big = format!("{{\"a\": \"{}\"}}", "x".repeat(MATCH_BODY_BYTES_MAX));
        let s = Search {
            json_path: Some(Search::parse_match("a=1").unwrap()),
            ..Search::default()
        };
        assert_eq!(s.judge(&payload(&big, None)), Verdict::TooLarge);
        assert_eq!(s.judge(&payload("{\"a\": 1}", None)), Verdict::Match);
        let deep = vec!["x"; MATCH_PATH_STEPS_MAX + 1].join(".");
        assert!(Search::parse_match(&format!("{deep}=1")).is_err());
    }
}
