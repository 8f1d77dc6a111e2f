//! Issue 21, item 6: a client cannot forge log lines. A `find` on a collection whose name
//! holds a newline, through the real binary, with the default pretty log format and with
//! JSON: no line of the log starts with the text after the newline, and the namespace is
//! there, escaped.

use crate::support;

use bson::rawdoc;
use support::bin::Binary;
use support::mongos::{FakeMongos, Hooked};
use support::raw::{self, RawClient};

const FORGED: &str = "FAKE LOG LINE";

fn config(fake: &FakeMongos) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
upstreams = ["{}"]
health_interval = "off"

[admin]
enabled = false

[[namespaces]]
pattern = "shop.*"
mode = "fallback"
"#,
        fake.addr()
    )
}

/// Sends a secondary `find` on `shop.<coll>` (mongos answers StaleConfig, which is logged
/// with the namespace at info: the trigger error and the retry) and returns the log once
/// the retry is in it.
async fn log_of_find(format: &str, coll: &str) -> String {
    let fake = FakeMongos::start().await;
    fake.set_hook(|body| {
        let stale = body.get_str("find").is_ok() && body.get_document("readConcern").is_err();
        stale.then(|| Hooked::error(13388, "StaleConfig", "shard version not ok"))
    });
    let proxy = Binary::start(&config(&fake), &["--log-format", format]);
    let addr = proxy.listen().await;
    let mut c = RawClient::connect(addr).await;
    let find = raw::msg(
        1,
        0,
        &rawdoc! {
            "find": coll,
            "filter": {},
            "$readPreference": {"mode": "secondary"},
            "$db": "shop",
        },
    );
    c.roundtrip(&find).await;
    proxy.wait_log("resending with readConcern available").await;
    proxy.log()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_name_with_a_newline_forges_no_line_in_the_pretty_log() {
    let coll = format!("x\n{FORGED}\r\u{1b}[2K");
    let log = log_of_find("pretty", &coll).await;
    let forged: Vec<&str> = log.lines().filter(|l| l.starts_with(FORGED)).collect();
    assert!(forged.is_empty(), "forged lines {forged:?} in:\n{log}");
    assert!(!log.contains('\u{1b}'), "no raw escape sequence:\n{log}");
    let trigger = log
        .lines()
        .find(|l| l.contains("trigger error"))
        .unwrap_or_else(|| panic!("a trigger error line in:\n{log}"));
    assert!(
        trigger.contains(&format!("ns=shop.x\\n{FORGED}\\r\\u{{1b}}[2K")),
        "{trigger}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_name_with_a_newline_forges_no_line_in_the_json_log() {
    let coll = format!("x\n{FORGED}");
    let log = log_of_find("json", &coll).await;
    assert!(!log.lines().any(|l| l.starts_with(FORGED)), "{log}");
    let mut seen = false;
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["fields"]["message"] == "trigger error" {
            assert_eq!(v["fields"]["ns"], format!("shop.x\n{FORGED}"), "{line}");
            seen = true;
        }
    }
    assert!(seen, "a trigger error event in:\n{log}");
}

/// Issue 32 item 7: the log does not grow with the read rate. One binary per rate; each
/// tick sends a read that meets StaleConfig on a fallback namespace whose breaker never
/// opens (one connection, `min_connections` 2: a trigger error and a retry each, at info)
/// and a read on a fallback namespace whose open breaker is closing on a long streak of
/// answered probes (each read a probe). Ten times the reads write as many lines: each call
/// site writes at most a burst per window, then says how many it left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_stays_flat_as_reads_grow_tenfold() {
    let (slow_lines, slow_reads) = lines_while_reading(20).await;
    let (fast_lines, fast_reads) = lines_while_reading(200).await;
    println!("{slow_reads} reads: {slow_lines} lines; {fast_reads} reads: {fast_lines} lines");
    assert!(
        fast_reads >= 6 * slow_reads,
        "the fast run read {fast_reads} times, the slow one {slow_reads}"
    );
    // Three sites (trigger error, retry, probe), a burst each per window, a window edge
    // perhaps inside the 3 s measured.
    let bound = 3 * 2 * staleguard::logs::BURST as usize + 6;
    assert!(slow_lines <= bound, "{slow_lines} lines at 20 reads/s");
    assert!(fast_lines <= bound, "{fast_lines} lines at 200 reads/s");
    assert!(
        fast_lines <= slow_lines + 2 * staleguard::logs::BURST as usize,
        "flat: {slow_lines} lines for {slow_reads} reads, {fast_lines} for {fast_reads}"
    );
}

/// Runs a binary, opens `shop.closing`'s breaker, heals it, then reads `per_second` ticks a
/// second for 3 s (a read on each namespace per tick); the log lines written meanwhile, and
/// the reads sent.
async fn lines_while_reading(per_second: u32) -> (usize, usize) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let fake = FakeMongos::start().await;
    let closing_stale = Arc::new(AtomicBool::new(true));
    let stale = closing_stale.clone();
    fake.set_hook(move |body| {
        let coll = body.get_str("find").ok()?;
        let relaxed = body.get_document("readConcern").is_ok();
        let fails =
            !relaxed && (coll == "flood" || (coll == "closing" && stale.load(Ordering::Relaxed)));
        fails.then(|| Hooked::error(13388, "StaleConfig", "shard version not ok"))
    });
    let config = format!(
        r#"listen = "127.0.0.1:0"
upstreams = ["{}"]
health_interval = "off"

[admin]
enabled = false

[[namespaces]]
pattern = "shop.flood"
mode = "fallback"

[[namespaces]]
pattern = "shop.closing"
mode = "fallback"
min_connections = 1
per_connection = 1000
min_wait = "0s"
min_cooldown = "100ms"
cooldown = "200ms"
close_after = 1000
"#,
        fake.addr()
    );
    let proxy = Binary::start(&config, &[]);
    let addr = proxy.listen().await;
    let mut c = RawClient::connect(addr).await;
    let find = |id: i32, coll: &str| {
        raw::msg(
            id,
            0,
            &rawdoc! {"find": coll, "filter": {}, "$readPreference": {"mode": "secondary"}, "$db": "shop"},
        )
    };
    let mut id = 0;
    let mut next = || {
        id += 1;
        id
    };
    while !proxy.log().contains("breaker transition") {
        c.roundtrip(&find(next(), "closing")).await;
    }
    closing_stale.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = proxy.log().lines().count();
    let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let start = Instant::now();
    let mut reads = 0;
    while start.elapsed() < Duration::from_secs(3) {
        tick.tick().await;
        c.roundtrip(&find(next(), "flood")).await;
        c.roundtrip(&find(next(), "closing")).await;
        reads += 2;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = proxy.log();
    let lines = log.lines().count() - before;
    assert!(
        log.contains("trigger error") && log.contains("resending with readConcern available"),
        "the flood's lines were logged:\n{log}"
    );
    (lines, reads)
}
