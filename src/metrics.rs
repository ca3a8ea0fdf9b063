//! One scan's figures, as `EXPLAIN ANALYZE` shows them on its `DataSourceExec`: what the
//! scan's readers found in the caches, where the bytes they read came from, and what its
//! prefetching did.
//!
//! One [`ScanMetrics`] per scan, registered in the scan's metrics set by the first reader it
//! opens and handed to everything that works for the scan: the readers, the versioned reads
//! they make, and the scan's prefetcher. Listing happens while the query is planned, outside
//! any scan, and shows in `lakecache_stats()` only.

use std::time::Duration;

use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};

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

/// Every per-scan figure. Cheap to clone: the counters are shared.
#[derive(Debug, Clone)]
pub struct ScanMetrics {
    /// Objects whose version a reader found in the handle cache.
    pub handle_hits: Count,
    /// Objects whose version the handle cache did not hold.
    pub handle_misses: Count,
    /// Footers (with page index) found in the index cache.
    pub footer_hits: Count,
    /// Footers fetched and decoded.
    pub footer_misses: Count,
    /// Bloom filters found in the index cache.
    pub bloom_hits: Count,
    /// Bloom filters fetched.
    pub bloom_misses: Count,
    /// Bytes readers read themselves (no prefetch covered them) from the range cache's memory.
    pub from_memory: Count,
    /// ... from the range cache's disk tier.
    pub from_disk: Count,
    /// ... from the store.
    pub from_store: Count,
    /// Range downloads the prefetcher started.
    pub prefetch_requests: Count,
    /// Bytes downloaded ahead of the readers.
    pub prefetch_bytes: Count,
    /// Prefetched bytes handed to readers.
    pub prefetch_used: Count,
    /// Prefetched bytes dropped unread.
    pub prefetch_wasted: Count,
    /// Downloads aborted because the scan ended.
    pub prefetch_cancelled: Count,
    /// Downloads that failed (the reader then read the bytes itself).
    pub prefetch_failed: Count,
    /// Downloads not started because the memory pool refused their bytes.
    pub prefetch_denied: Count,
    /// Time readers waited for a download already under way.
    pub prefetch_wait: Time,
    /// Most downloads in flight at once.
    pub prefetch_peak_in_flight: Gauge,
    /// Most bytes reserved at once.
    pub prefetch_peak_bytes: Gauge,
}

impl ScanMetrics {
    /// Registers the figures in a scan's metrics set.
    pub fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        let m = || MetricBuilder::new(metrics);
        Self {
            handle_hits: m().global_counter("handle_hits"),
            handle_misses: m().global_counter("handle_misses"),
            footer_hits: m().global_counter("index_footer_hits"),
            footer_misses: m().global_counter("index_footer_misses"),
            bloom_hits: m().global_counter("index_bloom_hits"),
            bloom_misses: m().global_counter("index_bloom_misses"),
            from_memory: m().global_counter("bytes_from_memory"),
            from_disk: m().global_counter("bytes_from_disk"),
            from_store: m().global_counter("bytes_from_store"),
            prefetch_requests: m().global_counter("prefetch_requests"),
            prefetch_bytes: m().global_counter("prefetch_bytes"),
            prefetch_used: m().global_counter("prefetch_bytes_used"),
            prefetch_wasted: m().global_counter("prefetch_bytes_wasted"),
            prefetch_cancelled: m().global_counter("prefetch_cancelled"),
            prefetch_failed: m().global_counter("prefetch_failed"),
            prefetch_denied: m().global_counter("prefetch_memory_denied"),
            prefetch_wait: m().subset_time("prefetch_wait_time", 0),
            prefetch_peak_in_flight: m().global_gauge("prefetch_peak_in_flight"),
            prefetch_peak_bytes: m().global_gauge("prefetch_peak_bytes"),
        }
    }

    /// Counts `bytes` a reader read from `source`.
    pub fn read_from(&self, source: Source, bytes: u64) {
        let count = match source {
            Source::Memory => &self.from_memory,
            Source::Disk => &self.from_disk,
            Source::Store => &self.from_store,
        };
        count.add(bytes as usize);
    }

    /// Counts a handle-cache lookup of an object's version.
    pub fn handle_lookup(&self, hit: bool) {
        match hit {
            true => self.handle_hits.add(1),
            false => self.handle_misses.add(1),
        }
    }

    /// Counts an index-cache lookup of a footer (`bloom` false) or a bloom filter.
    pub fn index_lookup(&self, bloom: bool, hit: bool) {
        let count = match (bloom, hit) {
            (false, true) => &self.footer_hits,
            (false, false) => &self.footer_misses,
            (true, true) => &self.bloom_hits,
            (true, false) => &self.bloom_misses,
        };
        count.add(1);
    }

    /// Adds time a reader waited for a prefetch.
    pub fn waited(&self, time: Duration) {
        self.prefetch_wait.add_duration(time);
    }
}
