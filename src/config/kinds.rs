//! The kinds of value a setting takes: how each is parsed from text, written back, and
//! checked against its range. Every error names the setting, the value and what it accepts.

use std::path::PathBuf;
use std::time::Duration;

use datafusion::error::{DataFusionError, Result};

/// Parses, formats and checks values of type `T`.
pub(crate) trait Kind<T> {
    /// The value `text` stands for, or an error naming `key`.
    fn parse(&self, key: &str, text: &str) -> Result<T>;
    /// `value` as [`Kind::parse`] reads it back.
    fn format(&self, value: &T) -> String;
    /// Whether `value` is within the accepted range.
    fn check(&self, key: &str, value: &T) -> Result<()>;
    /// What the setting accepts, as its errors and docs/configuration.md say it.
    fn accepted(&self) -> String;
}

/// An on/off setting.
pub(crate) struct Flag;

/// A whole number within `min..=max`.
pub(crate) struct Count {
    pub(crate) min: u64,
    pub(crate) max: u64,
}

/// A byte size within `min..=max`.
pub(crate) struct Size {
    pub(crate) min: u64,
    pub(crate) max: u64,
}

/// A duration from 0 to [`MAX_DURATION`]; 0 means no expiry where it bounds a lifetime.
pub(crate) struct Span;

/// A duration where 0 means none.
pub(crate) struct OptionalSpan;

/// A directory; empty means none.
pub(crate) struct Dir;

/// Longest accepted duration: ten years. Longer values are almost certainly unit mistakes, and
/// moka rejects expiries beyond about a thousand years with a panic.
const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
const DIR_VALUES: &str = "a directory path, or nothing for none";
const BOOL_VALUES: &str = "true or false (also on/off, 1/0)";
const DURATION_RANGE: &str =
    "a duration from 0 to 3650d such as 0, 500ms, 30s, 10m, 2h or 1d (0 means none)";

/// The error for `value` of `key`, which accepts `expected`.
pub(crate) fn invalid(key: &str, value: &str, expected: &str) -> DataFusionError {
    DataFusionError::Configuration(format!(
        "invalid value '{value}' for {key}: expected {expected}"
    ))
}

impl Kind<bool> for Flag {
    fn parse(&self, key: &str, text: &str) -> Result<bool> {
        parse_bool(key, text)
    }

    fn format(&self, value: &bool) -> String {
        value.to_string()
    }

    fn check(&self, _key: &str, _value: &bool) -> Result<()> {
        Ok(())
    }

    fn accepted(&self) -> String {
        BOOL_VALUES.to_string()
    }
}

impl Count {
    fn expected(&self) -> String {
        format!("an integer from {} to {}", self.min, self.max)
    }
}

macro_rules! count_kind {
    ($($t:ty),*) => {$(
        impl Kind<$t> for Count {
            fn parse(&self, key: &str, text: &str) -> Result<$t> {
                let n = parse_count(key, text, self.min, self.max)?;
                <$t>::try_from(n).map_err(|_| invalid(key, text, &self.expected()))
            }

            fn format(&self, value: &$t) -> String {
                value.to_string()
            }

            fn accepted(&self) -> String {
                self.expected()
            }

            fn check(&self, key: &str, value: &$t) -> Result<()> {
                let n = u64::try_from(*value).unwrap_or(u64::MAX);
                if n < self.min || n > self.max {
                    return Err(invalid(key, &value.to_string(), &self.expected()));
                }
                Ok(())
            }
        }
    )*};
}
count_kind!(u8, u64, usize);

impl Size {
    fn expected(&self) -> String {
        let name = |bytes: u64| match bytes {
            1 => "1 byte".to_string(),
            super::PIB => "1PiB".to_string(),
            b => format_bytes(b),
        };
        format!(
            "a size from {} to {} such as 512KiB, 256MiB or 4GiB",
            name(self.min),
            name(self.max)
        )
    }
}

impl Kind<u64> for Size {
    fn parse(&self, key: &str, text: &str) -> Result<u64> {
        let bytes = parse_size(text).ok_or_else(|| invalid(key, text, &self.expected()))?;
        self.check(key, &bytes)
            .map_err(|_| invalid(key, text, &self.expected()))?;
        Ok(bytes)
    }

    fn format(&self, value: &u64) -> String {
        format_bytes(*value)
    }

    fn accepted(&self) -> String {
        self.expected()
    }

    fn check(&self, key: &str, value: &u64) -> Result<()> {
        if *value < self.min || *value > self.max {
            return Err(invalid(key, &value.to_string(), &self.expected()));
        }
        Ok(())
    }
}

impl Kind<Duration> for Span {
    fn parse(&self, key: &str, text: &str) -> Result<Duration> {
        parse_duration(key, text)
    }

    fn format(&self, value: &Duration) -> String {
        format_duration(*value)
    }

    fn accepted(&self) -> String {
        DURATION_RANGE.to_string()
    }

    fn check(&self, key: &str, value: &Duration) -> Result<()> {
        if *value > MAX_DURATION {
            return Err(invalid(key, &format!("{value:?}"), DURATION_RANGE));
        }
        Ok(())
    }
}

impl Kind<Option<Duration>> for OptionalSpan {
    fn parse(&self, key: &str, text: &str) -> Result<Option<Duration>> {
        let d = parse_duration(key, text)?;
        Ok((!d.is_zero()).then_some(d))
    }

    fn format(&self, value: &Option<Duration>) -> String {
        format_duration(value.unwrap_or_default())
    }

    fn accepted(&self) -> String {
        DURATION_RANGE.to_string()
    }

    fn check(&self, key: &str, value: &Option<Duration>) -> Result<()> {
        value.as_ref().map_or(Ok(()), |d| Span.check(key, d))
    }
}

impl Kind<Option<PathBuf>> for Dir {
    fn parse(&self, _key: &str, text: &str) -> Result<Option<PathBuf>> {
        let dir = text.trim();
        Ok((!dir.is_empty()).then(|| dir.into()))
    }

    fn format(&self, value: &Option<PathBuf>) -> String {
        value
            .as_ref()
            .map_or(String::new(), |d| d.display().to_string())
    }

    fn accepted(&self) -> String {
        DIR_VALUES.to_string()
    }

    fn check(&self, key: &str, value: &Option<PathBuf>) -> Result<()> {
        match value {
            Some(d) if d.as_os_str().is_empty() => Err(invalid(key, "", DIR_VALUES)),
            _ => Ok(()),
        }
    }
}

/// Parses an on/off setting: `true`/`false`, `on`/`off` or `1`/`0`.
pub(crate) fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "1" => Ok(true),
        "false" | "off" | "0" => Ok(false),
        _ => Err(invalid(key, value, BOOL_VALUES)),
    }
}

/// Parses an integer setting within `min..=max` (underscores allowed: `10_000`).
pub(crate) fn parse_count(key: &str, value: &str, min: u64, max: u64) -> Result<u64> {
    let expected = format!("an integer from {min} to {max}");
    let n: u64 = value
        .trim()
        .replace('_', "")
        .parse()
        .map_err(|_| invalid(key, value, &expected))?;
    if n < min || n > max {
        return Err(invalid(key, value, &expected));
    }
    Ok(n)
}

/// Parses a byte size of 1 byte to 1 PiB: a whole number with an optional unit (`B`,
/// `KB`/`KiB`, `MB`/`MiB`, `GB`/`GiB`, `TB`/`TiB`, all powers of 1024, as DataFusion's own size
/// settings read them), as the size settings read it; an error names `key`. For sizes an
/// embedder reads itself (a memory limit of its own), with the settings' messages.
pub fn parse_bytes(key: &str, value: &str) -> Result<u64> {
    let size = Size {
        min: 1,
        max: super::PIB,
    };
    size.parse(key, value)
}

fn parse_size(value: &str) -> Option<u64> {
    let v = value.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let number: u64 = number.parse().ok()?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return None,
    };
    number.checked_shl(shift).filter(|b| b >> shift == number)
}

/// Parses a duration setting: a non-negative number with a unit (`ms`, `s`, `m`, `h`, `d`), or
/// a bare number of seconds, at most ten years. `0` is accepted.
pub(crate) fn parse_duration(key: &str, value: &str) -> Result<Duration> {
    let err = || invalid(key, value, DURATION_RANGE);
    let v = value.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let number: f64 = number.parse().map_err(|_| err())?;
    let seconds_per_unit = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return Err(err()),
    };
    let seconds = number * seconds_per_unit;
    if !seconds.is_finite() || seconds < 0.0 || seconds > MAX_DURATION.as_secs_f64() {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// `bytes` in the largest unit that divides it, as a size setting reads it back.
pub(crate) fn format_bytes(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// `d` in the largest unit that divides it, as [`parse_duration`] reads it back.
pub(crate) fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0".into();
    }
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    for (per, unit) in [(86_400, "d"), (3_600, "h"), (60, "m")] {
        if s.is_multiple_of(per) {
            return format!("{}{unit}", s / per);
        }
    }
    format!("{s}s")
}
