//! The page's details of what is wrong, worst first, below the first screen: one sentence
//! that links a write stall to the breakers it opened, the stall (where, since the whole
//! stall's start, what staleguard does about it), each open breaker (for how long, the next
//! probe, what happens to its reads, how many failed fast or were rewritten, and in dry run
//! what would have been), readiness, Redis and reloads; the green line last, with the last
//! incident when there was one. And the events list, repeats folded. Times are relative.

use std::fmt::Write as _;

use super::history::EventView;
use super::status::Status;
use super::text::{ago, esc, secs};
use crate::events::Kind;

/// Event rows shown on the page (`/status` has every event kept).
pub const PAGE_EVENTS: usize = 50;

/// Every banner, worst first.
pub fn banners(out: &mut String, s: &Status) {
    let open: Vec<_> = s
        .namespaces
        .iter()
        .filter(|n| n.breaker == Some("open"))
        .collect();
    let w = &s.write_stall;
    let stalled_for = secs(w.since_seconds_ago.unwrap_or(0));
    if let (Some(place), false) = (&w.place, open.is_empty()) {
        let names: Vec<String> = open.iter().map(|n| esc(&n.namespace)).collect();
        let dry = open.iter().filter(|n| n.dry_run).count();
        let dry_note = match dry {
            0 => String::new(),
            n if n == open.len() => " (dry run: their reads go out as sent)".to_string(),
            _ => " (those in dry run: their reads go out as sent)".to_string(),
        };
        let _ = write!(
            out,
            "<div class=\"banner bad\" id=\"incident\">One incident: secondaries cannot refresh \
             their routing tables because {} (for {stalled_for}), so the breaker{} of \
             {} {} open{dry_note}.</div>",
            stalled_where(
                place,
                w.signals
                    .iter()
                    .any(|g| g.state == "raised" && g.evidence.shard.is_some())
            ),
            if open.len() == 1 { "" } else { "s" },
            names.join(", "),
            if open.len() == 1 { "is" } else { "are" },
        );
    }
    if let Some(place) = &w.place {
        let shard = w
            .signals
            .iter()
            .any(|g| g.state == "raised" && g.evidence.shard.is_some());
        let evidence = w
            .signals
            .iter()
            .find(|g| g.state == "raised" && &g.place == place)
            .map(|g| format!(" ({} signal: {})", g.signal, esc(&g.summary)))
            .unwrap_or_default();
        let _ = write!(
            out,
            "<div class=\"banner bad\" id=\"write-stall\">Write stall suspected for {stalled_for}: {}{evidence}. staleguard is {}.</div>",
            stalled_where(place, shard),
            esc(w.effect.as_deref().unwrap_or("")),
        );
    }
    for n in &open {
        breaker_banner(out, n);
    }
    if !s.ready {
        out.push_str(
            "<div class=\"banner bad\">Not ready: no upstream answered its last health check.</div>",
        );
    }
    if let Some(f) = s.fleet.as_ref().filter(|f| !f.connected) {
        let since = f
            .since_seconds_ago
            .map_or(String::new(), |a| format!(" for {}", secs(a)));
        let _ = write!(
            out,
            "<div class=\"banner warn\" id=\"fleet-alone\">Redis does not answer{since}: this instance ({}) acts alone: its own breakers, its local guard, every probe and poll. No read fails because of it.</div>",
            esc(&f.name)
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
        green(out, s);
    }
}

/// Where writes do not complete, as a clause: a shard's primary when the serverStatus
/// signal names it, else the router writes go through.
fn stalled_where(place: &str, names_shard: bool) -> String {
    // A composite signal's place reads `shard A (shardA at host:port)`.
    let shard = place.split(" (").next().unwrap_or(place);
    if names_shard && shard.starts_with("shard ") {
        format!("{}'s primary completes no writes", esc(shard))
    } else if names_shard {
        format!("the primary of {} completes no writes", esc(place))
    } else {
        format!("no write through {} completes", esc(place))
    }
}

/// The green line, with the last breaker that closed.
fn green(out: &mut String, s: &Status) {
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
                " The last one closed {} ago (<code>{}</code>{open_for}); see the plots and Recent events.",
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

fn breaker_banner(out: &mut String, n: &super::ns_rows::NsStatus) {
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
    let mut counts = if counts.is_empty() {
        String::new()
    } else {
        format!(" So far: {}.", counts.join(", "))
    };
    if let Some(would) = &n.dry_run_status.would {
        let acts: Vec<String> = would
            .iter()
            .filter(|(_, &c)| c > 0)
            .map(|(a, c)| format!("{c} {}", a.replace('_', " ")))
            .collect();
        if n.dry_run && !acts.is_empty() {
            let _ = write!(
                counts,
                " Dry run, what it would have done so far: {}.",
                acts.join(", ")
            );
        }
    }
    let _ = write!(
        out,
        "<div class=\"banner bad breaker-open\" data-ns=\"{ns}\">Breaker of <code>{ns}</code> ({mode}{dry}) open for {open_for}{probe}. Its reads: {action}.{counts} <span class=\"why\">Opened because: {reason}.</span></div>",
        ns = esc(&n.namespace),
        mode = n.mode,
        dry = if n.dry_run { ", dry run" } else { "" },
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
        Kind::FleetJoined => "Redis answers (fleet)",
        Kind::FleetLost => "Redis lost (acting alone)",
    }
}

/// Whether two events are about the same thing (one breaker, one signal's place, one
/// upstream, the fleet, the config file), so that repeats fold into one row.
fn same_subject(a: &EventView, b: &EventView) -> bool {
    let family = |k: Kind| match k {
        Kind::BreakerOpened | Kind::BreakerClosed => 0,
        Kind::WriteStallRaised | Kind::WriteStallCleared => 1,
        Kind::ReloadApplied | Kind::ReloadRefused => 2,
        Kind::UpstreamUp | Kind::UpstreamDown => 3,
        Kind::FleetJoined | Kind::FleetLost => 4,
    };
    let (a, b) = (&a.event, &b.event);
    family(a.kind) == family(b.kind)
        && a.namespace == b.namespace
        && a.place == b.place
        && a.shard == b.shard
}

/// Consecutive events about one subject (most recent first), folded when there are more
/// than two: a breaker that opened and closed five times is one row.
fn fold(events: &[EventView]) -> Vec<&[EventView]> {
    let mut groups: Vec<&[EventView]> = Vec::new();
    let mut start = 0;
    for i in 1..=events.len() {
        if i == events.len() || !same_subject(&events[start], &events[i]) {
            let run = &events[start..i];
            if run.len() > 2 {
                groups.push(run);
            } else {
                groups.extend(run.chunks(1));
            }
            start = i;
        }
    }
    groups
}

/// The events list, most recent first, repeats folded.
pub fn events(out: &mut String, events: &[EventView], total: u64) {
    out.push_str("<h2>Recent events</h2>");
    if events.is_empty() {
        out.push_str("<p class=\"muted\" id=\"no-events\">Nothing yet: no breaker transition, write-stall signal, reload, upstream or Redis change since start.</p>");
        return;
    }
    out.push_str(
        "<table id=\"events\" class=\"cards\"><tr class=\"head\"><th>when</th><th>what</th><th>where</th><th>reason</th></tr>",
    );
    let groups = fold(events);
    for g in groups.iter().take(PAGE_EVENTS) {
        event_row(out, g);
    }
    out.push_str("</table>");
    if groups.len() > PAGE_EVENTS || (events.len() as u64) < total {
        let shown: usize = groups.iter().take(PAGE_EVENTS).map(|g| g.len()).sum();
        let _ = write!(
            out,
            "<p class=\"muted\">{shown} of {total} events since start shown; <a href=\"status\">status JSON</a> keeps the last {}.</p>",
            crate::events::CAPACITY
        );
    }
}

/// One row: an event, or a run of events about one subject (the latest first).
fn event_row(out: &mut String, g: &[EventView]) {
    let latest = &g[0];
    let ev = &latest.event;
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
    let (when, what_text) = if g.len() == 1 {
        (
            ago(latest.seconds_ago, &latest.at),
            what(ev.kind).to_string(),
        )
    } else {
        let oldest = &g[g.len() - 1];
        let mut kinds: Vec<(Kind, usize)> = Vec::new();
        for e in g {
            match kinds.iter_mut().find(|(k, _)| *k == e.event.kind) {
                Some((_, n)) => *n += 1,
                None => kinds.push((e.event.kind, 1)),
            }
        }
        let counts: Vec<String> = kinds
            .iter()
            .map(|(k, n)| format!("{} {n} times", what(*k)))
            .collect();
        (
            format!(
                "{} ago to {} ago<br><span class=\"muted\" title=\"{}\">from {} UTC</span>",
                secs(oldest.seconds_ago),
                secs(latest.seconds_ago),
                esc(&oldest.at),
                esc(oldest.at.get(11..19).unwrap_or(&oldest.at))
            ),
            format!("{}; last: {}", counts.join(", "), what(ev.kind)),
        )
    };
    let _ = write!(
        out,
        "<tr class=\"{class}\" data-kind=\"{kind}\" data-events=\"{n}\"><td data-label=\"when\">{when}</td>\
         <td data-label=\"what\">{what_text}</td><td data-label=\"where\">{place}</td><td data-label=\"reason\">{reason}</td></tr>",
        class = if ev.kind.is_bad() { "bad" } else { "good" },
        kind = ev.kind.as_str(),
        n = g.len(),
        place = place.join("<br>"),
        reason = esc(&ev.reason),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Event;

    fn ev(kind: Kind, place: &str, ago: u64) -> EventView {
        EventView {
            at: format!("t-{ago}"),
            seconds_ago: ago,
            event: Event::new(kind, "why").place(place),
        }
    }

    #[test]
    fn repeats_fold_into_one_row_and_other_subjects_stay_apart() {
        let events = vec![
            ev(Kind::WriteStallCleared, "upstream m:1", 2),
            ev(Kind::WriteStallRaised, "upstream m:1", 10),
            ev(Kind::WriteStallCleared, "upstream m:1", 20),
            ev(Kind::WriteStallRaised, "upstream m:1", 30),
            ev(Kind::WriteStallCleared, "upstream m:1", 40),
            ev(Kind::WriteStallRaised, "upstream m:1", 50),
            ev(Kind::UpstreamDown, "m:2", 55),
            ev(Kind::WriteStallRaised, "shard A", 60),
            ev(Kind::WriteStallCleared, "upstream m:1", 70),
        ];
        let groups = fold(&events);
        assert_eq!(
            groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
            vec![6, 1, 1, 1]
        );
        let mut out = String::new();
        super::events(&mut out, &events, events.len() as u64);
        assert_eq!(
            out.matches("<tr class=").count(),
            5,
            "a head and four rows: {out}"
        );
        assert!(
            out.contains("write stall cleared 3 times, write stall raised 3 times; last: write stall cleared"),
            "{out}"
        );
        assert!(out.contains("50 s ago to 2 s ago"), "{out}");
        assert!(out.contains("data-events=\"6\""), "{out}");
    }
}
