//! Starting downloads while the controller and the budget allow, and taking them back as they
//! finish. Each download is a task of its own, aborted when the scan ends; each reads through
//! the versioned read at the version the scan planned with.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::path::Path;
use tokio::runtime::Handle;

use super::controller::Measured;
use super::queue::{State, Work};
use super::{Download, Landed, Scan};
use crate::index::footer::load_footer;

/// What a footer load fetched on a guess counts against a scan that may stop early: about a
/// footer and page index of a large file.
const FOOTER_GUESS: u64 = 64 << 10;

impl Scan {
    /// Starts queued work while the controller allows more downloads and the budget and the
    /// memory pool allow their bytes.
    pub(super) fn pump(self: &Arc<Self>, state: &mut State, runtime: &Handle) {
        while state.running && state.in_flight < state.controller.downloads() {
            self.fill_queue(state);
            let Some((&key, work)) = state.queue.first_key_value() else {
                return;
            };
            let bytes = match work {
                Work::Footer(_) | Work::Blooms(_) => 0,
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
            let guess = self.plan.stops_early && self.is_guess(state, work);
            if guess && !state.may_guess(bytes.max(FOOTER_GUESS)) {
                // The readers have not shown they read this far; they start it if they do.
                return;
            }
            if bytes > 0 && !self.reserve(state, bytes) {
                return;
            }
            match state.queue.remove(&key) {
                Some(Work::Footer(path)) => self.launch_footer(state, path, runtime),
                Some(Work::Blooms(path)) => self.launch_blooms(state, path, runtime),
                Some(Work::Unit(path, start)) => {
                    self.launch_unit(state, &path, start, bytes, runtime);
                    if let Some(unit) = state
                        .files
                        .get_mut(&path)
                        .and_then(|e| e.units.get_mut(&start))
                    {
                        // Ahead of the readers until one asks for it.
                        unit.speculative = true;
                        state.ahead += bytes;
                    }
                }
                None => {}
            }
        }
    }

    /// Whether `work` is fetched on a guess: anything but the first work of a file a reader
    /// has opened (its footer, or the whole file when small), which that reader surely reads.
    fn is_guess(&self, state: &State, work: &Work) -> bool {
        let (path, whole) = match work {
            // What the reader of an opened file reads first.
            Work::Footer(path) | Work::Blooms(path) => (path, true),
            Work::Unit(path, start) => {
                let entry = state.files.get(path);
                let whole = entry
                    .and_then(|e| e.units.get(start))
                    .is_some_and(|u| u.whole);
                (path, whole)
            }
        };
        !(whole && state.files.get(path).is_some_and(|e| e.opens > 0))
    }

    fn spawn_task(
        self: &Arc<Self>,
        state: &mut State,
        runtime: &Handle,
        task: BoxFuture<'static, Option<Landed>>,
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
        self.figures.ended(1);
        state.in_flight -= 1;
        if let Ok(runtime) = Handle::try_current() {
            self.pump(&mut state, &runtime);
        }
    }

    fn launch_footer(self: &Arc<Self>, state: &mut State, path: Path, runtime: &Handle) {
        let Some(entry) = state.files.get(&path) else {
            return;
        };
        let version = entry.version.clone();
        let scan = Arc::clone(self);
        let generation = state.generation;
        let task = async move {
            // Keyed as the readers key it: pinned to its e_tag (see `StoreReads::pinned`).
            let Ok(version) = scan.reads.pinned(&version).await else {
                scan.figures.failed();
                return None;
            };
            let (reads, v, hint) = (scan.reads.clone(), version.clone(), scan.metadata_size_hint);
            let load = async move {
                let read = |range: Range<u64>| {
                    let (reads, v) = (reads.clone(), v.clone());
                    async move { reads.read_one(&v, range, None).await }
                };
                load_footer(&v, hint, read).await
            };
            let identity = scan.reads.identity().clone();
            match scan.index.metadata(&version, &identity, load).await {
                Ok((metadata, _)) => scan.queue_pieces(generation, version.path(), &metadata),
                Err(_) => scan.figures.failed(),
            }
            None
        }
        .boxed();
        // Nothing waits on a footer load here: readers join it through the index cache.
        drop(self.spawn_task(state, runtime, task));
    }

    /// Loads the bloom filters a file's readers consult into the index cache, a request each,
    /// all at once (they sit after each row group's data: one coalesced read would fetch the
    /// data between them); then queues the file's pieces, pruned by them. A filter that
    /// failed to load leaves its row group unpruned (fetched in vain at worst) and the reader
    /// to read it itself.
    fn launch_blooms(self: &Arc<Self>, state: &mut State, path: Path, runtime: &Handle) {
        let Some(entry) = state.files.get(&path) else {
            return;
        };
        let Some((spans, footer)) = entry.blooms.clone() else {
            return;
        };
        let version = self.reads.completed(&entry.version);
        let scan = Arc::clone(self);
        let generation = state.generation;
        let task = async move {
            let reads = spans
                .iter()
                .map(|s| scan.reads.read_one(&version, s.range.clone(), None));
            let filters = futures::future::join_all(reads).await;
            for (span, filter) in spans.iter().zip(filters) {
                match filter {
                    Ok(filter) => {
                        let (rg, column) = (span.row_group, span.column);
                        scan.index.keep_bloom(&version, rg, column, &filter);
                    }
                    Err(_) => scan.figures.failed(),
                }
            }
            let mut state = scan.lock();
            if state.generation == generation && state.running {
                if let Some(entry) = state.files.get_mut(version.path()) {
                    entry.blooms = None;
                }
                scan.queue_pieces_locked(&mut state, version.path(), &footer);
            }
            None
        }
        .boxed();
        // Nothing waits on it here: readers find the filters in the index cache.
        drop(self.spawn_task(state, runtime, task));
    }

    pub(super) fn launch_unit(
        self: &Arc<Self>,
        state: &mut State,
        path: &Path,
        start: u64,
        reserved: u64,
        runtime: &Handle,
    ) -> Option<Download> {
        let entry = state.files.get(path)?;
        let unit = entry.units.get(&start)?;
        let (version, range) = (entry.version.clone(), unit.range.clone());
        let scan = Arc::clone(self);
        let generation = state.generation;
        let task = async move {
            let read = scan
                .reads
                .read_shown(&version, std::slice::from_ref(&range), None);
            let landed = match read.await {
                Ok((version, mut bytes)) => bytes.pop().map(|bytes| Landed { version, bytes }),
                Err(_) => None,
            };
            scan.unit_arrived(generation, version.path(), range, landed.is_some());
            landed
        }
        .boxed();
        let download = self.spawn_task(state, runtime, task);
        state.controller.started(reserved, Instant::now());
        let unit = state.files.get_mut(path)?.units.get_mut(&start)?;
        unit.download = Some(download.clone());
        unit.reserved = reserved;
        Some(download)
    }

    fn unit_arrived(&self, generation: u64, path: &Path, range: Range<u64>, ok: bool) {
        let mut state = self.lock();
        if state.generation != generation {
            return;
        }
        let len = range.end - range.start;
        if ok {
            self.figures.fetched(len);
            let latency = self.reads.typical_wait();
            match state.controller.finished(len, latency, Instant::now()) {
                Some(Measured::Full(link)) => self.reads.record_link(link),
                Some(Measured::AtLeast(link)) => self.reads.raise_link(link),
                None => {}
            }
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
        } else if let Some(mut unit) = entry.units.remove(&range.start) {
            // Never keep a failed download: readers read these bytes themselves.
            state.claimed(&mut unit);
            self.release(&mut state, unit.reserved);
        }
    }
}
