//! The request side's early gates, from the request as opened once (`wire::Request`) and
//! the config: forwarded untouched, followed as a write (write-stall watch), refused (legacy
//! OP_QUERY), or governed (`request.rs`). Functions of the request and the config only; a
//! large compressed request is decompressed off the runtime's workers first
//! ([`inflate_aside`]).

use tokio::sync::Semaphore;

use super::counters::Meter;
use super::SessionError;
use crate::config::Config;
use crate::policy;
use crate::stall;
use crate::wire::{Request, WireError};

/// Where the early gates send a request.
pub(super) enum Gate {
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
/// one runs on the blocking pool behind `SessionHandles::inflate_slots`, so that no client can hold a
/// worker (and every session scheduled on it) for the tens of milliseconds a message of up to
/// `max_message_size` takes.
pub(super) const INLINE_INFLATE: usize = 64 * 1024;

/// The early gates. Without any acting policy or write watch, only what `Request::new`
/// checks (the OP_MSG structure and checksum) is looked at; otherwise the body is opened
/// (decompressed, once) and its command name read, once.
pub(super) fn gate(req: &mut Request, config: &Config) -> Result<Gate, SessionError> {
    let policy_active = !config.policy.is_passthrough_only();
    let watch_writes = config.stall.passive;
    if !(policy_active || watch_writes) {
        return Ok(Gate::Pass {
            expects_reply: !req.more_to_come(),
        });
    }
    if let Some(gate) = gate_compressed(req, config, policy_active, watch_writes)? {
        return Ok(gate);
    }
    if req
        .declared_inflated_len()
        .is_some_and(|n| n > INLINE_INFLATE)
    {
        return Ok(Gate::Inflate);
    }
    gate_open(req, config)
}

/// The gates that need the message open: decompressed (once; already done for a large
/// one), then its opcode, flags and command name.
pub(super) fn gate_open(req: &mut Request, config: &Config) -> Result<Gate, SessionError> {
    let policy_active = !config.policy.is_passthrough_only();
    let watch_writes = config.stall.passive;
    let max = config.max_message_size;
    req.inflate(max).map_err(SessionError::ClientProtocol)?;
    if !req.is_command() {
        // A legacy opcode, or OP_COMPRESSED wrapping one.
        // An OP_QUERY (plain, or unwrapped by `inflate`) was read on arrival.
        if let (true, Some(q)) = (policy_active, req.op_query()) {
            let judged = policy::judge_op_query(&q, &config.policy);
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
    // The name as bytes: compared here, read as text when the request is classified.
    Ok(match req.command_key() {
        Ok(Some(name)) if watch_writes && stall::is_write_key(name) => Gate::Write,
        // Every other command: a repeated policy-relevant field or a client's own
        // `available` is refused whatever the command (see `policy::resolve`).
        Ok(Some(name)) if policy_active && !stall::is_write_key(name) => Gate::Read,
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
    req: &mut Request,
    config: &Config,
    policy_active: bool,
    watch_writes: bool,
) -> Result<Option<Gate>, SessionError> {
    let max = config.max_message_size;
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

/// Decompresses `req` on the blocking pool, waiting for one of `slots`
/// (`SessionHandles::inflate_slots`: half the cores, so that a flood of large compressed
/// messages cannot take every core from the relays).
pub(super) async fn inflate_aside(
    mut req: Request,
    slots: &Semaphore,
    max: usize,
    meter: &Meter,
) -> Result<Request, SessionError> {
    let Ok(_slot) = slots.acquire().await else {
        return Err(SessionError::ClientProtocol(WireError::Decompress(
            "decompression slots closed".into(),
        )));
    };
    meter.off_worker_decompression();
    let task = tokio::task::spawn_blocking(move || req.inflate(max).map(|()| req));
    match task.await {
        Ok(r) => r.map_err(SessionError::ClientProtocol),
        Err(e) => Err(SessionError::ClientProtocol(WireError::Decompress(
            format!("decompression task: {e}"),
        ))),
    }
}
