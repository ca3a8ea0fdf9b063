//! `lakecache`: DataFusion's command-line client with the lake caches installed.
//!
//! It is datafusion-cli 55.2 underneath (its REPL with history and multi-line statements,
//! output formats, backslash commands, and object stores created from the URLs of
//! `CREATE EXTERNAL TABLE` and of `SELECT ... FROM 's3://...'`), in a session made by
//! [`LakeCache::install`]. What this file adds: the session, a one-line cache summary after
//! each statement (of `-c`, `-f` and at the prompt, `repl.rs`), one-line errors with a
//! non-zero exit code, and `lakecache demo` (`demo.rs`).
//!
//! ```text
//! lakecache -c "SELECT count(*) FROM 's3://bucket/sales/'"
//! lakecache -f report.sql --format csv
//! lakecache                       # interactive
//! lakecache demo --latency-ms 50
//! ```

mod demo;
mod progress;
mod repl;

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_cli::catalog::DynamicObjectStoreCatalog;
use datafusion_cli::exec;
use datafusion_cli::object_storage::instrumented::InstrumentedObjectStoreRegistry;
use datafusion_cli::print_format::PrintFormat;
use datafusion_cli::print_options::{MaxRows, PrintOptions};
use datafusion_lakecache::{LakeCache, LakeStats};

/// DataFusion's SQL client over data lakes, with handle and index caching and prefetching.
#[derive(Debug, Parser)]
#[command(
    name = "lakecache",
    version,
    about = "DataFusion's SQL client over data lakes, with handle, index and byte caching and prefetching"
)]
struct Args {
    #[command(subcommand)]
    demo: Option<Command>,

    /// SQL to run (repeatable); statements run in order, then the tool exits.
    #[arg(short = 'c', long = "command")]
    command: Vec<String>,

    /// A file of SQL statements (separated by `;` at the end of a line) to run (repeatable).
    #[arg(short = 'f', long = "file")]
    file: Vec<String>,

    /// Output format of results.
    #[arg(long, value_enum, default_value_t = PrintFormat::Automatic)]
    format: PrintFormat,

    /// Print only results: no timing and no cache summary.
    #[arg(short, long)]
    quiet: bool,

    /// When to show a progress line on stderr for statements running over a second.
    #[arg(long, value_enum, default_value_t = progress::When::Auto)]
    progress: progress::When,

    /// Most rows printed per result in table format (0 for all).
    #[arg(long, default_value_t = 40)]
    maxrows: usize,

    /// Endpoint of an S3-compatible store (for example http://localhost:9000); credentials
    /// and region come from the usual AWS_* variables.
    #[arg(long)]
    endpoint: Option<String>,

    /// A `lakecache.*` or `datafusion.*` setting as KEY=VALUE, applied before anything runs
    /// (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    settings: Vec<String>,
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

/// The session: datafusion-cli's, installed from `lake`.
async fn session(lake: &LakeCache, settings: &[String]) -> Result<SessionContext> {
    let mut config = SessionConfig::from_env()?.with_information_schema(true);
    let registry = Arc::new(InstrumentedObjectStoreRegistry::new());
    let runtime = RuntimeEnvBuilder::new()
        .with_object_store_registry(registry)
        .build_arc()?;
    for setting in settings.iter().filter(|s| s.starts_with("datafusion.")) {
        let (key, value) = split_setting(setting)?;
        config.options_mut().set(key, value)?;
    }
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime);
    let ctx = SessionContext::new_with_state(lake.install(builder)?.build()).enable_url_table();
    for setting in settings.iter().filter(|s| !s.starts_with("datafusion.")) {
        let (key, value) = split_setting(setting)?;
        ctx.state_ref()
            .write()
            .config_mut()
            .options_mut()
            .set(key, value)?;
    }
    // Tables named by URL (`SELECT * FROM 's3://bucket/path/'`) register their store.
    ctx.register_catalog_list(Arc::new(DynamicObjectStoreCatalog::new(
        ctx.state().catalog_list().clone(),
        ctx.state_weak_ref(),
    )));
    Ok(ctx)
}

fn split_setting(setting: &str) -> Result<(&str, &str)> {
    setting.split_once('=').ok_or_else(|| {
        DataFusionError::Configuration(format!("--set expects KEY=VALUE, got '{setting}'"))
    })
}

async fn run(args: Args) -> Result<()> {
    // Cache sizes and the disk tier belong to the LakeCache; the rest to the session.
    let mut builder = LakeCache::builder();
    let mut session_settings = Vec::new();
    for setting in &args.settings {
        let (key, value) = split_setting(setting)?;
        match key.strip_prefix("lakecache.") {
            Some(rest) if !rest.starts_with("prefetch.") => builder = builder.set(key, value),
            _ => session_settings.push(setting.clone()),
        }
    }
    let lake = builder.build()?;
    let ctx = session(&lake, &session_settings).await?;
    let result = run_statements(&args, &lake, &ctx).await;
    // Ranges still being written to the disk tier are kept for the next run.
    lake.ranges().flush().await;
    result
}

async fn run_statements(args: &Args, lake: &LakeCache, ctx: &SessionContext) -> Result<()> {
    let mut print = PrintOptions {
        format: args.format,
        quiet: args.quiet,
        maxrows: match args.maxrows {
            0 => MaxRows::Unlimited,
            n => MaxRows::Limited(n),
        },
        color: false,
        instrumented_registry: Arc::new(InstrumentedObjectStoreRegistry::new()),
    };
    if args.command.is_empty() && args.file.is_empty() {
        repl::run(ctx, &mut print, lake, args.progress).await?;
        return Ok(());
    }
    let mut statements = Vec::new();
    for file in &args.file {
        let text = std::fs::read_to_string(file)
            .map_err(|e| DataFusionError::Execution(format!("cannot read {file}: {e}")))?;
        statements.extend(split_statements(&text));
    }
    statements.extend(args.command.iter().cloned());
    for sql in statements {
        let progress = progress::Progress::start(lake, args.progress);
        let result = exec::exec_from_commands(ctx, vec![sql], &print).await;
        progress.finish();
        result?;
        if !args.quiet {
            println!("{}", summary(&lake.stats()));
        }
    }
    Ok(())
}

/// The statements of a SQL file, as datafusion-cli reads one: a statement ends with a line
/// ending in `;`; lines starting with `--` or `#!` are skipped.
fn split_statements(text: &str) -> Vec<String> {
    let mut statements = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        if line.starts_with("--") || line.starts_with("#!") {
            continue;
        }
        let line = line.trim_end();
        current.push_str(line);
        if line.ends_with(';') {
            statements.push(std::mem::take(&mut current));
        } else {
            current.push('\n');
        }
    }
    if current.trim().is_empty() {
        statements
    } else {
        statements.push(current);
        statements
    }
}

/// One line of cache figures since the tool started.
fn summary(s: &LakeStats) -> String {
    let h = &s.handles;
    format!(
        "lakecache: handles {} hits / {} misses, listings {} / {}; index {} hits / {} misses, \
         {} KiB; prefetch {} requests, {} KiB, at most {} in flight; bytes from memory {} KiB, \
         disk {} KiB, store {} KiB",
        h.metadata.hits,
        h.metadata.misses,
        h.listings.hits,
        h.listings.misses,
        s.index.cache.hits,
        s.index.cache.misses,
        s.index.bytes >> 10,
        s.prefetch.requests,
        s.prefetch.bytes_fetched >> 10,
        s.prefetch.peak_in_flight,
        s.ranges.bytes_from_memory >> 10,
        s.ranges.bytes_from_disk >> 10,
        s.ranges.bytes_from_store >> 10
    )
}
