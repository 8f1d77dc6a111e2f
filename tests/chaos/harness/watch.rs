//! Watching staleguard from outside, through its admin endpoint only: `/metrics` every
//! 100 ms (each breaker's state and transition counts) and, at the end, `/status`'s recent
//! events (the reason each breaker opened or closed).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// One scrape of `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Since the run started.
    pub at: Duration,
    /// `breaker_state` by namespace (0 closed, 2 open).
    pub states: BTreeMap<String, i64>,
    /// `breaker_transitions_total` by (namespace, to).
    pub transitions: BTreeMap<(String, String), u64>,
}

impl Scrape {
    pub fn open(&self) -> Vec<&str> {
        self.states
            .iter()
            .filter(|(_, v)| **v != 0)
            .map(|(ns, _)| ns.as_str())
            .collect()
    }

    /// Transitions into `to` so far, by namespace.
    pub fn into(&self, to: &str) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for ((ns, t), n) in &self.transitions {
            if t == to {
                *out.entry(ns.clone()).or_default() += n;
            }
        }
        out
    }
}

/// A breaker event of `/status`.
#[derive(Debug, Clone)]
pub struct Event {
    pub at_unix_ms: u64,
    pub kind: String,
    pub namespace: String,
    pub reason: String,
}

/// `GET path` on the admin endpoint; `None` if it fails (the run goes on).
pub async fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let fetch = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.ok()?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        if !head.starts_with("HTTP/1.1 200") {
            return None;
        }
        let chunked = head.lines().any(|l| {
            l.to_ascii_lowercase()
                .starts_with("transfer-encoding: chunked")
        });
        Some(if chunked {
            dechunk(body)
        } else {
            body.to_string()
        })
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .flatten()
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The value of `label` in a sample line's label set.
fn label<'a>(labels: &'a str, label: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{label}=\""))? + label.len() + 2;
    let rest = &labels[start..];
    Some(&rest[..rest.find('"')?])
}

pub fn parse(text: &str, at: Duration) -> Scrape {
    let mut s = Scrape {
        at,
        ..Scrape::default()
    };
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.parse::<f64>() else {
            continue;
        };
        if let Some(labels) = series.strip_prefix("staleguard_breaker_state{") {
            if let Some(ns) = label(labels, "namespace") {
                s.states.insert(ns.to_string(), v as i64);
            }
        } else if let Some(labels) = series.strip_prefix("staleguard_breaker_transitions_total{") {
            if let (Some(ns), Some(to)) = (label(labels, "namespace"), label(labels, "to")) {
                *s.transitions
                    .entry((ns.to_string(), to.to_string()))
                    .or_default() += v as u64;
            }
        }
    }
    s
}

/// Scrapes `/metrics` every 100 ms until `stop`.
pub async fn poll(addr: SocketAddr, t0: Instant, stop: Instant, out: Arc<Mutex<Vec<Scrape>>>) {
    while Instant::now() < stop {
        if let Some(text) = get(addr, "/metrics").await {
            let s = parse(&text, t0.elapsed());
            out.lock().expect("scrapes").push(s);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The breaker events `/status` still holds (the last 256 events), oldest first.
pub async fn events(addr: SocketAddr) -> Vec<Event> {
    let Some(text) = get(addr, "/status").await else {
        return Vec::new();
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let mut out: Vec<Event> = json["events"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|e| {
                    e["kind"]
                        .as_str()
                        .is_some_and(|k| k.starts_with("breaker_"))
                })
                .map(|e| Event {
                    at_unix_ms: e["at_unix_ms"].as_u64().unwrap_or(0),
                    kind: e["kind"].as_str().unwrap_or("").to_string(),
                    namespace: e["namespace"].as_str().unwrap_or("").to_string(),
                    reason: e["reason"].as_str().unwrap_or("").to_string(),
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_by_key(|e| e.at_unix_ms);
    out
}
