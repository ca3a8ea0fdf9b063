//! Delta Lake fixtures (`testkit` with `delta`): the rows the tests commit. The tests' S3
//! server and the benches' simulated store take put-if-absent commits, so delta-rs's default
//! log store serves `s3://` tables ([`crate::delta::register_default_log_stores`]).

use arrow::array::RecordBatch;

use super::lake::{LakeSpec, file_batch};

/// The rows of generated file `index` of `spec`, as a Delta table takes them: without the
/// timestamp column (Delta's `timestamp` type is UTC-adjusted; the generator's is not).
pub fn delta_batch(spec: &LakeSpec, index: usize) -> RecordBatch {
    file_batch(spec, index)
        .project(&[0, 1, 2, 3, 5])
        .expect("the generator's columns")
}
