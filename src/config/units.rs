//! Durations and sizes as the config file writes them: the one grammar
//! every duration of spoold is read with (the config's keys, the
//! `--since`/`--until` flags, `cluster add --wait`), and the spelling the
//! effective config prints them in, which reads back to the same value.

use std::time::Duration;

use serde::Deserialize;

/// The longest duration any setting may be written as: 100 years, past
/// every sane value, so that nothing quietly saturates.
const DURATION_MS_MAX: u64 = 100 * 365 * 86_400_000;

/// Why a duration or a size cannot be read; `text` is what was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// A number alone (`"30"`): seconds or milliseconds would be a guess.
    #[error("duration {text:?} needs a unit: ms, s, m, h or d")]
    NoUnit { text: String },
    #[error("invalid duration {text:?}: expected e.g. \"30s\" or \"250ms\"")]
    BadDuration { text: String },
    #[error("invalid duration unit {unit:?} in {text:?}: allowed ms, s, m, h, d")]
    BadDurationUnit { unit: String, text: String },
    /// One span over [`DURATION_MS_MAX`].
    #[error("duration {text:?} is too long: at most {} days", DURATION_MS_MAX / 86_400_000)]
    DurationTooLong { text: String },
    /// Several spans (`"1h30m"`) that add up to over [`DURATION_MS_MAX`].
    #[error("duration {text:?} is too long")]
    SpansTooLong { text: String },
    #[error("invalid size {text:?}: expected e.g. \"64MiB\"")]
    BadSize { text: String },
    #[error("invalid size unit {unit:?} in {text:?}: allowed B, KiB, MiB, GiB, KB, MB, GB")]
    BadSizeUnit { unit: String, text: String },
    /// Past what 64 bits of bytes hold.
    #[error("size {text:?} is too large")]
    SizeTooLarge { text: String },
}

/// Parses `"30s"`, `"250ms"`, `"10m"`, `"2h"`, `"7d"`, `"1.5s"`, or
/// several spans as `humantime` reads them (`"1h30m"`, `"2h 15min"`) into
/// milliseconds.
pub(crate) fn parse_duration_ms(text: &str) -> Result<u64, UnitError> {
    let text = text.trim();
    match parse_one_span_ms(text) {
        Ok(ms) => Ok(ms),
        Err(e) => match humantime::parse_duration(text) {
            Ok(d) => u64::try_from(d.as_millis())
                .ok()
                .filter(|ms| *ms <= DURATION_MS_MAX)
                .ok_or_else(|| UnitError::SpansTooLong {
                    text: text.to_owned(),
                }),
            Err(_) => Err(e),
        },
    }
}

/// A duration on the command line, read as the config file reads one.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    parse_duration_ms(text).map(Duration::from_millis)
}

/// One number and unit, the number possibly fractional.
fn parse_one_span_ms(text: &str) -> Result<u64, UnitError> {
    let text_owned = || text.to_owned();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| UnitError::NoUnit { text: text_owned() })?;
    let (num, unit) = text.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| UnitError::BadDuration { text: text_owned() })?;
    let scale = match unit.trim() {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        other => {
            return Err(UnitError::BadDurationUnit {
                unit: other.to_owned(),
                text: text_owned(),
            });
        }
    };
    let ms = (value * scale).round();
    if !ms.is_finite() || ms > DURATION_MS_MAX as f64 {
        return Err(UnitError::DurationTooLong { text: text_owned() });
    }
    Ok(ms as u64)
}

/// Milliseconds in the largest unit that holds them exactly (`"90m"`,
/// `"250ms"`), as the config file spells durations.
pub(super) fn format_duration_ms(ms: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    for (scale, unit) in UNITS {
        if ms != 0 && ms.is_multiple_of(scale) {
            return format!("{}{unit}", ms / scale);
        }
    }
    format!("{ms}ms")
}

/// Bytes in the largest binary unit that holds them exactly (`"64MiB"`).
pub(super) fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes != 0 && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// Parses `"64MiB"`, `"1GiB"`, `"512KiB"`, `"10MB"` or `"1000"` into bytes.
fn parse_size_bytes(text: &str) -> Result<u64, UnitError> {
    let text = text.trim();
    let text_owned = || text.to_owned();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| UnitError::BadSize { text: text_owned() })?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        other => {
            return Err(UnitError::BadSizeUnit {
                unit: other.to_owned(),
                text: text_owned(),
            });
        }
    };
    let bytes = (value * scale).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(UnitError::SizeTooLarge { text: text_owned() });
    }
    Ok(bytes as u64)
}

/// A size is a plain byte count or a string with a unit.
#[derive(Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

pub(super) fn de_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match SizeValue::deserialize(d)? {
        SizeValue::Bytes(n) => Ok(n),
        SizeValue::Text(s) => parse_size_bytes(&s).map_err(serde::de::Error::custom),
    }
}

pub(super) fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    parse_duration_ms(&s).map_err(serde::de::Error::custom)
}

pub(super) fn de_opt_duration<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
    de_duration(d).map(Some)
}

pub(super) fn de_opt_size<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    de_size(d).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_parse() {
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("1.5s"), Ok(1_500));
        assert_eq!(parse_duration_ms("7d"), Ok(604_800_000));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("2h 15min"), Ok(8_100_000));
        assert_eq!(parse_duration_ms("1d12h"), Ok(129_600_000));
        assert!(parse_duration_ms("30").is_err());
        for ms in [250, 1_000, 90_000, 5_400_000, 604_800_000, 1_500] {
            assert_eq!(parse_duration_ms(&format_duration_ms(ms)), Ok(ms));
        }
        assert!(parse_duration_ms("30x").is_err());
        assert_eq!(parse_size_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size_bytes("1000"), Ok(1000));
        assert!(parse_size_bytes("1 parsec").is_err());
    }

    #[test]
    fn a_command_line_duration_is_read_as_the_config_reads_one() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("60").is_err());
    }
}
