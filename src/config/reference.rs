//! The settings as a reference: the tables of docs/configuration.md, rendered from
//! `setting_table!` so that the page cannot drift from the code (tests/settings.rs compares
//! them), and the environment variable each key is read from by
//! `LakeCacheBuilder::from_env`.

use std::fmt::Write;
use std::path::PathBuf;
use std::time::Duration;

use super::kinds::{Count, Dir, Flag, Kind, OptionalSpan, Size, Span};
use super::{PIB, Scope, Settings, setting_table};

/// The prefix of every environment variable a setting is read from.
pub const VARIABLE_PREFIX: &str = "LAKECACHE_";

/// The environment variable `LakeCacheBuilder::from_env` reads the setting `key` from:
/// `LAKECACHE_` and the key after `lakecache.`, upper case, dots as underscores
/// (`lakecache.range.disk_dir` is `LAKECACHE_RANGE_DISK_DIR`).
pub fn variable_of(key: &str) -> String {
    let name = key.strip_prefix("lakecache.").unwrap_or(key);
    format!(
        "{VARIABLE_PREFIX}{}",
        name.replace('.', "_").to_ascii_uppercase()
    )
}

/// One row of the reference.
struct Row {
    key: &'static str,
    builder: &'static str,
    scope: Scope,
    description: &'static str,
    trades: &'static str,
    default: String,
    accepted: String,
}

/// One group of settings (`lakecache.<name>.*`).
struct Group {
    name: &'static str,
    title: &'static str,
    doc: Vec<&'static str>,
    rows: Vec<Row>,
}

macro_rules! define_reference {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident $group:ident $title:literal {
            $($field:ident: $ty:ty = $default:expr, $kind:expr, $key:literal, $builder:ident,
              $scope:ident, $desc:literal, $trades:literal;)*
        }
    )*) => {
        fn groups() -> Vec<Group> {
            let defaults = Settings::default();
            vec![$(
                Group {
                    name: stringify!($group),
                    title: $title,
                    doc: vec![$($doc),*],
                    rows: vec![$(
                        Row {
                            key: $key,
                            builder: stringify!($builder),
                            scope: Scope::$scope,
                            description: $desc,
                            trades: $trades,
                            default: defaults.get($key).unwrap_or_default(),
                            accepted: <_ as Kind<$ty>>::accepted(&$kind),
                        },
                    )*],
                },
            )*]
        }
    };
}

setting_table!(define_reference);

/// Every setting as Markdown: a section per group (title, what the group is, who sets it)
/// with a table of key, builder method, default, accepted values and what it trades. This is
/// the generated part of docs/configuration.md.
pub fn settings_reference() -> String {
    let mut out = String::new();
    for group in groups() {
        let _ = writeln!(out, "## {} (`lakecache.{}.*`)\n", group.title, group.name);
        let doc: Vec<&str> = group.doc.iter().map(|line| line.trim()).collect();
        let _ = writeln!(out, "{}", doc.join(" "));
        let scope = if group.rows.iter().all(|r| r.scope == Scope::Shared) {
            "Shared by every session of a `LakeCache`: set when it is built (builder, \
             environment, the tool's rc file); `SET` accepts only the current value."
        } else {
            "Each session's: `SET` changes them for that session's next queries."
        };
        let _ = writeln!(out, "{scope}\n");
        let _ = writeln!(
            out,
            "| key | builder method | default | accepted | what it does, and what it trades |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|");
        for row in &group.rows {
            let default = if row.default.is_empty() {
                "none"
            } else {
                &row.default
            };
            let _ = writeln!(
                out,
                "| `{}` | `{}` | {} | {} | {} {} |",
                row.key,
                row.builder,
                cell(default),
                cell(&row.accepted),
                cell(row.description),
                cell(row.trades),
            );
        }
        out.push('\n');
    }
    out
}

/// `text` as one Markdown table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SETTINGS;

    #[test]
    fn every_setting_has_one_row_with_its_default_and_range() {
        let reference = settings_reference();
        for setting in SETTINGS {
            let rows: Vec<&str> = reference
                .lines()
                .filter(|l| l.starts_with(&format!("| `{}` |", setting.key)))
                .collect();
            assert_eq!(rows.len(), 1, "{}: {rows:?}", setting.key);
        }
        assert!(reference.contains(
            "| `lakecache.handle.capacity` | `handle_capacity` | 100000 | an integer from 1 to \
             1099511627776 |"
        ));
        assert!(reference.contains("| `lakecache.range.disk_dir` | `range_disk_dir` | none |"));
        assert!(reference.contains("'handle' \\| 'index' \\| 'range'"));
    }

    #[test]
    fn variables_are_the_key_in_upper_case() {
        assert_eq!(
            variable_of("lakecache.range.disk_dir"),
            "LAKECACHE_RANGE_DISK_DIR"
        );
        assert_eq!(
            variable_of("lakecache.store.hedge"),
            "LAKECACHE_STORE_HEDGE"
        );
    }
}
