//! Entry points for the fuzz targets (`fuzz/`) and their seeded in-test version
//! (`tests/fuzz.rs`): the decode paths that read bytes from outside, each of which must give
//! a value or an error for any input, never a panic or a huge allocation. Built with the
//! `fuzz` feature only; not needed to embed the library.

use std::ops::Range;

use bytes::Bytes;

use crate::index::footer::{bloom_range, chunk_range, load_footer};
use crate::object::{ObjectVersion, StoreIdentity, StoreKey, Validator};

/// Decodes `file` (named `fuzz.parquet`) as a Parquet file's footer and page index, as a
/// footer load does, then walks every column chunk's data and bloom-filter spans as a scan
/// would. Returns the error a footer load gives, if any.
pub async fn parquet_footer(file: &[u8], metadata_size_hint: Option<usize>) -> Result<(), String> {
    let file = Bytes::copy_from_slice(file);
    let store = StoreKey::of(&url::Url::parse("memory://").expect("a valid URL"));
    let version = ObjectVersion::with_validator(
        store,
        &StoreIdentity::named("fuzz"),
        "fuzz.parquet".into(),
        file.len() as u64,
        Validator::Immutable,
    );
    let read = |r: Range<u64>| {
        let bytes = usize::try_from(r.start)
            .ok()
            .zip(usize::try_from(r.end).ok())
            .filter(|(s, e)| s <= e && *e <= file.len())
            .map(|(s, e)| file.slice(s..e));
        async move {
            bytes.ok_or_else(|| object_store::Error::Generic {
                store: "fuzz",
                source: "a read outside the file".into(),
            })
        }
    };
    let metadata = load_footer(&version, metadata_size_hint, read)
        .await
        .map_err(|e| e.to_string())?;
    for row_group in metadata.row_groups() {
        for chunk in row_group.columns() {
            let _ = chunk_range(chunk);
            let _ = bloom_range(chunk);
        }
    }
    Ok(())
}

/// Parses `name` as a disk-tier entry's file name and `contents` as its file, as a tier that
/// finds them in its directory would. Returns whether the entry was served.
pub fn disk_entry(name: &str, contents: &[u8]) -> bool {
    crate::range::fuzz_disk_entry(name, contents)
}
