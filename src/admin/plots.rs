//! The page's plots: for a window of time (the current or last incident by default, or the
//! last 5 minutes, 30 minutes or 3 hours), one plot per `[[namespaces]]` entry that met
//! something in it, a line per measure (answered, rewritten to `available`, failed fast,
//! sent to the primary, trigger errors), red bands where a write-stall signal was raised,
//! and UTC time labels. The lines are an inline SVG that stretches to the plot's width;
//! the labels are HTML, so they keep their size on a phone. No script, no external asset.

use std::fmt::Write as _;
use std::time::Duration;

use super::history::{EntryView, HistoryView, SeriesView};
use super::text::{clock, esc, words};
use crate::events::MEASURES;

/// Each measure's label and colour, in `MEASURES` order.
const LINES: [(&str, &str); MEASURES.len()] = [
    ("answered", "#17582a"),
    ("rewritten to available", "#1f6feb"),
    ("failed fast", "#b3001b"),
    ("sent to the primary", "#8250df"),
    ("trigger errors", "#c76b00"),
];

/// The SVG's drawing box; it is stretched to the plot's size.
const VW: f64 = 1000.0;
const VH: f64 = 100.0;

/// Quiet buckets that still belong to one incident.
const GAP: usize = 3;

/// The windows a reader may pick (`?window=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The current or last incident, with some time around it.
    Incident,
    Minutes5,
    Minutes30,
    Hours3,
}

impl Window {
    pub const ALL: [Window; 4] = [
        Window::Incident,
        Window::Minutes5,
        Window::Minutes30,
        Window::Hours3,
    ];

    /// From the `window` query parameter; unknown values are none (the default view).
    pub fn parse(v: &str) -> Option<Window> {
        Window::ALL.into_iter().find(|w| w.param() == v)
    }

    pub fn param(self) -> &'static str {
        match self {
            Window::Incident => "incident",
            Window::Minutes5 => "5m",
            Window::Minutes30 => "30m",
            Window::Hours3 => "3h",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Window::Incident => "the incident",
            Window::Minutes5 => "5 min",
            Window::Minutes30 => "30 min",
            Window::Hours3 => "3 h",
        }
    }

    fn span_ms(self) -> Option<u64> {
        match self {
            Window::Incident => None,
            Window::Minutes5 => Some(5 * 60_000),
            Window::Minutes30 => Some(30 * 60_000),
            Window::Hours3 => Some(3 * 3_600_000),
        }
    }
}

/// What the plots show: a range of buckets of one series.
struct View<'a> {
    s: &'a SeriesView,
    /// Bucket indexes, inclusive.
    first: usize,
    last: usize,
    /// Unix ms at the left and right edges.
    from: u64,
    to: u64,
    /// The window picked (the incident when there is one, else 30 minutes).
    window: Window,
    /// The incident's buckets, when the window is the incident.
    incident: Option<(usize, usize)>,
}

/// The buckets of `s` in which something but answers happened (or a stall was raised).
fn eventful(s: &SeriesView, i: usize) -> bool {
    s.write_stall.get(i).copied().unwrap_or(false)
        || s.entries
            .iter()
            .any(|e| (1..MEASURES.len()).any(|m| e.measure(m).get(i).copied().unwrap_or(0) > 0))
}

/// The last incident in `s`: the last run of eventful buckets, quiet gaps of up to
/// [`GAP`] buckets included.
fn last_incident(s: &SeriesView) -> Option<(usize, usize)> {
    let n = s.bucket_ends_unix_ms.len();
    let end = (0..n).rev().find(|&i| eventful(s, i))?;
    let mut start = end;
    let mut quiet = 0;
    for i in (0..end).rev() {
        if eventful(s, i) {
            start = i;
            quiet = 0;
        } else {
            quiet += 1;
            if quiet > GAP {
                break;
            }
        }
    }
    Some((start, end))
}

/// The view for `asked` (none: the incident when there is one, else 30 minutes).
fn view(h: &HistoryView, asked: Option<Window>) -> Option<View<'_>> {
    let fine = &h.fine;
    let coarse = &h.coarse;
    let wants_incident = asked.is_none_or(|w| w == Window::Incident);
    if wants_incident {
        let found = last_incident(fine)
            .map(|r| (fine, r))
            .or_else(|| last_incident(coarse).map(|r| (coarse, r)));
        if let Some((s, (a, b))) = found {
            let n = s.bucket_ends_unix_ms.len();
            let pad = ((b - a + 1) / 4).max(3);
            let first = a.saturating_sub(pad);
            // Ongoing (or just over): up to the last bucket.
            let last = if n - 1 - b <= GAP {
                n - 1
            } else {
                (b + pad).min(n - 1)
            };
            // At least 12 buckets, when there are.
            let first = first.min(last.saturating_sub(11));
            return Some(edges(s, first, last, Window::Incident, Some((a, b))));
        }
    }
    let window = match asked {
        Some(Window::Incident) | None => Window::Minutes30,
        Some(w) => w,
    };
    let span = window.span_ms().unwrap_or(30 * 60_000);
    let covers = |s: &SeriesView| (s.bucket_seconds * 1000.0) as u64 * s.max_buckets as u64;
    let s = if span <= covers(fine) || coarse.bucket_ends_unix_ms.is_empty() {
        fine
    } else {
        coarse
    };
    let n = s.bucket_ends_unix_ms.len();
    if n == 0 {
        return None;
    }
    let end = s.bucket_ends_unix_ms[n - 1];
    let first = s
        .bucket_ends_unix_ms
        .iter()
        .position(|&e| e > end.saturating_sub(span))
        .unwrap_or(0);
    let mut v = edges(s, first, n - 1, window, None);
    // A window asked for spans its whole width; the default one spans the buckets there
    // are (a fresh instance's few buckets are not squeezed into a corner).
    if asked.is_some() {
        v.from = end.saturating_sub(span);
    }
    Some(v)
}

fn edges(
    s: &SeriesView,
    first: usize,
    last: usize,
    window: Window,
    incident: Option<(usize, usize)>,
) -> View<'_> {
    let w = (s.bucket_seconds * 1000.0) as u64;
    View {
        s,
        first,
        last,
        from: s.bucket_ends_unix_ms[first].saturating_sub(w),
        to: s.bucket_ends_unix_ms[last],
        window,
        incident,
    }
}

impl View<'_> {
    fn x(&self, t: u64) -> f64 {
        let span = self.to.saturating_sub(self.from).max(1) as f64;
        (t.saturating_sub(self.from) as f64 / span * VW).clamp(0.0, VW)
    }

    fn width_ms(&self) -> u64 {
        (self.s.bucket_seconds * 1000.0) as u64
    }

    /// The entries that met something in the view.
    fn entries(&self) -> impl Iterator<Item = &EntryView> {
        let (a, b) = (self.first, self.last);
        self.s.entries.iter().filter(move |e| {
            (0..MEASURES.len()).any(|m| {
                e.measure(m)
                    .get(a..=b)
                    .is_some_and(|v| v.iter().any(|&n| n > 0))
            })
        })
    }

    /// The time labels: a round step giving at most 6, as UTC clock times.
    fn ticks(&self) -> Vec<(u64, String)> {
        const STEPS: [u64; 12] = [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200];
        let span = self.to.saturating_sub(self.from) / 1000;
        let step = STEPS
            .iter()
            .copied()
            .find(|s| span / s <= 6)
            .unwrap_or(7200);
        let mut t = (self.from / 1000).div_ceil(step) * step;
        let mut out = Vec::new();
        while t * 1000 <= self.to {
            out.push((t * 1000, clock(t * 1000, step < 60)));
            t += step;
        }
        out
    }
}

/// The plots section: the window's links, a sentence on it, the legend and the plots.
/// `query` is added to each link (the admin token, when the page was opened with one).
pub fn section(out: &mut String, h: &HistoryView, asked: Option<Window>, query: &str) {
    out.push_str("<section id=\"plots\">");
    let Some(v) = view(h, asked) else {
        out.push_str("<h2>What reads met</h2><p class=\"muted\" id=\"history-empty\">No bucket closed yet (one closes every <code>[admin] history_interval</code>).</p></section>");
        return;
    };
    let span = Duration::from_millis(v.to.saturating_sub(v.from));
    let title = match v.incident {
        Some((a, b)) => {
            let ends = &v.s.bucket_ends_unix_ms;
            let start = clock(ends[a].saturating_sub(v.width_ms()), true);
            if b + GAP >= ends.len() - 1 {
                format!("The incident, since {start} UTC")
            } else {
                format!("The last incident: {start}–{} UTC", clock(ends[b], true))
            }
        }
        None if asked.is_some() => format!("The last {}", v.window.label()),
        None => format!("The last {}", words(span)),
    };
    let _ = write!(
        out,
        "<h2 id=\"plots-title\">{title}</h2><nav class=\"windows\">Show: "
    );
    for w in Window::ALL {
        let class = if w == v.window { " class=\"on\"" } else { "" };
        let _ = write!(
            out,
            "<a{class} href=\"?window={}{}\">{}</a> ",
            w.param(),
            esc(query),
            w.label()
        );
    }
    out.push_str("</nav>");
    summary_line(out, &v);
    out.push_str("<p class=\"legend\">");
    for (label, colour) in LINES {
        let _ = write!(
            out,
            "<span><i style=\"background:{colour}\"></i>{label}</span> "
        );
    }
    out.push_str("<span><i style=\"background:#f4c7c3\"></i>write stall raised</span></p>");
    let mut any = false;
    out.push_str("<div class=\"plots\">");
    for e in v.entries() {
        any = true;
        plot(out, &v, e);
    }
    out.push_str("</div>");
    if !any {
        out.push_str("<p class=\"muted\">No governed read in this window.</p>");
    }
    let quiet: Vec<String> = h.fine.quiet_entries.iter().map(|n| esc(n)).collect();
    if !quiet.is_empty() {
        let _ = write!(
            out,
            "<p class=\"muted\">No governed read of {} in the plots' window.</p>",
            quiet.join(", ")
        );
    }
    out.push_str("</section>");
}

/// Governed reads in the window, and how long a stall was raised in it.
fn summary_line(out: &mut String, v: &View<'_>) {
    let mut sums = [0u64; MEASURES.len()];
    for e in &v.s.entries {
        for (m, s) in sums.iter_mut().enumerate() {
            *s += e.measure(m)[v.first..=v.last]
                .iter()
                .map(|&n| u64::from(n))
                .sum::<u64>();
        }
    }
    let stalled = v.s.write_stall[v.first..=v.last]
        .iter()
        .filter(|&&s| s)
        .count();
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
                " A write-stall signal was raised during {} of it (the red bands).",
                words(Duration::from_secs_f64(stalled as f64 * v.s.bucket_seconds))
            )
        } else {
            String::new()
        }
    );
}

fn plot(out: &mut String, v: &View<'_>, e: &EntryView) {
    let (a, b) = (v.first, v.last);
    let max = (0..MEASURES.len())
        .flat_map(|m| e.measure(m)[a..=b].iter().copied())
        .max()
        .unwrap_or(0)
        .max(1);
    let totals: Vec<String> = LINES
        .iter()
        .enumerate()
        .filter_map(|(m, (label, _))| {
            let t: u64 = e.measure(m)[a..=b].iter().map(|&n| u64::from(n)).sum();
            (t > 0).then(|| format!("{t} {label}"))
        })
        .collect();
    let n = b - a + 1;
    let _ = write!(
        out,
        "<figure class=\"plot\" data-entry=\"{name}\"><figcaption><code>{name}</code> \
         <span class=\"muted\">{totals}</span></figcaption><div class=\"chart\">\
         <span class=\"ymax\">{max}</span><span class=\"y0\">0</span>\
         <svg viewBox=\"0 0 {VW} {VH}\" preserveAspectRatio=\"none\" role=\"img\" data-buckets=\"{n}\">\
         <title>{name}: {totals}</title>",
        name = esc(&e.entry),
        totals = totals.join(", "),
    );
    let w = v.width_ms();
    let ends = &v.s.bucket_ends_unix_ms;
    // Write-stall bands, a rect per run of raised buckets.
    let mut i = a;
    while i <= b {
        if !v.s.write_stall[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i <= b && v.s.write_stall[i] {
            i += 1;
        }
        let x0 = v.x(ends[start].saturating_sub(w));
        let x1 = v.x(ends[i - 1]);
        let _ = write!(
            out,
            "<rect class=\"stall\" x=\"{x0:.1}\" y=\"0\" width=\"{:.1}\" height=\"{VH}\" fill=\"#f4c7c3\"/>",
            (x1 - x0).max(1.0)
        );
    }
    let ticks = v.ticks();
    for (t, _) in &ticks {
        let x = v.x(*t);
        let _ = write!(
            out,
            "<line x1=\"{x:.1}\" y1=\"0\" x2=\"{x:.1}\" y2=\"{VH}\" stroke=\"#e2e2df\" vector-effect=\"non-scaling-stroke\"/>"
        );
    }
    let _ = write!(
        out,
        "<line x1=\"0\" y1=\"{VH}\" x2=\"{VW}\" y2=\"{VH}\" stroke=\"#999\" vector-effect=\"non-scaling-stroke\"/>"
    );
    let y = |n: u32| VH - 3.0 - f64::from(n) / f64::from(max) * (VH - 6.0);
    for (m, (label, colour)) in LINES.iter().enumerate() {
        let values = &e.measure(m)[a..=b];
        if values.iter().all(|&n| n == 0) {
            continue;
        }
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .map(|(k, &n)| {
                let mid = ends[a + k].saturating_sub(w / 2);
                format!("{:.1},{:.1}", v.x(mid), y(n))
            })
            .collect();
        let _ = write!(
            out,
            "<polyline data-measure=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" vector-effect=\"non-scaling-stroke\" points=\"{}\"><title>{label}</title></polyline>",
            MEASURES[m],
            points.join(" "),
        );
    }
    out.push_str("</svg><div class=\"xaxis\">");
    for (t, label) in &ticks {
        let at = v.x(*t) / VW * 100.0;
        // Labels at the edges hang inside the plot rather than past it.
        let hang = if at > 92.0 {
            " class=\"r\""
        } else if at < 8.0 {
            " class=\"l\""
        } else {
            ""
        };
        let _ = write!(out, "<span{hang} style=\"left:{at:.1}%\">{label}</span>");
    }
    out.push_str("</div></div></figure>");
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

    /// `n` buckets of 10 s ending at 14:00:00 UTC and every 10 s after.
    fn series(answered: Vec<u32>, failed: Vec<u32>, stall: Vec<bool>) -> SeriesView {
        let t0 = 1_796_133_600_000;
        SeriesView {
            bucket_seconds: 10.0,
            max_buckets: 180,
            bucket_ends_unix_ms: (0..answered.len() as u64)
                .map(|i| t0 + i * 10_000)
                .collect(),
            write_stall: stall,
            entries: vec![entry(answered, failed)],
            quiet_entries: vec!["demo.quiet".into()],
        }
    }

    #[test]
    fn the_default_view_zooms_to_the_last_incident_with_time_labels() {
        // 60 buckets (10 min): quiet but for answers, then 4 buckets with failures and a
        // stall, 20 quiet buckets after (over).
        let n = 60;
        let mut failed = vec![0; n];
        let mut stall = vec![false; n];
        for i in 30..34 {
            failed[i] = 5;
            stall[i] = true;
        }
        let h = HistoryView {
            fine: series(vec![7; n], failed, stall),
            coarse: SeriesView::default(),
        };
        let mut out = String::new();
        section(&mut out, &h, None, "&token=t");
        assert!(
            out.contains("<h2 id=\"plots-title\">The last incident: 14:04:50–14:05:30 UTC"),
            "{out}"
        );
        assert_eq!(out.matches("<svg").count(), 1);
        let buckets: usize = out
            .split("data-buckets=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        assert!(
            (12..=20).contains(&buckets),
            "zoomed: {buckets} buckets\n{out}"
        );
        assert_eq!(out.matches("<polyline").count(), 2, "{out}");
        assert!(out.contains("data-measure=\"failed_fast\""));
        assert!(!out.contains("data-measure=\"primary\""));
        assert_eq!(out.matches("class=\"stall\"").count(), 1, "one band");
        assert!(out.contains("pay.&lt;x&gt;"), "entry names are escaped");
        assert!(out.contains("20 failed fast"), "{out}");
        assert!(out.contains("demo.quiet"));
        // Time labels at a round step, UTC.
        assert!(
            out.contains(">14:05:00</span>") || out.contains(">14:05</span>"),
            "{out}"
        );
        // Links to the other windows keep the page's query.
        assert!(out.contains("href=\"?window=3h&amp;token=t\""), "{out}");
    }

    #[test]
    fn fixed_windows_and_no_incident() {
        let n = 40;
        let h = HistoryView {
            fine: series(vec![3; n], vec![0; n], vec![false; n]),
            coarse: SeriesView::default(),
        };
        let mut out = String::new();
        section(&mut out, &h, None, "");
        assert!(
            out.contains("The last 6 min 40 s"),
            "no incident: the buckets there are, up to 30 min\n{out}"
        );
        let mut out = String::new();
        section(&mut out, &h, Some(Window::Minutes5), "");
        assert!(out.contains("The last 5 min"), "{out}");
        assert!(out.contains("data-buckets=\"30\""), "{out}");
        assert!(out.contains("class=\"on\" href=\"?window=5m\""), "{out}");
    }

    #[test]
    fn before_the_first_bucket_it_says_so() {
        let mut out = String::new();
        section(&mut out, &HistoryView::default(), None, "");
        assert!(out.contains("history-empty"));
        assert!(!out.contains("<svg"));
    }
}
