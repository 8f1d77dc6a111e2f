//! The page's lower sections: the write-stall watch (every signal with its evidence), the
//! fleet (`[fleet]`: connected or alone, this instance's name, what it leads, its budget
//! counts), the upstreams and the last config load.

use std::fmt::Write as _;

use super::stall_status::WriteStallStatus;
use super::status::{FleetStatus, Status, UpstreamStatus};
use super::text::{ago, esc, secs};

pub fn write_stall(out: &mut String, w: &WriteStallStatus) {
    out.push_str("<h2>Write-stall watch</h2>");
    if w.state == "off" {
        out.push_str("<p class=\"muted\">Off: no [stall_watch] signal is configured.</p>");
        return;
    }
    let _ = write!(
        out,
        "<p class=\"muted\">Watching: {} &middot; on a stall: {}</p>",
        esc(&w.watching.join(", ")),
        if w.action == "open_fallback_breakers" {
            "hold the breakers of fallback namespaces open"
        } else {
            "observe only"
        }
    );
    if w.signals.is_empty() {
        out.push_str("<p class=\"muted\">No reading yet.</p>");
        return;
    }
    out.push_str(
        "<table id=\"write-stall-signals\" class=\"cards\"><tr class=\"head\"><th>signal</th><th>where</th><th>state</th>\
         <th>since</th><th>evidence</th></tr>",
    );
    for sig in &w.signals {
        let since = match (&sig.since, sig.since_seconds_ago) {
            (Some(t), Some(a)) => ago(a, t),
            _ => "<span class=\"muted\">-</span>".to_string(),
        };
        let _ = write!(
            out,
            "<tr class=\"{state}\"><td data-label=\"signal\">{signal}</td><td data-label=\"where\">{place}</td>\
             <td class=\"state\" data-label=\"state\"><b>{state}</b></td>\
             <td data-label=\"since\">{since}</td><td data-label=\"evidence\">{summary}</td></tr>",
            state = sig.state,
            signal = sig.signal,
            place = esc(&sig.place),
            summary = esc(&sig.summary),
        );
    }
    out.push_str("</table>");
}

/// `[fleet]`: this instance in the fleet. Nothing without the section.
pub fn fleet(out: &mut String, f: Option<&FleetStatus>) {
    let Some(f) = f else {
        return;
    };
    out.push_str("<h2>Fleet (Redis)</h2><table id=\"fleet\" class=\"cards\"><tr class=\"head\"><th>Redis</th><th>name</th><th>leads</th><th>fleet budget</th><th>primary-rung reads judged by it</th></tr>");
    let since = f
        .since_seconds_ago
        .map_or(String::new(), |a| format!(" for {}", secs(a)));
    let link = if f.connected {
        format!("<span class=\"up\">connected</span>{since}<br><span class=\"muted\">openings, budgets and probes are shared</span>")
    } else {
        format!("<span class=\"down\">lost</span>{since}<br><span class=\"muted\">acting alone: its own breakers, local guard, every probe and poll</span>")
    };
    let name = if f.default_name {
        format!(
            "<code>{}</code><br><span class=\"down\">the default (listen's address): instances started from one config share it and ignore each other's openings; set [fleet] name per instance</span>",
            esc(&f.name)
        )
    } else {
        format!("<code>{}</code>", esc(&f.name))
    };
    let leads = match &f.leads {
        None => "every probe and poll (no other instance leads any)".to_string(),
        Some(l) if l.is_empty() => {
            "nothing: another instance probes and polls; its signals come through Redis".to_string()
        }
        Some(l) => l.iter().map(|x| esc(x)).collect::<Vec<_>>().join("<br>"),
    };
    let budget = match (f.fleet_max_per_second, f.fleet_max_in_flight) {
        (None, None) => "none (each instance's own [ladder_guard] only)".to_string(),
        (ps, inf) => format!(
            "{}/s, {} in flight",
            ps.map_or("-".to_string(), |n| n.to_string()),
            inf.map_or("-".to_string(), |n| n.to_string())
        ),
    };
    let b = &f.budget;
    let _ = write!(
        out,
        "<tr class=\"{class}\"><td data-label=\"Redis\">{link}</td><td data-label=\"name\">{name}</td>\
         <td data-label=\"leads\">{leads}</td><td data-label=\"fleet budget\">{budget}</td>\
         <td data-label=\"judged\">{} allowed, {} denied, {} unanswered (the local guard decided)</td></tr></table>",
        b.allowed,
        b.denied,
        b.unanswered,
        class = if f.connected { "pattern" } else { "open" },
    );
}

pub fn upstreams(out: &mut String, s: &Status) {
    out.push_str("<h2>Upstreams</h2>");
    let _ = write!(
        out,
        "<p class=\"muted\">Health checks: {}{}</p>",
        if s.health_checks == "off" {
            "off".to_string()
        } else {
            format!("a hello every {}", esc(&s.health_checks))
        },
        if s.upstream_tls {
            " &middot; TLS to mongos"
        } else {
            ""
        }
    );
    out.push_str(
        "<table id=\"upstreams\" class=\"cards\"><tr class=\"head\"><th>address</th><th>health</th><th>last hello</th>\
         <th>last check</th><th>primary-rung reads in flight</th><th>reads it left unanswered</th><th>last error</th></tr>",
    );
    for u in &s.upstreams {
        upstream_row(out, u);
    }
    out.push_str("</table>");
}

fn upstream_row(out: &mut String, u: &UpstreamStatus) {
    let latency = u
        .last_hello_ms
        .map_or_else(|| "-".to_string(), |ms| format!("{ms:.1} ms"));
    let silent = match (&u.last_silent, u.silent_reads) {
        (Some(at), n) if n > 0 => format!(
            "<span class=\"down\">{n}</span><br><span class=\"muted\">last {}</span>",
            esc(at)
        ),
        (_, n) => n.to_string(),
    };
    let _ = write!(
        out,
        "<tr><td data-label=\"address\"><code>{}</code></td><td class=\"{h}\" data-label=\"health\">{h}<br><span class=\"muted\">since {}</span></td>\
         <td data-label=\"last hello\">{latency}</td><td data-label=\"last check\">{}</td>\
         <td data-label=\"primary-rung reads in flight\">{}</td>\
         <td data-label=\"reads it left unanswered\">{silent}</td><td data-label=\"last error\">{}</td></tr>",
        esc(&u.address),
        esc(&u.since),
        esc(u.last_check.as_deref().unwrap_or("-")),
        u.ladder_in_flight,
        esc(u.last_error.as_deref().unwrap_or("")),
        h = u.health,
    );
}

pub fn config(out: &mut String, s: &Status) {
    out.push_str("<h2>Configuration</h2>");
    let r = &s.config.last_reload;
    let class = if r.result == "ok" { "up" } else { "down" };
    let _ = write!(
        out,
        "<p>File <code>{}</code> &middot; last load: <span class=\"{class}\">{}</span> \
         ({}, {})</p>",
        esc(&s.config.file),
        r.result,
        esc(&r.trigger),
        esc(&r.at),
    );
    if !r.messages.is_empty() {
        out.push_str("<ul id=\"reload-messages\">");
        for m in &r.messages {
            let _ = write!(out, "<li><code>{}</code></li>", esc(m));
        }
        out.push_str("</ul>");
    }
}
