//! Helpers shared by the benchmarks: a lake in memory, a simulated remote store, arguments,
//! timing a query, percentiles, peak RSS and a line plot.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::error::Result;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use datafusion_lakecache::testkit::{ContentETags, CountingStore, LatencyStore};
use datafusion_lakecache::{LakeCache, testkit};
use futures::StreamExt;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

/// `spec`'s lake under `lake/` in a new in-memory store, and its size in bytes.
pub async fn memory_lake(spec: &LakeSpec) -> Result<(Arc<InMemory>, u64)> {
    let store = Arc::new(InMemory::new());
    let mut bytes = 0;
    for path in write_lake(store.as_ref(), &Path::from("lake"), spec).await? {
        bytes += store.head(&path).await?.size;
    }
    Ok((store, bytes))
}

/// A simulated remote store, counted: what reaches it is counted.
pub type Remote = CountingStore<Arc<dyn ObjectStore>>;

/// `store` as S3 shows it: e_tags that are digests of the bytes (learned before anything is
/// measured), behind `latency` per real request and a link of `bandwidth` bytes per second,
/// counted (the counts are the requests a remote store would see).
pub async fn remote(
    store: Arc<dyn ObjectStore>,
    latency: Duration,
    bandwidth: u64,
) -> Result<Arc<Remote>> {
    let s3_like = ContentETags::new(store);
    s3_like.learn(None).await?;
    let slow = LatencyStore::new(s3_like, latency).with_bandwidth(bandwidth);
    Ok(Arc::new(CountingStore::new(
        Arc::new(slow) as Arc<dyn ObjectStore>
    )))
}

/// [`remote`] with S3's spread of response times rather than one: each real request waits a
/// log-normal draw around `median`, one in a hundred 20 times longer (`LatencyStore::s3_like`,
/// from `seed`).
pub async fn remote_s3_like(
    store: Arc<dyn ObjectStore>,
    median: Duration,
    bandwidth: u64,
    seed: u64,
) -> Result<Arc<Remote>> {
    let s3_like = ContentETags::new(store);
    s3_like.learn(None).await?;
    let slow = LatencyStore::s3_like(s3_like, median, seed).with_bandwidth(bandwidth);
    Ok(Arc::new(CountingStore::new(
        Arc::new(slow) as Arc<dyn ObjectStore>
    )))
}

/// The value after `--name` on the command line, or `default`.
pub fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} expects a number, got {v}"))
        })
        .unwrap_or(default)
}

/// The numbers after `--name` (comma-separated), or `default`.
pub fn list(name: &str, default: &[u64]) -> Vec<u64> {
    let args: Vec<String> = std::env::args().collect();
    match args
        .iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
    {
        Some(v) => v
            .split(',')
            .map(|n| n.trim().parse().unwrap_or_else(|_| panic!("{name}: {v}")))
            .collect(),
        None => default.to_vec(),
    }
}

/// The text after `--name` on the command line.
pub fn text(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

/// A session of 2 partitions: installed from `cache` if given, else vanilla DataFusion.
pub fn context(cache: Option<&LakeCache>) -> Result<SessionContext> {
    testkit::context(cache, SessionConfig::new().with_target_partitions(2))
}

/// Runs `sql` to the end without keeping its rows; returns rows and time.
pub async fn run(ctx: &SessionContext, sql: &str) -> Result<(usize, Duration)> {
    let began = Instant::now();
    let mut stream = ctx.sql(sql).await?.execute_stream().await?;
    let mut rows = 0;
    while let Some(batch) = stream.next().await {
        rows += batch?.num_rows();
    }
    Ok((rows, began.elapsed()))
}

/// The `p`-th percentile of `times` by nearest rank, in ms (of 50 times, p99 is the slowest).
pub fn percentile(times: &[Duration], p: f64) -> f64 {
    let mut sorted = times.to_vec();
    sorted.sort();
    let rank = ((p / 100.0 * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    ms(sorted[rank - 1])
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Peak resident set size since the last reset, in MiB (Linux; 0 elsewhere).
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

pub fn reset_peak_rss() {
    // Writing 5 to clear_refs resets VmHWM to the current RSS (Linux 4.0+).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// One line of a [`line_plot`]: label, colour, and a y value (ms) per x.
pub struct Series<'a> {
    pub label: &'a str,
    pub color: &'a str,
    pub values: Vec<f64>,
}

/// An SVG plot of `series` (ms, log scale) against `xs`.
pub fn line_plot(x_title: &str, y_title: &str, xs: &[u64], series: &[Series]) -> String {
    let (w, h, pad) = (640.0, 400.0, 60.0);
    let max_x = xs.iter().copied().max().unwrap_or(1) as f64;
    let values = series.iter().flat_map(|s| s.values.iter().copied());
    let (lo, hi) = values.fold((f64::MAX, 1.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = (lo.max(1.0).log10().floor(), hi.log10().ceil());
    let x = |v: f64| pad + v / max_x * (w - 2.0 * pad);
    let y = |v: f64| h - pad - (v.max(1.0).log10() - lo) / (hi - lo).max(1.0) * (h - 2.0 * pad);
    let mut lines = String::new();
    for (row, s) in series.iter().enumerate() {
        let pts: Vec<String> = xs
            .iter()
            .zip(&s.values)
            .map(|(&l, &v)| format!("{:.1},{:.1}", x(l as f64), y(v)))
            .collect();
        lines += &format!(
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>\
             <text x=\"{:.0}\" y=\"{:.0}\" fill=\"{c}\">{}</text>",
            pts.join(" "),
            pad + 10.0,
            pad + row as f64 * 18.0,
            s.label,
            c = s.color,
        );
    }
    let mut ticks = String::new();
    for &l in xs {
        ticks += &format!(
            "<text x=\"{:.1}\" y=\"{:.0}\" text-anchor=\"middle\">{l}</text>",
            x(l as f64),
            h - pad + 18.0
        );
    }
    for decade in lo as i32..=hi as i32 {
        let v = 10f64.powi(decade);
        ticks += &format!(
            "<text x=\"{:.0}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>",
            pad - 6.0,
            y(v) + 4.0
        );
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"12\">\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\
         <line x1=\"{pad}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\
         <line x1=\"{pad}\" y1=\"{pad}\" x2=\"{pad}\" y2=\"{b}\" stroke=\"black\"/>\
         <text x=\"{cx}\" y=\"{lx}\" text-anchor=\"middle\">{x_title}</text>\
         <text x=\"14\" y=\"{cy}\" transform=\"rotate(-90 14 {cy})\" text-anchor=\"middle\">\
         {y_title}</text>{ticks}{lines}</svg>\n",
        b = h - pad,
        r = w - pad,
        cx = w / 2.0,
        lx = h - 15.0,
        cy = h / 2.0,
    )
}

/// The system allocator (mimalloc with the `bench-mimalloc` feature), counting the bytes live
/// on the heap: what a run holds, apart from what the allocator keeps in reserve (RSS counts
/// both). A bench that reports it declares
/// `#[global_allocator] static HEAP: common::CountingHeap = common::CountingHeap;`.
pub struct CountingHeap;

#[cfg(not(feature = "bench-mimalloc"))]
const INNER: std::alloc::System = std::alloc::System;
#[cfg(feature = "bench-mimalloc")]
const INNER: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The allocator the benches run on, as their reports name it.
pub const ALLOCATOR: &str = if cfg!(feature = "bench-mimalloc") {
    "mimalloc"
} else {
    "the system's (glibc)"
};

static HEAP_LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Bytes live on the heap now, when the bench's global allocator is a `CountingHeap`.
pub fn heap_live_mib() -> f64 {
    HEAP_LIVE.load(std::sync::atomic::Ordering::Relaxed) as f64 / (1024.0 * 1024.0)
}

// SAFETY: every call is forwarded to the inner allocator with its own arguments; the
// counter only adds and subtracts the sizes it was given.
unsafe impl std::alloc::GlobalAlloc for CountingHeap {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let p = unsafe { INNER.alloc(layout) };
        if !p.is_null() {
            HEAP_LIVE.fetch_add(layout.size(), std::sync::atomic::Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { INNER.dealloc(ptr, layout) };
        HEAP_LIVE.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        let p = unsafe { INNER.alloc_zeroed(layout) };
        if !p.is_null() {
            HEAP_LIVE.fetch_add(layout.size(), std::sync::atomic::Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new: usize) -> *mut u8 {
        let p = unsafe { INNER.realloc(ptr, layout, new) };
        if !p.is_null() {
            HEAP_LIVE.fetch_add(new, std::sync::atomic::Ordering::Relaxed);
            HEAP_LIVE.fetch_sub(layout.size(), std::sync::atomic::Ordering::Relaxed);
        }
        p
    }
}
