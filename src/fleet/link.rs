//! The fleet task's link to Redis: connect, hold this instance's name, put its openings and
//! closes in the index (`index.rs`) and renew them, poll the index every [`POLL`] and apply
//! the others' (`follow.rs`); on any failure act alone, log it once, and try again every
//! `timeout`.

use redis::aio::MultiplexedConnection;
use redis::Client;
use tokio::sync::mpsc;
use tokio::time::{interval, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::conn::{client, connect, LinkError, NAME_TRIES};
use super::follow::Followed;
use super::index::{Index, Polled};
use super::{Ctx, Heard, Kind, Message, Mine, POLL};
use crate::config::FleetConfig;

/// A live link.
struct Link {
    conn: MultiplexedConnection,
    /// The index's version as last read.
    version: String,
    joined: Instant,
    renewed: Instant,
    /// When the index is next read whole whatever its version.
    reconcile_at: Instant,
}

/// What the task keeps between links.
struct Task {
    ctx: Ctx,
    cfg: FleetConfig,
    index: Index,
    mine: Mine,
    followed: Followed,
}

/// The task: runs until `stop`.
pub(super) async fn run(
    ctx: Ctx,
    cfg: FleetConfig,
    mut rx: mpsc::Receiver<Heard>,
    stop: CancellationToken,
) {
    let client = match client(&cfg) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(redis = %cfg.shown, error = %e, "fleet: cannot use the Redis URL; acting alone");
            return;
        }
    };
    let mut t = Task {
        index: Index::new(&cfg.prefix),
        ctx,
        cfg,
        mine: Mine::default(),
        followed: Followed::default(),
    };
    let mut link: Option<Link> = None;
    let mut tick = interval(POLL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut next_join = Instant::now();
    // Logged once per outage (and once if Redis is not there at start).
    let mut alone_logged = false;
    t.ctx.set_connected(false);
    loop {
        let failed = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            Some(heard) = rx.recv() => t.heard(heard, link.as_mut()).await.err(),
            _ = tick.tick() => match link.as_mut() {
                Some(l) => {
                    // What the breakers said before this poll counts first: a close this
                    // instance's own samples made is not undone by the poll.
                    let mut r = Ok(());
                    while r.is_ok() {
                        let Ok(heard) = rx.try_recv() else { break };
                        r = t.heard(heard, Some(&mut *l)).await;
                    }
                    match r {
                        Ok(()) => t.round(l).await.err(),
                        Err(e) => Some(e),
                    }
                }
                None if Instant::now() < next_join => None,
                None => {
                    next_join = Instant::now() + t.cfg.timeout;
                    match t.join(&client).await {
                        Ok(l) => {
                            link = Some(l);
                            alone_logged = false;
                            t.ctx.set_connected(true);
                            tracing::info!(redis = %t.cfg.shown, name = %t.ctx.fleet.name(), openings = t.mine.open.len(), "fleet: connected to Redis");
                        }
                        Err(e) if !alone_logged => {
                            alone_logged = true;
                            tracing::warn!(redis = %t.cfg.shown, error = %e, "fleet: Redis unreachable; acting alone until it answers");
                        }
                        Err(e) => tracing::debug!(error = %e, "fleet: Redis still unreachable"),
                    }
                    None
                }
            },
        };
        if let Some(e) = failed {
            link = None;
            next_join = Instant::now() + t.cfg.timeout;
            t.ctx.set_connected(false);
            alone_logged = true;
            tracing::warn!(redis = %t.cfg.shown, error = %e, "fleet: lost Redis; acting alone until it answers");
        }
    }
    if let Some(mut l) = link {
        // A restart under the same name need not wait for the claim to expire.
        let name = t.ctx.fleet.name();
        let token = &t.ctx.fleet.token;
        let _ = t.index.release(&mut l.conn, &t.cfg, &name, token).await;
    }
}

impl Task {
    /// A transition the hook queued.
    async fn heard(&mut self, heard: Heard, link: Option<&mut Link>) -> Result<(), LinkError> {
        match heard {
            Heard::Own {
                ns,
                to,
                cause,
                reason,
            } => {
                let name = self.ctx.fleet.name();
                let Some(m) = self.mine.note(ns, to, cause, &reason, &name) else {
                    return Ok(());
                };
                match link {
                    Some(l) => self.publish(l, &m).await,
                    None => Ok(()),
                }
            }
            Heard::Contradicted { ns, opener } => {
                self.followed.contradicted(&self.ctx, ns, &opener);
                Ok(())
            }
        }
    }

    /// Puts one of this instance's openings or closes in the index.
    async fn publish(&mut self, l: &mut Link, m: &Message) -> Result<(), LinkError> {
        if !self.index.put(&mut l.conn, &self.cfg, m).await? {
            self.ctx.metrics.fleet.skipped("unusable_index", 1);
            tracing::warn!(prefix = %self.cfg.prefix, "fleet: the openings index holds keys of another type; nothing published");
            return Ok(());
        }
        if m.kind == Kind::Close
            && self
                .mine
                .unsent_closes
                .get(&m.ns)
                .is_some_and(|c| c.id == m.id)
        {
            self.mine.unsent_closes.remove(&m.ns);
        }
        self.ctx.metrics.fleet.event("published", m.kind.as_str());
        tracing::info!(ns = %m.ns, kind = m.kind.as_str(), id = %m.id, "fleet: published this instance's breaker change");
        Ok(())
    }

    /// Connects, holds a name, republishes this instance's openings and unsent closes, then
    /// applies the openings the others have in Redis now.
    async fn join(&mut self, client: &Client) -> Result<Link, LinkError> {
        let conn = connect(client, &self.cfg).await?;
        let now = Instant::now();
        let mut l = Link {
            conn,
            version: String::new(),
            joined: now,
            renewed: now,
            reconcile_at: now + self.cfg.lease,
        };
        self.hold_name(&mut l).await?;
        self.renew(&mut l).await?;
        let polled = self.index.poll(&mut l.conn, &self.cfg, "").await?;
        self.take(&mut l, polled, false);
        Ok(l)
    }

    /// One poll tick: renewals every third of `lease`, then the index when it changed (or
    /// whole, every `lease`).
    async fn round(&mut self, l: &mut Link) -> Result<(), LinkError> {
        let now = Instant::now();
        if now.saturating_duration_since(l.renewed) >= self.cfg.lease / 3 {
            l.renewed = now;
            self.hold_name(l).await?;
            for m in self.mine.prune(&self.ctx.breakers) {
                tracing::debug!(ns = %m.ns, "fleet: own opening no longer open here");
            }
            self.renew(l).await?;
        }
        let whole = now >= l.reconcile_at;
        if whole {
            l.reconcile_at = now + self.cfg.lease;
        }
        let known = if whole {
            String::new()
        } else {
            l.version.clone()
        };
        let polled = self.index.poll(&mut l.conn, &self.cfg, &known).await?;
        let settled = now.saturating_duration_since(l.joined) >= self.cfg.lease;
        self.take(l, polled, settled);
        Ok(())
    }

    /// Puts this instance's openings again (their expiry renewed) and its unsent closes.
    async fn renew(&mut self, l: &mut Link) -> Result<(), LinkError> {
        let all: Vec<Message> = self
            .mine
            .open
            .values()
            .chain(self.mine.unsent_closes.values())
            .cloned()
            .collect();
        for m in &all {
            if m.kind == Kind::Close {
                self.publish(l, m).await?;
            } else if !self.index.put(&mut l.conn, &self.cfg, m).await? {
                self.ctx.metrics.fleet.skipped("unusable_index", 1);
            }
        }
        Ok(())
    }

    /// What a poll found: counted, and applied when the index was read.
    fn take(&mut self, l: &mut Link, polled: Polled, settled: bool) {
        for (why, n) in polled.skipped.counts() {
            if n > 0 {
                self.ctx.metrics.fleet.skipped(why, n);
            }
        }
        if polled.skipped != Default::default() {
            tracing::debug!(skipped = ?polled.skipped, "fleet: index entries set aside");
        }
        l.version = polled.version;
        if let Some(read) = polled.read {
            let name = self.ctx.fleet.name();
            let absent_closes = settled && polled.complete;
            self.followed
                .apply(&self.ctx, &read, &self.mine, &name, absent_closes);
        }
    }

    /// Holds this instance's name, or a new one when another live instance holds it.
    async fn hold_name(&mut self, l: &mut Link) -> Result<(), LinkError> {
        let fleet = self.ctx.fleet.clone();
        let current = fleet.name();
        if self
            .index
            .claim(&mut l.conn, &self.cfg, &current, &fleet.token)
            .await?
        {
            return Ok(());
        }
        for _ in 0..NAME_TRIES {
            let id = super::message::new_id();
            let candidate = format!("{}-{}", fleet.configured, &id[..6]);
            if !self
                .index
                .claim(&mut l.conn, &self.cfg, &candidate, &fleet.token)
                .await?
            {
                continue;
            }
            fleet.set_name(&candidate);
            self.mine.rename(&candidate);
            self.ctx.metrics.fleet.name_conflict();
            tracing::warn!(name = %current, joined_as = %candidate, "fleet: another live instance holds this instance's name (two instances share one [fleet] name: the default is `listen`, the same on every sidecar of one ConfigMap); joined under a suffixed name. Give each instance its own [fleet] name");
            return Ok(());
        }
        Err(LinkError::NoName(current))
    }
}
