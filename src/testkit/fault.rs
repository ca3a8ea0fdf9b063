//! [`FaultStore`]: makes chosen requests fail, to test that failures are reported and never
//! cached.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, Error, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// The kinds of request a [`FaultStore`] can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `get_opts` with `head`.
    Head,
    /// `get_opts` without `head`, and `get_ranges`.
    Get,
    /// Listings. A failed listing yields the objects of the inner listing, then the error.
    List,
    /// Conditional GETs (`If-Match`), failed with [`Error::Precondition`] as if the object
    /// had just been replaced.
    Changed,
}

/// Wraps a store; [`FaultStore::fail`] makes the next requests of one kind fail.
///
/// ```
/// # use object_store::{ObjectStoreExt, memory::InMemory, path::Path};
/// # use datafusion_lakecache::testkit::{FaultStore, Op};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let store = FaultStore::new(InMemory::new());
/// store.fail(Op::Head, 1);
/// let err = store.head(&Path::from("a")).await.unwrap_err();
/// assert!(err.to_string().contains("injected"));
/// # }
/// ```
#[derive(Debug)]
pub struct FaultStore<S> {
    inner: S,
    pending: Arc<[AtomicU64; 4]>,
    /// The kinds of request refused, as by a store whose credentials do not allow them: a
    /// bit per [`Op`].
    refusing: Arc<AtomicU8>,
    /// Failures injected so far.
    injected: Arc<AtomicU64>,
}

impl<S: ObjectStore> FaultStore<S> {
    /// Passes every request to `inner` until told to fail some.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            pending: Arc::default(),
            refusing: Arc::default(),
            injected: Arc::default(),
        }
    }

    /// How many requests failed because they were told to (not counting refusals).
    pub fn injected(&self) -> u64 {
        self.injected.load(Relaxed)
    }

    /// Refuses every request from now on with `PermissionDenied`, listings before their
    /// first object: a store of other credentials. `false` lets requests through again.
    pub fn refuse_all(&self, refuse: bool) {
        match refuse {
            true => self.refuse(&[Op::Head, Op::Get, Op::List]),
            false => self.refuse(&[]),
        }
    }

    /// Refuses the requests of the kinds `ops` from now on with `PermissionDenied` (and
    /// lets every other kind through): `&[Op::Head, Op::Get]` is a store whose credentials
    /// may list a bucket but not read it (S3's `s3:ListBucket` without `s3:GetObject`).
    pub fn refuse(&self, ops: &[Op]) {
        let bits = ops.iter().fold(0u8, |bits, op| bits | 1 << *op as u8);
        self.refusing.store(bits, Relaxed);
    }

    fn refused(&self, op: Op, location: &str) -> Result<()> {
        match self.refusing.load(Relaxed) & 1 << op as u8 {
            0 => Ok(()),
            _ => Err(Error::PermissionDenied {
                path: location.to_string(),
                source: "refused: these credentials may not read it".into(),
            }),
        }
    }

    /// Makes the next `times` requests of kind `op` fail.
    pub fn fail(&self, op: Op, times: u64) {
        self.pending[op as usize].store(times, Relaxed);
    }

    /// Whether this request of kind `op` is to fail (and counts it if so).
    fn take(&self, op: Op) -> bool {
        let failing = self.pending[op as usize]
            .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            self.injected.fetch_add(1, Relaxed);
        }
        failing
    }

    fn check(&self, op: Op, location: &Path) -> Result<()> {
        self.refused(op, location.as_ref())?;
        match self.take(op) {
            true => Err(injected(op, location.as_ref())),
            false => Ok(()),
        }
    }

    fn maybe_fail_listing(
        &self,
        prefix: Option<&Path>,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        if let Err(e) = self.refused(Op::List, prefix.map_or("", |p| p.as_ref())) {
            return stream::once(async move { Err(e) }).boxed();
        }
        if !self.take(Op::List) {
            return listing;
        }
        let err = injected(Op::List, prefix.map_or("", |p| p.as_ref()));
        listing.chain(stream::once(async move { Err(err) })).boxed()
    }
}

fn injected(op: Op, location: &str) -> Error {
    Error::Generic {
        store: "FaultStore",
        source: format!("injected {op:?} failure for '{location}'").into(),
    }
}

impl<S: ObjectStore> fmt::Display for FaultStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultStore({})", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ObjectStore> ObjectStore for FaultStore<S> {
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
        self.check(if options.head { Op::Head } else { Op::Get }, location)?;
        if options.if_match.is_some() && self.take(Op::Changed) {
            return Err(Error::Precondition {
                path: location.to_string(),
                source: "injected change".into(),
            });
        }
        self.inner.get_opts(location, options).await
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        self.check(Op::Get, location)?;
        self.inner.get_ranges(location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.maybe_fail_listing(prefix, self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.maybe_fail_listing(prefix, self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.refused(Op::List, prefix.map_or("", |p| p.as_ref()))?;
        if self.take(Op::List) {
            return Err(injected(Op::List, prefix.map_or("", |p| p.as_ref())));
        }
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}
