//! How long a retryable failure waits (docs/contract.md §2–3).
//!
//! The delay before retry `n` (0 for the first retry) is
//! `initial × multiplier^n`, jittered by ± `jitter` (uniformly), then capped
//! at `max`: with the defaults about 5 s, 20 s, 80 s, 5 min, 21 min, 85 min,
//! 5.7 h, then 10 h. A `Retry-After` from the destination (seconds or an
//! HTTP date) replaces it, clamped to `[0, max]`.

use std::time::{Duration, SystemTime};

use crate::spool::queue::Backoff;

/// The delay before retry `retry` (0-based), with `unit` a uniform random
/// number in `[0, 1)` (passed in so tests need no randomness).
pub(crate) fn delay_ms(backoff: &Backoff, retry: u32, unit: f64) -> u64 {
    let base = backoff.initial_ms as f64 * backoff.multiplier.powi(retry.min(64) as i32);
    let jitter = backoff.jitter.clamp(0.0, 1.0);
    let factor = 1.0 - jitter + 2.0 * jitter * unit.clamp(0.0, 1.0);
    let jittered = base * factor;
    if !jittered.is_finite() {
        return backoff.max_ms;
    }
    (jittered.round() as u64).min(backoff.max_ms)
}

/// Parses a `Retry-After` value (delay-seconds or an HTTP date) into a delay
/// from `now`, clamped to `[0, max_ms]`. `None` if it is neither.
pub(crate) fn retry_after_ms(value: &str, now: SystemTime, max_ms: u64) -> Option<u64> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(secs.saturating_mul(1000).min(max_ms));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    let ms = when
        .duration_since(now)
        .unwrap_or(Duration::ZERO)
        .as_millis()
        .min(u128::from(max_ms));
    Some(ms as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_schedule_matches_the_spec() {
        let b = Backoff::default();
        let mid: Vec<u64> = (0..9).map(|n| delay_ms(&b, n, 0.5)).collect();
        assert_eq!(
            mid,
            vec![
                5_000, 20_000, 80_000, 320_000, 1_280_000, 5_120_000, 20_480_000, 36_000_000,
                36_000_000
            ]
        );
        // ±20 %.
        assert_eq!(delay_ms(&b, 0, 0.0), 4_000);
        assert_eq!(delay_ms(&b, 0, 0.999_999), 6_000);
        // Capped after jitter.
        assert_eq!(delay_ms(&b, 7, 0.999_999), 36_000_000);
    }

    #[test]
    fn retry_after_takes_seconds_or_dates_and_is_clamped() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after_ms("120", now, 3_600_000), Some(120_000));
        assert_eq!(retry_after_ms("999999", now, 3_600_000), Some(3_600_000));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(retry_after_ms(&later, now, 3_600_000), Some(30_000));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(retry_after_ms(&past, now, 3_600_000), Some(0));
        assert_eq!(retry_after_ms("soon", now, 3_600_000), None);
    }
}
