//! The figures of [`LakeCache::stats`] published through the [`metrics`] facade (feature
//! `metrics`), so that whatever exporter a service installs (Prometheus, StatsD,
//! OpenTelemetry through a bridge) scrapes them with the service's own figures.
//!
//! Each row of `lakecache_metrics()` (a `cache`, a `metric`, a `value`) is published as
//! `lakecache_<metric>` with the label `cache`: the SQL
//!
//! ```sql
//! SELECT value FROM lakecache_metrics() WHERE cache = 'range.memory' AND metric = 'hits'
//! ```
//!
//! reads the figure a Prometheus exporter shows as `lakecache_hits{cache="range.memory"}`.
//! Running totals (hits, misses, bytes served, requests, ...) are counters; what the caches
//! hold now (`entries`, `bytes`, `capacity`, `in_flight`, ...) and the high-water marks
//! (`peak_in_flight`, `peak_reserved_bytes`) are gauges. Each name is described once, with
//! its unit, as the facade allows, so an exporter can print `# HELP` lines.
//!
//! # Exported when the embedder asks, not on every increment
//!
//! The caches count in plain atomics, read together by [`LakeCache::stats`], the snapshot
//! `lakecache_metrics()`, the `lakecache` tool and the Python module read too. This module
//! publishes such a snapshot when called, rather than each cache calling the facade as it
//! counts:
//! - the figures a scrape shows are those `lakecache_metrics()` shows, taken by the same
//!   code, so the two cannot drift apart, and the tool's and Python's figures are unchanged;
//! - a read's hot path stays a few relaxed atomic adds: a facade call looks up the
//!   recorder and the metric's key each time, for every piece of every read;
//! - a snapshot runs the caches' pending maintenance first (exact entry counts), which is
//!   worth doing once per scrape, not once per lookup.
//!
//! So the embedder decides when figures are taken: call [`export_metrics`] before each
//! scrape (in the handler that renders the exporter's text, say), or let [`export_every`]
//! take them on an interval of its choosing. Counters are set with
//! [`Counter::absolute`](metrics::Counter::absolute), the facade's call for a total counted
//! elsewhere.
//!
//! ```
//! use datafusion_lakecache::LakeCache;
//! use datafusion_lakecache::metrics_export::export_metrics;
//!
//! let lake = LakeCache::builder().build()?;
//! // With a recorder installed (`metrics_exporter_prometheus::PrometheusBuilder`, ...):
//! export_metrics(&lake);
//! # Ok::<(), datafusion::error::DataFusionError>(())
//! ```

use std::time::Duration;

use metrics::{Label, Unit};

use crate::lake::LakeCache;
use crate::stats::LakeStats;

/// The prefix of every name this module publishes.
pub const PREFIX: &str = "lakecache_";

/// The name of the label that carries the `cache` column of `lakecache_metrics()`.
pub const CACHE_LABEL: &str = "cache";

/// How a figure is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A running total: it only grows while the `LakeCache` lives.
    Counter,
    /// A level, or a high-water mark: it may go down (or is not a count of events).
    Gauge,
}

/// Every metric of `lakecache_metrics()`: its kind, unit and description. A figure added to
/// `LakeStats::rows` and not here is published as a gauge with no description
/// (tests/metrics.rs fails until it is placed here).
const FIGURES: &[(&str, Kind, Unit, &str)] = &[
    (
        "hits",
        Kind::Counter,
        Unit::Count,
        "Lookups served from the cache.",
    ),
    (
        "misses",
        Kind::Counter,
        Unit::Count,
        "Lookups that had to go to the store.",
    ),
    (
        "evictions",
        Kind::Counter,
        Unit::Count,
        "Entries dropped to stay within the capacity.",
    ),
    (
        "expirations",
        Kind::Counter,
        Unit::Count,
        "Entries dropped because their TTL or idle timeout passed.",
    ),
    (
        "invalidations",
        Kind::Counter,
        Unit::Count,
        "Entries dropped because a write, delete, rename or newer version made them stale.",
    ),
    ("entries", Kind::Gauge, Unit::Count, "Entries held now."),
    (
        "open_now",
        Kind::Gauge,
        Unit::Count,
        "Local file descriptors open now, held by the cache or by reads in progress.",
    ),
    (
        "version_changes",
        Kind::Counter,
        Unit::Count,
        "Times a response showed a different version than the one cached.",
    ),
    (
        "heads",
        Kind::Counter,
        Unit::Count,
        "HEAD requests sent only to prove access to a version the caches held.",
    ),
    (
        "bytes",
        Kind::Gauge,
        Unit::Bytes,
        "Bytes held now, as weighed against the capacity (the range memory tier's include 432 per range for its bookkeeping).",
    ),
    (
        "capacity",
        Kind::Gauge,
        Unit::Bytes,
        "Bytes the tier may hold (0 for a disk tier that is off).",
    ),
    (
        "footer_loads",
        Kind::Counter,
        Unit::Count,
        "Parquet footer loads run for scans.",
    ),
    (
        "bloom_loads",
        Kind::Counter,
        Unit::Count,
        "Bloom-filter loads that ran.",
    ),
    (
        "rejected",
        Kind::Counter,
        Unit::Count,
        "Entries not kept because they exceed the per-entry share of the capacity.",
    ),
    (
        "loads_in_flight",
        Kind::Gauge,
        Unit::Count,
        "Footer and bloom-filter loads running now.",
    ),
    (
        "reloads",
        Kind::Counter,
        Unit::Count,
        "Loads made again with the waiter's own store after the joined load failed.",
    ),
    (
        "warmed",
        Kind::Counter,
        Unit::Count,
        "Footers loaded or proven for a listing before it ended.",
    ),
    (
        "planning_hits",
        Kind::Counter,
        Unit::Count,
        "Footers served to DataFusion's planning on a miss of its own footer cache.",
    ),
    (
        "bytes_served",
        Kind::Counter,
        Unit::Bytes,
        "Bytes of reads served from the tier.",
    ),
    (
        "corrupt",
        Kind::Counter,
        Unit::Count,
        "Disk entries that failed their checksum or version, deleted and refetched.",
    ),
    (
        "writes",
        Kind::Counter,
        Unit::Count,
        "Ranges written to disk.",
    ),
    (
        "write_errors",
        Kind::Counter,
        Unit::Count,
        "Disk writes that failed (the range stays in memory only).",
    ),
    (
        "skipped",
        Kind::Counter,
        Unit::Count,
        "Ranges not written because the disk fell behind.",
    ),
    (
        "claims_waited",
        Kind::Counter,
        Unit::Count,
        "Downloads that waited for another process's download of the same bytes (a disk tier shared by processes).",
    ),
    (
        "walks",
        Kind::Counter,
        Unit::Count,
        "Walks of the disk tier's directory, to evict past its capacity or to count it.",
    ),
    (
        "view_versions",
        Kind::Gauge,
        Unit::Count,
        "Object versions this process keeps in its view of the disk tier (at most 65,536).",
    ),
    (
        "bytes_from_store",
        Kind::Counter,
        Unit::Bytes,
        "Bytes of reads fetched from the store.",
    ),
    (
        "too_large",
        Kind::Counter,
        Unit::Count,
        "Ranges not kept because they exceed an eighth of a tier.",
    ),
    (
        "shared",
        Kind::Counter,
        Unit::Count,
        "Ranges a read got from a download another read had in the air.",
    ),
    (
        "bytes_shared",
        Kind::Counter,
        Unit::Bytes,
        "Bytes of the ranges reads shared.",
    ),
    (
        "gets",
        Kind::Counter,
        Unit::Count,
        "GETs of byte ranges sent to stores, not counting hedges.",
    ),
    (
        "hedged",
        Kind::Counter,
        Unit::Count,
        "Second requests sent for GETs and proof HEADs waiting past the recent 95th percentile.",
    ),
    (
        "hedges_won",
        Kind::Counter,
        Unit::Count,
        "Second requests that answered first.",
    ),
    (
        "scans",
        Kind::Counter,
        Unit::Count,
        "Scans that started prefetching.",
    ),
    (
        "requests",
        Kind::Counter,
        Unit::Count,
        "Prefetch range downloads started.",
    ),
    (
        "bytes_fetched",
        Kind::Counter,
        Unit::Bytes,
        "Bytes downloaded ahead of the readers.",
    ),
    (
        "bytes_used",
        Kind::Counter,
        Unit::Bytes,
        "Prefetched bytes handed to a reader.",
    ),
    (
        "bytes_wasted",
        Kind::Counter,
        Unit::Bytes,
        "Prefetched bytes dropped without being read.",
    ),
    (
        "cancelled",
        Kind::Counter,
        Unit::Count,
        "Prefetch downloads aborted because their query ended.",
    ),
    (
        "failed",
        Kind::Counter,
        Unit::Count,
        "Prefetch downloads that failed (the reader then read the bytes itself).",
    ),
    (
        "memory_denied",
        Kind::Counter,
        Unit::Count,
        "Prefetch downloads not started because the memory pool refused the reservation.",
    ),
    (
        "wait_ms",
        Kind::Counter,
        Unit::Milliseconds,
        "Time readers spent waiting for a download already under way.",
    ),
    (
        "peak_in_flight",
        Kind::Gauge,
        Unit::Count,
        "Most prefetch downloads one scan had in flight at once.",
    ),
    (
        "in_flight",
        Kind::Gauge,
        Unit::Count,
        "Prefetch downloads in flight now, over every scan.",
    ),
    (
        "reserved_bytes",
        Kind::Gauge,
        Unit::Bytes,
        "Bytes reserved by all prefetching scans now.",
    ),
    (
        "peak_reserved_bytes",
        Kind::Gauge,
        Unit::Bytes,
        "Most bytes one scan held reserved at once.",
    ),
    (
        "leases",
        Kind::Gauge,
        Unit::Count,
        "Files open now with a prefetch lease, over every scan.",
    ),
];

fn figure(metric: &str) -> Option<&'static (&'static str, Kind, Unit, &'static str)> {
    FIGURES.iter().find(|f| f.0 == metric)
}

/// The name `metric` (a `metric` of `lakecache_metrics()`) is published under:
/// `lakecache_<metric>`.
pub fn metric_name(metric: &str) -> String {
    format!("{PREFIX}{metric}")
}

/// Publishes every figure of `lake` now, to the recorder the facade has (the thread's local
/// one, else the global one; none installed, nothing happens). See the module docs for the
/// names, and for why figures are taken when the embedder asks.
pub fn export_metrics(lake: &LakeCache) {
    export_stats(&lake.stats(), &[]);
}

/// Publishes the figures of `stats` with `labels` added to each (`cache` is always set): for
/// a process with several `LakeCache`s, a label telling them apart.
pub fn export_stats(stats: &LakeStats, labels: &[Label]) {
    let rows = stats.rows();
    let mut described: Vec<&str> = Vec::new();
    for (cache, metric, value) in rows {
        let name = metric_name(metric);
        let found = figure(metric);
        let kind = found.map_or(Kind::Gauge, |f| f.1);
        if let Some(&(_, kind, unit, help)) = found
            && !described.contains(&metric)
        {
            described.push(metric);
            match kind {
                Kind::Counter => metrics::describe_counter!(name.clone(), unit, help),
                Kind::Gauge => metrics::describe_gauge!(name.clone(), unit, help),
            }
        }
        let mut all = Vec::with_capacity(labels.len() + 1);
        all.push(Label::new(CACHE_LABEL, cache));
        all.extend(labels.iter().cloned());
        match kind {
            Kind::Counter => metrics::counter!(name, all).absolute(value),
            Kind::Gauge => metrics::gauge!(name, all).set(value as f64),
        }
    }
}

/// Publishes the figures of `lake` every `interval` (the first at once) on a Tokio task, to
/// the global recorder, until the returned [`ExportTask`] is dropped. The task holds a clone
/// of `lake`, so the caches live as long as it does.
///
/// Choose the interval as the scrape interval, or shorter; each export takes a
/// [`LakeCache::stats`] snapshot, which runs the caches' pending maintenance.
///
/// # Panics
///
/// Outside a Tokio runtime, as `tokio::spawn` does.
pub fn export_every(lake: &LakeCache, interval: Duration) -> ExportTask {
    let lake = lake.clone();
    let task = tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            export_metrics(&lake);
        }
    });
    ExportTask { task }
}

/// The task of [`export_every`]: exports stop when it is dropped.
#[derive(Debug)]
pub struct ExportTask {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ExportTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}
