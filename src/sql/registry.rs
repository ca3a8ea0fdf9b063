//! [`LakeObjectStoreRegistry`]: every object store a session registers is handed out wrapped
//! in a [`CachingObjectStore`](crate::CachingObjectStore), so plain `ListingTable`s, other
//! table providers and Ballista executors get handle and range caching without plan changes.
//!
//! The wrapper goes on top of whatever the inner registry makes of a store (datafusion-cli's
//! registry, for one, wraps stores to count their requests): scans then find the wrapper's
//! versioned read, and what the inner registry counts is what reaches the store, below the
//! caches.

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::execution::object_store::ObjectStoreRegistry;
use object_store::ObjectStore;
use url::Url;

use crate::object::StoreKey;
use crate::store::{Caches, SessionStores};

/// Wraps the stores of an inner registry; see the module docs.
#[derive(Debug)]
pub(crate) struct LakeObjectStoreRegistry {
    inner: Arc<dyn ObjectStoreRegistry>,
    caches: Caches,
    /// The wrapper of each store, by the namespace it serves: one per registration.
    wrapped: SessionStores,
}

impl LakeObjectStoreRegistry {
    /// Wraps the stores of `inner`, those registered already included (on first use).
    pub(crate) fn new(inner: Arc<dyn ObjectStoreRegistry>, caches: &Caches) -> Self {
        Self {
            inner,
            caches: caches.clone(),
            wrapped: SessionStores::default(),
        }
    }

    /// The wrappers of the stores the session registered (as they are registered).
    pub(crate) fn stores(&self) -> SessionStores {
        self.wrapped.clone()
    }

    fn wrap(&self, url: &Url, store: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
        crate::store::cached_store(store, url, &self.caches)
    }
}

impl ObjectStoreRegistry for LakeObjectStoreRegistry {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        let old = self.inner.register_store(url, store);
        let below = self.inner.get_store(url).ok()?;
        let key = StoreKey::of(url);
        let directory = &self.caches.directory;
        let previous = self.wrapped.insert(key, self.wrap(url, below), directory);
        previous.or(old)
    }

    fn deregister_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        self.wrapped.remove(&StoreKey::of(url));
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        let key = StoreKey::of(url);
        if let Some(store) = self.wrapped.get(&key) {
            return Ok(store);
        }
        let below = self.inner.get_store(url)?;
        let directory = &self.caches.directory;
        Ok(self
            .wrapped
            .get_or_insert_with(key, directory, || self.wrap(url, below)))
    }
}
