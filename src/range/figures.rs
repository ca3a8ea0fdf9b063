//! Where the bytes of reads came from: counted for the whole [`RangeCache`](super::RangeCache)
//! and, for reads made inside [`ScanReads::scope`], for one scan too.
//!
//! The range cache sits in the object-store wrapper, below DataFusion's Parquet reader, so it
//! cannot be handed the scan a read belongs to. A scan's readers instead run their reads in a
//! task-local scope (reads are polled in the reader's own task), and the wrapper adds what it
//! served to the scope it finds, if any.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};

/// Where bytes of a read came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The memory tier.
    Memory,
    /// The disk tier.
    Disk,
    /// The object store (a request was made).
    Store,
}

tokio::task_local! {
    static SCAN: ScanReads;
}

/// One scan's read figures, as `EXPLAIN ANALYZE` shows them on its `DataSourceExec`:
/// `bytes_from_memory`, `bytes_from_disk` and `bytes_from_store`.
#[derive(Debug, Clone)]
pub struct ScanReads {
    memory: Count,
    disk: Count,
    store: Count,
}

impl ScanReads {
    /// Registers the figures in a scan's metrics set.
    pub fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        let m = || MetricBuilder::new(metrics);
        Self {
            memory: m().global_counter("bytes_from_memory"),
            disk: m().global_counter("bytes_from_disk"),
            store: m().global_counter("bytes_from_store"),
        }
    }

    /// Runs `read`, counting the bytes the object-store wrapper serves it in these figures.
    pub async fn scope<F: Future>(&self, read: F) -> F::Output {
        SCAN.scope(self.clone(), read).await
    }

    fn add(&self, source: Source, bytes: u64) {
        let count = match source {
            Source::Memory => &self.memory,
            Source::Disk => &self.disk,
            Source::Store => &self.store,
        };
        count.add(bytes as usize);
    }
}

/// Counts `bytes` served from `source` in the current scan's figures, if the read runs in one.
pub(crate) fn record_scan(source: Source, bytes: u64) {
    let _ = SCAN.try_with(|scan| scan.add(source, bytes));
}

/// The cache-wide counters of bytes served, by source.
#[derive(Debug, Default)]
pub(crate) struct Served {
    pub(crate) memory: AtomicU64,
    pub(crate) disk: AtomicU64,
    pub(crate) store: AtomicU64,
}

impl Served {
    pub(crate) fn add(&self, source: Source, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let counter = match source {
            Source::Memory => &self.memory,
            Source::Disk => &self.disk,
            Source::Store => &self.store,
        };
        counter.fetch_add(bytes, Relaxed);
        record_scan(source, bytes);
    }
}
