//! A Delta Lake table through the caches: create it with delta-rs, register it in a session
//! installed from a `LakeCache`, query it with SQL, and read `lakecache_stats()`.
//!
//! `cargo run --example delta --features delta`

use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionContext;
use datafusion_lakecache::LakeCache;
use deltalake_core::protocol::SaveMode;
use object_store::local::LocalFileSystem;
use url::Url;

/// One commit's rows: `n` orders starting at `first`.
fn orders(first: i64, n: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("region", DataType::Utf8, false),
        Field::new("amount", DataType::Float64, false),
    ]));
    let ids: Vec<i64> = (first..first + n).collect();
    let regions: Vec<&str> = ids
        .iter()
        .map(|i| ["north", "south", "east", "west"][(*i % 4) as usize])
        .collect();
    let amounts: Vec<f64> = ids.iter().map(|i| (*i % 1000) as f64 / 10.0).collect();
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ids)),
            Arc::new(StringArray::from(regions)),
            Arc::new(Float64Array::from(amounts)),
        ],
    )
    .expect("columns match the schema")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let url = Url::from_directory_path(dir.path().join("orders")).map_err(|()| "a path")?;
    std::fs::create_dir_all(dir.path().join("orders"))?;
    let lake = LakeCache::builder().build()?;
    let fs = Arc::new(LocalFileSystem::new());

    // Three commits, written by delta-rs through the caches' table builder (writes go
    // through the wrapper, which forgets what they replace).
    let mut table = datafusion_lakecache::delta::table_builder(&lake, &url, fs.clone())?.build()?;
    for commit in 0..3 {
        table = table
            .write(vec![orders(commit * 10_000, 10_000)])
            .with_save_mode(SaveMode::Append)
            .await?;
    }

    for query in 1..=2 {
        // A new session and snapshot load per query, as a service would have them.
        let builder = SessionStateBuilder::new().with_default_features();
        let ctx = SessionContext::new_with_state(lake.install(builder)?.build());
        let table = datafusion_lakecache::delta::table_builder(&lake, &url, fs.clone())?
            .load()
            .await?;
        ctx.register_table("orders", table.table_provider().await?)?;
        println!("query {query}, table version {:?}:", table.version());
        ctx.sql(
            "SELECT region, count(*) AS n, round(sum(amount), 1) AS total \
             FROM orders WHERE id % 3 = 0 GROUP BY region ORDER BY region",
        )
        .await?
        .show()
        .await?;
        ctx.sql("SELECT cache, entries, hits, misses FROM lakecache_stats()")
            .await?
            .show()
            .await?;
    }
    Ok(())
}
