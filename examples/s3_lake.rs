//! A `SessionContext` over a lake on S3 (or any S3-compatible server), through the caches.
//!
//! The store is configured as usual, from the standard `AWS_*` variables, with
//! `LAKECACHE_S3_ENDPOINT` as the endpoint override and `LAKECACHE_S3_BUCKET` as the bucket.
//! Against the S3 server the tests use:
//!
//! `bash scripts/with-s3 cargo run --example s3_lake`
//!
//! Without `LAKECACHE_S3_ENDPOINT` it says so and exits.

use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::testkit::lake::{LakeSpec, write_lake};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use url::Url;

#[tokio::main]
async fn main() -> datafusion::error::Result<()> {
    let Ok(endpoint) = std::env::var("LAKECACHE_S3_ENDPOINT") else {
        eprintln!(
            "set LAKECACHE_S3_ENDPOINT, or run: bash scripts/with-s3 cargo run --example s3_lake"
        );
        return Ok(());
    };
    let bucket = std::env::var("LAKECACHE_S3_BUCKET").unwrap_or_else(|_| "lakecache-test".into());
    // Credentials and region from AWS_* if set; the test server's otherwise.
    let s3 = AmazonS3Builder::from_env()
        .with_endpoint(endpoint)
        .with_bucket_name(&bucket)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false);
    let s3 = match std::env::var("AWS_ACCESS_KEY_ID") {
        Ok(_) => s3,
        Err(_) => s3
            .with_region("us-east-1")
            .with_access_key_id("lakecache")
            .with_secret_access_key("lakecache"),
    };
    let store: Arc<dyn ObjectStore> = Arc::new(s3.build()?);

    // A small lake to read: 20 files under a prefix of our own.
    let prefix = Path::from(format!("example-{}", std::process::id()));
    let files = write_lake(store.as_ref(), &prefix, &LakeSpec::small_files(20)).await?;

    let lake = LakeCache::builder().build()?;
    let state = lake
        .install(SessionStateBuilder::new().with_default_features())?
        .build();
    let ctx = SessionContext::new_with_state(state);
    let bucket_url = Url::parse(&format!("s3://{bucket}")).expect("valid bucket URL");
    ctx.register_object_store(&bucket_url, Arc::clone(&store));
    let table = format!("s3://{bucket}/{prefix}/");
    ctx.register_parquet("sales", &table, ParquetReadOptions::default())
        .await?;

    for _ in 0..2 {
        ctx.sql("SELECT category, round(sum(value), 2) FROM sales GROUP BY category ORDER BY 1")
            .await?
            .show()
            .await?;
    }
    let s = lake.stats();
    println!(
        "index: {} hits / {} misses; prefetch: {} requests, {} KiB",
        s.index.footers.hits,
        s.index.footers.misses,
        s.prefetch.requests,
        s.prefetch.bytes_fetched >> 10
    );
    for file in files {
        store.delete(&file).await?;
    }
    Ok(())
}
