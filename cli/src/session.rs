//! The session the tool runs statements in: datafusion-cli's (its configuration defaults,
//! memory pool, disk manager, instrumented store registry, dynamic URL tables and table
//! functions), installed from the `LakeCache`.
//!
//! The instrumented registry is the one the session's stores are registered in, and the
//! caches sit on top of the stores it hands out, so `\object_store_profiling` counts the
//! requests that reach the store, not the ones the caches answered.

use std::num::NonZeroUsize;
use std::sync::Arc;

use datafusion::common::config::ConfigNonZeroUsize;
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{
    FairSpillPool, GreedyMemoryPool, MemoryPool, TrackConsumersPool,
};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::ExplainFormat;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_cli::catalog::DynamicObjectStoreCatalog;
use datafusion_cli::functions::{
    ListFilesCacheFunc, MetadataCacheFunc, ParquetMetadataFunc, StatisticsCacheFunc,
};
use datafusion_cli::object_storage::instrumented::InstrumentedObjectStoreRegistry;
use datafusion_cli::object_storage::{StdinCarriesCommands, is_stdin_location};
use datafusion_cli::pool_type::PoolType;
use datafusion_lakecache::LakeCache;

use crate::Args;

/// The session for `args`, installed from `lake`, with `settings` (`KEY=VALUE`) applied, and
/// the registry `\object_store_profiling` reads.
pub async fn session(
    lake: &LakeCache,
    args: &Args,
    settings: &[String],
) -> Result<(SessionContext, Arc<InstrumentedObjectStoreRegistry>)> {
    let config = config(args, settings)?;
    let registry = Arc::new(
        InstrumentedObjectStoreRegistry::new().with_profile_mode(args.object_store_profiling),
    );
    let mut runtime = RuntimeEnvBuilder::new().with_object_store_registry(registry.clone());
    if let Some(limit) = args.memory_limit {
        runtime = runtime.with_memory_pool(memory_pool(limit, args));
    }
    if let Some(limit) = args.disk_limit {
        let disk = DiskManagerBuilder::default()
            .with_mode(DiskManagerMode::OsTmpDirectory)
            .with_max_temp_directory_size(limit as u64);
        runtime = runtime.with_disk_manager_builder(disk);
    }
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(config)
        .with_runtime_env(runtime.build_arc()?);
    let ctx = SessionContext::new_with_state(lake.install(builder)?.build()).enable_url_table();
    for setting in settings.iter().filter(|s| !s.starts_with("datafusion.")) {
        let (key, value) = split_setting(setting)?;
        ctx.state_ref()
            .write()
            .config_mut()
            .options_mut()
            .set(key, value)?;
    }
    ctx.refresh_catalogs().await?;
    // Tables named by URL (`SELECT * FROM 's3://bucket/path/'`) register their store.
    ctx.register_catalog_list(Arc::new(DynamicObjectStoreCatalog::new(
        ctx.state().catalog_list().clone(),
        ctx.state_weak_ref(),
    )));
    let caches = ctx.task_ctx().runtime_env().cache_manager.clone();
    ctx.register_udtf("parquet_metadata", Arc::new(ParquetMetadataFunc {}));
    ctx.register_udtf(
        "metadata_cache",
        Arc::new(MetadataCacheFunc::new(caches.clone())),
    );
    ctx.register_udtf(
        "statistics_cache",
        Arc::new(StatisticsCacheFunc::new(caches.clone())),
    );
    ctx.register_udtf(
        "list_files_cache",
        Arc::new(ListFilesCacheFunc::new(caches)),
    );
    Ok((ctx, registry))
}

/// datafusion-cli's configuration: `DATAFUSION_*` variables, `-b`, tree `EXPLAIN` and `NULL`
/// shown as such unless the environment says otherwise; then the `datafusion.*` settings.
fn config(args: &Args, settings: &[String]) -> Result<SessionConfig> {
    let mut options = ConfigOptions::from_env()?;
    if let Some(batch_size) = args.batch_size {
        options.execution.batch_size = ConfigNonZeroUsize::try_new(batch_size)?;
    }
    if std::env::var_os("DATAFUSION_EXPLAIN_FORMAT").is_none() {
        options.explain.format = ExplainFormat::Tree;
    }
    if std::env::var_os("DATAFUSION_FORMAT_NULL").is_none() {
        options.format.null = String::from("NULL");
    }
    for setting in settings.iter().filter(|s| s.starts_with("datafusion.")) {
        let (key, value) = split_setting(setting)?;
        options.set(key, value)?;
    }
    let mut config = SessionConfig::from(options).with_information_schema(true);
    // When stdin carries the SQL it cannot also be a table's `LOCATION '/dev/stdin'`.
    if args.repl_mode() || args.file.iter().any(|f| is_stdin_location(f)) {
        config = config.with_extension(Arc::new(StdinCarriesCommands));
    }
    Ok(config)
}

/// The pool `-m`, `--mem-pool-type` and `--top-memory-consumers` ask for.
fn memory_pool(limit: usize, args: &Args) -> Arc<dyn MemoryPool> {
    let top = NonZeroUsize::new(args.top_memory_consumers);
    match (&args.mem_pool_type, top) {
        (PoolType::Fair, None) => Arc::new(FairSpillPool::new(limit)),
        (PoolType::Fair, Some(top)) => {
            Arc::new(TrackConsumersPool::new(FairSpillPool::new(limit), top))
        }
        (PoolType::Greedy, None) => Arc::new(GreedyMemoryPool::new(limit)),
        (PoolType::Greedy, Some(top)) => {
            Arc::new(TrackConsumersPool::new(GreedyMemoryPool::new(limit), top))
        }
    }
}

/// `KEY=VALUE` split at the first `=`.
pub fn split_setting(setting: &str) -> Result<(&str, &str)> {
    setting.split_once('=').ok_or_else(|| {
        DataFusionError::Configuration(format!("--set expects KEY=VALUE, got '{setting}'"))
    })
}

/// Whether `key` goes to the `LakeCache` (a shared `lakecache.*` setting, or an unknown one,
/// which the builder refuses by name) rather than to the session.
pub fn is_shared(key: &str) -> bool {
    key.starts_with("lakecache.")
        && datafusion_lakecache::config::setting(key)
            .is_none_or(|s| s.scope == datafusion_lakecache::config::Scope::Shared)
}

/// The `SET` statements of shared `lakecache.*` keys in the rc file `path`, as (key, value):
/// they configure the `LakeCache`, so they are read before it is built. Running the file
/// later sets them again to the value they already have, which a session accepts.
pub fn shared_settings_in(path: &str) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| DataFusionError::Execution(format!("cannot read the rc file {path}: {e}")))?;
    Ok(set_statements(&text)
        .into_iter()
        .filter(|(key, _)| is_shared(key))
        .collect())
}

/// The `SET key = value` and `SET key TO value` statements of `sql`, as (key, value), keys
/// in lower case and values without their quotes. Comments (`--` to the end of a line) are
/// skipped; other statements are left to the session.
fn set_statements(sql: &str) -> Vec<(String, String)> {
    let code: String = sql
        .lines()
        .map(|line| line.split_once("--").map_or(line, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n");
    code.split(';')
        .filter_map(|statement| {
            let words = statement.trim();
            let rest = words
                .get(..4)
                .filter(|set| set.eq_ignore_ascii_case("set "))
                .map(|_| words[4..].trim())?;
            let (key, value) = match rest.split_once('=') {
                Some(split) => split,
                None => {
                    let at = rest.to_ascii_lowercase().find(" to ")?;
                    (&rest[..at], &rest[at + 4..])
                }
            };
            let value = value.trim();
            let unquoted = ['\'', '"']
                .iter()
                .find_map(|q| value.strip_prefix(*q)?.strip_suffix(*q))
                .unwrap_or(value);
            Some((key.trim().to_ascii_lowercase(), unquoted.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_statements_are_found_whatever_their_form() {
        let rc = "-- the caches\nSET lakecache.range.disk_dir = '/var/cache/lc';\n\
                  set LAKECACHE.HANDLE.CAPACITY to 50000 ;\nSELECT 1;\n\
                  SET datafusion.execution.batch_size = 4096; -- the session's\n\
                  SET lakecache.prefetch.max_in_flight = 64";
        assert_eq!(
            set_statements(rc),
            [
                (
                    "lakecache.range.disk_dir".to_string(),
                    "/var/cache/lc".to_string()
                ),
                ("lakecache.handle.capacity".into(), "50000".into()),
                ("datafusion.execution.batch_size".into(), "4096".into()),
                ("lakecache.prefetch.max_in_flight".into(), "64".into()),
            ]
        );
        let shared: Vec<String> = set_statements(rc)
            .into_iter()
            .filter(|(k, _)| is_shared(k))
            .map(|(k, _)| k)
            .collect();
        assert_eq!(
            shared,
            ["lakecache.range.disk_dir", "lakecache.handle.capacity"]
        );
    }
}
