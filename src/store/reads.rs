//! [`StoreReads`]: `read(version, ranges)`, the one way a scan's bytes move.
//!
//! A read names the version it wants (the one its reader planned with). Every request it
//! makes is guarded by that version: `If-Match` with its strong e_tag, and a check that the
//! response shows that version (some servers ignore `If-Match`). Ranges already kept come from
//! the range cache; only the gaps are fetched, coalesced as object_store coalesces, and kept.
//! A read never returns another version's bytes: when the object changed, it fails with an
//! `object_store::Error::Precondition` naming the path and both versions, and drops the old
//! version's metadata, listings, footers and bytes, so the next query plans with the new one.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    Error, GetOptions, OBJECT_STORE_COALESCE_DEFAULT, ObjectMeta, ObjectStore, Result,
    coalesce_ranges,
};

use super::hedge::Hedger;
use super::proofs::Proofs;
use super::{Caches, Link};
use crate::metrics::{ScanMetrics, Source};
use crate::object::{
    ObjectId, ObjectVersion, StoreKey, Validator, VersionChanged, version_changed,
};

/// The versioned reads of one store instance. Cheap to clone.
#[derive(Clone)]
pub(crate) struct StoreReads(Arc<ReadsInner>, Naming);

/// Where the versions of the files a plan names come from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Naming {
    /// From the store: what its listing or HEAD showed (size, e_tag, modification time).
    Store,
    /// From a table log that names files written once (Delta Lake's `add` actions): path
    /// and size name the bytes, whatever the plan's metadata leaves out.
    Log,
}

pub(crate) struct ReadsInner {
    /// The store requests go to.
    pub(super) inner: Arc<dyn ObjectStore>,
    pub(super) store: StoreKey,
    pub(super) caches: Caches,
    /// Whether this instance records what it sees in the handle cache and keeps bytes in
    /// the range cache: a [`CachingObjectStore`](super::CachingObjectStore)'s reads do, reads
    /// over a store this crate did not wrap only guard and check.
    pub(super) caching: bool,
    /// Where objects can be read as local files, through cached descriptors.
    pub(super) local: Option<Arc<LocalFileSystem>>,
    /// What this store has shown it can read (`None`: reads that cache nothing of their own).
    proofs: Option<Proofs>,
    /// Cleared the first time the store refuses `If-Match`.
    if_match: AtomicBool,
    /// This store's recent response times, for hedging its slow GETs.
    hedger: Hedger,
}

impl std::fmt::Debug for StoreReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreReads({}, {})", self.0.store, self.0.inner)
    }
}

impl StoreReads {
    /// Reads of `inner`, which serves the namespace `store`, through `caches`.
    pub(super) fn new(
        inner: Arc<dyn ObjectStore>,
        store: StoreKey,
        caches: Caches,
        local: Option<Arc<LocalFileSystem>>,
    ) -> Self {
        let proofs = Some(Proofs::new(caches.handles.config()));
        let hedger = Hedger::new(Arc::clone(&caches.hedges));
        Self(
            Arc::new(ReadsInner {
                inner,
                store,
                caches,
                caching: true,
                local,
                proofs,
                if_match: AtomicBool::new(true),
                hedger,
            }),
            Naming::Store,
        )
    }

    /// Versioned reads over a store this crate did not wrap (found neither in the session's
    /// registry nor the directory): guarded and checked, footers in the index cache, nothing
    /// recorded in the handle or range cache for it.
    pub(crate) fn foreign(inner: Arc<dyn ObjectStore>, store: StoreKey, caches: &Caches) -> Self {
        Self(
            Arc::new(ReadsInner {
                inner,
                store,
                caches: caches.clone(),
                caching: false,
                local: None,
                proofs: None,
                if_match: AtomicBool::new(true),
                hedger: Hedger::new(Arc::clone(&caches.hedges)),
            }),
            Naming::Store,
        )
    }

    pub(super) fn from_inner(inner: Arc<ReadsInner>) -> Self {
        Self(inner, Naming::Store)
    }

    /// These reads for a plan whose files a table log names (see [`Naming::Log`]): their
    /// versions need no e_tag, HEAD or listing.
    pub(crate) fn named_by_log(&self) -> Self {
        Self(self.0.clone(), Naming::Log)
    }

    pub(super) fn downgrade(&self) -> Weak<ReadsInner> {
        Arc::downgrade(&self.0)
    }

    pub(super) fn inner(&self) -> &ReadsInner {
        &self.0
    }

    /// The namespace of the store read.
    pub(crate) fn store_key(&self) -> &StoreKey {
        &self.0.store
    }

    /// The link this store's scans last measured, with the store's current typical wait.
    pub(crate) fn link(&self) -> Option<Link> {
        let mut link = self.0.caches.links.get(&self.0.store)?;
        if let Some(wait) = self.typical_wait() {
            link.latency = wait;
        }
        Some(link)
    }

    /// Remembers `link` for every later scan of this store.
    pub(crate) fn record_link(&self, link: Link) {
        self.0.caches.links.record(&self.0.store, link);
    }

    /// Remembers `link` as a lower bound of this store's: kept if its bandwidth is more than
    /// the one known.
    pub(crate) fn raise_link(&self, link: Link) {
        self.0.caches.links.raise(&self.0.store, link);
    }

    /// The median wait for a response of this store's recent GETs.
    pub(crate) fn typical_wait(&self) -> Option<Duration> {
        self.0.hedger.typical_wait()
    }

    /// The caches these reads use.
    pub(crate) fn caches(&self) -> &Caches {
        &self.0.caches
    }

    /// The id of the object at `path`.
    pub(crate) fn id(&self, path: &Path) -> ObjectId {
        ObjectId {
            store: self.0.store.clone(),
            path: path.clone(),
        }
    }

    /// The version a plan's `meta` names, completed with what the handle cache knows of that
    /// same version (a strong e_tag its listing left out); the lookup is counted in `scan`.
    pub(crate) fn version_of(
        &self,
        meta: &ObjectMeta,
        scan: Option<&ScanMetrics>,
    ) -> ObjectVersion {
        if self.1 == Naming::Log {
            let (store, path) = (self.0.store.clone(), meta.location.clone());
            return ObjectVersion::with_validator(store, path, meta.size, Validator::Immutable);
        }
        if !self.0.caching {
            return ObjectVersion::new(self.0.store.clone(), meta);
        }
        let (version, hit) = self.0.caches.handles.version_of(&self.0.store, meta);
        if let Some(scan) = scan {
            scan.handle_lookup(hit);
        }
        version
    }

    /// Whether this store has shown it can read `path` (always, for reads that cache nothing
    /// of their own: a plan's metadata came from the store's own listing).
    pub(super) fn proven(&self, path: &Path) -> bool {
        self.0.proofs.as_ref().is_none_or(|p| p.object(path))
    }

    /// Notes that this store answered for `path`.
    pub(super) fn proved(&self, path: &Path) {
        if let Some(p) = &self.0.proofs {
            p.prove_object(path);
        }
    }

    /// Whether this store listed `key` itself.
    pub(super) fn listing_proven(&self, key: &crate::handle::ListKey) -> bool {
        self.0.proofs.as_ref().is_none_or(|p| p.listing(key))
    }

    /// Notes that this store answered the listing `key`.
    pub(super) fn proved_listing(&self, key: &crate::handle::ListKey) {
        if let Some(p) = &self.0.proofs {
            p.prove_listing(key);
        }
    }

    /// Makes sure this store can read `version` before anything cached of it is served: a
    /// HEAD, unless the store has shown the object already (a listing, a read). The HEAD
    /// also checks the version: a changed object is a [`VersionChanged`] error.
    pub(crate) async fn prove(&self, version: &ObjectVersion) -> Result<()> {
        let path = version.path();
        if self.proven(path) || self.local_file(path).is_some() {
            return Ok(());
        }
        let head = GetOptions::new().with_head(true);
        let meta = match self.0.inner.get_opts(path, head).await {
            Ok(response) => response.meta,
            Err(e) => return Err(self.failed(version, naming(e, format!("reading {path}")))),
        };
        self.observe(&meta);
        if !version.matches(&meta) {
            return Err(self.failed(version, version_changed(version, Some(&meta))));
        }
        Ok(())
    }

    /// The version of `path` the handle cache holds, if any.
    pub(super) fn current(&self, path: &Path) -> Option<ObjectVersion> {
        let meta = self.0.caches.handles.peek(&self.id(path))?;
        Some(ObjectVersion::new(self.0.store.clone(), &meta))
    }

    /// Whether the range cache holds every byte of `range` of `version`.
    pub(crate) fn holds(&self, version: &ObjectVersion, range: Range<u64>) -> bool {
        self.0.caching && self.0.caches.ranges.covers(version, range)
    }

    /// Reads `ranges` of exactly `version`; see the module docs. Bytes a reader reads are
    /// counted in its `scan`.
    pub(crate) async fn read(
        &self,
        version: &ObjectVersion,
        ranges: &[Range<u64>],
        scan: Option<&ScanMetrics>,
    ) -> Result<Vec<Bytes>> {
        check_ranges(version, ranges)?;
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let version = &self.complete(version).await?;
        let read = async {
            if let Some(file) = self.local_file(version.path()) {
                let wanted = ranges.to_vec();
                let (_, bytes) = self
                    .read_local(version.path(), file?, Some(version), move |_| Ok(wanted))
                    .await?;
                count(scan, &bytes);
                return Ok(bytes);
            }
            let cache = &self.0.caches.ranges;
            if self.0.caching && cache.config().enabled {
                let fetched = AtomicBool::new(false);
                let fetch = |gaps: Vec<Range<u64>>| {
                    fetched.store(true, Relaxed);
                    async move { self.fetch(version, &gaps).await }
                };
                // A version known by its time alone is completed by the responses (`fetch`
                // records what they show), and its bytes kept under the completed version.
                let keep_as = || Some(self.completed(version)).filter(|v| v.pins_bytes());
                let bytes = cache
                    .read_through(version, ranges, scan, fetch, keep_as)
                    .await?;
                // A read that went to the store was answered by it, which proves access; one
                // served whole from the caches needs a proof before its bytes are returned.
                if !fetched.load(Relaxed) {
                    self.prove(version).await?;
                }
                return Ok(bytes);
            }
            // Nothing kept is served here: the store's answer is the proof.
            let bytes = self.fetch(version, ranges).await?;
            count(scan, &bytes);
            Ok(bytes)
        };
        read.await.map_err(|e| self.failed(version, e))
    }

    /// [`StoreReads::read`] of one range.
    pub(crate) async fn read_one(
        &self,
        version: &ObjectVersion,
        range: Range<u64>,
        scan: Option<&ScanMetrics>,
    ) -> Result<Bytes> {
        let mut bytes = self
            .read(version, std::slice::from_ref(&range), scan)
            .await?;
        bytes.pop().ok_or_else(|| Error::Generic {
            store: "lakecache",
            source: format!("{}: a read of {range:?} returned nothing", version.path()).into(),
        })
    }

    /// `version` completed with what the handle cache knows now (see [`Self::complete`]),
    /// without a request.
    pub(crate) fn completed(&self, version: &ObjectVersion) -> ObjectVersion {
        match self.0.caching && !version.pins_bytes() {
            true => self.0.caches.handles.complete(version),
            false => None,
        }
        .unwrap_or_else(|| version.clone())
    }

    /// Whether `a` and `b` name the same version, as far as is known now: equal, or equal
    /// once completed.
    pub(crate) fn same_version(&self, a: &ObjectVersion, b: &ObjectVersion) -> bool {
        a == b || self.completed(a) == self.completed(b)
    }

    /// `version` with the strong validator a response showed for it, if it has none: a
    /// listing without e_tags names a version by size and modification time, and a HEAD or
    /// GET of that same version (same size, times within a second) shows its e_tag. Reads of
    /// the completed version are guarded, and their bytes kept. When the handle cache knows
    /// no e_tag but the disk tier holds bytes of the object, one HEAD learns it rather than
    /// fetching those bytes again.
    async fn complete(&self, version: &ObjectVersion) -> Result<ObjectVersion> {
        if version.pins_bytes() || !self.0.caching {
            return Ok(version.clone());
        }
        let caches = &self.0.caches;
        if let Some(known) = caches.handles.complete(version) {
            return Ok(known);
        }
        if caches.ranges.may_hold(version.id()) {
            let head = GetOptions::new().with_head(true);
            let meta = self.0.inner.get_opts(version.path(), head).await?.meta;
            if version.matches(&meta) {
                self.observe(&meta);
                if let Some(known) = caches.handles.complete(version) {
                    return Ok(known);
                }
            }
        }
        Ok(version.clone())
    }

    /// The file behind `path` if these reads go through cached local descriptors.
    pub(super) fn local_file(&self, path: &Path) -> Option<Result<PathBuf>> {
        if !self.0.caches.handles.files().enabled() {
            return None;
        }
        Some(self.0.local.as_ref()?.path_to_filesystem(path))
    }

    /// Fetches `ranges` of `version` from the store, one guarded request per coalesced range.
    async fn fetch(&self, version: &ObjectVersion, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let guard = match self.0.if_match.load(Relaxed) {
            true => version.validator().if_match(),
            false => None,
        };
        let fetched = self.fetch_guarded(version, ranges, guard.clone()).await;
        match fetched {
            Err(e) if guard.is_some() && is_unsupported(&e) => {
                // The store cannot evaluate If-Match: every response is still checked.
                log::warn!(
                    "{}: the store refused If-Match ({e}); reads are checked by the version \
                     their responses show instead",
                    self.0.store
                );
                self.0.if_match.store(false, Relaxed);
                self.fetch_guarded(version, ranges, None).await
            }
            other => other,
        }
    }

    async fn fetch_guarded(
        &self,
        version: &ObjectVersion,
        ranges: &[Range<u64>],
        guard: Option<String>,
    ) -> Result<Vec<Bytes>> {
        let path = version.path();
        coalesce_ranges(
            ranges,
            |range| {
                let mut options = GetOptions::new().with_range(Some(range.clone()));
                options.if_match = guard.clone();
                async move {
                    let what = || format!("reading {path}");
                    // Only the wait for the response is hedged, never its body: the copy
                    // carries the same guard, so it answers with this version or fails.
                    let response = self
                        .0
                        .hedger
                        .run(|| self.0.inner.get_opts(path, options.clone()))
                        .await
                        .map_err(|e| naming(e, what()))?;
                    if !version.matches(&response.meta) {
                        return Err(version_changed(version, Some(&response.meta)));
                    }
                    if version.pins_bytes() {
                        self.proved(path);
                    } else {
                        // Learn the e_tag the plan's metadata lacked (see `complete`).
                        self.observe(&response.meta);
                    }
                    let bytes = response.bytes().await.map_err(|e| naming(e, what()))?;
                    if bytes.len() as u64 != range.end - range.start {
                        return Err(Error::Generic {
                            store: "lakecache",
                            source: format!(
                                "{path}: asked for bytes {range:?}, the store sent {}",
                                bytes.len()
                            )
                            .into(),
                        });
                    }
                    Ok(bytes)
                }
            },
            OBJECT_STORE_COALESCE_DEFAULT,
        )
        .await
    }

    /// What a failed read of `version` leaves behind: a changed object drops the old
    /// version's entries (and becomes a [`VersionChanged`] error if it is not one yet), a
    /// missing one everything known of it.
    fn failed(&self, version: &ObjectVersion, error: Error) -> Error {
        match error {
            Error::Precondition { path, source } => {
                self.changed(version);
                if source.downcast_ref::<VersionChanged>().is_some() {
                    Error::Precondition { path, source }
                } else {
                    version_changed(version, None)
                }
            }
            e @ Error::NotFound { .. } => {
                if self.0.caching {
                    self.0.caches.forget(version.id());
                }
                e
            }
            e => e,
        }
    }

    /// `version` is no longer the object's: forget it everywhere.
    fn changed(&self, version: &ObjectVersion) {
        let caches = &self.0.caches;
        caches.forget_version(version);
        if !self.0.caching {
            return;
        }
        caches.handles.count_version_change();
        let cached = caches.handles.peek(version.id());
        if cached.is_some_and(|m| version.matches(&m)) {
            caches.handles.invalidate(version.id());
        }
    }

    /// Records what a response showed; a replaced version's entries are dropped.
    pub(super) fn observe(&self, meta: &ObjectMeta) {
        if !self.0.caching {
            return;
        }
        self.proved(&meta.location);
        if let Some(old) = self.0.caches.handles.record(&self.0.store, meta) {
            self.0
                .caches
                .forget_version(&ObjectVersion::new(self.0.store.clone(), &old));
        }
    }

    /// [`StoreReads::observe`] for an object a listing that began at `epoch` showed.
    pub(super) fn observe_listed(&self, meta: &ObjectMeta, epoch: u64) {
        self.proved(&meta.location);
        let handles = &self.0.caches.handles;
        if let Some(old) = handles.record_listed(&self.0.store, meta, epoch) {
            self.0
                .caches
                .forget_version(&ObjectVersion::new(self.0.store.clone(), &old));
        }
    }
}

/// Refuses ranges that are reversed or reach past the end of `version`, naming the file.
fn check_ranges(version: &ObjectVersion, ranges: &[Range<u64>]) -> Result<()> {
    match ranges
        .iter()
        .find(|r| r.start > r.end || r.end > version.size())
    {
        Some(bad) => Err(Error::Generic {
            store: "lakecache",
            source: format!(
                "{}: the range {bad:?} is not within its {} bytes",
                version.path(),
                version.size()
            )
            .into(),
        }),
        None => Ok(()),
    }
}

fn count(scan: Option<&ScanMetrics>, bytes: &[Bytes]) {
    if let Some(scan) = scan {
        scan.read_from(Source::Store, bytes.iter().map(|b| b.len() as u64).sum());
    }
}

/// `error`, naming `what` it was about if its message may not (object_store's errors for a
/// failed response body, for one, name no object): "reading lake/a.parquet: ...".
pub(super) fn naming(error: Error, what: impl std::fmt::Display) -> Error {
    match error {
        Error::Generic { store, source } => Error::Generic {
            store,
            source: format!("{what}: {source}").into(),
        },
        other => other,
    }
}

pub(super) fn is_unsupported(e: &Error) -> bool {
    matches!(e, Error::NotImplemented { .. } | Error::NotSupported { .. })
}
