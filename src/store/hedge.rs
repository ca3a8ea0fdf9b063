//! Hedged requests: a GET (or a HEAD) still waiting for its first byte past the 95th
//! percentile of this store's recent ones (of every instance of it) is sent a second time;
//! the first success wins and the other request is dropped (its connection closed), and the
//! read fails only when every attempt has failed.
//!
//! Only requests slow at the store are copied, not those queued behind their own burst: a
//! registration sends hundreds of footer reads at once, and on a small machine their answers
//! spread over several round trips while each waits for the ones sent before it. A request
//! counts as on its way to the store once all but one in [`STILL_AHEAD`] of the requests that
//! were waiting when it was sent have been answered; its wait (for hedging, and for the
//! percentile) is counted from then. Object stores have long tails (a few requests in a
//! hundred take many times the median), and a scan waits for its slowest read, so one slow
//! request in a few hundred sets the query's time; the second request rarely is slow too.
//!
//! Bounded: at most one request in [`MAX_SHARE`] of a store (all its instances) is hedged,
//! none before [`MIN_SAMPLES`] requests have shown what is usual, and never once the answer's
//! bytes are arriving (only the wait for the response is raced, not its body). The second
//! request is the first one's copy, guarded by the same `If-Match`, so a hedge reads the same
//! version or fails the same way.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::future::{Either, select};
use futures::stream::{FuturesUnordered, StreamExt};

use crate::object::StoreKey;
use crate::stats::StoreStats;

/// Recent times to first byte a store's percentile is taken over.
const WINDOW: usize = 256;
/// Times a store must have shown before any of its requests is hedged. Few, since a new
/// process's first scan is the one that waits longest; with few, the percentile is their
/// slowest.
const MIN_SAMPLES: usize = 8;
/// How often a request that began before enough times were known, or is still behind the
/// requests sent before it, looks again (at least: a quarter of the threshold once known).
const LOOK_AGAIN: Duration = Duration::from_millis(5);
/// A request still waiting past this share of the recent ones (95th percentile) is hedged.
const PERCENTILE: f64 = 0.95;
/// At most one request in this many gets a copy (5% more requests).
const MAX_SHARE: u64 = 20;
/// A request is on its way to the store, no longer queued behind its burst, once all but one
/// in this many of the requests waiting when it was sent are answered. Not the last few: the
/// last of a burst are those slow at the store, so a request waiting for them is counted
/// from the burst's own tail and copied a whole threshold late (one in twenty: first contact
/// on the tail bench 1.30-1.32x its time without slow requests; one in four: 1.08-1.09x).
/// Not half: with half of its queue still ahead, a request's queueing counts as the store's
/// time and queued requests get the copies (one in two: the budget spent, 2.05x). Each figure
/// is this constant changed and `cargo bench --bench tail -- --first-contact-only 1 --runs 60`.
const STILL_AHEAD: u64 = 4;
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
    /// The response times of each store, shared by its instances (see [`Hedges::times_of`]).
    times: Mutex<HashMap<StoreKey, Weak<Times>>>,
}

impl Hedges {
    /// Hedging on or off for every store of a `LakeCache`.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            ..Self::default()
        }
    }

    /// The response times and hedging budget of the store `store` names, shared by every
    /// instance of it: how long a store takes to answer is its endpoint's, whoever's
    /// credentials ask, and the copies' load is the endpoint's too. A new store identity (a
    /// tenant's own instance for a bucket) then hedges from its first request: with a window
    /// and budget of its own, its first reads (before [`MIN_SAMPLES`] answers, and twenty
    /// requests, of its own) could not be hedged, and one slow among them held up its whole
    /// first query.
    fn times_of(&self, store: &StoreKey) -> Arc<Times> {
        let mut all = lock(&self.times);
        if let Some(times) = all.get(store).and_then(Weak::upgrade) {
            return times;
        }
        // Entries of stores no instance reads any more go as new ones come.
        all.retain(|_, t| t.strong_count() > 0);
        let times = Arc::new(Times::default());
        all.insert(store.clone(), Arc::downgrade(&times));
        times
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

/// A store's recent response times and hedging budget, shared by its instances.
#[derive(Debug, Default)]
struct Times {
    /// Requests sent to the store, and copies of them: at most one in [`MAX_SHARE`].
    requests: AtomicU64,
    hedged: AtomicU64,
    recent: Mutex<VecDeque<Duration>>,
    /// The 95th percentile of `recent` in nanoseconds, worked out as each answer comes (0
    /// until [`MIN_SAMPLES`] are known), so a waiting request only reads it.
    threshold_nanos: AtomicU64,
    /// The median of `recent` in nanoseconds (0 until one is known): the store's typical
    /// wait, which the prefetcher sizes its downloads by.
    median_nanos: AtomicU64,
}

/// One store instance's hedging: the store's recent response times and budget, and the
/// instance's own requests waiting.
#[derive(Debug)]
pub(crate) struct Hedger {
    figures: Arc<Hedges>,
    times: Arc<Times>,
    /// The number of the next request sent.
    next: AtomicU64,
    /// The requests waiting for their answer now, by number.
    waiting: Mutex<BTreeSet<u64>>,
}

/// One request waiting: its number, and how many were waiting when it was sent.
struct Waiting<'a> {
    hedger: &'a Hedger,
    number: u64,
    ahead: usize,
}

impl Waiting<'_> {
    /// Whether the requests sent before this one are answered, all but one in [`STILL_AHEAD`]
    /// of those that were waiting when it was sent: it is not queued behind them any more.
    fn on_its_way(&self) -> bool {
        let waiting = lock(&self.hedger.waiting);
        let before = waiting.range(..self.number).count();
        before as u64 * STILL_AHEAD <= self.ahead as u64
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.hedger.waiting).remove(&self.number);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Hedger {
    /// The hedger of an instance of `store`, reporting into `figures`, over the store's
    /// response times and budget (see [`Hedges::times_of`]).
    pub fn new(figures: Arc<Hedges>, store: &StoreKey) -> Self {
        Self {
            times: figures.times_of(store),
            figures,
            next: AtomicU64::new(0),
            waiting: Mutex::default(),
        }
    }

    /// Notes a request sent now, until the returned guard is dropped.
    fn waiting(&self) -> Waiting<'_> {
        let number = self.next.fetch_add(1, Relaxed);
        let mut waiting = lock(&self.waiting);
        let ahead = waiting.len();
        waiting.insert(number);
        Waiting {
            hedger: self,
            number,
            ahead,
        }
    }

    /// Runs `request` (a GET up to its response, not its body), sending it again if it is
    /// still waiting past the recent 95th percentile (counted from when it was on its way,
    /// see the module docs) and the budget allows (and once more if the copy waits as long);
    /// the first success wins, the others are dropped.
    pub async fn run<T, E, F, Fut>(&self, request: F) -> Result<T, E>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.figures.requests.fetch_add(1, Relaxed);
        self.race(request).await
    }

    /// [`run`](Self::run) for a HEAD proving access: a new store identity proves each file
    /// it reads at once, and its scan waits for the slowest of those HEADs as for a GET.
    /// Counted in the budget and the store's times, not as a GET.
    pub async fn run_head<T, E, F, Fut>(&self, request: F) -> Result<T, E>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.race(request).await
    }

    async fn race<T, E, F, Fut>(&self, request: F) -> Result<T, E>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.times.requests.fetch_add(1, Relaxed);
        let began = Instant::now();
        if !self.figures.enabled {
            return self.noted(began, request().await);
        }
        let waiting = self.waiting();
        let mut attempts = FuturesUnordered::new();
        attempts.push(attempt(0, &self.figures, request()));
        // When the request was on its way (see the module docs), then when the latest copy
        // went out: the next one waits a threshold from then. A request that began before the
        // store's times were known (the first ones of a process) looks again as they come.
        let mut on_its_way = (waiting.ahead == 0).then_some(began);
        let mut copied_at = None;
        // The first error an attempt returned, reported only if every attempt fails.
        let mut first_error = None;
        let mut sent = 1;
        loop {
            if on_its_way.is_none() && waiting.on_its_way() {
                on_its_way = Some(Instant::now());
            }
            let wait = match (self.threshold(), copied_at.or(on_its_way)) {
                (Some(after), Some(sent_at)) => after.checked_sub(sent_at.elapsed()),
                // Still behind the requests sent before it: queued, not slow.
                (Some(after), None) => Some((after / 4).max(LOOK_AGAIN)),
                (None, _) => Some(LOOK_AGAIN),
            };
            let wait = match wait {
                Some(left) if !left.is_zero() => left,
                // Past the threshold: one more copy, if the budget allows, else just wait.
                _ if sent < MAX_ATTEMPTS && self.take_budget() => {
                    attempts.push(attempt(sent, &self.figures, request()));
                    sent += 1;
                    copied_at = Some(Instant::now());
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
            match answered {
                Some((copy, Ok(answer))) => {
                    if copy > 0 {
                        self.figures.won.fetch_add(1, Relaxed);
                    }
                    // The store's own time: from when the request was on its way (a copy's,
                    // from when the latest went out).
                    let from = if copy == 0 { on_its_way } else { copied_at };
                    return self.noted(from.unwrap_or(began), Ok(answer));
                }
                // A failed attempt does not end the request while another may still answer:
                // a copy that met a reset connection or a 503 must not fail a read the
                // original would have served, nor the other way round.
                Some((_, Err(e))) if attempts.is_empty() => {
                    return self.noted(began, Err(first_error.take().unwrap_or(e)));
                }
                Some((_, Err(e))) => {
                    first_error.get_or_insert(e);
                }
                None => {}
            }
        }
    }

    /// How long a request may wait before it is hedged, once enough times are known.
    fn threshold(&self) -> Option<Duration> {
        match self.times.threshold_nanos.load(Relaxed) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// Takes one hedge from the budget: at most one in [`MAX_SHARE`] requests so far.
    fn take_budget(&self) -> bool {
        let requests = self.times.requests.load(Relaxed);
        self.times
            .hedged
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
        match self.times.median_nanos.load(Relaxed) {
            0 => None,
            nanos => Some(Duration::from_nanos(nanos)),
        }
    }

    /// Adds a response time to the window and works out its median and, when hedging, its
    /// 95th percentile.
    fn record(&self, time: Duration) {
        let mut recent = lock(&self.times.recent);
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
        self.times.median_nanos.store(nth(0.5), Relaxed);
        if self.figures.enabled && enough {
            self.times.threshold_nanos.store(nth(PERCENTILE), Relaxed);
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

    fn key(url: &str) -> StoreKey {
        StoreKey::of(&url::Url::parse(url).unwrap())
    }

    fn hedger() -> Hedger {
        Hedger::new(Arc::new(Hedges::new(true)), &key("s3://bucket"))
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
        h.times.requests.store(n as u64, Relaxed);
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
    async fn a_new_instance_of_a_store_hedges_its_first_request_on_the_stores_times() {
        let figures = Arc::new(Hedges::new(true));
        let (bucket, other) = (key("s3://bucket"), key("s3://other"));
        // One tenant's instance has seen the store answer in 50 ms, a hundred times.
        let first = Hedger::new(Arc::clone(&figures), &bucket);
        let sent = AtomicUsize::new(0);
        for _ in 0..100 {
            first.record(Duration::from_millis(50));
        }
        first.times.requests.store(100, Relaxed);
        // Another tenant's instance of the same store: its first request, slow, gets a copy.
        let second = Hedger::new(Arc::clone(&figures), &bucket);
        let n = send(&second, &sent, |n| match n {
            0 => Duration::from_secs(2),
            _ => Duration::from_millis(1),
        })
        .await;
        assert_eq!(n, 1, "the copy's answer");
        assert_eq!(figures.hedged.load(Relaxed), 1);
        // Another store has times of its own; a store no instance reads any more is dropped.
        let elsewhere = figures.times_of(&other);
        assert!(!Arc::ptr_eq(&elsewhere, &first.times));
        assert_eq!(elsewhere.median_nanos.load(Relaxed), 0);
        drop((first, second, elsewhere));
        assert_eq!(figures.times_of(&bucket).median_nanos.load(Relaxed), 0);
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn in_a_burst_the_request_slow_at_the_store_is_copied_not_those_queued() {
        // 200 requests sent at once to a store that serves 4 at a time, 2 ms each (the last
        // is answered after about 100 ms), but takes 2 s over the 38th.
        let h = Arc::new(hedger());
        let server = Arc::new(tokio::sync::Semaphore::new(4));
        let answers = futures::future::join_all((0..200usize).map(|i| {
            let (h, server) = (Arc::clone(&h), Arc::clone(&server));
            async move {
                let attempts = AtomicUsize::new(0);
                let answer = h
                    .run(|| {
                        let attempt = attempts.fetch_add(1, Relaxed);
                        let server = Arc::clone(&server);
                        async move {
                            let _serving = server.acquire().await.unwrap();
                            let slow = i == 37 && attempt == 0;
                            let time = if slow { 2000 } else { 2 };
                            tokio::time::sleep(Duration::from_millis(time)).await;
                            Ok::<usize, ()>(attempt)
                        }
                    })
                    .await;
                (i, answer.unwrap())
            }
        }))
        .await;
        let (_, attempt) = answers[37];
        assert!(attempt > 0, "the slow request was answered by a copy");
        let hedged = h.figures.hedged.load(Relaxed);
        assert!(hedged * MAX_SHARE <= 200, "{hedged}");
    }

    #[tokio::test]
    async fn a_copy_that_fails_does_not_fail_the_request_its_original_answers() {
        let h = seasoned(100, Duration::from_millis(5));
        let sent = AtomicUsize::new(0);
        // The original answers after 1 s; its copies go out past the usual 5 ms and fail at
        // once (a reset connection, a 503).
        let answer = h
            .run(|| {
                let n = sent.fetch_add(1, Relaxed);
                async move {
                    match n {
                        0 => {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            Ok(n)
                        }
                        _ => Err("connection reset"),
                    }
                }
            })
            .await;
        assert_eq!(answer, Ok(0), "the original's answer");
        assert!(h.figures.hedged.load(Relaxed) >= 1, "a copy went out");
        assert_eq!(h.figures.won.load(Relaxed), 0);
    }

    #[tokio::test]
    async fn an_original_that_fails_waits_for_its_copy() {
        let h = seasoned(100, Duration::from_millis(5));
        let sent = AtomicUsize::new(0);
        // The original fails after 200 ms, long after its copy went out; the copy answers
        // after 400 ms.
        let answer = h
            .run(|| {
                let n = sent.fetch_add(1, Relaxed);
                async move {
                    match n {
                        0 => {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            Err("503")
                        }
                        _ => {
                            tokio::time::sleep(Duration::from_millis(400)).await;
                            Ok(n)
                        }
                    }
                }
            })
            .await;
        assert!(matches!(answer, Ok(n) if n > 0), "{answer:?}");
        assert_eq!(h.figures.won.load(Relaxed), 1);
    }

    #[tokio::test]
    async fn a_request_fails_only_when_every_attempt_failed() {
        let h = seasoned(100, Duration::from_millis(5));
        let sent = AtomicUsize::new(0);
        // Copies fail at once; the original fails after 1 s: the request waits for it.
        let began = Instant::now();
        let answer: Result<usize, String> = h
            .run(|| {
                let n = sent.fetch_add(1, Relaxed);
                async move {
                    if n == 0 {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(format!("attempt {n} failed"))
                }
            })
            .await;
        assert!(answer.is_err());
        assert!(
            began.elapsed() >= Duration::from_secs(1),
            "{:?}",
            began.elapsed()
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
        let (requests, hedged) = (h.times.requests.load(Relaxed), h.times.hedged.load(Relaxed));
        assert!(
            hedged > 0 && hedged * MAX_SHARE <= requests,
            "{hedged} of {requests}"
        );
        assert_eq!(sent.load(Relaxed) as u64, 60 + hedged);
    }

    #[tokio::test]
    async fn nothing_is_hedged_when_hedging_is_off() {
        let h = Hedger::new(Arc::new(Hedges::new(false)), &key("s3://bucket"));
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
