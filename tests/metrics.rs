//! The `metrics` feature: a Prometheus scrape of one query's figures, named as
//! `lakecache_metrics()` names them (`lakecache_<metric>{cache="<cache>"}`).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use datafusion::arrow::array::{Array, StringArray, UInt64Array};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::metrics_export::{export_every, export_metrics};
use datafusion_lakecache::stats::RANGE_ENTRY_BOOKKEEPING;
use datafusion_lakecache::testkit::lake::LakeSpec;
use metrics_exporter_prometheus::PrometheusBuilder;

type Figures = BTreeMap<(String, String), u64>;

/// Every row of `lakecache_metrics()` in `ctx`, by (cache, metric).
async fn sql_figures(ctx: &SessionContext) -> Figures {
    let batches = ctx
        .sql("SELECT cache, metric, value FROM lakecache_metrics()")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut figures = Figures::new();
    for batch in batches {
        let column = |i: usize| batch.column(i).as_any();
        let cache = column(0).downcast_ref::<StringArray>().unwrap();
        let metric = column(1).downcast_ref::<StringArray>().unwrap();
        let value = column(2).downcast_ref::<UInt64Array>().unwrap();
        for row in 0..batch.num_rows() {
            let key = (cache.value(row).to_string(), metric.value(row).to_string());
            figures.insert(key, value.value(row));
        }
    }
    figures
}

/// The `lakecache_*` samples of a Prometheus scrape, by (cache label, metric), with the type
/// the scrape declares for each name.
fn scraped(text: &str) -> (Figures, BTreeMap<String, String>) {
    let mut figures = Figures::new();
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE lakecache_") {
            let (metric, kind) = declared.split_once(' ').unwrap();
            types.insert(metric.to_string(), kind.to_string());
            continue;
        }
        let Some(sample) = line.strip_prefix("lakecache_") else {
            continue;
        };
        let (metric, rest) = sample.split_once("{cache=\"").unwrap();
        let (cache, value) = rest.split_once("\"} ").unwrap();
        let value: f64 = value.parse().unwrap();
        figures.insert((cache.to_string(), metric.to_string()), value as u64);
    }
    (figures, types)
}

#[tokio::test]
async fn a_prometheus_scrape_shows_the_figures_of_one_query() {
    let b = common::memory_backend();
    let spec = LakeSpec::small_files(4);
    b.write(&spec).await;
    let counted = b.counting();
    let lake = LakeCache::builder().build().unwrap();
    let ctx = common::installed(
        &b,
        counted.clone(),
        &lake,
        SessionStateBuilder::new(),
        SessionConfig::new(),
    )
    .await;
    let rows = common::rows(&ctx, "SELECT count(*), sum(value) FROM t").await;
    assert!(rows.unwrap().iter().any(|r| r.contains("20000")));
    let requests = counted.counts();

    // The recorder a service would install globally, here for this thread alone.
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || export_metrics(&lake));
    let text = handle.render();
    eprintln!("{text}");
    let (scrape, types) = scraped(&text);
    let sql = sql_figures(&ctx).await;

    // Every figure of lakecache_metrics(), under its name, with its value, and nothing else.
    assert_eq!(scrape, sql, "the scrape and lakecache_metrics() differ");
    let figure = |cache: &str, metric: &str| scrape[&(cache.to_string(), metric.to_string())];
    // The query's own figures: a cold lake of 4 files, each footer loaded once (missed while
    // the table was planned, found by the scan); every GET the versioned read sent is one
    // the store saw, and its bytes are those the memory tier now holds.
    assert_eq!(figure("index", "footer_loads"), 4);
    assert_eq!(figure("index", "misses"), 4);
    assert_eq!(figure("index", "hits"), 4);
    assert_eq!(figure("index", "entries"), 4);
    assert!(requests.get > 0);
    assert_eq!(figure("store", "gets"), requests.get);
    assert_eq!(figure("range.memory", "hits"), 0);
    assert_eq!(
        figure("range", "bytes_from_store")
            + figure("range.memory", "entries") * RANGE_ENTRY_BOOKKEEPING,
        figure("range.memory", "bytes"),
        "the memory tier weighs each range's bytes and its bookkeeping"
    );
    assert_eq!(figure("prefetch", "scans"), 1);
    // Totals are counters, levels gauges.
    assert_eq!(types["hits"], "counter");
    assert_eq!(types["bytes_from_store"], "counter");
    assert_eq!(types["entries"], "gauge");
    assert_eq!(types["capacity"], "gauge");
    // Every name described (src/metrics_export.rs has a kind and a description for each).
    for metric in types.keys() {
        let help = format!("# HELP lakecache_{metric} ");
        assert!(
            text.contains(&help),
            "lakecache_{metric} has no description:\n{text}"
        );
    }
    assert!(text.contains("# HELP lakecache_hits Lookups served from the cache."));

    // A second export after a warm query: its figures move on, and the store saw nothing new.
    common::rows(&ctx, "SELECT count(*), sum(value) FROM t")
        .await
        .unwrap();
    assert_eq!(counted.counts().get, requests.get);
    metrics::with_local_recorder(&recorder, || export_metrics(&lake));
    let text = handle.render();
    let (warm, _) = scraped(&text);
    assert_eq!(
        warm,
        sql_figures(&ctx).await,
        "the scrape and lakecache_metrics() differ"
    );
    let warm_figure = |cache: &str, metric: &str| warm[&(cache.to_string(), metric.to_string())];
    assert_eq!(warm_figure("index", "footer_loads"), 4, "{text}");
    assert_eq!(warm_figure("index", "misses"), 4, "{text}");
    assert!(warm_figure("index", "hits") > 4, "{text}");
    assert_eq!(warm_figure("store", "gets"), requests.get, "{text}");
    assert!(warm_figure("range.memory", "hits") > 0, "{text}");
}

#[tokio::test]
async fn export_every_publishes_to_the_global_recorder() {
    let handle = PrometheusBuilder::new().install_recorder().unwrap();
    let lake = LakeCache::builder()
        .range_memory_bytes(64 << 20)
        .build()
        .unwrap();
    let task = export_every(&lake, Duration::from_millis(20));
    let capacity = "lakecache_capacity{cache=\"range.memory\"} 67108864";
    let mut seen = false;
    for _ in 0..100 {
        if handle.render().contains(capacity) {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen, "no export within 2 s:\n{}", handle.render());
    drop(task);
}
