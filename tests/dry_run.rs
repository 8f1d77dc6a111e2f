//! `dry_run` counts what it would do (`staleguard_dry_run_total{namespace,action}`, the
//! `dry_run` object of each namespace in `/status`, the page's "Dry run" table) and does
//! none of it: through the real driver against the fake mongos, every read reaches mongos
//! as the driver sent it and every reply reaches the driver as mongos sent it, while each
//! action a policy would have taken is counted once: fail fast, bounded, rewrite, retry,
//! primary (at once while open, and climbing after a trigger error), refuse, time limit.

use crate::ops_support;
use crate::policy_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use futures::TryStreamExt;
use mongodb::options::{CollectionOptions, ReadConcern, ReadPreference, SelectionCriteria};
use mongodb::{Client, Collection};
use staleguard::breaker::State;

use ops_support::http::get;
use ops_support::promtool::check_metrics;
use policy_support::*;

/// One connection's errors count, at once; a breaker stays open through the test.
const FAST: &str = "dry_run = true\nthreshold = 3\nwindow = \"10s\"\ncooldown = \"30s\"\n\
                    min_cooldown = \"30s\"\nmin_connections = 1\nper_connection = 1000\n\
                    min_wait = \"0s\"\n";

fn namespaces() -> String {
    format!(
        r#"
[admin]
listen = "127.0.0.1:0"

[[namespaces]]
pattern = "dry.refuse"
mode = "strict"
on_open = "refuse"
{FAST}
[[namespaces]]
pattern = "dry.bound"
mode = "strict"
{FAST}
[[namespaces]]
pattern = "dry.ladder"
mode = "strict"
ladder = ["primary"]
{FAST}
[[namespaces]]
pattern = "dry.capped"
mode = "strict"
max_time = "500ms"
{FAST}
[[namespaces]]
pattern = "drydemo.inventory"
mode = "fallback"
{FAST}"#
    )
}

const STALE: &[&str] = &["refuse", "bound", "ladder", "inventory"];

fn secondary(client: &Client, ns: &str) -> Collection<Document> {
    let (db, c) = ns.split_once('.').expect("db.coll");
    let opts = CollectionOptions::builder()
        .selection_criteria(SelectionCriteria::ReadPreference(
            ReadPreference::Secondary {
                options: Default::default(),
            },
        ))
        .build();
    client.database(db).collection_with_options(c, opts)
}

async fn find(c: &Collection<Document>) -> mongodb::error::Result<Vec<Document>> {
    let cursor = c.find(doc! {}).max_time(Duration::from_secs(10)).await?;
    cursor.try_collect().await
}

/// mongos's own StaleConfig, as the fake sends it: what a dry run leaves the client.
async fn stale(c: &Collection<Document>) {
    let e = find(c).await.expect_err("mongos's error");
    let (code, _, msg) = command_error(&e);
    assert_eq!((code, msg.as_str()), (13388, "secondary cannot refresh"));
}

/// `dry_run_total` by (namespace, action), from the text format.
fn dry_counts(body: &str) -> BTreeMap<(String, String), u64> {
    body.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("staleguard_dry_run_total{namespace=\"")?;
            let (ns, rest) = rest.split_once("\",action=\"")?;
            let (action, value) = rest.split_once("\"} ")?;
            Some(((ns.to_string(), action.to_string()), value.parse().ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_counts_every_action_and_takes_none() {
    let env = Env::start(&namespaces()).await;
    let admin = env.proxy.admin_addr().expect("admin endpoint");
    for c in ["refuse", "bound", "ladder", "capped"] {
        env.fake.seed(&format!("dry.{c}"), seed_docs(2));
    }
    env.fake.seed("drydemo.inventory", seed_docs(2));
    // Every secondary read of the stale collections fails, whatever it asks for; the
    // primary and `available` would answer, had staleguard sent anything there.
    stale_secondaries(&env, STALE);
    let client = env.client("").await;

    // Closed: each namespace's three errors open its breaker (a dry run counts and opens);
    // the ladder would climb to the primary and the fallback would retry with `available`.
    for c in STALE {
        let ns = if *c == "inventory" {
            "drydemo.inventory".to_string()
        } else {
            format!("dry.{c}")
        };
        let coll = secondary(&client, &ns);
        for _ in 0..3 {
            stale(&coll).await;
        }
        env.wait_state(&ns, State::Open).await;
        // Open: what each would do now, two reads each; mongos still gets them as sent.
        for _ in 0..2 {
            stale(&coll).await;
        }
    }
    // A strict read asking for `available` itself would be refused: it is forwarded, and
    // mongos answers it.
    let asks = secondary(&client, "dry.refuse")
        .find(doc! {})
        .read_concern(ReadConcern::available())
        .await
        .expect("forwarded, answered");
    assert_eq!(asks.try_collect::<Vec<_>>().await.expect("docs").len(), 2);
    // The cap would lower maxTimeMS from 10 s to 500 ms: it leaves at 10 s.
    let capped = secondary(&client, "dry.capped");
    for _ in 0..2 {
        assert_eq!(find(&capped).await.expect("answered").len(), 2);
    }

    // Nothing was done: every read reached mongos as the driver sent it (no `available`,
    // no primary, no lowered limit, no fail-fast: every read arrived).
    for c in ["refuse", "bound", "ladder", "capped", "inventory"] {
        let sent = env.driver_bodies("find", c);
        let got: Vec<_> = env
            .upstream_bodies("find", c)
            .into_iter()
            .filter(|b| !is_confirm(b))
            .collect();
        assert_eq!(
            got, sent,
            "{c}: mongos got other reads than the driver sent"
        );
        assert!(!sent.is_empty());
    }

    let want: BTreeMap<(String, String), u64> = [
        ("dry.refuse", "fail_fast", 2),
        ("dry.refuse", "refuse", 1),
        ("dry.bound", "bounded", 2),
        ("dry.ladder", "primary", 3 + 2),
        ("dry.capped", "time_limit", 2),
        ("drydemo.inventory", "retry", 3),
        ("drydemo.inventory", "rewrite", 2),
    ]
    .into_iter()
    .map(|(ns, a, n)| ((ns.to_string(), a.to_string()), n))
    .collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    let body = loop {
        let body = get(admin, "/metrics", &[]).await.body;
        if dry_counts(&body) == want || Instant::now() > deadline {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(dry_counts(&body), want, "{body}");
    for accept in [None, Some("application/openmetrics-text")] {
        let h: Vec<(&str, &str)> = accept.map(|a| ("Accept", a)).into_iter().collect();
        let body = get(admin, "/metrics", &h).await.body;
        let (ok, out) = check_metrics(&body);
        assert!(ok, "promtool check metrics ({accept:?}):\n{out}\n{body}");
    }

    // /status: a `dry_run` object per namespace.
    let status = get(admin, "/status", &[]).await.json();
    let rows = status["namespaces"].as_array().expect("namespaces");
    for ((ns, action), n) in &want {
        let row = rows
            .iter()
            .find(|r| r["namespace"] == ns.as_str())
            .unwrap_or_else(|| panic!("no row for {ns}: {status:#}"));
        assert_eq!(row["dry_run"]["enabled"], true, "{row:#}");
        assert_eq!(row["dry_run"]["would"][action.as_str()], *n, "{row:#}");
    }
    let ladder = rows
        .iter()
        .find(|r| r["namespace"] == "dry.ladder")
        .expect("row");
    assert_eq!(ladder["dry_run"]["would"]["fail_fast"], 0, "{ladder:#}");

    // The page lists them.
    let page = get(admin, "/", &[]).await.body;
    let table = page
        .split_once("<table id=\"dry-run\" class=\"cards\">")
        .map(|(_, t)| t.split_once("</table>").map_or(t, |(t, _)| t))
        .unwrap_or_else(|| panic!("no dry-run table:\n{page}"));
    assert!(
        table.contains("<code>dry.ladder</code></td><td data-label=\"dry run\">on</td>")
            && table.contains("<td data-action=\"primary\" data-label=\"primary\">5</td>")
            && table.contains("<td data-action=\"rewrite\" data-label=\"rewrite\">2</td>"),
        "{table}"
    );

    env.proxy.shutdown().await;
}
