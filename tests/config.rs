//! Config parsing, validation, pattern precedence and the check-config views.

use std::path::Path;
use std::time::Duration;

use staleguard::command::ReadPrefMode;
use staleguard::config::*;

fn parse(text: &str) -> Result<Config, Vec<ConfigError>> {
    Config::parse(text, Path::new("t.toml"))
}

fn ok(text: &str) -> Config {
    match parse(text) {
        Ok(c) => c,
        Err(errs) => panic!("expected a valid config, got {errs:#?}"),
    }
}

/// (line, key) of every error.
fn errs(text: &str) -> Vec<(usize, String)> {
    match parse(text) {
        Ok(_) => panic!("expected errors for:\n{text}"),
        Err(errs) => errs.into_iter().map(|e| (e.line, e.key)).collect(),
    }
}

fn one_err(text: &str) -> ConfigError {
    match parse(text) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(mut errs) => {
            assert_eq!(errs.len(), 1, "{errs:#?}");
            errs.remove(0)
        }
    }
}

fn k(line: usize, key: &str) -> (usize, String) {
    (line, key.to_string())
}

fn pattern_of(c: &Config, db: &str, coll: &str) -> Option<String> {
    c.policy.lookup(db, coll).map(|p| p.pattern.clone())
}

// ----------------------------------------------------------------------------- precedence

const PRECEDENCE: &str = r#"[[namespaces]]
pattern = "*"
mode = "fallback"

[[namespaces]]
pattern = "shop.*"
mode = "strict"

[[namespaces]]
pattern = "shop.inv*"
mode = "fallback"

[[namespaces]]
pattern = "shop.inventory_*"
mode = "strict"

[[namespaces]]
pattern = "shop.inventory_eu"
mode = "fallback"

[[namespaces]]
pattern = "shop.inventory_public*"
mode = "passthrough"

[[namespaces]]
pattern = "logs.events.2024"
mode = "strict"

[[namespaces]]
pattern = "logs.events.*"
mode = "fallback"
"#;

#[test]
fn most_specific_pattern_wins() {
    let c = ok(PRECEDENCE);
    let table = [
        // (db, coll, expected pattern)
        ("shop", "inventory_eu", "shop.inventory_eu"), // exact beats every prefix
        ("shop", "inventory_us", "shop.inventory_*"),  // longer prefix beats shorter
        ("shop", "invoices", "shop.inv*"),             // shorter prefix beats db.*
        ("shop", "inv", "shop.inv*"),                  // prefix matches itself
        ("shop", "orders", "shop.*"),                  // db.* beats *
        ("other", "x", "*"),                           // only * left
        ("shopping", "inventory_eu", "*"),             // db match is exact, not a prefix
        ("shop", "inventory_public_2", "shop.inventory_public*"),
        ("logs", "events.2024", "logs.events.2024"), // db is before the FIRST dot
        ("logs", "events.2025", "logs.events.*"),    // prefix containing a dot
        ("logs", "events", "*"),                     // `events` lacks the `events.` prefix
    ];
    for (db, coll, want) in table {
        assert_eq!(
            pattern_of(&c, db, coll).as_deref(),
            Some(want),
            "{db}.{coll}"
        );
    }
    assert_eq!(
        c.policy.lookup("shop", "inventory_eu").unwrap().mode,
        Mode::Fallback
    );
    assert_eq!(
        c.policy.lookup("shop", "orders").unwrap().mode,
        Mode::Strict
    );
}

#[test]
fn passthrough_entry_overrides_a_wider_pattern() {
    let c = ok(r#"[[namespaces]]
pattern = "pay.*"
mode = "strict"

[[namespaces]]
pattern = "pay.public_rates"
mode = "passthrough"
"#);
    let p = c.policy.lookup("pay", "public_rates").unwrap();
    assert_eq!(p.mode, Mode::Passthrough);
    assert_eq!(p.pattern, "pay.public_rates");
    assert_eq!(c.policy.lookup("pay", "ledger").unwrap().mode, Mode::Strict);
    assert!(!c.policy.is_passthrough_only());
}

#[test]
fn unlisted_namespaces_have_no_policy() {
    let c = ok(r#"[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
"#);
    assert!(c.policy.lookup("demo", "store_inventory_old").is_none());
    assert!(c.policy.lookup("demo", "store").is_none());
    assert!(c.policy.lookup("payments", "x").is_none());
    assert!(c.policy.lookup("", "").is_none());
    assert_eq!(pattern_of(&c, "pay", "").as_deref(), Some("pay.*"));
}

#[test]
fn entries_keep_file_order_and_dotted_collections() {
    let c = ok(r#"[[namespaces]]
pattern = "b.x.y.z"
mode = "strict"

[[namespaces]]
pattern = "a.*"
mode = "fallback"
"#);
    let pats: Vec<&str> = c
        .policy
        .entries()
        .iter()
        .map(|p| p.pattern.as_str())
        .collect();
    assert_eq!(pats, ["b.x.y.z", "a.*"]);
    assert_eq!(pattern_of(&c, "b", "x.y.z").as_deref(), Some("b.x.y.z"));
    assert!(c.policy.lookup("b.x", "y.z").is_none());
}

#[test]
fn passthrough_only_tables() {
    assert!(ok("").policy.is_passthrough_only());
    let c = ok(r#"[[namespaces]]
pattern = "*"
mode = "passthrough"
"#);
    assert!(c.policy.is_passthrough_only());
    assert_eq!(c.policy.entries().len(), 1);
}

#[test]
fn from_policies_builds_the_same_lookup() {
    let t = PolicyTable::from_policies(vec![
        NsPolicy::with_defaults("a.*", Mode::Strict),
        NsPolicy::with_defaults("a.bc*", Mode::Fallback),
        NsPolicy::with_defaults("a.b*", Mode::Passthrough),
    ])
    .unwrap();
    assert_eq!(t.lookup("a", "bcd").unwrap().pattern, "a.bc*");
    assert_eq!(t.lookup("a", "bx").unwrap().pattern, "a.b*");
    assert_eq!(t.lookup("a", "x").unwrap().pattern, "a.*");
    let dup = PolicyTable::from_policies(vec![
        NsPolicy::with_defaults("a.*", Mode::Strict),
        NsPolicy::with_defaults("a.*", Mode::Fallback),
    ]);
    assert!(dup.unwrap_err().contains("a.*"));
    assert!(PolicyTable::from_policies(vec![NsPolicy::with_defaults("a", Mode::Strict)]).is_err());
}

// ----------------------------------------------------------------------------- layout

#[test]
fn layout_is_per_core_shared_or_uring() {
    assert_eq!(ok("layout = \"shared\"\n").layout, Layout::Shared);
    assert_eq!(ok("layout = \"per-core\"\n").layout, Layout::PerCore);
    assert_eq!(ok("layout = \"uring\"\n").layout, Layout::Uring);
    let e = one_err("listen = \"127.0.0.1:0\"\nlayout = \"thread-per-core\"\n");
    assert_eq!((e.line, e.key.as_str()), (2, "layout"));
    assert!(
        e.message.contains("per-core")
            && e.message.contains("shared")
            && e.message.contains("uring"),
        "{}",
        e.message
    );
    let e = one_err("layout = 2\n");
    assert_eq!(e.line, 1);
}

// ----------------------------------------------------------------------------- defaults

#[test]
fn empty_file_is_all_defaults() {
    let c = ok("");
    assert_eq!(c.listen, "127.0.0.1:27018");
    assert_eq!(c.upstreams, ["127.0.0.1:27017"]);
    assert_eq!(c.max_message_size, 48_000_000);
    assert_eq!(c.connect_timeout, Duration::from_secs(5));
    assert_eq!(c.shutdown_timeout, Duration::from_secs(10));
    assert_eq!(c.layout, Layout::PerCore);
    assert_eq!(c.admin_listen.as_deref(), Some("127.0.0.1:9187"));
    assert_eq!(c.admin_token, None);
    assert_eq!(c.health_interval, Some(Duration::from_secs(5)));
    assert_eq!(c.health_timeout, Duration::from_secs(2));
    assert!(c.tls.is_none() && c.upstream_tls.is_none());
    assert!(c.policy.entries().is_empty());
    assert_eq!(c.source, Path::new("t.toml"));
}

#[test]
fn builtin_defaults_apply_without_a_defaults_table() {
    let c = ok(r#"[[namespaces]]
pattern = "a.b"
mode = "fallback"
"#);
    let p = c.policy.lookup("a", "b").unwrap();
    assert_eq!(**p, NsPolicy::with_defaults("a.b", Mode::Fallback));
    assert_eq!(p.threshold, 3);
    assert_eq!(p.window, Duration::from_secs(10));
    assert_eq!(p.cooldown, Duration::from_secs(3));
    assert_eq!(p.close_after, 3);
    assert_eq!(p.open_time_limit, Duration::from_millis(200));
    assert_eq!(p.confirm_time, Duration::from_millis(250));
    assert_eq!(
        p.trigger_codes,
        [13388, 63, 150, 249, 50, 262, 89, 133, 202]
    );
    assert_eq!(
        read_pref_names(p.read_preferences),
        "secondary,secondaryPreferred,nearest"
    );
    assert!(!p.allows_read_pref(ReadPrefMode::Primary));
    assert!(!p.allows_read_pref(ReadPrefMode::PrimaryPreferred));
    assert!(p.allows_read_pref(ReadPrefMode::Nearest));
    assert_eq!((p.max_time, p.slow_read, p.dry_run), (None, None, false));
    assert_eq!(p.causal, Causal::Drop);
    assert!(p.is_trigger(13388) && !p.is_trigger(11600));
}

#[test]
fn entry_overrides_defaults_which_override_builtins() {
    let c = ok(r#"listen = "0.0.0.0:27100"
upstreams = ["m1:27017", "[::1]:27018"]
max_message_size = 16384
connect_timeout = "1500ms"
shutdown_timeout = "0s"

[admin]
listen = "127.0.0.1:0"

[defaults]
threshold = 5
window = "1m"
read_preferences = ["nearest"]
max_time = "2s"
dry_run = true
causal = "skip"

[[namespaces]]
pattern = "a.b"
mode = "fallback"
threshold = 1
cooldown = "250ms"
trigger_codes = [13388]
slow_read = "500ms"
dry_run = false

[[namespaces]]
pattern = "a.*"
mode = "strict"
"#);
    assert_eq!(c.listen, "0.0.0.0:27100");
    assert_eq!(c.upstreams, ["m1:27017", "[::1]:27018"]);
    assert_eq!(c.max_message_size, 16384);
    assert_eq!(c.connect_timeout, Duration::from_millis(1500));
    assert_eq!(c.shutdown_timeout, Duration::ZERO);
    assert_eq!(c.admin_listen.as_deref(), Some("127.0.0.1:0"));

    let b = c.policy.lookup("a", "b").unwrap();
    assert_eq!(b.threshold, 1); // entry
    assert_eq!(b.window, Duration::from_secs(60)); // [defaults]
    assert_eq!(b.cooldown, Duration::from_millis(250)); // entry
    assert_eq!(b.read_preferences, ReadPrefMode::Nearest.bit()); // [defaults]
    assert_eq!(b.trigger_codes, [13388]); // entry
    assert_eq!(b.max_time, Some(Duration::from_secs(2))); // [defaults]
    assert_eq!(b.slow_read, Some(Duration::from_millis(500))); // entry
    assert!(!b.dry_run); // entry beats [defaults]
    assert_eq!(b.causal, Causal::Skip); // [defaults]

    let s = c.policy.lookup("a", "z").unwrap();
    assert_eq!(s.threshold, 5);
    assert_eq!(s.cooldown, Duration::from_secs(3)); // built-in
    assert!(s.dry_run);
    assert_eq!(s.trigger_codes.len(), 9);
}

#[test]
fn inline_tables_are_accepted() {
    let c = ok(r#"namespaces = [{ pattern = "x.y", mode = "strict", threshold = 2 }]"#);
    assert_eq!(c.policy.lookup("x", "y").unwrap().threshold, 2);
}

// ----------------------------------------------------------------------------- errors

#[test]
fn unknown_top_level_key() {
    let e = one_err(
        r#"listen = "127.0.0.1:1"
listn = "127.0.0.1:2"
"#,
    );
    assert_eq!((e.line, e.key.as_str()), (2, "listn"));
    assert_eq!(e.message, "unknown key `listn`: did you mean `listen`?");
    assert_eq!(e.file, "t.toml");
    assert!(
        e.to_string().starts_with("t.toml:2: listn: unknown key"),
        "{e}"
    );
}

#[test]
fn unknown_key_inside_namespace_entry() {
    let e = one_err(
        r#"[[namespaces]]
pattern = "a.b"
mode = "fallback"

[[namespaces]]
pattern = "c.d"
mode = "strict"
treshold = 4
"#,
    );
    assert_eq!((e.line, e.key.as_str()), (8, "namespaces[1].treshold"));
}

#[test]
fn unknown_keys_in_admin_and_defaults_and_unknown_tables() {
    assert_eq!(
        errs("[admin]\nlisten = \"127.0.0.1:1\"\nport = 3\n"),
        [k(3, "admin.port")]
    );
    assert_eq!(
        errs("[defaults]\n\nwindw = \"1s\"\n"),
        [k(3, "defaults.windw")]
    );
    assert_eq!(errs("\n[metrics]\nx = 1\n"), [k(2, "metrics")]);
}

#[test]
fn wrong_type_names_the_key() {
    assert_eq!(
        errs("[defaults]\nthreshold = \"3\"\n"),
        [k(2, "defaults.threshold")]
    );
    assert_eq!(errs("upstreams = \"m:1\"\n"), [k(1, "upstreams")]);
    assert_eq!(errs("upstreams = [\"m:1\", 2]\n"), [k(1, "upstreams[1]")]);
}

#[test]
fn syntax_error_alone_with_its_line() {
    let e = one_err("listen = \"127.0.0.1:1\"\n\n[defaults\nthreshold = 3\n");
    assert_eq!((e.line, e.key.as_str()), (3, "syntax"));
    let e = one_err("listen = \"a:1\"\nlisten = \"b:2\"\n");
    assert_eq!((e.line, e.key.as_str()), (2, "syntax"), "{e}");
}

#[test]
fn bad_durations() {
    let text = r#"connect_timeout = "5 parsecs"

[defaults]
window = "0s"
cooldown = "10"

[[namespaces]]
pattern = "a.b"
mode = "fallback"
max_time = "500us"
slow_read = "0ms"
"#;
    assert_eq!(
        errs(text),
        [
            k(1, "connect_timeout"),
            k(4, "defaults.window"),
            k(5, "defaults.cooldown"),
            k(10, "namespaces[0].max_time"),
            k(11, "namespaces[0].slow_read"),
        ]
    );
    let all = parse(text).unwrap_err();
    assert!(
        all[0].message.contains("invalid duration `5 parsecs`"),
        "{}",
        all[0]
    );
    assert!(all[1].message.contains("greater than zero"), "{}", all[1]);
    assert!(all[3].message.contains("at least 1ms"), "{}", all[3]);
}

#[test]
fn zero_and_negative_thresholds() {
    let e = one_err("[defaults]\nthreshold = 0\n");
    assert_eq!((e.line, e.key.as_str()), (2, "defaults.threshold"));
    assert!(e.message.contains("out of range 1.."), "{}", e.message);
    assert_eq!(
        errs("[[namespaces]]\npattern = \"a.b\"\nmode = \"strict\"\nthreshold = -2\n"),
        [k(4, "namespaces[0].threshold")]
    );
}

#[test]
fn bad_and_missing_mode() {
    let e = one_err("[[namespaces]]\npattern = \"a.b\"\nmode = \"relaxed\"\n");
    assert_eq!((e.line, e.key.as_str()), (3, "namespaces[0].mode"));
    assert!(e.message.contains("`relaxed`"), "{}", e.message);
    assert_eq!(
        errs("\n[[namespaces]]\npattern = \"a.b\"\n"),
        [k(2, "namespaces[0].mode")]
    );
    assert_eq!(
        errs("[[namespaces]]\nmode = \"strict\"\n"),
        [k(1, "namespaces[0].pattern")]
    );
}

#[test]
fn bad_pattern_forms() {
    for bad in [
        "", "nodot", "*.coll", "a*.coll", ".coll", "db.", "db.a*b", "db.**", "db.*x", "**",
        "my db.x", "d$b.x",
    ] {
        let text = format!("[[namespaces]]\nmode = \"strict\"\npattern = \"{bad}\"\n");
        let e = one_err(&text);
        assert_eq!(
            (e.line, e.key.as_str()),
            (3, "namespaces[0].pattern"),
            "pattern {bad:?}"
        );
        assert!(
            e.message.contains(&format!("`{bad}`")) || bad.is_empty(),
            "{}",
            e.message
        );
    }
}

#[test]
fn duplicate_patterns_name_both_lines() {
    let text = r#"[[namespaces]]
pattern = "pay.*"
mode = "strict"

[[namespaces]]
pattern = "pay.ledger"
mode = "fallback"

[[namespaces]]
mode = "fallback"
pattern = "pay.*"
"#;
    let e = one_err(text);
    assert_eq!((e.line, e.key.as_str()), (11, "namespaces[2].pattern"));
    assert!(
        e.message.contains("namespaces[0] at line 2"),
        "{}",
        e.message
    );
    let e = one_err("[[namespaces]]\npattern = \"*\"\nmode = \"strict\"\n[[namespaces]]\npattern = \"*\"\nmode = \"passthrough\"\n");
    assert_eq!((e.line, e.key.as_str()), (5, "namespaces[1].pattern"));
    assert!(e.message.contains("line 2"), "{}", e.message);
    // The same prefix length in one database only overlaps when the prefix is the same.
    ok("[[namespaces]]\npattern = \"a.ab*\"\nmode = \"strict\"\n[[namespaces]]\npattern = \"a.ac*\"\nmode = \"strict\"\n");
}

#[test]
fn passthrough_entry_with_settings_is_unreachable() {
    let text = r#"[[namespaces]]
pattern = "a.*"
mode = "passthrough"
threshold = 2
window = "1s"
cooldown = "1s"
read_preferences = ["nearest"]
trigger_codes = [50]
max_time = "1s"
dry_run = true
causal = "skip"
slow_read = "100ms"
"#;
    let keys = [
        "threshold",
        "window",
        "cooldown",
        "read_preferences",
        "trigger_codes",
        "max_time",
        "dry_run",
        "causal",
        "slow_read",
    ];
    let want: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| k(i + 4, &format!("namespaces[0].{key}")))
        .collect();
    assert_eq!(errs(text), want);
    let all = parse(text).unwrap_err();
    assert!(all.iter().all(|e| e.message.contains("passthrough")));
    // Inheriting [defaults] is fine: nothing was written on the entry.
    ok("[defaults]\nthreshold = 2\n[[namespaces]]\npattern = \"a.*\"\nmode = \"passthrough\"\n");
}

#[test]
fn causal_on_strict_is_unreachable() {
    assert_eq!(
        errs("[[namespaces]]\npattern = \"a.*\"\nmode = \"strict\"\ncausal = \"drop\"\n"),
        [k(4, "namespaces[0].causal")]
    );
    assert_eq!(
        errs("[[namespaces]]\npattern = \"a.*\"\nmode = \"fallback\"\ncausal = \"maybe\"\n"),
        [k(4, "namespaces[0].causal")]
    );
}

#[test]
fn slow_read_must_be_below_max_time() {
    // Both on the entry.
    let e = one_err("[[namespaces]]\npattern = \"a.b\"\nmode = \"strict\"\nmax_time = \"1s\"\nslow_read = \"1s\"\n");
    assert_eq!((e.line, e.key.as_str()), (5, "namespaces[0].slow_read"));
    assert!(e.message.contains("line 4"), "{}", e.message);
    // Both in [defaults]: reported once, there.
    assert_eq!(
        errs("[defaults]\nslow_read = \"2s\"\nmax_time = \"1s\"\n[[namespaces]]\npattern = \"a.b\"\nmode = \"strict\"\n"),
        [k(2, "defaults.slow_read")]
    );
    // max_time on the entry against slow_read from [defaults].
    assert_eq!(
        errs("[defaults]\nslow_read = \"2s\"\n[[namespaces]]\npattern = \"a.b\"\nmode = \"fallback\"\nmax_time = \"2s\"\n"),
        [k(6, "namespaces[0].max_time")]
    );
    ok("[defaults]\nslow_read = \"2s\"\n[[namespaces]]\npattern = \"a.b\"\nmode = \"fallback\"\nmax_time = \"3s\"\n");
}

#[test]
fn read_preference_errors() {
    assert_eq!(
        errs("[defaults]\nread_preferences = [\"secondary\", \"seconday\"]\n"),
        [k(2, "defaults.read_preferences[1]")]
    );
    assert_eq!(
        errs("[[namespaces]]\npattern = \"a.b\"\nmode = \"fallback\"\nread_preferences = [\"primary\"]\n"),
        [k(4, "namespaces[0].read_preferences[0]")]
    );
    assert_eq!(
        errs("[defaults]\nread_preferences = []\n"),
        [k(2, "defaults.read_preferences")]
    );
    let e = one_err("[defaults]\nread_preferences = [\n  \"nearest\",\n  \"primary\",\n]\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (4, "defaults.read_preferences[1]")
    );
    assert!(e.message.contains("never eligible"), "{}", e.message);
}

#[test]
fn trigger_code_errors() {
    assert_eq!(
        errs("[defaults]\ntrigger_codes = []\n"),
        [k(2, "defaults.trigger_codes")]
    );
    assert_eq!(
        errs("[defaults]\ntrigger_codes = [50, -1, 4294967296]\n"),
        [
            k(2, "defaults.trigger_codes[1]"),
            k(2, "defaults.trigger_codes[2]")
        ]
    );
}

#[test]
fn address_and_size_errors() {
    assert_eq!(errs("upstreams = []\n"), [k(1, "upstreams")]);
    assert_eq!(
        errs("upstreams = [\"m1:27017\", \"m2\", \"m3:0\", \"m4:99999\", \":1\"]\n"),
        [
            k(1, "upstreams[1]"),
            k(1, "upstreams[2]"),
            k(1, "upstreams[3]"),
            k(1, "upstreams[4]")
        ]
    );
    assert_eq!(errs("listen = \"localhost\"\n"), [k(1, "listen")]);
    assert_eq!(errs("listen = \"::1:27018\"\n"), [k(1, "listen")]);
    assert_eq!(
        errs("\n\nmax_message_size = 100\n"),
        [k(3, "max_message_size")]
    );
    assert_eq!(
        errs("max_message_size = 2147483648\n"),
        [k(1, "max_message_size")]
    );
    assert_eq!(
        errs("listen = \"127.0.0.1:5000\"\n[admin]\nlisten = \"127.0.0.1:5000\"\n"),
        [k(3, "admin.listen")]
    );
    ok("listen = \"localhost:0\"\nupstreams = [\"mongos.internal:27017\"]\n");
}

#[test]
fn pattern_and_mode_do_not_belong_in_defaults() {
    assert_eq!(
        errs("[defaults]\npattern = \"a.b\"\nmode = \"strict\"\n"),
        [k(2, "defaults.pattern"), k(3, "defaults.mode")]
    );
}

#[test]
fn validation_errors_are_all_collected() {
    let text = r#"upstreams = []

[defaults]
threshold = 0

[[namespaces]]
pattern = "a"
mode = "fallback"

[[namespaces]]
pattern = "b.c"
mode = "nope"
window = "x"
"#;
    assert_eq!(
        errs(text),
        [
            k(1, "upstreams"),
            k(4, "defaults.threshold"),
            k(7, "namespaces[0].pattern"),
            k(12, "namespaces[1].mode"),
            k(13, "namespaces[1].window"),
        ]
    );
}

#[test]
fn unreadable_file() {
    let errs = Config::load(Path::new("/nonexistent/staleguard.toml")).unwrap_err();
    assert_eq!(errs.len(), 1);
    assert_eq!((errs[0].line, errs[0].key.as_str()), (0, "file"));
    assert_eq!(errs[0].file, "/nonexistent/staleguard.toml");
}

// ----------------------------------------------------------------------------- shipped file

fn shipped() -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/staleguard.toml");
    match Config::load(&path) {
        Ok(c) => c,
        Err(e) => panic!("{e:#?}"),
    }
}

#[test]
fn shipped_config_parses() {
    let c = shipped();
    assert_eq!(c.listen, "127.0.0.1:27018");
    assert_eq!(c.upstreams, ["127.0.0.1:27017"]);
    assert_eq!(c.admin_listen.as_deref(), Some("127.0.0.1:9187"));
    assert_eq!(c.max_message_size, 48_000_000);
    let inv = c.policy.lookup("demo", "store_inventory").unwrap();
    assert_eq!(inv.mode, Mode::Fallback);
    assert_eq!(
        (inv.threshold, inv.window, inv.cooldown),
        (3, Duration::from_secs(10), Duration::from_secs(3))
    );
    assert_eq!(c.policy.lookup("pay", "ledger").unwrap().mode, Mode::Strict);
    assert!(c.policy.lookup("demo", "other").is_none());
    assert_eq!(c.policy.entries().len(), 2);
}

// ----------------------------------------------------------------------------- views

#[test]
fn render_table_shows_every_entry_in_effective_form() {
    let c = ok(r#"listen = "127.0.0.1:27018"
[admin]
listen = "127.0.0.1:9187"
[defaults]
max_time = "2s"
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"
slow_read = "750ms"
[[namespaces]]
pattern = "pay.*"
mode = "strict"
dry_run = true
[[namespaces]]
pattern = "pay.rates"
mode = "passthrough"
"#);
    let out = render_table(&c);
    assert!(
        out.contains("listen                    127.0.0.1:27018"),
        "{out}"
    );
    assert!(
        out.contains("admin.listen              127.0.0.1:9187"),
        "{out}"
    );
    assert!(
        out.contains("upstreams                 127.0.0.1:27017"),
        "{out}"
    );
    assert!(out.contains("max_message_size          48000000"), "{out}");
    assert!(out.contains("connect_timeout           5s"), "{out}");
    assert!(out.contains("shutdown_timeout          10s"), "{out}");
    assert!(out.contains("layout                    per-core"), "{out}");
    // Four tables keyed by `#`, each under its title; every setting in one of them.
    let cells = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let table = |title: &str| -> Vec<Vec<String>> {
        let lines: Vec<&str> = out.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with(&format!("namespaces: {title}")))
            .unwrap_or_else(|| panic!("no table {title}:\n{out}"));
        lines[at + 1..]
            .iter()
            .take_while(|l| !l.is_empty())
            .map(|l| cells(l))
            .collect()
    };
    let entries = table("entries");
    assert_eq!(
        entries,
        [
            vec!["#", "line", "pattern", "mode", "dry_run", "on_open", "causal", "ladder"],
            vec![
                "0",
                "7",
                "demo.store_inventory",
                "fallback",
                "false",
                "-",
                "drop",
                "[available]"
            ],
            vec!["1", "11", "pay.*", "strict", "true", "bound", "-", "[]"],
            vec!["2", "15", "pay.rates", "passthrough", "-", "-", "-", "-"],
        ]
    );
    // Passthrough entries have no settings: only in the first table.
    assert_eq!(
        table("breakers"),
        [
            vec![
                "#",
                "threshold",
                "window",
                "cooldown",
                "min_cooldown",
                "close_after",
                "min_connections",
                "per_connection"
            ],
            vec!["0", "3", "10s", "3s", "1s", "3", "2", "1"],
            vec!["1", "3", "10s", "3s", "1s", "3", "2", "1"],
        ]
    );
    assert_eq!(
        table("time limits"),
        [
            vec![
                "#",
                "max_time",
                "slow_read",
                "min_wait",
                "attempt_share",
                "attempt_limit",
                "open_time_limit",
                "confirm_time"
            ],
            vec!["0", "2s", "750ms", "1s", "0.5", "500ms", "-", "250ms"],
            vec!["1", "2s", "-", "1s", "-", "-", "200ms", "250ms"],
        ]
    );
    assert_eq!(
        table("reads governed"),
        [
            vec!["#", "read_preferences", "trigger_codes"],
            vec![
                "0",
                "secondary,secondaryPreferred,nearest",
                "13388,63,150,249,50,262,89,133,202"
            ],
            vec![
                "1",
                "secondary,secondaryPreferred,nearest",
                "13388,63,150,249,50,262,89,133,202"
            ],
        ]
    );
    assert!(out.lines().all(|l| l.chars().count() <= 100), "{out}");
    assert!(render_table(&ok("")).contains("every read passes through"));
}

#[test]
fn explain_names_the_winning_entry_and_why() {
    let c = ok(PRECEDENCE);
    let out = explain(&c, "shop.inventory_us");
    assert!(
        out.starts_with(
            "shop.inventory_us: matches namespaces[3] `shop.inventory_*` (line 14): strict"
        ),
        "{out}"
    );
    assert!(
        out.contains("longest collection prefix `inventory_*`"),
        "{out}"
    );
    // Losers, most specific first.
    let inv = out.find("namespaces[2] `shop.inv*` (line 10)").expect(&out);
    let db = out.find("namespaces[1] `shop.*` (line 6)").expect(&out);
    let all = out.find("namespaces[0] `*` (line 2)").expect(&out);
    assert!(inv < db && db < all, "{out}");
    // The default strict mode sends reads bounded while open; the error comes after.
    assert!(
        out.contains("each attempt with maxTimeMS at most 200ms"),
        "{out}"
    );
    assert!(out.contains("the fail-fast error"), "{out}");
    assert!(out.contains("threshold        3"), "{out}");

    let out = explain(&c, "shop.inventory_eu");
    assert!(
        out.contains("namespaces[4] `shop.inventory_eu` (line 18): fallback"),
        "{out}"
    );
    assert!(out.contains("exact namespace"), "{out}");
    assert!(out.contains("readConcern available"), "{out}");

    let out = explain(&c, "shop.inventory_public_x");
    assert!(out.contains("passthrough"), "{out}");
    assert!(out.contains("forwarded untouched"), "{out}");

    let out = explain(&c, "logs.events.2024");
    assert!(out.contains("`logs.events.2024` (line 26)"), "{out}");

    let out = explain(&shipped(), "demo.other");
    assert_eq!(
        out.trim_end(),
        "demo.other: unlisted: passthrough (no pattern matches; reads are forwarded untouched)"
    );
    assert!(explain(&shipped(), "nodot").contains("not a namespace"));
}

// ----------------------------------------------------------------------------- hot path

mod alloc_count {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        pub static ALLOCS: Cell<usize> = const { Cell::new(0) };
    }

    /// Counts allocations per thread, so that parallel tests do not disturb each other.
    pub struct Counting;

    // SAFETY: forwards to the system allocator unchanged; only counts.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    pub fn count() -> usize {
        ALLOCS.with(|n| n.get())
    }
}

#[test]
fn lookup_does_not_allocate() {
    let c = ok(PRECEDENCE);
    let names = [
        ("shop", "inventory_eu"),
        ("shop", "inventory_us"),
        ("shop", "orders"),
        ("logs", "events.2025"),
        ("other", "x"),
    ];
    let before = alloc_count::count();
    let mut found = 0;
    for (db, coll) in names {
        found += usize::from(c.policy.lookup(db, coll).is_some());
    }
    let after = alloc_count::count();
    assert_eq!(found, names.len());
    assert_eq!(after - before, 0, "lookup allocated");
    // The counter works: a String allocates.
    let s = String::from("x").repeat(100);
    assert!(alloc_count::count() > after, "{s}");
}

// ----------------------------------------------------------------------------- operations

#[test]
fn admin_token_health_and_switching_the_admin_endpoint_off() {
    let c = ok("health_interval = \"1s\"\nhealth_timeout = \"1s\"\n[admin]\ntoken = \"abc-123\"\n");
    assert_eq!(c.admin_listen.as_deref(), Some("127.0.0.1:9187"));
    assert_eq!(c.admin_token.as_deref(), Some("abc-123"));
    assert_eq!(c.health_interval, Some(Duration::from_secs(1)));
    assert_eq!(c.health_timeout, Duration::from_secs(1));
    let off = ok("health_interval = \"off\"\n[admin]\nenabled = false\n");
    assert_eq!((off.admin_listen, off.health_interval), (None, None));
    // Port 0 on both sides binds two different free ports.
    let c = ok("listen = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n");
    assert_eq!(c.admin_listen.as_deref(), Some("127.0.0.1:0"));
}

#[test]
fn operations_errors_name_line_and_key() {
    assert_eq!(
        errs("[admin]\nenabled = false\nlisten = \"127.0.0.1:1\"\n"),
        [k(3, "admin.listen")]
    );
    assert_eq!(errs("[admin]\ntoken = \"a b\"\n"), [k(2, "admin.token")]);
    assert_eq!(errs("[admin]\ntoken = \"\"\n"), [k(2, "admin.token")]);
    assert_eq!(
        errs("health_interval = \"0s\"\n"),
        [k(1, "health_interval")]
    );
    assert_eq!(
        errs("\nhealth_timeout = \"soon\"\n"),
        [k(2, "health_timeout")]
    );
    let e = one_err("health_interval = \"1s\"\nhealth_timeout = \"3s\"\n");
    assert_eq!((e.line, e.key.as_str()), (2, "health_timeout"));
    assert!(
        e.message.contains("longer than health_interval"),
        "{}",
        e.message
    );
    let e = one_err("health_interval = \"1s\"\n");
    assert_eq!((e.line, e.key.as_str()), (1, "health_interval"));
    assert_eq!(errs("[tls]\ncert = \"a\"\n"), [k(1, "tls.key")]);
    // The unknown key, and (its entry left out) what the rest lacks: a CA.
    assert_eq!(
        errs("[upstream_tls]\nsni = \"x\"\n"),
        [k(1, "upstream_tls.ca"), k(2, "upstream_tls.sni")]
    );
}

// ------------------------------------------------------------- issue 12: ladder and budget

/// (line, key) of every error; empty when the text is valid.
fn problems(text: &str) -> Vec<(usize, String)> {
    parse(text)
        .err()
        .map(|errs| errs.into_iter().map(|e| (e.line, e.key)).collect())
        .unwrap_or_default()
}

#[test]
fn ladder_budget_and_backoff_defaults() {
    let c = ok("[[namespaces]]\npattern = \"a.b\"\nmode = \"fallback\"\n[[namespaces]]\npattern = \"p.*\"\nmode = \"strict\"\n");
    let fb = c.policy.lookup("a", "b").expect("fallback");
    assert_eq!(fb.min_cooldown, Duration::from_secs(1));
    assert_eq!(fb.attempt_share, 0.5);
    assert_eq!(fb.attempt_limit, Some(Duration::from_millis(500)));
    assert!(!fb.primary_rung);
    assert_eq!(fb.ladder(), ["available"]);
    let strict = c.policy.lookup("p", "x").expect("strict");
    assert!(
        !strict.primary_rung,
        "strict stays fail-fast unless it opts in"
    );
    assert!(strict.ladder().is_empty());
    assert_eq!(c.ladder_guard.max_in_flight, 16);
    assert_eq!(c.ladder_guard.max_per_second, 100);
    assert_eq!(c.ladder_guard.per_connection, 4);
}

#[test]
fn ladder_keys_set_and_inherited() {
    let c = ok(r#"[defaults]
min_cooldown = "2s"
attempt_share = 0.25
[ladder_guard]
max_in_flight = 4
max_per_second = 20
[[namespaces]]
pattern = "pay.*"
mode = "strict"
ladder = ["primary"]
attempt_limit = "300ms"
[[namespaces]]
pattern = "demo.inv"
mode = "fallback"
ladder = ["primary", "available"]
"#);
    let pay = c.policy.lookup("pay", "t").expect("strict");
    assert!(pay.primary_rung);
    assert_eq!(pay.ladder(), ["primary"]);
    assert_eq!(pay.attempt_share, 0.25);
    assert_eq!(pay.attempt_limit, Some(Duration::from_millis(300)));
    assert_eq!(pay.min_cooldown, Duration::from_secs(2));
    let inv = c.policy.lookup("demo", "inv").expect("fallback");
    assert_eq!(inv.ladder(), ["primary", "available"]);
    assert_eq!(
        (c.ladder_guard.max_in_flight, c.ladder_guard.max_per_second),
        (4, 20)
    );
}

#[test]
fn ladder_errors_name_line_and_key() {
    let strict = |ladder: &str| {
        problems(&format!(
            "[[namespaces]]\npattern = \"p.*\"\nmode = \"strict\"\nladder = {ladder}\n"
        ))
    };
    // Strict is never relaxed.
    assert_eq!(
        strict("[\"primary\", \"available\"]"),
        [k(4, "namespaces[0].ladder")]
    );
    assert_eq!(strict("[\"available\"]"), [k(4, "namespaces[0].ladder")]);
    assert_eq!(strict("[\"secondary\"]"), [k(4, "namespaces[0].ladder[0]")]);
    assert_eq!(
        strict("[\"primary\", \"primary\"]"),
        [k(4, "namespaces[0].ladder[1]")]
    );
    assert!(strict("[]").is_empty() && strict("[\"primary\"]").is_empty());
    let fallback = |ladder: &str| {
        problems(&format!(
            "[[namespaces]]\npattern = \"d.c\"\nmode = \"fallback\"\nladder = {ladder}\n"
        ))
    };
    // A fallback ladder ends with available.
    for bad in ["[]", "[\"primary\"]", "[\"available\", \"primary\"]"] {
        assert_eq!(fallback(bad), [k(4, "namespaces[0].ladder")], "{bad}");
    }
    // Inherited from [defaults]: the error names where it was written.
    assert_eq!(
        problems("[defaults]\nladder = [\"primary\", \"available\"]\n[[namespaces]]\npattern = \"p.*\"\nmode = \"strict\"\n"),
        [k(2, "defaults.ladder")]
    );
    // Passthrough never climbs.
    assert_eq!(
        problems(
            "[[namespaces]]\npattern = \"p.*\"\nmode = \"passthrough\"\nladder = [\"primary\"]\n"
        ),
        [k(4, "namespaces[0].ladder")]
    );
}

// ----------------------------------------------------------------------------- evidence and limits

#[test]
fn evidence_settings_default_and_override() {
    let c = ok(r#"[defaults]
min_wait = "2s"
per_connection = 2
[[namespaces]]
pattern = "pay.*"
mode = "strict"
min_connections = 3
[[namespaces]]
pattern = "demo.x"
mode = "fallback"
min_wait = "0s"
"#);
    let pay = c.policy.lookup("pay", "t").unwrap();
    assert_eq!(
        (pay.min_wait, pay.min_connections, pay.per_connection),
        (Duration::from_secs(2), 3, 2)
    );
    let demo = c.policy.lookup("demo", "x").unwrap();
    assert_eq!(
        (demo.min_wait, demo.min_connections, demo.per_connection),
        (Duration::ZERO, 2, 2)
    );
    let built_in =
        staleguard::policy::NsPolicy::with_defaults("a.b", staleguard::policy::Mode::Strict);
    assert_eq!(
        (
            built_in.min_wait,
            built_in.min_connections,
            built_in.per_connection
        ),
        (Duration::from_secs(1), 2, 1)
    );
}

#[test]
fn budget_and_cooldown_errors() {
    let e = |body: &str| {
        problems(&format!(
            "[[namespaces]]\npattern = \"d.c\"\nmode = \"fallback\"\n{body}\n"
        ))
    };
    for share in ["0.0", "1.5", "-0.5", "nan"] {
        assert_eq!(
            e(&format!("attempt_share = {share}")),
            [k(4, "namespaces[0].attempt_share")],
            "{share}"
        );
    }
    assert!(e("attempt_share = 1.0").is_empty());
    assert!(e("attempt_limit = \"off\"").is_empty());
    assert_eq!(
        e("attempt_limit = \"0ms\""),
        [k(4, "namespaces[0].attempt_limit")]
    );
    assert_eq!(
        e("attempt_limit = \"30d\""),
        [k(4, "namespaces[0].attempt_limit")]
    );
    assert_eq!(
        e("min_cooldown = \"0s\""),
        [k(4, "namespaces[0].min_cooldown")]
    );
    // The first cooldown cannot be longer than the longest.
    assert_eq!(
        e("min_cooldown = \"40s\""),
        [k(4, "namespaces[0].min_cooldown")]
    );
    assert!(e("min_cooldown = \"40s\"\ncooldown = \"1m\"").is_empty());
    assert_eq!(
        problems("[defaults]\nmin_cooldown = \"5s\"\ncooldown = \"2s\"\n"),
        [k(2, "defaults.min_cooldown")]
    );
    // A strict entry without a primary rung has no next rung to share its budget with.
    let s = |body: &str| {
        problems(&format!(
            "[[namespaces]]\npattern = \"p.*\"\nmode = \"strict\"\n{body}\n"
        ))
    };
    assert_eq!(
        s("attempt_share = 0.5"),
        [k(4, "namespaces[0].attempt_share")]
    );
    assert_eq!(
        s("attempt_limit = \"1s\""),
        [k(4, "namespaces[0].attempt_limit")]
    );
    assert!(s("ladder = [\"primary\"]\nattempt_limit = \"1s\"").is_empty());
}

#[test]
fn ladder_guard_errors() {
    let laddered = "[[namespaces]]\npattern = \"p.*\"\nmode = \"strict\"\nladder = [\"primary\"]\n";
    assert_eq!(
        problems(&format!("[ladder_guard]\nmax_in_flight = 0\n{laddered}")),
        [k(2, "ladder_guard.max_in_flight")]
    );
    assert_eq!(
        problems(&format!("[ladder_guard]\nmax_per_second = -3\n{laddered}")),
        [k(2, "ladder_guard.max_per_second")]
    );
    assert_eq!(
        problems(&format!("[ladder_guard]\nper_connection = 0\n{laddered}")),
        [k(2, "ladder_guard.per_connection")]
    );
    // Without any primary rung the guard can never act.
    assert_eq!(
        problems("[ladder_guard]\nmax_in_flight = 4\n[[namespaces]]\npattern = \"p.*\"\nmode = \"strict\"\n"),
        [k(1, "ladder_guard")]
    );
    assert_eq!(
        problems(&format!("[ladder_guard]\nmax_queued = 1\n{laddered}"))
            .first()
            .map(|(_, key)| key.as_str()),
        Some("ladder_guard.max_queued")
    );
}

#[test]
fn evidence_settings_are_validated_with_their_lines() {
    assert_eq!(
        errs("[defaults]\nmin_connections = 0\nper_connection = 1001\n[[namespaces]]\npattern = \"a.b\"\nmode = \"strict\"\nmin_wait = \"soon\"\n"),
        [k(2, "defaults.min_connections"), k(3, "defaults.per_connection"), k(7, "namespaces[0].min_wait")]
    );
    let e =
        one_err("[[namespaces]]\npattern = \"a.b\"\nmode = \"passthrough\"\nmin_connections = 2\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (4, "namespaces[0].min_connections")
    );
}

#[test]
fn a_huge_cooldown_is_refused_at_load() {
    // Parsed, then `Instant + cooldown` overflowed (a panic) before durations were bounded.
    let e = one_err(
        "[[namespaces]]\npattern = \"pay.*\"\nmode = \"strict\"\ncooldown = \"500000000years\"\n",
    );
    assert_eq!((e.line, e.key.as_str()), (4, "namespaces[0].cooldown"));
    assert!(
        e.message.contains("longest") || e.message.contains("longer"),
        "{}",
        e.message
    );
    // Every duration has the same bound: a day is the most.
    for key in ["connect_timeout", "shutdown_timeout", "health_interval"] {
        let e = one_err(&format!("{key} = \"25h\"\n"));
        assert_eq!((e.line, e.key.as_str()), (1, key));
    }
    let e = one_err("[defaults]\nwindow = \"2days\"\n");
    assert_eq!(e.key, "defaults.window");
    ok("[defaults]\ncooldown = \"24h\"\n");
}

// ------------------------------------------------------------- issue 20: the breaker map

#[test]
fn breaker_share_default_value_and_errors() {
    assert_eq!(ok("").breaker_share, 0.5);
    assert_eq!(ok("breaker_share = 0.25\n").breaker_share, 0.25);
    assert_eq!(ok("breaker_share = 1.0\n").breaker_share, 1.0);
    for bad in ["0.0", "-0.5", "1.5", "nan"] {
        assert_eq!(
            problems(&format!(
                "listen = \"127.0.0.1:0\"\nbreaker_share = {bad}\n"
            )),
            [k(2, "breaker_share")],
            "{bad}"
        );
    }
    let shown = staleguard::config::render_table(&ok("breaker_share = 0.25\n"));
    assert!(shown.contains("breaker_share             0.25"), "{shown}");
}

#[test]
fn per_connection_per_second_default_value_and_errors() {
    let laddered = "[[namespaces]]\npattern = \"p.*\"\nmode = \"strict\"\nladder = [\"primary\"]\n";
    assert_eq!(ok(laddered).ladder_guard.per_connection_per_second, 10);
    // Unset: a tenth of max_per_second, at least 1.
    let g = |guard: &str| ok(&format!("[ladder_guard]\n{guard}\n{laddered}")).ladder_guard;
    assert_eq!(g("max_per_second = 40").per_connection_per_second, 4);
    assert_eq!(g("max_per_second = 5").per_connection_per_second, 1);
    assert_eq!(
        g("max_per_second = 40\nper_connection_per_second = 40").per_connection_per_second,
        40
    );
    for bad in ["0", "-1", "101"] {
        assert_eq!(
            problems(&format!(
                "[ladder_guard]\nper_connection_per_second = {bad}\n{laddered}"
            )),
            [k(2, "ladder_guard.per_connection_per_second")],
            "{bad}"
        );
    }
    let shown = staleguard::config::render_table(&ok(laddered));
    assert!(
        shown.contains("16 in flight, 100/s per upstream; per connection 4 in flight, 10/s"),
        "{shown}"
    );
}

#[test]
fn write_timeout_defaults_to_30s_and_is_never_zero() {
    let c = ok("");
    assert_eq!(c.limits.write_timeout, Duration::from_secs(30));
    let c = ok("write_timeout = \"5s\"\n");
    assert_eq!(c.limits.write_timeout, Duration::from_secs(5));
    assert_eq!(errs("write_timeout = \"0s\"\n"), [k(1, "write_timeout")]);
    assert_eq!(errs("write_timeout = \"off\"\n"), [k(1, "write_timeout")]);
    assert_eq!(errs("write_timeout = \"soon\"\n"), [k(1, "write_timeout")]);
}
