#![allow(clippy::single_range_in_vec_init)] // one-range reads are the common case here

use std::sync::Mutex;

use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::ObjectMeta;

use super::*;

/// A version of the test object named by its content (an MD5-like e_tag made from `tag`), as
/// S3 names versions: kept on disk and shared between identities.
fn version(tag: &str) -> ObjectVersion {
    let digest = twox_hash::XxHash64::oneshot(0, tag.as_bytes());
    version_tagged(&format!("\"{digest:016x}{digest:016x}\""))
}

fn version_tagged(e_tag: &str) -> ObjectVersion {
    let meta = ObjectMeta {
        location: "lake/a.parquet".into(),
        last_modified: chrono::DateTime::UNIX_EPOCH,
        size: 64 << 20,
        e_tag: Some(e_tag.into()),
        version: None,
    };
    let store = crate::object::StoreKey::of(&url::Url::parse("s3://bucket").unwrap());
    ObjectVersion::new(store, &StoreIdentity::named("test"), &meta)
}

/// A fetch that serves `bytes` for every call, kept under `object`.
fn fetch_of(
    object: &ObjectVersion,
    bytes: impl Fn(&[Range<u64>]) -> object_store::Result<Vec<Bytes>> + Send + Sync + 'static,
) -> impl Fn(Vec<Range<u64>>) -> BoxFuture<'static, object_store::Result<Fetched>> + Send + Sync {
    let object = object.clone();
    let bytes = Arc::new(bytes);
    move |wanted: Vec<Range<u64>>| {
        let (object, bytes) = (object.clone(), Arc::clone(&bytes));
        async move {
            Ok(Fetched {
                bytes: bytes(&wanted)?,
                keep: Some(object),
            })
        }
        .boxed()
    }
}

/// The byte at `offset` of the test object: every range has distinct, checkable content.
fn byte_at(offset: u64, salt: u8) -> u8 {
    (offset % 251) as u8 ^ salt
}

fn content(range: &Range<u64>, salt: u8) -> Bytes {
    range.clone().map(|o| byte_at(o, salt)).collect()
}

/// A store stand-in: serves the content and records every call's ranges.
#[derive(Default)]
struct Fetches {
    calls: Arc<Mutex<Vec<Vec<Range<u64>>>>>,
    /// Fetches that ran to their end.
    finished: Arc<AtomicU64>,
}

impl Fetches {
    async fn read(
        &self,
        cache: &RangeCache,
        object: &ObjectVersion,
        ranges: &[Range<u64>],
        salt: u8,
    ) -> Vec<Bytes> {
        self.read_with(cache, object, ranges, salt, None)
            .await
            .unwrap()
    }

    /// [`Fetches::read`] whose fetch takes `delay` (a download in the air), or fails after it.
    async fn read_slow(
        &self,
        cache: &RangeCache,
        object: &ObjectVersion,
        ranges: &[Range<u64>],
        delay: std::time::Duration,
        fail: bool,
    ) -> object_store::Result<Vec<Bytes>> {
        self.read_with(cache, object, ranges, 0, Some((delay, fail)))
            .await
    }

    /// Reads through `cache`, serving content with `salt`; with `slow`, each fetch takes its
    /// delay and then fails if asked to.
    async fn read_with(
        &self,
        cache: &RangeCache,
        object: &ObjectVersion,
        ranges: &[Range<u64>],
        salt: u8,
        slow: Option<(std::time::Duration, bool)>,
    ) -> object_store::Result<Vec<Bytes>> {
        let (calls, finished, keep) = (self.calls.clone(), self.finished.clone(), object.clone());
        let fetch = move |wanted: Vec<Range<u64>>| {
            let (calls, finished, keep) = (calls.clone(), finished.clone(), keep.clone());
            async move {
                calls.lock().unwrap().push(wanted.clone());
                if let Some((delay, fail)) = slow {
                    tokio::time::sleep(delay).await;
                    if fail {
                        return Err(object_store::Error::Generic {
                            store: "test",
                            source: "boom".into(),
                        });
                    }
                }
                finished.fetch_add(1, Relaxed);
                Ok(Fetched {
                    bytes: wanted.iter().map(|r| content(r, salt)).collect(),
                    keep: Some(keep),
                })
            }
            .boxed()
        };
        cache.read_through(object, ranges, None, &fetch).await
    }

    fn take(&self) -> Vec<Vec<Range<u64>>> {
        std::mem::take(&mut self.calls.lock().unwrap())
    }
}

#[tokio::test]
async fn a_read_whose_bytes_landed_after_its_lookups_takes_them_kept_not_fetched_again() {
    // Four sessions reading one file at once: one read's lookups miss, another read's
    // download lands (its flight leaves the air) before the first claims the range. The
    // bytes were kept before they landed, so the first read takes them from memory.
    let cache = RangeCache::try_new(RangeConfig::default()).unwrap();
    let v = version("landed between lookups and claim");
    let fetches = Fetches::default();
    let first = fetches.read(&cache, &v, &[4..179_861], 7).await;
    assert_eq!(fetches.take().len(), 1);
    let (calls, keep) = (fetches.calls.clone(), v.clone());
    let fetch = move |wanted: Vec<Range<u64>>| {
        calls.lock().unwrap().push(wanted.clone());
        let keep = keep.clone();
        async move {
            Ok(Fetched {
                bytes: wanted.iter().map(|r| content(r, 7)).collect(),
                keep: Some(keep),
            })
        }
        .boxed()
    };
    let second = cache
        .read_past_lookups(&v, &[4..179_861, 1000..2000], &fetch)
        .await
        .unwrap();
    assert_eq!(
        fetches.take(),
        Vec::<Vec<Range<u64>>>::new(),
        "fetched again"
    );
    assert_eq!(second[0], first[0]);
    assert_eq!(second[1], content(&(1000..2000), 7));
}

fn config(memory: u64) -> RangeConfig {
    RangeConfig {
        memory_bytes: memory,
        ..RangeConfig::default()
    }
}

#[tokio::test]
async fn covered_reads_make_no_request_and_partial_ones_fetch_only_the_gaps() {
    let cache = RangeCache::try_new(config(64 << 20)).unwrap();
    let fetches = Fetches::default();
    let v = version("1");
    const M: u64 = 1 << 20;
    fetches
        .read(&cache, &v, &[0..1000, 3 * M..3 * M + 1000], 0)
        .await;
    assert_eq!(fetches.take(), vec![vec![0..1000, 3 * M..3 * M + 1000]]);

    // Inside one entry: a slice, no request.
    let got = fetches.read(&cache, &v, &[100..200], 0).await;
    assert_eq!(got[0], content(&(100..200), 0));
    assert!(fetches.take().is_empty());

    // Partly held: only the two gaps are fetched (too far apart to coalesce).
    let wanted = [500..1500, 3 * M - 500..3 * M + 500];
    let got = fetches.read(&cache, &v, &wanted, 0).await;
    for (range, bytes) in wanted.iter().zip(&got) {
        assert_eq!(bytes, &content(range, 0), "{range:?}");
    }
    assert_eq!(fetches.take(), vec![vec![1000..1500, 3 * M - 500..3 * M]]);

    // Across several entries, joined.
    let wanted = [0..1500, 3 * M - 500..3 * M + 1000];
    fetches.read(&cache, &v, &wanted, 0).await;
    assert!(fetches.take().is_empty(), "everything is held now");
    let stats = cache.stats();
    assert!(stats.bytes_from_memory > 0 && stats.bytes_from_store > 0);
}

#[tokio::test]
async fn another_version_of_the_object_is_a_miss() {
    let cache = RangeCache::try_new(config(64 << 20)).unwrap();
    let fetches = Fetches::default();
    fetches.read(&cache, &version("1"), &[0..1000], 0).await;
    fetches.take();
    let got = fetches.read(&cache, &version("2"), &[0..1000], 7).await;
    assert_eq!(got[0], content(&(0..1000), 7), "the new version's bytes");
    assert_eq!(fetches.take(), vec![vec![0..1000]]);
}

#[tokio::test]
async fn a_failed_fetch_keeps_nothing() {
    let cache = RangeCache::try_new(config(64 << 20)).unwrap();
    let v = version("1");
    let boom = fetch_of(&v, |_| {
        Err(object_store::Error::Generic {
            store: "test",
            source: "boom".into(),
        })
    });
    let failed = cache.read_through(&v, &[0..1000], None, &boom).await;
    assert!(failed.is_err());
    assert!(!cache.covers(&v, 0..1));
    let short = fetch_of(&v, |_| Ok(vec![Bytes::from_static(b"x")]));
    let short = cache.read_through(&v, &[0..1000], None, &short).await;
    assert!(short.unwrap_err().to_string().contains("a.parquet"));
    assert!(!cache.covers(&v, 0..1));
}

#[tokio::test]
async fn the_memory_tier_stays_within_its_bound_under_a_larger_scan() {
    let capacity = 4 << 20;
    let cache = RangeCache::try_new(config(capacity)).unwrap();
    let fetches = Fetches::default();
    let v = version("1");
    // 32 MiB in 256 KiB reads, eight times the capacity.
    for i in 0..128u64 {
        let start = i * (256 << 10) + i * (2 << 20);
        fetches
            .read(&cache, &v, &[start..start + (256 << 10)], 0)
            .await;
    }
    let stats = cache.stats();
    assert!(
        stats.memory_bytes <= capacity,
        "{} bytes held of {capacity}",
        stats.memory_bytes
    );
    assert!(stats.memory_bytes > 0);
}

#[tokio::test]
async fn small_ranges_weigh_their_bookkeeping_so_the_bound_holds_for_them_too() {
    // 5,000 versions read 16 bytes each: 80 KB of bytes, which alone would all fit in 1 MiB,
    // but each range held takes hundreds of bytes of bookkeeping besides.
    let capacity = 1 << 20;
    let cache = RangeCache::try_new(config(capacity)).unwrap();
    let fetches = Fetches::default();
    for i in 0..5_000 {
        fetches
            .read(&cache, &version(&i.to_string()), &[0..16], 0)
            .await;
    }
    let stats = cache.stats();
    assert!(stats.memory.entries > 0, "{stats:?}");
    assert!(
        stats.memory.entries * (16 + RANGE_ENTRY_BOOKKEEPING) <= capacity,
        "{} ranges of 16 bytes held in {capacity} bytes: their bookkeeping is not counted",
        stats.memory.entries
    );
    assert!(stats.memory_bytes <= capacity, "{stats:?}");
}

#[tokio::test]
async fn a_scan_read_once_does_not_flush_ranges_read_often() {
    let capacity = 4 << 20;
    let cache = RangeCache::try_new(config(capacity)).unwrap();
    let fetches = Fetches::default();
    let hot = version("hot");
    let hot_ranges: Vec<Range<u64>> = (0..8u64)
        .map(|i| i * (4 << 20)..i * (4 << 20) + (256 << 10))
        .collect();
    for _ in 0..4 {
        fetches.read(&cache, &hot, &hot_ranges, 0).await;
        cache.stats();
    }
    fetches.take();
    let cold = version("cold");
    for i in 0..64u64 {
        let start = i * (4 << 20);
        fetches
            .read(&cache, &cold, &[start..start + (256 << 10)], 0)
            .await;
    }
    cache.stats();
    fetches.take();
    fetches.read(&cache, &hot, &hot_ranges, 0).await;
    assert!(
        fetches.take().is_empty(),
        "the hot ranges are all still held"
    );
}

#[tokio::test]
async fn invalidate_and_clear_drop_the_ranges() {
    let cache = RangeCache::try_new(config(64 << 20)).unwrap();
    let fetches = Fetches::default();
    let v = version("1");
    fetches.read(&cache, &v, &[0..1000], 0).await;
    assert!(cache.covers(&v, 0..1000));
    cache.invalidate(v.id());
    assert!(!cache.covers(&v, 0..1000));
    fetches.read(&cache, &v, &[0..1000], 0).await;
    cache.clear();
    assert!(!cache.covers(&v, 0..1000));
    assert_eq!(cache.stats().memory_bytes, 0);
}

#[tokio::test]
async fn when_off_every_read_goes_to_the_store() {
    let cache = RangeCache::try_new(RangeConfig {
        enabled: false,
        ..RangeConfig::default()
    })
    .unwrap();
    let fetches = Fetches::default();
    let v = version("1");
    for _ in 0..2 {
        fetches.read(&cache, &v, &[0..1000], 0).await;
    }
    assert_eq!(fetches.take().len(), 2);
    assert_eq!(cache.stats().bytes_from_store, 2000);
}

fn with_disk(dir: &std::path::Path) -> RangeConfig {
    RangeConfig {
        disk_dir: Some(dir.to_path_buf()),
        disk_bytes: 64 << 20,
        ..config(16 << 20)
    }
}

#[tokio::test]
async fn a_new_cache_on_the_same_disk_reads_without_requests() {
    let dir = tempfile::tempdir().unwrap();
    let v = version("1");
    let fetches = Fetches::default();
    {
        let cache = RangeCache::try_new(with_disk(dir.path())).unwrap();
        fetches
            .read(&cache, &v, &[0..1000, (4 << 20)..(4 << 20) + 5000], 0)
            .await;
        cache.flush().await;
        assert_eq!(cache.stats().disk_writes, 2);
    }
    fetches.take();
    let cache = RangeCache::try_new(with_disk(dir.path())).unwrap();
    let second = (4 << 20) + 500..(4 << 20) + 4000;
    assert!(cache.covers(&v, second.clone()));
    let got = fetches
        .read(&cache, &v, &[10..900, second.clone()], 0)
        .await;
    assert!(fetches.take().is_empty());
    assert_eq!(got[1], content(&second, 0));
    let stats = cache.stats();
    assert_eq!(stats.bytes_from_disk, 890 + 3500);
    // Read from disk once, then from memory.
    fetches.read(&cache, &v, &[10..900], 0).await;
    assert_eq!(cache.stats().bytes_from_memory, 890);
    // Another version finds nothing on disk.
    assert!(!cache.covers(&version("2"), 0..1000));
}

#[tokio::test]
async fn ranges_read_from_disk_go_to_memory_while_it_has_room_then_one_in_eight() {
    let dir = tempfile::tempdir().unwrap();
    let v = version("1");
    let fetches = Fetches::default();
    // 32 ranges of 64 KiB on disk (too far apart to be coalesced), in a memory tier with
    // room for 16 (each with its bookkeeping).
    let ranges: Vec<Range<u64>> = (0..32u64)
        .map(|i| i << 21..(i << 21) + (64 << 10))
        .collect();
    {
        let cache = RangeCache::try_new(with_disk(dir.path())).unwrap();
        fetches.read(&cache, &v, &ranges, 0).await;
        cache.flush().await;
    }
    fetches.take();
    let small = RangeConfig {
        memory_bytes: 16 * ((64 << 10) + RANGE_ENTRY_BOOKKEEPING),
        ..with_disk(dir.path())
    };
    let cache = RangeCache::try_new(small).unwrap();
    for range in &ranges[..16] {
        fetches
            .read(&cache, &v, std::slice::from_ref(range), 0)
            .await;
    }
    cache.inner.memory.run_pending_tasks();
    let held = |cache: &RangeCache| {
        ranges
            .iter()
            .filter(|r| cache.in_memory(&v, (*r).clone()))
            .count()
    };
    assert_eq!(held(&cache), 16, "every range read while memory had room");
    // Memory is full: of the next 16 ranges read from disk, 2 are offered to it.
    let offers = (0..16).filter(|_| cache.promotes(64 << 10)).count();
    assert_eq!(offers, 2);
    for range in &ranges[16..] {
        fetches
            .read(&cache, &v, std::slice::from_ref(range), 0)
            .await;
    }
    cache.inner.memory.run_pending_tasks();
    let offered = ranges[16..]
        .iter()
        .filter(|r| cache.in_memory(&v, (*r).clone()))
        .count();
    assert!(
        offered <= 2,
        "{offered} of the ranges read once memory was full"
    );
    assert!(fetches.take().is_empty(), "all from disk");
}

#[tokio::test]
async fn a_corrupted_disk_entry_is_refetched_never_returned() {
    let dir = tempfile::tempdir().unwrap();
    let v = version("1");
    let fetches = Fetches::default();
    {
        let cache = RangeCache::try_new(with_disk(dir.path())).unwrap();
        fetches.read(&cache, &v, &[0..100_000], 0).await;
        cache.flush().await;
    }
    fetches.take();
    // Flip one byte in the middle of the bytes of every entry file.
    let flipped = crate::testkit::corrupt_files_below(dir.path(), |len| len - 50_000).unwrap();
    assert_eq!(flipped, 1);
    let cache = RangeCache::try_new(with_disk(dir.path())).unwrap();
    let got = fetches.read(&cache, &v, &[0..100_000], 0).await;
    assert_eq!(got[0], content(&(0..100_000), 0), "the store's bytes");
    assert_eq!(fetches.take(), vec![vec![0..100_000]]);
    let stats = cache.stats();
    assert_eq!(stats.disk_corrupt, 1);
    assert_eq!(stats.bytes_from_disk, 0);
    // Written again, whole.
    cache.flush().await;
    drop(cache);
    let cache = RangeCache::try_new(with_disk(dir.path())).unwrap();
    let got = fetches.read(&cache, &v, &[0..100_000], 0).await;
    assert_eq!(got[0], content(&(0..100_000), 0));
    assert!(fetches.take().is_empty());
}

#[test]
fn a_disk_directory_that_cannot_be_used_is_refused_with_the_setting_name() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let err = RangeCache::try_new(with_disk(file.path())).unwrap_err();
    assert!(
        err.to_string().contains("lakecache.range.disk_dir"),
        "{err}"
    );
}

const IN_THE_AIR: std::time::Duration = std::time::Duration::from_millis(50);

#[tokio::test]
async fn concurrent_reads_of_the_same_bytes_share_one_download() {
    let cache = RangeCache::try_new(config(64 << 20)).unwrap();
    let fetches = Fetches::default();
    let v = version("1");
    const M: u64 = 1 << 20;
    let wanted = [0..1000, 3 * M..3 * M + 1000];
    let reads: Vec<_> = (0..8)
        .map(|_| fetches.read_slow(&cache, &v, &wanted, IN_THE_AIR, false))
        .collect();
    for got in futures::future::join_all(reads).await {
        let got = got.unwrap();
        assert_eq!(got[0], content(&wanted[0], 0));
        assert_eq!(got[1], content(&wanted[1], 0));
    }
    assert_eq!(fetches.take(), vec![wanted.to_vec()], "one download");
    let stats = cache.stats();
    assert_eq!(stats.shared, 7 * 2, "seven reads joined both of its ranges");
    assert_eq!(stats.bytes_shared, 7 * 2000);
}

#[tokio::test]
async fn a_read_overlapping_a_download_in_the_air_fetches_only_the_rest() {
    let cache = RangeCache::try_new(config(64 << 20)).unwrap();
    let fetches = Fetches::default();
    let v = version("1");
    let (a, b) = tokio::join!(
        fetches.read_slow(&cache, &v, &[1000..2000], IN_THE_AIR, false),
        fetches.read_slow(&cache, &v, &[500..2500], IN_THE_AIR, false),
    );
    assert_eq!(a.unwrap()[0], content(&(1000..2000), 0));
    assert_eq!(
        b.unwrap()[0],
        content(&(500..2500), 0),
        "joined across three pieces"
    );
    assert_eq!(
        fetches.take(),
        vec![vec![1000..2000], vec![500..1000, 2000..2500]]
    );
}

#[tokio::test]
async fn a_download_that_fails_or_is_dropped_leaves_its_joiners_to_fetch() {
    let cache = RangeCache::try_new(config(64 << 20)).unwrap();
    let fetches = Fetches::default();
    let v = version("1");
    let (failed, joined) = tokio::join!(
        fetches.read_slow(&cache, &v, &[0..1000], IN_THE_AIR, true),
        fetches.read_slow(&cache, &v, &[0..1000], IN_THE_AIR, false),
    );
    assert!(failed.is_err());
    assert_eq!(joined.unwrap()[0], content(&(0..1000), 0));
    assert_eq!(fetches.take(), vec![vec![0..1000], vec![0..1000]]);

    // A download whose query ended (its future dropped) in the air, nobody joined: aborted.
    let w = version("2");
    let cancelled = tokio::time::timeout(
        IN_THE_AIR / 5,
        fetches.read_slow(&cache, &w, &[0..1000], IN_THE_AIR, false),
    )
    .await;
    assert!(cancelled.is_err(), "timed out");
    let before = fetches.finished.load(Relaxed);
    tokio::time::sleep(IN_THE_AIR * 2).await;
    assert_eq!(
        fetches.finished.load(Relaxed),
        before,
        "aborted, never finished"
    );
    assert!(!cache.covers(&w, 0..1000));
    assert_eq!(fetches.take(), vec![vec![0..1000]]);
    assert!(
        cache.inner.flights.is_empty(),
        "no flight is left in the air"
    );
}

#[tokio::test]
async fn a_download_whose_reader_went_away_goes_on_for_those_who_joined_it() {
    let cache = RangeCache::try_new(config(64 << 20)).unwrap();
    let fetches = Fetches::default();
    let w = version("2");
    let cancelled = tokio::time::timeout(
        IN_THE_AIR / 5,
        fetches.read_slow(&cache, &w, &[0..1000], IN_THE_AIR, false),
    );
    let later = async {
        tokio::time::sleep(IN_THE_AIR / 10).await;
        fetches
            .read_slow(&cache, &w, &[0..1000], IN_THE_AIR, false)
            .await
    };
    let (cancelled, later) = tokio::join!(cancelled, later);
    assert!(cancelled.is_err(), "timed out");
    assert_eq!(later.unwrap()[0], content(&(0..1000), 0));
    assert_eq!(fetches.take(), vec![vec![0..1000]], "one download, joined");
    assert!(cache.covers(&w, 0..1000), "and kept");
    assert!(cache.inner.flights.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_finishes_while_the_reader_that_started_the_download_is_not_polled() {
    let cache = RangeCache::try_new(config(64 << 20)).unwrap();
    let fetches = Fetches::default();
    let v = version("1");
    // The first read claims the download and is then never polled again, as a query whose
    // consumer stopped pulling rows.
    let mut first = Box::pin(fetches.read_slow(&cache, &v, &[0..1000], IN_THE_AIR, false));
    assert!(futures::poll!(first.as_mut()).is_pending());
    assert!(
        !cache.inner.flights.is_empty(),
        "its download is in the air"
    );
    let joiner = fetches.read_slow(&cache, &v, &[0..1000], IN_THE_AIR, false);
    let got = tokio::time::timeout(IN_THE_AIR * 40, joiner).await;
    let got = got.expect("the joiner finished").unwrap();
    assert_eq!(got[0], content(&(0..1000), 0));
    assert_eq!(
        fetches.take(),
        vec![vec![0..1000]],
        "it joined the download"
    );
    drop(first);
}

#[tokio::test]
async fn reads_of_another_version_never_join() {
    let cache = RangeCache::try_new(config(64 << 20)).unwrap();
    let fetches = Fetches::default();
    let (one, two) = (version("1"), version("2"));
    let (a, b) = tokio::join!(
        fetches.read_slow(&cache, &one, &[0..1000], IN_THE_AIR, false),
        fetches.read_slow(&cache, &two, &[0..1000], IN_THE_AIR, false),
    );
    a.unwrap();
    b.unwrap();
    assert_eq!(fetches.take().len(), 2);
    assert_eq!(cache.stats().shared, 0);
}

#[tokio::test]
async fn a_flush_wakes_when_a_skipped_write_takes_the_last_pending_bytes_off() {
    let dir = tempfile::tempdir().unwrap();
    let cache = RangeCache::try_new(with_disk(dir.path())).unwrap();
    // A write in progress holds every byte writes may wait with...
    let in_progress = MAX_PENDING_DISK_BYTES;
    cache.inner.disk_pending.fetch_add(in_progress, Relaxed);
    let mut flush = Box::pin(cache.flush());
    assert!(futures::poll!(flush.as_mut()).is_pending());
    // ...so the next write is skipped, and the one in progress ends between the skipped
    // write's two steps: the skipped write is the one that takes the count to zero.
    let inner = Arc::clone(&cache.inner);
    *cache.inner.between_skip_steps.lock().unwrap() =
        Some(Box::new(move || inner.written(in_progress)));
    cache.insert(&version("1"), 0, Bytes::from_static(b"skipped"), None);
    assert_eq!(cache.stats().disk_skipped, 1);
    tokio::time::timeout(std::time::Duration::from_secs(10), flush)
        .await
        .expect("the flush woke");
}
