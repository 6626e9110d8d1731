//! How many spoold deliveries a message came through: `Spooler-Hops`.
//!
//! A push delivery says how many spoold deliveries its message came
//! through, one more than the message arrived with (`delivery/send.rs`). A
//! send, forward or event that arrives with that header stores its count
//! (`Payload::hops`), so that a delivery that comes back into spoold, by
//! whatever path no address check sees (a load balancer, another node's
//! public URL), counts up, and past [`HOPS_MAX`] it is refused with `508
//! loop_detected`: two push queues at each other's `/v1/events` turned
//! one event into 116 155 in 17 s; now into at most [`HOPS_MAX`] rounds.

use axum::http::{HeaderMap, StatusCode};

use super::error::ApiError;
use crate::metrics::{Limit, limit_reached};

/// The header.
pub(crate) const SPOOLER_HOPS: &str = "spooler-hops";
pub(crate) use crate::spool::command::HOPS_MAX;

/// The hop count a request carries (0 without the header); `508
/// loop_detected` past [`HOPS_MAX`], `400` when it is not a count.
pub(crate) fn incoming_hops(headers: &HeaderMap) -> Result<u8, ApiError> {
    let Some(value) = headers.get(SPOOLER_HOPS) else {
        return Ok(0);
    };
    let hops = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .ok_or_else(|| ApiError::bad_request("Spooler-Hops: a count of spoold deliveries"))?;
    if hops > u64::from(HOPS_MAX) {
        limit_reached(Limit::Hops);
        return Err(ApiError::new(
            StatusCode::LOOP_DETECTED,
            "loop_detected",
            format!(
                "this request came through {hops} spoold deliveries (Spooler-Hops), more than \
                 {HOPS_MAX}: a push queue delivers into spoold in a loop"
            ),
        ));
    }
    Ok(hops as u8)
}
