//! The openings index in Redis, and everything else the fleet reads there, bounded on the
//! Redis side: nothing larger than the caps below ever crosses the connection, whatever
//! sits in the database.
//!
//! Keys, under `[fleet] prefix` (`P`):
//! - `P:openings`: a hash, one field per opener and namespace (`message::field`), whose
//!   value is the opening (or, for one `lease` after it, its close) as JSON;
//! - `P:openings:until`: a sorted set, the same fields scored by when they expire (Redis's
//!   clock, ms): an opener renews its fields every third of `lease`, so a dead opener's
//!   openings are gone `lease` after its last renewal;
//! - `P:openings:version`: a token that changes with every change of the index (a new
//!   value, a field expired), so a poll that finds it unchanged reads nothing else;
//! - `P:member:<name>`: the instance that holds a fleet name (see [`Index::claim`]).
//!
//! Openings are found in their index, never by scanning the keyspace: a database shared with
//! millions of other keys costs a poll nothing. A poll reads at most [`MAX_ENTRIES`] fields
//! and [`MAX_READ_BYTES`] in all; a field longer than [`MAX_FIELD`] or a value longer than
//! `message::MAX_PAYLOAD` is not sent (counted as `too_large`); field names are bytes, and a
//! field that is not UTF-8 or does not name its own message is skipped and counted. A key of
//! the wrong type (someone else's data under the prefix) makes the index unusable, which is
//! counted and logged, never a failed link.

use redis::aio::MultiplexedConnection;
use redis::{Script, Value};

use super::conn::{within, LinkError, CLAIM};
use super::message::{new_id, Message, MAX_PAYLOAD};
use crate::config::FleetConfig;

/// The most index fields one poll reads.
pub const MAX_ENTRIES: usize = 1000;
/// The most bytes (fields and values) one poll reads.
pub const MAX_READ_BYTES: usize = 256 * 1024;
/// The longest index field read (an opener name, a separator and a namespace fit).
pub const MAX_FIELD: usize = 512;
/// The longest value read under a signal key (`leader.rs`).
pub const MAX_SIGNAL: usize = 16 * 1024;

/// The clock of Redis in ms, and whether the three index keys have usable types (an
/// absent key has); the scripts below start with it.
const PRELUDE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function usable(key, kind)
  local found = redis.call('TYPE', key).ok
  return found == 'none' or found == kind
end
local ok = usable(KEYS[1], 'hash') and usable(KEYS[2], 'zset') and usable(KEYS[3], 'string')
"#;

/// Sets one field (ARGV: field, value, lease ms, a new version token): its value (and the
/// version, when the value changed) and its expiry. 0 when the index is unusable.
const PUT: &str = r#"
if not ok then return 0 end
local same = redis.call('HSTRLEN', KEYS[1], ARGV[1]) == #ARGV[2]
  and redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2]
if not same then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('SET', KEYS[3], ARGV[4])
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[1])
return 1
"#;

/// Drops expired fields, then (ARGV: the version last read, max entries, max field, max
/// value, max bytes, a new version token) returns `{version}` when nothing changed, else
/// `{version, fields in all, too large, not read, field, value, ...}`; `{}` when the index
/// is unusable.
const POLL: &str = r#"
if not ok then return {} end
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 256)
for _, f in ipairs(dead) do
  redis.call('HDEL', KEYS[1], f)
  redis.call('ZREM', KEYS[2], f)
end
if #dead > 0 then redis.call('SET', KEYS[3], ARGV[6]) end
local v = redis.call('GET', KEYS[3]) or '0'
if v == ARGV[1] then return {v} end
local max, max_field, max_value, max_bytes =
  tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local n = redis.call('HLEN', KEYS[1])
local fields
if n <= max then
  fields = redis.call('HKEYS', KEYS[1])
else
  fields = redis.call('HRANDFIELD', KEYS[1], max)
end
local out = {v, n, 0, n - #fields}
local bytes = 0
for _, f in ipairs(fields) do
  local len = redis.call('HSTRLEN', KEYS[1], f)
  if #f > max_field or len > max_value then
    out[3] = out[3] + 1
  elseif bytes + #f + len > max_bytes then
    out[4] = out[4] + 1
  else
    bytes = bytes + #f + len
    table.insert(out, f)
    table.insert(out, redis.call('HGET', KEYS[1], f))
  end
end
return out
"#;

/// Lets a name go (KEYS: the member key; ARGV: the token) when this process holds it.
const RELEASE: &str = r#"
if redis.call('TYPE', KEYS[1]).ok == 'string' and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return 1
"#;

/// Values of string keys no longer than ARGV[1]; false for the others (absent, too large,
/// another type).
const GET_SMALL: &str = r#"
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = false
  if redis.call('TYPE', k).ok == 'string' and redis.call('STRLEN', k) <= tonumber(ARGV[1]) then
    out[i] = redis.call('GET', k)
  end
end
return out
"#;

/// The scripts and key names of one fleet (one `prefix`).
pub(super) struct Index {
    put: Script,
    poll: Script,
    claim: Script,
    release: Script,
    hash: String,
    until: String,
    version: String,
    members: String,
}

/// What a poll set aside, by why (the `why` label of `fleet_skipped_total`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Skipped {
    /// A field or value over its cap: never sent by Redis.
    pub too_large: u64,
    /// Past [`MAX_ENTRIES`] or [`MAX_READ_BYTES`]: not read this time.
    pub not_read: u64,
    /// A field name that is not UTF-8.
    pub not_utf8: u64,
    /// A value that is not a fleet message, or a field that does not name its message.
    pub malformed: u64,
    /// The index keys hold another type (someone else's data under the prefix).
    pub unusable: u64,
}

impl Skipped {
    pub(super) fn counts(&self) -> [(&'static str, u64); 5] {
        [
            ("too_large", self.too_large),
            ("not_read", self.not_read),
            ("not_utf8", self.not_utf8),
            ("malformed", self.malformed),
            ("unusable_index", self.unusable),
        ]
    }
}

/// What a poll found.
#[derive(Debug, Default)]
pub(super) struct Polled {
    /// The index's version now.
    pub version: String,
    /// The index read whole, when it changed since the version asked about (none when it
    /// did not).
    pub read: Option<Vec<Message>>,
    /// Every field was looked at (none left past the caps): an opening not in `read` is not
    /// in Redis (a field set aside holds none).
    pub complete: bool,
    pub skipped: Skipped,
}

impl Index {
    pub(super) fn new(prefix: &str) -> Index {
        Index {
            put: Script::new(&format!("{PRELUDE}{PUT}")),
            poll: Script::new(&format!("{PRELUDE}{POLL}")),
            claim: Script::new(CLAIM),
            release: Script::new(RELEASE),
            hash: format!("{prefix}:openings"),
            until: format!("{prefix}:openings:until"),
            version: format!("{prefix}:openings:version"),
            members: format!("{prefix}:member:"),
        }
    }

    /// Sets `m` in the index, expiring `lease` from now (an opening renewed, or a close kept
    /// one `lease` for the pollers); false when the index is unusable.
    pub(super) async fn put(
        &self,
        conn: &mut MultiplexedConnection,
        cfg: &FleetConfig,
        m: &Message,
    ) -> Result<bool, LinkError> {
        let mut call = self.put.key(&self.hash);
        call.key(&self.until)
            .key(&self.version)
            .arg(m.field())
            .arg(m.encode())
            .arg(lease_ms(cfg))
            .arg(new_id());
        let set: i64 = within(cfg.timeout, call.invoke_async(conn)).await?;
        Ok(set == 1)
    }

    /// The index, when its version is not `known` (always with `known` empty).
    pub(super) async fn poll(
        &self,
        conn: &mut MultiplexedConnection,
        cfg: &FleetConfig,
        known: &str,
    ) -> Result<Polled, LinkError> {
        let mut call = self.poll.key(&self.hash);
        call.key(&self.until)
            .key(&self.version)
            .arg(known)
            .arg(MAX_ENTRIES)
            .arg(MAX_FIELD)
            .arg(MAX_PAYLOAD)
            .arg(MAX_READ_BYTES)
            .arg(new_id());
        let reply: Value = within(cfg.timeout, call.invoke_async(conn)).await?;
        Ok(parse_poll(reply, known))
    }

    /// Holds `name` for this process (`token`) for `lease`; false when another live process
    /// holds it.
    pub(super) async fn claim(
        &self,
        conn: &mut MultiplexedConnection,
        cfg: &FleetConfig,
        name: &str,
        token: &str,
    ) -> Result<bool, LinkError> {
        let mut call = self.claim.key(format!("{}{name}", self.members));
        call.arg(token).arg(lease_ms(cfg));
        let held: i64 = within(cfg.timeout, call.invoke_async(conn)).await?;
        Ok(held == 1)
    }

    /// Lets `name` go when this process holds it (at a stop, or when taking another name).
    pub(super) async fn release(
        &self,
        conn: &mut MultiplexedConnection,
        cfg: &FleetConfig,
        name: &str,
        token: &str,
    ) -> Result<(), LinkError> {
        let mut call = self.release.key(format!("{}{name}", self.members));
        call.arg(token);
        within(cfg.timeout, call.invoke_async::<i64>(conn))
            .await
            .map(|_| ())
    }
}

/// Reads keys whose values are at most [`MAX_SIGNAL`] bytes; the others read as none.
pub(super) async fn get_small(
    conn: &mut MultiplexedConnection,
    limit: std::time::Duration,
    keys: &[String],
) -> Result<Vec<Option<Vec<u8>>>, LinkError> {
    let script = Script::new(GET_SMALL);
    let mut call = script.prepare_invoke();
    for k in keys {
        call.key(k);
    }
    call.arg(MAX_SIGNAL);
    let values: Vec<Value> = within(limit, call.invoke_async(conn)).await?;
    Ok(values
        .into_iter()
        .map(|v| match v {
            Value::BulkString(b) => Some(b),
            _ => None,
        })
        .collect())
}

pub(super) fn lease_ms(cfg: &FleetConfig) -> u64 {
    cfg.lease.as_millis().max(1) as u64
}

/// The bytes of a string reply, or none.
fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn int(v: &Value) -> u64 {
    match v {
        Value::Int(n) => u64::try_from(*n).unwrap_or(0),
        _ => 0,
    }
}

/// A poll's reply (see [`POLL`]) as what it found; `known`: the version asked about.
fn parse_poll(reply: Value, known: &str) -> Polled {
    let Value::Array(items) = reply else {
        return unusable(known);
    };
    let Some(version) = items.first().and_then(bytes) else {
        return unusable(known);
    };
    let version = String::from_utf8_lossy(version).into_owned();
    if items.len() == 1 {
        return Polled {
            version,
            complete: true,
            ..Polled::default()
        };
    }
    let mut skipped = Skipped {
        too_large: items.get(2).map_or(0, int),
        not_read: items.get(3).map_or(0, int),
        ..Skipped::default()
    };
    let mut read = Vec::new();
    for pair in items.get(4..).unwrap_or_default().chunks(2) {
        let [field, value] = pair else {
            skipped.malformed += 1;
            continue;
        };
        let (Some(field), Some(value)) = (bytes(field), bytes(value)) else {
            skipped.malformed += 1;
            continue;
        };
        let Ok(field) = std::str::from_utf8(field) else {
            skipped.not_utf8 += 1;
            continue;
        };
        match Message::decode(value) {
            Ok(m) if m.field() == field => read.push(m),
            _ => skipped.malformed += 1,
        }
    }
    Polled {
        version,
        read: Some(read),
        // What was set aside is no opening anyone can apply; only fields not read leave the
        // answer open.
        complete: skipped.not_read == 0,
        skipped,
    }
}

/// An index whose keys hold other types: nothing read, the version left as it was (so the
/// next poll looks again).
fn unusable(known: &str) -> Polled {
    Polled {
        version: known.to_string(),
        read: None,
        complete: false,
        skipped: Skipped {
            unusable: 1,
            ..Skipped::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::Reason;
    use crate::fleet::Kind;

    fn bulk(s: &[u8]) -> Value {
        Value::BulkString(s.to_vec())
    }

    #[test]
    fn a_poll_reply_is_read_as_bytes_and_odd_fields_are_counted() {
        let m = Message::new(Kind::Open, "pay.tx", ("sg-1", "1"), Reason::TimeLimit, "e");
        let unchanged = parse_poll(Value::Array(vec![bulk(b"v1")]), "v1");
        assert_eq!(
            (unchanged.version.as_str(), unchanged.read.is_none()),
            ("v1", true)
        );
        let other = Message::new(Kind::Open, "pay.x", ("sg-2", "2"), Reason::TimeLimit, "e");
        let reply = Value::Array(vec![
            bulk(b"v2"),
            Value::Int(6),
            Value::Int(1),
            Value::Int(0),
            bulk(m.field().as_bytes()),
            bulk(m.encode().as_bytes()),
            bulk(b"\xff\xfe not utf-8"),
            bulk(m.encode().as_bytes()),
            // A value under a field that is not its own: set aside.
            bulk(m.field().as_bytes()),
            bulk(other.encode().as_bytes()),
            bulk(b"x"),
            bulk(b"not json"),
        ]);
        let p = parse_poll(reply, "v1");
        assert_eq!(p.version, "v2");
        assert_eq!(p.read.as_deref(), Some(&[m][..]));
        assert_eq!(
            p.skipped,
            Skipped {
                too_large: 1,
                not_utf8: 1,
                malformed: 2,
                ..Skipped::default()
            }
        );
        assert!(p.complete, "every field was looked at");
        let partial = parse_poll(
            Value::Array(vec![
                bulk(b"v3"),
                Value::Int(2000),
                Value::Int(0),
                Value::Int(1000),
            ]),
            "v2",
        );
        assert!(
            !partial.complete,
            "fields past the caps leave absence unproven"
        );
        let bad = parse_poll(Value::Array(vec![]), "v2");
        assert_eq!((bad.version.as_str(), bad.skipped.unusable), ("v2", 1));
    }
}
