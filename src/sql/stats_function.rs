//! `lakecache_stats()`: every cache's figures as a table, one row per (cache, metric).
//!
//! ```sql
//! SELECT * FROM lakecache_stats() WHERE cache = 'index';
//! ```

use std::sync::Arc;

use arrow::array::{RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::datasource::MemTable;
use datafusion::error::{DataFusionError, Result};

use crate::LakeCache;

/// The `lakecache_stats()` table function of a [`LakeCache`].
#[derive(Debug)]
pub struct LakeStatsFunction {
    lake: LakeCache,
}

impl LakeStatsFunction {
    /// The function reporting `lake`'s figures.
    pub fn new(lake: &LakeCache) -> Self {
        Self { lake: lake.clone() }
    }
}

impl TableFunctionImpl for LakeStatsFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        if !args.exprs().is_empty() {
            return Err(DataFusionError::Plan(
                "lakecache_stats() takes no arguments".to_string(),
            ));
        }
        let rows = self.lake.stats().rows();
        let schema = Arc::new(Schema::new(vec![
            Field::new("cache", DataType::Utf8, false),
            Field::new("metric", DataType::Utf8, false),
            Field::new("value", DataType::UInt64, false),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.2))),
            ],
        )?;
        Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
    }
}
