//! [`RangeCache::read_through`]: a read cut into the pieces memory holds, the pieces the disk
//! tier holds, and the gaps, which are joined to downloads in the air or fetched, and kept.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use object_store::OBJECT_STORE_COALESCE_DEFAULT;

use super::disk::Claim as DiskClaim;
use super::flights::Claim;
use super::spans::Piece;
use super::{PROMOTE_ONE_IN, RangeCache, RangeKey, forget_span};
use crate::metrics::{ScanMetrics, Source};
use crate::object::ObjectVersion;

/// One piece of a requested range and, once found, the buffer holding it and where that
/// buffer starts in the object.
struct Part {
    range: Range<u64>,
    found: Option<(Bytes, u64, Source)>,
}

impl Part {
    fn gap(range: Range<u64>) -> Self {
        Self { range, found: None }
    }

    fn bytes(&self) -> Option<Bytes> {
        let (buffer, start, _) = self.found.as_ref()?;
        let from = (self.range.start - start) as usize;
        let to = (self.range.end - start) as usize;
        (to <= buffer.len()).then(|| buffer.slice(from..to))
    }
}

/// What a fetch of missing ranges brought: a buffer per range, and the version they may be
/// kept under (`None`: not kept), which every response that carried them showed.
pub(crate) struct Fetched {
    /// The bytes, one buffer per range asked for.
    pub(crate) bytes: Vec<Bytes>,
    /// The version to keep them under: the one asked for, or, for a version known by its
    /// time alone, the one the responses showed.
    pub(crate) keep: Option<ObjectVersion>,
}

/// A fetch of missing ranges: a future of its own, so a download other reads join runs on
/// its own task, whether or not its first reader is polled.
pub(crate) type Fetch<'a> =
    dyn Fn(Vec<Range<u64>>) -> BoxFuture<'static, object_store::Result<Fetched>> + Send + Sync + 'a;

impl RangeCache {
    /// Reads `ranges` of `object`: from memory, then disk, then downloads of other reads in
    /// the air, and what none holds through `fetch`, called with the missing ranges
    /// (coalesced the way object_store coalesces): once, and once more for bytes a joined
    /// download failed to bring. `fetch` must read `object` at this version (guarded by it);
    /// what it returns is kept under the version it names. Downloads this read makes run as
    /// tasks of their own, which other reads join; one nobody waits for any more is aborted.
    /// The bytes served are counted by source here and, for a reader's own read, in `scan`.
    /// Ranges must be valid.
    #[cfg(test)]
    pub(crate) async fn read_through(
        &self,
        object: &ObjectVersion,
        ranges: &[Range<u64>],
        scan: Option<&ScanMetrics>,
        fetch: &Fetch<'_>,
    ) -> object_store::Result<Vec<Bytes>> {
        let (bytes, _) = self.read_through_shown(object, ranges, scan, fetch).await?;
        Ok(bytes)
    }

    /// [`RangeCache::read_through`], and the version the bytes were shown to be of: `object`
    /// for bytes kept under it, what the responses of the fetches that brought the rest
    /// showed (its own and the downloads it joined). `None` when they showed none, or not
    /// one alike (for `object` known by size and time alone, which nothing guards).
    pub(crate) async fn read_through_shown(
        &self,
        object: &ObjectVersion,
        ranges: &[Range<u64>],
        scan: Option<&ScanMetrics>,
        fetch: &Fetch<'_>,
    ) -> object_store::Result<(Vec<Bytes>, Option<ObjectVersion>)> {
        let served = |source, bytes| {
            self.inner.served.add(source, bytes);
            if let Some(scan) = scan {
                scan.read_from(source, bytes);
            }
        };
        let mut parts = match self.applies(object) {
            true => {
                let mut parts = self.look_in_memory(object, ranges);
                self.look_on_disk(object, &mut parts).await;
                parts
            }
            false => ranges.iter().map(|r| vec![Part::gap(r.clone())]).collect(),
        };
        let mut shown = Shown::of(object, &parts);
        self.fetch_gaps(object, &mut parts, fetch, &mut shown)
            .await?;
        let bytes = ranges
            .iter()
            .zip(parts)
            .map(|(range, parts)| {
                for part in &parts {
                    if let Some((_, _, source)) = part.found {
                        served(source, part.range.end - part.range.start);
                    }
                }
                join(object, range, &parts)
            })
            .collect::<object_store::Result<_>>()?;
        Ok((bytes, shown.agreed()))
    }

    /// Cuts each range into pieces, found in memory or not.
    fn look_in_memory(&self, object: &ObjectVersion, ranges: &[Range<u64>]) -> Vec<Vec<Part>> {
        // Worked out under the lock (moka is called after it is released: its listener
        // takes the lock).
        let covered: Option<Vec<Vec<Piece>>> = self
            .lock_spans()
            .get(object)
            .map(|held| ranges.iter().map(|r| held.cover(r.clone())).collect());
        let Some(covered) = covered else {
            for _ in ranges {
                self.inner.counters.miss();
            }
            return ranges.iter().map(|r| vec![Part::gap(r.clone())]).collect();
        };
        let mut buffers: HashMap<u64, Option<Bytes>> = HashMap::new();
        let mut stale = Vec::new();
        let parts = covered
            .into_iter()
            .map(|pieces| {
                pieces
                    .into_iter()
                    .map(|(piece, entry)| {
                        let found = entry.and_then(|entry| {
                            let key = RangeKey {
                                object: object.clone(),
                                start: entry.start,
                            };
                            let buffer = buffers
                                .entry(entry.start)
                                .or_insert_with(|| self.inner.memory.get(&key))
                                .clone()
                                .filter(|b| b.len() as u64 == entry.end - entry.start);
                            if buffer.is_none() {
                                stale.push(entry.clone());
                            }
                            buffer.map(|b| (b, entry.start, Source::Memory))
                        });
                        match found {
                            Some(_) => self.inner.counters.hit(),
                            None => self.inner.counters.miss(),
                        }
                        Part {
                            range: piece,
                            found,
                        }
                    })
                    .collect()
            })
            .collect();
        for entry in stale {
            forget_span(&self.inner.spans, object, entry);
        }
        parts
    }

    /// [`RangeCache::read_through`] as if its lookups had found nothing: what a read meets
    /// when another read's download lands between its lookups and its claim.
    #[cfg(test)]
    pub(super) async fn read_past_lookups(
        &self,
        object: &ObjectVersion,
        ranges: &[Range<u64>],
        fetch: &Fetch<'_>,
    ) -> object_store::Result<Vec<Bytes>> {
        let mut parts: Vec<Vec<Part>> = ranges.iter().map(|r| vec![Part::gap(r.clone())]).collect();
        let mut shown = Shown::of(object, &parts);
        self.fetch_gaps(object, &mut parts, fetch, &mut shown)
            .await?;
        ranges
            .iter()
            .zip(parts)
            .map(|(range, parts)| join(object, range, &parts))
            .collect()
    }

    /// The bytes of `range`, if memory holds all of it now. A second look, counted as no hit
    /// or miss: the read's own lookup was counted.
    fn held_in_memory(&self, object: &ObjectVersion, range: &Range<u64>) -> Option<Bytes> {
        let pieces = self.lock_spans().get(object)?.cover(range.clone());
        let mut held = Vec::with_capacity(pieces.len());
        for (piece, entry) in pieces {
            let entry = entry?;
            let key = RangeKey {
                object: object.clone(),
                start: entry.start,
            };
            let buffer = self
                .inner
                .memory
                .get(&key)
                .filter(|b| b.len() as u64 == entry.end - entry.start)?;
            let from = (piece.start - entry.start) as usize;
            let to = (piece.end - entry.start) as usize;
            held.push(buffer.slice(from..to));
        }
        match held.as_slice() {
            [one] => Some(one.clone()),
            _ => Some(held.concat().into()),
        }
    }

    /// Fills the pieces memory lacked from the disk tier, and brings what it read into memory.
    /// Looked up and read on one blocking thread: what this process knows of the disk is
    /// checked first, and the object's directory listed again if that leaves gaps.
    async fn look_on_disk(&self, object: &ObjectVersion, parts: &mut [Vec<Part>]) {
        let Some(disk) = self.disk_for(object) else {
            return;
        };
        let gaps: Vec<Range<u64>> = parts
            .iter()
            .flatten()
            .filter(|p| p.found.is_none())
            .map(|p| p.range.clone())
            .collect();
        if gaps.is_empty() {
            return;
        }
        let (tier, version) = (Arc::clone(disk), object.clone());
        let found = tokio::task::spawn_blocking(move || {
            let covered = tier.cover(&version, &gaps)?;
            let mut read: HashMap<u64, Option<Bytes>> = HashMap::new();
            for (_, entry) in covered.iter().flatten() {
                if let Some(entry) = entry
                    && !read.contains_key(&entry.start)
                {
                    read.insert(entry.start, tier.read(&version, entry.clone()));
                }
            }
            Some((covered, read))
        })
        .await;
        let Ok(Some((covered, read))) = found else {
            return;
        };
        for (&start, bytes) in &read {
            if let Some(bytes) = bytes
                && self.promotes(bytes.len() as u64)
            {
                self.insert_memory(object, start, bytes.clone());
            }
        }
        // Split each gap by what the disk held (`covered` is in the order of the gaps).
        let mut covered = covered.into_iter();
        split_missing(parts, |_| {
            covered
                .next()
                .unwrap_or_default()
                .into_iter()
                .map(|(piece, entry)| {
                    let found = entry.and_then(|e| {
                        let bytes = read.get(&e.start)?.clone()?;
                        Some((bytes, e.start, Source::Disk))
                    });
                    Part {
                        range: piece,
                        found,
                    }
                })
                .collect()
        });
    }

    /// Whether a range of `len` bytes read from disk is offered to the memory tier: always
    /// while memory has room for it, else one read in [`PROMOTE_ONE_IN`]. Offering it costs
    /// an insert and an eviction, and when memory is full the frequency-based admission
    /// keeps out what is read no more often than what memory holds (a scan read again and
    /// again over a lake larger than memory): a range read often still comes up within a
    /// few reads, at a fraction of the cost of offering every one.
    pub(super) fn promotes(&self, len: u64) -> bool {
        let inner = &self.inner;
        inner.memory.weighted_size() + u64::from(super::memory_weight(len))
            <= inner.config.memory_bytes
            || inner
                .disk_reads
                .fetch_add(1, Relaxed)
                .is_multiple_of(PROMOTE_ONE_IN)
    }

    /// Fetches the pieces neither tier had and keeps them: what downloads of other reads
    /// already in the air bring is joined (`flights.rs`), the rest fetched in one call of
    /// `fetch`; a joined download that fails is fetched here after all, in a second call.
    async fn fetch_gaps(
        &self,
        object: &ObjectVersion,
        parts: &mut [Vec<Part>],
        fetch: &Fetch<'_>,
        shown: &mut Shown,
    ) -> object_store::Result<()> {
        let mut gaps: Vec<Range<u64>> = parts
            .iter()
            .flatten()
            .filter(|p| p.found.is_none())
            .map(|p| p.range.clone())
            .collect();
        if gaps.is_empty() {
            return Ok(());
        }
        gaps.sort_by_key(|g| g.start);
        let mut requests: Vec<Range<u64>> = Vec::new();
        for gap in gaps {
            match requests.last_mut() {
                Some(last)
                    if gap.start <= last.end.saturating_add(OBJECT_STORE_COALESCE_DEFAULT) =>
                {
                    last.end = last.end.max(gap.end);
                }
                _ => requests.push(gap),
            }
        }
        let (joined, own, claim) = self.inner.flights.claim(object, &requests);
        let mut pieces: Vec<(Range<u64>, Bytes, Source)> = Vec::new();
        if !own.is_empty() {
            // A download that landed between this read's lookups and its claim is no longer
            // in the air, and was kept before it landed: if memory now holds every range
            // claimed, they are served from there, not fetched a second time.
            let held: Option<Vec<Bytes>> =
                own.iter().map(|r| self.held_in_memory(object, r)).collect();
            match held {
                Some(bytes) => {
                    // Kept under `object`: of it.
                    claim.land(&bytes, Some(object));
                    shown.saw(Some(object));
                    let held = own.into_iter().zip(bytes);
                    pieces.extend(held.map(|(r, b)| (r, b, Source::Memory)));
                }
                None => {
                    let (fetched, source) = self.download(object, &own, claim, fetch).await?;
                    shown.saw(fetched.keep.as_ref());
                    let fetched = own.into_iter().zip(fetched.bytes);
                    pieces.extend(fetched.map(|(r, b)| (r, b, source)));
                }
            }
        }
        let mut failed = Vec::new();
        for j in joined {
            let range = j.range.clone();
            match j.wait().await {
                Some((bytes, of)) => {
                    shown.saw(of.as_ref());
                    pieces.push((range, bytes, Source::Store));
                }
                None => failed.push(range),
            }
        }
        if !failed.is_empty() {
            let fetched = self.fetch_checked(object, &failed, fetch).await?;
            self.keep(&failed, &fetched, None);
            shown.saw(fetched.keep.as_ref());
            let fetched = failed.into_iter().zip(fetched.bytes);
            pieces.extend(fetched.map(|(r, b)| (r, b, Source::Store)));
        }
        pieces.sort_by_key(|(r, _, _)| r.start);
        // Each gap is covered by the pieces fetched or joined, each a slice of its buffer.
        split_missing(parts, |gap| {
            let first = pieces.partition_point(|(r, _, _)| r.end <= gap.range.start);
            pieces[first..]
                .iter()
                .take_while(|(r, _, _)| r.start < gap.range.end)
                .map(|(r, bytes, source)| Part {
                    range: r.start.max(gap.range.start)..r.end.min(gap.range.end),
                    found: Some((bytes.clone(), r.start, *source)),
                })
                .collect()
        });
        Ok(())
    }

    /// Downloads `own`, the ranges this read claimed as flights, on a task of its own: the
    /// bytes land for whoever joined, and are kept, however this read is polled. If this read
    /// goes away (its query was cancelled or stopped polling for good), the download goes on
    /// while others wait for it, and is aborted when nobody does. With a disk tier, the
    /// ranges are first claimed against the other processes sharing it: if one of them was
    /// downloading them, this waits for its download; bytes on disk once claimed are read
    /// from there.
    /// Returns the bytes and where they came from.
    async fn download(
        &self,
        object: &ObjectVersion,
        own: &[Range<u64>],
        claim: Claim,
        fetch: &Fetch<'_>,
    ) -> object_store::Result<(Fetched, Source)> {
        let fetching = fetch(own.to_vec());
        let joiners = claim.watchers();
        let (cache, object, own) = (self.clone(), object.clone(), own.to_vec());
        let task = async move {
            let mut shared = None;
            if let Some(disk) = cache.disk_for(&object) {
                // Looked for again once claimed, waited or not: another process may have
                // written them between this read's lookup and its claim.
                let (held, _) = disk.claim(&object, &own).await;
                if let Some(bytes) = cache.read_from_disk(&object, &own).await {
                    claim.land(&bytes, Some(&object));
                    let keep = Some(object);
                    return Ok((Fetched { bytes, keep }, Source::Disk));
                }
                shared = Some(Arc::new(held));
            }
            // On an error, `claim` is dropped: its flights close, and their joiners fetch.
            let fetched = check(&object, &own, fetching.await?)?;
            // Kept before the flights land and leave the air, so a read that finds no
            // flight for these bytes finds them kept (see `fetch_gaps`).
            cache.keep(&own, &fetched, shared);
            claim.land(&fetched.bytes, fetched.keep.as_ref());
            Ok((fetched, Source::Store))
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return task.await;
        };
        let running = Running {
            task: runtime.spawn(task),
            joiners,
        };
        running.finish().await
    }

    /// Every byte of `ranges` of `object`, if the disk tier holds them all now.
    async fn read_from_disk(
        &self,
        object: &ObjectVersion,
        ranges: &[Range<u64>],
    ) -> Option<Vec<Bytes>> {
        let mut parts: Vec<Vec<Part>> = ranges.iter().map(|r| vec![Part::gap(r.clone())]).collect();
        self.look_on_disk(object, &mut parts).await;
        ranges
            .iter()
            .zip(&parts)
            .map(|(range, parts)| join(object, range, parts).ok())
            .collect()
    }

    /// `fetch` of `requests`, checked to return one buffer of the right length per range.
    async fn fetch_checked(
        &self,
        object: &ObjectVersion,
        requests: &[Range<u64>],
        fetch: &Fetch<'_>,
    ) -> object_store::Result<Fetched> {
        check(object, requests, fetch(requests.to_vec()).await?)
    }

    /// Keeps fetched bytes under the version the fetch named, if any; `claim` (the
    /// download's claim against other processes) is released once they are on disk.
    fn keep(&self, ranges: &[Range<u64>], fetched: &Fetched, claim: Option<Arc<DiskClaim>>) {
        if let Some(keep) = &fetched.keep {
            for (range, bytes) in ranges.iter().zip(&fetched.bytes) {
                self.insert(keep, range.start, bytes.clone(), claim.clone());
            }
        }
    }
}

/// `fetched`, if it holds one buffer of the right length per range of `requests`.
fn check(
    object: &ObjectVersion,
    requests: &[Range<u64>],
    fetched: Fetched,
) -> object_store::Result<Fetched> {
    if fetched.bytes.len() != requests.len()
        || fetched
            .bytes
            .iter()
            .zip(requests)
            .any(|(b, r)| b.len() as u64 != r.end - r.start)
    {
        return Err(object_store::Error::Generic {
            store: "RangeCache",
            source: format!(
                "the store returned other lengths than the ranges asked of {}",
                object.path()
            )
            .into(),
        });
    }
    Ok(fetched)
}

/// A download running on its own task, and who else waits for its flights.
struct Running {
    task: tokio::task::JoinHandle<object_store::Result<(Fetched, Source)>>,
    joiners: super::flights::Watchers,
}

impl Running {
    async fn finish(mut self) -> object_store::Result<(Fetched, Source)> {
        let joined = (&mut self.task).await;
        joined.unwrap_or_else(|e| {
            Err(object_store::Error::Generic {
                store: "RangeCache",
                source: format!("a download failed to finish: {e}").into(),
            })
        })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Its reader went away: the download goes on only for those who joined it.
        if !self.task.is_finished() && !self.joiners.any() {
            self.task.abort();
        }
    }
}

/// The version the parts of one read were shown to be of, as they come.
pub(super) struct Shown {
    version: Option<ObjectVersion>,
    /// Whether a part showed none, or another.
    mixed: bool,
}

impl Shown {
    /// The parts found already (memory, disk) were kept under `object`.
    fn of(object: &ObjectVersion, parts: &[Vec<Part>]) -> Self {
        let found = parts.iter().flatten().any(|p| p.found.is_some());
        Self {
            version: found.then(|| object.clone()),
            mixed: false,
        }
    }

    fn saw(&mut self, version: Option<&ObjectVersion>) {
        match (version, &self.version) {
            (None, _) => self.mixed = true,
            (Some(v), None) => self.version = Some(v.clone()),
            (Some(v), Some(seen)) if v != seen => self.mixed = true,
            _ => {}
        }
    }

    fn agreed(self) -> Option<ObjectVersion> {
        self.version.filter(|_| !self.mixed)
    }
}

/// Replaces each piece of `parts` not found yet by the pieces `split` makes of it, in order.
fn split_missing(parts: &mut [Vec<Part>], mut split: impl FnMut(Part) -> Vec<Part>) {
    for range_parts in parts.iter_mut() {
        let mut out = Vec::with_capacity(range_parts.len());
        for part in range_parts.drain(..) {
            match part.found {
                Some(_) => out.push(part),
                None => out.extend(split(part)),
            }
        }
        *range_parts = out;
    }
}

/// Joins the pieces of `range`: a slice of one buffer, or a copy of several.
fn join(object: &ObjectVersion, range: &Range<u64>, parts: &[Part]) -> object_store::Result<Bytes> {
    let missing = || object_store::Error::Generic {
        store: "RangeCache",
        source: format!("bytes {range:?} of {} were not found", object.path()).into(),
    };
    if let [part] = parts {
        return part.bytes().ok_or_else(missing);
    }
    let len = usize::try_from(range.end.saturating_sub(range.start)).map_err(|_| missing())?;
    let mut joined = BytesMut::with_capacity(len);
    for part in parts {
        joined.extend_from_slice(&part.bytes().ok_or_else(missing)?);
    }
    Ok(joined.freeze())
}
