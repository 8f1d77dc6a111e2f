//! Upstream health: every `health_interval`, a hello on a dedicated connection per
//! upstream (the legacy `isMaster` until the server offers `hello`), answered within
//! `health_timeout`. The result steers `Upstreams::connect`
//! (down ones are tried last) and shows in metrics (`upstream_up`) and `/status`.

use std::sync::Arc;
use std::time::Duration;

use bson::{rawdoc, RawDocumentBuf};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::server::Shared;
use crate::upstream::{self, Health, ProbeConn, Upstream};
use crate::wire::opmsg::OpMsg;
use crate::wire::{reply, Header, MessageCodec, HEADER_LEN};

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

/// One check on the upstream's kept connection, with the handshake drivers use: the legacy
/// hello (`isMaster` with `helloOk: true`) until the server answers `helloOk: true`, then
/// `hello` on that connection (see [`check_command`]). Waits for an `ok: 1` answer; returns
/// its round trip.
async fn hello(u: &Upstream, config: &Config, request_id: i32) -> Result<Duration, String> {
    let mut slot = u.probe.lock().await;
    if slot.is_none() {
        let stream = upstream::dial(&u.addr, config.health_timeout, config.upstream_tls.as_ref())
            .await
            .map_err(|e| e.to_string())?;
        *slot = Some(ProbeConn {
            frames: FramedRead::new(stream, MessageCodec::new(config.max_message_size)),
            hello_ok: false,
        });
    }
    let Some(conn) = slot.as_mut() else {
        return Err("no connection".to_string());
    };
    let msg = reply::op_msg(request_id, 0, 0, &check_command(conn.hello_ok));
    let sent = Instant::now();
    let frames = &mut conn.frames;
    let outcome = async {
        frames
            .get_mut()
            .write_all(&msg)
            .await
            .map_err(|e| format!("send hello: {e}"))?;
        loop {
            let reply = match frames.next().await {
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
        Ok(s) if s.ok => {
            conn.hello_ok = conn.hello_ok || offers_hello(&reply);
            Ok(latency)
        }
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

/// The check to send: `{hello: 1}` once the server offered it (`helloOk`), otherwise the
/// legacy hello `{isMaster: 1, helloOk: true}`, which every server answers (`hello` is unknown
/// to 4.0 before 4.0.21 and to 4.2.0–4.2.9). OP_MSG with `$db`, which servers accept from 3.6
/// on (OP_QUERY would only matter for servers before 3.6, which drivers no longer support).
pub fn check_command(hello_ok: bool) -> RawDocumentBuf {
    if hello_ok {
        rawdoc! { "hello": 1, "$db": "admin" }
    } else {
        rawdoc! { "isMaster": 1, "helloOk": true, "$db": "admin" }
    }
}

/// The reply (an OP_MSG) says `helloOk: true`: the server knows `hello`.
pub fn offers_hello(reply: &[u8]) -> bool {
    reply
        .get(HEADER_LEN..)
        .and_then(|payload| OpMsg::parse(payload).ok())
        .is_some_and(|m| m.body.get_bool("helloOk").is_ok_and(|b| b))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_hello_until_offered() {
        let first = check_command(false);
        assert_eq!(first.get_i32("isMaster").ok(), Some(1));
        assert_eq!(first.get_bool("helloOk").ok(), Some(true));
        assert!(first.get("hello").ok().flatten().is_none());
        let then = check_command(true);
        assert_eq!(then.get_i32("hello").ok(), Some(1));
        assert_eq!(then.get_str("$db").ok(), Some("admin"));
        let offered = reply::op_msg(
            1,
            2,
            0,
            &rawdoc! { "ismaster": true, "helloOk": true, "ok": 1.0 },
        );
        assert!(offered.len() > HEADER_LEN && offers_hello(&offered));
        let old = reply::op_msg(1, 2, 0, &rawdoc! { "ismaster": true, "ok": 1.0 });
        assert!(!offers_hello(&old));
        assert!(!offers_hello(b"short"));
    }
}
