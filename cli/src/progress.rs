//! A progress line on stderr while a statement runs for more than a second: elapsed time,
//! files opened and bytes read so far. indicatif draws it (rewritten in place, erased when
//! the statement ends, so results on stdout are untouched); the figures come from
//! `LakeCache::activity`, plain counters that cost no cache maintenance to read.

use std::fmt;
use std::io::{self, IsTerminal, Write};
use std::time::Duration;

use clap::ValueEnum;
use datafusion_lakecache::{Activity, LakeCache};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use tokio::task::JoinHandle;

/// When to show the progress line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum When {
    /// When stderr is a terminal.
    Auto,
    /// Always, on a pipe too.
    Always,
    /// Never.
    Never,
}

/// The progress line of one statement, erased when it is dropped.
pub struct Progress {
    task: Option<JoinHandle<()>>,
    bar: ProgressBar,
}

impl Progress {
    /// Starts watching `lake`'s figures; the line appears after a second.
    pub fn start(lake: &LakeCache, when: When) -> Self {
        let terminal = io::stderr().is_terminal();
        let target = match (when, terminal) {
            (When::Never, _) | (When::Auto, false) => None,
            (_, true) => Some(ProgressDrawTarget::stderr_with_hz(4)),
            // indicatif draws nothing on a pipe by itself.
            (When::Always, false) => Some(ProgressDrawTarget::term_like_with_hz(
                Box::new(PlainStderr),
                4,
            )),
        };
        let bar = ProgressBar::hidden();
        let Some(target) = target else {
            return Self { task: None, bar };
        };
        let style = ProgressStyle::with_template("{spinner} lakecache: running {elapsed} · {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(style);
        let (lake, before) = (lake.clone(), lake.activity());
        let shown = bar.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            shown.set_draw_target(target);
            loop {
                shown.set_message(message(&before, &lake.activity()));
                shown.tick();
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Self {
            task: Some(task),
            bar,
        }
    }

    /// Stops the line and erases it if it was shown (as dropping it does, for a statement
    /// interrupted by Ctrl-C).
    pub fn finish(self) {}
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        self.bar.finish_and_clear();
    }
}

/// What the statement did so far: files opened (footer lookups) and bytes read (from the
/// range cache's memory and disk, the store, and prefetched).
fn message(before: &Activity, now: &Activity) -> String {
    let files = now.footer_lookups.saturating_sub(before.footer_lookups);
    let read = now.bytes_read().saturating_sub(before.bytes_read());
    format!("{files} files opened, {:.1} MB read", read as f64 / 1e6)
}

/// stderr as a terminal that moves nothing: for `--progress always` on a pipe or a file.
struct PlainStderr;

impl fmt::Debug for PlainStderr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PlainStderr")
    }
}

impl TermLike for PlainStderr {
    fn width(&self) -> u16 {
        100
    }

    fn move_cursor_up(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn move_cursor_down(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn move_cursor_right(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn move_cursor_left(&self, _: usize) -> io::Result<()> {
        Ok(())
    }

    fn write_line(&self, s: &str) -> io::Result<()> {
        writeln!(io::stderr(), "{s}")
    }

    fn write_str(&self, s: &str) -> io::Result<()> {
        write!(io::stderr(), "{s}")
    }

    fn clear_line(&self) -> io::Result<()> {
        write!(io::stderr(), "\r\x1b[2K")
    }

    fn flush(&self) -> io::Result<()> {
        io::stderr().flush()
    }
}
