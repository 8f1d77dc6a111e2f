//! The query subset the simulated cluster understands: value comparison, filters (field
//! paths with equality and a few operators, `$and`/`$or`), projection and sort.
//!
//! The simulator works on decoded `bson::Document`s: it is a test bed, not the proxy's hot
//! path, and clarity wins over speed here.

use std::cmp::Ordering;
use std::time::Duration;

use bson::{Bson, Document};

use super::routing::number;
use super::SimError;

const OPERATORS: &[&str] = &[
    "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists",
];

/// The value at a dotted path (`"_id.storeId"`), if every step exists.
pub fn get_path<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let mut cur = doc.get(parts.next()?)?;
    for part in parts {
        cur = match cur {
            Bson::Document(d) => d.get(part)?,
            Bson::Array(a) => a.get(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// MongoDB equality: numbers by value whatever their type, documents field by field in
/// order, arrays element by element, anything else exactly.
pub fn values_equal(a: &Bson, b: &Bson) -> bool {
    match (a, b) {
        (Bson::Document(x), Bson::Document(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .all(|((ka, va), (kb, vb))| ka == kb && values_equal(va, vb))
        }
        (Bson::Array(x), Bson::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| values_equal(p, q))
        }
        _ => match (number(a), number(b)) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        },
    }
}

/// Rank of a type in MongoDB's cross-type sort order.
fn type_rank(v: &Bson) -> u8 {
    match v {
        Bson::MinKey => 0,
        Bson::Null | Bson::Undefined => 1,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 2,
        Bson::String(_) | Bson::Symbol(_) => 3,
        Bson::Document(_) => 4,
        Bson::Array(_) => 5,
        Bson::Binary(_) => 6,
        Bson::ObjectId(_) => 7,
        Bson::Boolean(_) => 8,
        Bson::DateTime(_) => 9,
        Bson::Timestamp(_) => 10,
        Bson::RegularExpression(_) => 11,
        Bson::MaxKey => 13,
        _ => 12,
    }
}

/// A total order close to MongoDB's: by type rank, then by value within the type.
pub fn compare(a: &Bson, b: &Bson) -> Ordering {
    let rank = type_rank(a).cmp(&type_rank(b));
    if rank != Ordering::Equal {
        return rank;
    }
    match (a, b) {
        (Bson::String(x), Bson::String(y)) => x.cmp(y),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.cmp(y),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => {
            (x.time, x.increment).cmp(&(y.time, y.increment))
        }
        (Bson::Document(x), Bson::Document(y)) => compare_seq(
            x.iter().map(|(k, v)| (Some(k), v)),
            y.iter().map(|(k, v)| (Some(k), v)),
        ),
        (Bson::Array(x), Bson::Array(y)) => {
            compare_seq(x.iter().map(|v| (None, v)), y.iter().map(|v| (None, v)))
        }
        _ => match (number(a), number(b)) {
            (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(Ordering::Equal),
            _ => Ordering::Equal,
        },
    }
}

fn compare_seq<'a>(
    mut x: impl Iterator<Item = (Option<&'a String>, &'a Bson)>,
    mut y: impl Iterator<Item = (Option<&'a String>, &'a Bson)>,
) -> Ordering {
    loop {
        match (x.next(), y.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some((ka, va)), Some((kb, vb))) => {
                let o = compare(va, vb).then_with(|| ka.cmp(&kb));
                if o != Ordering::Equal {
                    return o;
                }
            }
        }
    }
}

/// Checks that a filter only uses what [`matches`] understands.
pub fn check_filter(filter: &Document) -> Result<(), SimError> {
    for (key, cond) in filter {
        match key.as_str() {
            "$and" | "$or" | "$nor" => {
                let Bson::Array(parts) = cond else {
                    return Err(SimError::bad_value(format!("{key} must be an array")));
                };
                for part in parts {
                    match part {
                        Bson::Document(d) => check_filter(d)?,
                        _ => {
                            return Err(SimError::bad_value(format!(
                                "{key} entries must be objects"
                            )))
                        }
                    }
                }
            }
            "$where" => {
                if cond.as_str().and_then(parse_where).is_none() {
                    return Err(SimError::bad_value(
                        "the simulator reads $where only as \"sleep(<ms>)\" or \"sleep(<ms>) || true\"",
                    ));
                }
            }
            k if k.starts_with('$') => {
                return Err(SimError::bad_value(format!(
                "unknown top level operator: {k} (the simulator supports $and, $or, $nor, $where)"
            )))
            }
            _ => check_condition(cond)?,
        }
    }
    Ok(())
}

fn check_condition(cond: &Bson) -> Result<(), SimError> {
    let Bson::Document(ops) = cond else {
        return Ok(());
    };
    if !is_operator_doc(ops) {
        return Ok(());
    }
    for (op, arg) in ops {
        if !OPERATORS.contains(&op.as_str()) {
            return Err(SimError::bad_value(format!(
                "unknown operator: {op} (the simulator supports {})",
                OPERATORS.join(", ")
            )));
        }
        if matches!(op.as_str(), "$in" | "$nin") && !matches!(arg, Bson::Array(_)) {
            return Err(SimError::bad_value(format!("{op} needs an array")));
        }
    }
    Ok(())
}

fn is_operator_doc(d: &Document) -> bool {
    d.keys().next().is_some_and(|k| k.starts_with('$'))
}

/// Whether `doc` matches `filter` (checked beforehand by [`check_filter`]).
pub fn matches(doc: &Document, filter: &Document) -> bool {
    filter.iter().all(|(key, cond)| match key.as_str() {
        "$and" => sub_filters(cond).all(|f| matches(doc, f)),
        "$or" => sub_filters(cond).any(|f| matches(doc, f)),
        "$nor" => !sub_filters(cond).any(|f| matches(doc, f)),
        "$where" => cond.as_str().and_then(parse_where).is_some_and(|(_, m)| m),
        path => condition_holds(get_path(doc, path), cond),
    })
}

/// `$where` as the simulator reads it: not JavaScript, only `sleep(<ms>)`, optionally
/// followed by `|| true`, the way tests make a query slow. The sleep and whether documents
/// match (`sleep` returns nothing, so alone it matches none). The sleep is taken once per
/// node the read reaches, not once per document as a server would.
pub fn parse_where(code: &str) -> Option<(Duration, bool)> {
    let code = code.trim();
    let (call, matches) = match code.split_once("||") {
        Some((call, rest)) if rest.trim() == "true" => (call.trim(), true),
        Some(_) => return None,
        None => (code, false),
    };
    let ms = call.strip_prefix("sleep(")?.strip_suffix(')')?.trim();
    Some((Duration::from_millis(ms.parse().ok()?), matches))
}

/// The sleep of a filter's top-level `$where` (zero without one).
pub fn where_cost(filter: &Document) -> Duration {
    filter
        .get_str("$where")
        .ok()
        .and_then(parse_where)
        .map_or(Duration::ZERO, |(d, _)| d)
}

fn sub_filters(cond: &Bson) -> impl Iterator<Item = &Document> {
    let parts = match cond {
        Bson::Array(a) => a.as_slice(),
        _ => &[],
    };
    parts.iter().filter_map(|p| match p {
        Bson::Document(d) => Some(d),
        _ => None,
    })
}

fn condition_holds(value: Option<&Bson>, cond: &Bson) -> bool {
    match cond {
        Bson::Document(ops) if is_operator_doc(ops) => {
            ops.iter().all(|(op, arg)| operator_holds(value, op, arg))
        }
        expected => eq_matches(value, expected),
    }
}

/// Equality as a query sees it: a missing field equals null; an array field matches when it
/// equals the value or contains it.
fn eq_matches(value: Option<&Bson>, expected: &Bson) -> bool {
    match value {
        None => matches!(expected, Bson::Null),
        Some(Bson::Array(items)) if !matches!(expected, Bson::Array(_)) => {
            items.iter().any(|v| values_equal(v, expected))
        }
        Some(v) => values_equal(v, expected),
    }
}

fn operator_holds(value: Option<&Bson>, op: &str, arg: &Bson) -> bool {
    let in_list = |list: &Bson| match list {
        Bson::Array(items) => items.iter().any(|x| eq_matches(value, x)),
        _ => false,
    };
    let ordered = |want: &[Ordering]| {
        value.is_some_and(|v| type_rank(v) == type_rank(arg) && want.contains(&compare(v, arg)))
    };
    match op {
        "$eq" => eq_matches(value, arg),
        "$ne" => !eq_matches(value, arg),
        "$in" => in_list(arg),
        "$nin" => !in_list(arg),
        "$gt" => ordered(&[Ordering::Greater]),
        "$gte" => ordered(&[Ordering::Greater, Ordering::Equal]),
        "$lt" => ordered(&[Ordering::Less]),
        "$lte" => ordered(&[Ordering::Less, Ordering::Equal]),
        "$exists" => value.is_some() == truthy(arg),
        _ => false,
    }
}

/// JavaScript-ish truth of a BSON value, as MongoDB reads flags like `{_id: 0}`.
pub fn truthy(v: &Bson) -> bool {
    match v {
        Bson::Boolean(b) => *b,
        Bson::Null | Bson::Undefined => false,
        other => number(other).is_none_or(|n| n != 0.0),
    }
}

/// Applies a `find` projection: inclusion (`{a: 1}`, `_id` kept unless `_id: 0`) or
/// exclusion (`{a: 0}`), top-level fields only; other forms are ignored.
pub fn project(doc: &Document, projection: &Document) -> Document {
    let wants_id = projection.get("_id").is_none_or(truthy);
    let inclusion = projection
        .iter()
        .any(|(k, v)| k != "_id" && !matches!(v, Bson::Document(_)) && truthy(v));
    let mut out = Document::new();
    for (k, v) in doc {
        let spec = projection.get(k);
        let keep = if k == "_id" {
            wants_id
        } else if inclusion {
            spec.is_some_and(truthy)
        } else {
            spec.is_none_or(truthy)
        };
        if keep {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

/// Sorts by a `{path: 1 | -1, ...}` specification (stable).
pub fn sort(docs: &mut [Document], spec: &Document) {
    let keys: Vec<(&str, bool)> = spec
        .iter()
        .map(|(k, v)| (k.as_str(), number(v).is_none_or(|n| n >= 0.0)))
        .collect();
    docs.sort_by(|a, b| {
        for (path, asc) in &keys {
            let (x, y) = (
                get_path(a, path).unwrap_or(&Bson::Null),
                get_path(b, path).unwrap_or(&Bson::Null),
            );
            let o = compare(x, y);
            if o != Ordering::Equal {
                return if *asc { o } else { o.reverse() };
            }
        }
        Ordering::Equal
    });
}

/// The top-level equalities of a filter (`{a: 1}` and `{a: {$eq: 1}}`), as an upsert
/// seeds its new document from them.
pub fn equalities(filter: &Document) -> Document {
    let mut out = Document::new();
    for (k, v) in filter {
        if k.starts_with('$') || k.contains('.') {
            continue;
        }
        match v {
            Bson::Document(d) if is_operator_doc(d) => {
                if let (1, Some(eq)) = (d.len(), d.get("$eq")) {
                    out.insert(k.clone(), eq.clone());
                }
            }
            other => {
                out.insert(k.clone(), other.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn filters() {
        let d = doc! {"_id": {"productId": 1, "storeId": 2}, "qty": 10, "tags": ["a", "b"]};
        for (f, want) in [
            (doc! {}, true),
            (doc! {"_id": {"productId": 1, "storeId": 2}}, true),
            (doc! {"_id": {"storeId": 2, "productId": 1}}, false),
            (doc! {"_id.storeId": 2_i64}, true),
            (doc! {"qty": 10.0}, true),
            (doc! {"qty": {"$gt": 5, "$lte": 10}}, true),
            (doc! {"qty": {"$in": [1, 2]}}, false),
            (doc! {"tags": "b"}, true),
            (doc! {"missing": null}, true),
            (doc! {"missing": {"$exists": false}}, true),
            (doc! {"$or": [{"qty": 1}, {"qty": 10}]}, true),
        ] {
            assert!(check_filter(&f).is_ok());
            assert_eq!(matches(&d, &f), want, "{f}");
        }
        assert!(check_filter(&doc! {"qty": {"$regex": "x"}}).is_err());
        assert!(check_filter(&doc! {"$where": "x"}).is_err());
    }

    #[test]
    fn projection_and_sort() {
        let d = doc! {"_id": 1, "a": 1, "b": 2};
        assert_eq!(project(&d, &doc! {"a": 1}), doc! {"_id": 1, "a": 1});
        assert_eq!(project(&d, &doc! {"a": 1, "_id": 0}), doc! {"a": 1});
        assert_eq!(project(&d, &doc! {"a": 0}), doc! {"_id": 1, "b": 2});
        let mut v = vec![doc! {"x": 2}, doc! {"x": 1.5}, doc! {"x": "s"}, doc! {}];
        sort(&mut v, &doc! {"x": -1});
        assert_eq!(v[0], doc! {"x": "s"});
        assert_eq!(v[3], doc! {});
    }
}
