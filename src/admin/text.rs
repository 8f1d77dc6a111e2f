//! The page's and `/status`'s small text helpers: HTML escaping, times as RFC 3339, and
//! durations in words. A leaf: it imports nothing of the admin module, so every file of it
//! may use these without tying itself to another.

use std::time::{Duration, SystemTime};

/// `&`, `<`, `>`, `"` and `'` escaped for text and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `t` as RFC 3339 in UTC, to the second.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

/// `d` as `1h 2m`, `3m 4s` or `5s`.
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, (s % 3600) / 60),
    }
}

/// `d` in words: `7 s`, `3 min 4 s`, `30 min`, `1 h 2 min`.
pub fn words(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 if s % 60 == 0 => format!("{} min", s / 60),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// The UTC time of day of `unix_ms`: `14:02` or, `with_seconds`, `14:02:11`.
pub fn clock(unix_ms: u64, with_seconds: bool) -> String {
    let s = unix_ms / 1000;
    let (h, m, sec) = ((s / 3600) % 24, (s / 60) % 60, s % 60);
    if with_seconds {
        format!("{h:02}:{m:02}:{sec:02}")
    } else {
        format!("{h:02}:{m:02}")
    }
}

/// `12 s ago` over the time of day of `at` (RFC 3339), the whole time in its tooltip.
pub fn ago(seconds_ago: u64, at: &str) -> String {
    format!(
        "{} ago<br><span class=\"muted\" title=\"{}\">{} UTC</span>",
        secs(seconds_ago),
        esc(at),
        esc(at.get(11..19).unwrap_or(at))
    )
}

/// `s` seconds in words.
pub fn secs(s: u64) -> String {
    words(Duration::from_secs(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<script>a&b\"c'</script>"),
            "&lt;script&gt;a&amp;b&quot;c&#39;&lt;/script&gt;"
        );
    }

    #[test]
    fn durations_in_words() {
        assert_eq!(words(Duration::from_secs(7)), "7 s");
        assert_eq!(words(Duration::from_secs(184)), "3 min 4 s");
        assert_eq!(words(Duration::from_secs(1800)), "30 min");
        assert_eq!(words(Duration::from_secs(3720)), "1 h 2 min");
        assert_eq!(short_duration(Duration::from_secs(184)), "3m 4s");
        // 2026-12-01T14:02:11Z
        assert_eq!(clock(1_796_133_731_000, true), "14:02:11");
        assert_eq!(clock(1_796_133_731_999, false), "14:02");
    }
}
