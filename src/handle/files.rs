//! Open local file descriptors kept for reuse, read with positional reads.
//!
//! `LocalFileSystem` opens, reads and closes a file for every range request. Here a descriptor
//! stays open while the file is in use, and each read is one `pread` with no seek. Before a
//! cached descriptor is used, one `stat` checks that the path still names the same, unchanged
//! file; if not, the descriptor is closed and the path opened anew.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use moka::notification::RemovalCause;
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
    /// Set once its metadata has been handed to the handle cache.
    recorded: AtomicBool,
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
            recorded: AtomicBool::new(false),
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

    /// True the first time it is asked, false after: a reused descriptor's metadata was
    /// recorded when it was opened and cannot have changed since (`open` checks that), so
    /// reads need not build and record it again.
    pub(crate) fn first_use(&self) -> bool {
        !self.recorded.swap(true, Relaxed)
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

/// The descriptor cache: at most `min(max_open_files, ulimit -n / 2)` files, evicted least
/// recently used first, and after the handle TTL or idle timeout.
///
/// Written out rather than built on moka: moka drops removed values during later
/// housekeeping, which runs on a time budget, so under load a removed descriptor could stay
/// open for a while. Descriptors are a hard OS limit; here a removed one is closed at once
/// (or when the last read still using it ends).
#[derive(Debug)]
pub(crate) struct OpenFiles {
    slots: Option<Mutex<Slots>>,
    capacity: usize,
    ttl: Option<Duration>,
    idle: Option<Duration>,
    counters: CacheCounters,
    open_now: Arc<AtomicU64>,
}

#[derive(Debug, Default)]
struct Slots {
    map: HashMap<PathBuf, Slot>,
    tick: u64,
}

#[derive(Debug)]
struct Slot {
    file: Arc<OpenFile>,
    opened: Instant,
    used: Instant,
    tick: u64,
}

impl OpenFiles {
    pub(crate) fn new(config: &HandleConfig) -> Self {
        let capacity = match config.enabled {
            true => config.max_open_files.min(max_open_files_allowed()),
            false => 0,
        };
        Self {
            slots: (capacity > 0).then(Mutex::default),
            capacity,
            ttl: (!config.ttl.is_zero()).then_some(config.ttl),
            idle: config.idle_timeout,
            counters: CacheCounters::default(),
            open_now: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Whether descriptors are cached at all.
    pub(crate) fn enabled(&self) -> bool {
        self.slots.is_some()
    }

    fn expired(&self, slot: &Slot, now: Instant) -> bool {
        self.ttl
            .is_some_and(|ttl| now.duration_since(slot.opened) >= ttl)
            || self
                .idle
                .is_some_and(|idle| now.duration_since(slot.used) >= idle)
    }

    fn lock(slots: &Mutex<Slots>) -> std::sync::MutexGuard<'_, Slots> {
        // A panic while holding the lock leaves the map consistent; keep using it.
        slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// An open, current descriptor for `path`: the cached one if the path still names the
    /// same unchanged file, else a newly opened one (kept for next time).
    pub(crate) fn open(&self, path: &FsPath) -> io::Result<Arc<OpenFile>> {
        let Some(slots) = &self.slots else {
            return OpenFile::open(path, &self.open_now).map(Arc::new);
        };
        let now = Instant::now();
        let cached = {
            let mut s = Self::lock(slots);
            s.tick += 1;
            let tick = s.tick;
            match s.map.get_mut(path) {
                Some(slot) if self.expired(slot, now) => {
                    s.map.remove(path);
                    self.counters.removed(RemovalCause::Expired);
                    None
                }
                Some(slot) => {
                    slot.used = now;
                    slot.tick = tick;
                    Some(Arc::clone(&slot.file))
                }
                None => None,
            }
        };
        if let Some(file) = cached {
            if file.is_current(path) {
                self.counters.hit();
                return Ok(file);
            }
            self.invalidate(path);
        }
        self.counters.miss();
        let file = Arc::new(OpenFile::open(path, &self.open_now)?);
        let mut s = Self::lock(slots);
        if !s.map.contains_key(path) && s.map.len() >= self.capacity {
            self.make_room(&mut s, now);
        }
        s.tick += 1;
        let tick = s.tick;
        let slot = Slot {
            file: Arc::clone(&file),
            opened: now,
            used: now,
            tick,
        };
        if s.map.insert(path.to_path_buf(), slot).is_some() {
            // Another reader opened it meanwhile; the newer descriptor replaces it.
            self.counters.removed(RemovalCause::Replaced);
        }
        Ok(file)
    }

    /// Drops expired descriptors, then the least recently used one if still full.
    fn make_room(&self, s: &mut Slots, now: Instant) {
        let before = s.map.len();
        s.map.retain(|_, slot| !self.expired(slot, now));
        for _ in s.map.len()..before {
            self.counters.removed(RemovalCause::Expired);
        }
        if s.map.len() >= self.capacity
            && let Some(oldest) = s
                .map
                .iter()
                .min_by_key(|(_, slot)| slot.tick)
                .map(|(p, _)| p.clone())
        {
            s.map.remove(&oldest);
            self.counters.removed(RemovalCause::Size);
        }
    }

    /// Closes the cached descriptor of `path`, if any.
    pub(crate) fn invalidate(&self, path: &FsPath) {
        if let Some(slots) = &self.slots
            && Self::lock(slots).map.remove(path).is_some()
        {
            self.counters.removed(RemovalCause::Explicit);
        }
    }

    pub(crate) fn clear(&self) {
        if let Some(slots) = &self.slots {
            let removed = std::mem::take(&mut Self::lock(slots).map);
            for _ in 0..removed.len() {
                self.counters.removed(RemovalCause::Explicit);
            }
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let entries = self.slots.as_ref().map_or(0, |s| Self::lock(s).map.len());
        self.counters.snapshot(entries as u64)
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
    fn the_least_recently_used_descriptor_goes_first_and_closes_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let files = OpenFiles::new(&config(2));
        let p: Vec<_> = (0..3)
            .map(|i| {
                let p = dir.path().join(format!("f{i}"));
                std::fs::write(&p, b"x").unwrap();
                p
            })
            .collect();
        drop(files.open(&p[0]).unwrap());
        drop(files.open(&p[1]).unwrap());
        drop(files.open(&p[0]).unwrap()); // p[1] is now the least recently used
        drop(files.open(&p[2]).unwrap());
        assert_eq!(files.open_now(), 2, "the evicted descriptor is closed");
        let before = files.stats();
        drop(files.open(&p[0]).unwrap());
        assert_eq!(files.stats().hits, before.hits + 1, "p[0] stayed");
        assert_eq!(before.evictions, 1);
    }

    #[test]
    fn descriptors_expire_after_the_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        let files = OpenFiles::new(&HandleConfig {
            ttl: Duration::from_millis(30),
            ..config(4)
        });
        drop(files.open(&p).unwrap());
        std::thread::sleep(Duration::from_millis(60));
        drop(files.open(&p).unwrap());
        let stats = files.stats();
        assert_eq!((stats.hits, stats.misses, stats.expirations), (0, 2, 1));
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
