//! The admin endpoint: `/healthz`, `/readyz`, `/metrics`, `/status`, the bearer token, and
//! the HTML status page as a person sees it in a real headless Chromium.

use crate::ops_support;
use crate::support;

use ops_support::http::get;
use ops_support::*;
use staleguard::breaker::State;
use staleguard::config::Mode;
use support::mongos::FakeMongos;
use support::raw::RawClient;

/// A proxy with `pay.*` strict (threshold 3) and `demo.store_inventory` fallback, whose
/// `pay.orders` breaker has been opened by StaleConfig errors; one fail-fast answered.
/// The client stays connected while the returned tuple lives.
async fn open_breaker(token: Option<&str>) -> (FakeMongos, staleguard::server::Running, RawClient) {
    let fake = FakeMongos::start().await;
    stale_on(&fake, "pay");
    // Refusing while open (`on_open = "refuse"`): the page shows a fail-fast namespace.
    let mut pay = policy("pay.*", Mode::Strict, 3);
    pay.on_open = staleguard::policy::OnOpen::Refuse;
    let mut c = config(
        vec![fake.addr().to_string()],
        vec![pay, policy("demo.store_inventory", Mode::Fallback, 3)],
    );
    c.admin_token = token.map(str::to_string);
    let proxy = start(c).await;
    let mut client = RawClient::connect(proxy.local_addr()).await;
    for id in 1..=3 {
        let reply = client.roundtrip(&find(id, "pay", "orders")).await;
        assert!(
            errmsg(&reply).contains("shard version"),
            "{}",
            errmsg(&reply)
        );
    }
    assert_eq!(proxy.shared().breakers.state("pay.orders"), State::Open);
    let reply = client.roundtrip(&find(4, "pay", "orders")).await;
    assert!(
        errmsg(&reply).starts_with("staleguard:"),
        "{}",
        errmsg(&reply)
    );
    (fake, proxy, client)
}

#[tokio::test]
async fn health_ready_metrics_and_status() {
    let (_fake, proxy, _client) = open_breaker(None).await;
    let admin = admin(&proxy);

    let r = get(admin, "/healthz", &[]).await;
    assert_eq!(r.status, 200);
    // Health checks are off in this config: a configured upstream is enough.
    assert_eq!(get(admin, "/readyz", &[]).await.status, 200);

    // Sessions add their counts in batches, at the latest a second after the last one.
    let wanted = "staleguard_requests_total{command=\"find\",decision=\"fail_fast\"} 1";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let m = loop {
        let m = get(admin, "/metrics", &[]).await;
        if m.body.lines().any(|l| l == wanted) || std::time::Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(m.status, 200);
    assert_eq!(
        m.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    for line in [
        "staleguard_breaker_state{namespace=\"pay.orders\"} 2",
        "staleguard_trigger_errors_total{namespace=\"pay.orders\",code=\"13388\"} 3",
        "staleguard_fail_fasts_total{namespace=\"pay.orders\"} 1",
        "staleguard_requests_total{command=\"find\",decision=\"fail_fast\"} 1",
        "staleguard_client_connections 1",
        "staleguard_client_connections_accepted_total 1",
    ] {
        assert!(
            m.body.lines().any(|l| l == line),
            "missing {line}:\n{}",
            m.body
        );
    }

    let s = get(admin, "/status", &[]).await;
    assert_eq!(s.status, 200);
    assert_eq!(s.header("content-type"), Some("application/json"));
    let s = s.json();
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["client_connections"], 1);
    assert_eq!(s["config"]["last_reload"]["result"], "ok");
    assert_eq!(s["upstreams"][0]["health"], "unknown");
    let ns = s["namespaces"].as_array().expect("namespaces");
    // The open breaker first, then the configured patterns.
    let names: Vec<&str> = ns.iter().filter_map(|n| n["namespace"].as_str()).collect();
    assert_eq!(names, ["pay.orders", "demo.store_inventory", "pay.*"]);
    let open = &ns[0];
    assert_eq!(open["breaker"], "open");
    assert_eq!(open["mode"], "strict");
    assert_eq!(open["pattern"], "pay.*");
    assert_eq!(open["errors_in_window"], 3);
    assert_eq!(open["trigger_errors_total"], 3);
    assert!(open["reason"]
        .as_str()
        .is_some_and(|r| r.contains("13388 StaleConfig")));
    // The first cooldown is min_cooldown (1 s): the probe may be due already (0).
    assert!(open["next_probe_seconds"].as_u64().is_some_and(|s| s <= 1));
    // No ladder on this strict entry; the fallback pattern climbs to available.
    assert_eq!(open["ladder"], serde_json::json!([]));
    assert_eq!(open["ladder_reads"]["primary_answered"], 0);
    assert_eq!(open["orphans_estimated_total"], 0);
    assert_eq!(ns[1]["ladder"], serde_json::json!(["available"]));
    assert_eq!(ns[2]["ladder_reads"], serde_json::Value::Null);
    assert_eq!(s["upstreams"][0]["ladder_in_flight"], 0);
    assert_eq!(ns[1]["kind"], "pattern");
    assert_eq!(ns[1]["mode"], "fallback");
    assert_eq!(ns[1]["breaker"], "closed");
    // A wildcard pattern has no breaker of its own: those are per exact namespace.
    assert_eq!(ns[2]["breaker"], serde_json::Value::Null);
    assert_eq!(s["listen"], proxy.local_addr().to_string());
    proxy.shutdown().await;
}

#[tokio::test]
async fn token_guards_everything_but_health_probes() {
    let (_fake, proxy, _client) = open_breaker(Some("s3cret-t0ken")).await;
    let admin = admin(&proxy);
    assert_eq!(get(admin, "/healthz", &[]).await.status, 200);
    assert_eq!(get(admin, "/readyz", &[]).await.status, 200);
    for path in ["/", "/status", "/metrics"] {
        let r = get(admin, path, &[]).await;
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        let wrong = get(admin, path, &[("Authorization", "Bearer nope")]).await;
        assert_eq!(wrong.status, 401, "{path}");
        let ok = get(admin, path, &[("Authorization", "Bearer s3cret-t0ken")]).await;
        assert_eq!(ok.status, 200, "{path}");
    }
    assert_eq!(get(admin, "/?token=s3cret-t0ken", &[]).await.status, 200);
    assert_eq!(get(admin, "/status?token=s3cret", &[]).await.status, 401);
    proxy.shutdown().await;
}

#[tokio::test]
async fn readyz_is_503_while_stopping_and_admin_closes_after() {
    let fake = FakeMongos::start().await;
    let proxy = start(config(vec![fake.addr().to_string()], vec![])).await;
    let admin = admin(&proxy);
    assert_eq!(get(admin, "/readyz", &[]).await.status, 200);
    proxy.shutdown().await;
    assert!(tokio::net::TcpStream::connect(admin).await.is_err());
}

/// Visible text of an HTML fragment: tags dropped, entities for the few we emit decoded,
/// whitespace collapsed.
fn text_of(html: &str) -> String {
    let mut out = String::new();
    let mut in_tag = false;
    for c in html.chars() {
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
    let out = out.replace("&middot;", "·").replace("&amp;", "&");
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_in_headless_chromium() {
    let (_fake, proxy, _client) = open_breaker(Some("page-token")).await;
    let url = format!("http://{}/?token=page-token", admin(&proxy));
    let profile = tempfile::tempdir().expect("profile dir");
    let dom = {
        let (url, dir) = (url.clone(), profile.path().to_path_buf());
        tokio::task::spawn_blocking(move || chromium::run(&url, "--dump-dom", &dir, (1400, 900)))
            .await
            .expect("chromium task")
    };
    if let Ok(shot) = std::env::var("STALEGUARD_SCREENSHOT") {
        let dir = profile.path().to_path_buf();
        tokio::task::spawn_blocking(move || {
            chromium::run(&url, &format!("--screenshot={shot}"), &dir, (1400, 900))
        })
        .await
        .expect("screenshot task");
    }
    assert!(dom.contains("<title>staleguard status</title>"), "{dom}");
    // The banner names the open breaker, for how long, and what happens to its reads.
    let text = text_of(&dom);
    assert!(
        text.contains("Breaker of pay.orders (strict) open for "),
        "{text}"
    );
    assert!(text.contains("failing fast with StaleConfig"), "{text}");
    assert!(
        !dom.contains("id=\"no-open-breaker\""),
        "no green line while one is open"
    );
    // The namespace table: the open breaker is the first row, highlighted, with its mode,
    // what happens to reads, and why it opened.
    let table = dom
        .split("<table id=\"namespaces\" class=\"cards\">")
        .nth(1)
        .and_then(|t| t.split("</table>").next())
        .expect("namespaces table");
    let rows: Vec<&str> = table.split("<tr").skip(2).collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert!(rows[0].starts_with(" class=\"open\""), "{}", rows[0]);
    let first = text_of(rows[0]);
    for want in [
        "pay.orders",
        "pay.*",
        "strict",
        "open",
        "failing fast with StaleConfig",
        "3 / 3",
        "3 trigger errors within 10s (last: 13388 StaleConfig)",
    ] {
        assert!(first.contains(want), "first row lacks {want:?}: {first}");
    }
    // The probe is due in a second or so, or already (then its next read probes).
    assert!(
        first.contains("next probe in ") || first.contains("its next read probes"),
        "{first}"
    );
    assert!(
        text_of(rows[1]).contains("demo.store_inventory fallback closed"),
        "{}",
        rows[1]
    );
    assert!(!rows[1].contains("class=\"open\""));
    // Upstreams and config are there too; the page refreshes itself.
    assert!(text.contains(&proxy_upstream(&proxy)), "{text}");
    assert!(text.contains("last load: ok"), "{text}");
    assert!(dom.contains("setInterval(tick,2000)"));
    proxy.shutdown().await;
}

fn proxy_upstream(proxy: &staleguard::server::Running) -> String {
    proxy.shared().upstreams.addrs()[0].clone()
}
