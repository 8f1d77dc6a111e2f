//! The fleet budget on primary-rung reads: `[ladder_guard] fleet_max_per_second` and
//! `fleet_max_in_flight` across every instance of the fleet (one budget per cluster: a
//! fleet, one `[fleet] prefix`, fronts one cluster).
//!
//! Every 100 ms this task asks Redis, in one script each (atomic), for this instance's part:
//! - starts: a counter per second of Redis's own clock (`P:budget:starts:<second>`, kept 2 s);
//!   the script grants what this instance asks for (twice what its reads asked in the last
//!   100 ms, at most a fifth of the budget) within what is left of the second, and says how
//!   long the second still lasts. The sum of grants never passes the budget.
//! - in flight: a hash of the slots each instance holds (`P:budget:slots`) and when each
//!   holding expires (`P:budget:slots:until`, `lease`): the script drops the holdings of
//!   instances that stopped renewing (a dead instance frees its slots within `lease`), and
//!   grants this instance what it holds plus what it asked, within what the others hold.
//!
//! The grant lands in `upstream::FleetShare`, which reads take with atomics. A call that
//! fails or takes longer than `budget_timeout` grants nothing; after 500 ms without a grant
//! the share stands aside and each instance's local guard alone decides.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Script;
use tokio::time::{interval, Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::link::{self, within};
use crate::config::FleetConfig;
use crate::state::LiveConfig;
use crate::upstream::FleetShare;

/// How often the share is refilled.
const REFILL: Duration = Duration::from_millis(100);
/// How old a grant may be before the share stands aside.
pub const STALE: Duration = Duration::from_millis(500);

const STARTS: &str = r#"
local t = redis.call('TIME')
local key = KEYS[1] .. ':' .. t[1]
local used = tonumber(redis.call('GET', key) or '0')
local grant = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) - used)
if grant < 0 then grant = 0 end
if grant > 0 then
  redis.call('INCRBY', key, grant)
  redis.call('PEXPIRE', key, 2000)
end
return {grant, 1000 - math.floor(tonumber(t[2]) / 1000)}
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
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do others = others + tonumber(v) end
local grant = math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) - others)
if grant < 0 then grant = 0 end
local lease = tonumber(ARGV[4])
redis.call('HSET', KEYS[1], ARGV[3], grant)
redis.call('ZADD', KEYS[2], now + lease, ARGV[3])
redis.call('PEXPIRE', KEYS[1], lease * 2)
redis.call('PEXPIRE', KEYS[2], lease * 2)
return grant
"#;

struct Scripts {
    starts: Script,
    slots: Script,
    starts_key: String,
    slots_key: String,
    until_key: String,
}

/// The refill task: runs until `stop`.
pub(super) async fn run(
    config: Arc<LiveConfig>,
    share: Arc<FleetShare>,
    cfg: FleetConfig,
    name: String,
    stop: CancellationToken,
) {
    let Ok(client) = link::client(&cfg) else {
        return;
    };
    let s = Scripts {
        starts: Script::new(STARTS),
        slots: Script::new(SLOTS),
        starts_key: format!("{}:budget:starts", cfg.prefix),
        slots_key: format!("{}:budget:slots", cfg.prefix),
        until_key: format!("{}:budget:slots:until", cfg.prefix),
    };
    let mut conn: Option<MultiplexedConnection> = None;
    let mut tick = interval(REFILL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let live = config.load();
        let Some(f) = live.fleet.as_ref() else {
            continue;
        };
        let (rate, slots) = (f.max_per_second, f.max_in_flight);
        if rate.is_none() && slots.is_none() {
            share.turn_off();
            continue;
        }
        share.turn_on(STALE);
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match link::connect(&client, &cfg).await {
                Ok(c) => conn.insert(c),
                // The link task logs the outage; the share goes stale and stands aside.
                Err(_) => continue,
            },
        };
        let (asked, _) = share.demand();
        match refill(c, &s, &cfg, &name, &share, (rate, slots), asked).await {
            Ok(()) => {}
            Err(e) => {
                tracing::debug!(error = %e, "fleet budget: no grant");
                conn = None;
            }
        }
    }
}

async fn refill(
    c: &mut MultiplexedConnection,
    s: &Scripts,
    cfg: &FleetConfig,
    name: &str,
    share: &FleetShare,
    (rate, slots): (Option<u32>, Option<u32>),
    asked: u32,
) -> Result<(), link::LinkError> {
    let limit = cfg.budget_timeout;
    let starts = match rate {
        Some(max) => {
            let want = asked.saturating_mul(2).clamp(1, (max / 5).max(1));
            let mut call = s.starts.key(&s.starts_key);
            call.arg(max).arg(want);
            let (grant, left_ms): (u32, u64) = within(limit, call.invoke_async(c)).await?;
            Some((grant, Duration::from_millis(left_ms.min(1000))))
        }
        None => None,
    };
    let slots = match slots {
        Some(max) => {
            let want = share.held().saturating_add(asked.max(1)).min(max);
            let mut call = s.slots.key(&s.slots_key);
            call.key(&s.until_key)
                .arg(max)
                .arg(want)
                .arg(name)
                .arg(cfg.lease.as_millis() as u64);
            let grant: u32 = within(limit, call.invoke_async(c)).await?;
            Some(grant)
        }
        None => None,
    };
    share.grant(starts, slots, Instant::now());
    Ok(())
}
