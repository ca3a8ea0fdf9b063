//! Handle caching: object metadata from HEAD, GET and LIST, cached listings, and open local
//! file descriptors, so repeated scans stop paying a round trip (or an `open`) per file.
//!
//! [`HandleCache`] holds the state and is shared by every `CachingObjectStore` built over it;
//! the store layer decides when to consult and when to invalidate it. What it records is
//! recorded per [`StoreIdentity`]: the metadata and listings a store of that identity showed,
//! and its proofs of access (the versions it answered a HEAD or a GET for). Versions are
//! compared by the one rule of [`ObjectVersion::matches`].

mod files;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use moka::notification::RemovalCause;
use moka::sync::Cache;
use object_store::path::Path;
use object_store::{ListResult, ObjectMeta};

pub use files::max_open_files_allowed;
pub(crate) use files::{OpenFile, OpenFiles};

use crate::config::HandleConfig;
use crate::object::{ByObject, ObjectId, ObjectVersion, StoreIdentity, StoreKey, Validator};
use crate::stats::{CacheCounters, HandleStats, settle};

/// Which kind of listing a cached result answers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ListKind {
    Recursive,
    Delimited,
    After(Path),
}

/// One listing request of one store identity: a listing is served only to the identity
/// whose store made it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ListKey {
    pub(crate) identity: StoreIdentity,
    pub(crate) store: StoreKey,
    pub(crate) prefix: Option<Path>,
    pub(crate) kind: ListKind,
}

/// A cached listing. Immutable once built; shared by every reader.
#[derive(Debug)]
pub(crate) struct Listing {
    pub(crate) objects: Vec<ObjectMeta>,
    pub(crate) common_prefixes: Vec<Path>,
}

impl Listing {
    pub(crate) fn to_list_result(&self) -> ListResult {
        ListResult {
            objects: self.objects.clone(),
            common_prefixes: self.common_prefixes.clone(),
        }
    }

    /// The objects of `listing` one at a time, each copied as it is taken: a listing served
    /// from the cache holds one copy of its objects, however many read it at once.
    pub(crate) fn stream(listing: Arc<Listing>) -> impl Iterator<Item = ObjectMeta> {
        (0..listing.objects.len()).map(move |i| listing.objects[i].clone())
    }

    /// The bytes it holds, as weighed against `lakecache.handle.listing_bytes`.
    fn weight(&self) -> u64 {
        let objects: u64 = self.objects.iter().map(listed_bytes).sum();
        let prefixes: u64 = self
            .common_prefixes
            .iter()
            .map(|p| p.as_ref().len() as u64 + PER_OBJECT)
            .sum();
        objects + prefixes + PER_OBJECT
    }
}

/// What one object of a listing weighs besides its path and e_tag: `ObjectMeta`'s fields and
/// their allocations.
const PER_OBJECT: u64 = 100;

/// The bytes `meta` takes in a cached listing.
pub(crate) fn listed_bytes(meta: &ObjectMeta) -> u64 {
    let text = meta.location.as_ref().len()
        + meta.e_tag.as_ref().map_or(0, String::len)
        + meta.version.as_ref().map_or(0, String::len);
    text as u64 + PER_OBJECT
}

/// One object as one store identity has seen it: the key of recorded metadata. What a store
/// recorded is never what another identity's read is made at.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Seen {
    pub(crate) identity: StoreIdentity,
    pub(crate) id: ObjectId,
}

/// A proof of access: this identity's store answered a HEAD or a GET for this version.
type ProofKey = (StoreIdentity, ObjectVersion);

/// When a request began, as the handle cache counts: what its answer shows is recorded over
/// what was recorded before it began, never over what another request's answer recorded
/// since (older news: the object may have been rewritten in between), and a listing records
/// nothing once an invalidation came after it began (it may have missed the write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Epoch {
    invalidations: u64,
    recordings: u64,
}

/// Whether the handle cache's evicting for room was logged (once per process).
static FULL_LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a listing too large to cache was logged (once per process).
static LISTING_TOO_LARGE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Locks recordings are spread over (see `Inner::recording`).
const RECORDING_STRIPES: usize = 64;

/// Metadata as recorded, with the token of that recording. The path index holds a token per
/// entry the cache holds, and each removal (replaced, expired, evicted, invalidated) takes
/// out its own: the removal of an older entry under the same key (expired and not yet swept
/// when a new one was recorded over it) never unindexes the new one.
#[derive(Debug, Clone)]
struct Recorded {
    meta: ObjectMeta,
    token: u64,
}

/// Which identities hold metadata of each path (a pair per entry held, with its token), so
/// entries keyed by path alone (DataFusion's) can be checked against every version the caches
/// know of it, and an object can be forgotten for everyone.
type PathIndex = Arc<Mutex<HashMap<Path, Vec<(Seen, u64)>>>>;

/// Process-wide cache of object handles: metadata, listings and local file descriptors, and
/// what each store identity has shown it can read.
///
/// Cheap to clone; clones share the same entries. Bounded by [`HandleConfig::capacity`]
/// entries (each of metadata, listed objects and proofs) with a TTL and an optional idle
/// timeout, and safe to use from concurrent queries.
///
/// Users reach it through a `LakeCache`:
///
/// ```
/// let lake = datafusion_lakecache::LakeCache::builder().handle_capacity(100).build().unwrap();
/// assert_eq!(lake.stats().handle.metadata.entries, 0);
/// ```
#[derive(Clone)]
pub struct HandleCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HandleCache {
    // Not derived: moka's `Debug` prints every entry.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleCache")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: HandleConfig,
    metas: Cache<Seen, Recorded>,
    /// The token of the next recording.
    next_token: AtomicU64,
    /// Held while a recording reads what is recorded and replaces it, by the hash of its
    /// key: two answers recorded at once never both replace the same entry.
    recording: [Mutex<()>; RECORDING_STRIPES],
    meta_counters: Arc<CacheCounters>,
    lists: Cache<ListKey, Arc<Listing>>,
    list_counters: Arc<CacheCounters>,
    proofs: Cache<ProofKey, ()>,
    /// The keys `proofs` holds, by object: what forgetting an object drops.
    proven: Arc<ByObject<ProofKey>>,
    proof_counters: Arc<CacheCounters>,
    /// HEADs sent only to prove access to a version whose entries were cached.
    proof_heads: AtomicU64,
    paths: PathIndex,
    files: OpenFiles,
    version_changes: AtomicU64,
    /// Bumped by every invalidation; a listing that started before one records nothing.
    epoch: AtomicU64,
}

impl HandleCache {
    /// Builds a cache after validating `config`.
    pub fn try_new(config: HandleConfig) -> datafusion::error::Result<Self> {
        let meta_counters = Arc::new(CacheCounters::default());
        let paths: PathIndex = Arc::default();
        let capacity = config.capacity;
        let metas = with_expiry(
            Cache::builder().max_capacity(config.capacity),
            config.ttl,
            config.idle_timeout,
        )
        .eviction_listener({
            let (c, paths) = (Arc::clone(&meta_counters), Arc::clone(&paths));
            move |key: Arc<Seen>, gone: Recorded, cause| {
                c.removed(cause);
                unindex(&paths, &key, gone.token);
                if cause == RemovalCause::Size && !FULL_LOGGED.swap(true, Relaxed) {
                    log::warn!(
                        "the handle cache is full (lakecache.handle.capacity = {capacity}): \
                         objects it lets go of cost a HEAD on their next read; raise \
                         lakecache.handle.capacity above the files of the tables queried"
                    );
                }
            }
        })
        .build();
        // Listings weigh their bytes, within a bound of their own: a table of a million
        // files is one listing, held whole.
        let list_counters = Arc::new(CacheCounters::default());
        let lists = with_expiry(
            Cache::builder()
                .max_capacity(config.listing_bytes)
                .weigher(|_, l: &Arc<Listing>| u32::try_from(l.weight()).unwrap_or(u32::MAX)),
            config.list_ttl,
            config.idle_timeout,
        )
        .eviction_listener({
            let c = Arc::clone(&list_counters);
            move |_, _, cause| c.removed(cause)
        })
        .build();
        // Proofs last as long as metadata does: a store whose rights were taken away is
        // asked again within the TTL.
        let proof_counters = Arc::new(CacheCounters::default());
        let proven: Arc<ByObject<ProofKey>> = Arc::default();
        let proofs = with_expiry(
            Cache::builder().max_capacity(config.capacity),
            config.ttl,
            config.idle_timeout,
        )
        .eviction_listener({
            let (c, proven) = (Arc::clone(&proof_counters), Arc::clone(&proven));
            move |key: Arc<ProofKey>, _, cause| {
                c.removed(cause);
                proven.removed(key.1.id(), &key);
            }
        })
        .build();
        let files = OpenFiles::new(&config);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                metas,
                next_token: AtomicU64::new(0),
                recording: std::array::from_fn(|_| Mutex::new(())),
                meta_counters,
                lists,
                list_counters,
                proofs,
                proven,
                proof_counters,
                proof_heads: AtomicU64::new(0),
                paths,
                files,
                version_changes: AtomicU64::new(0),
                epoch: AtomicU64::new(0),
            }),
        })
    }

    /// The settings this cache was built with.
    pub fn config(&self) -> &HandleConfig {
        &self.inner.config
    }

    /// A snapshot of the figures.
    pub fn stats(&self) -> HandleStats {
        let i = &self.inner;
        settle(&i.metas, i.config.capacity);
        settle(&i.lists, i.config.listing_bytes);
        settle(&i.proofs, i.config.capacity);
        HandleStats {
            metadata: i.meta_counters.snapshot(i.metas.entry_count()),
            listings: i.list_counters.snapshot(i.lists.entry_count()),
            listing_bytes: i.lists.weighted_size(),
            proofs: i.proof_counters.snapshot(i.proofs.entry_count()),
            proof_heads: i.proof_heads.load(Relaxed),
            files: i.files.stats(),
            open_files: i.files.open_now(),
            version_changes: i.version_changes.load(Relaxed),
        }
    }

    /// Drops every entry and closes every cached descriptor.
    pub fn clear(&self) {
        self.inner.epoch.fetch_add(1, Relaxed);
        self.inner.metas.invalidate_all();
        self.inner.lists.invalidate_all();
        self.inner.proofs.invalidate_all();
        self.inner.files.clear();
        self.inner.metas.run_pending_tasks();
        self.inner.lists.run_pending_tasks();
        self.inner.proofs.run_pending_tasks();
    }

    pub(crate) fn files(&self) -> &OpenFiles {
        &self.inner.files
    }

    /// The metadata `seen` recorded, counted as a lookup: a hit only if `served` says it may
    /// be served (its identity has shown that version).
    pub(crate) fn meta(
        &self,
        seen: &Seen,
        served: impl FnOnce(&ObjectMeta) -> bool,
    ) -> Option<ObjectMeta> {
        let found = self.peek(seen).filter(|m| served(m));
        match &found {
            Some(_) => self.inner.meta_counters.hit(),
            None => self.inner.meta_counters.miss(),
        }
        found
    }

    /// The metadata `seen` recorded, if any, without counting a lookup.
    pub(crate) fn peek(&self, seen: &Seen) -> Option<ObjectMeta> {
        self.inner.metas.get(seen).map(|r| r.meta)
    }

    /// Keeps `meta` as what `seen` recorded, indexed by its path under a token of its own.
    fn put(&self, seen: Seen, meta: ObjectMeta) {
        let token = self.inner.next_token.fetch_add(1, Relaxed);
        self.index_path(&seen, token);
        self.inner.metas.insert(seen, Recorded { meta, token });
    }

    /// Records metadata a response or a listing of a store of `identity` showed, of a request
    /// that began at `since`. The same version as the one recorded keeps the entry
    /// (completed with a strong e_tag it lacked); another version replaces it, is counted,
    /// and drops the identity's listings that still hold the old one. If that other version
    /// was recorded after the request began, the answers of two requests in flight at once
    /// disagree and neither can be told the newer: nothing is recorded, and the next read
    /// asks the store. Returns the version's metadata that is no longer recorded, whose
    /// other entries the caller drops.
    pub(crate) fn record(
        &self,
        identity: &StoreIdentity,
        store: &StoreKey,
        meta: &ObjectMeta,
        since: Epoch,
    ) -> Option<ObjectMeta> {
        if !self.inner.config.enabled {
            return None;
        }
        let seen = Seen {
            identity: identity.clone(),
            id: ObjectId {
                store: store.clone(),
                path: meta.location.clone(),
            },
        };
        let version = |m: &ObjectMeta| ObjectVersion::new(store.clone(), identity, m);
        let stripe = {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            seen.hash(&mut hasher);
            hasher.finish() as usize % RECORDING_STRIPES
        };
        let _recording = lock(&self.inner.recording[stripe]);
        let recorded = self.inner.metas.get(&seen);
        match recorded.map(|r| (r.meta, r.token)) {
            Some((cached, _)) if version(&cached).matches(meta) => {
                if !version(&cached).pins_bytes() && version(meta).pins_bytes() {
                    // Learn the validator a listing left out: reads of the object can then be
                    // guarded by it (and its bytes kept). The listing's time stays, as
                    // DataFusion compares its cached entries with what its listing showed
                    // (a GET's time may be cut to the second where the listing's is not).
                    let learned = ObjectMeta {
                        e_tag: meta.e_tag.clone(),
                        version: meta.version.clone(),
                        ..cached
                    };
                    self.put(seen, learned);
                }
                None
            }
            Some((old, token)) if token >= since.recordings => {
                self.inner.version_changes.fetch_add(1, Relaxed);
                self.inner.metas.invalidate(&seen);
                self.invalidate_listings(&seen);
                Some(old)
            }
            Some((old, _)) => {
                self.inner.version_changes.fetch_add(1, Relaxed);
                self.put(seen.clone(), meta.clone());
                self.invalidate_listings(&seen);
                Some(old)
            }
            None => {
                self.put(seen, meta.clone());
                None
            }
        }
    }

    /// [`HandleCache::record`] for an object a listing that began at `epoch` showed: nothing
    /// is recorded if an invalidation came since, as it may be of a write the listing missed.
    pub(crate) fn record_listed(
        &self,
        identity: &StoreIdentity,
        store: &StoreKey,
        meta: &ObjectMeta,
        epoch: Epoch,
    ) -> Option<ObjectMeta> {
        if self.epoch().invalidations != epoch.invalidations {
            return None;
        }
        self.record(identity, store, meta, epoch)
    }

    /// Counts a response that showed another version than a reader asked for.
    pub(crate) fn count_version_change(&self) {
        self.inner.version_changes.fetch_add(1, Relaxed);
    }

    /// The cached listing `key` (one its identity made), counted as a lookup.
    pub(crate) fn listing(&self, key: &ListKey) -> Option<Arc<Listing>> {
        let found = self.inner.lists.get(key);
        match &found {
            Some(_) => self.inner.list_counters.hit(),
            None => self.inner.list_counters.miss(),
        }
        found
    }

    /// Now, as a request about to be sent takes it: pass it to [`HandleCache::record`] with
    /// what its answer showed (to [`HandleCache::record_listing`] for a listing).
    pub(crate) fn epoch(&self) -> Epoch {
        Epoch {
            invalidations: self.inner.epoch.load(Relaxed),
            recordings: self.inner.next_token.load(Relaxed),
        }
    }

    /// Caches a complete listing. A listing larger than the listing bound is not kept, nor
    /// one that started (at `epoch`) before an invalidation: it may have missed the write
    /// that caused it.
    pub(crate) fn record_listing(&self, key: ListKey, listing: Arc<Listing>, epoch: Epoch) {
        if self.epoch().invalidations != epoch.invalidations || !self.inner.config.enabled {
            return;
        }
        if self.listing_fits(listing.weight()) {
            self.inner.lists.insert(key, listing);
        }
    }

    /// Whether a listing of `bytes` (so far) can be cached; says once per process, in the
    /// log, which setting to raise when it cannot.
    pub(crate) fn listing_fits(&self, bytes: u64) -> bool {
        let bound = self.inner.config.listing_bytes;
        // moka admits an entry only below its whole capacity.
        let fits = bytes < bound;
        if !fits && !LISTING_TOO_LARGE.swap(true, Relaxed) {
            log::warn!(
                "a listing of {bytes} bytes or more is larger than lakecache.handle.listing_bytes \
                 ({bound}): it is not cached, and every query lists its prefix again; raise \
                 lakecache.handle.listing_bytes to keep it"
            );
        }
        fits
    }

    /// Whether a store of `identity` has shown it can read `version`, counted as a lookup.
    pub(crate) fn proven(&self, identity: &StoreIdentity, version: &ObjectVersion) -> bool {
        let key = (identity.clone(), version.clone());
        let found = self.inner.config.enabled && self.inner.proofs.contains_key(&key);
        match found {
            true => self.inner.proof_counters.hit(),
            false => self.inner.proof_counters.miss(),
        }
        found
    }

    /// Notes that a store of `identity` answered a HEAD or a GET for `version`.
    pub(crate) fn prove(&self, identity: &StoreIdentity, version: &ObjectVersion) {
        if !self.inner.config.enabled {
            return;
        }
        let key = (identity.clone(), version.clone());
        if !self.inner.proofs.contains_key(&key) {
            self.inner.proven.added(version.id(), &key);
            self.inner.proofs.insert(key, ());
        }
    }

    /// The versions stores of `identities` have proven, each with the identity that did.
    pub(crate) fn proven_by(
        &self,
        identities: &[StoreIdentity],
    ) -> Vec<(StoreIdentity, ObjectVersion)> {
        self.inner
            .proofs
            .iter()
            .filter(|(key, _)| identities.contains(&key.0))
            .map(|(key, _)| (key.0.clone(), key.1.clone()))
            .collect()
    }

    /// Drops `identity`'s listings of `store` that hold objects under `prefix`, or are under
    /// it: the next listing there asks the store.
    pub(crate) fn invalidate_listings_under(
        &self,
        identity: &StoreIdentity,
        store: &StoreKey,
        prefix: &Path,
    ) {
        self.inner.epoch.fetch_add(1, Relaxed);
        let stale: Vec<Arc<ListKey>> = self
            .inner
            .lists
            .iter()
            .filter(|(k, _)| {
                &k.identity == identity
                    && &k.store == store
                    && (covers(k.prefix.as_ref(), prefix)
                        || k.prefix.as_ref().is_some_and(|p| covers(Some(prefix), p)))
            })
            .map(|(k, _)| k)
            .collect();
        for key in stale {
            self.inner.lists.invalidate(key.as_ref());
        }
    }

    /// Counts a HEAD sent only to prove access.
    pub(crate) fn count_proof_head(&self) {
        self.inner.proof_heads.fetch_add(1, Relaxed);
    }

    /// Drops `identity`'s proof of `version`, and its recorded metadata if that shows
    /// `version`: the store showed another version, or refused this one.
    pub(crate) fn unprove(&self, identity: &StoreIdentity, version: &ObjectVersion) {
        self.inner
            .proofs
            .invalidate(&(identity.clone(), version.clone()));
        let seen = Seen {
            identity: identity.clone(),
            id: version.id().clone(),
        };
        if self.peek(&seen).is_some_and(|m| version.matches(&m)) {
            self.inner.metas.invalidate(&seen);
            self.invalidate_listings(&seen);
        }
    }

    /// Drops what `seen`'s identity recorded of its object: metadata, the listings that may
    /// hold it, and its proofs of every version.
    pub(crate) fn invalidate_seen(&self, seen: &Seen) {
        self.inner.metas.invalidate(seen);
        self.invalidate_listings(seen);
        for key in self.inner.proven.keys(&seen.id) {
            if key.0 == seen.identity {
                self.inner.proofs.invalidate(&key);
            }
        }
    }

    /// Drops what every identity recorded of object `id`.
    pub(crate) fn invalidate(&self, id: &ObjectId) {
        let seen: Vec<Seen> = self
            .seen_at(&id.path)
            .into_iter()
            .filter(|s| &s.id == id)
            .collect();
        for s in &seen {
            self.invalidate_seen(s);
        }
        // Listings and proofs of identities whose metadata has gone already.
        self.inner.epoch.fetch_add(1, Relaxed);
        let listed = id.clone();
        let stale: Vec<Arc<ListKey>> = self
            .inner
            .lists
            .iter()
            .filter(|(k, _)| k.store == listed.store && covers(k.prefix.as_ref(), &listed.path))
            .map(|(k, _)| k)
            .collect();
        for key in stale {
            self.inner.lists.invalidate(key.as_ref());
        }
        for key in self.inner.proven.keys(id) {
            self.inner.proofs.invalidate(&key);
        }
    }

    /// Drops `seen`'s identity's listings that may hold its object.
    fn invalidate_listings(&self, seen: &Seen) {
        self.inner.epoch.fetch_add(1, Relaxed);
        let stale: Vec<Arc<ListKey>> = self
            .inner
            .lists
            .iter()
            .filter(|(k, _)| {
                k.identity == seen.identity
                    && k.store == seen.id.store
                    && covers(k.prefix.as_ref(), &seen.id.path)
            })
            .map(|(k, _)| k)
            .collect();
        for key in stale {
            self.inner.lists.invalidate(key.as_ref());
        }
    }

    /// The version `meta` (a plan's view of an object of `store`, as a store of `identity`
    /// listed it) names, completed with what `identity` recorded of that same version (a
    /// strong e_tag a listing left out), and whether the cache held it.
    pub(crate) fn version_of(
        &self,
        identity: &StoreIdentity,
        store: &StoreKey,
        meta: &ObjectMeta,
    ) -> (ObjectVersion, bool) {
        let seen = ObjectVersion::new(store.clone(), identity, meta);
        let key = Seen {
            identity: identity.clone(),
            id: seen.id().clone(),
        };
        match self.peek(&key) {
            Some(cached) if seen.matches(&cached) => {
                if seen.pins_bytes() {
                    return (seen, true);
                }
                let known = ObjectVersion::new(store.clone(), identity, &cached);
                (if known.pins_bytes() { known } else { seen }, true)
            }
            _ => (seen, false),
        }
    }

    /// `version` (known by its size and time alone) with the strong validator `identity`
    /// recorded for that same version, if it recorded one.
    pub(crate) fn complete(
        &self,
        identity: &StoreIdentity,
        version: &ObjectVersion,
    ) -> Option<ObjectVersion> {
        let seen = Seen {
            identity: identity.clone(),
            id: version.id().clone(),
        };
        let cached = self.peek(&seen)?;
        let known = version.reseen(identity, &cached);
        (known.pins_bytes() && version.matches(&cached)).then_some(known)
    }

    /// Whether an entry keyed by path alone and made for `meta` may be another version's than
    /// the one a store of `scope` (every identity if `None`) reads: some store's recorded
    /// metadata shows `path` at a version `meta` is not; or `meta`'s version does not name its
    /// bytes and more than one store of the scope has shown the path (such a version is told
    /// apart only within one store: two stores may show the same counter for other bytes).
    pub(crate) fn contradicts(
        &self,
        path: &Path,
        meta: &ObjectMeta,
        scope: Option<&[StoreIdentity]>,
    ) -> bool {
        let named_by_content = Validator::of(meta).names_content();
        let mut in_scope = 0;
        self.seen_at(path).into_iter().any(|s| {
            let Some(cached) = self.peek(&s) else {
                return false;
            };
            if !ObjectVersion::new(s.id.store.clone(), &s.identity, &cached).matches(meta) {
                return true;
            }
            if !named_by_content && scope.is_none_or(|ids| ids.contains(&s.identity)) {
                in_scope += 1;
            }
            in_scope > 1
        })
    }

    /// Each identity and store that recorded metadata of `path`, once.
    fn seen_at(&self, path: &Path) -> Vec<Seen> {
        let paths = lock(&self.inner.paths);
        let mut seen: Vec<Seen> = Vec::new();
        for (s, _) in paths.get(path).into_iter().flatten() {
            if !seen.contains(s) {
                seen.push(s.clone());
            }
        }
        seen
    }

    fn index_path(&self, seen: &Seen, token: u64) {
        let mut paths = lock(&self.inner.paths);
        paths
            .entry(seen.id.path.clone())
            .or_default()
            .push((seen.clone(), token));
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes the entry recorded for `seen` under `token` out of the path index.
fn unindex(paths: &PathIndex, seen: &Seen, token: u64) {
    let mut paths = lock(paths);
    if let Some(all) = paths.get_mut(&seen.id.path) {
        all.retain(|(s, held)| s != seen || *held != token);
        if all.is_empty() {
            paths.remove(&seen.id.path);
        }
    }
}

/// Whether a listing of `prefix` can contain `path` (object_store prefixes match whole
/// path segments).
fn covers(prefix: Option<&Path>, path: &Path) -> bool {
    match prefix {
        None => true,
        Some(p) => path.prefix_match(p).is_some(),
    }
}

fn with_expiry<K, V, C>(
    builder: moka::sync::CacheBuilder<K, V, C>,
    ttl: Duration,
    idle: Option<Duration>,
) -> moka::sync::CacheBuilder<K, V, C> {
    let builder = if ttl.is_zero() {
        builder
    } else {
        builder.time_to_live(ttl)
    };
    match idle {
        Some(idle) => builder.time_to_idle(idle),
        None => builder,
    }
}

#[cfg(test)]
mod tests;
