//! Open local file descriptors kept for reuse, read with positional reads.
//!
//! `LocalFileSystem` opens, reads and closes a file for every range request. Here a descriptor
//! stays open while the file is in use, and each read is one `pread` with no seek. Before a
//! cached descriptor is used, one `stat` checks that the path still names the same, unchanged
//! file; if not, the descriptor is closed and the path opened anew.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::SystemTime;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use moka::sync::Cache;
use object_store::ObjectMeta;
use object_store::path::Path;

use crate::config::HandleConfig;
use crate::stats::{CacheCounters, CacheStats};

/// The most descriptors the cache may hold in this process: half the soft `ulimit -n`, so
/// the rest of the process (sockets, spill files, other readers) keeps room.
pub fn max_open_files_allowed() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return 1 << 20;
    }
    usize::try_from(limit.rlim_cur / 2).unwrap_or(usize::MAX)
}

/// One open file and the identity it had when opened.
#[derive(Debug)]
pub(crate) struct OpenFile {
    file: File,
    ino: u64,
    size: u64,
    modified: SystemTime,
    open_now: Arc<AtomicU64>,
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        self.open_now.fetch_sub(1, Relaxed);
    }
}

impl OpenFile {
    fn open(path: &FsPath, open_now: &Arc<AtomicU64>) -> io::Result<Self> {
        let file = File::open(path)?;
        let m = file.metadata()?;
        if m.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{} is a directory", path.display()),
            ));
        }
        open_now.fetch_add(1, Relaxed);
        Ok(Self {
            file,
            ino: m.ino(),
            size: m.len(),
            modified: m.modified()?,
            open_now: Arc::clone(open_now),
        })
    }

    /// Whether the path still names the file this descriptor was opened on, unchanged.
    fn is_current(&self, path: &FsPath) -> bool {
        // One stat of the path: a deleted file fails it, a renamed-over one has another inode,
        // and one rewritten in place has another size or modification time.
        let Ok(now) = std::fs::metadata(path) else {
            return false;
        };
        now.ino() == self.ino
            && now.len() == self.size
            && now.modified().ok() == Some(self.modified)
    }

    /// Object metadata in the form `LocalFileSystem` reports it, e_tag included, so versions
    /// seen here and in listings compare equal.
    pub(crate) fn meta(&self, location: &Path) -> ObjectMeta {
        let micros = self
            .modified
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros();
        ObjectMeta {
            location: location.clone(),
            last_modified: DateTime::<Utc>::from(self.modified),
            size: self.size,
            e_tag: Some(format!("{:x}-{:x}-{:x}", self.ino, micros, self.size)),
            version: None,
        }
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Reads one range with a positional read.
    pub(crate) fn read(&self, path: &FsPath, range: Range<u64>) -> io::Result<Bytes> {
        if range.start > range.end || range.end > self.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "range {}..{} is outside {} ({} bytes)",
                    range.start,
                    range.end,
                    path.display(),
                    self.size
                ),
            ));
        }
        let len = usize::try_from(range.end - range.start)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "range too large"))?;
        let mut buf = vec![0; len];
        self.file.read_exact_at(&mut buf, range.start)?;
        Ok(buf.into())
    }
}

/// The descriptor cache: at most `min(max_open_files, ulimit -n / 2)` files, evicted by
/// capacity, TTL and idle timeout like the rest of the handle cache.
#[derive(Debug)]
pub(crate) struct OpenFiles {
    cache: Option<Cache<PathBuf, Arc<OpenFile>>>,
    counters: Arc<CacheCounters>,
    open_now: Arc<AtomicU64>,
}

impl OpenFiles {
    pub(crate) fn new(config: &HandleConfig) -> Self {
        let capacity = config.max_open_files.min(max_open_files_allowed()) as u64;
        let counters = Arc::new(CacheCounters::default());
        let cache = (capacity > 0).then(|| {
            let c = Arc::clone(&counters);
            super::with_expiry(
                Cache::builder().max_capacity(capacity),
                config.ttl,
                config.idle_timeout,
            )
            .eviction_listener(move |_, _, cause| c.removed(cause))
            .build()
        });
        Self {
            cache,
            counters,
            open_now: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Whether descriptors are cached at all.
    pub(crate) fn enabled(&self) -> bool {
        self.cache.is_some()
    }

    /// An open, current descriptor for `path`: the cached one if the path still names the
    /// same unchanged file, else a newly opened one (kept for next time if there is room).
    pub(crate) fn open(&self, path: &FsPath) -> io::Result<Arc<OpenFile>> {
        let Some(cache) = &self.cache else {
            return OpenFile::open(path, &self.open_now).map(Arc::new);
        };
        if let Some(file) = cache.get(path) {
            if file.is_current(path) {
                self.counters.hit();
                return Ok(file);
            }
            cache.invalidate(path);
        }
        self.counters.miss();
        let file = Arc::new(OpenFile::open(path, &self.open_now)?);
        cache.insert(path.to_path_buf(), Arc::clone(&file));
        // moka applies inserts and evictions lazily, holding the values meanwhile; descriptors
        // are a hard OS limit, so settle the bound now. Opens are rare next to reads.
        cache.run_pending_tasks();
        Ok(file)
    }

    /// Closes the cached descriptor of `path`, if any.
    pub(crate) fn invalidate(&self, path: &FsPath) {
        if let Some(cache) = &self.cache {
            cache.invalidate(path);
        }
    }

    pub(crate) fn clear(&self) {
        if let Some(cache) = &self.cache {
            cache.invalidate_all();
            cache.run_pending_tasks();
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let entries = self.cache.as_ref().map_or(0, |c| {
            c.run_pending_tasks();
            c.entry_count()
        });
        self.counters.snapshot(entries)
    }

    pub(crate) fn open_now(&self) -> u64 {
        self.open_now.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_open_files: usize) -> HandleConfig {
        HandleConfig {
            max_open_files,
            ..HandleConfig::default()
        }
    }

    #[test]
    fn descriptors_are_reused_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let files = OpenFiles::new(&config(4));
        let paths: Vec<_> = (0..20)
            .map(|i| {
                let p = dir.path().join(format!("f{i}"));
                std::fs::write(&p, vec![i as u8; 100]).unwrap();
                p
            })
            .collect();
        for _ in 0..3 {
            for p in &paths {
                let f = files.open(p).unwrap();
                assert_eq!(f.read(p, 10..20).unwrap().len(), 10);
            }
        }
        let stats = files.stats();
        assert!(stats.entries <= 4, "{stats:?}");
        assert!(files.open_now() <= 4, "open now {}", files.open_now());
        assert!(stats.hits + stats.misses == 60);
    }

    #[test]
    fn replaced_and_deleted_files_are_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"first version").unwrap();
        let files = OpenFiles::new(&config(8));
        let first = files.open(&p).unwrap();
        assert_eq!(&first.read(&p, 0..5).unwrap()[..], b"first");
        drop(first);

        // Replace by rename, as writers of immutable files do.
        let tmp = dir.path().join("f.tmp");
        std::fs::write(&tmp, b"second").unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        let second = files.open(&p).unwrap();
        assert_eq!(&second.read(&p, 0..6).unwrap()[..], b"second");
        drop(second);

        std::fs::remove_file(&p).unwrap();
        let err = files.open(&p).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        files.clear();
        assert_eq!(files.open_now(), 0, "every descriptor closed");
    }

    #[test]
    fn reads_past_the_end_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        let files = OpenFiles::new(&config(8));
        let err = files.open(&p).unwrap().read(&p, 5..11).unwrap_err();
        assert!(err.to_string().contains("outside"), "{err}");
    }
}
