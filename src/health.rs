//! Upstream health: every `health_interval`, a `hello` on a dedicated connection per
//! upstream, answered within `health_timeout`. The result steers `Upstreams::connect`
//! (down ones are tried last) and shows in metrics (`upstream_up`) and `/status`.

use std::sync::Arc;
use std::time::Duration;

use bson::rawdoc;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::server::Shared;
use crate::upstream::{self, Health, Upstream};
use crate::wire::{reply, Header, MessageCodec};

/// Checks every upstream until `stop`; the first round starts at once. While checks are
/// off (`health_interval = "off"`), every upstream counts as unknown (usable).
pub async fn run(shared: Arc<Shared>, stop: CancellationToken) {
    let mut was_on = false;
    loop {
        let config = shared.config.load_full();
        let wait = match config.health_interval {
            Some(every) => {
                check_all(&shared, &config).await;
                was_on = true;
                every
            }
            None => {
                if std::mem::take(&mut was_on) {
                    for u in shared.upstreams.list().iter() {
                        u.forget();
                        *u.probe.lock().await = None;
                        shared.metrics.upstream_removed(&u.addr);
                    }
                }
                OFF_RECHECK
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// While checks are off, how often the config is looked at again.
const OFF_RECHECK: Duration = Duration::from_secs(1);

/// One round: every upstream checked concurrently.
pub async fn check_all(shared: &Shared, config: &Config) {
    let list = shared.upstreams.list();
    futures::future::join_all(list.iter().map(|u| check(shared, u, config))).await;
}

async fn check(shared: &Shared, u: &Upstream, config: &Config) {
    let request_id = shared.request_id();
    let result =
        match tokio::time::timeout(config.health_timeout, hello(u, config, request_id)).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "no hello reply within {}",
                humantime::format_duration(config.health_timeout)
            )),
        };
    if result.is_err() {
        // A reply may still be on its way: never read it as the answer to the next check.
        *u.probe.lock().await = None;
    }
    let m = &shared.metrics;
    m.upstream_health(&u.addr, result.is_ok());
    if let Ok(latency) = &result {
        m.upstream_hello(&u.addr, *latency);
    }
    let error = result.as_ref().err().cloned();
    match (u.record(result), error) {
        (Some(before), None) => {
            tracing::info!(upstream = %u.addr, was = before.as_str(), "upstream healthy")
        }
        (Some(_), Some(e)) => {
            tracing::warn!(upstream = %u.addr, error = %e, "upstream unhealthy: new clients go to the others")
        }
        (None, Some(e)) => {
            tracing::debug!(upstream = %u.addr, error = %e, "upstream still unhealthy")
        }
        (None, None) => {}
    }
}

/// Sends `{hello: 1, $db: "admin"}` and waits for an `ok: 1` answer; returns its round trip.
async fn hello(u: &Upstream, config: &Config, request_id: i32) -> Result<Duration, String> {
    let mut slot = u.probe.lock().await;
    if slot.is_none() {
        let stream = upstream::dial(&u.addr, config.health_timeout, config.upstream_tls.as_ref())
            .await
            .map_err(|e| e.to_string())?;
        *slot = Some(FramedRead::new(
            stream,
            MessageCodec::new(config.max_message_size),
        ));
    }
    let Some(conn) = slot.as_mut() else {
        return Err("no connection".to_string());
    };
    let msg = reply::op_msg(request_id, 0, 0, &rawdoc! { "hello": 1, "$db": "admin" });
    let sent = Instant::now();
    let outcome = async {
        conn.get_mut()
            .write_all(&msg)
            .await
            .map_err(|e| format!("send hello: {e}"))?;
        loop {
            let reply = match conn.next().await {
                Some(Ok(r)) => r,
                Some(Err(e)) => return Err(format!("read hello reply: {e}")),
                None => return Err("connection closed before the hello reply".to_string()),
            };
            // Anything else (a late answer to an earlier check) is skipped.
            if Header::parse(&reply).is_some_and(|h| h.response_to == request_id) {
                return Ok(reply);
            }
        }
    }
    .await;
    let reply = match outcome {
        Ok(r) => r,
        Err(e) => {
            *slot = None;
            return Err(e);
        }
    };
    let latency = sent.elapsed();
    match crate::wire::inspect_reply(&reply, config.max_message_size) {
        Ok(s) if s.ok => Ok(latency),
        Ok(s) => Err(format!(
            "hello answered ok: 0 (code {}, {})",
            s.code.unwrap_or(0),
            s.code_name.unwrap_or_default()
        )),
        Err(e) => {
            *slot = None;
            Err(format!("malformed hello reply: {e}"))
        }
    }
}

/// Ready to serve: at least one upstream answered its last check (with checks off: at
/// least one upstream is configured).
pub fn any_up(shared: &Shared) -> bool {
    let list = shared.upstreams.list();
    if shared.config.load().health_interval.is_none() {
        return !list.is_empty();
    }
    list.iter().any(|u| u.health() == Health::Up)
}
