//! What the fleet (the `fleet` task, through Redis) may do to the breakers: be told of every
//! transition (a hook that must not block: the fleet task's channel), open a breaker on
//! another instance's evidence, and close a breaker it opened when that instance says its
//! own closed. The evidence rules stay per instance: an opening from the fleet is only
//! ever the word of an instance that met the rules itself, and it comes only from Redis,
//! never from a client.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Breakers, Reason, State, Transition};
use crate::policy::NsPolicy;

/// What the hook runs.
type HookFn = dyn Fn(&str, &Transition) + Send + Sync;

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

    /// Closes `ns` when fleet instance `opener`'s opening opened it and it is still open
    /// on that word alone (not held by the write-stall watch); `why`: the opener's close
    /// reason, or why its opening is gone.
    pub fn close_from_fleet(
        &self,
        ns: &str,
        opener: &str,
        why: &str,
        now: Instant,
    ) -> Option<Transition> {
        let t = {
            let mut b = self.map.get_mut(ns)?;
            if b.state != State::Open || b.held || b.opener.as_deref() != Some(opener) {
                return None;
            }
            let why = format!("closed by fleet instance {opener}: {why}");
            Some(self.moved(b.close(why, now)))
        };
        self.report(ns, t)
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
        assert!(
            b.close_from_fleet(NS, "sg-2", "x", t0).is_none(),
            "not its opener"
        );
        let t = b.close_from_fleet(NS, "sg-1", "x", t0).expect("closes");
        assert_eq!(t.opener.as_deref(), Some("sg-1"));
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
        assert!(b.close_from_fleet("pay.other", "sg-1", "x", t0).is_none());
    }
}
