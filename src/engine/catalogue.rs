//! The event catalogue (docs/contract.md §4, "Event types"): each type's
//! description, an example and an optional JSON Schema. Entries are
//! journaled (`Command::EventType`), so that every replica holds the same
//! catalogue and it survives restarts. A client's event whose type has a
//! schema is refused at publish when its payload does not match, naming
//! where ([`Engine::check_schema`]).
//!
//! Bounds: [`EVENT_TYPES_MAX`] entries of at most
//! [`DEFINITION_MAX_BYTES`] each, so the catalogue stays small beside the
//! queues. A schema may not fetch anything: references outside it fail to
//! compile (the `jsonschema` crate is built without its HTTP resolver).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Engine;
use super::error::EventError;
use crate::spool::Command;
use crate::spool::event::event_type_problem;

/// Most entries the catalogue holds.
pub(crate) const EVENT_TYPES_MAX: usize = 1000;
/// Largest definition (description, example and schema, as JSON).
pub(crate) const DEFINITION_MAX_BYTES: usize = 64 << 10;

/// One entry: what an event of the type means, and what it looks like.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventTypeDef {
    #[serde(default)]
    pub description: String,
    /// A JSON Schema every published payload of the type must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    pub schema: Option<Value>,
    /// A payload of the type (the portal shows it and sends it as a test).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<serde_json::Value>)]
    pub example: Option<Value>,
}

/// Why a catalogue change is refused.
#[derive(Debug, thiserror::Error)]
pub enum CatalogueError {
    #[error("{0}")]
    Invalid(String),
    #[error("the event catalogue holds {EVENT_TYPES_MAX} types, its most: delete one first")]
    Full,
    #[error("no event type {0}")]
    NotFound(String),
    #[error(transparent)]
    Write(#[from] super::WriteError),
}

impl EventTypeDef {
    /// Checks a definition for `name`: the name, the size, a schema that
    /// compiles and an example that matches it. Its stored bytes.
    fn checked(&self, name: &str) -> Result<Vec<u8>, CatalogueError> {
        if let Some(why) = event_type_problem(name) {
            return Err(CatalogueError::Invalid(format!("name: {why}")));
        }
        let bytes = serde_json::to_vec(self).expect("a definition serializes");
        if bytes.len() > DEFINITION_MAX_BYTES {
            return Err(CatalogueError::Invalid(format!(
                "the definition is {} bytes, more than {DEFINITION_MAX_BYTES}",
                bytes.len()
            )));
        }
        if let Some(schema) = &self.schema {
            let validator = jsonschema::validator_for(schema)
                .map_err(|e| CatalogueError::Invalid(format!("schema: {e}")))?;
            if let Some(example) = &self.example
                && let Err(e) = validator.validate(example)
            {
                return Err(CatalogueError::Invalid(format!(
                    "example does not match the schema at {:?}: {e}",
                    e.instance_path().as_str()
                )));
            }
        }
        Ok(bytes)
    }
}

fn parse(bytes: &[u8]) -> Option<EventTypeDef> {
    serde_json::from_slice(bytes).ok()
}

/// Validators by the definition they were compiled from.
type Compiled = HashMap<Arc<[u8]>, Arc<jsonschema::Validator>>;

/// Compiled schemas by definition, shared by every engine of the process:
/// a schema is compiled once, not at every publish.
fn compiled(definition: &Arc<[u8]>) -> Option<Arc<jsonschema::Validator>> {
    static CACHE: OnceLock<Mutex<Compiled>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().expect("schema cache poisoned").get(definition) {
        return Some(v.clone());
    }
    // Stored definitions compiled when they were put; one that no longer
    // does (a later build's stricter reading) checks nothing.
    let schema = parse(definition)?.schema?;
    let validator = Arc::new(jsonschema::validator_for(&schema).ok()?);
    let mut cache = cache.lock().expect("schema cache poisoned");
    if cache.len() >= 2 * EVENT_TYPES_MAX {
        cache.clear();
    }
    cache.insert(definition.clone(), validator.clone());
    Some(validator)
}

impl Engine {
    /// The catalogue, by name.
    pub fn event_types(&self) -> Vec<(String, EventTypeDef)> {
        let types: Vec<(String, Arc<[u8]>)> = self
            .core()
            .spool
            .event_types()
            .iter()
            .map(|(n, d)| (n.clone(), d.clone()))
            .collect();
        types
            .into_iter()
            .filter_map(|(name, d)| Some((name, parse(&d)?)))
            .collect()
    }

    /// How many types the catalogue holds.
    pub fn event_type_count(&self) -> usize {
        self.core().spool.event_types().len()
    }

    pub fn event_type(&self, name: &str) -> Option<EventTypeDef> {
        let definition = self.core().spool.event_types().get(name).cloned()?;
        parse(&definition)
    }

    /// Sets `name`'s entry, durably; `true` if it is new.
    pub async fn put_event_type(
        &self,
        name: &str,
        def: &EventTypeDef,
    ) -> Result<bool, CatalogueError> {
        let bytes = def.checked(name)?;
        let mut created = false;
        self.write_done(|core, _| {
            let types = core.spool.event_types();
            created = !types.contains_key(name);
            if created && types.len() >= EVENT_TYPES_MAX {
                return Err(CatalogueError::Full);
            }
            Ok(Command::EventType {
                name: name.to_owned().into(),
                definition: bytes.into(),
            })
        })
        .await?;
        Ok(created)
    }

    /// Removes `name`'s entry, durably.
    pub async fn delete_event_type(&self, name: &str) -> Result<(), CatalogueError> {
        self.write_done(|core, _| {
            if !core.spool.event_types().contains_key(name) {
                return Err(CatalogueError::NotFound(name.to_owned()));
            }
            Ok(Command::EventType {
                name: name.to_owned().into(),
                definition: Vec::new().into(),
            })
        })
        .await?;
        Ok(())
    }

    /// Checks a client's payload: not empty, and taken by its type's schema
    /// if the catalogue has one (JSON, else `SchemaMismatch`, naming where:
    /// a JSON pointer into it).
    pub(crate) fn check_payload(
        &self,
        event_type: &str,
        content_type: &str,
        payload: &[u8],
    ) -> Result<(), EventError> {
        let invalid = |problem: String| EventError::Invalid {
            field: "payload",
            problem,
        };
        if payload.is_empty() {
            return Err(invalid("is empty: an event carries a payload".into()));
        }
        let media = content_type.split(';').next().unwrap_or("").trim();
        let is_json = media.eq_ignore_ascii_case("application/json") || media.ends_with("+json");
        let definition = self.core().spool.event_types().get(event_type).cloned();
        // A raw body that says JSON without a schema to match is checked
        // where it arrives (`api/events.rs`): a JSON event's payload was
        // parsed there already, and is not parsed again here.
        let Some(validator) = definition.as_ref().and_then(compiled) else {
            return Ok(());
        };
        let mismatch = |path: &str, reason: String| EventError::SchemaMismatch {
            event_type: event_type.to_owned(),
            path: path.to_owned(),
            reason,
        };
        if !is_json {
            return Err(mismatch(
                "",
                format!("the payload is {content_type:?}, not JSON"),
            ));
        }
        let value: Value = serde_json::from_slice(payload)
            .map_err(|e| invalid(format!("Content-Type says JSON, but it is not: {e}")))?;
        match validator.validate(&value) {
            Ok(()) => Ok(()),
            Err(e) => Err(mismatch(e.instance_path().as_str(), e.to_string())),
        }
    }
}
