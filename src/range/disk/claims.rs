//! [`Claims`]: which process is downloading which ranges, so that processes sharing a disk
//! tier that miss the same bytes at once send one request, not one each.
//!
//! A claim is a write lock on a byte range of the tier's `CLAIMS` file (an open-file-
//! description lock, `F_OFD_SETLK`): the range stands for the object version's range
//! (`offset`), overlapping claims conflict as the ranges do, and the kernel releases a
//! process's claims when it dies, however it dies, so none is held for longer than its
//! holder lives. The file stays empty. Within a process, downloads are shared before they
//! get here (`flights.rs`), and one open file serves every claim of the process: its claims
//! never conflict with each other.
//!
//! Where such locks do not exist (other systems than Linux) every claim is granted at once,
//! and processes that miss the same bytes together each download them.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::sync::Arc;

/// Object versions are spread over this many slots of the lock space; two versions in one
/// slot may wait for each other's downloads (only for a while: see `DiskTier::claim`).
const SLOT_BITS: u32 = 22;
/// Each slot spans this many offsets: bytes of an object past 1 TiB share its last offset.
const SLOT_SPAN: u64 = 1 << 40;

/// The claims of the processes on one tier.
#[derive(Debug)]
pub(super) struct Claims {
    file: Arc<File>,
}

/// Ranges this process claimed; released when dropped.
#[derive(Debug)]
pub(crate) struct Claim {
    file: Arc<File>,
    held: Vec<(i64, i64)>,
}

impl Claims {
    pub(super) fn new(file: File) -> Self {
        Self {
            file: Arc::new(file),
        }
    }

    /// An empty claim, to add ranges to.
    pub(super) fn start(&self) -> Claim {
        Claim {
            file: Arc::clone(&self.file),
            held: Vec::new(),
        }
    }
}

impl Claim {
    /// Claims `range` of the version hashed as `version` if no other process holds any of it:
    /// whether it is now held by this claim.
    pub(super) fn try_add(&mut self, version: u64, range: &Range<u64>) -> io::Result<bool> {
        let (start, len) = lock_range(version, range);
        if lock(&self.file, start, len, true)? {
            self.held.push((start, len));
            return Ok(true);
        }
        Ok(false)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        for &(start, len) in &self.held {
            let _ = lock(&self.file, start, len, false);
        }
    }
}

/// Where the claim of `range` of version `version` lies in the lock space.
fn lock_range(version: u64, range: &Range<u64>) -> (i64, i64) {
    let slot = version & ((1 << SLOT_BITS) - 1);
    let start = range.start.min(SLOT_SPAN - 1);
    let end = range.end.clamp(start + 1, SLOT_SPAN);
    // Below 2^62 + 2^40: fits an off_t.
    ((slot * SLOT_SPAN + start) as i64, (end - start) as i64)
}

/// Takes (`take`) or releases a write lock on `len` bytes of `file` at `start`, without
/// waiting; whether it is held (released: always).
#[cfg(target_os = "linux")]
fn lock(file: &File, start: i64, len: i64, take: bool) -> io::Result<bool> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: a plain C struct, all zeroes is valid (and l_pid must be 0 for these locks).
    let mut spec: libc::flock = unsafe { std::mem::zeroed() };
    spec.l_type = if take { libc::F_WRLCK } else { libc::F_UNLCK } as libc::c_short;
    spec.l_whence = libc::SEEK_SET as libc::c_short;
    spec.l_start = start as libc::off_t;
    spec.l_len = len as libc::off_t;
    // SAFETY: fcntl reads `spec`, which lives across the call, and the descriptor `file`
    // keeps open.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &spec) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

#[cfg(not(target_os = "linux"))]
fn lock(_file: &File, _start: i64, _len: i64, _take: bool) -> io::Result<bool> {
    Ok(true)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn claims(path: &std::path::Path) -> Claims {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .unwrap();
        Claims::new(file)
    }

    #[test]
    fn overlapping_claims_of_two_opens_conflict_until_released() {
        let dir = tempfile::tempdir().unwrap();
        // Two opens of the file: two processes, as far as these locks go.
        let (a, b) = (claims(&dir.path().join("C")), claims(&dir.path().join("C")));
        let mut first = a.start();
        assert!(first.try_add(7, &(100..200)).unwrap());
        let mut second = b.start();
        assert!(!second.try_add(7, &(150..250)).unwrap());
        assert!(second.try_add(7, &(200..300)).unwrap(), "no overlap");
        assert!(second.try_add(8, &(100..200)).unwrap(), "another version");
        drop(first);
        assert!(second.try_add(7, &(150..250)).unwrap());
        // One open's claims never conflict with each other.
        let mut same = b.start();
        assert!(same.try_add(7, &(150..250)).unwrap());
    }

    #[test]
    fn offsets_stay_within_an_off_t_at_the_largest_slot_and_range() {
        let (start, len) = lock_range(u64::MAX, &(u64::MAX - 10..u64::MAX));
        assert!(start > 0 && len >= 1);
        assert!(start.checked_add(len).is_some());
        let (_, len) = lock_range(1, &(5..5));
        assert_eq!(len, 1, "an empty range still claims a byte");
    }
}
