//! The page's news, worst first: one sentence that links a write stall to the breakers it
//! opened, the stall (where, for how long, what staleguard does about it), each open
//! breaker (for how long, the next probe, what happens to its reads, how many failed fast
//! or were rewritten), readiness and reloads; the green line last, with the last incident
//! when there was one. And the events list. Times are relative ("for 7 s").

use std::fmt::Write as _;

use super::history::EventView;
use super::status::{NsStatus, SignalStatus, Status, WriteStallStatus};
use super::text::{esc, secs};
use crate::events::Kind;

/// Events shown on the page (`/status` has every one kept).
pub const PAGE_EVENTS: usize = 50;

/// Where writes do not complete, as a clause: a shard's primary when the serverStatus
/// signal names it, else the router writes go through.
fn stalled_where(sig: &SignalStatus) -> String {
    // A composite signal's place reads `shard A (shardA at host:port)`.
    let shard = sig.place.split(" (").next().unwrap_or(&sig.place);
    match &sig.evidence.shard {
        Some(_) if shard.starts_with("shard ") => {
            format!("{}'s primary completes no writes", esc(shard))
        }
        Some(id) => format!("shard {}'s primary completes no writes", esc(id)),
        None if sig.signal == "composite" => {
            format!("the primary of {} completes no writes", esc(&sig.place))
        }
        None => format!("no write through {} completes", esc(&sig.place)),
    }
}

/// Every banner, worst first.
pub fn banners(out: &mut String, s: &Status) {
    let open: Vec<&NsStatus> = s
        .namespaces
        .iter()
        .filter(|n| n.breaker == Some("open"))
        .collect();
    let w = &s.write_stall;
    // The signal that says most about where: one naming the shard, else the first raised.
    let mut raised_signals = w.signals.iter().filter(|sig| sig.state == "raised");
    let raised = raised_signals
        .clone()
        .find(|sig| sig.evidence.shard.is_some())
        .or_else(|| raised_signals.next());
    if let (Some(sig), false) = (raised, open.is_empty()) {
        let names: Vec<String> = open.iter().map(|n| esc(&n.namespace)).collect();
        let _ = write!(
            out,
            "<div class=\"banner bad\" id=\"incident\">One incident: secondaries cannot refresh \
             their routing tables because {} (for {}), so the breaker{} of \
             {} {} open.</div>",
            stalled_where(sig),
            secs(sig.since_seconds_ago.unwrap_or(0)),
            if open.len() == 1 { "" } else { "s" },
            names.join(", "),
            if open.len() == 1 { "is" } else { "are" },
        );
    }
    if let Some(sig) = raised {
        stall_banner(out, w, sig);
    }
    for n in &open {
        breaker_banner(out, n);
    }
    if !s.ready {
        out.push_str(
            "<div class=\"banner bad\">Not ready: no upstream answered its last health check.</div>",
        );
    }
    if s.config.last_reload.result == "error" {
        let _ = write!(
            out,
            "<div class=\"banner warn\">The last config reload failed ({}); the previous config is still in force. See Configuration below.</div>",
            esc(&s.config.last_reload.at)
        );
    }
    if open.is_empty() {
        let last = s
            .events
            .iter()
            .find(|e| e.event.kind == Kind::BreakerClosed)
            .map(|e| {
                let ns = e.event.namespace.as_deref();
                let opened = s.events.iter().find(|o| {
                    o.event.kind == Kind::BreakerOpened
                        && o.event.namespace.as_deref() == ns
                        && o.event.at_unix_ms <= e.event.at_unix_ms
                });
                let open_for = opened.map_or(String::new(), |o| {
                    let ms = e.event.at_unix_ms - o.event.at_unix_ms;
                    format!(", after {} open", secs(ms / 1000))
                });
                format!(
                    " The last one closed {} ago (<code>{}</code>{open_for}); see the plots and Recent events below.",
                    secs(e.seconds_ago),
                    esc(ns.unwrap_or(""))
                )
            })
            .unwrap_or_default();
        let _ = write!(
            out,
            "<div class=\"banner good\" id=\"no-open-breaker\">No breaker is open.{last}</div>"
        );
    }
}

fn stall_banner(out: &mut String, w: &WriteStallStatus, sig: &SignalStatus) {
    let doing = if w.action == "open_fallback_breakers" {
        let held = if w.held_breakers.is_empty() {
            String::new()
        } else {
            let names: Vec<String> = w.held_breakers.iter().map(|n| esc(n)).collect();
            format!(" (now: {})", names.join(", "))
        };
        format!("holding the breakers of fallback namespaces open{held}: their reads go out with readConcern available before any fails")
    } else {
        "only observing (<code>on_write_stall = \"observe\"</code>): fallback reads still meet their first failures before their breakers open".to_string()
    };
    let _ = write!(
        out,
        "<div class=\"banner bad\" id=\"write-stall\">Write stall suspected for {}: {} ({} signal: {}). staleguard is {doing}.</div>",
        secs(sig.since_seconds_ago.unwrap_or(0)),
        stalled_where(sig),
        sig.signal,
        esc(&sig.summary),
    );
}

fn breaker_banner(out: &mut String, n: &NsStatus) {
    let open_for = secs(n.last_transition_seconds_ago.unwrap_or(0));
    let probe = match (n.next_probe_seconds, n.held_by_write_stall) {
        (_, true) => ", held open while writes are not completing".to_string(),
        (Some(0), _) => ", its next read probes".to_string(),
        (Some(p), _) => format!(", next probe in {}", secs(p)),
        (None, _) => String::new(),
    };
    let mut counts = Vec::new();
    if let Some(f) = n.failed_fast_total.filter(|&f| f > 0) {
        counts.push(format!("{f} failed fast"));
    }
    if let Some(r) = n.rewritten_total.filter(|&r| r > 0) {
        counts.push(format!("{r} rewritten to available"));
    }
    let counts = if counts.is_empty() {
        String::new()
    } else {
        format!(" So far: {}.", counts.join(", "))
    };
    let _ = write!(
        out,
        "<div class=\"banner bad breaker-open\" data-ns=\"{ns}\">Breaker of <code>{ns}</code> ({mode}) open for {open_for}{probe}. Its reads: {action}.{counts} <span class=\"why\">Opened because: {reason}.</span></div>",
        ns = esc(&n.namespace),
        mode = n.mode,
        action = esc(&n.action),
        reason = esc(n.reason.as_deref().unwrap_or("-")),
    );
}

/// What an event is, in words.
fn what(kind: Kind) -> &'static str {
    match kind {
        Kind::BreakerOpened => "breaker opened",
        Kind::BreakerClosed => "breaker closed",
        Kind::WriteStallRaised => "write stall raised",
        Kind::WriteStallCleared => "write stall cleared",
        Kind::ReloadApplied => "config reloaded",
        Kind::ReloadRefused => "config reload refused",
        Kind::UpstreamUp => "upstream up",
        Kind::UpstreamDown => "upstream down",
    }
}

/// The events list, most recent first.
pub fn events(out: &mut String, events: &[EventView], total: u64) {
    out.push_str("<h2>Recent events</h2>");
    if events.is_empty() {
        out.push_str("<p class=\"muted\" id=\"no-events\">Nothing yet: no breaker transition, write-stall signal, reload or upstream change since start.</p>");
        return;
    }
    out.push_str(
        "<table id=\"events\"><tr><th>when</th><th>what</th><th>where</th><th>reason</th></tr>",
    );
    for e in events.iter().take(PAGE_EVENTS) {
        let ev = &e.event;
        let mut place = Vec::new();
        if let Some(ns) = &ev.namespace {
            place.push(format!("<code>{}</code>", esc(ns)));
        }
        if let Some(shard) = &ev.shard {
            place.push(format!("shard {}", esc(shard)));
        }
        if let Some(p) = &ev.place {
            place.push(esc(p));
        }
        let _ = write!(
            out,
            "<tr class=\"{class}\" data-kind=\"{kind}\"><td>{ago} ago<br><span class=\"muted\">{at}</span></td>\
             <td>{what}</td><td>{place}</td><td>{reason}</td></tr>",
            class = if ev.kind.is_bad() { "bad" } else { "good" },
            kind = ev.kind.as_str(),
            ago = secs(e.seconds_ago),
            at = esc(&e.at),
            what = what(ev.kind),
            place = place.join("<br>"),
            reason = esc(&ev.reason),
        );
    }
    out.push_str("</table>");
    let shown = events.len().min(PAGE_EVENTS);
    if (shown as u64) < total {
        let _ = write!(
            out,
            "<p class=\"muted\">{shown} of {total} events since start shown; <a href=\"status\">status JSON</a> keeps the last {}.</p>",
            crate::events::CAPACITY
        );
    }
}
