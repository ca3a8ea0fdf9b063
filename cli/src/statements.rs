//! Running statements: each through datafusion-cli's own executor (results, timing and the
//! object-store profile on stdout), with the progress line while it runs and the summary of
//! what the caches did for it on stderr after it.

use datafusion::error::{DataFusionError, Result};
use datafusion::prelude::SessionContext;
use datafusion_cli::exec;
use datafusion_cli::print_options::PrintOptions;
use datafusion_lakecache::LakeCache;

use crate::progress::{Progress, When};

/// What every statement runs with.
pub struct Runner {
    /// The session.
    pub ctx: SessionContext,
    /// The caches the session was installed from.
    pub lake: LakeCache,
    /// datafusion-cli's print options (`\pset` and `\object_store_profiling` change them).
    pub print: PrintOptions,
    /// When to draw the progress line.
    pub progress: When,
    /// Whether a file stops at its first failed statement.
    pub stop_on_error: bool,
}

impl Runner {
    /// Runs `sql` (one or more statements), then prints the summary unless quiet.
    pub async fn statement(&self, sql: String) -> Result<()> {
        let before = self.lake.stats();
        let progress = Progress::start(&self.lake, self.progress);
        let result = exec::exec_from_commands(&self.ctx, vec![sql], &self.print).await;
        progress.finish();
        if !self.print.quiet {
            eprintln!("{}", crate::summary::line(&before, &self.lake.stats()));
        }
        result
    }

    /// Runs the statements of `file` in order, as datafusion-cli does: one that fails is
    /// reported on stderr and the next one runs, unless `stop_on_error`. Fails at the end if
    /// any failed, so scripts see it in the exit code.
    pub async fn file(&self, file: &str) -> Result<()> {
        let text = std::fs::read_to_string(file)
            .map_err(|e| DataFusionError::Execution(format!("cannot read {file}: {e}")))?;
        let statements = split_statements(&text);
        let mut failed = 0;
        for sql in &statements {
            if let Err(e) = self.statement(sql.clone()).await {
                if self.stop_on_error {
                    return Err(e);
                }
                eprintln!(
                    "lakecache: {}",
                    crate::one_line(&crate::with_hint(e.to_string()))
                );
                failed += 1;
            }
        }
        match failed {
            0 => Ok(()),
            n => Err(DataFusionError::Execution(format!(
                "{n} of the {} statements of {file} failed",
                statements.len()
            ))),
        }
    }
}

/// The statements of a SQL file, as datafusion-cli reads one: a statement ends with a line
/// ending in `;`; lines starting with `--` or `#!` are skipped.
pub fn split_statements(text: &str) -> Vec<String> {
    let mut statements = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        if line.starts_with("--") || line.starts_with("#!") {
            continue;
        }
        let line = line.trim_end();
        current.push_str(line);
        if line.ends_with(';') {
            statements.push(std::mem::take(&mut current));
        } else {
            current.push('\n');
        }
    }
    if !current.trim().is_empty() {
        statements.push(current);
    }
    statements
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_end_with_a_line_ending_in_a_semicolon() {
        let text = "#!/usr/bin/env lakecache\n-- a comment\nSELECT 1;\nSELECT\n  2;\nSELECT 3";
        assert_eq!(
            split_statements(text),
            ["SELECT 1;", "SELECT\n  2;", "SELECT 3\n"]
        );
        assert!(split_statements("-- only a comment\n\n").is_empty());
    }
}
