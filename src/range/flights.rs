//! Downloads shared across reads: a read whose gaps another read is already fetching (the
//! same object version, overlapping bytes) waits for that download instead of making its own
//! request, from any session or query of the cache. Each download in the air is a *flight*:
//! the range it fetches and a channel its bytes arrive on.
//!
//! Flights are claimed under one lock, so the flights of a version never overlap: a read
//! joins the parts of its gaps that flights already bring and claims the rest, which it
//! fetches itself. A flight is keyed by the exact version its reads asked for, and its fetch
//! is checked as the joiner's own would be: guarded by `If-Match` of the version's e_tag, or,
//! for a version known by size and modification time alone (a listing without e_tags), with
//! the response checked against them. A joined read thus gets bytes of the version it asked
//! for, fetched while it waited. A flight's fetch runs on a task of its own (`read.rs`), so a
//! joiner never waits on another query being polled. A flight whose fetch fails or is
//! aborted (nobody waits for it any more) closes its channel, and whoever joined it fetches
//! those bytes itself.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::watch;

use crate::object::ObjectVersion;

/// What a flight's channel carries: nothing yet, then its bytes and the version its
/// responses showed (`None`: they showed none, or not one alike).
type Arrival = Option<(Bytes, Option<ObjectVersion>)>;

/// The flights in the air, by object version. Each is removed when its fetch ends.
#[derive(Debug, Default)]
pub(super) struct Flights {
    flights: Mutex<HashMap<ObjectVersion, Vec<Flight>>>,
    next_id: AtomicU64,
    /// Ranges a read got from another read's download instead of a request of its own.
    pub(super) joined: AtomicU64,
    /// Their bytes.
    pub(super) joined_bytes: AtomicU64,
}

#[derive(Debug)]
struct Flight {
    id: u64,
    range: Range<u64>,
    arrival: watch::Receiver<Arrival>,
}

/// A part of a read that another read's flight brings.
pub(super) struct Joined {
    /// The bytes of the object this read wants from the flight.
    pub(super) range: Range<u64>,
    flight: Range<u64>,
    arrival: watch::Receiver<Arrival>,
}

impl Joined {
    /// The bytes of `self.range`, and the version the flight's responses showed, once the
    /// flight lands; `None` if it failed or was dropped.
    pub(super) async fn wait(mut self) -> Option<(Bytes, Option<ObjectVersion>)> {
        let arrived = self.arrival.wait_for(Option::is_some).await.ok()?;
        let (buffer, shown) = arrived.as_ref()?.clone();
        let from = (self.range.start - self.flight.start) as usize;
        let to = (self.range.end - self.flight.start) as usize;
        (to <= buffer.len()).then(|| (buffer.slice(from..to), shown))
    }
}

/// The flights a read claimed: it must fetch their ranges and [`Claim::land`] them. Dropped
/// unlanded (a failed or cancelled fetch), its flights close and are removed.
pub(super) struct Claim {
    flights: Arc<Flights>,
    object: ObjectVersion,
    own: Vec<(u64, watch::Sender<Arrival>)>,
}

/// Who waits for the flights of a claim, besides its own read.
pub(super) struct Watchers(Vec<watch::Sender<Arrival>>);

impl Watchers {
    /// Whether another read joined one of the flights.
    pub(super) fn any(&self) -> bool {
        // Each flight's own entry in the map holds one receiver.
        self.0.iter().any(|s| s.receiver_count() > 1)
    }
}

impl Flights {
    /// Splits `requests` of `object` (sorted, disjoint) into the parts flights in the air
    /// bring, and the parts this read fetches itself, claimed as its flights (sorted).
    pub(super) fn claim(
        self: &Arc<Self>,
        object: &ObjectVersion,
        requests: &[Range<u64>],
    ) -> (Vec<Joined>, Vec<Range<u64>>, Claim) {
        let mut joined = Vec::new();
        let mut fetch = Vec::new();
        let mut claim = Claim {
            flights: Arc::clone(self),
            object: object.clone(),
            own: Vec::new(),
        };
        let mut map = self.lock();
        let flights = map.entry(object.clone()).or_default();
        let mut own_flights = Vec::new();
        for request in requests {
            let mut at = request.start;
            // `flights` is sorted by start and disjoint.
            for f in flights.iter() {
                if f.range.end <= at || f.range.start >= request.end {
                    continue;
                }
                if f.range.start > at {
                    fetch.push(at..f.range.start);
                }
                let end = f.range.end.min(request.end);
                joined.push(Joined {
                    range: f.range.start.max(at)..end,
                    flight: f.range.clone(),
                    arrival: f.arrival.clone(),
                });
                at = end;
            }
            if at < request.end {
                fetch.push(at..request.end);
            }
        }
        for range in &fetch {
            let id = self.next_id.fetch_add(1, Relaxed);
            let (sender, arrival) = watch::channel(None);
            claim.own.push((id, sender));
            own_flights.push(Flight {
                id,
                range: range.clone(),
                arrival,
            });
        }
        flights.extend(own_flights);
        flights.sort_by_key(|f| f.range.start);
        if flights.is_empty() {
            map.remove(object);
        }
        drop(map);
        for j in &joined {
            self.joined.fetch_add(1, Relaxed);
            self.joined_bytes
                .fetch_add(j.range.end - j.range.start, Relaxed);
        }
        (joined, fetch, claim)
    }

    /// Whether no flight is in the air.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectVersion, Vec<Flight>>> {
        self.flights.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Claim {
    /// Who else waits for these flights, to tell whether a download nobody else wants may be
    /// aborted. Holding it keeps the flights' channels open: drop it once the download ended.
    pub(super) fn watchers(&self) -> Watchers {
        Watchers(self.own.iter().map(|(_, s)| s.clone()).collect())
    }

    /// Hands the fetched bytes (one buffer per claimed range, in order), of the version
    /// `shown` (what their responses showed), to whoever joined.
    pub(super) fn land(mut self, fetched: &[Bytes], shown: Option<&ObjectVersion>) {
        for ((_, sender), bytes) in self.own.iter().zip(fetched) {
            sender.send_replace(Some((bytes.clone(), shown.cloned())));
        }
        self.remove();
    }

    fn remove(&mut self) {
        if self.own.is_empty() {
            return;
        }
        let mut map = self.flights.lock();
        if let Some(flights) = map.get_mut(&self.object) {
            flights.retain(|f| !self.own.iter().any(|(id, _)| *id == f.id));
            if flights.is_empty() {
                map.remove(&self.object);
            }
        }
        drop(map);
        // Dropping the senders closes unlanded flights: their joiners fetch for themselves.
        self.own.clear();
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.remove();
    }
}
