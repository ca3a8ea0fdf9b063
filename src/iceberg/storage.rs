//! [`StoreStorage`]: the iceberg crate's `Storage` over the session's object store, so that
//! metadata files, manifest lists and manifests are read through the caches.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use iceberg::io::{
    FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use url::Url;

/// The iceberg crate's [`Storage`] over one object store: the one of the store root `root`
/// (scheme, host and port), which is how DataFusion registers stores. Iceberg names every
/// file by its absolute URL; a URL under another root is refused with an error naming it.
///
/// It lives in one process: the crate's `typetag` registration needs `serde`, and a store
/// with its credentials and caches does not cross a wire, so serializing it is an error.
#[derive(Clone)]
pub(crate) struct StoreStorage {
    root: Url,
    store: Arc<dyn ObjectStore>,
}

impl fmt::Debug for StoreStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreStorage")
            .field("root", &self.root.as_str())
            .field("store", &self.store.to_string())
            .finish()
    }
}

impl StoreStorage {
    /// The storage of `store`, the store of `root`.
    pub(crate) fn new(root: Url, store: Arc<dyn ObjectStore>) -> Self {
        Self { root, store }
    }

    /// The store.
    pub(crate) fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.store)
    }

    /// A `FileIO` that reads and writes through this storage.
    pub(crate) fn file_io(&self) -> FileIO {
        FileIOBuilder::new(self.factory()).build()
    }

    /// A factory that hands out this storage.
    pub(crate) fn factory(&self) -> Arc<dyn StorageFactory> {
        Arc::new(StoreStorageFactory(self.clone()))
    }

    /// The path in the store of the file at `location`: an absolute URL under the root, or an
    /// absolute local path when the root is `file:///`.
    ///
    /// Iceberg's locations are the files' names as their writer wrote them, not
    /// percent-encoded URLs: a partition value its writer escaped (`a+b%2Fc` for `a b/c`) is
    /// part of the object's key, and Iceberg's own readers (S3FileIO, Hadoop's `Path`,
    /// pyiceberg) never decode it. So the key is taken from `location` as it is.
    pub(crate) fn path_of(&self, location: &str) -> iceberg::Result<Path> {
        let url = match Url::parse(location) {
            Ok(url) => url,
            Err(_) if location.starts_with('/') && self.root.scheme() == "file" => {
                Url::from_file_path(location).map_err(|()| outside(location, &self.root))?
            }
            Err(e) => {
                return Err(Error::new(
                    ErrorKind::DataInvalid,
                    format!("{location} is not a URL: {e}"),
                ));
            }
        };
        if !same_root(&url, &self.root) {
            return Err(outside(location, &self.root));
        }
        Path::parse(key_of(location)).map_err(|e| invalid_path(location, e))
    }

    /// The path in the store of a table URL a user wrote (`LOCATION`, `table_builder`):
    /// percent-decoded, as DataFusion reads the URL of any table.
    pub(crate) fn path_of_url(&self, url: &Url) -> iceberg::Result<Path> {
        if !same_root(url, &self.root) {
            return Err(outside(url.as_str(), &self.root));
        }
        Path::from_url_path(url.path()).map_err(|e| invalid_path(url.as_str(), e))
    }

    /// The location of `path` as Iceberg names files: the root's URL and the key as it is
    /// (the inverse of [`path_of`](Self::path_of)).
    pub(crate) fn location_of(&self, path: &Path) -> String {
        let root = self.root.as_str();
        match root.ends_with('/') {
            true => format!("{root}{path}"),
            false => format!("{root}/{path}"),
        }
    }
}

/// The key part of an absolute location: what follows the scheme and the authority
/// (`s3://bucket/k` gives `/k`; `file:///tmp/k`, `file:/tmp/k` and `memory:/k` give what
/// follows them), or the location itself when it is a local path.
fn key_of(location: &str) -> &str {
    if location.starts_with('/') {
        return location;
    }
    match location.split_once(':') {
        Some((_, rest)) => match rest.strip_prefix("//") {
            Some(rest) => rest.find('/').map_or("", |at| &rest[at..]),
            None => rest,
        },
        None => location,
    }
}

/// Whether `url` is under the store root `root`. `s3a://` and `s3n://`, which Hadoop writers
/// put in manifests, name the buckets of `s3://`.
fn same_root(url: &Url, root: &Url) -> bool {
    let scheme = |u: &Url| match u.scheme() {
        "s3a" | "s3n" => "s3".to_string(),
        other => other.to_string(),
    };
    scheme(url) == scheme(root)
        && url.host_str().unwrap_or("") == root.host_str().unwrap_or("")
        && url.port_or_known_default() == root.port_or_known_default()
}

fn invalid_path(location: &str, e: object_store::path::Error) -> Error {
    Error::new(
        ErrorKind::DataInvalid,
        format!("{location} is not a valid object path"),
    )
    .with_source(e)
}

fn outside(location: &str, root: &Url) -> Error {
    Error::new(
        ErrorKind::DataInvalid,
        format!("{location} is outside the store {root} the Iceberg table was opened with"),
    )
}

fn store_error(location: &str, e: object_store::Error) -> Error {
    let kind = match e {
        object_store::Error::NotFound { .. } => ErrorKind::DataInvalid,
        _ => ErrorKind::Unexpected,
    };
    Error::new(kind, format!("reading {location}: {e}")).with_source(e)
}

#[async_trait]
#[typetag::serde(name = "datafusion_lakecache::StoreStorage")]
impl Storage for StoreStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        match self.store.head(&self.path_of(path)?).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(store_error(path, e)),
        }
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        let meta = self
            .store
            .head(&self.path_of(path)?)
            .await
            .map_err(|e| store_error(path, e))?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        let result = self.store.get(&self.path_of(path)?).await;
        let result = result.map_err(|e| store_error(path, e))?;
        result.bytes().await.map_err(|e| store_error(path, e))
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        Ok(Box::new(StoreRead {
            location: path.to_string(),
            path: self.path_of(path)?,
            store: Arc::clone(&self.store),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        let location = self.path_of(path)?;
        self.store
            .put(&location, PutPayload::from_bytes(bs))
            .await
            .map_err(|e| store_error(path, e))?;
        Ok(())
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        Ok(Box::new(StoreWrite {
            storage: self.clone(),
            location: path.to_string(),
            parts: Vec::new(),
            closed: false,
        }))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        match self.store.delete(&self.path_of(path)?).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_error(path, e)),
        }
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        let prefix = self.path_of(path)?;
        let listed: Vec<_> = self
            .store
            .list(Some(&prefix))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await
            .map_err(|e| store_error(path, e))?;
        for location in listed {
            self.store
                .delete(&location)
                .await
                .map_err(|e| store_error(location.as_ref(), e))?;
        }
        Ok(())
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        self.path_of(path)?;
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        self.path_of(path)?;
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// Ranges of one file, each one ranged GET (through the caches).
struct StoreRead {
    location: String,
    path: Path,
    store: Arc<dyn ObjectStore>,
}

#[async_trait]
impl FileRead for StoreRead {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        self.store
            .get_range(&self.path, range)
            .await
            .map_err(|e| store_error(&self.location, e))
    }
}

/// A file written whole by one PUT at `close`: what the iceberg crate writes through a
/// `FileIO` (metadata files, manifests and, in tests, data files) is small.
struct StoreWrite {
    storage: StoreStorage,
    location: String,
    parts: Vec<Bytes>,
    closed: bool,
}

#[async_trait]
impl FileWrite for StoreWrite {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        self.parts.push(bs);
        Ok(())
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        if self.closed {
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!("{} was already closed", self.location),
            ));
        }
        self.closed = true;
        let payload: PutPayload = std::mem::take(&mut self.parts).into_iter().collect();
        let path = self.storage.path_of(&self.location)?;
        self.storage
            .store
            .put(&path, payload)
            .await
            .map_err(|e| store_error(&self.location, e))?;
        Ok(())
    }
}

/// The factory a [`FileIO`] builds its storage with: it hands out the one storage it holds.
#[derive(Debug, Clone)]
struct StoreStorageFactory(StoreStorage);

#[typetag::serde(name = "datafusion_lakecache::StoreStorageFactory")]
impl StorageFactory for StoreStorageFactory {
    fn build(&self, _config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.0.clone()))
    }
}

/// Neither the storage nor its factory cross a process boundary (see [`StoreStorage`]).
macro_rules! not_serializable {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom(concat!(
                    stringify!($t),
                    " holds a live object store and is not serialized"
                )))
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
                Err(serde::de::Error::custom(concat!(
                    stringify!($t),
                    " holds a live object store and is not deserialized"
                )))
            }
        }
    };
}

not_serializable!(StoreStorage);
not_serializable!(StoreStorageFactory);

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    fn storage(root: &str) -> StoreStorage {
        StoreStorage::new(Url::parse(root).unwrap(), Arc::new(InMemory::new()))
    }

    #[test]
    fn a_location_maps_to_its_path_under_the_root_and_another_root_is_refused() {
        // (root, location, its path): a key is taken as it is written, never decoded, so a
        // partition value its writer escaped stays part of the key.
        let cases = [
            (
                "s3://bucket/",
                "s3://bucket/db/t/metadata/v1.metadata.json",
                "db/t/metadata/v1.metadata.json",
            ),
            (
                "s3://bucket/",
                "s3a://bucket/db/t/data/a b.parquet",
                "db/t/data/a b.parquet",
            ),
            (
                "s3://bucket/",
                "s3://bucket/db/t/data/category=a+b%2Fc%25/f.parquet",
                "db/t/data/category=a+b%2Fc%25/f.parquet",
            ),
            ("file:///", "/tmp/w/t/x.avro", "tmp/w/t/x.avro"),
            ("file:///", "file:///tmp/w/x.avro", "tmp/w/x.avro"),
            ("file:///", "file:/tmp/w/x=%3A.avro", "tmp/w/x=%3A.avro"),
            ("file:///", "/tmp/w:1/x.avro", "tmp/w:1/x.avro"),
            ("memory:/", "memory:/lake/t/x%25.avro", "lake/t/x%25.avro"),
        ];
        for (root, location, path) in cases {
            assert_eq!(
                storage(root).path_of(location).unwrap().as_ref(),
                path,
                "{location}"
            );
        }
        let s3 = storage("s3://bucket/");
        let escaped = "s3://bucket/db/t/data/category=a+b%2Fc%25/f.parquet";
        assert_eq!(s3.location_of(&s3.path_of(escaped).unwrap()), escaped);
        let err = s3.path_of("s3://other/db/t/x.parquet").unwrap_err();
        assert!(
            err.to_string().contains("s3://other/db/t/x.parquet"),
            "{err}"
        );
        assert!(s3.path_of("/tmp/w/t/x.avro").is_err());
    }

    #[tokio::test]
    async fn what_is_written_through_it_is_read_back_and_deleted() {
        let s3 = storage("s3://bucket/");
        let io = s3.file_io();
        let out = io.new_output("s3://bucket/t/m.avro").unwrap();
        let mut writer = out.writer().await.unwrap();
        writer.write(Bytes::from_static(b"abc")).await.unwrap();
        writer.write(Bytes::from_static(b"def")).await.unwrap();
        writer.close().await.unwrap();
        let input = io.new_input("s3://bucket/t/m.avro").unwrap();
        assert_eq!(input.read().await.unwrap().as_ref(), b"abcdef");
        assert_eq!(input.metadata().await.unwrap().size, 6);
        assert_eq!(
            input
                .reader()
                .await
                .unwrap()
                .read(2..4)
                .await
                .unwrap()
                .as_ref(),
            b"cd"
        );
        io.delete_prefix("s3://bucket/t/").await.unwrap();
        assert!(!io.exists("s3://bucket/t/m.avro").await.unwrap());
    }
}
