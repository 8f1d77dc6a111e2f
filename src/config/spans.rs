//! Locating problems: every error names the file, the 1-based line and the dotted key
//! (`namespaces[2].window`) it is about. `Ctx` collects them during validation; `key_at`
//! finds the key of a byte offset that serde reported without one.

use toml::Spanned;

use super::ConfigError;

/// A value found invalid: what is wrong with it is recorded in the [`Ctx`] (with its line and
/// key), so the error carries nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recorded;

/// The file being validated and the errors found so far.
pub(super) struct Ctx {
    file: String,
    line_starts: Vec<usize>,
    pub(super) errors: Vec<ConfigError>,
}

impl Ctx {
    /// A context for `text`, read from `file` (as it should be named in errors).
    pub(super) fn new(file: String, text: &str) -> Ctx {
        Ctx {
            file,
            line_starts: line_starts(text),
            errors: Vec::new(),
        }
    }

    /// 1-based line of a byte offset.
    pub(super) fn line(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|&s| s <= offset)
    }

    pub(super) fn err_line(&mut self, line: usize, key: &str, message: String) {
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line,
            key: key.to_string(),
            message,
        });
    }

    pub(super) fn err<T>(&mut self, at: &Spanned<T>, key: &str, message: String) {
        let line = self.line(at.span().start);
        self.err_line(line, key, message);
    }

    pub(super) fn toml_error(&mut self, e: &toml::de::Error, key: String) {
        let line = e.span().map_or(0, |s| self.line(s.start));
        let message = plain(&e.message().trim().replace('\n', "; "));
        self.err_line(line, &key, message);
    }
}

/// A deserializer's message in the file's own words: serde's `invalid type: string "3",
/// expected i64` becomes `expected a whole number, found the string "3" (write 3,
/// without quotes)`; Rust's type names never reach the operator.
pub(super) fn plain(message: &str) -> String {
    for (prefix, what) in [("invalid type: ", "found"), ("invalid value: ", "found")] {
        let Some(rest) = message.strip_prefix(prefix) else {
            continue;
        };
        let Some((found, expected)) = rest.rsplit_once(", expected ") else {
            continue;
        };
        let want = expected_in_words(expected);
        let (thing, bare) = found_in_words(found);
        let hint = match (bare, want.as_str()) {
            (Some(v), w) if w.starts_with("a whole number") && v.parse::<i64>().is_ok() => {
                format!(" (write {v}, without quotes)")
            }
            (Some(v), "a number") if v.parse::<f64>().is_ok() => {
                format!(" (write {v}, without quotes)")
            }
            (Some(v), "true or false") if v == "true" || v == "false" => {
                format!(" (write {v}, without quotes)")
            }
            _ => String::new(),
        };
        return format!("expected {want}, {what} {thing}{hint}");
    }
    message.to_string()
}

/// serde's name of what was expected, in words.
fn expected_in_words(e: &str) -> String {
    match e {
        "u8" => "a whole number from 0 to 255".into(),
        "u16" => "a whole number from 0 to 65535".into(),
        "u32" => "a whole number from 0 to 4294967295".into(),
        "u64" | "usize" | "u128" => "a whole number, 0 or more".into(),
        "i8" | "i16" | "i32" | "i64" | "isize" | "i128" => "a whole number".into(),
        "f32" | "f64" => "a number".into(),
        "a boolean" => "true or false".into(),
        "a string" => "a string in quotes".into(),
        "a sequence" => "a list, [...]".into(),
        "a map" => "a table".into(),
        other => other.to_string(),
    }
}

/// serde's description of what was found, in words, and a string's own text (for a hint).
fn found_in_words(f: &str) -> (String, Option<String>) {
    let ticked = |s: &str| s.trim_matches('`').to_string();
    if let Some(s) = f.strip_prefix("string ") {
        let inner = s.trim_matches('"').to_string();
        return (format!("the string {s}"), Some(inner));
    }
    for (serde, words) in [
        ("integer ", "the number "),
        ("floating point ", "the number "),
        ("boolean ", ""),
    ] {
        if let Some(v) = f.strip_prefix(serde) {
            return (format!("{words}{}", ticked(v)), None);
        }
    }
    let words = match f {
        "sequence" => "a list",
        "map" => "a table",
        other => other,
    };
    (words.to_string(), None)
}

fn line_starts(text: &str) -> Vec<usize> {
    std::iter::once(0)
        .chain(text.match_indices('\n').map(|(i, _)| i + 1))
        .collect()
}

/// The dotted path of the key (or value) at byte `offset`, deepest first.
pub(super) fn key_at(table: &toml::de::DeTable<'_>, offset: usize, prefix: &str) -> Option<String> {
    for (k, v) in table {
        let path = join(prefix, k.get_ref());
        if k.span().contains(&offset) {
            return Some(path);
        }
        if let Some(found) = value_key_at(v, offset, &path) {
            return Some(found);
        }
    }
    None
}

fn value_key_at(v: &Spanned<toml::de::DeValue<'_>>, offset: usize, path: &str) -> Option<String> {
    match v.get_ref() {
        toml::de::DeValue::Table(t) => {
            if let Some(found) = key_at(t, offset, path) {
                return Some(found);
            }
        }
        toml::de::DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                if let Some(found) = value_key_at(item, offset, &format!("{path}[{i}]")) {
                    return Some(found);
                }
            }
        }
        _ => {}
    }
    v.span().contains(&offset).then(|| path.to_string())
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_offsets_to_lines() {
        let ctx = Ctx {
            file: String::new(),
            line_starts: line_starts("ab\n\ncd\n"),
            errors: Vec::new(),
        };
        assert_eq!([0, 2, 3, 4, 6, 7].map(|o| ctx.line(o)), [1, 1, 2, 3, 3, 4]);
    }

    #[test]
    fn key_paths_from_offsets() {
        let text = "a = 1\n[t]\nb = [1, 2]\n[[n]]\nc = 'x'\n[[n]]\nd = 'y'\n";
        let doc = toml::de::DeTable::parse(text).unwrap();
        let at = |needle: &str| key_at(doc.get_ref(), text.find(needle).unwrap(), "");
        assert_eq!(at("a =").as_deref(), Some("a"));
        assert_eq!(at("b =").as_deref(), Some("t.b"));
        assert_eq!(at("2]").as_deref(), Some("t.b[1]"));
        assert_eq!(at("c =").as_deref(), Some("n[0].c"));
        assert_eq!(at("'y'").as_deref(), Some("n[1].d"));
    }

    #[test]
    fn serde_type_names_become_words() {
        for (serde, plain_text) in [
            (
                "invalid type: string \"3\", expected i64",
                "expected a whole number, found the string \"3\" (write 3, without quotes)",
            ),
            (
                "invalid type: floating point `2.5`, expected u32",
                "expected a whole number from 0 to 4294967295, found the number 2.5",
            ),
            (
                "invalid type: string \"yes\", expected a boolean",
                "expected true or false, found the string \"yes\"",
            ),
            (
                "invalid type: integer `5`, expected a string",
                "expected a string in quotes, found the number 5",
            ),
            (
                "invalid type: string \"a\", expected a sequence",
                "expected a list, [...], found the string \"a\"",
            ),
            (
                "invalid value: integer `-1`, expected u64",
                "expected a whole number, 0 or more, found the number -1",
            ),
            ("missing field `mode`", "missing field `mode`"),
        ] {
            assert_eq!(plain(serde), plain_text);
        }
    }
}
