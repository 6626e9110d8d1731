//! A stored message as an answer shows it: read back (payload, attempts)
//! and rendered, and the bound of an answer that lists such messages
//! (peek, search, history, a tail's first lines).

use serde_json::Value;

use super::{AppState, view};
use crate::engine::{Engine, MessageError};
use crate::spool::Payload;

/// Most bytes of rendered messages in one peek (and in a tail's first
/// `last`): past it the page ends (with at least one message) and `next`
/// continues it. A body's bytes may render up to six times larger in
/// JSON (`\u0000`), so memory is bounded by this, not by `limit`.
pub(super) const ANSWER_BYTES_MAX: usize = 4 << 20;

/// Renders a message with its payload, as peek, get and tail show it.
pub(super) fn render_stored(
    state: &AppState,
    engine: &Engine,
    queue: &str,
    v: &crate::spool::MessageView,
    payload: Option<Payload>,
) -> Result<Value, MessageError> {
    let payload = match payload {
        Some(p) => p,
        None => engine.payload(queue, v.id)?,
    };
    let attempts = engine.attempts(queue, v.id).unwrap_or_default();
    let rendered = view::render(
        engine.tokens(),
        queue,
        v,
        &payload,
        &attempts,
        &state.config.redact_headers,
    );
    // Strings, numbers and string-keyed maps only: this cannot fail.
    Ok(serde_json::to_value(rendered).expect("bug: a message does not render as JSON"))
}
