//! How many downloads a scan keeps in flight, and how many bytes they may hold.
//!
//! The link is full when the bytes in flight reach its bandwidth-delay product. Neither factor
//! is known in advance and the store hides both, so the controller measures: it starts with a
//! few downloads, and after each window of completions compares the aggregate throughput with
//! the best seen so far. Like TCP's slow start, it adds a download per completion (doubling
//! them every round trip, up to `max_in_flight`) for as long as each window's throughput beats
//! the best by 10%; once it stops rising the count holds where that window began. This is the
//! "more workers while aggregate throughput still rises" rule of Polars' concurrency tuner,
//! at round-trip rather than wall-clock pace, since a window lasts at least one time to first
//! byte.
//!
//! The byte budget is the Databricks seed's rule on top:
//! `clamp(downloads x largest range seen, buffer, 4 x buffer)`, capped by `max_bytes`. The
//! largest range is a high-water mark on purpose: the last ranges of a scan are often small
//! and would shrink the budget just when it no longer matters.

use std::time::{Duration, Instant};

use crate::config::PrefetchConfig;

/// Downloads a scan starts with: enough to measure, few enough to waste little when a query
/// stops early.
const INITIAL_DOWNLOADS: usize = 8;
/// Throughput must rise by this factor over a window for the controller to add downloads.
const RISE: f64 = 1.1;

/// Sizes a scan's downloads from what it measures.
#[derive(Debug)]
pub(crate) struct Controller {
    config: PrefetchConfig,
    downloads: usize,
    largest: u64,
    /// Fastest time to first byte seen: the link's latency with no queueing.
    min_ttfb: Option<Duration>,
    window_start: Option<Instant>,
    window_bytes: u64,
    window_done: usize,
    /// Downloads allowed when the window began: it ends after that many completions.
    window_size: usize,
    best_throughput: f64,
    growing: bool,
}

impl Controller {
    pub fn new(config: &PrefetchConfig) -> Self {
        let downloads = INITIAL_DOWNLOADS.min(config.max_in_flight);
        Self {
            config: config.clone(),
            downloads,
            window_size: downloads,
            largest: 0,
            min_ttfb: None,
            window_start: None,
            window_bytes: 0,
            window_done: 0,
            best_throughput: 0.0,
            growing: true,
        }
    }

    /// Downloads that may be in flight now.
    pub fn downloads(&self) -> usize {
        self.downloads
    }

    /// Bytes that buffered and in-flight prefetches may hold now.
    pub fn budget(&self) -> u64 {
        self.config.budget(self.downloads, self.largest)
    }

    /// Notes a range the scan wants to download, before the budget is checked for it.
    pub fn saw(&mut self, bytes: u64) {
        self.largest = self.largest.max(bytes);
    }

    /// Notes that a download of `bytes` is about to start.
    pub fn started(&mut self, bytes: u64, now: Instant) {
        self.saw(bytes);
        self.window_start.get_or_insert(now);
    }

    /// Notes a finished download: its size and its time to first byte.
    pub fn finished(&mut self, bytes: u64, ttfb: Duration, now: Instant) {
        self.min_ttfb = Some(self.min_ttfb.map_or(ttfb, |m| m.min(ttfb)));
        self.window_bytes += bytes;
        self.window_done += 1;
        if self.growing {
            // Slow start: one more download per completion doubles them every round trip,
            // without waiting for a whole window to finish.
            self.downloads = (self.downloads + 1).min(self.config.max_in_flight);
        }
        let Some(start) = self.window_start else {
            return;
        };
        let elapsed = now.saturating_duration_since(start);
        let long_enough = self.min_ttfb.is_none_or(|t| elapsed >= t);
        if self.window_done < self.window_size || !long_enough || elapsed.is_zero() {
            return;
        }
        let throughput = self.window_bytes as f64 / elapsed.as_secs_f64();
        if self.growing && throughput <= self.best_throughput * RISE {
            // The link is full: more downloads only queue. Hold at the count this window
            // started with.
            self.growing = false;
            self.downloads = self.window_size;
        }
        self.best_throughput = self.best_throughput.max(throughput);
        self.window_start = Some(now);
        self.window_bytes = 0;
        self.window_done = 0;
        self.window_size = self.downloads;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_in_flight: usize) -> PrefetchConfig {
        PrefetchConfig {
            max_in_flight,
            ..PrefetchConfig::default()
        }
    }

    /// Runs windows of downloads against a link whose throughput is `rate(downloads)`.
    fn settle(c: &mut Controller, rate: impl Fn(usize) -> f64, windows: usize) {
        let mut now = Instant::now();
        for _ in 0..windows {
            let n = c.downloads();
            let window = Duration::from_millis(25);
            let bytes_each = (rate(n) * window.as_secs_f64() / n as f64) as u64;
            for _ in 0..n {
                c.started(bytes_each, now);
            }
            now += window;
            for _ in 0..n {
                c.finished(bytes_each, Duration::from_millis(20), now);
            }
        }
    }

    #[test]
    fn downloads_grow_while_throughput_rises_and_stop_at_the_cap() {
        // A latency-bound link: every download adds the same throughput.
        let mut c = Controller::new(&config(64));
        settle(&mut c, |n| n as f64 * 1e6, 10);
        assert_eq!(c.downloads(), 64);
    }

    #[test]
    fn downloads_hold_once_the_link_is_full() {
        // The link saturates at 16 downloads: more add nothing.
        let mut c = Controller::new(&config(64));
        settle(&mut c, |n| n.min(16) as f64 * 1e6, 10);
        assert_eq!(c.downloads(), 32, "one probe past the knee, then hold");
    }

    #[test]
    fn the_budget_follows_the_seed_rule_within_the_cap() {
        let config = PrefetchConfig {
            buffer_bytes: 10,
            max_bytes: 35,
            ..config(64)
        };
        assert_eq!(config.budget(2, 1), 10, "never below the buffer");
        assert_eq!(config.budget(3, 5), 15, "downloads x largest in between");
        assert_eq!(config.budget(64, 100), 35, "never above max_bytes");
        let wide = PrefetchConfig {
            max_bytes: 1000,
            ..config
        };
        assert_eq!(wide.budget(64, 100), 40, "never above 4 x buffer");
    }
}
