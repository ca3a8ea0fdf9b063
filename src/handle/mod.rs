//! Handle caching: object metadata from HEAD, GET and LIST, cached listings, and open local
//! file descriptors, so repeated scans stop paying a round trip (or an `open`) per file.
//!
//! [`HandleCache`] holds the state and is shared by every `CachingObjectStore` built over it;
//! the store layer decides when to consult and when to invalidate it. What it records is
//! recorded per [`StoreIdentity`]: the metadata and listings a store of that identity showed,
//! and its proofs of access (the versions it answered a HEAD or a GET for). Versions are
//! compared by the one rule of [`ObjectVersion::matches`].

mod files;
mod known;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use moka::notification::RemovalCause;
use moka::ops::compute::Op;
use moka::sync::Cache;
use object_store::path::Path;
use object_store::{ListResult, ObjectMeta};
use smallvec::SmallVec;
use twox_hash::XxHash64;

pub use files::max_open_files_allowed;
pub(crate) use files::{OpenFile, OpenFiles};

use crate::config::HandleConfig;
use crate::object::{ObjectId, ObjectVersion, StoreIdentity, StoreKey, Validator};
use crate::stats::{CacheCounters, HandleStats, settle};
use known::{Known, Member, Members, Proof, Recorded, expired};

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

/// A cached listing. Immutable once built; shared by every reader. Its objects' metadata is
/// the same allocation the handle entries recorded from it.
#[derive(Debug)]
pub(crate) struct Listing {
    pub(crate) objects: Vec<Arc<ObjectMeta>>,
    pub(crate) common_prefixes: Vec<Path>,
}

impl Listing {
    pub(crate) fn to_list_result(&self) -> ListResult {
        ListResult {
            objects: self.objects.iter().map(|m| m.as_ref().clone()).collect(),
            common_prefixes: self.common_prefixes.clone(),
        }
    }

    /// The objects of `listing` one at a time, each copied as it is taken: a listing served
    /// from the cache holds one copy of its objects, however many read it at once.
    pub(crate) fn stream(listing: Arc<Listing>) -> impl Iterator<Item = ObjectMeta> {
        (0..listing.objects.len()).map(move |i| listing.objects[i].as_ref().clone())
    }

    /// The bytes it holds, as weighed against `lakecache.handle.listing_bytes`.
    fn weight(&self) -> u64 {
        let objects: u64 = self.objects.iter().map(|m| listed_bytes(m)).sum();
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

/// Shards of the path index, each behind its own lock: every lookup of DataFusion's caches
/// reads it.
const PATH_SHARDS: usize = 16;

/// Slices of the paths recordings are counted by (see [`HandleCache::recordings_of`]).
const RECORDING_SLICES: usize = 4096;

/// A path's hash, for its shard of the path index and its slice of the recording counts.
/// A fixed seed spreads paths as well as a random one.
fn path_hash(path: &Path) -> usize {
    XxHash64::oneshot(0, path.as_ref().as_bytes()) as usize
}

/// A shard of the path index: the entries of each path, one per store (mostly one: kept
/// inline).
type ByPath = datafusion::common::HashMap<Path, SmallVec<[Indexed; 1]>>;

/// An entry of the handle cache, as the path index finds it.
struct Indexed {
    store: StoreKey,
    /// The entry's token: the removal of an entry takes out its own.
    token: u64,
    /// The entry itself, without keeping it: a lookup by path reaches it without making its
    /// key and asking the cache, and finds it let go (empty, `gone`) once the cache lets go.
    known: Weak<Known>,
}

/// Which stores' objects the cache holds an entry of, by path, so entries keyed by path
/// alone (DataFusion's) can be checked against every version the caches know of it. The
/// removal of an entry takes out its own token: an entry made over an expired one moka had
/// not swept yet stays indexed.
struct PathIndex {
    shards: [Mutex<ByPath>; PATH_SHARDS],
}

impl PathIndex {
    fn new() -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::default()),
        }
    }

    fn shard(&self, path: &Path) -> MutexGuard<'_, ByPath> {
        lock(&self.shards[path_hash(path) % PATH_SHARDS])
    }

    fn add(&self, id: &ObjectId, known: &Arc<Known>) {
        self.shard(&id.path)
            .entry(id.path.clone())
            .or_default()
            .push(Indexed {
                store: id.store.clone(),
                token: known.token,
                known: Arc::downgrade(known),
            });
    }

    fn remove(&self, id: &ObjectId, token: u64) {
        let mut shard = self.shard(&id.path);
        if let Some(all) = shard.get_mut(&id.path) {
            all.retain(|e| e.store != id.store || e.token != token);
            if all.is_empty() {
                shard.remove(&id.path);
            }
        }
    }

    /// The entries held of the objects at `path`, with the store of each.
    fn entries(&self, path: &Path) -> Vec<(StoreKey, Arc<Known>)> {
        let shard = self.shard(path);
        let all = shard.get(path).into_iter().flatten();
        all.filter_map(|e| Some((e.store.clone(), e.known.upgrade()?)))
            .collect()
    }

    #[cfg(test)]
    fn paths(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }
}

/// Process-wide cache of object handles: metadata, listings and local file descriptors, and
/// what each store identity has shown it can read.
///
/// Cheap to clone; clones share the same entries. Bounded by [`HandleConfig::capacity`]
/// (one unit per object, and one more per 32 store identities that have shown it) with a
/// TTL and an optional idle timeout, and safe to use from concurrent queries.
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

/// The figures of what the object entries hold, updated as members change.
#[derive(Default)]
struct Held {
    metas: AtomicU64,
    proofs: AtomicU64,
    meta_counters: CacheCounters,
    proof_counters: CacheCounters,
}

impl Held {
    /// Counts the removal of what `member` held, for `cause`.
    fn dropped(&self, member: &Member, cause: RemovalCause) {
        if member.meta.is_some() {
            self.meta_gone(cause);
        }
        for _ in &member.proofs {
            self.proof_gone(cause);
        }
    }

    fn meta_gone(&self, cause: RemovalCause) {
        self.metas.fetch_sub(1, Relaxed);
        self.meta_counters.removed(cause);
    }

    fn proof_gone(&self, cause: RemovalCause) {
        self.proofs.fetch_sub(1, Relaxed);
        self.proof_counters.removed(cause);
    }
}

struct Inner {
    config: HandleConfig,
    /// One entry per object: what each identity that has shown it recorded and proved.
    objects: Cache<ObjectId, Arc<Known>>,
    held: Arc<Held>,
    /// The token of the next recording (and of the next object entry).
    next_token: AtomicU64,
    lists: Cache<ListKey, Arc<Listing>>,
    list_counters: Arc<CacheCounters>,
    /// HEADs sent only to prove access to a version whose entries were cached.
    proof_heads: AtomicU64,
    paths: Arc<PathIndex>,
    files: OpenFiles,
    version_changes: AtomicU64,
    /// Bumped by every invalidation; a listing that started before one records nothing.
    epoch: AtomicU64,
    /// Recordings of metadata made, by slice of their paths.
    recordings: Box<[AtomicU64]>,
}

impl HandleCache {
    /// Builds a cache after validating `config`.
    pub fn try_new(config: HandleConfig) -> datafusion::error::Result<Self> {
        let held = Arc::new(Held::default());
        let paths = Arc::new(PathIndex::new());
        let capacity = config.capacity;
        // No time to live of the entry's own: each member's recording and proofs expire on
        // their own clocks (`known::expired`), checked on every lookup.
        let objects = with_expiry(
            Cache::builder()
                .max_capacity(config.capacity)
                .weigher(|_, known: &Arc<Known>| known.weight()),
            Duration::ZERO,
            config.idle_timeout,
        )
        .eviction_listener({
            let (held, paths) = (Arc::clone(&held), Arc::clone(&paths));
            move |id: Arc<ObjectId>, known: Arc<Known>, cause| {
                // Replaced: the same entry inserted again to be weighed anew.
                if cause == RemovalCause::Replaced {
                    return;
                }
                paths.remove(&id, known.token);
                let mut members = lock(&known.state);
                if std::mem::replace(&mut members.gone, true) {
                    return;
                }
                for (_, member) in members.by.iter() {
                    held.dropped(member, cause);
                }
                members.by = known::ByIdentity::default();
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
        let files = OpenFiles::new(&config);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                objects,
                held,
                next_token: AtomicU64::new(0),
                lists,
                list_counters,
                proof_heads: AtomicU64::new(0),
                paths,
                files,
                version_changes: AtomicU64::new(0),
                epoch: AtomicU64::new(0),
                recordings: (0..RECORDING_SLICES).map(|_| AtomicU64::new(0)).collect(),
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
        settle(&i.objects, i.config.capacity);
        settle(&i.lists, i.config.listing_bytes);
        HandleStats {
            metadata: i.held.meta_counters.snapshot(i.held.metas.load(Relaxed)),
            listings: i.list_counters.snapshot(i.lists.entry_count()),
            listing_bytes: i.lists.weighted_size(),
            proofs: i.held.proof_counters.snapshot(i.held.proofs.load(Relaxed)),
            proof_heads: i.proof_heads.load(Relaxed),
            files: i.files.stats(),
            open_files: i.files.open_now(),
            version_changes: i.version_changes.load(Relaxed),
        }
    }

    /// Drops every entry and closes every cached descriptor.
    pub fn clear(&self) {
        self.inner.epoch.fetch_add(1, Relaxed);
        self.inner.objects.invalidate_all();
        self.inner.lists.invalidate_all();
        self.inner.files.clear();
        self.inner.objects.run_pending_tasks();
        self.inner.lists.run_pending_tasks();
    }

    pub(crate) fn files(&self) -> &OpenFiles {
        &self.inner.files
    }

    /// The entry of object `id`, if the cache holds one.
    fn known(&self, id: &ObjectId) -> Option<Arc<Known>> {
        self.inner.objects.get(id)
    }

    /// Runs `change` on the members of object `id`'s entry, made if there is none, and
    /// weighs the entry again if it grew by a unit.
    fn change<T>(&self, id: &ObjectId, change: impl FnOnce(&mut Members) -> T) -> T {
        let mut change = Some(change);
        loop {
            let known = self.inner.objects.get_with_by_ref(id, || {
                let token = self.inner.next_token.fetch_add(1, Relaxed);
                let known = Arc::new(Known::new(token));
                self.inner.paths.add(id, &known);
                known
            });
            let mut members = lock(&known.state);
            if members.gone {
                // Let go between the lookup and the lock: take it out if it is still held
                // (an entry weighed anew as it expired), then make a new one.
                drop(members);
                self.inner
                    .objects
                    .entry_by_ref(id)
                    .and_compute_with(|held| match held {
                        Some(e) if Arc::ptr_eq(e.value(), &known) => Op::Remove,
                        _ => Op::Nop,
                    });
                continue;
            }
            let Some(change) = change.take() else {
                unreachable!("a change runs once: the loop ends when it ran");
            };
            let out = change(&mut members);
            let grew = members.outgrew_weight();
            drop(members);
            if grew {
                self.inner
                    .objects
                    .entry_by_ref(id)
                    .and_compute_with(|held| match held {
                        Some(e) if Arc::ptr_eq(e.value(), &known) => Op::Put(Arc::clone(&known)),
                        _ => Op::Nop,
                    });
            }
            return out;
        }
    }

    /// What `seen`'s identity recorded, if it has not expired (an expired recording is
    /// dropped and counted as it is found).
    fn recorded(&self, members: &mut Members, identity: &StoreIdentity) -> Option<Recorded> {
        let member = members.by.get_mut(identity)?;
        let recorded = member.meta.as_ref()?;
        if !expired(recorded.at, self.inner.config.ttl) {
            return Some(recorded.clone());
        }
        member.meta = None;
        self.inner.held.meta_gone(RemovalCause::Expired);
        if member.is_empty() {
            members.by.remove(identity);
        }
        None
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
            Some(_) => self.inner.held.meta_counters.hit(),
            None => self.inner.held.meta_counters.miss(),
        }
        found
    }

    /// The metadata `seen` recorded, if any, without counting a lookup.
    pub(crate) fn peek(&self, seen: &Seen) -> Option<ObjectMeta> {
        let known = self.known(&seen.id)?;
        let mut members = lock(&known.state);
        if members.gone {
            return None;
        }
        self.recorded(&mut members, &seen.identity)
            .map(|r| r.meta.as_ref().clone())
    }

    /// Keeps `meta` as what `identity` recorded, under a new token; `given` is `meta` in an
    /// allocation of its own already (a listing's), taken rather than copied.
    fn put(
        &self,
        members: &mut Members,
        identity: &StoreIdentity,
        meta: &ObjectMeta,
        given: Option<&Arc<ObjectMeta>>,
    ) {
        let recorded = Recorded {
            meta: members.shared(meta, given),
            token: self.inner.next_token.fetch_add(1, Relaxed),
            at: Instant::now(),
        };
        let member = members.by.get_or_default(identity);
        if member.meta.replace(recorded).is_none() {
            self.inner.held.metas.fetch_add(1, Relaxed);
        }
        // Counted under the entry's lock, once it is made: a check that sees the count sees
        // the recording (see `recordings_of`).
        let slice = path_hash(&meta.location) % RECORDING_SLICES;
        self.inner.recordings[slice].fetch_add(1, Relaxed);
    }

    /// A count of the recordings of metadata made of the paths of `path`'s slice (one of
    /// 4,096). What [`HandleCache::contradicts`] says of an entry for `path` holds while it
    /// is unchanged: only a recording can turn its "no" into a "yes" (an expiry, an eviction
    /// or a forget takes recordings away). Read it before the check: one made while the
    /// check runs counts towards the next.
    pub(crate) fn recordings_of(&self, path: &Path) -> u64 {
        self.inner.recordings[path_hash(path) % RECORDING_SLICES].load(Relaxed)
    }

    /// Drops what `identity` recorded, counted for `cause`.
    fn unrecord(&self, members: &mut Members, identity: &StoreIdentity, cause: RemovalCause) {
        let Some(member) = members.by.get_mut(identity) else {
            return;
        };
        if member.meta.take().is_some() {
            self.inner.held.meta_gone(cause);
        }
        if member.is_empty() {
            members.by.remove(identity);
        }
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
        self.record_shared(identity, store, meta, None, since)
    }

    /// [`HandleCache::record`], with `given` holding `meta` in an allocation the entry can
    /// share (a cached listing's) rather than copy: an equal recording takes it too, so a
    /// listing made again and the entries recorded from it hold one copy.
    fn record_shared(
        &self,
        identity: &StoreIdentity,
        store: &StoreKey,
        meta: &ObjectMeta,
        given: Option<&Arc<ObjectMeta>>,
        since: Epoch,
    ) -> Option<ObjectMeta> {
        if !self.inner.config.enabled {
            return None;
        }
        let id = ObjectId {
            store: store.clone(),
            path: meta.location.clone(),
        };
        let version = |m: &ObjectMeta| ObjectVersion::new(store.clone(), identity, m);
        let replaced = self.change(&id, |members| {
            match self.recorded(members, identity) {
                Some(cached) if version(&cached.meta).matches(meta) => {
                    if !version(&cached.meta).pins_bytes() && version(meta).pins_bytes() {
                        // Learn the validator a listing left out: reads of the object can
                        // then be guarded by it (and its bytes kept). The listing's time
                        // stays, as DataFusion compares its cached entries with what its
                        // listing showed (a GET's time may be cut to the second where the
                        // listing's is not).
                        let learned = ObjectMeta {
                            e_tag: meta.e_tag.clone(),
                            version: meta.version.clone(),
                            ..cached.meta.as_ref().clone()
                        };
                        self.put(members, identity, &learned, None);
                    } else if let Some(given) = given
                        && !Arc::ptr_eq(&cached.meta, given)
                        && cached.meta.as_ref() == given.as_ref()
                    {
                        members.share(identity, &cached.meta, given);
                    }
                    None
                }
                Some(old) if old.token >= since.recordings => {
                    self.unrecord(members, identity, RemovalCause::Explicit);
                    Some(old.meta.as_ref().clone())
                }
                Some(old) => {
                    self.inner
                        .held
                        .meta_counters
                        .removed(RemovalCause::Replaced);
                    self.put(members, identity, meta, given);
                    Some(old.meta.as_ref().clone())
                }
                None => {
                    self.put(members, identity, meta, given);
                    None
                }
            }
        });
        if replaced.is_some() {
            self.inner.version_changes.fetch_add(1, Relaxed);
            self.invalidate_listings(identity, &id);
        }
        replaced
    }

    /// [`HandleCache::record`] for an object a listing that began at `epoch` showed: nothing
    /// is recorded if an invalidation came since, as it may be of a write the listing missed.
    pub(crate) fn record_listed(
        &self,
        identity: &StoreIdentity,
        store: &StoreKey,
        meta: &Arc<ObjectMeta>,
        epoch: Epoch,
    ) -> Option<ObjectMeta> {
        if self.epoch().invalidations != epoch.invalidations {
            return None;
        }
        self.record_shared(identity, store, meta, Some(meta), epoch)
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
        let found = self.inner.config.enabled && self.has_proof(identity, version);
        match found {
            true => self.inner.held.proof_counters.hit(),
            false => self.inner.held.proof_counters.miss(),
        }
        found
    }

    fn has_proof(&self, identity: &StoreIdentity, version: &ObjectVersion) -> bool {
        let Some(known) = self.known(version.id()) else {
            return false;
        };
        let mut members = lock(&known.state);
        if members.gone {
            return false;
        }
        let Some(member) = members.by.get_mut(identity) else {
            return false;
        };
        let Some(at) = member.proofs.iter().position(|p| &p.version == version) else {
            return false;
        };
        if !expired(member.proofs[at].at, self.inner.config.ttl) {
            return true;
        }
        member.proofs.swap_remove(at);
        self.inner.held.proof_gone(RemovalCause::Expired);
        if member.is_empty() {
            members.by.remove(identity);
        }
        false
    }

    /// Notes that a store of `identity` answered a HEAD or a GET for `version`.
    pub(crate) fn prove(&self, identity: &StoreIdentity, version: &ObjectVersion) {
        if !self.inner.config.enabled {
            return;
        }
        self.change(version.id(), |members| {
            let member = members.by.get_or_default(identity);
            let now = Instant::now();
            match member.proofs.iter_mut().find(|p| &p.version == version) {
                Some(proof) => proof.at = now,
                None => {
                    member.proofs.push(Proof {
                        version: version.clone(),
                        at: now,
                    });
                    self.inner.held.proofs.fetch_add(1, Relaxed);
                }
            }
        });
    }

    /// The versions stores of `identities` have proven, each with the identity that did.
    pub(crate) fn proven_by(
        &self,
        identities: &[StoreIdentity],
    ) -> Vec<(StoreIdentity, ObjectVersion)> {
        let ttl = self.inner.config.ttl;
        let mut proven = Vec::new();
        for (_, known) in self.inner.objects.iter() {
            let members = lock(&known.state);
            for identity in identities {
                let Some(member) = members.by.get(identity) else {
                    continue;
                };
                proven.extend(
                    member
                        .proofs
                        .iter()
                        .filter(|p| !expired(p.at, ttl))
                        .map(|p| (identity.clone(), p.version.clone())),
                );
            }
        }
        proven
    }

    /// Drops the listings of `store` that hold objects under `prefix`, or are under it, of
    /// `identity` (of every identity if `None`): the next listing there asks the store.
    pub(crate) fn invalidate_listings_under(
        &self,
        identity: Option<&StoreIdentity>,
        store: &StoreKey,
        prefix: &Path,
    ) {
        self.inner.epoch.fetch_add(1, Relaxed);
        let stale: Vec<Arc<ListKey>> = self
            .inner
            .lists
            .iter()
            .filter(|(k, _)| {
                identity.is_none_or(|i| &k.identity == i)
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

    /// The objects of `store` under `prefix` (whole path segments) that any identity has
    /// recorded or proved.
    pub(crate) fn objects_under(&self, store: &StoreKey, prefix: &Path) -> Vec<ObjectId> {
        self.inner
            .objects
            .iter()
            .filter(|(id, _)| &id.store == store && covers(Some(prefix), &id.path))
            .map(|(id, _)| id.as_ref().clone())
            .collect()
    }

    /// Counts a HEAD sent only to prove access.
    pub(crate) fn count_proof_head(&self) {
        self.inner.proof_heads.fetch_add(1, Relaxed);
    }

    /// Drops `identity`'s proof of `version`, and its recorded metadata if that shows
    /// `version`: the store showed another version, or refused this one.
    pub(crate) fn unprove(&self, identity: &StoreIdentity, version: &ObjectVersion) {
        let Some(known) = self.known(version.id()) else {
            return;
        };
        let mut members = lock(&known.state);
        let Some(member) = members.by.get_mut(identity) else {
            return;
        };
        if let Some(at) = member.proofs.iter().position(|p| &p.version == version) {
            member.proofs.swap_remove(at);
            self.inner.held.proof_gone(RemovalCause::Explicit);
        }
        let shows = member
            .meta
            .as_ref()
            .is_some_and(|r| version.matches(&r.meta));
        if shows {
            self.unrecord(&mut members, identity, RemovalCause::Explicit);
        } else if member.is_empty() {
            members.by.remove(identity);
        }
        drop(members);
        if shows {
            self.invalidate_listings(identity, version.id());
        }
    }

    /// Drops what `seen`'s identity recorded of its object: metadata, the listings that may
    /// hold it, and its proofs of every version.
    pub(crate) fn invalidate_seen(&self, seen: &Seen) {
        if let Some(known) = self.known(&seen.id) {
            let mut members = lock(&known.state);
            if let Some(member) = members.by.remove(&seen.identity) {
                self.inner.held.dropped(&member, RemovalCause::Explicit);
            }
        }
        self.invalidate_listings(&seen.identity, &seen.id);
    }

    /// Drops what every identity recorded of object `id`, and every listing that may hold it.
    pub(crate) fn invalidate(&self, id: &ObjectId) {
        self.inner.objects.invalidate(id);
        self.inner.epoch.fetch_add(1, Relaxed);
        let stale: Vec<Arc<ListKey>> = self
            .inner
            .lists
            .iter()
            .filter(|(k, _)| k.store == id.store && covers(k.prefix.as_ref(), &id.path))
            .map(|(k, _)| k)
            .collect();
        for key in stale {
            self.inner.lists.invalidate(key.as_ref());
        }
    }

    /// Drops `identity`'s listings that may hold object `id`.
    fn invalidate_listings(&self, identity: &StoreIdentity, id: &ObjectId) {
        self.inner.epoch.fetch_add(1, Relaxed);
        let stale: Vec<Arc<ListKey>> = self
            .inner
            .lists
            .iter()
            .filter(|(k, _)| {
                &k.identity == identity
                    && k.store == id.store
                    && covers(k.prefix.as_ref(), &id.path)
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
        // Run for every file of a table on every plan: nothing is made unless a recording
        // differs from `meta`.
        let ttl = self.inner.config.ttl;
        let mut named_by_content = None;
        let mut in_scope = 0;
        for (store, known) in self.inner.paths.entries(path) {
            let members = lock(&known.state);
            // Members that recorded the same metadata share it: compared once.
            let mut agreed: Option<*const ObjectMeta> = None;
            for (identity, member) in members.by.iter() {
                let Some(recorded) = member.meta.as_ref().filter(|r| !expired(r.at, ttl)) else {
                    continue;
                };
                let shared = Arc::as_ptr(&recorded.meta);
                if agreed != Some(shared) {
                    let same = recorded.meta.as_ref() == meta
                        || ObjectVersion::new(store.clone(), identity, &recorded.meta)
                            .matches(meta);
                    if !same {
                        return true;
                    }
                    agreed = Some(shared);
                }
                let named_by_content =
                    *named_by_content.get_or_insert_with(|| Validator::names_content_of(meta));
                if !named_by_content && scope.is_none_or(|ids| ids.contains(identity)) {
                    in_scope += 1;
                    if in_scope > 1 {
                        return true;
                    }
                }
            }
        }
        false
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
