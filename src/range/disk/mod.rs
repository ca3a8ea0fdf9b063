//! [`DiskTier`]: ranges kept as files in a local directory, so a new process (or a memory
//! tier that let them go) reads them without a request, and every process of the host that
//! opens the same directory reads what the others wrote.
//!
//! The directory is the index: an object's entries are the files of its directory
//! (`files.rs`), listed when a read finds no entry this process knows of, so a range another
//! process wrote is found without any message between them. What a process keeps in memory
//! is a bounded view of those listings. The directory's size is counted in a ledger all
//! processes share (`ledger.rs`); a write that would take it past the capacity first walks
//! the directory and deletes the least recently used entries (by file time, which reads
//! update), whoever wrote them, down to nine tenths of it. Downloads of ranges no process
//! holds are claimed (`claims.rs`), so that processes missing the same bytes at once wait
//! for one download instead of each making their own.
//!
//! Readers take no lock shared with writers or walks: a reader whose entry was deleted
//! meanwhile finds its file missing (a miss), and an entry's bytes are checked against the
//! version they are read for.

mod claims;
mod files;
mod ledger;

pub(crate) use claims::Claim;

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use twox_hash::XxHash64;

use super::spans::{Inserted, Piece, Spans};
use crate::object::{ObjectId, ObjectVersion};
use claims::Claims;
use files::{EntryId, EntryRead, TierDir, decode, encode, encoded_len};
use ledger::{Ledger, Usage};

/// Object versions whose entries a process keeps in its view; past this, the view forgets
/// one for each new one (a forgotten one costs a listing of its directory when next read).
#[cfg(not(test))]
const VIEW_VERSIONS: usize = 1 << 16;
#[cfg(test)]
const VIEW_VERSIONS: usize = 8;
/// How long a download waits for another process's claim of the same bytes before making
/// its own request: a holder that died released its claim at once, so this bounds only a
/// live holder's slow download.
const CLAIM_WAIT: Duration = Duration::from_secs(10);

/// Figures of the disk tier, this process's.
#[derive(Debug, Default)]
pub(crate) struct DiskCounters {
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) write_errors: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) invalidations: AtomicU64,
    pub(crate) corrupt: AtomicU64,
    /// Downloads that waited for another process's claim.
    pub(crate) claims_waited: AtomicU64,
    /// Walks of the directory (to evict, or to count an uncounted one).
    pub(crate) walks: AtomicU64,
}

/// Ranges on local disk, bounded in bytes (least recently used go first), shared by the
/// processes of the host that open the same directory.
#[derive(Debug)]
pub(crate) struct DiskTier {
    dir: TierDir,
    ledger: Ledger,
    claims: Claims,
    capacity: u64,
    /// Held ranges per (object hash, version hash), as last listed or written by this process.
    view: Mutex<HashMap<(u64, u64), Spans>>,
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

/// Where `object`'s claims lie ([`Claim::try_add`]).
fn claim_slot(object: &ObjectVersion) -> u64 {
    let (o, v) = ids(object);
    o.rotate_left(32) ^ v
}

/// Forgets a version of `view` if it is full and `key` is not in it: which one does not
/// matter much, a forgotten one costs one listing when next read.
fn make_room(view: &mut HashMap<(u64, u64), Spans>, key: (u64, u64)) {
    if view.len() >= VIEW_VERSIONS && !view.contains_key(&key) {
        let any = view.keys().next().copied();
        if let Some(any) = any {
            view.remove(&any);
        }
    }
}

impl DiskTier {
    /// The tier below `dir`: the one this process has open there already (every `LakeCache`
    /// of a process on one directory shares it; they must agree on its capacity), else
    /// opened now.
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

    /// Opens (creating if needed) the tier below `dir`. Reads nothing but its ledger: the
    /// entries are found when read, however many there are.
    pub(crate) fn open(dir: &Path, capacity: u64) -> io::Result<Self> {
        let dir = TierDir::open(dir)?;
        let ledger = Ledger::open(&dir)?;
        let claims = Claims::new(dir.own_file("CLAIMS")?);
        let usage = ledger.peek();
        if usage.counted {
            log::info!(
                "range cache: disk tier at {} opened with {} entries ({} bytes)",
                dir.root().display(),
                usage.entries,
                usage.bytes
            );
        } else {
            log::info!(
                "range cache: disk tier at {} opened; its size is counted at its first write",
                dir.root().display()
            );
        }
        Ok(Self {
            dir,
            ledger,
            claims,
            capacity,
            view: Mutex::default(),
            counters: DiskCounters::default(),
        })
    }

    fn view(&self) -> MutexGuard<'_, HashMap<(u64, u64), Spans>> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ranges of version `(object, version)` on disk now, listed from its object's
    /// directory, and kept in the view.
    fn refresh(&self, key: (u64, u64)) -> Spans {
        let mut spans = Spans::default();
        for (id, len) in self.dir.entries_of(key.0) {
            if id.version == key.1 {
                spans.insert(id.start..id.start + len);
            }
        }
        let mut view = self.view();
        if spans.is_empty() {
            view.remove(&key);
        } else {
            make_room(&mut view, key);
            view.insert(key, spans.clone());
        }
        spans
    }

    /// Forgets `range` of `key` in the view (its file is gone).
    fn forget(&self, key: (u64, u64), range: &Range<u64>) {
        let mut view = self.view();
        if let Some(spans) = view.get_mut(&key) {
            spans.remove(range);
            if spans.is_empty() {
                view.remove(&key);
            }
        }
    }

    /// Whether any version of object `id` has entries.
    pub(crate) fn holds(&self, id: &ObjectId) -> bool {
        self.dir.has_object(object_hash(id))
    }

    /// The ranges of `object` on disk.
    #[cfg(test)]
    fn spans(&self, object: &ObjectVersion) -> Option<Spans> {
        Some(self.refresh(ids(object))).filter(|s| !s.is_empty())
    }

    /// Each of `ranges` cut into pieces held on disk and gaps ([`Spans::cover`]); `None` if
    /// the disk holds nothing of `object`. What this process knows of first; if that leaves
    /// gaps, the object's directory is listed again (another process may have written
    /// them). Blocking: call from a blocking thread.
    pub(crate) fn cover(
        &self,
        object: &ObjectVersion,
        ranges: &[Range<u64>],
    ) -> Option<Vec<Vec<Piece>>> {
        let key = ids(object);
        let known: Option<Vec<Vec<Piece>>> = {
            let view = self.view();
            view.get(&key)
                .map(|held| ranges.iter().map(|r| held.cover(r.clone())).collect())
        };
        let whole = |c: &Vec<Vec<Piece>>| c.iter().flatten().all(|(_, e)| e.is_some());
        if let Some(known) = known.filter(whole) {
            return Some(known);
        }
        let held = self.refresh(key);
        (!held.is_empty()).then(|| ranges.iter().map(|r| held.cover(r.clone())).collect())
    }

    /// The bytes of `object` on disk (headers not included). Blocking.
    pub(crate) fn bytes_of(&self, object: &ObjectVersion) -> u64 {
        self.refresh(ids(object)).bytes()
    }

    /// Entries and bytes (headers included) on disk, as the processes sharing the tier count
    /// them.
    pub(crate) fn size(&self) -> (u64, u64) {
        let usage = self.ledger.peek();
        (usage.entries, usage.bytes)
    }

    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Object versions in this process's view (bounded by [`VIEW_VERSIONS`]).
    pub(crate) fn view_versions(&self) -> u64 {
        self.view().len() as u64
    }

    /// Claims `ranges` of `object` for a download, waiting (up to [`CLAIM_WAIT`] in all)
    /// while another process holds a claim on any of them. Returns the claim, released when
    /// dropped, and whether it waited (for the figures).
    pub(crate) async fn claim(
        &self,
        object: &ObjectVersion,
        ranges: &[Range<u64>],
    ) -> (Claim, bool) {
        let slot = claim_slot(object);
        let mut claim = self.claims.start();
        let mut waited = false;
        let deadline = Instant::now() + CLAIM_WAIT;
        for range in ranges {
            let mut pause = Duration::from_millis(2);
            // An error (a file system without these locks): no claim, no wait.
            while let Ok(false) = claim.try_add(slot, range) {
                waited = true;
                if Instant::now() >= deadline {
                    break;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(50));
            }
        }
        if waited {
            self.counters.claims_waited.fetch_add(1, Relaxed);
        }
        (claim, waited)
    }

    /// Reads the entry holding `held` of `object`, checking it names the same version and
    /// that its bytes match their checksum. A bad entry is deleted and counted, and reads as
    /// `None`, like a missing one (evicted or replaced since `held` was looked up). Blocking:
    /// call from a blocking thread.
    pub(crate) fn read(&self, object: &ObjectVersion, held: Range<u64>) -> Option<Bytes> {
        let key = ids(object);
        let id = EntryId {
            object: key.0,
            version: key.1,
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
        if let Some(bytes) = checked {
            self.counters.hits.fetch_add(1, Relaxed);
            return Some(bytes);
        }
        if bad {
            log::warn!(
                "range cache: an entry for {} in {} failed its checks (torn write, bit flip \
                 or another version); deleted, the bytes are read again",
                object.path(),
                self.dir.root().display()
            );
            self.counters.corrupt.fetch_add(1, Relaxed);
            // Not waiting for a walk: if the ledger is busy, the next write of this range
            // replaces the file.
            if let Some(mut ledger) = self.ledger.try_lock()
                && let Some(bytes) = self.dir.remove(id, len)
            {
                ledger.removed(bytes);
                ledger.save();
            }
        }
        self.forget(key, &held);
        self.counters.misses.fetch_add(1, Relaxed);
        None
    }

    /// Writes `bytes`, the range of `object` starting at `start`, unless an entry there holds
    /// at least as much; deletes the entries it holds. Blocking: call from a blocking thread.
    pub(crate) fn write(&self, object: &ObjectVersion, start: u64, bytes: &Bytes) {
        let key = ids(object);
        let id = EntryId {
            object: key.0,
            version: key.1,
            start,
        };
        let end = start + bytes.len() as u64;
        if self.refresh(key).holds(&(start..end)) {
            return;
        }
        let encoded = encode(&object.canonical(), start, bytes);
        let placed = self.dir.write_temp(&encoded).and_then(|temp| {
            let mut ledger = self.ledger.lock()?;
            let n = temp.bytes;
            if !ledger.usage.counted || ledger.usage.bytes + n > self.capacity {
                self.walk(&mut ledger, n);
            }
            if ledger.usage.bytes + n > self.capacity {
                // Nothing more to evict (the rest is being written): not kept on disk.
                return Ok(false);
            }
            // Counted before it is in place: a process killed between the two leaves the
            // ledger high, never low.
            ledger.placed(n, None);
            ledger.save();
            let replaced = self.dir.place(temp, id, bytes.len() as u64);
            match replaced {
                Ok(Some(old)) => ledger.removed(old),
                Ok(None) => {}
                Err(e) => {
                    ledger.removed(n);
                    ledger.save();
                    return Err(e);
                }
            }
            // The entries this one holds are no longer needed.
            let inside = {
                let mut view = self.view();
                make_room(&mut view, key);
                match view.entry(key).or_default().insert(start..end) {
                    Inserted::Covered => Vec::new(),
                    Inserted::Replacing(inside) => inside,
                }
            };
            for r in inside.into_iter().filter(|r| *r != (start..end)) {
                let old = EntryId {
                    start: r.start,
                    ..id
                };
                if let Some(bytes) = self.dir.remove(old, r.end - r.start) {
                    ledger.removed(bytes);
                }
            }
            ledger.save();
            Ok(true)
        });
        match placed {
            Ok(true) => {
                self.counters.writes.fetch_add(1, Relaxed);
            }
            Ok(false) => {}
            Err(e) => {
                log::warn!(
                    "range cache: writing a range to {} failed ({e}); it stays in memory only",
                    self.dir.root().display()
                );
                self.counters.write_errors.fetch_add(1, Relaxed);
            }
        }
    }

    /// Walks the directory under the ledger's lock: recounts it, removes abandoned temporary
    /// files and, if `incoming` more bytes would take it past the capacity, deletes the least
    /// recently used entries down to nine tenths of it (less `incoming`).
    fn walk(&self, ledger: &mut ledger::Locked<'_>, incoming: u64) {
        self.counters.walks.fetch_add(1, Relaxed);
        self.dir.sweep_temps();
        let Ok(mut found) = self.dir.walk() else {
            return;
        };
        let mut bytes: u64 = found.iter().map(|f| f.file_bytes).sum();
        let mut entries = found.len() as u64;
        if bytes + incoming > self.capacity {
            let target = (self.capacity - self.capacity / 10).saturating_sub(incoming);
            found.sort_by_key(|f| (f.used, f.id));
            for f in found {
                if bytes <= target {
                    break;
                }
                if let Some(removed) = self.dir.remove(f.id, f.len) {
                    bytes = bytes.saturating_sub(removed);
                    entries -= 1;
                    self.counters.evictions.fetch_add(1, Relaxed);
                    self.forget(
                        (f.id.object, f.id.version),
                        &(f.id.start..f.id.start + f.len),
                    );
                    // Only an empty directory goes.
                    self.dir.remove_object_dir(f.id.object);
                }
            }
        }
        ledger.usage = Usage {
            bytes,
            entries,
            counted: true,
        };
        ledger.save();
    }

    /// Deletes every entry of one object, in every version. Returns `false`, deleting
    /// nothing, if `now` and the ledger is busy (another process walks the directory); else
    /// waits for it.
    pub(crate) fn invalidate(&self, id: &ObjectId, now: bool) -> bool {
        self.remove_where(object_hash(id), |_| true, now)
    }

    /// Deletes every entry of one version of an object; returns as
    /// [`DiskTier::invalidate`].
    pub(crate) fn invalidate_version(&self, version: &ObjectVersion, now: bool) -> bool {
        let (object, v) = ids(version);
        self.remove_where(object, |id| id.version == v, now)
    }

    /// Deletes the entries of `object` that `which` picks.
    fn remove_where(&self, object: u64, which: impl Fn(&EntryId) -> bool, now: bool) -> bool {
        let ledger = match now {
            true => self.ledger.try_lock(),
            false => self.ledger.lock().ok(),
        };
        let Some(mut ledger) = ledger else {
            return false;
        };
        self.view().retain(|k, _| k.0 != object);
        for (id, len) in self.dir.entries_of(object) {
            if which(&id)
                && let Some(bytes) = self.dir.remove(id, len)
            {
                ledger.removed(bytes);
                self.counters.invalidations.fetch_add(1, Relaxed);
            }
        }
        ledger.save();
        self.dir.remove_object_dir(object);
        true
    }

    /// Deletes every entry (and sweeps abandoned temporary files). Blocking.
    pub(crate) fn clear(&self) {
        self.view().clear();
        let Ok(mut ledger) = self.ledger.lock() else {
            return;
        };
        self.dir.sweep_temps();
        // Under the lock no process places or deletes an entry: what is left is what could
        // not be deleted.
        let mut left = Usage {
            counted: true,
            ..Usage::default()
        };
        for f in self.dir.walk().unwrap_or_default() {
            match self.dir.remove(f.id, f.len) {
                Some(_) => {
                    self.counters.invalidations.fetch_add(1, Relaxed);
                }
                None => {
                    left.bytes += f.file_bytes;
                    left.entries += 1;
                }
            }
            self.dir.remove_object_dir(f.id.object);
        }
        ledger.usage = left;
        ledger.save();
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
