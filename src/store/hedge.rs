//! Hedged requests: a GET still waiting for its first byte past the 95th percentile of this
//! store's recent ones is sent a second time; the first answer wins and the other request is
//! dropped (its connection closed). Object stores have long tails (a few requests in a
//! hundred take many times the median), and a scan waits for its slowest read, so one slow
//! request in a few hundred sets the query's time; the second request rarely is slow too.
//!
//! Bounded: at most one request in [`MAX_SHARE`] is hedged, none before [`MIN_SAMPLES`]
//! requests have shown what is usual, and never once the answer's bytes are arriving (only
//! the wait for the response is raced, not its body). The second request is the first one's
//! copy, guarded by the same `If-Match`, so a hedge reads the same version or fails the same
//! way.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::{Either, select};
use futures::stream::{FuturesUnordered, StreamExt};

use crate::stats::StoreStats;

/// Recent times to first byte a store's percentile is taken over.
const WINDOW: usize = 256;
/// Times a store must have shown before any of its requests is hedged. Few, since a new
/// process's first scan is the one that waits longest; with few, the percentile is their
/// slowest.
const MIN_SAMPLES: usize = 8;
/// How often a request that began before enough times were known looks again.
const LOOK_AGAIN: Duration = Duration::from_millis(5);
/// A request still waiting past this share of the recent ones (95th percentile) is hedged.
const PERCENTILE: f64 = 0.95;
/// At most one request in this many gets a copy (5% more requests).
const MAX_SHARE: u64 = 20;
/// A request and its copies: a copy that is slow too gets one more, a threshold later, since
/// tails strike requests independently.
const MAX_ATTEMPTS: usize = 3;

/// Hedging figures of every store of a `LakeCache`, and whether it hedges at all.
#[derive(Debug, Default)]
pub(crate) struct Hedges {
    enabled: bool,
    /// GETs sent for the versioned read (first requests only).
    pub requests: AtomicU64,
    /// Second requests sent.
    pub hedged: AtomicU64,
    /// Second requests that answered first.
    pub won: AtomicU64,
}

impl Hedges {
    /// Hedging on or off for every store of a `LakeCache`.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            ..Self::default()
        }
    }

    /// The figures now.
    pub fn snapshot(&self) -> StoreStats {
        StoreStats {
            gets: self.requests.load(Relaxed),
            hedged: self.hedged.load(Relaxed),
            hedges_won: self.won.load(Relaxed),
        }
    }
}

/// One store instance's recent response times and hedging budget.
#[derive(Debug)]
pub(crate) struct Hedger {
    figures: Arc<Hedges>,
    recent: Mutex<VecDeque<Duration>>,
    /// The 95th percentile of `recent` in nanoseconds, worked out as each answer comes (0
    /// until [`MIN_SAMPLES`] are known), so a waiting request only reads it.
    threshold_nanos: AtomicU64,
    /// The median of `recent` in nanoseconds (0 until one is known): the store's typical
    /// wait, which the prefetcher sizes its downloads by.
    median_nanos: AtomicU64,
    requests: AtomicU64,
    hedged: AtomicU64,
}

impl Hedger {
    /// A store's hedger, reporting into `figures`.
    pub fn new(figures: Arc<Hedges>) -> Self {
        Self {
            figures,
            recent: Mutex::new(VecDeque::with_capacity(WINDOW)),
            threshold_nanos: AtomicU64::new(0),
            median_nanos: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            hedged: AtomicU64::new(0),
        }
    }

    /// Runs `request` (a GET up to its response, not its body), sending it again if it is
    /// still waiting past the recent 95th percentile and the budget allows (and once more if
    /// the copy waits as long); the first answer wins, the others are dropped.
    pub async fn run<T, E, F, Fut>(&self, request: F) -> Result<T, E>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.requests.fetch_add(1, Relaxed);
        self.figures.requests.fetch_add(1, Relaxed);
        let began = Instant::now();
        if !self.figures.enabled {
            return self.noted(began, request().await);
        }
        let mut attempts = FuturesUnordered::new();
        attempts.push(attempt(0, &self.figures, request()));
        // When the latest copy went out: the next one waits a threshold from then. A request
        // that began before the store's times were known (the first ones of a process) looks
        // again as they come.
        let mut sent_at = began;
        loop {
            let wait = match self.threshold() {
                Some(after) => after.checked_sub(sent_at.elapsed()),
                None => Some(LOOK_AGAIN),
            };
            let wait = match wait {
                Some(left) if !left.is_zero() => left,
                // Past the threshold: one more copy, if the budget allows, else just wait.
                _ if attempts.len() < MAX_ATTEMPTS && self.take_budget() => {
                    let copy = attempts.len();
                    attempts.push(attempt(copy, &self.figures, request()));
                    sent_at = Instant::now();
                    continue;
                }
                _ => Duration::MAX,
            };
            let next = attempts.next();
            let answered = match wait {
                Duration::MAX => next.await,
                wait => match select(next, pin!(tokio::time::sleep(wait))).await {
                    Either::Left((answered, _)) => answered,
                    Either::Right(_) => continue,
                },
            };
            if let Some((copy, answer)) = answered {
                if copy > 0 {
                    self.figures.won.fetch_add(1, Relaxed);
                }
                return self.noted(began, answer);
            }
        }
    }

    /// How long a request may wait before it is hedged, once enough times are known.
    fn threshold(&self) -> Option<Duration> {
        match self.threshold_nanos.load(Relaxed) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// Takes one hedge from the budget: at most one in [`MAX_SHARE`] requests so far.
    fn take_budget(&self) -> bool {
        let requests = self.requests.load(Relaxed);
        self.hedged
            .fetch_update(Relaxed, Relaxed, |h| {
                ((h + 1) * MAX_SHARE <= requests).then_some(h + 1)
            })
            .is_ok()
    }

    /// Records how long an answer took (since the first request went out) if it came.
    fn noted<T, E>(&self, began: Instant, answer: Result<T, E>) -> Result<T, E> {
        if answer.is_ok() {
            self.record(began.elapsed());
        }
        answer
    }

    /// The median wait for a response of the recent requests, once one has answered.
    pub fn typical_wait(&self) -> Option<Duration> {
        match self.median_nanos.load(Relaxed) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// Adds a response time to the window and works out its median and, when hedging, its
    /// 95th percentile.
    fn record(&self, time: Duration) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() == WINDOW {
            recent.pop_front();
        }
        recent.push_back(time);
        let mut times: Vec<Duration> = recent.iter().copied().collect();
        drop(recent);
        let enough = times.len() >= MIN_SAMPLES;
        let mut nth = |share: f64| {
            let at = ((times.len() as f64 * share).ceil() as usize).clamp(1, times.len()) - 1;
            let (_, nth, _) = times.select_nth_unstable(at);
            u64::try_from(nth.as_nanos()).unwrap_or(u64::MAX).max(1)
        };
        self.median_nanos.store(nth(0.5), Relaxed);
        if self.figures.enabled && enough {
            self.threshold_nanos.store(nth(PERCENTILE), Relaxed);
        }
    }
}

/// `request`'s answer with which attempt it was. A copy is counted as hedged once it goes
/// out (is first polled): one the first answer beat to it never reached the store.
async fn attempt<F: Future>(attempt: usize, figures: &Hedges, request: F) -> (usize, F::Output) {
    if attempt > 0 {
        figures.hedged.fetch_add(1, Relaxed);
    }
    (attempt, request.await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn hedger() -> Hedger {
        Hedger::new(Arc::new(Hedges::new(true)))
    }

    /// Requests that answer after `slow(n)` for the n-th request sent.
    async fn send(h: &Hedger, sent: &AtomicUsize, slow: impl Fn(usize) -> Duration) -> usize {
        h.run(|| {
            let n = sent.fetch_add(1, Relaxed);
            let wait = slow(n);
            async move {
                tokio::time::sleep(wait).await;
                Ok::<usize, ()>(n)
            }
        })
        .await
        .unwrap()
    }

    /// A hedger that has seen `n` answers of `time` each.
    fn seasoned(n: usize, time: Duration) -> Hedger {
        let h = hedger();
        for _ in 0..n {
            h.record(time);
        }
        h.requests.store(n as u64, Relaxed);
        h
    }

    #[tokio::test]
    async fn a_slow_request_is_sent_again_and_the_second_answer_wins() {
        let h = seasoned(100, Duration::from_millis(50));
        let sent = AtomicUsize::new(0);
        // The first request would take 2 s; its copy answers 1 ms after it is sent, well
        // within the usual 50 ms (so a loaded machine does not make it slow enough for a
        // third).
        let began = Instant::now();
        let n = send(&h, &sent, |n| match n {
            0 => Duration::from_secs(2),
            _ => Duration::from_millis(1),
        })
        .await;
        assert_eq!(n, 1, "the second request's answer");
        assert!(
            began.elapsed() < Duration::from_secs(1),
            "{:?}",
            began.elapsed()
        );
        assert_eq!(h.figures.hedged.load(Relaxed), 1);
        assert_eq!(h.figures.won.load(Relaxed), 1);
    }

    #[tokio::test]
    async fn requests_sent_before_any_answer_are_hedged_once_answers_come() {
        // A new process's first requests go out at once, before any time is known.
        let h = hedger();
        let sent = AtomicUsize::new(0);
        let began = Instant::now();
        let answers = futures::future::join_all((0..41).map(|_| {
            send(&h, &sent, |n| match n {
                0 => Duration::from_secs(2),
                _ => Duration::from_millis(2),
            })
        }))
        .await;
        assert!(
            began.elapsed() < Duration::from_secs(1),
            "{:?}",
            began.elapsed()
        );
        assert!(
            answers.iter().all(|&n| n != 0),
            "the slow one was answered by its copy"
        );
    }

    #[tokio::test]
    async fn hedges_stay_within_one_request_in_twenty() {
        let h = seasoned(100, Duration::from_millis(1));
        let sent = AtomicUsize::new(0);
        // Every request from now on is slower than all known: only the budget stops hedging.
        for _ in 0..60 {
            send(&h, &sent, |_| Duration::from_millis(30)).await;
        }
        let (requests, hedged) = (h.requests.load(Relaxed), h.hedged.load(Relaxed));
        assert!(
            hedged > 0 && hedged * MAX_SHARE <= requests,
            "{hedged} of {requests}"
        );
        assert_eq!(sent.load(Relaxed) as u64, 60 + hedged);
    }

    #[tokio::test]
    async fn nothing_is_hedged_when_hedging_is_off() {
        let h = Hedger::new(Arc::new(Hedges::new(false)));
        let sent = AtomicUsize::new(0);
        for _ in 0..60 {
            send(&h, &sent, |n| {
                Duration::from_millis(if n % 10 == 0 { 100 } else { 1 })
            })
            .await;
        }
        assert_eq!(sent.load(Relaxed), 60);
        // The typical wait is still known (the prefetcher sizes its downloads by it): the
        // median, not pulled up by the slow tenth.
        let typical = h.typical_wait().expect("answers were recorded");
        assert!(
            typical >= Duration::from_millis(1) && typical < Duration::from_millis(50),
            "{typical:?}"
        );
    }
}
