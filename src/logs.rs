//! How log fields are written in the pretty (human) format: every field value, span fields
//! and the message included, with control characters escaped, so that nothing a client
//! sends (a collection name, a command name, a field name inside an error) can start a line
//! of its own or move the cursor. The JSON format needs no help: serde_json escapes control
//! characters in strings.
//!
//! One place covers every event and span: the formatter, not each call site.
//!
//! Lines that repeat with traffic (one per read) go through [`sampled!`] (`sampled.rs`), so
//! the log does not grow with the read rate. A session's lines carry its connection's span,
//! entered only when something is logged (`conn.rs`).

mod conn;
mod sampled;

pub use conn::{note_spans, ConnScoped, ConnSpan, Entered};
pub(crate) use sampled::sampled;
pub use sampled::{Site, BURST, WINDOW};

/// What a test's subscriber wrote (the log tests here and in `conn.rs`).
#[cfg(test)]
#[derive(Clone, Default)]
struct LogBuf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl LogBuf {
    fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        String::from_utf8(bytes).expect("utf-8")
    }
}

#[cfg(test)]
impl std::io::Write for LogBuf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        (self.0.lock().unwrap_or_else(|p| p.into_inner())).extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuf {
    type Writer = LogBuf;
    fn make_writer(&'a self) -> LogBuf {
        self.clone()
    }
}

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;

/// The pretty format's field formatter: `name=value` pairs separated by spaces, the message
/// bare, as `tracing_subscriber`'s default, with control characters (and the Unicode line
/// separators and bidirectional overrides) escaped as `\n`, `\u{1b}`, ....
#[derive(Debug, Default, Clone, Copy)]
pub struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut v = Fields {
            ansi: writer.has_ansi_escapes(),
            writer,
            empty: true,
            result: Ok(()),
        };
        fields.record(&mut v);
        v.result
    }
}

struct Fields<'w> {
    writer: Writer<'w>,
    ansi: bool,
    empty: bool,
    result: fmt::Result,
}

impl Fields<'_> {
    fn field(&mut self, field: &Field, value: &dyn fmt::Debug) -> fmt::Result {
        let name = field.name();
        // Fields the `log` bridge adds; the default formatter leaves them out too.
        if name.starts_with("log.") {
            return Ok(());
        }
        if !std::mem::take(&mut self.empty) {
            self.writer.write_char(' ')?;
        }
        if name != "message" {
            let name = name.strip_prefix("r#").unwrap_or(name);
            if self.ansi {
                write!(self.writer, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m")?;
            } else {
                write!(self.writer, "{name}=")?;
            }
        }
        write!(Escape(&mut self.writer), "{value:?}")
    }
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.result.is_ok() {
            self.result = self.field(field, value);
        }
    }
}

/// Writes through to `W`, escaping what could break or forge a line.
pub struct Escape<'a, W: fmt::Write>(pub &'a mut W);

impl<W: fmt::Write> fmt::Write for Escape<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut start = 0;
        for (i, c) in s.char_indices() {
            if needs_escape(c) {
                self.0.write_str(&s[start..i])?;
                write!(self.0, "{}", c.escape_default())?;
                start = i + c.len_utf8();
            }
        }
        self.0.write_str(&s[start..])
    }
}

/// Control characters (C0, DEL, C1: newline, carriage return, escape, ...), the Unicode line
/// and paragraph separators, and the bidirectional overrides and isolates (which reorder
/// what a terminal shows).
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(s: &str) -> String {
        let mut out = String::new();
        write!(Escape(&mut out), "{s}").expect("write");
        out
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(escaped("shop.x\nFAKE LOG"), "shop.x\\nFAKE LOG");
        assert_eq!(escaped("a\r\tb\u{1b}[31m"), "a\\r\\tb\\u{1b}[31m");
        assert_eq!(
            escaped("\u{85}\u{2028}\u{202e}"),
            "\\u{85}\\u{2028}\\u{202e}"
        );
        assert_eq!(escaped("plain é ü 日本 \\n"), "plain é ü 日本 \\n");
    }

    #[test]
    fn events_and_spans_are_escaped() {
        let buf = super::LogBuf::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(EscapedFields)
            .with_writer(buf.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let ns = "shop.x\nFORGED span";
            let span = tracing::info_span!("conn", peer = %ns);
            let _e = span.enter();
            let coll = "x\nFORGED field";
            tracing::info!(ns = %coll, name = "q\nFORGED str", "trigger {}", "m\nFORGED message");
        });
        let out = buf.text();
        assert_eq!(out.lines().count(), 1, "{out}");
        assert!(!out.lines().any(|l| l.starts_with("FORGED")), "{out}");
        assert!(out.contains("conn{peer=shop.x\\nFORGED span}"), "{out}");
        assert!(
            out.contains("trigger m\\nFORGED message ns=x\\nFORGED field"),
            "{out}"
        );
        // `?`-formatted strings keep their quotes, as with the default formatter.
        assert!(out.contains("name=\"q\\nFORGED str\""), "{out}");
    }
}
