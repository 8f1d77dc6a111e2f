//! Human-readable views for `staleguard check-config`: every setting in effective form
//! (`render_table`), and which entry governs a namespace and why (`explain`).

use std::fmt::Write as _;
use std::time::Duration;

use super::{columns, stall, Config};
use crate::command::ReadPrefMode;
use crate::policy::{Mode, NsPolicy, Pattern, PolicyTable};

fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn fmt_opt(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_string(), fmt_duration)
}

/// The names of a read-preference bit set, comma-separated.
/// The per-namespace settings, in the order `policy_cells` gives them (after pattern and mode):
/// the table's columns and the lines of `--explain`.
const POLICY_COLUMNS: [&str; 20] = [
    "threshold",
    "window",
    "cooldown",
    "read_preferences",
    "trigger_codes",
    "max_time",
    "slow_read",
    "min_wait",
    "min_connections",
    "per_connection",
    "dry_run",
    "causal",
    "min_cooldown",
    "ladder",
    "attempt_share",
    "attempt_limit",
    "on_open",
    "open_time_limit",
    "close_after",
    "confirm_time",
];

pub fn read_pref_names(bits: u8) -> String {
    ReadPrefMode::ALL
        .iter()
        .filter(|m| bits & m.bit() != 0)
        .map(|m| m.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// The effective settings of one policy as table cells (settings are `-` for passthrough).
fn policy_cells(p: &NsPolicy) -> Vec<String> {
    let mut cells = vec![p.pattern.clone(), p.mode.as_str().to_string()];
    if p.mode == Mode::Passthrough {
        cells.extend(std::iter::repeat_n("-".to_string(), POLICY_COLUMNS.len()));
        return cells;
    }
    let codes: Vec<String> = p.trigger_codes.iter().map(|c| c.to_string()).collect();
    cells.extend([
        p.threshold.to_string(),
        fmt_duration(p.window),
        fmt_duration(p.cooldown),
        read_pref_names(p.read_preferences),
        codes.join(","),
        fmt_opt(p.max_time),
        fmt_opt(p.slow_read),
        fmt_duration(p.min_wait),
        p.min_connections.to_string(),
        p.per_connection.to_string(),
        p.dry_run.to_string(),
        if p.mode == Mode::Strict {
            "-"
        } else {
            p.causal.as_str()
        }
        .to_string(),
        fmt_duration(p.min_cooldown),
        format!("[{}]", p.ladder().join(",")),
    ]);
    // Only a read with a next rung takes a share of its budget.
    if p.mode == Mode::Strict && !p.primary_rung {
        cells.extend(["-".to_string(), "-".to_string()]);
    } else {
        let limit = p
            .attempt_limit
            .map_or_else(|| "off".to_string(), fmt_duration);
        cells.extend([p.attempt_share.to_string(), limit]);
    }
    // Only a strict read without a primary rung is sent bounded (or refused) while open.
    if p.mode == Mode::Strict && !p.primary_rung {
        let limit = match p.on_open {
            crate::policy::OnOpen::Bound => fmt_duration(p.open_time_limit),
            crate::policy::OnOpen::Refuse => "-".to_string(),
        };
        cells.extend([p.on_open.as_str().to_string(), limit]);
    } else {
        cells.extend(["-".to_string(), "-".to_string()]);
    }
    cells.extend([p.close_after.to_string(), fmt_duration(p.confirm_time)]);
    cells
}

/// Every top-level setting and every entry in effective form, as aligned text.
pub fn render_table(config: &Config) -> String {
    let mut lines = String::new();
    settings(&mut lines, config);
    // Every value starts in one column, past the longest name; a value too long for the
    // terminal continues under itself.
    let rows: Vec<(&str, &str)> = lines
        .lines()
        .map(|l| {
            let (name, value) = l.split_once(' ').unwrap_or((l, ""));
            (name, value.trim_start())
        })
        .collect();
    let width = rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0) + 2;
    let mut out = String::new();
    for (name, value) in rows {
        columns::line(&mut out, name, value, width);
    }
    out.push('\n');
    namespaces(&mut out, &config.policy);
    out
}

/// The top-level settings, one `name  value` line each.
fn settings(out: &mut String, config: &Config) {
    let _ = writeln!(out, "config            {}", config.source.display());
    let _ = writeln!(out, "listen            {}", config.listen);
    let admin = config.admin_listen.as_deref().unwrap_or("-");
    let _ = writeln!(out, "admin.listen      {admin}");
    let token = if config.admin_token.is_some() {
        "set"
    } else {
        "-"
    };
    let _ = writeln!(out, "admin.token       {token}");
    let a = &config.admin_limits;
    let _ = writeln!(
        out,
        "admin.limits      max_connections {}, header_read_timeout {}, request_timeout {}",
        a.max_connections,
        fmt_duration(a.header_read_timeout),
        fmt_duration(a.request_timeout)
    );
    let _ = writeln!(out, "upstreams         {}", config.upstreams.join(", "));
    let l = &config.limits;
    let _ = writeln!(out, "max_connections   {}", l.max_connections);
    let per_peer = l
        .max_connections_per_peer
        .map_or("off".to_string(), |n| n.to_string());
    let _ = writeln!(out, "max_connections_per_peer {per_peer}");
    let _ = writeln!(out, "message_timeout   {}", fmt_duration(l.message_timeout));
    let _ = writeln!(
        out,
        "first_message_timeout {}",
        fmt_duration(l.first_message_timeout)
    );
    let _ = writeln!(
        out,
        "idle_timeout      {}",
        l.idle_timeout.map_or("off".to_string(), fmt_duration)
    );
    let _ = writeln!(out, "write_timeout     {}", fmt_duration(l.write_timeout));
    let _ = writeln!(out, "max_pending_reads {}", l.max_pending_reads);
    let _ = writeln!(out, "breaker_share     {}", config.breaker_share);
    let _ = writeln!(out, "max_message_size  {}", config.max_message_size);
    let _ = writeln!(
        out,
        "connect_timeout   {}",
        fmt_duration(config.connect_timeout)
    );
    let _ = writeln!(
        out,
        "shutdown_timeout  {}",
        fmt_duration(config.shutdown_timeout)
    );
    let _ = writeln!(out, "layout            {}", config.layout.name());
    let _ = writeln!(out, "health            {}", health(config));
    let _ = writeln!(out, "tls               {}", server_tls(config));
    let _ = writeln!(out, "upstream_tls      {}", upstream_tls(config));
    let _ = writeln!(out, "stall_watch       {}", stall::describe(&config.stall));
    let g = config.ladder_guard;
    let _ = writeln!(
        out,
        "ladder_guard      {} in flight, {}/s per upstream; per connection {} in flight, {}/s",
        g.max_in_flight, g.max_per_second, g.per_connection, g.per_connection_per_second
    );
    fleet(out, config);
}

/// `[fleet]`: the Redis (password masked), this instance's name, the timings, and the
/// fleet budgets of `[ladder_guard]`.
fn fleet(out: &mut String, config: &Config) {
    let Some(f) = &config.fleet else {
        let _ = writeln!(out, "fleet             - (no [fleet]: each instance alone)");
        return;
    };
    let default = if f.name == config.listen {
        " (the default, listen's address: the same on every instance of one config; set a name per instance)"
    } else {
        ""
    };
    let _ = writeln!(out, "fleet.redis       {}", f.shown);
    let _ = writeln!(out, "fleet.name        {}{default}", f.name);
    let _ = writeln!(
        out,
        "fleet.timings     prefix {}, lease {}, timeout {}, connect_timeout {}, budget_timeout {}",
        f.prefix,
        fmt_duration(f.lease),
        fmt_duration(f.timeout),
        fmt_duration(f.connect_timeout),
        fmt_duration(f.budget_timeout)
    );
    let per_second = f
        .max_per_second
        .map_or("-".to_string(), |n| format!("{n}/s"));
    let in_flight = f
        .max_in_flight
        .map_or("-".to_string(), |n| format!("{n} in flight"));
    let _ = writeln!(
        out,
        "fleet.budgets     fleet_max_per_second {per_second}, fleet_max_in_flight {in_flight} (primary-rung reads across the fleet; each instance's ladder_guard still bounds it)"
    );
}

fn health(config: &Config) -> String {
    config.health_interval.map_or_else(
        || "off".to_string(),
        |every| {
            format!(
                "every {}, timeout {}",
                fmt_duration(every),
                fmt_duration(config.health_timeout)
            )
        },
    )
}

fn server_tls(config: &Config) -> String {
    config.tls.as_ref().map_or_else(
        || "-".to_string(),
        |t| {
            let mtls = t
                .client_ca
                .as_ref()
                .map_or(String::new(), |ca| format!(", client_ca {}", ca.display()));
            format!("cert {}{mtls}", t.cert.display())
        },
    )
}

fn upstream_tls(config: &Config) -> String {
    config.upstream_tls.as_ref().map_or_else(
        || "-".to_string(),
        |t| match (&t.ca, t.insecure_skip_verify) {
            (_, true) => "on, certificate NOT verified (insecure_skip_verify)".to_string(),
            (Some(ca), false) => format!("on, ca {}", ca.display()),
            (None, false) => "on".to_string(),
        },
    )
}

/// The tables of the `[[namespaces]]` entries (each fits [`columns::WIDTH`]): what each
/// entry is, then its breaker, its time limits and the reads and errors it acts on, rows
/// keyed by the entry's `#` (passthrough entries only in the first: they have no settings).
const POLICY_TABLES: [(&str, &[&str]); 4] = [
    (
        "entries (the most specific pattern wins: exact > longest prefix > db.* > *)",
        &[
            "line", "pattern", "mode", "dry_run", "on_open", "causal", "ladder",
        ],
    ),
    (
        "breakers",
        &[
            "threshold",
            "window",
            "cooldown",
            "min_cooldown",
            "close_after",
            "min_connections",
            "per_connection",
        ],
    ),
    (
        "time limits",
        &[
            "max_time",
            "slow_read",
            "min_wait",
            "attempt_share",
            "attempt_limit",
            "open_time_limit",
            "confirm_time",
        ],
    ),
    (
        "reads governed and trigger errors",
        &["read_preferences", "trigger_codes"],
    ),
];

/// The `[[namespaces]]` entries, in file order, as the tables of [`POLICY_TABLES`].
fn namespaces(out: &mut String, t: &PolicyTable) {
    if t.entries().is_empty() {
        out.push_str("no [[namespaces]] entries: every read passes through untouched\n");
        return;
    }
    // Every entry's cells by column name: `#`, `line`, `pattern`, `mode` and the settings.
    let cells: Vec<Vec<(&str, String)>> = t
        .entries()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let values = policy_cells(p);
            let names = ["pattern", "mode"].into_iter().chain(POLICY_COLUMNS);
            let mut row = vec![("#", i.to_string()), ("line", t.line(i).to_string())];
            row.extend(names.zip(values));
            row
        })
        .collect();
    for (k, (title, columns)) in POLICY_TABLES.iter().enumerate() {
        let header: Vec<String> = std::iter::once("#")
            .chain(columns.iter().copied())
            .map(str::to_string)
            .collect();
        let mut rows = vec![header.clone()];
        for (entry, p) in cells.iter().zip(t.entries()) {
            if k > 0 && p.mode == Mode::Passthrough {
                continue;
            }
            let cell = |name: &str| {
                entry
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or_else(|| "-".to_string(), |(_, v)| v.clone())
            };
            rows.push(header.iter().map(|h| cell(h)).collect());
        }
        if rows.len() == 1 {
            continue;
        }
        if k > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "namespaces: {title}");
        columns::table(out, &rows);
    }
}

fn why(pat: &Pattern) -> String {
    match pat {
        Pattern::Exact { .. } => "exact namespace: the most specific kind of pattern".to_string(),
        Pattern::Prefix { db, prefix } => format!(
            "longest collection prefix `{prefix}*` in `{db}` (no exact entry for this namespace)"
        ),
        Pattern::Db(db) => {
            format!("whole database `{db}.*` (no exact or collection-prefix entry matches)")
        }
        Pattern::All => "catch-all `*` (no entry names this database)".to_string(),
    }
}

fn effect(p: &NsPolicy) -> String {
    let opens = format!(
        "after {} counted trigger errors within {} (from at least {} client connection{}), its breaker opens",
        p.threshold,
        fmt_duration(p.window),
        p.min_connections,
        if p.min_connections == 1 { "" } else { "s" }
    );
    let closes = format!(
        "it closes on {} answered samples in a row spanning at least {}",
        p.close_after,
        fmt_duration(p.min_cooldown)
    );
    let probes = format!(
        "one probe at a time goes as a closed read would (the first {} after opening, then waits doubling up to {})",
        fmt_duration(p.min_cooldown),
        fmt_duration(p.cooldown)
    );
    let text = match (p.mode, p.primary_rung, p.on_open) {
        (Mode::Passthrough, _, _) => return "reads are forwarded untouched".to_string(),
        (Mode::Fallback, false, _) => format!(
            "a read that meets a trigger error is sent again with readConcern available (its first attempt gets {} of its budget, at most {}); {opens}: reads are rewritten to available before they are sent, and {probes}; {closes}",
            p.attempt_share,
            p.attempt_limit.map_or("no limit".to_string(), fmt_duration)
        ),
        (Mode::Fallback, true, _) => format!(
            "a read that meets a trigger error is sent to the shard's primary, then with readConcern available if that fails too; {opens}: reads go to the primary first, available when it fails or [ladder_guard] is full, and {probes}; {closes}"
        ),
        (Mode::Strict, true, _) => format!(
            "a read that meets a trigger error is sent once to the shard's primary (within [ladder_guard]); {opens}: reads go to the primary at once, and fail fast only when [ladder_guard] is full; {probes}; {closes}; reads asking for readConcern available are refused"
        ),
        (Mode::Strict, false, crate::policy::OnOpen::Bound) => format!(
            "{opens}: reads are still sent, each attempt with maxTimeMS at most {} (on_open = \"bound\"): a healthy secondary answers, a read that fails within the bound is sent once more under it, and only then gets the fail-fast error (within about twice the bound); every read is a sample, and {closes}; reads asking for readConcern available are refused",
            fmt_duration(p.open_time_limit)
        ),
        (Mode::Strict, false, crate::policy::OnOpen::Refuse) => format!(
            "{opens}: reads fail fast with an error and nothing is sent (on_open = \"refuse\"), but {probes}; {closes}; reads asking for readConcern available are refused"
        ),
    };
    if p.dry_run {
        format!("{text} (dry_run: none of this changes a read; it is logged at debug and counted in dry_run_total)")
    } else {
        text
    }
}

/// Which entry governs `ns` (`db.coll`) and why, or that it is unlisted.
pub fn explain(config: &Config, ns: &str) -> String {
    let Some((db, coll)) = ns
        .split_once('.')
        .filter(|(d, c)| !d.is_empty() && !c.is_empty())
    else {
        return format!("`{ns}` is not a namespace: expected `db.coll`\n");
    };
    let t = &config.policy;
    let Some(i) = t.find(db, coll) else {
        return format!(
            "{ns}: unlisted: passthrough (no pattern matches; reads are forwarded untouched)\n"
        );
    };
    let p = &t.entries()[i];
    let mut out = format!(
        "{ns}: matches namespaces[{i}] `{}` (line {}): {}\n",
        p.pattern,
        t.line(i),
        p.mode.as_str()
    );
    columns::line(&mut out, "  why:", &why(t.pattern(i)), 10);
    let mut others: Vec<usize> = (0..t.entries().len())
        .filter(|&j| j != i && t.pattern(j).matches(db, coll))
        .collect();
    others.sort_by_key(|&j| std::cmp::Reverse(t.pattern(j).rank()));
    for j in others {
        let o = &t.entries()[j];
        let _ = writeln!(
            out,
            "  also matches, less specific: namespaces[{j}] `{}` (line {}): {}",
            o.pattern,
            t.line(j),
            o.mode.as_str()
        );
    }
    columns::line(&mut out, "  effect:", &effect(p), 10);
    if p.mode != Mode::Passthrough {
        let cells = policy_cells(p);
        for (name, value) in POLICY_COLUMNS.iter().zip(&cells[2..]) {
            let _ = writeln!(out, "  {name:<17}{value}");
        }
    }
    out
}
