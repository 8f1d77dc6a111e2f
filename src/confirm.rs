//! Asking the cluster before a time limit counts, or before a read that staleguard's own limit
//! cut is relaxed or sent to the primary. A read that ran out of time may have met a hung
//! secondary or may just be slow (its own query, its own limit, a view's pipeline); only the
//! cluster can tell. So staleguard asks it, on connections of its own (never the client's,
//! whose next request would wait behind the question at mongos): three cheap reads of the
//! namespace's *collection* (a view is followed to its source collection, learned once per
//! namespace with `listCollections`) through the same mongos, `find` with an empty filter,
//! `limit: 1`, `singleBatch`, a projection that keeps nothing (each document comes back as
//! `{}`, so the reply is tiny whatever the documents), `maxTimeMS` = `confirm_time`, with
//! `secondary` when the read asked for it and `secondaryPreferred` otherwise, no tags; sent
//! at once, so that a stale member beside a healthy one is met by at least one (confirmed
//! when any fails, unconfirmed when all are answered).
//!
//! The same task answers an open breaker's *close question* (`breaker::close`): when its
//! streak of answered samples meets the close rule, [`CLOSE_READS`] cheap reads, all of
//! which must be answered before it closes.
//!
//! What the answer says ([`policy::confirmation`]) reaches the breaker as the asking
//! connection's word (`breaker::Breakers::hear`, its share applies): confirmed, a failure;
//! answered, nothing for a closed breaker and an answered sample for an open one (a
//! secondary served the namespace). A session that waits on the answer (a read its own
//! limit cut) gets it back too ([`Answer`]).
//!
//! Bounded: questions wait in a queue of [`QUEUE`]; at most [`IN_FLIGHT`] questions run at
//! once, and as many close questions (`breaker::close`, [`CLOSE_READS`] cheap reads each, at
//! most one per breaker per `min_cooldown`); one per namespace and upstream at a time, which
//! the questions asked meanwhile join (at most [`JOINERS`]; a close question is never
//! joined); a confirmed failure serves the questions on its namespace for
//! [`FRESH`]; a question asked only for the evidence starts at most `per_connection` cheap
//! reads per `window` for its connection (remembered for [`CONNECTIONS_KEPT`] connections);
//! at most [`VIEWS_KEPT`] namespaces' view lookups are kept. A question past these bounds is
//! answered "unknown" at once. Without `[confirm]` credentials on a cluster that requires
//! authentication every answer is "unknown": time limits then never count, and a read cut by
//! staleguard's own limit is sent again unchanged, never relaxed.

mod ask;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::breaker::{Breakers, CloseAnswer, Heard, Said, Witness, CLOSE_READS, OWN_TICK};
use crate::command::ReadPrefMode;
use crate::metrics::Metrics;
use crate::policy::{Confirmation, Mode, NsPolicy, Reason};
use crate::state::LiveConfig;

/// Questions waiting for the confirming task.
pub const QUEUE: usize = 256;
/// Cheap reads running at once, over every namespace and upstream.
pub const IN_FLIGHT: usize = 32;
/// Questions that may join the one in flight on the same namespace and upstream.
pub const JOINERS: usize = 16;
/// How long a confirmed failure serves the questions on its namespace and upstream.
pub const FRESH: Duration = Duration::from_secs(2);
/// Namespaces whose view lookup is kept (all are let go of past it).
pub const VIEWS_KEPT: usize = 4096;
/// How long a view lookup is kept.
pub const VIEW_TTL: Duration = Duration::from_secs(60);
/// Connections whose share of cheap reads is remembered (past it, those whose window has
/// passed are let go of).
pub const CONNECTIONS_KEPT: usize = 8192;

/// A question about one read.
#[derive(Debug)]
pub struct Question {
    /// The namespace the read was on (`db.coll`).
    pub ns: Arc<str>,
    pub policy: Arc<NsPolicy>,
    /// The read's preference mode (the cheap read keeps `secondary`, else uses
    /// `secondaryPreferred`).
    pub mode: Option<ReadPrefMode>,
    /// The mongos it went through.
    pub upstream: String,
    /// The connection whose read raised it.
    pub who: Witness,
    /// The read was a sample of an open breaker.
    pub sample: bool,
    /// The answer serves the evidence only (a closed breaker's read whose reply already went
    /// to the client): such a question starts a cheap read only within its connection's
    /// share, `per_connection` per `window` (joining one in flight, or a fresh failure, is
    /// free).
    pub limited: bool,
    /// Why the read failed, and how (the breaker's reason and text if confirmed).
    pub reason: Reason,
    pub what: String,
    /// Where the asking session waits for the answer, and its token.
    pub reply: Option<(mpsc::UnboundedSender<Answer>, u64)>,
    /// A close question (`breaker::Breakers::close_answer`): [`CLOSE_READS`] cheap reads of
    /// its own, never joined with nor answered by a time limit's question.
    pub close: bool,
}

impl Question {
    /// The close question an open breaker asked (`Said::AskToClose`) after a sample of
    /// `ns` through `upstream`.
    pub fn close(ns: Arc<str>, policy: Arc<NsPolicy>, upstream: &str, who: Witness) -> Question {
        Question {
            ns,
            policy,
            mode: None,
            upstream: upstream.to_string(),
            who,
            sample: false,
            limited: false,
            reason: Reason::StaleRouting,
            what: String::new(),
            reply: None,
            close: true,
        }
    }

    fn key(&self) -> Key {
        (self.upstream.clone(), self.ns.clone(), self.close)
    }
}

/// A flight's key: upstream, namespace, close question or not.
type Key = (String, Arc<str>, bool);

/// The answer a waiting session gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub token: u64,
    /// The cheap read failed too.
    pub confirmed: bool,
}

/// Where sessions hand their questions.
#[derive(Debug)]
pub struct Confirmer {
    tx: mpsc::Sender<Question>,
}

/// The confirming task's side of the queue.
#[derive(Debug)]
pub struct Inbox(mpsc::Receiver<Question>);

/// What the confirming task uses.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub config: Arc<LiveConfig>,
    pub breakers: Arc<Breakers>,
    pub metrics: Arc<Metrics>,
}

impl Confirmer {
    pub fn new() -> (Confirmer, Inbox) {
        let (tx, rx) = mpsc::channel(QUEUE);
        (Confirmer { tx }, Inbox(rx))
    }

    /// Hands `q` to the confirming task; false when its queue is full (the caller treats
    /// the question as unanswered).
    pub fn ask(&self, q: Question) -> bool {
        self.tx.try_send(q).is_ok()
    }
}

/// One question's cheap reads in flight, and the questions waiting on them.
struct Flight {
    waiting: Vec<Question>,
    started: Instant,
}

/// A flight whose reads have not come back this long past `confirm_time` is given up (its
/// task bounds its reads to `confirm_time` and a second; this only guards a lost one).
const FLIGHT_LOST: Duration = Duration::from_secs(5);

/// The confirming task's state.
struct State {
    ctx: Ctx,
    clients: ask::Clients,
    flights: HashMap<Key, Flight>,
    /// The last answer per (upstream, namespace), and when it came (time limits' questions).
    recent: HashMap<Key, (Instant, Confirmation)>,
    /// Per namespace, the collection a cheap read reads (itself, or a view's source).
    views: HashMap<Arc<str>, (Instant, Arc<str>)>,
    /// Per connection, the cheap reads its limited questions started: since when, how many.
    starts: HashMap<u64, (Instant, u32)>,
    done: mpsc::UnboundedSender<ask::Done>,
    /// The upstream the next own question goes through, in turn.
    turn: usize,
}

/// The witness of staleguard's own question asked now: no client connection (0 is never
/// one).
fn own_witness() -> Witness {
    Witness {
        conn: 0,
        proven: true,
        sent: Instant::now(),
    }
}

/// Runs the confirming task until `stop`.
pub async fn run(inbox: Inbox, ctx: Ctx, stop: CancellationToken) {
    let Inbox(mut rx) = inbox;
    // From now on an open breaker asks here before it closes on its streak.
    ctx.breakers.confirm_closes();
    let (done, mut finished) = mpsc::unbounded_channel();
    let mut state = State {
        ctx,
        clients: ask::Clients::default(),
        flights: HashMap::new(),
        recent: HashMap::new(),
        views: HashMap::new(),
        starts: HashMap::new(),
        done,
        turn: 0,
    };
    let mut own = tokio::time::interval(OWN_TICK);
    own.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            q = rx.recv() => match q {
                Some(q) => state.question(q),
                None => return,
            },
            Some(d) = finished.recv() => state.finished(d),
            _ = own.tick() => state.own_questions(),
            _ = stop.cancelled() => return,
        }
    }
}

impl State {
    /// Asks staleguard's own question of every open breaker due one (`breaker::own`),
    /// through the configured mongos routers in turn.
    fn own_questions(&mut self) {
        let config = self.ctx.config.load_full();
        if config.upstreams.is_empty() || !config.confirm.own_questions {
            return;
        }
        let table = &config.policy;
        let due = self.ctx.breakers.own_questions(Instant::now(), |ns| {
            let (db, coll) = ns.split_once('.')?;
            table.lookup(db, coll).cloned()
        });
        for (ns, policy) in due {
            self.turn = self.turn.wrapping_add(1);
            let upstream = &config.upstreams[self.turn % config.upstreams.len()];
            let mut q = Question::close(ns, policy, upstream, own_witness());
            q.mode = Some(ReadPrefMode::Secondary);
            self.question(q);
        }
    }

    fn question(&mut self, q: Question) {
        let now = Instant::now();
        let key = q.key();
        if let Some(&(at, c)) = self.recent.get(&key) {
            if now.saturating_duration_since(at) < FRESH {
                return self.tell(&q, c, "shared");
            }
        }
        let lost = (self.flights.get(&key)).is_some_and(|f| {
            now.saturating_duration_since(f.started) > q.policy.confirm_time + FLIGHT_LOST
        });
        if lost {
            if let Some(f) = self.flights.remove(&key) {
                for w in &f.waiting {
                    self.tell(w, Confirmation::Unknown, "unknown");
                }
            }
        }
        if let Some(f) = self.flights.get_mut(&key) {
            if f.waiting.len() <= JOINERS {
                f.waiting.push(q);
                return;
            }
            return self.tell(&q, Confirmation::Unknown, "skipped");
        }
        // Close questions and time limits' questions each have their own IN_FLIGHT: clients'
        // slow reads cannot crowd out the question a breaker asks before closing.
        let same_kind = self.flights.keys().filter(|k| k.2 == q.close).count();
        if same_kind >= IN_FLIGHT || (q.limited && !self.take_share(&q, now)) {
            return self.tell(&q, Confirmation::Unknown, "skipped");
        }
        let config = self.ctx.config.load_full();
        let Some(client) = self.clients.get(&config, &q.upstream) else {
            return self.tell(&q, Confirmation::Unknown, "unknown");
        };
        let source = self.source(&q.ns, now);
        let read = ask::Cheap {
            client,
            ns: q.ns.clone(),
            source,
            mode: ask::mode(q.mode),
            limit: q.policy.confirm_time,
            policy: q.policy.clone(),
            tries: if q.close { CLOSE_READS } else { ask::TRIES },
            close: q.close,
        };
        tokio::spawn(read.run(key.clone(), self.done.clone()));
        let flight = Flight {
            waiting: vec![q],
            started: now,
        };
        self.flights.insert(key, flight);
    }

    /// One start from the share of `q`'s connection: `per_connection` per `window`.
    fn take_share(&mut self, q: &Question, now: Instant) -> bool {
        let window = q.policy.window;
        if self.starts.len() >= CONNECTIONS_KEPT {
            self.starts
                .retain(|_, (since, _)| now.saturating_duration_since(*since) < window);
        }
        let share = self.starts.entry(q.who.conn).or_insert((now, 0));
        if now.saturating_duration_since(share.0) >= window {
            *share = (now, 0);
        }
        if share.1 >= q.policy.per_connection.max(1) {
            return false;
        }
        share.1 += 1;
        true
    }

    /// The collection a cheap read of `ns` reads, when known and fresh.
    fn source(&mut self, ns: &Arc<str>, now: Instant) -> Option<Arc<str>> {
        match self.views.get(ns) {
            Some((at, src)) if now.saturating_duration_since(*at) < VIEW_TTL => Some(src.clone()),
            _ => None,
        }
    }

    /// Delivers an answer to `q`, and asks the close question a sample's answer raised.
    fn tell(&mut self, q: &Question, c: Confirmation, label: &'static str) {
        if let Some(close) = deliver(&self.ctx, q, c, label) {
            self.question(close);
        }
    }

    fn finished(&mut self, d: ask::Done) {
        let now = Instant::now();
        if let Some(src) = d.learned {
            if self.views.len() >= VIEWS_KEPT {
                self.views.clear();
            }
            self.views.insert(d.key.1.clone(), (now, src));
        }
        if self.recent.len() >= VIEWS_KEPT {
            self.recent
                .retain(|_, (at, _)| now.saturating_duration_since(*at) < FRESH);
        }
        // Only a failure is shared past its flight: in a partial incident each question
        // deserves its own cheap read (mongos picks a member for each), and an answer from
        // the healthy member must not hide the stale one from the next question.
        match d.confirmation {
            Confirmation::Confirmed { .. } if !d.key.2 => {
                self.recent.insert(d.key.clone(), (now, d.confirmation));
            }
            _ => {
                self.recent.remove(&d.key);
            }
        }
        let Some(flight) = self.flights.remove(&d.key) else {
            return;
        };
        let mut label = d.label;
        for q in &flight.waiting {
            self.tell(q, d.confirmation, label);
            // The first question paid for the read; the others shared its answer.
            label = "shared";
        }
    }
}

/// Tells the breaker (and the waiting session) what the cluster answered `q`; returns the
/// close question the answer raised, if any.
fn deliver(ctx: &Ctx, q: &Question, c: Confirmation, label: &'static str) -> Option<Question> {
    let now = Instant::now();
    if q.close {
        let answer = match c {
            Confirmation::Unconfirmed => CloseAnswer::Answered,
            Confirmation::Confirmed { code, .. } => CloseAnswer::Declined { code },
            Confirmation::Unknown => CloseAnswer::Unknown,
        };
        ctx.breakers.close_answer(&q.ns, &q.policy, &answer, now);
        return None;
    }
    let what;
    let heard = match c {
        Confirmation::Confirmed { code, reason } => {
            crate::logs::sampled!(info, ns = %q.ns, evidence = %q.what, code, "time limit confirmed: the cheap read failed too");
            what = format!("{}, confirmed by a limit-1 read: {code}", q.what);
            // The confirming read's own code says best why (stale routing or a hang).
            let reason = match reason {
                Reason::StaleRouting => reason,
                _ => q.reason,
            };
            Heard::Failed {
                reason,
                what: &what,
            }
        }
        // The cheap reads were answered: the time limit was not the cluster's failure. For
        // a sample of a strict namespace it is the cluster's word that its secondaries
        // serve the namespace (a view whose healthy reads outlast the bound has no other
        // answered samples): an answered sample, toward a streak that only asks the
        // cluster before closing (`breaker::close`). Otherwise neutral.
        Confirmation::Unconfirmed if q.sample && q.policy.mode == Mode::Strict => {
            tracing::debug!(ns = %q.ns, evidence = %q.what, "time limit not confirmed: an answered sample");
            Heard::Answered
        }
        Confirmation::Unconfirmed => {
            tracing::debug!(ns = %q.ns, evidence = %q.what, "time limit not confirmed: the cheap read was answered");
            ctx.metrics.limits.ignored("unconfirmed");
            Heard::Neutral
        }
        Confirmation::Unknown => Heard::Neutral,
    };
    let said = ctx
        .breakers
        .hear(&q.ns, &q.policy, heard, q.sample, q.who, now);
    ctx.metrics.breakers.confirm(match c {
        _ if label == "skipped" || label == "shared" => label,
        Confirmation::Confirmed { .. } => "confirmed",
        Confirmation::Unconfirmed => "unconfirmed",
        Confirmation::Unknown => "unknown",
    });
    if let Some((tx, token)) = &q.reply {
        let confirmed = matches!(c, Confirmation::Confirmed { .. });
        let _ = tx.send(Answer {
            token: *token,
            confirmed,
        });
    }
    (said == Said::AskToClose)
        .then(|| Question::close(q.ns.clone(), q.policy.clone(), &q.upstream, q.who))
}
