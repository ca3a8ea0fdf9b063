//! The crate's layering (`docs/architecture.md`, "The layers"): each module of `src/` imports
//! only modules of the layers below its own, never one beside or above it. The layers are
//! listed here once, bottom first; a module missing from the list fails the test, so a new
//! module is placed deliberately.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers, bottom first. Modules of one layer do not import each other.
const LAYERS: &[&[&str]] = &[
    &["few_map"],
    &["object"],
    &["config", "stats", "metrics"],
    &["handle", "index", "range"],
    &["store", "fuzz"],
    &["prefetch"],
    &["table"],
    &["iceberg"],
    &["sql"],
    &["delta"],
    &["lake"],
    &["ballista", "metrics_export"],
    &["testkit"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None` for `lib.rs`, the crate root).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(name) => Some(name.to_string()),
        None => Some(first.to_string()),
    }
}

/// The top-level modules `text` names as `crate::<module>`, by line (comments skipped).
/// Unit tests (a file's `#[cfg(test)] mod`, and files named `tests.rs`) are not part of the
/// layering: they may use the test kit, the top layer.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        if code == "#[cfg(test)]"
            && lines
                .get(n + 1)
                .is_some_and(|next| next.trim_start().starts_with("mod "))
        {
            break;
        }
        if code.starts_with("//") {
            continue;
        }
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            // `crate::{a, b}` lists several.
            if name.is_empty() && after.starts_with('{') {
                let list = &after[1..after.find('}').unwrap_or(after.len())];
                for item in list.split(',') {
                    let item: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !item.is_empty() {
                        found.push((n + 1, item));
                    }
                }
            } else if !name.is_empty() {
                found.push((n + 1, name));
            }
            rest = after;
        }
    }
    found
}

#[test]
fn every_module_imports_only_from_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut wrong = Vec::new();
    let mut imports: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for file in &files {
        let Some(module) = module_of(&src, file) else {
            continue;
        };
        let Some(own) = layer_of(&module) else {
            wrong.push(format!("{module}: not in the list of layers"));
            continue;
        };
        if file.file_name().is_some_and(|name| name == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        for (line, used) in crate_paths(&text) {
            // Items of the crate root (re-exports such as `crate::LakeCache`) are the face's.
            let used_layer = match layer_of(&used) {
                Some(l) => l,
                None if used.chars().next().is_some_and(char::is_uppercase) => {
                    layer_of("lake").unwrap()
                }
                None => continue,
            };
            if used == module {
                continue;
            }
            *imports
                .entry(module.clone())
                .or_default()
                .entry(used.clone())
                .or_default() += 1;
            if used_layer >= own {
                wrong.push(format!(
                    "{}:{line}: {module} (layer {own}) imports {used} (layer {used_layer})",
                    file.strip_prefix(&src).unwrap().display()
                ));
            }
        }
    }
    for (module, used) in &imports {
        let used: Vec<&str> = used.keys().map(String::as_str).collect();
        eprintln!("{module:>9} -> {}", used.join(", "));
    }
    assert!(
        wrong.is_empty(),
        "imports against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_layer_check_sees_the_imports_it_checks() {
    let text = "use crate::store::{Caches, StoreReads};\n\
                // use crate::lake::LakeCache;\n\
                let x = crate::range::RangeCache::new();\n\
                use crate::{config, object::ObjectId};\n\
                #[cfg(test)]\n\
                mod tests {\n\
                    use crate::testkit::lake::LakeSpec;\n\
                }";
    let found: Vec<String> = crate_paths(text).into_iter().map(|(_, m)| m).collect();
    assert_eq!(found, ["store", "range", "config", "object"]);
}
