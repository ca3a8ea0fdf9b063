//! A seeded generator of Parquet lakes: the same spec always gives the same bytes.
//!
//! Each file has several row groups, a page index, and bloom filters on `id` and `name`, so
//! every kind of pruning DataFusion does has something to work on. Columns:
//! `id` (Int64, unique across the lake), `name` (Utf8), `category` (Utf8, 8 values),
//! `value` (Float64), `ts` (Timestamp µs) and `note` (Utf8, one row in 7 null).

use std::ops::Range;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use bytes::Bytes;
use datafusion::error::Result;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// The queries of the handle-cache workload (the Gluten file-handle benchmark's shapes), by
/// name: a full scan, a filtered scan and a scan of two of the six columns.
pub const SCANS: [(&str, &str); 3] = [
    ("full scan", "SELECT * FROM t"),
    (
        "filtered",
        "SELECT id, name, value FROM t WHERE id % 997 = 3 AND category IN ('beta', 'eta')",
    ),
    ("column pruning", "SELECT category, value FROM t"),
];

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LakeSpec {
    /// Number of files.
    pub files: usize,
    /// Rows in each file.
    pub rows_per_file: usize,
    /// Rows per row group.
    pub row_group_rows: usize,
    /// Seed of the values; another seed gives other rows with the same shape.
    pub seed: u64,
}

impl LakeSpec {
    /// The small-files workload: `files` files of 5,000 rows, one row group each (pages of
    /// 1,250 rows), as small files written by streaming jobs are.
    pub fn small_files(files: usize) -> Self {
        Self {
            files,
            rows_per_file: 5_000,
            row_group_rows: 5_000,
            seed: 42,
        }
    }

    /// The large-files workload: 4 files of 2M rows in row groups of 250k, as compacted
    /// tables are.
    pub fn large_files() -> Self {
        Self {
            files: 4,
            rows_per_file: 2_000_000,
            row_group_rows: 250_000,
            seed: 42,
        }
    }

    /// The same lake split into row groups of `rows` rows.
    pub fn with_row_groups_of(self, rows: usize) -> Self {
        Self {
            row_group_rows: rows,
            ..self
        }
    }

    /// The same lake with other values.
    pub fn with_seed(self, seed: u64) -> Self {
        Self { seed, ..self }
    }

    /// The name of file `index`, relative to the lake's prefix.
    pub fn file_name(index: usize) -> String {
        format!("part-{index:05}.parquet")
    }
}

/// The schema every generated file has.
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
        Field::new("category", DataType::Utf8, false),
        Field::new("value", DataType::Float64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, None),
            false,
        ),
        Field::new("note", DataType::Utf8, true),
    ]))
}

/// The rows of file `index`.
pub fn file_batch(spec: &LakeSpec, index: usize) -> RecordBatch {
    let mut rng =
        SmallRng::seed_from_u64(spec.seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let n = spec.rows_per_file;
    let first = (index * n) as i64;
    let ids: Vec<i64> = (0..n as i64).map(|i| first + i).collect();
    let names: Vec<String> = ids
        .iter()
        .map(|id| format!("name-{:06}", (id * 7919 + spec.seed as i64) % 100_000))
        .collect();
    let categories: Vec<&str> = (0..n)
        .map(|_| {
            [
                "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta",
            ][rng.random_range(0..8)]
        })
        .collect();
    let values: Vec<f64> = (0..n).map(|_| rng.random_range(0.0..1000.0)).collect();
    let base = 1_700_000_000_000_000i64 + first * 1_000_000;
    let ts: Vec<i64> = (0..n as i64).map(|i| base + i * 1_000_000).collect();
    let notes: Vec<Option<String>> = ids
        .iter()
        .map(|id| (id % 7 != 0).then(|| format!("note {}", rng.random_range(0..50))))
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        Arc::new(StringArray::from(names)),
        Arc::new(StringArray::from(categories)),
        Arc::new(Float64Array::from(values)),
        Arc::new(TimestampMicrosecondArray::from(ts)),
        Arc::new(StringArray::from(notes)),
    ];
    RecordBatch::try_new(schema(), columns).expect("columns match the schema")
}

/// File `index` encoded as Parquet.
pub fn file_bytes(spec: &LakeSpec, index: usize) -> Result<Bytes> {
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(spec.row_group_rows.max(1)))
        .set_data_page_row_count_limit(
            spec.row_group_rows
                .min(spec.rows_per_file)
                .div_ceil(4)
                .max(1),
        )
        .set_write_batch_size(256)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_column_bloom_filter_enabled("id".into(), true)
        .set_column_bloom_filter_enabled("name".into(), true)
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema(), Some(props))?;
    writer.write(&file_batch(spec, index))?;
    writer.close()?;
    Ok(out.into())
}

/// Writes the lake under `prefix` in `store` and returns the paths of its files.
pub async fn write_lake(
    store: &dyn ObjectStore,
    prefix: &Path,
    spec: &LakeSpec,
) -> Result<Vec<Path>> {
    let mut paths = Vec::with_capacity(spec.files);
    for index in 0..spec.files {
        let path = prefix.clone().join(LakeSpec::file_name(index));
        store
            .put(&path, PutPayload::from(file_bytes(spec, index)?))
            .await?;
        paths.push(path);
    }
    Ok(paths)
}

/// The schema of [`same_layout_file`]: `id` and `value`, both Int64.
pub fn same_layout_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("value", DataType::Int64, false),
    ]))
}

/// A Parquet file of `rows` rows whose size and layout do not depend on `seed`: every page,
/// row group and footer field has the same length whatever the values, so two seeds give two
/// versions of one object that only a version check tells apart. Pages of 500 rows with a
/// page index, so a reader that took one version's footer and another's bytes would prune
/// pages by the wrong statistics. `value` lies in `[2^24, 2^25)`, where every statistic
/// encodes to the same length.
pub fn same_layout_file(rows: usize, seed: u64) -> Result<Bytes> {
    same_layout_file_in(rows, seed, 0..1 << 24)
}

/// [`same_layout_file`] with every `value` in `2^24 + band` (`band` within `0..2^24`): two
/// versions whose bands do not meet have the same size and layout, and statistics that rule
/// out each other's rows, so a reader that pruned one version's bytes by the other's
/// statistics returns rows of neither.
pub fn same_layout_file_in(rows: usize, seed: u64, band: Range<i64>) -> Result<Bytes> {
    let band = band.start.clamp(0, 1 << 24)..band.end.clamp(0, 1 << 24);
    let mut rng = SmallRng::seed_from_u64(seed);
    let ids: Vec<i64> = (0..rows as i64).collect();
    let values: Vec<i64> = (0..rows)
        .map(|_| (1 << 24) + rng.random_range(band.clone()))
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        Arc::new(Int64Array::from(values)),
    ];
    let batch = RecordBatch::try_new(same_layout_schema(), columns)?;
    let props = WriterProperties::builder()
        .set_compression(parquet::basic::Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_max_row_group_row_count(Some(rows.div_ceil(2).max(1)))
        .set_data_page_row_count_limit(500)
        .set_write_batch_size(100)
        .set_statistics_enabled(EnabledStatistics::Page)
        // A writer version string of fixed length: the footer records it.
        .set_created_by("lakecache same-layout".into())
        .build();
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, same_layout_schema(), Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    Ok(out.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    #[test]
    fn same_layout_files_differ_in_values_only() {
        let a = same_layout_file(2_000, 1).unwrap();
        let b = same_layout_file(2_000, 2).unwrap();
        assert_eq!(a.len(), b.len());
        assert_ne!(a, b);
        let reader = SerializedFileReader::new(a).unwrap();
        let meta = reader.metadata();
        assert_eq!(meta.num_row_groups(), 2);
        assert!(meta.row_group(0).column(1).column_index_offset().is_some());
    }

    #[test]
    fn files_are_deterministic_and_have_row_groups_and_indexes() {
        let spec = LakeSpec::small_files(2).with_row_groups_of(1_000);
        let a = file_bytes(&spec, 1).unwrap();
        assert_eq!(a, file_bytes(&spec, 1).unwrap());
        assert_ne!(a, file_bytes(&spec.with_seed(7), 1).unwrap());
        let reader = SerializedFileReader::new(a).unwrap();
        let meta = reader.metadata();
        assert_eq!(meta.num_row_groups(), 5);
        assert_eq!(meta.file_metadata().num_rows(), 5_000);
        let rg = meta.row_group(0);
        assert!(
            rg.column(0).bloom_filter_offset().is_some(),
            "bloom filter on id"
        );
        assert!(
            rg.column(0).column_index_offset().is_some(),
            "page index on id"
        );
    }
}
