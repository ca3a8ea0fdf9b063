//! The store layer: [`CachingObjectStore`], the object-store wrapper, and [`StoreReads`], the
//! one versioned read every byte of a scan goes through.
//!
//! - `reads.rs`: `read(version, ranges)` guards each request with the version (`If-Match`
//!   and a check of the response), serves from and fills the range cache, counts the figures,
//!   and on a changed object fails with a `Precondition` error and drops the old version's
//!   entries. Readers, footer and bloom-filter loads, and prefetches all call it.
//! - `local.rs`: the same read over local files, through cached descriptors.
//! - `wrapper.rs`: `CachingObjectStore`, which answers HEAD and LIST from the handle cache,
//!   serves ranged GETs through the versioned read at the version it knows, and drops what a
//!   write through it touches.
//! - `hedge.rs`: a GET waiting past the recent 95th percentile is sent again (on by default:
//!   `lakecache.store.hedge`).
//! - `link.rs`: each store's measured bandwidth and latency, where a scan's downloads start.
//! - `listing.rs`: listings recorded as they stream.
//! - `checked.rs`: DataFusion's own path-keyed caches (footers, statistics), checked against
//!   the versions the handle cache knows.
//!
//! [`Caches`] bundles what the layer reads and fills; [`Directory`] finds the versioned read
//! of a wrapper a session registered, from the `Arc<dyn ObjectStore>` DataFusion hands out,
//! and the [`StoreIdentity`] of a store instance.
//!
//! Who gets a hit: every read is made by a store of one identity, at a version that identity
//! recorded (from its own listing, HEAD or GET), and anything cached of that version (its
//! metadata, footer, bloom filters, bytes) is served only once a store of that identity has
//! answered a HEAD or a GET for it: its proof of access. A read the caches cannot answer whole
//! goes to the store, whose answer is the proof; one they answer whole without a proof sends
//! one HEAD first. Failures are the caller's alone: what one identity's store refused or
//! reported missing changes nothing another identity sees.

mod checked;
mod clock;
mod hedge;
mod link;
mod listing;
mod local;
mod reads;
mod session;
mod wrapper;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use url::Url;

pub(crate) use checked::datafusion_caches;
pub(crate) use hedge::Hedges;
pub(crate) use link::{Link, Links};
pub(crate) use listing::{AfterListing, is_parquet};
pub(crate) use reads::StoreReads;
pub(crate) use session::SessionStores;
pub use wrapper::CachingObjectStore;

use crate::handle::{HandleCache, Seen};
use crate::index::IndexCache;
use crate::object::{ObjectId, ObjectVersion, StoreIdentity};

use crate::range::RangeCache;

/// The caches a [`CachingObjectStore`] reads and fills, shared by every store and session of
/// a `LakeCache` (which hands them out with `AsRef`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Caches {
    pub(crate) handles: HandleCache,
    pub(crate) index: IndexCache,
    pub(crate) ranges: RangeCache,
    pub(crate) directory: Directory,
    /// Whether GETs are hedged, and the figures of hedging.
    pub(crate) hedges: Arc<Hedges>,
    /// What each store's link has shown the prefetcher.
    pub(crate) links: Links,
    /// What is done with the Parquet files a listing shows before it ends (footers loaded).
    pub(crate) after_listing: Option<Arc<dyn AfterListing>>,
}

impl AsRef<Caches> for Caches {
    fn as_ref(&self) -> &Caches {
        self
    }
}

impl Caches {
    /// Bundles the caches.
    pub(crate) fn new(handles: HandleCache, index: IndexCache, ranges: RangeCache) -> Self {
        Self {
            handles,
            index,
            ranges,
            directory: Directory::default(),
            hedges: Arc::default(),
            links: Links::default(),
            after_listing: None,
        }
    }

    /// The caches, with `hook` run on the Parquet files a listing shows before it ends.
    pub(crate) fn after_listing(self, hook: Arc<dyn AfterListing>) -> Self {
        Self {
            after_listing: Some(hook),
            ..self
        }
    }

    /// The caches, their stores hedging slow GETs if `hedge` (`lakecache.store.hedge`).
    pub(crate) fn hedging(self, hedge: bool) -> Self {
        Self {
            hedges: Arc::new(Hedges::new(hedge)),
            ..self
        }
    }

    /// Drops everything cached about one object, in every version, for every identity.
    pub(crate) fn forget(&self, id: &ObjectId) {
        self.handles.invalidate(id);
        self.index.invalidate(id);
        self.ranges.invalidate(id);
    }

    /// Drops what one identity has of one object: what it recorded and proved, and the
    /// entries of the versions that are its alone. Entries of versions named by their content
    /// stay for the identities that showed them, and age out.
    pub(crate) fn forget_seen(&self, seen: &Seen) {
        self.handles.invalidate_seen(seen);
        self.index.invalidate_owned(&seen.id, &seen.identity);
        self.ranges.invalidate_owned(&seen.id, &seen.identity);
    }

    /// Drops the index and range entries of one version of an object.
    pub(crate) fn forget_version(&self, version: &ObjectVersion) {
        self.index.invalidate_version(version);
        self.ranges.invalidate_version(version);
    }
}

/// The versioned reads of every [`CachingObjectStore`] built over one [`Caches`], by the id
/// each wrapper shows in its `Display` (`CachingObjectStore#7(...)`): the only thing a
/// `dyn ObjectStore` tells about itself. Ids are never reused, and entries hold no store
/// alive. And the identity of each store instance wrapped or read: one `Arc<dyn
/// ObjectStore>` registered in several sessions is one store, so one identity.
#[derive(Debug, Clone, Default)]
pub(crate) struct Directory {
    reads: Arc<Mutex<HashMap<u64, Weak<reads::ReadsInner>>>>,
    instances: Arc<Mutex<Vec<Instance>>>,
}

/// A store instance the directory gave an identity, held without keeping it alive.
type Instance = (Weak<dyn ObjectStore>, StoreIdentity);

impl Directory {
    /// The identity of the store instance `store`: the process's file system for a root
    /// `LocalFileSystem`, else one of its own, the same every time this instance is asked for.
    pub(crate) fn identity_of(&self, store: &Arc<dyn ObjectStore>) -> StoreIdentity {
        if is_root_local(store.as_ref()) {
            return StoreIdentity::local_files();
        }
        let mut instances = self.instances.lock().unwrap_or_else(|e| e.into_inner());
        instances.retain(|(w, _)| w.strong_count() > 0);
        let this = Arc::downgrade(store);
        // A `Weak` keeps its allocation, so a live entry's address is never another store's.
        if let Some((_, identity)) = instances.iter().find(|(w, _)| Weak::ptr_eq(w, &this)) {
            return identity.clone();
        }
        let identity = StoreIdentity::instance();
        instances.push((this, identity.clone()));
        identity
    }

    fn register(&self, id: u64, reads: &StoreReads) {
        let mut map = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, r| r.strong_count() > 0);
        map.insert(id, reads.downgrade());
    }

    /// The versioned read of `store` if it is a [`CachingObjectStore`] over these caches
    /// (not wrapped again by another store, whose requests would then be bypassed).
    pub(crate) fn find(&self, store: &Arc<dyn ObjectStore>) -> Option<StoreReads> {
        let id = wrapper::wrapper_id(store.as_ref())?;
        let map = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&id)?.upgrade().map(StoreReads::from_inner)
    }
}

/// `store`, registered for `url` (a store root), as the caches read it: itself if it is one
/// of their wrappers already; a root `LocalFileSystem` rebuilt as one that reads through
/// cached descriptors; any other store (a prefixed local one included) wrapped as it is,
/// with the identity of that instance. What a session's registry does with each store
/// registered in it, and what a table format does with the store it is handed.
pub(crate) fn cached_store(
    store: Arc<dyn ObjectStore>,
    url: &Url,
    caches: &Caches,
) -> Arc<dyn ObjectStore> {
    if caches.directory.find(&store).is_some() {
        return store;
    }
    if url.scheme() == "file" && is_root_local(store.as_ref()) {
        return Arc::new(CachingObjectStore::new(LocalFileSystem::new(), url, caches));
    }
    Arc::new(CachingObjectStore::over_registered(store, url, caches))
}

/// The URL of the store root `url` is in: its scheme, host and port (`None` for a URL that
/// cannot be a base, which no store serves).
pub(crate) fn store_root(url: &Url) -> Option<Url> {
    let mut root = url.clone();
    root.set_path("/");
    root.set_query(None);
    root.set_fragment(None);
    (!root.cannot_be_a_base()).then_some(root)
}

/// Whether `store` reads the process's file system from its root, as every
/// `LocalFileSystem::new()` does (told by its `Display`, all a `dyn ObjectStore` shows).
pub(crate) fn is_root_local(store: &dyn ObjectStore) -> bool {
    store.to_string() == LocalFileSystem::new().to_string()
}
