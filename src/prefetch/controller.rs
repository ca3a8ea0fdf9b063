//! How many downloads a scan keeps in flight, and how many bytes they may hold.
//!
//! The link is full when the bytes in flight reach its bandwidth-delay product (BDP):
//! bandwidth x the wait for a response. The wait is the store's typical (median) time to a
//! response, which the versioned read measures on every GET; the bandwidth is not known
//! until the scan's own downloads fill the link, so the controller measures it like TCP's
//! slow start: it adds a download's bytes to the bytes it wants in flight each time one
//! completes (doubling them every round trip) for as long as each window of completions
//! beats the best throughput so far by 10%. When a window no longer does, the link is full
//! at that best throughput; from then on the scan keeps `1.5 x BDP` plus one download in
//! flight, as many downloads as that is at their mean size. A later window that beats the
//! best by 10% again (another scan finished, the link freed) resumes the growth. This is
//! the "more workers while aggregate throughput still rises" rule of Polars' concurrency
//! tuner, at round-trip rather than wall-clock pace.
//!
//! The measured link is remembered per store (`crate::store::Links`), so the next scan of
//! the store starts at its BDP rather than probing again; it still grows if it can. A scan
//! too short to fill the link leaves what it did reach as a lower bound, so scan after scan
//! starts higher, as TCP stacks keep a destination's window between connections.
//!
//! No constant caps the count: small pieces at high latency need many downloads, large
//! pieces few. `max_in_flight` only bounds it against the store's request rate and the
//! process's sockets.
//!
//! The byte budget is the Databricks seed's rule, `clamp(downloads x largest range seen,
//! buffer, 4 x buffer)`, raised to the bytes wanted in flight plus a buffer for readers,
//! and capped by `max_bytes`. The largest range is a high-water mark on purpose: the last
//! ranges of a scan are often small and would shrink the budget just when it no longer
//! matters.

use std::time::{Duration, Instant};

use crate::config::PrefetchConfig;
use crate::store::Link;

/// Downloads a scan starts with on a store whose link is not known yet. A cold scan is only
/// a few round trips long, and slow start doubles once per round trip, so it starts well
/// above a handful; a scan that may stop early is held to what its readers read anyway
/// (`State::may_guess`).
const INITIAL_DOWNLOADS: usize = 32;
/// Throughput must rise by this factor over a window for the controller to add downloads.
const RISE: f64 = 1.1;
/// Bytes in flight kept once the link is known, as a multiple of its BDP: waits and sizes
/// vary, and a download short of the BDP leaves the link idle.
const HEADROOM: f64 = 1.5;
/// Weight of a new download's size in the mean size.
const MEAN_WEIGHT: f64 = 1.0 / 8.0;

/// What a window of completions showed of the link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Measured {
    /// The downloads filled the link: this is its bandwidth.
    Full(Link),
    /// The link took all the downloads gave it: its bandwidth is at least this.
    AtLeast(Link),
}

/// Sizes a scan's downloads from what it measures.
#[derive(Debug)]
pub(crate) struct Controller {
    config: PrefetchConfig,
    /// Bytes the scan wants in flight, once a download's size is known.
    target: Option<f64>,
    /// The link the scan starts from (another scan's measurement), until it measures its own.
    seed: Option<Link>,
    /// Mean size of the downloads started, recent ones weighing most.
    mean: Option<f64>,
    largest: u64,
    /// The store's typical wait for a response, as last reported.
    latency: Option<Duration>,
    window_start: Option<Instant>,
    window_bytes: u64,
    window_done: usize,
    /// Downloads allowed when the window began: it ends after that many completions.
    window_size: usize,
    best_throughput: f64,
    growing: bool,
}

impl Controller {
    /// A scan's controller; `seed` is the store's last measured link, if any.
    pub fn new(config: &PrefetchConfig, seed: Option<Link>) -> Self {
        let mut controller = Self {
            config: config.clone(),
            target: None,
            seed,
            mean: None,
            largest: 0,
            latency: seed.map(|l| l.latency),
            window_start: None,
            window_bytes: 0,
            window_done: 0,
            window_size: 0,
            best_throughput: 0.0,
            growing: true,
        };
        controller.window_size = controller.downloads();
        controller
    }

    /// Downloads that may be in flight now: the bytes wanted in flight at the mean size.
    pub fn downloads(&self) -> usize {
        let most = self.config.max_in_flight;
        match (self.target, self.mean) {
            (Some(target), Some(mean)) if mean > 0.0 => {
                ((target / mean).ceil() as usize).clamp(1, most)
            }
            _ => INITIAL_DOWNLOADS.min(most),
        }
    }

    /// Bytes that buffered and in-flight prefetches may hold now.
    pub fn budget(&self) -> u64 {
        let wanted = self.target.unwrap_or(0.0) as u64;
        self.config.budget(self.downloads(), self.largest, wanted)
    }

    /// Notes a range the scan wants to download, before the budget is checked for it.
    pub fn saw(&mut self, bytes: u64) {
        self.largest = self.largest.max(bytes);
    }

    /// Notes that a download of `bytes` is about to start.
    pub fn started(&mut self, bytes: u64, now: Instant) {
        self.saw(bytes);
        let size = bytes.max(1) as f64;
        let mean = self.mean.map_or(size, |m| m + (size - m) * MEAN_WEIGHT);
        self.mean = Some(mean);
        if self.target.is_none() {
            let known = self.seed.map_or(0.0, |l| HEADROOM * l.bdp() + mean);
            self.target = Some(known.max(INITIAL_DOWNLOADS as f64 * mean));
        }
        self.window_start.get_or_insert(now);
    }

    /// Notes a finished download of `bytes`, and the store's typical wait for a response now.
    /// Returns what the link showed when this completion closed a window.
    pub fn finished(
        &mut self,
        bytes: u64,
        latency: Option<Duration>,
        now: Instant,
    ) -> Option<Measured> {
        self.latency = latency.or(self.latency);
        self.window_bytes += bytes;
        self.window_done += 1;
        if self.growing {
            // Slow start: a completion's bytes more in flight doubles them every round trip,
            // without waiting for a whole window to finish.
            self.target = self.target.map(|t| t + bytes as f64);
        }
        let start = self.window_start?;
        let elapsed = now.saturating_duration_since(start);
        let long_enough = self.latency.is_none_or(|t| elapsed >= t);
        if self.window_done < self.window_size || !long_enough || elapsed.is_zero() {
            return None;
        }
        let throughput = self.window_bytes as f64 / elapsed.as_secs_f64();
        let rose = throughput > self.best_throughput * RISE;
        self.best_throughput = self.best_throughput.max(throughput);
        if self.growing && !rose {
            // The link is full: more downloads only queue.
            self.growing = false;
        } else if !self.growing && rose {
            // The link has room again.
            self.growing = true;
        }
        self.window_start = Some(now);
        self.window_bytes = 0;
        self.window_done = 0;
        let latency = self.latency?;
        let link = Link {
            bandwidth: self.best_throughput,
            latency,
        };
        let measured = if self.growing {
            Measured::AtLeast(link)
        } else {
            self.target = Some(HEADROOM * link.bdp() + self.mean.unwrap_or(0.0));
            Measured::Full(link)
        };
        self.window_size = self.downloads();
        Some(measured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    const MIB: u64 = 1 << 20;

    fn config(max_in_flight: usize) -> PrefetchConfig {
        PrefetchConfig {
            max_in_flight,
            max_bytes: 1 << 40,
            ..PrefetchConfig::default()
        }
    }

    /// Runs `completions` downloads of `size` bytes through `c` over a simulated link of
    /// `bandwidth` bytes per second whose responses come `latency` after each request and
    /// whose bytes cross it one response after another, as `LatencyStore` does. Returns the
    /// throughput of the last half of the downloads, and the link as the controller last
    /// found it full.
    fn run(
        c: &mut Controller,
        bandwidth: f64,
        latency: Duration,
        size: u64,
        completions: usize,
    ) -> (f64, Option<Link>) {
        let begin = Instant::now();
        let (mut now, mut link_free) = (begin, begin);
        let transfer = Duration::from_secs_f64(size as f64 / bandwidth);
        let mut arrivals = BinaryHeap::new();
        let (mut half, mut full) = (None, None);
        for done in 0..completions {
            while arrivals.len() < c.downloads() {
                c.started(size, now);
                let arrive = (now + latency).max(link_free) + transfer;
                link_free = arrive;
                arrivals.push(Reverse(arrive));
            }
            let Reverse(at) = arrivals.pop().expect("downloads in flight");
            now = at;
            if let Some(Measured::Full(link)) = c.finished(size, Some(latency), now) {
                full = Some(link);
            }
            if done == completions / 2 {
                half = Some(now);
            }
        }
        let half = half.expect("more than one completion");
        let throughput = (completions - completions / 2 - 1) as f64 * size as f64
            / now.duration_since(half).as_secs_f64();
        (throughput, full)
    }

    fn bdp_downloads(bandwidth: f64, latency: Duration, size: u64) -> f64 {
        bandwidth * latency.as_secs_f64() / size as f64
    }

    /// Asserts that `c` keeps between one and 2.5 BDPs of `size` downloads in flight and that
    /// they got at least 90% of the link's `bandwidth` (`got`).
    fn assert_fills(c: &Controller, got: f64, bandwidth: f64, latency: Duration, size: u64) {
        let need = bdp_downloads(bandwidth, latency, size);
        let n = c.downloads() as f64;
        assert!(
            n >= need && n <= 2.5 * need,
            "{n} downloads for a BDP of {need:.0}"
        );
        assert!(
            got >= 0.9 * bandwidth,
            "throughput {got:.0} of {bandwidth:.0}"
        );
    }

    #[test]
    fn downloads_grow_past_any_old_cap_to_fill_a_long_fat_link() {
        // 10 Gbit/s at 100 ms with 1 MiB pieces: about 119 downloads fill the link.
        let (bandwidth, latency) = (1.25e9, Duration::from_millis(100));
        let mut c = Controller::new(&config(1024), None);
        let (got, full) = run(&mut c, bandwidth, latency, MIB, 3000);
        assert_fills(&c, got, bandwidth, latency, MIB);
        let link = full.expect("the link was found full");
        assert!((link.bandwidth / bandwidth - 1.0).abs() < 0.2, "{link:?}");
        assert_eq!(link.latency, latency);
    }

    #[test]
    fn a_short_link_needs_few_large_downloads() {
        // 1 Gbit/s at 5 ms with 8 MiB pieces: one download in flight nearly fills it.
        let (bandwidth, latency) = (1.25e8, Duration::from_millis(5));
        let mut c = Controller::new(&config(1024), None);
        let (got, _) = run(&mut c, bandwidth, latency, 8 * MIB, 200);
        assert!(c.downloads() <= 3, "{} downloads", c.downloads());
        assert!(
            got >= 0.9 * bandwidth,
            "throughput {got:.0} of {bandwidth:.0}"
        );
    }

    #[test]
    fn small_pieces_at_high_latency_get_as_many_downloads_as_the_bdp() {
        // 1 Gbit/s at 100 ms with 64 KiB pieces (pages): about 190 downloads.
        let (bandwidth, latency) = (1.25e8, Duration::from_millis(100));
        let mut c = Controller::new(&config(1024), None);
        let (got, _) = run(&mut c, bandwidth, latency, 64 << 10, 5000);
        assert_fills(&c, got, bandwidth, latency, 64 << 10);
    }

    #[test]
    fn max_in_flight_bounds_the_downloads() {
        let mut c = Controller::new(&config(16), None);
        run(&mut c, 1.25e9, Duration::from_millis(100), MIB, 500);
        assert_eq!(c.downloads(), 16);
    }

    #[test]
    fn a_scan_of_a_known_link_starts_at_its_bdp() {
        let link = Link {
            bandwidth: 1.25e9,
            latency: Duration::from_millis(100),
        };
        let mut c = Controller::new(&config(1024), Some(link));
        assert_eq!(c.downloads(), INITIAL_DOWNLOADS, "no size known yet");
        c.started(MIB, Instant::now());
        let need = bdp_downloads(link.bandwidth, link.latency, MIB);
        assert!(
            c.downloads() as f64 >= need,
            "{} for {need:.0}",
            c.downloads()
        );
        let mut fresh = Controller::new(&config(1024), None);
        fresh.started(MIB, Instant::now());
        assert_eq!(fresh.downloads(), INITIAL_DOWNLOADS);
    }
}
