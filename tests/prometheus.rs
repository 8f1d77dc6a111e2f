//! The shipped Prometheus rules and Grafana dashboard, with the real tools (Debian's
//! `prometheus` package; `.ci/run` installs it, and a missing `promtool` or `prometheus`
//! fails these tests, it never skips them):
//!
//! - `promtool check rules` and `promtool test rules` on `config/prometheus/`;
//! - every alert has a summary, a description, a runbook section in the README, and unit
//!   tests that see it fire, stay quiet on zero traffic, and resolve;
//! - end to end: a real Prometheus scrapes a real staleguard in front of the simulated
//!   cluster through the incident (shard A's primary stalls, its secondaries restart, it
//!   resumes) and its alerting API shows the write-stall and breaker alerts firing during
//!   the stall and resolved after it; every expression of the Grafana dashboard evaluates
//!   against that Prometheus without error, and every metric the rules and the dashboard
//!   name is one staleguard exports or a rule records.
//!
//! The end-to-end run loads the shipped rules with every `for` and range window divided by
//! [`TIME_SCALE`] (2m becomes 6s), scraping and evaluating every second.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use mongodb::options::{ReadPreference, SelectionCriteria};
use serde_json::Value as Json;
use serde_norway::Value as Yaml;
use staleguard::config::Config;
use staleguard::sim::{self, SimConfig};

const RULES: &str = "config/prometheus/staleguard-rules.yml";
const RULE_TESTS: &str = "config/prometheus/staleguard-rules.test.yml";
const DASHBOARD: &str = "config/grafana/staleguard-dashboard.json";

/// Production durations divided by this in the end-to-end run.
const TIME_SCALE: u64 = 20;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A program from Debian's `prometheus` package, installed with apt-get when missing (as
/// root, once per test binary); the test fails when it still cannot be found.
fn tool(name: &str) -> PathBuf {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    if find_in_path(name).is_none() {
        INSTALL.call_once(|| {
            eprintln!("installing Debian's prometheus package for the rule tests (apt-get)");
            let _ = Command::new("sh")
                .arg("-c")
                .arg("DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null")
                .status();
        });
    }
    find_in_path(name).unwrap_or_else(|| {
        panic!("`{name}` not found: install Debian's `prometheus` package (apt-get install prometheus; .ci/run does)")
    })
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn yaml(rel: &str) -> Yaml {
    serde_norway::from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every rule of a rules file: (group, rule).
fn rules(doc: &Yaml) -> Vec<&Yaml> {
    doc["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").iter())
        .collect()
}

fn alert_names(doc: &Yaml) -> Vec<String> {
    rules(doc)
        .iter()
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

// ---- promtool -------------------------------------------------------------------------

#[test]
fn promtool_check_rules_accepts_the_shipped_rules() {
    let (ok, out) = run(Command::new(tool("promtool"))
        .args(["check", "rules"])
        .arg(repo(RULES)));
    println!("{out}");
    assert!(ok, "promtool check rules failed:\n{out}");
    let n = rules(&yaml(RULES)).len();
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "{out}");
}

#[test]
fn promtool_unit_tests_of_every_alert_pass() {
    // promtool resolves `rule_files` against the test file's folder.
    let (ok, out) = run(Command::new(tool("promtool"))
        .args(["test", "rules"])
        .arg(repo(RULE_TESTS)));
    println!("{out}");
    assert!(ok, "promtool test rules failed:\n{out}");
    assert!(out.contains("SUCCESS"), "{out}");
}

/// Checks the unit tests' coverage: for every alert, a test where it fires, one on an idle
/// fleet where it stays quiet, and a later evaluation in a firing test where it is gone.
#[test]
fn every_alert_is_documented_and_unit_tested_three_ways() {
    let doc = yaml(RULES);
    let readme = read("README.md");
    let alerts = alert_names(&doc);
    assert!(alerts.len() >= 8, "{alerts:?}");
    for r in rules(&doc).iter().filter(|r| r["alert"].as_str().is_some()) {
        let name = r["alert"].as_str().unwrap_or_default();
        let a = &r["annotations"];
        for key in ["summary", "description"] {
            let text = a[key].as_str().unwrap_or_default();
            assert!(text.len() > 20, "{name}: {key} missing or empty");
        }
        let severity = r["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["critical", "warning"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        let anchor = name.to_lowercase();
        assert_eq!(
            a["runbook"].as_str(),
            Some(format!("README.md#{anchor}").as_str()),
            "{name}: runbook annotation"
        );
        // GitHub's anchor of a `#### Name` heading is the name in lower case.
        assert!(
            readme.lines().any(|l| l.trim() == format!("#### {name}")),
            "README has no runbook section `#### {name}`"
        );
    }

    let tests = yaml(RULE_TESTS);
    let cases = tests["tests"].as_sequence().expect("tests");
    let mut fires = BTreeSet::new();
    let mut quiet_when_idle = BTreeSet::new();
    let mut resolves = BTreeSet::new();
    for case in cases {
        let idle = case["name"].as_str().unwrap_or_default().contains("idle");
        let Some(checks) = case["alert_rule_test"].as_sequence() else {
            continue;
        };
        let mut first_firing: BTreeMap<String, f64> = BTreeMap::new();
        let mut quiet_at: Vec<(String, f64)> = Vec::new();
        for c in checks {
            let name = c["alertname"].as_str().expect("alertname").to_string();
            let at = prom_duration(c["eval_time"].as_str().expect("eval_time"))
                .expect("eval_time duration")
                .as_secs_f64();
            let expected = c["exp_alerts"].as_sequence().map_or(0, |v| v.len());
            if expected > 0 {
                fires.insert(name.clone());
                let t = first_firing.entry(name).or_insert(at);
                *t = t.min(at);
            } else if idle {
                quiet_when_idle.insert(name);
            } else {
                quiet_at.push((name, at));
            }
        }
        for (name, at) in quiet_at {
            if first_firing.get(&name).is_some_and(|t| *t < at) {
                resolves.insert(name);
            }
        }
    }
    for a in &alerts {
        assert!(fires.contains(a), "no unit test where {a} fires");
        assert!(
            quiet_when_idle.contains(a),
            "no unit test where {a} stays quiet on an idle fleet"
        );
        assert!(resolves.contains(a), "no unit test where {a} resolves");
    }
}

// ---- durations --------------------------------------------------------------------------

/// A Prometheus duration (`90s`, `2m`, `1h30m`, `250ms`).
fn prom_duration(s: &str) -> Option<Duration> {
    let mut total = 0u64;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let ms = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 7 * 86_400_000,
            _ => return None,
        };
        total += n * ms;
        rest = &rest[unit_len..];
    }
    Some(Duration::from_millis(total))
}

fn scaled(s: &str) -> Option<String> {
    let d = prom_duration(s)?;
    Some(format!("{}ms", (d.as_millis() as u64 / TIME_SCALE).max(1)))
}

/// Every `[range]` and `[range:step]` of a PromQL expression, scaled.
fn scale_expr(expr: &str) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(open) = rest.find('[') {
        let Some(len) = rest[open..].find(']') else {
            break;
        };
        out.push_str(&rest[..=open]);
        let inside = &rest[open + 1..open + len];
        let parts: Vec<Option<String>> = inside
            .split(':')
            .map(|p| {
                if p.is_empty() {
                    Some(String::new())
                } else {
                    scaled(p)
                }
            })
            .collect();
        if parts.iter().all(Option::is_some) {
            out.push_str(&parts.into_iter().flatten().collect::<Vec<_>>().join(":"));
        } else {
            out.push_str(inside);
        }
        out.push(']');
        rest = &rest[open + len + 1..];
    }
    out.push_str(rest);
    out
}

/// The shipped rules with every `for` and range window divided by [`TIME_SCALE`].
fn scaled_rules() -> String {
    let mut doc = yaml(RULES);
    let groups = doc["groups"].as_sequence_mut().expect("groups");
    for g in groups {
        for r in g["rules"].as_sequence_mut().expect("rules") {
            let map = r.as_mapping_mut().expect("rule");
            if let Some(f) = map.get("for").and_then(Yaml::as_str).and_then(scaled) {
                map.insert("for".into(), Yaml::String(f));
            }
            let expr = map.get("expr").and_then(Yaml::as_str).expect("expr");
            let e = scale_expr(expr);
            map.insert("expr".into(), Yaml::String(e));
        }
    }
    serde_norway::to_string(&doc).expect("rules serialize")
}

#[test]
fn time_scaling_of_the_rules_for_the_end_to_end_run() {
    assert_eq!(
        scale_expr("rate(x[2m]) > 0 and max_over_time(y[1h:15s]) and z[5m:]"),
        "rate(x[6000ms]) > 0 and max_over_time(y[180000ms:750ms]) and z[15000ms:]"
    );
    assert_eq!(scaled("1h30m").as_deref(), Some("270000ms"));
    assert_eq!(prom_duration("2x"), None);
    // The scaled file is still valid for promtool.
    let dir = tempfile::tempdir().expect("temp dir");
    let p = dir.path().join("rules.yml");
    std::fs::write(&p, scaled_rules()).expect("write");
    let (ok, out) = run(Command::new(tool("promtool"))
        .args(["check", "rules"])
        .arg(&p));
    assert!(ok, "{out}");
}

// ---- a real Prometheus ------------------------------------------------------------------

struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[derive(Debug, Clone)]
struct Alert {
    name: String,
    state: String,
    labels: BTreeMap<String, String>,
}

impl Prometheus {
    /// Scrapes `target` (an admin endpoint) and evaluates `rules`, both every second.
    async fn start(target: SocketAddr, rules: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("rules.yml"), rules).expect("rules");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             rule_files: [rules.yml]\n\
             scrape_configs:\n  - job_name: staleguard\n    static_configs:\n      - targets: [\"{target}\"]\n"
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("config");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new(tool("prometheus"))
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start prometheus: {e}"));
        let p = Prometheus { child, addr, dir };
        let start = Instant::now();
        loop {
            if let Ok(r) = tokio::time::timeout(Duration::from_secs(2), p.raw_get("/-/ready")).await
            {
                if r.map(|(status, _)| status == 200).unwrap_or(false) {
                    break;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "prometheus not ready:\n{}",
                p.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    async fn raw_get(&self, path: &str) -> std::io::Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.addr).await?;
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        );
        s.write_all(req.as_bytes()).await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        Ok((
            status,
            if chunked {
                dechunk(body)
            } else {
                body.to_string()
            },
        ))
    }

    /// A GET on the HTTP API; the JSON whatever the status (errors are JSON too).
    async fn api(&self, path: &str) -> Json {
        let (status, body) = support::within(path, self.raw_get(path))
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {status} {e}: {body}"))
    }

    async fn query(&self, expr: &str) -> Json {
        self.api(&format!("/api/v1/query?query={}", urlencode(expr)))
            .await
    }

    async fn alerts(&self) -> Vec<Alert> {
        let v = self.api("/api/v1/alerts").await;
        assert_eq!(v["status"], "success", "{v}");
        v["data"]["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|a| Alert {
                name: a["labels"]["alertname"].as_str().unwrap_or_default().into(),
                state: a["state"].as_str().unwrap_or_default().into(),
                labels: a["labels"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().into()))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect()
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

// ---- the incident ------------------------------------------------------------------------

/// A read or write loop against the proxy until stopped; counts answers and errors.
struct Load {
    running: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl Load {
    fn stop(&self) {
        self.running.store(false, Ordering::Relaxed);
    }

    fn counts(&self) -> (u64, u64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

/// Runs `op(i)` every `every`, each in its own task (a stalled one does not hold the next).
fn load<F, Fut>(every: Duration, op: F) -> Load
where
    F: Fn(u64) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let running = Arc::new(AtomicBool::new(true));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let (r, o, f) = (running.clone(), ok.clone(), failed.clone());
    tokio::spawn(async move {
        let mut i = 0u64;
        while r.load(Ordering::Relaxed) {
            i += 1;
            let (fut, o, f) = (op(i), o.clone(), f.clone());
            tokio::spawn(async move {
                let counter = if fut.await { o } else { f };
                counter.fetch_add(1, Ordering::Relaxed);
            });
            tokio::time::sleep(every).await;
        }
    });
    Load {
        running,
        ok,
        failed,
    }
}

fn secondary_preferred() -> SelectionCriteria {
    SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred {
        options: Default::default(),
    })
}

/// The proxy's config: every signal of the write-stall watch with short windows, the
/// inventory fallback (held open while writes stall), payments strict.
fn proxy_config(sim: &sim::SimHandle) -> String {
    let node = |n: &str| sim.node_addr(n).expect("node port").to_string();
    format!(
        r#"listen = "127.0.0.1:0"
upstreams = ["{}"]
health_interval = "1s"
health_timeout = "500ms"

[admin]
listen = "127.0.0.1:0"

[stall_watch]
stall_after = "1s"
# The writers all run on this machine: one client address.
min_client_addresses = 1
on_write_stall = "open_fallback_breakers"

[stall_watch.probe]
interval = "500ms"
slow = "300ms"

[stall_watch.shards]
uris = ["mongodb://{}/?directConnection=true", "mongodb://{}/?directConnection=true"]
poll = "200ms"
for = "1s"
baseline = "2s"

[defaults]
threshold = 3
window = "10s"
cooldown = "1s"
# The clock here is compressed (the payment reads' maxTimeMS is 500 ms): their time limits
# are evidence from that long on.
min_wait = "500ms"

[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"

[[namespaces]]
pattern = "pay.*"
mode = "strict"
"#,
        sim.addr(),
        node("a0"),
        node("b0")
    )
}

/// The alerts of this incident that must fire: (alertname, label, value).
fn expected(upstream: &str) -> Vec<(&'static str, &'static str, String)> {
    vec![
        ("StaleguardWriteStall", "signal", "passive".into()),
        (
            "StaleguardWriteStall",
            "target",
            format!("{upstream}/writer-probe"),
        ),
        ("StaleguardShardWriteStall", "shard", "shardA".into()),
        (
            "StaleguardFallbackServingAvailable",
            "namespace",
            "demo.store_inventory".into(),
        ),
        (
            "StaleguardStrictFailingFast",
            "namespace",
            "pay.transactions".into(),
        ),
    ]
}

fn missing<'a>(
    alerts: &[Alert],
    want: &'a [(&'static str, &'static str, String)],
) -> Vec<&'a (&'static str, &'static str, String)> {
    want.iter()
        .filter(|(name, key, value)| {
            !alerts.iter().any(|a| {
                a.state == "firing" && a.name == *name && a.labels.get(*key) == Some(value)
            })
        })
        .collect()
}

async fn wait_for<T>(
    what: &str,
    limit: Duration,
    prom: &Prometheus,
    mut check: impl FnMut(&[Alert]) -> Option<T>,
) -> (T, Duration) {
    let start = Instant::now();
    loop {
        let alerts = prom.alerts().await;
        if let Some(v) = check(&alerts) {
            return (v, start.elapsed());
        }
        assert!(
            start.elapsed() < limit,
            "{what}: not within {limit:?}; alerts now: {alerts:#?}\nprometheus log:\n{}",
            prom.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_fire_during_the_simulated_stall_and_resolve_after_it() {
    let t0 = Instant::now();
    let sim = sim::start(SimConfig {
        listen: "127.0.0.1:0".into(),
        node_ports: true,
        write_tickets: 8,
        refresh_timeout: Duration::from_millis(500),
        find_host_timeout: Duration::from_millis(300),
        ..SimConfig::default()
    })
    .await
    .expect("sim starts");
    let text = proxy_config(&sim);
    let config = Config::parse(&text, Path::new("<prometheus test>"))
        .unwrap_or_else(|e| panic!("{e:#?}\n{text}"));
    let proxy = staleguard::server::start(Arc::new(config))
        .await
        .expect("proxy starts");
    let admin = proxy.admin_addr().expect("admin endpoint");
    let prom = Prometheus::start(admin, &scaled_rules()).await;

    let uri = |pool: u32| {
        format!(
            "mongodb://{}/?serverSelectionTimeoutMS=5000&maxPoolSize={pool}",
            proxy.local_addr()
        )
    };
    let writes = mongodb::Client::with_uri_str(uri(64))
        .await
        .expect("client");
    let reads = mongodb::Client::with_uri_str(uri(32))
        .await
        .expect("client");
    let orders = writes.database("demo").collection::<Document>("orders");
    let writer = load(Duration::from_millis(25), move |i| {
        let c = orders.clone();
        async move {
            c.insert_one(doc! {"seq": i as i64, "item": "widget"})
                .await
                .is_ok()
        }
    });
    let inventory = reads
        .database("demo")
        .collection::<Document>("store_inventory");
    let inventory_reader = load(Duration::from_millis(40), move |i| {
        let c = inventory.clone();
        async move {
            let read = c
                .find_one(doc! {"_id": {"productId": (i % 100 + 1) as i32, "storeId": (i % 20 + 1) as i32}})
                .selection_criteria(secondary_preferred())
                .max_time(Duration::from_secs(1));
            matches!(
                tokio::time::timeout(Duration::from_secs(3), read).await,
                Ok(Ok(_))
            )
        }
    });
    let payments = reads.database("pay").collection::<Document>("transactions");
    let payment_reader = load(Duration::from_millis(40), move |i| {
        let c = payments.clone();
        async move {
            let read = c
                .find_one(doc! {"_id": (i % 300 + 1) as i32})
                .selection_criteria(secondary_preferred())
                .max_time(Duration::from_millis(500));
            matches!(
                tokio::time::timeout(Duration::from_secs(2), read).await,
                Ok(Ok(_))
            )
        }
    });

    // Healthy: scraped, traffic flowing, nothing pending or firing.
    let up = Instant::now();
    loop {
        let v = prom.query("up{job=\"staleguard\"}").await;
        if v["data"]["result"][0]["value"][1] == "1" {
            break;
        }
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "never scraped: {v}\n{}",
            prom.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let healthy = Instant::now();
    while healthy.elapsed() < Duration::from_secs(5) {
        let alerts = prom.alerts().await;
        assert!(
            alerts.is_empty(),
            "alerts on a healthy cluster: {alerts:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        writer.counts().0 > 50,
        "writes complete: {:?}",
        writer.counts()
    );
    assert!(inventory_reader.counts().0 > 50 && payment_reader.counts().0 > 50);

    // The incident: the primary stalls, then both secondaries of shard A restart.
    sim.cluster().stall_primary("shardA").expect("stall");
    tokio::time::sleep(Duration::from_secs(2)).await;
    for node in ["a1", "a2"] {
        sim.cluster().restart_node(node).expect("restart");
    }
    let upstream = sim.addr().to_string();
    let want = expected(&upstream);
    let (firing, took) = wait_for(
        "every incident alert firing",
        Duration::from_secs(30),
        &prom,
        |alerts| missing(alerts, &want).is_empty().then(|| alerts.to_vec()),
    )
    .await;
    println!("all firing {took:?} after the restarts:");
    for a in &firing {
        println!("  {} {} {:?}", a.state, a.name, a.labels);
    }
    // The passive signal names the mongos the writes went through.
    assert!(firing.iter().any(|a| a.name == "StaleguardWriteStall"
        && a.labels.get("signal").map(String::as_str) == Some("passive")
        && a.labels.get("target") == Some(&upstream)));
    // Nothing that should stay quiet: mongos answers its health checks, no reload failed.
    for quiet in [
        "StaleguardUpstreamDown",
        "StaleguardNoHealthyUpstream",
        "StaleguardReloadFailed",
    ] {
        assert!(
            !firing.iter().any(|a| a.name == quiet),
            "{quiet}: {firing:#?}"
        );
    }

    // Resolution: the primary resumes; every staleguard alert leaves Prometheus's list.
    sim.cluster().resume_primary("shardA").expect("resume");
    let ((), took) = wait_for(
        "every alert resolved",
        Duration::from_secs(40),
        &prom,
        |alerts| alerts.is_empty().then_some(()),
    )
    .await;
    println!("all resolved {took:?} after the resume");
    assert!(
        writer.counts().0 > 0 && payment_reader.counts().1 > 0,
        "writes {:?}, payment reads {:?}",
        writer.counts(),
        payment_reader.counts()
    );
    writer.stop();
    inventory_reader.stop();
    payment_reader.stop();

    // Prometheus scraped the OpenMetrics format all along (it asks for it first); the live
    // exposition after the incident, every write-stall family in it, in both formats
    // through promtool.
    check_live_exposition(admin).await;

    // The dashboard and the rules against this Prometheus and this staleguard's metrics.
    check_dashboard(&prom).await;
    // Families with no sample yet are not rendered: TLS failures, serverStatus poll errors
    // and dry-run counts did not happen here (nor is there a fleet), so take their names
    // from an exporter that saw one.
    let mut exported = exported_names(&proxy.shared().metrics.render());
    let rare = staleguard::metrics::Metrics::new();
    rare.register_fleet();
    rare.tls_failure("client");
    rare.hot_dry_run(&rare.ns_hot("dry.run"), "rewrite");
    rare.stall
        .poll_errors
        .get_or_create(&staleguard::metrics::ShardLabel {
            shard: "shardA".into(),
        })
        .inc();
    exported.extend(exported_names(&rare.render()));
    check_metric_names(&exported);

    proxy.shutdown().await;
    sim.shutdown().await;
    println!("end-to-end run took {:?}", t0.elapsed());
}

/// `promtool check metrics` on the admin endpoint's `/metrics`, asked for the text format
/// and for OpenMetrics.
async fn check_live_exposition(admin: SocketAddr) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for (accept, content_type) in [
        ("text/plain;version=0.0.4", "text/plain; version=0.0.4"),
        (
            "application/openmetrics-text;version=1.0.0",
            "application/openmetrics-text; version=1.0.0",
        ),
    ] {
        let mut s = tokio::net::TcpStream::connect(admin).await.expect("admin");
        let req = format!(
            "GET /metrics HTTP/1.1\r\nHost: {admin}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.expect("request");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.expect("response");
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("content-type: {content_type}")),
            "{head}"
        );
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(body)
        } else {
            body.to_string()
        };
        for family in [
            "staleguard_write_stall_signal",
            "staleguard_shard_write_stall",
            "staleguard_probes_total",
            "staleguard_breaker_transitions_total",
        ] {
            assert!(
                body.contains(&format!("# TYPE {family} ")),
                "{accept}: no {family}:\n{body}"
            );
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path().join("metrics.txt");
        std::fs::write(&p, &body).expect("write");
        let (ok, out) = run(Command::new("sh").arg("-c").arg(format!(
            "{} check metrics < {}",
            tool("promtool").display(),
            p.display()
        )));
        assert!(ok, "promtool check metrics ({accept}):\n{out}\n{body}");
    }
}

// ---- the dashboard ------------------------------------------------------------------------

/// Every PromQL expression of the dashboard: panel targets (nested rows too).
fn dashboard_exprs(d: &Json) -> Vec<String> {
    fn walk(panels: &Json, out: &mut Vec<String>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push(e.to_string());
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    out
}

/// Grafana's variables as the dashboard's defaults select them: every job and instance.
fn with_variables(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("${job}", "staleguard")
        .replace("$job", "staleguard")
        .replace("${instance}", ".*")
        .replace("$instance", ".*")
}

async fn check_dashboard(prom: &Prometheus) {
    let d: Json = serde_json::from_str(&read(DASHBOARD)).expect("dashboard is JSON");
    let exprs = dashboard_exprs(&d);
    assert!(exprs.len() >= 15, "{} expressions", exprs.len());
    let mut with_data = 0;
    for e in &exprs {
        let q = with_variables(e);
        assert!(!q.contains('$'), "unknown variable in {e}");
        let v = prom.query(&q).await;
        assert_eq!(v["status"], "success", "dashboard expression {q}: {v}");
        if v["data"]["result"]
            .as_array()
            .is_some_and(|r| !r.is_empty())
        {
            with_data += 1;
        }
    }
    // Most panels show something after an incident (not TLS failures, not down upstreams).
    assert!(
        with_data * 3 >= exprs.len() * 2,
        "only {with_data} of {} expressions returned data",
        exprs.len()
    );
}

/// Sample names staleguard exports: every `# TYPE` family with its sample suffixes.
fn exported_names(exposition: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in exposition.lines() {
        let mut w = l.split_whitespace();
        if (w.next(), w.next()) != (Some("#"), Some("TYPE")) {
            continue;
        }
        let (Some(name), Some(kind)) = (w.next(), w.next()) else {
            continue;
        };
        // Counter families are named by their `_total` sample (see metrics/exposition.rs).
        let suffixes: &[&str] = match kind {
            "counter" if name.ends_with("_total") => &[""],
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        for s in suffixes {
            out.insert(format!("{name}{s}"));
        }
    }
    out
}

/// Metric names in a PromQL expression or Grafana query: `staleguard_*` and `staleguard:*`.
fn names_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("staleguard") {
        let before = rest[..i].chars().next_back();
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        // Skip label values and other words that merely contain it (`job="staleguard"`).
        let quoted = before == Some('"');
        let word_inside = before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let name = &tail[..end];
        if !quoted
            && !word_inside
            && (name.starts_with("staleguard_") || name.starts_with("staleguard:"))
        {
            out.push(name.to_string());
        }
        rest = &tail[end.max(1)..];
    }
    out
}

fn check_metric_names(exported: &BTreeSet<String>) {
    assert!(
        exported.contains("staleguard_fail_fasts_total"),
        "{exported:?}"
    );
    let rules_doc = yaml(RULES);
    let recorded: BTreeSet<String> = rules(&rules_doc)
        .iter()
        .filter_map(|r| r["record"].as_str().map(str::to_string))
        .collect();
    let mut sources: Vec<(String, String)> = rules(&rules_doc)
        .iter()
        .map(|r| {
            (
                "rule".to_string(),
                r["expr"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let d: Json = serde_json::from_str(&read(DASHBOARD)).expect("dashboard");
    sources.extend(
        dashboard_exprs(&d)
            .into_iter()
            .map(|e| ("dashboard".into(), e)),
    );
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = v["query"].as_str().or_else(|| v["query"]["query"].as_str()) {
            sources.push(("dashboard variable".into(), q.to_string()));
        }
    }
    let mut checked = 0;
    for (from, expr) in &sources {
        for name in names_in(expr) {
            assert!(
                exported.contains(&name) || recorded.contains(&name),
                "{from} names {name}, which staleguard does not export and no rule records: {expr}"
            );
            checked += 1;
        }
    }
    assert!(checked > 30, "{checked} names checked");
}

#[test]
fn metric_names_are_found_in_expressions() {
    assert_eq!(
        names_in(
            r#"sum by (job) (rate(staleguard_rewrites_total{job="staleguard"}[2m])) > staleguard:x:rate2m"#
        ),
        ["staleguard_rewrites_total", "staleguard:x:rate2m"]
    );
    let names = exported_names(
        "# HELP staleguard_reloads_total Config reloads.\n# TYPE staleguard_reloads_total counter\n\
         # TYPE staleguard_upstream_hello_seconds histogram\n# TYPE staleguard_upstream_up gauge\n",
    );
    let want: BTreeSet<String> = [
        "staleguard_reloads_total",
        "staleguard_upstream_hello_seconds_bucket",
        "staleguard_upstream_hello_seconds_sum",
        "staleguard_upstream_hello_seconds_count",
        "staleguard_upstream_up",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(names, want);
}
