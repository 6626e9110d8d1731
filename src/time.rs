//! Time as the rest of the crate sees it.
//!
//! Every timestamp is [`Millis`]: milliseconds since the Unix epoch. The state
//! machine never reads the clock; the engine reads a [`Clock`] and passes
//! `now` down, so tests can move time by hand instead of sleeping.
//!
//! The engine's real clock is [`SteadyClock`]: wall time that a step of the
//! host's clock does not move. Deadlines are written as wall time, but a
//! process runs its time on the monotonic clock, so a wall clock that
//! steps an hour ahead for a moment and back (or back and ahead) changes
//! no timer: a 2 s lease taken before, during or after it expires 2 s
//! later. The two are compared on every read: a difference past
//! [`STEP_MS`] is a step, logged with its size and shown on `/readyz` and
//! `GET /v1/cluster` (`clockStepMs`).
//!
//! - Small differences (NTP's corrections) and a wall clock that went back
//!   are followed by slewing: the steady clock runs 1% slower or faster
//!   until it meets the wall clock, and never runs backwards.
//! - A wall clock that went ahead and stays there for [`ADOPT_AFTER`] is
//!   taken at once: a host whose clock was wrong was set right (timers due
//!   in the jump fire then).
//! - Time it must not pass below (the last record's at start-up, the
//!   primary's stamps on a follower) moves it ahead, and it runs on from
//!   there: a spool written by a clock an hour ahead does not freeze its
//!   timers for an hour after a restart or a failover.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (UTC).
pub type Millis = i64;

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> Millis;

    /// Time this clock must not be below from now on (a record's): a
    /// clock that keeps its own time moves ahead to it and runs on.
    fn not_before(&self, _ms: Millis) {}

    /// How far the host's wall clock is from this clock's time, when that
    /// is a step (more than [`STEP_MS`]); 0 otherwise.
    fn step_ms(&self) -> i64 {
        0
    }
}

/// The host's wall clock, as it is (under the `testing` feature, moved by
/// the offset `SPOOLD_TEST_CLOCK_FILE` holds: tests step it in one process).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        wall_ms()
    }
}

/// The host's wall clock in ms since the epoch: every reading of it in the
/// crate is this one.
pub fn wall_ms() -> Millis {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    since.as_millis() as Millis + test_offset::ms()
}

/// A difference between the wall clock and the steady clock past this is
/// a step.
pub const STEP_MS: i64 = 1_000;
/// How long a wall clock that went ahead must stay ahead to be taken.
pub const ADOPT_AFTER: Duration = Duration::from_secs(10);
/// How much faster or slower the steady clock runs while it meets the
/// wall clock: one part in this many.
const SLEW_PARTS: i128 = 100;

/// Wall time driven by the monotonic clock (module docs).
pub struct SteadyClock {
    state: Mutex<Steady>,
    step_ms: AtomicI64,
}

struct Steady {
    /// This clock's time at `at`, in nanoseconds since the epoch.
    anchor_ns: i128,
    at: Instant,
    /// Since when the wall clock has been ahead by a step.
    ahead_since: Option<Instant>,
    /// The step last logged (0: none).
    logged_ms: i64,
}

impl Default for SteadyClock {
    fn default() -> SteadyClock {
        SteadyClock::new()
    }
}

impl SteadyClock {
    pub fn new() -> SteadyClock {
        SteadyClock {
            state: Mutex::new(Steady {
                anchor_ns: i128::from(wall_ms()) * 1_000_000,
                at: Instant::now(),
                ahead_since: None,
                logged_ms: 0,
            }),
            step_ms: AtomicI64::new(0),
        }
    }

    /// This clock's time for the wall clock's `wall_ns` at `now`.
    fn read(&self, wall_ns: i128, now: Instant) -> i128 {
        let mut s = self.state.lock().expect("bug: clock lock poisoned");
        let elapsed = now.saturating_duration_since(s.at).as_nanos() as i128;
        let steady = s.anchor_ns + elapsed;
        let diff = wall_ns - steady;
        let step = diff.abs() > i128::from(STEP_MS) * 1_000_000;
        let next = if diff > 0 && step {
            // Ahead by a step: taken once it has stayed for ADOPT_AFTER.
            let since = *s.ahead_since.get_or_insert(now);
            if now.saturating_duration_since(since) >= ADOPT_AFTER {
                wall_ns
            } else {
                steady
            }
        } else {
            s.ahead_since = None;
            // Slewed toward the wall clock, never past it, never back.
            let slew = elapsed / SLEW_PARTS;
            let toward = if diff >= 0 {
                steady + slew.min(diff)
            } else {
                steady - slew.min(-diff)
            };
            toward.max(s.anchor_ns)
        };
        s.anchor_ns = next;
        s.at = now;
        let left = wall_ns - next;
        let step_ms = if left.abs() > i128::from(STEP_MS) * 1_000_000 {
            i64::try_from(left / 1_000_000).unwrap_or(i64::MAX)
        } else {
            0
        };
        self.step_ms.store(step_ms, Ordering::Relaxed);
        if step_ms != 0 && (step_ms - s.logged_ms).abs() > STEP_MS {
            s.logged_ms = step_ms;
            tracing::warn!(
                step_ms,
                "the wall clock stepped away from the monotonic clock: spoold keeps its \
                 timers on the monotonic clock (a clock that went back is met by slewing 1%, \
                 one that went ahead is taken after {} s)",
                ADOPT_AFTER.as_secs()
            );
        } else if step_ms == 0 && s.logged_ms != 0 {
            s.logged_ms = 0;
            tracing::info!("the wall clock and spoold's steady clock agree again");
        }
        next
    }
}

impl Clock for SteadyClock {
    fn now_ms(&self) -> Millis {
        let wall_ns = i128::from(wall_ms()) * 1_000_000;
        let ns = self.read(wall_ns, Instant::now());
        i64::try_from(ns.div_euclid(1_000_000)).unwrap_or(Millis::MAX)
    }

    fn not_before(&self, ms: Millis) {
        let mut s = self.state.lock().expect("bug: clock lock poisoned");
        let now = Instant::now();
        let steady = s.anchor_ns + now.saturating_duration_since(s.at).as_nanos() as i128;
        let floor = i128::from(ms) * 1_000_000;
        if floor > steady {
            s.anchor_ns = floor;
            s.at = now;
        }
    }

    fn step_ms(&self) -> i64 {
        self.step_ms.load(Ordering::Relaxed)
    }
}

/// The `testing` feature's clock offset: `SPOOLD_TEST_CLOCK_FILE` names a
/// file holding milliseconds (signed) added to every reading of the wall
/// clock, read again every 10 ms by a thread of its own, so a test steps
/// one process's wall clock (its monotonic clock is left alone, as a
/// host's clock step leaves it). Without the feature: 0, and nothing runs.
mod test_offset {
    #[cfg(feature = "testing")]
    pub(super) fn ms() -> i64 {
        use std::sync::OnceLock;
        use std::sync::atomic::{AtomicI64, Ordering};
        static OFFSET: OnceLock<Option<&'static AtomicI64>> = OnceLock::new();
        let offset = OFFSET.get_or_init(|| {
            let path = std::env::var_os("SPOOLD_TEST_CLOCK_FILE")?;
            let offset: &'static AtomicI64 = Box::leak(Box::new(AtomicI64::new(0)));
            let read = move || {
                std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|t| t.trim().parse::<i64>().ok())
            };
            offset.store(read().unwrap_or(0), Ordering::Relaxed);
            std::thread::spawn(move || {
                loop {
                    if let Some(ms) = read() {
                        offset.store(ms, Ordering::Relaxed);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            });
            Some(offset)
        });
        offset.map_or(0, |o| o.load(Ordering::Relaxed))
    }

    #[cfg(not(feature = "testing"))]
    pub(super) fn ms() -> i64 {
        0
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

    const S: i128 = 1_000_000_000;

    fn steady_at(wall_ns: i128, at: Instant) -> SteadyClock {
        let clock = SteadyClock::new();
        *clock.state.lock().unwrap() = Steady {
            anchor_ns: wall_ns,
            at,
            ahead_since: None,
            logged_ms: 0,
        };
        clock
    }

    #[test]
    fn a_wall_clock_step_ahead_and_back_moves_no_timer() {
        let t0 = Instant::now();
        let wall = 1_800_000_000 * S;
        let clock = steady_at(wall, t0);
        // One second in, the wall clock jumps an hour ahead for 0.3 s.
        assert_eq!(clock.read(wall + S, t0 + Duration::from_secs(1)), wall + S);
        let during = clock.read(wall + S + 3600 * S, t0 + Duration::from_millis(1300));
        assert!(during - (wall + S) <= 305_000_000, "{during}");
        assert!(clock.step_ms() > 3_599_000);
        let after = clock.read(wall + 2 * S, t0 + Duration::from_secs(2));
        assert!((after - (wall + 2 * S)).abs() <= 10_000_000, "{after}");
        assert_eq!(clock.step_ms(), 0);
    }

    #[test]
    fn a_wall_clock_step_back_is_met_by_slewing_never_by_running_back() {
        let t0 = Instant::now();
        let wall = 1_800_000_000 * S;
        let clock = steady_at(wall, t0);
        let mut last = wall;
        for i in 1..=100 {
            let now = clock.read(wall - 3600 * S + i * S, t0 + Duration::from_secs(i as u64));
            let ran = now - last;
            // 99% of real time: timers a percent late, never frozen.
            assert!((989_000_000..=S).contains(&ran), "{ran}");
            last = now;
        }
        assert!(clock.step_ms() < -3_500_000);
    }

    #[test]
    fn a_wall_clock_that_stays_ahead_is_taken_after_a_while() {
        let t0 = Instant::now();
        let wall = 1_800_000_000 * S;
        let clock = steady_at(wall, t0);
        let ahead = 3600 * S;
        let early = clock.read(wall + ahead + S, t0 + Duration::from_secs(1));
        assert!(early < wall + 2 * S);
        let late = clock.read(wall + ahead + 12 * S, t0 + Duration::from_secs(12));
        assert_eq!(late, wall + ahead + 12 * S);
        assert_eq!(clock.step_ms(), 0);
    }

    #[test]
    fn a_clock_moved_ahead_by_a_record_runs_on_from_there() {
        let clock = SteadyClock::new();
        let ahead = clock.now_ms() + 3_600_000;
        clock.not_before(ahead);
        let first = clock.now_ms();
        assert!(first >= ahead);
        std::thread::sleep(Duration::from_millis(50));
        assert!(clock.now_ms() >= first + 40, "it runs, not frozen");
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
