//! [`LakeObjectStoreRegistry`]: every object store a session registers is handed out wrapped
//! in a [`CachingObjectStore`] (with the range cache for remote stores), so plain
//! `ListingTable`s, other table providers and Ballista executors get handle and range caching
//! without plan changes.

use std::sync::Arc;

use datafusion::error::Result;
use datafusion::execution::object_store::ObjectStoreRegistry;
use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use url::Url;

use crate::{CachingObjectStore, LakeCache};

/// Wraps the stores of an inner registry as they are registered.
#[derive(Debug)]
pub struct LakeObjectStoreRegistry {
    inner: Arc<dyn ObjectStoreRegistry>,
    lake: LakeCache,
}

impl LakeObjectStoreRegistry {
    /// Wraps `inner`, including the stores already registered for `file://`.
    pub fn new(inner: Arc<dyn ObjectStoreRegistry>, lake: &LakeCache) -> Self {
        let registry = Self {
            inner,
            lake: lake.clone(),
        };
        if let Ok(url) = Url::parse("file://")
            && let Ok(local) = registry.inner.get_store(&url)
        {
            registry.register_store(&url, local);
        }
        registry
    }

    fn wrap(&self, url: &Url, store: Arc<dyn ObjectStore>) -> Arc<dyn ObjectStore> {
        let shown = store.to_string();
        if shown.starts_with("CachingObjectStore(") {
            return store;
        }
        let handles = self.lake.handles();
        // A root `LocalFileSystem` is rebuilt as one we can read through cached descriptors;
        // any other store (a prefixed local one included) is wrapped as it is.
        if url.scheme() == "file" && shown == LocalFileSystem::new().to_string() {
            return Arc::new(CachingObjectStore::new(
                LocalFileSystem::new(),
                url,
                handles,
            ));
        }
        let wrapped = CachingObjectStore::new(store, url, handles);
        match self.lake.range_cache_for(url) {
            Some(ranges) => Arc::new(wrapped.with_range_cache(ranges)),
            None => Arc::new(wrapped),
        }
    }
}

impl ObjectStoreRegistry for LakeObjectStoreRegistry {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        self.inner.register_store(url, self.wrap(url, store))
    }

    fn deregister_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        self.inner.deregister_store(url)
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        self.inner.get_store(url)
    }
}
