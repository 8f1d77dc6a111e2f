//! The test harness itself (`tests/it.rs`): with `autotests = false`, cargo builds only the
//! test targets Cargo.toml names, so a new file of `tests/` that nobody declares would never
//! run. Every file is either a module of `it.rs` or a `[[test]]` of its own, never both.

use std::collections::BTreeSet;
use std::path::Path;

fn repo(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// The modules `tests/it.rs` declares (`mod name;` lines).
fn it_modules() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo("tests/it.rs")).expect("read tests/it.rs");
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

/// The files of `tests/` that Cargo.toml's `[[test]]` entries build, as paths under `tests/`.
fn own_binaries() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo("Cargo.toml")).expect("read Cargo.toml");
    let manifest: toml::Table = toml::from_str(&text).expect("Cargo.toml parses");
    let tests = manifest.get("test").and_then(|t| t.as_array());
    tests
        .into_iter()
        .flatten()
        .map(|t| {
            let name = t
                .get("name")
                .and_then(|n| n.as_str())
                .expect("[[test]] name");
            match t.get("path").and_then(|p| p.as_str()) {
                Some(path) => path.to_string(),
                None => format!("tests/{name}.rs"),
            }
        })
        .filter_map(|p| p.strip_prefix("tests/").map(str::to_string))
        .collect()
}

#[test]
fn every_test_file_is_built_once() {
    let modules = it_modules();
    let binaries = own_binaries();
    assert!(
        binaries.contains("it.rs"),
        "no [[test]] for tests/it.rs: {binaries:?}"
    );
    let mut wrong = Vec::new();
    let dir = std::fs::read_dir(repo("tests")).expect("read tests/");
    for entry in dir {
        let path = entry.expect("directory entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let file = path.file_name().expect("a file name").to_string_lossy();
        let stem = file.trim_end_matches(".rs");
        match (modules.contains(stem), binaries.contains(file.as_ref())) {
            (true, true) => wrong.push(format!(
                "tests/{file}: both a module of tests/it.rs and a [[test]] of its own"
            )),
            (false, false) if file != "it.rs" => wrong.push(format!(
                "tests/{file}: never built; add `mod {stem};` to tests/it.rs (or, for a file \
                 that must run alone, a [[test]] in Cargo.toml: see the top of tests/it.rs)"
            )),
            _ => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
