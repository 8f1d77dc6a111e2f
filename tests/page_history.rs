//! The status page during an incident on the simulated cluster, in headless Chromium.
//!
//! - The partial incident (shard A's primary stalls, a1 restarts): the first screen says
//!   what is wrong, since when, what staleguard does and what clients got; the plots zoom
//!   to the incident with its stall bands and time labels; worst news first in the
//!   details, one sentence linking the stall to the open breakers, the events list; the
//!   page fits 1280 px and 390 px without scrolling sideways; 20 s after the heal
//!   `/status` still has the incident's events.
//! - Dry run during a stall (issue 32 item 1): no word on the page or in `/status` says a
//!   read is rewritten, bounded or failed fast when nothing was; they say what would be.
//! - The fleet with Redis down: the page says this instance acts alone, and since when.
//!
//! Buckets of 1 s (`[admin] history_interval`); the screenshots are kept in
//! `target/tmp/page_history/` (their paths are printed).

use crate::ops_support;
use crate::support;

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
min_client_addresses = 1
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
    start_with(CONFIG).await
}

async fn start_with(config: &str) -> (SimHandle, Running) {
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
        config
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

/// The DOM as Chromium built it, and a screenshot of the whole page kept as `name`.
async fn look(url: &str, name: &str) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let (u, p) = (url.to_string(), profile.path().to_path_buf());
    let dom =
        tokio::task::spawn_blocking(move || chromium::run(&u, "--dump-dom", &p, (1400, 2600)))
            .await
            .expect("chromium task");
    shot(url, name, (1400, 2600)).await;
    dom
}

/// A screenshot of `url` in a window of `size`, kept as `name`.
async fn shot(url: &str, name: &str, size: (u32, u32)) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("page_history");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    let file = dir.join(name);
    let profile = tempfile::tempdir().expect("profile dir");
    let (u, p, s) = (url.to_string(), profile.path().to_path_buf(), file.clone());
    tokio::task::spawn_blocking(move || {
        chromium::run(&u, &format!("--screenshot={}", s.display()), &p, size)
    })
    .await
    .expect("screenshot task");
    assert!(file.exists(), "no screenshot at {}", file.display());
    println!("screenshot: {}", file.display());
}

/// How wide the page `html` lays out in a viewport `width` px wide: Chromium loads it in an
/// iframe of that width and reports the document's scroll width (wider than the viewport:
/// the page scrolls sideways).
async fn laid_out_width(html: &str, width: u32) -> (u32, u32) {
    let dir = tempfile::tempdir().expect("wrapper dir");
    let srcdoc = html.replace('&', "&amp;").replace('"', "&quot;");
    let wrapper = format!(
        "<!doctype html><html><body style=\"margin:0\"><iframe id=\"f\" style=\"width:{width}px;height:900px;border:0\" srcdoc=\"{srcdoc}\"></iframe>\
         <script>window.addEventListener(\"load\",function(){{var d=document.getElementById(\"f\").contentDocument.documentElement;\
         var p=document.createElement(\"pre\");p.id=\"fit\";p.textContent=d.scrollWidth+\" \"+d.clientWidth;document.body.appendChild(p);}});</script></body></html>"
    );
    let file = dir.path().join("wrapper.html");
    std::fs::write(&file, wrapper).expect("write the wrapper");
    let url = format!("file://{}", file.display());
    let profile = tempfile::tempdir().expect("profile dir");
    let p = profile.path().to_path_buf();
    let dom = tokio::task::spawn_blocking(move || {
        chromium::run(&url, "--dump-dom", &p, (width + 40, 1000))
    })
    .await
    .expect("chromium task");
    let measured = dom
        .split("id=\"fit\">")
        .nth(1)
        .and_then(|r| r.split('<').next())
        .unwrap_or_else(|| panic!("no measurement in {dom}"));
    let mut n = measured.split(' ').map(|v| v.parse::<u32>().unwrap_or(0));
    (n.next().unwrap_or(0), n.next().unwrap_or(0))
}

/// The page fits 1280 px and a phone's 390 px without scrolling sideways.
async fn fits_without_sideways_scrolling(admin: std::net::SocketAddr) {
    let html = get(admin, "/", &[]).await.body;
    for width in [1280, 390] {
        let (scroll, client) = laid_out_width(&html, width).await;
        assert!(
            client > 0 && scroll <= client,
            "at {width} px the page is {scroll} px wide (viewport {client})"
        );
    }
}

/// The page's visible text, tags dropped and entities decoded, whitespace collapsed.
fn text_of(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    let body = html.split("<div id=\"main\">").nth(1).unwrap_or(html);
    let body = body.split("<script>").next().unwrap_or(body);
    for c in body.chars() {
        match c {
            '<' => {
                in_tag = true;
                out.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    let out = out
        .replace("&middot;", "·")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    out.split_whitespace().collect::<Vec<_>>().join(" ")
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
    shot(&url, "partial-incident-1280x800.png", (1280, 800)).await;
    shot(&url, "partial-incident-phone-390.png", (390, 844)).await;
    fits_without_sideways_scrolling(admin).await;
    // The first screen: what is wrong and since when, what staleguard does, what clients got.
    let first = section(&dom, "<section id=\"summary\"", "</section>");
    let text = text_of(first);
    assert!(
        text.contains("Writes are not completing on shard A"),
        "{text}"
    );
    assert!(text.contains("Since ") && text.contains(" UTC, "), "{text}");
    assert!(
        text.contains(&format!("The breaker of {PAYMENTS} (strict) is open")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{INVENTORY}: its reads go out with readConcern available"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("{PAYMENTS}: its reads fail fast with StaleConfig")),
        "{text}"
    );
    let now = section(first, "<table id=\"right-now\"", "</table>");
    assert!(now.contains("data-entry=\"pay.*\""), "{now}");
    // The plots come before the details, zoomed to the incident.
    assert!(at(&dom, "id=\"plots-title\">The incident, since ") < at(&dom, "id=\"details\""));
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
        stall_banner.contains(&format!("holding the breakers of {INVENTORY} open")),
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
    let events = section(&dom, "<table id=\"events\" class=\"cards\">", "</table>");
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

/// Orders every 40 ms through the proxy, each insert in its own task (a stalled one hangs
/// and holds its connection: a client of their own, so the readers' pool stays free), until
/// the flag turns false.
async fn orders(proxy: &Running) -> Arc<std::sync::atomic::AtomicBool> {
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
    writing
}

/// What a page or `/status` may only say of a namespace in dry run with "would": the
/// actions themselves.
const ACTIONS: [&str; 7] = [
    "go out with readConcern available",
    "rewritten to readConcern available",
    "fail fast with",
    "failing fast with",
    "bounded by",
    "sent with maxTimeMS at most",
    "go to the shard's primary",
];

/// Every sentence (or clause after a `;`) of `text` that names an action says "would".
fn only_would(text: &str, what: &str) {
    for sentence in text.split(". ").flat_map(|s| s.split(';')) {
        if ACTIONS.iter().any(|a| sentence.contains(a)) {
            assert!(
                sentence.contains("would"),
                "{what} claims an action nothing took, in dry run: {sentence:?}"
            );
        }
    }
}

/// Issue 32 item 1: with `dry_run` and `on_write_stall = "open_fallback_breakers"` (the
/// README's rollout path), during a stall and a restarted secondary, the page and `/status`
/// say what would be done, never that a read was rewritten, bounded or failed fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_dry_run_during_a_stall_the_page_says_what_would_be_done_not_that_it_was() {
    let (sim, proxy) =
        start_with(&CONFIG.replace("[defaults]\n", "[defaults]\ndry_run = true\n")).await;
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
    let writing = orders(&proxy).await;
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
    sim.cluster().stall_primary("shardA").expect("stall");
    until("inventory held open", Duration::from_secs(8), || {
        shared.breakers.is_held(INVENTORY)
    })
    .await;
    sim.cluster().restart_node("a1").expect("restart a1");
    // Nothing is done: the inventory's reads meet a1's StaleConfig as they would without
    // staleguard (not rewritten), and payments are never failed fast.
    let mut failed = 0;
    for _ in 0..3 {
        for ns in [INVENTORY, PAYMENTS] {
            for _ in 0..4 {
                if let Err(e) = find_on(&client, ns, "a1").await {
                    assert!(!e.to_string().contains("staleguard:"), "{e}");
                    failed += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        failed >= 12,
        "{failed} reads met a1's StaleConfig, as without staleguard"
    );
    until("buckets with the incident", Duration::from_secs(4), || {
        shared.metrics.recent.series().ends().len() >= 3
    })
    .await;

    let st = get(admin, "/status", &[]).await.json();
    let w = &st["write_stall"];
    assert_eq!(w["held_dry_run"], serde_json::json!([INVENTORY]), "{w:#}");
    let effect = w["effect"].as_str().unwrap_or("");
    assert!(
        effect.contains("in dry run") && effect.contains("nothing is rewritten"),
        "{effect}"
    );
    only_would(effect, "/status write_stall.effect");
    for row in st["namespaces"].as_array().expect("namespaces") {
        let action = row["action"].as_str().unwrap_or("");
        only_would(action, "/status namespaces[].action");
        only_would(row["reads_now"].as_str().unwrap_or(""), "/status reads_now");
    }
    for line in st["summary"]["doing"].as_array().expect("doing") {
        only_would(line.as_str().unwrap_or(""), "/status summary.doing");
    }
    let inv = st["namespaces"]
        .as_array()
        .and_then(|n| n.iter().find(|r| r["namespace"] == INVENTORY))
        .expect("inventory row");
    assert_eq!(inv["rewritten_total"], 0, "{inv:#}");
    assert!(
        inv["dry_run"]["would"]["rewrite"].as_u64().unwrap_or(0) > 0,
        "the held reads counted as would-be rewrites: {inv:#}"
    );

    let dom = look(&url, "dry-run-stall.png").await;
    shot(&url, "dry-run-stall-1280x800.png", (1280, 800)).await;
    let text = text_of(&dom);
    only_would(&text, "the page");
    let stall = text_of(section(
        &dom,
        "<div class=\"banner bad\" id=\"write-stall\">",
        "</div>",
    ));
    assert!(stall.contains("in dry run"), "{stall}");
    assert!(
        !stall.contains("their reads go out with readConcern available"),
        "{stall}"
    );
    let doing = text_of(section(&dom, "<ul class=\"doing\"", "</ul>"));
    assert!(
        doing.contains(&format!("{INVENTORY}: its reads go out as sent (dry run); would go out with readConcern available")),
        "{doing}"
    );
    let incident = text_of(section(
        &dom,
        "<div class=\"banner bad\" id=\"incident\">",
        "</div>",
    ));
    assert!(
        incident.contains("dry run: their reads go out as sent"),
        "{incident}"
    );
    fits_without_sideways_scrolling(admin).await;

    writing.store(false, std::sync::atomic::Ordering::Relaxed);
    sim.cluster().resume_primary("shardA").expect("resume");
    proxy.shutdown().await;
    sim.shutdown().await;
}

/// Debian's `redis-server`, as tests/fleet.rs installs it (as root, when missing).
fn redis_server() -> std::process::Child {
    let found = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
    };
    if !found("redis-server") {
        eprintln!("installing Debian's redis-server for the fleet page test (apt-get)");
        let _ = std::process::Command::new("sh")
            .arg("-c")
            .arg("DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null")
            .status();
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("redis-server cannot start ({e}): apt-get install redis-server")
        });
    REDIS_PORT.store(port, std::sync::atomic::Ordering::Relaxed);
    child
}

static REDIS_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

/// The fleet with Redis down: the page says this instance acts alone and since when, that
/// its name is the default one every instance of one config shares, and its budget counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_the_page_says_this_instance_acts_alone() {
    let mut redis = redis_server();
    let port = REDIS_PORT.load(std::sync::atomic::Ordering::Relaxed);
    let text = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"127.0.0.1:1\"]\nhealth_interval = \"off\"\nshutdown_timeout = \"0s\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\nhistory_interval = \"1s\"\n\
         [fleet]\nredis = \"redis://127.0.0.1:{port}/0\"\nlease = \"1s\"\ntimeout = \"200ms\"\n\
         [ladder_guard]\nfleet_max_per_second = 20\n\
         [[namespaces]]\npattern = \"pay.*\"\nmode = \"strict\"\nladder = [\"primary\"]\n"
    );
    let config = Config::parse(&text, Path::new("<fleet page test>"))
        .unwrap_or_else(|e| panic!("{e:#?}\n{text}"));
    let proxy = staleguard::server::start(Arc::new(config))
        .await
        .expect("proxy starts");
    let admin = proxy.admin_addr().expect("admin endpoint");
    let fleet = |st: &serde_json::Value| st["fleet"].clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while fleet(&get(admin, "/status", &[]).await.json())["connected"] != true {
        assert!(Instant::now() < deadline, "never connected to Redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = redis.kill();
    let _ = redis.wait();
    let lost = Instant::now();
    let st = loop {
        let st = get(admin, "/status", &[]).await.json();
        if fleet(&st)["connected"] == false {
            break st;
        }
        assert!(lost.elapsed() < Duration::from_secs(5), "still connected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let f = fleet(&st);
    assert_eq!(f["default_name"], true, "{f:#}");
    assert_eq!(f["fleet_max_per_second"], 20, "{f:#}");
    assert!(f["since_seconds_ago"].is_u64(), "{f:#}");
    assert_eq!(st["summary"]["state"], "degraded", "{:#}", st["summary"]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let url = format!("http://{admin}/");
    let dom = look(&url, "fleet-redis-down.png").await;
    shot(&url, "fleet-redis-down-1280x800.png", (1280, 800)).await;
    let headline = text_of(section(&dom, "<p class=\"headline\"", "</p>"));
    assert!(
        headline.contains("Redis does not answer: this instance (127.0.0.1:")
            && headline.contains(") acts alone."),
        "{headline}"
    );
    let banner = text_of(section(
        &dom,
        "<div class=\"banner warn\" id=\"fleet-alone\">",
        "</div>",
    ));
    assert!(banner.contains("Redis does not answer for "), "{banner}");
    let table = text_of(section(&dom, "<table id=\"fleet\"", "</table>"));
    for want in [
        "lost",
        "the default (listen's address)",
        "20/s",
        "0 allowed, 0 denied, 0 unanswered",
    ] {
        assert!(table.contains(want), "{want:?} missing: {table}");
    }
    let events = section(&dom, "<table id=\"events\" class=\"cards\">", "</table>");
    assert!(events.contains("data-kind=\"fleet_lost\""), "{events}");
    fits_without_sideways_scrolling(admin).await;
    proxy.shutdown().await;
}
