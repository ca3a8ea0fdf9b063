//! Keeping the bytes: a [`RangeCache`] of exact byte ranges of remote objects, in memory and
//! optionally on local disk, so repeated scans of immutable files stop touching the network.
//!
//! Entries are the ranges that were actually downloaded (a small file read whole at planning
//! time, a prefetched column chunk, the coalesced ranges of a reader's request), keyed by
//! object version, not fixed-size blocks: a block cache reads whole blocks around every small
//! request. A read covered by one entry is a slice of it, without a copy; one covered by
//! several is joined; one partly covered fetches only the gaps, and keeps what it fetched.
//!
//! The cache is read and filled by the store layer's versioned read alone (`read(version,
//! ranges)`), which every byte a scan reads goes through: planning reads, plain
//! `ListingTable`s, readers and prefetches share it. Only versions whose bytes can be told
//! apart ([`ObjectVersion::pins_bytes`]: a strong e_tag, a version id, or an immutable file)
//! are kept, and every fetch of their gaps is guarded by that version, so a replaced object
//! is a new key (its old ranges are never served for it).
//!
//! The memory tier is a moka cache weighted by bytes: each range's, and
//! [`RANGE_ENTRY_BOOKKEEPING`] for what its entry takes besides. Its TinyLFU admission keeps
//! the hot set when full: a range seen once (one pass of a scan larger than the cache) cannot push out
//! ranges read more often, while a range read again is admitted. Local files are not cached:
//! the operating system's page cache already keeps them.

mod disk;
mod flights;
mod read;
mod spans;

pub(crate) use read::Fetched;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use datafusion::error::{DataFusionError, Result};
use moka::notification::RemovalCause;
use moka::sync::Cache;
use smallvec::SmallVec;
use tokio::sync::Notify;

use crate::config::RangeConfig;
use crate::metrics::Source;
use crate::object::{ObjectId, ObjectVersion, StoreIdentity};
use crate::stats::{CacheCounters, CacheStats, RANGE_ENTRY_BOOKKEEPING, RangeStats, settle};
use disk::{Claim, DiskTier};
use flights::Flights;
use spans::{Inserted, Spans};

/// Bytes of disk writes that may wait for a blocking thread; beyond this a range is not
/// written (the disk is slower than the network), rather than held in memory.
const MAX_PENDING_DISK_BYTES: u64 = 256 << 20;

/// What a range of `len` bytes weighs against `lakecache.range.memory`: the tier's weigher
/// and its check of room for a range read from disk.
fn memory_weight(len: u64) -> u32 {
    u32::try_from(len + RANGE_ENTRY_BOOKKEEPING).unwrap_or(u32::MAX)
}

/// Once memory is full, one range in this many read from disk is offered to it
/// (`RangeCache::promotes`).
const PROMOTE_ONE_IN: u64 = 8;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RangeKey {
    object: ObjectVersion,
    start: u64,
}

type SpanMap = Arc<Mutex<Held>>;

/// The ranges the memory tier holds, per object version, and the versions of each object it
/// holds ranges of (so that forgetting an object looks at its own versions, not every one).
#[derive(Debug, Default)]
struct Held {
    versions: HashMap<ObjectVersion, Spans>,
    /// Mostly one version per object: kept inline.
    objects: HashMap<ObjectId, SmallVec<[ObjectVersion; 1]>>,
}

impl Held {
    fn get(&self, version: &ObjectVersion) -> Option<&Spans> {
        self.versions.get(version)
    }

    /// Records `range` of `version` ([`Spans::insert`]).
    fn insert(&mut self, version: &ObjectVersion, range: Range<u64>) -> Inserted {
        if !self.versions.contains_key(version) {
            let held = self.objects.entry(version.id().clone()).or_default();
            held.push(version.clone());
        }
        self.versions
            .entry(version.clone())
            .or_default()
            .insert(range)
    }

    /// Forgets `range` of `version` if it is the range held at its start.
    fn remove_range(&mut self, version: &ObjectVersion, range: &Range<u64>) {
        if let Some(held) = self.versions.get_mut(version) {
            held.remove(range);
            if held.is_empty() {
                self.remove(version);
            }
        }
    }

    /// Forgets every range of `version`.
    fn remove(&mut self, version: &ObjectVersion) -> Option<Spans> {
        let spans = self.versions.remove(version)?;
        if let Some(held) = self.objects.get_mut(version.id()) {
            held.retain(|v| v != version);
            if held.is_empty() {
                self.objects.remove(version.id());
            }
        }
        Some(spans)
    }

    /// The versions of object `id` it holds ranges of.
    fn versions_of(&self, id: &ObjectId) -> Vec<ObjectVersion> {
        self.objects.get(id).map(|v| v.to_vec()).unwrap_or_default()
    }

    fn holds_object(&self, id: &ObjectId) -> bool {
        self.objects.contains_key(id)
    }

    fn clear(&mut self) {
        self.versions.clear();
        self.objects.clear();
    }
}

/// The shared cache of object byte ranges. Cheap to clone.
///
/// Users reach it through a `LakeCache`:
///
/// ```
/// let lake = datafusion_lakecache::LakeCache::builder().build().unwrap();
/// assert_eq!(lake.stats().range.memory_capacity, 1 << 30);
/// ```
#[derive(Clone)]
pub struct RangeCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RangeCache {
    // Not derived: moka's `Debug` prints every entry.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeCache")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: RangeConfig,
    memory: Cache<RangeKey, Bytes>,
    /// The ranges the memory tier holds, per object version. Kept beside moka (whose
    /// listener removes evicted ranges) because moka cannot find the entries overlapping
    /// a range. May briefly list a range moka has dropped; a lookup then treats it as a gap.
    spans: SpanMap,
    disk: Option<Arc<DiskTier>>,
    counters: Arc<CacheCounters>,
    served: Served,
    too_large: AtomicU64,
    disk_pending: AtomicU64,
    disk_skipped: AtomicU64,
    disk_idle: Notify,
    /// Ranges read from the disk tier, for [`PROMOTE_ONE_IN`].
    disk_reads: AtomicU64,
    /// Downloads in the air, which reads of the same bytes join.
    flights: Arc<Flights>,
    /// Run between a skipped disk write's two steps: lets a test order another write's end
    /// between them.
    #[cfg(test)]
    between_skip_steps: Mutex<Option<Box<dyn Fn() + Send + Sync>>>,
}

impl RangeCache {
    /// Builds a cache after validating `config`; opens (and indexes) the disk tier if one is
    /// configured.
    pub fn try_new(config: RangeConfig) -> Result<Self> {
        let counters = Arc::new(CacheCounters::default());
        let spans: SpanMap = Arc::default();
        let memory = Cache::builder()
            .max_capacity(config.memory_bytes)
            .weigher(|_, v: &Bytes| memory_weight(v.len() as u64))
            .eviction_listener({
                let (counters, spans) = (Arc::clone(&counters), Arc::clone(&spans));
                move |key: Arc<RangeKey>, value: Bytes, cause| {
                    counters.removed(cause);
                    if cause != RemovalCause::Replaced {
                        forget_span(
                            &spans,
                            &key.object,
                            key.start..key.start + value.len() as u64,
                        );
                    }
                }
            })
            .build();
        let disk = match &config.disk_dir {
            Some(dir) => Some(DiskTier::shared(dir, config.disk_bytes).map_err(|e| {
                DataFusionError::Configuration(format!(
                    "lakecache.range.disk_dir: cannot use {} for the disk tier: {e}",
                    dir.display()
                ))
            })?),
            None => None,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                memory,
                spans,
                disk,
                counters,
                served: Served::default(),
                too_large: AtomicU64::new(0),
                disk_pending: AtomicU64::new(0),
                disk_skipped: AtomicU64::new(0),
                disk_idle: Notify::new(),
                disk_reads: AtomicU64::new(0),
                flights: Arc::default(),
                #[cfg(test)]
                between_skip_steps: Mutex::default(),
            }),
        })
    }

    /// The settings this cache was built with.
    pub fn config(&self) -> &RangeConfig {
        &self.inner.config
    }

    /// Whether bytes of `version` are kept: when the cache is on, for versions whose bytes can
    /// be told apart, of every store but local files (which the operating system's page cache
    /// keeps already).
    pub fn applies(&self, version: &ObjectVersion) -> bool {
        self.inner.config.enabled && version.pins_bytes() && !version.store().is_local()
    }

    /// The disk tier, if there is one and it may keep `version`: only versions named by their
    /// content are the same version in the next process, or for the next store identity.
    fn disk_for(&self, version: &ObjectVersion) -> Option<&Arc<DiskTier>> {
        self.inner
            .disk
            .as_ref()
            .filter(|_| version.outlives_process())
    }

    /// Bytes served so far from memory, disk and the store, read without cache maintenance.
    pub(crate) fn served(&self) -> (u64, u64, u64) {
        let s = &self.inner.served;
        (
            s.memory.load(Relaxed),
            s.disk.load(Relaxed),
            s.store.load(Relaxed),
        )
    }

    /// A snapshot of the figures.
    pub fn stats(&self) -> RangeStats {
        let i = &self.inner;
        settle(&i.memory, i.config.memory_bytes);
        let (disk, disk_bytes, disk_capacity) = match &i.disk {
            Some(d) => {
                let (entries, bytes) = d.size();
                let c = &d.counters;
                let stats = CacheStats {
                    hits: c.hits.load(Relaxed),
                    misses: c.misses.load(Relaxed),
                    evictions: c.evictions.load(Relaxed),
                    expirations: 0,
                    invalidations: c.invalidations.load(Relaxed),
                    entries,
                };
                (stats, bytes, d.capacity())
            }
            None => (CacheStats::default(), 0, 0),
        };
        let d = i.disk.as_ref().map(|d| &d.counters);
        let load = |f: fn(&disk::DiskCounters) -> &AtomicU64| d.map_or(0, |c| f(c).load(Relaxed));
        RangeStats {
            memory: i.counters.snapshot(i.memory.entry_count()),
            memory_bytes: i.memory.weighted_size(),
            memory_capacity: i.config.memory_bytes,
            disk,
            disk_bytes,
            disk_capacity,
            bytes_from_memory: i.served.memory.load(Relaxed),
            bytes_from_disk: i.served.disk.load(Relaxed),
            bytes_from_store: i.served.store.load(Relaxed),
            too_large: i.too_large.load(Relaxed),
            shared: i.flights.joined.load(Relaxed),
            bytes_shared: i.flights.joined_bytes.load(Relaxed),
            disk_corrupt: load(|c| &c.corrupt),
            disk_writes: load(|c| &c.writes),
            disk_write_errors: load(|c| &c.write_errors),
            disk_skipped: i.disk_skipped.load(Relaxed),
            disk_claims_waited: load(|c| &c.claims_waited),
            disk_walks: load(|c| &c.walks),
            disk_view_versions: i.disk.as_ref().map_or(0, |d| d.view_versions()),
        }
    }

    /// Drops every entry, in memory and on disk.
    pub fn clear(&self) {
        self.inner.memory.invalidate_all();
        self.inner.memory.run_pending_tasks();
        self.lock_spans().clear();
        if let Some(disk) = &self.inner.disk {
            disk.clear();
        }
    }

    /// Drops every range of one object, in every version. Its files on disk are deleted
    /// before it returns, unless another process is walking the directory: then on a
    /// blocking thread once it is done (they are keyed by version, so until then they are
    /// only space).
    pub(crate) fn invalidate(&self, id: &ObjectId) {
        self.drop_versions(id, |_| true);
        if let Some(disk) = &self.inner.disk
            && !disk.invalidate(id, true)
        {
            let (disk, id) = (Arc::clone(disk), id.clone());
            blocking(move || {
                disk.invalidate(&id, false);
            });
        }
    }

    /// Drops every range of the versions of one object that are `identity`'s alone (never on
    /// disk: see [`RangeCache::disk_for`]).
    pub(crate) fn invalidate_owned(&self, id: &ObjectId, identity: &StoreIdentity) {
        self.drop_versions(id, |o| o.owner() == Some(identity));
    }

    /// Drops every range of one version of an object.
    pub(crate) fn invalidate_version(&self, version: &ObjectVersion) {
        self.drop_versions(version.id(), |o| o == version);
        // As for `invalidate`.
        if let Some(disk) = &self.inner.disk
            && !disk.invalidate_version(version, true)
        {
            let (disk, version) = (Arc::clone(disk), version.clone());
            blocking(move || {
                disk.invalidate_version(&version, false);
            });
        }
    }

    /// Drops the memory tier's ranges of the versions of object `id` that `which` picks.
    fn drop_versions(&self, id: &ObjectId, which: impl Fn(&ObjectVersion) -> bool) {
        let keys: Vec<RangeKey> = {
            let mut spans = self.lock_spans();
            let versions: Vec<ObjectVersion> = spans
                .versions_of(id)
                .into_iter()
                .filter(|o| which(o))
                .collect();
            versions
                .into_iter()
                .flat_map(|object| {
                    let held = spans.remove(&object).unwrap_or_default();
                    held.ranges()
                        .map(|r| RangeKey {
                            object: object.clone(),
                            start: r.start,
                        })
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        // Outside the lock: moka's listener takes it.
        for key in keys {
            self.inner.memory.invalidate(&key);
        }
    }

    /// The bytes of `version` held in memory and on disk.
    pub(crate) fn bytes_of(&self, version: &ObjectVersion) -> (u64, u64) {
        let memory = self.lock_spans().get(version).map_or(0, Spans::bytes);
        let disk = self.inner.disk.as_ref().map_or(0, |d| d.bytes_of(version));
        (memory, disk)
    }

    /// Whether memory or the disk tier holds bytes of some version of object `id`: then
    /// learning its version (a HEAD) may save fetching them again.
    pub(crate) fn may_hold(&self, id: &ObjectId) -> bool {
        self.inner.config.enabled
            && (self.lock_spans().holds_object(id)
                || self.inner.disk.as_ref().is_some_and(|d| d.holds(id)))
    }

    /// Waits until every disk write started so far has finished (or failed).
    pub async fn flush(&self) {
        loop {
            let idle = self.inner.disk_idle.notified();
            if self.inner.disk_pending.load(Relaxed) == 0 {
                return;
            }
            idle.await;
        }
    }

    fn lock_spans(&self) -> MutexGuard<'_, Held> {
        self.inner.spans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether every byte of `range` of `object` is in memory or on disk.
    /// Whether the memory tier holds every byte of `range` of `object`: a read of it is
    /// served at once, with nothing to wait for (a read from the disk tier waits for a
    /// blocking thread and the disk).
    pub fn in_memory(&self, object: &ObjectVersion, range: Range<u64>) -> bool {
        self.applies(object)
            && self.lock_spans().get(object).is_some_and(|held| {
                held.cover(range)
                    .into_iter()
                    .all(|(_, entry)| entry.is_some())
            })
    }

    /// Whether either tier holds every byte of `range` of `object`.
    #[cfg(test)]
    pub fn covers(&self, object: &ObjectVersion, range: Range<u64>) -> bool {
        if !self.applies(object) {
            return false;
        }
        let gaps: Vec<Range<u64>> = match self.lock_spans().get(object) {
            Some(held) => held
                .cover(range)
                .into_iter()
                .filter_map(|(piece, entry)| entry.is_none().then_some(piece))
                .collect(),
            None => vec![range],
        };
        if gaps.is_empty() {
            return true;
        }
        let on_disk = self.disk_for(object).and_then(|d| d.cover(object, &gaps));
        on_disk.is_some_and(|pieces| pieces.iter().flatten().all(|(_, entry)| entry.is_some()))
    }

    /// Keeps `bytes`, the range of `object` starting at `start`, in memory and (if there is
    /// one) on disk. The bytes must be of that version: read under its guard. `claim`, the
    /// claim of the download that brought them, is released once they are on disk (or not
    /// written), so that a process waiting for it finds them there.
    fn insert(&self, object: &ObjectVersion, start: u64, bytes: Bytes, claim: Option<Arc<Claim>>) {
        if !self.applies(object) || bytes.is_empty() {
            return;
        }
        self.write_disk(object, start, &bytes, claim);
        self.insert_memory(object, start, bytes);
    }

    fn insert_memory(&self, object: &ObjectVersion, start: u64, bytes: Bytes) {
        let len = bytes.len() as u64;
        if len > RangeConfig::max_entry_bytes(self.inner.config.memory_bytes) {
            self.inner.too_large.fetch_add(1, Relaxed);
            return;
        }
        let key = RangeKey {
            object: object.clone(),
            start,
        };
        // The lookup counts as a touch in the admission's frequency sketch: a range read
        // twice is admitted over ranges read once, a range read once is not.
        if self
            .inner
            .memory
            .get(&key)
            .is_some_and(|held| held.len() as u64 >= len)
        {
            return;
        }
        let range = start..start + len;
        if self
            .lock_spans()
            .get(object)
            .is_some_and(|s| s.holds(&range))
        {
            return;
        }
        // In moka before the spans, so a lookup never finds a span without its bytes.
        self.inner.memory.insert(key, bytes);
        let inserted = self.lock_spans().insert(object, range.clone());
        let unneeded = match inserted {
            // Another read kept a range holding this one meanwhile.
            Inserted::Covered => vec![range],
            Inserted::Replacing(inside) => inside,
        };
        // Outside the lock: moka's listener takes it. The entry at `start` is this one.
        for r in unneeded.into_iter().filter(|r| r.start != start) {
            self.inner.memory.invalidate(&RangeKey {
                object: object.clone(),
                start: r.start,
            });
        }
    }

    fn write_disk(
        &self,
        object: &ObjectVersion,
        start: u64,
        bytes: &Bytes,
        claim: Option<Arc<Claim>>,
    ) {
        let Some(disk) = self.disk_for(object) else {
            return;
        };
        let len = bytes.len() as u64;
        if len > RangeConfig::max_entry_bytes(disk.capacity()) {
            self.inner.too_large.fetch_add(1, Relaxed);
            return;
        }
        let pending = self.inner.disk_pending.fetch_add(len, Relaxed);
        if pending + len > MAX_PENDING_DISK_BYTES {
            self.inner.disk_skipped.fetch_add(1, Relaxed);
            #[cfg(test)]
            if let Some(step) = self.inner.between_skip_steps.lock().unwrap().as_ref() {
                step();
            }
            self.inner.written(len);
            return;
        }
        let (disk, object, bytes) = (Arc::clone(disk), object.clone(), bytes.clone());
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            disk.write(&object, start, &bytes);
            drop(claim);
            inner.written(len);
        });
    }
}

/// Runs `work` on a blocking thread of the runtime, if there is one, else here.
fn blocking(work: impl FnOnce() + Send + 'static) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn_blocking(work);
        }
        Err(_) => work(),
    }
}

impl Inner {
    /// `len` pending bytes are written (or given up): a flush waiting for the last of them
    /// wakes, whichever path took them off.
    fn written(&self, len: u64) {
        if self.disk_pending.fetch_sub(len, Relaxed) == len {
            self.disk_idle.notify_waiters();
        }
    }
}

/// Bytes served, by source, over the cache's life.
#[derive(Debug, Default)]
struct Served {
    memory: AtomicU64,
    disk: AtomicU64,
    store: AtomicU64,
}

impl Served {
    /// Counts `bytes` served from `source`.
    fn add(&self, source: Source, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let counter = match source {
            Source::Memory => &self.memory,
            Source::Disk => &self.disk,
            Source::Store => &self.store,
        };
        counter.fetch_add(bytes, Relaxed);
    }
}

/// See `crate::fuzz::disk_entry`.
#[cfg(feature = "fuzz")]
pub(crate) fn fuzz_disk_entry(name: &str, contents: &[u8]) -> bool {
    disk::fuzz_entry(name, contents)
}

fn forget_span(spans: &SpanMap, object: &ObjectVersion, range: Range<u64>) {
    let mut spans = spans.lock().unwrap_or_else(|e| e.into_inner());
    spans.remove_range(object, &range);
}

#[cfg(test)]
mod tests;
