//! [`LakeQueryPlanner`]: gives every Parquet scan of an installed session's final plan its
//! prefetcher (and its reader, if its table did not give it one).
//!
//! A scan's prefetcher needs what only the final plan knows: the predicate DataFusion pushes
//! into the scan during physical optimization, the projection after projection pushdown, and
//! the file groups after large files were split across partitions. And it needs the session
//! that plans: its settings, and its runtime, whose memory pool `SET
//! datafusion.runtime.memory_limit` replaces. A query planner sees both, so `install()`
//! wraps the session's planner in this one, which finishes the plan the inner one made: a
//! scan whose table gave it its reader keeps it and only binds the prefetcher, so the plan
//! is left as it is (see `awaiting.rs`); any other is rebuilt with a reader of its own.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::Session;
use datafusion::error::Result;
use datafusion::execution::context::QueryPlanner;
use datafusion::logical_expr::LogicalPlan;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};

use super::ScanCaches;

/// The query planner `install()` gives a session; see the module docs.
#[derive(Debug)]
pub(crate) struct LakeQueryPlanner {
    inner: Option<Arc<dyn QueryPlanner + Send + Sync>>,
    scans: ScanCaches,
}

impl LakeQueryPlanner {
    /// Plans with `inner` (DataFusion's default planner if `None`), then rewrites the scans.
    pub(crate) fn new(
        inner: Option<Arc<dyn QueryPlanner + Send + Sync>>,
        scans: ScanCaches,
    ) -> Self {
        Self { inner, scans }
    }
}

#[async_trait]
impl QueryPlanner for LakeQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = match &self.inner {
            Some(inner) => inner.create_physical_plan(logical_plan, session).await?,
            None => {
                DefaultPhysicalPlanner::default()
                    .create_physical_plan(logical_plan, session)
                    .await?
            }
        };
        self.scans
            .rewrite(plan, session.config_options(), session.runtime_env(), true)
    }
}
