//! File groups formed by preferred executor, as the scheduler binds a stage's first task.
//!
//! [`AffinityPolicy`](super::AffinityPolicy) places a scan task by the object it reads most
//! bytes of. A task whose files have different preferred executors reads some of them on an
//! executor that is not theirs, and when another plan groups those files differently they
//! end up cached twice and read again warm. So before it binds any task of a stage, the
//! policy regroups each file scan of the stage's plan ([`by_preferred_executor`]) so that the
//! files of a group share a preferred executor (rendezvous hashing over the executors alive
//! then): as many groups as before (the stage's partitions do not change), shared out
//! between executors by their files' bytes and balanced by bytes within each share. It is
//! done there, not by a physical optimizer rule, because Ballista's adaptive planner plans
//! stages with optimizer rules of its own.
//!
//! A scan is left as it is when its groups already agree, when it declares an output
//! ordering or partitioning or keeps its files' order (its groups carry meaning), when files are cut into byte ranges
//! (`datafusion.optimizer.repartition_file_scans`), or when fewer than two executors are
//! alive.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileScanConfigBuilder};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::physical_plan::ExecutionPlan;

use super::affinity::{Rendezvous, object_hash_of};
use crate::table::balanced;

/// `plan` with each file scan's files regrouped by preferred executor among `executors`
/// (sorted names); see the module docs.
pub(crate) fn by_preferred_executor(
    plan: Arc<dyn ExecutionPlan>,
    executors: &[String],
) -> Result<Arc<dyn ExecutionPlan>> {
    if executors.len() < 2 {
        return Ok(plan);
    }
    plan.transform_up(|node| {
        let regrouped = node
            .downcast_ref::<DataSourceExec>()
            .and_then(|scan| scan.data_source().downcast_ref::<FileScanConfig>())
            .and_then(|config| {
                let groups = regroup(config, executors)?;
                let config = FileScanConfigBuilder::from(config.clone())
                    .with_file_groups(groups)
                    .build();
                Some(DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>)
            });
        Ok(match regrouped {
            Some(scan) => Transformed::yes(scan),
            None => Transformed::no(node),
        })
    })
    .map(|t| t.data)
}

/// `config`'s files in as many groups as it has, each group's files of one preferred
/// executor among `executors`; `None` to leave the scan as it is.
fn regroup(config: &FileScanConfig, executors: &[String]) -> Option<Vec<FileGroup>> {
    let n = config.file_groups.len();
    if n < 2
        || !config.output_ordering.is_empty()
        || config.output_partitioning.is_some()
        || config.preserve_order
    {
        return None;
    }
    if config
        .file_groups
        .iter()
        .flat_map(|g| g.iter())
        .any(|f| f.range.is_some())
    {
        return None;
    }
    // Each file's preferred executor, by its index in `executors`.
    let rendezvous = Rendezvous::new(executors);
    let owners: Vec<Vec<usize>> = config
        .file_groups
        .iter()
        .map(|g| {
            g.iter()
                .map(|file| {
                    let object =
                        object_hash_of(&config.object_store_url, &file.object_meta.location);
                    rendezvous.owner(object)
                })
                .collect::<Option<_>>()
        })
        .collect::<Option<_>>()?;
    if owners.iter().all(|g| g.windows(2).all(|w| w[0] == w[1])) {
        return None;
    }
    // By owner, in the executors' (sorted) order.
    let mut by_owner: BTreeMap<usize, Vec<PartitionedFile>> = BTreeMap::new();
    for (group, owners) in config.file_groups.iter().zip(&owners) {
        for (file, owner) in group.iter().zip(owners) {
            by_owner.entry(*owner).or_default().push(file.clone());
        }
    }
    let shares = shares(&by_owner, n)?;
    let mut groups = Vec::with_capacity(n);
    for ((_, files), k) in by_owner.into_iter().zip(shares) {
        groups.extend(balanced(files, k));
    }
    Some(groups)
}

/// How many of `n` groups each owner's files get: at least one each, about in proportion to
/// their bytes, never more than an owner has files. `None` if that cannot make `n`.
fn shares(by_owner: &BTreeMap<usize, Vec<PartitionedFile>>, n: usize) -> Option<Vec<usize>> {
    let bytes: Vec<u64> = by_owner
        .values()
        .map(|files| files.iter().map(|f| f.object_meta.size.max(1)).sum())
        .collect();
    let counts: Vec<usize> = by_owner.values().map(Vec::len).collect();
    if by_owner.len() > n || counts.iter().sum::<usize>() < n {
        return None;
    }
    let total: u64 = bytes.iter().sum();
    let mut k: Vec<usize> = bytes
        .iter()
        .zip(&counts)
        .map(|(&b, &c)| ((n as u128 * b as u128 / total as u128) as usize).clamp(1, c))
        .collect();
    // Hand out or take back one group at a time, where it changes bytes per group most.
    while k.iter().sum::<usize>() < n {
        let i = (0..k.len())
            .filter(|&i| k[i] < counts[i])
            .max_by_key(|&i| bytes[i] / k[i] as u64)?;
        k[i] += 1;
    }
    while k.iter().sum::<usize>() > n {
        let i = (0..k.len())
            .filter(|&i| k[i] > 1)
            .min_by_key(|&i| bytes[i] / k[i] as u64)?;
        k[i] -= 1;
    }
    Some(k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ballista::affinity::{object_key, preferred_executor};
    use datafusion::arrow::datatypes::Schema;
    use datafusion::datasource::physical_plan::ArrowSource;
    use datafusion::execution::object_store::ObjectStoreUrl;

    fn scan(groups: Vec<Vec<(&str, u64)>>) -> FileScanConfig {
        let groups = groups
            .into_iter()
            .map(|g| {
                FileGroup::new(
                    g.into_iter()
                        .map(|(name, size)| PartitionedFile::new(name, size))
                        .collect(),
                )
            })
            .collect();
        FileScanConfigBuilder::new(
            ObjectStoreUrl::parse("s3://bucket").unwrap(),
            Arc::new(ArrowSource::new_file_source(Arc::new(Schema::empty()))),
        )
        .with_file_groups(groups)
        .build()
    }

    fn owners(
        config: &FileScanConfig,
        groups: &[FileGroup],
        executors: &[String],
    ) -> Vec<Vec<String>> {
        groups
            .iter()
            .map(|g| {
                let mut o: Vec<String> = g
                    .iter()
                    .map(|f| {
                        preferred_executor(
                            executors,
                            &object_key(&config.object_store_url, &f.object_meta.location),
                        )
                        .unwrap()
                        .clone()
                    })
                    .collect();
                o.dedup();
                o
            })
            .collect()
    }

    #[test]
    fn each_group_holds_the_files_of_one_executor_and_their_number_is_kept() {
        let executors: Vec<String> = (0..3).map(|i| format!("executor-{i}")).collect();
        let files: Vec<(String, u64)> = (0..40)
            .map(|i| (format!("lake/part-{i}.parquet"), 1000 + 10 * i))
            .collect();
        // Four groups of ten files in listing order: every group mixes executors.
        let groups = files
            .chunks(10)
            .map(|c| c.iter().map(|(n, s)| (n.as_str(), *s)).collect())
            .collect();
        let config = scan(groups);
        let regrouped = regroup(&config, &executors).expect("the groups mixed executors");
        assert_eq!(regrouped.len(), 4);
        for o in owners(&config, &regrouped, &executors) {
            assert_eq!(o.len(), 1, "one preferred executor per group: {o:?}");
        }
        let mut names: Vec<String> = regrouped
            .iter()
            .flat_map(|g| g.iter().map(|f| f.object_meta.location.to_string()))
            .collect();
        names.sort();
        let mut want: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
        want.sort();
        assert_eq!(names, want, "every file once");
        // Grouped already: left as it is.
        let again = scan(
            regrouped
                .iter()
                .map(|g| {
                    g.iter()
                        .map(|f| (f.object_meta.location.as_ref(), f.object_meta.size))
                        .collect()
                })
                .collect(),
        );
        assert!(regroup(&again, &executors).is_none());
    }

    #[test]
    fn scans_whose_groups_carry_meaning_or_cut_files_are_left_alone() {
        let executors: Vec<String> = (0..2).map(|i| format!("executor-{i}")).collect();
        let files: Vec<String> = (0..8).map(|i| format!("lake/part-{i}.parquet")).collect();
        let groups = || {
            files
                .chunks(4)
                .map(|c| c.iter().map(|n| (n.as_str(), 100)).collect())
                .collect()
        };
        assert!(regroup(&scan(groups()), &executors).is_some());
        let mut ranged = scan(groups());
        ranged.file_groups[0] = FileGroup::new(vec![
            PartitionedFile::new("lake/part-0.parquet", 100).with_range(0, 50),
        ]);
        assert!(regroup(&ranged, &executors).is_none(), "byte ranges");
        // More executors own files than there are groups.
        let one = scan(vec![files.iter().map(|n| (n.as_str(), 100)).collect()]);
        assert!(regroup(&one, &executors).is_none(), "a single group");
    }
}
