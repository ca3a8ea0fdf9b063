//! TPC-H at scale factor 0.1: the 22 queries (benches/tpch/queries.sql) over the 14 Parquet
//! files `tpchgen-cli` 4.0 writes (`bash scripts/tpch-data`, into `target/tpch/sf0.1`), side
//! by side in one run:
//!
//! - vanilla DataFusion over the files on the local disk;
//! - a session installed from a `LakeCache`, over the same local files;
//! - a session installed from another `LakeCache`, over the same files in a simulated remote
//!   store (`s3://tpch`: S3's spread of waits around `--latency-ms`, default 25, one request
//!   in a hundred 20 times longer, one 1 Gbit/s link, e_tags that are digests);
//! - a second vanilla session over the local files, the control: what the machine alone
//!   makes of two identical sides.
//!
//! A query counts as slower installed than vanilla when the interval of the median of its
//! paired ratios (installed's run over vanilla's next to it), at a confidence that leaves
//! one chance in twenty to flag any of the 22 queries between identical sides, lies above
//! 1; the control's ratios pass the same test in the same run, so the run shows what the
//! rule makes of noise.
//!
//! Each query runs once cold on every side (its answers compared: they must be equal), then
//! `--runs` (default 5) times warm on each side in turn (each run starting with the next
//! side); the figures are the medians, the requests those the remote side's warm runs sent.
//! Every session has 2 partitions.
//! `cargo bench --bench tpch` (options: `-- --data DIR --runs N --latency-ms N --query qN`;
//! `--explain 1` compares vanilla DataFusion's plan of each query with the installed
//! session's instead, printing both where they differ;
//! `--plans-only 1` times the warm runs' planning alone (to a physical plan, not run);
//! `--side-alone vanilla|installed|remote` runs the warm runs of that side alone, to profile
//! it;
//! `LAKECACHE_*` variables set both caches' settings, for a trial; the figures reported are
//! of the defaults).

mod common;

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{arg, context, ms, remote_s3_like, text};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_lakecache::LakeCache;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use url::Url;

/// The sides, as `--side-alone` names them.
const SIDES: [&str; 4] = ["vanilla", "installed", "remote", "control"];

/// The confidence of each query's interval: 1 - 0.05 / 22, so that between two identical
/// sides the chance that any of the 22 queries' intervals misses 1 is at most one in twenty.
const CONFIDENCE: f64 = 1.0 - 0.05 / 22.0;

const TABLES: [&str; 8] = [
    "customer", "lineitem", "nation", "orders", "part", "partsupp", "region", "supplier",
];

/// The 22 queries, by name, from benches/tpch/queries.sql.
fn queries() -> Vec<(String, String)> {
    let mut queries: Vec<(String, String)> = Vec::new();
    for line in include_str!("tpch/queries.sql").lines() {
        match line.strip_prefix("-- q") {
            Some(n) if n.chars().all(|c| c.is_ascii_digit()) => {
                queries.push((format!("q{n}"), String::new()))
            }
            _ => {
                if let Some((_, sql)) = queries.last_mut()
                    && !line.starts_with("--")
                {
                    sql.push_str(line);
                    sql.push('\n');
                }
            }
        }
    }
    queries
}

/// The data directory: `--data DIR`, or `target/tpch/sf0.1`.
fn data_dir() -> PathBuf {
    PathBuf::from(text("--data").unwrap_or_else(|| "target/tpch/sf0.1".to_string()))
}

/// Every file under `dir`, by its path relative to `dir`.
fn files_under(dir: &FsPath) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for table in TABLES {
        for entry in std::fs::read_dir(dir.join(table))? {
            found.push(PathBuf::from(table).join(entry?.file_name()));
        }
    }
    Ok(found)
}

/// Registers the eight tables in `ctx`, each from `{base}{table}/`.
async fn register(ctx: &SessionContext, base: &str) -> Result<()> {
    for table in TABLES {
        ctx.register_parquet(
            table,
            format!("{base}{table}/"),
            ParquetReadOptions::default(),
        )
        .await?;
    }
    Ok(())
}

/// Runs `sql`; its answer as text, and its time.
async fn answer(ctx: &SessionContext, sql: &str) -> Result<(String, Duration)> {
    let began = std::time::Instant::now();
    let batches = ctx.sql(sql).await?.collect().await?;
    let took = began.elapsed();
    Ok((pretty_format_batches(&batches)?.to_string(), took))
}

/// Plans `sql` to its physical plan, without running it; the time that took.
async fn planned(ctx: &SessionContext, sql: &str) -> Result<Duration> {
    let began = std::time::Instant::now();
    ctx.sql(sql).await?.create_physical_plan().await?;
    Ok(began.elapsed())
}

/// One warm run of `sql` on `ctx`: its planning alone with `plans_only`, else the whole query.
async fn warm_run(ctx: &SessionContext, sql: &str, plans_only: bool) -> Result<Duration> {
    match plans_only {
        true => planned(ctx, sql).await,
        false => Ok(answer(ctx, sql).await?.1),
    }
}

fn median(mut times: Vec<Duration>) -> f64 {
    times.sort();
    ms(times[times.len() / 2])
}

/// One side against vanilla, run by run.
struct Paired {
    /// Each run's ratio (the side's time over vanilla's in the same run), sorted.
    ratios: Vec<f64>,
    /// The ratio of the fastest runs (what noise only adds to).
    fastest: f64,
}

impl Paired {
    fn of(vanilla: &[Duration], side: &[Duration]) -> Self {
        let mut ratios: Vec<f64> = vanilla
            .iter()
            .zip(side)
            .map(|(v, s)| s.as_secs_f64() / v.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        let fastest = |t: &[Duration]| t.iter().min().map_or(f64::NAN, |d| d.as_secs_f64());
        Self {
            ratios,
            fastest: fastest(side) / fastest(vanilla),
        }
    }

    /// The median of the runs' ratios: steadier than the ratio of medians on a shared machine,
    /// as slow stretches of the machine hit both sides of a run.
    fn median(&self) -> f64 {
        self.ratios[self.ratios.len() / 2]
    }

    /// The interval that holds the median of the ratios at `CONFIDENCE`, from the runs' order
    /// alone (the sign test's: no assumption on how the ratios spread); the whole range when
    /// there are too few runs for that confidence.
    fn interval(&self) -> (f64, f64) {
        let n = self.ratios.len();
        let k = median_rank(n, CONFIDENCE);
        match k {
            0 => (self.ratios[0], self.ratios[n - 1]),
            k => (self.ratios[k - 1], self.ratios[n - k]),
        }
    }

    /// Slower than vanilla beyond what the machine's noise explains: the interval lies above 1.
    fn slower(&self) -> bool {
        self.interval().0 > 1.0
    }
}

/// The largest k such that the k-th smallest and the k-th largest of `n` draws hold their
/// median with probability at least `confidence`: the largest k with P(B <= k - 1) at most
/// (1 - confidence) / 2, for B binomial(n, 1/2). Summed in logarithms, so that any `n` stays
/// within a float's range.
fn median_rank(n: usize, confidence: f64) -> usize {
    let tail = (1.0 - confidence) / 2.0;
    let half = (n as f64) * 0.5f64.ln();
    let (mut below, mut ln_choose, mut k) = (0.0, 0.0, 0);
    for j in 0..n {
        let p = (ln_choose + half).exp();
        if below + p > tail {
            break;
        }
        below += p;
        k = j + 1;
        ln_choose += ((n - j) as f64).ln() - ((j + 1) as f64).ln();
    }
    k
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let dir = data_dir();
    let files = files_under(&dir).map_err(|e| {
        DataFusionError::Execution(format!(
            "no TPC-H data in {} ({e}): run `bash scripts/tpch-data` first",
            dir.display()
        ))
    })?;
    let dir = dir.canonicalize()?;
    let runs = arg("--runs", 5) as usize;
    let latency = Duration::from_millis(arg("--latency-ms", 25));

    let memory = Arc::new(InMemory::new());
    for file in &files {
        let bytes = std::fs::read(dir.join(file))?;
        let path = Path::from(file.to_string_lossy().as_ref());
        memory.put(&path, PutPayload::from(bytes)).await?;
    }
    let remote = remote_s3_like(memory, latency, 125_000_000, 7).await?;

    let local = format!("{}/", dir.display());
    let vanilla = context(None)?;
    register(&vanilla, &local).await?;
    let local_lake = LakeCache::builder().with_env().build()?;
    let installed = context(Some(&local_lake))?;
    register(&installed, &local).await?;
    let remote_lake = LakeCache::builder().with_env().build()?;
    let cached = context(Some(&remote_lake))?;
    let url = Url::parse("s3://tpch").expect("static URL");
    cached.register_object_store(&url, Arc::clone(&remote) as Arc<dyn ObjectStore>);
    register(&cached, "s3://tpch/").await?;
    let control = context(None)?;
    register(&control, &local).await?;

    println!(
        "TPC-H SF0.1, {} files; {runs} warm runs each, medians in ms; remote: S3-like waits \
         (median {} ms, 1% at 20x), 1 Gbit/s; requests H/G/L of the remote side's warm runs",
        files.len(),
        latency.as_millis()
    );
    println!(
        "query | vanilla, local disk | installed, local disk (x vanilla) | installed / vanilla: \
         median of paired runs [interval], fastest runs | control / vanilla: the same | cached \
         remote (x vanilla) | remote cold | warm requests | answers"
    );
    let (mut sums, mut slower, mut differ) = ([0.0f64; 4], Vec::new(), Vec::new());
    let (mut slower_paired, mut slower_fastest) = (Vec::new(), Vec::new());
    let (mut slower_surely, mut control_slower) = (Vec::new(), Vec::new());
    let listed = |v: &[String]| match v.is_empty() {
        true => "none".to_string(),
        false => v.join(", "),
    };
    let only = text("--query");
    let plans_only = arg("--plans-only", 0) == 1;
    let explain = arg("--explain", 0) == 1;
    let alone = match text("--side-alone") {
        None => None,
        Some(side) => Some(SIDES.iter().position(|s| *s == side).ok_or_else(|| {
            DataFusionError::Configuration(format!(
                "--side-alone {side}: not one of {}",
                SIDES.join(", ")
            ))
        })?),
    };
    for (name, sql) in queries() {
        if only.as_ref().is_some_and(|q| *q != name) {
            continue;
        }
        let sides = [&vanilla, &installed, &cached, &control];
        if explain {
            let mut plans = Vec::new();
            for ctx in &sides[..2] {
                let plan = ctx.sql(&format!("EXPLAIN {sql}")).await?.collect().await?;
                plans.push(pretty_format_batches(&plan)?.to_string());
            }
            if plans[0] == plans[1] {
                println!("{name}: the same plan");
            } else {
                println!(
                    "{name}: vanilla's plan\n{}\ninstalled\n{}",
                    plans[0], plans[1]
                );
                differ.push(name);
            }
            continue;
        }
        let mut answers = Vec::new();
        let mut cold = Duration::ZERO;
        for (i, ctx) in sides.iter().enumerate() {
            let (text, took) = answer(ctx, &sql).await?;
            if SIDES[i] == "remote" {
                cold = took;
            }
            answers.push(text);
        }
        let equal = answers.windows(2).all(|w| w[0] == w[1]);
        if !equal {
            differ.push(name.clone());
        }
        if let Some(side) = alone {
            let mut times = Vec::new();
            for _ in 0..runs {
                times.push(warm_run(sides[side], &sql, plans_only).await?);
            }
            println!("{name} | {:.1} ({})", median(times), SIDES[side]);
            continue;
        }
        let mut times = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        remote.reset();
        for run in 0..runs {
            // Each run starts with another side, so that no side always follows the same one
            // (and finds the CPU's caches as that one left them).
            for k in 0..sides.len() {
                let i = (run + k) % sides.len();
                times[i].push(warm_run(sides[i], &sql, plans_only).await?);
            }
        }
        let requests = remote.counts();
        let ours = Paired::of(&times[0], &times[1]);
        let theirs = Paired::of(&times[0], &times[3]);
        let (paired, fastest) = (ours.median(), ours.fastest);
        let medians = times.map(median);
        for (sum, m) in sums.iter_mut().zip(medians) {
            *sum += m;
        }
        let [v, i, c, _] = medians;
        if i > v {
            slower.push(format!("{name} {:.2}x", i / v));
        }
        if paired > 1.0 {
            slower_paired.push(format!("{name} {paired:.3}x"));
        }
        if fastest > 1.0 {
            slower_fastest.push(format!("{name} {fastest:.3}x"));
        }
        if ours.slower() {
            slower_surely.push(format!("{name} {paired:.3}x"));
        }
        if theirs.slower() {
            control_slower.push(format!("{name} {:.3}x", theirs.median()));
        }
        let shown = |p: &Paired| {
            let (low, high) = p.interval();
            format!("{:.3}x [{low:.3}, {high:.3}]", p.median())
        };
        println!(
            "{name} | {v:.1} | {i:.1} ({:.2}x) | {}, {fastest:.3}x | {} | {c:.1} ({:.2}x) | \
             {:.0} | {}/{}/{} | {}",
            i / v,
            shown(&ours),
            shown(&theirs),
            c / v,
            ms(cold),
            requests.head,
            requests.get,
            requests.list,
            if equal { "equal" } else { "DIFFERENT" }
        );
    }
    if alone.is_some() {
        return Ok(());
    }
    if explain {
        println!("plans that differ: {}", listed(&differ));
        return Ok(());
    }
    println!(
        "sum of medians: vanilla local {:.1} ms, installed local {:.1} ms ({:.2}x), cached \
         remote {:.1} ms ({:.2}x); installed slower than vanilla: by medians {}; by paired \
         runs {}; by fastest runs {}; answers not equal: {}",
        sums[0],
        sums[1],
        sums[1] / sums[0],
        sums[2],
        sums[2] / sums[0],
        listed(&slower),
        listed(&slower_paired),
        listed(&slower_fastest),
        listed(&differ),
    );
    println!(
        "control: vanilla again {:.1} ms ({:.2}x); slower than vanilla beyond the noise (paired \
         interval above 1, at {:.2}% per query): installed {}; control {}",
        sums[3],
        sums[3] / sums[0],
        CONFIDENCE * 100.0,
        listed(&slower_surely),
        listed(&control_slower),
    );
    Ok(())
}
