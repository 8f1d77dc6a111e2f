//! Whether a read's result can hold the same `_id` twice only through orphans: what the
//! orphan estimate needs to know before it counts repeated `_id`s in a reply.
//!
//! A collection's `_id` is unique, so a `find` (whose projection keeps `_id` as stored)
//! returns each `_id` at most once from the documents each shard owns; a repeat is a copy a
//! migration left behind. An aggregation can repeat or reshape `_id` by itself (`$unwind`,
//! `$group`, `$project: {_id: "$x"}`, `$replaceRoot`, `$unionWith`, `$lookup`, `$facet`,
//! `$sample`, ...), so it counts only when every stage of its pipeline is one known to pass
//! documents through with their `_id` untouched: an allow-list, so that a stage added to
//! the server later never counts by mistake.

use super::*;

/// A top-level pipeline stage (`spec` is its single `{$name: value}` element) that neither
/// repeats documents nor changes their `_id`.
pub(super) fn stage_keeps_ids(spec: &Elem<'_>) -> Result<bool, ClassifyError> {
    Ok(match spec.key {
        b"$match" | b"$sort" | b"$limit" | b"$skip" => true,
        b"$project" => projection_keeps_id(spec)?,
        b"$addFields" | b"$set" => spec.tag == scan::DOCUMENT && !names_id(spec.value)?,
        b"$unset" => unset_keeps_id(spec)?,
        _ => false,
    })
}

/// A projection (`find`'s `projection`, or `$project`) that leaves `_id` as stored: it
/// includes or excludes `_id` (a number or a boolean) or does not name it; never an
/// expression, a sub-projection or a dotted path below `_id`.
pub(super) fn projection_keeps_id(e: &Elem<'_>) -> Result<bool, ClassifyError> {
    if e.tag != scan::DOCUMENT {
        return Ok(false);
    }
    let mut fields = Elements::new(e.value)?;
    while let Some(f) = fields.next_elem()? {
        if f.key == b"_id" {
            let flag = matches!(
                f.tag,
                scan::BOOLEAN | scan::INT32 | scan::INT64 | scan::DOUBLE | DECIMAL128
            );
            if !flag {
                return Ok(false);
            }
        } else if below_id(f.key) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// BSON decimal128, a number a projection may use as a flag.
const DECIMAL128: u8 = 0x13;

/// A field path that is `_id` or inside it.
fn names_id_path(path: &[u8]) -> bool {
    path == b"_id" || below_id(path)
}

fn below_id(path: &[u8]) -> bool {
    path.starts_with(b"_id.")
}

/// A document with a key that is `_id` or a path inside it.
fn names_id(doc: &[u8]) -> Result<bool, ClassifyError> {
    let mut fields = Elements::new(doc)?;
    while let Some(f) = fields.next_elem()? {
        if names_id_path(f.key) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `$unset: "path"` or `$unset: ["path", ...]` naming neither `_id` nor a path inside it.
fn unset_keeps_id(spec: &Elem<'_>) -> Result<bool, ClassifyError> {
    match spec.tag {
        scan::STRING => Ok(!names_id_path(scan::str_value(spec.value)?.as_bytes())),
        scan::ARRAY => {
            let mut paths = Elements::new(spec.value)?;
            while let Some(p) = paths.next_elem()? {
                if p.tag != scan::STRING || names_id_path(scan::str_value(p.value)?.as_bytes()) {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::super::classify;
    use bson::{doc, rawdoc, RawDocumentBuf};

    fn unique(body: RawDocumentBuf) -> bool {
        classify(&body).expect("classifies").unique_ids
    }

    fn aggregate(pipeline: bson::Array) -> bool {
        let body = RawDocumentBuf::try_from(&doc! {
            "aggregate": "inv", "pipeline": pipeline, "cursor": {}, "$db": "demo",
        })
        .unwrap();
        unique(body)
    }

    #[test]
    fn find_counts_unless_its_projection_reshapes_id() {
        let find = |projection: Option<bson::Document>| {
            let mut d = doc! {"find": "inv", "filter": {"qty": {"$gt": 1}}, "$db": "demo"};
            if let Some(p) = projection {
                d.insert("projection", p);
            }
            unique(RawDocumentBuf::try_from(&d).unwrap())
        };
        let table: [(Option<bson::Document>, bool); 10] = [
            (None, true),
            (Some(doc! {"qty": 1}), true),
            (Some(doc! {"_id": 0, "qty": 1}), true),
            (Some(doc! {"_id": 1}), true),
            (Some(doc! {"_id": true, "a.b": 1}), true),
            (Some(doc! {"_id": 1.0}), true),
            (Some(doc! {"_id": "$storeId"}), false),
            (Some(doc! {"_id": {"productId": 1}}), false),
            (Some(doc! {"_id.productId": 1}), false),
            (Some(doc! {"_id": {"$literal": 1}}), false),
        ];
        for (projection, want) in table {
            assert_eq!(find(projection.clone()), want, "{projection:?}");
        }
    }

    #[test]
    fn aggregate_counts_only_allowed_stages() {
        let table: Vec<(bson::Array, bool)> = vec![
            (vec![], true),
            (vec![doc! {"$match": {"qty": 1}}.into()], true),
            (
                vec![
                    doc! {"$match": {"qty": 1}}.into(),
                    doc! {"$sort": {"qty": -1}}.into(),
                    doc! {"$skip": 5}.into(),
                    doc! {"$limit": 10}.into(),
                    doc! {"$project": {"qty": 1, "_id": 1}}.into(),
                    doc! {"$set": {"total": {"$add": ["$qty", 1]}}}.into(),
                    doc! {"$addFields": {"x": 1}}.into(),
                    doc! {"$unset": ["x", "y"]}.into(),
                    doc! {"$unset": "total"}.into(),
                ],
                true,
            ),
            (vec![doc! {"$unwind": "$sizes"}.into()], false),
            (
                vec![
                    doc! {"$match": {"qty": 1}}.into(),
                    doc! {"$unwind": {"path": "$sizes"}}.into(),
                ],
                false,
            ),
            (vec![doc! {"$group": {"_id": "$storeId"}}.into()], false),
            (vec![doc! {"$project": {"_id": "$storeId"}}.into()], false),
            (vec![doc! {"$project": {"_id.storeId": 1}}.into()], false),
            (vec![doc! {"$set": {"_id": "$storeId"}}.into()], false),
            (vec![doc! {"$addFields": {"_id.x": 1}}.into()], false),
            (vec![doc! {"$unset": "_id.storeId"}.into()], false),
            (vec![doc! {"$unset": ["a", "_id"]}.into()], false),
            (vec![doc! {"$replaceRoot": {"newRoot": "$inner"}}.into()], false),
            (vec![doc! {"$replaceWith": "$inner"}.into()], false),
            (
                vec![doc! {"$lookup": {"from": "b", "localField": "x", "foreignField": "y", "as": "z"}}.into()],
                false,
            ),
            (vec![doc! {"$facet": {"a": [{"$match": {}}]}}.into()], false),
            (vec![doc! {"$bucket": {"groupBy": "$qty", "boundaries": [0, 10]}}.into()], false),
            (vec![doc! {"$sortByCount": "$qty"}.into()], false),
            (vec![doc! {"$unionWith": "other"}.into()], false),
            (vec![doc! {"$sample": {"size": 3}}.into()], false),
            (vec![doc! {"$densify": {"field": "x", "range": {"step": 1, "bounds": "full"}}}.into()], false),
            (vec![doc! {"$fill": {"output": {"x": {"value": 0}}}}.into()], false),
            (vec![doc! {"$count": "n"}.into()], false),
            (vec![doc! {"$redact": "$$KEEP"}.into()], false),
            (vec![doc! {"$someFutureStage": {}}.into()], false),
        ];
        for (pipeline, want) in table {
            assert_eq!(aggregate(pipeline.clone()), want, "{pipeline:?}");
        }
    }

    #[test]
    fn other_commands_and_shapes_never_count() {
        for body in [
            rawdoc! {"count": "inv", "$db": "demo"},
            rawdoc! {"distinct": "inv", "key": "qty", "$db": "demo"},
            rawdoc! {"explain": {"find": "inv"}, "$db": "demo"},
            // The server refuses an aggregate without a pipeline, or with a non-array one.
            rawdoc! {"aggregate": "inv", "cursor": {}, "$db": "demo"},
            rawdoc! {"aggregate": "inv", "pipeline": {"$match": {}}, "$db": "demo"},
            rawdoc! {"find": "inv", "projection": 1, "$db": "demo"},
        ] {
            assert!(!unique(body.clone()), "{body:?}");
        }
    }
}
