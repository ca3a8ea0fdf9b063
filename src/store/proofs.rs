//! Proofs of access, per store instance: what a registered store has itself shown it can
//! read, before its session gets a hit for it.
//!
//! Entries are keyed by object version and shared by every session of a `LakeCache`, so a
//! server that makes a store per session keeps sharing bytes and footers. But two sessions
//! may register different stores at one URL (other credentials, another endpoint), and a
//! session whose store would refuse a request must never get another's rows as cache hits.
//! So each wrapper remembers, for a while, the objects and listings its own store answered:
//! an object it listed, HEADed, read or wrote; a prefix it listed. A cached listing is served
//! to a wrapper only once it listed that prefix itself, cached metadata, footers and bytes of
//! an object only once it has shown that object (a HEAD proves it when nothing else has).
//! A new or re-registered store starts with no proofs.

use std::time::Duration;

use moka::sync::Cache;
use object_store::path::Path;

use crate::config::HandleConfig;
use crate::handle::ListKey;

/// What one store instance has shown it can read.
pub(super) struct Proofs {
    objects: Cache<Path, ()>,
    listings: Cache<ListKey, ()>,
}

impl Proofs {
    /// Proofs bounded as the handle cache is, lasting as long as its entries do.
    pub(super) fn new(config: &HandleConfig) -> Self {
        Self {
            objects: bounded(config.capacity, config.ttl),
            listings: bounded(config.capacity, config.list_ttl),
        }
    }

    pub(super) fn object(&self, path: &Path) -> bool {
        self.objects.contains_key(path)
    }

    pub(super) fn prove_object(&self, path: &Path) {
        if !self.objects.contains_key(path) {
            self.objects.insert(path.clone(), ());
        }
    }

    pub(super) fn listing(&self, key: &ListKey) -> bool {
        self.listings.contains_key(key)
    }

    pub(super) fn prove_listing(&self, key: &ListKey) {
        self.listings.insert(key.clone(), ());
    }
}

fn bounded<K>(capacity: u64, ttl: Duration) -> Cache<K, ()>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
{
    let builder = Cache::builder().max_capacity(capacity);
    match ttl.is_zero() {
        true => builder.build(),
        false => builder.time_to_live(ttl).build(),
    }
}
