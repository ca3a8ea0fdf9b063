#![allow(clippy::single_range_in_vec_init)] // one-range reads are the common case here

use super::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;

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
    ObjectVersion::new(store, &crate::object::StoreIdentity::named("test"), &meta)
}

/// The file of `v`'s entry at `start` holding `len` bytes.
fn entry_file(tier: &DiskTier, v: &ObjectVersion, start: u64, len: u64) -> std::path::PathBuf {
    let (object, version) = ids(v);
    let id = EntryId {
        object,
        version,
        start,
    };
    tier.dir.entry_path(id, len)
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
    let file = tier.dir.entry_path(
        EntryId {
            object: o,
            version: v,
            start: 0,
        },
        4096,
    );
    let mut raw = std::fs::read(&file).unwrap();
    let last = raw.len() - 1;
    raw[last] ^= 1;
    std::fs::write(&file, raw).unwrap();
    assert!(tier.read(&v1, 0..4096).is_none());
    assert_eq!(tier.counters.corrupt.load(Relaxed), 1);
    assert!(!file.exists());
    assert!(tier.spans(&v1).is_none());
}

/// Sets the time of last use of `v`'s entry at `start` (`len` bytes) to `ago` before now.
fn last_used(tier: &DiskTier, v: &ObjectVersion, start: u64, len: u64, ago: u64) {
    let file = fs::File::open(entry_file(tier, v, start, len)).unwrap();
    let when = std::time::SystemTime::now() - std::time::Duration::from_secs(ago);
    file.set_modified(when).unwrap();
}

#[test]
fn the_least_recently_used_entries_go_when_over_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let tier = DiskTier::open(dir.path(), 12_000).unwrap();
    let v = version("a.parquet", "1");
    let chunk = Bytes::from(vec![1u8; 3000]);
    tier.write(&v, 0, &chunk);
    tier.write(&v, 3000, &chunk);
    // Written an hour ago; then the first is read, which makes it the more recently used.
    last_used(&tier, &v, 0, 3000, 3600);
    last_used(&tier, &v, 3000, 3000, 3600);
    assert!(tier.read(&v, 0..3000).is_some());
    tier.write(&v, 6000, &chunk);
    tier.write(&v, 9000, &chunk);
    let spans = tier.spans(&v).unwrap();
    assert!(spans.covers(0..3000), "read recently, kept");
    assert!(!spans.covers(3000..6000), "least recently used, evicted");
    assert!(spans.covers(9000..12000), "the new one is in");
    assert!(tier.size().1 <= 12_000);
    assert_eq!(tier.counters.evictions.load(Relaxed), 1);
}

#[test]
fn openers_of_one_directory_read_each_others_entries_within_one_capacity() {
    // Two opens of one directory: two processes, as far as the tier's files and locks go.
    let dir = tempfile::tempdir().unwrap();
    let a = DiskTier::open(dir.path(), 10_000).unwrap();
    let b = DiskTier::open(dir.path(), 10_000).unwrap();
    let (v, w) = (version("a.parquet", "1"), version("b.parquet", "1"));
    let chunk = Bytes::from(vec![3u8; 2000]);
    a.write(&v, 0, &chunk);
    assert_eq!(b.read(&v, 0..2000).unwrap(), chunk, "a's entry is b's hit");
    // b saw nothing of `v` before: a's later entries are found by listing its directory.
    a.write(&v, 2000, &chunk);
    let covered = b.cover(&v, &[0..4000]).unwrap();
    assert!(covered[0].iter().all(|(_, e)| e.is_some()), "{covered:?}");
    // Both fill it: what is on disk stays within the one capacity, and each counts the same.
    for i in 0..10 {
        let tier = if i % 2 == 0 { &a } else { &b };
        tier.write(&w, i * 2000, &chunk);
        let on_disk: u64 = files_below(tier.dir.root())
            .iter()
            .filter(|f| f.ends_with(".range"))
            .map(|f| fs::metadata(tier.dir.root().join(f)).unwrap().len())
            .sum();
        assert!(on_disk <= 10_000, "{on_disk} bytes on disk");
        assert_eq!(a.size(), b.size());
        assert_eq!(a.size().1, on_disk, "the ledger is what is on disk");
    }
    // An entry the other evicted reads as a miss, never an error.
    assert!(b.read(&v, 0..2000).is_none());
}

#[test]
fn opening_reads_only_the_ledger_and_an_uncounted_tier_is_counted_at_its_first_write() {
    let dir = tempfile::tempdir().unwrap();
    let v = version("a.parquet", "1");
    {
        let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
        for i in 0..50 {
            tier.write(&v, i * 100, &Bytes::from(vec![1u8; 100]));
        }
        assert_eq!(tier.size().0, 50);
    }
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(tier.size().0, 50, "from the ledger");
    assert_eq!(tier.counters.walks.load(Relaxed), 0, "no walk at opening");
    drop(tier);
    // A directory an earlier release filled has no ledger: counted when first written.
    fs::remove_file(dir.path().join("lakecache-ranges/USAGE")).unwrap();
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(tier.size(), (0, 0), "not counted yet");
    assert_eq!(tier.read(&v, 0..100).unwrap().len(), 100, "yet read");
    tier.write(&v, 10_000, &Bytes::from(vec![1u8; 100]));
    assert_eq!(tier.counters.walks.load(Relaxed), 1);
    assert_eq!(tier.size().0, 51);
}

#[test]
fn a_write_a_process_left_unfinished_is_never_an_entry_and_is_swept_once_abandoned() {
    let dir = tempfile::tempdir().unwrap();
    let tier = DiskTier::open(dir.path(), 10_000).unwrap();
    let v = version("a.parquet", "1");
    let encoded = encode(&v.canonical(), 0, &[5u8; 100]);
    // A live writer's temporary file (locked while it writes), and one a process killed
    // mid-write left (its lock went with it): neither is an entry.
    let live = tier.dir.write_temp(&encoded).unwrap();
    let dead = tier.dir.root().join("tmp/w-999999-0-0");
    fs::write(&dead, &encoded).unwrap();
    assert!(tier.read(&v, 0..100).is_none());
    assert!(tier.cover(&v, &[0..100]).is_none());
    // Both old: the next walk sweeps the dead one alone.
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    for path in [live.path(), dead.as_path()] {
        let file = fs::File::options().write(true).open(path).unwrap();
        file.set_modified(hour_ago).unwrap();
    }
    tier.clear();
    assert!(!dead.exists(), "abandoned: swept");
    assert!(
        live.path().exists(),
        "a live writer's file is left, however old"
    );
    let path = live.path().to_path_buf();
    drop(live);
    assert!(!path.exists(), "removed by its writer");
}

/// Every file below `dir`, as paths relative to it.
fn files_below(dir: &std::path::Path) -> Vec<String> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else {
                all.push(e.path().strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    all.sort();
    all
}

#[test]
fn opening_touches_nothing_but_its_own_directory() {
    let dir = tempfile::tempdir().unwrap();
    // What a disk_dir of /var holds: other programs' files, a `tmp` of theirs, a link.
    let elsewhere = tempfile::tempdir().unwrap();
    fs::write(elsewhere.path().join("precious"), b"keep me").unwrap();
    fs::create_dir_all(dir.path().join("tmp")).unwrap();
    fs::write(dir.path().join("tmp/session.sock"), b"x").unwrap();
    fs::create_dir_all(dir.path().join("0123456789abcdef")).unwrap();
    fs::write(dir.path().join("0123456789abcdef/notes.range"), b"x").unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("link")).unwrap();
    let before = files_below(dir.path());
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    tier.write(&version("a.parquet", "1"), 0, &Bytes::from_static(b"hello"));
    drop(tier);
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    tier.clear();
    let after: Vec<String> = files_below(dir.path())
        .into_iter()
        .filter(|f| !f.starts_with("lakecache-ranges/"))
        .collect();
    assert_eq!(after, before, "nothing outside its own directory changed");
    assert_eq!(
        fs::read(elsewhere.path().join("precious")).unwrap(),
        b"keep me"
    );
}

#[test]
fn its_directories_and_files_are_private_to_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    let v = version("a.parquet", "1");
    tier.write(&v, 0, &Bytes::from_static(b"secret rows"));
    let root = tier.dir.root().to_path_buf();
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&root), 0o700);
    let (o, vh) = ids(&v);
    let entry = tier.dir.entry_path(
        EntryId {
            object: o,
            version: vh,
            start: 0,
        },
        11,
    );
    assert_eq!(mode(entry.parent().unwrap()), 0o700);
    assert_eq!(mode(&entry), 0o600);
}

#[test]
fn a_directory_of_something_else_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("lakecache-ranges");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("report.csv"), b"a,b").unwrap();
    let err = DiskTier::open(dir.path(), 1 << 20).unwrap_err();
    assert!(err.to_string().contains("lakecache-ranges"), "{err}");
    assert!(root.join("report.csv").exists());
}

#[test]
fn a_process_of_an_earlier_release_holding_it_alone_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    drop(DiskTier::open(dir.path(), 1 << 20).unwrap());
    // What an earlier release held while open: an exclusive lock on LOCK.
    let lock = fs::File::open(dir.path().join("lakecache-ranges/LOCK")).unwrap();
    assert!(files::flock(&lock, libc::LOCK_EX | libc::LOCK_NB));
    let err = DiskTier::open(dir.path(), 1 << 20).unwrap_err();
    assert!(err.to_string().contains("earlier release"), "{err}");
    drop(lock);
    DiskTier::open(dir.path(), 1 << 20).expect("free once it is closed");
}

#[test]
fn links_and_odd_names_in_its_directory_are_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let v = version("a.parquet", "1");
    let root = {
        let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
        tier.write(&v, 0, &Bytes::from_static(b"hello"));
        tier.dir.root().to_path_buf()
    };
    let (o, vh) = ids(&v);
    let sub = root.join(format!("{o:016x}"));
    // A dangling link with an entry's name (a file that vanished), an offset that overflows,
    // and a temporary file that is a link to a file elsewhere.
    std::os::unix::fs::symlink(
        "/nonexistent",
        sub.join(format!("{o:016x}-{vh:016x}-9-5.range")),
    )
    .unwrap();
    fs::write(
        sub.join(format!("{o:016x}-{vh:016x}-18446744073709551615-10.range")),
        b"x",
    )
    .unwrap();
    let elsewhere = tempfile::NamedTempFile::new().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), root.join("tmp/w-1-2-3")).unwrap();
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(tier.size().0, 1, "only the real entry");
    assert_eq!(tier.read(&v, 0..5).unwrap(), "hello");
    assert!(elsewhere.path().exists(), "a link's target is not deleted");
}

#[test]
fn a_longer_range_at_the_same_start_replaces_the_shorter_file() {
    let dir = tempfile::tempdir().unwrap();
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    let v = version("a.parquet", "1");
    tier.write(&v, 0, &Bytes::from(vec![1u8; 100]));
    tier.write(&v, 0, &Bytes::from(vec![1u8; 300]));
    let (entries, bytes) = tier.size();
    assert_eq!(entries, 1);
    let files: Vec<String> = files_below(tier.dir.root())
        .into_iter()
        .filter(|f| f.ends_with(".range"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let on_disk: u64 = files
        .iter()
        .map(|f| fs::metadata(tier.dir.root().join(f)).unwrap().len())
        .sum();
    assert_eq!(on_disk, bytes, "what is counted is what is on disk");
}

#[test]
fn caches_of_one_process_share_the_tier_of_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let a = DiskTier::shared(dir.path(), 1 << 20).unwrap();
    let b = DiskTier::shared(dir.path(), 1 << 20).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    let err = DiskTier::shared(dir.path(), 2 << 20).unwrap_err();
    assert!(err.to_string().contains("capacity"), "{err}");
    drop((a, b));
    DiskTier::shared(dir.path(), 2 << 20).expect("closed when the last user went");
}

#[test]
fn a_reader_of_an_entry_a_longer_one_replaced_misses_and_leaves_the_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    let v = version("a.parquet", "1");
    tier.write(&v, 0, &Bytes::from(vec![1u8; 100]));
    // The steps in the order a race takes them: a reader looks up what the tier holds...
    let held = tier.cover(&v, &[0..100]).unwrap()[0][0].1.clone().unwrap();
    assert_eq!(held, 0..100);
    // ...a write of a longer range at the same start replaces the entry and its file...
    tier.write(&v, 0, &Bytes::from(vec![1u8; 200]));
    // ...and the reader reads what it looked up.
    assert!(
        tier.read(&v, held).is_none(),
        "the file it looked up is gone"
    );
    assert_eq!(
        tier.counters.corrupt.load(Relaxed),
        0,
        "nothing was corrupt"
    );
    assert!(
        entry_file(&tier, &v, 0, 200).exists(),
        "the new entry stays"
    );
    assert_eq!(tier.read(&v, 0..200).unwrap().len(), 200);
    assert_eq!(tier.size().0, 1);
}

#[test]
fn names_of_its_layout_spelled_otherwise_are_neither_counted_nor_read() {
    let dir = tempfile::tempdir().unwrap();
    let v = version("a.parquet", "1");
    let w = version("b.parquet", "1");
    let (real, root) = {
        let tier = DiskTier::open(dir.path(), 10_000).unwrap();
        tier.write(&v, 0, &Bytes::from(vec![1u8; 1000]));
        (
            entry_file(&tier, &v, 0, 1000),
            tier.dir.root().to_path_buf(),
        )
    };
    let contents = fs::read(&real).unwrap();
    let name = real.file_name().unwrap().to_string_lossy().into_owned();
    let dir_of = real.parent().unwrap().to_path_buf();
    // Spellings that parse to the same entry: upper-case hex, a leading zero or `+` in the
    // numbers; and the entry's own name in another object's directory.
    let (o, _) = ids(&w);
    let other_dir = root.join(format!("{o:016x}"));
    fs::create_dir_all(&other_dir).unwrap();
    let odd = [
        dir_of.join(name.to_uppercase().replace(".RANGE", ".range")),
        dir_of.join(name.replace("-0-1000.", "-00-1000.")),
        dir_of.join(name.replace("-0-1000.", "-+0-1000.")),
        other_dir.join(&name),
    ];
    for path in &odd {
        assert_ne!(path, &real);
        fs::write(path, &contents).unwrap();
    }
    let tier = DiskTier::open(dir.path(), 10_000).unwrap();
    assert_eq!(
        tier.size(),
        (1, contents.len() as u64),
        "only the real entry"
    );
    // Filling the tier to its capacity keeps what is on disk within it (the odd files are
    // not the tier's to count or delete, and are left as they are).
    for i in 1..20u64 {
        tier.write(&v, i * 1000, &Bytes::from(vec![1u8; 1000]));
    }
    let (_, bytes) = tier.size();
    assert!(bytes <= 10_000, "{bytes}");
    for path in &odd {
        assert!(path.exists(), "{} left alone", path.display());
    }
}

#[test]
fn an_entry_file_of_another_length_is_not_read_into_memory() {
    let dir = tempfile::tempdir().unwrap();
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    let v = version("a.parquet", "1");
    tier.write(&v, 0, &Bytes::from(vec![1u8; 100]));
    let file = entry_file(&tier, &v, 0, 100);
    // Grown to a gigabyte behind the tier's back (sparse: nothing is written).
    fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    assert!(tier.read(&v, 0..100).is_none());
    assert_eq!(tier.counters.corrupt.load(Relaxed), 1);
    assert!(!file.exists(), "deleted as corrupt");
}

#[test]
fn an_objects_directory_goes_with_its_last_entry() {
    let dir = tempfile::tempdir().unwrap();
    let tier = DiskTier::open(dir.path(), 3_000).unwrap();
    let (a, b) = (version("a.parquet", "1"), version("b.parquet", "1"));
    tier.write(&a, 0, &Bytes::from(vec![1u8; 1000]));
    let a_dir = entry_file(&tier, &a, 0, 1000)
        .parent()
        .unwrap()
        .to_path_buf();
    assert!(a_dir.exists());
    // Over capacity: a's entry, the least recently used, is evicted, and its directory with
    // it.
    last_used(&tier, &a, 0, 1000, 3600);
    tier.write(&b, 0, &Bytes::from(vec![1u8; 1000]));
    tier.write(&b, 1000, &Bytes::from(vec![1u8; 1000]));
    assert!(tier.read(&a, 0..1000).is_none());
    assert!(
        !a_dir.exists(),
        "an empty object directory is not left behind"
    );
    // And a write after it made the directory again.
    tier.write(&a, 0, &Bytes::from(vec![2u8; 10]));
    assert_eq!(tier.read(&a, 0..10).unwrap().len(), 10);
}

#[test]
fn forgetting_an_object_or_a_version_deletes_its_entries_alone() {
    let dir = tempfile::tempdir().unwrap();
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    let (a1, a2, b) = (
        version("a.parquet", "1"),
        version("a.parquet", "2"),
        version("b.parquet", "1"),
    );
    for v in [&a1, &a2, &b] {
        tier.write(v, 0, &Bytes::from_static(b"0123456789"));
        tier.write(v, 100, &Bytes::from_static(b"0123456789"));
    }
    tier.invalidate_version(&a1, false);
    assert!(tier.spans(&a1).is_none());
    assert!(!entry_file(&tier, &a1, 0, 10).exists(), "its files go");
    assert!(
        tier.spans(&a2).unwrap().covers(100..110),
        "the other version stays"
    );
    tier.invalidate(a2.id(), false);
    assert!(tier.spans(&a2).is_none());
    assert!(!entry_file(&tier, &a2, 100, 10).exists());
    assert_eq!(
        tier.read(&b, 100..110).unwrap(),
        "0123456789",
        "another object stays"
    );
    assert_eq!(tier.size().0, 2);
    assert_eq!(tier.counters.invalidations.load(Relaxed), 4);
}

#[test]
fn openers_of_a_new_directory_at_the_same_moment_all_open_it() {
    for _ in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let opened: Vec<io::Result<DiskTier>> = std::thread::scope(|s| {
            let openers: Vec<_> = (0..4)
                .map(|_| s.spawn(|| DiskTier::open(dir.path(), 1 << 20)))
                .collect();
            openers.into_iter().map(|o| o.join().unwrap()).collect()
        });
        for tier in opened {
            tier.expect("opened beside the others");
        }
    }
}

#[test]
fn the_view_a_process_keeps_is_bounded_and_what_it_forgot_is_found_again() {
    let dir = tempfile::tempdir().unwrap();
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    let objects: Vec<ObjectVersion> = (0..3 * VIEW_VERSIONS)
        .map(|i| version(&format!("f{i}.parquet"), "1"))
        .collect();
    for v in &objects {
        tier.write(v, 0, &Bytes::from_static(b"0123456789"));
        assert!(tier.view_versions() <= VIEW_VERSIONS as u64);
    }
    for v in &objects {
        assert_eq!(tier.read(v, 0..10).unwrap(), "0123456789");
        assert!(tier.cover(v, &[0..10]).is_some());
        assert!(tier.view_versions() <= VIEW_VERSIONS as u64);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_another_opener_claimed_waits_for_it_then_finds_its_bytes_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let a = Arc::new(DiskTier::open(dir.path(), 1 << 20).unwrap());
    let b = DiskTier::open(dir.path(), 1 << 20).unwrap();
    let v = version("a.parquet", "1");
    let (held, waited) = a.claim(&v, &[0..100]).await;
    assert!(!waited, "nobody held it");
    // While a holds it, b cannot claim any of it.
    let slot = claim_slot(&v);
    assert!(!b.claims.start().try_add(slot, &(50..60)).unwrap());
    // a downloads, writes, then lets go of its claim; b's claim waits for that (or, on a
    // slow machine, comes after it), then finds a's bytes on disk.
    let writer = {
        let (a, v) = (Arc::clone(&a), v.clone());
        tokio::task::spawn_blocking(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            a.write(&v, 0, &Bytes::from(vec![9u8; 100]));
            drop(held);
        })
    };
    let (_claim, _) = b.claim(&v, &[0..100]).await;
    assert_eq!(
        b.read(&v, 0..100).unwrap().len(),
        100,
        "a's bytes, from disk"
    );
    writer.await.unwrap();
}

#[test]
fn what_was_read_before_a_restart_outlives_what_was_not() {
    let dir = tempfile::tempdir().unwrap();
    let v = version("a.parquet", "1");
    let chunk = Bytes::from(vec![1u8; 3000]);
    {
        let tier = DiskTier::open(dir.path(), 12_000).unwrap();
        tier.write(&v, 0, &chunk);
        tier.write(&v, 3000, &chunk);
        last_used(&tier, &v, 0, 3000, 3600);
        last_used(&tier, &v, 3000, 3000, 3600);
        // Read before the process ends: the file's time says so to the next one.
        assert!(tier.read(&v, 0..3000).is_some());
    }
    let tier = DiskTier::open(dir.path(), 12_000).unwrap();
    tier.write(&v, 6000, &chunk);
    tier.write(&v, 9000, &chunk);
    let spans = tier.spans(&v).unwrap();
    assert!(spans.covers(0..3000), "read before the restart: kept");
    assert!(!spans.covers(3000..6000), "not read: evicted first");
}

#[test]
fn its_figures_are_read_while_the_ledger_is_held_for_a_walk() {
    let dir = tempfile::tempdir().unwrap();
    let tier = DiskTier::open(dir.path(), 1 << 20).unwrap();
    let v = version("a.parquet", "1");
    tier.write(&v, 0, &Bytes::from_static(b"0123456789"));
    // As a walk holds it (seconds, at a million entries): statistics do not wait for it.
    let held = tier.ledger.lock().unwrap();
    assert_eq!(tier.size().0, 1);
    drop(held);
}
