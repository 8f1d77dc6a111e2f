//! One followed read, from its request to its last reply: [`Followed`] owns the read's
//! attempt (`policy::Attempt`: its rung, the rungs ahead, its budget), its ladder slot, its
//! timing, its namespace and policy, and the request as opened on arrival. Its next step
//! after a reply is a method on it, [`Followed::settle`], which returns what to do
//! ([`Next`]); the handler only carries that out (bytes, sends, breaker calls, the meter).
//!
//! ```text
//!   request.rs  Followed::first ──▶ Reads ──▶ reply.rs: Arrival::Read
//!                                               │ policy::judge(f.read(), ending) → Verdict
//!                                               ▼
//!                                   Followed::settle(verdict, relayed, claim) → Next
//!                                     Reply | FailFast | Resend | Ask | NoTime | Silent
//!   reply.rs  Resend: Followed::sent ──▶ Reads (followed again, on its new rung)
//!             Ask:    parked in Reads until the cluster answers (Followed::answered)
//! ```

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::command::{CommandInfo, ReadPrefMode};
use crate::policy::{self, Attempt, ErrorReply, Members, NsPolicy, Rung, Then, Verdict};
use crate::rewrite::RewriteSpec;
use crate::upstream::LadderPermit;
use crate::wire::Request;

/// How long past an attempt's `maxTimeMS` mongos may take to answer before staleguard
/// answers the client itself (mongos checks its limit between steps, and the reply has a
/// network to cross).
pub(super) const SILENT_GRACE: Duration = Duration::from_secs(1);

/// A read whose replies the session judges. Boxed: it moves from the request side into the
/// pending reads, out at its reply, through the gate and `settle` and back for a resend, and
/// a move of the box is a pointer's (the state is some 350 bytes; moved by value, it cost a
/// `memcpy` per move, six or more per round trip).
#[derive(Debug)]
pub(super) struct Followed(Box<State>);

/// What a [`Followed`] knows of its read.
#[derive(Debug)]
pub(super) struct State {
    request_id: i32,
    /// Shared with the session's last followed namespace: no allocation per read.
    ns: Arc<str>,
    /// Borrowed from the metrics' command list when there (every read command is).
    command: Cow<'static, str>,
    policy: Arc<NsPolicy>,
    /// The client's request as opened on arrival (a resend is rewritten from it, with no
    /// second header read or decompression).
    original: Request,
    /// When mongos could start its first attempt: the read's budget runs from here.
    started: Instant,
    /// When mongos could start the attempt in flight (nothing sent before it was still
    /// waiting); `None`: not yet.
    began: Option<Instant>,
    attempt: Attempt,
    /// Which members may answer it (what its success says about the secondaries).
    members: Members,
    /// Its read preference mode (a confirming read uses the same, without tags).
    pref: Option<ReadPrefMode>,
    /// The upstream's ladder slot, held while the primary rung is in flight.
    permit: Option<LadderPermit>,
    /// Its place among the requests sent upstream that expect a final reply (`Peers`).
    seq: u64,
    /// A repeated `_id` in its result can only be an orphan (`CommandInfo::unique_ids`).
    unique_ids: bool,
    /// A dry run's read: a rung it would climb is counted, not climbed.
    dry: bool,
    /// What each attempt under an open breaker's bound met (a code; none: no reply).
    met: [Option<i32>; 2],
    met_len: u8,
    /// The `maxTimeMS` the attempt in flight went out with (its own or staleguard's): past
    /// it and [`SILENT_GRACE`], mongos is silent.
    limit_ms: Option<i64>,
    /// Answered by staleguard because mongos stayed silent: its late reply is dropped.
    expired: bool,
}

/// The box of a followed read that ended, emptied of what it held (its request, its slot),
/// kept by the session for its next followed read: a read costs no allocation of its own.
#[derive(Debug)]
pub(super) struct Spare(Box<State>);

impl State {
    /// What [`Followed::first`] makes of a new read, written over a spare's (every field
    /// named: one added to `State` is a compile error here until it is written).
    fn fill(&mut self, f: First<'_>) {
        let State {
            request_id,
            ns,
            command,
            policy,
            original,
            started,
            began,
            attempt,
            members,
            pref,
            permit,
            seq,
            unique_ids,
            dry,
            met,
            met_len,
            limit_ms,
            expired,
        } = self;
        let info = f.info;
        *request_id = f.req.request_id();
        *ns = f.ns;
        *command = command_name(info.name);
        *policy = f.policy;
        *original = f.req.clone();
        *started = f.now;
        *began = f.at_once.then_some(f.now);
        *attempt = f.attempt;
        *members = Members {
            tagged: info.read_pref_tags,
            secondary_answers: info.secondary_answers(),
        };
        *pref = info.read_pref;
        *permit = f.permit;
        *seq = f.seq;
        *unique_ids = info.unique_ids;
        *dry = f.dry;
        *met = [None; 2];
        *met_len = 0;
        *limit_ms = f.limit_ms;
        *expired = false;
    }
}

impl std::ops::Deref for Followed {
    type Target = State;

    fn deref(&self) -> &State {
        &self.0
    }
}

impl std::ops::DerefMut for Followed {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.0
    }
}

/// What the handler does after a followed read's reply (or its end without one).
#[derive(Debug)]
pub(super) enum Next {
    /// The reply goes to the client as it came (or, with none, nothing more happens).
    Reply,
    /// The reply is replaced by staleguard's fail-fast error.
    FailFast(ErrorReply),
    /// The reply is swallowed and the read sent again, from the original request, edited
    /// by the spec, to the rung; once sent it is followed again ([`Followed::sent`]).
    Resend(Followed, Rung, RewriteSpec),
    /// The reply is swallowed until the cluster answers a question about it (a cheap read
    /// of the namespace): the read waits, and [`Followed::answered`] settles it then.
    Ask(Followed),
    /// A rung was due but the read's budget is spent: the reply goes to the client.
    NoTime(Rung),
    /// mongos stayed silent: the client gets this error; the read stays followed (expired)
    /// so that its late reply is dropped.
    Silent(Followed, ErrorReply),
}

/// What the request side knows of a read it follows.
pub(super) struct First<'a> {
    pub(super) req: &'a Request,
    pub(super) info: &'a CommandInfo<'a>,
    pub(super) ns: Arc<str>,
    pub(super) policy: Arc<NsPolicy>,
    pub(super) attempt: Attempt,
    pub(super) permit: Option<LadderPermit>,
    /// `maxTimeMS` as sent (the client's, or the one staleguard wrote).
    pub(super) limit_ms: Option<i64>,
    pub(super) seq: u64,
    pub(super) now: Instant,
    /// mongos can start it at once (nothing sent before it waits for its reply).
    pub(super) at_once: bool,
    pub(super) dry: bool,
}

impl Followed {
    /// The read as its first attempt goes out, in `spare` when there is one.
    pub(super) fn first(f: First<'_>, spare: Option<Spare>) -> Followed {
        match spare {
            // Written in place, field by field: no state built aside and copied in.
            Some(Spare(mut b)) => {
                b.fill(f);
                Followed(b)
            }
            None => {
                let info = f.info;
                Followed(Box::new(State {
                    request_id: f.req.request_id(),
                    ns: f.ns,
                    command: command_name(info.name),
                    policy: f.policy,
                    original: f.req.clone(),
                    started: f.now,
                    began: f.at_once.then_some(f.now),
                    attempt: f.attempt,
                    members: Members {
                        tagged: info.read_pref_tags,
                        secondary_answers: info.secondary_answers(),
                    },
                    pref: info.read_pref,
                    permit: f.permit,
                    seq: f.seq,
                    unique_ids: info.unique_ids,
                    dry: f.dry,
                    met: [None; 2],
                    met_len: 0,
                    limit_ms: f.limit_ms,
                    expired: false,
                }))
            }
        }
    }

    /// The read is over: its box, emptied (its request, its slot given back).
    fn into_spare(self) -> Spare {
        let mut b = self.0;
        b.original = Request::default();
        b.permit = None;
        b.command = Cow::Borrowed("");
        Spare(b)
    }

    /// The read as `policy::judge` sees its attempt in flight.
    pub(super) fn read(&self) -> policy::Read<'_> {
        self.attempt
            .read(&self.policy, self.started, self.began, self.members)
    }

    pub(super) fn request_id(&self) -> i32 {
        self.request_id
    }

    pub(super) fn ns(&self) -> &Arc<str> {
        &self.ns
    }

    pub(super) fn command(&self) -> &str {
        &self.command
    }

    pub(super) fn policy(&self) -> &Arc<NsPolicy> {
        &self.policy
    }

    pub(super) fn pref(&self) -> Option<ReadPrefMode> {
        self.pref
    }

    pub(super) fn original(&self) -> &Request {
        &self.original
    }

    pub(super) fn rung(&self) -> Rung {
        self.attempt.rung
    }

    /// Admitted while its breaker was open (and not yet past its first attempt).
    pub(super) fn sample(&self) -> bool {
        self.attempt.sample && self.attempt.rung == Rung::First
    }

    pub(super) fn holds_slot(&self) -> bool {
        self.permit.is_some()
    }

    pub(super) fn dry(&self) -> bool {
        self.dry
    }

    pub(super) fn started(&self) -> Instant {
        self.started
    }

    /// Its reply is looked at for documents returned twice (an `available` answer whose
    /// `_id`s must be unique).
    pub(super) fn scans_orphans(&self) -> bool {
        self.attempt.rung == Rung::Available && self.unique_ids
    }

    /// Answered by reply number `seq` with `response_to` (both must match: a reply to
    /// another request that reused its id never stands for it).
    pub(super) fn answered_by(&self, response_to: i32, seq: u64) -> bool {
        self.request_id == response_to && self.seq == seq
    }

    /// Its turn for a reply has passed (`finals_in` final replies came).
    pub(super) fn passed(&self, finals_in: u64) -> bool {
        self.seq <= finals_in
    }

    pub(super) fn expired(&self) -> bool {
        self.expired
    }

    /// Request `next` may start now at mongos: if it is this read, its attempt begins (a
    /// first attempt's budget, like its `maxTimeMS`, runs from then).
    pub(super) fn begins(&mut self, next: u64, now: Instant) {
        if self.began.is_none() && self.seq == next {
            self.began = Some(now);
            if self.attempt.rung == Rung::First && !self.attempt.asked {
                self.started = now;
            }
        }
    }

    /// When mongos, silent until then, is past the attempt's limit and the grace (`None`:
    /// no limit, or it has not started the attempt, or staleguard answered already).
    pub(super) fn deadline(&self) -> Option<Instant> {
        let limit = u64::try_from(self.limit_ms?).ok()?;
        let began = self.began.filter(|_| !self.expired)?;
        began.checked_add(Duration::from_millis(limit) + SILENT_GRACE)
    }

    /// The head of its reply arrived (a large reply, passed on in pieces): what needed only
    /// mongos's answer happens now. Its primary-rung slot is given back; true when it is a
    /// sample whose probe slot the breaker can let go of (its outcome still counts at the
    /// last piece).
    pub(super) fn head(&mut self) -> bool {
        self.permit = None;
        self.sample()
    }

    /// Its next step, by `verdict` (judged on its reply; `met`: the trigger code its
    /// attempt met). `relayed`: the reply already went to the client, so it stands
    /// whatever the verdict says. `claim` asks the upstream's guard for a primary-rung
    /// slot, when the step climbs there.
    pub(super) fn settle(
        self,
        verdict: &Verdict<'_>,
        relayed: bool,
        claim: impl FnOnce(&Followed) -> Option<LadderPermit>,
    ) -> Next {
        self.settle_spare(verdict, relayed, claim).0
    }

    /// [`Followed::settle`], with the read's box when the step needs the read no more.
    pub(super) fn settle_spare(
        mut self,
        verdict: &Verdict<'_>,
        relayed: bool,
        claim: impl FnOnce(&Followed) -> Option<LadderPermit>,
    ) -> (Next, Option<Spare>) {
        let then = match relayed {
            true => verdict.then.clone().relayed(),
            false => verdict.then.clone(),
        };
        if self.attempt.rung != Rung::First {
            // A rung ended: its guard slot is freed.
            self.permit = None;
        }
        if self.attempt.bounded.is_some() && usize::from(self.met_len) < self.met.len() {
            let n = usize::from(self.met_len);
            self.met[n] = verdict.met;
            self.met_len += 1;
        }
        let next = match then {
            Then::Reply => return (Next::Reply, Some(self.into_spare())),
            Then::NoTime(rung) => return (Next::NoTime(rung), Some(self.into_spare())),
            Then::FailFast(b) => {
                let bound = self.policy.open_time_limit;
                let met = &self.met[..usize::from(self.met_len)];
                let reply = policy::bounded_fail_reply(&self.ns, b.reason, b.errors, bound, met);
                return (Next::FailFast(reply), Some(self.into_spare()));
            }
            Then::Confirm => Next::Ask(self),
            Then::Silent => {
                let reply = match self.attempt.bounded {
                    // Under an open breaker's bound: the fail-fast error, naming the silence.
                    Some(b) => {
                        let bound = self.policy.open_time_limit;
                        let met = &self.met[..usize::from(self.met_len)];
                        policy::bounded_fail_reply(&self.ns, b.reason, b.errors, bound, met)
                    }
                    None => {
                        let waited = self.began.map_or(Duration::ZERO, |b| b.elapsed());
                        let limit = self.limit_ms.unwrap_or(0).max(0) as u64;
                        policy::silent_reply(&self.ns, Duration::from_millis(limit), waited)
                    }
                };
                self.expired = true;
                Next::Silent(self, reply)
            }
            Then::Climb {
                to: Rung::Primary, ..
            } => match claim(&self) {
                Some(permit) => {
                    self.permit = Some(permit);
                    self.climb(then)
                }
                None => self.climb(then.refused()),
            },
            climb => self.climb(climb),
        };
        (next, None)
    }

    fn climb(mut self, then: Then) -> Next {
        match then {
            Then::Climb { to, spec, .. } => {
                if to == Rung::Available {
                    self.permit = None;
                }
                Next::Resend(self, to, spec)
            }
            // A refused primary rung with nothing after it.
            _ => Next::Reply,
        }
    }

    /// The cluster answered the question its time limit raised (`confirmed`: the cheap read
    /// failed too), `now`: its next step, as [`Followed::settle`] would give it.
    pub(super) fn answered(
        self,
        confirmed: bool,
        now: Instant,
        claim: impl FnOnce(&Followed) -> Option<LadderPermit>,
    ) -> Next {
        let elapsed = now.saturating_duration_since(self.started);
        let then = policy::after_confirm(&self.read(), confirmed, elapsed);
        let verdict = Verdict {
            word: policy::Word::Neutral(None),
            then,
            met: None,
        };
        self.settle(&verdict, false, claim)
    }

    /// The resend to `to`, edited by `spec`, went out at place `seq` (`at_once`: mongos can
    /// start it now): it is followed as that attempt.
    pub(super) fn sent(&mut self, to: Rung, spec: &RewriteSpec, seq: u64, at_once: bool) {
        self.attempt = self.attempt.climbed(to, spec);
        self.seq = seq;
        self.began = at_once.then(Instant::now);
        // A resend without a limit in its spec has none: the read had no budget.
        self.limit_ms = spec.max_time_ms;
    }
}

/// A followed read's command name without an allocation when the metrics know it (every
/// read command the policy follows does).
fn command_name(name: &str) -> Cow<'static, str> {
    let known = crate::metrics::Metrics::command_label(name);
    if known == name {
        Cow::Borrowed(known)
    } else {
        Cow::Owned(name.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bson::rawdoc;

    use super::*;
    use crate::config::LadderGuardConfig;
    use crate::policy::{Bounded, Mode, Reason, Word};
    use crate::upstream::LadderGuard;

    fn request(body: bson::RawDocumentBuf) -> Request {
        let msg = crate::wire::reply::op_msg(7, 0, 0, &body);
        Request::new(msg, 1 << 20).expect("a valid request")
    }

    fn find() -> Request {
        request(rawdoc! {
            "find": "inventory", "filter": {}, "maxTimeMS": 1000_i32, "$db": "demo",
            "$readPreference": {"mode": "secondaryPreferred"},
        })
    }

    /// A followed read of `policy` on `attempt`, sent at place 1 at `now`.
    fn followed(policy: NsPolicy, attempt: Attempt, now: Instant) -> Followed {
        let req = find();
        let info = crate::command::classify_request(&req).expect("classified");
        Followed::first(
            First {
                req: &req,
                info: &info,
                ns: Arc::from("demo.inventory"),
                policy: Arc::new(policy),
                attempt,
                permit: None,
                limit_ms: Some(500),
                seq: 1,
                now,
                at_once: true,
                dry: false,
            },
            None,
        )
    }

    fn first(primary: bool, retry: bool) -> Attempt {
        Attempt {
            rung: Rung::First,
            primary,
            retry,
            sample: false,
            bounded: None,
            limit_ours: true,
            budget_ms: Some(1000),
            asked: false,
        }
    }

    fn verdict(then: Then, met: Option<i32>) -> Verdict<'static> {
        Verdict {
            word: Word::Neutral(None),
            then,
            met,
        }
    }

    fn permit() -> Option<LadderPermit> {
        let guard = Arc::new(LadderGuard::default());
        guard
            .try_acquire(LadderGuardConfig::default(), Instant::now())
            .ok()
    }

    fn kind(n: &Next) -> String {
        match n {
            Next::Reply => "reply".into(),
            Next::FailFast(r) => format!("fail_fast {}", r.code),
            Next::Resend(f, to, _) => format!("resend {} slot={}", to.as_str(), f.holds_slot()),
            Next::Ask(_) => "ask".into(),
            Next::NoTime(r) => format!("no_time {}", r.as_str()),
            Next::Silent(f, r) => format!("silent {} expired={}", r.code, f.expired()),
        }
    }

    /// Each verdict's next step, as `policy::judge`'s table gives verdicts: the session only
    /// carries these out.
    #[test]
    fn settle_table() {
        let t0 = Instant::now();
        let fallback = NsPolicy::with_defaults("demo.inventory", Mode::Fallback);
        let strict = NsPolicy::with_defaults("pay.transactions", Mode::Strict);
        let available = RewriteSpec {
            available: true,
            max_time_ms: Some(400),
            ..RewriteSpec::default()
        };
        let to_primary = Then::Climb {
            to: Rung::Primary,
            spec: RewriteSpec {
                primary: true,
                max_time_ms: Some(300),
                ..RewriteSpec::default()
            },
            or_else: Some(available),
        };
        let to_available = Then::Climb {
            to: Rung::Available,
            spec: available,
            or_else: None,
        };
        let b = Bounded {
            reason: Reason::StaleRouting,
            errors: 3,
            ours: true,
        };
        let bounded = Attempt {
            sample: true,
            bounded: Some(b),
            ..first(false, false)
        };
        // (name, policy, attempt, verdict, relayed, the guard grants a slot, next)
        let rows: Vec<(&str, &NsPolicy, Attempt, Verdict, bool, bool, &str)> = vec![
            (
                "reply",
                &fallback,
                first(false, true),
                verdict(Then::Reply, None),
                false,
                true,
                "reply",
            ),
            (
                "available",
                &fallback,
                first(false, true),
                verdict(to_available.clone(), Some(13388)),
                false,
                true,
                "resend available slot=false",
            ),
            (
                "primary granted",
                &fallback,
                first(true, true),
                verdict(to_primary.clone(), Some(13388)),
                false,
                true,
                "resend primary slot=true",
            ),
            // The guard refuses: the rung after it, at once.
            (
                "primary refused",
                &fallback,
                first(true, true),
                verdict(to_primary.clone(), Some(13388)),
                false,
                false,
                "resend available slot=false",
            ),
            // Already relayed (a large reply): the reply stands, whatever the verdict said.
            (
                "relayed climb",
                &fallback,
                first(false, true),
                verdict(to_available, Some(13388)),
                true,
                true,
                "reply",
            ),
            (
                "relayed question",
                &fallback,
                first(false, true),
                verdict(Then::Confirm, Some(50)),
                true,
                true,
                "reply",
            ),
            (
                "relayed no time",
                &fallback,
                first(false, true),
                verdict(Then::NoTime(Rung::Available), Some(50)),
                true,
                true,
                "no_time available",
            ),
            (
                "question",
                &fallback,
                first(false, true),
                verdict(Then::Confirm, Some(50)),
                false,
                true,
                "ask",
            ),
            (
                "no time",
                &fallback,
                first(false, true),
                verdict(Then::NoTime(Rung::Available), Some(50)),
                false,
                true,
                "no_time available",
            ),
            (
                "fail fast",
                &strict,
                bounded,
                verdict(Then::FailFast(b), Some(13388)),
                false,
                true,
                "fail_fast 13388",
            ),
            (
                "silent",
                &strict,
                first(false, false),
                verdict(Then::Silent, None),
                false,
                true,
                "silent 50 expired=true",
            ),
            (
                "silent bounded",
                &strict,
                bounded,
                verdict(Then::Silent, None),
                false,
                true,
                "silent 13388 expired=true",
            ),
        ];
        for (name, policy, attempt, v, relayed, grant, want) in rows {
            let f = followed(policy.clone(), attempt, t0);
            let next = f.settle(&v, relayed, |_| if grant { permit() } else { None });
            assert_eq!(kind(&next), want, "{name}");
        }
    }

    /// What each attempt under the bound met is named by the fail-fast error.
    #[test]
    fn the_fail_fast_error_names_what_each_attempt_met() {
        let strict = NsPolicy::with_defaults("pay.transactions", Mode::Strict);
        let b = Bounded {
            reason: Reason::StaleRouting,
            errors: 3,
            ours: true,
        };
        let bounded = Attempt {
            sample: true,
            bounded: Some(b),
            ..first(false, false)
        };
        let t0 = Instant::now();
        let f = followed(strict, bounded, t0);
        let again = Then::Climb {
            to: Rung::Again,
            spec: RewriteSpec {
                max_time_ms: Some(200),
                ..RewriteSpec::default()
            },
            or_else: None,
        };
        let Next::Resend(mut f, to, spec) = f.settle(&verdict(again, Some(13388)), false, |_| None)
        else {
            panic!("sent again under the bound")
        };
        f.sent(to, &spec, 2, true);
        assert_eq!(f.rung(), Rung::Again);
        let Next::FailFast(reply) =
            f.settle(&verdict(Then::FailFast(b), Some(13388)), false, |_| None)
        else {
            panic!("fails fast")
        };
        assert!(
            reply
                .errmsg
                .contains("StaleConfig (13388), then StaleConfig (13388)"),
            "{}",
            reply.errmsg
        );
    }

    /// A resend is followed on its new rung, from its new place; its deadline follows the
    /// limit it went out with.
    #[test]
    fn a_resend_is_followed_as_its_new_attempt() {
        let fallback = NsPolicy::with_defaults("demo.inventory", Mode::Fallback);
        let t0 = Instant::now();
        let mut f = followed(fallback.clone(), first(true, true), t0);
        assert!(f.answered_by(7, 1) && !f.answered_by(7, 2) && !f.answered_by(8, 1));
        assert_eq!(
            f.deadline(),
            t0.checked_add(Duration::from_millis(500) + SILENT_GRACE)
        );
        let spec = RewriteSpec {
            available: true,
            max_time_ms: Some(400),
            ..RewriteSpec::default()
        };
        f.sent(Rung::Available, &spec, 3, false);
        assert!(f.answered_by(7, 3));
        assert_eq!(f.rung(), Rung::Available);
        assert!(f.scans_orphans() || !f.unique_ids);
        // Not started yet (queued behind another request): no deadline until it begins.
        assert_eq!(f.deadline(), None);
        let later = t0 + Duration::from_millis(50);
        f.begins(3, later);
        assert_eq!(
            f.deadline(),
            later.checked_add(Duration::from_millis(400) + SILENT_GRACE)
        );
        // The unchanged resend after the cluster answered keeps the rungs ahead, asked.
        let mut g = followed(fallback, first(false, true), t0);
        g.sent(Rung::First, &RewriteSpec::default(), 2, true);
        let r = g.read();
        assert!(r.asked && r.retry && !r.limit_ours && r.rung == Rung::First);
        assert_eq!(g.deadline(), None, "no limit of its own, none written");
    }
}
