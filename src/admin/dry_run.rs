//! What `dry_run` namespaces would have done: the `dry_run` object of each namespace in
//! `/status`, and the page's table of those counts (`staleguard_dry_run_total`).

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::page::esc;
use super::status::NsStatus;
use crate::metrics::{Metrics, DRY_RUN_ACTIONS};

/// A namespace's dry run: on or off, and what it would have done so far.
#[derive(Debug, Serialize)]
pub struct DryRunStatus {
    pub enabled: bool,
    /// `dry_run_total` of this namespace by action (every action, zeros included); none for
    /// a wildcard pattern (counted per namespace, on the namespace's own row).
    pub would: Option<BTreeMap<&'static str, u64>>,
}

impl DryRunStatus {
    /// `ns`'s counts (`exact`: a namespace, not a wildcard pattern).
    pub fn of(metrics: &Metrics, ns: &str, enabled: bool, exact: bool) -> DryRunStatus {
        DryRunStatus {
            enabled,
            would: exact.then(|| metrics.dry_run.counts_of(ns).into_iter().collect()),
        }
    }

    fn any(&self) -> bool {
        self.would
            .as_ref()
            .is_some_and(|w| w.values().any(|n| *n > 0))
    }
}

/// The page's "Dry run" section: one row per namespace in a dry run or with counts (a
/// namespace whose dry run was turned off keeps its counts); nothing when there is none.
pub fn render(out: &mut String, rows: &[NsStatus]) {
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
