//! Tools to test and measure lake scans without a cloud account: object stores that count,
//! delay or fail requests the way a remote store would see them, and a seeded generator of
//! Parquet lakes. Used by this crate's tests, benchmarks and `lakecache demo`, and public so
//! that embedders can test their own set-up the same way.
//!
//! The counting and latency stores serve `get_ranges` with object_store's own range
//! coalescing over their `get_opts`, so they see (and charge) one request per HTTP request an
//! S3-like store would make, not one per `get_ranges` call.

mod counting;
mod fault;
pub mod lake;
mod latency;
mod session;

pub use counting::{CountingStore, RequestCounts};
pub use fault::{FaultStore, Op};
pub use latency::LatencyStore;
pub use session::{LakeLocation, query};
