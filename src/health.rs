//! Upstream health: every `health_interval`, a hello on a dedicated connection per
//! upstream (kept here between checks, opened again after a config swap; the legacy
//! `isMaster` until the server offers `hello`), answered within `health_timeout`. The result, recorded on the `Upstream`, steers `Upstreams::connect`
//! (down ones are tried last) and shows in metrics (`upstream_up`) and `/status`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bson::{rawdoc, RawDocumentBuf};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::state::{Ids, LiveConfig};
use crate::tls::Stream;
use crate::upstream::{self, Upstream, Upstreams};
use crate::wire::opmsg::OpMsg;
use crate::wire::{reply, Header, MessageCodec, HEADER_LEN};

/// The checker's own connection to an upstream, kept between checks, and what its
/// handshake learned.
struct Conn {
    frames: FramedRead<Stream, MessageCodec>,
    /// The server answered the legacy hello with `helloOk: true`: check with `hello`.
    hello_ok: bool,
}

/// While checks are off, how often the config is looked at again.
const OFF_RECHECK: Duration = Duration::from_secs(1);

/// The health checker, with the handles it is given.
#[derive(Debug)]
pub struct Checker {
    pub config: Arc<LiveConfig>,
    pub upstreams: Arc<Upstreams>,
    pub metrics: Arc<Metrics>,
    /// requestIDs of the `hello`s.
    pub ids: Arc<Ids>,
}

/// The connections kept between rounds, and the config generation they were opened under.
#[derive(Default)]
struct Conns {
    generation: u64,
    by_addr: HashMap<String, Conn>,
}

impl Checker {
    /// Checks every upstream until `stop`; the first round starts at once. While checks are
    /// off (`health_interval = "off"`), every upstream counts as unknown (usable).
    pub async fn run(self, stop: CancellationToken) {
        let mut conns = Conns::default();
        let mut was_on = false;
        loop {
            // The generation first: a swap in between only costs one more reconnect.
            let generation = self.config.generation();
            let config = self.config.load_full();
            let wait = match config.health_interval {
                Some(every) => {
                    if generation != conns.generation {
                        // Reconnect with the new settings (e.g. `[upstream_tls]`).
                        conns.by_addr.clear();
                        conns.generation = generation;
                    }
                    self.check_all(&config, &mut conns.by_addr).await;
                    was_on = true;
                    every
                }
                None => {
                    if std::mem::take(&mut was_on) {
                        conns.by_addr.clear();
                        for u in self.upstreams.list().iter() {
                            u.forget();
                            self.metrics.upstream_removed(&u.addr);
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

    /// One round: every upstream checked concurrently, each on its kept connection. Only the
    /// connections of upstreams still listed are kept.
    async fn check_all(&self, config: &Config, conns: &mut HashMap<String, Conn>) {
        let list = self.upstreams.list();
        let checks: Vec<_> = list
            .iter()
            .map(|u| self.check(u, conns.remove(&u.addr), config))
            .collect();
        let kept = futures::future::join_all(checks).await;
        conns.clear();
        for (u, conn) in list.iter().zip(kept) {
            if let Some(c) = conn {
                conns.insert(u.addr.clone(), c);
            }
        }
    }

    /// Checks one upstream; returns the connection to keep for the next check.
    async fn check(&self, u: &Upstream, mut conn: Option<Conn>, config: &Config) -> Option<Conn> {
        let request_id = self.ids.request_id();
        let asked = hello(&mut conn, &u.addr, config, request_id);
        let result = match tokio::time::timeout(config.health_timeout, asked).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "no hello reply within {}",
                humantime::format_duration(config.health_timeout)
            )),
        };
        if result.is_err() {
            // A reply may still be on its way: never read it as the answer to the next check.
            conn = None;
        }
        let m = &self.metrics;
        m.upstream_health(&u.addr, result.is_ok());
        if let Ok(latency) = &result {
            m.upstream_hello(&u.addr, *latency);
        }
        let error = result.as_ref().err().cloned();
        let changed = u.record(result);
        if changed.is_some() {
            let e = crate::events::Event::upstream(&u.addr, error.as_deref());
            m.recent.events.record(e);
        }
        match (changed, error) {
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
        conn
    }
}

/// One check on the upstream's kept connection, with the handshake drivers use: the legacy
/// hello (`isMaster` with `helloOk: true`) until the server answers `helloOk: true`, then
/// `hello` on that connection (see [`check_command`]). Waits for an `ok: 1` answer; returns
/// its round trip.
async fn hello(
    slot: &mut Option<Conn>,
    addr: &str,
    config: &Config,
    request_id: i32,
) -> Result<Duration, String> {
    if slot.is_none() {
        let stream = upstream::dial(addr, config.health_timeout, config.upstream_tls.as_ref())
            .await
            .map_err(|e| e.to_string())?;
        *slot = Some(Conn {
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
