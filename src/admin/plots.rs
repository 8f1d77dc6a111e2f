//! The page's plots: one inline SVG per `[[namespaces]]` entry that met something in the
//! window, a line per measure (answered, rewritten to `available`, failed fast, sent to the
//! primary, trigger errors) and red bands where a write-stall signal was raised. No
//! script, no external font: the SVG inherits the page's system font.

use std::fmt::Write as _;
use std::time::Duration;

use super::history::{EntryView, HistoryView};
use super::text::{esc, words};
use crate::events::MEASURES;

const W: f64 = 720.0;
const H: f64 = 150.0;
const LEFT: f64 = 44.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 8.0;
const BOTTOM: f64 = 20.0;

/// Each measure's label and colour, in `MEASURES` order.
const LINES: [(&str, &str); MEASURES.len()] = [
    ("answered", "#17582a"),
    ("rewritten to available", "#1f6feb"),
    ("failed fast", "#b3001b"),
    ("sent to the primary", "#8250df"),
    ("trigger errors", "#c76b00"),
];

/// The "last N minutes" section: a summary sentence, the legend and the plots.
pub fn section(out: &mut String, h: &HistoryView) {
    let width = Duration::from_secs_f64(h.bucket_seconds * h.max_buckets as f64);
    let _ = write!(out, "<h2>The last {}</h2>", words(width));
    if h.bucket_ends_unix_ms.is_empty() {
        out.push_str("<p class=\"muted\" id=\"history-empty\">No bucket closed yet (one closes every <code>[admin] history_interval</code>).</p>");
        return;
    }
    let mut sums = [0u64; MEASURES.len()];
    for e in &h.entries {
        for (s, n) in sums.iter_mut().zip(e.totals) {
            *s += n;
        }
    }
    let stalled = h.write_stall.iter().filter(|&&s| s).count();
    let parts: Vec<String> = LINES
        .iter()
        .zip(sums)
        .map(|((label, _), n)| format!("{n} {label}"))
        .collect();
    let _ = write!(
        out,
        "<p id=\"history-summary\">Governed reads in this window: {}.{}</p>",
        parts.join(", "),
        if stalled > 0 {
            format!(
                " A write-stall signal was raised during {} of them (the red bands).",
                words(Duration::from_secs_f64(stalled as f64 * h.bucket_seconds))
            )
        } else {
            String::new()
        }
    );
    out.push_str("<p class=\"legend\">");
    for (label, colour) in LINES {
        let _ = write!(
            out,
            "<span><i style=\"background:{colour}\"></i>{label}</span> "
        );
    }
    out.push_str("<span><i style=\"background:#f4c7c3\"></i>write stall raised</span></p>");
    if h.entries.is_empty() {
        out.push_str("<p class=\"muted\">No governed read in the window.</p>");
    }
    for e in &h.entries {
        plot(out, h, e);
    }
    if !h.quiet_entries.is_empty() {
        let names: Vec<String> = h.quiet_entries.iter().map(|n| esc(n)).collect();
        let _ = write!(
            out,
            "<p class=\"muted\">Nothing in the window for {}.</p>",
            names.join(", ")
        );
    }
}

fn plot(out: &mut String, h: &HistoryView, e: &EntryView) {
    let slots = h.max_buckets.max(1) as f64;
    let n = e.answered.len();
    let first_slot = h.max_buckets.saturating_sub(n) as f64;
    let bw = (W - LEFT - RIGHT) / slots;
    let plot_h = H - TOP - BOTTOM;
    let max = (0..MEASURES.len())
        .flat_map(|i| e.measure(i).iter().copied())
        .max()
        .unwrap_or(0)
        .max(1);
    let x = |i: usize| LEFT + (first_slot + i as f64 + 0.5) * bw;
    let y = |v: u32| TOP + plot_h - f64::from(v) / f64::from(max) * plot_h;
    let totals: Vec<String> = LINES
        .iter()
        .zip(e.totals)
        .filter(|(_, t)| *t > 0)
        .map(|((label, _), t)| format!("{t} {label}"))
        .collect();
    let _ = write!(
        out,
        "<figure class=\"plot\" data-entry=\"{name}\"><figcaption><code>{name}</code> \
         <span class=\"muted\">{totals}</span></figcaption>\
         <svg viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" data-buckets=\"{n}\">\
         <title>{name}: {totals}</title>",
        name = esc(&e.entry),
        totals = totals.join(", "),
    );
    // Write-stall bands, a rect per run of raised buckets.
    let stall = &h.write_stall[h.write_stall.len().saturating_sub(n)..];
    let mut i = 0;
    while i < stall.len() {
        if !stall[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < stall.len() && stall[i] {
            i += 1;
        }
        let _ = write!(
            out,
            "<rect class=\"stall\" x=\"{:.1}\" y=\"{TOP}\" width=\"{:.1}\" height=\"{plot_h}\" fill=\"#f4c7c3\"/>",
            LEFT + (first_slot + start as f64) * bw,
            (i - start) as f64 * bw
        );
    }
    let _ = write!(
        out,
        "<line x1=\"{LEFT}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#999\"/>\
         <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b}\" stroke=\"#999\"/>\
         <text x=\"{tx}\" y=\"{ty}\" font-size=\"11\" text-anchor=\"end\">{max}</text>\
         <text x=\"{tx}\" y=\"{b}\" font-size=\"11\" text-anchor=\"end\">0</text>\
         <text x=\"{LEFT}\" y=\"{lb}\" font-size=\"11\">-{window}</text>\
         <text x=\"{r}\" y=\"{lb}\" font-size=\"11\" text-anchor=\"end\">now</text>",
        b = TOP + plot_h,
        r = W - RIGHT,
        tx = LEFT - 4.0,
        ty = TOP + 10.0,
        lb = H - 4.0,
        window = words(Duration::from_secs_f64(h.bucket_seconds * slots)),
    );
    for (i, (label, colour)) in LINES.iter().enumerate() {
        if e.totals[i] == 0 {
            continue;
        }
        let points: Vec<String> = e
            .measure(i)
            .iter()
            .enumerate()
            .map(|(k, &v)| format!("{:.1},{:.1}", x(k), y(v)))
            .collect();
        let _ = write!(
            out,
            "<polyline data-measure=\"{m}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.6\" points=\"{p}\"><title>{label}</title></polyline>",
            m = MEASURES[i],
            p = points.join(" "),
        );
    }
    out.push_str("</svg></figure>");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(answered: Vec<u32>, failed: Vec<u32>) -> EntryView {
        let n = answered.len();
        let z = vec![0; n];
        EntryView {
            entry: "pay.<x>".into(),
            totals: [
                answered.iter().map(|&v| u64::from(v)).sum(),
                0,
                failed.iter().map(|&v| u64::from(v)).sum(),
                0,
                0,
            ],
            answered,
            rewritten: z.clone(),
            failed_fast: failed,
            primary: z.clone(),
            trigger_errors: z,
        }
    }

    #[test]
    fn a_plot_has_a_line_per_measure_seen_and_the_stall_bands() {
        let h = HistoryView {
            bucket_seconds: 10.0,
            max_buckets: 180,
            bucket_ends_unix_ms: vec![1, 2, 3],
            write_stall: vec![false, true, true],
            entries: vec![entry(vec![5, 0, 2], vec![0, 9, 0])],
            quiet_entries: vec!["demo.quiet".into()],
        };
        let mut out = String::new();
        section(&mut out, &h);
        assert!(out.contains("<h2>The last 30 min</h2>"), "{out}");
        assert_eq!(out.matches("<svg").count(), 1);
        assert_eq!(out.matches("<polyline").count(), 2, "{out}");
        assert!(out.contains("data-measure=\"failed_fast\""));
        assert!(!out.contains("data-measure=\"primary\""));
        assert_eq!(
            out.matches("class=\"stall\"").count(),
            1,
            "one band of two buckets"
        );
        assert!(out.contains("pay.&lt;x&gt;"), "entry names are escaped");
        assert!(out.contains("7 answered, 0 rewritten to available, 9 failed fast"));
        assert!(out.contains("demo.quiet"));
    }

    #[test]
    fn before_the_first_bucket_it_says_so() {
        let mut out = String::new();
        section(&mut out, &HistoryView::default());
        assert!(out.contains("history-empty"));
        assert!(!out.contains("<svg"));
    }
}
