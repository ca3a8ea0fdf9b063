//! [`FileLease`]: what a reader holds while a file is open, its way to the scan's prefetched
//! bytes. The last lease of a scan to go ends the scan after a short grace period.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use bytes::Bytes;
use object_store::path::Path;
use parquet::file::metadata::ParquetMetaData;
use tokio::runtime::Handle;

use super::queue::Work;
use super::{Download, GRACE, Scan};
use crate::object::ObjectVersion;

/// What a reader holds while a file is open: its way to the scan's prefetched bytes.
#[derive(Debug)]
pub(crate) struct FileLease {
    scan: Arc<Scan>,
    path: Path,
    generation: u64,
    runtime: Handle,
    /// Column-data reads this reader has made.
    data_reads: AtomicUsize,
}

/// Prefetched bytes for one requested range: pieces of downloads, in order.
type Parts = Vec<(Download, Range<usize>)>;

impl FileLease {
    pub(super) fn new(scan: Arc<Scan>, path: Path, generation: u64, runtime: Handle) -> Self {
        scan.figures.leased();
        Self {
            scan,
            path,
            generation,
            runtime,
            data_reads: AtomicUsize::new(0),
        }
    }

    /// The bytes of each of `ranges` of `version` (the version the reader reads at) that
    /// prefetching covers (already here, under way, or queued and started now, all before any
    /// is awaited); `None` for those the reader should read itself, among them any a download
    /// brought of another version. `data` marks a read of column data (not of a footer, page
    /// index or bloom filter): every such read after this reader's first shows the scan reads
    /// on.
    pub(crate) async fn read_all(
        &self,
        version: &ObjectVersion,
        ranges: &[Range<u64>],
        data: bool,
    ) -> Vec<Option<Bytes>> {
        let covered: Vec<Option<Parts>> = ranges.iter().map(|r| self.cover(r)).collect();
        if data && self.data_reads.fetch_add(1, Relaxed) > 0 {
            let asked: u64 = ranges.iter().map(|r| r.end.saturating_sub(r.start)).sum();
            let mut state = self.scan.lock();
            if state.generation == self.generation {
                state.proven += asked;
                self.scan.pump(&mut state, &self.runtime);
            }
        }
        let mut found = Vec::with_capacity(ranges.len());
        for (range, parts) in ranges.iter().zip(covered) {
            found.push(match parts {
                Some(parts) => self.join(version, range, parts).await,
                None => None,
            });
        }
        found
    }

    /// The bytes of `range` of `version` from the downloads that cover it, or `None` if one
    /// failed or brought another version's bytes.
    async fn join(
        &self,
        version: &ObjectVersion,
        range: &Range<u64>,
        parts: Parts,
    ) -> Option<Bytes> {
        let began = Instant::now();
        let mut pieces = Vec::with_capacity(parts.len());
        for (download, slice) in parts {
            let waiting = download.peek().is_none();
            let landed = download.await?;
            if waiting {
                self.scan.figures.waited(began.elapsed());
            }
            if &landed.version != version {
                // The object was rewritten while the download was under way, and the reader
                // pinned the new version: those bytes are not its to read.
                self.scan.reads.caches().handles.count_version_change();
                return None;
            }
            pieces.push(landed.bytes.slice(slice));
        }
        let bytes = match pieces.len() {
            1 => pieces.pop()?,
            _ => {
                let mut joined = Vec::with_capacity((range.end - range.start) as usize);
                for piece in &pieces {
                    joined.extend_from_slice(piece);
                }
                Bytes::from(joined)
            }
        };
        self.scan.figures.used(bytes.len() as u64);
        Some(bytes)
    }

    /// Tells the scan the file's footer, so the pieces DataFusion is about to read are known
    /// before it asks for them.
    pub(crate) fn footer_known(&self, metadata: &Arc<ParquetMetaData>) {
        self.scan
            .queue_pieces(self.generation, &self.path, metadata);
        let mut state = self.scan.lock();
        self.scan.pump(&mut state, &self.runtime);
    }

    /// The downloads covering `range`, starting any that are still queued.
    fn cover(&self, range: &Range<u64>) -> Option<Parts> {
        let scan = &self.scan;
        let mut state = scan.lock();
        if state.generation != self.generation || !state.running || range.start >= range.end {
            return None;
        }
        let entry = state.files.get(&self.path)?;
        // The units that overlap the range, in order, must cover it without a gap.
        let mut covering = Vec::new();
        let mut at = range.start;
        let first = entry
            .units
            .range(..=range.start)
            .next_back()
            .map(|(s, _)| *s)?;
        for (&start, unit) in entry.units.range(first..) {
            if at >= range.end {
                break;
            }
            if start > at || unit.range.end <= at {
                return None;
            }
            covering.push(start);
            at = unit.range.end;
        }
        if at < range.end {
            return None;
        }
        let mut parts = Vec::with_capacity(covering.len());
        for start in covering {
            let unit = state.files.get(&self.path)?.units.get(&start)?;
            let download = match &unit.download {
                Some(d) => d.clone(),
                None => {
                    // A reader wants it now: start it ahead of the queue if the budget allows,
                    // else the reader reads it itself.
                    let bytes = unit.range.end - unit.range.start;
                    let rank = state.files.get(&self.path)?.rank;
                    let key = state.queued(rank).into_iter().find(|k| {
                        matches!(&state.queue[k], Work::Unit(p, s) if *p == self.path && *s == start)
                    });
                    if let Some(key) = key {
                        state.queue.remove(&key);
                    }
                    if !scan.reserve(&mut state, bytes) {
                        // The reader reads these bytes now; fetching them later would waste.
                        state.files.get_mut(&self.path)?.units.remove(&start);
                        return None;
                    }
                    scan.launch_unit(&mut state, &self.path, start, bytes, &self.runtime)?
                }
            };
            let unit = state.files.get_mut(&self.path)?.units.get_mut(&start)?;
            let claimed = unit.claim();
            let lo = range.start.max(unit.range.start);
            let hi = range.end.min(unit.range.end);
            unit.served += hi - lo;
            let offset = unit.range.start;
            let read_through = !unit.whole && unit.served >= unit.range.end - unit.range.start;
            parts.push((download, (lo - offset) as usize..(hi - offset) as usize));
            state.ahead = state.ahead.saturating_sub(claimed);
            if read_through {
                // Every byte of this piece has been handed out: its buffer is the reader's now.
                if let Some(unit) = state
                    .files
                    .get_mut(&self.path)
                    .and_then(|e| e.units.remove(&start))
                {
                    scan.release(&mut state, unit.reserved);
                }
            }
        }
        Some(parts)
    }
}

impl Drop for FileLease {
    fn drop(&mut self) {
        let scan = &self.scan;
        scan.figures.unleased();
        let mut state = scan.lock();
        if state.generation != self.generation {
            return;
        }
        let done = match state.files.get_mut(&self.path) {
            Some(entry) => {
                entry.leases = entry.leases.saturating_sub(1);
                entry.done()
            }
            None => false,
        };
        if done {
            scan.release_file(&mut state, &self.path);
        }
        state.leases = state.leases.saturating_sub(1);
        if state.leases == 0 {
            let (generation, taken) = (state.generation, state.leases_taken);
            let scan = Arc::clone(scan);
            drop(state);
            self.runtime.spawn(async move {
                tokio::time::sleep(GRACE).await;
                scan.stop_if_idle(generation, taken);
            });
        } else {
            scan.pump(&mut state, &self.runtime);
        }
    }
}
