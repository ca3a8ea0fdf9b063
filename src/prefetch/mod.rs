//! [`Prefetcher`]: keeps a scan's downloads in flight ahead of its readers, so the link stays
//! full instead of waiting one round trip per file and per row group.
//!
//! DataFusion 55 keeps one request in flight per partition. A scan's [`Prefetcher`] knows the
//! scan's files from its final plan ([`ScanPlan`]) and, from the first file a reader opens,
//! downloads ahead of the readers:
//! - a file whose footer is cached: the column chunks, or with a row selection the pages,
//!   the scan will read (its projection and DataFusion's row-group, limit and page pruning
//!   applied), in file order, nearby ones merged and long ones split into parallel requests
//!   of `split_bytes`;
//! - a small file (up to `small_file_bytes`) whose footer is not cached: the whole file in one
//!   request, so footer, page index, bloom filters and data come from those bytes;
//! - a larger file whose footer is not cached: the footer into the index cache, then its
//!   chunks as above.
//!
//! A scan the query may stop early (a limit above it) fetches on a guess only as far as its
//! readers have shown they read ([`ScanPlan::stops_early`]); the rest it fetches as they ask.
//!
//! Every download is a versioned read (`crate::store`) of the version the scan planned with,
//! so it is guarded, checked and kept in the range cache like any read; ranges the range
//! cache already holds are not downloaded at all.
//!
//! The pieces: `queue.rs` (what to fetch next, per file), `download.rs` (starting downloads
//! and taking them back), `budget.rs` (the byte budget and the memory pool), `lease.rs` (what
//! a reader holds while a file is open), `controller.rs` (how many downloads), `plan.rs`
//! (what the scan will read) and `figures.rs`.
//!
//! Readers hold a [`FileLease`] while a file is open. When the last lease of a scan is gone
//! for longer than a short grace period (DataFusion opens the next file right after closing
//! one), the scan is over: every download is aborted and its memory released.
//!
//! A prefetch is only ever a guess: a download that fails, is cancelled or was never made
//! leaves the reader to read those bytes itself.

mod budget;
mod controller;
mod download;
mod figures;
mod footers;
mod lease;
pub(crate) mod plan;
mod queue;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use datafusion::execution::cache::cache_manager::FileMetadataCache;
use datafusion::execution::memory_pool::MemoryPool;
use futures::future::{BoxFuture, Shared};
use tokio::runtime::Handle;

use crate::config::PrefetchConfig;
use crate::index::IndexCache;
use crate::metrics::ScanMetrics;
use crate::object::ObjectVersion;
use crate::store::StoreReads;
use figures::Figures;
pub(crate) use figures::PrefetchCounters;
pub(crate) use footers::FooterWarmup;
pub(crate) use lease::FileLease;
pub(crate) use plan::ScanPlan;
use queue::State;

/// How long a scan with no open file waits before it counts as over. DataFusion opens the
/// next file in the same poll that closes the last one, so this only has to outlast that,
/// and keeps cancellation well within 100 ms.
const GRACE: Duration = Duration::from_millis(30);

/// What a download brought: its bytes and the version they are of.
#[derive(Debug, Clone)]
struct Landed {
    /// The version the scan planned with or, for a version known by size and time alone, the
    /// one its response showed (`StoreReads::read_shown`). A reader is handed the bytes only
    /// if this is the version it reads at.
    version: ObjectVersion,
    bytes: Bytes,
}

/// One download, shared by the readers that wait for it; `None` if it failed or was
/// cancelled (or loaded a footer or bloom filters into the index cache, where readers find
/// them).
type Download = Shared<BoxFuture<'static, Option<Landed>>>;

/// What a scan's prefetcher works with, besides its plan.
#[derive(Debug)]
pub(crate) struct ScanInputs {
    /// The versioned reads of the scan's store.
    pub reads: StoreReads,
    /// Where footers are found and loaded.
    pub index: IndexCache,
    /// The session's own footer cache, which DataFusion's planning filled.
    pub planning: Option<Arc<FileMetadataCache>>,
    /// The session's memory pool, where every buffered or in-flight byte is reserved.
    pub pool: Arc<dyn MemoryPool>,
    /// The process-wide prefetch figures.
    pub counters: Arc<PrefetchCounters>,
    /// The session's prefetch settings.
    pub settings: PrefetchConfig,
    /// DataFusion's `metadata_size_hint`, for footer loads.
    pub metadata_size_hint: Option<usize>,
}

/// The prefetching state of one scan (one `DataSourceExec`). Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Prefetcher {
    shared: Arc<Scan>,
}

#[derive(Debug)]
struct Scan {
    reads: StoreReads,
    index: IndexCache,
    planning: Option<Arc<FileMetadataCache>>,
    plan: ScanPlan,
    config: PrefetchConfig,
    metadata_size_hint: Option<usize>,
    pool: Arc<dyn MemoryPool>,
    figures: Figures,
    state: Mutex<State>,
}

impl Prefetcher {
    /// A prefetcher for the scan `plan`. Returns `None` when prefetching is off or the scan
    /// has nothing to prefetch.
    pub(crate) fn try_new(plan: ScanPlan, inputs: ScanInputs) -> Option<Self> {
        if !inputs.settings.enabled || plan.files.is_empty() {
            return None;
        }
        let state = State::new(&inputs.settings);
        Some(Self {
            shared: Arc::new(Scan {
                reads: inputs.reads,
                index: inputs.index,
                planning: inputs.planning,
                plan,
                config: inputs.settings,
                metadata_size_hint: inputs.metadata_size_hint,
                pool: inputs.pool,
                figures: Figures::new(inputs.counters),
                state: Mutex::new(state),
            }),
        })
    }

    /// Called as a reader opens `version`: starts the scan's prefetching if this is its first
    /// file, puts this file's work first, and returns the lease through which the reader gets
    /// prefetched bytes. `None` outside a Tokio runtime, or for a file the plan does not list
    /// at this version.
    pub(crate) fn open(&self, version: &ObjectVersion, metrics: &ScanMetrics) -> Option<FileLease> {
        let runtime = Handle::try_current().ok()?;
        let scan = &self.shared;
        scan.figures.register(metrics);
        let mut state = scan.lock();
        if !state.running {
            scan.start(&mut state);
        }
        let entry = state.files.get_mut(version.path())?;
        if !scan.reads.same_version(&entry.version, version) {
            return None;
        }
        // The reader may know the version better (an e_tag learned since the scan began):
        // downloads from now on are guarded by it.
        entry.version = scan.reads.completed(&entry.version);
        entry.opens += 1;
        entry.leases += 1;
        state.leases += 1;
        state.leases_taken += 1;
        scan.put_first(&mut state, version.path());
        scan.pump(&mut state, &runtime);
        let generation = state.generation;
        drop(state);
        Some(FileLease::new(
            Arc::clone(scan),
            version.path().clone(),
            generation,
            runtime,
        ))
    }
}

impl Scan {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave the bookkeeping half-updated in a way that matters
        // more than losing prefetches, so a poisoned lock is used as is.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}
