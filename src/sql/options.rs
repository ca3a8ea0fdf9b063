//! [`LakeOptions`]: the `lakecache.*` settings of a session, for `SET`, `SHOW ALL` and
//! `information_schema.df_settings`.
//!
//! Written by hand rather than with DataFusion's `extensions_options!`, whose entries drop
//! the `lakecache.` prefix: exported session options (as Ballista ships them to executors)
//! must keep it to be read back.
//!
//! Prefetching settings belong to the session: `SET lakecache.prefetch.max_in_flight = 16`
//! changes that session's next scans. The handle, index and range cache settings belong to the
//! `LakeCache` every installed session shares; they are listed with their values, and a
//! `SET` to another value is refused with the way to change them, rather than silently
//! applying to other sessions' caches.

use std::any::Any;
use std::time::Duration;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::error::{DataFusionError, Result};

use crate::LakeCache;
use crate::config::{
    HANDLE_CAPACITY, HANDLE_ENABLED, HANDLE_IDLE_TIMEOUT, HANDLE_LIST_TTL, HANDLE_MAX_OPEN_FILES,
    HANDLE_TTL, HandleConfig, INDEX_CAPACITY, INDEX_ENABLED, INDEX_MAX_ENTRY_PERCENT, IndexConfig,
    PREFETCH_BUFFER, PREFETCH_ENABLED, PREFETCH_MAX_BYTES, PREFETCH_MAX_IN_FLIGHT,
    PREFETCH_SMALL_FILE, PREFETCH_SPLIT, PrefetchConfig, RANGE_DISK_CAPACITY, RANGE_DISK_DIR,
    RANGE_ENABLED, RANGE_MEMORY, RangeConfig,
};

/// Every `lakecache.*` key with its description, in the order `SHOW ALL` lists them.
const KEYS: [(&str, &str); 19] = [
    (
        HANDLE_ENABLED,
        "Whether object metadata (HEAD, LIST) and local descriptors are cached; the range cache needs it. Shared.",
    ),
    (
        HANDLE_CAPACITY,
        "Object metadata entries (HEAD, GET and LIST results) the handle cache keeps. Shared by every session of the LakeCache.",
    ),
    (
        HANDLE_TTL,
        "How long cached object metadata and open descriptors are trusted; 0 means no expiry. Shared.",
    ),
    (
        HANDLE_IDLE_TIMEOUT,
        "Entries not used for this long are dropped; 0 means none. Shared.",
    ),
    (
        HANDLE_LIST_TTL,
        "How long a cached listing is reused: new files show up at most this late. Shared.",
    ),
    (
        HANDLE_MAX_OPEN_FILES,
        "Local file descriptors kept open for reuse (0 = off), at most half the soft ulimit. Shared.",
    ),
    (
        INDEX_ENABLED,
        "Whether decoded Parquet footers, page indexes and bloom filters are kept. Shared.",
    ),
    (
        INDEX_CAPACITY,
        "Bytes of decoded Parquet footers, page indexes and bloom filters kept. Shared.",
    ),
    (
        INDEX_MAX_ENTRY_PERCENT,
        "An index entry above this share of the capacity is not kept. Shared.",
    ),
    (
        PREFETCH_ENABLED,
        "Whether this session's Parquet scans download ahead of their readers.",
    ),
    (
        PREFETCH_MAX_IN_FLIGHT,
        "Most downloads one scan keeps in flight (1 to 1024); fewer start while throughput stops rising.",
    ),
    (
        PREFETCH_BUFFER,
        "Smallest byte budget of a scan's prefetches; the budget is clamp(downloads x largest range, buffer, 4 x buffer).",
    ),
    (
        PREFETCH_MAX_BYTES,
        "Largest byte budget of a scan's prefetches, whatever the rule gives (at least the buffer).",
    ),
    (
        PREFETCH_SMALL_FILE,
        "A file this small whose footer is not cached is fetched whole in one request.",
    ),
    (
        PREFETCH_SPLIT,
        "Ranges longer than this are fetched as parallel requests of this size (at least 64KiB).",
    ),
    (
        RANGE_ENABLED,
        "Whether bytes read from remote stores are kept (memory, and disk if configured) and served again. Shared.",
    ),
    (
        RANGE_MEMORY,
        "Bytes of remote objects kept in memory; ranges read twice win over ranges read once. Shared.",
    ),
    (
        RANGE_DISK_DIR,
        "Directory where bytes of remote objects are also kept, checksummed, across restarts; empty = no disk tier. Shared.",
    ),
    (
        RANGE_DISK_CAPACITY,
        "Bytes the disk tier keeps; least recently used ranges go first. Shared.",
    ),
];

/// The `lakecache.*` settings of one session. [`LakeCache::install`] registers them.
#[derive(Debug, Clone)]
pub struct LakeOptions {
    handle: HandleConfig,
    index: IndexConfig,
    range: RangeConfig,
    /// This session's prefetching settings.
    pub prefetch: PrefetchConfig,
}

impl LakeOptions {
    /// The settings of a session installed from `lake`: its shared cache settings, and its
    /// prefetching defaults.
    pub fn new(lake: &LakeCache) -> Self {
        Self {
            handle: lake.handles().config().clone(),
            index: lake.index().config().clone(),
            range: lake.ranges().config().clone(),
            prefetch: lake.prefetch_config().clone(),
        }
    }

    /// The current value of `key`, as `SET` would accept it.
    fn value(&self, key: &str) -> String {
        let h = &self.handle;
        let p = &self.prefetch;
        match key {
            HANDLE_ENABLED => h.enabled.to_string(),
            HANDLE_CAPACITY => h.capacity.to_string(),
            HANDLE_TTL => format_duration(h.ttl),
            HANDLE_IDLE_TIMEOUT => format_duration(h.idle_timeout.unwrap_or_default()),
            HANDLE_LIST_TTL => format_duration(h.list_ttl),
            HANDLE_MAX_OPEN_FILES => h.max_open_files.to_string(),
            INDEX_ENABLED => self.index.enabled.to_string(),
            INDEX_CAPACITY => format_bytes(self.index.capacity_bytes),
            INDEX_MAX_ENTRY_PERCENT => self.index.max_entry_percent.to_string(),
            PREFETCH_ENABLED => p.enabled.to_string(),
            PREFETCH_MAX_IN_FLIGHT => p.max_in_flight.to_string(),
            PREFETCH_BUFFER => format_bytes(p.buffer_bytes),
            PREFETCH_MAX_BYTES => format_bytes(p.max_bytes),
            PREFETCH_SMALL_FILE => format_bytes(p.small_file_bytes),
            PREFETCH_SPLIT => format_bytes(p.split_bytes),
            RANGE_ENABLED => self.range.enabled.to_string(),
            RANGE_MEMORY => format_bytes(self.range.memory_bytes),
            RANGE_DISK_DIR => self
                .range
                .disk_dir
                .as_ref()
                .map_or(String::new(), |d| d.display().to_string()),
            RANGE_DISK_CAPACITY => format_bytes(self.range.disk_bytes),
            _ => String::new(),
        }
    }
}

impl ConfigExtension for LakeOptions {
    const PREFIX: &'static str = "lakecache";
}

impl ExtensionOptions for LakeOptions {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    /// `key` comes without its `lakecache.` prefix, as DataFusion routes it.
    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let key = format!("{}.{key}", Self::PREFIX);
        if key.starts_with("lakecache.prefetch.") {
            return self.prefetch.set(&key, value);
        }
        let mut after = self.clone();
        if key.starts_with("lakecache.handle.") {
            after.handle.set(&key, value)?;
        } else if key.starts_with("lakecache.index.") {
            after.index.set(&key, value)?;
        } else if key.starts_with("lakecache.range.") {
            after.range.set(&key, value)?;
        } else {
            let known: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
            return Err(DataFusionError::Configuration(format!(
                "unknown setting '{key}'; the lakecache settings are {}",
                known.join(", ")
            )));
        }
        if after.value(&key) == self.value(&key) {
            return Ok(());
        }
        Err(DataFusionError::Configuration(format!(
            "{key} is {} for every session sharing this LakeCache and cannot be changed by one \
             of them; build the LakeCache with it instead (LakeCache::builder().set(\"{key}\", \
             \"{value}\"))",
            self.value(&key)
        )))
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        KEYS.iter()
            .map(|&(key, description)| ConfigEntry {
                key: key.to_string(),
                value: Some(self.value(key)),
                description,
            })
            .collect()
    }
}

/// `bytes` in the largest unit that divides it, as `parse_bytes` reads it back.
fn format_bytes(bytes: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// `d` in the largest unit that divides it, as `parse_duration` reads it back.
fn format_duration(d: Duration) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_bytes, parse_duration};

    #[test]
    fn values_read_back_as_set_accepts_them() {
        for bytes in [1, 1023, 1024, 512 << 10, 256 << 20, 3 << 30, (1 << 20) + 1] {
            assert_eq!(parse_bytes("k", &format_bytes(bytes)).unwrap(), bytes);
        }
        for ms in [1, 500, 1_000, 60_000, 90_000, 3_600_000, 86_400_000] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse_duration("k", &format_duration(d)).unwrap(), d);
        }
    }

    #[test]
    fn every_key_is_listed_with_its_prefix_and_a_value() {
        let options = LakeOptions::new(&LakeCache::builder().build().unwrap());
        let entries = options.entries();
        assert_eq!(entries.len(), KEYS.len());
        for e in entries {
            assert!(e.key.starts_with("lakecache."), "{}", e.key);
            let empty_means_off = e.key == RANGE_DISK_DIR;
            assert!(
                e.value.is_some_and(|v| empty_means_off || !v.is_empty()),
                "{}",
                e.key
            );
        }
    }
}
