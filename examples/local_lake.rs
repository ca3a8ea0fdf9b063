//! Scan a local directory of Parquet files through the handle cache and read its figures.
//!
//! `cargo run --example local_lake`

use std::sync::Arc;

use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use datafusion_lakecache::{CachingObjectStore, LakeCache};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use url::Url;

#[tokio::main]
async fn main() -> datafusion::error::Result<()> {
    // A small lake of 20 files in a temporary directory.
    let dir = tempfile::tempdir()?;
    let lake_dir = dir.path().join("lake");
    let fs = LocalFileSystem::new();
    write_lake(
        &fs,
        &Path::from_absolute_path(&lake_dir)?,
        &LakeSpec::small_files(20),
    )
    .await?;

    // One LakeCache per process; every store registered through it shares its entries.
    let lake = LakeCache::builder().build()?;
    let url = Url::parse("file://").expect("static URL");
    let store = Arc::new(CachingObjectStore::new(fs, &url, &lake));

    for query in 1..=3 {
        // A new session per query, as a service planning each query afresh would have.
        let ctx = SessionContext::new();
        ctx.register_object_store(&url, store.clone());
        let location = format!("{}/", lake_dir.display());
        ctx.register_parquet("t", &location, ParquetReadOptions::default())
            .await?;
        let df = ctx
            .sql("SELECT category, count(*) AS n FROM t GROUP BY category ORDER BY category")
            .await?;
        let rows: usize = df.collect().await?.iter().map(|b| b.num_rows()).sum();
        let s = lake.stats().handle;
        println!(
            "query {query}: {rows} groups; listings {} hits / {} misses, descriptors {} hits / {} opened, {} open now",
            s.listings.hits, s.listings.misses, s.files.hits, s.files.misses, s.open_files
        );
    }
    Ok(())
}
