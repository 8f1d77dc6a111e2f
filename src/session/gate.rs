//! The request side's early gates: each request is opened once (`wire::Request`), its
//! requestID checked against the reads and writes still waiting (a reused one closes the
//! client), and sent through the gates in one match: forwarded untouched, followed as a write
//! (write-stall watch), refused (legacy OP_QUERY), or handed to `request.rs` to be governed. A large
//! compressed request is decompressed off the runtime's workers first.

use super::{Session, SessionError};
use crate::policy;
use crate::stall;
use crate::wire::{Request, WireError};
use bytes::Bytes;

/// Where the early gates send a request.
enum Gate {
    /// Forwarded untouched; `expects_reply` is false for `moreToCome`.
    Pass { expects_reply: bool },
    /// A write the write-stall watch follows, then forwarded untouched.
    Write,
    /// A command a policy may govern (every command but the writes).
    Read,
    /// A legacy OP_QUERY refused on a database with governed namespaces.
    Legacy(policy::LegacyRefusal),
    /// A compressed message that must be opened whole and declares more than
    /// [`INLINE_INFLATE`] bytes: decompressed off the runtime's workers first.
    Inflate,
}

/// The largest decompression done on a runtime worker (a few tens of microseconds); a larger
/// one runs on the blocking pool behind [`inflate_slots`], so that no client can hold a
/// worker (and every session scheduled on it) for the tens of milliseconds a message of up to
/// `max_message_size` takes.
pub(super) const INLINE_INFLATE: usize = 64 * 1024;

/// Decompressions running off the workers at once: half the cores (at least one), so that
/// a flood of large compressed messages cannot take every core from the relays.
fn inflate_slots() -> &'static tokio::sync::Semaphore {
    static SLOTS: std::sync::OnceLock<tokio::sync::Semaphore> = std::sync::OnceLock::new();
    SLOTS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        tokio::sync::Semaphore::new((cores / 2).max(1))
    })
}

impl Session {
    /// One request from the client. `Some`: a large compressed request to be decompressed
    /// off the workers ([`Session::inflate_aside`]) and then handed to
    /// [`Session::on_inflated`].
    pub(super) fn on_request(&mut self, msg: Bytes) -> Result<Option<Request>, SessionError> {
        self.refresh_config();
        let max = self.config.max_message_size;
        let mut req = Request::new(msg, max).map_err(SessionError::ClientProtocol)?;
        self.refuse_reused_id(req.request_id())?;
        match self.gate(&mut req)? {
            Gate::Inflate => return Ok(Some(req)),
            gate => self.dispatch(gate, req)?,
        }
        Ok(None)
    }

    /// A request [`Session::on_request`] set aside, now decompressed.
    pub(super) fn on_inflated(&mut self, mut req: Request) -> Result<(), SessionError> {
        let gate = self.gate_open(&mut req)?;
        self.dispatch(gate, req)
    }

    /// Decompresses `req` on the blocking pool, waiting for one of [`inflate_slots`].
    pub(super) async fn inflate_aside(&self, mut req: Request) -> Result<Request, SessionError> {
        let max = self.config.max_message_size;
        let Ok(_slot) = inflate_slots().acquire().await else {
            return Err(SessionError::ClientProtocol(WireError::Decompress(
                "decompression slots closed".into(),
            )));
        };
        self.shared.metrics.limits.off_worker_decompressions.inc();
        let task = tokio::task::spawn_blocking(move || req.inflate(max).map(|()| req));
        match task.await {
            Ok(r) => r.map_err(SessionError::ClientProtocol),
            Err(e) => Err(SessionError::ClientProtocol(WireError::Decompress(
                format!("decompression task: {e}"),
            ))),
        }
    }

    /// The first gate: a request that reuses the requestID of a followed read or write
    /// still waiting for its reply closes the client, since its reply could be taken for
    /// theirs (an open breaker's probe above all). No driver does this: ids are unique among a
    /// connection's requests in flight. Scans only while something is followed.
    fn refuse_reused_id(&self, request_id: i32) -> Result<(), SessionError> {
        let reused = (!self.pending.is_empty()
            && self.pending.iter().any(|t| t.request_id == request_id))
            || (!self.writes.is_empty() && self.writes.contains(request_id));
        if reused {
            self.shared.metrics.limits.hit("reused_request_id");
            // The followed reads end unjudged: a sample among them says nothing (a probe
            // gives its slot back).
            let now = tokio::time::Instant::now();
            for t in self.pending.iter().filter(|t| t.sample) {
                let unknown = crate::breaker::Sample::Unknown;
                self.shared
                    .breakers
                    .sampled(&t.ns, &t.policy, unknown, self.id, now);
            }
            return Err(SessionError::ReusedRequestId(request_id));
        }
        Ok(())
    }

    fn dispatch(&mut self, gate: Gate, mut req: Request) -> Result<(), SessionError> {
        match gate {
            Gate::Pass { expects_reply } => self.pass(req.into_frame(), expects_reply),
            Gate::Write => self.send_write(req.request_id(), req.into_frame()),
            Gate::Read => self.govern(req)?,
            Gate::Legacy(refusal) => self.refuse_legacy(req.request_id(), &refusal),
            // Only from `gate`, handled by the caller; opened here as a last resort.
            Gate::Inflate => {
                let gate = self.gate_open(&mut req)?;
                return self.dispatch(gate, req);
            }
        }
        Ok(())
    }

    /// The early gates. Without any acting policy or write watch, only what `Request::new`
    /// checks (the OP_MSG structure and checksum) is looked at; otherwise the body is opened
    /// (decompressed, once) and its command name read, once.
    fn gate(&self, req: &mut Request) -> Result<Gate, SessionError> {
        let policy_active = self.policy_active();
        let watch_writes = self.config.stall.passive;
        if !(policy_active || watch_writes) {
            return Ok(Gate::Pass {
                expects_reply: !req.more_to_come(),
            });
        }
        if let Some(gate) = self.gate_compressed(req, policy_active, watch_writes)? {
            return Ok(gate);
        }
        if req
            .declared_inflated_len()
            .is_some_and(|n| n > INLINE_INFLATE)
        {
            return Ok(Gate::Inflate);
        }
        self.gate_open(req)
    }

    /// The gates that need the message open: decompressed (once; already done for a large
    /// one), then its opcode, flags and command name.
    fn gate_open(&self, req: &mut Request) -> Result<Gate, SessionError> {
        let policy_active = self.policy_active();
        let watch_writes = self.config.stall.passive;
        let max = self.config.max_message_size;
        req.inflate(max).map_err(SessionError::ClientProtocol)?;
        if !req.is_command() {
            // A legacy opcode, or OP_COMPRESSED wrapping one.
            // An OP_QUERY (plain, or unwrapped by `inflate`) was read on arrival.
            if let (true, Some(q)) = (policy_active, req.op_query()) {
                let judged = policy::judge_op_query(&q, &self.config.policy);
                if let Some(r) = judged.map_err(SessionError::ClientProtocol)? {
                    return Ok(Gate::Legacy(r));
                }
            }
            return Ok(Gate::Pass {
                expects_reply: true,
            });
        }
        if req.more_to_come() {
            return Ok(Gate::Pass {
                expects_reply: false,
            });
        }
        Ok(match req.command_name() {
            Ok(Some(name)) if watch_writes && stall::is_write_command(name) => Gate::Write,
            // Every other command: a repeated policy-relevant field or a client's own
            // `available` is refused whatever the command (see `policy::resolve`).
            Ok(Some(name)) if policy_active && !stall::is_write_command(name) => Gate::Read,
            Ok(_) => Gate::Pass {
                expects_reply: true,
            },
            Err(m) => return Err(SessionError::ClientProtocol(WireError::BadBson(m.0))),
        })
    }

    /// A compressed request's gate from the first few hundred decompressed bytes: only a
    /// command some policy may act on is decompressed whole (a small message declaring tens of
    /// megabytes must not cost that much work to be told apart). The peek's decompression is
    /// kept in `req`: opening it whole goes on from there. `None`: open it whole.
    fn gate_compressed(
        &self,
        req: &mut Request,
        policy_active: bool,
        watch_writes: bool,
    ) -> Result<Option<Gate>, SessionError> {
        let max = self.config.max_message_size;
        let peek = match req.peek(max, INLINE_INFLATE) {
            Ok(Some(p)) => p,
            Ok(None) => return Ok(None),
            Err(e) => return Err(SessionError::ClientProtocol(e)),
        };
        let expects_reply = !peek.more_to_come();
        Ok(Some(if !expects_reply {
            Gate::Pass { expects_reply }
        } else if watch_writes && stall::is_write_command(peek.command_name) {
            Gate::Write
        } else if policy_active {
            // Every non-write command is classified under an acting policy (a repeated
            // policy-relevant field or a client's own `available` is refused whatever the
            // command), so it is opened whole, as uncompressed ones are.
            return Ok(None);
        } else {
            Gate::Pass { expects_reply }
        }))
    }
}
