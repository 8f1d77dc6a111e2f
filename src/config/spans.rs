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
        let message = e.message().trim().replace('\n', "; ");
        self.err_line(line, &key, message);
    }
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
}
