//! [`DiskTier`]: ranges kept as files in a local directory, so a new process (or a memory
//! tier that let them go) reads them without a request. Which ranges it holds, their
//! eviction order (least recently used first) and its byte bound live here; the files
//! themselves, and what the tier may touch on disk, in `files.rs`.

mod files;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::ops::Range;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;
use twox_hash::XxHash64;

use super::spans::{Inserted, Piece, Spans};
use crate::object::{ObjectId, ObjectVersion};
use files::{EntryId, EntryRead, TierDir, decode, encode, encoded_len};

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
    /// Ordered by object, then version, then start: the entries of one object (or version)
    /// are one range of it, so forgetting an object does not look at every entry.
    entries: BTreeMap<EntryId, Entry>,
    /// Least recently used first.
    order: BTreeMap<u64, EntryId>,
    /// Entries per object hash, whatever the version.
    per_object: HashMap<u64, usize>,
    next_seq: u64,
    bytes: u64,
    /// Files of entries forgotten under the lock, deleted once it is released (by
    /// [`Locked`]'s drop), so that no reader waits for the file system's deletions.
    doomed: Vec<(EntryId, u64)>,
}

/// The tier's state, locked. Dropping it releases the lock, then deletes the files of the
/// entries forgotten meanwhile: a read that looks for one of them now finds it missing
/// (a miss), never other bytes, since a file's name holds its version's hash and its
/// contents are checked.
struct Locked<'a> {
    tier: &'a DiskTier,
    guard: Option<MutexGuard<'a, State>>,
}

impl Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.guard.as_mut().expect("held until dropped")
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        let doomed = std::mem::take(&mut guard.doomed);
        if doomed.is_empty() {
            return;
        }
        let emptied: Vec<EntryId> = doomed
            .iter()
            .filter(|(id, _)| !guard.per_object.contains_key(&id.object))
            .map(|(id, _)| *id)
            .collect();
        drop(guard);
        for (id, len) in doomed {
            self.tier.dir.remove(id, len);
        }
        // Only an empty directory is removed: one a write has put a file into since stays.
        for id in emptied {
            self.tier.dir.remove_object_dir(id);
        }
    }
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
    dir: TierDir,
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
    /// The tier below `dir`: the one this process has open there already (every `LakeCache`
    /// of a process on one directory shares it; they must agree on its capacity), else
    /// opened now. Another process's tier on the same directory is refused.
    pub(crate) fn shared(dir: &Path, capacity: u64) -> io::Result<Arc<Self>> {
        static OPEN: Mutex<Vec<(PathBuf, Weak<DiskTier>)>> = Mutex::new(Vec::new());
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|(_, t)| t.strong_count() > 0);
        if let Some(tier) = open
            .iter()
            .find(|(p, _)| p == &key)
            .and_then(|(_, t)| t.upgrade())
        {
            if tier.capacity != capacity {
                return Err(io::Error::other(format!(
                    "{} is open in this process with a capacity of {} bytes, not {capacity}",
                    dir.display(),
                    tier.capacity
                )));
            }
            return Ok(tier);
        }
        let tier = Arc::new(Self::open(dir, capacity)?);
        let key = std::fs::canonicalize(dir).unwrap_or(key);
        open.push((key, Arc::downgrade(&tier)));
        Ok(tier)
    }

    /// Opens (creating if needed) the tier below `dir`, indexing the entries a previous
    /// process left there and trimming them to `capacity`.
    pub(crate) fn open(dir: &Path, capacity: u64) -> io::Result<Self> {
        let dir = TierDir::open(dir)?;
        let mut found = dir.scan()?;
        // Oldest first, so the order of the previous process is kept as well as it can be.
        found.sort_by_key(|f| f.used);
        let tier = Self {
            dir,
            capacity,
            state: Mutex::new(State::default()),
            counters: DiskCounters::default(),
        };
        {
            let mut state = tier.lock();
            for f in found {
                // Names are checked to have `start + len` in range. A file another one holds
                // (left by a process that stopped before deleting it) goes.
                if !tier.index(&mut state, f.id, f.id.start + f.len, f.file_bytes) {
                    tier.dir.remove(f.id, f.len);
                }
            }
            tier.trim(&mut state);
            log::info!(
                "range cache: disk tier at {} opened with {} entries ({} bytes)",
                tier.dir.root().display(),
                state.entries.len(),
                state.bytes
            );
        }
        Ok(tier)
    }

    fn lock(&self) -> Locked<'_> {
        Locked {
            tier: self,
            guard: Some(self.state.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// Indexes the entry file of `id`, holding bytes up to `end`. Returns `false` (indexing
    /// nothing) if an entry holds those bytes already; entries it holds are deleted.
    fn index(&self, state: &mut State, id: EntryId, end: u64, file_bytes: u64) -> bool {
        if let Some(old) = state.entries.get(&id) {
            let old_end = old.end;
            if old_end >= end {
                return false;
            }
            // A longer range at the same start has another file: the shorter one goes.
            self.drop_entry(state, id);
        }
        let key = (id.object, id.version);
        let inside = match state.spans.entry(key).or_default().insert(id.start..end) {
            Inserted::Covered => return false,
            Inserted::Replacing(inside) => inside,
        };
        for r in inside {
            self.drop_entry(
                state,
                EntryId {
                    start: r.start,
                    ..id
                },
            );
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
        true
    }

    /// Forgets an entry; its file, and its object's directory once it holds no entry, are
    /// deleted when the lock is released (so what is on disk stays what is counted).
    fn drop_entry(&self, state: &mut State, id: EntryId) {
        if let Some(entry) = self.forget(state, id) {
            state.doomed.push((id, entry.end - id.start));
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

    /// The bytes of `object` on disk (headers not included).
    pub(crate) fn bytes_of(&self, object: &ObjectVersion) -> u64 {
        self.lock().spans.get(&ids(object)).map_or(0, Spans::bytes)
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
    /// `None`, like a missing one; so does an entry replaced (by a longer range at the same
    /// start) or deleted since `held` was looked up, which is left as it is now. Blocking:
    /// call from a blocking thread.
    pub(crate) fn read(&self, object: &ObjectVersion, held: Range<u64>) -> Option<Bytes> {
        let (o, v) = ids(object);
        let id = EntryId {
            object: o,
            version: v,
            start: held.start,
        };
        let version = object.canonical();
        let len = held.end - held.start;
        let read = self.dir.read(id, len, encoded_len(&version, len));
        let (checked, bad) = match read {
            EntryRead::Found(raw) => {
                let checked = decode(raw, &version, held.clone());
                let bad = checked.is_none();
                (checked, bad)
            }
            EntryRead::Missing => (None, false),
            EntryRead::Bad => (None, true),
        };
        let mut guard = self.lock();
        let state = &mut *guard;
        // Whether the entry is still the one read: not replaced meanwhile.
        let same = state.entries.get(&id).is_some_and(|e| e.end == held.end);
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
                if same && bad {
                    // Deleted below, so each bad file is reported once.
                    log::warn!(
                        "range cache: an entry for {} in {} failed its checks (torn write, \
                         bit flip or another version); deleted, the bytes are read again",
                        object.path(),
                        self.dir.root().display()
                    );
                    self.counters.corrupt.fetch_add(1, Relaxed);
                    self.drop_entry(state, id);
                } else if same && !self.dir.exists(id, len) {
                    // Its file was deleted behind the tier's back (checked under the lock: a
                    // write of the same range may have put it back meanwhile): forget it.
                    self.forget(state, id);
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
        let held = |state: &State| {
            let spans = state.spans.get(&(o, v));
            spans.is_some_and(|s| s.holds(&(start..end)))
        };
        if held(&self.lock()) {
            return;
        }
        let encoded = encode(&object.canonical(), start, bytes);
        if let Err(e) = self.dir.write(id, bytes.len() as u64, &encoded) {
            log::warn!(
                "range cache: writing a range to {} failed ({e}); it stays in memory only",
                self.dir.root().display()
            );
            self.counters.write_errors.fetch_add(1, Relaxed);
            return;
        }
        self.counters.writes.fetch_add(1, Relaxed);
        let mut state = self.lock();
        if !self.index(&mut state, id, end, encoded.len() as u64) {
            // Another write kept a range holding this one meanwhile; unless it is this very
            // range (whose file this write just replaced with the same bytes), this file goes.
            let same_file = state.entries.get(&id).is_some_and(|e| e.end == end);
            if !same_file {
                state.doomed.push((id, bytes.len() as u64));
            }
        }
        self.trim(&mut state);
    }

    /// Deletes every entry of one object, in every version.
    pub(crate) fn invalidate(&self, id: &ObjectId) {
        let object = object_hash(id);
        let (first, last) = ((0, 0), (u64::MAX, u64::MAX));
        self.drop_between(EntryId::of(object, first), EntryId::of(object, last));
    }

    /// Deletes every entry of one version of an object.
    pub(crate) fn invalidate_version(&self, version: &ObjectVersion) {
        let (object, v) = ids(version);
        self.drop_between(
            EntryId::of(object, (v, 0)),
            EntryId::of(object, (v, u64::MAX)),
        );
    }

    /// Deletes the entries from `first` to `last`, both included.
    fn drop_between(&self, first: EntryId, last: EntryId) {
        let mut state = self.lock();
        let ids: Vec<EntryId> = state
            .entries
            .range(first..=last)
            .map(|(id, _)| *id)
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

/// Parses `name` and decodes `contents` as the tier does for a file it finds: an entry is
/// served only if both hold up, for the version text the name's hashes stand for.
#[cfg(feature = "fuzz")]
pub(crate) fn fuzz_entry(name: &str, contents: &[u8]) -> bool {
    let Some((id, len)) = files::parse_name(name) else {
        return false;
    };
    // The version text is not known from a name alone; take it from the header, as a
    // collision would present it.
    let version = contents
        .get(20..)
        .and_then(|rest| {
            let n = u32::from_le_bytes(contents.get(16..20)?.try_into().ok()?) as usize;
            std::str::from_utf8(rest.get(..n)?).ok()
        })
        .unwrap_or("");
    decode(contents.to_vec(), version, id.start..id.start + len).is_some()
}

#[cfg(test)]
mod tests;
