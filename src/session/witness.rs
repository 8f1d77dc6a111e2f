//! The session's side of the one evidence gate: what a followed read said about the cluster
//! (`policy::evidence`) reaches its breaker as this connection's word (`Breakers::hear`:
//! only a connection that proved itself counts, and only its share), or goes to the cluster
//! as a question first (`confirm`: a time limit before it counts). A view over the few parts
//! of the handler it needs, made for each use (`Handler::witnessing`).

use tokio::sync::mpsc::UnboundedSender;
use tokio::time::Instant;

use super::arrival::log_failure;
use super::counters::Meter;
use super::followed::Followed;
use super::reads::Reads;
use crate::breaker::{CloseAnswer, Heard, Said, Witness};
use crate::confirm::{Answer, Question};
use crate::handles::SessionHandles;
use crate::policy::{Failure, Word};

pub(super) struct Witnessing<'h> {
    pub(super) shared: &'h SessionHandles,
    pub(super) meter: &'h Meter,
    pub(super) reads: &'h mut Reads,
    /// The client connection's id.
    pub(super) conn: u64,
    /// The mongos it is paired with.
    pub(super) upstream: &'h str,
}

impl Witnessing<'_> {
    /// The one evidence gate: what a read said about the cluster reaches its breaker here,
    /// as the word of this connection (which must have proved itself), or as a question to
    /// the cluster first (`in_path`: the read itself waits on it, see `reply.rs`); `now`:
    /// the time the caller judged it at (the reply's arrival for a whole reply).
    pub(super) fn hear(&mut self, f: &Followed, word: &Word<'_>, in_path: bool, now: Instant) {
        let who = self.witness(f);
        let heard = match word {
            Word::Neutral(why) => {
                if let Some(why) = why {
                    self.meter.ignored(why.label());
                }
                Heard::Neutral
            }
            Word::Answered => Heard::Answered,
            Word::Failed(failure) => {
                log_failure(f, failure, now);
                self.meter.trigger_error(f.ns(), &failure.evidence.label());
                if !who.proven {
                    self.meter.ignored("unproven");
                }
                let what = failure.evidence.to_string();
                let heard = Heard::Failed {
                    reason: failure.reason,
                    what: &what,
                };
                let (ns, policy) = (f.ns(), f.policy());
                let said = self
                    .shared
                    .breakers
                    .hear(ns, policy, heard, f.sample(), who, now);
                self.ask_to_close(f, said);
                return;
            }
            Word::Ask(failure) => {
                log_failure(f, failure, now);
                self.meter.trigger_error(f.ns(), &failure.evidence.label());
                if !in_path {
                    self.ask_aside(f, failure, now);
                }
                return;
            }
        };
        if f.sample() {
            let (ns, policy) = (f.ns(), f.policy());
            let said = self
                .shared
                .breakers
                .hear(ns, policy, heard, f.sample(), who, now);
            self.ask_to_close(f, said);
        }
    }

    /// The breaker's streak met the close rule: the cluster is asked before it closes
    /// (`breaker::close`); a question the confirming task cannot take is an unknown answer.
    fn ask_to_close(&self, f: &Followed, said: Said) {
        if said != Said::AskToClose {
            return;
        }
        let (ns, policy) = (f.ns(), f.policy());
        let q = Question::close(ns.clone(), policy.clone(), self.upstream, self.witness(f));
        if !self.shared.confirmer.ask(q) {
            let now = Instant::now();
            let breakers = &self.shared.breakers;
            breakers.close_answer(ns, policy, &CloseAnswer::Unknown, now);
        }
    }

    fn witness(&self, f: &Followed) -> Witness {
        Witness {
            conn: self.conn,
            proven: self.reads.proof.proven(),
            sent: f.started(),
        }
    }

    /// A question whose answer only the breaker waits for: asked for a sample (its outcome
    /// is the answer), or for a closed read when the answer can still count (this
    /// connection proved itself and has its share of the window's errors left; the
    /// confirming task holds it to its share of cheap reads).
    fn ask_aside(&mut self, f: &Followed, failure: &Failure<'_>, now: Instant) {
        let who = self.witness(f);
        if !f.sample() {
            let breakers = &self.shared.breakers;
            if !who.proven || !breakers.would_count(f.ns(), f.policy(), self.conn, now) {
                self.meter.confirm("skipped");
                return;
            }
        }
        let q = self.question(f, failure, None);
        if !self.shared.confirmer.ask(q) {
            self.meter.confirm("skipped");
            if f.sample() {
                self.release_sample(f);
            }
        }
    }

    pub(super) fn question(
        &self,
        f: &Followed,
        failure: &Failure<'_>,
        reply: Option<(UnboundedSender<Answer>, u64)>,
    ) -> Question {
        Question {
            ns: f.ns().clone(),
            policy: f.policy().clone(),
            mode: f.pref(),
            upstream: self.upstream.to_string(),
            who: self.witness(f),
            sample: f.sample(),
            limited: reply.is_none() && !f.sample(),
            reason: failure.reason,
            what: failure.evidence.to_string(),
            reply,
            close: false,
        }
    }

    /// A sample whose outcome will never be known: its breaker lets the next one go.
    pub(super) fn release_sample(&self, f: &Followed) {
        let now = Instant::now();
        let breakers = &self.shared.breakers;
        breakers.hear(
            f.ns(),
            f.policy(),
            Heard::Neutral,
            true,
            self.witness(f),
            now,
        );
    }
}
