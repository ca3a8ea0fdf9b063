//! Iceberg tables through the caches (`iceberg` feature), on a local directory, an in-memory
//! store standing for a remote one and the S3 server: tables the iceberg crate's own writer
//! and catalog wrote (appends, a column added, a column dropped) read right at every
//! snapshot in SQL; a warm query makes no request, metadata included; a cold one reads each
//! manifest once; a new snapshot is seen once the listing expires; planning prunes files;
//! equality deletes the crate's equality-delete writer wrote read as the crate's own reader
//! reads them.
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

/// One row of [`cities_schema`](datafusion_lakecache::testkit::iceberg::cities_schema).
type City = (i64, Option<String>, Option<f64>);

/// The rows of snapshot `id` as the iceberg crate's own reader returns them, deletes applied
/// by it, sorted.
async fn crates_rows(w: &IcebergWriter, id: i64) -> Vec<City> {
    use futures::TryStreamExt;
    use iceberg_arrow_array::Array;
    use iceberg_arrow_array::cast::AsArray;
    use iceberg_arrow_array::types::{Float64Type, Int64Type};
    let scan = w.table().scan().snapshot_id(id).build().unwrap();
    let batches: Vec<_> = scan.to_arrow().await.unwrap().try_collect().await.unwrap();
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let cities = b.column(1).as_string::<i32>();
        let values = b.column(2).as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            out.push((
                ids.value(i),
                (!cities.is_null(i)).then(|| cities.value(i).to_string()),
                (!values.is_null(i)).then(|| values.value(i)),
            ));
        }
    }
    out.sort_by(|a, b| a.partial_cmp(b).unwrap());
    out
}

/// The rows `sql` (`id, city, value`) returns, sorted.
async fn sql_rows(ctx: &SessionContext, sql: &str) -> Vec<City> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{Float64Type, Int64Type};
    let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
    let mut out = Vec::new();
    for b in batches {
        let ids = b.column(0).as_primitive::<Int64Type>();
        // Utf8 or Utf8View, as the session reads strings: compared as Utf8.
        let cities = arrow::compute::cast(b.column(1), &arrow::datatypes::DataType::Utf8).unwrap();
        let cities = cities.as_string::<i32>();
        let values = b.column(2).as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            out.push((
                ids.value(i),
                (!cities.is_null(i)).then(|| cities.value(i).to_string()),
                (!values.is_null(i)).then(|| values.value(i)),
            ));
        }
    }
    out.sort_by(|a, b| a.partial_cmp(b).unwrap());
    out
}

/// Rows of [`cities_schema`] with these ids, cities and a value of `value`.
fn upserts(rows: &[(i64, Option<&str>)], value: f64) -> Vec<Values> {
    vec![
        Values::Long(rows.iter().map(|r| Some(r.0)).collect()),
        Values::Str(rows.iter().map(|r| r.1.map(str::to_string)).collect()),
        Values::Double(rows.iter().map(|_| Some(value)).collect()),
    ]
}

#[tokio::test]
async fn equality_deletes_are_applied_at_every_snapshot_as_the_crates_reader_applies_them() {
    let mut all = remote_backends("iceberg_equality");
    all.insert(0, local_backend());
    for b in &all {
        let schema = datafusion_lakecache::testkit::iceberg::cities_schema();
        let mut w =
            IcebergWriter::create(Arc::clone(&b.raw), &b.store_url, &location(b), "t", schema)
                .await
                .unwrap();
        let mut snapshots = Vec::new();
        snapshots.push(w.append(cities(0, 100)).await.unwrap());
        snapshots.push(w.append(cities(100, 50)).await.unwrap());
        // By id, over both files.
        let gone = upserts(&[(3, None), (10, None), (120, None)], 0.0);
        snapshots.push(w.delete_where_equal(&["id"], gone).await.unwrap());
        // Two ids written again (a later sequence number: they stay), and rows with no city.
        let again = upserts(
            &[
                (3, Some("Kyiv")),
                (10, Some("Kyiv")),
                (150, None),
                (151, None),
            ],
            -1.0,
        );
        snapshots.push(w.append(again).await.unwrap());
        // By city: a null deletes the rows with none; every Oslo row so far.
        let gone = upserts(&[(0, None), (0, Some("Oslo"))], 0.0);
        snapshots.push(w.delete_where_equal(&["city"], gone).await.unwrap());
        // Oslo rows appended after that delete stay.
        snapshots.push(w.append(cities(200, 10)).await.unwrap());
        // By two columns: (1, Lima) is a row; (2, Lima) is not (2 is in Pune).
        let gone = upserts(&[(1, Some("Lima")), (2, Some("Lima"))], 0.0);
        snapshots.push(w.delete_where_equal(&["id", "city"], gone).await.unwrap());

        let lake = LakeCache::builder().build().unwrap();
        let counted = b.counting();
        let ctx = session(b, &lake, &counted);
        for (i, id) in snapshots.iter().enumerate() {
            let name = format!("t{i}");
            let options = format!("OPTIONS ('iceberg.snapshot_id' '{id}')");
            register(&ctx, b, &name, &options).await;
            let want = crates_rows(&w, *id).await;
            let at = format!("{} snapshot {i}", b.name);
            let got = sql_rows(&ctx, &format!("SELECT id, city, value FROM {name}")).await;
            assert_eq!(got, want, "{at}");

            // The key columns read though not asked for; no row count from the manifests.
            let got = line(&ctx, &format!("SELECT count(*), sum(value) FROM {name}")).await;
            let sum: f64 = want.iter().filter_map(|r| r.2).sum();
            let expected = [want.len().to_string(), format!("{sum:.1}")];
            assert_eq!(cells(&got), expected, "{at}");

            // A filter pushed into the scan, and a limit that deleted rows must not fill.
            let sql = format!("SELECT id, city, value FROM {name} WHERE id < 20 AND value >= 0");
            let filtered: Vec<City> = want
                .iter()
                .filter(|r| r.0 < 20 && r.2.is_some_and(|v| v >= 0.0))
                .cloned()
                .collect();
            assert_eq!(sql_rows(&ctx, &sql).await, filtered, "{at}");
            let limited = sql_rows(
                &ctx,
                &format!("SELECT id, city, value FROM {name} LIMIT 30"),
            )
            .await;
            assert_eq!(limited.len(), 30.min(want.len()), "{at}");
            assert!(
                limited.iter().all(|r| want.contains(r)),
                "{at}: {limited:?}"
            );
        }
        // EXPLAIN counts the delete files applied at the last snapshot: all three (the first
        // two files have every one; the files appended later, only the later deletes).
        let plan = rows(&ctx, "EXPLAIN SELECT id FROM t6")
            .await
            .unwrap()
            .join("\n");
        assert!(plan.contains("equality_delete_files=3"), "{plan}");
        // What the deletes left, spelled out at the last snapshot.
        let last = crates_rows(&w, snapshots[6]).await;
        let ids: Vec<i64> = last.iter().map(|r| r.0).collect();
        assert!(
            !ids.contains(&1) && ids.contains(&2) && !ids.contains(&120),
            "{ids:?}"
        );
        assert!(!ids.contains(&0) && ids.contains(&203), "Oslo: {ids:?}");
        assert_eq!(ids.iter().filter(|i| **i == 3).count(), 1, "{ids:?}");
        assert!(!ids.contains(&150) && !ids.contains(&151), "{ids:?}");
    }
}
