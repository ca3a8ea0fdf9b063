//! The plan codecs of a cluster with the caches: Ballista's own, plus what crosses the wire
//! differently with them.
//!
//! - [`LakePhysicalCodec`]: a Parquet scan is sent as DataFusion encodes it (its reader
//!   factory does not travel) and decoded on the executor with DataFusion's reader. This
//!   codec sees every plan an executor decodes (each stage is rooted in a shuffle writer,
//!   an extension node), and gives each scan below it the caches' reader and a prefetcher,
//!   as an installed session's planner does.
//! - [`LakeLogicalCodec`]: a [`LakeTable`] on the client crosses to the scheduler as the
//!   `ListingTable` it wraps, and becomes a `LakeTable` over the scheduler's caches again.
//! - `lakecache_cluster_metrics()` crosses as a tag, and its scan as the executors it asks
//!   and the scheduler's rows ([`super::figures`]).

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use ballista_core::serde::{BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec};
use datafusion::catalog::TableProvider;
use datafusion::common::{TableReference, plan_err};
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{
    AggregateUDF, Extension, HigherOrderUDF, LogicalPlan, LogicalPlanBuilder, ScalarUDF, WindowUDF,
};
use datafusion::physical_expr_common::physical_expr::PhysicalExpr;
use datafusion::physical_expr_common::physical_expr::proto_decode::PhysicalExprDecodeCtx;
use datafusion::physical_expr_common::physical_expr::proto_encode::PhysicalExprEncodeCtx;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::logical_plan::{AsLogicalPlan, LogicalExtensionCodec};
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_proto::protobuf::LogicalPlanNode;

use super::LakeBallista;
use super::figures::{ClusterMetricsExec, ClusterMetricsTable, FUNCTION, ProcessFigures};
use crate::table::{LakeTable, ScanCaches};

/// Ballista's physical codec, giving every Parquet scan it decodes the caches; see the module
/// docs.
#[derive(Debug)]
pub struct LakePhysicalCodec {
    inner: Arc<dyn PhysicalExtensionCodec>,
    scans: ScanCaches,
    figures: Option<Arc<ProcessFigures>>,
}

impl LakePhysicalCodec {
    /// Ballista's codec, with the scans it decodes reading through `lake` (a `LakeCache`).
    pub fn new(lake: &impl AsRef<ScanCaches>) -> Self {
        Self::wrapping(Arc::new(BallistaPhysicalExtensionCodec::default()), lake)
    }

    /// `inner` (a product's own codec, which should wrap Ballista's), with the scans it
    /// decodes reading through `lake`.
    pub fn wrapping(inner: Arc<dyn PhysicalExtensionCodec>, lake: &impl AsRef<ScanCaches>) -> Self {
        Self {
            inner,
            scans: lake.as_ref().clone(),
            figures: None,
        }
    }

    /// This codec, with `lakecache_cluster_metrics()`'s scan answering with the figures of
    /// `setup`'s process ([`LakeBallista::physical_codec`] does it).
    pub fn with_figures_of(mut self, setup: &LakeBallista) -> Self {
        self.figures = Some(Arc::clone(&setup.figures));
        self
    }
}

#[deny(clippy::missing_trait_methods)]
impl PhysicalExtensionCodec for LakePhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = match buf.split_first() {
            Some((&OTHER, rest)) => self.inner.try_decode(rest, inputs, ctx, proto_converter)?,
            #[cfg(feature = "delta")]
            Some((&DELTA, rest)) => {
                return super::delta::ClusterDeltaScanExec::decode(rest, inputs, ctx, &self.scans);
            }
            Some((&FIGURES, rest)) => {
                let figures = self.figures.clone();
                return Ok(Arc::new(ClusterMetricsExec::decode(rest, inputs, figures)?));
            }
            // Its scan is rewritten with the rest of the stage, by the codec call that
            // decodes the stage's root (every stage is rooted in an extension node).
            #[cfg(feature = "iceberg")]
            Some((&ICEBERG, rest)) => {
                let [input] = inputs else {
                    return plan_err!("an IcebergScanExec has one input, given {}", inputs.len());
                };
                let scan = crate::iceberg::IcebergScanExec::decode(rest, Arc::clone(input))?;
                return Ok(Arc::new(scan));
            }
            _ => return plan_err!("a plan node not encoded by LakePhysicalCodec"),
        };
        // The task's settings (the client's `SET lakecache.*` included) and its runtime: the
        // executor's caches, and the memory pool the task was given.
        let runtime = ctx.runtime_env();
        self.scans
            .rewrite(plan, ctx.session_config().options(), &runtime, true)
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        #[cfg(feature = "delta")]
        if let Some(scan) = node.downcast_ref::<super::delta::ClusterDeltaScanExec>() {
            buf.push(DELTA);
            buf.extend_from_slice(&scan.encode()?);
            return Ok(());
        }
        if let Some(scan) = node.downcast_ref::<ClusterMetricsExec>() {
            buf.push(FIGURES);
            buf.extend_from_slice(&scan.encode()?);
            return Ok(());
        }
        #[cfg(feature = "iceberg")]
        if let Some(scan) = node.downcast_ref::<crate::iceberg::IcebergScanExec>() {
            buf.push(ICEBERG);
            buf.extend_from_slice(&scan.encode());
            return Ok(());
        }
        buf.push(OTHER);
        self.inner.try_encode(node, buf, proto_converter)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udf(node, buf)
    }

    fn try_decode_higher_order_function(
        &self,
        name: &str,
        buf: &[u8],
    ) -> Result<Arc<HigherOrderUDF>> {
        self.inner.try_decode_higher_order_function(name, buf)
    }

    fn try_encode_higher_order_function(
        &self,
        node: &HigherOrderUDF,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.inner.try_encode_higher_order_function(node, buf)
    }

    fn try_decode_expr(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn PhysicalExpr>],
        ctx: &PhysicalExprDecodeCtx<'_>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        self.inner.try_decode_expr(buf, inputs, ctx)
    }

    fn try_encode_expr(
        &self,
        node: &Arc<dyn PhysicalExpr>,
        buf: &mut Vec<u8>,
        ctx: &PhysicalExprEncodeCtx<'_>,
    ) -> Result<()> {
        self.inner.try_encode_expr(node, buf, ctx)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        self.inner.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> Result<Arc<WindowUDF>> {
        self.inner.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udwf(node, buf)
    }
}

/// The first byte of an encoded table provider or plan node: what the rest is.
const OTHER: u8 = 0;
/// A [`LakeTable`], as the scan of the `ListingTable` it wraps.
const LAKE_TABLE: u8 = 1;
/// A Delta table or scan (feature `delta`; see [`super::delta`]).
#[cfg_attr(not(feature = "delta"), allow(dead_code))]
const DELTA: u8 = 2;
/// `lakecache_cluster_metrics()`: its table (the tag alone), or its scan.
const FIGURES: u8 = 3;
/// An Iceberg table ([`crate::iceberg::IcebergTable::to_parts`]), or its scan node.
#[cfg(feature = "iceberg")]
const ICEBERG: u8 = 4;

/// Ballista's logical codec, carrying [`LakeTable`]s too; see the module docs.
#[derive(Debug)]
pub struct LakeLogicalCodec {
    inner: Arc<dyn LogicalExtensionCodec>,
    scans: ScanCaches,
    figures: Option<Arc<ProcessFigures>>,
}

impl LakeLogicalCodec {
    /// Ballista's codec, with the `LakeTable`s it decodes reading through `lake`.
    pub fn new(lake: &impl AsRef<ScanCaches>) -> Self {
        Self::wrapping(Arc::new(BallistaLogicalExtensionCodec::default()), lake)
    }

    /// `inner` (a product's own codec, which should wrap Ballista's), carrying `LakeTable`s
    /// too, which it decodes reading through `lake`.
    pub fn wrapping(inner: Arc<dyn LogicalExtensionCodec>, lake: &impl AsRef<ScanCaches>) -> Self {
        Self {
            inner,
            scans: lake.as_ref().clone(),
            figures: None,
        }
    }

    /// This codec, carrying `lakecache_cluster_metrics()` to a scheduler whose figures are
    /// `setup`'s ([`LakeBallista::logical_codec`] does it).
    pub fn with_figures_of(mut self, setup: &LakeBallista) -> Self {
        self.figures = Some(Arc::clone(&setup.figures));
        self
    }
}

#[deny(clippy::missing_trait_methods)]
impl LogicalExtensionCodec for LakeLogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> Result<Extension> {
        self.inner.try_decode(buf, inputs, ctx)
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        match buf.split_first() {
            Some((&LAKE_TABLE, rest)) => {
                // The scan of the wrapped table, as DataFusion encodes a `ListingTable`.
                let node = LogicalPlanNode::try_decode(rest)?;
                let LogicalPlan::TableScan(scan) = node.try_into_logical_plan(ctx, self)? else {
                    return plan_err!("table {table_ref}: a LakeTable must decode as a table scan");
                };
                let provider = source_as_provider(&scan.source)?;
                let any: Arc<dyn std::any::Any + Send + Sync> = provider;
                match any.downcast::<ListingTable>() {
                    Ok(listing) => Ok(Arc::new(LakeTable::new(listing, &self.scans))),
                    Err(_) => plan_err!("table {table_ref}: a LakeTable must wrap a ListingTable"),
                }
            }
            #[cfg(feature = "delta")]
            Some((&DELTA, rest)) => Ok(Arc::new(super::delta::ClusterDeltaTable::decode(rest)?)),
            #[cfg(feature = "iceberg")]
            Some((&ICEBERG, rest)) => {
                let parts = std::str::from_utf8(rest).map_err(|_| {
                    datafusion::common::plan_datafusion_err!(
                        "table {table_ref}: not an Iceberg table"
                    )
                })?;
                Ok(Arc::new(crate::iceberg::IcebergTable::from_parts(
                    parts, schema,
                )?))
            }
            Some((&FIGURES, _)) => match &self.figures {
                Some(figures) => Ok(Arc::new(ClusterMetricsTable::new(Arc::clone(figures)))),
                None => plan_err!(
                    "table {table_ref}: {FUNCTION}() needs the codec of the scheduler's \
                     LakeBallista"
                ),
            },
            Some((&OTHER, rest)) => self
                .inner
                .try_decode_table_provider(rest, table_ref, schema, ctx),
            _ => plan_err!("table {table_ref}: not encoded by LakeLogicalCodec"),
        }
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        #[cfg(feature = "delta")]
        if let Some(encoded) = super::delta::ClusterDeltaTable::encode(node.as_ref()) {
            buf.push(DELTA);
            buf.extend_from_slice(&encoded?);
            return Ok(());
        }
        if node.downcast_ref::<ClusterMetricsTable>().is_some() {
            buf.push(FIGURES);
            return Ok(());
        }
        #[cfg(feature = "iceberg")]
        if let Some(table) = node.downcast_ref::<crate::iceberg::IcebergTable>() {
            buf.push(ICEBERG);
            buf.extend_from_slice(table.to_parts().as_bytes());
            return Ok(());
        }
        let mut encoded = Vec::new();
        let kind = match node.downcast_ref::<LakeTable>() {
            Some(table) => {
                let listing: Arc<dyn TableProvider> = Arc::clone(table.listing_table()) as _;
                let scan =
                    LogicalPlanBuilder::scan(table_ref.clone(), provider_as_source(listing), None)?
                        .build()?;
                LogicalPlanNode::try_from_logical_plan(&scan, self)?.try_encode(&mut encoded)?;
                LAKE_TABLE
            }
            None => {
                self.inner
                    .try_encode_table_provider(table_ref, node, &mut encoded)?;
                OTHER
            }
        };
        buf.push(kind);
        buf.extend_from_slice(&encoded);
        Ok(())
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> Result<Arc<dyn FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn FileFormatFactory>,
    ) -> Result<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udf(node, buf)
    }

    fn try_decode_higher_order_function(
        &self,
        name: &str,
        buf: &[u8],
    ) -> Result<Arc<HigherOrderUDF>> {
        self.inner.try_decode_higher_order_function(name, buf)
    }

    fn try_encode_higher_order_function(
        &self,
        node: &HigherOrderUDF,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.inner.try_encode_higher_order_function(node, buf)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        self.inner.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> Result<Arc<WindowUDF>> {
        self.inner.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udwf(node, buf)
    }
}
