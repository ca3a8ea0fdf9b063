//! Equality deletes of format v2 (merge-on-read upserts, as Flink writes them). A delete file
//! names rows by the values of some columns (its `equality_ids`) and deletes every row whose
//! values in them equal one of its rows, a null equal to a null, in the data files it applies
//! to. Which files those are (its partition's, or every partition's for an unpartitioned
//! delete file, with a lower data sequence number) is the iceberg crate's planning.
//!
//! Each delete file of a scan is read once, through the caches, into a set of keys: its values
//! cast to the table's types (a promoted column compares as the table reads it), in the row
//! format of arrow's `RowConverter`, where equal values, nulls too, are equal bytes. Data
//! files with the same delete files form a group. Each data file carries its group's number in
//! a hidden partition column; the Parquet scan reads the key columns beside the projected
//! ones, and [`EqualityFilter`], applied by the node above the scan, drops the rows whose key
//! is in a set of their group, then the extra columns. Pruning, the page index, filter
//! pushdown and position deletes still apply below it; a limit does not (deleted rows would
//! count).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::compute::{CastOptions, cast_with_options, filter_record_batch};
use arrow::datatypes::{DataType, Field, FieldRef, Fields, Schema, UInt32Type};
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::error::{DataFusionError, Result};
use iceberg::scan::{FileScanTask, FileScanTaskDeleteFile};
use iceberg::spec::DataContentType;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::deletes::{each_delete_file, read_delete_file};
use super::schema::position_of_id;
use super::storage::StoreStorage;
use super::wire::{Decoder, Encoder, bad};

/// The hidden partition column that holds each data file's group number (null: none applies).
pub(crate) const GROUP_COLUMN: &str = "__lakecache_iceberg_equality_group";

/// The keys one equality delete file deletes, and where their columns are.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeySet {
    /// The key columns: indices into the table's schema while planning, into the scan's
    /// output once [`EqualityDeletes::scan`] placed them.
    columns: Vec<usize>,
    /// Each deleted key in the row format of the key columns' types.
    keys: HashSet<Box<[u8]>>,
}

/// The equality deletes of a scan's files, as planned; see the module docs.
#[derive(Debug)]
pub(crate) struct EqualityDeletes {
    sets: Vec<KeySet>,
    /// Each group's key sets.
    groups: Vec<Vec<usize>>,
    /// Each task's group, in the order of the tasks.
    task_groups: Vec<Option<u32>>,
}

impl EqualityDeletes {
    /// Reads the equality delete files of `tasks` (a scan of `table`, whose columns are
    /// `schema`'s), several at once, each decoded on a blocking thread; `None` when
    /// none applies. Refuses, naming the table and the file, a delete on a column the schema
    /// has no top-level column for.
    pub(crate) async fn read(
        table: &str,
        storage: &StoreStorage,
        schema: &Schema,
        tasks: &[FileScanTask],
    ) -> Result<Option<Self>> {
        let mut index: HashMap<&str, usize> = HashMap::new();
        let mut distinct: Vec<&FileScanTaskDeleteFile> = Vec::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut group_of: HashMap<Vec<usize>, u32> = HashMap::new();
        let mut task_groups = Vec::with_capacity(tasks.len());
        for task in tasks {
            let mut sets: Vec<usize> = task
                .deletes
                .iter()
                .filter(|d| d.file_type == DataContentType::EqualityDeletes)
                .map(|d| {
                    *index.entry(d.file_path.as_str()).or_insert_with(|| {
                        distinct.push(d);
                        distinct.len() - 1
                    })
                })
                .collect();
            if sets.is_empty() {
                task_groups.push(None);
                continue;
            }
            sets.sort_unstable();
            sets.dedup();
            let next = u32::try_from(groups.len()).map_err(|_| {
                DataFusionError::Execution(format!(
                    "Iceberg table {table}: more than {} groups of equality deletes",
                    u32::MAX
                ))
            })?;
            let group = *group_of.entry(sets.clone()).or_insert_with(|| {
                groups.push(sets);
                next
            });
            task_groups.push(Some(group));
        }
        if distinct.is_empty() {
            return Ok(None);
        }
        if schema.field_with_name(GROUP_COLUMN).is_ok() {
            return Err(DataFusionError::NotImplemented(format!(
                "Iceberg table {table}: a column is named {GROUP_COLUMN}, the name the scan of \
                 equality deletes uses for its own"
            )));
        }
        let reads = distinct.iter().map(|d| key_set(table, storage, schema, d));
        let sets = each_delete_file(reads.collect()).await?;
        Ok(Some(Self {
            sets,
            groups,
            task_groups,
        }))
    }

    /// The group of the `i`th task, as the value of [`GROUP_COLUMN`] for its file.
    pub(crate) fn group_of_task(&self, i: usize) -> Option<u32> {
        self.task_groups.get(i).copied().flatten()
    }

    /// The columns a scan of `columns` table columns projected to `projection` reads, and
    /// the filter above it: the projected columns, then the key columns not among them, then
    /// [`GROUP_COLUMN`] (a partition column, after the table's); the filter keeps the
    /// projected ones.
    pub(crate) fn scan(
        self,
        projection: Option<&Vec<usize>>,
        columns: usize,
    ) -> (Vec<usize>, EqualityFilter) {
        let mut read: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..columns).collect(),
        };
        let width = read.len();
        let mut place = |column: usize| match read.iter().position(|c| *c == column) {
            Some(at) => at,
            None => {
                read.push(column);
                read.len() - 1
            }
        };
        let sets = self
            .sets
            .into_iter()
            .map(|set| KeySet {
                columns: set.columns.iter().map(|c| place(*c)).collect(),
                keys: set.keys,
            })
            .collect();
        let group_column = read.len();
        read.push(columns);
        let filter = EqualityFilter {
            sets,
            groups: self.groups,
            group_column,
            width,
        };
        (read, filter)
    }
}

/// The hidden partition column of a scan with equality deletes.
pub(crate) fn group_field() -> FieldRef {
    Arc::new(Field::new(GROUP_COLUMN, DataType::UInt32, true))
}

/// Drops the rows of a scan's batches that equality deletes delete, then the columns read for
/// them only; see the module docs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EqualityFilter {
    sets: Vec<KeySet>,
    groups: Vec<Vec<usize>>,
    group_column: usize,
    width: usize,
}

impl EqualityFilter {
    /// How many of the input's columns it keeps (the first ones).
    pub(crate) fn width(&self) -> usize {
        self.width
    }

    /// Whether it reads only columns of an input of `columns` columns, keeps fewer than its
    /// group column and knows every set its groups name: what a decoded filter must show
    /// before it is applied.
    pub(crate) fn fits(&self, columns: usize) -> bool {
        self.group_column < columns
            && self.width <= self.group_column
            && self
                .sets
                .iter()
                .flat_map(|s| &s.columns)
                .all(|c| *c < columns && *c != self.group_column)
            && self.groups.iter().flatten().all(|s| *s < self.sets.len())
    }

    /// How many equality delete files it applies.
    pub(crate) fn delete_files(&self) -> usize {
        self.sets.len()
    }

    /// The rows of `batch` no delete of their group names, in its first `width` columns.
    pub(crate) fn apply(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let kept: Vec<usize> = (0..self.width).collect();
        let Some(groups) = batch
            .columns()
            .get(self.group_column)
            .and_then(|c| c.as_primitive_opt::<UInt32Type>())
        else {
            return Err(DataFusionError::Internal(format!(
                "an Iceberg scan's batch has no {GROUP_COLUMN} column"
            )));
        };
        if groups.null_count() == groups.len() {
            return Ok(batch.project(&kept)?);
        }
        let mut converted: Vec<Option<Rows>> = vec![None; self.sets.len()];
        let mut keep = Vec::with_capacity(batch.num_rows());
        for row in 0..batch.num_rows() {
            let mut deleted = false;
            if groups.is_valid(row) {
                let group = self.groups.get(groups.value(row) as usize).ok_or_else(|| {
                    DataFusionError::Internal("an unknown group of equality deletes".into())
                })?;
                for &s in group {
                    if converted[s].is_none() {
                        converted[s] = Some(self.sets[s].rows_of(&batch)?);
                    }
                    if let Some(rows) = &converted[s]
                        && self.sets[s].keys.contains(rows.row(row).as_ref())
                    {
                        deleted = true;
                        break;
                    }
                }
            }
            keep.push(!deleted);
        }
        let filtered = filter_record_batch(&batch, &BooleanArray::from(keep))?;
        Ok(filtered.project(&kept)?)
    }

    /// This filter for the files of groups `used` only: the other groups left empty and the
    /// key sets none of `used` applies dropped, so a task that reads some files of a scan
    /// does not carry every key of every delete file across the wire.
    pub(crate) fn restricted_to(&self, used: &HashSet<u32>) -> Self {
        let mut renumbered: HashMap<usize, usize> = HashMap::new();
        let mut sets = Vec::new();
        let groups = self
            .groups
            .iter()
            .enumerate()
            .map(|(g, group)| {
                if !u32::try_from(g).is_ok_and(|g| used.contains(&g)) {
                    return Vec::new();
                }
                group
                    .iter()
                    .map(|s| {
                        *renumbered.entry(*s).or_insert_with(|| {
                            sets.push(self.sets[*s].clone());
                            sets.len() - 1
                        })
                    })
                    .collect()
            })
            .collect();
        Self {
            sets,
            groups,
            group_column: self.group_column,
            width: self.width,
        }
    }

    /// Writes this filter, for [`super::IcebergScanExec::encode`].
    pub(super) fn encode(&self, out: &mut Encoder) {
        out.usize(self.group_column);
        out.usize(self.width);
        out.usize(self.groups.len());
        for group in &self.groups {
            out.usize(group.len());
            group.iter().for_each(|s| out.usize(*s));
        }
        out.usize(self.sets.len());
        for set in &self.sets {
            out.usize(set.columns.len());
            set.columns.iter().for_each(|c| out.usize(*c));
            out.usize(set.keys.len());
            set.keys.iter().for_each(|key| out.bytes(key));
        }
    }

    /// Reads the filter [`EqualityFilter::encode`] wrote; an error when it is not one.
    pub(super) fn decode(d: &mut Decoder) -> Result<Self> {
        let group_column = d.usize()?;
        let width = d.usize()?;
        // Every item is at least 8 bytes (a number, or a length before bytes).
        let numbers = |d: &mut Decoder| -> Result<Vec<usize>> {
            (0..d.count(8)?).map(|_| d.usize()).collect()
        };
        let groups = (0..d.count(8)?)
            .map(|_| numbers(d))
            .collect::<Result<Vec<_>>>()?;
        let mut sets = Vec::new();
        for _ in 0..d.count(8)? {
            let columns = numbers(d)?;
            let keys = (0..d.count(8)?)
                .map(|_| d.bytes().map(Box::from))
                .collect::<Result<HashSet<_>>>()?;
            sets.push(KeySet { columns, keys });
        }
        let filter = Self {
            sets,
            groups,
            group_column,
            width,
        };
        if filter.fits(usize::MAX) {
            Ok(filter)
        } else {
            Err(bad())
        }
    }
}

impl KeySet {
    /// The keys of `batch`'s rows, in the row format of the key columns.
    fn rows_of(&self, batch: &RecordBatch) -> Result<Rows> {
        let columns: Vec<ArrayRef> = self
            .columns
            .iter()
            .map(|c| {
                batch.columns().get(*c).cloned().ok_or_else(|| {
                    DataFusionError::Internal(format!("key column {c} not in the batch"))
                })
            })
            .collect::<Result<_>>()?;
        let types: Vec<DataType> = columns.iter().map(|c| c.data_type().clone()).collect();
        Ok(converter(&types)?.convert_columns(&columns)?)
    }
}

fn converter(types: &[DataType]) -> Result<RowConverter> {
    Ok(RowConverter::new(
        types.iter().cloned().map(SortField::new).collect(),
    )?)
}

/// The keys the equality delete file `delete` deletes, its columns placed in `schema`.
async fn key_set(
    table: &str,
    storage: &StoreStorage,
    schema: &Schema,
    delete: &FileScanTaskDeleteFile,
) -> Result<KeySet> {
    let ids = delete.equality_ids.clone().unwrap_or_default();
    let mut columns = Vec::with_capacity(ids.len());
    let mut types = Vec::with_capacity(ids.len());
    for id in &ids {
        let Some(i) = position_of_id(schema.fields(), *id) else {
            return Err(DataFusionError::NotImplemented(format!(
                "Iceberg table {table}: the equality deletes {} compare field {id}, which is \
                 not a top-level column of the table's schema (if the column was added since \
                 the table was registered, register it again)",
                delete.file_path
            )));
        };
        columns.push(i);
        types.push(schema.field(i).data_type().clone());
    }
    if ids.is_empty() {
        return Err(DataFusionError::Execution(format!(
            "Iceberg table {table}: the equality deletes {} name no column",
            delete.file_path
        )));
    }
    let keys_of = move |bytes| decode(bytes, &ids, &types);
    let keys = read_delete_file(table, storage, delete, "equality", keys_of).await?;
    Ok(KeySet { columns, keys })
}

/// The rows of the columns of field ids `ids` of an equality delete file, cast to `types`,
/// as keys.
fn decode(
    bytes: bytes::Bytes,
    ids: &[i32],
    types: &[DataType],
) -> std::result::Result<HashSet<Box<[u8]>>, String> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| e.to_string())?;
    let column = |fields: &Fields, id: &i32| {
        position_of_id(fields, *id).ok_or_else(|| format!("no column of field id {id}"))
    };
    let roots = ids
        .iter()
        .map(|id| column(builder.schema().fields(), id))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let batches = builder
        .with_projection(mask)
        .build()
        .map_err(|e| e.to_string())?;
    let converter = converter(types).map_err(|e| e.to_string())?;
    let mut keys = HashSet::new();
    for batch in batches {
        let batch = batch.map_err(|e| e.to_string())?;
        // The projected columns come in the file's order; take them in the ids' order.
        let columns = ids
            .iter()
            .zip(types)
            .map(|(id, ty)| {
                let i = column(batch.schema().fields(), id)?;
                // A value that does not fit the table's type is an error, not a null key
                // (which would delete every row with no value).
                let options = CastOptions {
                    safe: false,
                    ..CastOptions::default()
                };
                cast_with_options(batch.column(i), ty, &options).map_err(|e| e.to_string())
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let rows = converter
            .convert_columns(&columns)
            .map_err(|e| e.to_string())?;
        keys.extend(rows.iter().map(|r| Box::from(r.as_ref())));
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray, UInt32Array};

    fn keys(columns: &[ArrayRef]) -> HashSet<Box<[u8]>> {
        let types: Vec<DataType> = columns.iter().map(|c| c.data_type().clone()).collect();
        let rows = converter(&types).unwrap().convert_columns(columns).unwrap();
        rows.iter().map(|r| Box::from(r.as_ref())).collect()
    }

    /// Ids deleted in group 0 (by id) and in group 1 (by id, and by city with a null).
    fn filter() -> EqualityFilter {
        let by_id = KeySet {
            columns: vec![0],
            keys: keys(&[Arc::new(Int64Array::from(vec![2, 4]))]),
        };
        let by_city = KeySet {
            columns: vec![1],
            keys: keys(&[Arc::new(StringArray::from(vec![None, Some("Oslo")]))]),
        };
        EqualityFilter {
            sets: vec![by_id, by_city],
            groups: vec![vec![0], vec![0, 1]],
            group_column: 2,
            width: 1,
        }
    }

    fn batch(groups: Vec<Option<u32>>) -> RecordBatch {
        let n = groups.len() as i64;
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("city", DataType::Utf8, true),
            Field::new(GROUP_COLUMN, DataType::UInt32, true),
        ]);
        let cities = ["Oslo", "Lima"];
        let city: Vec<Option<&str>> = (0..n)
            .map(|i| (i % 3 != 0).then(|| cities[i as usize % 2]))
            .collect();
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from((0..n).collect::<Vec<_>>())),
                Arc::new(StringArray::from(city)),
                Arc::new(UInt32Array::from(groups)),
            ],
        )
        .unwrap()
    }

    fn ids(batch: &RecordBatch) -> Vec<i64> {
        batch
            .column(0)
            .as_primitive::<arrow::datatypes::Int64Type>()
            .values()
            .to_vec()
    }

    #[test]
    fn a_row_is_dropped_when_a_set_of_its_group_holds_its_key_nulls_equal() {
        let f = filter();
        // Cities of ids 0..6: null, Lima, Oslo, null, Oslo, Lima.
        let out = f.apply(batch(vec![Some(0); 6])).unwrap();
        assert_eq!(ids(&out), vec![0, 1, 3, 5]);
        assert_eq!(out.num_columns(), 1);
        let out = f.apply(batch(vec![Some(1); 6])).unwrap();
        assert_eq!(ids(&out), vec![1, 5]);
        let out = f.apply(batch(vec![None; 6])).unwrap();
        assert_eq!(ids(&out), vec![0, 1, 2, 3, 4, 5]);
        let mixed = vec![None, Some(1), Some(1), Some(0), Some(0), None];
        assert_eq!(ids(&f.apply(batch(mixed)).unwrap()), vec![0, 1, 3, 5]);
        assert!(f.apply(batch(vec![Some(7); 6])).is_err());
    }

    /// A Parquet file of one `long` column of field id 1.
    fn delete_file(values: Vec<Option<i64>>) -> bytes::Bytes {
        let field = Field::new("id", DataType::Int64, true).with_metadata(
            [(
                parquet::arrow::PARQUET_FIELD_ID_META_KEY.to_string(),
                "1".to_string(),
            )]
            .into(),
        );
        let schema = Arc::new(Schema::new(vec![field]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int64Array::from(values))],
        )
        .unwrap();
        let mut out = Vec::new();
        let mut writer = parquet::arrow::ArrowWriter::try_new(&mut out, schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        out.into()
    }

    #[test]
    fn a_delete_value_the_tables_type_cannot_hold_is_an_error_not_a_null_key() {
        let keys = decode(delete_file(vec![Some(7), None]), &[1], &[DataType::Int32]).unwrap();
        let want = super::tests::keys(&[Arc::new(arrow::array::Int32Array::from(vec![
            Some(7),
            None,
        ]))]);
        assert_eq!(keys, want);
        let err = decode(delete_file(vec![Some(1 << 40)]), &[1], &[DataType::Int32]).unwrap_err();
        assert!(err.contains("1099511627776"), "{err}");
        let err = decode(delete_file(vec![Some(1)]), &[2], &[DataType::Int64]).unwrap_err();
        assert!(err.contains("field id 2"), "{err}");
    }

    #[test]
    fn a_filter_restricted_to_some_groups_keeps_their_sets_only() {
        let f = filter();
        let only_first = f.restricted_to(&HashSet::from([0]));
        assert_eq!(only_first.sets, vec![f.sets[0].clone()]);
        assert_eq!(only_first.groups, vec![vec![0], vec![]]);
        let only_second = f.restricted_to(&HashSet::from([1]));
        assert_eq!(only_second.sets, f.sets);
        assert_eq!(only_second.groups, vec![vec![], vec![0, 1]]);
        // The rows of the group kept are filtered as before.
        let rows = only_second.apply(batch(vec![Some(1); 6])).unwrap();
        assert_eq!(ids(&rows), vec![1, 5]);
        assert!(f.restricted_to(&HashSet::new()).sets.is_empty());
    }

    #[test]
    fn a_filter_crosses_the_wire_whole_and_a_cut_one_is_refused() {
        let f = filter();
        let mut out = Encoder::default();
        f.encode(&mut out);
        out.0.extend_from_slice(b"rest");
        let bytes = out.0;
        let mut d = Decoder(&bytes);
        assert_eq!(EqualityFilter::decode(&mut d).unwrap(), f);
        assert_eq!(d.0, b"rest");
        for cut in [0, 8, 30, bytes.len() - 5] {
            let decoded = EqualityFilter::decode(&mut Decoder(&bytes[..cut]));
            assert!(decoded.is_err(), "cut at {cut}");
        }
        let mut huge = bytes.clone();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(EqualityFilter::decode(&mut Decoder(&huge)).is_err());
        // Its group column is the third: an input of two columns cannot be filtered by it.
        assert!(f.fits(3) && !f.fits(2));
        let mut wide = bytes.clone();
        wide[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let decoded = EqualityFilter::decode(&mut Decoder(&wide));
        assert!(decoded.is_err(), "wider than its group column");
    }
}
