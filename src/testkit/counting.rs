//! [`CountingStore`]: counts the requests that reach a store, by kind.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// A listing that, like a cloud store's, may not be read past its end: object_store's
/// paginated listings are `unfold` streams, which panic when polled after they ended. The
/// in-memory and local stores forgive it, so a counted store does not.
fn ends_strictly(
    listing: BoxStream<'static, Result<ObjectMeta>>,
) -> BoxStream<'static, Result<ObjectMeta>> {
    futures::stream::unfold(listing, |mut listing| async move {
        let item = listing.next().await?;
        Some((item, listing))
    })
    .boxed()
}

/// Requests seen by a [`CountingStore`] since it was built or last reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// HEAD requests (`get_opts` with `head`).
    pub head: u64,
    /// GET requests: one per `get_opts`, one per coalesced range of `get_ranges`.
    pub get: u64,
    /// Listings (`list`, `list_with_offset`, `list_with_delimiter`).
    pub list: u64,
    /// Writes, deletes, copies and renames.
    pub write: u64,
}

impl RequestCounts {
    /// Every request, of any kind.
    pub fn total(&self) -> u64 {
        self.head + self.get + self.list + self.write
    }
}

impl std::ops::Add for RequestCounts {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            head: self.head + other.head,
            get: self.get + other.get,
            list: self.list + other.list,
            write: self.write + other.write,
        }
    }
}

impl std::iter::Sum for RequestCounts {
    /// The requests of several stores (the processes of a cluster, say) together.
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), |a, b| a + b)
    }
}

#[derive(Debug, Default)]
struct Counters {
    head: AtomicU64,
    get: AtomicU64,
    list: AtomicU64,
    write: AtomicU64,
    /// Bytes the GETs' answers carry.
    bytes: AtomicU64,
    /// Every GET: the object and the range asked for.
    gets: Mutex<Vec<(Path, Option<GetRange>)>>,
    /// GETs and HEADs waiting for their response now, and the most there were at once.
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
}

/// Wraps a store and counts each request that reaches it.
///
/// ```
/// # use object_store::{ObjectStoreExt, PutPayload, memory::InMemory, path::Path};
/// # use datafusion_lakecache::testkit::CountingStore;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> object_store::Result<()> {
/// let store = CountingStore::new(InMemory::new());
/// store.put(&Path::from("a"), PutPayload::from_static(b"x")).await?;
/// store.head(&Path::from("a")).await?;
/// assert_eq!(store.counts().head, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct CountingStore<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S: ObjectStore> CountingStore<S> {
    /// Counts the requests made to `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            counters: Arc::default(),
        }
    }

    /// The counts so far.
    pub fn counts(&self) -> RequestCounts {
        let c = &self.counters;
        RequestCounts {
            head: c.head.load(Relaxed),
            get: c.get.load(Relaxed),
            list: c.list.load(Relaxed),
            write: c.write.load(Relaxed),
        }
    }

    /// Every GET since the last reset: the object and the range asked for (`None`: whole).
    pub fn gets(&self) -> Vec<(Path, Option<GetRange>)> {
        self.log().clone()
    }

    /// Bytes the answers to GETs carried since the last reset (what a remote store would send
    /// if every answer were read to its end).
    pub fn bytes(&self) -> u64 {
        self.counters.bytes.load(Relaxed)
    }

    /// The most GETs and HEADs that waited for their response at once since the last reset.
    pub fn peak_in_flight(&self) -> u64 {
        self.counters.peak_in_flight.load(Relaxed)
    }

    /// Sets every count back to zero and empties the GET log.
    pub fn reset(&self) {
        let c = &self.counters;
        for counter in [
            &c.head,
            &c.get,
            &c.list,
            &c.write,
            &c.bytes,
            &c.peak_in_flight,
        ] {
            counter.store(0, Relaxed);
        }
        self.log().clear();
    }

    fn log(&self) -> std::sync::MutexGuard<'_, Vec<(Path, Option<GetRange>)>> {
        self.counters.gets.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<S: ObjectStore> fmt::Display for CountingStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CountingStore({})", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ObjectStore> ObjectStore for CountingStore<S> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.counters.write.fetch_add(1, Relaxed);
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.counters.write.fetch_add(1, Relaxed);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        if options.head {
            self.counters.head.fetch_add(1, Relaxed);
        } else {
            self.counters.get.fetch_add(1, Relaxed);
            self.log().push((location.clone(), options.range.clone()));
        }
        let head = options.head;
        let c = &self.counters;
        let now = c.in_flight.fetch_add(1, Relaxed) + 1;
        c.peak_in_flight.fetch_max(now, Relaxed);
        let result = self.inner.get_opts(location, options).await;
        c.in_flight.fetch_sub(1, Relaxed);
        let result = result?;
        if !head {
            let bytes = result.range.end.saturating_sub(result.range.start);
            self.counters.bytes.fetch_add(bytes, Relaxed);
        }
        Ok(result)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        super::get_ranges_per_request(self, location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let counters = Arc::clone(&self.counters);
        let locations = locations
            .inspect(move |_| {
                counters.write.fetch_add(1, Relaxed);
            })
            .boxed();
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.counters.list.fetch_add(1, Relaxed);
        ends_strictly(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.counters.list.fetch_add(1, Relaxed);
        ends_strictly(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.counters.list.fetch_add(1, Relaxed);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.counters.write.fetch_add(1, Relaxed);
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.counters.write.fetch_add(1, Relaxed);
        self.inner.rename_opts(from, to, options).await
    }
}
