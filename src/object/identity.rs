//! [`StoreIdentity`]: whose answers a store gives, the unit the caches prove access by.
//!
//! Two stores registered at one URL can be different services (a tenant's own endpoint, a
//! `PrefixStore` per tenant) or the same bucket with other credentials (one may list but not
//! read). A session may only get cache hits for object versions its own store has shown, so
//! what a store has shown (its recorded versions, its listings, its proofs of access) is kept
//! per identity, never per URL.
//!
//! By default every store instance is an identity of its own: [`CachingObjectStore::new`]
//! gives each wrapper a new one, and registering one `Arc<dyn ObjectStore>` in several
//! sessions keeps its identity (it is one store). An embedder that makes a store per session
//! over one bucket and one set of credentials declares those instances one identity with
//! [`StoreIdentity::named`], and they share everything they have shown.
//!
//! [`CachingObjectStore::new`]: crate::CachingObjectStore::new

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Whose answers a store gives: stores of one identity answer alike (one service, one set of
/// credentials), so what one of them has shown holds for all. Cheap to clone.
///
/// ```
/// # use datafusion_lakecache::{CachingObjectStore, LakeCache, StoreIdentity};
/// # use object_store::memory::InMemory;
/// let lake = LakeCache::builder().build().unwrap();
/// let url = url::Url::parse("s3://sales").unwrap();
/// // A store per session, all with the same credentials: one identity.
/// let reader = StoreIdentity::named("sales-reader");
/// let a = CachingObjectStore::new(InMemory::new(), &url, &lake).with_identity(reader.clone());
/// let b = CachingObjectStore::new(InMemory::new(), &url, &lake).with_identity(reader);
/// assert_eq!(a.identity(), b.identity());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct StoreIdentity(Kind);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Kind {
    /// One store instance.
    Instance(u64),
    /// Declared by the embedder.
    Named(Arc<str>),
    /// The process's own file system, read through a root `LocalFileSystem`: every such
    /// store of the process reads the same files with the same permissions.
    LocalFiles,
}

static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

impl StoreIdentity {
    /// The identity every store wrapped with it shares. Declare one per service and set of
    /// credentials: stores of one identity get each other's cache hits without asking their
    /// own store, so they must be able to read the same objects.
    pub fn named(name: impl Into<String>) -> Self {
        Self(Kind::Named(name.into().into()))
    }

    /// A new identity, of one store instance.
    pub(crate) fn instance() -> Self {
        Self(Kind::Instance(NEXT_INSTANCE.fetch_add(1, Relaxed)))
    }

    /// The identity of the process's own file system.
    pub(crate) fn local_files() -> Self {
        Self(Kind::LocalFiles)
    }
}

impl fmt::Display for StoreIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Instance(n) => write!(f, "store instance {n}"),
            Kind::Named(name) => write!(f, "identity '{name}'"),
            Kind::LocalFiles => write!(f, "local files"),
        }
    }
}

impl fmt::Debug for StoreIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreIdentity({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_differ_and_names_are_equal_by_name() {
        assert_ne!(StoreIdentity::instance(), StoreIdentity::instance());
        assert_eq!(StoreIdentity::named("a"), StoreIdentity::named("a"));
        assert_ne!(StoreIdentity::named("a"), StoreIdentity::named("b"));
        assert_eq!(StoreIdentity::local_files(), StoreIdentity::local_files());
        assert_eq!(StoreIdentity::named("t").to_string(), "identity 't'");
    }
}
