//! The page's per-namespace tables: every configured pattern and every namespace with a
//! breaker (open ones first and highlighted), and what `dry_run` namespaces would have done.
//! Each cell carries its column's name (`data-label`), so that on a narrow screen a row
//! reads as a card instead of a table wider than the screen.

use std::fmt::Write as _;

use super::ns_rows::NsStatus;
use super::text::{ago, esc, secs};
use crate::metrics::DRY_RUN_ACTIONS;

/// The namespaces table.
pub fn namespaces(out: &mut String, rows: &[NsStatus]) {
    out.push_str("<h2>Namespaces</h2>");
    if rows.is_empty() {
        out.push_str("<p class=\"muted\">No [[namespaces]] configured: every read passes through untouched.</p>");
        return;
    }
    out.push_str(
        "<table id=\"namespaces\" class=\"cards\"><tr class=\"head\"><th>namespace</th>\
         <th>breaker</th><th>what happens to reads</th><th>since start</th><th>ladder</th><th>last change</th></tr>",
    );
    for r in rows {
        row(out, r);
    }
    out.push_str("</table>");
}

fn row(out: &mut String, r: &NsStatus) {
    let mut probe = match r.next_probe_seconds {
        None => String::new(),
        Some(0) => "<br><span class=\"muted\">its next read probes</span>".to_string(),
        Some(p) => format!("<br><span class=\"muted\">next probe in {}</span>", secs(p)),
    };
    if let Some(n) = r.answered_in_a_row {
        let _ = write!(
            probe,
            "<br><span class=\"muted\">{n} answered in a row</span>"
        );
    }
    let window = match (r.errors_in_window, r.threshold) {
        (Some(n), Some(t)) => format!("<br>errors in window {n} / {t}"),
        (Some(n), None) => format!("<br>errors in window {n}"),
        (None, _) => String::new(),
    };
    let state = match r.breaker {
        Some("open") => format!(
            "<b>open</b> for {}{window}{probe}",
            secs(r.last_transition_seconds_ago.unwrap_or(0))
        ),
        Some(b) => format!("<b>{b}</b>{window}{probe}"),
        None => "<span class=\"muted\">per namespace</span>".to_string(),
    };
    let mut counts = vec![r.trigger_errors_total.map_or_else(
        || "<span class=\"muted\">per namespace</span>".to_string(),
        |n| format!("{n} trigger errors"),
    )];
    for (n, what) in [
        (r.failed_fast_total, "failed fast"),
        (r.rewritten_total, "rewritten to available"),
    ] {
        if let Some(n) = n.filter(|&n| n > 0) {
            counts.push(format!("{n} {what}"));
        }
    }
    let pattern = match r.pattern.as_deref() {
        Some(p) if p != r.namespace => format!(" under <code>{}</code>", esc(p)),
        Some(_) => String::new(),
        None => " (no pattern any more)".to_string(),
    };
    let dry = if r.dry_run { ", dry run" } else { "" };
    let last = match (&r.last_transition, r.last_transition_seconds_ago) {
        (Some(t), Some(a)) => ago(a, t),
        _ => "<span class=\"muted\">never</span>".to_string(),
    };
    let reason = r
        .reason
        .as_deref()
        .map_or(String::new(), |why| format!("<br>{}", esc(why)));
    let _ = write!(
        out,
        "<tr class=\"{class}\"><td data-label=\"namespace\"><code>{ns}</code><br>\
         <span class=\"muted\">{mode}{dry}{pattern}</span></td>\
         <td class=\"state\" data-label=\"breaker\">{state}</td><td data-label=\"reads\">{action}</td>\
         <td data-label=\"since start\">{counts}</td><td data-label=\"ladder\">{ladder}</td>\
         <td data-label=\"last change\">{last}{reason}</td></tr>",
        class = r.breaker.unwrap_or("pattern"),
        ns = esc(&r.namespace),
        mode = r.mode,
        action = esc(&r.action),
        counts = counts.join("<br>"),
        ladder = ladder_cell(r),
    );
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

/// The "Dry run" section: one row per namespace in a dry run or with counts (a namespace
/// whose dry run was turned off keeps its counts); nothing when there is none.
pub fn dry_run(out: &mut String, rows: &[NsStatus]) {
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
         time limit, then a retry.</p><table id=\"dry-run\" class=\"cards\"><tr class=\"head\"><th>namespace</th><th>dry run</th>",
    );
    for action in DRY_RUN_ACTIONS {
        let _ = write!(out, "<th>{}</th>", action.replace('_', " "));
    }
    out.push_str("</tr>");
    for r in shown {
        let _ = write!(
            out,
            "<tr><td data-label=\"namespace\"><code>{}</code></td><td data-label=\"dry run\">{}</td>",
            esc(&r.namespace),
            if r.dry_run_status.enabled {
                "on"
            } else {
                "off"
            }
        );
        for action in DRY_RUN_ACTIONS {
            let label = action.replace('_', " ");
            match &r.dry_run_status.would {
                Some(w) => {
                    let n = w.get(action).copied().unwrap_or(0);
                    let _ = write!(
                        out,
                        "<td data-action=\"{action}\" data-label=\"{label}\">{n}</td>"
                    );
                }
                None => {
                    let _ = write!(
                        out,
                        "<td class=\"muted\" data-label=\"{label}\">per namespace</td>"
                    );
                }
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}
