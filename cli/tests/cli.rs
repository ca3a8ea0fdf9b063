//! The `lakecache` binary, run as a user runs it: `-c`, `-f` (continuing after a failed
//! statement), the flags it shares with datafusion-cli, the rc file, the summary of each
//! statement on stderr, `\object_store_profiling` below the caches, `RUST_LOG`, tables on
//! S3 and over HTTP, Iceberg tables, the progress line, the demo, and one readable line with a
//! non-zero exit for each kind of bad input.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::path::Path as FsPath;
use std::process::{Command, Output, Stdio};

use common::{Backend, backends, local_backend};
use datafusion_lakecache::testkit::HttpDir;
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use object_store::local::LocalFileSystem;
use object_store::path::Path;

fn lakecache(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lakecache"));
    command.args(args);
    for (k, v) in envs {
        command.env(k, v);
    }
    command.output().expect("lakecache runs")
}

/// Runs the tool at the prompt with `input` on stdin, in `dir`, with `envs`.
fn lakecache_prompt(dir: &FsPath, args: &[&str], envs: &[(&str, &str)], input: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lakecache"));
    command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        command.env(k, v);
    }
    let mut child = command.spawn().expect("lakecache runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("input written");
    child.wait_with_output().expect("lakecache ends")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The summary lines the tool printed.
fn summaries(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("lakecache: handles"))
        .collect()
}

/// The figure after `name` in a summary line (`... disk 12 KiB ...` gives 12 for "disk").
fn figure(line: &str, name: &str) -> u64 {
    let after = line
        .split(name)
        .nth(1)
        .unwrap_or_else(|| panic!("{name} in {line}"));
    after
        .trim()
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a number after {name} in {line}"))
}

/// Runs the tool with `args` against `b`'s store: for S3, with the endpoint and credentials
/// of the S3 server.
fn lakecache_on(b: &Backend, args: &[&str]) -> Output {
    match std::env::var("LAKECACHE_S3_ENDPOINT") {
        Ok(endpoint) if b.name == "s3" => {
            let mut all = vec!["--endpoint", endpoint.as_str()];
            all.extend_from_slice(args);
            let envs = [
                ("AWS_ACCESS_KEY_ID", "lakecache"),
                ("AWS_SECRET_ACCESS_KEY", "lakecache"),
                ("AWS_REGION", "us-east-1"),
            ];
            lakecache(&all, &envs)
        }
        _ => lakecache(args, &[]),
    }
}

fn create(b: &Backend) -> String {
    format!(
        "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION '{}'",
        b.table_url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_go_to_stdout_and_each_statements_own_summary_to_stderr() {
    for b in backends("cli") {
        b.write(&LakeSpec::small_files(3)).await;
        let create = create(&b);

        // CSV on stdout stays CSV; a summary per statement on stderr.
        // A filter, so that the count scans the files rather than answering from the
        // statistics the CREATE collected.
        let count = "SELECT count(*) AS n FROM t WHERE value >= 0";
        let out = lakecache_on(
            &b,
            &["--format", "csv", "-c", &create, "-c", count, "-c", count],
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{}: {stderr}", b.name);
        assert!(
            stdout.contains("n\n15000"),
            "{}: csv rows:\n{stdout}",
            b.name
        );
        assert!(
            !stdout.contains("lakecache"),
            "{}: stdout:\n{stdout}",
            b.name
        );
        let lines = summaries(&stderr);
        assert_eq!(
            lines.len(),
            3,
            "{}: a summary per statement:\n{stderr}",
            b.name
        );
        // What each statement did, not totals: both counts found their listing in the cache,
        // one hit each.
        let listing_hits = |l: &str| figure(l, "listings");
        assert_eq!(listing_hits(lines[1]), 1, "{}:\n{stderr}", b.name);
        assert_eq!(listing_hits(lines[2]), 1, "{}:\n{stderr}", b.name);
        if b.name == "s3" {
            // The footers were read once, and the second count found them all in the cache.
            let misses = |l: &str| figure(l.split("footers").nth(1).unwrap(), "hits /");
            assert_eq!(misses(lines[2]), 0, "{}: {}", b.name, lines[2]);
            assert!(figure(lines[2], "footers") > 0, "{}: {}", b.name, lines[2]);
        }

        // -f with two statements, JSON, quiet: only the rows.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("q.sql");
        std::fs::write(
            &file,
            format!("-- a comment\n{create};\nSELECT category, count(*) AS n\nFROM t WHERE category = 'beta'\nGROUP BY category;\n"),
        )
        .unwrap();
        let file = file.display().to_string();
        let out = lakecache_on(&b, &["-q", "--format", "json", "-f", &file]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{}: {}", b.name, text(&out.stderr));
        assert!(
            stdout.contains("\"category\":\"beta\""),
            "{}: json:\n{stdout}",
            b.name
        );
        assert!(text(&out.stderr).is_empty(), "{}: quiet", b.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iceberg_table_is_created_in_sql_and_read_at_a_snapshot() {
    use datafusion_lakecache::testkit::iceberg::{IcebergWriter, cities, cities_schema};
    for b in backends("cli_iceberg") {
        let location = format!("{}ice", b.table_url());
        let mut w = IcebergWriter::create(
            std::sync::Arc::clone(&b.raw),
            &b.store_url,
            &location,
            "ice",
            cities_schema(),
        )
        .await
        .unwrap();
        let first = w.append(cities(0, 30)).await.unwrap();
        w.append(cities(30, 12)).await.unwrap();
        let newest = format!("CREATE EXTERNAL TABLE t STORED AS ICEBERG LOCATION '{location}'");
        let pinned = format!(
            "CREATE EXTERNAL TABLE s STORED AS ICEBERG LOCATION '{location}' \
             OPTIONS ('iceberg.snapshot_id' '{first}')"
        );
        let out = lakecache_on(
            &b,
            &[
                "--format",
                "csv",
                "-c",
                &newest,
                "-c",
                &pinned,
                "-c",
                "SELECT count(*) AS n, sum(id) AS s FROM t WHERE city <> 'none'",
                "-c",
                "SELECT count(*) AS n, sum(id) AS s FROM s WHERE city <> 'none'",
            ],
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{}: {stderr}", b.name);
        let sums = |n: i64| format!("n,s\n{n},{}", (0..n).sum::<i64>());
        assert!(stdout.contains(&sums(42)), "{}: newest:\n{stdout}", b.name);
        assert!(
            stdout.contains(&sums(30)),
            "{}: snapshot {first}:\n{stdout}",
            b.name
        );
    }
}

#[test]
fn a_file_goes_on_after_a_failed_statement_unless_told_to_stop() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("q.sql");
    std::fs::write(
        &file,
        "SELECT 1 AS first;\nSELECT no_such_column;\nSELECT 3 AS third;\n",
    )
    .unwrap();
    let file = file.display().to_string();
    let out = lakecache(&["-q", "--format", "csv", "-f", &file], &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        stdout.contains("first") && stdout.contains("third"),
        "{stdout}"
    );
    assert!(stderr.contains("no_such_column"), "{stderr}");
    assert!(stderr.contains("1 of the 3 statements"), "{stderr}");
    assert!(
        !out.status.success(),
        "a failed statement shows in the exit code"
    );

    let out = lakecache(&["-q", "--stop-on-error", "-f", &file], &[]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("first") && !stdout.contains("third"),
        "{stdout}"
    );
    assert!(!out.status.success());
    assert_eq!(text(&out.stderr).trim_end().lines().count(), 1);
}

#[test]
fn datafusion_cli_flags_mean_what_they_mean_there() {
    // -b sets the batch size; --maxrows limits the table shown.
    let out = lakecache(
        &[
            "-q",
            "-b",
            "123",
            "-c",
            "SHOW datafusion.execution.batch_size",
        ],
        &[],
    );
    assert!(text(&out.stdout).contains("123"), "{}", text(&out.stdout));
    let series = "SELECT * FROM generate_series(1, 50)";
    let out = lakecache(&["-q", "--maxrows", "3", "-c", series], &[]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("| 3 ") && !stdout.contains("| 4 "),
        "{stdout}"
    );
    let out = lakecache(&["-q", "--maxrows", "inf", "-c", series], &[]);
    assert!(text(&out.stdout).contains("| 50 "), "{}", text(&out.stdout));
    let out = lakecache(&["--maxrows", "lots", "-c", series], &[]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("Invalid maxrows lots"));

    // -m bounds the memory pool, of the --mem-pool-type asked for: a sort larger than it
    // cannot get its memory. With room to spill, -d bounds the spill files.
    let sort = "SELECT v FROM generate_series(1, 3000000) AS s(v) ORDER BY v DESC";
    for pool in ["greedy", "fair"] {
        let out = lakecache(
            &[
                "-q",
                "--maxrows",
                "1",
                "-m",
                "1m",
                "--mem-pool-type",
                pool,
                "-c",
                sort,
            ],
            &[],
        );
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{pool}: {}", text(&out.stdout));
        assert!(stderr.contains("Resources exhausted"), "{pool}: {stderr}");
        assert!(stderr.contains(&format!("{pool}(")), "{pool}: {stderr}");
    }
    let spill = ["-q", "--maxrows", "1", "-m", "16m", "-d", "1m", "-c", sort];
    let out = lakecache(&spill, &[]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("exceeded the allowable limit of 1024.0 KB"));
    let out = lakecache(&["-q", "--maxrows", "1", "-m", "16m", "-c", sort], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = lakecache(&["-m", "lots", "-c", "SELECT 1"], &[]);
    assert!(text(&out.stderr).contains("Invalid memory pool size 'lots'"));

    // -p: relative paths read from the data path.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("v.csv"), "a,b\n1,2\n").unwrap();
    let data = dir.path().display().to_string();
    let out = lakecache(&["-q", "-p", &data, "-c", "SELECT b FROM 'v.csv'"], &[]);
    assert!(text(&out.stdout).contains("| 2 |"), "{}", text(&out.stderr));
}

#[test]
fn the_prompt_runs_the_rc_file_first() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join(".datafusionrc"),
        "SET datafusion.execution.batch_size = 321;\n",
    )
    .unwrap();
    let home_dir = home.path().display().to_string();
    let show = "SHOW datafusion.execution.batch_size;\n\\q\n";
    let out = lakecache_prompt(home.path(), &["-q"], &[("HOME", &home_dir)], show);
    assert!(text(&out.stdout).contains("321"), "{}", text(&out.stdout));

    // -r replaces it.
    let other = home.path().join("other.sql");
    std::fs::write(&other, "SET datafusion.execution.batch_size = 77;\n").unwrap();
    let other = other.display().to_string();
    let out = lakecache_prompt(
        home.path(),
        &["-q", "-r", &other],
        &[("HOME", &home_dir)],
        show,
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("77") && !stdout.contains("321"), "{stdout}");
}

#[test]
fn shared_settings_come_from_the_environment_the_rc_file_and_set_in_that_order() {
    let home = tempfile::tempdir().unwrap();
    let home_dir = home.path().display().to_string();
    std::fs::write(
        home.path().join(".datafusionrc"),
        "-- the caches of this machine\n\
         SET lakecache.handle.capacity = 4321;\n\
         SET lakecache.range.memory = '96MiB';\n",
    )
    .unwrap();
    let show = "SELECT name, value FROM information_schema.df_settings \
                WHERE name IN ('lakecache.handle.capacity', 'lakecache.range.memory', \
                'lakecache.index.capacity', 'lakecache.store.hedge') ORDER BY name;\n\\q\n";
    let env = [
        ("HOME", home_dir.as_str()),
        ("LAKECACHE_INDEX_CAPACITY", "8MiB"),
        ("LAKECACHE_RANGE_MEMORY", "64MiB"),
        ("LAKECACHE_HANDLE_CAPACITY", "99"),
    ];
    let out = lakecache_prompt(
        home.path(),
        &[
            "-q",
            "--format",
            "csv",
            "--set",
            "lakecache.store.hedge=false",
        ],
        &env,
        show,
    );
    let stdout = text(&out.stdout);
    // The environment over the defaults, the rc file over the environment, --set over all.
    for row in [
        "lakecache.handle.capacity,4321",
        "lakecache.index.capacity,8MiB",
        "lakecache.range.memory,96MiB",
        "lakecache.store.hedge,false",
    ] {
        assert!(
            stdout.contains(row),
            "{row} in {stdout}\n{}",
            text(&out.stderr)
        );
    }

    // In a session, a shared key says where it is set.
    let out = lakecache(&["-c", "SET lakecache.handle.capacity = 5"], &[]);
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("LAKECACHE_HANDLE_CAPACITY")
            && stderr.contains("rc file"),
        "{stderr}"
    );
    // A misspelt variable of a settings group is refused by name.
    let out = lakecache(&["-c", "SELECT 1"], &[("LAKECACHE_HANDLE_CAPACTY", "5")]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("LAKECACHE_HANDLE_CAPACTY"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn rust_log_shows_what_the_caches_report() {
    let dir = tempfile::tempdir().unwrap();
    let disk = format!("lakecache.range.disk_dir={}", dir.path().display());
    let args = ["-q", "--set", disk.as_str(), "-c", "SELECT 1"];
    let out = lakecache(&args, &[("RUST_LOG", "datafusion_lakecache=info")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("disk tier at"),
        "{}",
        text(&out.stderr)
    );
    // Nothing at the default level.
    let out = lakecache(&args, &[]);
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiling_counts_the_requests_that_reach_the_store() {
    for b in backends("cli_profiling") {
        b.write(&LakeSpec::small_files(3)).await;
        let create = create(&b);
        let sql = "SELECT category, count(*) FROM t GROUP BY category";
        let out = lakecache_on(
            &b,
            &[
                "--object-store-profiling",
                "summary",
                "-c",
                &create,
                "-c",
                sql,
                "-c",
                sql,
            ],
        );
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{}: {}", b.name, text(&out.stderr));
        // A profile per statement; each names the operations that reached the store.
        let profiles: Vec<&str> = stdout.split("Object Store Profiling").skip(1).collect();
        assert_eq!(profiles.len(), 3, "{}:\n{stdout}", b.name);
        let ops = |p: &str, op: &str| p.lines().filter(|l| l.contains(op)).count();
        // The CREATE lists the table and reads the footers for its statistics.
        assert!(ops(profiles[0], "List") > 0, "{}: {}", b.name, profiles[0]);
        assert!(ops(profiles[0], "Get") > 0, "{}: {}", b.name, profiles[0]);
        // The caches answer the queries' listings.
        assert_eq!(ops(profiles[2], "List"), 0, "{}: {}", b.name, profiles[2]);
        if b.name == "s3" {
            // The CREATE read the footers, the first query the data; the range cache serves
            // every byte of the second, so no request of its reaches the store.
            for p in &profiles[2..] {
                assert!(
                    !p.contains("Summaries"),
                    "{}: no request reached the store: {p}",
                    b.name
                );
            }
        } else {
            // file:// bytes are read from the disk, not kept: the query reads them.
            assert!(ops(profiles[1], "Get") > 0, "{}: {}", b.name, profiles[1]);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_table_is_read_through_the_caches() {
    let dir = tempfile::tempdir().unwrap();
    let fs = LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let files = write_lake(&fs, &Path::from("lake"), &LakeSpec::small_files(1))
        .await
        .unwrap();
    let server = HttpDir::serve(dir.path()).await.unwrap();
    let sql = format!(
        "SELECT count(*) AS n FROM '{}/{}'",
        server.url(),
        files[0].as_ref()
    );
    let sql1 = sql.clone();
    let out = tokio::task::spawn_blocking(move || {
        lakecache(&["-q", "--format", "csv", "-c", sql1.as_str()], &[])
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("n\n5000"),
        "{}",
        text(&out.stdout)
    );
    let once = server.requests();
    assert!(once > 0);

    let sql2 = sql.clone();
    let out = tokio::task::spawn_blocking(move || {
        lakecache(
            &[
                "-q",
                "--format",
                "csv",
                "-c",
                sql2.as_str(),
                "-c",
                sql2.as_str(),
            ],
            &[],
        )
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let twice = server.requests() - once;
    assert_eq!(twice, once, "the second query made no request of its own");
}

#[test]
fn the_demo_prints_a_line_for_each_capability() {
    let out = lakecache(
        &["demo", "--files", "4", "--latency-ms", "1", "--runs", "2"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("s3://demo/small/ (4 Parquet files of 5000 rows"),
        "{stdout}"
    );
    assert!(
        stdout.contains("in one SessionContext per side, kept across its runs"),
        "{stdout}"
    );
    // Both sides kept their session: from run 2 on, neither lists or reads a footer again
    // (DataFusion's own listing and footer caches, and the LakeCache's).
    for side in ["  DataFusion ", "  lakecache "] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(side) && l.contains('→'))
            .unwrap_or_else(|| panic!("{side}:\n{stdout}"));
        let counts = |text: &str| -> Vec<u64> {
            text.trim()
                .split('/')
                .map(|n| n.parse::<u64>().unwrap())
                .collect()
        };
        let (cold, warm) = line.rsplit_once("   ").unwrap().1.split_once('→').unwrap();
        let (cold, warm) = (counts(cold), counts(warm));
        assert!(cold[1] >= 1 && warm[1] == 0, "{side}: listed again: {line}");
        assert!(warm[2] < cold[2], "{side}: read footers again: {line}");
    }
    for line in [
        "DataFusion",
        "lakecache, restarted on disk",
        "speed-up against DataFusion",
        "handle cache:",
        "index cache:",
        "prefetch:",
        "range cache:",
    ] {
        assert!(stdout.contains(line), "{line}:\n{stdout}");
    }
    // Over the large files the prefetcher downloads ahead of the readers.
    let large = stdout
        .split("large files (s3://demo/large/)")
        .nth(1)
        .expect("the large-files query ran");
    let downloads: u64 = large
        .split("prefetch: ")
        .nth(1)
        .and_then(|l| l.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a prefetch line");
    assert!(downloads > 0, "{large}");
}

/// Runs `args`; the run must fail with exactly one line on stderr, naming `expected`.
fn fails_with_one_line(args: &[&str], envs: &[(&str, &str)], expected: &str) {
    let out = lakecache(args, envs);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{args:?} fails");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("lakecache: handles"))
        .collect();
    assert_eq!(lines.len(), 1, "{args:?}: one line:\n{stderr}");
    assert!(lines[0].starts_with("lakecache: "), "{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
    assert!(
        lines[0].contains(expected),
        "{args:?}: says '{expected}':\n{stderr}"
    );
}

#[test]
fn bad_input_gives_one_readable_line_and_a_failing_exit() {
    let b = local_backend();
    fails_with_one_line(&["-c", "SELEKT 1"], &[], "SELEKT");
    fails_with_one_line(&["-f", "/no/such/file.sql"], &[], "/no/such/file.sql");
    fails_with_one_line(
        &[
            "--set",
            "lakecache.prefetch.max_in_flight=0",
            "-c",
            "SELECT 1",
        ],
        &[],
        "lakecache.prefetch.max_in_flight",
    );
    fails_with_one_line(
        &[
            "-c",
            "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://'",
        ],
        &[],
        "s3://",
    );
    fails_with_one_line(
        &["-c", &format!("SELECT * FROM '{}missing/'", b.table_url())],
        &[],
        "missing",
    );
}

#[test]
fn a_missing_bucket_and_a_wrong_credential_give_one_line() {
    let Ok(endpoint) = std::env::var("LAKECACHE_S3_ENDPOINT") else {
        datafusion_lakecache::testkit::s3_skipped(
            "a_missing_bucket_and_a_wrong_credential_give_one_line",
        );
        return;
    };
    let bucket = std::env::var("LAKECACHE_S3_BUCKET").unwrap_or_else(|_| "lakecache-test".into());
    let good = [
        ("AWS_ACCESS_KEY_ID", "lakecache"),
        ("AWS_SECRET_ACCESS_KEY", "lakecache"),
        ("AWS_REGION", "us-east-1"),
    ];
    let missing =
        "CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://no-such-bucket-lakecache/t/'";
    fails_with_one_line(
        &["--endpoint", &endpoint, "-c", missing],
        &good,
        "no-such-bucket-lakecache",
    );
    let wrong = [
        ("AWS_ACCESS_KEY_ID", "lakecache"),
        ("AWS_SECRET_ACCESS_KEY", "not-the-secret"),
        ("AWS_REGION", "us-east-1"),
    ];
    let table = format!("CREATE EXTERNAL TABLE t STORED AS PARQUET LOCATION 's3://{bucket}/any/'");
    fails_with_one_line(
        &["--endpoint", &endpoint, "-c", &table],
        &wrong,
        "check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_REGION",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_reads_the_disk_tier_the_first_filled() {
    for b in backends("cli_disk").into_iter().filter(|b| b.name == "s3") {
        b.write(&LakeSpec::small_files(3)).await;
        let dir = tempfile::tempdir().unwrap();
        let disk = format!("lakecache.range.disk_dir={}", dir.path().display());
        let create = create(&b);
        let sql = "SELECT category, count(*) AS n FROM t GROUP BY category";
        let args = ["--set", disk.as_str(), "-c", create.as_str(), "-c", sql];
        let first = lakecache_on(&b, &args);
        let stderr = text(&first.stderr);
        assert!(first.status.success(), "{stderr}");
        let last = |s: &str| summaries(s).last().expect("a summary").to_string();
        assert_eq!(figure(&last(&stderr), "disk"), 0, "{stderr}");
        let second = lakecache_on(&b, &args);
        let stderr = text(&second.stderr);
        assert!(second.status.success(), "{stderr}");
        let whole: u64 = summaries(&stderr).iter().map(|l| figure(l, "disk")).sum();
        assert!(whole > 0, "{stderr}");
        let from_store: u64 = summaries(&stderr).iter().map(|l| figure(l, "store")).sum();
        assert_eq!(from_store, 0, "{stderr}");
    }
}

#[test]
fn the_prompt_prints_a_summary_after_each_statement() {
    let dir = tempfile::tempdir().unwrap();
    let input = "SELECT 1 AS a;\nSELECT no_such_column;\nSELECT 2\n  AS b;\n\\q\n";
    let home = dir.path().display().to_string();
    let out = lakecache_prompt(dir.path(), &[], &[("HOME", &home)], input);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("| 1 |") && stdout.contains("| 2 |"),
        "{stdout}"
    );
    assert_eq!(
        summaries(&stderr).len(),
        3,
        "one summary per statement, the failed one included:\n{stderr}"
    );
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.starts_with("lakecache: handles"))
        .collect();
    assert_eq!(errors.len(), 1, "the error on one line: {stderr}");
    assert!(dir.path().join(".history").exists(), "history kept");
}

#[test]
fn a_long_statement_shows_a_progress_line_on_stderr_and_erases_it() {
    // Several seconds in a debug build on two cores; the line appears after one.
    let sql = "SELECT count(*) AS n FROM generate_series(1, 100000000)";
    let out = lakecache(&["-q", "--progress", "always", "-c", sql], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("lakecache: running") && stderr.contains("files opened"),
        "{stderr:?}"
    );
    assert!(
        stderr.ends_with("\r\x1b[2K"),
        "erased at the end: {stderr:?}"
    );
    assert!(text(&out.stdout).contains("100000000"));
    // Not on a pipe unless asked.
    let out = lakecache(&["-q", "-c", "SELECT 1"], &[]);
    assert!(text(&out.stderr).is_empty(), "{}", text(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_sessions_may_clear_warm_list_and_invalidate_the_caches() {
    // The tool's one user owns its caches: `lakecache.sql.clear` and `lakecache.sql.manage`
    // are on in its sessions (a library's sessions have them off).
    let b = local_backend();
    b.write(&LakeSpec::small_files(2)).await;
    let out = lakecache(
        &[
            "-c",
            &create(&b),
            "-c",
            "SELECT * FROM lakecache_warm('t')",
            "-c",
            "SELECT count(*) AS n FROM lakecache_entries()",
            "-c",
            "SELECT * FROM lakecache_invalidate('file:///nowhere.parquet')",
            "-c",
            "SELECT * FROM lakecache_clear('range')",
        ],
        &[],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("rror"), "{stderr}");
    assert!(stdout.contains("| n "), "{stdout}");
}

/// The tool over `endpoint` (the S3 server, or a proxy in front of it) with the S3 server's
/// credentials, started without waiting for it.
fn spawn_via(endpoint: &str, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_lakecache"))
        .args(["--endpoint", endpoint])
        .args(args)
        .envs([
            ("AWS_ACCESS_KEY_ID", "lakecache"),
            ("AWS_SECRET_ACCESS_KEY", "lakecache"),
            ("AWS_REGION", "us-east-1"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("lakecache runs")
}

/// Waits for `children` on blocking threads (the proxy they talk to runs on this runtime).
async fn outputs(children: Vec<std::process::Child>) -> Vec<Output> {
    let waits = children
        .into_iter()
        .map(|c| tokio::task::spawn_blocking(move || c.wait_with_output().expect("waited")));
    futures::future::join_all(waits)
        .await
        .into_iter()
        .map(|o| o.expect("joined"))
        .collect()
}

/// Bytes of the entry files of the disk tier below `dir`, each checked to be whole: its
/// magic, and its length what its name and header say (a torn write is neither).
fn tier_bytes(dir: &FsPath) -> u64 {
    let mut total = 0;
    let root = dir.join("lakecache-ranges");
    for sub in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(sub.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = f.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".range") else {
                continue;
            };
            let len: u64 = stem.rsplit('-').next().unwrap().parse().unwrap();
            let raw = std::fs::read(f.path()).unwrap();
            assert_eq!(&raw[..8], b"LKRANGE1", "{name}");
            let version_len = u32::from_le_bytes(raw[16..20].try_into().unwrap()) as u64;
            assert_eq!(raw.len() as u64, 36 + version_len + len, "{name} is whole");
            total += raw.len() as u64;
        }
    }
    total
}

/// A lake on the S3 server behind a counting proxy, for the tests of processes sharing a
/// disk tier: a table statement, a scan reading every column, and the rows it must return.
struct SharedTierLake {
    proxy: datafusion_lakecache::testkit::FaultProxy,
    endpoint: String,
    create: String,
    sql: &'static str,
    want: String,
    _backend: Backend,
}

/// [`SharedTierLake`] for `test`, the proxy's faults drawn from `seed`; `None` (the test
/// skipped) without an S3 server.
async fn shared_tier_lake(test: &str, seed: u64) -> Option<SharedTierLake> {
    let b = common::s3_backend(test)?;
    let target = datafusion_lakecache::testkit::s3_server_addr().expect("the S3 server");
    let proxy = datafusion_lakecache::testkit::FaultProxy::start(target, seed)
        .await
        .unwrap();
    // Few files of many row groups: the requests are mostly ranges of data, which the
    // processes share, rather than listings and HEADs, which each process makes.
    let spec = LakeSpec {
        files: 4,
        rows_per_file: 60_000,
        row_group_rows: 2_000,
        seed: 42,
    };
    b.write(&spec).await;
    // Answers that do not depend on the order rows arrive in (no floating-point sums).
    let sql = "SELECT category, count(*), sum(id), min(name), max(value) FROM t \
               GROUP BY category ORDER BY category";
    let out = lakecache_on(&b, &["-q", "-c", &create(&b), "-c", sql]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    Some(SharedTierLake {
        endpoint: proxy.endpoint(),
        proxy,
        create: create(&b),
        sql,
        want: text(&out.stdout),
        _backend: b,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_sharing_a_disk_tier_download_each_range_once() {
    let Some(lake) = shared_tier_lake("cli_shared_tier", 1).await else {
        return;
    };
    let SharedTierLake {
        proxy,
        endpoint,
        create,
        sql,
        want,
        ..
    } = &lake;
    // One process, cold, with a tier of its own: the requests a scan costs.
    let run = |dir: &FsPath| {
        let disk = format!("lakecache.range.disk_dir={}", dir.display());
        spawn_via(endpoint, &["-q", "--set", &disk, "-c", create, "-c", sql])
    };
    let alone = tempfile::tempdir().unwrap();
    let before = proxy.counts().relayed;
    let out = outputs(vec![run(alone.path())]).await;
    assert!(out[0].status.success(), "{}", text(&out[0].stderr));
    let one = proxy.counts().relayed - before;
    // Four processes at once over one directory, cold: about one process's requests.
    let shared = tempfile::tempdir().unwrap();
    let before = proxy.counts().relayed;
    let four = outputs((0..4).map(|_| run(shared.path())).collect()).await;
    let requests = proxy.counts().relayed - before;
    for out in &four {
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(&text(&out.stdout), want, "every row right");
    }
    common::report(
        "processes_sharing_a_disk_tier",
        &format!("one process {one} requests, four at once {requests}"),
    );
    assert!(
        requests as f64 <= 1.2 * one as f64,
        "four processes sent {requests} requests, one alone {one}"
    );
    // A fifth, later, reads every byte from the directory the four filled.
    let disk = format!("lakecache.range.disk_dir={}", shared.path().display());
    let fifth = spawn_via(endpoint, &["--set", &disk, "-c", create, "-c", sql]);
    let out = outputs(vec![fifth]).await;
    let stderr = text(&out[0].stderr);
    let from_store: u64 = summaries(&stderr).iter().map(|l| figure(l, "store")).sum();
    assert_eq!(from_store, 0, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_keep_a_shared_tier_within_its_capacity_and_a_killed_one_blocks_none() {
    let Some(lake) = shared_tier_lake("cli_shared_tier_kill", 7).await else {
        return;
    };
    let SharedTierLake {
        proxy,
        endpoint,
        create,
        sql,
        want,
        ..
    } = &lake;
    let dir = tempfile::tempdir().unwrap();
    // The smallest capacity there is, below what the scan reads.
    let capacity = 1 << 20;
    let disk = format!("lakecache.range.disk_dir={}", dir.path().display());
    let bound = format!("lakecache.range.disk_capacity={capacity}");
    let args = [
        "-q", "--set", &disk, "--set", &bound, "-c", create, "-c", sql,
    ];
    // A process whose requests stall (its claims held, its writes pending) is killed.
    proxy.set(datafusion_lakecache::testkit::Faults {
        stall: 0.5,
        stall_for: std::time::Duration::from_secs(120),
        ..Default::default()
    });
    let mut stalled = spawn_via(endpoint, &args);
    while proxy.counts().stalled < 2 && stalled.try_wait().unwrap().is_none() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    stalled.kill().expect("SIGKILL");
    let _ = stalled.wait();
    proxy.set(datafusion_lakecache::testkit::Faults::none());
    // The others run twice (cold, then over what they all wrote): every row right, and what
    // is on disk within the capacity after every round.
    for _ in 0..2 {
        let outs = outputs((0..4).map(|_| spawn_via(endpoint, &args)).collect()).await;
        for out in &outs {
            assert!(out.status.success(), "{}", text(&out.stderr));
            assert_eq!(&text(&out.stdout), want, "every row right");
        }
        let on_disk = tier_bytes(dir.path());
        assert!(on_disk <= capacity, "{on_disk} bytes on disk");
    }
}
