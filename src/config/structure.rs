//! The shape pass, reporting every structural mistake at once: serde (with
//! `deny_unknown_fields`) stops at the first unknown key, wrong type or missing field, so
//! the document is deserialized again with the offending entry taken out, until it reads
//! or nothing more can be taken out. Each mistake is named with its file:line:key (from
//! the document as written), and an unknown key with the closest known one ("did you
//! mean"). Values are checked afterwards, all at once, by `validate`.

use serde::de::DeserializeOwned;
use toml::de::{DeArray, DeTable, DeValue};
use toml::Spanned;

use super::spans::{key_at, Ctx};

/// Structural mistakes reported before giving up (each costs one more deserialization).
const MAX_MISTAKES: usize = 50;

/// `text` deserialized as `T`, every structural mistake in `ctx` and its entry left out
/// (so that the values of the rest can still be checked); `None` on syntax errors, or when
/// a mistake cannot be located.
pub(super) fn read<T: DeserializeOwned>(text: &str, ctx: &mut Ctx) -> Option<T> {
    let (doc, syntax) = DeTable::parse_recoverable(text);
    if !syntax.is_empty() {
        for e in &syntax {
            ctx.toml_error(e, "syntax".to_string());
        }
        return None;
    }
    let mut pruned = doc.clone();
    for _ in 0..MAX_MISTAKES {
        let err = match T::deserialize(toml::de::Deserializer::from(pruned.clone())) {
            Ok(v) => return Some(v),
            Err(e) => e,
        };
        let key = err
            .span()
            .and_then(|s| key_at(doc.get_ref(), s.start, ""))
            .unwrap_or_default();
        report(ctx, &err, key);
        let taken = err
            .span()
            .is_some_and(|s| take_out(pruned.get_mut(), s.start));
        if !taken {
            return None;
        }
    }
    ctx.err_line(
        0,
        "file",
        format!("stopped after {MAX_MISTAKES} structural mistakes"),
    );
    None
}

/// Adds `err`, an unknown key with the closest known one.
fn report(ctx: &mut Ctx, err: &toml::de::Error, key: String) {
    let message = err.message().trim().replace('\n', "; ");
    let Some(rest) = message.strip_prefix("unknown field `") else {
        ctx.toml_error(err, key);
        return;
    };
    // serde: "unknown field `x`, expected one of `a`, `b`" (or "expected `a` or `b`").
    let names: Vec<&str> = rest.split('`').step_by(2).collect();
    let (unknown, known) = names.split_first().map_or(("", &[][..]), |(u, k)| (*u, k));
    let known: Vec<&str> = known
        .iter()
        .map(|k| k.trim_start_matches([',', ' ']))
        .filter(|k| !k.is_empty() && !k.contains(' '))
        .collect();
    let line = err.span().map_or(0, |s| ctx.line(s.start));
    let text = match closest(unknown, &known) {
        Some(m) => format!("unknown key `{unknown}`: did you mean `{m}`?"),
        None if known.is_empty() => format!("unknown key `{unknown}`: this table takes no keys"),
        None => format!(
            "unknown key `{unknown}`; known keys here: {}",
            known.join(", ")
        ),
    };
    ctx.err_line(line, &key, text);
}

/// The known name closest to `unknown` by edit distance, when close enough to be a typo:
/// at most 2 edits, or a third of the name's length for longer names.
pub(super) fn closest<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    let limit = (unknown.chars().count() / 3).max(2);
    known
        .iter()
        .map(|k| (edit_distance(&unknown.to_lowercase(), k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance (insertions, deletions, substitutions; a swap of two neighbours
/// counts as one edit, as in Damerau's restricted form).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut rows = vec![(0..=b.len()).collect::<Vec<usize>>()];
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            row[j] = (rows[i - 1][j] + 1)
                .min(row[j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(rows[i - 2][j - 2] + 1);
            }
        }
        rows.push(row);
    }
    rows[a.len()][b.len()]
}

/// Takes out of `table` the deepest entry (key and value, or array element) whose key or
/// value spans `offset`; false when none does.
fn take_out(table: &mut DeTable<'_>, offset: usize) -> bool {
    let mut hit: Option<String> = None;
    for (k, v) in table.iter_mut() {
        if !(k.span().contains(&offset) || v.span().contains(&offset) || inside(v, offset)) {
            continue;
        }
        if take_out_value(v, offset) {
            return true;
        }
        hit = Some(k.get_ref().to_string());
        break;
    }
    match hit {
        Some(name) => {
            let old = std::mem::take(table);
            *table = old
                .into_iter()
                .filter(|(k, _)| *k.get_ref() != name)
                .collect();
            true
        }
        None => false,
    }
}

/// Within a value: a nested entry or array element spanning `offset`, taken out.
fn take_out_value(v: &mut Spanned<DeValue<'_>>, offset: usize) -> bool {
    match v.get_mut() {
        DeValue::Table(t) => take_out(t, offset),
        DeValue::Array(items) => {
            let Some(i) = items
                .iter()
                .position(|item| item.span().contains(&offset) || inside(item, offset))
            else {
                return false;
            };
            if take_out_value(&mut items.as_mut()[i], offset) {
                return true;
            }
            let mut rest = DeArray::new();
            for (j, item) in items.iter().enumerate() {
                if j != i {
                    rest.push(item.clone());
                }
            }
            *items = rest;
            true
        }
        _ => false,
    }
}

/// A table's span is its header only: `offset` may lie in one of its entries below.
fn inside(v: &Spanned<DeValue<'_>>, offset: usize) -> bool {
    match v.get_ref() {
        DeValue::Table(t) => t.iter().any(|(k, v)| {
            k.span().contains(&offset) || v.span().contains(&offset) || inside(v, offset)
        }),
        DeValue::Array(items) => items
            .iter()
            .any(|i| i.span().contains(&offset) || inside(i, offset)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_are_close_and_other_words_are_not() {
        let known = ["threshold", "window", "cooldown", "min_cooldown", "mode"];
        assert_eq!(closest("thresold", &known), Some("threshold"));
        assert_eq!(closest("widnow", &known), Some("window"));
        assert_eq!(closest("Window", &known), Some("window"));
        assert_eq!(closest("min_cooldwn", &known), Some("min_cooldown"));
        assert_eq!(closest("colour", &known), None);
        assert_eq!(closest("x", &known), None);
        assert_eq!(edit_distance("abc", "acb"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
