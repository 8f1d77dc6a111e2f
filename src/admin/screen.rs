//! The page's first screen: what is wrong and since when, what staleguard does about it,
//! and what clients got in the last bucket, per `[[namespaces]]` entry (the `summary` of
//! `/status`, drawn). Short sentences; the details come below.

use std::fmt::Write as _;
use std::time::Duration;

use super::summary::{RightNow, Summary};
use super::text::{esc, secs, words};

pub fn render(out: &mut String, s: &Summary) {
    let _ = write!(
        out,
        "<section id=\"summary\" class=\"summary {}\"><div class=\"what\">",
        s.state
    );
    let (first, rest) = match s.wrong.split_first() {
        Some((f, r)) => (esc(f), r),
        None => ("All is well.".to_string(), &[][..]),
    };
    let _ = write!(out, "<p class=\"headline\" id=\"headline\">{first}</p>");
    if let (Some(at), Some(ago)) = (&s.since, s.since_seconds_ago) {
        let clock = at.get(11..19).unwrap_or(at);
        let _ = write!(
            out,
            "<p class=\"since\" id=\"since\">Since {} UTC, {} ago.</p>",
            esc(clock),
            secs(ago)
        );
    }
    if !rest.is_empty() {
        out.push_str("<ul class=\"wrong\">");
        for w in rest {
            let _ = write!(out, "<li>{}</li>", esc(w));
        }
        out.push_str("</ul>");
    }
    out.push_str("<p class=\"doing-title\">staleguard:</p><ul class=\"doing\" id=\"doing\">");
    for d in &s.doing {
        let _ = write!(out, "<li>{}</li>", esc(d));
    }
    out.push_str("</ul></div>");
    right_now(out, s.right_now.as_ref());
    out.push_str("</section>");
}

fn right_now(out: &mut String, now: Option<&RightNow>) {
    out.push_str("<div class=\"now\">");
    let Some(n) = now else {
        out.push_str("<p class=\"muted\">What clients get shows here once the first bucket closes (every <code>[admin] history_interval</code>).</p></div>");
        return;
    };
    let _ = write!(
        out,
        "<p class=\"now-title\">What governed reads got in the last {} <span class=\"muted\">(until {} ago)</span>:</p>",
        words(Duration::from_secs_f64(n.seconds)),
        secs(n.ended_seconds_ago)
    );
    if n.entries.is_empty() {
        out.push_str("<p class=\"muted\" id=\"right-now-empty\">No governed read in the plots' window.</p></div>");
        return;
    }
    out.push_str(
        "<table id=\"right-now\" class=\"cards\"><tr class=\"head\"><th>namespace</th><th>answered</th>\
         <th>rewritten to available</th><th>failed fast</th><th>sent to the primary</th><th>errors met</th></tr>",
    );
    for r in &n.entries {
        let note = match (r.open, r.dry_run) {
            (true, true) => " <span class=\"muted\">breaker open, dry run: nothing changed</span>",
            (true, false) => " <span class=\"muted\">breaker open</span>",
            (false, true) => " <span class=\"muted\">dry run</span>",
            (false, false) => "",
        };
        let _ = write!(
            out,
            "<tr class=\"{class}\" data-entry=\"{name}\"><td data-label=\"namespace\"><code>{name}</code> <span class=\"muted\">{mode}</span>{note}</td>\
             <td data-label=\"answered\">{}</td><td data-label=\"rewritten to available\">{}</td>\
             <td data-label=\"failed fast\">{}</td><td data-label=\"sent to the primary\">{}</td>\
             <td data-label=\"errors met\">{}</td></tr>",
            r.answered,
            r.rewritten,
            r.failed_fast,
            r.primary,
            r.trigger_errors,
            class = if r.open { "open" } else { "pattern" },
            name = esc(&r.entry),
            mode = r.mode,
        );
    }
    out.push_str("</table></div>");
}
