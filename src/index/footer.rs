//! Fetching and checking a Parquet footer with its page index: what a footer load runs.
//!
//! Written here rather than calling DataFusion's `DFParquetMetadata`, which panics (subtract
//! with overflow) on a footer length larger than the file. Every length read from the file is
//! checked against the file's size before anything is fetched or allocated, and every offset a
//! footer gives is checked before anything downstream uses it.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::error::DataFusionError;
use parquet::errors::ParquetError;
use parquet::file::metadata::{
    FooterTail, PageIndexPolicy, ParquetMetaData, ParquetMetaDataOptions, ParquetMetaDataReader,
};
use parquet::schema::types::SchemaDescriptor;

use super::schemas;

use crate::object::ObjectVersion;

/// Fetches and decodes the footer of `version` with its page index, reading through `read`;
/// errors name the file.
///
/// Reads the last `metadata_size_hint` bytes (the whole file if smaller) in one read, then only
/// the missing bytes before them if the footer or page index reaches further back. A page
/// index that cannot be read (its offsets point into the footer, past the file, or its bytes
/// do not decode) is left out, as DataFusion's reader leaves it: the footer alone is returned,
/// and queries answer without page pruning.
pub async fn load_footer<F, Fut>(
    version: &ObjectVersion,
    metadata_size_hint: Option<usize>,
    read: F,
) -> datafusion::error::Result<Arc<ParquetMetaData>>
where
    F: Fn(Range<u64>) -> Fut,
    Fut: Future<Output = object_store::Result<Bytes>>,
{
    let size = version.size();
    let fail = |why: String| {
        DataFusionError::Execution(format!(
            "reading the Parquet footer of {}: {why}",
            version.path()
        ))
    };
    if size < 12 {
        return Err(fail(format!(
            "{size} bytes is too small for a Parquet file"
        )));
    }
    let mut suffix = (metadata_size_hint.unwrap_or(0) as u64).clamp(8, size);
    let mut reader = ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Optional);
    let mut bytes = read(size - suffix..size).await?;
    // Found once: a pass that fetches more bytes (a page index further back) decodes the
    // footer again, on the schema already found.
    let mut schema_found = false;
    let metadata = loop {
        if !schema_found
            && !reader.has_metadata()
            && let Some(schema) = shared_schema(&bytes)
        {
            let options = ParquetMetaDataOptions::new().with_schema(schema);
            reader = reader.with_metadata_options(Some(options));
            schema_found = true;
        }
        let result = if reader.has_metadata() {
            reader.read_page_indexes_sized(&bytes, size)
        } else {
            reader.try_parse_sized(&bytes, size)
        };
        match result {
            Ok(()) => break reader.finish().map_err(|e| fail(e.to_string()))?,
            Err(ParquetError::NeedMoreData(needed))
                if (needed as u64) > suffix && (needed as u64) <= size =>
            {
                // Fetch only what lies before the bytes already here.
                let needed = needed as u64;
                let before = read(size - needed..size - suffix).await?;
                let mut joined = Vec::with_capacity(needed as usize);
                joined.extend_from_slice(&before);
                joined.extend_from_slice(&bytes);
                bytes = joined.into();
                suffix = needed;
            }
            Err(e) => match footer_alone(&bytes, size) {
                Some(footer) => break footer,
                None => {
                    return Err(fail(match e {
                        ParquetError::NeedMoreData(needed) => {
                            format!("it asks for {needed} bytes from its end but has {size}")
                        }
                        e => e.to_string(),
                    }));
                }
            },
        }
    };
    check_offsets(&metadata, size).map_err(fail)?;
    Ok(Arc::new(metadata))
}

/// The schema of the footer at the end of `bytes`, as held for every footer of that schema
/// (`schemas`), if `bytes` hold the whole footer and its schema decodes. An encrypted footer
/// is left to the decoder.
fn shared_schema(bytes: &[u8]) -> Option<Arc<SchemaDescriptor>> {
    let end = bytes.len().checked_sub(8)?;
    let tail = FooterTail::try_new(bytes[end..].try_into().ok()?).ok()?;
    if tail.is_encrypted_footer() {
        return None;
    }
    let start = end.checked_sub(tail.metadata_length())?;
    let schema = ParquetMetaDataReader::decode_schema(&bytes[start..end]).ok()?;
    Some(schemas::shared(Arc::unwrap_or_clone(schema)))
}

/// The footer in `bytes` (the end of a file of `size` bytes) without its page index, if it
/// decodes on its own.
fn footer_alone(bytes: &Bytes, size: u64) -> Option<ParquetMetaData> {
    let mut reader = ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Skip);
    reader.try_parse_sized(bytes, size).ok()?;
    reader.finish().ok()
}

/// The bytes of a column chunk, if its footer gives a sane offset and length.
pub fn chunk_range(chunk: &parquet::file::metadata::ColumnChunkMetaData) -> Option<Range<u64>> {
    let start = chunk
        .dictionary_page_offset()
        .unwrap_or_else(|| chunk.data_page_offset());
    let start = u64::try_from(start).ok()?;
    let len = u64::try_from(chunk.compressed_size()).ok()?;
    Some(start..start.checked_add(len)?)
}

/// The span of a bloom filter, if the footer gives one and it is sane.
pub fn bloom_range(chunk: &parquet::file::metadata::ColumnChunkMetaData) -> Option<Range<u64>> {
    let start = u64::try_from(chunk.bloom_filter_offset()?).ok()?;
    let len = u64::try_from(chunk.bloom_filter_length()?).ok()?;
    Some(start..start.checked_add(len)?)
}

/// Refuses a footer whose column chunks lie outside the file or have negative offsets: the
/// Parquet reader asserts on them (a panic under the scan), and a prefetch would ask for
/// bytes that do not exist.
fn check_offsets(metadata: &ParquetMetaData, size: u64) -> Result<(), String> {
    for (rg, row_group) in metadata.row_groups().iter().enumerate() {
        for (col, chunk) in row_group.columns().iter().enumerate() {
            let ok = chunk_range(chunk).is_some_and(|r| r.end <= size);
            if !ok {
                return Err(format!(
                    "column {col} of row group {rg} lies outside the file's {size} bytes \
                     (offset {}, length {})",
                    chunk.data_page_offset(),
                    chunk.compressed_size()
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::object::{StoreKey, Validator};
    use crate::testkit::lake::{LakeSpec, file_bytes};

    fn version(size: u64) -> ObjectVersion {
        let store = StoreKey::of(&url::Url::parse("memory://").unwrap());
        let identity = crate::object::StoreIdentity::named("test");
        ObjectVersion::with_validator(
            store,
            &identity,
            "f.parquet".into(),
            size,
            Validator::Immutable,
        )
    }

    async fn loaded(bytes: &Bytes) -> Arc<ParquetMetaData> {
        let read = |r: Range<u64>| {
            let b = bytes.slice(r.start as usize..r.end as usize);
            async move { Ok(b) }
        };
        load_footer(&version(bytes.len() as u64), None, read)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn footers_of_one_schema_share_it_and_are_the_footers_their_bytes_describe() {
        let spec = LakeSpec::small_files(2);
        let (a, b) = (file_bytes(&spec, 0).unwrap(), file_bytes(&spec, 1).unwrap());
        let (fa, fb) = (loaded(&a).await, loaded(&b).await);
        assert!(Arc::ptr_eq(
            &fa.file_metadata().schema_descr_ptr(),
            &fb.file_metadata().schema_descr_ptr()
        ));
        assert!(Arc::ptr_eq(
            &fa.row_group(0).schema_descr_ptr(),
            &fb.file_metadata().schema_descr_ptr()
        ));
        // Each is the footer a decoder on its own makes of the file's bytes.
        for (bytes, footer) in [(&a, &fa), (&b, &fb)] {
            let alone = ParquetMetaDataReader::new()
                .with_page_index_policy(PageIndexPolicy::Optional)
                .parse_and_finish(bytes)
                .unwrap();
            assert_eq!(**footer, alone);
        }
        assert_ne!(
            fa.row_group(0).column(0).statistics(),
            fb.row_group(0).column(0).statistics()
        );
    }

    #[tokio::test]
    async fn a_footer_of_another_schema_keeps_its_own() {
        use arrow::array::Int32Array;
        use arrow::datatypes::{DataType, Field, Schema};
        use arrow::record_batch::RecordBatch;
        use parquet::arrow::ArrowWriter;
        let lake = loaded(&file_bytes(&LakeSpec::small_files(1), 0).unwrap()).await;
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int32, false)]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(Int32Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let mut out = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut out, schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        let other = loaded(&Bytes::from(out)).await;
        assert!(!Arc::ptr_eq(
            &lake.file_metadata().schema_descr_ptr(),
            &other.file_metadata().schema_descr_ptr()
        ));
        assert_eq!(other.file_metadata().schema_descr().num_columns(), 1);
        assert_eq!(other.file_metadata().schema_descr().column(0).name(), "id");
    }

    #[tokio::test]
    async fn a_footer_beyond_the_hint_is_completed_without_refetching() {
        let bytes = file_bytes(&LakeSpec::small_files(1).with_row_groups_of(500), 0).unwrap();
        let reads = Mutex::new(Vec::new());
        let read = |r: Range<u64>| {
            reads.lock().unwrap().push(r.clone());
            let b = bytes.slice(r.start as usize..r.end as usize);
            async move { Ok(b) }
        };
        let v = version(bytes.len() as u64);
        let footer = load_footer(&v, Some(1024), read).await.unwrap();
        assert_eq!(footer.num_row_groups(), 10);
        assert!(footer.column_index().is_some() && footer.offset_index().is_some());
        let fetched = reads.lock().unwrap().clone();
        assert!(
            fetched.len() >= 2,
            "the footer is larger than 1 KiB: {fetched:?}"
        );
        for pair in fetched.windows(2) {
            assert_eq!(
                pair[1].end, pair[0].start,
                "each read ends where the last began: {fetched:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_footer_with_a_negative_or_outside_offset_is_refused_naming_the_file() {
        use parquet::file::metadata::{
            ParquetMetaData, ParquetMetaDataReader, ParquetMetaDataWriter, RowGroupMetaData,
        };
        let good = file_bytes(&LakeSpec::small_files(1), 0).unwrap();
        let metadata = ParquetMetaDataReader::new()
            .parse_and_finish(&good)
            .unwrap();
        for offset in [-5, i64::MAX / 2] {
            // The footer of the same file, with one column chunk's offset rewritten.
            let row_groups: Vec<RowGroupMetaData> = metadata
                .row_groups()
                .iter()
                .map(|rg| {
                    // Without page indexes or bloom filters: only the data offsets matter.
                    let mut columns: Vec<_> = rg
                        .columns()
                        .iter()
                        .map(|c| {
                            c.clone()
                                .into_builder()
                                .set_column_index_offset(None)
                                .set_column_index_length(None)
                                .set_offset_index_offset(None)
                                .set_offset_index_length(None)
                                .set_bloom_filter_offset(None)
                                .set_bloom_filter_length(None)
                                .build()
                                .unwrap()
                        })
                        .collect();
                    columns[0] = columns[0]
                        .clone()
                        .into_builder()
                        .set_data_page_offset(offset)
                        .set_dictionary_page_offset(None)
                        .build()
                        .unwrap();
                    rg.clone()
                        .into_builder()
                        .set_column_metadata(columns)
                        .build()
                        .unwrap()
                })
                .collect();
            let bad = ParquetMetaData::new(metadata.file_metadata().clone(), row_groups);
            let mut footer = Vec::new();
            ParquetMetaDataWriter::new(&mut footer, &bad)
                .finish()
                .unwrap();
            let mut file = b"PAR1".to_vec();
            file.extend_from_slice(&footer);
            let file = Bytes::from(file);
            let read = |r: Range<u64>| {
                let b = file.slice(r.start as usize..r.end as usize);
                async move { Ok(b) }
            };
            let err = load_footer(&version(file.len() as u64), None, read)
                .await
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("f.parquet") && err.contains("outside"),
                "{offset}: {err}"
            );
        }
    }

    #[tokio::test]
    async fn a_footer_claiming_more_than_the_file_is_refused_naming_it() {
        let bytes = file_bytes(&LakeSpec::small_files(1), 0).unwrap();
        // The last 8 bytes: footer length, then PAR1. Claim a footer far longer than the file.
        let mut raw = bytes.to_vec();
        let n = raw.len();
        raw[n - 8..n - 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let raw = Bytes::from(raw);
        let read = |r: Range<u64>| {
            let b = raw.slice(r.start as usize..r.end as usize);
            async move { Ok(b) }
        };
        let err = load_footer(&version(n as u64), Some(64), read)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("f.parquet"), "{err}");
    }
}
