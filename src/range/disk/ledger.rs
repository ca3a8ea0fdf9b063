//! The disk tier's [`Ledger`]: the bytes and entries its directory holds, kept in its `USAGE`
//! file for every process that has the directory open, so that together they keep it within
//! one capacity.
//!
//! Every change to the set of entry files (placing one, deleting one) is made holding the
//! ledger's lock (`flock` on `USAGE`, and a mutex for the threads of this process), and the
//! ledger is updated before the lock is released: a process that reads it under the lock
//! reads the directory's true size. A process killed between a deletion and its update
//! leaves the ledger too high, never too low (the count goes up before a file is placed),
//! so the tier may hold less than its capacity until the next walk recounts it, never more.
//! Reads take no lock.
//!
//! Layout of `USAGE`: `LKUSAGE1`, bytes (u64), entries (u64), then 1 once a walk has counted
//! the directory (0 in a directory an earlier release filled); integers little-endian.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::{Mutex, MutexGuard};

use super::files::{TierDir, flock};

const NAME: &str = "USAGE";
const MAGIC: &[u8; 8] = b"LKUSAGE1";
const LEN: usize = 25;

/// What the directory holds, as the ledger counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Usage {
    /// Bytes of entry files (headers included).
    pub bytes: u64,
    pub entries: u64,
    /// Whether a walk of the directory made these figures (a directory filled by an earlier
    /// release, or a ledger that cannot be read, has not been counted).
    pub counted: bool,
}

impl Usage {
    fn encode(&self) -> [u8; LEN] {
        let mut out = [0; LEN];
        out[..8].copy_from_slice(MAGIC);
        out[8..16].copy_from_slice(&self.bytes.to_le_bytes());
        out[16..24].copy_from_slice(&self.entries.to_le_bytes());
        out[24] = u8::from(self.counted);
        out
    }

    /// The figures in `raw`, or uncounted ones if it is not a ledger.
    fn decode(raw: &[u8]) -> Self {
        let u64_at = |at: usize| {
            raw.get(at..at + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
        };
        match (raw.get(..8), u64_at(8), u64_at(16), raw.get(24)) {
            (Some(m), Some(bytes), Some(entries), Some(&1)) if m == MAGIC => Self {
                bytes,
                entries,
                counted: true,
            },
            _ => Self::default(),
        }
    }
}

/// The shared count of the tier's bytes and entries.
#[derive(Debug)]
pub(super) struct Ledger {
    file: File,
    /// Held with the flock: this process's threads share the file's one flock, so they
    /// exclude each other here.
    threads: Mutex<()>,
}

/// The ledger, locked against every thread and process: its figures, changed in place and
/// written back on [`Locked::save`].
pub(super) struct Locked<'a> {
    file: &'a File,
    _threads: MutexGuard<'a, ()>,
    pub usage: Usage,
}

impl Ledger {
    pub(super) fn open(dir: &TierDir) -> io::Result<Self> {
        Ok(Self {
            file: dir.own_file(NAME)?,
            threads: Mutex::new(()),
        })
    }

    /// The figures as they are now, taking no lock (for statistics: a change may be under
    /// way, and a walk holding the lock for seconds does not hold them up).
    pub(super) fn peek(&self) -> Usage {
        read(&self.file)
    }

    /// The ledger, locked; waits for another process's walk to end.
    pub(super) fn lock(&self) -> io::Result<Locked<'_>> {
        let threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if !flock(&self.file, libc::LOCK_EX) {
            return Err(io::Error::last_os_error());
        }
        Ok(self.locked(threads))
    }

    /// The ledger, locked, if no other thread or process holds it now.
    pub(super) fn try_lock(&self) -> Option<Locked<'_>> {
        let threads = self.threads.try_lock().ok()?;
        if !flock(&self.file, libc::LOCK_EX | libc::LOCK_NB) {
            return None;
        }
        Some(self.locked(threads))
    }

    fn locked<'a>(&'a self, threads: MutexGuard<'a, ()>) -> Locked<'a> {
        Locked {
            file: &self.file,
            _threads: threads,
            usage: read(&self.file),
        }
    }
}

impl Locked<'_> {
    /// Writes the figures back.
    pub(super) fn save(&self) {
        // A ledger that cannot be written is recounted by the next walk that can.
        let _ = self.file.write_all_at(&self.usage.encode(), 0);
    }

    /// Counts a file of `bytes` placed (`replaced`: the size of the file of the same name it
    /// took the place of).
    pub(super) fn placed(&mut self, bytes: u64, replaced: Option<u64>) {
        let u = &mut self.usage;
        match replaced {
            Some(old) => u.bytes = u.bytes.saturating_sub(old),
            None => u.entries += 1,
        }
        u.bytes += bytes;
    }

    /// Counts a file of `bytes` deleted.
    pub(super) fn removed(&mut self, bytes: u64) {
        let u = &mut self.usage;
        u.bytes = u.bytes.saturating_sub(bytes);
        u.entries = u.entries.saturating_sub(1);
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Before the mutex guard (a field) is dropped.
        flock(self.file, libc::LOCK_UN);
    }
}

fn read(file: &File) -> Usage {
    let mut raw = [0; LEN];
    match file.read_exact_at(&mut raw, 0) {
        Ok(()) => Usage::decode(&raw),
        Err(_) => Usage::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_round_trip_and_anything_else_reads_as_uncounted() {
        let u = Usage {
            bytes: 1 << 40,
            entries: 7,
            counted: true,
        };
        assert_eq!(Usage::decode(&u.encode()), u);
        assert_eq!(Usage::decode(b"short"), Usage::default());
        let mut other = u.encode();
        other[0] = b'X';
        assert!(!Usage::decode(&other).counted);
    }
}
