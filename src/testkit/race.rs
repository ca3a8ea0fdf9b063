//! [`RaceStore`]: forces the interleavings in which one version of an object could be handed
//! to a reader of another, which timing alone would bring about only now and then: a GET
//! whose answer arrives after the object was rewritten and another request showed the new
//! version.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
    RenameOptions, Result,
};
use tokio::sync::watch;

/// How long a held answer waits for the request it waits for, at most: a test whose reader
/// never sends it finishes rather than hangs.
const MOST_HELD: Duration = Duration::from_secs(10);

/// Wraps a store; [`RaceStore::rewrite_during_get`] arms one race.
///
/// ```
/// # use bytes::Bytes;
/// # use object_store::{ObjectStoreExt, PutPayload, memory::InMemory, path::Path};
/// # use datafusion_lakecache::testkit::RaceStore;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> object_store::Result<()> {
/// let store = std::sync::Arc::new(RaceStore::new(InMemory::new()));
/// let path = Path::from("a");
/// store.put(&path, PutPayload::from_static(b"old")).await?;
/// store.rewrite_during_get(&path, Bytes::from_static(b"new"));
/// // The GET answers with the bytes it found, once a HEAD has shown the rewrite.
/// let get = tokio::spawn({
///     let (store, path) = (store.clone(), path.clone());
///     async move { store.get(&path).await?.bytes().await }
/// });
/// // The HEAD waits for the rewrite, and releases the GET's answer.
/// store.head(&path).await?;
/// assert_eq!(&get.await.unwrap()?[..], b"old");
/// assert_eq!(&store.get(&path).await?.bytes().await?[..], b"new");
/// # Ok(())
/// # }
/// ```
pub struct RaceStore<S> {
    inner: Arc<S>,
    /// Whether listings leave e_tags out, as s3s-fs and some S3-compatible servers do.
    listed_e_tags: bool,
    armed: Arc<Mutex<Option<Race>>>,
}

/// One race armed on one object.
struct Race {
    path: Path,
    /// The bytes the object is rewritten with, until a GET takes them.
    rewrite: Option<Bytes>,
    /// Set once the GET rewrote the object.
    rewritten: watch::Sender<bool>,
    /// Set once a HEAD of the object answered after the rewrite.
    shown: watch::Sender<bool>,
}

impl<S: ObjectStore> RaceStore<S> {
    /// Passes every request to `inner` until a race is armed.
    pub fn new(inner: S) -> Self {
        Self {
            inner: Arc::new(inner),
            listed_e_tags: true,
            armed: Arc::default(),
        }
    }

    /// Lists objects without their e_tags, as s3s-fs and some S3-compatible servers do: a
    /// listing then names a version by size and modification time alone.
    pub fn without_listed_e_tags(mut self) -> Self {
        self.listed_e_tags = false;
        self
    }

    /// Arms one race on `path`: the next GET of it (not a HEAD) takes the object as it is,
    /// the object is then rewritten with `bytes` (of the same size, for a rewrite only a
    /// version check tells apart), and the GET's answer, of the old bytes, is held until a
    /// HEAD of the object has answered with the new version. A HEAD of the object waits for
    /// the rewrite. Each waits 10 s at most.
    pub fn rewrite_during_get(&self, path: &Path, bytes: Bytes) {
        let race = Race {
            path: path.clone(),
            rewrite: Some(bytes),
            rewritten: watch::Sender::new(false),
            shown: watch::Sender::new(false),
        };
        *self.armed() = Some(race);
    }

    /// Waits until the armed race's GET has rewritten the object (its answer is held now).
    pub async fn wait_for_rewrite(&self) {
        let rewritten = self.armed().as_ref().map(|r| r.rewritten.subscribe());
        if let Some(mut rewritten) = rewritten {
            let _ = tokio::time::timeout(MOST_HELD, rewritten.wait_for(|r| *r)).await;
        }
    }

    fn armed(&self) -> std::sync::MutexGuard<'_, Option<Race>> {
        self.armed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A GET that found the old bytes: rewrites the object with `rewrite` (then says so on
    /// `rewritten`), and answers once a HEAD (`shown`) has shown the new version.
    async fn race(
        &self,
        location: &Path,
        options: GetOptions,
        (rewrite, rewritten, mut shown): (Bytes, watch::Sender<bool>, watch::Receiver<bool>),
    ) -> Result<GetResult> {
        let answer = self.inner.get_opts(location, options).await?;
        let (meta, range) = (answer.meta.clone(), answer.range.clone());
        let attributes = answer.attributes.clone();
        // Read whole before the rewrite: a server streaming from the file would mix them.
        let bytes = answer.bytes().await?;
        self.inner.put(location, PutPayload::from(rewrite)).await?;
        rewritten.send_replace(true);
        let _ = tokio::time::timeout(MOST_HELD, shown.wait_for(|s| *s)).await;
        let payload = GetResultPayload::Stream(stream::once(async move { Ok(bytes) }).boxed());
        Ok(GetResult {
            payload,
            meta,
            range,
            attributes,
        })
    }
}

impl<S: ObjectStore> fmt::Display for RaceStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RaceStore({})", self.inner)
    }
}

impl<S: ObjectStore> fmt::Debug for RaceStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RaceStore({})", self.inner)
    }
}

impl<S> RaceStore<S> {
    fn shape_listing(
        &self,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        if self.listed_e_tags {
            return listing;
        }
        listing
            .map(|m| {
                m.map(|mut m| {
                    m.e_tag = None;
                    m
                })
            })
            .boxed()
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ObjectStore> ObjectStore for RaceStore<S> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let race = match self.armed().as_mut() {
            Some(race) if &race.path == location => Some((
                match options.head {
                    true => None,
                    false => race.rewrite.take(),
                },
                race.rewritten.clone(),
                race.shown.clone(),
            )),
            _ => None,
        };
        match race {
            None => self.inner.get_opts(location, options).await,
            Some((Some(rewrite), rewritten, shown)) => {
                let race = (rewrite, rewritten, shown.subscribe());
                self.race(location, options, race).await
            }
            Some((None, rewritten, shown)) if options.head => {
                // Not before the rewrite; then it shows it, which releases the held GET.
                let mut rewritten = rewritten.subscribe();
                let _ = tokio::time::timeout(MOST_HELD, rewritten.wait_for(|r| *r)).await;
                let answer = self.inner.get_opts(location, options).await?;
                shown.send_replace(true);
                Ok(answer)
            }
            Some((None, ..)) => self.inner.get_opts(location, options).await,
        }
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        super::get_ranges_per_request(self, location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.shape_listing(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.shape_listing(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let mut listed = self.inner.list_with_delimiter(prefix).await?;
        if !self.listed_e_tags {
            for m in &mut listed.objects {
                m.e_tag = None;
            }
        }
        Ok(listed)
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}
