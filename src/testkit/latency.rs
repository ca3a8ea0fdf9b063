//! [`LatencyStore`]: charges a fixed delay per request, the way a remote store's round trip
//! does.

use std::fmt;
use std::ops::Range;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// Objects per page of a simulated listing; S3 returns at most 1,000 keys per request.
const LIST_PAGE: usize = 1000;

/// Wraps a store and sleeps `latency` before every request it passes on: once per HEAD, per
/// GET (so once per coalesced range of `get_ranges`, as S3 would see them), per write, and
/// once per 1,000 listed objects.
///
/// Unlike object_store's `ThrottledStore`, which sleeps once per `get_ranges` call, this
/// charges each real request, so concurrency and request counts show in the timings.
///
/// ```
/// # use std::time::Duration;
/// # use object_store::memory::InMemory;
/// # use datafusion_lakecache::testkit::LatencyStore;
/// let remote_like = LatencyStore::new(InMemory::new(), Duration::from_millis(25));
/// ```
#[derive(Debug)]
pub struct LatencyStore<S> {
    inner: S,
    latency: Duration,
}

impl<S: ObjectStore> LatencyStore<S> {
    /// Delays every request to `inner` by `latency`.
    pub fn new(inner: S, latency: Duration) -> Self {
        Self { inner, latency }
    }

    async fn round_trip(&self) {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }

    fn paged(
        &self,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let latency = self.latency;
        listing
            .chunks(LIST_PAGE)
            .then(move |page| async move {
                tokio::time::sleep(latency).await;
                stream::iter(page)
            })
            .flatten()
            .boxed()
    }
}

impl<S: ObjectStore> fmt::Display for LatencyStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LatencyStore({:?}, {})", self.latency, self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ObjectStore> ObjectStore for LatencyStore<S> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.round_trip().await;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.round_trip().await;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.round_trip().await;
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        super::get_ranges_per_request(self, location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let latency = self.latency;
        let locations = locations
            .then(move |l| async move {
                tokio::time::sleep(latency).await;
                l
            })
            .boxed();
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.paged(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.paged(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.round_trip().await;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.round_trip().await;
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.round_trip().await;
        self.inner.rename_opts(from, to, options).await
    }
}
