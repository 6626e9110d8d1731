//! Time as the rest of the crate sees it.
//!
//! Every timestamp is [`Millis`]: milliseconds since the Unix epoch. The state
//! machine never reads the clock; the engine reads a [`Clock`] and passes
//! `now` down, so tests can move time by hand instead of sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (UTC).
pub type Millis = i64;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> Millis;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        since.as_millis() as Millis
    }
}

/// A clock that only moves when told to. Cloning shares the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now_ms: Arc<AtomicI64>,
}

impl ManualClock {
    pub fn new(start_ms: Millis) -> ManualClock {
        ManualClock {
            now_ms: Arc::new(AtomicI64::new(start_ms)),
        }
    }

    pub fn advance_ms(&self, delta_ms: i64) {
        self.now_ms.fetch_add(delta_ms, Ordering::SeqCst);
    }

    pub fn set_ms(&self, now_ms: Millis) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> Millis {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// Formats a timestamp as RFC 3339 UTC with milliseconds
/// (`2026-01-02T03:04:05.678Z`), the form the API uses everywhere. Times
/// outside years 0–9999 are clamped to them: RFC 3339 has four-digit years.
pub fn format_rfc3339(ms: Millis) -> String {
    const FORMAT: &[time::format_description::BorrowedFormatItem<'_>] = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    let ms = ms.clamp(RFC3339_MS_MIN, RFC3339_MS_MAX);
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .expect("bug: clamped to years 0-9999")
        .format(FORMAT)
        .expect("bug: a UTC time in years 0-9999 formats")
}

/// 0000-01-01T00:00:00.000Z and 9999-12-31T23:59:59.999Z.
const RFC3339_MS_MIN: Millis = -62_167_219_200_000;
const RFC3339_MS_MAX: Millis = 253_402_300_799_999;

/// Parses an RFC 3339 time (`2026-01-02T03:04:05Z`, fractions and offsets
/// allowed) to milliseconds since the epoch.
pub fn parse_rfc3339(text: &str) -> Option<Millis> {
    let t =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_parses_what_it_formats_and_offsets() {
        for ms in [0, 951_782_400_123, 1_798_761_599_999] {
            assert_eq!(parse_rfc3339(&format_rfc3339(ms)), Some(ms));
        }
        assert_eq!(parse_rfc3339("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01Z"), Some(1000));
        for bad in ["", "yesterday", "1970-01-01", "1970-01-01T00:00:00"] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(format_rfc3339(i64::MIN), "0000-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339(i64::MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(format_rfc3339(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(
            format_rfc3339(1_798_761_599_999),
            "2026-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        let other = clock.clone();
        assert_eq!(clock.now_ms(), 1_000);
        other.advance_ms(500);
        assert_eq!(clock.now_ms(), 1_500);
        clock.set_ms(10);
        assert_eq!(other.now_ms(), 10);
    }
}
