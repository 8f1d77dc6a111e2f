//! The fleet budget on primary-rung reads: `[ladder_guard] fleet_max_per_second` and
//! `fleet_max_in_flight` across every instance of the fleet (one budget per cluster: a
//! fleet, one `[fleet] prefix`, fronts one cluster).
//!
//! Every 100 ms this task asks Redis, in one script each (atomic), for this instance's part:
//! - starts: a counter per second of Redis's own clock (`P:budget:starts:<second>`, kept 2 s);
//!   the script first counts the starts this instance borrowed since its last call, then
//!   grants what it asks for (twice what its reads asked in the last 100 ms, at most a fifth
//!   of the budget) within what is left of the second, and says how long the second still
//!   lasts and this instance's *spare*: what is left unclaimed, divided among the instances
//!   that asked within the last second (`P:budget:members`) and one more. A burst takes the
//!   spare at once instead of waiting for a refill that follows its demand.
//! - in flight: a hash of the slots each instance holds (`P:budget:slots`) and when each
//!   holding expires (`P:budget:slots:until`, `lease`): the script drops the holdings of
//!   instances that stopped renewing (a dead instance frees its slots within `lease`), grants
//!   this instance what it holds plus what it asked, within what the others hold, and its
//!   spare of what is free, divided in the same way.
//!
//! Refills come every 100 ms, and just after each second of Redis's clock ends (the answer
//! says how long it still lasts), so a new second's starts are there within a round trip.
//! The grant lands in `upstream::FleetShare`, which reads take with atomics. A call that
//! fails or takes longer than `budget_timeout` grants nothing, and the share leaves every
//! read to the local guard until a grant comes: Redis slow, stopped or gone costs no read.
//! Instances are told apart by their process token, never their name (two may share one).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Script;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::conn::{self, within};
use super::Fleet;
use crate::config::FleetConfig;
use crate::state::LiveConfig;
use crate::upstream::{FleetShare, Slots, Starts};

/// How often the share is refilled.
const REFILL: Duration = Duration::from_millis(100);
/// How old a grant may be before the share stands aside: two refills missed.
pub const STALE: Duration = Duration::from_millis(250);
/// How long after Redis's second ends the refill asks for the next one's starts.
const SECOND_SLACK: Duration = Duration::from_millis(2);
/// How long an instance that asked counts among the members the spare is divided by.
const MEMBER_MS: u64 = 1000;

const STARTS: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local key = KEYS[1] .. ':' .. t[1]
local max, want, borrowed = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], now, ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[5]))
redis.call('PEXPIRE', KEYS[2], 2 * tonumber(ARGV[5]))
local members = redis.call('ZCARD', KEYS[2])
local used = tonumber(redis.call('GET', key) or '0')
local grant = math.min(want, max - used - borrowed)
if grant < 0 then grant = 0 end
if grant + borrowed > 0 then
  redis.call('INCRBY', key, grant + borrowed)
  redis.call('PEXPIRE', key, 2000)
end
local left = max - used - borrowed - grant
local spare = 0
if left > 0 then spare = math.floor(left / (members + 1)) end
return {grant, 1000 - math.floor(tonumber(t[2]) / 1000), spare}
"#;

const SLOTS: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, n in ipairs(dead) do
  redis.call('HDEL', KEYS[1], n)
  redis.call('ZREM', KEYS[2], n)
end
redis.call('HDEL', KEYS[1], ARGV[3])
local others = 0
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do others = others + (tonumber(v) or 0) end
local max = tonumber(ARGV[1])
local grant = math.min(tonumber(ARGV[2]), max - others)
if grant < 0 then grant = 0 end
local lease = tonumber(ARGV[4])
local held = math.max(grant, tonumber(ARGV[5]))
local free = max - others - held
local spare = 0
if free > 0 then spare = math.floor(free / (redis.call('HLEN', KEYS[1]) + 2)) end
redis.call('HSET', KEYS[1], ARGV[3], held)
redis.call('ZADD', KEYS[2], now + lease, ARGV[3])
redis.call('PEXPIRE', KEYS[1], lease * 2)
redis.call('PEXPIRE', KEYS[2], lease * 2)
return {grant, spare}
"#;

struct Scripts {
    starts: Script,
    slots: Script,
    starts_key: String,
    members_key: String,
    slots_key: String,
    until_key: String,
}

/// The refill task: runs until `stop`.
pub(super) async fn run(
    config: Arc<LiveConfig>,
    share: Arc<FleetShare>,
    cfg: FleetConfig,
    me: Arc<Fleet>,
    stop: CancellationToken,
) {
    let Ok(client) = conn::client(&cfg) else {
        return;
    };
    let s = Scripts {
        starts: Script::new(STARTS),
        slots: Script::new(SLOTS),
        starts_key: format!("{}:budget:starts", cfg.prefix),
        members_key: format!("{}:budget:members", cfg.prefix),
        slots_key: format!("{}:budget:slots", cfg.prefix),
        until_key: format!("{}:budget:slots:until", cfg.prefix),
    };
    let mut conn: Option<MultiplexedConnection> = None;
    // The next refill: every REFILL, and just after Redis's second ends, so that a new
    // second's starts are granted at once rather than up to REFILL into it.
    let mut next = Instant::now();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep_until(next) => {}
        }
        next = Instant::now() + REFILL;
        let live = config.load();
        let Some(f) = live.fleet.as_ref() else {
            continue;
        };
        let (rate, slots) = (f.max_per_second, f.max_in_flight);
        if rate.is_none() && slots.is_none() {
            share.turn_off();
            continue;
        }
        share.turn_on(STALE, cfg.budget_timeout);
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match conn::connect(&client, &cfg).await {
                Ok(c) => conn.insert(c),
                // The link task logs the outage; the local guard decides meanwhile.
                Err(_) => {
                    share.failed();
                    continue;
                }
            },
        };
        let demand = share.demand();
        share.asking(Instant::now());
        match refill(c, &s, &cfg, &me.token, &share, (rate, slots), demand).await {
            Ok(Some(left)) => next = next.min(Instant::now() + left + SECOND_SLACK),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, "fleet budget: no grant");
                share.failed();
                // What was borrowed is counted at the next refill that answers.
                share.keep_borrowed(demand.2);
                conn = None;
            }
        }
    }
}

async fn refill(
    c: &mut MultiplexedConnection,
    s: &Scripts,
    cfg: &FleetConfig,
    token: &str,
    share: &FleetShare,
    (rate, slots): (Option<u32>, Option<u32>),
    (asked, _, borrowed): (u32, u32, u32),
) -> Result<Option<Duration>, conn::LinkError> {
    let limit = cfg.budget_timeout;
    let starts = match rate {
        Some(max) => {
            let want = asked.saturating_mul(2).clamp(1, (max / 5).max(1));
            let mut call = s.starts.key(&s.starts_key);
            call.key(&s.members_key)
                .arg(max)
                .arg(want)
                .arg(borrowed)
                .arg(token)
                .arg(MEMBER_MS);
            let (granted, left_ms, spare): (u32, u64, u32) =
                within(limit, call.invoke_async(c)).await?;
            Some(Starts {
                granted,
                spare,
                left: Duration::from_millis(left_ms.min(1000)),
            })
        }
        None => None,
    };
    let slots = match slots {
        Some(max) => {
            let held = share.held();
            let want = held.saturating_add(asked.max(1)).min(max);
            let mut call = s.slots.key(&s.slots_key);
            call.key(&s.until_key)
                .arg(max)
                .arg(want)
                .arg(token)
                .arg(cfg.lease.as_millis() as u64)
                .arg(held);
            let (granted, spare): (u32, u32) = within(limit, call.invoke_async(c)).await?;
            Some(Slots { granted, spare })
        }
        None => None,
    };
    share.grant(starts, slots, Instant::now());
    Ok(starts.map(|s| s.left))
}
