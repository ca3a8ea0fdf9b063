//! [`StoreReads`]: `read(version, ranges)`, the one way a scan's bytes move.
//!
//! A read names the version it wants (the one its reader planned with). Every request it
//! makes is guarded by that version: `If-Match` with its strong e_tag, and a check that the
//! response shows that version (some servers ignore `If-Match`). Ranges already kept come from
//! the range cache; only the gaps are fetched, coalesced as object_store coalesces, and kept.
//! A read never returns another version's bytes: when the object changed, it fails with an
//! `object_store::Error::Precondition` naming the path and both versions, and drops what this
//! store's identity recorded of the old version, so its next query plans with the new one.
//! Bytes are kept under a version only when every response that carried them showed it.
//!
//! Access is proven per version and store identity: a GET or HEAD this store answered for a
//! version is its proof, and nothing cached of a version (bytes, footer, bloom filter,
//! metadata) is served to it before. A listing proves nothing: a store may be allowed to list
//! and not to read.

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    Error, GetOptions, OBJECT_STORE_COALESCE_DEFAULT, ObjectMeta, ObjectStore, Result,
    coalesce_ranges,
};
use tokio::sync::watch;

use super::hedge::Hedger;
use super::{Caches, Link};
use crate::handle::{Epoch, Seen};
use crate::metrics::{ScanMetrics, Source};
use crate::object::{
    ObjectId, ObjectVersion, StoreIdentity, StoreKey, Validator, VersionChanged, version_changed,
};
use crate::range::Fetched;

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

/// A proof under way: whether the HEAD other reads of the same version wait for held.
type Proving = watch::Receiver<Option<bool>>;

pub(crate) struct ReadsInner {
    /// The store requests go to.
    pub(super) inner: Arc<dyn ObjectStore>,
    pub(super) store: StoreKey,
    /// Whose answers the store gives: what it records and proves is this identity's.
    pub(super) identity: StoreIdentity,
    pub(super) caches: Caches,
    /// Whether this instance keeps bytes in the range cache: a
    /// [`CachingObjectStore`](super::CachingObjectStore)'s reads do; reads over a store this
    /// crate did not wrap only guard, check, prove and record what versions they saw (so that
    /// a version a listing named by size and time alone is guarded by its e_tag once known).
    pub(super) keeps_bytes: bool,
    /// Where objects can be read as local files, through cached descriptors.
    pub(super) local: Option<Arc<LocalFileSystem>>,
    /// Cleared the first time the store refuses `If-Match`.
    if_match: AtomicBool,
    /// This store's recent response times, for hedging its slow GETs.
    hedger: Hedger,
    /// HEADs proving access, by version: reads of one version wait for one HEAD.
    proving: Mutex<HashMap<ObjectVersion, Proving>>,
    /// Listings under way, by what they list: a listing of the same prefix waits for one.
    listings: Mutex<HashMap<crate::handle::ListKey, watch::Receiver<bool>>>,
}

impl std::fmt::Debug for StoreReads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "StoreReads({}, {}, {})",
            self.0.store, self.0.identity, self.0.inner
        )
    }
}

impl StoreReads {
    /// Reads of `inner`, which serves the namespace `store` with the answers of `identity`,
    /// through `caches`.
    pub(super) fn new(
        inner: Arc<dyn ObjectStore>,
        store: StoreKey,
        identity: StoreIdentity,
        caches: Caches,
        local: Option<Arc<LocalFileSystem>>,
    ) -> Self {
        Self::build(inner, store, identity, caches, true, local)
    }

    /// Versioned reads over a store this crate did not wrap (found neither in the session's
    /// registry nor the directory), with the identity of that store instance: guarded and
    /// checked, footers in the index cache (served once the store has shown it can read
    /// them), the versions it shows recorded for its identity, no bytes kept.
    pub(crate) fn foreign(inner: Arc<dyn ObjectStore>, store: StoreKey, caches: &Caches) -> Self {
        let identity = caches.directory.identity_of(&inner);
        Self::build(inner, store, identity, caches.clone(), false, None)
    }

    fn build(
        inner: Arc<dyn ObjectStore>,
        store: StoreKey,
        identity: StoreIdentity,
        caches: Caches,
        keeps_bytes: bool,
        local: Option<Arc<LocalFileSystem>>,
    ) -> Self {
        let hedger = Hedger::new(Arc::clone(&caches.hedges), &store);
        Self(
            Arc::new(ReadsInner {
                inner,
                store,
                identity,
                caches,
                keeps_bytes,
                local,
                if_match: AtomicBool::new(true),
                hedger,
                proving: Mutex::default(),
                listings: Mutex::default(),
            }),
            Naming::Store,
        )
    }

    pub(super) fn from_inner(inner: Arc<ReadsInner>) -> Self {
        Self(inner, Naming::Store)
    }

    /// The listings under way through these reads (`listing.rs`).
    pub(super) fn listings(
        &self,
    ) -> &Mutex<HashMap<crate::handle::ListKey, watch::Receiver<bool>>> {
        &self.0.listings
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

    /// Whose answers the store gives.
    pub(crate) fn identity(&self) -> &StoreIdentity {
        &self.0.identity
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

    /// The object at `path` as this identity sees it: the key of what it recorded.
    pub(super) fn seen(&self, path: &Path) -> Seen {
        Seen {
            identity: self.0.identity.clone(),
            id: self.id(path),
        }
    }

    /// The version `meta` shows, as this store's identity knows it.
    pub(super) fn version(&self, meta: &ObjectMeta) -> ObjectVersion {
        ObjectVersion::new(self.0.store.clone(), &self.0.identity, meta)
    }

    /// The version a plan's `meta` names, completed with what this identity recorded of that
    /// same version (a strong e_tag its listing left out); the lookup is counted in `scan`.
    pub(crate) fn version_of(
        &self,
        meta: &ObjectMeta,
        scan: Option<&ScanMetrics>,
    ) -> ObjectVersion {
        let (store, identity) = (self.0.store.clone(), &self.0.identity);
        if self.1 == Naming::Log {
            let path = meta.location.clone();
            return ObjectVersion::with_validator(
                store,
                identity,
                path,
                meta.size,
                Validator::Immutable,
            );
        }
        let (version, hit) = self.0.caches.handles.version_of(identity, &store, meta);
        if let Some(scan) = scan {
            scan.handle_lookup(hit);
        }
        version
    }

    /// Whether this store has shown it can read `version` (a local file always can: every
    /// read of it checks the file itself).
    pub(super) fn proven(&self, version: &ObjectVersion) -> bool {
        self.local_file(version.path()).is_some()
            || self.0.caches.handles.proven(&self.0.identity, version)
    }

    /// Notes that this store answered a HEAD or a GET for `version`.
    fn proved(&self, version: &ObjectVersion) {
        self.0.caches.handles.prove(&self.0.identity, version);
    }

    /// Makes sure this store can read `version` before anything cached of it is served: one
    /// HEAD, unless the store has shown it already. Reads of one version wait for one HEAD,
    /// which runs as a task of its own so that no waiter depends on another being polled. The
    /// HEAD also checks the version: a changed object is a [`VersionChanged`] error.
    pub(crate) async fn prove(&self, version: &ObjectVersion) -> Result<()> {
        if self.proven(version) {
            return Ok(());
        }
        let sender = match self.join_proof(version) {
            Err(mut outcome) => {
                return match outcome.wait_for(Option::is_some).await.map(|o| *o) {
                    Ok(Some(true)) => Ok(()),
                    // Its error was the first caller's to report (or it never finished): this
                    // one asks once more itself.
                    _ => self.head_proof(version).await,
                };
            }
            Ok(sender) => sender,
        };
        let (this, v) = (self.clone(), version.clone());
        let head = async move {
            let result = this.head_proof(&v).await;
            sender.send_replace(Some(result.is_ok()));
            let mut map = this.0.proving.lock().unwrap_or_else(|e| e.into_inner());
            map.remove(&v);
            result
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime
                .spawn(head)
                .await
                .map_err(|source| Error::JoinError { source })?,
            Err(_) => head.await,
        }
    }

    /// The sender of a new proof of `version` this caller makes, or the outcome of the one
    /// under way.
    fn join_proof(
        &self,
        version: &ObjectVersion,
    ) -> std::result::Result<watch::Sender<Option<bool>>, Proving> {
        let mut map = self.0.proving.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(outcome) = map.get(version) {
            return Err(outcome.clone());
        }
        let (sender, outcome) = watch::channel(None);
        map.insert(version.clone(), outcome);
        Ok(sender)
    }

    /// A HEAD of `path`, its wait for the response hedged: a HEAD proving access, or a
    /// planner's (of a file its listing did not show, or before a new identity's footer read),
    /// holds up its query as a slow GET does.
    pub(crate) async fn hedged_head(&self, path: &Path) -> Result<object_store::GetResult> {
        let head = GetOptions::new().with_head(true);
        let inner = &self.0.inner;
        self.0
            .hedger
            .run_head(|| inner.get_opts(path, head.clone()))
            .await
    }

    /// One HEAD proving `version`, counted.
    async fn head_proof(&self, version: &ObjectVersion) -> Result<()> {
        if self.proven(version) {
            return Ok(());
        }
        self.0.caches.handles.count_proof_head();
        let path = version.path();
        let since = self.now();
        let meta = match self.hedged_head(path).await {
            Ok(response) => response.meta,
            Err(e) => return Err(self.failed(version, naming(e, format!("reading {path}")))),
        };
        self.observe(&meta, since);
        if !version.matches(&meta) {
            return Err(self.failed(version, version_changed(version, Some(&meta))));
        }
        self.proved(version);
        Ok(())
    }

    /// The version of `path` this identity recorded, if any.
    pub(super) fn current(&self, path: &Path) -> Option<ObjectVersion> {
        let meta = self.0.caches.handles.peek(&self.seen(path))?;
        Some(self.version(&meta))
    }

    /// The metadata of `path` a HEAD may be answered with: what this identity recorded, once
    /// its store has shown that version.
    pub(super) fn cached_head(&self, path: &Path) -> Option<ObjectMeta> {
        let handles = &self.0.caches.handles;
        handles.meta(&self.seen(path), |m| {
            handles.proven(&self.0.identity, &self.version(m))
        })
    }

    /// The metadata this identity recorded of `path` and the decoded footer of that version,
    /// if the index cache holds it and this store has proven the version.
    pub(crate) fn cached_footer(
        &self,
        path: &Path,
    ) -> Option<(ObjectMeta, Arc<parquet::file::metadata::ParquetMetaData>)> {
        let meta = self.0.caches.handles.peek(&self.seen(path))?;
        let version = self.version(&meta);
        if !self.proven(&version) {
            return None;
        }
        let footer = self.0.caches.index.cached_metadata(&version)?;
        Some((meta, footer))
    }

    /// Whether the range cache's memory tier holds every byte of `range` of `version`: a
    /// read of it needs nothing fetched ahead. (Bytes on the disk tier are worth fetching
    /// ahead: a read of them waits for a blocking thread and the disk.)
    pub(crate) fn in_memory(&self, version: &ObjectVersion, range: Range<u64>) -> bool {
        self.0.keeps_bytes && self.0.caches.ranges.in_memory(version, range)
    }

    /// Reads `ranges` of exactly `version`; see the module docs. Bytes a reader reads are
    /// counted in its `scan`.
    pub(crate) async fn read(
        &self,
        version: &ObjectVersion,
        ranges: &[Range<u64>],
        scan: Option<&ScanMetrics>,
    ) -> Result<Vec<Bytes>> {
        Ok(self.read_shown(version, ranges, scan).await?.1)
    }

    /// [`StoreReads::read`], and the version the bytes are of: `version` itself when its
    /// validator tells its bytes apart (every byte was read under its guard, or kept under
    /// it); for a version a listing named by size and time alone, the version every response
    /// that brought them showed, this read's own and those of the downloads it joined
    /// (`version` if they showed none, or not one alike). Whoever hands the bytes on to a
    /// reader compares it with the version that reader reads at (`FileLease`): a reader
    /// pinned to the object's new e_tag while the download was under way gets none of the
    /// old version's bytes.
    pub(crate) async fn read_shown(
        &self,
        version: &ObjectVersion,
        ranges: &[Range<u64>],
        scan: Option<&ScanMetrics>,
    ) -> Result<(ObjectVersion, Vec<Bytes>)> {
        check_ranges(version, ranges)?;
        if ranges.is_empty() {
            return Ok((version.clone(), Vec::new()));
        }
        let version = &self.complete(version).await?;
        let read = async {
            if let Some(file) = self.local_file(version.path()) {
                let wanted = ranges.to_vec();
                let (_, bytes) = self
                    .read_local(version.path(), file?, Some(version), move |_| Ok(wanted))
                    .await?;
                count(scan, &bytes);
                return Ok((version.clone(), bytes));
            }
            let cache = &self.0.caches.ranges;
            if self.0.keeps_bytes && cache.config().enabled {
                let fetched = Arc::new(AtomicBool::new(false));
                let fetch = {
                    let (this, v, fetched) = (self.clone(), version.clone(), fetched.clone());
                    move |gaps: Vec<Range<u64>>| {
                        fetched.store(true, Relaxed);
                        let (this, v) = (this.clone(), v.clone());
                        async move { this.fetch(&v, &gaps).await }.boxed()
                    }
                };
                let read = cache.read_through_shown(version, ranges, scan, &fetch);
                let (bytes, shown) = read.await?;
                // A read that went to the store was answered by it, which proves access; one
                // served whole from the caches needs a proof before its bytes are returned.
                if !fetched.load(Relaxed) {
                    self.prove(version).await?;
                }
                return Ok((self.of(version, shown), bytes));
            }
            // Nothing kept is served here: the store's answer is the proof.
            let fetched = self.fetch(version, ranges).await?;
            count(scan, &fetched.bytes);
            Ok((self.of(version, fetched.keep), fetched.bytes))
        };
        read.await.map_err(|e| self.failed(version, e))
    }

    /// The version bytes read for `version` are of, given the one their responses showed.
    fn of(&self, version: &ObjectVersion, shown: Option<ObjectVersion>) -> ObjectVersion {
        match version.pins_bytes() {
            true => version.clone(),
            false => shown.unwrap_or_else(|| version.clone()),
        }
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

    /// `version` completed with what this identity recorded now (see [`Self::complete`]),
    /// without a request.
    pub(crate) fn completed(&self, version: &ObjectVersion) -> ObjectVersion {
        match version.pins_bytes() {
            false => self.0.caches.handles.complete(&self.0.identity, version),
            true => None,
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
    /// the completed version are guarded, and their bytes kept. When this identity recorded
    /// no e_tag but the range cache holds bytes of the object (another identity's, or a
    /// previous process's on disk), one HEAD learns it rather than fetching those bytes again.
    async fn complete(&self, version: &ObjectVersion) -> Result<ObjectVersion> {
        if version.pins_bytes() {
            return Ok(version.clone());
        }
        let caches = &self.0.caches;
        if let Some(known) = caches.handles.complete(&self.0.identity, version) {
            return Ok(known);
        }
        if self.0.keeps_bytes && caches.ranges.may_hold(version.id()) {
            caches.handles.count_proof_head();
            let head = GetOptions::new().with_head(true);
            let since = self.now();
            let meta = self.0.inner.get_opts(version.path(), head).await?.meta;
            if version.matches(&meta) {
                self.observe(&meta, since);
                return Ok(self.shown_by(version, &meta));
            }
        }
        Ok(version.clone())
    }

    /// `version` (known by size and time) as the answer `meta` showed it: with the strong
    /// validator the answer carries, if it does. What this request showed, not what is
    /// recorded once it is done: another request's answer may have been recorded meanwhile.
    fn shown_by(&self, version: &ObjectVersion, meta: &ObjectMeta) -> ObjectVersion {
        let shown = version.reseen(&self.0.identity, meta);
        match shown.pins_bytes() {
            true => shown,
            false => version.clone(),
        }
    }

    /// The version a reader of `version` reads at from now on: `version` itself if its
    /// validator tells its bytes apart; else (a listing named it by size and time alone) the
    /// e_tag this identity recorded for it, or learned with one HEAD (which proves access
    /// too). Every later read of the reader is then guarded by that e_tag, so a footer and
    /// the data it points to come from one version, and the footer is kept.
    pub(crate) async fn pinned(&self, version: &ObjectVersion) -> Result<ObjectVersion> {
        if version.pins_bytes() {
            return Ok(version.clone());
        }
        let handles = &self.0.caches.handles;
        if let Some(known) = handles.complete(&self.0.identity, version) {
            return Ok(known);
        }
        if let Some(file) = self.local_file(version.path()) {
            // A local file's descriptor shows its e_tag (inode, time, size): no request. A
            // plan that crossed the wire (Ballista's leaves e_tags out) names it by size and
            // time alone, and its footer is kept only once it is pinned.
            let path = version.path();
            let (meta, _) = self
                .read_local(path, file?, Some(version), |_| Ok(Vec::new()))
                .await
                .map_err(|e| self.failed(version, e))?;
            return Ok(self.shown_by(version, &meta));
        }
        handles.count_proof_head();
        let path = version.path();
        let since = self.now();
        let meta = match self.hedged_head(path).await {
            Ok(response) => response.meta,
            Err(e) => return Err(self.failed(version, naming(e, format!("reading {path}")))),
        };
        self.observe(&meta, since);
        if !version.matches(&meta) {
            return Err(self.failed(version, version_changed(version, Some(&meta))));
        }
        self.proved(version);
        Ok(self.shown_by(version, &meta))
    }

    /// Whether these reads go to local files through cached descriptors.
    pub(crate) fn reads_local_files(&self) -> bool {
        self.0.local.is_some() && self.0.caches.handles.files().enabled()
    }

    /// The file behind `path` if these reads go through cached local descriptors.
    pub(super) fn local_file(&self, path: &Path) -> Option<Result<PathBuf>> {
        if !self.0.caches.handles.files().enabled() {
            return None;
        }
        Some(self.0.local.as_ref()?.path_to_filesystem(path))
    }

    /// Fetches `ranges` of `version` from the store, one guarded request per coalesced range,
    /// and says which version the bytes may be kept under.
    async fn fetch(&self, version: &ObjectVersion, ranges: &[Range<u64>]) -> Result<Fetched> {
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
    ) -> Result<Fetched> {
        let path = version.path();
        // What each response showed of the version it carried (see `shown`).
        let shown: Mutex<Vec<Option<ObjectVersion>>> = Mutex::default();
        let since = self.now();
        let bytes = coalesce_ranges(
            ranges,
            |range| {
                let mut options = GetOptions::new().with_range(Some(range.clone()));
                options.if_match = guard.clone();
                let (guarded, shown) = (guard.is_some(), &shown);
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
                    if !version.pins_bytes() {
                        // Learn the e_tag the plan's metadata lacked (see `complete`).
                        self.observe(&response.meta, since);
                    }
                    let seen = self.shown(version, &response.meta, guarded);
                    shown.lock().unwrap_or_else(|e| e.into_inner()).push(seen);
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
        .await?;
        // Every response answered for `version`: the store can read it.
        self.proved(version);
        let shown = shown.into_inner().unwrap_or_else(|e| e.into_inner());
        let keep = match shown.first() {
            Some(Some(first)) if shown.iter().all(|s| s.as_ref() == Some(first)) => {
                Some(first.clone())
            }
            _ if !version.pins_bytes() && distinct(&shown) > 1 => {
                // The object was rewritten between the responses of one read (versions known
                // by size and time cannot tell): its bytes are of two versions.
                return Err(version_changed(version, None));
            }
            _ => None,
        };
        Ok(Fetched { bytes, keep })
    }

    /// The version a response for `version` showed itself to carry, if it showed one its
    /// bytes may be kept under: `version` when its validator was guarded by `If-Match` or
    /// shown in the response (or the file is named by a log), the version a strong e_tag
    /// names for a version known by its time alone, else nothing.
    fn shown(
        &self,
        version: &ObjectVersion,
        meta: &ObjectMeta,
        guarded: bool,
    ) -> Option<ObjectVersion> {
        match version.validator() {
            Validator::ETag(_) => (guarded || meta.e_tag.is_some()).then(|| version.clone()),
            Validator::Version(_) => meta.version.is_some().then(|| version.clone()),
            Validator::Immutable => Some(version.clone()),
            Validator::Unvalidated { .. } => {
                let seen = version.reseen(&self.0.identity, meta);
                seen.pins_bytes().then_some(seen)
            }
        }
    }

    /// What a failed read of `version` leaves behind, for this identity alone: a changed
    /// object drops its proof and recorded version (and becomes a [`VersionChanged`] error if
    /// it is not one yet), a missing one everything this identity recorded of it.
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
                self.forget_object(version.path());
                e
            }
            e => e,
        }
    }

    /// Forgets what this identity recorded and proved of the object at `path`, and the
    /// entries of its versions that are this identity's alone.
    pub(super) fn forget_object(&self, path: &Path) {
        self.0.caches.forget_seen(&self.seen(path));
    }

    /// `version` is no longer the object's, for this identity: its proof, its recorded
    /// metadata and, if the version is this identity's alone, its entries go.
    fn changed(&self, version: &ObjectVersion) {
        let caches = &self.0.caches;
        caches.handles.count_version_change();
        caches.handles.unprove(&self.0.identity, version);
        if version.owner() == Some(&self.0.identity) {
            caches.forget_version(version);
        }
    }

    /// Now, as a request about to be sent takes it (see [`StoreReads::observe`]).
    pub(super) fn now(&self) -> Epoch {
        self.0.caches.handles.epoch()
    }

    /// Records what the answer to a HEAD or GET sent at `since` showed: its version is
    /// proven, and recorded for this identity (unless another answer recorded a version
    /// since); a replaced version's entries that were this identity's alone go.
    pub(super) fn observe(&self, meta: &ObjectMeta, since: Epoch) {
        self.proved(&self.version(meta));
        let handles = &self.0.caches.handles;
        if let Some(old) = handles.record(&self.0.identity, &self.0.store, meta, since) {
            self.forget_replaced(&old);
        }
    }

    /// Records what a listing that began at `epoch` showed: the version is recorded for this
    /// identity, nothing proven (a listing shows a name, not that its bytes can be read).
    pub(super) fn observe_listed(&self, meta: &Arc<ObjectMeta>, epoch: Epoch) {
        let handles = &self.0.caches.handles;
        if let Some(old) = handles.record_listed(&self.0.identity, &self.0.store, meta, epoch) {
            self.forget_replaced(&old);
        }
    }

    /// Drops the entries of a version this identity saw replaced, if they were its alone.
    fn forget_replaced(&self, old: &ObjectMeta) {
        let old = self.version(old);
        if old.owner().is_some() {
            self.0.caches.forget_version(&old);
        }
    }
}

/// How many different versions `shown` holds.
fn distinct(shown: &[Option<ObjectVersion>]) -> usize {
    let mut seen: Vec<&ObjectVersion> = Vec::new();
    for v in shown.iter().flatten() {
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    seen.len()
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
