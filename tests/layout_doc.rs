//! The documentation matches the tree, the way `layers.rs` checks the import layers: the
//! Layout's list of files (`docs/layout.md`, "The files") names every file under `src/`,
//! `crates/*/src/` and `tests/`, once, and no file that does not exist; and every relative
//! link of `README.md` and `docs/*.md` reaches a file, and a heading of it when it names one.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

const LAYOUT: &str = "docs/layout.md";
/// The heading of the Layout's list of files.
const LIST_HEADING: &str = "## The files";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// Every file under `rel` (a folder of the repository), as a path from the repository's
/// root. Hidden names and what tools leave behind (`__pycache__`, `node_modules`, `target`)
/// are not the project's files.
fn files_under(rel: &str, out: &mut BTreeSet<String>) {
    let dir = std::fs::read_dir(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"));
    for entry in dir {
        let entry = entry.expect("directory entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || ["__pycache__", "node_modules", "target"].contains(&&*name) {
            continue;
        }
        let path = format!("{rel}{name}");
        if entry.file_type().expect("file type").is_dir() {
            files_under(&format!("{path}/"), out);
        } else {
            out.insert(path);
        }
    }
}

/// The folders whose every file the list names: `src/`, each crate's `src/`, `tests/`.
fn roots() -> Vec<String> {
    let mut roots = vec!["src/".to_string(), "tests/".to_string()];
    let crates = std::fs::read_dir(repo().join("crates")).expect("read crates/");
    for entry in crates {
        let name = entry.expect("directory entry").file_name();
        let src = format!("crates/{}/src/", name.to_string_lossy());
        if repo().join(&src).is_dir() {
            roots.push(src);
        }
    }
    roots.sort();
    roots
}

fn tree(roots: &[String]) -> BTreeSet<String> {
    let mut files = BTreeSet::new();
    for root in roots {
        files_under(root, &mut files);
    }
    files
}

/// The files the Layout's list names, as paths from the repository's root. The list is a
/// markdown list under [`LIST_HEADING`], up to the next heading: an item is `` - `name` ``
/// and what it owns; a name ending in `/` is a folder whose items are indented two spaces
/// more, and a top-level item is a folder given from the root (one of `roots`). Lines that
/// are no item (a wrapped description, prose) are passed over.
fn listed(text: &str, roots: &[String]) -> Result<Vec<String>, String> {
    let mut lines = text.lines().skip_while(|l| l.trim_end() != LIST_HEADING);
    if lines.next().is_none() {
        return Err(format!("no `{LIST_HEADING}` heading"));
    }
    let mut folders: Vec<String> = Vec::new();
    let mut files = Vec::new();
    for (n, line) in lines.enumerate() {
        if line.starts_with('#') {
            break;
        }
        let indent = line.len() - line.trim_start_matches(' ').len();
        let Some(item) = line[indent..].strip_prefix("- `") else {
            continue;
        };
        let Some((name, _)) = item.split_once('`') else {
            continue;
        };
        let at = || format!("line {} after the heading, `{name}`", n + 1);
        if indent % 2 != 0 {
            return Err(format!("{}: odd indentation", at()));
        }
        let depth = indent / 2;
        if depth == 0 {
            if !roots.iter().any(|r| r == name) {
                return Err(format!("{}: a top-level item is one of {roots:?}", at()));
            }
            folders = vec![name.to_string()];
            continue;
        }
        if depth > folders.len() {
            return Err(format!("{}: indented past its folder", at()));
        }
        folders.truncate(depth);
        let path = format!("{}{name}", folders[depth - 1]);
        if name.ends_with('/') {
            folders.push(path);
        } else {
            files.push(path);
        }
    }
    Ok(files)
}

/// What is wrong between the list and the tree: each file named twice, each file the list
/// leaves out, each file it names that does not exist.
fn mismatches(listed: &[String], tree: &BTreeSet<String>) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut wrong = Vec::new();
    for f in listed {
        if !seen.insert(f.clone()) {
            wrong.push(format!("{f}: named twice"));
        }
    }
    for f in tree.difference(&seen) {
        wrong.push(format!("{f}: not named (add a line for it)"));
    }
    for f in seen.difference(tree) {
        wrong.push(format!("{f}: named, but there is no such file"));
    }
    wrong
}

#[test]
fn the_layout_names_every_file_of_the_tree_and_no_other() {
    let roots = roots();
    let list = listed(&read(LAYOUT), &roots).unwrap_or_else(|e| panic!("{LAYOUT}: {e}"));
    let wrong = mismatches(&list, &tree(&roots));
    assert!(
        wrong.is_empty(),
        "{LAYOUT} ({LIST_HEADING}) does not match the tree:\n  {}",
        wrong.join("\n  ")
    );
}

#[test]
fn the_check_sees_a_file_left_out_a_stale_one_and_a_repeat() {
    let roots = vec!["src/".to_string()];
    let text = "# Layout\n\n## The files\n\n- `src/`\n  - `a.rs`: one\n    more words\n  \
                - `b/`\n    - `c.rs`: two\n  - `gone.rs`: three\n  - `a.rs`: again\n\n\
                ## After\n\n- `src/`\n  - `later.rs`\n";
    let list = listed(text, &roots).expect("parses");
    assert_eq!(list, ["src/a.rs", "src/b/c.rs", "src/gone.rs", "src/a.rs"]);
    let tree: BTreeSet<String> = ["src/a.rs", "src/b/c.rs", "src/d.rs"]
        .map(String::from)
        .into();
    assert_eq!(
        mismatches(&list, &tree),
        [
            "src/a.rs: named twice",
            "src/d.rs: not named (add a line for it)",
            "src/gone.rs: named, but there is no such file",
        ]
    );
    assert!(
        listed("- `src/`\n  - `a.rs`\n", &roots).is_err(),
        "no heading"
    );
    let skipped = "## The files\n- `src/`\n    - `a.rs`\n";
    assert!(listed(skipped, &roots).is_err(), "a level skipped");
    assert!(
        listed("## The files\n- `lib/`\n", &roots).is_err(),
        "not a root"
    );
}

/// GitHub's anchor of a heading: lower case, punctuation dropped but `-` and `_`, spaces as
/// `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of a markdown text's inline links, `[text](target)`.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].to_string());
        }
    }
    out
}

/// `path` without `.` and `..`, or `None` when it climbs out of the repository.
fn normal(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            c => out.push(c),
        }
    }
    Some(out)
}

#[test]
fn every_relative_link_of_the_docs_reaches_its_file_and_heading() {
    let mut docs = vec!["README.md".to_string()];
    let mut found = BTreeSet::new();
    files_under("docs/", &mut found);
    docs.extend(found.into_iter().filter(|f| f.ends_with(".md")));
    assert!(docs.len() > 5, "{docs:?}");
    let mut wrong = Vec::new();
    for doc in &docs {
        let text = read(doc);
        let dir = Path::new(doc).parent().unwrap_or(Path::new(""));
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((&target, ""));
            let file = if file.is_empty() {
                PathBuf::from(doc)
            } else {
                // A link out of the repository (the shared folder beside it) is not ours.
                let Some(p) = normal(&dir.join(file)) else {
                    continue;
                };
                p
            };
            let shown = file.display();
            if !repo().join(&file).exists() {
                wrong.push(format!("{doc}: ({target}): no file {shown}"));
                continue;
            }
            if frag.is_empty() {
                continue;
            }
            let Some(rel) = file.to_str().filter(|f| f.ends_with(".md")) else {
                continue;
            };
            if !anchors(&read(rel)).contains(frag) {
                wrong.push(format!("{doc}: ({target}): no heading #{frag} in {rel}"));
            }
        }
    }
    assert!(wrong.is_empty(), "broken links:\n  {}", wrong.join("\n  "));
}
