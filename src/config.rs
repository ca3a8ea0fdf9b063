//! Every setting of the crate: its default, its accepted range and its validation.
//!
//! Settings are typed fields on one struct per capability ([`HandleConfig`],
//! [`IndexConfig`]). [`LakeCacheBuilder`](crate::LakeCacheBuilder) validates them before any cache
//! is built, so a bad value is refused once, with a message naming the setting, instead of
//! surfacing later as odd behaviour. [`HandleConfig::set`] accepts the same settings as strings
//! under their `lakecache.*` keys, the form SQL `SET` and configuration files use.

use std::time::Duration;

use datafusion::error::{DataFusionError, Result};

/// Settings of the [`HandleCache`](crate::handle::HandleCache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleConfig {
    /// Whether object metadata, listings and descriptors are cached at all. Off, every HEAD
    /// and LIST reaches the store, and the range cache (which learns versions here) keeps
    /// nothing.
    pub enabled: bool,
    /// Maximum number of cached object metadata entries (HEAD, GET and LIST results).
    pub capacity: u64,
    /// Time an entry stays valid after it was fetched; `Duration::ZERO` means no expiry.
    pub ttl: Duration,
    /// Entries not read for this long are dropped; `None` means no idle timeout.
    pub idle_timeout: Option<Duration>,
    /// Time a cached listing stays valid. Kept short because new files must show up.
    pub list_ttl: Duration,
    /// Maximum number of open local file descriptors kept for reuse; 0 turns the descriptor
    /// cache off. Never more than half the process's soft `ulimit -n` is used.
    pub max_open_files: usize,
}

impl Default for HandleConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            capacity: 10_000,
            ttl: Duration::from_secs(600),
            idle_timeout: None,
            list_ttl: Duration::from_secs(60),
            max_open_files: 1_000,
        }
    }
}

/// Settings of the [`IndexCache`](crate::index::IndexCache).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexConfig {
    /// Whether decoded footers, page indexes and bloom filters are kept at all. Off, every
    /// scan reads and decodes them again.
    pub enabled: bool,
    /// Bytes of deserialized footers, page indexes and bloom filters kept.
    pub capacity_bytes: u64,
    /// An entry larger than this percentage of the capacity is not kept (it would flush the
    /// rest); such refusals are counted.
    pub max_entry_percent: u8,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            capacity_bytes: 256 << 20,
            max_entry_percent: 25,
        }
    }
}

/// Key of [`IndexConfig::enabled`].
pub const INDEX_ENABLED: &str = "lakecache.index.enabled";
/// Key of [`IndexConfig::capacity_bytes`].
pub const INDEX_CAPACITY: &str = "lakecache.index.capacity";
/// Key of [`IndexConfig::max_entry_percent`].
pub const INDEX_MAX_ENTRY_PERCENT: &str = "lakecache.index.max_entry_percent";

const MAX_BYTES: u64 = 1 << 50;
const BYTES_RANGE: &str = "a size from 1 byte to 1PiB such as 268435456, 512KiB, 256MiB or 4GiB";

impl IndexConfig {
    /// Sets one setting from its `lakecache.*` key and a string value, validating it.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            INDEX_ENABLED => self.enabled = parse_bool(key, value)?,
            INDEX_CAPACITY => self.capacity_bytes = parse_bytes(key, value)?,
            INDEX_MAX_ENTRY_PERCENT => {
                self.max_entry_percent = parse_count(key, value, 1, 100)? as u8
            }
            _ => {
                return Err(DataFusionError::Configuration(format!(
                    "unknown setting '{key}'; known index settings: {INDEX_ENABLED}, {INDEX_CAPACITY}, \
                     {INDEX_MAX_ENTRY_PERCENT}"
                )));
            }
        }
        Ok(())
    }

    /// Checks every field against its accepted range.
    pub fn validate(&self) -> Result<()> {
        if self.capacity_bytes == 0 || self.capacity_bytes > MAX_BYTES {
            return Err(range_error(
                INDEX_CAPACITY,
                &self.capacity_bytes.to_string(),
                BYTES_RANGE,
            ));
        }
        if !(1..=100).contains(&self.max_entry_percent) {
            return Err(range_error(
                INDEX_MAX_ENTRY_PERCENT,
                &self.max_entry_percent.to_string(),
                "a percentage from 1 to 100",
            ));
        }
        Ok(())
    }

    /// The largest entry kept, in bytes.
    pub fn max_entry_bytes(&self) -> u64 {
        self.capacity_bytes * u64::from(self.max_entry_percent) / 100
    }
}

/// Settings of the [`Prefetcher`](crate::prefetch::Prefetcher).
///
/// The number of downloads in flight is not a setting: it starts small and grows while the
/// aggregate throughput still rises, up to `max_in_flight`. The bytes they may hold follow
/// `clamp(downloads x largest range seen, buffer, 4 x buffer)`, never above `max_bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefetchConfig {
    /// Whether scans fetch ahead at all.
    pub enabled: bool,
    /// Most downloads in flight per scan.
    pub max_in_flight: usize,
    /// The smallest byte budget of a scan's buffered and in-flight prefetches.
    pub buffer_bytes: u64,
    /// The largest byte budget of a scan, whatever the rule above gives.
    pub max_bytes: u64,
    /// Files of at most this size are fetched whole in one request.
    pub small_file_bytes: u64,
    /// Column chunks larger than this are fetched as parallel ranged requests of this size.
    pub split_bytes: u64,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_in_flight: 64,
            buffer_bytes: 32 << 20,
            max_bytes: 256 << 20,
            small_file_bytes: 512 << 10,
            split_bytes: 8 << 20,
        }
    }
}

/// Key of [`PrefetchConfig::enabled`].
pub const PREFETCH_ENABLED: &str = "lakecache.prefetch.enabled";
/// Key of [`PrefetchConfig::max_in_flight`].
pub const PREFETCH_MAX_IN_FLIGHT: &str = "lakecache.prefetch.max_in_flight";
/// Key of [`PrefetchConfig::buffer_bytes`].
pub const PREFETCH_BUFFER: &str = "lakecache.prefetch.buffer";
/// Key of [`PrefetchConfig::max_bytes`].
pub const PREFETCH_MAX_BYTES: &str = "lakecache.prefetch.max_bytes";
/// Key of [`PrefetchConfig::small_file_bytes`].
pub const PREFETCH_SMALL_FILE: &str = "lakecache.prefetch.small_file";
/// Key of [`PrefetchConfig::split_bytes`].
pub const PREFETCH_SPLIT: &str = "lakecache.prefetch.split_size";

const MAX_IN_FLIGHT: u64 = 1024;
/// Below this, splitting a chunk costs more round trips than it saves.
const MIN_SPLIT: u64 = 64 << 10;

impl PrefetchConfig {
    /// Sets one setting from its `lakecache.*` key and a string value, validating it.
    /// The setting is applied only if the whole configuration stays valid.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let mut next = self.clone();
        next.apply(key, value)?;
        next.validate()?;
        *self = next;
        Ok(())
    }

    fn apply(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            PREFETCH_ENABLED => self.enabled = parse_bool(key, value)?,
            PREFETCH_MAX_IN_FLIGHT => {
                self.max_in_flight = parse_count(key, value, 1, MAX_IN_FLIGHT)? as usize
            }
            PREFETCH_BUFFER => self.buffer_bytes = parse_bytes(key, value)?,
            PREFETCH_MAX_BYTES => self.max_bytes = parse_bytes(key, value)?,
            PREFETCH_SMALL_FILE => self.small_file_bytes = parse_bytes(key, value)?,
            PREFETCH_SPLIT => self.split_bytes = parse_bytes(key, value)?,
            _ => {
                return Err(DataFusionError::Configuration(format!(
                    "unknown setting '{key}'; known prefetch settings: {PREFETCH_ENABLED}, \
                     {PREFETCH_MAX_IN_FLIGHT}, {PREFETCH_BUFFER}, {PREFETCH_MAX_BYTES}, \
                     {PREFETCH_SMALL_FILE}, {PREFETCH_SPLIT}"
                )));
            }
        }
        Ok(())
    }

    /// Checks every field against its accepted range, and that the budget's floor is not
    /// above its cap.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_IN_FLIGHT as usize).contains(&self.max_in_flight) {
            return Err(range_error(
                PREFETCH_MAX_IN_FLIGHT,
                &self.max_in_flight.to_string(),
                &format!("an integer from 1 to {MAX_IN_FLIGHT}"),
            ));
        }
        for (key, bytes) in [
            (PREFETCH_BUFFER, self.buffer_bytes),
            (PREFETCH_MAX_BYTES, self.max_bytes),
            (PREFETCH_SMALL_FILE, self.small_file_bytes),
        ] {
            if bytes == 0 || bytes > MAX_BYTES {
                return Err(range_error(key, &bytes.to_string(), BYTES_RANGE));
            }
        }
        if self.max_bytes < self.buffer_bytes {
            return Err(range_error(
                PREFETCH_MAX_BYTES,
                &self.max_bytes.to_string(),
                &format!(
                    "a size no smaller than {PREFETCH_BUFFER} ({} bytes)",
                    self.buffer_bytes
                ),
            ));
        }
        if self.split_bytes < MIN_SPLIT || self.split_bytes > MAX_BYTES {
            return Err(range_error(
                PREFETCH_SPLIT,
                &self.split_bytes.to_string(),
                "a size from 64KiB to 1PiB",
            ));
        }
        Ok(())
    }

    /// The scan's byte budget for `workers` downloads when the largest range seen so far is
    /// `largest` bytes: the seed rule `clamp(workers x largest, buffer, 4 x buffer)`, capped.
    pub fn budget(&self, workers: usize, largest: u64) -> u64 {
        (workers as u64)
            .saturating_mul(largest)
            .clamp(self.buffer_bytes, self.buffer_bytes.saturating_mul(4))
            .min(self.max_bytes)
    }
}

/// Settings of the [`RangeCache`](crate::range::RangeCache): the bytes of object ranges kept
/// in memory and, optionally, on local disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeConfig {
    /// Whether ranges read from remote stores are kept at all.
    pub enabled: bool,
    /// Bytes the memory tier keeps.
    pub memory_bytes: u64,
    /// Directory of the disk tier; `None` (the default) keeps no bytes on disk.
    pub disk_dir: Option<std::path::PathBuf>,
    /// Bytes the disk tier keeps.
    pub disk_bytes: u64,
}

impl Default for RangeConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            memory_bytes: 1 << 30,
            disk_dir: None,
            disk_bytes: 16 << 30,
        }
    }
}

/// Key of [`RangeConfig::enabled`].
pub const RANGE_ENABLED: &str = "lakecache.range.enabled";
/// Key of [`RangeConfig::memory_bytes`].
pub const RANGE_MEMORY: &str = "lakecache.range.memory";
/// Key of [`RangeConfig::disk_dir`].
pub const RANGE_DISK_DIR: &str = "lakecache.range.disk_dir";
/// Key of [`RangeConfig::disk_bytes`].
pub const RANGE_DISK_CAPACITY: &str = "lakecache.range.disk_capacity";

/// Below this a tier could hold hardly a column chunk; such a value is a unit mistake.
const MIN_TIER: u64 = 1 << 20;

impl RangeConfig {
    /// Sets one setting from its `lakecache.*` key and a string value, validating it.
    /// The setting is applied only if the whole configuration stays valid.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let mut next = self.clone();
        match key {
            RANGE_ENABLED => next.enabled = parse_bool(key, value)?,
            RANGE_MEMORY => next.memory_bytes = parse_bytes(key, value)?,
            RANGE_DISK_DIR => {
                let dir = value.trim();
                next.disk_dir = (!dir.is_empty()).then(|| dir.into());
            }
            RANGE_DISK_CAPACITY => next.disk_bytes = parse_bytes(key, value)?,
            _ => {
                return Err(DataFusionError::Configuration(format!(
                    "unknown setting '{key}'; known range cache settings: {RANGE_ENABLED}, \
                     {RANGE_MEMORY}, {RANGE_DISK_DIR}, {RANGE_DISK_CAPACITY}"
                )));
            }
        }
        next.validate()?;
        *self = next;
        Ok(())
    }

    /// Checks every field against its accepted range.
    pub fn validate(&self) -> Result<()> {
        for (key, bytes) in [
            (RANGE_MEMORY, self.memory_bytes),
            (RANGE_DISK_CAPACITY, self.disk_bytes),
        ] {
            if !(MIN_TIER..=MAX_BYTES).contains(&bytes) {
                return Err(range_error(
                    key,
                    &bytes.to_string(),
                    "a size from 1MiB to 1PiB such as 512MiB or 4GiB",
                ));
            }
        }
        Ok(())
    }

    /// The largest entry a tier of `capacity` bytes keeps: an eighth, so one download cannot
    /// flush most of a tier.
    pub fn max_entry_bytes(capacity: u64) -> u64 {
        capacity / 8
    }
}

/// Parses an on/off setting: `true`/`false`, `on`/`off` or `1`/`0`.
pub fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "1" => Ok(true),
        "false" | "off" | "0" => Ok(false),
        _ => Err(range_error(key, value, "true or false")),
    }
}

/// Parses a byte size: a whole number with an optional unit (`B`, `KB`/`KiB`, `MB`/`MiB`,
/// `GB`/`GiB`, `TB`/`TiB`, all powers of 1024, as DataFusion's own size settings read them).
pub fn parse_bytes(key: &str, value: &str) -> Result<u64> {
    let err = || range_error(key, value, BYTES_RANGE);
    let v = value.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let number: u64 = number.parse().map_err(|_| err())?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(err()),
    };
    let bytes = number
        .checked_shl(shift)
        .filter(|b| b >> shift == number)
        .ok_or_else(err)?;
    if bytes == 0 || bytes > MAX_BYTES {
        return Err(err());
    }
    Ok(bytes)
}

/// Key of [`HandleConfig::enabled`].
pub const HANDLE_ENABLED: &str = "lakecache.handle.enabled";
/// Key of [`HandleConfig::capacity`].
pub const HANDLE_CAPACITY: &str = "lakecache.handle.capacity";
/// Key of [`HandleConfig::ttl`].
pub const HANDLE_TTL: &str = "lakecache.handle.ttl";
/// Key of [`HandleConfig::idle_timeout`].
pub const HANDLE_IDLE_TIMEOUT: &str = "lakecache.handle.idle_timeout";
/// Key of [`HandleConfig::list_ttl`].
pub const HANDLE_LIST_TTL: &str = "lakecache.handle.list_ttl";
/// Key of [`HandleConfig::max_open_files`].
pub const HANDLE_MAX_OPEN_FILES: &str = "lakecache.handle.max_open_files";

/// Longest accepted duration: ten years. Longer values are almost certainly unit mistakes, and
/// moka rejects expiries beyond about a thousand years with a panic.
const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
const DURATION_RANGE: &str =
    "a duration from 0 to 3650d such as 0, 500ms, 30s, 10m, 2h or 1d (0 means no expiry)";

impl HandleConfig {
    /// Sets one setting from its `lakecache.*` key and a string value, validating it.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            HANDLE_CAPACITY => self.capacity = parse_count(key, value, 1, u64::MAX)?,
            HANDLE_TTL => self.ttl = parse_duration(key, value)?,
            HANDLE_IDLE_TIMEOUT => {
                let idle = parse_duration(key, value)?;
                self.idle_timeout = (!idle.is_zero()).then_some(idle);
            }
            HANDLE_LIST_TTL => self.list_ttl = parse_duration(key, value)?,
            HANDLE_MAX_OPEN_FILES => {
                self.max_open_files = parse_count(key, value, 0, 1 << 20)? as usize
            }
            HANDLE_ENABLED => self.enabled = parse_bool(key, value)?,
            _ => {
                return Err(DataFusionError::Configuration(format!(
                    "unknown setting '{key}'; known handle settings: {HANDLE_ENABLED}, {HANDLE_CAPACITY}, \
                     {HANDLE_TTL}, {HANDLE_IDLE_TIMEOUT}, {HANDLE_LIST_TTL}, {HANDLE_MAX_OPEN_FILES}"
                )));
            }
        }
        Ok(())
    }

    /// Checks every field against its accepted range.
    pub fn validate(&self) -> Result<()> {
        if self.capacity == 0 {
            return Err(range_error(
                HANDLE_CAPACITY,
                "0",
                "an entry count from 1 to 18446744073709551615",
            ));
        }
        for (key, d) in [
            (HANDLE_TTL, Some(self.ttl)),
            (HANDLE_IDLE_TIMEOUT, self.idle_timeout),
            (HANDLE_LIST_TTL, Some(self.list_ttl)),
        ] {
            if let Some(d) = d
                && d > MAX_DURATION
            {
                return Err(range_error(key, &format!("{d:?}"), DURATION_RANGE));
            }
        }
        if self.max_open_files > 1 << 20 {
            return Err(range_error(
                HANDLE_MAX_OPEN_FILES,
                &self.max_open_files.to_string(),
                "a descriptor count from 0 (off) to 1048576",
            ));
        }
        Ok(())
    }
}

fn range_error(key: &str, value: &str, expected: &str) -> DataFusionError {
    DataFusionError::Configuration(format!(
        "invalid value '{value}' for {key}: expected {expected}"
    ))
}

/// Parses an integer setting within `min..=max`.
pub fn parse_count(key: &str, value: &str, min: u64, max: u64) -> Result<u64> {
    let expected = format!("an integer from {min} to {max}");
    let n: u64 = value
        .trim()
        .replace('_', "")
        .parse()
        .map_err(|_| range_error(key, value, &expected))?;
    if n < min || n > max {
        return Err(range_error(key, value, &expected));
    }
    Ok(n)
}

/// Parses a duration setting: a non-negative number with a unit (`ms`, `s`, `m`, `h`, `d`), or a
/// bare number of seconds. `0` is accepted and, for TTLs, means no expiry.
pub fn parse_duration(key: &str, value: &str) -> Result<Duration> {
    let err = || range_error(key, value, DURATION_RANGE);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        let ok = |s| parse_duration("k", s).unwrap();
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("30"), Duration::from_secs(30));
        assert_eq!(ok("10m"), Duration::from_secs(600));
        assert_eq!(ok("1.5h"), Duration::from_secs(5400));
    }

    #[test]
    fn bad_values_name_the_setting_and_the_range() {
        let mut c = HandleConfig::default();
        for (key, value) in [
            (HANDLE_CAPACITY, "0"),
            (HANDLE_CAPACITY, "-3"),
            (HANDLE_CAPACITY, "many"),
            (HANDLE_TTL, "-5s"),
            (HANDLE_TTL, "ten minutes"),
            (HANDLE_TTL, "5 fortnights"),
            (HANDLE_LIST_TTL, "1e400"),
            (HANDLE_IDLE_TIMEOUT, "-1"),
            (HANDLE_MAX_OPEN_FILES, "-1"),
        ] {
            let msg = c.set(key, value).unwrap_err().to_string();
            assert!(msg.contains(key), "{msg}");
            assert!(msg.contains(value), "{msg}");
            assert!(msg.contains("expected"), "{msg}");
        }
        assert_eq!(
            c,
            HandleConfig::default(),
            "a refused value changes nothing"
        );
        let msg = c.set("lakecache.handle.nope", "1").unwrap_err().to_string();
        assert!(
            msg.contains("unknown setting 'lakecache.handle.nope'"),
            "{msg}"
        );
    }

    #[test]
    fn sizes_parse_with_units_and_refuse_nonsense() {
        let ok = |s| parse_bytes("k", s).unwrap();
        assert_eq!(ok("512"), 512);
        assert_eq!(ok("512KiB"), 512 << 10);
        assert_eq!(ok("256MB"), 256 << 20);
        assert_eq!(ok("4 GiB"), 4 << 30);
        let mut c = IndexConfig::default();
        for bad in ["0", "-1", "1.5G", "12XB", "99999999999999999999", "2000TiB"] {
            let msg = c.set(INDEX_CAPACITY, bad).unwrap_err().to_string();
            assert!(
                msg.contains(INDEX_CAPACITY) && msg.contains("expected"),
                "{msg}"
            );
        }
        let msg = c.set(INDEX_MAX_ENTRY_PERCENT, "0").unwrap_err().to_string();
        assert!(msg.contains("from 1 to 100"), "{msg}");
        assert_eq!(c, IndexConfig::default());
        c.set(INDEX_MAX_ENTRY_PERCENT, "50").unwrap();
        c.set(INDEX_CAPACITY, "1MiB").unwrap();
        assert_eq!(c.max_entry_bytes(), 1 << 19);
    }

    #[test]
    fn good_values_are_applied() {
        let mut c = HandleConfig::default();
        c.set(HANDLE_CAPACITY, "5_000").unwrap();
        c.set(HANDLE_TTL, "0").unwrap();
        c.set(HANDLE_IDLE_TIMEOUT, "2m").unwrap();
        c.set(HANDLE_MAX_OPEN_FILES, "0").unwrap();
        assert_eq!(c.capacity, 5_000);
        assert_eq!(c.ttl, Duration::ZERO);
        assert_eq!(c.idle_timeout, Some(Duration::from_secs(120)));
        assert_eq!(c.max_open_files, 0);
        c.validate().unwrap();
        assert!(
            HandleConfig {
                capacity: 0,
                ..HandleConfig::default()
            }
            .validate()
            .is_err()
        );
    }
}
