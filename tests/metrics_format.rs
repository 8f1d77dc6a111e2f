//! `/metrics` as scrapers read it, live from a proxy that has seen every decision (the real
//! driver against the fake mongos): both exposition formats pass `promtool check metrics`
//! (Debian's `prometheus` package; `.ci/run` installs it, and a missing `promtool` fails
//! this test, it never skips it), the format follows `Accept` with the matching
//! `Content-Type`, every family name is unique, breaker transitions are counted, and every
//! `find` the driver sent is in `requests_total` under its decision, the primary included.

use crate::ops_support;
use crate::policy_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use futures::TryStreamExt;
use mongodb::options::{CollectionOptions, ReadConcern, ReadPreference, SelectionCriteria};
use mongodb::{Client, Collection};
use staleguard::breaker::State;

use ops_support::http::{get, Response};
use ops_support::promtool::check_metrics;
use policy_support::*;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Evidence as the decision-table tests take it: one connection's errors count, at once.
const FAST: &str = "threshold = 3\nwindow = \"10s\"\ncooldown = \"30s\"\nmin_cooldown = \"30s\"\n\
                    min_connections = 1\nper_connection = 1000\nmin_wait = \"0s\"\n";

fn namespaces() -> String {
    format!(
        r#"
[admin]
listen = "127.0.0.1:0"

[[namespaces]]
pattern = "pay.accounts"
mode = "strict"
ladder = ["primary"]
{FAST}
[[namespaces]]
pattern = "pay.*"
mode = "strict"
on_open = "refuse"
{FAST}
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"
{FAST}"#
    )
}

fn coll(client: &Client, ns: &str, pref: ReadPreference) -> Collection<Document> {
    let (db, c) = ns.split_once('.').expect("db.coll");
    let opts = CollectionOptions::builder()
        .selection_criteria(SelectionCriteria::ReadPreference(pref))
        .build();
    client.database(db).collection_with_options(c, opts)
}

fn secondary() -> ReadPreference {
    ReadPreference::Secondary {
        options: Default::default(),
    }
}

async fn find(c: &Collection<Document>) -> mongodb::error::Result<Vec<Document>> {
    let cursor = c.find(doc! {}).max_time(Duration::from_secs(10)).await?;
    cursor.try_collect().await
}

/// Samples by metric name and label set, from the text format.
fn samples(body: &str) -> BTreeMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// Family names of the `# TYPE` lines, each once (a name twice is a failure).
fn families(body: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for l in body.lines() {
        let Some(rest) = l.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
        let before = out.insert(name.to_string(), kind.to_string());
        assert!(before.is_none(), "family {name} declared twice:\n{body}");
    }
    out
}

async fn metrics(admin: SocketAddr, accept: Option<&str>) -> Response {
    let headers: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
    let r = get(admin, "/metrics", &headers).await;
    assert_eq!(r.status, 200, "{}", r.body);
    r
}

/// `requests_total{command="find"}` by decision.
fn finds_by_decision(body: &str) -> BTreeMap<String, f64> {
    samples(body)
        .into_iter()
        .filter_map(|(series, v)| {
            let labels = series.strip_prefix("staleguard_requests_total{")?;
            let decision = labels
                .strip_prefix("command=\"find\",decision=\"")?
                .strip_suffix("\"}")?;
            Some((decision.to_string(), v))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_in_both_formats_and_count_every_decision() {
    let env = Env::start(&namespaces()).await;
    let admin = env.proxy.admin_addr().expect("admin endpoint");
    for ns in ["pay.accounts", "pay.orders", "demo.store_inventory"] {
        env.fake.seed(ns, seed_docs(3));
    }
    stale_secondaries(&env, &["accounts", "orders", "store_inventory"]);
    let client = env.client("").await;

    // pay.accounts (strict, primary rung): three StaleConfig answered by the primary open
    // the breaker; the next reads go to the primary at once.
    let accounts = coll(&client, "pay.accounts", secondary());
    for _ in 0..3 {
        assert_eq!(find(&accounts).await.expect("primary answers").len(), 3);
    }
    env.wait_state("pay.accounts", State::Open).await;
    for _ in 0..5 {
        assert_eq!(find(&accounts).await.expect("primary answers").len(), 3);
    }
    // Reads the client sends to the primary itself: not eligible, forwarded.
    let on_primary = coll(&client, "pay.accounts", ReadPreference::Primary);
    for _ in 0..2 {
        assert_eq!(find(&on_primary).await.expect("answered").len(), 3);
    }

    // pay.orders (strict, on_open = "refuse"): the errors, then fail-fasts; `available`
    // asked for is refused.
    let orders = coll(&client, "pay.orders", secondary());
    for _ in 0..3 {
        find(&orders)
            .await
            .expect_err("StaleConfig reaches the client");
    }
    env.wait_state("pay.orders", State::Open).await;
    for _ in 0..2 {
        let e = find(&orders).await.expect_err("fail fast");
        assert_eq!(command_error(&e).0, 13388);
    }
    let asks = orders
        .find(doc! {})
        .read_concern(ReadConcern::available())
        .await
        .expect_err("refused");
    assert_eq!(command_error(&asks).0, 72);

    // demo.store_inventory (fallback): retried with `available`, then rewritten up front.
    let inventory = coll(&client, "demo.store_inventory", secondary());
    for _ in 0..3 {
        assert_eq!(find(&inventory).await.expect("available answers").len(), 3);
    }
    env.wait_state("demo.store_inventory", State::Open).await;
    for _ in 0..2 {
        assert_eq!(find(&inventory).await.expect("rewritten").len(), 3);
    }

    // Every find the driver sent is counted once, under its decision (batches reach the
    // shared counters within a second).
    let sent: usize = ["accounts", "orders", "store_inventory"]
        .iter()
        .map(|c| env.sent_by_driver("find", c).len())
        .sum();
    assert_eq!(sent, 3 + 5 + 2 + 3 + 2 + 1 + 3 + 2);
    let deadline = Instant::now() + Duration::from_secs(5);
    let by_decision = loop {
        let body = metrics(admin, None).await.body;
        let by = finds_by_decision(&body);
        if by.values().sum::<f64>() as usize >= sent || Instant::now() > deadline {
            break by;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let want: BTreeMap<String, f64> = [
        ("track", 6.0),   // pay.accounts 3 (climbed to the primary), pay.orders 3
        ("primary", 5.0), // pay.accounts, breaker open
        ("forward", 2.0), // readPreference primary
        ("fail_fast", 2.0),
        ("refuse", 1.0),
        ("track_retry", 3.0),
        ("rewrite", 2.0),
    ]
    .into_iter()
    .map(|(d, n)| (d.to_string(), n))
    .collect();
    assert_eq!(by_decision, want, "requests_total{{command=\"find\"}}");

    // Both formats, negotiated, each valid for promtool.
    let plain = metrics(admin, None).await;
    assert_eq!(plain.header("content-type"), Some(TEXT));
    let text = metrics(admin, Some("text/plain; version=0.0.4")).await;
    assert_eq!(text.header("content-type"), Some(TEXT));
    let prometheus_accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let om = metrics(admin, Some(prometheus_accept)).await;
    assert_eq!(om.header("content-type"), Some(OPENMETRICS));
    assert!(om.body.ends_with("# EOF\n"), "{}", om.body);
    assert!(!text.body.contains("# EOF"), "{}", text.body);
    for (what, body) in [("text", &text.body), ("OpenMetrics", &om.body)] {
        let (ok, out) = check_metrics(body);
        assert!(ok, "promtool check metrics ({what}):\n{out}\n{body}");
        let kinds = families(body);
        // The gauge of open connections and the counter of accepted ones are two names.
        assert_eq!(
            kinds
                .get("staleguard_client_connections")
                .map(String::as_str),
            Some("gauge")
        );
        assert_eq!(
            kinds
                .get("staleguard_client_connections_accepted_total")
                .map(String::as_str),
            Some("counter")
        );
        for (name, kind) in &kinds {
            assert_eq!(
                kind == "counter",
                name.ends_with("_total"),
                "{what}: {name} is a {kind}"
            );
        }
        let s = samples(body);
        for series in [
            r#"staleguard_breaker_transitions_total{namespace="pay.accounts",from="closed",to="open"}"#,
            r#"staleguard_breaker_transitions_total{namespace="pay.orders",from="closed",to="open"}"#,
            r#"staleguard_breaker_transitions_total{namespace="demo.store_inventory",from="closed",to="open"}"#,
            r#"staleguard_ladder_attempts_total{namespace="pay.accounts",rung="primary",result="answered"}"#,
            r#"staleguard_fail_fasts_total{namespace="pay.orders"}"#,
            r#"staleguard_refusals_total{namespace="pay.orders"}"#,
            r#"staleguard_rewrites_total{namespace="demo.store_inventory",kind="preemptive"}"#,
            r#"staleguard_rewrites_total{namespace="demo.store_inventory",kind="retry"}"#,
        ] {
            assert!(
                s.get(series).is_some_and(|v| *v >= 1.0),
                "{what}: {series}:\n{body}"
            );
        }
        assert!(
            s.keys()
                .any(|k| k.starts_with("staleguard_upstream_request_seconds_bucket{")),
            "{what}: the latency histogram:\n{body}"
        );
    }
    // The two formats carry the same samples.
    assert_eq!(
        samples(&text.body).keys().collect::<BTreeSet<_>>(),
        samples(&om.body).keys().collect::<BTreeSet<_>>()
    );

    env.proxy.shutdown().await;
}

/// Issue 32 item 6: relay only (no `[[namespaces]]`, the rollout's first step), the traffic
/// still shows in `/metrics` (`client_requests_total`, where `requests_total` counts only
/// governed requests), and the process's own metrics are there under the names
/// Prometheus's client libraries use, for CPU and memory; both formats pass promtool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_only_traffic_and_the_process_metrics_show() {
    let env = Env::start("[admin]\nlisten = \"127.0.0.1:0\"\n").await;
    let admin = env.proxy.admin_addr().expect("admin endpoint");
    env.fake.seed("shop.items", seed_docs(3));
    let client = env.client("").await;
    let items = coll(&client, "shop.items", secondary());
    for _ in 0..20 {
        assert_eq!(find(&items).await.expect("relayed").len(), 3);
    }
    // Counts reach /metrics within a second of a connection going quiet.
    let deadline = Instant::now() + Duration::from_secs(5);
    let body = loop {
        let body = metrics(admin, None).await.body;
        if samples(&body)
            .get("staleguard_client_requests_total")
            .is_some_and(|n| *n >= 20.0)
        {
            break body;
        }
        assert!(Instant::now() < deadline, "client_requests_total:\n{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let s = samples(&body);
    assert!(
        !s.keys()
            .any(|k| k.starts_with("staleguard_requests_total{")),
        "no governed request in relay-only mode:\n{body}"
    );
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(
            s.get(name).is_some_and(|v| *v > 0.0),
            "{name} missing or zero:\n{body}"
        );
    }
    let kinds = families(&body);
    assert_eq!(
        kinds.get("process_cpu_seconds_total").map(String::as_str),
        Some("counter")
    );
    assert_eq!(
        kinds
            .get("process_resident_memory_bytes")
            .map(String::as_str),
        Some("gauge")
    );
    let rss = s["process_resident_memory_bytes"];
    assert!(rss > 1e6 && rss < 1e10, "resident memory {rss}");
    let started = s["process_start_time_seconds"];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    assert!(
        started <= now && started > now - 3600.0,
        "{started} vs {now}"
    );
    let om = metrics(admin, Some("application/openmetrics-text"))
        .await
        .body;
    for (what, body) in [("text", &body), ("OpenMetrics", &om)] {
        let (ok, out) = check_metrics(body);
        assert!(ok, "promtool check metrics ({what}):\n{out}\n{body}");
    }
    assert!(
        om.ends_with("# EOF\n") && om.matches("# EOF").count() == 1,
        "{om}"
    );
    env.proxy.shutdown().await;
}
