//! [`SessionStores`]: the stores one session registered, as its registry wrapped them.
//!
//! DataFusion's path-keyed caches are checked against the identities of the session's stores
//! on every lookup: once per file on every plan of a table (see `checked.rs`). Finding a
//! wrapper's versioned read from the `Arc<dyn ObjectStore>` DataFusion hands out formats the
//! store's name ([`Directory::find`]); so it is found once, when the store is registered, and
//! every lookup after reads what was found.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use object_store::ObjectStore;

use super::{Directory, StoreReads};
use crate::object::{StoreIdentity, StoreKey};

/// The stores a session registered, by namespace, with the versioned read of each that reads
/// through the caches. Cheap to clone; clones share the same stores.
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionStores(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    registered: RwLock<Registered>,
    /// Changes of the identities, counted outside the lock: read on every lookup of the
    /// session's checked caches.
    changes: AtomicU64,
}

#[derive(Debug, Default)]
struct Registered {
    by_key: HashMap<StoreKey, (Arc<dyn ObjectStore>, Option<StoreReads>)>,
    /// The identities of `by_key`'s reads, made again on every change.
    identities: Arc<[StoreIdentity]>,
}

impl SessionStores {
    fn read(&self) -> RwLockReadGuard<'_, Registered> {
        self.0.registered.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Registered> {
        self.0.registered.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `registered`'s identities again after a change, and counts it (under the
    /// write lock: a reader that sees the count reads the identities it counts).
    fn changed(&self, registered: &mut Registered) {
        let reads = registered.by_key.values().filter_map(|(_, r)| r.as_ref());
        registered.identities = reads.map(|r| r.identity().clone()).collect();
        self.0.changes.fetch_add(1, Relaxed);
    }

    /// How many times the identities have changed: read before
    /// [`SessionStores::identities`], what is found of them holds while it is the same.
    pub(crate) fn changes(&self) -> u64 {
        self.0.changes.load(Relaxed)
    }

    /// The store registered for `key`.
    pub(crate) fn get(&self, key: &StoreKey) -> Option<Arc<dyn ObjectStore>> {
        self.read()
            .by_key
            .get(key)
            .map(|(store, _)| Arc::clone(store))
    }

    /// Registers `store` (a wrapper `directory` knows, or any other store) for `key`; the
    /// store it replaces.
    pub(crate) fn insert(
        &self,
        key: StoreKey,
        store: Arc<dyn ObjectStore>,
        directory: &Directory,
    ) -> Option<Arc<dyn ObjectStore>> {
        let reads = directory.find(&store);
        let mut registered = self.write();
        let old = registered.by_key.insert(key, (store, reads));
        self.changed(&mut registered);
        old.map(|(store, _)| store)
    }

    /// The store registered for `key`, or `make()` registered for it.
    pub(crate) fn get_or_insert_with(
        &self,
        key: StoreKey,
        directory: &Directory,
        make: impl FnOnce() -> Arc<dyn ObjectStore>,
    ) -> Arc<dyn ObjectStore> {
        if let Some(store) = self.get(&key) {
            return store;
        }
        let mut registered = self.write();
        if let Some((store, _)) = registered.by_key.get(&key) {
            return Arc::clone(store);
        }
        let store = make();
        let reads = directory.find(&store);
        registered.by_key.insert(key, (Arc::clone(&store), reads));
        self.changed(&mut registered);
        store
    }

    /// Forgets the store registered for `key`.
    pub(crate) fn remove(&self, key: &StoreKey) {
        let mut registered = self.write();
        if registered.by_key.remove(key).is_some() {
            self.changed(&mut registered);
        }
    }

    /// The versioned reads of the stores that read through the caches.
    pub(crate) fn reads(&self) -> Vec<StoreReads> {
        let registered = self.read();
        let reads = registered.by_key.values().filter_map(|(_, r)| r.clone());
        reads.collect()
    }

    /// The identities of the stores that read through the caches.
    pub(crate) fn identities(&self) -> Arc<[StoreIdentity]> {
        Arc::clone(&self.read().identities)
    }
}

#[cfg(test)]
mod tests {
    use object_store::memory::InMemory;
    use url::Url;

    use super::*;
    use crate::{CachingObjectStore, LakeCache};

    #[test]
    fn the_identities_of_a_sessions_stores_follow_its_registrations() {
        let lake = LakeCache::builder().build().unwrap();
        let caches: &super::super::Caches = lake.as_ref();
        let url = Url::parse("memory://").unwrap();
        let key = StoreKey::of(&url);
        let stores = SessionStores::default();
        let wrapper = Arc::new(CachingObjectStore::new(InMemory::new(), &url, &lake));
        let identity = wrapper.identity().clone();
        stores.insert(key.clone(), wrapper, &caches.directory);
        assert_eq!(&*stores.identities(), std::slice::from_ref(&identity));
        let changes = stores.changes();
        // A store the caches do not read through has no identity of theirs.
        let plain = Url::parse("s3://plain").unwrap();
        let made = stores.get_or_insert_with(StoreKey::of(&plain), &caches.directory, || {
            Arc::new(InMemory::new())
        });
        assert!(Arc::ptr_eq(
            &made,
            &stores.get(&StoreKey::of(&plain)).unwrap()
        ));
        assert_eq!(&*stores.identities(), std::slice::from_ref(&identity));
        assert_eq!(stores.reads().len(), 1);
        assert!(stores.changes() > changes, "a registration is a change");
        let changes = stores.changes();
        stores.remove(&key);
        assert!(stores.changes() > changes, "so is a removal");
        assert!(stores.identities().is_empty());
        assert!(stores.reads().is_empty());
    }
}
