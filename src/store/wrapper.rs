//! [`CachingObjectStore`]: an [`ObjectStore`] wrapper that answers HEAD and LIST from the
//! handle cache, serves ranged reads through the versioned read, and drops what writes
//! through it touch.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    Attributes, CopyOptions, Error, GetOptions, GetRange, GetResult, GetResultPayload, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions, PutPayload,
    PutResult, RenameOptions, Result, UploadPart,
};
use url::Url;

use super::{Caches, StoreReads};
use crate::handle::{Epoch, HandleCache};
use crate::object::{Lifecycle, ObjectVersion, StoreIdentity, StoreKey};
use crate::stats::HandleStats;

/// Ids of wrappers, shown in their `Display` so a `dyn ObjectStore` can be recognised.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
const NAME: &str = "CachingObjectStore#";

/// An [`ObjectStore`] that remembers what it learned about objects in shared caches:
///
/// - what it records (metadata, listings) and the versions it has shown it can read are its
///   [`StoreIdentity`]'s: by default its own, so a store that may list but not read, or a
///   second store at the same URL, never gets this one's cache hits
///   ([`CachingObjectStore::with_identity`] declares stores that answer alike one identity);
///
/// - HEAD requests of a known object and repeated listings of a prefix make no request
///   (listings have their own, shorter TTL so new files show up);
/// - a ranged read is a versioned read of the version the handle cache holds: guarded by
///   `If-Match` and a check of each response, served from the range cache where it holds the
///   bytes; over a [`LocalFileSystem`], positional reads on cached descriptors. A read of an
///   object replaced behind the cache's back fails once with a `Precondition` error naming
///   it, and the next read sees the new version;
/// - writes, deletes, copies and renames made through the wrapper drop the entries they
///   touch, and the listings that hold them, before they return.
///
/// Every method is forwarded, so the inner store's own listing stays in use whenever the cache
/// has nothing to add.
///
/// ```
/// # use object_store::{ObjectStore, ObjectStoreExt, PutPayload, memory::InMemory, path::Path};
/// # use datafusion_lakecache::{CachingObjectStore, LakeCache};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> object_store::Result<()> {
/// let lake = LakeCache::builder().build().unwrap();
/// let url = url::Url::parse("memory://").unwrap();
/// let store = CachingObjectStore::new(InMemory::new(), &url, &lake);
/// let path = Path::from("data/a.parquet");
/// store.put(&path, PutPayload::from_static(b"PAR1")).await?;
/// store.head(&path).await?; // a request
/// store.head(&path).await?; // served from the cache
/// assert_eq!(lake.stats().handle.metadata.hits, 1);
/// # Ok(())
/// # }
/// ```
pub struct CachingObjectStore<S: ObjectStore> {
    inner: Arc<S>,
    id: u64,
    reads: StoreReads,
}

impl<S: ObjectStore> Clone for CachingObjectStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            id: self.id,
            reads: self.reads.clone(),
        }
    }
}

impl<S: ObjectStore> fmt::Debug for CachingObjectStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl<S: ObjectStore> fmt::Display for CachingObjectStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{NAME}{}({})", self.id, self.inner)
    }
}

/// The id a store's `Display` shows if it is a [`CachingObjectStore`], read without
/// formatting the rest (an inner store's `Display` can be long).
pub(super) fn wrapper_id(store: &dyn ObjectStore) -> Option<u64> {
    struct Head(String);
    impl fmt::Write for Head {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            for c in s.chars() {
                if c == '(' || self.0.len() > NAME.len() + 20 {
                    return Err(fmt::Error);
                }
                self.0.push(c);
            }
            Ok(())
        }
    }
    let mut head = Head(String::new());
    let _ = fmt::write(&mut head, format_args!("{store}"));
    head.0.strip_prefix(NAME)?.parse().ok()
}

impl<S: ObjectStore> CachingObjectStore<S> {
    /// Wraps `inner`, which serves the objects under `store_url` (for example `s3://bucket`;
    /// only scheme, host and port are used), with the caches of `caches` (a `LakeCache`).
    /// A [`LocalFileSystem`] is read through cached descriptors. The wrapper is an identity
    /// of its own (a root `LocalFileSystem`: the process's file system, which every such
    /// store reads alike).
    pub fn new(inner: S, store_url: &Url, caches: &impl AsRef<Caches>) -> Self {
        let identity = match super::is_root_local(&inner) {
            true => StoreIdentity::local_files(),
            false => StoreIdentity::instance(),
        };
        Self::wrapping(Arc::new(inner), store_url, caches.as_ref(), identity)
    }

    /// Like [`CachingObjectStore::new`], for a store already behind an `Arc`: the identity is
    /// that instance's, so wrapping one `Arc` twice gives one identity.
    pub fn new_arc(inner: Arc<S>, store_url: &Url, caches: &impl AsRef<Caches>) -> Self {
        let caches = caches.as_ref();
        let dyn_inner: Arc<dyn ObjectStore> = Arc::clone(&inner) as _;
        let identity = caches.directory.identity_of(&dyn_inner);
        Self::wrapping(inner, store_url, caches, identity)
    }

    fn wrapping(inner: Arc<S>, store_url: &Url, caches: &Caches, identity: StoreIdentity) -> Self {
        let any: Arc<dyn std::any::Any + Send + Sync> = Arc::clone(&inner) as _;
        let local = any.downcast::<LocalFileSystem>().ok();
        Self::build(inner, StoreKey::of(store_url), identity, caches, local)
    }

    fn build(
        inner: Arc<S>,
        store: StoreKey,
        identity: StoreIdentity,
        caches: &Caches,
        local: Option<Arc<LocalFileSystem>>,
    ) -> Self {
        let id = NEXT_ID.fetch_add(1, Relaxed);
        let dyn_inner: Arc<dyn ObjectStore> = Arc::clone(&inner) as _;
        let reads = StoreReads::new(dyn_inner, store, identity, caches.clone(), local);
        caches.directory.register(id, &reads);
        Self { inner, id, reads }
    }

    /// Declares that the inner store's objects are the files `files` resolves, so they are
    /// read through cached descriptors. Found on its own when the inner store is a
    /// [`LocalFileSystem`]; use this when it is a wrapper around one.
    pub fn with_local_files(self, files: Arc<LocalFileSystem>) -> Self {
        let r = self.reads.inner();
        let (store, identity, caches) = (r.store.clone(), r.identity.clone(), r.caches.clone());
        Self::build(self.inner, store, identity, &caches, Some(files))
    }

    /// Declares this store one of the stores of `identity`: stores that answer alike (one
    /// service, one set of credentials), such as a store made per session over one bucket.
    /// They share what each has listed and shown it can read; their reads are made at the
    /// versions any of them recorded. Never declare stores of other credentials or other
    /// services one identity: one would get the other's cache hits without asking its store.
    pub fn with_identity(self, identity: StoreIdentity) -> Self {
        let r = self.reads.inner();
        let (store, caches, local) = (r.store.clone(), r.caches.clone(), r.local.clone());
        Self::build(self.inner, store, identity, &caches, local)
    }

    /// Whose answers this store gives: what it records and proves is kept for this identity.
    pub fn identity(&self) -> &StoreIdentity {
        self.reads.identity()
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// The figures of the handle cache this wrapper reads and fills (shared with every
    /// wrapper of the same `LakeCache`).
    pub fn handle_stats(&self) -> HandleStats {
        self.handles().stats()
    }

    fn handles(&self) -> &HandleCache {
        &self.reads.caches().handles
    }

    /// Drops what this store's identity has of `location` (descriptor included): after a
    /// write through it, its next read sees what it wrote. Other identities' entries stay:
    /// their stores may be other services, and within their TTLs they serve what they saw.
    fn forget(&self, location: &Path) {
        self.reads.forget_object(location);
        if let Some(Ok(path)) = self.reads.local_file(location) {
            self.handles().files().invalidate(&path);
        }
    }

    /// Records what the answer to a request sent at `since` showed: its metadata, or that
    /// the object is gone.
    fn observe<T>(
        &self,
        location: &Path,
        (result, since): (Result<T>, Epoch),
        meta: impl Fn(&T) -> &ObjectMeta,
    ) -> Result<T> {
        match &result {
            Ok(value) => self.reads.observe(meta(value), since),
            Err(Error::NotFound { .. }) => self.forget(location),
            Err(_) => {}
        }
        result
    }

    /// A HEAD of the inner store (hedged: see `StoreReads::hedged_head`), recorded in the
    /// cache.
    async fn head_inner(&self, location: &Path) -> Result<ObjectMeta> {
        let since = self.reads.now();
        let head = self
            .reads
            .hedged_head(location)
            .await
            .map_err(|e| super::reads::naming(e, format!("reading {location}")));
        self.observe(location, (head, since), |r| &r.meta)
            .map(|r| r.meta)
    }

    /// The version of `location` reads of the plain `ObjectStore` API are made at: the one
    /// this store's identity recorded (what its listing or HEAD showed, as a planner saw it),
    /// learned with a HEAD (or, for a local file, its descriptor) if it recorded none. `None`
    /// when the handle cache is off, or for an object rewritten in place: reads then go to the
    /// store as they are.
    async fn version_for_read(&self, location: &Path) -> Result<Option<ObjectVersion>> {
        if !self.handles().config().enabled || Lifecycle::of(location) == Lifecycle::ChangesInPlace
        {
            return Ok(None);
        }
        if let Some(v) = self.reads.current(location) {
            return Ok(Some(v));
        }
        if let Some(file) = self.reads.local_file(location) {
            let (meta, _) = self
                .reads
                .read_local(location, file?, None, |_| Ok(Vec::new()))
                .await?;
            return Ok(Some(self.reads.version(&meta)));
        }
        let meta = self.head_inner(location).await?;
        Ok(Some(self.reads.version(&meta)))
    }
}

fn is_unconditional(options: &GetOptions) -> bool {
    options.if_match.is_none()
        && options.if_none_match.is_none()
        && options.if_modified_since.is_none()
        && options.if_unmodified_since.is_none()
        && options.version.is_none()
}

fn head_result(meta: ObjectMeta) -> GetResult {
    GetResult {
        payload: GetResultPayload::Stream(stream::empty().boxed()),
        range: 0..0,
        meta,
        attributes: Attributes::default(),
    }
}

fn bounded(range: &GetRange, location: &Path, size: u64) -> Result<Range<u64>> {
    range.as_range(size).map_err(|e| Error::Generic {
        store: "lakecache",
        source: format!("{location}: {e}").into(),
    })
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ObjectStore> ObjectStore for CachingObjectStore<S> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.forget(location);
        let result = self.inner.put_opts(location, payload, opts).await;
        // A write shows nothing about reading: the next read of it is asked of the store.
        self.forget(location);
        result
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.forget(location);
        let upload = self.inner.put_multipart_opts(location, opts).await?;
        Ok(Box::new(ForgettingUpload {
            upload,
            store: self.clone(),
            location: location.clone(),
        }))
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let lifecycle = Lifecycle::of(location);
        if lifecycle == Lifecycle::ChangesInPlace {
            // Always the store's answer: the next read must see the next rewrite.
            return self.inner.get_opts(location, options).await;
        }
        if !is_unconditional(&options) {
            let since = self.reads.now();
            let result = self.inner.get_opts(location, options).await;
            return self.observe(location, (result, since), |r| &r.meta);
        }
        if options.head {
            if let Some(meta) = self.reads.cached_head(location) {
                return Ok(head_result(meta));
            }
            return self.head_inner(location).await.map(head_result);
        }
        let range = match options.range.clone() {
            Some(range) => range,
            // A file written once (a table log's commit) is read whole again and again: kept.
            None if lifecycle == Lifecycle::WrittenOnce => GetRange::Offset(0),
            None => {
                // A whole-object read is one request: it cannot mix versions.
                let since = self.reads.now();
                let result = self.inner.get_opts(location, options).await;
                return self.observe(location, (result, since), |r| &r.meta);
            }
        };
        let Some(version) = self.version_for_read(location).await? else {
            return self.inner.get_opts(location, options).await;
        };
        if version.size() == 0 {
            return self.inner.get_opts(location, options).await;
        }
        let wanted = bounded(&range, location, version.size())?;
        let mut bytes = self
            .reads
            .read(&version, std::slice::from_ref(&wanted), None)
            .await?;
        let meta = self
            .handles()
            .peek(&self.reads.seen(location))
            .filter(|m| version.matches(m))
            .unwrap_or_else(|| ObjectMeta {
                location: location.clone(),
                last_modified: chrono::DateTime::UNIX_EPOCH,
                size: version.size(),
                e_tag: version.validator().if_match(),
                version: None,
            });
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream::iter(bytes.pop().map(Ok)).boxed()),
            range: wanted,
            meta,
            attributes: Attributes::default(),
        })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        match self.version_for_read(location).await? {
            Some(version) => self.reads.read(&version, ranges, None).await,
            None => self.inner.get_ranges(location, ranges).await,
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let before = self.clone();
        let after = self.clone();
        let locations = locations
            .inspect(move |l| {
                if let Ok(l) = l {
                    before.forget(l);
                }
            })
            .boxed();
        self.inner
            .delete_stream(locations)
            .inspect(move |l| {
                if let Ok(l) = l {
                    after.forget(l);
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.reads.list(prefix, None)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.reads.list(prefix, Some(offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.reads
            .list_with_delimiter(prefix, || self.inner.list_with_delimiter(prefix))
            .await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.forget(to);
        let result = self.inner.copy_opts(from, to, options).await;
        self.forget(to);
        result
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.forget(from);
        self.forget(to);
        let result = self.inner.rename_opts(from, to, options).await;
        self.forget(from);
        self.forget(to);
        result
    }
}

/// A multipart upload that drops the cached entries of its object once it completes.
#[derive(Debug)]
struct ForgettingUpload<S: ObjectStore> {
    upload: Box<dyn MultipartUpload>,
    store: CachingObjectStore<S>,
    location: Path,
}

#[async_trait]
impl<S: ObjectStore> MultipartUpload for ForgettingUpload<S> {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        self.upload.put_part(data)
    }

    async fn complete(&mut self) -> Result<PutResult> {
        let result = self.upload.complete().await;
        self.store.forget(&self.location);
        result
    }

    async fn abort(&mut self) -> Result<()> {
        self.upload.abort().await
    }
}

#[cfg(test)]
mod tests;

impl CachingObjectStore<Arc<dyn ObjectStore>> {
    /// Wraps a store a session registered (or an inner registry made): its identity is that
    /// instance's, so one store registered in several sessions is one identity.
    pub(crate) fn over_registered(
        store: Arc<dyn ObjectStore>,
        store_url: &Url,
        caches: &Caches,
    ) -> Self {
        let identity = caches.directory.identity_of(&store);
        Self::wrapping(Arc::new(store), store_url, caches, identity)
    }
}
