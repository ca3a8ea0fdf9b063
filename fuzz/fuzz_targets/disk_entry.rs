//! Any file name and contents as a disk-tier entry. `cargo fuzz run disk_entry`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (&str, &[u8])| {
    datafusion_lakecache::fuzz::disk_entry(input.0, input.1);
});
