//! [`CachingObjectStore`]: an [`ObjectStore`] wrapper that answers HEAD and LIST from the
//! [`HandleCache`], reads local files through cached descriptors, and guards ranged reads of
//! remote objects with the cached e_tag.

use std::any::Any;
use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    Attributes, CopyOptions, Error, GetOptions, GetResult, GetResultPayload, ListResult,
    MultipartUpload, OBJECT_STORE_COALESCE_DEFAULT, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult, RenameOptions, Result, UploadPart, coalesce_ranges,
};
use url::Url;

use super::files::OpenFile;
use super::{HandleCache, ListKey, ListKind, Listing, ObjectKey};
use crate::index::ObjectVersion;
use crate::query::{self, Source};
use crate::range::RangeCache;

/// The error a read reports when the object was replaced while it was being read, twice in a
/// row. Returned inside [`object_store::Error::Generic`]; find it with
/// `std::error::Error::source` and `downcast_ref::<ObjectChanged>()`.
#[derive(Debug, Clone)]
pub struct ObjectChanged {
    /// The object that changed.
    pub path: String,
}

impl fmt::Display for ObjectChanged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "object {} changed while it was being read; run the query again to read its new version",
            self.path
        )
    }
}

impl std::error::Error for ObjectChanged {}

/// An [`ObjectStore`] that remembers what it learned about objects, in a shared
/// [`HandleCache`]:
///
/// - HEAD requests of a known object and repeated listings of a prefix make no request
///   (listings have their own, shorter TTL so new files show up);
/// - over a [`LocalFileSystem`], ranges are read with positional reads on cached descriptors;
/// - a ranged read of a remote object whose e_tag is known carries it as `If-Match`, so the
///   ranges of one request never mix two versions of an object: if the object was replaced,
///   the entry is dropped and the read is retried once on the new version;
/// - writes, deletes, copies and renames made through the wrapper drop the entries they touch,
///   and the listings that hold them, before they return.
///
/// Every method is forwarded, so the inner store's own `get_ranges` and listing stay in use
/// whenever the cache has nothing to add.
///
/// ```
/// # use std::sync::Arc;
/// # use object_store::{ObjectStore, ObjectStoreExt, PutPayload, memory::InMemory, path::Path};
/// # use datafusion_lakecache::{config::HandleConfig, handle::{CachingObjectStore, HandleCache}};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> object_store::Result<()> {
/// let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
/// let url = url::Url::parse("memory://").unwrap();
/// let store = CachingObjectStore::new(InMemory::new(), &url, &cache);
/// let path = Path::from("data/a.parquet");
/// store.put(&path, PutPayload::from_static(b"PAR1")).await?;
/// store.head(&path).await?; // a request
/// store.head(&path).await?; // served from the cache
/// assert_eq!(cache.stats().metadata.hits, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct CachingObjectStore<S: ObjectStore> {
    inner: Arc<S>,
    store: Arc<str>,
    cache: HandleCache,
    /// Where objects can be read as local files, through cached descriptors.
    local: Option<Arc<LocalFileSystem>>,
    /// Cleared the first time the inner store refuses `If-Match`.
    if_match: Arc<AtomicBool>,
    /// Where ranged reads of a known version are kept and served from.
    ranges: Option<RangeCache>,
}

impl<S: ObjectStore> Clone for CachingObjectStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            store: Arc::clone(&self.store),
            cache: self.cache.clone(),
            local: self.local.clone(),
            if_match: Arc::clone(&self.if_match),
            ranges: self.ranges.clone(),
        }
    }
}

impl<S: ObjectStore> fmt::Display for CachingObjectStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CachingObjectStore({})", self.inner)
    }
}

impl<S: ObjectStore> CachingObjectStore<S> {
    /// Wraps `inner`, which serves the objects under `store_url` (for example `s3://bucket`;
    /// only scheme, host and port are used). Entries are keyed by that URL and the path, so
    /// wrappers of the same store share entries and different stores never collide.
    pub fn new(inner: S, store_url: &Url, cache: &HandleCache) -> Self {
        Self::new_arc(Arc::new(inner), store_url, cache)
    }

    /// Like [`CachingObjectStore::new`], for a store already behind an `Arc`.
    pub fn new_arc(inner: Arc<S>, store_url: &Url, cache: &HandleCache) -> Self {
        let any: Arc<dyn Any + Send + Sync> = Arc::clone(&inner) as _;
        Self {
            inner,
            store: crate::store_key(store_url),
            cache: cache.clone(),
            local: any.downcast::<LocalFileSystem>().ok(),
            if_match: Arc::new(AtomicBool::new(true)),
            ranges: None,
        }
    }

    /// Keeps the bytes of ranged reads in `ranges` and serves reads from it. Only reads of a
    /// version known by its e_tag are kept, and fetched under `If-Match`, so a replaced
    /// object is never served from an older version's bytes.
    pub fn with_range_cache(mut self, ranges: RangeCache) -> Self {
        self.ranges = Some(ranges);
        self
    }

    /// Declares that the inner store's objects are the files `files` resolves, so they are
    /// read through cached descriptors. Found on its own when the inner store is a
    /// [`LocalFileSystem`]; use this when it is a wrapper around one.
    pub fn with_local_files(mut self, files: Arc<LocalFileSystem>) -> Self {
        self.local = Some(files);
        self
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// The cache this wrapper reads and fills.
    pub fn cache(&self) -> &HandleCache {
        &self.cache
    }

    fn key(&self, location: &Path) -> ObjectKey {
        ObjectKey {
            store: Arc::clone(&self.store),
            path: location.clone(),
        }
    }

    /// The file behind `location` if the inner store is a local file system and descriptors
    /// are cached.
    fn local_path(&self, location: &Path) -> Option<Result<PathBuf>> {
        if !self.cache.files().enabled() {
            return None;
        }
        Some(self.local.as_ref()?.path_to_filesystem(location))
    }

    /// Drops everything cached about `location`, descriptor included.
    fn forget(&self, location: &Path) {
        self.cache.invalidate(&self.store, location);
        if let Some(Ok(path)) = self.local_path(location) {
            self.cache.files().invalidate(&path);
        }
    }

    /// Records what a response showed: its metadata, or that the object is gone.
    fn observe<T>(
        &self,
        location: &Path,
        result: Result<T>,
        meta: impl Fn(&T) -> &ObjectMeta,
    ) -> Result<T> {
        match &result {
            Ok(value) => self.cache.record(&self.store, meta(value)),
            Err(Error::NotFound { .. }) => self.forget(location),
            Err(_) => {}
        }
        result
    }

    /// The cached metadata of `location` and its e_tag, if reads can be guarded by it.
    fn guarded_version(&self, location: &Path) -> Option<(ObjectMeta, String)> {
        if !self.if_match.load(Relaxed) {
            return None;
        }
        let meta = self.cache.peek_meta(&self.key(location));
        query::record_handle_lookup(meta.is_some());
        let meta = meta?;
        // A weak e_tag never matches under If-Match (RFC 9110 compares strongly).
        let e_tag = meta.e_tag.clone().filter(|e| !e.starts_with("W/"))?;
        Some((meta, e_tag))
    }

    /// [`Self::guarded_version`], learning the e_tag with a HEAD when the listing left it out
    /// and the disk tier holds bytes of the object: one metadata request instead of reading
    /// its data again.
    async fn version_for_read(&self, location: &Path) -> Result<Option<(ObjectMeta, String)>> {
        if let Some(version) = self.guarded_version(location) {
            return Ok(Some(version));
        }
        let held = self
            .ranges
            .as_ref()
            .is_some_and(|r| r.may_hold(&self.store, location));
        if held && self.if_match.load(Relaxed) {
            self.head_inner(location).await?;
            return Ok(self.guarded_version(location));
        }
        Ok(None)
    }

    fn cached_e_tag(&self, location: &Path) -> Option<String> {
        self.guarded_version(location).map(|(_, e_tag)| e_tag)
    }

    /// Reads `ranges` of the version `meta` (whose e_tag is `e_tag`): through the range
    /// cache if there is one, else from the store under `If-Match`.
    async fn read_version(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
        meta: &ObjectMeta,
        e_tag: &str,
    ) -> Result<Vec<Bytes>> {
        let fetch = |wanted: Vec<Range<u64>>| async move {
            self.get_ranges_if_match(location, &wanted, e_tag).await
        };
        match &self.ranges {
            Some(cache) => {
                let object = ObjectVersion::with_store_key(Arc::clone(&self.store), meta);
                cache.read_through(&object, ranges, fetch).await
            }
            None => fetch(ranges.to_vec())
                .await
                .inspect(|b| record_store_bytes(b)),
        }
    }

    /// Reads `ranges` of a local file through a cached descriptor; `ranges` maps the file
    /// size to the byte ranges wanted. The file's metadata is recorded when its descriptor
    /// is first used, not on every read.
    async fn read_local(
        &self,
        location: &Path,
        path: PathBuf,
        ranges: impl FnOnce(u64) -> Result<Vec<Range<u64>>> + Send + 'static,
    ) -> Result<(Arc<OpenFile>, Vec<Range<u64>>, Vec<Bytes>)> {
        let cache = self.cache.clone();
        let loc = location.clone();
        let read = tokio::task::spawn_blocking(move || {
            let file: Arc<OpenFile> = cache
                .files()
                .open(&path)
                .map_err(|e| io_error(e, &loc, &path))?;
            let ranges = ranges(file.size())?;
            let bytes = ranges
                .iter()
                .map(|r| {
                    file.read(&path, r.clone())
                        .map_err(|e| io_error(e, &loc, &path))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((file, ranges, bytes))
        })
        .await
        .map_err(|source| Error::JoinError { source })?;
        match &read {
            Ok((file, _, _)) if file.first_use() => {
                self.cache.record(&self.store, &file.meta(location))
            }
            Ok(_) => {}
            Err(Error::NotFound { .. }) => self.forget(location),
            Err(_) => {}
        }
        read
    }

    /// `get_ranges` with every request guarded by `If-Match: e_tag`, coalesced the way
    /// object_store's default `get_ranges` does. The e_tag of each response is checked too,
    /// since some servers ignore `If-Match`; a response without one is taken as it is.
    async fn get_ranges_if_match(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
        e_tag: &str,
    ) -> Result<Vec<Bytes>> {
        coalesce_ranges(
            ranges,
            |range| {
                let options = GetOptions::new()
                    .with_range(Some(range))
                    .with_if_match(Some(e_tag));
                async move {
                    let response = self.inner.get_opts(location, options).await?;
                    if response
                        .meta
                        .e_tag
                        .as_deref()
                        .is_some_and(|seen| seen != e_tag)
                    {
                        return Err(Error::Precondition {
                            path: location.to_string(),
                            source: "the response shows another e_tag than If-Match asked for"
                                .into(),
                        });
                    }
                    response.bytes().await
                }
            },
            OBJECT_STORE_COALESCE_DEFAULT,
        )
        .await
    }

    /// Keeps the bytes of `response`, a ranged read made without knowing the object's
    /// e_tag, if the response shows a strong one: they are of that version.
    async fn keep(&self, ranges: &RangeCache, response: GetResult) -> Result<GetResult> {
        let strong = response
            .meta
            .e_tag
            .as_deref()
            .is_some_and(|e| !e.starts_with("W/"));
        if !strong {
            return Ok(response);
        }
        let (meta, range) = (response.meta.clone(), response.range.clone());
        let attributes = response.attributes.clone();
        let bytes = response.bytes().await?;
        if bytes.len() as u64 == range.end - range.start {
            let object = ObjectVersion::with_store_key(Arc::clone(&self.store), &meta);
            ranges.insert(&object, range.start, bytes.clone());
        }
        ranges.count_fetched(bytes.len() as u64);
        Ok(GetResult {
            payload: GetResultPayload::Stream(stream::once(async { Ok(bytes) }).boxed()),
            range,
            meta,
            attributes,
        })
    }

    /// A HEAD of the inner store, recorded in the cache.
    async fn head_inner(&self, location: &Path) -> Result<ObjectMeta> {
        let head = self
            .inner
            .get_opts(location, GetOptions::new().with_head(true))
            .await;
        self.observe(location, head, |r| &r.meta).map(|r| r.meta)
    }
}

/// Counts bytes read from the store in the current scan's figures (when a scan's reader
/// reads), as the range cache counts the bytes it fetches.
fn record_store_bytes(bytes: &[Bytes]) {
    let total = bytes.iter().map(|b| b.len() as u64).sum();
    query::record_bytes(Source::Store, total);
}

fn is_unconditional(options: &GetOptions) -> bool {
    options.if_match.is_none()
        && options.if_none_match.is_none()
        && options.if_modified_since.is_none()
        && options.if_unmodified_since.is_none()
        && options.version.is_none()
}

fn is_unsupported(e: &Error) -> bool {
    matches!(e, Error::NotImplemented { .. } | Error::NotSupported { .. })
}

fn io_error(e: std::io::Error, location: &Path, path: &std::path::Path) -> Error {
    match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound {
            path: location.to_string(),
            source: Box::new(e),
        },
        _ => Error::Generic {
            store: "LocalFileSystem",
            source: format!("reading {}: {e}", path.display()).into(),
        },
    }
}

fn head_result(meta: ObjectMeta) -> GetResult {
    GetResult {
        payload: GetResultPayload::Stream(stream::empty().boxed()),
        range: 0..0,
        meta,
        attributes: Attributes::default(),
    }
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
        if !is_unconditional(&options) {
            let result = self.inner.get_opts(location, options).await;
            return self.observe(location, result, |r| &r.meta);
        }
        if options.head {
            let cached = self.cache.meta(&self.key(location));
            query::record_handle_lookup(cached.is_some());
            if let Some(meta) = cached {
                return Ok(head_result(meta));
            }
            return self.head_inner(location).await.map(head_result);
        }
        let Some(range) = options.range.clone() else {
            // A whole-object read is one request: it cannot mix versions.
            let result = self.inner.get_opts(location, options).await;
            return self.observe(location, result, |r| &r.meta);
        };
        if let Some(path) = self.local_path(location) {
            let ranges = move |size| {
                range
                    .as_range(size)
                    .map(|r| vec![r])
                    .map_err(|source| Error::Generic {
                        store: "LocalFileSystem",
                        source: Box::new(source),
                    })
            };
            let (file, ranges, mut bytes) = self.read_local(location, path?, ranges).await?;
            record_store_bytes(&bytes);
            return Ok(GetResult {
                payload: GetResultPayload::Stream(stream::iter(bytes.pop().map(Ok)).boxed()),
                range: ranges[0].clone(),
                meta: file.meta(location),
                attributes: Attributes::default(),
            });
        }
        if self.ranges.is_some()
            && let Some((meta, e_tag)) = self.version_for_read(location).await?
            && let Ok(bounded) = range.as_range(meta.size)
        {
            match self
                .read_version(location, std::slice::from_ref(&bounded), &meta, &e_tag)
                .await
            {
                Ok(mut bytes) => {
                    return Ok(GetResult {
                        payload: GetResultPayload::Stream(
                            stream::iter(bytes.pop().map(Ok)).boxed(),
                        ),
                        range: bounded,
                        meta,
                        attributes: Attributes::default(),
                    });
                }
                // Replaced since we cached it: drop the entry, read the new version below.
                Err(Error::Precondition { .. }) => self.forget(location),
                Err(e) if is_unsupported(&e) => self.if_match.store(false, Relaxed),
                Err(e) => return self.observe(location, Err(e), |r: &GetResult| &r.meta),
            }
        } else if let Some(e_tag) = self.cached_e_tag(location) {
            let guarded = options.clone().with_if_match(Some(e_tag));
            match self.inner.get_opts(location, guarded).await {
                // Replaced since we cached it: drop the entry, read the new version below.
                Err(Error::Precondition { .. }) => self.forget(location),
                Err(e) if is_unsupported(&e) => self.if_match.store(false, Relaxed),
                other => return self.observe(location, other, |r| &r.meta),
            }
        }
        let result = self.inner.get_opts(location, options).await;
        let result = self.observe(location, result, |r| &r.meta)?;
        match &self.ranges {
            Some(ranges) => self.keep(ranges, result).await,
            None => Ok(result),
        }
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        if let Some(path) = self.local_path(location) {
            let wanted = ranges.to_vec();
            let (_, _, bytes) = self
                .read_local(location, path?, move |_| Ok(wanted))
                .await?;
            record_store_bytes(&bytes);
            return Ok(bytes);
        }
        let mut retried = false;
        loop {
            let Some((meta, e_tag)) = self.version_for_read(location).await? else {
                let result = match &self.ranges {
                    // One request per coalesced range, as object_store's own `get_ranges`,
                    // but through `get_opts`: the responses show the object's e_tag.
                    // (`get_opts` keeps and counts the bytes.)
                    Some(_) => {
                        let read = |range| async move {
                            let options = GetOptions::new().with_range(Some(range));
                            self.get_opts(location, options).await?.bytes().await
                        };
                        coalesce_ranges(ranges, read, OBJECT_STORE_COALESCE_DEFAULT).await
                    }
                    None => self
                        .inner
                        .get_ranges(location, ranges)
                        .await
                        .inspect(|b| record_store_bytes(b)),
                };
                if let Err(Error::NotFound { .. }) = &result {
                    self.forget(location);
                }
                return result;
            };
            match self.read_version(location, ranges, &meta, &e_tag).await {
                Err(Error::Precondition { .. }) if !retried => {
                    // Replaced: learn the new version, then read all ranges from it.
                    self.forget(location);
                    retried = true;
                    self.head_inner(location).await?;
                }
                Err(Error::Precondition { .. }) => {
                    self.forget(location);
                    return Err(Error::Generic {
                        store: "CachingObjectStore",
                        source: Box::new(ObjectChanged {
                            path: location.to_string(),
                        }),
                    });
                }
                Err(e) if is_unsupported(&e) => {
                    self.if_match.store(false, Relaxed);
                    return self
                        .inner
                        .get_ranges(location, ranges)
                        .await
                        .inspect(|b| record_store_bytes(b));
                }
                Err(e @ Error::NotFound { .. }) => {
                    self.forget(location);
                    return Err(e);
                }
                other => return other,
            }
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
        let key = ListKey {
            store: Arc::clone(&self.store),
            prefix: prefix.cloned(),
            kind: ListKind::Recursive,
        };
        if let Some(listing) = self.cache.listing(&key) {
            return stream::iter(listing.objects.clone().into_iter().map(Ok)).boxed();
        }
        self.recording(key, self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let key = ListKey {
            store: Arc::clone(&self.store),
            prefix: prefix.cloned(),
            kind: ListKind::After(offset.clone()),
        };
        if let Some(listing) = self.cache.listing(&key) {
            return stream::iter(listing.objects.clone().into_iter().map(Ok)).boxed();
        }
        self.recording(key, self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let key = ListKey {
            store: Arc::clone(&self.store),
            prefix: prefix.cloned(),
            kind: ListKind::Delimited,
        };
        if let Some(listing) = self.cache.listing(&key) {
            return Ok(listing.to_list_result());
        }
        let epoch = self.cache.epoch();
        let result = self.inner.list_with_delimiter(prefix).await?;
        for meta in &result.objects {
            self.cache.record(&self.store, meta);
        }
        self.cache.record_listing(
            key,
            Listing {
                objects: result.objects.clone(),
                common_prefixes: result.common_prefixes.clone(),
            },
            epoch,
        );
        Ok(result)
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

impl<S: ObjectStore> CachingObjectStore<S> {
    /// Passes a listing through while collecting it; a listing that completes without error
    /// and without an intervening write is cached.
    fn recording(
        &self,
        key: ListKey,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        struct State {
            listing: BoxStream<'static, Result<ObjectMeta>>,
            seen: Option<Vec<ObjectMeta>>,
            done: Option<(HandleCache, ListKey, u64)>,
        }
        let cache = self.cache.clone();
        let epoch = cache.epoch();
        let state = State {
            listing,
            seen: Some(Vec::new()),
            done: Some((cache, key, epoch)),
        };
        stream::unfold(state, |mut s| async move {
            match s.listing.next().await {
                Some(item) => {
                    match (&item, &s.done) {
                        (Ok(meta), Some((cache, key, _))) => {
                            cache.record(&key.store, meta);
                            match &mut s.seen {
                                Some(seen) if cache.listing_fits(seen.len() + 1) => {
                                    seen.push(meta.clone())
                                }
                                _ => s.seen = None,
                            }
                        }
                        _ => s.seen = None,
                    }
                    Some((item, s))
                }
                None => {
                    if let (Some(objects), Some((cache, key, epoch))) =
                        (s.seen.take(), s.done.take())
                    {
                        let listing = Listing {
                            objects,
                            common_prefixes: vec![],
                        };
                        cache.record_listing(key, listing, epoch);
                    }
                    None
                }
            }
        })
        .boxed()
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
mod tests {
    use super::*;
    use crate::config::HandleConfig;
    use crate::testkit::{CountingStore, FaultStore, Op};
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    type Faulty = Arc<FaultStore<InMemory>>;
    type Counted = Arc<CountingStore<Faulty>>;
    type Stack = CachingObjectStore<Counted>;

    fn stack() -> (Stack, Counted, Faulty) {
        let faults = Arc::new(FaultStore::new(InMemory::new()));
        let counted = Arc::new(CountingStore::new(Arc::clone(&faults)));
        let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
        let url = Url::parse("memory://").unwrap();
        let store = CachingObjectStore::new(Arc::clone(&counted), &url, &cache);
        (store, counted, faults)
    }

    async fn put(store: &impl ObjectStore, path: &str, body: &'static [u8]) {
        store
            .put(&Path::from(path), PutPayload::from_static(body))
            .await
            .unwrap();
    }

    async fn list(store: &impl ObjectStore, prefix: &str) -> Vec<String> {
        let listed: Vec<ObjectMeta> = store
            .list(Some(&Path::from(prefix)))
            .try_collect()
            .await
            .unwrap();
        let mut names: Vec<String> = listed.into_iter().map(|m| m.location.to_string()).collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn heads_and_listings_are_served_from_the_cache() {
        let (store, counted, _) = stack();
        put(&store, "d/a", b"aaaa").await;
        put(&store, "d/b", b"bb").await;
        counted.reset();
        assert_eq!(list(&store, "d").await, ["d/a", "d/b"]);
        assert_eq!(list(&store, "d").await, ["d/a", "d/b"]);
        // The listing taught the cache both objects' metadata.
        assert_eq!(store.head(&Path::from("d/a")).await.unwrap().size, 4);
        let delimited = store
            .list_with_delimiter(Some(&Path::from("d")))
            .await
            .unwrap();
        assert_eq!(delimited.objects.len(), 2);
        store
            .list_with_delimiter(Some(&Path::from("d")))
            .await
            .unwrap();
        let c = counted.counts();
        assert_eq!(
            (c.list, c.head),
            (2, 0),
            "one recursive and one delimited listing"
        );
        let stats = store.cache().stats();
        assert_eq!(stats.listings.hits, 2);
        assert_eq!(stats.metadata.hits, 1);
    }

    #[tokio::test]
    async fn writes_through_the_wrapper_invalidate_what_they_touch() {
        let (store, counted, _) = stack();
        put(&store, "d/a", b"aaaa").await;
        assert_eq!(list(&store, "d").await, ["d/a"]);
        put(&store, "d/b", b"bb").await;
        assert_eq!(
            list(&store, "d").await,
            ["d/a", "d/b"],
            "put drops the parent listing"
        );
        store
            .copy(&Path::from("d/a"), &Path::from("d/c"))
            .await
            .unwrap();
        assert_eq!(list(&store, "d").await, ["d/a", "d/b", "d/c"]);
        store
            .rename(&Path::from("d/c"), &Path::from("e/c"))
            .await
            .unwrap();
        assert_eq!(list(&store, "d").await, ["d/a", "d/b"]);
        store.delete(&Path::from("d/a")).await.unwrap();
        assert_eq!(list(&store, "d").await, ["d/b"]);
        let err = store.head(&Path::from("d/a")).await.unwrap_err();
        assert!(matches!(err, Error::NotFound { .. }), "{err}");
        let mut upload = store.put_multipart(&Path::from("d/m")).await.unwrap();
        upload
            .put_part(PutPayload::from_static(b"mmm"))
            .await
            .unwrap();
        upload.complete().await.unwrap();
        assert_eq!(list(&store, "d").await, ["d/b", "d/m"]);
        assert_eq!(store.head(&Path::from("d/b")).await.unwrap().size, 2);
        counted.reset();
        store.head(&Path::from("d/m")).await.unwrap();
        assert_eq!(counted.counts().head, 0, "known from the listing");
    }

    #[tokio::test]
    async fn a_replaced_object_is_read_whole_from_its_new_version() {
        let (store, counted, faults) = stack();
        let path = Path::from("f");
        put(&store, "f", b"0123456789").await;
        store.head(&path).await.unwrap();
        // Replaced behind the cache's back.
        faults
            .put(
                &path,
                PutPayload::from_static(b"abcdefghijklmnopqrstuvwxyz"),
            )
            .await
            .unwrap();
        counted.reset();
        let ranges = store.get_ranges(&path, &[0..2, 5..7, 8..10]).await.unwrap();
        assert_eq!(ranges, [&b"ab"[..], &b"fg"[..], &b"ij"[..]]);
        let c = counted.counts();
        assert_eq!(
            (c.get, c.head),
            (2, 1),
            "refused GET, HEAD of the new version, GET"
        );
        assert_eq!(store.head(&path).await.unwrap().size, 26, "entry replaced");
        assert!(store.cache().stats().metadata.invalidations >= 1);

        // The same for a single ranged GET.
        faults
            .put(&path, PutPayload::from_static(b"ZYX"))
            .await
            .unwrap();
        let got = store.get_range(&path, 0..3).await.unwrap();
        assert_eq!(&got[..], b"ZYX");
        assert_eq!(store.head(&path).await.unwrap().size, 3);
    }

    #[tokio::test]
    async fn an_object_that_keeps_changing_is_a_typed_error() {
        let (store, _, faults) = stack();
        let path = Path::from("f");
        put(&store, "f", b"0123456789").await;
        store.head(&path).await.unwrap();
        faults.fail(Op::Changed, 2);
        let err = store.get_ranges(&path, &[0..2, 4..6]).await.unwrap_err();
        let changed = std::error::Error::source(&err)
            .and_then(|e| e.downcast_ref::<ObjectChanged>())
            .unwrap_or_else(|| panic!("not an ObjectChanged: {err}"));
        assert_eq!(changed.path, "f");
        assert!(
            err.to_string().contains("changed while it was being read"),
            "{err}"
        );
        // Once it holds still, reads work again.
        assert_eq!(
            store.get_ranges(&path, &[0..2, 4..6]).await.unwrap().len(),
            2
        );
    }

    #[tokio::test]
    async fn failed_requests_are_not_cached() {
        let (store, counted, faults) = stack();
        put(&store, "d/a", b"aaaa").await;
        faults.fail(Op::Head, 1);
        assert!(store.head(&Path::from("d/a")).await.is_err());
        assert_eq!(store.head(&Path::from("d/a")).await.unwrap().size, 4);

        faults.fail(Op::List, 1);
        let failed: Result<Vec<ObjectMeta>> =
            store.list(Some(&Path::from("d"))).try_collect().await;
        assert!(failed.unwrap_err().to_string().contains("injected"));
        counted.reset();
        assert_eq!(list(&store, "d").await, ["d/a"]);
        assert_eq!(
            counted.counts().list,
            1,
            "the failed listing was not cached"
        );

        faults.fail(Op::List, 1);
        assert!(
            store
                .list_with_delimiter(Some(&Path::from("d")))
                .await
                .is_err()
        );
        assert_eq!(
            store
                .list_with_delimiter(Some(&Path::from("d")))
                .await
                .unwrap()
                .objects
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn a_missing_object_is_reported_and_forgotten() {
        let (store, _, faults) = stack();
        put(&store, "gone", b"xx").await;
        store.head(&Path::from("gone")).await.unwrap();
        faults.delete(&Path::from("gone")).await.unwrap();
        let err = store
            .get_ranges(&Path::from("gone"), &[0..1, 1..2])
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NotFound { .. }), "{err}");
        let err = store.head(&Path::from("gone")).await.unwrap_err();
        assert!(
            matches!(err, Error::NotFound { .. }),
            "the cached entry was dropped: {err}"
        );
    }
}
