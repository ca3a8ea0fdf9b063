//! What a scan fetches next: its files in the order its readers will open them, each file's
//! pieces once its footer is known, and the queue of work waiting for a download slot.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;

use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use object_store::path::Path;
use parquet::file::metadata::ParquetMetaData;
use tokio::task::AbortHandle;

use super::controller::Controller;
use super::plan::BloomSpan;
use super::{Download, Scan};
use crate::config::PrefetchConfig;
use crate::index::IndexCache;
use crate::object::ObjectVersion;

/// A piece of work waiting for a download slot.
#[derive(Debug, Clone)]
pub(super) enum Work {
    /// Load the footer (with page index) of a large file into the index cache.
    Footer(Path),
    /// Load the bloom filters the readers of a file consult before its data (one request
    /// for them all, coalesced), into the index cache: its data pieces follow once they are
    /// known, pruned by them.
    Blooms(Path),
    /// Download the unit of `Path` that starts at this offset.
    Unit(Path, u64),
}

/// Bytes of one file the scan downloads (or will) ahead of its reader.
#[derive(Debug)]
pub(super) struct Unit {
    pub range: Range<u64>,
    /// `None` while queued.
    pub download: Option<Download>,
    pub reserved: u64,
    /// Bytes of this unit handed to readers so far.
    pub served: u64,
    /// Whether the download completed with the bytes.
    pub arrived: bool,
    /// A whole small file, which footer, index and data reads all come back to: kept until
    /// the file is closed rather than once every byte was read.
    pub whole: bool,
    /// Started ahead of any reader asking for it: counted in [`State::ahead`] until one does.
    pub speculative: bool,
}

impl Unit {
    /// Notes that a reader asked for this unit (or that it is dropped): the bytes that stop
    /// counting as ahead of the readers.
    pub fn claim(&mut self) -> u64 {
        match std::mem::take(&mut self.speculative) {
            true => self.range.end - self.range.start,
            false => 0,
        }
    }

    fn queued(range: Range<u64>, whole: bool) -> Self {
        Self {
            range,
            download: None,
            reserved: 0,
            served: 0,
            arrived: false,
            whole,
            speculative: false,
        }
    }
}

#[derive(Debug)]
pub(super) struct FileEntry {
    /// The version the plan read this file at: every download is of it.
    pub version: ObjectVersion,
    /// Position in the work queue; lower goes first.
    pub rank: i64,
    /// Where the plan lists this file (more than once when split by byte range).
    pub splits: Vec<usize>,
    pub opens: usize,
    pub leases: usize,
    /// Whether its work has been queued.
    queued: bool,
    /// Whether the pieces of this (large) file have been worked out and queued.
    pieces_queued: bool,
    /// The bloom filters to load before the pieces, and the footer they are pruned with,
    /// while the load is queued or under way.
    pub blooms: Option<(Vec<BloomSpan>, Arc<ParquetMetaData>)>,
    /// Whether the bloom filters were loaded (or there were none to load).
    blooms_done: bool,
    /// Units by start offset, not overlapping.
    pub units: BTreeMap<u64, Unit>,
}

impl FileEntry {
    /// Whether every reader the plan expects has opened and closed this file.
    pub fn done(&self) -> bool {
        self.leases == 0 && self.opens >= self.splits.len()
    }
}

#[derive(Debug)]
pub(super) struct State {
    /// Bumped each time the scan starts (a plan may run more than once); work of an older
    /// run that finishes late is ignored.
    pub generation: u64,
    pub running: bool,
    pub leases: usize,
    /// Leases taken so far: a stop timer started when the leases fell to 0 ends the scan only
    /// if none was taken since (a count of 0 at the moment it fires is not a grace period
    /// without readers: another file may have opened and closed in between).
    pub leases_taken: u64,
    pub controller: Controller,
    pub reservation: Option<MemoryReservation>,
    pub queue: BTreeMap<(i64, u64), Work>,
    next_seq: u64,
    next_front: i64,
    /// Position in the plan's file order of the next file to queue work for.
    cursor: usize,
    pub files: HashMap<Path, FileEntry>,
    pub in_flight: usize,
    pub tasks: HashMap<u64, AbortHandle>,
    pub next_task: u64,
    /// Bytes readers asked for beyond each open file's first data read: what the scan has
    /// shown it reads. A scan that may stop early fetches ahead at most this much.
    pub proven: u64,
    /// Bytes of downloads started before any reader asked for them, not yet asked for.
    pub ahead: u64,
}

impl State {
    pub fn new(config: &PrefetchConfig) -> Self {
        Self {
            generation: 0,
            running: false,
            leases: 0,
            leases_taken: 0,
            controller: Controller::new(config, None),
            reservation: None,
            queue: BTreeMap::new(),
            next_seq: 0,
            next_front: 0,
            cursor: 0,
            files: HashMap::new(),
            in_flight: 0,
            tasks: HashMap::new(),
            next_task: 0,
            proven: 0,
            ahead: 0,
        }
    }

    /// Queue keys of the work of the file ranked `rank`, in order.
    pub fn queued(&self, rank: i64) -> Vec<(i64, u64)> {
        self.queue
            .range((rank, 0)..(rank + 1, 0))
            .map(|(k, _)| *k)
            .collect()
    }

    /// Whether a scan that may stop early may start `bytes` more ahead of its readers.
    pub fn may_guess(&self, bytes: u64) -> bool {
        self.ahead.saturating_add(bytes) <= self.proven
    }

    /// Notes that a reader asked for `unit` (or that it is dropped): it is no longer ahead.
    pub fn claimed(&mut self, unit: &mut Unit) {
        self.ahead = self.ahead.saturating_sub(unit.claim());
    }

    fn push(&mut self, rank: i64, work: Work) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.queue.insert((rank, seq), work);
    }
}

impl Scan {
    pub(super) fn start(&self, state: &mut State) {
        state.generation += 1;
        state.running = true;
        state.controller = Controller::new(&self.config, self.reads.link());
        state.reservation = Some(MemoryConsumer::new("lakecache prefetch").register(&self.pool));
        state.files.clear();
        state.queue.clear();
        state.next_front = 0;
        for (position, file) in self.plan.files.iter().enumerate() {
            let entry = state
                .files
                .entry(file.meta.location.clone())
                .or_insert_with(|| FileEntry {
                    version: self.reads.version_of(&file.meta, None),
                    rank: position as i64 + 1,
                    splits: Vec::new(),
                    opens: 0,
                    leases: 0,
                    queued: false,
                    pieces_queued: false,
                    blooms: None,
                    blooms_done: false,
                    units: BTreeMap::new(),
                });
            entry.splits.push(position);
        }
        state.cursor = 0;
        state.proven = 0;
        state.ahead = 0;
        self.figures.scan_started();
    }

    /// Queues the work of the next files in the scan's order until there is enough to keep
    /// every allowed download busy twice over. Working out a file's pieces costs CPU (its
    /// row groups are pruned), so a scan of a hundred thousand files plans only what it
    /// will fetch soon. A scan the query may stop early looks past the files its readers
    /// opened only as far as they have shown they read: a limit is usually reached long
    /// before the last file.
    pub(super) fn fill_queue(&self, state: &mut State) {
        if self.plan.stops_early && !state.may_guess(1) {
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
        let version = entry.version.clone();
        let footer = self.index.cached_metadata(&version).or_else(|| {
            let planning = self.planning.as_ref()?;
            IndexCache::planned_footer(planning.as_ref(), &version, self.reads.identity())
        });
        if let Some(footer) = footer {
            self.queue_pieces_locked(state, path, &footer);
            return;
        }
        let work = if version.size() <= self.config.small_file_bytes {
            if self.reads.in_memory(&version, 0..version.size()) {
                // Readers find the whole file in memory.
                return;
            }
            entry.units.insert(0, Unit::queued(0..version.size(), true));
            Work::Unit(path.clone(), 0)
        } else {
            Work::Footer(path.clone())
        };
        let rank = entry.rank;
        state.push(rank, work);
    }

    /// Moves a file a reader just opened to the front of the queue.
    pub(super) fn put_first(&self, state: &mut State, path: &Path) {
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

    /// Queues the pieces of a file DataFusion will read, once its footer is known: by the
    /// footer prefetch or by the reader, whichever has it first, so the reader's first data
    /// request already finds them.
    pub(super) fn queue_pieces(
        &self,
        generation: u64,
        path: &Path,
        metadata: &Arc<ParquetMetaData>,
    ) {
        let mut state = self.lock();
        if state.generation == generation && state.running {
            self.queue_pieces_locked(&mut state, path, metadata);
        }
    }

    /// Works out and queues the pieces of `path` unless that was done, the file was fetched
    /// whole, or no reader will read it again. If its readers consult bloom filters the
    /// caches do not hold yet, those are queued first, and the pieces once they are loaded.
    pub(super) fn queue_pieces_locked(
        &self,
        state: &mut State,
        path: &Path,
        metadata: &Arc<ParquetMetaData>,
    ) {
        let Some(entry) = state.files.get_mut(path) else {
            return;
        };
        if entry.pieces_queued || entry.blooms.is_some() || !entry.units.is_empty() || entry.done()
        {
            return;
        }
        let version = self.reads.completed(&entry.version);
        if !entry.blooms_done {
            entry.blooms_done = true;
            let mut spans: Vec<BloomSpan> = entry
                .splits
                .iter()
                .flat_map(|&i| self.plan.bloom_spans(&self.plan.files[i], metadata))
                .filter(|s| {
                    let held = self.index.cached_bloom(&version, s.row_group, s.column);
                    held.is_none()
                })
                .collect();
            spans.sort_by_key(|s| s.range.start);
            spans.dedup();
            if !spans.is_empty() {
                entry.blooms = Some((spans, Arc::clone(metadata)));
                let rank = entry.rank;
                state.push(rank, Work::Blooms(path.clone()));
                return;
            }
        }
        entry.pieces_queued = true;
        let blooms = |rg: usize, col: usize| self.index.cached_bloom(&version, rg, col).flatten();
        let mut pieces: Vec<Range<u64>> = entry
            .splits
            .iter()
            .flat_map(|&i| {
                self.plan.pieces(
                    &self.plan.files[i],
                    metadata,
                    self.config.split_bytes,
                    &blooms,
                )
            })
            .collect();
        pieces.sort_by_key(|p| p.start);
        let rank = entry.rank;
        let mut works = Vec::new();
        let mut last_end = 0;
        for range in pieces {
            if range.start < last_end
                || range.end > entry.version.size()
                || self.reads.in_memory(&entry.version, range.clone())
            {
                continue;
            }
            last_end = range.end;
            let start = range.start;
            entry.units.insert(start, Unit::queued(range, false));
            works.push(Work::Unit(path.clone(), start));
        }
        for work in works {
            state.push(rank, work);
        }
    }

    /// Drops the units of a file no reader will read again.
    pub(super) fn release_file(&self, state: &mut State, path: &Path) {
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

    fn drop_unit(&self, state: &mut State, mut unit: Unit) {
        state.claimed(&mut unit);
        if unit.arrived {
            let len = unit.range.end - unit.range.start;
            self.figures.wasted(len.saturating_sub(unit.served));
        }
        self.release(state, unit.reserved);
    }

    /// Ends the run `generation` if no reader has come back since its leases fell to 0 with
    /// `leases_taken` taken: aborts every download, drops every buffer and frees the
    /// reservation.
    pub(super) fn stop_if_idle(&self, generation: u64, leases_taken: u64) {
        let mut state = self.lock();
        if state.generation != generation
            || state.leases > 0
            || state.leases_taken != leases_taken
            || !state.running
        {
            return;
        }
        state.running = false;
        let tasks: Vec<AbortHandle> = state.tasks.drain().map(|(_, h)| h).collect();
        let cancelled = tasks.iter().filter(|t| !t.is_finished()).count();
        for task in &tasks {
            task.abort();
        }
        self.figures.cancelled(cancelled);
        self.figures.ended(tasks.len());
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
