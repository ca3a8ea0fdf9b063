//! How the objects at a path change, as the table formats this crate knows lay them out.
//!
//! Most objects of a lake are written once and replaced rarely; the caches trust what they
//! learned of them for the handle TTL and check every read against its version. A table log
//! is different: Delta Lake's `_delta_log/` gains a commit at any moment and rewrites one
//! object in place (`_last_checkpoint`), while every commit, checkpoint and checksum file in
//! it is written once (with put-if-absent) and never changes, as is every deletion-vector
//! file (`deletion_vector_<uuid>.bin`, named by a new UUID each time). Serving the first two from a
//! cache would hide a new commit from the next query; fetching the others again would make
//! each snapshot load pay for the whole log.
//!
//! An Iceberg table's `metadata/` folder is alike: every metadata file (`v3.metadata.json`,
//! `00003-<uuid>.metadata.json`), manifest list and manifest (`.avro`) and statistics file
//! is written once under a new name, while the Hadoop catalog's `version-hint.text` is
//! rewritten in place at each commit.

use object_store::path::Path;

/// The folder of a Delta Lake table's log.
const DELTA_LOG: &str = "_delta_log";
/// The folder of an Iceberg table's metadata.
const ICEBERG_METADATA: &str = "metadata";

/// How the object at a path changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    /// Rewritten in place at any moment (Delta's `_last_checkpoint`): always read from the
    /// store, nothing of it kept.
    ChangesInPlace,
    /// Written once and never changed (a Delta commit, checkpoint, sidecar, checksum or
    /// deletion-vector file): whole-object reads are served and kept like ranged ones.
    WrittenOnce,
    /// Nothing known: the caches' usual rules (handle TTL, versioned reads).
    Unknown,
}

impl Lifecycle {
    /// How the object at `path` changes.
    pub(crate) fn of(path: &Path) -> Self {
        // Asked on every read: the last three segments, without allocating.
        let mut segments = path.as_ref().rsplit('/');
        let name = segments.next().unwrap_or_default();
        let parent = segments.next();
        let grandparent = segments.next();
        match parent {
            Some(DELTA_LOG) if name == "_last_checkpoint" => Self::ChangesInPlace,
            // `00000000000000000012.json`, `...12.checkpoint.parquet`, `...12.crc`,
            // `...10.00000000000000000012.compacted.json`, v2 checkpoints: all start with a
            // zero-padded 20-digit version.
            Some(DELTA_LOG) if starts_with_version(name) => Self::WrittenOnce,
            // Sidecars of v2 checkpoints and staged commits are named by UUIDs, once.
            Some("_sidecars" | "_staged_commits") if grandparent == Some(DELTA_LOG) => {
                Self::WrittenOnce
            }
            _ if is_deletion_vector(name) => Self::WrittenOnce,
            Some(ICEBERG_METADATA) if name == "version-hint.text" => Self::ChangesInPlace,
            Some(ICEBERG_METADATA) if is_iceberg_metadata(name) => Self::WrittenOnce,
            _ => Self::Unknown,
        }
    }
}

/// `deletion_vector_<uuid>.bin`, as the Delta protocol names deletion-vector files.
fn is_deletion_vector(name: &str) -> bool {
    name.strip_prefix("deletion_vector_")
        .and_then(|rest| rest.strip_suffix(".bin"))
        .is_some_and(|uuid| {
            uuid.len() == 36 && uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        })
}

/// An Iceberg metadata file, manifest list, manifest or statistics file, each written once
/// under a name of its own.
fn is_iceberg_metadata(name: &str) -> bool {
    [".metadata.json", ".avro", ".stats", ".puffin"]
        .iter()
        .any(|suffix| name.len() > suffix.len() && name.ends_with(suffix))
}

/// Whether a listing of `prefix` must always come from the store: the listing of a table log
/// (or of anything in it) shows new commits the moment they are written.
pub(crate) fn listing_changes(prefix: Option<&Path>) -> bool {
    prefix.is_some_and(|p| p.parts().any(|part| part.as_ref() == DELTA_LOG))
}

fn starts_with_version(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes.len() > 21 && bytes[..20].iter().all(u8::is_ascii_digit) && bytes[20] == b'.'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(path: &str) -> Lifecycle {
        Lifecycle::of(&Path::from(path))
    }

    #[test]
    fn delta_log_files_are_told_apart() {
        use Lifecycle::*;
        assert_eq!(of("t/_delta_log/_last_checkpoint"), ChangesInPlace);
        assert_eq!(of("t/_delta_log/00000000000000000000.json"), WrittenOnce);
        assert_eq!(
            of("t/_delta_log/00000000000000000010.checkpoint.parquet"),
            WrittenOnce
        );
        assert_eq!(
            of("t/_delta_log/00000000000000000010.checkpoint.0000000001.0000000002.parquet"),
            WrittenOnce
        );
        assert_eq!(of("t/_delta_log/00000000000000000003.crc"), WrittenOnce);
        assert_eq!(of("t/_delta_log/_sidecars/3a0d65cd.parquet"), WrittenOnce);
        assert_eq!(of("_delta_log/00000000000000000001.json"), WrittenOnce);
        assert_eq!(
            of("t/ab/deletion_vector_559d13d5-87cd-4964-9563-fb08697fd289.bin"),
            WrittenOnce
        );
        assert_eq!(of("t/deletion_vector_x.bin"), Unknown);
        // Not log files: data files, a short number, a file merely named like the log.
        assert_eq!(of("t/part-00000-1.snappy.parquet"), Unknown);
        assert_eq!(of("t/_delta_log/1.json"), Unknown);
        assert_eq!(of("t/_delta_log/00000000000000000001"), Unknown);
        assert_eq!(of("t/_sidecars/x.parquet"), Unknown);
        assert_eq!(of("_last_checkpoint"), Unknown);
    }

    #[test]
    fn iceberg_metadata_files_are_told_apart() {
        use Lifecycle::*;
        assert_eq!(of("db/t/metadata/version-hint.text"), ChangesInPlace);
        assert_eq!(of("db/t/metadata/v3.metadata.json"), WrittenOnce);
        assert_eq!(of("db/t/metadata/00003-9b1f.metadata.json"), WrittenOnce);
        assert_eq!(of("db/t/metadata/v3.gz.metadata.json"), WrittenOnce);
        assert_eq!(of("db/t/metadata/snap-1-1-9b1f.avro"), WrittenOnce);
        assert_eq!(of("db/t/metadata/9b1f-m0.avro"), WrittenOnce);
        assert_eq!(of("db/t/metadata/1-9b1f.stats"), WrittenOnce);
        // Data files, and files merely named like metadata outside a metadata folder.
        assert_eq!(of("db/t/data/00000-0-9b1f.parquet"), Unknown);
        assert_eq!(of("db/t/data/x.avro"), Unknown);
        assert_eq!(of("db/t/version-hint.text"), Unknown);
    }

    #[test]
    fn listings_of_a_log_always_come_from_the_store() {
        assert!(listing_changes(Some(&Path::from("t/_delta_log"))));
        assert!(listing_changes(Some(&Path::from(
            "a/b/_delta_log/_sidecars"
        ))));
        assert!(!listing_changes(Some(&Path::from("t"))));
        assert!(!listing_changes(None));
    }
}
