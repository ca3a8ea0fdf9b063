//! Files of a scan dealt into partitions by their bytes: what a table that plans its own
//! files (an Iceberg table, a Delta table's task on Ballista) and a scheduler that regroups a
//! scan's files (Ballista's affinity placement) all need.

use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::FileGroup;

/// `files` in `k` groups of about equal bytes (largest first, each to the lightest group);
/// fewer when there are fewer files, none for none.
pub(crate) fn balanced(mut files: Vec<PartitionedFile>, k: usize) -> Vec<FileGroup> {
    let k = k.clamp(1, files.len().max(1));
    files.sort_by_key(|f| std::cmp::Reverse(f.object_meta.size));
    let mut groups: Vec<(u64, Vec<PartitionedFile>)> = vec![(0, Vec::new()); k];
    for file in files {
        if let Some(lightest) = groups.iter_mut().min_by_key(|(bytes, _)| *bytes) {
            lightest.0 += file.object_meta.size;
            lightest.1.push(file);
        }
    }
    groups
        .into_iter()
        .filter(|(_, files)| !files.is_empty())
        .map(|(_, files)| FileGroup::new(files))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_hold_about_equal_bytes_and_none_is_empty() {
        let files = [50, 40, 30, 20, 10, 10]
            .iter()
            .enumerate()
            .map(|(i, size)| PartitionedFile::new(format!("f{i}"), *size))
            .collect::<Vec<_>>();
        let bytes = |groups: &[FileGroup]| -> Vec<u64> {
            groups
                .iter()
                .map(|g| g.iter().map(|f| f.object_meta.size).sum())
                .collect()
        };
        assert_eq!(bytes(&balanced(files.clone(), 2)), [80, 80]);
        assert_eq!(balanced(files.clone(), 10).len(), 6);
        assert!(balanced(Vec::new(), 4).is_empty());
    }
}
