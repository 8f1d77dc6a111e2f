//! Connections to Redis and the bound on every call, shared by the link, the index, the
//! budget and the leases (a leaf: it imports no other file of the fleet).

use std::future::Future;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, IntoConnectionInfo};

use crate::config::FleetConfig;

/// Names tried, with a random suffix, when this instance's own is held by another.
pub(super) const NAME_TRIES: usize = 8;

/// Holds a key for this process (KEYS: the key; ARGV: this process's token, lease ms): 1
/// when it is free or already this process's (renewed), 0 when another live process holds
/// it or the key is of another type. A member's name and the leader's lease both use it.
pub(super) const CLAIM: &str = r#"
local found = redis.call('TYPE', KEYS[1]).ok
if found ~= 'none' and found ~= 'string' then return 0 end
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"#;

/// Why the link failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum LinkError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("no free name: `{0}` and {NAME_TRIES} suffixed names are held by other instances")]
    NoName(String),
}

/// The client for `[fleet] redis`, with the password of `password_env` when set.
pub(super) fn client(cfg: &FleetConfig) -> redis::RedisResult<Client> {
    let mut info = cfg.url.expose().into_connection_info()?;
    if let Some(p) = &cfg.password {
        let settings = info.redis_settings().clone().set_password(p.expose());
        info = info.set_redis_settings(settings);
    }
    Client::open(info)
}

/// `fut`, or [`LinkError::Timeout`] after `limit`.
pub(super) async fn within<T>(
    limit: Duration,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, LinkError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(LinkError::Timeout(limit)),
    }
}

/// Opens the command connection (every call bounded by `timeout`).
pub(super) async fn connect(
    client: &Client,
    cfg: &FleetConfig,
) -> Result<MultiplexedConnection, LinkError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(cfg.connect_timeout))
        .set_response_timeout(Some(cfg.timeout));
    within(
        cfg.connect_timeout + cfg.timeout,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
}
