//! The caches on a Ballista cluster: a scheduler and two executors in this process, each
//! with the runtime, settings and codecs of its own `LakeBallista` (none shares the client's),
//! over the S3 server.

mod common;
#[cfg(feature = "delta")]
#[path = "common/delta.rs"]
mod delta_tables;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ballista::prelude::SessionContextExt;
use common::{Backend, Counted, backends, rows};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::object_store::{DefaultObjectStoreRegistry, ObjectStoreRegistry};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_lakecache::ballista::LakeBallista;
use datafusion_lakecache::ballista::figures::FUNCTION;
use datafusion_lakecache::testkit::corpus::CORPUS;
use datafusion_lakecache::testkit::lake::LakeSpec;
use datafusion_lakecache::testkit::{
    NamedCluster, Placement, Process, RequestCounts, start_cluster,
};
use datafusion_lakecache::{LakeCache, LakeTable};

/// The S3 server (required in CI). Not the in-memory store: Ballista 55 cannot run a scan of
/// a `memory://` table even without the caches ("ObjectStoreUrl must only contain scheme and
/// authority"), and a local directory has no range cache to show.
fn s3_backends(test: &str) -> Vec<Backend> {
    backends(test)
        .into_iter()
        .filter(|b| b.name == "s3")
        .collect()
}

/// One process of the cluster: its set-up, and the store it reaches the lake through,
/// counting what gets past its caches.
struct Node {
    setup: LakeBallista,
    store: Arc<Counted>,
}

fn node(b: &Backend, lake: LakeCache) -> Node {
    let store = b.counting();
    let stores = DefaultObjectStoreRegistry::new();
    stores.register_store(&b.store_url, store.clone());
    let setup = LakeBallista::new(lake, Arc::new(stores)).unwrap();
    Node { setup, store }
}

/// A scheduler and two executors, each with a cache of its own.
struct Cluster {
    url: String,
    scheduler: Node,
    executors: Vec<Node>,
}

impl Cluster {
    async fn start(b: &Backend) -> Self {
        let fresh = || LakeCache::builder().build().unwrap();
        let scheduler = node(b, fresh());
        let executors = vec![node(b, fresh()), node(b, fresh())];
        let processes: Vec<Process> = executors
            .iter()
            .map(|n| Process::cached(&n.setup))
            .collect();
        let url = start_cluster(&Process::cached(&scheduler.setup), &processes, 2)
            .await
            .unwrap();
        Self {
            url,
            scheduler,
            executors,
        }
    }

    /// A client session on the cluster, with `t` registered (the client reads the lake's
    /// schema through a store of its own).
    async fn client(&self, b: &Backend) -> SessionContext {
        let ctx = self.session(b).await;
        ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await
            .unwrap();
        ctx
    }

    /// A client session on the cluster, with no table registered.
    async fn session(&self, b: &Backend) -> SessionContext {
        let client = node(b, LakeCache::builder().build().unwrap());
        let config = client.setup.config().with_target_partitions(4);
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_config(config)
            .build();
        let ctx = SessionContext::remote_with_state(&self.url, state)
            .await
            .unwrap();
        ctx.register_object_store(&b.store_url, b.raw.clone());
        ctx
    }

    /// Requests that reached the store from the scheduler and the executors.
    fn requests(&self) -> RequestCounts {
        std::iter::once(&self.scheduler)
            .chain(&self.executors)
            .map(|n| n.store.counts())
            .sum()
    }

    fn reset(&self) {
        for n in std::iter::once(&self.scheduler).chain(&self.executors) {
            n.store.reset();
        }
    }
}

async fn vanilla(b: &Backend) -> SessionContext {
    let ctx = SessionContext::new_with_config(SessionConfig::new().with_target_partitions(4));
    ctx.register_object_store(&b.store_url, b.raw.clone());
    ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
        .await
        .unwrap();
    ctx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_corpus_on_a_cluster_returns_single_process_rows_and_repeats_from_executor_caches() {
    for b in s3_backends("ballista-corpus") {
        b.write(&LakeSpec::small_files(8).with_row_groups_of(1_000))
            .await;
        let plain = vanilla(&b).await;
        let cluster = Cluster::start(&b).await;
        let ctx = cluster.client(&b).await;
        let mut passes = Vec::new();
        for pass in 0..2 {
            cluster.reset();
            for sql in CORPUS {
                let want = rows(&plain, sql).await.unwrap();
                let got = rows(&ctx, sql).await.unwrap();
                assert_eq!(got, want, "{} pass {pass}: {sql}", b.name);
            }
            passes.push(cluster.requests());
        }
        let (cold, warm) = (passes[0], passes[1]);
        eprintln!("{}: cold {cold:?}, warm {warm:?}", b.name);
        assert!(cold.get > 0, "{}: the cold pass read the lake", b.name);
        assert_eq!(
            warm.get, 0,
            "{}: the warm pass read no byte from the store",
            b.name
        );
        assert!(
            warm.head + warm.list < cold.head + cold.list,
            "{}: {warm:?} against {cold:?}",
            b.name
        );
        // Each executor served its tasks' footers and bytes from its own caches.
        for (i, e) in cluster.executors.iter().enumerate() {
            let stats = e.setup.lake().stats();
            eprintln!(
                "{} executor {i}: {:?} {:?}",
                b.name, stats.index.footers, stats.range.memory
            );
            assert!(
                stats.index.footers.hits > 0,
                "{} executor {i}: {:?}",
                b.name,
                stats.index
            );
            assert!(
                stats.range.memory.hits > 0,
                "{} executor {i}: {:?}",
                b.name,
                stats.range
            );
            assert!(
                stats.prefetch.scans > 0,
                "{} executor {i} prefetched",
                b.name
            );
        }
    }
}

/// A Delta table (with deletion vectors) registered on the client as delta-rs's provider:
/// the scheduler reads its log, and each task plans its files' part of the scan with delta-rs
/// on its executor, through that executor's caches. Tasks are placed by affinity (delta-rs
/// skips files at planning, so many of these scans are single tasks of one file).
#[cfg(feature = "delta")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delta_tables_corpus_on_the_cluster_returns_delta_rs_rows() {
    use delta_tables::{batch, delete_with_deletion_vectors, delta_rs_rows, uncached};
    use deltalake_core::protocol::SaveMode;

    // The Delta table has the lake's columns but its timestamp (see `batch`).
    let queries: Vec<&str> = CORPUS
        .iter()
        .copied()
        .filter(|sql| !sql.contains("ts"))
        .collect();
    for b in s3_backends("ballista-delta") {
        // A file per commit: six files for the cluster's tasks to split.
        let mut table = uncached(&b).write(vec![batch(0)]).await.unwrap();
        for i in 1..6 {
            table = table
                .write(vec![batch(i)])
                .with_save_mode(SaveMode::Append)
                .await
                .unwrap();
        }
        let cluster = AffinityCluster::start(&b, 2, 1 << 30).await;
        let ctx = cluster.session(&b, 6).await;
        for vectors in [false, true] {
            if vectors {
                let deleted = delete_with_deletion_vectors(&b, 5, |id| id % 7 == 3).await;
                assert!(deleted > 0, "{}: rows deleted by deletion vectors", b.name);
            }
            let want = delta_rs_rows(&b, &queries).await;
            let mut loaded = uncached(&b);
            loaded.load().await.unwrap();
            ctx.deregister_table("t").unwrap();
            ctx.register_table("t", loaded.table_provider().await.unwrap())
                .unwrap();
            let mut passes = Vec::new();
            for pass in 0..2 {
                cluster.reset();
                cluster.scheduler.store.reset();
                let before = cluster.cluster.placement().unwrap();
                for (sql, want) in queries.iter().zip(&want) {
                    let got = rows(&ctx, sql).await.unwrap();
                    assert_eq!(
                        &got, want,
                        "{} (vectors {vectors}) pass {pass}: {sql}",
                        b.name
                    );
                }
                let after = cluster.cluster.placement().unwrap();
                let gets: u64 = cluster.gets().iter().sum();
                let scheduler = cluster.scheduler.store.counts();
                if pass == 1 {
                    for (name, e) in &cluster.executors {
                        eprintln!("warm GETs of {name}: {:?}", e.store.gets());
                    }
                }
                passes.push((gets, after.elsewhere - before.elsewhere, scheduler));
            }
            let [
                (cold, cold_elsewhere, _),
                (warm, warm_elsewhere, warm_scheduler),
            ] = passes[..]
            else {
                unreachable!()
            };
            eprintln!(
                "{} (vectors {vectors}): {} queries; executors' GETs cold {cold} \
                 ({cold_elsewhere} tasks elsewhere), warm {warm} ({warm_elsewhere} elsewhere); \
                 scheduler warm {warm_scheduler:?}",
                b.name,
                queries.len()
            );
            assert!(cold > 0, "{}: the cold pass read the table", b.name);
            // The log (commits, deletion vectors) is written once: the scheduler plans the
            // warm pass from its caches.
            assert_eq!(
                warm_scheduler.get, 0,
                "{}: the scheduler read no byte",
                b.name
            );
            // Files, vectors and commits come from the executors' caches: a warm pass whose
            // tasks, and those of the pass before, ran on their preferred executor reads
            // nothing (a task placed elsewhere leaves its file to be read once later).
            if cold_elsewhere == 0 && warm_elsewhere == 0 {
                assert_eq!(warm, 0, "{}: the warm pass read no byte", b.name);
            } else {
                assert!(warm < cold, "{}: the warm pass read less", b.name);
            }
        }
    }
}

/// The cells of a result line.
#[cfg(feature = "iceberg")]
fn cells(line: &str) -> Vec<&str> {
    line.split('|').map(str::trim).collect()
}

/// An Iceberg table (iceberg feature) registered on the client: it crosses to the scheduler
/// as its location and snapshot, the scheduler plans its files with the iceberg crate
/// through its own caches, and each executor reads its tasks' files with columns matched by
/// field id (the table dropped a column and added one of the same name). A second pass reads the metadata
/// from the scheduler's caches and the data from the executors'.
#[cfg(feature = "iceberg")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_iceberg_table_on_the_cluster_reads_every_snapshot_by_field_id_deletes_applied() {
    use datafusion_lakecache::testkit::iceberg::{Values, evolving_table};
    for b in s3_backends("ballista-iceberg") {
        let location = format!("{}ice", b.table_url());
        let (mut w, snapshots) = evolving_table(b.raw.clone(), &b.store_url, &location)
            .await
            .unwrap();
        // `value` again, a new column of the dropped one's name: no file has it.
        w.add_column("value", iceberg::spec::PrimitiveType::Long)
            .await
            .unwrap();
        // Ids 0..10 deleted by equality: the filter crosses to the executors with the scan.
        let gone = vec![
            Values::Long((0..10).map(Some).collect()),
            Values::Str(vec![None; 10]),
            Values::Long(vec![None; 10]),
            Values::Long(vec![None; 10]),
        ];
        w.delete_where_equal(&["id"], gone).await.unwrap();
        let cluster = AffinityCluster::start(&b, 2, 1 << 30).await;
        let ctx = cluster.session(&b, 5).await;
        let lake = LakeCache::builder().build().unwrap();
        let url = url::Url::parse(&location).unwrap();
        let open = |snapshot: Option<i64>| {
            let builder =
                datafusion_lakecache::iceberg::table_builder(&lake, &url, b.raw.clone()).unwrap();
            async move {
                match snapshot {
                    Some(id) => builder.snapshot_id(id).load().await.unwrap(),
                    None => builder.load().await.unwrap(),
                }
            }
        };
        ctx.register_table("t", Arc::new(open(None).await)).unwrap();
        ctx.register_table("s", Arc::new(open(Some(snapshots[2])).await))
            .unwrap();
        let sum = |n: i64| (0..n).sum::<i64>();
        let cases = [
            (
                "SELECT count(*) AS n, sum(id) AS s, count(extra) AS e, sum(extra) AS x, \
                 count(value) AS v, max(value) AS m FROM t",
                format!(
                    "| 190 | {} | 25 | {} | 0 | |",
                    sum(200) - sum(10),
                    (175..200).sum::<i64>() * 10
                ),
            ),
            (
                "SELECT count(*) AS n, sum(id) AS s, sum(value) AS v FROM s",
                format!("| 175 | {} | {:.1} |", sum(175), sum(175) as f64 * 0.5),
            ),
        ];
        let mut warm_scheduler = None;
        for pass in 0..2 {
            cluster.scheduler.store.reset();
            for (sql, want) in &cases {
                let got = rows(&ctx, sql).await.unwrap();
                let line = got
                    .iter()
                    .find(|l| l.starts_with("| ") && l.contains(char::is_numeric));
                assert_eq!(
                    line.map(|l| cells(l)),
                    Some(cells(want)),
                    "{} pass {pass}: {sql}: {got:?}",
                    b.name
                );
            }
            warm_scheduler = Some(cluster.scheduler.store.counts());
        }
        let warm_scheduler = warm_scheduler.unwrap();
        assert_eq!(
            warm_scheduler.get, 0,
            "{}: the scheduler planned the warm pass from its caches",
            b.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_set_on_the_client_changes_what_the_executors_prefetch() {
    for b in s3_backends("ballista-set") {
        b.write(&LakeSpec::small_files(16)).await;
        let cluster = Cluster::start(&b).await;
        let ctx = cluster.client(&b).await;
        let peak = |c: &Cluster| {
            c.executors
                .iter()
                .map(|e| e.setup.lake().stats().prefetch.peak_in_flight)
                .max()
                .unwrap_or(0)
        };
        let downloads = |c: &Cluster| {
            c.executors
                .iter()
                .map(|e| e.setup.lake().stats().prefetch.requests)
                .sum::<u64>()
        };
        let sql = "SELECT count(*), sum(value), max(name) FROM t";
        ctx.sql("SET lakecache.prefetch.max_in_flight = 1")
            .await
            .unwrap();
        rows(&ctx, sql).await.unwrap();
        let one = (peak(&cluster), downloads(&cluster));
        for e in &cluster.executors {
            e.setup.lake().clear();
        }
        ctx.sql("SET lakecache.prefetch.max_in_flight = 8")
            .await
            .unwrap();
        rows(&ctx, sql).await.unwrap();
        let eight = (peak(&cluster), downloads(&cluster) - one.1);
        eprintln!("{}: max_in_flight 1 -> {one:?}, 8 -> {eight:?}", b.name);
        assert!(one.1 > 1, "{}: the executors prefetched", b.name);
        // One download ahead of the readers; a reader that wants a piece nobody started
        // starts it at once, beyond the limit (it would read those bytes itself otherwise).
        assert!(one.0 <= 2, "{}: one download ahead at a time", b.name);
        assert!(eight.0 > 2, "{}: more at a time", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lake_table_registered_on_the_client_runs_on_the_cluster() {
    for b in s3_backends("ballista-lake-table") {
        b.write(&LakeSpec::small_files(4)).await;
        let plain = vanilla(&b).await;
        let cluster = Cluster::start(&b).await;
        let ctx = cluster.client(&b).await;
        let lake = LakeCache::builder().build().unwrap();
        let table = LakeTable::try_new(&ctx.state(), &b.table_url(), &lake)
            .await
            .unwrap();
        ctx.register_table("lt", Arc::new(table)).unwrap();
        let sql = "SELECT category, count(*) AS n, round(sum(value), 3) AS total FROM {} GROUP BY category";
        let want = rows(&plain, &sql.replace("{}", "t")).await.unwrap();
        for _ in 0..2 {
            assert_eq!(rows(&ctx, &sql.replace("{}", "lt")).await.unwrap(), want);
        }
        // The executors' scans read through their caches and prefetched (which run a task
        // lands on, and so what it finds cached, is Ballista's choice).
        for (i, e) in cluster.executors.iter().enumerate() {
            let activity = e.setup.lake().activity();
            eprintln!("{} executor {i}: {activity:?}", b.name);
        }
        let lookups: u64 = cluster
            .executors
            .iter()
            .map(|e| e.setup.lake().activity().footer_lookups)
            .sum();
        let prefetched: u64 = cluster
            .executors
            .iter()
            .map(|e| e.setup.lake().stats().prefetch.scans)
            .sum();
        assert!(
            lookups > 0 && prefetched > 0,
            "{}: {lookups} {prefetched}",
            b.name
        );
    }
}

/// A scheduler placing tasks by cache affinity and `n` named executors, each with a cache
/// of its own whose memory tier holds `memory` bytes.
struct AffinityCluster {
    cluster: NamedCluster,
    scheduler: Node,
    executors: Vec<(String, Node)>,
}

impl AffinityCluster {
    async fn start(b: &Backend, n: usize, memory: u64) -> Self {
        let scheduler = node(b, LakeCache::builder().build().unwrap());
        let placement = Placement::Affinity {
            wait: Duration::from_millis(200),
            liveness: Duration::from_secs(2),
        };
        let cluster = NamedCluster::start(&Process::cached(&scheduler.setup), placement)
            .await
            .unwrap();
        let mut executors = Vec::new();
        for i in 0..n {
            let name = format!("executor-{i}");
            let lake = LakeCache::builder()
                .range_memory_bytes(memory)
                .build()
                .unwrap();
            let executor = node(b, lake);
            cluster
                .add_executor(&name, &Process::cached(&executor.setup), 2)
                .await
                .unwrap();
            executors.push((name, executor));
        }
        Self {
            cluster,
            scheduler,
            executors,
        }
    }

    /// A client session whose scans have one file per partition (whole files, not byte
    /// ranges cut across them: a task's bytes then have one preferred executor), with `t`
    /// registered.
    async fn client(&self, b: &Backend, files: usize) -> SessionContext {
        let ctx = self.session(b, files).await;
        ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await
            .unwrap();
        ctx
    }

    /// A client session as [`AffinityCluster::client`]'s, with no table registered.
    async fn session(&self, b: &Backend, files: usize) -> SessionContext {
        let mut config = self.scheduler.setup.config().with_target_partitions(files);
        config.options_mut().optimizer.repartition_file_scans = false;
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_config(config)
            .build();
        let ctx = SessionContext::remote_with_state(self.cluster.url(), state)
            .await
            .unwrap();
        ctx.register_object_store(&b.store_url, b.raw.clone());
        ctx
    }

    /// GETs the executors sent, by executor, since the last reset.
    fn gets(&self) -> Vec<u64> {
        self.executors
            .iter()
            .map(|(_, n)| n.store.counts().get)
            .collect()
    }

    fn reset(&self) {
        for (_, n) in &self.executors {
            n.store.reset();
        }
    }

    /// Range-cache memory hits and misses of every executor, summed.
    fn memory_lookups(&self) -> (u64, u64) {
        self.executors.iter().fold((0, 0), |(h, m), (_, n)| {
            let s = n.setup.lake().stats().range.memory;
            (h + s.hits, m + s.misses)
        })
    }
}

/// With more files than partitions, the scheduler groups files by preferred executor: every
/// file a run reads is read on its own preferred executor, so each file is cached once in
/// the cluster, and warm runs whose tasks all ran there send no GET.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_affinity_a_tasks_files_share_its_preferred_executor() {
    use datafusion::execution::object_store::ObjectStoreUrl;
    use datafusion_lakecache::ballista::affinity::{object_key, preferred_executor};

    for b in s3_backends("ballista-groups") {
        let files = 24;
        b.write(&LakeSpec::small_files(files)).await;
        let plain = vanilla(&b).await;
        let cluster = AffinityCluster::start(&b, 2, 1 << 30).await;
        // Four partitions for 24 files: six files a task.
        let ctx = cluster.session(&b, 4).await;
        ctx.register_parquet("t", b.table_url(), ParquetReadOptions::default())
            .await
            .unwrap();
        let names: Vec<String> = cluster.executors.iter().map(|(n, _)| n.clone()).collect();
        let store = ObjectStoreUrl::parse(b.store_url.as_str()).unwrap();
        let sql = "SELECT category, count(*), round(sum(value), 3) FROM t GROUP BY category ORDER BY category";
        let want = rows(&plain, sql).await.unwrap();
        let mut elsewhere_before = 0;
        for run in 1..=3 {
            cluster.reset();
            let before = cluster.cluster.placement().unwrap();
            assert_eq!(rows(&ctx, sql).await.unwrap(), want, "{} run {run}", b.name);
            let elsewhere = cluster.cluster.placement().unwrap().elsewhere - before.elsewhere;
            let mut read = 0;
            for (name, e) in &cluster.executors {
                for (path, _) in e.store.gets() {
                    let owner = preferred_executor(&names, &object_key(&store, &path));
                    read += 1;
                    if elsewhere == 0 {
                        assert_eq!(
                            owner,
                            Some(name),
                            "{} run {run}: {path} read on {name}",
                            b.name
                        );
                    }
                }
            }
            eprintln!(
                "{} run {run}: {read} GETs, {elsewhere} tasks elsewhere, by executor {:?}",
                b.name,
                cluster.gets()
            );
            if run == 1 {
                assert!(read >= files, "{}: the cold run read every file", b.name);
            } else if elsewhere == 0 && elsewhere_before == 0 {
                assert_eq!(read, 0, "{} run {run}: warm", b.name);
            }
            elsewhere_before = elsewhere;
        }
    }
}

/// Runs `sql` (whose rows are `want`) three times on `cluster`, and says how each run was
/// placed and served. Fails if the memory hit rate of run 2 or 3 is below `min_rate`, or, when
/// `all_cached`, if a run sent a GET although its tasks and those of the run before it all
/// ran on their preferred executor (a task placed elsewhere leaves its file to be read once
/// by its preferred executor in a later run).
async fn three_runs(
    cluster: &AffinityCluster,
    ctx: &SessionContext,
    sql: &str,
    want: &[String],
    all_cached: bool,
    min_rate: f64,
) -> Vec<String> {
    let mut report = Vec::new();
    let mut elsewhere_before = 0;
    for run in 1..=3 {
        cluster.reset();
        let before = cluster.cluster.placement().unwrap();
        let (hits, misses) = cluster.memory_lookups();
        assert_eq!(rows(ctx, sql).await.unwrap(), want);
        let after = cluster.cluster.placement().unwrap();
        let (hits, misses) = (
            cluster.memory_lookups().0 - hits,
            cluster.memory_lookups().1 - misses,
        );
        let elsewhere = after.elsewhere - before.elsewhere;
        let gets = cluster.gets();
        let rate = hits as f64 / (hits + misses).max(1) as f64;
        let held: Vec<u64> = cluster
            .executors
            .iter()
            .map(|(_, e)| e.setup.lake().stats().range.memory_bytes)
            .collect();
        report.push(format!(
            "run {run}: {} tasks on their preferred executor, {elsewhere} elsewhere, GETs by \
             executor {gets:?}, memory hit rate {:.1}%, memory held {held:?}",
            after.preferred - before.preferred,
            rate * 100.0
        ));
        if run > 1 {
            if all_cached && elsewhere == 0 && elsewhere_before == 0 {
                assert_eq!(gets.iter().sum::<u64>(), 0, "{report:?}");
            }
            assert!(rate >= min_rate, "{report:?}");
        }
        elsewhere_before = elsewhere;
    }
    report
}

/// The lake of the affinity tests and the query they time.
const AFFINITY_FILES: usize = 32;
const AFFINITY_SQL: &str = "SELECT category, count(*), round(sum(value), 3), max(name) FROM t \
                            GROUP BY category ORDER BY category";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_affinity_tasks_run_where_their_files_are_cached_on_2_and_4_executors() {
    for b in s3_backends("ballista-affinity") {
        b.write(&LakeSpec::small_files(AFFINITY_FILES)).await;
        let plain = vanilla(&b).await;
        let want = rows(&plain, AFFINITY_SQL).await.unwrap();
        for n in [2, 4] {
            let cluster = AffinityCluster::start(&b, n, 1 << 30).await;
            let ctx = cluster.client(&b, AFFINITY_FILES).await;
            let report = three_runs(&cluster, &ctx, AFFINITY_SQL, &want, true, 0.8).await;
            eprintln!("{} x{n}: {}", b.name, report.join("; "));
            for sql in CORPUS {
                assert_eq!(
                    rows(&ctx, sql).await.unwrap(),
                    rows(&plain, sql).await.unwrap(),
                    "{} x{n}: {sql}",
                    b.name
                );
            }
            if n == 4 {
                // An executor leaves: the answers stay right, and once it counts as gone its
                // files move to the others, which serve them warm from the next run on.
                cluster.cluster.stop_executor("executor-3");
                tokio::time::sleep(Duration::from_secs(3)).await;
                let report = three_runs(&cluster, &ctx, AFFINITY_SQL, &want, true, 0.8).await;
                eprintln!("{} x4 after executor-3 left: {}", b.name, report.join("; "));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_affinity_the_executors_tiers_add_up_to_serve_a_lake_larger_than_each_warm() {
    // 2 executors (100 files) and a lake 1.5x one executor's memory tier; 4 (50 files each)
    // and a lake 3x one executor's tier. Each tier is the lake / (0.75 x executors): a
    // quarter of room for the uneven shares hashing gives.
    // Enough files that one or two tasks placed elsewhere on a loaded machine cost a few
    // percent of the lookups, not the 3% each of 32 files would.
    for (n, files) in [(2, 100), (4, 200)] {
        for b in s3_backends(&format!("ballista-affinity-capacity-{n}")) {
            b.write(&LakeSpec::small_files(files)).await;
            let plain = vanilla(&b).await;
            let want = rows(&plain, AFFINITY_SQL).await.unwrap();
            // What the query reads of the lake, measured in one process, sizes the tiers.
            let probe = LakeCache::builder().build().unwrap();
            let probe_ctx = common::installed(
                &b,
                b.counting(),
                &probe,
                SessionStateBuilder::new(),
                SessionConfig::new(),
            )
            .await;
            rows(&probe_ctx, AFFINITY_SQL).await.unwrap();
            let lake = probe.stats().range.memory_bytes;
            let memory = ((lake as f64 / (0.75 * n as f64)) as u64).max(1 << 20);
            let cluster = AffinityCluster::start(&b, n, memory).await;
            let ctx = cluster.client(&b, files).await;
            let report = three_runs(&cluster, &ctx, AFFINITY_SQL, &want, false, 0.95).await;
            eprintln!(
                "{}: lake {lake} bytes, {:.1}x the memory tier of {memory} on each of {n} \
                 executors: {}",
                b.name,
                lake as f64 / memory as f64,
                report.join("; ")
            );
        }
    }
}

/// Every row of `lakecache_cluster_metrics()`, by (process, cache, metric).
async fn cluster_metrics(ctx: &SessionContext) -> BTreeMap<(String, String, String), u64> {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::UInt64Type;
    let batches = ctx
        .sql("SELECT process, cache, metric, value FROM lakecache_cluster_metrics()")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut figures = BTreeMap::new();
    for batch in batches {
        let text = |i: usize| batch.column(i).as_string::<i32>().clone();
        let (process, cache, metric) = (text(0), text(1), text(2));
        let value = batch.column(3).as_primitive::<UInt64Type>();
        for row in 0..batch.num_rows() {
            let key = (
                process.value(row).to_string(),
                cache.value(row).to_string(),
                metric.value(row).to_string(),
            );
            assert!(!value.is_null(row));
            let earlier = figures.insert(key.clone(), value.value(row));
            assert_eq!(earlier, None, "{key:?} twice");
        }
    }
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_client_reads_every_processes_lifetime_figures_and_the_placement_in_one_query() {
    for b in s3_backends("ballista-cluster-metrics") {
        const FILES: usize = 8;
        b.write(&LakeSpec::small_files(FILES)).await;
        let cluster = AffinityCluster::start(&b, 2, 1 << 30).await;
        let ctx = cluster.client(&b, FILES).await;
        ctx.register_udtf(FUNCTION, cluster.scheduler.setup.cluster_metrics());
        for _ in 0..2 {
            rows(&ctx, AFFINITY_SQL).await.unwrap();
        }
        let placement = cluster.cluster.placement().unwrap();
        let figures = cluster_metrics(&ctx).await;
        let processes: BTreeSet<&str> = figures.keys().map(|k| k.0.as_str()).collect();
        assert_eq!(
            processes,
            BTreeSet::from(["executor-0", "executor-1", "scheduler"])
        );
        // Each process's counters, as its own `lake().stats()` gives them (entry counts
        // settle in the background, so they are left out).
        let counters = |process: &str, lake: &LakeCache| {
            for (cache, metric, value) in lake.stats().rows() {
                if ["hits", "misses", "bytes_served", "gets"].contains(&metric) {
                    let key = (process.to_string(), cache.to_string(), metric.to_string());
                    assert_eq!(figures.get(&key), Some(&value), "{key:?}");
                }
            }
        };
        counters("scheduler", cluster.scheduler.setup.lake());
        // Which executor ran which task depends on the machine's load (a task waits at most
        // 100 ms for its preferred executor), so the memory hits are summed, not asked of each.
        let mut memory_hits = 0;
        for (name, executor) in &cluster.executors {
            counters(name, executor.setup.lake());
            memory_hits += figures[&(name.clone(), "range.memory".into(), "hits".into())];
        }
        assert!(memory_hits > 0, "the warm run was served from memory");
        let placed =
            |metric: &str| figures[&("scheduler".into(), "placement".into(), metric.into())];
        assert_eq!(placed("preferred"), placement.preferred);
        assert_eq!(placed("waited"), placement.waited);
        assert_eq!(placed("elsewhere"), placement.elsewhere);
        assert_eq!(placed("not_scans"), placement.not_scans);
        assert!(placement.preferred > 0);
        // The figures' own tasks count in no placement figure.
        assert_eq!(cluster.cluster.placement().unwrap(), placement);
        // An executor that left is not asked.
        cluster.cluster.stop_executor("executor-1");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let figures = cluster_metrics(&ctx).await;
        let processes: BTreeSet<&str> = figures.keys().map(|k| k.0.as_str()).collect();
        assert_eq!(processes, BTreeSet::from(["executor-0", "scheduler"]));
    }
}

/// The value of the scan figure `name` in the text of `EXPLAIN ANALYZE` on a cluster (the
/// first stage's scan).
fn scan_figure(plan: &[String], name: &str) -> String {
    let values = common::scan_metric(plan, name);
    values
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no {name} in {plan:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_client_reads_a_querys_cache_figures_of_every_executor_with_explain_analyze() {
    // Each task's scan figures travel with its status to the scheduler, which sums them per
    // stage; Ballista's `EXPLAIN ANALYZE` on the client fetches them (`get_job_metrics`).
    for b in s3_backends("ballista-explain") {
        const FILES: usize = 8;
        b.write(&LakeSpec::small_files(FILES)).await;
        let cluster = AffinityCluster::start(&b, 2, 1 << 30).await;
        let ctx = cluster.client(&b, FILES).await;
        let explain = format!("EXPLAIN ANALYZE {AFFINITY_SQL}");
        let plan = rows(&ctx, &explain).await.unwrap();
        // Cold: each file's footer was loaded by the one task that read it, and its bytes
        // downloaded from the store (by the prefetcher, ahead of the readers).
        assert_eq!(scan_figure(&plan, "index_footer_misses"), FILES.to_string());
        assert_ne!(scan_figure(&plan, "prefetch_requests"), "0");
        // Each run's figures are the executors' own: the footer lookups their caches
        // counted in that run. Warm (once each file's preferred executor has read it), every
        // byte comes from memory.
        let footers = || {
            cluster.executors.iter().fold((0, 0), |(h, m), (_, e)| {
                let f = e.setup.lake().stats().index.footers;
                (h + f.hits, m + f.misses)
            })
        };
        let mut warm = false;
        for run in 2..=6 {
            let before = footers();
            let plan = rows(&ctx, &explain).await.unwrap();
            let after = footers();
            let (hits, misses) = (after.0 - before.0, after.1 - before.1);
            eprintln!(
                "run {run}: plan {} hits {} misses, executors {hits} {misses}; store {}, prefetched {}",
                scan_figure(&plan, "index_footer_hits"),
                scan_figure(&plan, "index_footer_misses"),
                scan_figure(&plan, "bytes_from_store"),
                scan_figure(&plan, "prefetch_requests"),
            );
            assert_eq!(scan_figure(&plan, "index_footer_hits"), hits.to_string());
            assert_eq!(
                scan_figure(&plan, "index_footer_misses"),
                misses.to_string()
            );
            if hits == FILES as u64
                && scan_figure(&plan, "bytes_from_store") == "0"
                && scan_figure(&plan, "prefetch_requests") == "0"
            {
                assert_ne!(scan_figure(&plan, "bytes_from_memory"), "0");
                warm = true;
                break;
            }
        }
        assert!(warm, "a run served from the executors' memory");
    }
}
