//! The versioned read over local files: positional reads on cached descriptors.
//!
//! `LocalFileSystem` opens, reads and closes a file for every range request; here the
//! descriptor cache (`crate::handle`) keeps it open, and one `stat` before each use checks
//! that the path still names the same unchanged file. A version is checked against the
//! descriptor's identity (inode, modification time and size, as `LocalFileSystem` builds its
//! e_tags), so a file replaced since planning is a changed version, as a remote object would
//! be.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{Error, ObjectMeta, Result};

use super::StoreReads;
use crate::handle::OpenFile;
use crate::object::{ObjectVersion, version_changed};

impl StoreReads {
    /// Reads the ranges `ranges` picks (from the file's size) of the local file `file` behind
    /// `location`, through a cached descriptor; with `version`, only if the file is still at
    /// that version. Returns the file's metadata and the bytes.
    pub(super) async fn read_local(
        &self,
        location: &Path,
        file: PathBuf,
        version: Option<&ObjectVersion>,
        ranges: impl FnOnce(u64) -> Result<Vec<Range<u64>>> + Send + 'static,
    ) -> Result<(ObjectMeta, Vec<Bytes>)> {
        let handles = self.caches().handles.clone();
        let since = self.now();
        let loc = location.clone();
        let version = version.cloned();
        let read = tokio::task::spawn_blocking(move || {
            let open: Arc<OpenFile> = handles
                .files()
                .open(&file)
                .map_err(|e| io_error(e, &loc, &file))?;
            let meta = open.meta(&loc);
            if let Some(v) = &version
                && !v.matches(&meta)
            {
                return Err(version_changed(v, Some(&meta)));
            }
            let ranges = ranges(open.size())?;
            let bytes = ranges
                .iter()
                .map(|r| {
                    open.read(&file, r.clone())
                        .map_err(|e| io_error(e, &loc, &file))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((open, meta, bytes))
        })
        .await
        .map_err(|source| Error::JoinError { source })?;
        match read {
            Ok((open, meta, bytes)) => {
                // A reused descriptor's metadata was recorded when it was opened and cannot
                // have changed since (`open` checks that).
                if open.first_use() {
                    self.observe(&meta, since);
                }
                Ok((meta, bytes))
            }
            Err(e @ Error::NotFound { .. }) => {
                self.forget_object(location);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

fn io_error(e: std::io::Error, location: &Path, path: &std::path::Path) -> Error {
    match e.kind() {
        std::io::ErrorKind::NotFound => Error::NotFound {
            path: location.to_string(),
            source: Box::new(e),
        },
        _ => Error::Generic {
            store: "LocalFileSystem",
            source: format!("reading {}: {e}", path.display()).into(),
        },
    }
}
