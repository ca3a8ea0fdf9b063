//! [`Prefetcher`]: keeps a scan's downloads in flight ahead of its readers, so the link stays
//! full instead of waiting one round trip per file and per row group.
//!
//! DataFusion 55 keeps one request in flight per partition. A scan's [`Prefetcher`] knows the
//! scan's files from its final plan ([`ScanPlan`](plan::ScanPlan)) and, from the first file a
//! reader opens, downloads ahead of the readers:
//! - a file whose footer is cached: the column chunks the scan will read (its projection and
//!   DataFusion's row-group pruning applied), in file order, nearby chunks merged and long
//!   ones split into parallel requests of `split_bytes`;
//! - a small file (up to `small_file_bytes`) whose footer is not cached: the whole file in one
//!   request, so footer, page index, bloom filters and data come from those bytes;
//! - a larger file whose footer is not cached: the footer into the [`IndexCache`], then its
//!   chunks as above.
//!
//! How much is in flight follows the [`Controller`](controller::Controller). Every buffered
//! or in-flight byte is reserved in the session's `MemoryPool`; when the pool says no, nothing
//! more starts and readers read for themselves, one request at a time, as without prefetching.
//!
//! Readers hold a [`FileLease`] while a file is open. When the last lease of a scan is gone
//! for longer than a short grace period (DataFusion opens the next file right after closing
//! one), the scan is over: every download is aborted and its memory released.
//!
//! A prefetch is only ever a guess: a download that fails, is cancelled or was never made
//! leaves the reader to read those bytes from the store itself.

mod controller;
mod figures;
pub(crate) mod plan;

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use datafusion::common::config::ConfigOptions;
use datafusion::datasource::physical_plan::{FileScanConfig, ParquetSource};
use datafusion::execution::memory_pool::{
    MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use object_store::path::Path;
use object_store::{GetOptions, GetRange, ObjectMeta, ObjectStore};
use parquet::file::metadata::ParquetMetaData;
use tokio::runtime::Handle;
use tokio::task::AbortHandle;
use url::Url;

use crate::LakeCache;
use crate::config::PrefetchConfig;
use crate::handle::HandleCache;
use crate::index::{IndexCache, ObjectVersion};
use crate::range::RangeCache;
use crate::table::load_footer;
use controller::Controller;
pub use figures::PrefetchStats;
pub(crate) use figures::{Figures, PrefetchCounters};
use plan::ScanPlan;

/// How long a scan with no open file waits before it counts as over. DataFusion opens the
/// next file in the same poll that closes the last one, so this only has to outlast that,
/// and keeps cancellation well within 100 ms.
const GRACE: Duration = Duration::from_millis(30);

/// Bytes of one download, shared by the readers that wait for it; `None` if it failed or was
/// cancelled.
type Download = Shared<BoxFuture<'static, Option<Bytes>>>;

/// The prefetching state of one scan (one `DataSourceExec`). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Prefetcher {
    shared: Arc<Scan>,
}

#[derive(Debug)]
struct Scan {
    store: Arc<dyn ObjectStore>,
    store_url: Url,
    index: IndexCache,
    /// Where bytes already kept are found (pieces it holds are not fetched) and downloads
    /// are kept; `None` for stores it does not cache.
    ranges: Option<RangeCache>,
    /// What is known of each file's version (an e_tag its listing may have lacked).
    handles: HandleCache,
    plan: ScanPlan,
    config: PrefetchConfig,
    metadata_size_hint: Option<usize>,
    pool: Arc<dyn MemoryPool>,
    figures: Figures,
    state: Mutex<State>,
}

/// A piece of work waiting for a download slot.
#[derive(Debug, Clone)]
enum Work {
    /// Load the footer (with page index) of a large file into the index cache.
    Footer(Path),
    /// Download the unit of `Path` that starts at this offset.
    Unit(Path, u64),
}

/// Bytes of one file the scan downloads (or will) ahead of its reader.
#[derive(Debug)]
struct Unit {
    range: Range<u64>,
    /// `None` while queued.
    download: Option<Download>,
    reserved: u64,
    /// Bytes of this unit handed to readers so far.
    served: u64,
    /// Whether the download completed with the bytes.
    arrived: bool,
    /// A whole small file, which footer, index and data reads all come back to: kept until
    /// the file is closed rather than once every byte was read.
    whole: bool,
}

#[derive(Debug)]
struct FileEntry {
    meta: ObjectMeta,
    /// Position in the work queue; lower goes first.
    rank: i64,
    /// Where the plan lists this file (more than once when split by byte range).
    splits: Vec<usize>,
    opens: usize,
    leases: usize,
    /// Whether its work has been queued.
    queued: bool,
    /// Whether the pieces of this (large) file have been worked out and queued.
    pieces_queued: bool,
    /// Units by start offset, not overlapping.
    units: BTreeMap<u64, Unit>,
}

impl FileEntry {
    /// Whether every reader the plan expects has opened and closed this file.
    fn done(&self) -> bool {
        self.leases == 0 && self.opens >= self.splits.len()
    }
}

#[derive(Debug)]
struct State {
    /// Bumped each time the scan starts (a plan may run more than once); work of an older
    /// run that finishes late is ignored.
    generation: u64,
    running: bool,
    leases: usize,
    controller: Controller,
    reservation: Option<MemoryReservation>,
    queue: BTreeMap<(i64, u64), Work>,
    next_seq: u64,
    next_front: i64,
    /// Position in the plan's file order of the next file to queue work for.
    cursor: usize,
    files: HashMap<Path, FileEntry>,
    in_flight: usize,
    tasks: HashMap<u64, AbortHandle>,
    next_task: u64,
}

impl Prefetcher {
    /// A prefetcher for the scan `config` over `source`, reading from `store` (at
    /// `store_url`) and reserving its memory in `pool`. Returns `None` when the scan has
    /// nothing to prefetch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn try_new(
        config: &FileScanConfig,
        source: &ParquetSource,
        options: &ConfigOptions,
        store: Arc<dyn ObjectStore>,
        store_url: &Url,
        lake: &LakeCache,
        pool: Arc<dyn MemoryPool>,
        settings: &PrefetchConfig,
    ) -> Option<Self> {
        if !settings.enabled {
            return None;
        }
        let plan = ScanPlan::new(config, source, options);
        if plan.files.is_empty() {
            return None;
        }
        Some(Self {
            shared: Arc::new(Scan {
                store,
                store_url: store_url.clone(),
                index: lake.index().clone(),
                ranges: lake.range_cache_for(store_url),
                handles: lake.handles().clone(),
                plan,
                config: settings.clone(),
                metadata_size_hint: options.execution.parquet.metadata_size_hint,
                pool,
                figures: Figures::new(lake.prefetch_counters()),
                state: Mutex::new(State {
                    generation: 0,
                    running: false,
                    leases: 0,
                    controller: Controller::new(settings),
                    reservation: None,
                    queue: BTreeMap::new(),
                    next_seq: 0,
                    next_front: 0,
                    cursor: 0,
                    files: HashMap::new(),
                    in_flight: 0,
                    tasks: HashMap::new(),
                    next_task: 0,
                }),
            }),
        })
    }

    /// Called as a reader opens `meta`: starts the scan's prefetching if this is its first
    /// file, puts this file's work first, and returns the lease through which the reader gets
    /// prefetched bytes. `None` outside a Tokio runtime or for a file the plan does not list.
    pub fn open(&self, meta: &ObjectMeta, metrics: &ExecutionPlanMetricsSet) -> Option<FileLease> {
        let runtime = Handle::try_current().ok()?;
        let scan = &self.shared;
        scan.figures.register(metrics);
        let mut state = scan.lock();
        if !state.running {
            scan.start(&mut state);
        }
        let entry = state.files.get_mut(&meta.location)?;
        if entry.meta.size != meta.size || entry.meta.e_tag != meta.e_tag {
            return None;
        }
        entry.opens += 1;
        entry.leases += 1;
        state.leases += 1;
        scan.put_first(&mut state, &meta.location);
        scan.pump(&mut state, &runtime);
        let generation = state.generation;
        drop(state);
        Some(FileLease {
            scan: Arc::clone(scan),
            path: meta.location.clone(),
            generation,
            runtime,
        })
    }
}

impl Scan {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the bookkeeping half-updated in a way that matters
        // more than losing prefetches, so a poisoned lock is used as is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `meta` as the handle cache knows that version: with its e_tag, if any was seen.
    fn known(&self, meta: &ObjectMeta) -> ObjectMeta {
        self.handles
            .best_meta(&crate::store_key(&self.store_url), meta)
    }

    /// The key of `meta` in the index cache, as readers key it.
    fn object(&self, meta: &ObjectMeta) -> ObjectVersion {
        ObjectVersion::new(&self.store_url, meta)
    }

    /// Whether the range cache holds every byte of `range` of `meta`.
    fn kept(&self, meta: &ObjectMeta, range: Range<u64>) -> bool {
        self.ranges.as_ref().is_some_and(|r| {
            r.covers(
                &ObjectVersion::new(&self.store_url, &self.known(meta)),
                range,
            )
        })
    }

    fn start(&self, state: &mut State) {
        state.generation += 1;
        state.running = true;
        state.controller = Controller::new(&self.config);
        state.reservation = Some(MemoryConsumer::new("lakecache prefetch").register(&self.pool));
        state.files.clear();
        state.queue.clear();
        state.next_front = 0;
        for (position, file) in self.plan.files.iter().enumerate() {
            let entry = state
                .files
                .entry(file.meta.location.clone())
                .or_insert_with(|| FileEntry {
                    meta: file.meta.clone(),
                    rank: position as i64 + 1,
                    splits: Vec::new(),
                    opens: 0,
                    leases: 0,
                    queued: false,
                    pieces_queued: false,
                    units: BTreeMap::new(),
                });
            entry.splits.push(position);
        }
        state.cursor = 0;
        self.figures.scan_started();
    }

    /// Queues the work of the next files in the scan's order until there is enough to keep
    /// every allowed download busy twice over. Working out a file's pieces costs CPU (its
    /// row groups are pruned), so a scan of a hundred thousand files plans only what it
    /// will fetch soon. With a limit pushed into the scan, only files a reader opens are
    /// fetched: the limit is usually reached long before the last file.
    fn fill_queue(&self, state: &mut State) {
        if self.plan.limit.is_some() {
            return;
        }
        let want = 2 * state.controller.downloads();
        while state.queue.len() < want && state.cursor < self.plan.files.len() {
            let path = self.plan.files[state.cursor].meta.location.clone();
            state.cursor += 1;
            self.queue_file(state, &path);
        }
    }

    /// Queues the first work of a file not yet queued: the pieces DataFusion will read if
    /// its footer is already cached (then no request is needed to know them), else the
    /// whole file if small (one request instead of footer and data), else its footer.
    fn queue_file(&self, state: &mut State, path: &Path) {
        let Some(entry) = state.files.get_mut(path) else {
            return;
        };
        if entry.queued {
            return;
        }
        entry.queued = true;
        let meta = entry.meta.clone();
        let footer = self
            .index
            .cached_metadata(&self.object(&meta))
            .or_else(|| self.index.datafusion_footer(&meta));
        if let Some(footer) = footer {
            self.queue_pieces_locked(state, path, &footer);
            return;
        }
        let work = if meta.size <= self.config.small_file_bytes {
            if self.kept(&meta, 0..meta.size) {
                // Readers find the whole file in the range cache.
                return;
            }
            entry.units.insert(0, Unit::queued(0..meta.size, true));
            Work::Unit(path.clone(), 0)
        } else {
            Work::Footer(path.clone())
        };
        let rank = entry.rank;
        let seq = state.next_seq;
        state.next_seq += 1;
        state.queue.insert((rank, seq), work);
    }

    /// Moves a file a reader just opened to the front of the queue.
    fn put_first(&self, state: &mut State, path: &Path) {
        state.next_front -= 1;
        let front = state.next_front;
        let Some(entry) = state.files.get_mut(path) else {
            return;
        };
        let old = std::mem::replace(&mut entry.rank, front);
        for key in state.queued(old) {
            if let Some(work) = state.queue.remove(&key) {
                state.queue.insert((front, key.1), work);
            }
        }
        self.queue_file(state, path);
    }

    /// Starts queued work while the controller allows more downloads and the budget and the
    /// memory pool allow their bytes.
    fn pump(self: &Arc<Self>, state: &mut State, runtime: &Handle) {
        while state.running && state.in_flight < state.controller.downloads() {
            self.fill_queue(state);
            let Some((&key, work)) = state.queue.first_key_value() else {
                return;
            };
            let bytes = match work {
                Work::Footer(_) => 0,
                Work::Unit(path, start) => state
                    .files
                    .get(path)
                    .and_then(|e| e.units.get(start))
                    .map_or(0, |u| u.range.end - u.range.start),
            };
            if bytes > self.config.max_bytes {
                // Larger than any budget this scan can have: its reader reads it.
                state.queue.remove(&key);
                continue;
            }
            if bytes > 0 && !self.reserve(state, bytes) {
                return;
            }
            let work = state.queue.remove(&key);
            match work {
                Some(Work::Footer(path)) => self.launch_footer(state, path, runtime),
                Some(Work::Unit(path, start)) => {
                    self.launch_unit(state, &path, start, bytes, runtime);
                }
                None => {}
            }
        }
    }

    /// Reserves `bytes` for a download, within the scan's byte budget and the memory pool.
    fn reserve(&self, state: &mut State, bytes: u64) -> bool {
        state.controller.saw(bytes);
        let budget = state.controller.budget();
        let Some(reservation) = state.reservation.as_mut() else {
            return false;
        };
        let before = reservation.size() as u64;
        if before + bytes > budget {
            return false;
        }
        // With a memory limit, prefetching leaves at least half the pool to the query's
        // operators: its bytes cannot be taken back once an operator needs them.
        let over_half = match self.pool.memory_limit() {
            MemoryLimit::Finite(limit) => self.pool.reserved() as u64 + bytes > limit as u64 / 2,
            _ => false,
        };
        if over_half || reservation.try_grow(bytes as usize).is_err() {
            self.figures.denied();
            return false;
        }
        self.figures.reserved(before, before + bytes);
        true
    }

    fn release(&self, state: &mut State, bytes: u64) {
        if let Some(reservation) = state.reservation.as_mut() {
            let before = reservation.size() as u64;
            let bytes = bytes.min(before);
            reservation.shrink(bytes as usize);
            self.figures.reserved(before, before - bytes);
        }
    }

    fn spawn_task(
        self: &Arc<Self>,
        state: &mut State,
        runtime: &Handle,
        task: BoxFuture<'static, Option<Bytes>>,
    ) -> Download {
        state.next_task += 1;
        state.in_flight += 1;
        let id = state.next_task;
        let generation = state.generation;
        let scan = Arc::clone(self);
        let handle = runtime.spawn(async move {
            let result = task.await;
            scan.task_done(generation, id);
            result
        });
        state.tasks.insert(id, handle.abort_handle());
        self.figures.started(state.in_flight);
        handle.map(|r| r.ok().flatten()).boxed().shared()
    }

    fn task_done(self: &Arc<Self>, generation: u64, id: u64) {
        let mut state = self.lock();
        if state.generation != generation || state.tasks.remove(&id).is_none() {
            return;
        }
        state.in_flight -= 1;
        if let Ok(runtime) = Handle::try_current() {
            self.pump(&mut state, &runtime);
        }
    }

    fn launch_footer(self: &Arc<Self>, state: &mut State, path: Path, runtime: &Handle) {
        let Some(entry) = state.files.get(&path) else {
            return;
        };
        let meta = entry.meta.clone();
        let scan = Arc::clone(self);
        let generation = state.generation;
        let task = async move {
            let object = scan.object(&meta);
            let load = load_footer(
                Arc::clone(&scan.store),
                meta.clone(),
                scan.metadata_size_hint,
            );
            match scan.index.metadata(&object, load).await {
                Ok(metadata) => scan.queue_pieces(generation, &meta.location, &metadata),
                Err(_) => scan.figures.failed(),
            }
            None
        }
        .boxed();
        // Nothing waits on a footer load here: readers join it through the index cache.
        drop(self.spawn_task(state, runtime, task));
    }

    /// Queues the pieces of a file DataFusion will read, once its footer is known: by the
    /// footer prefetch or by the reader, whichever has it first, so the reader's first data
    /// request already finds them.
    fn queue_pieces(&self, generation: u64, path: &Path, metadata: &ParquetMetaData) {
        let mut state = self.lock();
        if state.generation == generation && state.running {
            self.queue_pieces_locked(&mut state, path, metadata);
        }
    }

    /// Works out and queues the pieces of `path` unless that was done, the file was fetched
    /// whole, or no reader will read it again.
    fn queue_pieces_locked(&self, state: &mut State, path: &Path, metadata: &ParquetMetaData) {
        let Some(entry) = state.files.get_mut(path) else {
            return;
        };
        if entry.pieces_queued || !entry.units.is_empty() || entry.done() {
            return;
        }
        entry.pieces_queued = true;
        let mut pieces: Vec<Range<u64>> = entry
            .splits
            .iter()
            .flat_map(|&i| {
                self.plan
                    .pieces(&self.plan.files[i], metadata, self.config.split_bytes)
            })
            .collect();
        pieces.sort_by_key(|p| p.start);
        let rank = entry.rank;
        let mut works = Vec::new();
        let mut last_end = 0;
        for range in pieces {
            if range.start < last_end
                || range.end > entry.meta.size
                || self.kept(&entry.meta, range.clone())
            {
                continue;
            }
            last_end = range.end;
            let start = range.start;
            entry.units.insert(start, Unit::queued(range, false));
            works.push(Work::Unit(path.clone(), start));
        }
        for work in works {
            let seq = state.next_seq;
            state.next_seq += 1;
            state.queue.insert((rank, seq), work);
        }
    }

    fn launch_unit(
        self: &Arc<Self>,
        state: &mut State,
        path: &Path,
        start: u64,
        reserved: u64,
        runtime: &Handle,
    ) -> Option<Download> {
        let entry = state.files.get(path)?;
        let unit = entry.units.get(&start)?;
        let (meta, range) = (self.known(&entry.meta), unit.range.clone());
        let scan = Arc::clone(self);
        let generation = state.generation;
        let task = async move {
            let began = Instant::now();
            let bytes = fetch(&scan.store, &meta, range.clone()).await;
            debug_assert_eq!(range.start, start);
            let guarded = meta.e_tag.as_deref().is_some_and(|e| !e.starts_with("W/"));
            if let (Some(ranges), Some((bytes, _)), true) = (&scan.ranges, &bytes, guarded) {
                // `fetch` read it under If-Match of this version's e_tag.
                ranges.insert(
                    &ObjectVersion::new(&scan.store_url, &meta),
                    start,
                    bytes.clone(),
                );
            }
            let ttfb = bytes.as_ref().map_or(began.elapsed(), |(_, t)| *t);
            scan.unit_arrived(generation, &meta.location, range, bytes.is_some(), ttfb);
            bytes.map(|(b, _)| b)
        }
        .boxed();
        let download = self.spawn_task(state, runtime, task);
        state.controller.started(reserved, Instant::now());
        let unit = state.files.get_mut(path)?.units.get_mut(&start)?;
        unit.download = Some(download.clone());
        unit.reserved = reserved;
        Some(download)
    }

    fn unit_arrived(
        &self,
        generation: u64,
        path: &Path,
        range: Range<u64>,
        ok: bool,
        ttfb: Duration,
    ) {
        let mut state = self.lock();
        if state.generation != generation {
            return;
        }
        let len = range.end - range.start;
        if ok {
            self.figures.fetched(len);
            state.controller.finished(len, ttfb, Instant::now());
        } else {
            self.figures.failed();
        }
        let Some(entry) = state.files.get_mut(path) else {
            return;
        };
        if ok {
            if let Some(unit) = entry.units.get_mut(&range.start) {
                unit.arrived = true;
            }
        } else if let Some(unit) = entry.units.remove(&range.start) {
            // Never keep a failed download: readers read these bytes themselves.
            self.release(&mut state, unit.reserved);
        }
    }

    /// Drops the units of a file no reader will read again.
    fn release_file(&self, state: &mut State, path: &Path) {
        let Some(entry) = state.files.get_mut(path) else {
            return;
        };
        let units = std::mem::take(&mut entry.units);
        let rank = entry.rank;
        for key in state.queued(rank) {
            state.queue.remove(&key);
        }
        for unit in units.into_values() {
            self.drop_unit(state, unit);
        }
    }

    fn drop_unit(&self, state: &mut State, unit: Unit) {
        if unit.arrived {
            let len = unit.range.end - unit.range.start;
            self.figures.wasted(len.saturating_sub(unit.served));
        }
        self.release(state, unit.reserved);
    }

    /// Ends the run `generation` if no reader has come back since: aborts every download,
    /// drops every buffer and frees the reservation.
    fn stop_if_idle(&self, generation: u64) {
        let mut state = self.lock();
        if state.generation != generation || state.leases > 0 || !state.running {
            return;
        }
        state.running = false;
        let tasks: Vec<AbortHandle> = state.tasks.drain().map(|(_, h)| h).collect();
        let cancelled = tasks.iter().filter(|t| !t.is_finished()).count();
        for task in tasks {
            task.abort();
        }
        self.figures.cancelled(cancelled);
        state.in_flight = 0;
        state.queue.clear();
        let paths: Vec<Path> = state.files.keys().cloned().collect();
        for path in paths {
            self.release_file(&mut state, &path);
        }
        if let Some(reservation) = state.reservation.take() {
            let before = reservation.size() as u64;
            reservation.free();
            self.figures.reserved(before, 0);
        }
        // A later run of the same plan starts afresh; old tasks that still finish see a
        // different generation.
        state.generation += 1;
    }
}

impl State {
    /// Queue keys of the work of the file ranked `rank`, in order.
    fn queued(&self, rank: i64) -> Vec<(i64, u64)> {
        self.queue
            .range((rank, 0)..(rank + 1, 0))
            .map(|(k, _)| *k)
            .collect()
    }
}

impl Unit {
    fn queued(range: Range<u64>, whole: bool) -> Self {
        Self {
            range,
            download: None,
            reserved: 0,
            served: 0,
            arrived: false,
            whole,
        }
    }
}

/// One ranged GET of `meta` at the version the plan saw, with its time to first byte.
/// `None` if it failed, came back short, or the object changed.
async fn fetch(
    store: &Arc<dyn ObjectStore>,
    meta: &ObjectMeta,
    range: Range<u64>,
) -> Option<(Bytes, Duration)> {
    let began = Instant::now();
    let strong_etag = meta.e_tag.clone().filter(|e| !e.starts_with("W/"));
    let options = GetOptions {
        range: Some(GetRange::Bounded(range.clone())),
        if_match: strong_etag.clone(),
        ..GetOptions::default()
    };
    let result = store.get_opts(&meta.location, options).await.ok()?;
    let ttfb = began.elapsed();
    if strong_etag.is_some() && result.meta.e_tag.is_some() && result.meta.e_tag != strong_etag {
        return None;
    }
    let bytes = result.bytes().await.ok()?;
    (bytes.len() as u64 == range.end - range.start).then_some((bytes, ttfb))
}

/// What a reader holds while a file is open: its way to the scan's prefetched bytes.
#[derive(Debug)]
pub struct FileLease {
    scan: Arc<Scan>,
    path: Path,
    generation: u64,
    runtime: Handle,
}

/// Prefetched bytes for one requested range: pieces of downloads, in order.
type Parts = Vec<(Download, Range<usize>)>;

impl FileLease {
    /// The bytes of `range` if prefetching covers it (already here, under way, or queued and
    /// started now); `None` if the reader should read them itself.
    pub async fn read(&self, range: Range<u64>) -> Option<Bytes> {
        let parts = self.cover(&range)?;
        let began = Instant::now();
        let mut pieces = Vec::with_capacity(parts.len());
        for (download, slice) in parts {
            let waiting = download.peek().is_none();
            let bytes = download.await?;
            if waiting {
                self.scan.figures.waited(began.elapsed());
            }
            pieces.push(bytes.slice(slice));
        }
        let bytes = match pieces.len() {
            1 => pieces.pop()?,
            _ => {
                let mut joined = Vec::with_capacity((range.end - range.start) as usize);
                for piece in &pieces {
                    joined.extend_from_slice(piece);
                }
                Bytes::from(joined)
            }
        };
        self.scan.figures.used(bytes.len() as u64);
        Some(bytes)
    }

    /// Tells the scan the file's footer, so the pieces DataFusion is about to read are known
    /// before it asks for them.
    pub fn footer_known(&self, metadata: &ParquetMetaData) {
        self.scan
            .queue_pieces(self.generation, &self.path, metadata);
        let mut state = self.scan.lock();
        self.scan.pump(&mut state, &self.runtime);
    }

    /// The downloads covering `range`, starting any that are still queued.
    fn cover(&self, range: &Range<u64>) -> Option<Parts> {
        let scan = &self.scan;
        let mut state = scan.lock();
        if state.generation != self.generation || !state.running || range.start >= range.end {
            return None;
        }
        let entry = state.files.get(&self.path)?;
        // The units that overlap the range, in order, must cover it without a gap.
        let mut covering = Vec::new();
        let mut at = range.start;
        let first = entry
            .units
            .range(..=range.start)
            .next_back()
            .map(|(s, _)| *s)?;
        for (&start, unit) in entry.units.range(first..) {
            if at >= range.end {
                break;
            }
            if start > at || unit.range.end <= at {
                return None;
            }
            covering.push(start);
            at = unit.range.end;
        }
        if at < range.end {
            return None;
        }
        let mut parts = Vec::with_capacity(covering.len());
        for start in covering {
            let unit = state.files.get(&self.path)?.units.get(&start)?;
            let download = match &unit.download {
                Some(d) => d.clone(),
                None => {
                    // A reader wants it now: start it ahead of the queue if the budget allows,
                    // else the reader reads it itself.
                    let bytes = unit.range.end - unit.range.start;
                    let rank = state.files.get(&self.path)?.rank;
                    let key = state.queued(rank).into_iter().find(|k| {
                        matches!(&state.queue[k], Work::Unit(p, s) if *p == self.path && *s == start)
                    });
                    if let Some(key) = key {
                        state.queue.remove(&key);
                    }
                    if !scan.reserve(&mut state, bytes) {
                        // The reader reads these bytes now; fetching them later would waste.
                        state.files.get_mut(&self.path)?.units.remove(&start);
                        return None;
                    }
                    scan.launch_unit(&mut state, &self.path, start, bytes, &self.runtime)?
                }
            };
            let unit = state.files.get_mut(&self.path)?.units.get_mut(&start)?;
            let lo = range.start.max(unit.range.start);
            let hi = range.end.min(unit.range.end);
            unit.served += hi - lo;
            let offset = unit.range.start;
            let read_through = !unit.whole && unit.served >= unit.range.end - unit.range.start;
            parts.push((download, (lo - offset) as usize..(hi - offset) as usize));
            if read_through {
                // Every byte of this piece has been handed out: its buffer is the reader's now.
                if let Some(unit) = state
                    .files
                    .get_mut(&self.path)
                    .and_then(|e| e.units.remove(&start))
                {
                    scan.release(&mut state, unit.reserved);
                }
            }
        }
        Some(parts)
    }
}

impl Drop for FileLease {
    fn drop(&mut self) {
        let scan = &self.scan;
        let mut state = scan.lock();
        if state.generation != self.generation {
            return;
        }
        let done = match state.files.get_mut(&self.path) {
            Some(entry) => {
                entry.leases = entry.leases.saturating_sub(1);
                entry.done()
            }
            None => false,
        };
        if done {
            scan.release_file(&mut state, &self.path);
        }
        state.leases = state.leases.saturating_sub(1);
        if state.leases == 0 {
            let generation = state.generation;
            let scan = Arc::clone(scan);
            drop(state);
            self.runtime.spawn(async move {
                tokio::time::sleep(GRACE).await;
                scan.stop_if_idle(generation);
            });
        } else {
            scan.pump(&mut state, &self.runtime);
        }
    }
}
