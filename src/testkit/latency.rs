//! [`LatencyStore`]: charges a fixed delay per request, the way a remote store's round trip
//! does, and optionally a link of limited bandwidth shared by all requests.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// Objects per page of a simulated listing; S3 returns at most 1,000 keys per request.
const LIST_PAGE: usize = 1000;

/// Wraps a store and sleeps `latency` before every request it passes on: once per HEAD, per
/// GET (so once per coalesced range of `get_ranges`, as S3 would see them), per write, and
/// once per 1,000 listed objects.
///
/// Unlike object_store's `ThrottledStore`, which sleeps once per `get_ranges` call, this
/// charges each real request, so concurrency and request counts show in the timings.
///
/// With [`LatencyStore::with_bandwidth`], the bytes of every GET also cross one simulated
/// link in turn: a response of `n` bytes occupies it for `n / bandwidth`, after those ahead of
/// it, so concurrent downloads share the bandwidth instead of each getting all of it. The
/// response itself comes after the latency; its body arrives as it crosses the link.
///
/// With [`LatencyStore::with_tail`], some requests take many times the latency, as a few in
/// a hundred do on object stores. With [`LatencyStore::with_spread`], each request's wait is
/// drawn from a log-normal body around the latency (its median); [`LatencyStore::s3_like`]
/// has both, as S3's time to first byte has.
///
/// ```
/// # use std::time::Duration;
/// # use object_store::memory::InMemory;
/// # use datafusion_lakecache::testkit::LatencyStore;
/// // 25 ms per request over a 1 Gbit/s link.
/// let remote_like = LatencyStore::new(InMemory::new(), Duration::from_millis(25))
///     .with_bandwidth(125_000_000);
/// ```
#[derive(Debug)]
pub struct LatencyStore<S> {
    inner: S,
    latency: Duration,
    /// Bytes per second of the shared link, and when it is next free.
    link: Option<Link>,
    /// One request in `.0` takes `.1` times the latency; which ones, a seeded draw decides.
    tail: Option<(u64, u32, Mutex<SmallRng>)>,
    /// The sigma of a log-normal spread of each wait around the latency, and its draws.
    spread: Option<(f64, Mutex<SmallRng>)>,
}

/// The spread of [`LatencyStore::s3_like`]: log-normal with sigma 0.5 around the median (its
/// 99th percentile 3.2 times the median), as S3's time to first byte is reported to spread.
pub const S3_SIGMA: f64 = 0.5;

/// A simulated link: bytes per second, and when it is next free.
type Link = (u64, Arc<Mutex<Instant>>);

impl<S: ObjectStore> LatencyStore<S> {
    /// Delays every request to `inner` by `latency`.
    pub fn new(inner: S, latency: Duration) -> Self {
        Self {
            inner,
            latency,
            link: None,
            tail: None,
            spread: None,
        }
    }

    /// Delays every request to `inner` as S3 is reported to: a log-normal body of waits whose
    /// median is `median` (sigma [`S3_SIGMA`]), and one request in a hundred 20 times longer,
    /// drawn from `seed`.
    pub fn s3_like(inner: S, median: Duration, seed: u64) -> Self {
        Self::new(inner, median)
            .with_spread(S3_SIGMA, seed)
            .with_tail(100, 20, seed.wrapping_add(1))
    }

    /// Draws each request's wait from a log-normal distribution whose median is the latency
    /// and whose sigma is `sigma` (from `seed`), rather than charging every request alike.
    pub fn with_spread(mut self, sigma: f64, seed: u64) -> Self {
        self.spread = Some((sigma.max(0.0), Mutex::new(SmallRng::seed_from_u64(seed))));
        self
    }

    /// Makes one request in `one_in` (drawn from `seed`) take `factor` times the latency.
    pub fn with_tail(mut self, one_in: u64, factor: u32, seed: u64) -> Self {
        self.tail = Some((
            one_in.max(1),
            factor,
            Mutex::new(SmallRng::seed_from_u64(seed)),
        ));
        self
    }

    /// Also carries the bytes of every GET over one link of `bytes_per_second` (at least 1),
    /// shared by all requests.
    pub fn with_bandwidth(mut self, bytes_per_second: u64) -> Self {
        self.link = Some((
            bytes_per_second.max(1),
            Arc::new(Mutex::new(Instant::now())),
        ));
        self
    }

    async fn round_trip(&self) {
        let latency = self.draw();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }

    /// The wait of the next request.
    fn draw(&self) -> Duration {
        let mut latency = self.latency;
        if let Some((sigma, rng)) = &self.spread {
            let mut rng = rng.lock().unwrap_or_else(|p| p.into_inner());
            // A standard normal draw (Box-Muller), then its log-normal around the median.
            let (u, v): (f64, f64) = (rng.random_range(f64::EPSILON..1.0), rng.random());
            let normal = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
            latency = latency.mul_f64((sigma * normal).exp());
        }
        if let Some((one_in, factor, rng)) = &self.tail {
            let mut rng = rng.lock().unwrap_or_else(|p| p.into_inner());
            if rng.random_range(0..*one_in) == 0 {
                latency *= *factor;
            }
        }
        latency
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

/// Waits while `bytes` cross `link`, after whatever is queued ahead of them.
async fn transfer(link: &Link, bytes: u64) {
    let (rate, free_at) = link;
    let busy = Duration::from_secs_f64(bytes as f64 / *rate as f64);
    let done = {
        let mut free_at = free_at.lock().unwrap_or_else(|p| p.into_inner());
        let start = (*free_at).max(Instant::now());
        *free_at = start + busy;
        *free_at
    };
    tokio::time::sleep_until(done).await;
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
        let head = options.head;
        let result = self.inner.get_opts(location, options).await?;
        let Some(link) = self.link.clone().filter(|_| !head) else {
            return Ok(result);
        };
        // The response has come; its body arrives once it crossed the link, in buffers of
        // its own as a network's are (not slices of the inner store's, which a cache could
        // keep for free).
        let (meta, range, attributes) = (
            result.meta.clone(),
            result.range.clone(),
            result.attributes.clone(),
        );
        let bytes = range.end - range.start;
        let body = result
            .into_stream()
            .map_ok(|chunk| Bytes::copy_from_slice(&chunk));
        let body = stream::once(async move {
            transfer(&link, bytes).await;
            body
        })
        .flatten()
        .boxed();
        Ok(GetResult {
            payload: GetResultPayload::Stream(body),
            meta,
            range,
            attributes,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectStoreExt;
    use object_store::memory::InMemory;

    #[test]
    fn waits_spread_log_normally_around_the_median() {
        let store =
            LatencyStore::new(InMemory::new(), Duration::from_millis(20)).with_spread(0.5, 7);
        let mut waits: Vec<Duration> = (0..2000).map(|_| store.draw()).collect();
        waits.sort();
        let (p50, p99) = (waits[1000], waits[1980]);
        assert!(
            p50 > Duration::from_millis(18) && p50 < Duration::from_millis(22),
            "{p50:?}"
        );
        // exp(2.33 * 0.5) = 3.2 times the median, give or take the sample.
        let ratio = p99.as_secs_f64() / p50.as_secs_f64();
        assert!((2.6..4.0).contains(&ratio), "{ratio}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_downloads_share_the_link() {
        let store = Arc::new(
            LatencyStore::new(InMemory::new(), Duration::from_millis(10)).with_bandwidth(10 << 20),
        );
        let path = Path::from("blob");
        store
            .put(&path, PutPayload::from(vec![0u8; 1 << 20]))
            .await
            .unwrap();
        let start = std::time::Instant::now();
        let reads: Vec<_> = (0..4)
            .map(|_| {
                let (store, path) = (Arc::clone(&store), path.clone());
                tokio::spawn(async move { store.get(&path).await.unwrap().bytes().await.unwrap() })
            })
            .collect();
        for r in reads {
            assert_eq!(r.await.unwrap().len(), 1 << 20);
        }
        // 4 MiB over a 10 MiB/s link take at least 400 ms, whatever the concurrency.
        assert!(
            start.elapsed() >= Duration::from_millis(400),
            "{:?}",
            start.elapsed()
        );
    }
}
