//! The status page keeps the recent past: during an incident on the simulated cluster
//! (shard A's primary stalls, a1 restarts), headless Chromium sees the worst news first,
//! one sentence linking the stall to the open breakers, the SVG plots with their lines and
//! stall bands, and the events list; 20 s after the heal `/status` still has the
//! incident's events. Buckets of 1 s (`[admin] history_interval`); the screenshots are kept
//! in `target/tmp/page_history/` (their paths are printed).

mod ops_support;
mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use mongodb::error::Error;
use mongodb::Client;
use ops_support::chromium;
use ops_support::http::get;
use staleguard::breaker::State;
use staleguard::config::Config;
use staleguard::server::Running;
use staleguard::sim::{self, SimConfig, SimHandle};
use support::within;

const INVENTORY: &str = "demo.store_inventory";
const PAYMENTS: &str = "pay.transactions";

/// Passive and serverStatus signals (the latter names the shard), the action on; both
/// namespaces count each error as it comes (one client), strict ones fail fast when open.
const CONFIG: &str = r#"
[admin]
listen = "127.0.0.1:0"
history_interval = "1s"

[stall_watch]
stall_after = "1s"
on_write_stall = "open_fallback_breakers"

[stall_watch.shards]
uris = ["mongodb://{a0}/?directConnection=true", "mongodb://{b0}/?directConnection=true"]
poll = "200ms"
for = "1s"
baseline = "2s"

[defaults]
min_connections = 1
per_connection = 1000
min_wait = "0s"
cooldown = "1s"

[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
on_open = "refuse"
"#;

async fn start() -> (SimHandle, Running) {
    let sim = sim::start(SimConfig {
        listen: "127.0.0.1:0".into(),
        node_ports: true,
        write_tickets: 8,
        refresh_timeout: Duration::from_millis(300),
        stale_retries: 1,
        find_host_timeout: Duration::from_millis(200),
        ..SimConfig::default()
    })
    .await
    .expect("sim starts");
    let text = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nhealth_interval = \"off\"\nshutdown_timeout = \"0s\"\n{}",
        sim.addr(),
        CONFIG
            .replace("{a0}", &sim.node_addr("a0").expect("a0").to_string())
            .replace("{b0}", &sim.node_addr("b0").expect("b0").to_string())
    );
    let config = Config::parse(&text, Path::new("<page history test>"))
        .unwrap_or_else(|e| panic!("{e:#?}\n{text}"));
    let proxy = staleguard::server::start(Arc::new(config))
        .await
        .expect("proxy starts");
    (sim, proxy)
}

/// A find on `ns` pinned to `node` on shard A (b1 on shard B), every document in one batch.
async fn find_on(c: &Client, ns: &str, node: &str) -> Result<usize, Error> {
    let (db, coll) = ns.split_once('.').expect("db.coll");
    let cmd = doc! {
        "find": coll, "filter": {}, "batchSize": 5000,
        "$readPreference": { "mode": "secondary", "tags": [{ "node": node }, { "node": "b1" }] },
    };
    let reply = within("find", c.database(db).run_command(cmd)).await?;
    let cursor = reply.get_document("cursor").expect("cursor");
    Ok(cursor.get_array("firstBatch").map_or(0, |b| b.len()))
}

async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The DOM as Chromium built it, and a screenshot kept as `name`.
async fn look(url: &str, name: &str) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("page_history");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    let shot = dir.join(name);
    let profile = tempfile::tempdir().expect("profile dir");
    let (u, p) = (url.to_string(), profile.path().to_path_buf());
    let dom =
        tokio::task::spawn_blocking(move || chromium::run(&u, "--dump-dom", &p, (1400, 2600)))
            .await
            .expect("chromium task");
    let (u, p, s) = (url.to_string(), profile.path().to_path_buf(), shot.clone());
    tokio::task::spawn_blocking(move || {
        chromium::run(
            &u,
            &format!("--screenshot={}", s.display()),
            &p,
            (1400, 2600),
        )
    })
    .await
    .expect("screenshot task");
    assert!(shot.exists(), "no screenshot at {}", shot.display());
    println!("screenshot: {}", shot.display());
    dom
}

/// The element of `dom` that starts with `open` up to its `close`.
fn section<'a>(dom: &'a str, open: &str, close: &str) -> &'a str {
    let start = dom
        .find(open)
        .unwrap_or_else(|| panic!("no {open} in the page"));
    let rest = &dom[start..];
    &rest[..rest.find(close).map_or(rest.len(), |e| e + close.len())]
}

fn at(dom: &str, what: &str) -> usize {
    dom.find(what)
        .unwrap_or_else(|| panic!("{what} missing from the page"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_incident_over_time_and_status_keeps_its_events() {
    let started = Instant::now();
    let (sim, proxy) = start().await;
    let shared = proxy.shared().clone();
    let admin = proxy.admin_addr().expect("admin endpoint");
    let url = format!("http://{admin}/");
    let client = Client::with_uri_str(format!(
        "mongodb://{}/?serverSelectionTimeoutMS=5000&maxPoolSize=64",
        proxy.local_addr()
    ))
    .await
    .expect("driver client");
    for ns in [INVENTORY, PAYMENTS] {
        assert!(find_on(&client, ns, "a1").await.expect("warm-up") > 0);
    }
    // Orders every 40 ms through the proxy, each insert in its own task (a stalled one hangs
    // and holds its connection: a client of their own, so the readers' pool stays free).
    let writer = Client::with_uri_str(format!(
        "mongodb://{}/?serverSelectionTimeoutMS=5000&maxPoolSize=400",
        proxy.local_addr()
    ))
    .await
    .expect("writer client");
    let orders = writer.database("demo").collection::<Document>("orders");
    let writing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let w = writing.clone();
    tokio::spawn(async move {
        while w.load(std::sync::atomic::Ordering::Relaxed) {
            let c = orders.clone();
            tokio::spawn(async move { c.insert_one(doc! { "item": "widget" }).await });
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    });
    until(
        "a write baseline on shard A",
        Duration::from_secs(6),
        || {
            shared.stall.signals().iter().any(|s| {
                s.place.starts_with("shard A")
                    && s.evidence.baseline_ops_per_second.unwrap_or(0.0) > 5.0
            })
        },
    )
    .await;

    // The incident: shard A's primary completes no writes, then a1 restarts.
    sim.cluster().stall_primary("shardA").expect("stall");
    until("the composite signal", Duration::from_secs(6), || {
        shared
            .stall
            .signals()
            .iter()
            .any(|s| s.raised && s.evidence.shard.is_some())
    })
    .await;
    until("inventory held open", Duration::from_secs(3), || {
        shared.breakers.is_held(INVENTORY)
    })
    .await;
    println!("{:?}: stall raised, inventory held", started.elapsed());
    sim.cluster().restart_node("a1").expect("restart a1");
    for _ in 0..3 {
        assert!(
            find_on(&client, PAYMENTS, "a1").await.is_err(),
            "StaleConfig on a1"
        );
    }
    assert_eq!(shared.breakers.state(PAYMENTS), State::Open);
    println!("{:?}: payments open", started.elapsed());
    // Reads go on: payments fail fast (but for a probe now and then, which meets the
    // StaleConfig), inventory is rewritten to `available`.
    let mut failed_fast = 0;
    for _ in 0..3 {
        for _ in 0..5 {
            let e = find_on(&client, PAYMENTS, "a1").await.expect_err("fails");
            failed_fast += usize::from(e.to_string().contains("staleguard:"));
        }
        for _ in 0..5 {
            assert!(find_on(&client, INVENTORY, "a1").await.expect("available") > 0);
        }
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    until(
        "two buckets with the incident",
        Duration::from_secs(4),
        || shared.metrics.recent.series().ends().len() >= 3,
    )
    .await;

    let dom = look(&url, "during-incident.png").await;
    // Worst news first: the incident sentence, the stall, the open breakers; no green line.
    let incident = at(&dom, "id=\"incident\"");
    let stall = at(&dom, "id=\"write-stall\"");
    let breaker = at(&dom, "class=\"banner bad breaker-open\"");
    assert!(
        incident < stall && stall < breaker,
        "order: {incident} {stall} {breaker}"
    );
    assert!(
        !dom.contains("id=\"no-open-breaker\""),
        "no green line while open"
    );
    let sentence = section(&dom, "<div class=\"banner bad\" id=\"incident\">", "</div>");
    assert!(
        sentence.contains("because shard A's primary completes no writes"),
        "{sentence}"
    );
    assert!(
        sentence.contains(PAYMENTS) && sentence.contains(INVENTORY),
        "{sentence}"
    );
    let stall_banner = section(
        &dom,
        "<div class=\"banner bad\" id=\"write-stall\">",
        "</div>",
    );
    assert!(
        stall_banner.contains("Write stall suspected for "),
        "{stall_banner}"
    );
    assert!(
        stall_banner.contains("holding the breakers of fallback namespaces open"),
        "{stall_banner}"
    );
    let pay = section(&dom, &format!("data-ns=\"{PAYMENTS}\">"), "</div>");
    assert!(
        pay.contains(" open for ") && pay.contains("failing fast"),
        "{pay}"
    );
    assert!(failed_fast >= 10, "{failed_fast} of 15 failed fast");
    assert!(pay.contains(&format!("{failed_fast} failed fast")), "{pay}");
    // The plots: an SVG per entry, with the lines that have data and the stall band.
    let pay_plot = section(
        &dom,
        "<figure class=\"plot\" data-entry=\"pay.*\">",
        "</figure>",
    );
    assert!(pay_plot.contains("<svg"), "{pay_plot}");
    assert!(
        pay_plot.contains("data-measure=\"failed_fast\""),
        "{pay_plot}"
    );
    assert!(
        pay_plot.contains("data-measure=\"trigger_errors\""),
        "{pay_plot}"
    );
    assert!(pay_plot.contains("class=\"stall\""), "{pay_plot}");
    let inv_plot = section(
        &dom,
        &format!("<figure class=\"plot\" data-entry=\"{INVENTORY}\">"),
        "</figure>",
    );
    assert!(
        inv_plot.contains("data-measure=\"rewritten\""),
        "{inv_plot}"
    );
    assert!(inv_plot.contains("data-measure=\"answered\""), "{inv_plot}");
    let points = section(pay_plot, "data-measure=\"failed_fast\"", "\">");
    assert!(
        points.matches(',').count() >= 3,
        "a point per bucket: {points}"
    );
    // The events list, most recent first, with the transition.
    let events = section(&dom, "<table id=\"events\">", "</table>");
    assert!(events.contains("data-kind=\"breaker_opened\""), "{events}");
    assert!(
        events.contains("data-kind=\"write_stall_raised\""),
        "{events}"
    );
    assert!(
        events.find("pay.transactions") < events.find("write stall raised"),
        "newest first: {events}"
    );

    // The heal: the primary resumes, the breakers close through their probes.
    sim.cluster().resume_primary("shardA").expect("resume");
    let healed = Instant::now();
    until("the stall clears", Duration::from_secs(4), || {
        !shared.stall.suspected()
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    // Reads that still fail fast until the breaker closes (its streak takes one answer per
    // connection per min_cooldown) are in the history too.
    let mut failed_fast_after = 0;
    while shared.breakers.state(PAYMENTS) == State::Open
        || shared.breakers.state(INVENTORY) == State::Open
    {
        assert!(Instant::now() < deadline, "breakers close after the heal");
        if let Err(e) = find_on(&client, PAYMENTS, "a1").await {
            failed_fast_after += usize::from(e.to_string().contains("staleguard:"));
        }
        let _ = find_on(&client, INVENTORY, "a1").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(healed.elapsed())).await;

    // 20 s later: /status still tells the incident.
    let st = get(admin, "/status", &[]).await.json();
    let events = st["events"].as_array().expect("events").clone();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    for want in [
        "breaker_opened",
        "breaker_closed",
        "write_stall_raised",
        "write_stall_cleared",
    ] {
        assert!(kinds.contains(&want), "{want} missing: {kinds:?}");
    }
    let opened = events
        .iter()
        .find(|e| e["kind"] == "breaker_opened" && e["namespace"] == PAYMENTS)
        .expect("the payments breaker's opening");
    assert!(
        opened["reason"]
            .as_str()
            .unwrap_or("")
            .contains("StaleConfig"),
        "{opened}"
    );
    assert!(
        opened["seconds_ago"].as_u64().unwrap_or(0) >= 20,
        "{opened}"
    );
    let raised = events
        .iter()
        .find(|e| e["kind"] == "write_stall_raised" && e["shard"] == "shardA")
        .expect("the stall on shard A");
    assert!(raised["at_unix_ms"].as_u64().unwrap_or(0) > 0, "{raised}");
    let times: Vec<u64> = events
        .iter()
        .filter_map(|e| e["at_unix_ms"].as_u64())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] >= w[1]),
        "most recent first: {times:?}"
    );
    let history = &st["history"];
    assert_eq!(history["bucket_seconds"], 1.0);
    let pay = history["entries"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["entry"] == "pay.*"))
        .expect("pay.* series");
    assert_eq!(
        pay["totals"][2].as_u64(),
        Some((failed_fast + failed_fast_after) as u64),
        "failed fast: {pay}"
    );
    assert!(
        history["write_stall"]
            .as_array()
            .is_some_and(|b| b.iter().any(|v| v == true)),
        "a stall band: {history}"
    );

    let dom = look(&url, "after-heal.png").await;
    let green = section(
        &dom,
        "<div class=\"banner good\" id=\"no-open-breaker\">",
        "</div>",
    );
    assert!(green.contains("The last one closed"), "{green}");
    assert!(green.contains(" s open)"), "how long it was open: {green}");
    assert!(
        dom.contains("<figure class=\"plot\" data-entry=\"pay.*\">"),
        "the plot keeps the incident"
    );
    println!("took {:?}", started.elapsed());
    proxy.shutdown().await;
    sim.shutdown().await;
}
