//! Any bytes as a Parquet file: its footer, page index and bloom-filter spans are decoded,
//! which must give a value or an error, never a panic. `cargo fuzz run footer`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    for hint in [None, Some(64), Some(512 << 10)] {
        runtime.block_on(datafusion_lakecache::fuzz::parquet_footer(data, hint));
    }
});
