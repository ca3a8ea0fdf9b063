//! [`DiskTier`]: ranges kept as files in a local directory, so a new process (or a memory
//! tier that let them go) reads them without a request.
//!
//! Each entry is one file, `<object>-<version>-<start>-<len>.range` under a subdirectory
//! named by the object's hash. The name lets a restarted process rebuild its index with one
//! directory walk, without opening a file; the header inside names the object version in full
//! and carries a checksum of the bytes, so a hash collision, a torn write or a flipped bit is
//! a miss (and the file is deleted), never wrong bytes.
//!
//! Layout of an entry file: `LKRANGE1`, checksum (u64, XXH64 of the bytes), the length of the
//! version text (u32), the version text, start (u64), length (u64), then the bytes; integers
//! little-endian. Files are written under a temporary name and renamed into place, so a
//! reader never sees a half-written entry.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use twox_hash::XxHash64;

use super::spans::{Piece, Spans};
use crate::object::{ObjectId, ObjectVersion};

const MAGIC: &[u8; 8] = b"LKRANGE1";
const SUFFIX: &str = "range";
const TEMP_DIR: &str = "tmp";

/// Where one entry lives: hashes of its object and version, and its range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct EntryId {
    object: u64,
    version: u64,
    start: u64,
}

#[derive(Debug)]
struct Entry {
    end: u64,
    /// Bytes on disk, header included.
    file_bytes: u64,
    /// Position in the eviction order; larger was used more recently.
    seq: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Held ranges per (object hash, version hash).
    spans: HashMap<(u64, u64), Spans>,
    entries: HashMap<EntryId, Entry>,
    /// Least recently used first.
    order: BTreeMap<u64, EntryId>,
    /// Entries per object hash, whatever the version.
    per_object: HashMap<u64, usize>,
    next_seq: u64,
    bytes: u64,
}

/// Figures of the disk tier.
#[derive(Debug, Default)]
pub(crate) struct DiskCounters {
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) write_errors: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) invalidations: AtomicU64,
    pub(crate) corrupt: AtomicU64,
}

/// Ranges on local disk, bounded in bytes (least recently used go first).
#[derive(Debug)]
pub(crate) struct DiskTier {
    dir: PathBuf,
    capacity: u64,
    state: Mutex<State>,
    pub(crate) counters: DiskCounters,
}

fn hash(text: &str) -> u64 {
    XxHash64::oneshot(0, text.as_bytes())
}

fn object_hash(id: &ObjectId) -> u64 {
    hash(&format!("{}\n{}", id.store, id.path))
}

fn ids(object: &ObjectVersion) -> (u64, u64) {
    (object_hash(object.id()), hash(&object.canonical()))
}

impl DiskTier {
    /// Opens (creating if needed) the tier in `dir`, indexing the entries a previous process
    /// left there and trimming them to `capacity`.
    pub(crate) fn open(dir: &Path, capacity: u64) -> io::Result<Self> {
        fs::create_dir_all(dir.join(TEMP_DIR))?;
        // Writes a previous process did not finish.
        for temp in fs::read_dir(dir.join(TEMP_DIR))? {
            let _ = fs::remove_file(temp?.path());
        }
        let mut found = Vec::new();
        for sub in fs::read_dir(dir)? {
            let sub = sub?;
            if !sub.file_type()?.is_dir() || sub.file_name() == TEMP_DIR {
                continue;
            }
            for file in fs::read_dir(sub.path())? {
                let file = file?;
                let Some((id, len)) = parse_name(&file.file_name().to_string_lossy()) else {
                    continue;
                };
                let meta = file.metadata()?;
                let used = meta.modified().ok();
                found.push((used, id, len, meta.len()));
            }
        }
        // Oldest first, so the order of the previous process is kept as well as it can be.
        found.sort_by_key(|(used, ..)| *used);
        let tier = Self {
            dir: dir.to_path_buf(),
            capacity,
            state: Mutex::new(State::default()),
            counters: DiskCounters::default(),
        };
        {
            let mut state = tier.lock();
            for (_, id, len, file_bytes) in found {
                tier.index(&mut state, id, id.start + len, file_bytes);
            }
            tier.trim(&mut state);
        }
        Ok(tier)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn file(&self, id: EntryId, len: u64) -> PathBuf {
        self.dir.join(format!("{:016x}", id.object)).join(format!(
            "{:016x}-{:016x}-{}-{}.{SUFFIX}",
            id.object, id.version, id.start, len
        ))
    }

    fn index(&self, state: &mut State, id: EntryId, end: u64, file_bytes: u64) {
        if state.entries.contains_key(&id) {
            self.forget(state, id);
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        state.order.insert(seq, id);
        state.bytes += file_bytes;
        *state.per_object.entry(id.object).or_default() += 1;
        state.entries.insert(
            id,
            Entry {
                end,
                file_bytes,
                seq,
            },
        );
        state
            .spans
            .entry((id.object, id.version))
            .or_default()
            .insert(id.start..end);
    }

    /// Forgets an entry and deletes its file.
    fn drop_entry(&self, state: &mut State, id: EntryId) {
        if let Some(entry) = self.forget(state, id) {
            let _ = fs::remove_file(self.file(id, entry.end - id.start));
        }
    }

    /// Forgets an entry, leaving its file.
    fn forget(&self, state: &mut State, id: EntryId) -> Option<Entry> {
        let entry = state.entries.remove(&id)?;
        state.order.remove(&entry.seq);
        state.bytes -= entry.file_bytes;
        if let Some(n) = state.per_object.get_mut(&id.object) {
            *n -= 1;
            if *n == 0 {
                state.per_object.remove(&id.object);
            }
        }
        let key = (id.object, id.version);
        if let Some(spans) = state.spans.get_mut(&key) {
            spans.remove(&(id.start..entry.end));
            if spans.is_empty() {
                state.spans.remove(&key);
            }
        }
        Some(entry)
    }

    /// Whether any version of object `id` has entries.
    pub(crate) fn holds(&self, id: &ObjectId) -> bool {
        self.lock().per_object.contains_key(&object_hash(id))
    }

    fn trim(&self, state: &mut State) {
        while state.bytes > self.capacity {
            let Some((_, &id)) = state.order.first_key_value() else {
                break;
            };
            self.drop_entry(state, id);
            self.counters.evictions.fetch_add(1, Relaxed);
        }
    }

    /// The ranges of `object` on disk.
    #[cfg(test)]
    fn spans(&self, object: &ObjectVersion) -> Option<Spans> {
        self.lock().spans.get(&ids(object)).cloned()
    }

    /// Each of `ranges` cut into pieces held on disk and gaps ([`Spans::cover`]); `None` if
    /// the disk holds nothing of `object`. Worked out under the lock, without copying the
    /// object's spans.
    pub(crate) fn cover(
        &self,
        object: &ObjectVersion,
        ranges: &[Range<u64>],
    ) -> Option<Vec<Vec<Piece>>> {
        let state = self.lock();
        let held = state.spans.get(&ids(object))?;
        Some(ranges.iter().map(|r| held.cover(r.clone())).collect())
    }

    /// Entries and bytes (headers included) on disk.
    pub(crate) fn size(&self) -> (u64, u64) {
        let state = self.lock();
        (state.entries.len() as u64, state.bytes)
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Reads the entry holding `held` of `object`, checking it names the same version and
    /// that its bytes match their checksum. A bad entry is deleted and counted, and reads as
    /// `None`, like a missing one. Blocking: call from a blocking thread.
    pub(crate) fn read(&self, object: &ObjectVersion, held: Range<u64>) -> Option<Bytes> {
        let (o, v) = ids(object);
        let id = EntryId {
            object: o,
            version: v,
            start: held.start,
        };
        let file = self.file(id, held.end - held.start);
        let checked = fs::read(&file)
            .ok()
            .and_then(|raw| decode(raw, &object.canonical(), held.clone()));
        let mut guard = self.lock();
        let state = &mut *guard;
        match checked {
            Some(bytes) => {
                if let Some(entry) = state.entries.get_mut(&id) {
                    let seq = state.next_seq;
                    state.order.remove(&entry.seq);
                    entry.seq = seq;
                    state.order.insert(seq, id);
                    state.next_seq += 1;
                }
                self.counters.hits.fetch_add(1, Relaxed);
                Some(bytes)
            }
            None => {
                if state.entries.contains_key(&id) {
                    self.counters.corrupt.fetch_add(1, Relaxed);
                    self.drop_entry(state, id);
                }
                self.counters.misses.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// Writes `bytes`, the range of `object` starting at `start`, unless an entry there holds
    /// at least as much. Blocking: call from a blocking thread.
    pub(crate) fn write(&self, object: &ObjectVersion, start: u64, bytes: &Bytes) {
        let (o, v) = ids(object);
        let id = EntryId {
            object: o,
            version: v,
            start,
        };
        let end = start + bytes.len() as u64;
        if self.lock().entries.get(&id).is_some_and(|e| e.end >= end) {
            return;
        }
        let encoded = encode(&object.canonical(), start, bytes);
        let file = self.file(id, bytes.len() as u64);
        let temp = self.dir.join(TEMP_DIR).join(format!(
            "{:016x}-{:016x}-{start}-{}",
            o,
            v,
            std::process::id()
        ));
        let written = file
            .parent()
            .map_or(Ok(()), fs::create_dir_all)
            .and_then(|()| fs::write(&temp, &encoded))
            .and_then(|()| fs::rename(&temp, &file));
        if written.is_err() {
            let _ = fs::remove_file(&temp);
            self.counters.write_errors.fetch_add(1, Relaxed);
            return;
        }
        self.counters.writes.fetch_add(1, Relaxed);
        let mut state = self.lock();
        self.index(&mut state, id, end, encoded.len() as u64);
        self.trim(&mut state);
    }

    /// Deletes every entry of one object, in every version.
    pub(crate) fn invalidate(&self, id: &ObjectId) {
        let object = object_hash(id);
        self.drop_matching(|e| e.object == object);
    }

    /// Deletes every entry of one version of an object.
    pub(crate) fn invalidate_version(&self, version: &ObjectVersion) {
        let (object, v) = ids(version);
        self.drop_matching(|e| e.object == object && e.version == v);
    }

    fn drop_matching(&self, which: impl Fn(&EntryId) -> bool) {
        let mut state = self.lock();
        let ids: Vec<EntryId> = state
            .entries
            .keys()
            .filter(|id| which(id))
            .copied()
            .collect();
        self.counters
            .invalidations
            .fetch_add(ids.len() as u64, Relaxed);
        for id in ids {
            self.drop_entry(&mut state, id);
        }
    }

    /// Deletes every entry.
    pub(crate) fn clear(&self) {
        let mut state = self.lock();
        let ids: Vec<EntryId> = state.entries.keys().copied().collect();
        self.counters
            .invalidations
            .fetch_add(ids.len() as u64, Relaxed);
        for id in ids {
            self.drop_entry(&mut state, id);
        }
    }
}

fn parse_name(name: &str) -> Option<(EntryId, u64)> {
    let stem = name.strip_suffix(SUFFIX)?.strip_suffix('.')?;
    let mut parts = stem.split('-');
    let object = u64::from_str_radix(parts.next()?, 16).ok()?;
    let version = u64::from_str_radix(parts.next()?, 16).ok()?;
    let start = parts.next()?.parse().ok()?;
    let len = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    let id = EntryId {
        object,
        version,
        start,
    };
    Some((id, len))
}

fn encode(version: &str, start: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(36 + version.len() + bytes.len());
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
fn decode(raw: Vec<u8>, version: &str, range: Range<u64>) -> Option<Bytes> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::ObjectMeta;

    fn version(path: &str, e_tag: &str) -> ObjectVersion {
        let meta = ObjectMeta {
            location: path.into(),
            last_modified: chrono::DateTime::UNIX_EPOCH,
            size: 1000,
            e_tag: Some(e_tag.into()),
            version: None,
        };
        let store = crate::object::StoreKey::of(&url::Url::parse("s3://bucket").unwrap());
        ObjectVersion::new(store, &meta)
    }

    #[test]
    fn entries_survive_a_restart_for_the_same_version_only() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = version("a.parquet", "1");
        {
            let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
            tier.write(&v1, 100, &Bytes::from_static(b"hello"));
        }
        let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
        assert!(tier.spans(&v1).unwrap().covers(100..105));
        assert_eq!(tier.read(&v1, 100..105).unwrap(), "hello");
        assert!(tier.spans(&version("a.parquet", "2")).is_none());
        assert!(tier.read(&version("a.parquet", "2"), 100..105).is_none());
    }

    #[test]
    fn a_corrupted_entry_is_a_miss_and_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = version("a.parquet", "1");
        let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
        tier.write(&v1, 0, &Bytes::from(vec![7u8; 4096]));
        let (o, v) = ids(&v1);
        let file = tier.file(
            EntryId {
                object: o,
                version: v,
                start: 0,
            },
            4096,
        );
        let mut raw = fs::read(&file).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        fs::write(&file, raw).unwrap();
        assert!(tier.read(&v1, 0..4096).is_none());
        assert_eq!(tier.counters.corrupt.load(Relaxed), 1);
        assert!(!file.exists());
        assert!(tier.spans(&v1).is_none());
    }

    #[test]
    fn the_least_recently_used_entries_go_when_over_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let tier = DiskTier::open(dir.path(), 10_000).unwrap();
        let v = version("a.parquet", "1");
        let chunk = Bytes::from(vec![1u8; 3000]);
        tier.write(&v, 0, &chunk);
        tier.write(&v, 3000, &chunk);
        assert!(tier.read(&v, 0..3000).is_some());
        tier.write(&v, 6000, &chunk);
        tier.write(&v, 9000, &chunk);
        let spans = tier.spans(&v).unwrap();
        assert!(spans.covers(0..3000), "read recently, kept");
        assert!(!spans.covers(3000..6000), "least recently used, evicted");
        assert!(tier.size().1 <= 10_000);
        assert!(tier.counters.evictions.load(Relaxed) >= 1);
    }
}
