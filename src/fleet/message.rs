//! What instances tell each other through Redis: an opening or a close of one namespace's
//! breaker, by the instance whose own evidence opened it. JSON, one object per message: the
//! value of the opening's field in the openings index (`index.rs`). Each opening has an
//! identity (`id`, new at each opening of the opener's breaker; its close carries the same
//! one), so an instance can tell one opening from the next. What comes from Redis is checked
//! (sizes, names, kinds) before it touches a breaker.

use serde::{Deserialize, Serialize};

use crate::breaker::Reason;

/// The largest payload read (a message is a few hundred bytes).
pub const MAX_PAYLOAD: usize = 4096;
/// The longest evidence text kept (the opener's transition reason).
pub const MAX_EVIDENCE: usize = 512;
/// The longest namespace accepted (MongoDB's own limit on `db.coll`).
pub const MAX_NS: usize = 255;
/// The longest instance name accepted (as `[fleet] name`, with a suffix when that name is
/// taken).
pub const MAX_OPENER: usize = 160;
/// The longest opening id accepted.
pub const MAX_ID: usize = 64;
/// What separates the opener from the namespace in an index field (neither may hold a
/// control character).
const FIELD_SEP: char = '\u{1f}';

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Open,
    Close,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Open => "open",
            Kind::Close => "close",
        }
    }
}

/// One opening or close.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub kind: Kind,
    pub ns: String,
    pub opener: String,
    /// The opening's identity: made by its opener when its breaker opened; a close names
    /// the opening it ends.
    pub id: String,
    /// `stale_routing` or `time_limit`: the fail-fast reply's code on other instances.
    pub cause: String,
    /// The opener's transition reason ("3 trigger errors within 10s (last: 13388 ...)").
    pub evidence: String,
}

impl Message {
    pub fn new(
        kind: Kind,
        ns: &str,
        (opener, id): (&str, &str),
        cause: Reason,
        evidence: &str,
    ) -> Message {
        Message {
            kind,
            ns: ns.to_string(),
            opener: opener.to_string(),
            id: id.to_string(),
            cause: cause_name(cause).to_string(),
            evidence: clip(evidence, MAX_EVIDENCE).to_string(),
        }
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A message read from Redis, or why it is set aside.
    pub fn decode(payload: &[u8]) -> Result<Message, &'static str> {
        if payload.len() > MAX_PAYLOAD {
            return Err("too large");
        }
        let m: Message = serde_json::from_slice(payload).map_err(|_| "not a fleet message")?;
        let printable = |s: &str| !s.chars().any(char::is_control);
        if m.ns.len() > MAX_NS || !m.ns.contains('.') || !printable(&m.ns) {
            return Err("bad namespace");
        }
        if m.opener.is_empty() || m.opener.len() > MAX_OPENER || !printable(&m.opener) {
            return Err("bad opener");
        }
        if m.id.is_empty() || m.id.len() > MAX_ID || !printable(&m.id) {
            return Err("bad id");
        }
        if cause_of(&m.cause).is_none() {
            return Err("unknown cause");
        }
        Ok(Message {
            evidence: clip(&m.evidence, MAX_EVIDENCE).to_string(),
            ..m
        })
    }

    pub fn cause(&self) -> Reason {
        cause_of(&self.cause).unwrap_or(Reason::StaleRouting)
    }

    /// Its field in the openings index: one per opener and namespace.
    pub fn field(&self) -> String {
        field(&self.opener, &self.ns)
    }

    /// `db` and `coll` of the namespace.
    pub fn db_coll(&self) -> (&str, &str) {
        self.ns.split_once('.').unwrap_or((&self.ns, ""))
    }
}

/// The index field of `opener`'s opening of `ns`.
pub fn field(opener: &str, ns: &str) -> String {
    format!("{opener}{FIELD_SEP}{ns}")
}

/// A fresh opening id: the opener's clock and a random part, so that two openings of one
/// namespace (by one instance, or by two that share a name) never share one.
pub fn new_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", h.finish())
}

fn cause_name(r: Reason) -> &'static str {
    match r {
        Reason::TimeLimit => "time_limit",
        Reason::StaleRouting | Reason::WriteStall => "stale_routing",
    }
}

fn cause_of(s: &str) -> Option<Reason> {
    match s {
        "time_limit" => Some(Reason::TimeLimit),
        "stale_routing" => Some(Reason::StaleRouting),
        _ => None,
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_checks() {
        let m = Message::new(
            Kind::Open,
            "pay.tx",
            ("sg-1", "0123abcd"),
            Reason::TimeLimit,
            "3 errors",
        );
        assert_eq!(Message::decode(m.encode().as_bytes()), Ok(m.clone()));
        assert_eq!(m.field(), "sg-1\u{1f}pay.tx");
        assert_ne!(new_id(), new_id());
        assert_eq!(m.cause(), Reason::TimeLimit);
        assert_eq!(m.db_coll(), ("pay", "tx"));
        let bad = |json: &str| Message::decode(json.as_bytes()).unwrap_err();
        assert_eq!(bad("{}"), "not a fleet message");
        let base = r#"{"kind":"open","ns":"NS","opener":"OP","id":"1","cause":"CA","evidence":""}"#;
        let with = |ns: &str, op: &str, ca: &str| {
            base.replace("NS", ns).replace("OP", op).replace("CA", ca)
        };
        assert_eq!(bad(&with("nodot", "a", "time_limit")), "bad namespace");
        assert_eq!(bad(&with("a.b\\n", "a", "time_limit")), "bad namespace");
        assert_eq!(bad(&with("a.b", "", "time_limit")), "bad opener");
        assert_eq!(bad(&with("a.b", "a", "other")), "unknown cause");
        assert_eq!(
            bad(&with("a.b", "a", "time_limit").replace("\"1\"", "\"\"")),
            "bad id"
        );
        let long = "x".repeat(MAX_PAYLOAD + 1);
        assert_eq!(Message::decode(long.as_bytes()).unwrap_err(), "too large");
        let m = Message::new(
            Kind::Close,
            "a.b",
            ("o", "1"),
            Reason::StaleRouting,
            &"é".repeat(400),
        );
        assert!(m.evidence.len() <= MAX_EVIDENCE);
    }
}
