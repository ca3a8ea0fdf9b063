//! The S3-server fixture: the store `scripts/with-s3` serves, built from the environment it
//! exports (`LAKECACHE_S3_ENDPOINT`, `LAKECACHE_S3_BUCKET`, and optionally
//! `LAKECACHE_S3_ACCESS_KEY` / `LAKECACHE_S3_SECRET_KEY`).

use object_store::aws::{AmazonS3, AmazonS3Builder};
use url::Url;

/// The S3 server's bucket as a store, and its URL (`s3://bucket`).
#[derive(Debug)]
pub struct S3Server {
    /// The bucket, through object_store's S3 client.
    pub store: AmazonS3,
    /// `s3://<bucket>`, the URL to register the store under.
    pub url: Url,
}

/// The S3 server named by the environment, or `None` if `LAKECACHE_S3_ENDPOINT` is unset.
pub fn s3_server() -> Option<S3Server> {
    let endpoint = std::env::var("LAKECACHE_S3_ENDPOINT").ok()?;
    let bucket = std::env::var("LAKECACHE_S3_BUCKET").unwrap_or_else(|_| "lakecache-test".into());
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| "lakecache".into());
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_bucket_name(&bucket)
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_region("us-east-1")
        .with_access_key_id(var("LAKECACHE_S3_ACCESS_KEY"))
        .with_secret_access_key(var("LAKECACHE_S3_SECRET_KEY"))
        .build()
        .ok()?;
    let url = Url::parse(&format!("s3://{bucket}")).ok()?;
    Some(S3Server { store, url })
}
