//! Position deletes of format v2 (merge-on-read), applied by DataFusion's own Parquet scan:
//! the positions a data file's delete files name become a row selection of that file
//! (`ParquetRowSelection`), which the scan splits by row group when it opens the file, so
//! deleted rows are never decoded and pruning, the page index and filter pushdown still
//! apply. Which delete files apply to which data file (the sequence-number rules of the
//! spec: a position delete applies to data files of its partition with a sequence number
//! at most its own) is the iceberg crate's planning; here each delete file's rows for the
//! data file (its `file_path` column) are read through the caches.
//!
//! Equality deletes need a join of their own and are refused with an error naming the table
//! and the file; so are v3 deletion vectors (Puffin files), which the crate's planning does
//! not hand to a reader as position deletes.

use std::collections::BTreeSet;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Int64Type};
use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::error::{DataFusionError, Result};
use iceberg::scan::{FileScanTask, FileScanTaskDeleteFile};
use iceberg::spec::DataContentType;
use object_store::ObjectStoreExt;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReaderBuilder, RowSelection, RowSelector};

use super::storage::StoreStorage;

/// The rows of `task`'s data file its delete files leave, as a selection over the whole
/// file; `None` when it has no deletes (or they name none of its rows).
pub(crate) async fn surviving_rows(
    table: &str,
    storage: &StoreStorage,
    task: &FileScanTask,
) -> Result<Option<ParquetRowSelection>> {
    if task.deletes.is_empty() {
        return Ok(None);
    }
    let refused = |delete: &FileScanTaskDeleteFile, what: &str| {
        DataFusionError::NotImplemented(format!(
            "Iceberg table {table}: {} has {what} ({}); the iceberg feature applies position \
             deletes only",
            task.data_file_path, delete.file_path
        ))
    };
    let Some(rows) = task.record_count else {
        let first = &task.deletes[0];
        return Err(refused(first, "deletes and a split without a row count"));
    };
    let mut deleted = BTreeSet::new();
    for delete in &task.deletes {
        match delete.file_type {
            // A v3 deletion vector is a blob of a Puffin file, not a Parquet file of rows.
            DataContentType::PositionDeletes if delete.file_path.ends_with(".puffin") => {
                return Err(refused(delete, "a deletion vector (format v3)"));
            }
            DataContentType::PositionDeletes => {
                positions(
                    table,
                    storage,
                    delete,
                    &task.data_file_path,
                    rows,
                    &mut deleted,
                )
                .await?;
            }
            DataContentType::EqualityDeletes => return Err(refused(delete, "equality deletes")),
            DataContentType::Data => return Err(refused(delete, "a data file as a delete")),
        }
    }
    if deleted.is_empty() {
        return Ok(None);
    }
    Ok(Some(ParquetRowSelection::new(selection(&deleted, rows))))
}

/// Adds to `deleted` the positions below `rows` that the position delete file `delete`
/// names for the data file `data_file`.
async fn positions(
    table: &str,
    storage: &StoreStorage,
    delete: &FileScanTaskDeleteFile,
    data_file: &str,
    rows: u64,
    deleted: &mut BTreeSet<u64>,
) -> Result<()> {
    let error = |e: &dyn std::fmt::Display| {
        DataFusionError::Execution(format!(
            "Iceberg table {table}: reading the position deletes {}: {e}",
            delete.file_path
        ))
    };
    // A delete file is small and read whole: one ranged read, kept by the range cache (it
    // is written once, under a name of its own).
    let path = storage.path_of(&delete.file_path).map_err(|e| error(&e))?;
    let bytes = storage
        .store()
        .get_range(&path, 0..delete.file_size_in_bytes)
        .await
        .map_err(|e| error(&e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| error(&e))?;
    // The spec's field ids: file_path 2147483546, pos 2147483545; their names are fixed too.
    let columns = ["file_path", "pos"].map(|name| builder.schema().index_of(name));
    let [Ok(file_path), Ok(pos)] = columns else {
        return Err(error(&"no file_path and pos columns"));
    };
    let mask = ProjectionMask::roots(builder.parquet_schema(), [file_path, pos]);
    let batches = builder
        .with_projection(mask)
        .build()
        .map_err(|e| error(&e))?;
    for batch in batches {
        let batch = batch.map_err(|e| error(&e))?;
        let paths = batch.column(0);
        let positions = batch.column(1);
        if positions.data_type() != &DataType::Int64 {
            return Err(error(&format!(
                "pos is {}, not long",
                positions.data_type()
            )));
        }
        let positions = positions.as_primitive::<Int64Type>();
        let matches = |i: usize| -> bool {
            match paths.data_type() {
                DataType::Utf8 => paths.as_string::<i32>().value(i) == data_file,
                DataType::LargeUtf8 => paths.as_string::<i64>().value(i) == data_file,
                DataType::Utf8View => paths.as_string_view().value(i) == data_file,
                _ => false,
            }
        };
        for i in 0..batch.num_rows() {
            if paths.is_valid(i) && positions.is_valid(i) && matches(i) {
                let position = positions.value(i);
                if let Ok(position) = u64::try_from(position)
                    && position < rows
                {
                    deleted.insert(position);
                }
            }
        }
    }
    Ok(())
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
