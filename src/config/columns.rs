//! Text that fits a terminal of [`WIDTH`] columns, for `check-config`: aligned tables whose
//! last column wraps onto continuation lines, and `name  value` lines whose value wraps.

use std::fmt::Write as _;

/// The terminal width `check-config` output fits.
pub(super) const WIDTH: usize = 100;

/// Space between two columns.
const GAP: usize = 2;

/// Narrowest room the last column of a table gets before the table is written as one
/// record per row instead.
const MIN_LAST: usize = 16;

/// `rows` (the first is the header) as an aligned table, the last column wrapped at commas
/// or spaces to fit [`WIDTH`]. When the other columns alone leave the last less than
/// `MIN_LAST`, each row is written as `header=value` pairs, wrapped.
pub(super) fn table(out: &mut String, rows: &[Vec<String>]) {
    let Some(header) = rows.first() else {
        return;
    };
    let n = header.len();
    let widths: Vec<usize> = (0..n.saturating_sub(1))
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let fixed: usize = widths.iter().map(|w| w + GAP).sum();
    if fixed + MIN_LAST > WIDTH {
        return records(out, rows);
    }
    let room = WIDTH - fixed;
    for row in rows {
        let mut head = String::new();
        for (cell, w) in row.iter().zip(&widths) {
            let _ = write!(head, "{cell:<w$}{:GAP$}", "");
        }
        let last = row.last().map_or("", String::as_str);
        let mut pieces = wrap(last, room).into_iter();
        let _ = writeln!(
            out,
            "{}",
            format!("{head}{}", pieces.next().unwrap_or_default()).trim_end()
        );
        for piece in pieces {
            let _ = writeln!(out, "{:fixed$}{piece}", "");
        }
    }
}

/// Each row after the header as `header=value` pairs, wrapped between pairs at [`WIDTH`]
/// with an indent.
fn records(out: &mut String, rows: &[Vec<String>]) {
    let header = &rows[0];
    for row in &rows[1..] {
        let pairs: Vec<String> = header
            .iter()
            .zip(row)
            .map(|(h, v)| format!("{h}={v}"))
            .collect();
        line(out, "", &pairs.join(", "), 4);
    }
}

/// `name` padded to `indent` columns, then `value` wrapped at [`WIDTH`] (continuation
/// lines indented as far).
pub(super) fn line(out: &mut String, name: &str, value: &str, indent: usize) {
    let pad = indent.max(name.chars().count() + 1);
    let room = WIDTH.saturating_sub(pad).max(MIN_LAST);
    let mut pieces = wrap(value, room).into_iter();
    let first = pieces.next().unwrap_or_default();
    let _ = writeln!(out, "{}", format!("{name:<pad$}{first}").trim_end());
    for piece in pieces {
        let _ = writeln!(out, "{:pad$}{piece}", "");
    }
}

/// `text` in pieces of at most `room` characters, broken after a comma or at a space when
/// one is near enough, else hard.
pub(super) fn wrap(text: &str, room: usize) -> Vec<String> {
    let room = room.max(1);
    let mut pieces = Vec::new();
    let mut rest: Vec<char> = text.chars().collect();
    while rest.len() > room {
        let window = &rest[..=room];
        let cut = window
            .iter()
            .rposition(|c| *c == ' ')
            .or_else(|| {
                window[..room]
                    .iter()
                    .rposition(|c| *c == ',')
                    .map(|i| i + 1)
            })
            .filter(|&i| i > room / 3)
            .unwrap_or(room);
        let piece: String = rest[..cut].iter().collect();
        pieces.push(piece.trim_end().to_string());
        let skip = rest[cut..].iter().take_while(|c| **c == ' ').count();
        rest.drain(..cut + skip);
    }
    pieces.push(rest.into_iter().collect());
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_commas_and_spaces() {
        assert_eq!(wrap("a,b,c,d", 4), ["a,b,", "c,d"]);
        assert_eq!(wrap("one two three", 8), ["one two", "three"]);
        assert_eq!(wrap("abcdefghij", 4), ["abcd", "efgh", "ij"]);
        assert_eq!(wrap("short", 10), ["short"]);
    }

    #[test]
    fn tables_fit_and_fall_back_to_records() {
        let long = (0..40).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let rows = vec![
            vec!["#".to_string(), "name".to_string(), "codes".to_string()],
            vec!["0".to_string(), "x".to_string(), long.clone()],
        ];
        let mut out = String::new();
        table(&mut out, &rows);
        assert!(out.lines().all(|l| l.chars().count() <= WIDTH), "{out}");
        assert_eq!(out.lines().count(), 3, "{out}");
        // The continuation starts under the last column (`#` and `name` take 3 + 6).
        let third = out.lines().nth(2).unwrap_or_default();
        assert!(third.starts_with("         33,"), "{out}");
        let wide = vec![
            vec!["a".to_string(), "b".to_string()],
            vec!["x".repeat(95), "y".to_string()],
        ];
        let mut out = String::new();
        table(&mut out, &wide);
        assert!(out.lines().all(|l| l.chars().count() <= WIDTH), "{out}");
    }
}
