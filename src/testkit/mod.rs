//! Tools to test and measure lake scans without a cloud account: object stores that count,
//! delay or fail requests the way a remote store would see them, and a seeded generator of
//! Parquet lakes, the S3 server `scripts/with-s3` runs, and a small HTTP file server. Used by
//! this crate's tests, benchmarks and `lakecache demo`, and public so that embedders can test
//! their own set-up the same way.
//!
//! The counting and latency stores serve `get_ranges` with object_store's own range
//! coalescing over their `get_opts`, so they see (and charge) one request per HTTP request an
//! S3-like store would make, not one per `get_ranges` call.

mod cloud;
#[cfg(feature = "ballista")]
mod cluster;
pub mod corpus;
mod counting;
#[cfg(feature = "delta")]
pub mod delta;
mod digests;
mod fault;
mod http;
#[cfg(feature = "iceberg")]
pub mod iceberg;
pub mod lake;
mod latency;
mod proxy;
mod race;
pub mod requests;
mod s3;
mod session;

pub use cloud::CloudMetadata;
#[cfg(feature = "ballista")]
pub use cluster::{NamedCluster, Placement, Process, start_cluster};
pub use counting::{CountingStore, RequestCounts};
pub use digests::ContentETags;
pub use fault::{FaultStore, Op};
pub use http::HttpDir;
pub use latency::{LatencyStore, S3_SIGMA};
pub use proxy::{FaultProxy, Faults, ProxyCounts};
pub use race::RaceStore;
pub use s3::{S3Server, s3_server, s3_server_addr, s3_skipped, s3_store_via};
pub use session::{LakeLocation, context, query};

use std::ops::Range;
use std::path::Path as FsPath;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{GetOptions, OBJECT_STORE_COALESCE_DEFAULT, ObjectStore, coalesce_ranges};

/// `get_ranges` as an S3-like store serves it: ranges coalesced the way object_store's
/// default does, then one `get_opts` (one request) per coalesced range.
async fn get_ranges_per_request(
    store: &impl ObjectStore,
    location: &Path,
    ranges: &[Range<u64>],
) -> object_store::Result<Vec<Bytes>> {
    coalesce_ranges(
        ranges,
        |r| async move {
            let options = GetOptions::new().with_range(Some(r));
            store.get_opts(location, options).await?.bytes().await
        },
        OBJECT_STORE_COALESCE_DEFAULT,
    )
    .await
}

/// Flips one byte of every entry file of the range cache's disk tier in `dir` (its files are
/// in `lakecache-ranges/<object>/`), at `at(file length)`: disk rot, or another program's
/// writes. Returns how many files it changed.
pub fn corrupt_files_below(dir: &FsPath, at: impl Fn(usize) -> usize) -> std::io::Result<usize> {
    let mut changed = 0;
    for sub in std::fs::read_dir(dir.join("lakecache-ranges"))? {
        let sub = sub?.path();
        if !sub.is_dir() || sub.ends_with("tmp") {
            continue;
        }
        for file in std::fs::read_dir(&sub)? {
            let file = file?.path();
            let mut raw = std::fs::read(&file)?;
            if raw.is_empty() {
                continue;
            }
            let i = at(raw.len()).min(raw.len() - 1);
            raw[i] ^= 0x5a;
            std::fs::write(&file, raw)?;
            changed += 1;
        }
    }
    Ok(changed)
}
