//! A DataFusion `ListingTable`, built the usual way, made faster by `install()` alone: no
//! lakecache type appears in the code that builds it, and the installed session's catalog
//! wraps it in a `LakeTable` when it is registered, so its scans get the handle, index and
//! range caches and prefetching. Prints the scan's figures from `EXPLAIN ANALYZE` and
//! `lakecache_stats()`.
//!
//! `cargo run --example listing_table`

use std::sync::Arc;

use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::SessionContext;
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use object_store::local::LocalFileSystem;
use object_store::path::Path;

#[tokio::main]
async fn main() -> datafusion::error::Result<()> {
    let dir = tempfile::tempdir()?;
    let lake_dir = dir.path().join("lake");
    write_lake(
        &LocalFileSystem::new(),
        &Path::from_absolute_path(&lake_dir)?,
        &LakeSpec::small_files(20),
    )
    .await?;

    // The only lakecache line: install it into the session.
    let lake = LakeCache::builder().build()?;
    let state = lake
        .install(SessionStateBuilder::new().with_default_features())?
        .build();
    let ctx = SessionContext::new_with_state(state);

    // A ListingTable as any DataFusion application builds one.
    let url = ListingTableUrl::parse(format!("{}/", lake_dir.display()))?;
    let options =
        ListingOptions::new(Arc::new(ParquetFormat::default())).with_file_extension(".parquet");
    let schema = options.infer_schema(&ctx.state(), &url).await?;
    let config = ListingTableConfig::new(url)
        .with_listing_options(options)
        .with_schema(schema);
    ctx.register_table("sales", Arc::new(ListingTable::try_new(config)?))?;

    let sql = "SELECT category, count(*), round(sum(value), 2) FROM sales GROUP BY category";
    ctx.sql(sql).await?.show().await?;
    let plan = ctx
        .sql(&format!("EXPLAIN ANALYZE {sql}"))
        .await?
        .collect()
        .await?;
    let plan = datafusion::arrow::util::pretty::pretty_format_batches(&plan)?.to_string();
    let scan = plan
        .lines()
        .find(|l| l.contains("DataSourceExec"))
        .unwrap_or_default();
    for figure in scan
        .split([',', '['])
        .map(str::trim)
        .filter(|f| f.starts_with("prefetch_") || f.starts_with("index_"))
    {
        println!("scan figure: {figure}");
    }
    ctx.sql("SELECT cache, entries, hits, misses FROM lakecache_stats()")
        .await?
        .show()
        .await?;
    // The second scan (EXPLAIN ANALYZE's) read every footer from the index cache. Local files'
    // bytes are left to the page cache (`lakecache.prefetch.local_files` is off by default).
    let footers = lake.stats().index.footers;
    assert!(
        footers.hits > 0,
        "the ListingTable's scans kept their footers: {footers:?}"
    );
    Ok(())
}
