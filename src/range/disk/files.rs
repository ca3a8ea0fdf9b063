//! The disk tier's files: the one directory it owns, how entries are named, written and
//! read, and what it will not touch.
//!
//! The tier lives in `<disk_dir>/lakecache-ranges/`, created private to the user (0700, files
//! 0600), with a `FORMAT` marker naming the layout. Any number of processes of the user open
//! it at once: each holds a shared advisory lock on its `LOCK` file (which refuses a process
//! of an earlier release, which held it alone), keeps the directory's size in `USAGE`
//! (`ledger.rs`) and claims the ranges it downloads in `CLAIMS` (`claims.rs`). Nothing outside
//! that directory is read, written or deleted; inside it, only names of its own layout are
//! (an object directory of 16 hex digits, an entry name, a temporary `w-*` file), and
//! symbolic links are never followed.
//!
//! Each entry is one file, `<object>/<object>-<version>-<start>-<len>.range`, written under a
//! random temporary name (created exclusively, not following links, locked while it is
//! written) and renamed into place, so a reader never sees a half-written entry. The name
//! lets any process find the entries of an object with one listing of its directory; the
//! header inside names the object version in full and carries a checksum of the bytes, so a
//! hash collision, a torn write or a flipped bit is a miss (and the file is deleted), never
//! wrong bytes. A file's modification time is when it was last read or written: the order
//! eviction follows, whichever process read it, and across restarts.
//!
//! Layout of an entry file: `LKRANGE1`, checksum (u64, XXH64 of the bytes), the length of the
//! version text (u32), the version text, start (u64), length (u64), then the bytes; integers
//! little-endian.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::ops::Range;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use twox_hash::XxHash64;

/// The directory the tier owns, below the configured one.
const ROOT: &str = "lakecache-ranges";
const MARKER: &str = "FORMAT";
const MARKER_TEXT: &str = "lakecache range cache, entry format LKRANGE1\n";
const LOCK: &str = "LOCK";
const TEMP_DIR: &str = "tmp";
const TEMP_PREFIX: &str = "w-";
const MAGIC: &[u8; 8] = b"LKRANGE1";
const SUFFIX: &str = ".range";
/// A read moves its entry up the eviction order only if its time is older than this: one
/// metadata write per entry and period, not per read.
const TOUCH_AFTER: Duration = Duration::from_secs(1);
/// A temporary file no process holds locked and older than this was left by a process that
/// died mid-write.
const ABANDONED_AFTER: Duration = Duration::from_secs(60);

/// Where one entry lives: hashes of its object and version, and its range's start.
/// Ordered by object, then version, then start (the order of the fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct EntryId {
    pub object: u64,
    pub version: u64,
    pub start: u64,
}

/// What reading an entry file found.
pub(super) enum EntryRead {
    /// The file's bytes, of the length its entry has.
    Found(Vec<u8>),
    /// No file: deleted meanwhile (replaced by a longer range, evicted, or by hand).
    Missing,
    /// A file that cannot be the entry: of another length, or unreadable.
    Bad,
}

/// An entry file found by a walk of the tier.
pub(super) struct Found {
    pub id: EntryId,
    pub len: u64,
    pub file_bytes: u64,
    pub used: SystemTime,
}

/// An entry's bytes written to a temporary file, not yet in place. Locked while it lives, so
/// that a walk of another process leaves it alone; removed if dropped before being placed.
pub(super) struct Temp {
    path: PathBuf,
    _file: File,
    pub bytes: u64,
}

impl Temp {
    #[cfg(test)]
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        // After a rename this name is gone already, and removing it fails harmlessly.
        let _ = fs::remove_file(&self.path);
    }
}

/// The tier's own directory, open in this process (and perhaps in others).
#[derive(Debug)]
pub(super) struct TierDir {
    root: PathBuf,
    /// Holds the shared advisory lock while the tier is open.
    _lock: File,
    next_temp: AtomicU64,
}

impl TierDir {
    /// Opens (creating if needed) the tier below `dir`; refuses a directory that is not one
    /// of its own, or that a process of an earlier release (which held it alone) has open.
    pub(super) fn open(dir: &Path) -> io::Result<Self> {
        let root = dir.join(ROOT);
        private_dir(&root)?;
        let marker = root.join(MARKER);
        match read_no_follow(&marker) {
            Ok(text) if text == MARKER_TEXT.as_bytes() => {}
            Ok(_) => {
                return Err(refused(
                    &root,
                    "it holds another layout (see its FORMAT file)",
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Names of the layout are another process's, opening it at the same moment.
                let foreign = fs::read_dir(&root)?
                    .flatten()
                    .any(|e| !is_own_name(&e.file_name().to_string_lossy()));
                if foreign {
                    return Err(refused(
                        &root,
                        "it has files but no FORMAT marker of this cache",
                    ));
                }
                // Written whole under a name of its own, then renamed: a process opening it at
                // the same moment reads the whole text or none (and writes the same).
                let nonce = XxHash64::oneshot(0, format!("{:?}", SystemTime::now()).as_bytes());
                let temp = root.join(format!("{MARKER}.{}-{nonce:016x}", std::process::id()));
                write_new(&temp, MARKER_TEXT.as_bytes())?;
                fs::rename(&temp, &marker)?;
            }
            Err(e) => return Err(e),
        }
        let lock = open_private(&root.join(LOCK))?;
        if !flock(&lock, libc::LOCK_SH | libc::LOCK_NB) {
            return Err(refused(
                &root,
                "a process of an earlier release of lakecache, which cannot share it, has it open",
            ));
        }
        private_dir(&root.join(TEMP_DIR))?;
        Ok(Self {
            root,
            _lock: lock,
            next_temp: AtomicU64::new(0),
        })
    }

    /// The tier's directory.
    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// A file of the tier's own (`USAGE`, `CLAIMS`), opened for reading and writing.
    pub(super) fn own_file(&self, name: &str) -> io::Result<File> {
        open_private(&self.root.join(name))
    }

    /// The entry files of one object, any version: `(entry, bytes held)`. An object no
    /// process holds anything of has no directory, and lists as nothing.
    pub(super) fn entries_of(&self, object: u64) -> Vec<(EntryId, u64)> {
        let name = format!("{object:016x}");
        let Ok(files) = fs::read_dir(self.root.join(&name)) else {
            return Vec::new();
        };
        files
            .flatten()
            .filter_map(|file| {
                let file_name = file.file_name().to_string_lossy().into_owned();
                let (id, len) = parse_name(&file_name)?;
                // Only the one name the tier would give this entry, in its object's directory:
                // any other spelling (upper-case hex, leading zeros, a `+`, another object's
                // directory) is a file the tier would never read nor delete.
                let ours = id.object == object && entry_name(id, len) == file_name;
                (ours && file.file_type().is_ok_and(|t| t.is_file())).then_some((id, len))
            })
            .collect()
    }

    /// Whether any entry of `object` may be on disk (its directory is there).
    pub(super) fn has_object(&self, object: u64) -> bool {
        fs::symlink_metadata(self.root.join(format!("{object:016x}"))).is_ok_and(|m| m.is_dir())
    }

    /// Every entry file the tier holds, with its size and time of last use. Files that vanish
    /// or are not of the tier's layout are passed over.
    pub(super) fn walk(&self) -> io::Result<Vec<Found>> {
        let mut found = Vec::new();
        for sub in fs::read_dir(&self.root)?.flatten() {
            let is_dir = sub.file_type().is_ok_and(|t| t.is_dir());
            let name = sub.file_name().to_string_lossy().into_owned();
            if !is_dir || !is_object_dir(&name) {
                continue;
            }
            let Ok(object) = u64::from_str_radix(&name, 16) else {
                continue;
            };
            if object_dir_name(object) != name {
                continue;
            }
            for (id, len) in self.entries_of(object) {
                // Not `metadata()`: it follows links, and a file may vanish meanwhile.
                let Ok(meta) = fs::symlink_metadata(self.entry_path(id, len)) else {
                    continue;
                };
                if meta.is_file() {
                    found.push(Found {
                        id,
                        len,
                        file_bytes: meta.len(),
                        used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    });
                }
            }
        }
        Ok(found)
    }

    /// Removes the temporary files of writes that will never finish: no process holds them
    /// locked (a process that dies loses its locks) and they are older than a write takes.
    pub(super) fn sweep_temps(&self) {
        let Ok(temps) = fs::read_dir(self.root.join(TEMP_DIR)) else {
            return;
        };
        let now = SystemTime::now();
        for temp in temps.flatten() {
            let name = temp.file_name();
            let ours = name.to_string_lossy().starts_with(TEMP_PREFIX);
            let Ok(meta) = fs::symlink_metadata(temp.path()) else {
                continue;
            };
            let old = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .is_some_and(|age| age > ABANDONED_AFTER);
            if !ours || !meta.is_file() || !old {
                continue;
            }
            let Ok(file) = open_no_follow(&temp.path()) else {
                continue;
            };
            if flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                let _ = fs::remove_file(temp.path());
            }
        }
    }

    /// The file of entry `id` holding `len` bytes.
    pub(super) fn entry_path(&self, id: EntryId, len: u64) -> PathBuf {
        self.root.join(object_dir(id)).join(entry_name(id, len))
    }

    /// Writes `encoded` to a new temporary file, locked until it is placed or dropped.
    pub(super) fn write_temp(&self, encoded: &[u8]) -> io::Result<Temp> {
        let n = self.next_temp.fetch_add(1, Relaxed);
        let nonce = XxHash64::oneshot(n, format!("{:?}", SystemTime::now()).as_bytes());
        let path = self.root.join(TEMP_DIR).join(format!(
            "{TEMP_PREFIX}{}-{n}-{nonce:016x}",
            std::process::id()
        ));
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)?;
        let temp = Temp {
            path,
            bytes: encoded.len() as u64,
            _file: file.try_clone()?,
        };
        flock(&temp._file, libc::LOCK_EX | libc::LOCK_NB);
        file.write_all(encoded)?;
        Ok(temp)
    }

    /// Renames `temp` into place as the file of entry `id` (`len` bytes of data), replacing
    /// any file of that name. Returns the size of the file replaced, if there was one.
    pub(super) fn place(&self, temp: Temp, id: EntryId, len: u64) -> io::Result<Option<u64>> {
        let path = self.entry_path(id, len);
        if let Some(parent) = path.parent() {
            private_dir(parent)?;
        }
        let replaced = fs::symlink_metadata(&path).ok().map(|m| m.len());
        match fs::rename(&temp.path, &path) {
            // The object's directory went with its last entry meanwhile: made again.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                path.parent().map_or(Ok(()), private_dir)?;
                fs::rename(&temp.path, &path)?;
            }
            other => other?,
        }
        Ok(replaced)
    }

    /// The raw bytes of an entry file (not following links), if it is there and exactly
    /// `file_bytes` long: a file of another length is not read into memory at all. A file
    /// found moves up the eviction order (its time is set to now, at most every
    /// [`TOUCH_AFTER`]).
    pub(super) fn read(&self, id: EntryId, len: u64, file_bytes: u64) -> EntryRead {
        match read_exactly(&self.entry_path(id, len), file_bytes) {
            Ok(Some(raw)) => EntryRead::Found(raw),
            Ok(None) => EntryRead::Bad,
            Err(e) if e.kind() == io::ErrorKind::NotFound => EntryRead::Missing,
            Err(_) => EntryRead::Bad,
        }
    }

    /// Deletes an entry file (a link in its place is removed, not followed); returns the
    /// bytes it held on disk, if it was there.
    pub(super) fn remove(&self, id: EntryId, len: u64) -> Option<u64> {
        let path = self.entry_path(id, len);
        let size = fs::symlink_metadata(&path).ok()?.len();
        fs::remove_file(&path).ok().map(|()| size)
    }

    /// Deletes the directory of `object` if it is empty (`remove_dir` refuses a directory
    /// that still holds anything, a file of another program's included).
    pub(super) fn remove_object_dir(&self, object: u64) {
        let _ = fs::remove_dir(self.root.join(object_dir_name(object)));
    }
}

/// Takes or releases an advisory lock (`flock`) on `file`; whether it succeeded.
pub(super) fn flock(file: &File, operation: libc::c_int) -> bool {
    // SAFETY: flock only reads the descriptor, which `file` keeps open.
    unsafe { libc::flock(file.as_raw_fd(), operation) == 0 }
}

/// Opens (creating if needed, 0600, not following links) a file for reading and writing.
fn open_private(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

fn refused(root: &Path, why: &str) -> io::Error {
    io::Error::other(format!(
        "{} is not usable as a disk tier: {why}",
        root.display()
    ))
}

/// Creates `dir` (0700) if missing, and checks it is a directory, not a link to one.
fn private_dir(dir: &Path) -> io::Result<()> {
    match DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory (a link or a file)",
            dir.display()
        )));
    }
    Ok(())
}

/// Creates `path` (0600), failing if anything is there already, link or file.
fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(bytes)
}

fn read_no_follow(path: &Path) -> io::Result<Vec<u8>> {
    let mut raw = Vec::new();
    open_no_follow(path)?
        .take(MARKER_TEXT.len() as u64 + 1)
        .read_to_end(&mut raw)?;
    Ok(raw)
}

/// The contents of `path` if it is `len` bytes long (`None` if it is not; nothing more is
/// read than that).
fn read_exactly(path: &Path, len: u64) -> io::Result<Option<Vec<u8>>> {
    let file = open_no_follow(path)?;
    let meta = file.metadata()?;
    if meta.len() != len {
        return Ok(None);
    }
    let now = SystemTime::now();
    let stale = meta
        .modified()
        .ok()
        .and_then(|m| now.duration_since(m).ok())
        .is_some_and(|age| age > TOUCH_AFTER);
    if stale {
        // The order of use, for every process and the next one: best effort.
        let _ = file.set_modified(now);
    }
    let mut raw = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(len + 1).read_to_end(&mut raw)?;
    Ok((raw.len() as u64 == len).then_some(raw))
}

fn open_no_follow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// The directory of entry `id`'s object.
fn object_dir(id: EntryId) -> String {
    object_dir_name(id.object)
}

fn object_dir_name(object: u64) -> String {
    format!("{object:016x}")
}

/// The file name of entry `id` holding `len` bytes: the only spelling the tier reads.
fn entry_name(id: EntryId, len: u64) -> String {
    format!(
        "{:016x}-{:016x}-{}-{}{SUFFIX}",
        id.object, id.version, id.start, len
    )
}

/// Whether `name`, in the tier's directory, is one the layout gives.
fn is_own_name(name: &str) -> bool {
    [MARKER, LOCK, TEMP_DIR, "USAGE", "CLAIMS"].contains(&name)
        || name.starts_with(&format!("{MARKER}."))
        || is_object_dir(name)
}

fn is_object_dir(name: &str) -> bool {
    name.len() == 16 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The entry a file name names, if it is one of the tier's and its range is sane.
pub(super) fn parse_name(name: &str) -> Option<(EntryId, u64)> {
    let stem = name.strip_suffix(SUFFIX)?;
    let mut parts = stem.split('-');
    let object = u64::from_str_radix(parts.next()?, 16).ok()?;
    let version = u64::from_str_radix(parts.next()?, 16).ok()?;
    let start: u64 = parts.next()?.parse().ok()?;
    let len: u64 = parts.next()?.parse().ok()?;
    if parts.next().is_some() || len == 0 || start.checked_add(len).is_none() {
        return None;
    }
    let id = EntryId {
        object,
        version,
        start,
    };
    Some((id, len))
}

/// The length of the file holding `len` bytes of a version named by `version`.
pub(super) fn encoded_len(version: &str, len: u64) -> u64 {
    HEADER_BYTES + version.len() as u64 + len
}

/// Bytes of an entry file's header besides the version text.
const HEADER_BYTES: u64 = 36;

/// An entry file's contents: header and bytes.
pub(super) fn encode(version: &str, start: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(version, bytes.len() as u64) as usize);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&XxHash64::oneshot(0, bytes).to_le_bytes());
    out.extend_from_slice(&(version.len() as u32).to_le_bytes());
    out.extend_from_slice(version.as_bytes());
    out.extend_from_slice(&start.to_le_bytes());
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
    out
}

/// The bytes of an entry file if it is whole, names `version` and `range`, and its bytes
/// match their checksum.
pub(super) fn decode(raw: Vec<u8>, version: &str, range: Range<u64>) -> Option<Bytes> {
    fn take<'a>(raw: &'a [u8], at: &mut usize, n: usize) -> Option<&'a [u8]> {
        let field = raw.get(*at..at.checked_add(n)?)?;
        *at += n;
        Some(field)
    }
    let u64_at = |raw: &[u8], at: &mut usize| {
        take(raw, at, 8).and_then(|b| b.try_into().ok().map(u64::from_le_bytes))
    };
    let mut at = 0;
    if take(&raw, &mut at, 8)? != MAGIC {
        return None;
    }
    let checksum = u64_at(&raw, &mut at)?;
    let name_len = u32::from_le_bytes(take(&raw, &mut at, 4)?.try_into().ok()?) as usize;
    if take(&raw, &mut at, name_len)? != version.as_bytes() {
        return None;
    }
    let start = u64_at(&raw, &mut at)?;
    let len = u64_at(&raw, &mut at)?;
    if start != range.start || start.checked_add(len)? != range.end {
        return None;
    }
    if (raw.len() - at) as u64 != len || XxHash64::oneshot(0, &raw[at..]) != checksum {
        return None;
    }
    Some(Bytes::from(raw).slice(at..))
}
