//! What the tenant rule costs: sessions of one `LakeCache` get cache hits only for versions
//! their own store identity has shown it can read. Side by side in one run:
//!
//! - one session alone;
//! - 8 sessions over one store (the `Arc` every session registers: one identity);
//! - 8 sessions, each over a store instance of its own (8 identities over one backend; the
//!   lake's e_tags are digests of the bytes, as S3's are, so a version one identity proved is
//!   shared with the next for one HEAD);
//! - vanilla DataFusion, one session and 8 at once, each over a store instance of its own.
//!
//! Cold: a new `LakeCache`, the sessions at once, each registering the lake and running the
//! query. Warm: after one session filled the cache, sessions one after the other, each new
//! (registration and query), as a service answering each user afresh runs them; the figure
//! is per session. Requests are what reached the store (HEAD/LIST/GET).
//!
//! The lake: `--files` (default 200) files of 5,000 rows in an in-memory store behind S3's
//! spread of waits per real request (below range coalescing: a log-normal body around 25 ms,
//! one in a hundred 20 times longer) and one shared 1 Gbit/s link, as `s3://lake`.
//! `cargo bench --bench tenants` (options: `-- --files N --sessions N --runs N`).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Remote, arg, context, memory_lake, ms, remote_s3_like, run};
use datafusion::error::Result;
use datafusion::prelude::ParquetReadOptions;
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::RequestCounts;
use datafusion_lakecache::testkit::lake::LakeSpec;
use object_store::ObjectStore;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use url::Url;

const QUERIES: [(&str, &str); 2] = [
    (
        "group-by",
        "SELECT category, round(sum(value), 3) FROM t GROUP BY category",
    ),
    (
        "filter",
        "SELECT id, name FROM t WHERE value > 999.0 AND category = 'beta'",
    ),
];

/// How the sessions' stores relate.
#[derive(Clone, Copy)]
enum Stores {
    /// Every session registers the same store.
    One,
    /// Every session registers a store instance of its own over the same backend.
    Each,
}

impl Stores {
    /// The store session `_i` registers.
    fn for_session(self, remote: &Arc<Remote>) -> Arc<dyn ObjectStore> {
        let shared = Arc::clone(remote) as Arc<dyn ObjectStore>;
        match self {
            Stores::One => shared,
            // A new instance (a store per session, as a server that builds one per request
            // would make), forwarding to the same backend and counts.
            Stores::Each => Arc::new(PrefixStore::new(shared, Path::default())),
        }
    }
}

/// A new session of `lake` (vanilla DataFusion when `None`) over `store`: registers the lake
/// and runs `sql`. Returns the rows.
async fn session(
    lake: Option<&LakeCache>,
    store: Arc<dyn ObjectStore>,
    sql: &str,
) -> Result<usize> {
    let url = Url::parse("s3://lake").expect("static URL");
    let ctx = context(lake)?;
    ctx.register_object_store(&url, store);
    ctx.register_parquet("t", "s3://lake/lake/", ParquetReadOptions::default())
        .await?;
    Ok(run(&ctx, sql).await?.0)
}

/// `n` sessions at once; the wall time.
async fn at_once(
    n: usize,
    lake: Option<&LakeCache>,
    stores: Stores,
    remote: &Arc<Remote>,
    sql: &str,
) -> Result<Duration> {
    let began = Instant::now();
    let sessions = (0..n).map(|_| session(lake, stores.for_session(remote), sql));
    let rows = futures::future::try_join_all(sessions).await?;
    assert!(
        rows.windows(2).all(|w| w[0] == w[1]),
        "every session's rows"
    );
    Ok(began.elapsed())
}

/// `n` new sessions one after the other; the mean time of one.
async fn one_by_one(
    n: usize,
    lake: &LakeCache,
    stores: Stores,
    remote: &Arc<Remote>,
    sql: &str,
) -> Result<Duration> {
    let began = Instant::now();
    for _ in 0..n {
        session(Some(lake), stores.for_session(remote), sql).await?;
    }
    Ok(began.elapsed() / n as u32)
}

fn counts(c: RequestCounts) -> String {
    format!("{}/{}/{}", c.head, c.list, c.get)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let files = arg("--files", 200) as usize;
    let sessions = arg("--sessions", 8) as usize;
    let runs = arg("--runs", 3) as usize;
    let (memory, _) = memory_lake(&LakeSpec::small_files(files)).await?;
    let remote = remote_s3_like(memory, Duration::from_millis(25), 125_000_000, 33).await?;
    println!(
        "{files} files of 5000 rows, S3-like e_tags, S3-like waits (median 25 ms, 1% at 20x), \
         one 1 Gbit/s link; requests HEAD/LIST/GET"
    );
    for (name, sql) in QUERIES {
        println!("{name}: {sql}");
        for r in 0..runs {
            // Cold: a new LakeCache each, the sessions at once; then vanilla DataFusion's
            // one and its `sessions`, each over a store of its own.
            let mut cold = Vec::new();
            for (n, stores, cached) in [
                (1, Stores::One, true),
                (sessions, Stores::One, true),
                (sessions, Stores::Each, true),
                (1, Stores::One, false),
                (sessions, Stores::Each, false),
            ] {
                let lake = LakeCache::builder().build()?;
                remote.reset();
                let took = at_once(n, cached.then_some(&lake), stores, &remote, sql).await?;
                cold.push((took, remote.counts(), lake.stats().handle.proof_heads));
            }
            // Warm: one session fills a new LakeCache; then new sessions one by one.
            let mut warm = Vec::new();
            for (n, stores) in [
                (1, Stores::One),
                (sessions, Stores::One),
                (sessions, Stores::Each),
            ] {
                let lake = LakeCache::builder().build()?;
                session(
                    Some(&lake),
                    Arc::clone(&remote) as Arc<dyn ObjectStore>,
                    sql,
                )
                .await?;
                let heads_before = lake.stats().handle.proof_heads;
                remote.reset();
                let took = one_by_one(n, &lake, stores, &remote, sql).await?;
                let heads = lake.stats().handle.proof_heads - heads_before;
                warm.push((took, remote.counts(), heads, n));
            }
            println!(
                "  run {}: cold: one {:.1} ms {} | x{sessions} one store {:.1} ms {} | \
                 x{sessions} a store each {:.1} ms {} ({} proof HEADs) | vanilla one {:.1} ms {} \
                 | vanilla x{sessions} a store each {:.1} ms {}",
                r + 1,
                ms(cold[0].0),
                counts(cold[0].1),
                ms(cold[1].0),
                counts(cold[1].1),
                ms(cold[2].0),
                counts(cold[2].1),
                cold[2].2,
                ms(cold[3].0),
                counts(cold[3].1),
                ms(cold[4].0),
                counts(cold[4].1),
            );
            let per = |w: &(Duration, RequestCounts, u64, usize)| {
                let n = w.3 as u64;
                let c = w.1;
                format!(
                    "{:.1} ms {:.1}/{:.1}/{:.1}",
                    ms(w.0),
                    c.head as f64 / n as f64,
                    c.list as f64 / n as f64,
                    c.get as f64 / n as f64
                )
            };
            println!(
                "         warm, per session: one {} | one store {} ({:.2}x the time) | a store \
                 each {} ({:.2}x the time, {:.2} proof HEADs per file and identity)",
                per(&warm[0]),
                per(&warm[1]),
                ms(warm[1].0) / ms(warm[0].0),
                per(&warm[2]),
                ms(warm[2].0) / ms(warm[0].0),
                warm[2].2 as f64 / (sessions * files) as f64,
            );
            let ratio = |of: usize, to: usize| {
                (
                    ms(cold[of].0) / ms(cold[to].0),
                    cold[of].1.total() as f64 / cold[to].1.total() as f64,
                )
            };
            let ((t1, r1), (t8, r8), (vt, vr)) = (ratio(1, 0), ratio(2, 0), ratio(4, 3));
            println!(
                "         cold x{sessions} against one: one store {t1:.2}x the time and {r1:.2}x \
                 the requests, a store each {t8:.2}x and {r8:.2}x (vanilla, a store each: \
                 {vt:.2}x and {vr:.2}x)",
            );
        }
    }
    Ok(())
}
