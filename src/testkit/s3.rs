//! The S3-server fixture: the store `scripts/with-s3` serves, built from the environment it
//! exports (`LAKECACHE_S3_ENDPOINT`, `LAKECACHE_S3_BUCKET`, and optionally
//! `LAKECACHE_S3_ACCESS_KEY` / `LAKECACHE_S3_SECRET_KEY`).

use std::net::SocketAddr;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::{BackoffConfig, ClientOptions, RetryConfig};
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
    let store = builder(&endpoint).build().ok()?;
    Some(S3Server {
        store,
        url: bucket_url()?,
    })
}

/// Says that `test`'s S3 part is skipped because no server is named; in CI (`CI=true`, the
/// one rule every test of the workspace follows) a skipped S3 part fails instead.
pub fn s3_skipped(test: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: LAKECACHE_S3_ENDPOINT is not set; in CI the S3 tests must run")
    }
    eprintln!("{test}: S3 part skipped (set LAKECACHE_S3_ENDPOINT to run it)");
}

/// The address the S3 server listens on, for a proxy to put in front of it.
pub fn s3_server_addr() -> Option<SocketAddr> {
    let endpoint = std::env::var("LAKECACHE_S3_ENDPOINT").ok()?;
    let url = Url::parse(&endpoint).ok()?;
    format!("{}:{}", url.host_str()?, url.port()?).parse().ok()
}

/// The S3 server's bucket reached at `endpoint` (a proxy in front of the server), with a
/// client that gives up on a request after `timeout` and retries it at most `retries` times
/// with short backoffs: what a test of faults wants, rather than minutes of retries.
pub fn s3_store_via(endpoint: &str, timeout: Duration, retries: usize) -> Option<AmazonS3> {
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            base: 2.0,
        },
        max_retries: retries,
        retry_timeout: timeout * (retries as u32 + 2),
    };
    let client = ClientOptions::new()
        .with_allow_http(true)
        .with_timeout(timeout)
        .with_connect_timeout(timeout);
    builder(endpoint)
        .with_client_options(client)
        .with_retry(retry)
        .build()
        .ok()
}

fn bucket() -> String {
    std::env::var("LAKECACHE_S3_BUCKET").unwrap_or_else(|_| "lakecache-test".into())
}

fn bucket_url() -> Option<Url> {
    Url::parse(&format!("s3://{}", bucket())).ok()
}

fn builder(endpoint: &str) -> AmazonS3Builder {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| "lakecache".into());
    AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_bucket_name(bucket())
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_region("us-east-1")
        .with_access_key_id(var("LAKECACHE_S3_ACCESS_KEY"))
        .with_secret_access_key(var("LAKECACHE_S3_SECRET_KEY"))
}
