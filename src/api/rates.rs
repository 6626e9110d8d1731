//! `GET /v1/rates` and `GET /v1/queues/{q}/rates`: messages enqueued,
//! delivered, retried and failed per second over the last hour, in total
//! and per queue, as the console's dashboard charts them
//! (`src/engine/rates.rs` keeps them).

use std::sync::Arc;

use axum::extract::{Path, State};
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::error::ApiError;
use super::openapi::{QueuePath, Refused};
use crate::engine::rates::{RateSeries, SERIES};
use crate::time::format_rfc3339;

/// Counts per bucket, oldest first; a bucket is `[enqueued, delivered,
/// retried, failed]` (the order of `series`).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Buckets {
    /// Seconds a bucket covers.
    step_seconds: u32,
    /// When the last bucket began (RFC 3339, UTC).
    last_start: String,
    counts: Vec<[u32; 4]>,
}

/// What the dashboard charts.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RatesBody {
    /// The queue, or absent for every queue together.
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<String>,
    /// The queue is past the first 1 000 with counts of their own: these
    /// are the sum of all such queues.
    pooled: bool,
    /// What each bucket's four numbers count.
    series: [&'static str; 4],
    /// The last five minutes, second by second.
    seconds: Buckets,
    /// The last hour, minute by minute (the current minute so far).
    minutes: Buckets,
}

impl RatesBody {
    fn new(queue: Option<String>, pooled: bool, s: RateSeries) -> RatesBody {
        let minute = s.now.div_euclid(60) * 60;
        RatesBody {
            queue,
            pooled,
            series: SERIES,
            seconds: Buckets {
                step_seconds: 1,
                last_start: format_rfc3339(s.now * 1000),
                counts: s.seconds,
            },
            minutes: Buckets {
                step_seconds: 60,
                last_start: format_rfc3339(minute * 1000),
                counts: s.minutes,
            },
        }
    }
}

/// `GET /v1/rates`
#[utoipa::path(
    get, path = "/v1/rates", operation_id = "rates", tag = "operations",
    description = "Messages enqueued, delivered (acked), retried and failed across every queue: the last five minutes by second and the last hour by minute, kept in the process since it started.",
    responses((status = 200, body = RatesBody), Refused)
)]
pub(crate) async fn total(
    State(state): State<Arc<AppState>>,
) -> Result<axum::Json<RatesBody>, ApiError> {
    let engine = state.engine()?;
    Ok(axum::Json(RatesBody::new(None, false, engine.rates(None))))
}

/// `GET /v1/queues/{q}/rates`
#[utoipa::path(
    get, path = "/v1/queues/{q}/rates", operation_id = "queueRates", tag = "queues", params(QueuePath),
    description = "One queue's messages enqueued, delivered (acked), retried and failed: the last five minutes by second and the last hour by minute.",
    responses((status = 200, body = RatesBody), Refused)
)]
pub(crate) async fn queue(
    State(state): State<Arc<AppState>>,
    Path(queue): Path<String>,
) -> Result<axum::Json<RatesBody>, ApiError> {
    let engine = state.engine()?;
    engine.stats(&queue)?;
    let pooled = engine.rates_pooled(&queue);
    let series = engine.rates(Some(&queue));
    Ok(axum::Json(RatesBody::new(Some(queue), pooled, series)))
}
