//! [`ContentETags`]: a store whose e_tags are digests of the objects' bytes, as S3's (MD5)
//! are: two stores holding the same bytes at a path show one e_tag, different bytes show
//! different ones. Over an in-memory store (whose e_tags are counters: `"0"`, `"1"`, ...) it
//! stands for a remote store whose versions can be shared between store identities.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};
use twox_hash::XxHash64;

/// Wraps a store and shows a digest of each object's bytes as its e_tag, translating
/// `If-Match` and `If-None-Match` back to the inner store's e_tags. Digests are learned by
/// reading each object version whole from the inner store once.
///
/// ```
/// # use object_store::{ObjectStoreExt, PutPayload, memory::InMemory, path::Path};
/// # use datafusion_lakecache::testkit::ContentETags;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> object_store::Result<()> {
/// let (a, b) = (ContentETags::new(InMemory::new()), ContentETags::new(InMemory::new()));
/// let path = Path::from("x");
/// a.put(&path, PutPayload::from_static(b"first")).await?;
/// b.put(&path, PutPayload::from_static(b"other")).await?;
/// b.put(&path, PutPayload::from_static(b"first")).await?;
/// assert_eq!(a.head(&path).await?.e_tag, b.head(&path).await?.e_tag);
/// # Ok(())
/// # }
/// ```
pub struct ContentETags<S> {
    inner: Arc<S>,
    digests: Known,
}

/// Per path: the inner e_tag of the version whose digest is known, and that digest.
type Known = Arc<Mutex<HashMap<Path, (Option<String>, String)>>>;

impl<S: ObjectStore> ContentETags<S> {
    /// Shows digests of `inner`'s objects as their e_tags.
    pub fn new(inner: S) -> Self {
        Self {
            inner: Arc::new(inner),
            digests: Arc::default(),
        }
    }

    /// Learns the digest of every object under `prefix` now, so that no later request pays
    /// for reading an object whole (benchmarks call this before they measure).
    pub async fn learn(&self, prefix: Option<&Path>) -> Result<()> {
        let digests = Digests::of(self);
        let mut listing = self.inner.list(prefix);
        while let Some(meta) = listing.next().await {
            digests.shown(meta?).await?;
        }
        Ok(())
    }
}

/// The digest of `bytes`, spelled as S3 spells an MD5 e_tag: 32 hex digits in quotes.
fn digest(bytes: &[u8]) -> String {
    let (a, b) = (XxHash64::oneshot(1, bytes), XxHash64::oneshot(2, bytes));
    format!("\"{a:016x}{b:016x}\"")
}

/// What the translation needs, cheap to clone into a listing's stream.
struct Digests<S> {
    inner: Arc<S>,
    known: Known,
}

impl<S: ObjectStore> Digests<S> {
    fn of(store: &ContentETags<S>) -> Self {
        Self {
            inner: Arc::clone(&store.inner),
            known: Arc::clone(&store.digests),
        }
    }

    /// `meta` with its e_tag replaced by the digest of that version's bytes.
    async fn shown(&self, mut meta: ObjectMeta) -> Result<ObjectMeta> {
        let known = self.lock().get(&meta.location).cloned();
        let digest = match known {
            Some((tag, digest)) if tag == meta.e_tag => digest,
            _ => {
                let options = GetOptions {
                    if_match: meta.e_tag.clone(),
                    ..GetOptions::default()
                };
                let bytes = self
                    .inner
                    .get_opts(&meta.location, options)
                    .await?
                    .bytes()
                    .await?;
                let d = digest(&bytes);
                let entry = (meta.e_tag.clone(), d.clone());
                self.lock().insert(meta.location.clone(), entry);
                d
            }
        };
        meta.e_tag = Some(digest);
        Ok(meta)
    }

    /// The inner e_tag of the version of `path` whose digest is `shown`, or one no version
    /// has (the inner store then refuses an `If-Match`, as S3 would for a replaced object).
    fn inner_tag(&self, path: &Path, shown: &str) -> String {
        match self.lock().get(path) {
            Some((Some(tag), digest)) if digest.trim_matches('"') == shown.trim_matches('"') => {
                tag.clone()
            }
            _ => "\"no version has this e_tag\"".to_string(),
        }
    }

    fn forget(&self, path: &Path) {
        self.lock().remove(path);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Path, (Option<String>, String)>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<S: ObjectStore> ContentETags<S> {
    fn listing(
        &self,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let digests = Arc::new(Digests::of(self));
        listing
            .then(move |m| {
                let digests = Arc::clone(&digests);
                async move { digests.shown(m?).await }
            })
            .boxed()
    }
}

impl<S: ObjectStore> fmt::Debug for ContentETags<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl<S: ObjectStore> fmt::Display for ContentETags<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentETags({})", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ObjectStore> ObjectStore for ContentETags<S> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let shown = digest(&Bytes::from(payload.clone()));
        let mut result = self.inner.put_opts(location, payload, opts).await?;
        let entry = (result.e_tag.clone(), shown.clone());
        Digests::of(self).lock().insert(location.clone(), entry);
        result.e_tag = Some(shown);
        Ok(result)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        // Learned from the bytes when first shown.
        Digests::of(self).forget(location);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, mut options: GetOptions) -> Result<GetResult> {
        let digests = Digests::of(self);
        options.if_match = options.if_match.map(|e| digests.inner_tag(location, &e));
        options.if_none_match = options
            .if_none_match
            .map(|e| digests.inner_tag(location, &e));
        let mut result = self.inner.get_opts(location, options).await?;
        result.meta = digests.shown(result.meta).await?;
        Ok(result)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        super::get_ranges_per_request(self, location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let digests = Digests::of(self);
        self.inner
            .delete_stream(locations)
            .inspect(move |p| {
                if let Ok(p) = p {
                    digests.forget(p);
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.listing(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.listing(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let mut result = self.inner.list_with_delimiter(prefix).await?;
        let digests = Digests::of(self);
        let mut objects = Vec::with_capacity(result.objects.len());
        for meta in result.objects {
            objects.push(digests.shown(meta).await?);
        }
        result.objects = objects;
        Ok(result)
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        Digests::of(self).forget(to);
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        let digests = Digests::of(self);
        digests.forget(from);
        digests.forget(to);
        self.inner.rename_opts(from, to, options).await
    }
}
