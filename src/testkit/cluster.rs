//! An in-process Ballista cluster (features `testkit` and `ballista`): a scheduler and
//! executors, each with a runtime, settings and codecs of its own, as separate processes
//! would have them; with the caches ([`Process::cached`]) or as plain Ballista
//! ([`Process::plain`]), to compare.

use std::sync::Arc;

use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::{
    BallistaCodec, BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec,
};
use ballista_core::{ConfigProducer, RuntimeProducer};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreRegistry;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::PhysicalExtensionCodec;

use crate::ballista::{LakeBallista, SessionBuilder, ballista_config, session_builder};

/// What one process of the cluster runs with.
pub struct Process {
    config: ConfigProducer,
    runtime: RuntimeProducer,
    sessions: SessionBuilder,
    logical: Arc<dyn LogicalExtensionCodec>,
    physical: Arc<dyn PhysicalExtensionCodec>,
}

impl Process {
    /// A process with the caches of `setup`.
    pub fn cached(setup: &LakeBallista) -> Self {
        Self {
            config: setup.config_producer(),
            runtime: setup.runtime_producer(),
            sessions: setup.session_builder(),
            logical: setup.logical_codec(),
            physical: setup.physical_codec(),
        }
    }

    /// A plain Ballista process over the object stores of `stores`: the same configuration
    /// (work stealing off), no cache.
    pub fn plain(stores: Arc<dyn ObjectStoreRegistry>) -> Result<Self> {
        let runtime = RuntimeEnvBuilder::new()
            .with_object_store_registry(stores)
            .build_arc()?;
        let shared = Arc::clone(&runtime);
        Ok(Self {
            config: Arc::new(ballista_config),
            runtime: Arc::new(move |_| Ok(Arc::clone(&shared))),
            sessions: session_builder(runtime),
            logical: Arc::new(BallistaLogicalExtensionCodec::default()),
            physical: Arc::new(BallistaPhysicalExtensionCodec::default()),
        })
    }

    fn codec(&self) -> BallistaCodec {
        BallistaCodec::new(Arc::clone(&self.logical), Arc::clone(&self.physical))
    }
}

/// Starts a scheduler run as `scheduler` and one executor per element of `executors` (each
/// with `vcores` task slots), and returns the scheduler's URL for
/// `SessionContext::remote_with_state`. They run until the tokio runtime ends.
pub async fn start_cluster(
    scheduler: &Process,
    executors: &[Process],
    vcores: usize,
) -> Result<String> {
    let addr = ballista_scheduler::standalone::new_standalone_scheduler_with_builder(
        Arc::clone(&scheduler.sessions),
        Arc::clone(&scheduler.config),
        scheduler.codec(),
    )
    .await
    .map_err(external)?;
    let url = format!("http://localhost:{}", addr.port());
    for executor in executors {
        // The scheduler was just spawned: wait until it listens.
        let mut tries = 0;
        let client = loop {
            match SchedulerGrpcClient::connect(url.clone()).await {
                Ok(client) => break client,
                Err(e) if tries == 100 => return Err(external(e)),
                Err(_) => tries += 1,
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        ballista_executor::new_standalone_executor_from_builder(
            client,
            vcores,
            Arc::clone(&executor.config),
            Arc::clone(&executor.runtime),
            executor.codec(),
            BallistaFunctionRegistry::default(),
        )
        .await
        .map_err(external)?;
    }
    Ok(url)
}

fn external(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}
