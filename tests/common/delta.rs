//! Delta tables as the tests write them: generated files, committed by delta-rs alone over
//! the raw store, and deletion vectors written as a Delta writer that supports them would.
//! A test that writes Delta tables includes it beside `common` (the tool's tests include
//! `common` without the `delta` feature):
//! `#[path = "common/delta.rs"] mod delta_tables;`.
#![allow(dead_code)]

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::prelude::SessionContext;
use datafusion_lakecache::delta::register_default_log_stores;
use datafusion_lakecache::testkit::delta::delta_batch;
use datafusion_lakecache::testkit::lake::LakeSpec;
use deltalake_core::{DeltaTable, DeltaTableBuilder};
use object_store::ObjectStoreExt;
use url::Url;

use crate::common::{Backend, rows};

/// The URL of the backend's table.
pub fn table_url(b: &Backend) -> Url {
    Url::parse(&b.table_url()).unwrap()
}

/// The rows of generated file `index` of the small-files lake, as Delta takes them.
pub fn batch(index: usize) -> RecordBatch {
    delta_batch(&LakeSpec::small_files(index + 1), index)
}

/// The table as delta-rs alone reads and writes it, over the raw store.
pub fn uncached(b: &Backend) -> DeltaTable {
    register_default_log_stores();
    let url = table_url(b);
    DeltaTableBuilder::from_url(url.clone())
        .unwrap()
        .with_storage_backend(Arc::clone(&b.raw), url)
        .build()
        .unwrap()
}

/// The `add` actions of the table's live files after commit `version`, from its JSON
/// commits (the table has no checkpoint yet).
pub async fn live_adds(b: &Backend, version: i64) -> Vec<serde_json::Value> {
    let mut live: Vec<(String, serde_json::Value)> = Vec::new();
    for v in 0..=version {
        let path = object_store::path::Path::from(format!("{}/_delta_log/{v:020}.json", b.prefix));
        let bytes = b.raw.get(&path).await.unwrap().bytes().await.unwrap();
        for line in std::str::from_utf8(&bytes).unwrap().lines() {
            let action: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(add) = action.get("add") {
                live.push((add["path"].as_str().unwrap().to_string(), add.clone()));
            }
            if let Some(remove) = action.get("remove") {
                live.retain(|(p, _)| p != remove["path"].as_str().unwrap());
            }
        }
    }
    live.into_iter().map(|(_, add)| add).collect()
}

/// Deletes the rows whose id `deleted` picks with deletion vectors, in commit `version` + 1,
/// as a Delta writer that writes them would (delta-rs 1.1 rewrites files instead): the
/// protocol gains the `deletionVectors` feature, and each file with deleted rows is removed
/// and added again with its vector, kept in one `deletion_vector_<uuid>.bin` file. Returns
/// how many rows it deleted.
pub async fn delete_with_deletion_vectors(
    b: &Backend,
    version: i64,
    deleted: fn(i64) -> bool,
) -> usize {
    use buoyant_kernel::actions::deletion_vector_writer::{
        KernelDeletionVector, StreamingDeletionVectorWriter,
    };
    use datafusion::arrow::array::{Array, Int64Array};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let uuid = uuid::Uuid::new_v4();
    let mut dv_file = Vec::new();
    let mut writer = StreamingDeletionVectorWriter::new(&mut dv_file);
    let now = 1_700_000_000_000i64;
    let mut lines = vec![serde_json::json!({"protocol": {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors"],
        "writerFeatures": ["deletionVectors"],
    }})];
    let mut total = 0;
    for add in live_adds(b, version).await {
        let name = add["path"].as_str().unwrap();
        let path = object_store::path::Path::from(format!("{}/{name}", b.prefix));
        let bytes = b.raw.get(&path).await.unwrap().bytes().await.unwrap();
        let mut rows = Vec::new();
        let mut position = 0u64;
        for batch in ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .build()
            .unwrap()
        {
            let batch = batch.unwrap();
            let ids = batch
                .column_by_name("id")
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .clone();
            for i in 0..ids.len() {
                if deleted(ids.value(i)) {
                    rows.push(position);
                }
                position += 1;
            }
        }
        if rows.is_empty() {
            continue;
        }
        total += rows.len();
        let mut dv = KernelDeletionVector::new();
        dv.add_deleted_row_indexes(rows);
        let written = writer.write_deletion_vector(dv).unwrap();
        lines.push(serde_json::json!({"remove": {
            "path": name,
            "deletionTimestamp": now,
            "dataChange": true,
            "extendedFileMetadata": true,
            "partitionValues": add["partitionValues"],
            "size": add["size"],
        }}));
        let mut again = add.clone();
        again["dataChange"] = serde_json::json!(true);
        again["deletionVector"] = serde_json::json!({
            "storageType": "u",
            "pathOrInlineDv": z85::encode(uuid.as_bytes()),
            "offset": written.offset,
            "sizeInBytes": written.size_in_bytes,
            "cardinality": written.cardinality,
        });
        lines.push(serde_json::json!({ "add": again }));
    }
    writer.finalize().unwrap();
    lines.push(serde_json::json!({"commitInfo": {"timestamp": now, "operation": "DELETE"}}));
    let dv_path =
        object_store::path::Path::from(format!("{}/deletion_vector_{uuid}.bin", b.prefix));
    b.raw.put(&dv_path, dv_file.into()).await.unwrap();
    let commit: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let commit_path =
        object_store::path::Path::from(format!("{}/_delta_log/{:020}.json", b.prefix, version + 1));
    b.raw.put(&commit_path, commit.into()).await.unwrap();
    total
}

/// What delta-rs alone answers for each of `queries` over the table as `t`, at its latest
/// version.
pub async fn delta_rs_rows(b: &Backend, queries: &[&str]) -> Vec<Vec<String>> {
    let mut table = uncached(b);
    table.load().await.unwrap();
    let ctx = SessionContext::new();
    ctx.register_object_store(&b.store_url, Arc::clone(&b.raw));
    ctx.register_table("t", table.table_provider().await.unwrap())
        .unwrap();
    let mut all = Vec::new();
    for sql in queries {
        all.push(rows(&ctx, sql).await.unwrap());
    }
    all
}
