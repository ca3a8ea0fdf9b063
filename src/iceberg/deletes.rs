//! Position deletes of format v2 (merge-on-read), applied by DataFusion's own Parquet scan:
//! the positions a data file's delete files name become a row selection of that file
//! (`ParquetRowSelection`), which the scan splits by row group when it opens the file, so
//! deleted rows are never decoded and pruning, the page index and filter pushdown still
//! apply. Which delete files apply to which data file (the sequence-number rules of the
//! spec: a position delete applies to data files of its partition with a sequence number
//! at most its own) is the iceberg crate's planning; here each delete file's rows for the
//! data file (its `file_path` column) are read through the caches.
//!
//! Equality deletes are applied above the scan (`super::equality`); v3 deletion vectors
//! (Puffin files), which the crate's planning does not hand to a reader as position deletes,
//! are refused with an error naming the table and the file.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;

use arrow::array::{Array, AsArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type};
use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::error::{DataFusionError, Result};
use futures::{StreamExt, TryStreamExt};
use iceberg::scan::{FileScanTask, FileScanTaskDeleteFile};
use iceberg::spec::DataContentType;
use object_store::ObjectStoreExt;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReaderBuilder, RowSelection, RowSelector};

use super::storage::StoreStorage;

/// The positions each position delete file of a scan names, by the data file they name:
/// each delete file read and decoded once per scan, however many data files it applies to
/// (the iceberg crate attaches every delete file of a partition to each of its data files).
#[derive(Debug, Default)]
pub(crate) struct ScanDeletes {
    by_delete_file: HashMap<String, HashMap<String, Vec<u64>>>,
}

impl ScanDeletes {
    /// Reads the position delete files of `tasks`, [`DELETE_READS`] at once, each decoded on
    /// a blocking thread. Refuses, naming the table and the file, the deletes it cannot
    /// apply.
    pub(crate) async fn read(
        table: &str,
        storage: &StoreStorage,
        tasks: &[FileScanTask],
    ) -> Result<Self> {
        let mut distinct: Vec<&FileScanTaskDeleteFile> = Vec::new();
        let mut seen = HashSet::new();
        for task in tasks {
            let positional = task
                .deletes
                .iter()
                .find(|d| d.file_type == DataContentType::PositionDeletes);
            if let (Some(delete), None) = (positional, task.record_count) {
                return Err(refused(
                    table,
                    task,
                    delete,
                    "position deletes and no row count",
                ));
            }
            for delete in &task.deletes {
                match delete.file_type {
                    // A v3 deletion vector is a blob of a Puffin file, not a Parquet file.
                    DataContentType::PositionDeletes if delete.file_path.ends_with(".puffin") => {
                        return Err(refused(
                            table,
                            task,
                            delete,
                            "a deletion vector (format v3)",
                        ));
                    }
                    DataContentType::PositionDeletes => {
                        if seen.insert(delete.file_path.as_str()) {
                            distinct.push(delete);
                        }
                    }
                    DataContentType::EqualityDeletes => {}
                    DataContentType::Data => {
                        return Err(refused(table, task, delete, "a data file as a delete"));
                    }
                }
            }
        }
        // Collected first: a stream over the closure would not be `Send` for every lifetime.
        let reads = distinct.iter().map(|d| positions(table, storage, d));
        let found = each_delete_file(reads.collect()).await?;
        let by_delete_file = distinct
            .iter()
            .map(|d| d.file_path.clone())
            .zip(found)
            .collect();
        Ok(Self { by_delete_file })
    }

    /// The rows of `task`'s data file its delete files leave, as a selection over the
    /// whole file; `None` when it has no deletes, or they name none of its rows.
    pub(crate) fn surviving_rows(&self, task: &FileScanTask) -> Option<ParquetRowSelection> {
        let rows = task.record_count?;
        let mut deleted = BTreeSet::new();
        for delete in &task.deletes {
            if delete.file_type != DataContentType::PositionDeletes {
                continue;
            }
            let named = self
                .by_delete_file
                .get(&delete.file_path)
                .and_then(|by_data_file| by_data_file.get(&task.data_file_path));
            deleted.extend(named.into_iter().flatten().filter(|p| **p < rows));
        }
        (!deleted.is_empty()).then(|| ParquetRowSelection::new(selection(&deleted, rows)))
    }
}

/// How many delete files a scan reads at once.
const DELETE_READS: usize = 32;

/// The reads of delete files `reads`, [`DELETE_READS`] at once, their results in order.
pub(super) async fn each_delete_file<T>(
    reads: Vec<impl Future<Output = Result<T>>>,
) -> Result<Vec<T>> {
    futures::stream::iter(reads)
        .buffered(DELETE_READS)
        .try_collect()
        .await
}

fn refused(
    table: &str,
    task: &FileScanTask,
    delete: &FileScanTaskDeleteFile,
    what: &str,
) -> DataFusionError {
    DataFusionError::NotImplemented(format!(
        "Iceberg table {table}: {} has {what} ({}); the iceberg feature applies position \
         and equality deletes of format v2",
        task.data_file_path, delete.file_path
    ))
}

/// The positions the position delete file `delete` names, by the data file they name.
async fn positions(
    table: &str,
    storage: &StoreStorage,
    delete: &FileScanTaskDeleteFile,
) -> Result<HashMap<String, Vec<u64>>> {
    read_delete_file(table, storage, delete, "position", decode).await
}

/// The delete file `delete` of `table` read whole and decoded by `decode` on a blocking
/// thread; an error names the table, the `kind` of deletes and the file. A delete file is
/// small and read in one ranged read, kept by the range cache (it is written once, under a
/// name of its own).
pub(super) async fn read_delete_file<T: Send + 'static>(
    table: &str,
    storage: &StoreStorage,
    delete: &FileScanTaskDeleteFile,
    kind: &str,
    decode: impl FnOnce(bytes::Bytes) -> std::result::Result<T, String> + Send + 'static,
) -> Result<T> {
    let error = |e: &dyn std::fmt::Display| {
        DataFusionError::Execution(format!(
            "Iceberg table {table}: reading the {kind} deletes {}: {e}",
            delete.file_path
        ))
    };
    let path = storage.path_of(&delete.file_path).map_err(|e| error(&e))?;
    let bytes = storage
        .store()
        .get_range(&path, 0..delete.file_size_in_bytes)
        .await
        .map_err(|e| error(&e))?;
    let decoded = tokio::task::spawn_blocking(move || decode(bytes))
        .await
        .map_err(|e| error(&e))?;
    decoded.map_err(|e| error(&e))
}

/// The `file_path` and `pos` columns of a position delete file, grouped by `file_path`.
fn decode(bytes: bytes::Bytes) -> std::result::Result<HashMap<String, Vec<u64>>, String> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| e.to_string())?;
    // The spec's names for fields 2147483546 and 2147483545.
    let columns = ["file_path", "pos"].map(|name| builder.schema().index_of(name));
    let [Ok(file_path), Ok(pos)] = columns else {
        return Err("no file_path and pos columns".to_string());
    };
    let mask = ProjectionMask::roots(builder.parquet_schema(), [file_path, pos]);
    let batches = builder
        .with_projection(mask)
        .build()
        .map_err(|e| e.to_string())?;
    let mut found: HashMap<String, Vec<u64>> = HashMap::new();
    for batch in batches {
        let batch = batch.map_err(|e| e.to_string())?;
        let paths = cast(batch.column(0), &DataType::Utf8).map_err(|e| e.to_string())?;
        let paths = paths.as_string::<i32>();
        let positions = batch.column(1);
        if positions.data_type() != &DataType::Int64 {
            return Err(format!("pos is {}, not long", positions.data_type()));
        }
        let positions = positions.as_primitive::<Int64Type>();
        for i in 0..batch.num_rows() {
            if paths.is_valid(i)
                && positions.is_valid(i)
                && let Ok(position) = u64::try_from(positions.value(i))
            {
                let path = paths.value(i);
                match found.get_mut(path) {
                    Some(list) => list.push(position),
                    None => {
                        found.insert(path.to_string(), vec![position]);
                    }
                }
            }
        }
    }
    Ok(found)
}

/// The selection of `rows` rows that skips `deleted`.
fn selection(deleted: &BTreeSet<u64>, rows: u64) -> RowSelection {
    let mut selectors = Vec::new();
    let mut next = 0u64;
    for &position in deleted {
        if position > next {
            selectors.push(RowSelector::select((position - next) as usize));
        }
        selectors.push(RowSelector::skip(1));
        next = position + 1;
    }
    if rows > next {
        selectors.push(RowSelector::select((rows - next) as usize));
    }
    RowSelection::from(selectors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_skips_exactly_the_deleted_rows() {
        let deleted = BTreeSet::from([0, 3, 4, 9]);
        let s = selection(&deleted, 10);
        let kept: Vec<usize> = (0..10)
            .filter(|i| {
                let mut at = 0;
                for sel in s.iter() {
                    if *i < at + sel.row_count {
                        return !sel.skip;
                    }
                    at += sel.row_count;
                }
                false
            })
            .collect();
        assert_eq!(kept, [1, 2, 5, 6, 7, 8]);
        assert_eq!(s.iter().map(|s| s.row_count).sum::<usize>(), 10);
    }
}
