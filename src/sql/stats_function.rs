//! The table functions `install()` registers:
//! - `lakecache_stats()`: one row per cache, with the figures every cache shares;
//! - `lakecache_metrics()`: every figure, one row per (cache, metric), for scripts;
//! - `lakecache_clear()`: empties every cache and says how many entries each held;
//!   `lakecache_clear('handle')` (or `'index'`, `'range'`) empties that cache alone.
//!
//! ```sql
//! SELECT cache, entries, hits, misses FROM lakecache_stats();
//! SELECT value FROM lakecache_metrics() WHERE cache = 'prefetch' AND metric = 'bytes_wasted';
//! SELECT * FROM lakecache_clear('index');
//! ```
//!
//! `lakecache_clear()` acts when the query runs, not when it is planned, so `EXPLAIN SELECT *
//! FROM lakecache_clear()` clears nothing. Every session of a `LakeCache` shares its caches,
//! so sessions get the function only where the embedder asks for it
//! (`LakeCacheBuilder::sql_clear(true)`, `lakecache.sql.clear`): off by default, so that no
//! session of a shared `LakeCache` can empty every tenant's caches. The `lakecache` tool turns
//! it on for its own sessions.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;

use crate::config::Settings;
use crate::handle::max_open_files_allowed;
use crate::stats::{CacheStats, LakeStats};

/// What the table functions read and clear: a `LakeCache`.
pub(crate) trait StatsSource: std::fmt::Debug + Send + Sync {
    /// Every cache's figures now.
    fn stats(&self) -> LakeStats;
    /// The settings the caches were built with.
    fn settings(&self) -> &Settings;
    /// Drops every entry of the caches `which` names.
    fn clear(&self, which: Clearing);
}

/// Which caches `lakecache_clear` empties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Clearing {
    /// Every cache.
    All,
    /// `'handle'`: metadata, listings, proofs of access, descriptors.
    Handle,
    /// `'index'`: footers, page indexes, bloom filters.
    Index,
    /// `'range'`: bytes, in memory and on disk.
    Range,
}

impl Clearing {
    /// The caches the function's arguments name.
    fn of(args: &[Expr]) -> Result<Self> {
        let refuse = || {
            DataFusionError::Plan(
                "lakecache_clear() takes no argument, or one of 'handle', 'index', 'range'"
                    .to_string(),
            )
        };
        match args {
            [] => Ok(Self::All),
            [Expr::Literal(ScalarValue::Utf8(Some(name)), _)] => match name.as_str() {
                "handle" => Ok(Self::Handle),
                "index" => Ok(Self::Index),
                "range" => Ok(Self::Range),
                _ => Err(refuse()),
            },
            _ => Err(refuse()),
        }
    }

    /// Whether the rows of `cache` (`handle.metadata`, `index`, ...) are of a cleared cache.
    fn covers(self, cache: &str) -> bool {
        let prefix = match self {
            Self::All => return true,
            Self::Handle => "handle",
            Self::Index => "index",
            Self::Range => "range",
        };
        cache.split('.').next() == Some(prefix)
    }
}

/// Which of the table functions a [`LakeStatsFunction`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsTable {
    /// `lakecache_stats()`: a row per cache.
    PerCache,
    /// `lakecache_metrics()`: a row per (cache, metric).
    PerMetric,
    /// `lakecache_clear()`: clears every cache, or the one its argument names.
    Clear,
}

impl StatsTable {
    /// The SQL name of the function.
    pub fn name(self) -> &'static str {
        match self {
            StatsTable::PerCache => "lakecache_stats",
            StatsTable::PerMetric => "lakecache_metrics",
            StatsTable::Clear => "lakecache_clear",
        }
    }
}

/// One of the lakecache table functions over a `LakeCache`.
#[derive(Debug)]
pub(crate) struct LakeStatsFunction {
    lake: Arc<dyn StatsSource>,
    table: StatsTable,
}

impl LakeStatsFunction {
    /// The function `table` over `lake`.
    pub(crate) fn of(lake: Arc<dyn StatsSource>, table: StatsTable) -> Self {
        Self { lake, table }
    }
}

fn clear_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("cache", DataType::Utf8, false),
        Field::new("entries_dropped", DataType::UInt64, false),
    ]))
}

/// `lakecache_clear()`: clears when executed, not when planned, so `EXPLAIN SELECT * FROM
/// lakecache_clear()` clears nothing.
#[derive(Debug)]
struct ClearStream {
    lake: Arc<dyn StatsSource>,
    which: Clearing,
    schema: SchemaRef,
}

impl PartitionStream for ClearStream {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let (lake, schema) = (Arc::clone(&self.lake), Arc::clone(&self.schema));
        let which = self.which;
        let batch = futures::stream::once(async move {
            let stats = lake.stats();
            lake.clear(which);
            let rows: Vec<(&str, u64)> = [
                ("handle.metadata", stats.handle.metadata.entries),
                ("handle.listings", stats.handle.listings.entries),
                ("handle.proofs", stats.handle.proofs.entries),
                ("handle.files", stats.handle.files.entries),
                ("index", stats.index.footers.entries),
                ("index.bloom", stats.index.bloom_filters.entries),
                ("range.memory", stats.range.memory.entries),
                ("range.disk", stats.range.disk.entries),
            ]
            .into_iter()
            .filter(|(cache, _)| which.covers(cache))
            .collect();
            let columns: Vec<ArrayRef> = vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.1))),
            ];
            Ok(RecordBatch::try_new(clear_schema(), columns)?)
        });
        Box::pin(RecordBatchStreamAdapter::new(schema, batch))
    }
}

/// One row of `lakecache_stats()`; `None` where a figure does not apply to the cache.
struct CacheRow {
    cache: &'static str,
    entries: Option<u64>,
    bytes: Option<u64>,
    capacity: Option<u64>,
    counts: Option<CacheStats>,
}

fn per_cache(settings: &Settings, s: &LakeStats) -> Vec<CacheRow> {
    let handle = &settings.handle;
    let counted = |cache, bytes, capacity, stats: CacheStats| CacheRow {
        cache,
        entries: Some(stats.entries),
        bytes,
        capacity,
        counts: Some(stats),
    };
    let descriptors = handle.max_open_files.min(max_open_files_allowed()) as u64;
    let index_capacity = settings.index.capacity_bytes;
    let p = &s.prefetch;
    vec![
        counted(
            "handle.metadata",
            None,
            Some(handle.capacity),
            s.handle.metadata,
        ),
        counted(
            "handle.listings",
            Some(s.handle.listing_bytes),
            Some(handle.listing_bytes),
            s.handle.listings,
        ),
        counted("handle.files", None, Some(descriptors), s.handle.files),
        counted(
            "index",
            Some(s.index.bytes),
            Some(index_capacity),
            s.index.footers,
        ),
        // Bloom filters share the index cache's capacity; this row is their part of it.
        counted(
            "index.bloom",
            Some(s.index.bloom_bytes),
            Some(index_capacity),
            s.index.bloom_filters,
        ),
        counted(
            "range.memory",
            Some(s.range.memory_bytes),
            Some(s.range.memory_capacity),
            s.range.memory,
        ),
        counted(
            "range.disk",
            Some(s.range.disk_bytes),
            Some(s.range.disk_capacity),
            s.range.disk,
        ),
        // Prefetching holds bytes only while a scan runs; its own figures are in
        // lakecache_metrics().
        CacheRow {
            cache: "prefetch",
            entries: None,
            bytes: Some(p.reserved_bytes),
            capacity: Some(settings.prefetch.budget(usize::MAX, u64::MAX, 0)),
            counts: None,
        },
    ]
}

fn u64_column(values: impl Iterator<Item = Option<u64>>) -> ArrayRef {
    Arc::new(values.collect::<UInt64Array>())
}

impl TableFunctionImpl for LakeStatsFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let name = self.table.name();
        if self.table != StatsTable::Clear && !args.exprs().is_empty() {
            return Err(DataFusionError::Plan(format!(
                "{name}() takes no arguments"
            )));
        }
        let stats = self.lake.stats();
        let (schema, columns): (Schema, Vec<ArrayRef>) = match self.table {
            StatsTable::PerCache => {
                let rows = per_cache(self.lake.settings(), &stats);
                let count = |f: fn(&CacheStats) -> u64| {
                    u64_column(rows.iter().map(move |r| r.counts.as_ref().map(f)))
                };
                let mut fields = vec![Field::new("cache", DataType::Utf8, false)];
                for name in [
                    "entries",
                    "bytes",
                    "capacity",
                    "hits",
                    "misses",
                    "evictions",
                    "expirations",
                    "invalidations",
                ] {
                    fields.push(Field::new(name, DataType::UInt64, true));
                }
                let columns = vec![
                    Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.cache)))
                        as ArrayRef,
                    u64_column(rows.iter().map(|r| r.entries)),
                    u64_column(rows.iter().map(|r| r.bytes)),
                    u64_column(rows.iter().map(|r| r.capacity)),
                    count(|c| c.hits),
                    count(|c| c.misses),
                    count(|c| c.evictions),
                    count(|c| c.expirations),
                    count(|c| c.invalidations),
                ];
                (Schema::new(fields), columns)
            }
            StatsTable::PerMetric => {
                let rows = stats.rows();
                let schema = Schema::new(vec![
                    Field::new("cache", DataType::Utf8, false),
                    Field::new("metric", DataType::Utf8, false),
                    Field::new("value", DataType::UInt64, false),
                ]);
                let columns: Vec<ArrayRef> = vec![
                    Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                    Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                    Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.2))),
                ];
                (schema, columns)
            }
            StatsTable::Clear => {
                let clear = ClearStream {
                    lake: Arc::clone(&self.lake),
                    which: Clearing::of(args.exprs())?,
                    schema: clear_schema(),
                };
                let schema = Arc::clone(&clear.schema);
                let table = StreamingTable::try_new(schema, vec![Arc::new(clear)])?;
                return Ok(Arc::new(table));
            }
        };
        let schema = Arc::new(schema);
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns)?;
        Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
    }
}
