//! Every setting of the crate, declared once.
//!
//! `setting_table!` lists each setting a single time: its field, type, default, accepted
//! range, `lakecache.*` key, builder method, scope and description. From that one table come
//! the settings structs ([`HandleConfig`], [`IndexConfig`], [`PrefetchConfig`],
//! [`RangeConfig`], [`StoreConfig`], [`SqlConfig`]), [`Settings::set`] and [`Settings::get`] (the string form SQL `SET`, `SHOW
//! ALL` and configuration files use), validation with a message naming the setting, the
//! [`SETTINGS`] list, and the builder methods of `LakeCacheBuilder`. Adding a setting is one
//! row.
//!
//! Settings of the caches are shared by every session of a `LakeCache`; prefetching settings
//! belong to each session ([`Scope`]).

mod kinds;
mod options;

use std::path::PathBuf;
use std::time::Duration;

use datafusion::error::{DataFusionError, Result};

use kinds::{Count, Dir, Flag, Kind, OptionalSpan, Size, Span};
#[cfg(test)]
use kinds::{parse_bytes, parse_duration};
pub(crate) use options::Installed;
pub use options::LakeOptions;

/// Largest byte size accepted anywhere: 1 PiB. Larger values are unit mistakes.
const PIB: u64 = 1 << 50;

/// Who a setting belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The `LakeCache`: every session sharing it sees the same value; set it when building.
    Shared,
    /// One session: `SET` changes it for that session's next queries.
    Session,
}

/// One setting as `SHOW ALL` lists it.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// Its `lakecache.*` key.
    pub key: &'static str,
    /// What it does.
    pub description: &'static str,
    /// Who it belongs to.
    pub scope: Scope,
}

/// The table of every setting; `$then!` is called with it (see the module docs).
///
/// Each row: `field: Type = default, kind, "key", builder_method, Scope, "description";`
macro_rules! setting_table {
    ($then:ident) => {
        $then! {
            /// Settings of the handle cache (object metadata, listings, local descriptors).
            HandleConfig handle {
                enabled: bool = true, Flag, "lakecache.handle.enabled", handle_cache, Shared,
                    "Whether object metadata (HEAD, LIST) and local descriptors are cached.";
                capacity: u64 = 10_000, Count { min: 1, max: 1 << 40 },
                    "lakecache.handle.capacity", handle_capacity, Shared,
                    "Object metadata entries (HEAD, GET and LIST results) kept.";
                ttl: Duration = Duration::from_secs(600), Span,
                    "lakecache.handle.ttl", handle_ttl, Shared,
                    "How long cached object metadata and open descriptors are trusted; 0 means no expiry.";
                idle_timeout: Option<Duration> = None, OptionalSpan,
                    "lakecache.handle.idle_timeout", handle_idle_timeout, Shared,
                    "Entries not used for this long are dropped; 0 means no idle timeout.";
                list_ttl: Duration = Duration::from_secs(60), Span,
                    "lakecache.handle.list_ttl", list_ttl, Shared,
                    "How long a cached listing is reused: new files show up at most this late.";
                max_open_files: usize = 1_000, Count { min: 0, max: 1 << 20 },
                    "lakecache.handle.max_open_files", max_open_files, Shared,
                    "Local file descriptors kept open for reuse (0 = off), at most half the soft ulimit.";
            }
            /// Settings of the index cache (Parquet footers, page indexes, bloom filters).
            IndexConfig index {
                enabled: bool = true, Flag, "lakecache.index.enabled", index_cache, Shared,
                    "Whether decoded Parquet footers, page indexes and bloom filters are kept.";
                capacity_bytes: u64 = 256 << 20, Size { min: 1, max: PIB },
                    "lakecache.index.capacity", index_capacity_bytes, Shared,
                    "Bytes of decoded Parquet footers, page indexes and bloom filters kept.";
                max_entry_percent: u8 = 25, Count { min: 1, max: 100 },
                    "lakecache.index.max_entry_percent", index_max_entry_percent, Shared,
                    "An index entry above this share of the capacity (in percent) is not kept.";
                on_listing: bool = true, Flag, "lakecache.index.on_listing", index_on_listing, Shared,
                    "Whether a listing's Parquet files have their footers loaded before the listing ends, all at once within the prefetch ceiling and budget: registering a table then takes one round trip for its footers, not one per 32 files.";
            }
            /// Settings of prefetching. The number of downloads in flight is not a setting: it
            /// grows while the aggregate throughput still rises, then holds 1.5 x the link's
            /// measured bandwidth-delay product, bounded only by `max_in_flight`. The bytes
            /// they may hold follow `clamp(downloads x largest range seen, buffer, 4 x buffer)`,
            /// raised to the bytes wanted in flight plus the buffer, never above `max_bytes`.
            PrefetchConfig prefetch {
                enabled: bool = true, Flag, "lakecache.prefetch.enabled", prefetch, Session,
                    "Whether this session's Parquet scans download ahead of their readers.";
                max_in_flight: usize = 512, Count { min: 1, max: 4096 },
                    "lakecache.prefetch.max_in_flight", prefetch_max_in_flight, Session,
                    "Ceiling on one scan's downloads in flight (the store's request rate, sockets); within it they are sized to the link's measured bandwidth-delay product.";
                buffer_bytes: u64 = 32 << 20, Size { min: 1, max: PIB },
                    "lakecache.prefetch.buffer", prefetch_buffer_bytes, Session,
                    "Smallest byte budget of a scan's prefetches: clamp(downloads x largest range, buffer, 4 x buffer).";
                max_bytes: u64 = 256 << 20, Size { min: 1, max: PIB },
                    "lakecache.prefetch.max_bytes", prefetch_max_bytes, Session,
                    "Largest byte budget of a scan's prefetches, whatever the rule gives (at least the buffer).";
                small_file_bytes: u64 = 512 << 10, Size { min: 1, max: PIB },
                    "lakecache.prefetch.small_file", prefetch_small_file_bytes, Session,
                    "A file this small whose footer is not cached is fetched whole in one request.";
                split_bytes: u64 = 8 << 20, Size { min: 64 << 10, max: PIB },
                    "lakecache.prefetch.split_size", prefetch_split_bytes, Session,
                    "Ranges longer than this are fetched as parallel requests of this size.";
            }
            /// Settings of the range cache (bytes of remote objects, in memory and on disk).
            RangeConfig range {
                enabled: bool = true, Flag, "lakecache.range.enabled", range_cache, Shared,
                    "Whether bytes read from remote stores are kept and served again.";
                memory_bytes: u64 = 1 << 30, Size { min: 1 << 20, max: PIB },
                    "lakecache.range.memory", range_memory_bytes, Shared,
                    "Bytes of remote objects kept in memory; ranges read twice win over ranges read once.";
                disk_dir: Option<PathBuf> = None, Dir,
                    "lakecache.range.disk_dir", range_disk_dir, Shared,
                    "Directory where bytes of remote objects are also kept, checksummed, across restarts; empty = none.";
                disk_bytes: u64 = 16 << 30, Size { min: 1 << 20, max: PIB },
                    "lakecache.range.disk_capacity", range_disk_bytes, Shared,
                    "Bytes the disk tier keeps; least recently used ranges go first.";
            }
            /// Settings of the requests the versioned read makes to a store.
            StoreConfig store {
                hedge: bool = true, Flag, "lakecache.store.hedge", hedge_requests, Shared,
                    "Whether a GET still waiting for its first byte past the 95th percentile of recent ones is sent again (at most 5% more requests; first answer wins).";
            }
            /// What installed sessions may do in SQL.
            SqlConfig sql {
                clear: bool = false, Flag, "lakecache.sql.clear", sql_clear, Shared,
                    "Whether sessions get lakecache_clear(), which empties the caches every session shares: off, so that no session can empty every tenant's caches.";
            }
        }
    };
}
pub(crate) use setting_table;

/// Generates the settings structs, [`Settings`] and [`SETTINGS`] from `setting_table!`.
macro_rules! define_settings {
    ($(
        $(#[$doc:meta])*
        $name:ident $group:ident {
            $($field:ident: $ty:ty = $default:expr, $kind:expr, $key:literal, $builder:ident,
              $scope:ident, $desc:literal;)*
        }
    )*) => {
        $(
            $(#[$doc])*
            #[derive(Debug, Clone, PartialEq, Eq)]
            #[non_exhaustive]
            pub struct $name {
                $(
                    #[doc = concat!($desc, " (`", $key, "`)")]
                    pub $field: $ty,
                )*
            }

            impl Default for $name {
                fn default() -> Self {
                    Self { $($field: $default,)* }
                }
            }
        )*

        /// Every setting, grouped by what it configures.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct Settings {
            $(
                #[doc = concat!("The `lakecache.", stringify!($group), ".*` settings.")]
                pub $group: $name,
            )*
        }

        /// Every setting, in the order `SHOW ALL` lists them.
        pub const SETTINGS: &[Setting] = &[
            $($(Setting { key: $key, description: $desc, scope: Scope::$scope },)*)*
        ];

        impl Settings {
            /// Sets the setting `key` from its string form, as `SET` does. The value is applied
            /// only if it and every other setting stay valid; an error names the key and what
            /// it accepts.
            pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
                let mut next = self.clone();
                match key {
                    $($(
                        $key => next.$group.$field = <_ as Kind<$ty>>::parse(&$kind, $key, value)?,
                    )*)*
                    _ => return Err(unknown(key)),
                }
                next.validate()?;
                *self = next;
                Ok(())
            }

            /// The value of `key` as [`Settings::set`] accepts it; `None` for an unknown key.
            pub fn get(&self, key: &str) -> Option<String> {
                match key {
                    $($($key => Some(<_ as Kind<$ty>>::format(&$kind, &self.$group.$field)),)*)*
                    _ => None,
                }
            }

            /// Checks every setting against its accepted range, and the rules between them.
            pub fn validate(&self) -> Result<()> {
                $($(<_ as Kind<$ty>>::check(&$kind, $key, &self.$group.$field)?;)*)*
                self.prefetch.check_budget()
            }
        }
    };
}

setting_table!(define_settings);

/// The setting `key`, if it is one.
pub fn setting(key: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.key == key)
}

fn unknown(key: &str) -> DataFusionError {
    let known: Vec<&str> = SETTINGS.iter().map(|s| s.key).collect();
    DataFusionError::Configuration(format!(
        "unknown setting '{key}'; the lakecache settings are {}",
        known.join(", ")
    ))
}

impl IndexConfig {
    /// The largest entry kept, in bytes.
    pub fn max_entry_bytes(&self) -> u64 {
        self.capacity_bytes * u64::from(self.max_entry_percent) / 100
    }
}

impl PrefetchConfig {
    /// The scan's byte budget for `workers` downloads when the largest range seen so far is
    /// `largest` bytes and `in_flight` bytes are wanted in flight: the seed rule
    /// `clamp(workers x largest, buffer, 4 x buffer)`, raised to `in_flight + buffer` (a link
    /// with a large bandwidth-delay product needs that much in flight, and readers a buffer
    /// beyond it), capped by `max_bytes`.
    pub fn budget(&self, workers: usize, largest: u64, in_flight: u64) -> u64 {
        (workers as u64)
            .saturating_mul(largest)
            .clamp(self.buffer_bytes, self.buffer_bytes.saturating_mul(4))
            .max(in_flight.saturating_add(self.buffer_bytes))
            .min(self.max_bytes)
    }

    fn check_budget(&self) -> Result<()> {
        if self.max_bytes < self.buffer_bytes {
            return Err(kinds::invalid(
                "lakecache.prefetch.max_bytes",
                &self.max_bytes.to_string(),
                &format!(
                    "a size no smaller than lakecache.prefetch.buffer ({} bytes)",
                    self.buffer_bytes
                ),
            ));
        }
        Ok(())
    }
}

impl RangeConfig {
    /// The largest entry a tier of `capacity` bytes keeps: an eighth, so one download cannot
    /// flush most of a tier.
    pub fn max_entry_bytes(capacity: u64) -> u64 {
        capacity / 8
    }
}

#[cfg(test)]
mod tests;
