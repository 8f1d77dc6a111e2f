//! A client of the official driver for one upstream, for what staleguard reads or writes on
//! connections of its own (the write probe, the confirming reads): a direct connection to
//! that mongos, `[upstream_tls]`'s CA when set, the given login when there is one.

use std::time::Duration;

use mongodb::options::{ClientOptions, Credential, ServerAddress, Tls, TlsOptions};
use mongodb::Client;

use crate::config::{Config, Credentials};

/// A driver client for `upstream`, named `app_name` in mongos's logs, that gives up selecting
/// the server after `timeout`. No retried reads or writes: one attempt each.
pub fn driver_client(
    config: &Config,
    upstream: &str,
    app_name: &str,
    timeout: Duration,
    creds: Option<&Credentials>,
) -> Result<Client, mongodb::error::Error> {
    let mut o = ClientOptions::default();
    o.hosts = vec![ServerAddress::parse(upstream)?];
    o.direct_connection = Some(true);
    o.app_name = Some(app_name.to_string());
    o.retry_writes = Some(false);
    o.retry_reads = Some(false);
    o.server_selection_timeout = Some(timeout);
    o.connect_timeout = Some(config.connect_timeout.min(timeout));
    o.max_pool_size = Some(4);
    if let Some(c) = creds {
        o.credential = Some(
            Credential::builder()
                .username(c.username.clone())
                .password(c.password.expose().to_string())
                .source(c.auth_source.clone())
                .build(),
        );
    }
    if let Some(t) = &config.upstream_tls {
        o.tls = Some(Tls::Enabled(
            TlsOptions::builder()
                .ca_file_path(t.ca.clone())
                .allow_invalid_certificates(t.insecure_skip_verify)
                .build(),
        ));
    }
    Client::with_options(o)
}
