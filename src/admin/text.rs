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
    }
}
