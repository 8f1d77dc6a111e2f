//! The module graph of `src/`: no cycles, and every module imports only modules of the layers
//! below its own (the map in `src/lib.rs`). Edges are the `crate::x` paths a module's files
//! name before their `#[cfg(test)]` (unit tests may reach anywhere), doc links included; a
//! module is a top-level file or folder of `src/`.
//!
//! A new module goes into `LAYERS` (and the lib.rs map) where it belongs; a module that must
//! import a higher one means state or a type should move down, not that the layers should.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom to top, as drawn in `src/lib.rs`. Modules in one layer do not import each other.
const LAYERS: &[&[&str]] = &[
    // the workspace's other crates, re-exported: below the proxy (protocol, simulated
    // cluster), and the demo, which reaches the proxy only through `demo_proxy`
    &["wire", "sim", "demo"],
    // the recent past (a ring of events, the plots' series): everything that makes an event
    // reaches it through `Metrics::recent`
    &["events"],
    // classification: one pass over the body (and where the fields a rewrite edits stand)
    &["command"],
    // leaves: every metric name, rustls, splicing, the log field formatter
    &["metrics", "tls", "rewrite", "logs"],
    // the pattern table, decide (pure), what a decision means for a request
    &["policy"],
    &["config"],
    // shared state: live config + generation, ids, runtime facts; the breakers; the upstreams
    &["state", "breaker", "upstream"],
    // background tasks, each given the handles it uses
    &["health", "stall", "confirm"],
    // with `[fleet]`: openings, budgets and probe leadership shared through Redis
    &["fleet"],
    // one Arc of each handle, for session, admin and reload
    &["handles"],
    &["session"],
    &["admin", "reload"],
    &["server"],
    // beside the proxy: what the demo reads of a running proxy
    &["demo_proxy"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_'
}

fn ident_at(b: &[u8], at: usize) -> Option<String> {
    let end = (at..b.len()).find(|&k| !is_ident(b[k])).unwrap_or(b.len());
    (end > at && !b[at].is_ascii_digit()).then(|| String::from_utf8_lossy(&b[at..end]).into())
}

/// The top-level modules `text` names through `crate::`: `crate::a::b`, and each item of a
/// group, `crate::{a, b::{c, d}}` (a and b).
fn crate_paths(text: &str) -> BTreeSet<String> {
    let b = text.as_bytes();
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("crate::") {
        let at = from + found;
        from = at + "crate::".len();
        // `$crate::` (macros) and names that merely end in "crate" are not paths of this crate.
        if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b'$' || b[at - 1].is_ascii_uppercase()) {
            continue;
        }
        if b.get(from) != Some(&b'{') {
            out.extend(ident_at(b, from));
            continue;
        }
        let (mut depth, mut item_start) = (0usize, true);
        for k in from..b.len() {
            match b[k] {
                b'{' => {
                    depth += 1;
                    item_start = depth == 1;
                }
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                b',' if depth == 1 => item_start = true,
                c if c.is_ascii_whitespace() => {}
                c if depth == 1 && item_start && is_ident(c) => {
                    out.extend(ident_at(b, k));
                    item_start = false;
                }
                _ => {
                    if depth == 1 {
                        item_start = false;
                    }
                }
            }
        }
    }
    out.remove("self");
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// module → the modules it names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&root).expect("under src");
        let first = rel.components().next().expect("a path");
        let first = first.as_os_str().to_string_lossy();
        let module = first.strip_suffix(".rs").unwrap_or(&first).to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let targets = edges.entry(module.clone()).or_default();
        targets.extend(crate_paths(code).into_iter().filter(|t| *t != module));
    }
    edges
}

/// A cycle through `start`, if there is one (depth-first, the path as found).
fn cycle_from(
    start: &str,
    edges: &BTreeMap<String, BTreeSet<String>>,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(i) = path.iter().position(|m| m == start) {
        let mut cycle = path[i..].to_vec();
        cycle.push(start.to_string());
        return Some(cycle);
    }
    if done.contains(start) {
        return None;
    }
    path.push(start.to_string());
    for next in edges.get(start).into_iter().flatten() {
        if let Some(c) = cycle_from(next, edges, path, done) {
            return Some(c);
        }
    }
    path.pop();
    done.insert(start.to_string());
    None
}

#[test]
fn the_module_graph_has_no_cycles() {
    let edges = graph();
    let mut done = BTreeSet::new();
    for module in edges.keys() {
        if let Some(cycle) = cycle_from(module, &edges, &mut Vec::new(), &mut done) {
            panic!("module cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn every_module_imports_only_layers_below_its_own() {
    let mut wrong = Vec::new();
    for (module, targets) in graph() {
        let Some(own) = layer_of(&module) else {
            wrong.push(format!(
                "{module}: not in LAYERS (tests/layers.rs) nor the lib.rs map"
            ));
            continue;
        };
        for t in targets {
            match layer_of(&t) {
                None => wrong.push(format!("{module} -> {t}: {t} is not in LAYERS")),
                Some(l) if l >= own => wrong.push(format!(
                    "{module} (layer {own}) -> {t} (layer {l}): imports {}",
                    if l == own { "its own layer" } else { "upward" }
                )),
                Some(_) => {}
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

/// `LAYERS` names exactly the modules `lib.rs` declares (and re-exports), so the list cannot
/// drift from the crate.
#[test]
fn the_layers_name_every_module_of_lib_rs() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("read lib.rs");
    let mut declared = BTreeSet::new();
    for line in lib.lines().map(str::trim) {
        let line = line.strip_prefix("pub ").unwrap_or(line);
        if let Some(m) = line.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            declared.insert(m.to_string());
        } else if let Some(rest) = line.strip_prefix("use staleguard_") {
            if let Some((_, alias)) = rest.strip_suffix(';').and_then(|r| r.split_once(" as ")) {
                declared.insert(alias.to_string());
            }
        }
    }
    let layered: BTreeSet<String> = LAYERS
        .iter()
        .flat_map(|l| l.iter())
        .map(|m| m.to_string())
        .collect();
    assert_eq!(declared, layered, "lib.rs modules vs LAYERS");
}

#[test]
fn crate_paths_reads_single_paths_and_nested_groups() {
    let text = "use crate::a::B;\nuse crate::{b, c::{d, e}, self};\n\
                /// see [`crate::f::g`]\nlet x = $crate::h::i; let y = mycrate::j;";
    let got: Vec<String> = crate_paths(text).into_iter().collect();
    assert_eq!(got, ["a", "b", "c", "f"]);
}
