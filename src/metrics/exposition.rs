//! The two text formats `/metrics` answers in, from the one encoding the exporter makes:
//! OpenMetrics 1.0 when the scraper asks for it (`Accept`), the Prometheus text format
//! 0.0.4 otherwise.
//!
//! `prometheus_client` writes OpenMetrics, where a counter family `x` has the sample
//! `x_total`. A text-format reader (promtool, the Prometheus text parser) takes the sample
//! `x_total` for a family of its own, untyped and without help, so both outputs name a
//! counter family by its sample: `# TYPE x_total counter`. That is the 0.0.4 format's own
//! rule, and in OpenMetrics the form Prometheus's parser accepts ("Prometheus allows
//! _total") and Prometheus's Go client wrote until 2023; a strict OpenMetrics 1.0 parser
//! (Python's `prometheus_client`) calls it a clashing name. The text format also loses
//! `# EOF` and `# UNIT` (neither is part of 0.0.4). No family here carries exemplars or
//! `_created` samples; a counter's `_created` sample would be dropped from both.

use std::collections::HashSet;

/// Which text format to answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Prometheus text format 0.0.4 (the default).
    Text,
    /// OpenMetrics 1.0.0, only when the `Accept` header prefers it.
    OpenMetrics,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }

    /// The format an `Accept` header asks for: OpenMetrics when a media range for it
    /// (`application/openmetrics-text`, version absent, 1.0.0 or 0.0.1) has a `q` above 0
    /// and at least that of every range the text format answers (`text/plain` without a
    /// version or with 0.0.4, `text/*`, `*/*`); the text format otherwise, also without a
    /// header or when nothing listed is known (no 406: a scraper gets the format every
    /// Prometheus version reads).
    pub fn negotiate(accept: Option<&str>) -> Format {
        let Some(accept) = accept else {
            return Format::Text;
        };
        let (mut om, mut text) = (0.0f32, 0.0f32);
        for range in accept.split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let mut q = 1.0f32;
            let mut version: Option<&str> = None;
            for p in parts {
                let Some((k, v)) = p.split_once('=') else {
                    continue;
                };
                let v = v.trim().trim_matches('"');
                match k.trim().to_ascii_lowercase().as_str() {
                    "q" => {
                        q = v
                            .parse()
                            .ok()
                            .filter(|q: &f32| q.is_finite())
                            .unwrap_or(0.0)
                    }
                    "version" => version = Some(v),
                    _ => {}
                }
            }
            match media.as_str() {
                "application/openmetrics-text"
                    if version.is_none_or(|v| v == "1.0.0" || v == "0.0.1") =>
                {
                    om = om.max(q)
                }
                "text/plain" if version.is_none_or(|v| v == "0.0.4") => text = text.max(q),
                "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if om > 0.0 && om >= text {
            Format::OpenMetrics
        } else {
            Format::Text
        }
    }
}

/// `om` (the exporter's OpenMetrics text) in `format`, counter families named by their
/// sample (see the module docs).
pub(super) fn finish(om: &str, format: Format) -> String {
    let counters: HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len() + counters.len() * 24);
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let (keyword, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            match keyword {
                "EOF" if format == Format::Text => continue,
                "UNIT" if format == Format::Text => continue,
                "HELP" | "TYPE" | "UNIT" => {
                    let (name, text) = tail.split_once(' ').unwrap_or((tail, ""));
                    out.push_str("# ");
                    out.push_str(keyword);
                    out.push(' ');
                    out.push_str(name);
                    if counters.contains(name) {
                        out.push_str("_total");
                    }
                    if !text.is_empty() {
                        out.push(' ');
                        out.push_str(text);
                    }
                    out.push('\n');
                    continue;
                }
                _ => {}
            }
        } else {
            let name = line.split(['{', ' ']).next().unwrap_or("");
            let created = name
                .strip_suffix("_created")
                .is_some_and(|family| counters.contains(family));
            if created {
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OM: &str = "# HELP a_requests Requests.\n# TYPE a_requests counter\n\
        a_requests_total{x=\"1\"} 3\na_requests_created 12.5\n\
        # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n\
        # HELP a_seconds Time.\n# TYPE a_seconds histogram\n# UNIT a_seconds seconds\n\
        a_seconds_bucket{le=\"+Inf\"} 1\na_seconds_sum 0.5\na_seconds_count 1\n# EOF\n";

    #[test]
    fn counters_are_named_by_their_sample_in_both_formats() {
        let text = finish(OM, Format::Text);
        assert_eq!(
            text,
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\n\
             a_requests_total{x=\"1\"} 3\n\
             # HELP a_up Up.\n# TYPE a_up gauge\na_up 1\n\
             # HELP a_seconds Time.\n# TYPE a_seconds histogram\n\
             a_seconds_bucket{le=\"+Inf\"} 1\na_seconds_sum 0.5\na_seconds_count 1\n"
        );
        let om = finish(OM, Format::OpenMetrics);
        assert!(om.starts_with("# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total{x=\"1\"} 3\n# HELP a_up"), "{om}");
        assert!(om.contains("# UNIT a_seconds seconds\n"), "{om}");
        assert!(om.ends_with("# EOF\n"), "{om}");
        assert!(!om.contains("_created"), "{om}");
    }

    #[test]
    fn openmetrics_only_when_preferred() {
        use Format::*;
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        for (accept, want) in [
            (None, Text),
            (Some(""), Text),
            (Some("*/*"), Text),
            (Some("text/plain; version=0.0.4"), Text),
            (Some("text/plain;version=0.0.4;q=0.9, */*;q=0.1"), Text),
            (Some("application/json"), Text),
            (Some(prometheus), OpenMetrics),
            (Some("application/openmetrics-text"), OpenMetrics),
            (
                Some("Application/OpenMetrics-Text; Version=\"1.0.0\""),
                OpenMetrics,
            ),
            (
                Some("application/openmetrics-text, text/plain"),
                OpenMetrics,
            ),
            (Some("application/openmetrics-text;q=0"), Text),
            (Some("application/openmetrics-text;q=0.5, text/plain"), Text),
            (Some("application/openmetrics-text;q=0.5, */*;q=0.6"), Text),
            (Some("application/openmetrics-text;version=2.0.0"), Text),
            (Some("application/openmetrics-text;q=junk"), Text),
            (
                Some("text/plain;version=0.0.4;q=0.5,application/openmetrics-text;q=0.8"),
                OpenMetrics,
            ),
        ] {
            assert_eq!(Format::negotiate(accept), want, "{accept:?}");
        }
    }
}
