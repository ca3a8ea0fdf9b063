//! Prefetch figures: process-wide counters for `lakecache_stats()`, and each scan's own in
//! its [`ScanMetrics`] (`EXPLAIN ANALYZE`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::metrics::ScanMetrics;
use crate::stats::PrefetchStats;

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
    in_flight: AtomicU64,
    reserved_bytes: AtomicU64,
    peak_reserved_bytes: AtomicU64,
    leases: AtomicU64,
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
            in_flight: self.in_flight.load(Relaxed),
            reserved_bytes: self.reserved_bytes.load(Relaxed),
            peak_reserved_bytes: self.peak_reserved_bytes.load(Relaxed),
            leases: self.leases.load(Relaxed),
        }
    }

    /// Bytes downloaded ahead of the readers so far.
    pub(crate) fn bytes_fetched(&self) -> u64 {
        self.bytes_fetched.load(Relaxed)
    }

    /// Bytes all scans hold reserved now.
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved_bytes.load(Relaxed)
    }
}

/// Where a scan reports: the process-wide counters and, once its first reader registered
/// them, the scan's own metrics.
#[derive(Debug)]
pub(crate) struct Figures {
    global: Arc<PrefetchCounters>,
    scan: OnceLock<ScanMetrics>,
}

impl Figures {
    pub fn new(global: Arc<PrefetchCounters>) -> Self {
        Self {
            global,
            scan: OnceLock::new(),
        }
    }

    pub fn global(&self) -> &PrefetchCounters {
        &self.global
    }

    /// Reports to `metrics` too, from now on (the first call wins).
    pub fn register(&self, metrics: &ScanMetrics) {
        let _ = self.scan.set(metrics.clone());
    }

    fn scan(&self) -> Option<&ScanMetrics> {
        self.scan.get()
    }

    pub fn scan_started(&self) {
        self.global.scans.fetch_add(1, Relaxed);
    }

    /// A download started; `in_flight` this scan has now.
    pub fn started(&self, in_flight: usize) {
        self.global.requests.fetch_add(1, Relaxed);
        self.global.in_flight.fetch_add(1, Relaxed);
        self.global
            .peak_in_flight
            .fetch_max(in_flight as u64, Relaxed);
        if let Some(s) = self.scan() {
            s.prefetch_requests.add(1);
            s.prefetch_peak_in_flight.set_max(in_flight);
        }
    }

    /// `n` downloads ended (finished, failed or aborted).
    pub fn ended(&self, n: usize) {
        self.global.in_flight.fetch_sub(n as u64, Relaxed);
    }

    pub fn fetched(&self, bytes: u64) {
        self.global.bytes_fetched.fetch_add(bytes, Relaxed);
        self.scan()
            .inspect(|s| s.prefetch_bytes.add(bytes as usize));
    }

    pub fn used(&self, bytes: u64) {
        self.global.bytes_used.fetch_add(bytes, Relaxed);
        self.scan().inspect(|s| s.prefetch_used.add(bytes as usize));
    }

    pub fn wasted(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.global.bytes_wasted.fetch_add(bytes, Relaxed);
        self.scan()
            .inspect(|s| s.prefetch_wasted.add(bytes as usize));
    }

    pub fn cancelled(&self, requests: usize) {
        self.global.cancelled.fetch_add(requests as u64, Relaxed);
        self.scan().inspect(|s| s.prefetch_cancelled.add(requests));
    }

    pub fn failed(&self) {
        self.global.failed.fetch_add(1, Relaxed);
        self.scan().inspect(|s| s.prefetch_failed.add(1));
    }

    pub fn denied(&self) {
        self.global.memory_denied.fetch_add(1, Relaxed);
        self.scan().inspect(|s| s.prefetch_denied.add(1));
    }

    pub fn waited(&self, time: Duration) {
        self.global
            .wait_nanos
            .fetch_add(time.as_nanos() as u64, Relaxed);
        self.scan().inspect(|s| s.waited(time));
    }

    pub fn leased(&self) {
        self.global.leases.fetch_add(1, Relaxed);
    }

    pub fn unleased(&self) {
        self.global.leases.fetch_sub(1, Relaxed);
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
        self.scan()
            .inspect(|s| s.prefetch_peak_bytes.set_max(after as usize));
    }
}
