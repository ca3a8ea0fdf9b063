//! [`CloudMetadata`]: a store that reports object metadata the way a cloud store does, for
//! tests of the rules that compare versions: GCS (and versioned S3 or Azure buckets) put a
//! version on GET and HEAD responses but not in listings; S3 gives modification times to the
//! second.

use std::fmt;
use std::ops::Range;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, RenameOptions, Result,
};

/// Wraps a store and reshapes the metadata it reports.
///
/// ```
/// # use object_store::{ObjectStoreExt, PutPayload, memory::InMemory, path::Path};
/// # use datafusion_lakecache::testkit::CloudMetadata;
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> object_store::Result<()> {
/// let store = CloudMetadata::gcs(InMemory::new());
/// store.put(&Path::from("a"), PutPayload::from_static(b"x")).await?;
/// assert!(store.head(&Path::from("a")).await?.version.is_some());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct CloudMetadata<S> {
    inner: S,
    /// GET and HEAD responses carry a version: the modification time in nanoseconds, which
    /// changes with every write.
    versions_on_reads: bool,
    /// Modification times are cut to the second everywhere.
    whole_seconds: bool,
}

impl<S: ObjectStore> CloudMetadata<S> {
    /// As GCS reports: a version (generation) on GET and HEAD responses, none in listings.
    pub fn gcs(inner: S) -> Self {
        Self {
            inner,
            versions_on_reads: true,
            whole_seconds: false,
        }
    }

    /// As S3 reports: modification times to the second.
    pub fn s3(inner: S) -> Self {
        Self {
            inner,
            versions_on_reads: false,
            whole_seconds: true,
        }
    }

    fn shape(&self, meta: &mut ObjectMeta, read: bool) {
        if read && self.versions_on_reads {
            let generation = meta.last_modified.timestamp_nanos_opt().unwrap_or(0);
            meta.version = Some(generation.to_string());
        }
        if self.whole_seconds {
            meta.last_modified = seconds(meta.last_modified);
        }
    }

    fn shape_listing(
        &self,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        if !self.whole_seconds {
            return listing;
        }
        listing
            .map(|m| {
                m.map(|mut m| {
                    m.last_modified = seconds(m.last_modified);
                    m
                })
            })
            .boxed()
    }
}

fn seconds(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

impl<S: ObjectStore> fmt::Display for CloudMetadata<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CloudMetadata({})", self.inner)
    }
}

#[async_trait]
#[deny(clippy::missing_trait_methods)]
impl<S: ObjectStore> ObjectStore for CloudMetadata<S> {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let mut result = self.inner.get_opts(location, options).await?;
        self.shape(&mut result.meta, true);
        Ok(result)
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        super::get_ranges_per_request(self, location, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.shape_listing(self.inner.list(prefix))
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        self.shape_listing(self.inner.list_with_offset(prefix, offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let mut result = self.inner.list_with_delimiter(prefix).await?;
        for meta in &mut result.objects {
            self.shape(meta, false);
        }
        Ok(result)
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }

    async fn rename_opts(&self, from: &Path, to: &Path, options: RenameOptions) -> Result<()> {
        self.inner.rename_opts(from, to, options).await
    }
}
