//! [`FooterWarmup`]: the footers of the Parquet files a listing showed, loaded before the
//! listing ends (`crate::store::AfterListing`).
//!
//! Registering a table lists it, then reads every file's footer for its schema and
//! statistics: DataFusion reads 32 at a time (`meta_fetch_concurrency`), so 200 files cost 7
//! round trips, and with its 512 KiB `metadata_size_hint` a small file is downloaded whole.
//! Here every footer is loaded at once into the index cache, one request each, within the
//! prefetch ceiling (`max_in_flight`) and budget (`max_bytes`), so registration costs one
//! LIST and one round of footer reads, and the reads DataFusion makes next find them cached.
//!
//! How many at once, before anything is measured: a footer read is one small response, so
//! the link's bandwidth-delay product asks for as many of them in flight as there are bytes
//! of it per footer (about 50 of 64 KiB on 1 Gbit/s at 25 ms); sending all of them at once
//! is never slower than that, only bounded by what a scan may have in flight (its ceiling
//! and its budget). The link's bandwidth then paces the responses, as it must.
//!
//! What is read of each file: the footer and page index only (the last bytes, as many as
//! the largest footer of the store seen so far needs, 64 KiB to begin with), not a small
//! file whole: a selective query reads a few files' data, and a full scan's data comes with
//! the scan, at link speed (figures in `docs/benchmarks.md`, "First contact").
//!
//! The footers' arrival measures the link: all were sent at once, so their bytes over the
//! time after the first response are a lower bound of its bandwidth, which the store's first
//! scan starts its downloads from instead of probing up from a few.
//!
//! A footer the index cache holds already (another identity loaded it) is proven with one
//! HEAD instead, in the same round. Failures are left to the reads that follow: a store that
//! refuses a read refuses it again when DataFusion asks.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::{self, StreamExt};
use object_store::ObjectMeta;

use crate::config::PrefetchConfig;
use crate::handle::Listing;
use crate::index::IndexCache;
use crate::index::footer::load_footer;
use crate::object::{ObjectVersion, StoreKey};
use crate::store::{AfterListing, Link, StoreReads, is_parquet};

/// Bytes read from a file's end for its footer before the store has shown a larger one.
const FIRST_FOOTER_READ: u64 = 64 << 10;
/// At most this much is read from a file's end in one request, however large footers got.
const MOST_FOOTER_READ: u64 = 16 << 20;
/// Stores whose footer sizes are remembered; past this many, they start over.
const MAX_STORES: usize = 1024;
/// Footer bytes below which a registration says nothing of the link's bandwidth (a few
/// responses take their round trip, however fast the link).
const MIN_MEASURED_BYTES: u64 = 1 << 20;

/// Loads the footers of listed Parquet files; see the module docs.
#[derive(Debug)]
pub(crate) struct FooterWarmup {
    config: PrefetchConfig,
    index: IndexCache,
    /// The most bytes a footer (with its page index) of each store needed so far.
    needed: Arc<Mutex<HashMap<StoreKey, u64>>>,
    /// What the warm-ups under way loaded: warm-ups at once share the index cache's free
    /// room rather than each taking all of it.
    loading: Arc<Mutex<Loading>>,
}

impl FooterWarmup {
    /// Loads into `index`, within `config`'s ceiling and budget.
    pub(crate) fn new(config: PrefetchConfig, index: IndexCache) -> Self {
        Self {
            config,
            index,
            needed: Arc::default(),
            loading: Arc::default(),
        }
    }
}

impl AfterListing for FooterWarmup {
    fn listed(&self, reads: StoreReads, listed: Arc<Listing>) -> BoxFuture<'static, ()> {
        let (index, needed) = (self.index.clone(), Arc::clone(&self.needed));
        // Into the room the index cache has free, less a tenth of it, and less what other
        // warm-ups under way loaded: footers loaded past that would push out each other, or
        // the footers other tables' queries read, before the reads that follow. Those past
        // it are loaded as queries read them; footers held already are proven all the same.
        let room = index
            .free_bytes()
            .saturating_sub(index.capacity_bytes() / 10);
        let loading = Arc::clone(&self.loading);
        let under_way = Loading::started(&loading);
        let read_from_end = needed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(reads.store_key())
            .copied()
            .unwrap_or(FIRST_FOOTER_READ);
        let at_once = (self.config.max_bytes / read_from_end.max(1)).max(1) as usize;
        let at_once = at_once.min(self.config.max_in_flight);
        async move {
            let began = Instant::now();
            let (mut read, mut loaded) = (0, 0);
            let refused = AtomicU64::new(0);
            let may_load = || {
                let fits = lock(&loading).bytes < room;
                if !fits {
                    refused.fetch_add(1, Relaxed);
                }
                fits
            };
            // Taken one at a time as downloads free up, each copied as it is taken.
            let files = (0..listed.objects.len()).filter_map(|i| {
                let meta = &listed.objects[i];
                is_parquet(meta).then(|| meta.as_ref().clone())
            });
            stream::iter(files)
                .map(|meta| warm(&reads, &index, meta, read_from_end, &may_load))
                .buffer_unordered(at_once)
                .for_each(|footer| {
                    if let Some((bytes, weight)) = footer {
                        index.note_warmed();
                        remember(&needed, reads.store_key(), bytes);
                        read += bytes;
                        loaded += 1;
                        // A footer held already took no room.
                        if bytes > 0 {
                            lock(&loading).bytes += weight;
                        }
                    }
                    async {}
                })
                .await;
            drop(under_way);
            if refused.load(Relaxed) > 0 && !ROOM_LOGGED.swap(true, Relaxed) {
                let files = listed.objects.iter().filter(|m| is_parquet(m)).count();
                log::warn!(
                    "the footers of {loaded} of the {files} Parquet files a listing showed fill \
                     the room lakecache.index.capacity ({} bytes) had free: the others are \
                     loaded as queries read them; raise lakecache.index.capacity to keep them all",
                    index.capacity_bytes()
                );
            }
            if let Some(link) = measured(read, began.elapsed(), reads.typical_wait()) {
                reads.raise_link(link);
            }
        }
        .boxed()
    }
}

/// Bytes of footers loaded by the warm-ups under way, and how many are under way.
#[derive(Debug, Default)]
struct Loading {
    bytes: u64,
    warmups: usize,
}

impl Loading {
    /// One more warm-up under way, until the guard returned is dropped (its end, or its
    /// future dropped before it).
    fn started(loading: &Arc<Mutex<Loading>>) -> UnderWay {
        lock(loading).warmups += 1;
        UnderWay(Arc::clone(loading))
    }

    /// One warm-up ended. Its footers are in the index cache's weight from now on, but a
    /// warm-up still under way measured its room before they were: their bytes stay counted
    /// until the last warm-up ends (a warm-up starting meanwhile counts them twice, and
    /// loads less rather than more).
    fn ended(&mut self) {
        self.warmups -= 1;
        if self.warmups == 0 {
            self.bytes = 0;
        }
    }
}

/// A warm-up under way; see [`Loading::started`].
struct UnderWay(Arc<Mutex<Loading>>);

impl Drop for UnderWay {
    fn drop(&mut self) {
        lock(&self.0).ended();
    }
}

/// Whether a listing whose footers outgrew the index cache was logged (once per process).
static ROOM_LOGGED: AtomicBool = AtomicBool::new(false);

/// Loads (or proves) the footer of `meta` through `reads`, reading `read_from_end` bytes
/// first, if `may_load()` (a footer held already is proven all the same). Returns the bytes
/// from the file's end its footer and page index took (0 if it was held already) and the
/// bytes the decoded footer takes, or `None` if it could not be had.
async fn warm(
    reads: &StoreReads,
    index: &IndexCache,
    meta: ObjectMeta,
    read_from_end: u64,
    may_load: &(dyn Fn() -> bool + Sync),
) -> Option<(u64, u64)> {
    let version = reads.completed(&reads.version_of(&meta, None));
    let version = match version.pins_bytes() {
        true => version,
        // Known by size and time alone: one HEAD pins it if another identity's footer or
        // bytes of the object are held; otherwise the footer's own read shows its e_tag.
        false if reads.caches().ranges.may_hold(version.id()) => {
            reads.pinned(&version).await.ok()?
        }
        false => version,
    };
    if let Some(held) = index.cached_metadata(&version) {
        reads.prove(&version).await.ok()?;
        return Some((0, held.memory_size() as u64));
    }
    if !may_load() {
        return None;
    }
    let lowest = Arc::new(AtomicU64::new(u64::MAX));
    // The versions the load's reads were of (see `StoreReads::read_shown`).
    let shown: Arc<Mutex<Vec<ObjectVersion>>> = Arc::default();
    let hint = read_from_end.min(version.size()) as usize;
    let load = {
        let (reads, version) = (reads.clone(), version.clone());
        let (lowest, shown) = (Arc::clone(&lowest), Arc::clone(&shown));
        async move {
            let read = |range: Range<u64>| {
                lowest.fetch_min(range.start, Relaxed);
                let (reads, version, shown) = (reads.clone(), version.clone(), shown.clone());
                async move {
                    let ranges = std::slice::from_ref(&range);
                    let (of, mut bytes) = reads.read_shown(&version, ranges, None).await?;
                    lock(&shown).push(of);
                    bytes.pop().ok_or_else(|| object_store::Error::Generic {
                        store: "lakecache",
                        source: format!("{}: a read of {range:?} returned nothing", version.path())
                            .into(),
                    })
                }
            };
            load_footer(&version, Some(hint), read).await
        }
    };
    let weight;
    if version.pins_bytes() {
        let (footer, found) = index
            .metadata(&version, reads.identity(), load)
            .await
            .ok()?;
        weight = footer.memory_size() as u64;
        if found {
            // Another identity's load: this store has still to show it can read the file.
            reads.prove(&version).await.ok()?;
        }
    } else {
        // Kept under the version its reads showed, if they all showed one: not the version
        // recorded once the load is done, which may be a rewrite's that came in between.
        let footer = load.await.ok()?;
        weight = footer.memory_size() as u64;
        let shown = lock(&shown);
        if let Some(of) = shown.first()
            && shown.iter().all(|s| s == of)
        {
            index.keep_footer(of, footer);
        }
    }
    let lowest = lowest.load(Relaxed);
    Some((
        version.size().saturating_sub(lowest.min(version.size())),
        weight,
    ))
}

/// What footer reads sent at once showed of the link: `bytes` arrived `elapsed` after they
/// were sent, the first of them after about `wait`, so the link carried at least `bytes /
/// (elapsed - wait)`. A lower bound the first scan of the store starts from, rather than
/// probing up from a few downloads (`crate::prefetch::controller`); `None` when too few
/// bytes came, or too soon, to tell.
fn measured(bytes: u64, elapsed: Duration, wait: Option<Duration>) -> Option<Link> {
    let latency = wait?;
    let moving = elapsed.checked_sub(latency)?;
    if bytes < MIN_MEASURED_BYTES || moving < latency / 4 || moving.is_zero() {
        return None;
    }
    Some(Link {
        bandwidth: bytes as f64 / moving.as_secs_f64(),
        latency,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Raises `store`'s remembered footer size to `bytes`.
fn remember(needed: &Mutex<HashMap<StoreKey, u64>>, store: &StoreKey, bytes: u64) {
    let bytes = bytes.min(MOST_FOOTER_READ);
    let mut needed = lock(needed);
    if needed.len() >= MAX_STORES && !needed.contains_key(store) {
        needed.clear();
    }
    let known = needed.entry(store.clone()).or_insert(FIRST_FOOTER_READ);
    *known = (*known).max(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footers_sent_at_once_measure_a_lower_bound_of_the_link() {
        let ms = Duration::from_millis;
        // 12.5 MB arrived 125 ms after they were sent, the first after 25 ms: 125 MB/s.
        let link = measured(12_500_000, ms(125), Some(ms(25))).unwrap();
        assert!((link.bandwidth - 125e6).abs() < 1.0, "{link:?}");
        assert_eq!(link.latency, ms(25));
        // Too few bytes, no wait known, or all within about one round trip: nothing told.
        assert_eq!(measured(100_000, ms(125), Some(ms(25))), None);
        assert_eq!(measured(12_500_000, ms(125), None), None);
        assert_eq!(measured(12_500_000, ms(27), Some(ms(25))), None);
    }

    #[test]
    fn a_warm_ups_loads_stay_counted_until_the_last_warm_up_under_way_ends() {
        let loading = Arc::new(Mutex::new(Loading::default()));
        let first = Loading::started(&loading);
        let second = Loading::started(&loading);
        lock(&loading).bytes += 100;
        // The first ends (or its future is dropped): the second measured its room before
        // those footers were in the cache's weight.
        drop(first);
        assert_eq!(lock(&loading).bytes, 100);
        lock(&loading).bytes += 50;
        drop(second);
        assert_eq!(lock(&loading).bytes, 0);
        assert_eq!(lock(&loading).warmups, 0);
    }
}
