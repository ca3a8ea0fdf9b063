//! Running SQL over a lake in a fresh `SessionContext`, as each query of a service that plans
//! queries afresh does.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use object_store::ObjectStore;
use url::Url;

use crate::lake::LakeCache;

/// Where a lake is and which store serves it.
#[derive(Debug, Clone)]
pub struct LakeLocation {
    /// URL of the store, such as `file://` or `s3://bucket`.
    pub store_url: Url,
    /// The store to register for `store_url`.
    pub store: Arc<dyn ObjectStore>,
    /// The table's location, such as `/data/lake/` or `s3://bucket/lake/`.
    pub table_url: String,
    /// If set, sessions are installed from this cache ([`LakeCache::install`]).
    pub lake: Option<LakeCache>,
}

/// A new session configured by `config`: installed from `cache` if given, else vanilla
/// DataFusion, the two sides tests and benchmarks compare.
pub fn context(cache: Option<&LakeCache>, config: SessionConfig) -> Result<SessionContext> {
    Ok(match cache {
        Some(cache) => {
            let builder = SessionStateBuilder::new()
                .with_default_features()
                .with_config(config);
            SessionContext::new_with_state(cache.install(builder)?.build())
        }
        None => SessionContext::new_with_config(config),
    })
}

/// Runs `sql` in a new `SessionContext` configured by `config`, where the lake is table `t`.
pub async fn query(
    lake: &LakeLocation,
    sql: &str,
    config: SessionConfig,
) -> Result<Vec<RecordBatch>> {
    let ctx = context(lake.lake.as_ref(), config)?;
    ctx.register_object_store(&lake.store_url, Arc::clone(&lake.store));
    ctx.register_parquet("t", &lake.table_url, ParquetReadOptions::default())
        .await?;
    ctx.sql(sql).await?.collect().await
}
