//! The evaluator against a plain reference that reads the policy's JSON
//! as it comes (no compiling), on generated filters and payloads; and the
//! errors and bounds of parsing.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use super::*;

/// The reference: the filter's JSON, interpreted where it stands.
fn reference(filter: &Value, payload: Option<&Value>, headers: &Map<String, Value>) -> bool {
    filter.as_object().unwrap().iter().all(|(part, policy)| {
        let document = match part.as_str() {
            "payload" => match payload {
                Some(Value::Object(o)) => o,
                _ => return false,
            },
            _ => headers,
        };
        reference_policy(policy, document)
    })
}

fn reference_policy(policy: &Value, document: &Map<String, Value>) -> bool {
    policy.as_object().unwrap().iter().all(|(key, test)| {
        if key == "$or" {
            return test
                .as_array()
                .unwrap()
                .iter()
                .any(|p| reference_policy(p, document));
        }
        let value = document.get(key);
        match test {
            Value::Object(_) => match value {
                Some(Value::Object(inner)) => reference_policy(test, inner),
                Some(Value::Array(items)) => items
                    .iter()
                    .filter_map(Value::as_object)
                    .any(|inner| reference_policy(test, inner)),
                Some(_) => false,
                None => reference_policy(test, &Map::new()),
            },
            conditions => conditions
                .as_array()
                .unwrap()
                .iter()
                .any(|c| reference_condition(c, value)),
        }
    })
}

fn reference_condition(condition: &Value, value: Option<&Value>) -> bool {
    if let Some(wanted) = condition.get("exists") {
        return wanted.as_bool().unwrap() == value.is_some();
    }
    let Some(value) = value else {
        return false;
    };
    let items: Vec<&Value> = match value {
        Value::Array(items) => items.iter().collect(),
        one => vec![one],
    };
    items
        .into_iter()
        .any(|item| reference_holds(condition, item))
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::Array(_) | Value::Object(_), _) => false,
        _ => a == b,
    }
}

fn reference_holds(condition: &Value, item: &Value) -> bool {
    let Value::Object(operator) = condition else {
        return same(condition, item);
    };
    let (name, arg) = operator.iter().next().unwrap();
    let text = item.as_str();
    let arg_text = arg.as_str().unwrap_or_default();
    match name.as_str() {
        "prefix" => text.is_some_and(|t| t.starts_with(arg_text)),
        "suffix" => text.is_some_and(|t| t.ends_with(arg_text)),
        "equals-ignore-case" => text.is_some_and(|t| t.to_lowercase() == arg_text.to_lowercase()),
        "anything-but" => match arg {
            Value::Array(values) => values.iter().all(|v| !same(v, item)),
            Value::Object(p) => text.is_some_and(|t| !t.starts_with(p["prefix"].as_str().unwrap())),
            one => !same(one, item),
        },
        "numeric" => item.as_f64().is_some_and(|n| {
            arg.as_array().unwrap().chunks(2).all(|pair| {
                let bound = pair[1].as_f64().unwrap();
                match pair[0].as_str().unwrap() {
                    "=" => n == bound,
                    "<" => n < bound,
                    "<=" => n <= bound,
                    ">" => n > bound,
                    _ => n >= bound,
                }
            })
        }),
        _ => unreachable!("generated operators only"),
    }
}

/// Scalars from a small universe, so that filters and payloads meet.
fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        prop::sample::select(vec!["x", "xy", "Xy", "yx", "y", ""]).prop_map(|s| json!(s)),
        (-3i64..4).prop_map(|n| json!(n)),
        prop::sample::select(vec![0.5f64, 2.0, -1.5]).prop_map(|n| json!(n)),
        any::<bool>().prop_map(|b| json!(b)),
        Just(Value::Null),
    ]
}

fn condition() -> impl Strategy<Value = Value> {
    let op = || prop::sample::select(vec!["=", "<", "<=", ">", ">="]);
    let text = || prop::sample::select(vec!["x", "X", "xy", "y", ""]);
    prop_oneof![
        scalar(),
        text().prop_map(|t| json!({"prefix": t})),
        text().prop_map(|t| json!({"suffix": t})),
        text().prop_map(|t| json!({"equals-ignore-case": t})),
        prop::collection::vec(scalar(), 1..3).prop_map(|v| json!({"anything-but": v})),
        scalar().prop_map(|v| json!({"anything-but": v})),
        text().prop_map(|t| json!({"anything-but": {"prefix": t}})),
        (op(), -3i64..4).prop_map(|(o, n)| json!({"numeric": [o, n]})),
        (op(), -3i64..4, op(), -3i64..4).prop_map(|(o, n, p, m)| json!({"numeric": [o, n, p, m]})),
        any::<bool>().prop_map(|b| json!({"exists": b})),
    ]
}

fn keys() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "c"]).prop_map(str::to_owned)
}

fn policy() -> impl Strategy<Value = Value> {
    let leaf = prop::collection::btree_map(keys(), prop::collection::vec(condition(), 1..3), 1..3)
        .prop_map(|m| json!(m));
    leaf.prop_recursive(3, 24, 3, |inner| {
        (
            prop::collection::btree_map(
                keys(),
                prop_oneof![
                    prop::collection::vec(condition(), 1..3).prop_map(Value::from),
                    inner.clone(),
                ],
                1..3,
            ),
            prop::option::of(prop::collection::vec(inner, 2..3)),
        )
            .prop_map(|(mut keys, or)| {
                if let Some(or) = or {
                    keys.insert("$or".into(), Value::from(or));
                }
                json!(keys)
            })
    })
}

fn document() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        scalar(),
        prop::collection::vec(scalar(), 0..3).prop_map(Value::from)
    ];
    leaf.prop_recursive(3, 16, 3, |inner| {
        prop_oneof![
            prop::collection::btree_map(keys(), inner.clone(), 0..3).prop_map(|m| json!(m)),
            prop::collection::vec(
                prop::collection::btree_map(keys(), inner, 0..3).prop_map(|m| json!(m)),
                0..3
            )
            .prop_map(Value::from),
        ]
    })
}

fn object() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(keys(), document(), 0..4)
        .prop_map(|m| m.into_iter().collect::<Map<String, Value>>())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn the_evaluator_agrees_with_the_reference(
        payload_policy in prop::option::of(policy()),
        headers_policy in prop::option::of(policy()),
        payload in prop_oneof![
            4 => object().prop_map(|o| Some(Value::Object(o))),
            1 => scalar().prop_map(Some),
            1 => Just(None),
        ],
        headers in object(),
    ) {
        let mut parts = Map::new();
        if let Some(p) = payload_policy {
            parts.insert("payload".into(), p);
        }
        if let Some(h) = headers_policy {
            parts.insert("headers".into(), h);
        }
        prop_assume!(!parts.is_empty());
        let source = Value::Object(parts);
        let Ok(filter) = ContentFilter::parse(&source) else {
            // Past a bound (conditions): refused, never evaluated.
            return Ok(());
        };
        prop_assert_eq!(
            filter.matches(payload.as_ref(), &headers),
            reference(&source, payload.as_ref(), &headers),
            "filter {} on payload {:?}, headers {:?}", source, payload, headers
        );
        prop_assert_eq!(filter.source(), &source);
    }
}

fn parse(v: Value) -> Result<ContentFilter, FilterError> {
    ContentFilter::parse(&v)
}

#[test]
fn the_examples_of_the_contract_pass_what_they_say() {
    let f = parse(json!({
        "payload": {
            "store": ["example_corp"],
            "price_usd": [{"numeric": [">=", 100, "<", 500]}],
            "customer": {"tier": [{"anything-but": ["free"]}]},
            "$or": [{"region": [{"prefix": "eu-"}]}, {"priority": [{"exists": true}]}]
        },
        "headers": {"x-source": ["checkout", "billing"]}
    }))
    .unwrap();
    let headers: Map<String, Value> = json!({"x-source": "billing"}).as_object().unwrap().clone();
    let good = json!({"store": "example_corp", "price_usd": 120,
                      "customer": {"tier": "pro"}, "region": "eu-west-1"});
    assert!(f.matches(Some(&good), &headers));
    let mut cheap = good.clone();
    cheap["price_usd"] = json!(99.5);
    assert!(!f.matches(Some(&cheap), &headers));
    let mut free = good.clone();
    free["customer"]["tier"] = json!("free");
    assert!(!f.matches(Some(&free), &headers));
    let mut us = good.clone();
    us["region"] = json!("us-east-1");
    assert!(!f.matches(Some(&us), &headers));
    us["priority"] = json!(1);
    assert!(f.matches(Some(&us), &headers), "the other branch of $or");
    assert!(
        !f.matches(Some(&good), &Map::new()),
        "the header is missing"
    );
    assert!(!f.matches(None, &headers), "not JSON");
}

#[test]
fn a_bad_filter_is_refused_naming_its_part() {
    let cases = [
        (json!([]), "", "a filter is an object"),
        (json!({}), "", "names \"payload\""),
        (
            json!({"body": {"a": [1]}}),
            ".body",
            "only \"payload\" and \"headers\"",
        ),
        (
            json!({"payload": {"a": 1}}),
            ".payload.a",
            "list of conditions or a nested policy",
        ),
        (json!({"payload": {"a": []}}), ".payload.a", "at least one"),
        (
            json!({"payload": {"a": [{"numeric": [">", "x"]}]}}),
            ".payload.a[0].numeric",
            "not a number",
        ),
        (
            json!({"payload": {"a": [{"numeric": ["~", 1]}]}}),
            ".payload.a[0].numeric",
            "is not =, <",
        ),
        (
            json!({"payload": {"a": [{"numeric": [">", 1, "<"]}]}}),
            ".payload.a[0].numeric",
            "pairs",
        ),
        (
            json!({"payload": {"a": [{"regex": ".*"}]}}),
            ".payload.a[0].regex",
            "unknown operator",
        ),
        (
            json!({"payload": {"a": [{"prefix": 1}]}}),
            ".payload.a[0].prefix",
            "takes a string",
        ),
        (
            json!({"payload": {"a": [{"exists": 1}]}}),
            ".payload.a[0].exists",
            "true or false",
        ),
        (
            json!({"payload": {"a": [{"prefix": "x", "suffix": "y"}]}}),
            ".payload.a[0]",
            "exactly one operator",
        ),
        (
            json!({"payload": {"a": [{"anything-but": [[1]]}]}}),
            ".payload.a[0].anything-but[0]",
            "not lists",
        ),
        (
            json!({"payload": {"$or": [{"a": [1]}]}}),
            ".payload.$or",
            "at least two",
        ),
        (
            json!({"headers": {"$or": [{"a": [1]}, 3]}}),
            ".headers.$or[1]",
            "must be an object",
        ),
    ];
    for (filter, at, why) in cases {
        let e = parse(filter.clone()).unwrap_err();
        assert_eq!(e.at, at, "{filter}: {e}");
        assert!(e.why.contains(why), "{filter}: {e}");
    }
}

#[test]
fn every_bound_is_checked_when_the_filter_is_written() {
    let mut deep = json!({"a": [1]});
    for _ in 0..FILTER_DEPTH_MAX {
        deep = json!({ "a": deep });
    }
    assert!(parse(json!({"payload": deep.clone()})).is_ok());
    let deeper = json!({"payload": {"a": deep}});
    let e = parse(deeper).unwrap_err();
    assert!(e.why.contains("nested deeper"), "{e}");

    let many: Vec<Value> = (0..FILTER_CONDITIONS_MAX).map(|n| json!(n)).collect();
    assert!(parse(json!({"payload": {"a": many.clone()}})).is_ok());
    let e = parse(json!({"payload": {"a": many, "b": [{"anything-but": [1]}]}})).unwrap_err();
    assert_eq!(e.at, ".payload.b[0].anything-but");
    assert!(e.why.contains("more than 150 conditions"), "{e}");

    let long = "x".repeat(FILTER_BYTES_MAX);
    let e = parse(json!({"payload": {"a": [long]}})).unwrap_err();
    assert!(e.why.contains("at most 16384"), "{e}");
}
