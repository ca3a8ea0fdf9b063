//! The interactive prompt: datafusion-cli's line editor (its helper for multi-line statements
//! and highlighting, history in `.history`, backslash commands), with the progress line and
//! the cache summary of each statement, which datafusion-cli's own `exec_from_repl` has no
//! hook for.

use datafusion::error::{DataFusionError, Result};
use datafusion_cli::command::{Command, OutputFormat};
use datafusion_cli::helper::CliHelper;
use rustyline::Editor;
use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;

use crate::statements::Runner;

const HISTORY: &str = ".history";

/// Reads statements until `\q` or end of input, running each through `runner`.
pub async fn run(runner: &mut Runner) -> Result<()> {
    let failed = |e: ReadlineError| DataFusionError::External(Box::new(e));
    let dialect = |runner: &Runner| runner.ctx.state().config().options().sql_parser.dialect;
    let mut editor: Editor<CliHelper, DefaultHistory> = Editor::new().map_err(failed)?;
    editor.set_helper(Some(CliHelper::new(&dialect(runner), runner.print.color)));
    editor.load_history(HISTORY).ok();
    loop {
        match editor.readline("> ") {
            Ok(line) if line.starts_with('\\') => {
                editor.add_history_entry(line.trim_end()).map_err(failed)?;
                let command = line.split_whitespace().collect::<Vec<_>>().join(" ");
                match command[1..].parse::<Command>() {
                    Ok(Command::Quit) => break,
                    Ok(Command::OutputFormat(Some(format))) => {
                        match format.parse::<OutputFormat>() {
                            Ok(format) => {
                                if let Err(e) = format.execute(&mut runner.print) {
                                    eprintln!("{e}");
                                }
                            }
                            Err(_) => eprintln!("'{line}' is not a valid output format"),
                        }
                    }
                    Ok(Command::OutputFormat(None)) => {
                        println!("Output format is {:?}.", runner.print.format)
                    }
                    Ok(other) => {
                        if let Err(e) = other.execute(&runner.ctx, &mut runner.print).await {
                            eprintln!("{e}");
                        }
                    }
                    Err(_) => eprintln!("'{line}' is not a valid command; '\\?' lists them"),
                }
            }
            Ok(line) => {
                editor.add_history_entry(line.trim_end()).map_err(failed)?;
                tokio::select! {
                    result = runner.statement(line) => {
                        if let Err(e) = result {
                            eprintln!("{}", crate::one_line(&crate::with_hint(e.to_string())));
                        }
                    }
                    _ = tokio::signal::ctrl_c() => println!("^C"),
                }
                // `SET datafusion.sql_parser.dialect` may have changed it.
                if let Some(helper) = editor.helper_mut() {
                    helper.set_dialect(&dialect(runner));
                }
            }
            Err(ReadlineError::Interrupted) => println!("^C"),
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(failed(e)),
        }
    }
    editor.save_history(HISTORY).map_err(failed)
}
