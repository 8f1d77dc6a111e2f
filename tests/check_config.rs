//! `staleguard check-config` (and `run`) as an operator meets them, through the binary:
//! every structural mistake in one run with its file:line:key and a "did you mean"; the
//! values of the rest still checked; a warning (exit 0) for a fallback or passthrough
//! pattern that relaxes names a strict one matches; output that fits 100 columns; a clear
//! hint naming `--config` when the default file is missing.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_staleguard");

fn run_in(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .expect("run staleguard");
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

fn check(text: &str) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("s.toml"), text).expect("write config");
    run_in(dir.path(), &["check-config", "s.toml"])
}

const BASE: &str = "listen = \"127.0.0.1:27018\"\nupstreams = [\"127.0.0.1:27017\"]\n";

#[test]
fn every_structural_mistake_in_one_run_with_did_you_mean() {
    let text = format!(
        r#"{BASE}max_conections = 5

[admin]
listen = "127.0.0.1:9187"
tokn = "x"

[stall_watch]
stall_after = 5

[[namespaces]]
pattern = "pay.*"
mode = "strict"
thresold = 3

[[namespaces]]
pattern = "demo.inventory"
mode = "fallback"
window = "soon"
colour = "blue"
"#
    );
    let (code, out, err) = check(&text);
    assert_eq!(code, Some(2), "{out}\n{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines,
        [
            "error: s.toml:3: max_conections: unknown key `max_conections`: did you mean `max_connections`?",
            "error: s.toml:7: admin.tokn: unknown key `tokn`: did you mean `token`?",
            "error: s.toml:10: stall_watch.stall_after: expected a string in quotes, found the number 5",
            "error: s.toml:15: namespaces[0].thresold: unknown key `thresold`: did you mean `threshold`?",
            "error: s.toml:20: namespaces[1].window: invalid duration `soon`: expected number at 0 (write e.g. \"250ms\", \"10s\", \"2m\")",
            &format!("error: s.toml:21: namespaces[1].colour: unknown key `colour`; known keys here: {}", lines[5].split("known keys here: ").nth(1).unwrap_or("?")),
        ],
        "{err}"
    );
    assert!(
        lines[5].contains("pattern, mode, threshold, window"),
        "{err}"
    );
    assert!(out.is_empty(), "no table for an invalid file: {out}");
}

#[test]
fn a_missing_field_and_a_wrong_type_in_two_sections() {
    let text = format!(
        "{BASE}[ladder_guard]\nmax_in_flight = \"many\"\n\n[[namespaces]]\npattern = \"pay.*\"\n"
    );
    let (code, _, err) = check(&text);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("s.toml:4: ladder_guard.max_in_flight: expected a whole number, found the string \"many\""),
        "{err}"
    );
    assert!(
        err.contains("s.toml:6: namespaces[0].mode: missing"),
        "{err}"
    );
}

#[test]
fn a_pattern_relaxing_part_of_a_strict_one_is_a_warning() {
    let text = format!(
        "{BASE}[[namespaces]]\npattern = \"pay.*\"\nmode = \"strict\"\n\n\
         [[namespaces]]\npattern = \"pay.t*\"\nmode = \"fallback\"\n\n\
         [[namespaces]]\npattern = \"demo.*\"\nmode = \"fallback\"\n"
    );
    let (code, out, err) = check(&text);
    assert_eq!(code, Some(0), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].starts_with(
            "warning: s.toml:8: namespaces[1].pattern: `pay.t*` (fallback) governs names that the strict `pay.*` (line 4) also matches, e.g. `pay.tx`"
        ),
        "{err}"
    );
    assert!(out.contains("pay.t*"), "the table still prints: {out}");
    // Strict more specific than the fallback: nothing is relaxed, nothing said.
    let text = format!(
        "{BASE}[[namespaces]]\npattern = \"pay.*\"\nmode = \"fallback\"\n\n\
         [[namespaces]]\npattern = \"pay.t*\"\nmode = \"strict\"\n"
    );
    let (code, _, err) = check(&text);
    assert_eq!(code, Some(0));
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn the_output_fits_a_100_column_terminal() {
    let codes: Vec<String> = (1..=40).map(|c| (13000 + c).to_string()).collect();
    let text = format!(
        r#"{BASE}
[stall_watch]
on_write_stall = "open_fallback_breakers"

[[namespaces]]
pattern = "a_rather_long_database_name.and_a_long_collection_prefix_too*"
mode = "fallback"
ladder = ["primary", "available"]
trigger_codes = [{}]
read_preferences = ["secondary", "secondaryPreferred", "nearest", "primaryPreferred"]
window = "1h 30m 15s"
max_time = "2m 30s 500ms"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
dry_run = true

[[namespaces]]
pattern = "logs.*"
mode = "passthrough"
"#,
        codes.join(", ")
    );
    let (code, out, err) = check(&text);
    assert_eq!(code, Some(0), "{err}");
    for l in out.lines() {
        assert!(
            l.chars().count() <= 100,
            "{} columns: {l}\n{out}",
            l.chars().count()
        );
    }
    // Nothing is cut: every trigger code is printed.
    for c in &codes {
        assert!(out.contains(c.as_str()), "{c} missing:\n{out}");
    }
    assert!(out.contains("a_rather_long_database_name.and_a_long_collection_prefix_too*"));
    // The shipped config too.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/staleguard.toml");
    let (code, out, err) = run_in(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        &["check-config", shipped.to_str().expect("utf-8 path")],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(out.lines().all(|l| l.chars().count() <= 100), "{out}");
}

/// Issue 32 items 5 and 11: the settings' values start in one column, past the longest
/// name; `[fleet]` and its budgets are printed (the password masked, a default name named as
/// such); `--explain` says what the default strict mode does (reads still go out, bounded)
/// and serde's type names never appear in an error.
#[test]
fn settings_align_the_fleet_prints_and_explain_says_what_strict_does() {
    let text = format!(
        "{BASE}[fleet]\nredis = \"redis://:hunter2@redis.ops:6379/0\"\n\
         [ladder_guard]\nfleet_max_per_second = 200\nfleet_max_in_flight = 32\n\
         [[namespaces]]\npattern = \"pay.*\"\nmode = \"strict\"\nladder = [\"primary\"]\n\
         [[namespaces]]\npattern = \"pay.audit\"\nmode = \"strict\"\n"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("s.toml"), &text).expect("write config");
    let (code, out, err) = run_in(
        dir.path(),
        &["check-config", "s.toml", "--explain", "pay.audit"],
    );
    assert_eq!(code, Some(0), "{err}");
    let settings: Vec<&str> = out.lines().take_while(|l| !l.is_empty()).collect();
    let column = |l: &str| {
        l.find(' ')
            .map(|i| i + l[i..].find(|c: char| c != ' ').unwrap_or(0))
    };
    let starts: Vec<usize> = settings
        .iter()
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| column(l))
        .collect();
    assert!(
        starts.windows(2).all(|w| w[0] == w[1]),
        "values start in one column: {starts:?}\n{out}"
    );
    assert!(out.contains("max_connections_per_peer  off"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("fleet.redis") && l.ends_with("redis://:***@redis.ops:6379/0")),
        "{out}"
    );
    assert!(!out.contains("hunter2"), "{out}");
    assert!(out.contains("(the default, listen's address"), "{out}");
    assert!(
        out.contains("fleet_max_per_second 200/s, fleet_max_in_flight 32 in flight"),
        "{out}"
    );
    let effect: String = out
        .split("  effect: ")
        .nth(1)
        .map(|e| e.split("\n  threshold").next().unwrap_or(e))
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        effect.contains(
            "reads are still sent, each attempt with maxTimeMS at most 200ms (on_open = \"bound\")"
        ),
        "the default strict mode is not plain fail-fast: {effect}"
    );
    assert!(effect.contains("sent once more under it"), "{effect}");
    // Without [fleet] it says so.
    let (_, out, _) = check(BASE);
    assert!(
        out.contains("fleet                     - (no [fleet]"),
        "{out}"
    );
    // serde's type names stay out of errors.
    let (code, _, err) = check(&format!(
        "{BASE}[[namespaces]]\npattern = \"a.b\"\nmode = \"strict\"\nthreshold = \"3\"\nclose_after = 2.5\ndry_run = \"yes\"\n"
    ));
    assert_eq!(code, Some(2));
    for serde in ["i64", "u32", "a boolean", "invalid type"] {
        assert!(!err.contains(serde), "{serde:?} in {err}");
    }
    assert!(
        err.contains("namespaces[0].threshold: expected a whole number, found the string \"3\" (write 3, without quotes)"),
        "{err}"
    );
    assert!(
        err.contains("namespaces[0].dry_run: expected true or false, found the string \"yes\""),
        "{err}"
    );
}

#[test]
fn a_missing_default_config_names_the_config_flag() {
    let dir = tempfile::tempdir().expect("temp dir");
    for args in [&["run"][..], &["check-config"][..]] {
        let (code, _, err) = run_in(dir.path(), args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.contains("config/staleguard.toml")
                && err.contains("relative to the current directory"),
            "{args:?}: {err}"
        );
        assert!(err.contains("--config FILE"), "{args:?}: {err}");
    }
    // `check-config --config FILE` is the same as `check-config FILE`.
    std::fs::write(dir.path().join("x.toml"), BASE).expect("write");
    let (code, out, err) = run_in(dir.path(), &["check-config", "--config", "x.toml"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("config                    x.toml"), "{out}");
}
