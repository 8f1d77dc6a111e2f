//! The other instances' openings and closes, as found in the index, applied here under this
//! instance's own word: the fleet carries evidence, not verdicts.
//!
//! - Each opening applied is remembered by its identity. When this instance's own answered
//!   samples close a breaker that an opening opened, that opening is *contradicted* here and
//!   is not applied again while it stands (an instance whose clients hold their breaker
//!   open cannot keep reopening it here); the opener's next opening, new evidence, is.
//! - The opener's close, or its opening gone from Redis (expired: its opener stopped), closes
//!   the breaker here unless its own last sample here failed within the namespace's
//!   `window`: then it stays open as this instance's own (`breaker::FleetClose::Kept`).
//!
//! Both maps are bounded by the breakers: an entry exists only for a breaker the fleet
//! opened (or contradicted) here, and entries whose opening left the index are dropped.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::{Ctx, Kind, Message, Mine};
use crate::breaker::FleetClose;
use crate::config::Mode;

/// The window weighed for a namespace that lost its policy (the default `window`).
const DEFAULT_RECENT: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub(super) struct Followed {
    /// The openings that opened a breaker here: namespace -> (opener, id).
    applied: HashMap<String, (String, String)>,
    /// Openings this instance's own samples contradicted: namespace -> id.
    contradicted: HashMap<String, String>,
}

impl Followed {
    /// Applies the index as read whole. `absent_closes`: the read is complete and every live
    /// opener has had the time to publish (one `lease` after joining), so a breaker the
    /// fleet opened whose opening is not there closes.
    pub(super) fn apply(
        &mut self,
        ctx: &Ctx,
        read: &[Message],
        mine: &Mine,
        name: &str,
        absent_closes: bool,
    ) {
        let others = read
            .iter()
            .filter(|m| m.opener != name && !mine.has_id(&m.id));
        for m in others {
            match m.kind {
                Kind::Open => self.open(ctx, m),
                Kind::Close => self.close(ctx, &m.ns, &m.opener, &m.evidence),
            }
        }
        if !absent_closes {
            return;
        }
        let standing = |ns: &str, opener: &str| {
            read.iter()
                .any(|m| m.kind == Kind::Open && m.ns == ns && m.opener == opener)
        };
        for (ns, opener) in ctx.breakers.opened_by_fleet() {
            if !standing(&ns, &opener) {
                let why = "its opening is no longer in Redis (closed while this instance was away, or its opener stopped)";
                self.close(ctx, &ns, &opener, why);
            }
        }
        self.contradicted.retain(|ns, id| {
            read.iter()
                .any(|m| m.kind == Kind::Open && m.ns == *ns && m.id == *id)
        });
        let opened = ctx.breakers.opened_by_fleet();
        self.applied
            .retain(|ns, (opener, _)| opened.iter().any(|(n, o)| n == ns && **o == **opener));
    }

    /// This instance's own samples closed the breaker that `opener`'s opening of `ns`
    /// opened: that opening is not applied here again.
    pub(super) fn contradicted(&mut self, ctx: &Ctx, ns: String, opener: &str) {
        let Some((by, id)) = self.applied.remove(&ns) else {
            return;
        };
        if by != opener {
            return;
        }
        tracing::info!(ns = %ns, opener = %opener, id = %id, "fleet: this instance's own samples closed a breaker the fleet opened; that opening is not applied here again");
        ctx.metrics.fleet.event("contradicted", "open");
        self.contradicted.insert(ns, id);
    }

    fn open(&mut self, ctx: &Ctx, m: &Message) {
        if self.contradicted.get(&m.ns) == Some(&m.id) {
            return;
        }
        // Applied here before, and its breaker closed since without the fleet's close (which
        // forgets the entry): this instance's own samples closed it, even when their word has
        // not reached this task yet. Not applied again.
        let same = |(by, id): &(String, String)| *by == m.opener && *id == m.id;
        if self.applied.get(&m.ns).is_some_and(same) {
            let open_here = ctx
                .breakers
                .opened_by_fleet()
                .iter()
                .any(|(ns, by)| *ns == m.ns && **by == *m.opener);
            if !open_here {
                self.contradicted(ctx, m.ns.clone(), &m.opener);
            }
            return;
        }
        let config = ctx.config.load();
        let (db, coll) = m.db_coll();
        let Some(policy) = config.policy.lookup(db, coll) else {
            return;
        };
        if policy.mode == Mode::Passthrough {
            return;
        }
        let b = &ctx.breakers;
        let now = Instant::now();
        if b.open_from_fleet(&m.ns, policy, m.cause(), &m.opener, &m.evidence, now)
            .is_none()
        {
            return;
        }
        ctx.metrics.fleet.event("applied", "open");
        tracing::info!(ns = %m.ns, opener = %m.opener, id = %m.id, "fleet: applied another instance's opening");
        self.applied
            .insert(m.ns.clone(), (m.opener.clone(), m.id.clone()));
    }

    fn close(&mut self, ctx: &Ctx, ns: &str, opener: &str, why: &str) {
        let recent = {
            let config = ctx.config.load();
            let (db, coll) = ns.split_once('.').unwrap_or((ns, ""));
            config
                .policy
                .lookup(db, coll)
                .map_or(DEFAULT_RECENT, |p| p.window)
        };
        match ctx
            .breakers
            .close_from_fleet(ns, opener, why, recent, Instant::now())
        {
            FleetClose::Closed(_) => {
                ctx.metrics.fleet.event("applied", "close");
                tracing::info!(ns = %ns, opener = %opener, "fleet: applied another instance's close");
                self.applied.remove(ns);
            }
            FleetClose::Kept => {
                ctx.metrics.fleet.event("declined", "close");
                self.applied.remove(ns);
            }
            FleetClose::NotTheirs => {}
        }
    }
}
