//! `lakecache`: DataFusion's command-line client with the lake caches installed.
//!
//! It is datafusion-cli 55.2 underneath (its REPL with history and multi-line statements,
//! output formats, backslash commands, `\object_store_profiling`, and object stores created
//! from the URLs of `CREATE EXTERNAL TABLE` and of `SELECT ... FROM 's3://...'`), with its
//! flags and their meanings, in a session made by [`LakeCache::install`]. What this crate
//! adds: the session (`session.rs`), a one-line summary on stderr of what the caches did for
//! each statement (`summary.rs`, `statements.rs`), a progress line for long statements
//! (`progress.rs`), the prompt that prints them (`repl.rs`), and `lakecache demo`
//! (`demo.rs`).
//!
//! ```text
//! lakecache -c "SELECT count(*) FROM 's3://bucket/sales/'"
//! lakecache -m 4g -f report.sql --format csv
//! lakecache                       # interactive; runs ~/.datafusionrc first
//! lakecache demo
//! ```

mod demo;
mod progress;
mod repl;
mod session;
mod statements;
mod summary;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use datafusion::error::{DataFusionError, Result};
use datafusion_cli::object_storage::instrumented::InstrumentedObjectStoreMode;
use datafusion_cli::pool_type::PoolType;
use datafusion_cli::print_format::PrintFormat;
use datafusion_cli::print_options::{MaxRows, PrintOptions};
use datafusion_lakecache::LakeCache;

use crate::statements::Runner;

/// mimalloc, as datafusion-cli uses: at a million files a warm plan takes 10.1-10.4 s with
/// it against 14.2 s with glibc's (docs/benchmarks.md, "Scale", "The process's allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// DataFusion's SQL client over data lakes, with handle, index and byte caching and
/// prefetching. Flags shared with datafusion-cli mean what they mean there.
#[derive(Debug, Parser)]
#[command(name = "lakecache", version, about, long_about = None)]
struct Args {
    #[command(subcommand)]
    demo: Option<Command>,

    /// Path to your data, default to current directory.
    #[arg(short = 'p', long, value_parser = parse_data_dir)]
    data_path: Option<String>,

    /// The batch size of each query, or use DataFusion default.
    #[arg(short = 'b', long, value_parser = parse_batch_size)]
    batch_size: Option<usize>,

    /// Execute the given command string(s), then exit; stops at the first that fails.
    #[arg(short = 'c', long, num_args = 0.., value_parser = parse_command)]
    command: Vec<String>,

    /// The memory pool limitation (e.g. '10g'), default to None (no limit). Prefetching
    /// holds at most half of it.
    #[arg(short = 'm', long, value_parser = parse_memory_limit)]
    memory_limit: Option<usize>,

    /// Execute commands from file(s), then exit. A failed statement is reported and the next
    /// one runs (see --stop-on-error); the exit code says whether any failed.
    #[arg(short, long, num_args = 0..)]
    file: Vec<String>,

    /// Run the provided files on startup instead of ~/.datafusionrc (interactive mode).
    #[arg(short = 'r', long, num_args = 0.., conflicts_with = "file")]
    rc: Option<Vec<String>>,

    /// Output format of results.
    #[arg(long, value_enum, default_value_t = PrintFormat::Automatic)]
    format: PrintFormat,

    /// Reduce printing other than the results and work quietly: no timing, no cache summary.
    #[arg(short, long)]
    quiet: bool,

    /// Specify the memory pool type 'greedy' or 'fair'.
    #[arg(long, default_value_t = PoolType::Greedy)]
    mem_pool_type: PoolType,

    /// The number of top memory consumers to display when query fails due to memory
    /// exhaustion. To disable memory consumer tracking, set this value to 0.
    #[arg(long, default_value = "3")]
    top_memory_consumers: usize,

    /// The max number of rows to display for 'Table' format
    /// [possible values: numbers(0/10/...), inf(no limit)].
    #[arg(long, default_value = "40")]
    maxrows: MaxRows,

    /// Enables console syntax highlighting.
    #[arg(long)]
    color: bool,

    /// Available disk space for spilling queries (e.g. '10g'), default to None (uses
    /// DataFusion's default value of '100g').
    #[arg(short = 'd', long, value_parser = parse_disk_limit)]
    disk_limit: Option<usize>,

    /// The default object_store_profiling mode: requests that reach the stores, below the
    /// caches [possible values: disabled, summary, trace].
    #[arg(long, default_value_t = InstrumentedObjectStoreMode::Disabled)]
    object_store_profiling: InstrumentedObjectStoreMode,

    /// With -f: stop at the first statement that fails.
    #[arg(long)]
    stop_on_error: bool,

    /// When to show a progress line on stderr for statements running over a second.
    #[arg(long, value_enum, default_value_t = progress::When::Auto)]
    progress: progress::When,

    /// Endpoint of an S3-compatible store (for example http://localhost:9000); credentials
    /// and region come from the usual AWS_* variables.
    #[arg(long)]
    endpoint: Option<String>,

    /// A `lakecache.*` or `datafusion.*` setting as KEY=VALUE, applied before anything runs
    /// (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    settings: Vec<String>,
}

impl Args {
    /// Without -c/-f the tool reads its SQL from stdin, interactively or piped.
    fn repl_mode(&self) -> bool {
        self.command.is_empty() && self.file.is_empty()
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build a lake in a temporary directory, serve it through a simulated remote store, and
    /// run the same scans with plain DataFusion and with lakecache side by side.
    Demo(demo::DemoArgs),
}

fn main() -> ExitCode {
    // A panic is a bug; it still ends with one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("lakecache: internal error: {}", one_line(&info.to_string()));
    }));
    // RUST_LOG, as datafusion-cli honours it. By default the library's warnings (a corrupt
    // disk entry, If-Match turned off) and other crates' errors: the clients' own warnings
    // (S3 region auto-detection, retries) would repeat what the error line says.
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("error,datafusion_lakecache=warn"),
    )
    .format_target(false)
    .init();
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    if let Some(endpoint) = &args.endpoint {
        // SAFETY: nothing else runs yet (no runtime, no threads), so no one reads the
        // environment concurrently. object_store's builders read these variables.
        unsafe {
            std::env::set_var("AWS_ENDPOINT", endpoint);
            if endpoint.starts_with("http://") {
                std::env::set_var("AWS_ALLOW_HTTP", "true");
            }
        }
    }
    if let Some(dir) = &args.data_path
        && let Err(e) = std::env::set_current_dir(dir)
    {
        eprintln!("lakecache: cannot change to the data path {dir}: {e}");
        return ExitCode::FAILURE;
    }
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(DataFusionError::from)
        .and_then(|runtime| {
            runtime.block_on(async {
                match args.demo {
                    Some(Command::Demo(demo)) => demo::demo(demo).await,
                    None => run(args).await,
                }
            })
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lakecache: {}", one_line(&with_hint(e.to_string())));
            ExitCode::FAILURE
        }
    }
}

/// `message` with what to check, where the store's own words do not say it.
fn with_hint(message: String) -> String {
    // datafusion-cli answers an S3 403 by looking up the bucket's region; with wrong
    // credentials that lookup fails too, and its error is what reaches the user.
    if message.contains("Failed to resolve region") {
        return format!(
            "{message} (the store refused the request: check AWS_ACCESS_KEY_ID, \
             AWS_SECRET_ACCESS_KEY and AWS_REGION)"
        );
    }
    message
}

/// `text` on one line: its lines joined with "; ".
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

async fn run(args: Args) -> Result<()> {
    // Settings of the LakeCache, lowest first: the tool's own default (its sessions are its
    // user's own, so `lakecache_clear()` is theirs to run), the environment, the rc files'
    // `SET`s of shared keys, then `--set`. The session's settings go to the session.
    let mut builder = LakeCache::builder()
        .sql_clear(true)
        .sql_manage(true)
        .with_env();
    let rc = if args.repl_mode() {
        rc_files(&args)
    } else {
        Vec::new()
    };
    for file in &rc {
        for (key, value) in session::shared_settings_in(file)? {
            builder = builder.set(&key, &value);
        }
    }
    let mut session_settings = Vec::new();
    for setting in &args.settings {
        let (key, value) = session::split_setting(setting)?;
        if session::is_shared(key) {
            builder = builder.set(key, value);
        } else {
            session_settings.push(setting.clone());
        }
    }
    let lake = builder.build()?;
    let (ctx, registry) = session::session(&lake, &args, &session_settings).await?;
    let print = PrintOptions {
        format: args.format,
        quiet: args.quiet,
        maxrows: args.maxrows,
        color: args.color,
        instrumented_registry: registry,
    };
    let mut runner = Runner {
        ctx,
        lake: lake.clone(),
        print,
        progress: args.progress,
        stop_on_error: args.stop_on_error,
    };
    let result = run_inputs(&args, &rc, &mut runner).await;
    // Ranges still being written to the disk tier are kept for the next run.
    lake.flush().await;
    result
}

/// The rc files of interactive mode: `-r`'s, else `~/.datafusionrc` if there is one.
fn rc_files(args: &Args) -> Vec<String> {
    match &args.rc {
        Some(files) => files.clone(),
        None => std::env::var_os("HOME")
            .map(|home| std::path::Path::new(&home).join(".datafusionrc"))
            .filter(|rc| rc.is_file())
            .map(|rc| rc.display().to_string())
            .into_iter()
            .collect(),
    }
}

/// What datafusion-cli runs, in its order: in interactive mode the rc files, then the
/// prompt; otherwise the -f files, then the -c commands.
async fn run_inputs(args: &Args, rc: &[String], runner: &mut Runner) -> Result<()> {
    if args.repl_mode() {
        for file in rc {
            runner.file(file).await?;
        }
        return repl::run(runner).await;
    }
    for file in &args.file {
        runner.file(file).await?;
    }
    for sql in &args.command {
        runner.statement(sql.clone()).await?;
    }
    Ok(())
}

fn parse_data_dir(dir: &str) -> Result<String, String> {
    match std::path::Path::new(dir).is_dir() {
        true => Ok(dir.to_string()),
        false => Err(format!("Invalid data directory '{dir}'")),
    }
}

fn parse_batch_size(size: &str) -> Result<usize, String> {
    match size.parse::<usize>() {
        Ok(size) if size > 0 => Ok(size),
        _ => Err(format!("Invalid batch size '{size}'")),
    }
}

fn parse_command(command: &str) -> Result<String, String> {
    match command.is_empty() {
        false => Ok(command.to_string()),
        true => Err("-c flag expects only non empty commands".to_string()),
    }
}

fn parse_memory_limit(size: &str) -> Result<usize, String> {
    parse_size(size, "memory pool size")
}

fn parse_disk_limit(size: &str) -> Result<usize, String> {
    parse_size(size, "disk limit")
}

/// A size as datafusion-cli reads `-m` and `-d`: a whole number with an optional unit
/// (`b`, `k`/`kb`, `m`/`mb`, `g`/`gb`, `t`/`tb`, powers of 1024, any case).
fn parse_size(size: &str, label: &str) -> Result<usize, String> {
    let lower = size.to_lowercase();
    let digits = lower
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(lower.len());
    let (number, unit) = lower.split_at(digits);
    let shift = match unit {
        "" | "b" => 0,
        "k" | "kb" => 10,
        "m" | "mb" => 20,
        "g" | "gb" => 30,
        "t" | "tb" => 40,
        _ => return Err(format!("Invalid {label} '{size}'")),
    };
    let number: usize = number
        .parse()
        .map_err(|_| format!("Invalid numeric value in {label} '{size}'"))?;
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{label} '{size}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_datafusion_cli_reads_them() {
        assert_eq!(parse_size("100", "x"), Ok(100));
        assert_eq!(parse_size("10g", "x"), Ok(10 << 30));
        assert_eq!(parse_size("512MB", "x"), Ok(512 << 20));
        assert_eq!(parse_size("1k", "x"), Ok(1024));
        assert!(parse_size("1.5g", "x").is_err());
        assert!(parse_size("-1g", "x").is_err());
        assert!(parse_size("g", "x").is_err());
        assert!(parse_size("99999999999999999999t", "x").is_err());
        assert!(
            parse_size("16777216t", "x")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn maxrows_reads_inf_and_numbers() {
        let args = Args::try_parse_from(["lakecache", "--maxrows", "inf"]).unwrap();
        assert_eq!(args.maxrows, MaxRows::Unlimited);
        let args = Args::try_parse_from(["lakecache", "--maxrows", "0"]).unwrap();
        assert_eq!(args.maxrows, MaxRows::Limited(0));
        assert!(Args::try_parse_from(["lakecache", "--maxrows", "many"]).is_err());
    }

    #[test]
    fn rc_and_file_conflict_as_in_datafusion_cli() {
        assert!(Args::try_parse_from(["lakecache", "-r", "a.sql", "-f", "b.sql"]).is_err());
    }
}
