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

use crate::ballista::{
    AffinityPolicy, LakeBallista, SessionBuilder, ballista_config, session_builder,
};

/// What one process of the cluster runs with.
pub struct Process {
    config: ConfigProducer,
    runtime: RuntimeProducer,
    sessions: SessionBuilder,
    logical: Arc<dyn LogicalExtensionCodec>,
    physical: Arc<dyn PhysicalExtensionCodec>,
    /// The set-up of a process with the caches: told its executor name or its placement.
    setup: Option<LakeBallista>,
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
            setup: Some(setup.clone()),
        }
    }

    /// A plain Ballista process over the object stores of `stores`: the same configuration
    /// (work stealing off), no cache.
    pub fn plain(stores: Arc<dyn ObjectStoreRegistry>) -> Result<Self> {
        let runtime = RuntimeEnvBuilder::new()
            .with_object_store_registry(Arc::clone(&stores))
            .build_arc()?;
        // As Ballista's scheduler does: a runtime per session.
        let per_session = move || {
            RuntimeEnvBuilder::new()
                .with_object_store_registry(Arc::clone(&stores))
                .build_arc()
        };
        Ok(Self {
            config: Arc::new(ballista_config),
            runtime: Arc::new(move |_| Ok(Arc::clone(&runtime))),
            sessions: session_builder(per_session),
            logical: Arc::new(BallistaLogicalExtensionCodec::default()),
            physical: Arc::new(BallistaPhysicalExtensionCodec::default()),
            setup: None,
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

/// A cluster whose executors have names of their own (as a deployment sets them with
/// `--executor-id`) and can be stopped one by one, and whose scheduler may place scan tasks
/// by cache affinity ([`AffinityPolicy`]). Pull mode, as Ballista's standalone cluster; it
/// runs until dropped or until the tokio runtime ends.
pub struct NamedCluster {
    url: String,
    policy: Option<Arc<AffinityPolicy>>,
    executors: std::sync::Mutex<std::collections::HashMap<String, RunningExecutor>>,
}

/// The tasks of one executor, aborted when it is stopped, and its work directory.
struct RunningExecutor {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    work_dir: std::path::PathBuf,
}

impl Drop for RunningExecutor {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        let _ = std::fs::remove_dir_all(&self.work_dir);
    }
}

/// How a [`NamedCluster`]'s scheduler places scan tasks.
#[derive(Debug, Clone, Copy)]
pub enum Placement {
    /// Ballista's default: the executor with the most free slots.
    Any,
    /// By cache affinity, waiting up to `wait` for the preferred executor, and counting an
    /// executor silent for `liveness` as gone.
    Affinity {
        /// How long a task waits for its preferred executor.
        wait: std::time::Duration,
        /// How long an executor counts as alive after its last poll.
        liveness: std::time::Duration,
    },
}

impl NamedCluster {
    /// Starts a scheduler run as `scheduler`, placing tasks as `placement` says.
    pub async fn start(scheduler: &Process, placement: Placement) -> Result<Self> {
        use ballista_core::config::TaskSchedulingPolicy;
        use ballista_scheduler::cluster::BallistaCluster;
        use ballista_scheduler::config::{SchedulerConfig, TaskDistributionPolicy};

        let cluster = BallistaCluster::new_memory(
            "localhost:0",
            Arc::clone(&scheduler.sessions),
            Arc::clone(&scheduler.config),
        );
        let policy = match placement {
            Placement::Any => None,
            Placement::Affinity { wait, liveness } => Some(Arc::new(
                AffinityPolicy::new(cluster.cluster_state())
                    .with_wait(wait)
                    .with_liveness(liveness),
            )),
        };
        let listener = tokio::net::TcpListener::bind("localhost:0").await?;
        let port = listener.local_addr()?.port();
        let mut config = SchedulerConfig::default()
            .with_scheduler_policy(TaskSchedulingPolicy::PullStaged)
            .with_hostname("localhost")
            .with_port(port)
            .with_override_config_producer(Arc::clone(&scheduler.config))
            .with_override_session_builder(Arc::clone(&scheduler.sessions));
        config.override_logical_codec = Some(Arc::clone(&scheduler.logical));
        config.override_physical_codec = Some(Arc::clone(&scheduler.physical));
        if let Some(policy) = &policy {
            if let Some(setup) = &scheduler.setup {
                setup.report_placement(policy);
            }
            let policy: Arc<dyn ballista_scheduler::cluster::DistributionPolicy> = policy.clone();
            config = config.with_task_distribution(TaskDistributionPolicy::Custom(policy));
        }
        let server = ballista_scheduler::scheduler_process::create_scheduler::<
            datafusion_proto::protobuf::LogicalPlanNode,
            datafusion_proto::protobuf::PhysicalPlanNode,
        >(cluster, Arc::new(config))
        .await
        .map_err(external)?;
        tokio::spawn(async move {
            let _ = ballista_scheduler::scheduler_process::start_grpc_service_with_listener(
                listener, server,
            )
            .await;
        });
        Ok(Self {
            url: format!("http://localhost:{port}"),
            policy,
            executors: Default::default(),
        })
    }

    /// The scheduler's URL, for `SessionContext::remote_with_state`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The affinity policy's figures, if the scheduler places by affinity.
    pub fn placement(&self) -> Option<crate::ballista::PlacementStats> {
        self.policy.as_ref().map(|p| p.stats())
    }

    /// Starts an executor named `name` run as `process`, with `vcores` task slots.
    pub async fn add_executor(&self, name: &str, process: &Process, vcores: usize) -> Result<()> {
        use arrow_flight::flight_service_server::FlightServiceServer;
        use ballista_core::serde::protobuf::ExecutorRegistration;
        use ballista_core::serde::scheduler::{
            ExecutorOperatingSystemSpecification, ExecutorSpecification,
        };
        use ballista_core::utils::{GrpcServerConfig, create_grpc_server};
        use ballista_executor::executor::Executor;
        use ballista_executor::flight_service::BallistaFlightService;
        use ballista_executor::metrics::LoggingMetricsCollector;

        if let Some(setup) = &process.setup {
            setup.name_executor(name);
        }
        let listener = tokio::net::TcpListener::bind("localhost:0").await?;
        let address = listener.local_addr()?;
        let registration = ExecutorRegistration {
            id: name.to_string(),
            host: Some("localhost".to_string()),
            port: u32::from(address.port()),
            grpc_port: 50020,
            specification: Some(
                ExecutorSpecification::default()
                    .with_vcores(vcores as u32)
                    .into(),
            ),
            os_info: Some(ExecutorOperatingSystemSpecification::default().into()),
            ballista_protocol_version: ballista_core::BALLISTA_PROTOCOL_VERSION,
        };
        let work_dir = std::env::temp_dir().join(format!(
            "lakecache-executor-{}-{name}-{}",
            std::process::id(),
            address.port()
        ));
        std::fs::create_dir_all(&work_dir)?;
        let dir = work_dir.display().to_string();
        let executor = Arc::new(Executor::with_default_execution_engine(
            registration,
            &dir,
            Arc::clone(&process.runtime),
            Arc::clone(&process.config),
            Arc::new(BallistaFunctionRegistry::default()),
            Arc::new(LoggingMetricsCollector::default()),
            vcores,
        ));
        let flight = FlightServiceServer::new(BallistaFlightService::new(dir));
        let serve = tokio::spawn(async move {
            let _ = create_grpc_server(&GrpcServerConfig::default())
                .add_service(flight)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        let mut tries = 0;
        let client = loop {
            match SchedulerGrpcClient::connect(self.url.clone()).await {
                Ok(client) => break client,
                Err(e) if tries == 100 => return Err(external(e)),
                Err(_) => tries += 1,
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        let codec = process.codec();
        let poll = tokio::spawn(async move {
            let _ = ballista_executor::execution_loop::poll_loop(
                client,
                executor,
                codec,
                None,
                None,
                ballista_executor::health::ExecutorHealth::new(),
            )
            .await;
        });
        let running = RunningExecutor {
            tasks: vec![serve, poll],
            work_dir,
        };
        self.lock().insert(name.to_string(), running);
        Ok(())
    }

    /// Stops the executor named `name`: it polls for no more work and serves nothing.
    pub fn stop_executor(&self, name: &str) {
        self.lock().remove(name);
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, RunningExecutor>> {
        self.executors.lock().unwrap_or_else(|e| e.into_inner())
    }
}
