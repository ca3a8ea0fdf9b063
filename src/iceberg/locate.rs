//! Which metadata file is a table's newest, found in the store as the catalogs that keep
//! tables in a directory leave it: the highest-numbered metadata file, named
//! `vN.metadata.json` (the Hadoop catalog, Spark's path-based tables) or
//! `NNNNN-<uuid>.metadata.json` (the REST, SQL and Glue catalogs, pyiceberg). The Hadoop
//! catalog's `metadata/version-hint.text` is a hint Iceberg itself probes past to the highest
//! version; it is read only where the store cannot list (HTTP). The listing goes through the
//! caches, kept for the handle cache's `list_ttl`: a new snapshot is seen within it, and a
//! warm query lists nothing.

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

use datafusion::error::{DataFusionError, Result};

/// The suffix of every metadata file (compressed ones end in `.gz.metadata.json`).
const SUFFIX: &str = ".metadata.json";

/// Whether `location` names a metadata file rather than a table directory.
pub(crate) fn is_metadata_file(location: &str) -> bool {
    location.ends_with(SUFFIX)
}

/// The newest metadata file of the table whose directory is `table` in `store`; `name` is
/// the table's URL, for errors.
pub(crate) async fn newest_metadata(
    store: &dyn ObjectStore,
    table: &Path,
    name: &str,
) -> Result<Path> {
    let dir = table.clone().join("metadata");
    let listed: Vec<_> = match store.list(Some(&dir)).try_collect().await {
        Ok(listed) => listed,
        Err(object_store::Error::NotImplemented { .. }) => {
            return from_hint(store, &dir, name).await;
        }
        Err(e) => return Err(read_error(name, &dir, e)),
    };
    listed
        .into_iter()
        .filter_map(|meta| {
            let version = version_of(meta.location.filename()?)?;
            Some((version, meta.location))
        })
        .max_by_key(|(version, _)| *version)
        .map(|(_, location)| location)
        .ok_or_else(|| {
            DataFusionError::Execution(format!(
                "Iceberg table {name}: no metadata file (vN.metadata.json or \
                 NNNNN-<uuid>.metadata.json) under {dir}"
            ))
        })
}

/// The metadata file `dir/version-hint.text` names: a version, or a file's name.
async fn from_hint(store: &dyn ObjectStore, dir: &Path, name: &str) -> Result<Path> {
    let hint = dir.clone().join("version-hint.text");
    let got = store
        .get(&hint)
        .await
        .map_err(|e| read_error(name, &hint, e))?;
    let bytes = got.bytes().await.map_err(|e| read_error(name, &hint, e))?;
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim();
    match text.parse::<u64>() {
        Ok(n) => Ok(dir.clone().join(format!("v{n}{SUFFIX}"))),
        // Some writers put the file's name in the hint.
        Err(_) if is_metadata_file(text) && !text.contains('/') => Ok(dir.clone().join(text)),
        Err(_) => Err(DataFusionError::Execution(format!(
            "Iceberg table {name}: {hint} holds {text:?}, not a version"
        ))),
    }
}

/// The version a metadata file's name gives it.
fn version_of(file: &str) -> Option<u64> {
    let stem = file.strip_suffix(SUFFIX)?;
    let stem = stem.strip_suffix(".gz").unwrap_or(stem);
    if let Some(n) = stem.strip_prefix('v')
        && let Ok(n) = n.parse()
    {
        return Some(n);
    }
    // `%05d-<uuid>`: a version of at least five digits, then a whole UUID. A Hadoop writer's
    // temporary `<uuid>.metadata.json` whose first group happens to be all digits is not one.
    let (n, uuid) = stem.split_once('-')?;
    let is_uuid = uuid.len() == 36
        && uuid.bytes().enumerate().all(|(i, b)| {
            matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
        });
    (is_uuid && n.len() >= 5 && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| n.parse().ok())
        .flatten()
}

fn read_error(name: &str, path: &Path, e: object_store::Error) -> DataFusionError {
    DataFusionError::Execution(format!("Iceberg table {name}: reading {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::PutPayload;
    use object_store::memory::InMemory;

    #[test]
    fn versions_are_read_from_both_namings() {
        assert_eq!(version_of("v12.metadata.json"), Some(12));
        assert_eq!(version_of("v3.gz.metadata.json"), Some(3));
        assert_eq!(
            version_of("00007-0b8a3e5c-4d4e-4b4c-9c1f-0a6b1e0e3a11.metadata.json"),
            Some(7)
        );
        // A temporary file named by a UUID whose first group is all digits.
        assert_eq!(
            version_of("12345678-4d4e-4b4c-9c1f-0a6b1e0e3a11.metadata.json"),
            None
        );
        assert_eq!(version_of("version-hint.text"), None);
        assert_eq!(version_of("snap-1-1-abc.avro"), None);
        assert_eq!(version_of("x-abc.metadata.json"), None);
    }

    #[tokio::test]
    async fn the_highest_version_wins_and_the_hint_is_read_where_nothing_lists() {
        let store = InMemory::new();
        let table = Path::from("db/t");
        for file in [
            "00001-9b2f4e1a-4d4e-4b4c-9c1f-0a6b1e0e3a11.metadata.json",
            "00010-0b8a3e5c-4d4e-4b4c-9c1f-0a6b1e0e3a11.metadata.json",
            "00002-1c8a3e5c-4d4e-4b4c-9c1f-0a6b1e0e3a11.metadata.json",
            "87654321-4d4e-4b4c-9c1f-0a6b1e0e3a11.metadata.json",
            "snap-1.avro",
        ] {
            store
                .put(
                    &Path::from(format!("db/t/metadata/{file}")),
                    PutPayload::from_static(b"{}"),
                )
                .await
                .unwrap();
        }
        let newest = newest_metadata(&store, &table, "t").await.unwrap();
        assert_eq!(
            newest.as_ref(),
            "db/t/metadata/00010-0b8a3e5c-4d4e-4b4c-9c1f-0a6b1e0e3a11.metadata.json"
        );

        // A hint behind the highest version is passed, as Iceberg probes past it.
        store
            .put(
                &Path::from("db/t/metadata/version-hint.text"),
                PutPayload::from_static(b"4\n"),
            )
            .await
            .unwrap();
        let newest = newest_metadata(&store, &table, "t").await.unwrap();
        assert_eq!(
            newest.as_ref(),
            "db/t/metadata/00010-0b8a3e5c-4d4e-4b4c-9c1f-0a6b1e0e3a11.metadata.json"
        );
        let hinted = from_hint(&store, &Path::from("db/t/metadata"), "t")
            .await
            .unwrap();
        assert_eq!(hinted.as_ref(), "db/t/metadata/v4.metadata.json");

        let err = newest_metadata(&store, &Path::from("db/none"), "s3://b/db/none")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("s3://b/db/none"), "{err}");
    }
}
