//! One query's cache figures, as `EXPLAIN ANALYZE` shows them on each Parquet scan: handle
//! cache lookups made by the scan's reads, and where the bytes it read came from (the range
//! cache's memory and disk tiers, or the store).
//!
//! The caches sit in the object-store wrapper, below DataFusion's Parquet reader, so they
//! cannot be handed the scan a read belongs to. A scan's readers instead run their reads in a
//! task-local scope ([`ScanFigures::scope`]; reads are polled in the reader's own task), and
//! the wrapper adds what it did to the scope it finds, if any. Listing happens while the
//! query is planned, outside any scan, and shows in `lakecache_stats()` only.

use std::future::Future;

use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};

/// Where bytes of a read came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The range cache's memory tier.
    Memory,
    /// The range cache's disk tier.
    Disk,
    /// The object store (a request was made).
    Store,
}

tokio::task_local! {
    static SCAN: ScanFigures;
}

/// One scan's figures: `handle_hits`, `handle_misses`, `bytes_from_memory`,
/// `bytes_from_disk` and `bytes_from_store` on its `DataSourceExec`.
#[derive(Debug, Clone)]
pub struct ScanFigures {
    handle_hits: Count,
    handle_misses: Count,
    memory: Count,
    disk: Count,
    store: Count,
}

impl ScanFigures {
    /// Registers the figures in a scan's metrics set.
    pub fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        let m = || MetricBuilder::new(metrics);
        Self {
            handle_hits: m().global_counter("handle_hits"),
            handle_misses: m().global_counter("handle_misses"),
            memory: m().global_counter("bytes_from_memory"),
            disk: m().global_counter("bytes_from_disk"),
            store: m().global_counter("bytes_from_store"),
        }
    }

    /// Runs `read`, counting what the object-store wrapper does for it in these figures.
    pub async fn scope<F: Future>(&self, read: F) -> F::Output {
        SCAN.scope(self.clone(), read).await
    }
}

/// Counts `bytes` served from `source` in the current scan's figures, if the read runs in one.
pub(crate) fn record_bytes(source: Source, bytes: u64) {
    let _ = SCAN.try_with(|scan| {
        let count = match source {
            Source::Memory => &scan.memory,
            Source::Disk => &scan.disk,
            Source::Store => &scan.store,
        };
        count.add(bytes as usize);
    });
}

/// Counts a handle-cache lookup (an object's metadata) in the current scan's figures.
pub(crate) fn record_handle_lookup(hit: bool) {
    let _ = SCAN.try_with(|scan| match hit {
        true => scan.handle_hits.add(1),
        false => scan.handle_misses.add(1),
    });
}
