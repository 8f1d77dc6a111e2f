//! Update documents: `$set`, `$inc`, `$unset`, `$setOnInsert`, or a replacement; and the
//! new document an upsert creates.

use bson::oid::ObjectId;
use bson::{Bson, Document};

use super::query::equalities;
use super::routing::number;
use super::SimError;

const UPDATE_OPERATORS: &[&str] = &["$set", "$inc", "$unset", "$setOnInsert"];

/// Checks an update document before anything is applied.
pub fn check_update(u: &Document) -> Result<(), SimError> {
    let operators = u.keys().filter(|k| k.starts_with('$')).count();
    if operators != 0 && operators != u.len() {
        return Err(SimError::failed_to_parse(
            "an update mixes operators and plain fields",
        ));
    }
    for (op, arg) in u {
        if operators != 0 && !UPDATE_OPERATORS.contains(&op.as_str()) {
            return Err(SimError::failed_to_parse(format!(
                "Unknown modifier: {op} (the simulator supports {})",
                UPDATE_OPERATORS.join(", ")
            )));
        }
        if operators != 0 && !matches!(arg, Bson::Document(_)) {
            return Err(SimError::failed_to_parse(format!(
                "Modifiers operate on fields but we found type {:?} instead",
                arg.element_type()
            )));
        }
    }
    Ok(())
}

/// Applies `u` to `doc`. `inserting` enables `$setOnInsert`. The `_id` cannot change.
pub fn apply(doc: &mut Document, u: &Document, inserting: bool) -> Result<(), SimError> {
    if !u.keys().any(|k| k.starts_with('$')) {
        return replace(doc, u);
    }
    for (op, arg) in u {
        let Bson::Document(fields) = arg else {
            continue;
        };
        for (path, value) in fields {
            if path == "_id" || path.starts_with("_id.") {
                return Err(SimError::new(
                    66,
                    "ImmutableField",
                    "Performing an update on the path '_id' would modify the immutable field '_id'",
                ));
            }
            match op.as_str() {
                "$set" => set_path(doc, path, value.clone())?,
                "$setOnInsert" if inserting => set_path(doc, path, value.clone())?,
                "$inc" => inc_path(doc, path, value)?,
                "$unset" => unset_path(doc, path),
                _ => {}
            }
        }
    }
    Ok(())
}

fn replace(doc: &mut Document, replacement: &Document) -> Result<(), SimError> {
    let id = doc.get("_id").cloned();
    if let (Some(old), Some(new)) = (&id, replacement.get("_id")) {
        if !super::query::values_equal(old, new) {
            return Err(SimError::new(
                66,
                "ImmutableField",
                "After applying the update, the (immutable) field '_id' was found to have been altered",
            ));
        }
    }
    let mut out = Document::new();
    if let Some(id) = id {
        out.insert("_id", id);
    }
    for (k, v) in replacement {
        if k != "_id" {
            out.insert(k.clone(), v.clone());
        }
    }
    *doc = out;
    Ok(())
}

/// The parent document of the last path step, created on the way if missing.
fn parent_mut<'a>(
    doc: &'a mut Document,
    path: &'a str,
) -> Result<(&'a mut Document, &'a str), SimError> {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap_or(path);
    let mut cur = doc;
    for part in parts {
        let next = cur
            .entry(part.to_string())
            .or_insert_with(|| Bson::Document(Document::new()));
        cur = match next {
            Bson::Document(d) => d,
            _ => {
                return Err(SimError::new(
                    28,
                    "PathNotViable",
                    format!("Cannot create field '{last}' in element {{{part}: ...}}"),
                ))
            }
        };
    }
    Ok((cur, last))
}

fn set_path(doc: &mut Document, path: &str, value: Bson) -> Result<(), SimError> {
    let (parent, key) = parent_mut(doc, path)?;
    parent.insert(key.to_string(), value);
    Ok(())
}

fn inc_path(doc: &mut Document, path: &str, by: &Bson) -> Result<(), SimError> {
    if number(by).is_none() {
        return Err(SimError::new(
            14,
            "TypeMismatch",
            "Cannot increment with non-numeric argument",
        ));
    }
    let (parent, key) = parent_mut(doc, path)?;
    let current = parent.get(key).cloned().unwrap_or(Bson::Int32(0));
    let sum = add(&current, by).ok_or_else(|| {
        SimError::new(
            14,
            "TypeMismatch",
            format!("Cannot apply $inc to a value of non-numeric type. {{{key}: ...}} has the field '{key}' of non-numeric type"),
        )
    })?;
    parent.insert(key.to_string(), sum);
    Ok(())
}

fn unset_path(doc: &mut Document, path: &str) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let Some(last) = parts.pop() else { return };
    let mut cur = doc;
    for part in parts {
        match cur.get_mut(part) {
            Some(Bson::Document(d)) => cur = d,
            _ => return,
        }
    }
    cur.remove(last);
}

/// Adds two BSON numbers with MongoDB's type promotion (int32 → int64 on overflow, anything
/// with a double → double).
pub fn add(a: &Bson, b: &Bson) -> Option<Bson> {
    Some(match (a, b) {
        (Bson::Int32(x), Bson::Int32(y)) => match x.checked_add(*y) {
            Some(s) => Bson::Int32(s),
            None => Bson::Int64(i64::from(*x) + i64::from(*y)),
        },
        (Bson::Int32(_) | Bson::Int64(_), Bson::Int32(_) | Bson::Int64(_)) => {
            Bson::Int64(as_i64(a)?.wrapping_add(as_i64(b)?))
        }
        _ => Bson::Double(number(a)? + number(b)?),
    })
}

fn as_i64(v: &Bson) -> Option<i64> {
    match v {
        Bson::Int32(i) => Some(i64::from(*i)),
        Bson::Int64(i) => Some(*i),
        _ => None,
    }
}

/// The document an upsert inserts: the filter's equalities, then the update (or the
/// replacement plus the filter's `_id`), with a fresh ObjectId if no `_id` resulted.
pub fn upsert_document(filter: &Document, u: &Document) -> Result<Document, SimError> {
    let seed = equalities(filter);
    let mut doc = if u.keys().any(|k| k.starts_with('$')) {
        let mut d = seed;
        apply(&mut d, u, true)?;
        d
    } else {
        let mut d = Document::new();
        if let Some(id) = seed.get("_id").or_else(|| u.get("_id")) {
            d.insert("_id", id.clone());
        }
        for (k, v) in u {
            if k != "_id" {
                d.insert(k.clone(), v.clone());
            }
        }
        d
    };
    if !doc.contains_key("_id") {
        let mut with_id = Document::new();
        with_id.insert("_id", ObjectId::new());
        with_id.extend(std::mem::take(&mut doc));
        doc = with_id;
    }
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn operators() {
        let mut d = doc! {"_id": 1, "qty": 10};
        let u = doc! {"$inc": {"qty": -1}, "$set": {"s.t": "x"}};
        check_update(&u).expect("valid");
        apply(&mut d, &u, false).expect("applies");
        assert_eq!(d, doc! {"_id": 1, "qty": 9, "s": {"t": "x"}});
        apply(&mut d, &doc! {"$unset": {"s": ""}}, false).expect("applies");
        assert_eq!(d, doc! {"_id": 1, "qty": 9});
        assert!(apply(&mut d, &doc! {"$set": {"_id": 2}}, false).is_err());
        assert!(check_update(&doc! {"$push": {"a": 1}}).is_err());
        assert!(check_update(&doc! {"$set": {"a": 1}, "b": 1}).is_err());
    }

    #[test]
    fn upserts() {
        let d = upsert_document(&doc! {"_id": "p"}, &doc! {"$set": {"at": 1}}).expect("ok");
        assert_eq!(d, doc! {"_id": "p", "at": 1});
        let d = upsert_document(&doc! {"k": 1}, &doc! {"v": 2}).expect("ok");
        assert!(matches!(d.get("_id"), Some(Bson::ObjectId(_))));
        assert_eq!(d.get("v"), Some(&Bson::Int32(2)));
    }
}
