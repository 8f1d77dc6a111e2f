//! The fleet task's link to Redis: connect (a command connection and a subscription),
//! publish this instance's openings and closes, apply the others', renew the opening keys,
//! check the link every `timeout`; on any failure act alone, log it once, and try again.
//!
//! Keys and channel, under `[fleet] prefix` (`P`): `P:openings` (pub/sub), and one key per
//! opening, `P:open:<opener>:<ns>`, holding the same JSON with a TTL of `lease`, renewed
//! every third of it while the breaker stays open.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{MultiplexedConnection, PubSubSink, PubSubStream};
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo};
use tokio::sync::mpsc;
use tokio::time::{interval, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::{Ctx, Kind, Message, Mine, Own};
use crate::breaker::Reason;
use crate::config::FleetConfig;

/// The most opening keys read when (re)joining: each names a namespace with a breaker.
const MAX_SCANNED: usize = 10_000;

/// Why the link failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum LinkError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the subscription ended")]
    Ended,
}

/// The client for `[fleet] redis`, with the password of `password_env` when set.
pub(super) fn client(cfg: &FleetConfig) -> redis::RedisResult<Client> {
    let mut info = cfg.url.expose().into_connection_info()?;
    if let Some(p) = &cfg.password {
        let settings = info.redis_settings().clone().set_password(p.expose());
        info = info.set_redis_settings(settings);
    }
    Client::open(info)
}

/// `fut`, or [`LinkError::Timeout`] after `limit`.
pub(super) async fn within<T>(
    limit: Duration,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, LinkError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(LinkError::Timeout(limit)),
    }
}

/// Opens the command connection (every call bounded by `timeout`).
pub(super) async fn connect(
    client: &Client,
    cfg: &FleetConfig,
) -> Result<MultiplexedConnection, LinkError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(cfg.connect_timeout))
        .set_response_timeout(Some(cfg.timeout));
    within(
        cfg.connect_timeout + cfg.timeout,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
}

struct Link {
    conn: MultiplexedConnection,
    /// The subscription's own connection, pinged too: a subscription cut without a close
    /// would otherwise miss messages while the command connection answers.
    sink: PubSubSink,
    messages: PubSubStream,
}

struct Names {
    channel: String,
    keys: String,
}

impl Names {
    fn new(prefix: &str) -> Names {
        Names {
            channel: format!("{prefix}:openings"),
            keys: format!("{prefix}:open:"),
        }
    }

    fn key(&self, m: &Message) -> String {
        format!("{}{}:{}", self.keys, m.opener, m.ns)
    }
}

/// The task: runs until `stop`.
pub(super) async fn run(
    ctx: Ctx,
    cfg: FleetConfig,
    mut rx: mpsc::Receiver<Own>,
    stop: CancellationToken,
) {
    let client = match client(&cfg) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(redis = %cfg.shown, error = %e, "fleet: cannot use the Redis URL; acting alone");
            return;
        }
    };
    let names = Names::new(&cfg.prefix);
    let mut mine = Mine::default();
    let mut link: Option<Link> = None;
    let mut tick = interval(cfg.timeout);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let renew_every = cfg.lease / 3;
    let mut renewed = Instant::now();
    let mut reconcile_at: Option<Instant> = None;
    // Logged once per outage (and once if Redis is not there at start).
    let mut alone_logged = false;
    ctx.set_connected(false);
    loop {
        let failed = tokio::select! {
            _ = stop.cancelled() => break,
            Some(own) = rx.recv() => {
                let Some(m) = mine.note(own, &ctx.fleet.name) else { continue };
                match link.as_mut() {
                    Some(l) => l.publish(&cfg, &names, &m, &mut mine, &ctx).await.err(),
                    None => None,
                }
            }
            msg = next(&mut link) => match msg {
                Some(payload) => {
                    receive(&ctx, &payload);
                    None
                }
                None => Some(LinkError::Ended),
            },
            _ = tick.tick() => match link.as_mut() {
                None => {
                    match join(&client, &cfg, &names, &mut mine, &ctx).await {
                        Ok(l) => {
                            link = Some(l);
                            renewed = Instant::now();
                            reconcile_at = Some(renewed + cfg.lease);
                            alone_logged = false;
                            ctx.set_connected(true);
                            tracing::info!(redis = %cfg.shown, name = %ctx.fleet.name, openings = mine.open.len(), "fleet: connected to Redis");
                        }
                        Err(e) if !alone_logged => {
                            alone_logged = true;
                            tracing::warn!(redis = %cfg.shown, error = %e, "fleet: Redis unreachable; acting alone until it answers");
                        }
                        Err(e) => tracing::debug!(error = %e, "fleet: Redis still unreachable"),
                    }
                    None
                }
                Some(l) => {
                    let renew = renewed.elapsed() >= renew_every;
                    let mut r = Ok(());
                    if renew {
                        renewed = Instant::now();
                        for m in mine.prune(&ctx.breakers, &ctx.fleet.name) {
                            if r.is_ok() {
                                r = l.publish(&cfg, &names, &m, &mut mine, &ctx).await;
                            }
                        }
                    }
                    if r.is_ok() {
                        r = l.check(&cfg, &names, &mine, renew).await;
                    }
                    if r.is_ok() && reconcile_at.is_some_and(|at| at <= Instant::now()) {
                        reconcile_at = Some(Instant::now() + cfg.lease);
                        r = l.reconcile(&cfg, &names, &ctx).await;
                    }
                    r.err()
                }
            },
        };
        if let Some(e) = failed {
            link = None;
            ctx.set_connected(false);
            alone_logged = true;
            tracing::warn!(redis = %cfg.shown, error = %e, "fleet: lost Redis; acting alone until it answers");
        }
    }
}

/// The next pub/sub payload; pending forever without a link.
async fn next(link: &mut Option<Link>) -> Option<Vec<u8>> {
    match link {
        Some(l) => l
            .messages
            .next()
            .await
            .map(|m| m.get_payload_bytes().to_vec()),
        None => std::future::pending().await,
    }
}

fn receive(ctx: &Ctx, payload: &[u8]) {
    match Message::decode(payload) {
        Ok(m) => {
            if ctx.apply(&m) {
                tracing::info!(ns = %m.ns, opener = %m.opener, kind = m.kind.as_str(), "fleet: applied another instance's breaker change");
            }
        }
        Err(why) => tracing::debug!(why, "fleet: message set aside"),
    }
}

/// Connects, subscribes, republishes this instance's openings and unsent closes, then
/// applies the openings the others have in Redis now.
async fn join(
    client: &Client,
    cfg: &FleetConfig,
    names: &Names,
    mine: &mut Mine,
    ctx: &Ctx,
) -> Result<Link, LinkError> {
    let conn = connect(client, cfg).await?;
    let mut pubsub = within(cfg.connect_timeout + cfg.timeout, client.get_async_pubsub()).await?;
    within(cfg.timeout, pubsub.subscribe(&names.channel)).await?;
    let (sink, messages) = pubsub.split();
    let mut link = Link {
        conn,
        sink,
        messages,
    };
    let mut pipe = redis::pipe();
    for m in mine.open.values() {
        let value = m.encode();
        pipe.cmd("SET")
            .arg(names.key(m))
            .arg(&value)
            .arg("PX")
            .arg(lease_ms(cfg))
            .ignore();
        pipe.cmd("PUBLISH").arg(&names.channel).arg(&value).ignore();
    }
    for ns in &mine.unsent_closes {
        let m = Message::new(Kind::Close, ns, &ctx.fleet.name, Reason::StaleRouting, "");
        pipe.cmd("DEL").arg(names.key(&m)).ignore();
        pipe.cmd("PUBLISH")
            .arg(&names.channel)
            .arg(m.encode())
            .ignore();
    }
    if !mine.open.is_empty() || !mine.unsent_closes.is_empty() {
        within(cfg.timeout, pipe.query_async::<()>(&mut link.conn)).await?;
    }
    mine.unsent_closes.clear();
    for m in link.scan(cfg, names).await? {
        if m.kind == Kind::Open && ctx.apply(&m) {
            tracing::info!(ns = %m.ns, opener = %m.opener, "fleet: applied an opening found in Redis");
        }
    }
    Ok(link)
}

fn lease_ms(cfg: &FleetConfig) -> u64 {
    cfg.lease.as_millis().max(1) as u64
}

impl Link {
    /// Publishes one of this instance's openings or closes (and sets or deletes its key).
    async fn publish(
        &mut self,
        cfg: &FleetConfig,
        names: &Names,
        m: &Message,
        mine: &mut Mine,
        ctx: &Ctx,
    ) -> Result<(), LinkError> {
        let value = m.encode();
        let mut pipe = redis::pipe();
        match m.kind {
            Kind::Open => pipe
                .cmd("SET")
                .arg(names.key(m))
                .arg(&value)
                .arg("PX")
                .arg(lease_ms(cfg))
                .ignore(),
            Kind::Close => pipe.cmd("DEL").arg(names.key(m)).ignore(),
        };
        pipe.cmd("PUBLISH").arg(&names.channel).arg(&value).ignore();
        within(cfg.timeout, pipe.query_async::<()>(&mut self.conn)).await?;
        if m.kind == Kind::Close {
            mine.unsent_closes.remove(&m.ns);
        }
        ctx.metrics.fleet.event("published", m.kind.as_str());
        tracing::info!(ns = %m.ns, kind = m.kind.as_str(), "fleet: published this instance's breaker change");
        Ok(())
    }

    /// PING, and when `renew`, the TTL of this instance's opening keys.
    async fn check(
        &mut self,
        cfg: &FleetConfig,
        names: &Names,
        mine: &Mine,
        renew: bool,
    ) -> Result<(), LinkError> {
        let mut pipe = redis::pipe();
        pipe.cmd("PING").ignore();
        if renew {
            for m in mine.open.values() {
                pipe.cmd("SET")
                    .arg(names.key(m))
                    .arg(m.encode())
                    .arg("PX")
                    .arg(lease_ms(cfg))
                    .ignore();
            }
        }
        within(cfg.timeout, pipe.query_async::<()>(&mut self.conn)).await?;
        within(cfg.timeout, self.sink.ping::<()>()).await
    }

    /// Every `lease`, from one `lease` after (re)joining (when every live opener has
    /// republished): breakers opened from the fleet whose opening is no longer in Redis were
    /// closed while this instance was away, or their opener died (its key expired): it
    /// closes them. Openings in Redis it does not have (a message it missed) it opens.
    async fn reconcile(
        &mut self,
        cfg: &FleetConfig,
        names: &Names,
        ctx: &Ctx,
    ) -> Result<(), LinkError> {
        let found = self.scan(cfg, names).await?;
        for m in found.iter().filter(|m| m.kind == Kind::Open) {
            if ctx.apply(m) {
                tracing::info!(ns = %m.ns, opener = %m.opener, "fleet: applied an opening found in Redis");
            }
        }
        for (ns, opener) in ctx.breakers.opened_by_fleet() {
            let still = found.iter().any(|m| m.ns == ns && *m.opener == *opener);
            let why = "its opening is no longer in Redis (closed while this instance was away, or its opener stopped)";
            let gone = Message::new(Kind::Close, &ns, &opener, Reason::StaleRouting, why);
            if !still && ctx.apply(&gone) {
                tracing::info!(ns = %ns, opener = %opener, "fleet: closed an opening no longer in Redis");
            }
        }
        Ok(())
    }

    /// The openings in Redis now (at most [`MAX_SCANNED`] keys).
    async fn scan(&mut self, cfg: &FleetConfig, names: &Names) -> Result<Vec<Message>, LinkError> {
        let pattern = format!("{}*", names.keys);
        let mut keys: Vec<String> = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, batch): (u64, Vec<String>) = within(
                cfg.timeout,
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(500)
                    .query_async(&mut self.conn),
            )
            .await?;
            keys.extend(batch);
            cursor = next;
            if cursor == 0 || keys.len() >= MAX_SCANNED {
                break;
            }
        }
        keys.truncate(MAX_SCANNED);
        let mut out = Vec::new();
        for chunk in keys.chunks(200) {
            let values: Vec<Option<Vec<u8>>> = within(
                cfg.timeout,
                redis::cmd("MGET").arg(chunk).query_async(&mut self.conn),
            )
            .await?;
            out.extend(
                values
                    .iter()
                    .flatten()
                    .filter_map(|v| Message::decode(v).ok()),
            );
        }
        Ok(out)
    }
}
