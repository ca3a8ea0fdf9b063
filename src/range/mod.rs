//! Keeping the bytes: a [`RangeCache`] of exact byte ranges of remote objects, in memory and
//! optionally on local disk, so repeated scans of immutable files stop touching the network.
//!
//! Entries are the ranges that were actually downloaded (a small file read whole at planning
//! time, a prefetched column chunk, the coalesced ranges of a reader's request), keyed by
//! object version, not fixed-size blocks: a block cache reads whole blocks around every small
//! request. A read covered by one entry is a slice of it, without a copy; one covered by
//! several is joined; one partly covered fetches only the gaps, and keeps what it fetched.
//!
//! The cache sits in [`CachingObjectStore`](crate::CachingObjectStore), below DataFusion's
//! Parquet reader, so planning reads, plain `ListingTable`s and every scan share it. Only
//! reads the wrapper can tie to one version are kept: those guarded by the object's e_tag,
//! which also makes a replaced object a new key (its old ranges are never served for it).
//!
//! The memory tier is a moka cache weighted by bytes. Its TinyLFU admission keeps the hot set
//! when full: a range seen once (one pass of a scan larger than the cache) cannot push out
//! ranges read more often, while a range read again is admitted. Local files are not cached:
//! the operating system's page cache already keeps them.

mod disk;
mod spans;

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use datafusion::error::{DataFusionError, Result};
use moka::notification::RemovalCause;
use moka::sync::Cache;
use object_store::OBJECT_STORE_COALESCE_DEFAULT;
use object_store::path::Path;
use tokio::sync::Notify;

use crate::config::{RANGE_DISK_DIR, RangeConfig};
use crate::index::ObjectVersion;
use crate::query::{Source, record_bytes};
use crate::stats::{CacheCounters, CacheStats, settle};
use disk::DiskTier;
use spans::{Piece, Spans};

/// Bytes of disk writes that may wait for a blocking thread; beyond this a range is not
/// written (the disk is slower than the network), rather than held in memory.
const MAX_PENDING_DISK_BYTES: u64 = 256 << 20;

/// Figures of a [`RangeCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RangeStats {
    /// The memory tier. Hits and misses count pieces of reads found or not found in it.
    pub memory: CacheStats,
    /// Bytes the memory tier holds.
    pub memory_bytes: u64,
    /// Bytes the memory tier may hold.
    pub memory_capacity: u64,
    /// The disk tier (all zero when it is off). Hits and misses count entries read or not
    /// found.
    pub disk: CacheStats,
    /// Bytes of the disk tier's files.
    pub disk_bytes: u64,
    /// Bytes the disk tier may hold; 0 when it is off.
    pub disk_capacity: u64,
    /// Bytes of reads served from memory.
    pub bytes_from_memory: u64,
    /// Bytes of reads served from disk.
    pub bytes_from_disk: u64,
    /// Bytes of reads fetched from the store (gaps of partly cached reads included).
    pub bytes_from_store: u64,
    /// Ranges not kept because they exceed an eighth of a tier.
    pub too_large: u64,
    /// Disk entries whose bytes did not match their checksum or version, deleted and refetched.
    pub disk_corrupt: u64,
    /// Ranges written to disk.
    pub disk_writes: u64,
    /// Disk writes that failed (the range stays in memory only).
    pub disk_write_errors: u64,
    /// Ranges not written because the disk fell behind.
    pub disk_skipped: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RangeKey {
    object: ObjectVersion,
    start: u64,
}

type SpanMap = Arc<Mutex<HashMap<ObjectVersion, Spans>>>;

/// The shared cache of object byte ranges. Cheap to clone.
///
/// ```
/// # use datafusion_lakecache::{config::RangeConfig, range::RangeCache};
/// let cache = RangeCache::try_new(RangeConfig::default()).unwrap();
/// assert_eq!(cache.stats().memory_capacity, 1 << 30);
/// ```
#[derive(Debug, Clone)]
pub struct RangeCache {
    inner: Arc<Inner>,
}

#[derive(Debug)]
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
}

/// One piece of a requested range and, once found, the buffer holding it and where that
/// buffer starts in the object.
struct Part {
    range: Range<u64>,
    found: Option<(Bytes, u64, Source)>,
}

impl Part {
    fn gap(range: Range<u64>) -> Self {
        Self { range, found: None }
    }

    fn bytes(&self) -> Option<Bytes> {
        let (buffer, start, _) = self.found.as_ref()?;
        let from = (self.range.start - start) as usize;
        let to = (self.range.end - start) as usize;
        (to <= buffer.len()).then(|| buffer.slice(from..to))
    }
}

impl RangeCache {
    /// Builds a cache after validating `config`; opens (and indexes) the disk tier if one is
    /// configured.
    pub fn try_new(config: RangeConfig) -> Result<Self> {
        config.validate()?;
        let counters = Arc::new(CacheCounters::default());
        let spans: SpanMap = Arc::default();
        let memory = Cache::builder()
            .max_capacity(config.memory_bytes)
            .weigher(|_, v: &Bytes| u32::try_from(v.len()).unwrap_or(u32::MAX))
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
            Some(dir) => Some(Arc::new(DiskTier::open(dir, config.disk_bytes).map_err(
                |e| {
                    DataFusionError::Configuration(format!(
                        "{RANGE_DISK_DIR}: cannot use {} for the disk tier: {e}",
                        dir.display()
                    ))
                },
            )?)),
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
            }),
        })
    }

    /// The settings this cache was built with.
    pub fn config(&self) -> &RangeConfig {
        &self.inner.config
    }

    /// Whether objects of the store at `store_url` are cached: every store but local files,
    /// which the operating system's page cache keeps already.
    pub fn applies_to(&self, store_url: &url::Url) -> bool {
        self.inner.config.enabled && store_url.scheme() != "file"
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
            disk_corrupt: load(|c| &c.corrupt),
            disk_writes: load(|c| &c.writes),
            disk_write_errors: load(|c| &c.write_errors),
            disk_skipped: i.disk_skipped.load(Relaxed),
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

    /// Drops every range of the object at `path` in the store `store_url`, in every version.
    pub fn invalidate(&self, store_url: &url::Url, path: &Path) {
        let store = crate::store_key(store_url);
        let keys: Vec<RangeKey> = {
            let mut spans = self.lock_spans();
            let versions: Vec<ObjectVersion> = spans
                .keys()
                .filter(|o| o.path() == path && o.store() == &store)
                .cloned()
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
        if let Some(disk) = &self.inner.disk {
            disk.invalidate(&store, path);
        }
    }

    /// Whether the disk tier holds bytes of some version of the object at `path` in the
    /// store keyed `store`: then learning its version (a HEAD) may save its data requests.
    pub(crate) fn may_hold(&self, store: &str, path: &Path) -> bool {
        self.inner.config.enabled
            && self
                .inner
                .disk
                .as_ref()
                .is_some_and(|d| d.holds(store, path))
    }

    /// Counts `bytes` read from the store outside [`RangeCache::read_through`] (a read made
    /// before the object's version was known) as served from the store.
    pub(crate) fn count_fetched(&self, bytes: u64) {
        self.inner.served.add(Source::Store, bytes);
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

    fn lock_spans(&self) -> MutexGuard<'_, HashMap<ObjectVersion, Spans>> {
        self.inner.spans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether every byte of `range` of `object` is in memory or on disk.
    pub fn covers(&self, object: &ObjectVersion, range: Range<u64>) -> bool {
        if !self.inner.config.enabled {
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
        let on_disk = self
            .inner
            .disk
            .as_ref()
            .and_then(|d| d.cover(object, &gaps));
        on_disk.is_some_and(|pieces| pieces.iter().flatten().all(|(_, entry)| entry.is_some()))
    }

    /// Keeps `bytes`, the range of `object` starting at `start`, in memory and (if there is
    /// one) on disk. The bytes must be of that version: read under its e_tag.
    pub fn insert(&self, object: &ObjectVersion, start: u64, bytes: Bytes) {
        if !self.inner.config.enabled || bytes.is_empty() {
            return;
        }
        self.write_disk(object, start, &bytes);
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
        self.inner.memory.insert(key, bytes);
        self.lock_spans()
            .entry(object.clone())
            .or_default()
            .insert(start..start + len);
    }

    fn write_disk(&self, object: &ObjectVersion, start: u64, bytes: &Bytes) {
        let Some(disk) = &self.inner.disk else {
            return;
        };
        let len = bytes.len() as u64;
        if len > RangeConfig::max_entry_bytes(disk.capacity()) {
            self.inner.too_large.fetch_add(1, Relaxed);
            return;
        }
        let pending = self.inner.disk_pending.fetch_add(len, Relaxed);
        if pending + len > MAX_PENDING_DISK_BYTES {
            self.inner.disk_pending.fetch_sub(len, Relaxed);
            self.inner.disk_skipped.fetch_add(1, Relaxed);
            return;
        }
        let (disk, object, bytes) = (Arc::clone(disk), object.clone(), bytes.clone());
        let inner = Arc::clone(&self.inner);
        let write = move || {
            disk.write(&object, start, &bytes);
            if inner.disk_pending.fetch_sub(len, Relaxed) == len {
                inner.disk_idle.notify_waiters();
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(write);
            }
            Err(_) => write(),
        }
    }

    /// Reads `ranges` of `object`: from memory, then disk, and what neither holds through
    /// `fetch`, which is called at most once with the missing ranges (coalesced the way
    /// object_store coalesces) and whose bytes are kept. `fetch` must read `object` at this
    /// version (under its e_tag).
    pub async fn read_through<F, Fut>(
        &self,
        object: &ObjectVersion,
        ranges: &[Range<u64>],
        fetch: F,
    ) -> object_store::Result<Vec<Bytes>>
    where
        F: FnOnce(Vec<Range<u64>>) -> Fut,
        Fut: Future<Output = object_store::Result<Vec<Bytes>>>,
    {
        if !self.inner.config.enabled {
            let bytes = fetch(ranges.to_vec()).await?;
            let total = bytes.iter().map(|b| b.len() as u64).sum();
            self.inner.served.add(Source::Store, total);
            return Ok(bytes);
        }
        let mut parts = self.look_in_memory(object, ranges);
        self.look_on_disk(object, &mut parts).await;
        self.fetch_gaps(object, &mut parts, fetch).await?;
        let served = &self.inner.served;
        ranges
            .iter()
            .zip(parts)
            .map(|(range, parts)| {
                for part in &parts {
                    if let Some((_, _, source)) = part.found {
                        served.add(source, part.range.end - part.range.start);
                    }
                }
                join(object, range, &parts)
            })
            .collect()
    }

    /// Cuts each range into pieces, found in memory or not.
    fn look_in_memory(&self, object: &ObjectVersion, ranges: &[Range<u64>]) -> Vec<Vec<Part>> {
        // Worked out under the lock (moka is called after it is released: its listener
        // takes the lock).
        let covered: Option<Vec<Vec<Piece>>> = self
            .lock_spans()
            .get(object)
            .map(|held| ranges.iter().map(|r| held.cover(r.clone())).collect());
        let Some(covered) = covered else {
            for _ in ranges {
                self.inner.counters.miss();
            }
            return ranges.iter().map(|r| vec![Part::gap(r.clone())]).collect();
        };
        let mut buffers: HashMap<u64, Option<Bytes>> = HashMap::new();
        let mut stale = Vec::new();
        let parts = covered
            .into_iter()
            .map(|pieces| {
                pieces
                    .into_iter()
                    .map(|(piece, entry)| {
                        let found = entry.and_then(|entry| {
                            let key = RangeKey {
                                object: object.clone(),
                                start: entry.start,
                            };
                            let buffer = buffers
                                .entry(entry.start)
                                .or_insert_with(|| self.inner.memory.get(&key))
                                .clone()
                                .filter(|b| b.len() as u64 == entry.end - entry.start);
                            if buffer.is_none() {
                                stale.push(entry.clone());
                            }
                            buffer.map(|b| (b, entry.start, Source::Memory))
                        });
                        match found {
                            Some(_) => self.inner.counters.hit(),
                            None => self.inner.counters.miss(),
                        }
                        Part {
                            range: piece,
                            found,
                        }
                    })
                    .collect()
            })
            .collect();
        for entry in stale {
            forget_span(&self.inner.spans, object, entry);
        }
        parts
    }

    /// Fills the pieces memory lacked from the disk tier, and brings what it read into memory.
    async fn look_on_disk(&self, object: &ObjectVersion, parts: &mut [Vec<Part>]) {
        let Some(disk) = &self.inner.disk else {
            return;
        };
        if parts.iter().flatten().all(|p| p.found.is_some()) {
            return;
        }
        let gaps: Vec<Range<u64>> = parts
            .iter()
            .flatten()
            .filter(|p| p.found.is_none())
            .map(|p| p.range.clone())
            .collect();
        let Some(covered) = disk.cover(object, &gaps) else {
            return;
        };
        // Split each gap by what the disk holds (`covered` is in the order of `gaps`).
        let mut covered = covered.into_iter();
        let mut wanted: Vec<Range<u64>> = Vec::new();
        for range_parts in parts.iter_mut() {
            let mut split = Vec::with_capacity(range_parts.len());
            for part in range_parts.drain(..) {
                if part.found.is_some() {
                    split.push(part);
                    continue;
                }
                for (piece, entry) in covered.next().unwrap_or_default() {
                    if let Some(entry) = &entry
                        && !wanted.contains(entry)
                    {
                        wanted.push(entry.clone());
                    }
                    // Marked with the entry's start; filled below once it is read.
                    split.push(Part {
                        range: piece,
                        found: entry.map(|e| (Bytes::new(), e.start, Source::Disk)),
                    });
                }
            }
            *range_parts = split;
        }
        if wanted.is_empty() {
            return;
        }
        let (tier, version) = (Arc::clone(disk), object.clone());
        let read = tokio::task::spawn_blocking(move || {
            wanted
                .into_iter()
                .map(|entry| (entry.start, tier.read(&version, entry)))
                .collect::<HashMap<u64, Option<Bytes>>>()
        })
        .await
        .unwrap_or_default();
        for (&start, bytes) in &read {
            if let Some(bytes) = bytes {
                self.insert_memory(object, start, bytes.clone());
            }
        }
        for part in parts.iter_mut().flatten() {
            if let Some((_, start, Source::Disk)) = &part.found {
                part.found = match read.get(start) {
                    Some(Some(bytes)) => Some((bytes.clone(), *start, Source::Disk)),
                    _ => None,
                };
            }
        }
    }

    /// Fetches the pieces neither tier had, in one call of `fetch`, and keeps them.
    async fn fetch_gaps<F, Fut>(
        &self,
        object: &ObjectVersion,
        parts: &mut [Vec<Part>],
        fetch: F,
    ) -> object_store::Result<()>
    where
        F: FnOnce(Vec<Range<u64>>) -> Fut,
        Fut: Future<Output = object_store::Result<Vec<Bytes>>>,
    {
        let mut gaps: Vec<Range<u64>> = parts
            .iter()
            .flatten()
            .filter(|p| p.found.is_none())
            .map(|p| p.range.clone())
            .collect();
        if gaps.is_empty() {
            return Ok(());
        }
        gaps.sort_by_key(|g| g.start);
        let mut requests: Vec<Range<u64>> = Vec::new();
        for gap in gaps {
            match requests.last_mut() {
                Some(last)
                    if gap.start <= last.end.saturating_add(OBJECT_STORE_COALESCE_DEFAULT) =>
                {
                    last.end = last.end.max(gap.end);
                }
                _ => requests.push(gap),
            }
        }
        let fetched = fetch(requests.clone()).await?;
        if fetched.len() != requests.len()
            || fetched
                .iter()
                .zip(&requests)
                .any(|(b, r)| b.len() as u64 != r.end - r.start)
        {
            return Err(object_store::Error::Generic {
                store: "RangeCache",
                source: format!(
                    "the store returned other lengths than the ranges asked of {}",
                    object.path()
                )
                .into(),
            });
        }
        for (request, bytes) in requests.iter().zip(&fetched) {
            self.insert(object, request.start, bytes.clone());
        }
        for part in parts.iter_mut().flatten() {
            if part.found.is_some() {
                continue;
            }
            let i = requests.partition_point(|r| r.end <= part.range.start);
            if let (Some(request), Some(bytes)) = (requests.get(i), fetched.get(i)) {
                part.found = Some((bytes.clone(), request.start, Source::Store));
            }
        }
        Ok(())
    }
}

/// Joins the pieces of `range`: a slice of one buffer, or a copy of several.
fn join(object: &ObjectVersion, range: &Range<u64>, parts: &[Part]) -> object_store::Result<Bytes> {
    let missing = || object_store::Error::Generic {
        store: "RangeCache",
        source: format!("bytes {range:?} of {} were not found", object.path()).into(),
    };
    if let [part] = parts {
        return part.bytes().ok_or_else(missing);
    }
    let mut joined = BytesMut::with_capacity((range.end - range.start) as usize);
    for part in parts {
        joined.extend_from_slice(&part.bytes().ok_or_else(missing)?);
    }
    Ok(joined.freeze())
}

/// Bytes served, by source, over the cache's life.
#[derive(Debug, Default)]
struct Served {
    memory: AtomicU64,
    disk: AtomicU64,
    store: AtomicU64,
}

impl Served {
    /// Counts `bytes` served from `source`, here and in the current scan's figures.
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
        record_bytes(source, bytes);
    }
}

fn forget_span(spans: &SpanMap, object: &ObjectVersion, range: Range<u64>) {
    let mut spans = spans.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(held) = spans.get_mut(object) {
        held.remove(&range);
        if held.is_empty() {
            spans.remove(object);
        }
    }
}

#[cfg(test)]
mod tests;
