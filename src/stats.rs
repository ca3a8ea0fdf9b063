//! Counters shared by every cache of the crate, and the snapshot they report.
//!
//! Each cache owns one `CacheCounters`; its eviction listener feeds the removal figures, so
//! evictions, expirations and invalidations are exact counts rather than estimates.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use std::hash::Hash;

use moka::notification::RemovalCause;
use moka::sync::Cache;

/// A point-in-time snapshot of one cache's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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
