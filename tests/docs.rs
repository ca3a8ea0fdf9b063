//! What can drift mechanically between the docs and the code, checked in `cargo test`:
//! - every `lakecache.*` setting (or `lakecache.<group>.*`) the docs name is one;
//! - every `lakecache_*` SQL function they name is registered by an installed session (with
//!   `lakecache.sql.clear` and `lakecache.sql.manage` on), or is the Ballista client's;
//! - every `LAKECACHE_*` variable they name is a setting's, or one the code or scripts read;
//! - every Rust block of the docs is compiled by `cargo test --doc`: its file is the crate's
//!   page (README.md) or wired into `mod guides` in src/lib.rs, a bare block in such a file is
//!   marked (rustdoc would compile it as Rust), and a block marked `ignore` says why in an
//!   HTML comment just before it (`<!-- ignore: reason -->`).
//!
//! The docs are README.md, CONTRIBUTING.md, python/README.md, cli/README.md (those present)
//! and docs/*.md.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use datafusion::execution::SessionStateBuilder;
use datafusion_lakecache::LakeCache;
use datafusion_lakecache::config::{SETTINGS, VARIABLE_PREFIX, variable_of};

/// Variables the docs name on purpose though nothing reads them.
const NAMED_TO_FAIL: &[&str] = &[
    // docs/configuration.md's example of a misspelled setting variable, which is an error.
    "LAKECACHE_HANDLE_CAPACTY",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The docs, as (path from the root, text).
fn docs() -> Vec<(String, String)> {
    let mut paths: Vec<String> = [
        "README.md",
        "CONTRIBUTING.md",
        "python/README.md",
        "cli/README.md",
    ]
    .map(String::from)
    .to_vec();
    let mut guides: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/ is readable")
        .map(|e| {
            e.expect("a docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    guides.sort();
    paths.extend(guides);
    paths
        .into_iter()
        .filter_map(|path| {
            let text = std::fs::read_to_string(root().join(&path)).ok()?;
            Some((path, text))
        })
        .collect()
}

/// What exists: the names the docs may use.
struct Known {
    keys: BTreeSet<String>,
    functions: BTreeSet<String>,
    variables: BTreeSet<String>,
}

impl Known {
    fn of_the_code() -> Self {
        let keys = SETTINGS.iter().map(|s| s.key.to_string()).collect();
        // What an installed session registers, with the settings that add functions on.
        let lake = LakeCache::builder()
            .sql_clear(true)
            .sql_manage(true)
            .build()
            .expect("a LakeCache");
        let state = lake
            .install(SessionStateBuilder::new().with_default_features())
            .expect("installed")
            .build();
        let mut functions: BTreeSet<String> = state
            .table_functions()
            .keys()
            .filter(|name| name.starts_with("lakecache_"))
            .cloned()
            .collect();
        // Registered by a Ballista client itself (docs/distributed.md).
        functions.insert(datafusion_lakecache::ballista::figures::FUNCTION.to_string());
        let mut variables: BTreeSet<String> = SETTINGS.iter().map(|s| variable_of(s.key)).collect();
        variables.extend(variables_read());
        Self {
            keys,
            functions,
            variables,
        }
    }

    fn has_key(&self, key: &str) -> bool {
        if self.keys.contains(key) {
            return true;
        }
        // `lakecache.<group>` stands for the group's settings (`lakecache.<group>.*`).
        let group = format!("{key}.");
        key.matches('.').count() == 1 && self.keys.iter().any(|k| k.starts_with(&group))
    }
}

/// The `LAKECACHE_*` variables the code, tests, benchmarks, examples and scripts read:
/// `var("..")`, `var_os("..")`, `environ.get("..")`, `environ[".."]`, `$..`, `${..`.
fn variables_read() -> BTreeSet<String> {
    let mut files = Vec::new();
    for dir in [
        "src", "tests", "benches", "examples", "cli", "python", "scripts", "fuzz",
    ] {
        walk(&root().join(dir), &mut files);
    }
    let mut found = BTreeSet::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (before, name) in names_with_prefix(&text, VARIABLE_PREFIX, |c| {
            c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'
        }) {
            let read = [
                "var(\"",
                "var_os(\"",
                "environ.get(\"",
                "environ[\"",
                "$",
                "${",
            ]
            .iter()
            .any(|call| before.ends_with(call));
            if read {
                found.insert(name);
            }
        }
    }
    found
}

/// Every file under `dir`, build outputs and virtual environments left out.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !(name == "target" || name.starts_with('.') || name == "__pycache__") {
                walk(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// Each name in `text` that starts with `prefix` where no identifier, path or dotted name is
/// going on before it, with what precedes it on its line; the name is the prefix and the
/// characters `part` accepts after it (trailing `.` and `_` dropped), and is left out when
/// nothing follows the prefix.
fn names_with_prefix<'a>(
    text: &'a str,
    prefix: &str,
    part: impl Fn(char) -> bool,
) -> Vec<(&'a str, String)> {
    let mut found = Vec::new();
    for line in text.lines() {
        let mut from = 0;
        while let Some(at) = line[from..].find(prefix) {
            let start = from + at;
            from = start + prefix.len();
            let before = &line[..start];
            let joined = before
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || "_.-/".contains(c));
            if joined {
                continue;
            }
            let rest: String = line[from..].chars().take_while(|c| part(*c)).collect();
            let rest = rest.trim_end_matches(['.', '_']);
            if !rest.is_empty() {
                found.push((before, format!("{prefix}{rest}")));
            }
        }
    }
    found
}

/// The line (from 1) of `text` where `needle` first occurs after a line's start.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .map_or(0, |n| n + 1)
}

/// The names `text` (the doc at `path`) uses that do not exist, one message each.
fn drift(path: &str, text: &str, known: &Known) -> Vec<String> {
    let mut wrong = BTreeSet::new();
    let key_part = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.';
    for (_, key) in names_with_prefix(text, "lakecache.", key_part) {
        if !known.has_key(&key) {
            let line = line_of(text, &key);
            wrong.insert(format!(
                "{path}:{line}: `{key}` is no lakecache setting (config::SETTINGS)"
            ));
        }
    }
    let function_part = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    for line in text.lines() {
        for (_, name) in names_with_prefix(line, "lakecache_", function_part) {
            // A function is named as called, or quoted: `lakecache_x(`, "lakecache_x", ...
            let called = ["(", "\"", "'", "`"]
                .iter()
                .any(|after| line.contains(&format!("{name}{after}")));
            if called && !known.functions.contains(&name) {
                let at = line_of(text, &name);
                wrong.insert(format!(
                    "{path}:{at}: `{name}` is no SQL function an installed session has"
                ));
            }
        }
    }
    let variable_part = |c: char| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_';
    for (_, name) in names_with_prefix(text, VARIABLE_PREFIX, variable_part) {
        if !known.variables.contains(&name) && !NAMED_TO_FAIL.contains(&name.as_str()) {
            let line = line_of(text, &name);
            wrong.insert(format!(
                "{path}:{line}: `{name}` is no setting's variable, and nothing reads it"
            ));
        }
    }
    wrong.into_iter().collect()
}

/// The docs src/lib.rs hands to rustdoc (`include_str!("../<path>")`): their Rust blocks are
/// compiled by `cargo test --doc`.
fn compiled_docs() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    let mut docs = BTreeSet::new();
    let mut rest = lib.as_str();
    while let Some(at) = rest.find("include_str!(\"../") {
        rest = &rest[at + "include_str!(\"../".len()..];
        if let Some(end) = rest.find('"') {
            docs.insert(rest[..end].to_string());
        }
    }
    docs
}

/// Whether rustdoc takes a block with the info string `info` for Rust: no language, `rust`,
/// or only rustdoc's own attributes.
fn rustdoc_rust(info: &str) -> bool {
    let tokens: Vec<&str> = info
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .collect();
    tokens.first() == Some(&"rust")
        || tokens.iter().all(|t| {
            [
                "ignore",
                "no_run",
                "should_panic",
                "compile_fail",
                "test_harness",
                "standalone_crate",
            ]
            .contains(t)
                || t.starts_with("edition")
                || t.starts_with("ignore-")
        })
}

/// The code blocks of `text` (the doc at `path`) that are Rust and not compiled, or not
/// marked as what they are; `compiled` if rustdoc reads the doc.
fn uncompiled_blocks(path: &str, text: &str, compiled: bool) -> Vec<String> {
    let mut wrong = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut open = false;
    for (n, line) in lines.iter().enumerate() {
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        if open {
            open = false;
            continue;
        }
        open = true;
        let info = info.trim();
        let at = format!("{path}:{}", n + 1);
        if info.is_empty() {
            if compiled {
                wrong.push(format!(
                    "{at}: a block with no language, which rustdoc compiles as Rust: mark it \
                     ```text (or what it is)"
                ));
            }
            continue;
        }
        if !rustdoc_rust(info) {
            continue;
        }
        if !compiled {
            wrong.push(format!(
                "{at}: a Rust block in a doc rustdoc does not read: add the doc to `mod \
                 guides` in src/lib.rs"
            ));
        }
        if info.split(',').any(|t| t.trim() == "ignore") {
            let before = lines[..n].iter().rev().take_while(|l| !l.contains("<!--"));
            let opening = lines[..n].iter().rev().find(|l| l.contains("<!--"));
            let closes_here = n > 0 && lines[n - 1].trim_end().ends_with("-->");
            let reason = opening
                .and_then(|l| l.split("<!--").nth(1))
                .and_then(|c| c.trim().strip_prefix("ignore:"))
                .is_some_and(|r| !r.trim().trim_end_matches("-->").trim().is_empty());
            if !(closes_here && reason && before.count() < 5) {
                wrong.push(format!(
                    "{at}: a block marked `ignore` with no `<!-- ignore: reason -->` just \
                     before it"
                ));
            }
        }
    }
    wrong
}

#[test]
fn the_docs_name_only_settings_functions_and_variables_that_exist() {
    let known = Known::of_the_code();
    // The check sees what it should: the names the code has are found, in docs that use them.
    assert!(known.functions.contains("lakecache_metrics"));
    assert!(known.functions.contains("lakecache_invalidate"));
    assert!(known.variables.contains("LAKECACHE_S3_ENDPOINT"));
    let docs = docs();
    let mut wrong = Vec::new();
    let mut named = 0;
    for (path, text) in &docs {
        named += names_with_prefix(text, "lakecache.", |c| c.is_ascii_lowercase()).len();
        wrong.extend(drift(path, text, &known));
    }
    assert!(
        named > 50,
        "only {named} settings named in {} docs",
        docs.len()
    );
    assert!(
        wrong.is_empty(),
        "names in the docs that the code does not have:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_fails_on_a_setting_a_function_or_a_variable_that_does_not_exist() {
    let known = Known::of_the_code();
    let text = "\
Set `lakecache.handle.capacity` (the `lakecache.range.*` group too) with
`SET lakecache.handle.capacityy = 10`, then `SELECT * FROM lakecache_metrics()` and
`SELECT * FROM lakecache_statz()`; or `LAKECACHE_RANGE_DISK_DIR` and
`LAKECACHE_RANGE_DISK_DIRR`. In `lakecache.cache.*`, `datafusion_lakecache.lakecache_x` is
a module path and `lakecache_bench.py` a file: neither is a name to check.
";
    let wrong = drift("synthetic.md", text, &known);
    assert_eq!(
        wrong,
        [
            "synthetic.md:2: `lakecache.handle.capacityy` is no lakecache setting (config::SETTINGS)",
            "synthetic.md:3: `lakecache_statz` is no SQL function an installed session has",
            "synthetic.md:4: `LAKECACHE_RANGE_DISK_DIRR` is no setting's variable, and nothing reads it",
            "synthetic.md:4: `lakecache.cache` is no lakecache setting (config::SETTINGS)",
        ],
        "{wrong:#?}"
    );
}

#[test]
fn every_rust_block_of_the_docs_is_compiled() {
    let compiled = compiled_docs();
    assert!(compiled.contains("README.md"), "{compiled:?}");
    let mut wrong = Vec::new();
    for (path, text) in docs() {
        wrong.extend(uncompiled_blocks(&path, &text, compiled.contains(&path)));
    }
    assert!(
        wrong.is_empty(),
        "code blocks of the docs that cargo test --doc does not compile:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_block_check_fails_on_an_uncompiled_or_unexplained_block() {
    let text = "\
```rust
let a = 1;
```

```rust,ignore
fragment();
```

<!-- ignore: a fragment of the program above -->
```rust,ignore
fragment();
```

```
a diagram
```

```text
output
```
";
    assert_eq!(
        uncompiled_blocks("doc.md", text, false),
        [
            "doc.md:1: a Rust block in a doc rustdoc does not read: add the doc to `mod guides` in src/lib.rs",
            "doc.md:5: a Rust block in a doc rustdoc does not read: add the doc to `mod guides` in src/lib.rs",
            "doc.md:5: a block marked `ignore` with no `<!-- ignore: reason -->` just before it",
            "doc.md:10: a Rust block in a doc rustdoc does not read: add the doc to `mod guides` in src/lib.rs",
        ]
    );
    assert_eq!(
        uncompiled_blocks("doc.md", text, true),
        [
            "doc.md:5: a block marked `ignore` with no `<!-- ignore: reason -->` just before it",
            "doc.md:14: a block with no language, which rustdoc compiles as Rust: mark it ```text (or what it is)",
        ]
    );
}
