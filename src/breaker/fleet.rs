//! What the fleet (the `fleet` task, through Redis) may do to the breakers: be told of every
//! transition (a hook that must not block: the fleet task's channel), open a breaker on
//! another instance's evidence, and close a breaker it opened when that instance says its
//! own closed. The evidence rules stay per instance: an opening from the fleet is only
//! ever the word of an instance that met the rules itself, and it comes only from Redis,
//! never from a client.
//!
//! The fleet carries evidence, not verdicts: this instance's own samples weigh more than
//! another's word. A breaker the fleet opened that this instance's own answered samples
//! close reports that close like any (the fleet task then does not apply that opening
//! again); and the opener's close does not close a breaker whose own last sample here
//! failed recently: it stays open, as this instance's own, until its own samples close it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Breakers, Reason, State, Transition};
use crate::policy::NsPolicy;

/// What the hook runs.
type HookFn = dyn Fn(&str, &Transition) + Send + Sync;

/// How every close made by [`Breakers::close_from_fleet`] begins its reason.
const FLEET_CLOSE: &str = "closed by fleet instance ";

/// Whether `t` is a close the fleet made ([`Breakers::close_from_fleet`]), rather than one
/// this instance's own samples made.
pub fn closed_by_fleet(t: &Transition) -> bool {
    t.to == State::Closed && t.reason.starts_with(FLEET_CLOSE)
}

/// What [`Breakers::close_from_fleet`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FleetClose {
    /// Closed.
    Closed(Transition),
    /// Kept open: this instance's own last sample failed within the namespace's `window`.
    /// The breaker is this instance's own from now on and closes on its own samples.
    Kept,
    /// Not open on that opener's word (closed already, opened here, held, another opener).
    NotTheirs,
}

/// This breaker's own recent samples, as the fleet weighs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnSamples {
    /// Samples answered in a row here, since the last failed one.
    pub answered_in_a_row: u32,
    /// When the last one failed, when the last one did (none once one is answered).
    pub last_failed: Option<Instant>,
}

/// Told of each transition (namespace, transition), after it is logged and counted.
pub(super) struct Hook(Box<HookFn>);

impl Hook {
    pub(super) fn call(&self, ns: &str, t: &Transition) {
        (self.0)(ns, t)
    }
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

impl Breakers {
    /// Sets the transition hook (once; a second call is ignored and returns false).
    pub fn set_hook(&self, hook: impl Fn(&str, &Transition) + Send + Sync + 'static) -> bool {
        self.hook.set(Hook(Box::new(hook))).is_ok()
    }

    /// Opens `ns` on the word of fleet instance `opener`, which opened its own on `evidence`
    /// (its transition's reason). Nothing when the breaker is open already (it keeps its
    /// reason) or the map has no room. The breaker then samples and closes as one opened
    /// here would (under `policy`), or when `opener` publishes its close.
    pub fn open_from_fleet(
        &self,
        ns: &str,
        policy: &NsPolicy,
        cause: Reason,
        opener: &str,
        evidence: &str,
        now: Instant,
    ) -> Option<Transition> {
        let t = {
            let mut b = self.slot(ns, now)?;
            if b.state != State::Closed {
                return None;
            }
            b.opener = Some(Arc::from(opener));
            let why = format!("opened by fleet instance {opener}: {evidence}");
            Some(self.moved(b.open(cause, why, now, policy.min_cooldown)))
        };
        self.report(ns, t)
    }

    /// The open breakers a fleet opening opened, with their opener.
    pub fn opened_by_fleet(&self) -> Vec<(String, Arc<str>)> {
        self.map
            .iter()
            .filter(|b| b.state == State::Open)
            .filter_map(|b| Some((b.key().clone(), b.opener.clone()?)))
            .collect()
    }

    /// This breaker's own samples since it opened; none when it is not open.
    pub fn own_samples(&self, ns: &str) -> Option<OwnSamples> {
        let b = self.map.get(ns)?;
        (b.state == State::Open).then_some(OwnSamples {
            answered_in_a_row: b.streak.count,
            last_failed: b.last_failed,
        })
    }

    /// Closes `ns` when fleet instance `opener`'s opening opened it and it is still open
    /// on that word alone (not held by the write-stall watch), unless its own last sample
    /// here failed within `recent` (the namespace's `window`): then it keeps it open as its
    /// own. `why`: the opener's close reason, or why its opening is gone.
    pub fn close_from_fleet(
        &self,
        ns: &str,
        opener: &str,
        why: &str,
        recent: Duration,
        now: Instant,
    ) -> FleetClose {
        let t = {
            let Some(mut b) = self.map.get_mut(ns) else {
                return FleetClose::NotTheirs;
            };
            if b.state != State::Open || b.held || b.opener.as_deref() != Some(opener) {
                return FleetClose::NotTheirs;
            }
            let failed_here = b
                .last_failed
                .is_some_and(|at| now.saturating_duration_since(at) <= recent);
            if failed_here {
                b.opener = None;
                b.last_reason = format!(
                    "kept open: its own last sample failed within {recent:?} when fleet instance {opener} closed ({why})"
                );
                tracing::info!(ns = %ns, opener = %opener, "fleet: close not applied: this instance's own last sample failed");
                return FleetClose::Kept;
            }
            let why = format!("{FLEET_CLOSE}{opener}: {why}");
            self.moved(b.close(why, now))
        };
        match self.report(ns, Some(t)) {
            Some(t) => FleetClose::Closed(t),
            None => FleetClose::NotTheirs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::{Counted, Sample};
    use crate::policy::Mode;
    use std::sync::Mutex;
    use std::time::Duration;

    const NS: &str = "pay.tx";

    #[test]
    fn a_fleet_opening_opens_closes_on_its_opener_and_is_reported() {
        let b = Breakers::default();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        assert!(b.set_hook(move |ns, t| {
            let opener = t.opener.as_deref().map(str::to_string);
            sink.lock().unwrap().push((ns.to_string(), t.to, opener));
        }));
        let p = NsPolicy::with_defaults(NS, Mode::Strict);
        let t0 = Instant::now();
        let t = b
            .open_from_fleet(NS, &p, Reason::TimeLimit, "sg-1", "3 errors", t0)
            .expect("opens");
        assert_eq!(t.reason, "opened by fleet instance sg-1: 3 errors");
        assert_eq!(t.cause, Reason::TimeLimit);
        assert!(b
            .open_from_fleet(NS, &p, Reason::TimeLimit, "sg-2", "x", t0)
            .is_none());
        let w = Duration::from_secs(10);
        assert_eq!(
            b.close_from_fleet(NS, "sg-2", "x", w, t0),
            FleetClose::NotTheirs,
            "not its opener"
        );
        let FleetClose::Closed(t) = b.close_from_fleet(NS, "sg-1", "x", w, t0) else {
            panic!("closes");
        };
        assert_eq!(t.opener.as_deref(), Some("sg-1"));
        assert!(closed_by_fleet(&t));
        assert_eq!(b.state(NS), State::Closed);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].2.as_deref(), Some("sg-1"));
    }

    #[test]
    fn own_evidence_and_own_samples_are_not_the_fleet_s() {
        let b = Breakers::default();
        let mut p = NsPolicy::with_defaults(NS, Mode::Strict);
        p.close_after = 2;
        p.min_connections = 1;
        let t0 = Instant::now();
        b.open_from_fleet(NS, &p, Reason::StaleRouting, "sg-1", "e", t0);
        // Its own samples close it (the opener's word is gone with the close).
        let first = t0 + Duration::from_secs(1);
        assert!(b.sampled(NS, &p, Sample::Answered, 1, first).is_none());
        let t = b
            .sampled(NS, &p, Sample::Answered, 1, t0 + Duration::from_secs(2))
            .expect("closes on a streak");
        assert_eq!(t.opener.as_deref(), Some("sg-1"));
        assert!(!closed_by_fleet(&t), "its own samples closed it");
        // Opened on its own errors: no opener, and the fleet's close does nothing.
        p.threshold = 1;
        let e = Counted {
            policy: &p,
            reason: Reason::StaleRouting,
            what: "13388",
            conn: 1,
        };
        let t = b.record_failure("pay.other", &e, t0).expect("opens");
        assert!(t.opener.is_none());
        let w = Duration::from_secs(10);
        assert_eq!(
            b.close_from_fleet("pay.other", "sg-1", "x", w, t0),
            FleetClose::NotTheirs
        );
    }

    /// Issue 29, item 4: the opener's close does not close a breaker whose own last sample
    /// failed recently; an old failure, or an answer since, lets it close.
    #[test]
    fn the_openers_close_does_not_close_what_failed_here() {
        let b = Breakers::default();
        let p = NsPolicy::with_defaults(NS, Mode::Strict);
        let w = p.window;
        let t0 = Instant::now();
        b.open_from_fleet(NS, &p, Reason::StaleRouting, "sg-1", "e", t0);
        assert_eq!(
            b.own_samples(NS),
            Some(OwnSamples {
                answered_in_a_row: 0,
                last_failed: None
            })
        );
        let failed = t0 + Duration::from_secs(1);
        b.sampled(NS, &p, Sample::Failed, 7, failed);
        assert_eq!(b.own_samples(NS).and_then(|o| o.last_failed), Some(failed));
        let close = t0 + Duration::from_secs(3);
        assert_eq!(
            b.close_from_fleet(NS, "sg-1", "healed", w, close),
            FleetClose::Kept
        );
        assert_eq!(b.state(NS), State::Open);
        // Its own now: the opener's later word changes nothing, its own samples close it.
        assert_eq!(
            b.close_from_fleet(NS, "sg-1", "again", w, close + w * 2),
            FleetClose::NotTheirs
        );
        assert!(b.opened_by_fleet().is_empty());
        // Another opening: failed long ago, or answered since: the close applies.
        b.open_from_fleet("pay.b", &p, Reason::StaleRouting, "sg-1", "e", t0);
        b.sampled("pay.b", &p, Sample::Failed, 7, t0);
        let late = t0 + w + Duration::from_millis(1);
        assert!(matches!(
            b.close_from_fleet("pay.b", "sg-1", "x", w, late),
            FleetClose::Closed(_)
        ));
        b.open_from_fleet("pay.c", &p, Reason::StaleRouting, "sg-1", "e", t0);
        b.sampled("pay.c", &p, Sample::Failed, 7, t0);
        b.sampled(
            "pay.c",
            &p,
            Sample::Answered,
            8,
            t0 + Duration::from_millis(10),
        );
        assert_eq!(
            b.own_samples("pay.c")
                .map(|o| (o.answered_in_a_row, o.last_failed)),
            Some((1, None))
        );
        assert!(matches!(
            b.close_from_fleet("pay.c", "sg-1", "x", w, t0 + Duration::from_millis(20)),
            FleetClose::Closed(_)
        ));
    }
}
