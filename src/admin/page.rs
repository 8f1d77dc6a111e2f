//! The HTML status page (`/`): what a person needs during an incident, open breakers first
//! and highlighted, refreshed every 2 s by a tiny inline script (no external assets).
//! Every value that can come from outside (namespaces come from clients) is escaped.

use std::fmt::Write as _;
use std::time::Duration;

use super::status::{NsStatus, Status, UpstreamStatus, WriteStallStatus};
use super::text::{esc, rfc3339, short_duration, words};
use crate::metrics::DRY_RUN_ACTIONS;

const STYLE: &str = r#"
body{font:15px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d1d1f;background:#f6f6f4}
header{background:#20242b;color:#fff;padding:12px 20px}
header h1{display:inline;font-size:20px;margin:0 12px 0 0}
header span{color:#c9ccd1}
main{padding:8px 20px 20px}
h2{font-size:16px;margin:22px 0 6px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:6px 9px;border-bottom:1px solid #e2e2df;vertical-align:top}
th{background:#ecece8;font-weight:600}
tr.open td{background:#fde2e1}
tr.open td.state b{color:#b3001b;text-transform:uppercase}
tr.raised td{background:#fde2e1}
tr.raised td.state b{color:#b3001b;text-transform:uppercase}
.banner{padding:10px 14px;margin:12px 0;border-radius:4px;font-weight:600}
.banner.bad{background:#b3001b;color:#fff}
.banner.warn{background:#ffe8a3}
.banner.good{background:#dff3e3;color:#17582a}
.down{color:#b3001b;font-weight:700}
.up{color:#17582a;font-weight:600}
.muted{color:#6b6b6b;font-weight:normal}
code{font-size:13px}
tr.bad td:nth-child(2){color:#b3001b;font-weight:600}
.banner .why{font-weight:normal}
figure.plot{margin:8px 0 14px;background:#fff;padding:6px 8px;display:inline-block}
figure.plot svg{display:block;max-width:100%;height:auto}
.legend span{margin-right:14px;font-size:13px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
footer{color:#6b6b6b;font-size:13px;margin-top:18px}
"#;

const SCRIPT: &str = r#"
(function(){
  function tick(){
    fetch(location.href,{cache:"no-store"}).then(function(r){
      if(!r.ok){throw new Error("HTTP "+r.status);}
      return r.text();
    }).then(function(t){
      var m=new DOMParser().parseFromString(t,"text/html").getElementById("main");
      if(m){document.getElementById("main").replaceWith(m);}
      document.getElementById("conn").hidden=true;
    }).catch(function(e){
      var c=document.getElementById("conn");
      c.textContent="Cannot reach the staleguard admin endpoint ("+e.message+"); the figures below are stale.";
      c.hidden=false;
    });
  }
  setInterval(tick,2000);
})();
"#;

/// The whole page.
pub fn render(s: &Status) -> String {
    let mut out = String::with_capacity(8 * 1024);
    out.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">");
    out.push_str("<title>staleguard status</title>");
    out.push_str("<noscript><meta http-equiv=\"refresh\" content=\"2\"></noscript>");
    let _ = write!(out, "<style>{STYLE}</style></head><body>");
    out.push_str("<div id=\"conn\" class=\"banner bad\" hidden></div>");
    out.push_str("<div id=\"main\">");
    header(&mut out, s);
    out.push_str("<main>");
    super::incident::banners(&mut out, s);
    out.push_str("<h2>Namespaces</h2>");
    namespaces(&mut out, &s.namespaces);
    dry_run_table(&mut out, &s.namespaces);
    super::plots::section(&mut out, &s.history);
    super::incident::events(&mut out, &s.events, s.events_recorded_total);
    out.push_str("<h2>Write-stall watch</h2>");
    write_stall(&mut out, &s.write_stall);
    out.push_str("<h2>Upstreams</h2>");
    upstreams(&mut out, s);
    out.push_str("<h2>Configuration</h2>");
    config(&mut out, s);
    let _ = write!(
        out,
        "<footer>Page built {} (UTC) &middot; refreshes every 2 s &middot; \
         <a href=\"status\">status JSON</a> &middot; <a href=\"metrics\">metrics</a></footer>",
        esc(&rfc3339(std::time::SystemTime::now()))
    );
    out.push_str("</main></div>");
    let _ = writeln!(out, "<script>{SCRIPT}</script></body></html>");
    out
}

fn header(out: &mut String, s: &Status) {
    let tls = if s.tls { " (TLS)" } else { "" };
    let _ = write!(
        out,
        "<header><h1>staleguard</h1><span>v{} &middot; up {} &middot; clients connect to {}{} \
         &middot; {} client connection{}</span></header>",
        esc(s.version),
        short_duration(Duration::from_secs(s.uptime_seconds)),
        esc(&s.listen),
        tls,
        s.client_connections,
        if s.client_connections == 1 { "" } else { "s" },
    );
}

fn namespaces(out: &mut String, rows: &[NsStatus]) {
    if rows.is_empty() {
        out.push_str("<p class=\"muted\">No [[namespaces]] configured: every read passes through untouched.</p>");
        return;
    }
    out.push_str(
        "<table id=\"namespaces\"><tr><th>namespace</th><th>pattern</th><th>mode</th>\
         <th>breaker</th><th>what happens to reads</th><th>errors in window</th>\
         <th>trigger errors<br><span class=\"muted\">reads failed fast, rewritten</span></th><th>ladder</th><th>last transition</th><th>reason</th></tr>",
    );
    for r in rows {
        let when = match (&r.last_transition, r.last_transition_seconds_ago) {
            (Some(t), Some(ago)) => format!(
                "{} ago<br><span class=\"muted\">{}</span>",
                words(Duration::from_secs(ago)),
                esc(t)
            ),
            _ => "<span class=\"muted\">never</span>".to_string(),
        };
        let mut probe = match r.next_probe_seconds {
            None => String::new(),
            Some(0) => "<br><span class=\"muted\">its next read probes</span>".to_string(),
            Some(p) => format!(
                "<br><span class=\"muted\">next probe in {}</span>",
                words(Duration::from_secs(p))
            ),
        };
        if let Some(n) = r.answered_in_a_row {
            probe.push_str(&format!(
                "<br><span class=\"muted\">{n} answered in a row</span>"
            ));
        }
        let state = match r.breaker {
            Some("open") => format!(
                "<b>open</b> for {}{probe}",
                words(Duration::from_secs(
                    r.last_transition_seconds_ago.unwrap_or(0)
                ))
            ),
            Some(b) => format!("<b>{b}</b>{probe}"),
            None => "<span class=\"muted\">per namespace</span>".to_string(),
        };
        let window = match (r.errors_in_window, r.threshold) {
            (Some(n), Some(t)) => format!("{n} / {t}"),
            (Some(n), None) => n.to_string(),
            (None, _) => "-".to_string(),
        };
        let mut total = r
            .trigger_errors_total
            .map_or_else(|| "-".to_string(), |n| n.to_string());
        for (n, what) in [
            (r.failed_fast_total, "failed fast"),
            (r.rewritten_total, "rewritten to available"),
        ] {
            if let Some(n) = n.filter(|&n| n > 0) {
                let _ = write!(total, "<br><span class=\"muted\">{n} {what}</span>");
            }
        }
        let dry = if r.dry_run { " (dry run)" } else { "" };
        let ladder = ladder_cell(r);
        let _ = write!(
            out,
            "<tr class=\"{class}\"><td><code>{ns}</code></td><td><code>{pat}</code></td>\
             <td>{mode}{dry}</td><td class=\"state\">{state}</td><td>{action}</td>\
             <td>{window}</td><td>{total}</td><td>{ladder}</td><td>{when}</td><td>{reason}</td></tr>",
            class = r.breaker.unwrap_or("pattern"),
            ns = esc(&r.namespace),
            pat = esc(r.pattern.as_deref().unwrap_or("-")),
            mode = r.mode,
            action = esc(&r.action),
            reason = esc(r.reason.as_deref().unwrap_or("")),
        );
    }
    out.push_str("</table>");
}

/// The rungs, what the reads sent to them got, and the orphans seen in `available` replies.
fn ladder_cell(r: &NsStatus) -> String {
    if r.ladder.is_empty() {
        return "<span class=\"muted\">none</span>".to_string();
    }
    let mut cell = esc(&r.ladder.join(" \u{2192} "));
    if let Some(l) = &r.ladder_reads {
        if r.ladder.contains(&"primary") {
            let _ = write!(
                cell,
                "<br>primary: {} answered, {} failed, {} refused by the guard",
                l.primary_answered, l.primary_failed, l.primary_denied
            );
        }
        if r.ladder.contains(&"available") {
            let _ = write!(
                cell,
                "<br>available: {} answered, {} failed",
                l.available_answered, l.available_failed
            );
        }
        if l.no_time > 0 {
            let _ = write!(cell, "<br>no time left: {}", l.no_time);
        }
    }
    if let Some(n) = r
        .orphans_estimated_total
        .filter(|_| r.ladder.contains(&"available"))
    {
        let _ = write!(cell, "<br>orphans seen: {n}");
    }
    cell
}

fn write_stall(out: &mut String, w: &WriteStallStatus) {
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
        "<table id=\"write-stall-signals\"><tr><th>signal</th><th>where</th><th>state</th>\
         <th>since</th><th>evidence</th></tr>",
    );
    for sig in &w.signals {
        let since = match (&sig.since, sig.since_seconds_ago) {
            (Some(t), Some(ago)) => format!(
                "{} ago<br><span class=\"muted\">{}</span>",
                words(Duration::from_secs(ago)),
                esc(t)
            ),
            _ => "<span class=\"muted\">-</span>".to_string(),
        };
        let _ = write!(
            out,
            "<tr class=\"{state}\"><td>{signal}</td><td>{place}</td><td class=\"state\"><b>{state}</b></td>\
             <td>{since}</td><td>{summary}</td></tr>",
            state = sig.state,
            signal = sig.signal,
            place = esc(&sig.place),
            summary = esc(&sig.summary),
        );
    }
    out.push_str("</table>");
}

fn upstreams(out: &mut String, s: &Status) {
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
        "<table id=\"upstreams\"><tr><th>address</th><th>health</th><th>last hello</th>\
         <th>last check</th><th>primary-rung reads in flight</th><th>last error</th></tr>",
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
    let _ = write!(
        out,
        "<tr><td><code>{}</code></td><td class=\"{h}\">{h}<br><span class=\"muted\">since {}</span></td>\
         <td>{latency}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        esc(&u.address),
        esc(&u.since),
        esc(u.last_check.as_deref().unwrap_or("-")),
        u.ladder_in_flight,
        esc(u.last_error.as_deref().unwrap_or("")),
        h = u.health,
    );
}

fn config(out: &mut String, s: &Status) {
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

/// The page's "Dry run" section: one row per namespace in a dry run or with counts (a
/// namespace whose dry run was turned off keeps its counts); nothing when there is none.
fn dry_run_table(out: &mut String, rows: &[NsStatus]) {
    let shown: Vec<&NsStatus> = rows
        .iter()
        .filter(|r| r.dry_run_status.enabled || r.dry_run_status.any())
        .collect();
    if shown.is_empty() {
        return;
    }
    out.push_str(
        "<h2>Dry run</h2><p class=\"muted\">What these namespaces would have done; nothing \
         of it was done (<code>staleguard_dry_run_total</code>). A read may count twice: its \
         time limit, then a retry.</p><table id=\"dry-run\"><tr><th>namespace</th><th>dry run</th>",
    );
    for action in DRY_RUN_ACTIONS {
        let _ = write!(out, "<th>{}</th>", action.replace('_', " "));
    }
    out.push_str("</tr>");
    for r in shown {
        let _ = write!(
            out,
            "<tr><td><code>{}</code></td><td>{}</td>",
            esc(&r.namespace),
            if r.dry_run_status.enabled {
                "on"
            } else {
                "off"
            }
        );
        for action in DRY_RUN_ACTIONS {
            match &r.dry_run_status.would {
                Some(w) => {
                    let n = w.get(action).copied().unwrap_or(0);
                    let _ = write!(out, "<td data-action=\"{action}\">{n}</td>");
                }
                None => out.push_str("<td class=\"muted\">per namespace</td>"),
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}
