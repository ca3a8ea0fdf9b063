//! Affinity placement: the scheduler runs each scan task on the executor whose caches hold
//! its files, so that a cluster's caches add up instead of each executor caching the whole
//! lake.
//!
//! - **The rule.** A scan partition's preferred executor is decided by rendezvous hashing
//!   (highest random weight) of the object it reads most bytes of over the names of the
//!   executors alive now: each (executor, object) pair gets a score, the highest wins. When
//!   an executor joins or leaves, only the objects it wins or won move; nothing else does.
//! - **Names.** Executors are told apart by their id (`ExecutorProcessConfig::executor_id`,
//!   `--executor-id`), which a deployment must set to a stable name: Ballista's default is a
//!   new random id at every start, which would move every object at every restart and throw
//!   away a disk tier's worth of cache.
//! - **Waiting.** A partition whose preferred executor has no free slot waits for it, up to
//!   [`AffinityPolicy::with_wait`] (default [`DEFAULT_WAIT`]), then runs on any executor
//!   with a free slot. Ballista binds tasks only when an event arrives: in pull mode every
//!   executor's poll is one (an idle executor polls every 50 ms), in push mode a finished
//!   task is one, and a waiting partition is bound at the first event after its wait.
//! - **What is not a scan** (stages reading shuffle output, stages that collapse their
//!   input into one task) is bound as Ballista's default policy binds it: to the executor
//!   with the most free slots.
//!
//! The figures ([`PlacementStats`]) say how many tasks ran on their preferred executor,
//! how many ran elsewhere after waiting, and how many were not scans.

use std::collections::{HashMap, HashSet};
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::figures::ClusterMetricsExec;
use super::groups;
use ballista_core::JobId;
use ballista_core::config::BallistaConfig;
use ballista_core::execution_plans::{RangeShuffleReaderExec, ShuffleReaderExec};
use ballista_core::serde::protobuf::{AvailableVcores, executor_status, job_status};
use ballista_core::serde::scheduler::TaskKey;
use ballista_scheduler::cluster::{BoundTask, ClusterState, DistributionPolicy};
use ballista_scheduler::state::execution_graph::{TaskDescription, create_task_info};
use ballista_scheduler::state::execution_stage::RunningStage;
use ballista_scheduler::state::task_builder::restrict_plan_to_partitions;
use ballista_scheduler::state::task_manager::JobInfoCache;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use object_store::path::Path;
use twox_hash::XxHash64;

/// How long a scan partition waits for its preferred executor by default: about one cold
/// read of a small file (a round trip to the store and its bytes), which is what running it
/// elsewhere would cost.
pub const DEFAULT_WAIT: Duration = Duration::from_millis(100);

/// How long an executor counts as alive after its last heartbeat (or poll) by default:
/// Ballista's own `executor_timeout_seconds`, so push-mode executors (a heartbeat a minute)
/// never look gone between heartbeats.
pub const DEFAULT_LIVENESS: Duration = Duration::from_secs(180);

/// The executor of `executors` that `object` prefers: the one with the highest rendezvous
/// score. `None` if there is none.
pub fn preferred_executor<'a>(executors: &'a [String], object: &str) -> Option<&'a String> {
    let at = Rendezvous::new(executors).owner(object_hash(object))?;
    executors.get(at)
}

/// Seed of the names hashed for placement.
const SEED: u64 = 0x1a4e_cac4e;

/// Executors' names hashed once, to score many objects against: a stage of a million files
/// over a hundred executors scores a hundred million pairs, so a pair's score combines two
/// 64-bit hashes rather than hashing both names again.
pub(crate) struct Rendezvous {
    executors: Vec<u64>,
}

impl Rendezvous {
    pub(crate) fn new(executors: &[String]) -> Self {
        let executors = executors
            .iter()
            .map(|e| XxHash64::oneshot(SEED, e.as_bytes()))
            .collect();
        Self { executors }
    }

    /// The index of the executor the object of hash `object` ([`object_hash`]) prefers.
    pub(crate) fn owner(&self, object: u64) -> Option<usize> {
        let bytes = object.to_le_bytes();
        (0..self.executors.len()).max_by_key(|&i| XxHash64::oneshot(self.executors[i], &bytes))
    }
}

/// The hash of an object's name ([`object_key`]) that placement scores it by.
pub(crate) fn object_hash(object: &str) -> u64 {
    XxHash64::oneshot(SEED, object.as_bytes())
}

/// [`object_hash`] of [`object_key`]`(store, location)`, without making the key.
pub(crate) fn object_hash_of(store: &ObjectStoreUrl, location: &Path) -> u64 {
    let mut hasher = XxHash64::with_seed(SEED);
    for part in key_parts(store, location) {
        hasher.write(part.as_bytes());
    }
    hasher.finish()
}

/// The parts of an object's key, in order.
fn key_parts<'a>(store: &'a ObjectStoreUrl, location: &'a Path) -> [&'a str; 3] {
    [store.as_str(), "/", location.as_ref()]
}

/// How the scheduler placed tasks, from [`AffinityPolicy::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlacementStats {
    /// Scan tasks run on their preferred executor.
    pub preferred: u64,
    /// Of them, tasks that waited for it first.
    pub waited: u64,
    /// Scan tasks run elsewhere: their preferred executor had no free slot within the wait.
    pub elsewhere: u64,
    /// Tasks that read no file of their own (shuffle readers, collapsing stages).
    pub not_scans: u64,
}

#[derive(Debug, Default)]
struct Counters {
    preferred: AtomicU64,
    waited: AtomicU64,
    elsewhere: AtomicU64,
    not_scans: AtomicU64,
}

/// Where a partition would run.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Preference {
    /// On the preferred executor of the object it reads most bytes of.
    Object(String),
    /// On this executor and no other, waiting for it as long as it is alive: a partition
    /// of `lakecache_cluster_metrics()` ([`super::figures`]).
    Executor(String),
}

/// A stage's partitions and where each would run (`None`: it reads no file).
type StageKeys = Vec<Option<Preference>>;

/// A stage of a job, in one attempt.
type StageAttempt = (JobId, usize, usize);

/// Where each partition of a stage attempt would run among the executors alive when it was
/// worked out: a bind looks each pending partition up rather than scoring every executor
/// for it, so its cost does not grow with the cluster.
struct Owners {
    alive: Vec<String>,
    /// Per partition, the index in `alive` of the executor it prefers; `None` for one that
    /// reads no file, or must run on an executor no longer alive.
    of: Vec<Option<usize>>,
}

impl Owners {
    fn of(keys: &StageKeys, alive: &[String]) -> Self {
        let rendezvous = Rendezvous::new(alive);
        let of = keys
            .iter()
            .map(|key| match key.as_ref()? {
                Preference::Object(object) => rendezvous.owner(object_hash(object)),
                Preference::Executor(name) => alive.iter().position(|a| a == name),
            })
            .collect();
        Self {
            alive: alive.to_vec(),
            of,
        }
    }
}

/// Ballista's task distribution by cache affinity; see the module docs. Set with
/// `SchedulerConfig::with_task_distribution(TaskDistributionPolicy::Custom(policy))`.
pub struct AffinityPolicy {
    cluster: Arc<dyn ClusterState>,
    wait: Duration,
    liveness: Duration,
    keys: Mutex<HashMap<StageAttempt, Arc<StageKeys>>>,
    /// Where each stage attempt's partitions would run, for the executors last alive.
    owners: Mutex<HashMap<StageAttempt, Arc<Owners>>>,
    /// When each waiting partition first found its preferred executor busy.
    waiting: Mutex<HashMap<(StageAttempt, usize), Instant>>,
    /// When each executor last offered slots (a poll in pull mode): with the heartbeats, who
    /// is alive between binds.
    offered: Mutex<HashMap<String, Instant>>,
    counters: Counters,
}

impl std::fmt::Debug for AffinityPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AffinityPolicy")
            .field("wait", &self.wait)
            .field("liveness", &self.liveness)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl AffinityPolicy {
    /// A policy over the executors `cluster` knows (`BallistaCluster::cluster_state`).
    pub fn new(cluster: Arc<dyn ClusterState>) -> Self {
        Self {
            cluster,
            wait: DEFAULT_WAIT,
            liveness: DEFAULT_LIVENESS,
            keys: Mutex::default(),
            owners: Mutex::default(),
            waiting: Mutex::default(),
            offered: Mutex::default(),
            counters: Counters::default(),
        }
    }

    /// How long a scan partition waits for its preferred executor before it runs elsewhere.
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// How long an executor counts as alive after its last heartbeat or poll: an executor
    /// silent for longer stops being preferred, and its objects move to the others.
    pub fn with_liveness(mut self, liveness: Duration) -> Self {
        self.liveness = liveness;
        self
    }

    /// How tasks were placed so far.
    pub fn stats(&self) -> PlacementStats {
        let c = &self.counters;
        PlacementStats {
            preferred: c.preferred.load(Relaxed),
            waited: c.waited.load(Relaxed),
            elsewhere: c.elsewhere.load(Relaxed),
            not_scans: c.not_scans.load(Relaxed),
        }
    }

    /// The executors alive now, by name, sorted: those heard from within the liveness and
    /// not reported dead or terminating, those offering slots now, and those that offered
    /// slots within the liveness.
    fn alive(&self, budgets: &[&mut AvailableVcores]) -> Vec<String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut alive = HashSet::new();
        let mut gone = HashSet::new();
        let mut known = HashSet::new();
        for h in self.cluster.executor_heartbeats().into_values() {
            known.insert(h.executor_id.clone());
            let stopped = matches!(
                h.status.as_ref().and_then(|s| s.status.as_ref()),
                Some(executor_status::Status::Dead(_) | executor_status::Status::Terminating(_))
            );
            if stopped {
                gone.insert(h.executor_id);
            } else if now.saturating_sub(h.timestamp) <= self.liveness.as_secs() {
                alive.insert(h.executor_id);
            }
        }
        {
            let mut offered = lock(&self.offered);
            // An executor the cluster removed (no heartbeat kept) or reported stopped is gone
            // at once, whenever it last offered slots; one offering slots now is alive.
            offered.retain(|name, at| {
                at.elapsed() <= self.liveness && known.contains(name) && !gone.contains(name)
            });
            let now = Instant::now();
            for b in budgets {
                offered.insert(b.executor_id.clone(), now);
            }
            alive.extend(offered.keys().cloned());
        }
        let mut alive: Vec<String> = alive.into_iter().collect();
        alive.sort();
        alive
    }

    /// The object each partition of `stage` reads most bytes of, worked out once per stage
    /// attempt, after its file groups are formed by preferred executor among `alive`.
    fn keys_of(
        &self,
        attempt: &StageAttempt,
        stage: &mut RunningStage,
        alive: &[String],
    ) -> Arc<StageKeys> {
        let mut keys = lock(&self.keys);
        if let Some(found) = keys.get(attempt) {
            return Arc::clone(found);
        }
        let figures = figures_scan(&stage.plan, stage.partitions);
        // No task of this attempt is bound yet: its file groups can still be formed by
        // preferred executor (the stage keeps its partitions).
        if stage.task_infos.is_empty() && figures.is_none() {
            match groups::by_preferred_executor(Arc::clone(&stage.plan), alive) {
                Ok(plan) => stage.plan = plan,
                Err(e) => log::debug!("stage {} keeps its file groups: {e}", stage.stage_id),
            }
        }
        // A stage that collapses many partitions into one task is bound whole, as Ballista
        // binds it; one of a single partition (a scan of one file, or of files planned into
        // one group) is placed by its files like any other.
        let found: StageKeys = if let Some(asked) = figures {
            asked
        } else if stage.partitions > 1 && collapses(&stage.plan) {
            vec![None; stage.partitions]
        } else {
            main_objects(&stage.plan, stage.partitions)
                .into_iter()
                .map(|o| o.map(Preference::Object))
                .collect()
        };
        let found = Arc::new(found);
        keys.insert(attempt.clone(), Arc::clone(&found));
        found
    }

    /// Where the partitions of `attempt` would run among `alive`, worked out again only when
    /// the executors alive changed.
    fn owners_of(&self, attempt: &StageAttempt, keys: &StageKeys, alive: &[String]) -> Arc<Owners> {
        let mut owners = lock(&self.owners);
        if let Some(found) = owners.get(attempt).filter(|o| o.alive == alive) {
            return Arc::clone(found);
        }
        let found = Arc::new(Owners::of(keys, alive));
        owners.insert(attempt.clone(), Arc::clone(&found));
        found
    }

    /// The executors alive now, by name, sorted (see `alive`).
    pub(crate) fn executors_alive(&self) -> Vec<String> {
        self.alive(&[])
    }

    /// Forgets what it kept of jobs no longer running.
    fn forget_finished(&self, running: &HashMap<JobId, JobInfoCache>) {
        lock(&self.keys).retain(|(job, _, _), _| running.contains_key(job));
        lock(&self.owners).retain(|(job, _, _), _| running.contains_key(job));
        lock(&self.waiting).retain(|((job, _, _), _), _| running.contains_key(job));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[async_trait::async_trait]
impl DistributionPolicy for AffinityPolicy {
    async fn bind_tasks(
        &self,
        mut budgets: Vec<&mut AvailableVcores>,
        running_jobs: Arc<HashMap<JobId, JobInfoCache>>,
    ) -> Result<Vec<BoundTask>> {
        self.forget_finished(&running_jobs);
        let mut bound = Vec::new();
        if budgets.iter().all(|b| b.vcores == 0) {
            return Ok(bound);
        }
        let alive = self.alive(&budgets);
        // The budget of each executor alive, by its index in `alive` (sorted).
        let mut slots: Vec<Option<usize>> = vec![None; alive.len()];
        for (i, b) in budgets.iter().enumerate() {
            if let Ok(at) = alive.binary_search(&b.executor_id) {
                slots[at] = Some(i);
            }
        }
        for (job_id, job) in running_jobs.iter() {
            if !matches!(job.status, Some(job_status::Status::Running(_))) {
                continue;
            }
            let mut graph = job.execution_graph.write().await;
            let session_id = graph.session_id().to_string();
            let mut done_with = Vec::new();
            while let Some(stage) = graph.fetch_running_stage(&done_with) {
                done_with.push(stage.stage_id);
                let attempt = (job_id.clone(), stage.stage_id, stage.stage_attempt_num);
                let keys = self.keys_of(&attempt, stage, &alive);
                let owners = self.owners_of(&attempt, &keys, &alive);
                // The figures' own tasks count in no placement figure.
                let counted = !keys
                    .iter()
                    .any(|k| matches!(k, Some(Preference::Executor(_))));
                let pending = stage.pending.next_slice(usize::MAX);
                let mut by_executor: HashMap<usize, Vec<usize>> = HashMap::new();
                let mut elsewhere = Vec::new();
                let mut unplaced = Vec::new();
                let mut deferred = Vec::new();
                for p in pending {
                    let Some(preference) = keys.get(p).and_then(Option::as_ref) else {
                        unplaced.push(p);
                        continue;
                    };
                    let owner = owners.of.get(p).copied().flatten();
                    if owner.is_none() && matches!(preference, Preference::Executor(_)) {
                        // Gone: it runs anywhere, and answers nothing there.
                        elsewhere.push(p);
                        continue;
                    }
                    let slot = owner.and_then(|o| slots[o]);
                    let free = slot.is_some_and(|i| {
                        let taken = by_executor.get(&i).map_or(0, Vec::len);
                        budgets[i].vcores as usize > taken
                    });
                    let key = (attempt.clone(), p);
                    match (slot, free) {
                        (Some(i), true) => {
                            if lock(&self.waiting).remove(&key).is_some() {
                                self.counters.waited.fetch_add(1, Relaxed);
                            }
                            by_executor.entry(i).or_default().push(p);
                        }
                        _ if matches!(preference, Preference::Executor(_)) => deferred.push(p),
                        _ => {
                            let since = *lock(&self.waiting)
                                .entry(key.clone())
                                .or_insert_with(Instant::now);
                            if since.elapsed() >= self.wait {
                                lock(&self.waiting).remove(&key);
                                elsewhere.push(p);
                            } else {
                                deferred.push(p);
                            }
                        }
                    }
                }
                let cap = max_partitions_per_task(stage);
                for (i, partitions) in by_executor {
                    for slice in partitions.chunks(cap) {
                        let task = bind(
                            stage,
                            &session_id,
                            job_id,
                            &mut *budgets[i],
                            slice.to_vec(),
                            false,
                        );
                        if counted {
                            self.counters.preferred.fetch_add(1, Relaxed);
                        }
                        bound.push(task);
                    }
                }
                // Partitions that waited long enough, and those that read no file: the
                // executor with the most free slots, as Ballista's default binds them.
                for (partitions, scans) in [(elsewhere, true), (unplaced, false)] {
                    let mut rest = partitions;
                    let collapse = !scans && collapses(&stage.plan);
                    while !rest.is_empty() {
                        let Some(budget) = budgets
                            .iter_mut()
                            .filter(|b| b.vcores > 0)
                            .max_by_key(|b| b.vcores)
                        else {
                            break;
                        };
                        let take = if collapse {
                            rest.len()
                        } else {
                            rest.len().min(budget.vcores as usize).min(cap)
                        };
                        let slice: Vec<usize> = rest.drain(..take).collect();
                        let task = bind(stage, &session_id, job_id, budget, slice, collapse);
                        let counter = match scans {
                            true => &self.counters.elsewhere,
                            false => &self.counters.not_scans,
                        };
                        if counted {
                            counter.fetch_add(1, Relaxed);
                        }
                        bound.push(task);
                    }
                    deferred.extend(rest);
                }
                deferred.sort_unstable();
                stage.pending.reschedule(deferred);
            }
        }
        Ok(bound)
    }

    fn name(&self) -> &str {
        "lakecache-affinity"
    }
}

/// The executor each partition must run on, if the stage scans `lakecache_cluster_metrics()`
/// partition for partition.
fn figures_scan(plan: &Arc<dyn ExecutionPlan>, partitions: usize) -> Option<StageKeys> {
    let mut found = None;
    let _ = plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<ClusterMetricsExec>()
            && node.output_partitioning().partition_count() == partitions
        {
            let asked = (0..partitions)
                .map(|p| {
                    scan.executor_of(p)
                        .map(|e| Preference::Executor(e.to_string()))
                })
                .collect();
            found = Some(asked);
            return Ok(TreeNodeRecursion::Stop);
        }
        Ok(TreeNodeRecursion::Continue)
    });
    found
}

/// The most input partitions one task may bundle.
fn max_partitions_per_task(stage: &RunningStage) -> usize {
    stage
        .session_config
        .options()
        .extensions
        .get::<BallistaConfig>()
        .map(|c| c.max_partitions_per_task())
        .filter(|&n| n > 0)
        .unwrap_or(usize::MAX)
}

/// Binds `partitions` of `stage` as one task on `budget`'s executor, as Ballista's own
/// binding does: the task's id is its slot in the stage's task list, its attempt the
/// highest of its partitions', and it takes a slot per partition (one for a stage that
/// collapses its input into one).
fn bind(
    stage: &mut RunningStage,
    session_id: &str,
    job_id: &JobId,
    budget: &mut AvailableVcores,
    partitions: Vec<usize>,
    collapse: bool,
) -> BoundTask {
    let vcores = if collapse { 1 } else { partitions.len() as u32 };
    let executor_id = budget.executor_id.clone();
    let task_id = stage.task_infos.len();
    let task_attempt = partitions
        .iter()
        .map(|p| stage.task_failure_numbers[*p])
        .max()
        .unwrap_or(0);
    let mut info = create_task_info(executor_id.clone(), task_id);
    info.global_input_partition_ids = partitions.clone();
    info.vcores_consumed = vcores;
    stage.task_infos.push(info);
    budget.vcores = budget.vcores.saturating_sub(vcores);
    let task = TaskDescription {
        session_id: session_id.to_string(),
        key: TaskKey {
            job_id: job_id.clone(),
            stage_id: stage.stage_id,
            task_id,
        },
        stage_attempt_num: stage.stage_attempt_num,
        task_attempt,
        global_input_partition_ids: partitions,
        vcores_consumed: vcores,
        plan: stage.plan.clone(),
        session_config: stage.session_config.clone(),
    };
    (executor_id, task)
}

/// Whether the stage's root reads its input as one partition (a collapse): then its whole
/// queue is one task, as Ballista requires.
fn collapses(root: &Arc<dyn ExecutionPlan>) -> bool {
    fn walk(node: &Arc<dyn ExecutionPlan>) -> bool {
        if node.downcast_ref::<ShuffleReaderExec>().is_some()
            || node.downcast_ref::<RangeShuffleReaderExec>().is_some()
        {
            return false;
        }
        if node.output_partitioning().partition_count() == 1 {
            return true;
        }
        match node.children().as_slice() {
            [child] => walk(child),
            _ => false,
        }
    }
    match root.children().as_slice() {
        [child] => walk(child),
        _ => false,
    }
}

/// The name an object is placed by ([`preferred_executor`]'s `object`): its store's URL
/// and its path.
pub fn object_key(store: &ObjectStoreUrl, location: &Path) -> String {
    key_parts(store, location).concat()
}

/// The object each of the `partitions` of `plan` reads most bytes of (ties to the smallest
/// name), as a task of that partition alone reads them.
///
/// A partition's files are those Ballista's `restrict_plan_to_partitions` keeps, whose
/// rules (unions, collapses, operators that slice their input) are its own to know. That
/// restriction copies every file of the plan's scans, so applying it to the plan once per
/// partition costs partitions x files (minutes at a million files). It is applied instead to
/// a skeleton of the plan whose file groups are one marker each: partitions x groups, then
/// each partition sums the bytes of the groups it kept, files x 1.
fn main_objects(plan: &Arc<dyn ExecutionPlan>, partitions: usize) -> Vec<Option<String>> {
    // The bytes of each object in each file group of the plan, by marker.
    let mut groups: Vec<HashMap<String, u64>> = Vec::new();
    let skeleton = Arc::clone(plan).transform_up(|node| {
        let Some(config) = node
            .downcast_ref::<DataSourceExec>()
            .and_then(|scan| scan.data_source().downcast_ref::<FileScanConfig>())
        else {
            return Ok(Transformed::no(node));
        };
        let markers = config
            .file_groups
            .iter()
            .map(|group| {
                let mut bytes: HashMap<String, u64> = HashMap::new();
                for file in group.iter() {
                    let len = file
                        .range
                        .as_ref()
                        .map_or(file.object_meta.size, |r| (r.end - r.start) as u64);
                    *bytes
                        .entry(object_key(
                            &config.object_store_url,
                            &file.object_meta.location,
                        ))
                        .or_default() += len;
                }
                groups.push(bytes);
                FileGroup::new(vec![PartitionedFile::new(
                    (groups.len() - 1).to_string(),
                    0,
                )])
            })
            .collect();
        let skeleton = FileScanConfigBuilder::from(config.clone())
            .with_file_groups(markers)
            .build();
        Ok(Transformed::yes(
            DataSourceExec::from_data_source(skeleton) as Arc<dyn ExecutionPlan>
        ))
    });
    let Ok(skeleton) = skeleton.map(|t| t.data) else {
        return vec![None; partitions];
    };
    (0..partitions)
        .map(|p| {
            let restricted = restrict_plan_to_partitions(Arc::clone(&skeleton), &[p]).ok()?;
            let mut bytes: HashMap<&str, u64> = HashMap::new();
            let _ = restricted.apply(|node| {
                if let Some(config) = node
                    .downcast_ref::<DataSourceExec>()
                    .and_then(|scan| scan.data_source().downcast_ref::<FileScanConfig>())
                {
                    for marker in config.file_groups.iter().flat_map(|g| g.iter()) {
                        let group = marker
                            .object_meta
                            .location
                            .as_ref()
                            .parse::<usize>()
                            .ok()
                            .and_then(|at| groups.get(at));
                        for (object, len) in group.into_iter().flatten() {
                            *bytes.entry(object.as_str()).or_default() += len;
                        }
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            });
            bytes
                .into_iter()
                .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(a.0)))
                .map(|(object, _)| object.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::Schema;
    use datafusion::datasource::physical_plan::ArrowSource;
    use datafusion::physical_plan::joins::CrossJoinExec;
    use datafusion::physical_plan::union::UnionExec;

    /// A scan of `groups` of (name, bytes) files in `store`.
    fn scan(store: &str, groups: &[&[(&str, u64)]]) -> Arc<dyn ExecutionPlan> {
        let groups = groups
            .iter()
            .map(|g| {
                FileGroup::new(
                    g.iter()
                        .map(|(name, size)| PartitionedFile::new(*name, *size))
                        .collect(),
                )
            })
            .collect();
        let config = FileScanConfigBuilder::new(
            ObjectStoreUrl::parse(store).unwrap(),
            Arc::new(ArrowSource::new_file_source(Arc::new(Schema::empty()))),
        )
        .with_file_groups(groups)
        .build();
        DataSourceExec::from_data_source(config)
    }

    /// What `main_objects` replaced: Ballista's restriction of the whole plan, once per
    /// partition.
    fn main_object_of_the_whole_plan(plan: &Arc<dyn ExecutionPlan>, p: usize) -> Option<String> {
        let restricted = restrict_plan_to_partitions(Arc::clone(plan), &[p]).ok()?;
        let mut bytes: HashMap<String, u64> = HashMap::new();
        let _ = restricted.apply(|node| {
            if let Some(config) = node
                .downcast_ref::<DataSourceExec>()
                .and_then(|scan| scan.data_source().downcast_ref::<FileScanConfig>())
            {
                for file in config.file_groups.iter().flat_map(|g| g.iter()) {
                    *bytes
                        .entry(object_key(
                            &config.object_store_url,
                            &file.object_meta.location,
                        ))
                        .or_default() += file.object_meta.size;
                }
            }
            Ok(TreeNodeRecursion::Continue)
        });
        bytes
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
            .map(|(object, _)| object)
    }

    #[test]
    fn main_objects_are_those_of_the_plan_restricted_to_each_partition() {
        let a = scan(
            "s3://a",
            &[&[("x", 10), ("y", 30)], &[("z", 5)], &[("x", 7), ("w", 7)]],
        );
        let b = scan("s3://b", &[&[("x", 20)], &[("v", 1), ("u", 1)]]);
        let plans: Vec<Arc<dyn ExecutionPlan>> = vec![
            Arc::clone(&a),
            UnionExec::try_new(vec![Arc::clone(&a), Arc::clone(&b)]).unwrap(),
            // The left side is read whole by every partition of the right.
            Arc::new(CrossJoinExec::new(Arc::clone(&b), Arc::clone(&a))),
        ];
        for plan in plans {
            let n = plan.output_partitioning().partition_count();
            let want: Vec<_> = (0..n)
                .map(|p| main_object_of_the_whole_plan(&plan, p))
                .collect();
            assert_eq!(main_objects(&plan, n), want, "{}", plan.name());
            assert!(want.iter().all(Option::is_some), "{want:?}");
        }
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("executor-{i}")).collect()
    }

    #[test]
    fn objects_spread_over_executors_and_only_a_leavers_move() {
        let objects: Vec<String> = (0..1000)
            .map(|i| format!("s3://lake/t/f{i}.parquet"))
            .collect();
        let four = names(4);
        let owners: Vec<&String> = objects
            .iter()
            .map(|o| preferred_executor(&four, o).unwrap())
            .collect();
        for executor in &four {
            let share = owners.iter().filter(|o| **o == executor).count();
            assert!((180..=320).contains(&share), "{executor}: {share} of 1000");
        }
        // executor-3 leaves: only its objects move, spread over the others.
        let three = names(3);
        for (object, before) in objects.iter().zip(&owners) {
            let after = preferred_executor(&three, object).unwrap();
            if before.as_str() != "executor-3" {
                assert_eq!(after, *before, "{object} moved though its executor stayed");
            }
        }
        // The order executors are listed in changes nothing.
        let mut shuffled = four.clone();
        shuffled.reverse();
        for object in &objects {
            assert_eq!(
                preferred_executor(&shuffled, object),
                preferred_executor(&four, object)
            );
        }
        assert_eq!(preferred_executor(&[], "x"), None);
    }

    #[test]
    fn an_objects_hash_from_its_parts_is_that_of_its_key() {
        let store = ObjectStoreUrl::parse("s3://lake").unwrap();
        for location in ["t/part-0.parquet", "a b/%/x=1/f.parquet", ""] {
            let location = Path::from(location);
            assert_eq!(
                object_hash_of(&store, &location),
                object_hash(&object_key(&store, &location)),
                "{location}"
            );
        }
    }
}
