//! Prefetch figures: process-wide counters for `lakecache_stats()`, and each scan's own in
//! `EXPLAIN ANALYZE`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use datafusion::physical_plan::metrics::{
    Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};

/// A point-in-time snapshot of the prefetch figures of every scan so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefetchStats {
    /// Scans that started prefetching.
    pub scans: u64,
    /// Range downloads started.
    pub requests: u64,
    /// Bytes downloaded ahead of the reader.
    pub bytes_fetched: u64,
    /// Prefetched bytes handed to a reader.
    pub bytes_used: u64,
    /// Downloaded bytes dropped without ever being read.
    pub bytes_wasted: u64,
    /// Downloads aborted because their query ended.
    pub cancelled: u64,
    /// Downloads that failed; the reader then read those bytes itself.
    pub failed: u64,
    /// Downloads not started because the session's memory pool refused the reservation.
    pub memory_denied: u64,
    /// Time readers spent waiting for a download already under way, in milliseconds.
    pub wait_ms: u64,
    /// Most downloads one scan had in flight at once.
    pub peak_in_flight: u64,
    /// Bytes reserved by all scans now.
    pub reserved_bytes: u64,
    /// Most bytes one scan held reserved at once.
    pub peak_reserved_bytes: u64,
}

/// Live counters behind [`PrefetchStats`], shared by every scan of a `LakeCache`.
#[derive(Debug, Default)]
pub(crate) struct PrefetchCounters {
    scans: AtomicU64,
    requests: AtomicU64,
    bytes_fetched: AtomicU64,
    bytes_used: AtomicU64,
    bytes_wasted: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    memory_denied: AtomicU64,
    wait_nanos: AtomicU64,
    peak_in_flight: AtomicU64,
    reserved_bytes: AtomicU64,
    peak_reserved_bytes: AtomicU64,
}

impl PrefetchCounters {
    pub(crate) fn snapshot(&self) -> PrefetchStats {
        PrefetchStats {
            scans: self.scans.load(Relaxed),
            requests: self.requests.load(Relaxed),
            bytes_fetched: self.bytes_fetched.load(Relaxed),
            bytes_used: self.bytes_used.load(Relaxed),
            bytes_wasted: self.bytes_wasted.load(Relaxed),
            cancelled: self.cancelled.load(Relaxed),
            failed: self.failed.load(Relaxed),
            memory_denied: self.memory_denied.load(Relaxed),
            wait_ms: self.wait_nanos.load(Relaxed) / 1_000_000,
            peak_in_flight: self.peak_in_flight.load(Relaxed),
            reserved_bytes: self.reserved_bytes.load(Relaxed),
            peak_reserved_bytes: self.peak_reserved_bytes.load(Relaxed),
        }
    }
}

/// One scan's figures as `EXPLAIN ANALYZE` shows them on its `DataSourceExec`.
#[derive(Debug)]
struct ScanMetrics {
    requests: Count,
    fetched: Count,
    used: Count,
    wasted: Count,
    cancelled: Count,
    failed: Count,
    denied: Count,
    wait: Time,
    peak_in_flight: Gauge,
    peak_bytes: Gauge,
}

/// Where a scan reports: the process-wide counters and, once the plan's metrics are known,
/// its own.
#[derive(Debug)]
pub(crate) struct Figures {
    global: std::sync::Arc<PrefetchCounters>,
    scan: OnceLock<ScanMetrics>,
}

impl Figures {
    pub fn new(global: std::sync::Arc<PrefetchCounters>) -> Self {
        Self {
            global,
            scan: OnceLock::new(),
        }
    }

    /// Registers this scan's metrics in the plan's metrics set (once).
    pub fn register(&self, metrics: &ExecutionPlanMetricsSet) {
        self.scan.get_or_init(|| {
            let m = || MetricBuilder::new(metrics);
            ScanMetrics {
                requests: m().global_counter("prefetch_requests"),
                fetched: m().global_counter("prefetch_bytes"),
                used: m().global_counter("prefetch_bytes_used"),
                wasted: m().global_counter("prefetch_bytes_wasted"),
                cancelled: m().global_counter("prefetch_cancelled"),
                failed: m().global_counter("prefetch_failed"),
                denied: m().global_counter("prefetch_memory_denied"),
                wait: m().subset_time("prefetch_wait_time", 0),
                peak_in_flight: m().global_gauge("prefetch_peak_in_flight"),
                peak_bytes: m().global_gauge("prefetch_peak_bytes"),
            }
        });
    }

    pub fn scan_started(&self) {
        self.global.scans.fetch_add(1, Relaxed);
    }

    pub fn started(&self, in_flight: usize) {
        self.global.requests.fetch_add(1, Relaxed);
        self.global
            .peak_in_flight
            .fetch_max(in_flight as u64, Relaxed);
        if let Some(s) = self.scan.get() {
            s.requests.add(1);
            s.peak_in_flight.set_max(in_flight);
        }
    }

    pub fn fetched(&self, bytes: u64) {
        self.global.bytes_fetched.fetch_add(bytes, Relaxed);
        self.scan.get().inspect(|s| s.fetched.add(bytes as usize));
    }

    pub fn used(&self, bytes: u64) {
        self.global.bytes_used.fetch_add(bytes, Relaxed);
        self.scan.get().inspect(|s| s.used.add(bytes as usize));
    }

    pub fn wasted(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.global.bytes_wasted.fetch_add(bytes, Relaxed);
        self.scan.get().inspect(|s| s.wasted.add(bytes as usize));
    }

    pub fn cancelled(&self, requests: usize) {
        self.global.cancelled.fetch_add(requests as u64, Relaxed);
        self.scan.get().inspect(|s| s.cancelled.add(requests));
    }

    pub fn failed(&self) {
        self.global.failed.fetch_add(1, Relaxed);
        self.scan.get().inspect(|s| s.failed.add(1));
    }

    pub fn denied(&self) {
        self.global.memory_denied.fetch_add(1, Relaxed);
        self.scan.get().inspect(|s| s.denied.add(1));
    }

    pub fn waited(&self, time: Duration) {
        self.global
            .wait_nanos
            .fetch_add(time.as_nanos() as u64, Relaxed);
        self.scan.get().inspect(|s| s.wait.add_duration(time));
    }

    /// The scan's reservation grew from `before` to `after` bytes.
    pub fn reserved(&self, before: u64, after: u64) {
        if after >= before {
            self.global
                .reserved_bytes
                .fetch_add(after - before, Relaxed);
        } else {
            self.global
                .reserved_bytes
                .fetch_sub(before - after, Relaxed);
        }
        self.global.peak_reserved_bytes.fetch_max(after, Relaxed);
        self.scan
            .get()
            .inspect(|s| s.peak_bytes.set_max(after as usize));
    }
}
