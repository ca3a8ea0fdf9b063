//! Iceberg tables through the caches (`iceberg` feature), on a local directory, an in-memory
//! store standing for a remote one and the S3 server: tables the iceberg crate's own writer
//! and catalog wrote (appends, a column added, a column dropped) read right at every
//! snapshot in SQL; a warm query makes no request, metadata included; a cold one reads each
//! manifest once; a new snapshot is seen once the listing expires; planning prunes files.
//! Tables pyiceberg wrote (renames, promotions, partitions, overwrites, deletes) are read by
//! the Python tests against pyiceberg's own scans.
#![cfg(feature = "iceberg")]

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{Backend, Counted, local_backend, remote_backends, rows};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::iceberg::{IcebergWriter, Values, cities, evolving_table};
use object_store::ObjectStore;

/// The table's location under the backend's prefix.
fn location(b: &Backend) -> String {
    format!("{}table", b.table_url())
}

/// Writes [`evolving_table`] at the backend's location.
async fn write_table(b: &Backend) -> (IcebergWriter, Vec<i64>) {
    evolving_table(Arc::clone(&b.raw), &b.store_url, &location(b))
        .await
        .unwrap()
}

/// A session installed from `lake` whose store for the backend is the caches over `counted`.
fn session(b: &Backend, lake: &LakeCache, counted: &Arc<Counted>) -> SessionContext {
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(SessionConfig::new().with_target_partitions(2));
    let ctx = SessionContext::new_with_state(lake.install(builder).unwrap().build());
    ctx.register_object_store(
        &b.store_url,
        b.cached(counted, lake) as Arc<dyn ObjectStore>,
    );
    ctx
}

/// Registers the table as `name`, with `options` (`'snapshot_id' '...'`).
async fn register(ctx: &SessionContext, b: &Backend, name: &str, options: &str) {
    let sql = format!(
        "CREATE EXTERNAL TABLE {name} STORED AS ICEBERG LOCATION '{}' {options}",
        location(b)
    );
    ctx.sql(&sql).await.unwrap().collect().await.unwrap();
}

/// The one line of a one-row result, as `| a | b |`.
async fn line(ctx: &SessionContext, sql: &str) -> String {
    let lines = rows(ctx, sql).await.unwrap();
    lines
        .iter()
        .find(|l| l.starts_with("| ") && l.chars().any(|c| c.is_ascii_digit()))
        .cloned()
        .unwrap_or_else(|| panic!("{sql}: {lines:?}"))
}

/// The cells of a result line.
fn cells(line: &str) -> Vec<&str> {
    line.split('|')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// `sum(i)` for `i` in `range`.
fn sum(range: std::ops::Range<i64>) -> i64 {
    range.sum()
}

#[tokio::test]
async fn every_snapshot_reads_its_rows_and_columns_by_field_id() {
    let mut all = remote_backends("iceberg_snapshots");
    all.insert(0, local_backend());
    for b in &all {
        let (_w, snapshots) = write_table(b).await;
        let lake = LakeCache::builder().build().unwrap();
        let counted = b.counting();
        let ctx = session(b, &lake, &counted);
        register(&ctx, b, "t", "").await;

        // The newest snapshot, with its schema: `value` dropped, `extra` added.
        let got = line(
            &ctx,
            "SELECT count(*), sum(id), count(extra), sum(extra) FROM t",
        )
        .await;
        let extra = sum(175..200) * 10;
        let want = ["200", &sum(0..200).to_string(), "25", &extra.to_string()];
        assert_eq!(cells(&got), want, "{}", b.name);
        let columns = ctx.table("t").await.unwrap().schema().field_names();
        assert_eq!(columns, ["t.id", "t.city", "t.extra"], "{}", b.name);

        // Each snapshot with its own schema: the ones before the drop still have `value`.
        let rows_at = [100, 150, 175, 195, 200];
        for (i, (id, n)) in snapshots.iter().zip(rows_at).enumerate() {
            let name = format!("t{i}");
            register(
                &ctx,
                b,
                &name,
                &format!("OPTIONS ('iceberg.snapshot_id' '{id}')"),
            )
            .await;
            let got = line(&ctx, &format!("SELECT count(*), sum(id) FROM {name}")).await;
            let want = [n.to_string(), sum(0..n).to_string()];
            assert_eq!(cells(&got), want, "{} snapshot {i}", b.name);
            if i < 4 {
                let got = line(&ctx, &format!("SELECT sum(value) FROM {name}")).await;
                let want = format!("{:.1}", sum(0..n.min(195)) as f64 * 0.5);
                assert_eq!(cells(&got), [want.as_str()], "{} snapshot {i}", b.name);
            }
        }
    }
}

#[tokio::test]
async fn a_warm_query_sends_no_request_and_a_cold_one_reads_each_manifest_once() {
    for b in remote_backends("iceberg_requests") {
        let (w, _) = write_table(&b).await;
        let lake = LakeCache::builder().build().unwrap();
        let counted = b.counting();
        let sql = "SELECT city, count(*), sum(id) FROM t GROUP BY city";

        let ctx = session(&b, &lake, &counted);
        register(&ctx, &b, "t", "").await;
        let cold = rows(&ctx, sql).await.unwrap();
        // Data files are versioned by the manifests (path and size): no HEAD, cold too.
        assert_eq!(
            counted.counts().head,
            0,
            "{}: {:?}",
            b.name,
            counted.counts()
        );
        let mut per_path: HashMap<String, usize> = HashMap::new();
        for (path, _) in counted.gets() {
            *per_path.entry(path.to_string()).or_default() += 1;
        }
        let manifests: Vec<_> = per_path
            .iter()
            .filter(|(p, _)| p.ends_with(".avro"))
            .collect();
        // A manifest list per snapshot read (the newest) and a manifest per append.
        assert!(manifests.len() >= 6, "{}: {per_path:?}", b.name);
        assert!(
            manifests.iter().all(|(_, n)| **n == 1),
            "{}: {manifests:?}",
            b.name
        );
        let metadata = w.table().metadata_location().unwrap().to_string();
        let newest = per_path
            .keys()
            .filter(|p| metadata.ends_with(p.as_str()))
            .count();
        assert_eq!(newest, 1, "{}: {metadata} in {per_path:?}", b.name);

        // Again in the same session, and in a new session that registers the table again.
        counted.reset();
        assert_eq!(rows(&ctx, sql).await.unwrap(), cold, "{}", b.name);
        let ctx = session(&b, &lake, &counted);
        register(&ctx, &b, "t", "").await;
        assert_eq!(rows(&ctx, sql).await.unwrap(), cold, "{}", b.name);
        let c = counted.counts();
        assert_eq!(
            (c.head, c.list, c.get),
            (0, 0, 0),
            "{}: {:?}",
            b.name,
            counted.gets()
        );
    }
}

#[tokio::test]
async fn a_new_snapshot_is_seen_once_the_listing_expires() {
    for b in remote_backends("iceberg_new_snapshot") {
        let (mut w, _) = write_table(&b).await;
        let lake = LakeCache::builder()
            .set("lakecache.handle.list_ttl", "50ms")
            .build()
            .unwrap();
        let counted = b.counting();
        let ctx = session(&b, &lake, &counted);
        register(&ctx, &b, "t", "").await;
        assert_eq!(cells(&line(&ctx, "SELECT count(*) FROM t").await), ["200"]);
        let mut columns = cities(200, 7);
        columns.remove(2);
        columns.push(Values::Long(vec![None; 7]));
        w.append(columns).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let got = line(&ctx, "SELECT count(*), sum(id) FROM t").await;
        let want = ["207".to_string(), sum(0..207).to_string()];
        assert_eq!(cells(&got), want, "{}", b.name);
    }
}

#[tokio::test]
async fn planning_prunes_the_files_a_filter_rules_out_by_their_bounds() {
    let b = local_backend();
    write_table(&b).await;
    let lake = LakeCache::builder().build().unwrap();
    let ctx = session(&b, &lake, &b.counting());
    register(&ctx, &b, "t", "").await;
    let plan = rows(&ctx, "EXPLAIN SELECT count(*) FROM t WHERE id < 40")
        .await
        .unwrap()
        .join("\n");
    assert!(
        plan.contains("IcebergScanExec") && plan.contains("files=1"),
        "{plan}"
    );
    let got = line(&ctx, "SELECT count(*) FROM t WHERE id < 40").await;
    assert_eq!(cells(&got), ["40"]);
    let plan = rows(&ctx, "EXPLAIN SELECT count(*) FROM t")
        .await
        .unwrap()
        .join("\n");
    assert!(plan.contains("files=5"), "{plan}");
}

#[tokio::test]
async fn what_cannot_be_read_is_an_error_naming_the_table() {
    let b = local_backend();
    let (_, snapshots) = write_table(&b).await;
    let lake = LakeCache::builder().build().unwrap();
    let ctx = session(&b, &lake, &b.counting());
    let missing = format!("{}nothing", b.table_url());
    let sql = format!("CREATE EXTERNAL TABLE m STORED AS ICEBERG LOCATION '{missing}'");
    let err = ctx.sql(&sql).await.unwrap_err().to_string();
    let named = err.contains("Iceberg table file:///") && err.contains("/lake/nothing:");
    assert!(
        named && err.contains("no metadata file"),
        "{missing}: {err}"
    );

    let unknown = snapshots.iter().max().unwrap() + 1;
    let sql = format!(
        "CREATE EXTERNAL TABLE s STORED AS ICEBERG LOCATION '{}' OPTIONS ('iceberg.snapshot_id' '{unknown}')",
        location(&b)
    );
    let err = ctx.sql(&sql).await.unwrap_err().to_string();
    assert!(err.contains(&format!("no snapshot {unknown}")), "{err}");

    let sql = format!(
        "CREATE EXTERNAL TABLE s STORED AS ICEBERG LOCATION '{}' OPTIONS ('iceberg.snapshot_id' 'latest')",
        location(&b)
    );
    let err = ctx.sql(&sql).await.unwrap_err().to_string();
    assert!(
        err.contains("snapshot_id") && err.contains("latest"),
        "{err}"
    );

    let sql = format!(
        "CREATE EXTERNAL TABLE s STORED AS ICEBERG LOCATION '{}' OPTIONS ('iceberg.snapshot' '1')",
        location(&b)
    );
    let err = ctx.sql(&sql).await.unwrap_err().to_string();
    assert!(
        err.contains("unknown Iceberg table option \"snapshot\""),
        "{err}"
    );
}

#[tokio::test]
async fn a_column_added_under_a_dropped_ones_name_is_null_in_older_files() {
    for b in remote_backends("iceberg_readded") {
        let (mut w, _) = write_table(&b).await;
        // `value` (a double, id 3) was dropped; a new `value` (a long) has an id of its own.
        w.add_column("value", iceberg::spec::PrimitiveType::Long)
            .await
            .unwrap();
        let lake = LakeCache::builder().build().unwrap();
        let ctx = session(&b, &lake, &b.counting());
        register(&ctx, &b, "t", "").await;
        let got = line(&ctx, "SELECT count(value), max(value), count(*) FROM t").await;
        assert_eq!(cells(&got), ["0", "200"], "{}: {got}", b.name);
    }
}
