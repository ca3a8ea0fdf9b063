//! The figures every cache reports: the public snapshot types ([`LakeStats`] and one per
//! cache), and the live counters behind them.
//!
//! Each cache owns one `CacheCounters`; its eviction listener feeds the removal figures, so
//! evictions, expirations and invalidations are exact counts rather than estimates.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use std::hash::Hash;

use moka::notification::RemovalCause;
use moka::sync::Cache;

/// A point-in-time snapshot of one cache's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheStats {
    /// Lookups served from the cache.
    pub hits: u64,
    /// Lookups that had to go to the store.
    pub misses: u64,
    /// Entries dropped to stay within the capacity.
    pub evictions: u64,
    /// Entries dropped because their TTL or idle timeout passed.
    pub expirations: u64,
    /// Entries dropped because a write, delete, rename or a newer version made them stale.
    pub invalidations: u64,
    /// Entries held now.
    pub entries: u64,
}

/// Live counters behind a [`CacheStats`] snapshot.
#[derive(Debug, Default)]
pub(crate) struct CacheCounters {
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    expirations: AtomicU64,
    invalidations: AtomicU64,
}

impl CacheCounters {
    pub(crate) fn hit(&self) {
        self.hits.fetch_add(1, Relaxed);
    }

    pub(crate) fn miss(&self) {
        self.misses.fetch_add(1, Relaxed);
    }

    /// Counts one removal reported by a moka eviction listener.
    pub(crate) fn removed(&self, cause: RemovalCause) {
        let counter = match cause {
            RemovalCause::Size => &self.evictions,
            RemovalCause::Expired => &self.expirations,
            RemovalCause::Explicit => &self.invalidations,
            // A newer value for the same key: the fresh insert is what matters.
            RemovalCause::Replaced => return,
        };
        counter.fetch_add(1, Relaxed);
    }

    /// Hits and misses so far, read without cache maintenance.
    pub(crate) fn lookups(&self) -> u64 {
        self.hits.load(Relaxed) + self.misses.load(Relaxed)
    }

    pub(crate) fn snapshot(&self, entries: u64) -> CacheStats {
        CacheStats {
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            expirations: self.expirations.load(Relaxed),
            invalidations: self.invalidations.load(Relaxed),
            entries,
        }
    }
}

/// Runs moka's pending evictions so a snapshot reflects the bound. moka gives up after 100 ms
/// of work per call when an eviction listener is set, so under heavy load one call can leave
/// evictions for later; a few more calls finish them.
pub(crate) fn settle<K, V>(cache: &Cache<K, V>, capacity: u64)
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    for _ in 0..8 {
        cache.run_pending_tasks();
        if cache.weighted_size() <= capacity {
            break;
        }
    }
}

/// Figures of the handle cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandleStats {
    /// Object metadata (HEAD) lookups.
    pub metadata: CacheStats,
    /// Listing (LIST) lookups.
    pub listings: CacheStats,
    /// Bytes the cached listings hold (`lakecache.handle.listing_bytes` bounds them).
    pub listing_bytes: u64,
    /// Proofs of access: lookups of whether a store identity has shown it can read a
    /// version, before it gets a cache hit for it.
    pub proofs: CacheStats,
    /// HEAD requests sent only to prove access to a version the caches held (one per
    /// identity and version at most, while proofs last).
    pub proof_heads: u64,
    /// Local file-descriptor lookups.
    pub files: CacheStats,
    /// Local file descriptors open now, held by the cache or by reads in progress.
    pub open_files: u64,
    /// Times a response showed a different version than the one cached.
    pub version_changes: u64,
}

/// Figures of the index cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IndexStats {
    /// Lookups, evictions and entries.
    pub footers: CacheStats,
    /// Bytes held now.
    pub bytes: u64,
    /// Footer loads run for scans. Unchanged across warm queries.
    pub footer_loads: u64,
    /// Bloom-filter loads that ran.
    pub bloom_loads: u64,
    /// Entries not kept because they exceed the per-entry share of the capacity.
    pub rejected: u64,
    /// The bloom-filter entries alone (they share the capacity with footers): lookups,
    /// removals and entries.
    pub bloom_filters: CacheStats,
    /// Bytes the bloom-filter entries hold.
    pub bloom_bytes: u64,
    /// Footer and bloom-filter loads running now.
    pub loads_in_flight: u64,
    /// Loads a waiter made again with its own store, after the load it joined failed on
    /// another store identity's error.
    pub reloads: u64,
    /// Footers loaded (or proven) for a listing before it ended, so that registering or
    /// scanning a table found them cached (`lakecache.index.on_listing`).
    pub warmed: u64,
    /// Footers served to DataFusion's planning (schema inference, file statistics) on a miss
    /// of its own footer cache, neither read nor decoded again.
    pub planning_hits: u64,
}

/// What a range held in the range cache's memory tier weighs besides its bytes, counted
/// against `lakecache.range.memory` so that its bound holds for small ranges too (a million
/// ranges of a few hundred bytes would otherwise hold twice their weight): moka's entry and
/// key (about 260 bytes) and the version's place in the tier's index of spans (about 170
/// bytes for its first range), measured with a heap profile of the scale bench's
/// registration (docs/benchmarks.md, "Scale"). [`RangeStats::memory_bytes`] includes it.
pub const RANGE_ENTRY_BOOKKEEPING: u64 = 432;

/// Figures of the range cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RangeStats {
    /// The memory tier. Hits and misses count pieces of reads found or not found in it.
    pub memory: CacheStats,
    /// Bytes the memory tier holds, as weighed against its capacity: each range's bytes and
    /// [`RANGE_ENTRY_BOOKKEEPING`] more for its bookkeeping.
    pub memory_bytes: u64,
    /// Bytes the memory tier may hold.
    pub memory_capacity: u64,
    /// The disk tier (all zero when it is off). Hits and misses count entries read or not
    /// found.
    pub disk: CacheStats,
    /// Bytes of the disk tier's files.
    pub disk_bytes: u64,
    /// Bytes the disk tier may hold; 0 when it is off.
    pub disk_capacity: u64,
    /// Bytes of reads served from memory.
    pub bytes_from_memory: u64,
    /// Bytes of reads served from disk.
    pub bytes_from_disk: u64,
    /// Bytes of reads fetched from the store (gaps of partly cached reads included).
    pub bytes_from_store: u64,
    /// Ranges not kept because they exceed an eighth of a tier.
    pub too_large: u64,
    /// Ranges a read got from a download another read (any session) had in the air, rather
    /// than a request of its own.
    pub shared: u64,
    /// Their bytes.
    pub bytes_shared: u64,
    /// Disk entries whose bytes did not match their checksum or version, deleted and refetched.
    pub disk_corrupt: u64,
    /// Ranges written to disk.
    pub disk_writes: u64,
    /// Disk writes that failed (the range stays in memory only).
    pub disk_write_errors: u64,
    /// Ranges not written because the disk fell behind.
    pub disk_skipped: u64,
    /// Downloads that waited for another process's download of the same bytes (processes
    /// sharing the disk tier's directory).
    pub disk_claims_waited: u64,
    /// Walks of the disk tier's directory: to evict when a write would pass its capacity,
    /// or to count a directory an earlier release filled.
    pub disk_walks: u64,
    /// Object versions this process keeps in its view of the disk tier (the listings of
    /// their directories it made), at most 65,536: the tier's whole index in memory.
    pub disk_view_versions: u64,
}

/// Prefetch figures of every scan so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PrefetchStats {
    /// Scans that started prefetching.
    pub scans: u64,
    /// Range downloads started.
    pub requests: u64,
    /// Bytes downloaded ahead of the reader.
    pub bytes_fetched: u64,
    /// Prefetched bytes handed to a reader.
    pub bytes_used: u64,
    /// Downloaded bytes dropped without ever being read.
    pub bytes_wasted: u64,
    /// Downloads aborted because their query ended.
    pub cancelled: u64,
    /// Downloads that failed; the reader then read those bytes itself.
    pub failed: u64,
    /// Downloads not started because the session's memory pool refused the reservation.
    pub memory_denied: u64,
    /// Time readers spent waiting for a download already under way, in milliseconds.
    pub wait_ms: u64,
    /// Most downloads one scan had in flight at once.
    pub peak_in_flight: u64,
    /// Downloads in flight now, over every scan.
    pub in_flight: u64,
    /// Bytes reserved by all scans now.
    pub reserved_bytes: u64,
    /// Most bytes one scan held reserved at once.
    pub peak_reserved_bytes: u64,
    /// Files open now with a prefetch lease, over every scan.
    pub leases: u64,
}

/// Running totals of what scans did, from `LakeCache::activity`: plain counters, read without
/// the cache maintenance a [`LakeStats`] snapshot runs, so a progress display can read them
/// many times a second. Subtract two readings for what happened between them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Activity {
    /// Parquet footers looked up (once per file a scan opens).
    pub footer_lookups: u64,
    /// Bytes the readers read from the range cache's memory.
    pub bytes_from_memory: u64,
    /// Bytes the readers read from the range cache's disk tier.
    pub bytes_from_disk: u64,
    /// Bytes the readers read from the store themselves.
    pub bytes_from_store: u64,
    /// Bytes downloaded ahead of the readers.
    pub bytes_prefetched: u64,
}

impl Activity {
    /// Every byte read so far, from wherever it came.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_from_memory
            + self.bytes_from_disk
            + self.bytes_from_store
            + self.bytes_prefetched
    }
}

/// Figures of the requests the versioned read sends to stores (`lakecache.store.*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// GETs of byte ranges sent, not counting hedges.
    pub gets: u64,
    /// Second requests sent for GETs (and HEADs proving access) still waiting past the
    /// recent 95th percentile.
    pub hedged: u64,
    /// Second requests that answered first.
    pub hedges_won: u64,
}

/// Figures of every cache of a `LakeCache`, from `LakeCache::stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LakeStats {
    /// The handle cache.
    pub handle: HandleStats,
    /// The index cache.
    pub index: IndexStats,
    /// The range cache.
    pub range: RangeStats,
    /// Prefetching, over every scan so far.
    pub prefetch: PrefetchStats,
    /// Requests to the stores.
    pub store: StoreStats,
}

impl LakeStats {
    /// Every figure as (cache, metric, value), the rows of `lakecache_metrics()`.
    pub fn rows(&self) -> Vec<(&'static str, &'static str, u64)> {
        let mut rows = Vec::new();
        let h = &self.handle;
        for (cache, s) in [
            ("handle.metadata", h.metadata),
            ("handle.listings", h.listings),
            ("handle.files", h.files),
            ("handle.proofs", h.proofs),
            ("index", self.index.footers),
            ("index.bloom", self.index.bloom_filters),
            ("range.memory", self.range.memory),
            ("range.disk", self.range.disk),
        ] {
            rows.extend([
                (cache, "hits", s.hits),
                (cache, "misses", s.misses),
                (cache, "evictions", s.evictions),
                (cache, "expirations", s.expirations),
                (cache, "invalidations", s.invalidations),
                (cache, "entries", s.entries),
            ]);
        }
        rows.extend([
            ("handle.files", "open_now", h.open_files),
            ("handle.metadata", "version_changes", h.version_changes),
            ("handle.proofs", "heads", h.proof_heads),
            ("handle.listings", "bytes", h.listing_bytes),
            ("index", "bytes", self.index.bytes),
            ("index", "footer_loads", self.index.footer_loads),
            ("index", "bloom_loads", self.index.bloom_loads),
            ("index", "rejected", self.index.rejected),
            ("index.bloom", "bytes", self.index.bloom_bytes),
            ("index", "loads_in_flight", self.index.loads_in_flight),
            ("index", "reloads", self.index.reloads),
            ("index", "warmed", self.index.warmed),
            ("index", "planning_hits", self.index.planning_hits),
        ]);
        let r = &self.range;
        rows.extend([
            ("range.memory", "bytes", r.memory_bytes),
            ("range.memory", "capacity", r.memory_capacity),
            ("range.memory", "bytes_served", r.bytes_from_memory),
            ("range.disk", "bytes", r.disk_bytes),
            ("range.disk", "capacity", r.disk_capacity),
            ("range.disk", "bytes_served", r.bytes_from_disk),
            ("range.disk", "corrupt", r.disk_corrupt),
            ("range.disk", "writes", r.disk_writes),
            ("range.disk", "write_errors", r.disk_write_errors),
            ("range.disk", "skipped", r.disk_skipped),
            ("range.disk", "claims_waited", r.disk_claims_waited),
            ("range.disk", "walks", r.disk_walks),
            ("range.disk", "view_versions", r.disk_view_versions),
            ("range", "bytes_from_store", r.bytes_from_store),
            ("range", "too_large", r.too_large),
            ("range", "shared", r.shared),
            ("range", "bytes_shared", r.bytes_shared),
        ]);
        rows.extend([
            ("store", "gets", self.store.gets),
            ("store", "hedged", self.store.hedged),
            ("store", "hedges_won", self.store.hedges_won),
        ]);
        let p = &self.prefetch;
        rows.extend([
            ("prefetch", "scans", p.scans),
            ("prefetch", "requests", p.requests),
            ("prefetch", "bytes_fetched", p.bytes_fetched),
            ("prefetch", "bytes_used", p.bytes_used),
            ("prefetch", "bytes_wasted", p.bytes_wasted),
            ("prefetch", "cancelled", p.cancelled),
            ("prefetch", "failed", p.failed),
            ("prefetch", "memory_denied", p.memory_denied),
            ("prefetch", "wait_ms", p.wait_ms),
            ("prefetch", "peak_in_flight", p.peak_in_flight),
            ("prefetch", "in_flight", p.in_flight),
            ("prefetch", "reserved_bytes", p.reserved_bytes),
            ("prefetch", "peak_reserved_bytes", p.peak_reserved_bytes),
            ("prefetch", "leases", p.leases),
        ]);
        rows
    }
}
