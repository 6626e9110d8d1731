//! Search terms on what a message carries (docs/contract.md §4
//! "Search"): its event's type and tenant, a substring of its body, and
//! JSON-path equality on a JSON body. Peek (messages, dead letters) and
//! history apply them to each message's stored record, a bounded number of
//! records per page.

use serde_json::Value;

use super::command::Payload;

/// Most messages one page of a search reads.
pub const SEARCH_SCAN_MAX: usize = 10_000;

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

impl Search {
    pub fn is_empty(&self) -> bool {
        self == &Search::default()
    }

    /// Whether `payload` holds every term.
    pub fn matches(&self, payload: &Payload) -> bool {
        let tag = payload.event.as_ref();
        if let Some(t) = &self.event_type
            && tag.is_none_or(|e| &e.event_type != t)
        {
            return false;
        }
        if let Some(t) = &self.tenant
            && tag.is_none_or(|e| e.tenant.as_ref() != Some(t))
        {
            return false;
        }
        if let Some(needle) = &self.contains
            && !payload
                .body
                .windows(needle.len().max(1))
                .any(|w| w == needle.as_bytes())
        {
            return false;
        }
        if let Some((path, expected)) = &self.json_path {
            let Ok(doc) = serde_json::from_slice::<Value>(&payload.body) else {
                return false;
            };
            let found = path.iter().try_fold(&doc, |v, step| match step {
                PathStep::Member(name) => v.get(name),
                PathStep::Index(i) => v.get(i),
            });
            if found != Some(expected) {
                return false;
            }
        }
        true
    }

    /// Parses `match=PATH=VALUE`: a path of dotted members and `[n]`
    /// indexes (`$.customer.id`, `items[0].sku`, the `$.` optional) and a
    /// value compared as JSON (`42`, `true`, `"x"`), or as a string when it
    /// is not JSON.
    pub fn parse_match(text: &str) -> Result<(Vec<PathStep>, Value), String> {
        let (path, value) = text
            .split_once('=')
            .ok_or("a JSON path, `=`, and a value: $.customer.id=42")?;
        let path = path.strip_prefix("$.").unwrap_or(path).trim();
        let path = path.strip_prefix('$').unwrap_or(path);
        if path.is_empty() {
            return Err("the path is empty".into());
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
                return Err(format!("an empty member in {path:?}"));
            }
            while let Some(inner) = rest.strip_prefix('[') {
                let end = inner
                    .find(']')
                    .ok_or_else(|| format!("an unclosed [ in {path:?}"))?;
                let index = inner[..end]
                    .parse()
                    .map_err(|_| format!("{:?} is not an array index", &inner[..end]))?;
                steps.push(PathStep::Index(index));
                rest = &inner[end + 1..];
            }
            if !rest.is_empty() {
                return Err(format!("{rest:?} after an index in {path:?}"));
            }
        }
        let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
        Ok((steps, value))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

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
}
