//! `spoold queue set QUEUE key=value…`: changes only the settings named,
//! as an RFC 7396 merge patch (`PATCH /v1/queues/{q}`), and prints the
//! queue as it is then. The patch is JSON of the operator's making, so it
//! is built as a `Value`.

use std::io::Write;

use reqwest::Method;
use serde_json::{Map, Value};

use super::client::{OpsError, Target};
use super::queues;
use crate::cli::term::Terminal;

/// `spoold queue set QUEUE key=value…`: changes only those settings (a
/// merge patch) and prints the queue as it is now; with `keep_secrets`, a
/// destination moved to another origin keeps the signing secret.
pub async fn queue_set(
    target: &Target,
    queue: &str,
    pairs: &[String],
    (json, keep_secrets): (bool, bool),
    out: &mut Terminal<impl Write>,
) -> Result<(), OpsError> {
    let patch = settings_patch(pairs)?;
    let path = match keep_secrets {
        true => format!("/v1/queues/{queue}?keepSecrets=true"),
        false => format!("/v1/queues/{queue}"),
    };
    let request = target
        .request(Method::PATCH, &path)
        .header("Content-Type", "application/merge-patch+json")
        .body(patch.to_string());
    let answer: Value = target.answer(request).await?;
    queues::show(target, answer, json, out)
}

/// The merge patch that `key=value` arguments mean: dotted keys nest
/// (`backoff.maxSeconds=60`, `headers.X-Token=t`), snake_case keys are
/// taken as the config file spells them (`breaker_failures`), `null`
/// resets, and a value is JSON when it parses as a number, a boolean or
/// a list (`permanentFailureStatuses=[400,410]`) or an object
/// (`filter={"payload": {"amount": [{"numeric": [">", 0]}]}}`), else a
/// string. Header values and the signing secret are always strings.
pub fn settings_patch(pairs: &[String]) -> Result<Value, OpsError> {
    let mut patch = Map::new();
    for pair in pairs {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(OpsError::Usage(format!(
                "{pair:?} is not key=value (e.g. breakerFailures=1000)"
            )));
        };
        let path: Vec<String> = match key.split_once('.') {
            Some(("headers", name)) => vec!["headers".into(), name.to_string()],
            _ => key.split('.').map(camel_case).collect(),
        };
        if path.iter().any(String::is_empty) {
            return Err(OpsError::Usage(format!("{key:?} is not a setting")));
        }
        let textual = path[0] == "headers" || path[0] == "signingSecret";
        let mut at = &mut patch;
        for step in &path[..path.len() - 1] {
            let next = at
                .entry(step.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            at = next
                .as_object_mut()
                .ok_or_else(|| OpsError::Usage(format!("{key:?} sets a value twice")))?;
        }
        at.insert(path[path.len() - 1].clone(), setting_value(value, textual));
    }
    Ok(Value::Object(patch))
}

/// A setting's value: `null` resets it; else JSON when it parses as a
/// number, a boolean, a list or an object, and a string otherwise
/// (always a string when `textual`).
fn setting_value(value: &str, textual: bool) -> Value {
    match value {
        "null" => Value::Null,
        v if textual => Value::String(v.to_string()),
        v => match serde_json::from_str::<Value>(v) {
            Ok(
                parsed @ (Value::Number(_) | Value::Bool(_) | Value::Array(_) | Value::Object(_)),
            ) => parsed,
            _ => Value::String(v.to_string()),
        },
    }
}

/// `breaker_failures` → `breakerFailures`; camelCase stays.
fn camel_case(key: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in key.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_value_pairs_become_a_merge_patch() {
        let pairs: Vec<String> = [
            "breaker_failures=1000",
            "backoff.maxSeconds=60",
            "destination=https://h.example.com/x",
            "headers.X-Token=123",
            "rateLimit=null",
            "permanentFailureStatuses=[400,410]",
            r#"filter={"payload": {"amount": [{"numeric": [">", 0]}]}}"#,
        ]
        .map(String::from)
        .to_vec();
        let patch = settings_patch(&pairs).unwrap();
        assert_eq!(
            patch,
            serde_json::json!({
                "breakerFailures": 1000,
                "backoff": {"maxSeconds": 60},
                "destination": "https://h.example.com/x",
                "headers": {"X-Token": "123"},
                "rateLimit": null,
                "permanentFailureStatuses": [400, 410],
                "filter": {"payload": {"amount": [{"numeric": [">", 0]}]}},
            })
        );
        assert!(settings_patch(&["nothing".to_string()]).is_err());
    }
}
