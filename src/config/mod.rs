//! Every setting of the crate, declared once.
//!
//! `setting_table!` lists each setting a single time: its field, type, default, accepted
//! range, `lakecache.*` key, builder method, scope and description. From that one table come
//! the settings structs ([`HandleConfig`], [`IndexConfig`], [`PrefetchConfig`],
//! [`RangeConfig`], [`StoreConfig`], [`SqlConfig`]), [`Settings::set`] and [`Settings::get`]
//! (the string form of SQL `SET`, `SHOW ALL` and `LakeCacheBuilder::set`), validation with a
//! message naming the setting, the [`SETTINGS`] list, and the builder methods of
//! `LakeCacheBuilder`. Adding a setting is one row.
//!
//! Prefetching settings belong to each session; every other setting (the caches',
//! `lakecache.store.*` and `lakecache.sql.*`) is shared by every session of a `LakeCache`
//! ([`Scope`]).

mod kinds;
mod options;
mod reference;

use std::path::PathBuf;
use std::time::Duration;

use datafusion::error::{DataFusionError, Result};

pub use kinds::parse_bytes;
#[cfg(test)]
use kinds::parse_duration;
use kinds::{Count, Dir, Flag, Kind, OptionalSpan, Size, Span};
pub(crate) use options::Installed;
pub use options::LakeOptions;
pub use reference::{VARIABLE_PREFIX, settings_reference, variable_of};

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
/// Each group: its doc, struct, group name and title (a heading of docs/configuration.md).
/// Each row: `field: Type = default, kind, "key", builder_method, Scope, "description",
/// "what it trades";`. The description is the line `SHOW ALL` and rustdoc show; what it trades
/// follows it in docs/configuration.md.
macro_rules! setting_table {
    ($then:ident) => {
        $then! {
            /// Settings of the handle cache (object metadata, listings, local descriptors).
            HandleConfig handle "Handle cache" {
                enabled: bool = true, Flag, "lakecache.handle.enabled", handle_cache, Shared,
                    "Whether object metadata (HEAD, LIST) and local descriptors are cached.",
                    "Off: every HEAD and LIST reaches the store and no descriptor is kept. Scans still read at the version they planned with, and their bytes are still kept.";
                capacity: u64 = 100_000, Count { min: 1, max: 1 << 40 },
                    "lakecache.handle.capacity", handle_capacity, Shared,
                    "Objects whose metadata (HEAD, GET and LIST results) and proofs of access are kept: one entry per object, shared by every store identity that showed it (an entry weighs one more per 32 identities).",
                    "Hold a table's files, or every warm query asks the store a HEAD per file it lacks (said once in the log when entries are evicted for room). About 1.8 KiB per object listed and read by one identity, 0.5 KiB per further identity, measured at 1,000,000 objects (docs/tuning.md). Listings have a bound of their own (`listing_bytes`).";
                listing_bytes: u64 = 256 << 20, Size { min: 1, max: PIB },
                    "lakecache.handle.listing_bytes", handle_listing_bytes, Shared,
                    "Bytes of cached listings kept, each listed object weighing its path, e_tag and about 100 bytes.",
                    "A listing larger than this is not cached (said once in the log): every query lists its prefix again. About 150 MiB holds a listing of a million objects.";
                ttl: Duration = Duration::from_secs(600), Span,
                    "lakecache.handle.ttl", handle_ttl, Shared,
                    "How long cached object metadata and open descriptors are trusted; 0 means no expiry.",
                    "Longer: fewer requests; a file replaced behind the cache's back is noticed later (a read of a replaced object is still never mixed: see Consistency below).";
                idle_timeout: Option<Duration> = None, OptionalSpan,
                    "lakecache.handle.idle_timeout", handle_idle_timeout, Shared,
                    "Entries not used for this long are dropped; 0 means no idle timeout.",
                    "Frees the descriptors of files no query reads any more.";
                list_ttl: Duration = Duration::from_secs(60), Span,
                    "lakecache.handle.list_ttl", list_ttl, Shared,
                    "How long a cached listing is reused: new files show up at most this late.",
                    "Longer: fewer LISTs; files added to a table show up in queries later.";
                max_open_files: usize = 1_000, Count { min: 0, max: 1 << 20 },
                    "lakecache.handle.max_open_files", max_open_files, Shared,
                    "Local file descriptors kept open for reuse (0 = off), at most half the soft ulimit.",
                    "Descriptors are kept for positional reads of `file://` objects; never more than half the process's soft `ulimit -n`, whatever is set.";
            }
            /// Settings of the index cache (Parquet footers, page indexes, bloom filters).
            IndexConfig index "Index cache" {
                enabled: bool = true, Flag, "lakecache.index.enabled", index_cache, Shared,
                    "Whether decoded Parquet footers, page indexes and bloom filters are kept.",
                    "Off: footers, page indexes and bloom filters are read and decoded by every scan (and by planning), as DataFusion does without a metadata cache.";
                capacity_bytes: u64 = 256 << 20, Size { min: 1, max: PIB },
                    "lakecache.index.capacity", index_capacity_bytes, Shared,
                    "Bytes of decoded Parquet footers, page indexes and bloom filters kept.",
                    "Larger: more files stay warm; the memory is held until evicted. Sizes are powers of 1024.";
                max_entry_percent: u8 = 25, Count { min: 1, max: 100 },
                    "lakecache.index.max_entry_percent", index_max_entry_percent, Shared,
                    "An index entry above this share of the capacity (in percent) is not kept.",
                    "So that one huge footer cannot flush every other file's. Refusals are counted (`index` / `rejected` in `lakecache_metrics()`).";
                datafusion_statistics_bytes: u64 = 20 << 20, Size { min: 1, max: PIB },
                    "lakecache.index.datafusion_statistics", index_datafusion_statistics_bytes, Shared,
                    "Bytes of DataFusion's own file statistics cache in each installed session (and each runtime made with `cache_manager_config()`): planning takes every file's statistics from it.",
                    "DataFusion's default (20 MiB). A table whose files' statistics do not fit has them made again from the footers on every plan, a cost per file (said once in the log with this key). What a file's statistics weigh grows with its columns: `cargo bench --bench scale -- --scenario files` prints it. Each session holds its own, up to this.";
                on_listing: bool = true, Flag, "lakecache.index.on_listing", index_on_listing, Shared,
                    "Whether a listing's Parquet files have their footers loaded before the listing ends, all at once within the prefetch ceiling and budget: registering a table then takes one round trip for its footers, not one per 32 files.",
                    "DataFusion's planning then finds the footers cached. The reads use the `LakeCache`'s prefetch settings as built, not a session's. Off: registration reads footers as DataFusion does, 32 at a time, small files whole.";
            }
            /// Settings of prefetching. The number of downloads in flight is not a setting: it
            /// grows while the aggregate throughput still rises, then holds 1.5 x the link's
            /// measured bandwidth-delay product, bounded only by `max_in_flight`. The bytes
            /// they may hold follow `clamp(downloads x largest range seen, buffer, 4 x buffer)`,
            /// raised to the bytes wanted in flight plus the buffer, never above `max_bytes`.
            PrefetchConfig prefetch "Prefetching" {
                enabled: bool = true, Flag, "lakecache.prefetch.enabled", prefetch, Session,
                    "Whether this session's Parquet scans download ahead of their readers.",
                    "Off: scans read as DataFusion does, one request at a time per partition.";
                max_in_flight: usize = 512, Count { min: 1, max: 4096 },
                    "lakecache.prefetch.max_in_flight", prefetch_max_in_flight, Session,
                    "Ceiling on one scan's downloads in flight (the store's request rate, sockets); within it they are sized to the link's measured bandwidth-delay product.",
                    "A ceiling, not the number in flight (that follows the link). Each download is a connection to the store, and stores throttle per prefix (S3: about 5,500 GETs a second): lower it for a store that answers 503 or a process short of sockets.";
                buffer_bytes: u64 = 32 << 20, Size { min: 1, max: PIB },
                    "lakecache.prefetch.buffer", prefetch_buffer_bytes, Session,
                    "Smallest byte budget of a scan's prefetches: clamp(downloads x largest range, buffer, 4 x buffer).",
                    "At most `max_bytes`. The budget is raised to the bytes the link needs in flight plus this buffer.";
                max_bytes: u64 = 256 << 20, Size { min: 1, max: PIB },
                    "lakecache.prefetch.max_bytes", prefetch_max_bytes, Session,
                    "Largest byte budget of a scan's prefetches, whatever the rule gives (at least the buffer).",
                    "At least `buffer`. A range larger than this is never prefetched.";
                small_file_bytes: u64 = 512 << 10, Size { min: 1, max: PIB },
                    "lakecache.prefetch.small_file", prefetch_small_file_bytes, Session,
                    "A file this small whose footer is not cached is fetched whole in one request.",
                    "Footer and data in one request, as DataFusion's metadata size hint reads such files whole.";
                split_bytes: u64 = 8 << 20, Size { min: 64 << 10, max: PIB },
                    "lakecache.prefetch.split_size", prefetch_split_bytes, Session,
                    "Ranges longer than this are fetched as parallel requests of this size.",
                    "More requests, but a single slow connection no longer holds a whole column chunk.";
                local_files: bool = false, Flag, "lakecache.prefetch.local_files", prefetch_local_files, Session,
                    "Whether scans of local files (`file://`, read through cached descriptors) download ahead too.",
                    "Off by default: the operating system's read-ahead and page cache serve them, as they serve DataFusion alone; warm over files in the page cache that measured 0.98-1.01x vanilla's time against 1.04-1.09x on (docs/benchmarks.md, TPC-H). On for a slow disk or a network file system mounted as a local one.";
            }
            /// Settings of the range cache (bytes of remote objects, in memory and on disk).
            /// Bytes of `file://` objects are left to the operating system's page cache.
            RangeConfig range "Range cache" {
                enabled: bool = true, Flag, "lakecache.range.enabled", range_cache, Shared,
                    "Whether bytes read from remote stores are kept and served again.",
                    "Off: every read goes to the store, as without lakecache.";
                memory_bytes: u64 = 1 << 30, Size { min: 1 << 20, max: PIB },
                    "lakecache.range.memory", range_memory_bytes, Shared,
                    "Bytes of remote objects kept in memory; ranges read twice win over ranges read once.",
                    "A range larger than an eighth of it is not kept. When full, moka's TinyLFU admission lets a range in only if it is read more often than what it would push out: one large scan does not flush the ranges repeated queries read. Each range weighs its bytes and 432 more for its bookkeeping, so the bound holds for small ranges too. Not reserved in DataFusion's `MemoryPool`: it is shared by every session and bounded by this capacity.";
                disk_dir: Option<PathBuf> = None, Dir,
                    "lakecache.range.disk_dir", range_disk_dir, Shared,
                    "Directory where bytes of remote objects are also kept, checksummed, across restarts; empty = none.",
                    "Also `range_disk(dir, bytes)`. Ranges of versions named by a content digest (an e_tag of 32 or more hex digits, optionally `-<parts>`: S3's MD5 and multipart `<md5>-<parts>` e_tags, GCS's MD5 ones) are written, one file each with the version and a checksum in its header; a new process reuses them. Other versions (Azure's and most HTTP servers' e_tags, counters, version ids, local files) stay in memory only. An entry whose bytes or version do not match is deleted and fetched again, never returned. Any number of processes of one user may use the same directory at once (Python workers, several `lakecache` runs, executors on one host): each reads what the others wrote, a range several of them miss at once is downloaded by one while the others wait for it, and together they keep it within `disk_capacity`. Not for a directory another user can write to (it is created private to its user, and a process of another user cannot open it). A process killed at any point leaves no partial entry and holds nothing the others wait for.";
                disk_bytes: u64 = 16 << 30, Size { min: 1 << 20, max: PIB },
                    "lakecache.range.disk_capacity", range_disk_bytes, Shared,
                    "Bytes the disk tier keeps; least recently used ranges go first.",
                    "The directory's bound, whichever processes wrote its ranges: a write that would pass it first deletes the least recently used entries (by last read, in any process, across restarts) down to nine tenths of it. Processes that set different capacities on one directory each hold it to their own. Writes happen off the query's path; when the disk falls behind by more than 256 MiB, ranges are not written (counted as `skipped`).";
            }
            /// Settings of the requests the versioned read makes to a store.
            StoreConfig store "Store requests" {
                hedge: bool = true, Flag, "lakecache.store.hedge", hedge_requests, Shared,
                    "Whether a GET (or a HEAD) still waiting for its first byte past the 95th percentile of recent ones is sent again (at most 5% more requests; the first success wins).",
                    "The percentile is of the store's last 256 waits (shared by every instance of one store URL, whoever's credentials ask), once 8 are known, each counted from when the request was on its way: a request sent in a burst waits behind the ones sent before it, and is not copied for that (it is on its way once all but one in 4 of those are answered). At most one copy per 20 requests of the store (a copy that is slow too may get a third attempt within that share); only the wait for the response is raced, never a body already arriving. A copy carries the same `If-Match`, so it reads the same version or fails the same way; a read fails only when every attempt failed. Counted as `store` / `hedged` and `hedges_won` in `lakecache_metrics()`. Off for a store that bills per request or throttles near its limit.";
            }
            /// What installed sessions may do in SQL.
            SqlConfig sql "SQL" {
                clear: bool = false, Flag, "lakecache.sql.clear", sql_clear, Shared,
                    "Whether sessions get lakecache_clear(), which empties the caches every session shares: off, so that no session can empty every tenant's caches.",
                    "`lakecache_clear()` empties every cache, `lakecache_clear('handle' | 'index' | 'range')` one, when the query runs (not when it is planned or explained). The `lakecache` tool turns it on for its own sessions.";
                manage: bool = false, Flag, "lakecache.sql.manage", sql_manage, Shared,
                    "Whether sessions get lakecache_warm(), lakecache_entries() and lakecache_invalidate(), each over what the session's own stores have shown: off, as they act on caches every session shares.",
                    "`lakecache_warm('table' [, 'a, b'])` reads the table's columns (all, or those named) once through the caches, filling footers and bytes within their bounds; `lakecache_entries()` lists, per object version the session's stores have shown, the bytes each cache holds; `lakecache_invalidate('url')` drops what the caches hold of the versions the session's store has shown at that object (every object below a URL ending in `/`) and that store's listings there. The `lakecache` tool turns it on for its own sessions.";
            }
        }
    };
}
pub(crate) use setting_table;

/// Generates the settings structs, [`Settings`] and [`SETTINGS`] from `setting_table!`.
macro_rules! define_settings {
    ($(
        $(#[$doc:meta])*
        $name:ident $group:ident $title:literal {
            $($field:ident: $ty:ty = $default:expr, $kind:expr, $key:literal, $builder:ident,
              $scope:ident, $desc:literal, $trades:literal;)*
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
