//! A progress line on stderr while a statement runs for more than a second: elapsed time,
//! files opened and bytes read so far, from the caches' own figures. It is rewritten in
//! place and erased when the statement ends, so results on stdout are untouched.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use datafusion_lakecache::{LakeCache, LakeStats};
use tokio::task::JoinHandle;

/// When to show the progress line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum When {
    /// When stderr is a terminal.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// The progress line of one statement; [`Progress::finish`] erases it.
pub struct Progress {
    task: Option<JoinHandle<()>>,
    shown: Arc<AtomicBool>,
}

impl Progress {
    /// Starts watching `lake`'s figures; the line appears after a second.
    pub fn start(lake: &LakeCache, when: When) -> Self {
        let show = match when {
            When::Auto => std::io::stderr().is_terminal(),
            When::Always => true,
            When::Never => false,
        };
        let shown = Arc::new(AtomicBool::new(false));
        if !show {
            return Self { task: None, shown };
        }
        let (lake, began, before) = (lake.clone(), Instant::now(), lake.stats());
        let flag = Arc::clone(&shown);
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            loop {
                {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "\r\x1b[K{}", line(&before, &lake.stats(), began));
                    let _ = err.flush();
                }
                flag.store(true, Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Self {
            task: Some(task),
            shown,
        }
    }

    /// Stops the line and erases it if it was shown.
    pub fn finish(self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        if self.shown.load(Relaxed) {
            eprint!("\r\x1b[K");
        }
    }
}

/// What the statement did so far: files opened (footer lookups) and bytes read (served by the
/// range cache from memory, disk or the store, plus prefetched).
fn line(before: &LakeStats, now: &LakeStats, began: Instant) -> String {
    let files = (now.index.cache.hits + now.index.cache.misses)
        .saturating_sub(before.index.cache.hits + before.index.cache.misses);
    let bytes = |s: &LakeStats| {
        s.ranges.bytes_from_memory
            + s.ranges.bytes_from_disk
            + s.ranges.bytes_from_store
            + s.prefetch.bytes_fetched
    };
    let read = bytes(now).saturating_sub(bytes(before));
    format!(
        "lakecache: running {:.1} s, {files} files opened, {:.1} MB read",
        began.elapsed().as_secs_f64(),
        read as f64 / 1e6
    )
}
