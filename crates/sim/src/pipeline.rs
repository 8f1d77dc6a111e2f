//! The aggregation subset: `$match`, `$group` (`$sum`, `$avg`, `$min`, `$max`, `$first`,
//! `$last`, `$count`), `$count`, `$limit`, `$skip`, `$sort`, `$project`, `$unwind` (of a
//! top-level field; `"$f"` or `{path: "$f"}`, without options).
//!
//! mongos targets shards with the first `$match` (see `commands`); the whole pipeline then
//! runs over the documents the shards returned. Results are the same as a split pipeline.

use bson::{Bson, Document};

use super::query::{check_filter, compare, get_path, matches, project, sort, truthy};
use super::routing::number;
use super::update::add;
use super::SimError;

/// One parsed stage.
#[derive(Debug, Clone)]
pub enum Stage {
    Match(Document),
    Group {
        id: Bson,
        fields: Vec<(String, Acc)>,
    },
    Count(String),
    Limit(usize),
    Skip(usize),
    Sort(Document),
    Project(Document),
    /// The top-level field whose array is unwound: one document per element, each with
    /// the same `_id`; a missing, null or empty field drops the document.
    Unwind(String),
}

#[derive(Debug, Clone)]
pub enum Acc {
    Sum(Bson),
    Avg(Bson),
    Min(Bson),
    Max(Bson),
    First(Bson),
    Last(Bson),
}

/// Parses a pipeline, refusing stages and accumulators the simulator does not know.
pub fn parse(pipeline: &[Bson]) -> Result<Vec<Stage>, SimError> {
    pipeline
        .iter()
        .map(|s| match s {
            Bson::Document(d) if d.len() == 1 => parse_stage(d),
            _ => Err(SimError::new(
                40323,
                "Location40323",
                "A pipeline stage specification object must contain exactly one field.",
            )),
        })
        .collect()
}

fn parse_stage(d: &Document) -> Result<Stage, SimError> {
    let Some((name, arg)) = d.iter().next() else {
        return Err(SimError::bad_value("empty stage"));
    };
    let count = |v: &Bson| {
        number(v)
            .filter(|n| *n >= 0.0)
            .map(|n| n as usize)
            .ok_or_else(|| SimError::bad_value(format!("{name} needs a non-negative number")))
    };
    Ok(match (name.as_str(), arg) {
        ("$match", Bson::Document(f)) => {
            check_filter(f)?;
            Stage::Match(f.clone())
        }
        ("$group", Bson::Document(g)) => parse_group(g)?,
        ("$count", Bson::String(field)) if !field.is_empty() => Stage::Count(field.clone()),
        ("$limit", v) => Stage::Limit(count(v)?),
        ("$skip", v) => Stage::Skip(count(v)?),
        ("$sort", Bson::Document(s)) => Stage::Sort(s.clone()),
        ("$project", Bson::Document(p)) => Stage::Project(p.clone()),
        ("$unwind", spec) => parse_unwind(spec)?,
        (name, _) => {
            return Err(SimError::new(
                40324,
                "Location40324",
                format!("Unrecognized pipeline stage name: '{name}' (or a malformed argument; the simulator supports $match, $group, $count, $limit, $skip, $sort, $project, $unwind)"),
            ))
        }
    })
}

fn parse_unwind(spec: &Bson) -> Result<Stage, SimError> {
    let path = match spec {
        Bson::String(p) => Some(p.as_str()),
        Bson::Document(d) if d.len() == 1 => d.get_str("path").ok(),
        _ => None,
    };
    match path.and_then(|p| p.strip_prefix('$')) {
        Some(field) if !field.is_empty() && !field.contains('.') => {
            Ok(Stage::Unwind(field.to_string()))
        }
        _ => Err(SimError::bad_value(
            "$unwind: the simulator supports \"$field\" or {path: \"$field\"} of a top-level field",
        )),
    }
}

/// `$unwind` of `field` over `docs`.
fn unwind(docs: Vec<Document>, field: &str) -> Vec<Document> {
    let mut out = Vec::with_capacity(docs.len());
    for d in docs {
        match d.get(field) {
            Some(Bson::Array(items)) => {
                for item in items {
                    let mut one = d.clone();
                    one.insert(field, item.clone());
                    out.push(one);
                }
            }
            None | Some(Bson::Null) => {}
            Some(_) => out.push(d),
        }
    }
    out
}

fn parse_group(g: &Document) -> Result<Stage, SimError> {
    let id = g.get("_id").cloned().ok_or_else(|| {
        SimError::new(
            15955,
            "Location15955",
            "a group specification must include an _id",
        )
    })?;
    let mut fields = Vec::new();
    for (name, spec) in g.iter().filter(|(k, _)| *k != "_id") {
        let acc = match spec {
            Bson::Document(d) if d.len() == 1 => d.iter().next().and_then(|(op, arg)| {
                let arg = arg.clone();
                Some(match op.as_str() {
                    "$sum" => Acc::Sum(arg),
                    "$count" => Acc::Sum(Bson::Int32(1)),
                    "$avg" => Acc::Avg(arg),
                    "$min" => Acc::Min(arg),
                    "$max" => Acc::Max(arg),
                    "$first" => Acc::First(arg),
                    "$last" => Acc::Last(arg),
                    _ => return None,
                })
            }),
            _ => None,
        };
        let acc = acc.ok_or_else(|| {
            SimError::new(
                15952,
                "Location15952",
                format!("unknown group operator in field '{name}' (the simulator supports $sum, $count, $avg, $min, $max, $first, $last)"),
            )
        })?;
        fields.push((name.clone(), acc));
    }
    Ok(Stage::Group { id, fields })
}

/// The first stage's filter, if it is a `$match` (used for targeting shards).
pub fn leading_match(stages: &[Stage]) -> Document {
    match stages.first() {
        Some(Stage::Match(f)) => f.clone(),
        _ => Document::new(),
    }
}

/// Runs the stages over `docs`.
pub fn run(stages: &[Stage], mut docs: Vec<Document>) -> Vec<Document> {
    for stage in stages {
        docs = match stage {
            Stage::Match(f) => docs.into_iter().filter(|d| matches(d, f)).collect(),
            Stage::Group { id, fields } => group(&docs, id, fields),
            Stage::Count(_) if docs.is_empty() => Vec::new(),
            Stage::Count(field) => {
                let mut d = Document::new();
                d.insert(field.clone(), Bson::Int32(docs.len() as i32));
                vec![d]
            }
            Stage::Limit(n) => docs.into_iter().take(*n).collect(),
            Stage::Skip(n) => docs.into_iter().skip(*n).collect(),
            Stage::Sort(spec) => {
                sort(&mut docs, spec);
                docs
            }
            Stage::Project(p) => docs.iter().map(|d| project_stage(d, p)).collect(),
            Stage::Unwind(field) => unwind(docs, field),
        };
    }
    docs
}

/// `$project`: inclusion/exclusion like `find`, plus computed fields (`{total: "$qty"}`),
/// which make it an inclusion projection.
fn project_stage(doc: &Document, spec: &Document) -> Document {
    if !spec.iter().any(|(_, v)| is_expression(v)) {
        return project(doc, spec);
    }
    let mut out = Document::new();
    match spec.get("_id") {
        Some(e) if is_expression(e) => {
            out.insert("_id", eval(doc, e));
        }
        Some(flag) if !truthy(flag) => {}
        _ => {
            if let Some(id) = doc.get("_id") {
                out.insert("_id", id.clone());
            }
        }
    }
    for (k, v) in spec.iter().filter(|(k, _)| *k != "_id") {
        if is_expression(v) {
            out.insert(k.clone(), eval(doc, v));
        } else if let (true, Some(x)) = (truthy(v), get_path(doc, k)) {
            out.insert(k.clone(), x.clone());
        }
    }
    out
}

fn is_expression(v: &Bson) -> bool {
    matches!(v, Bson::String(s) if s.starts_with('$')) || matches!(v, Bson::Document(_))
}

/// Evaluates an expression: `"$path"` (missing → null), a document of expressions, or a
/// constant.
pub fn eval(doc: &Document, expr: &Bson) -> Bson {
    match expr {
        Bson::String(s) if s.starts_with('$') => {
            get_path(doc, &s[1..]).cloned().unwrap_or(Bson::Null)
        }
        Bson::Document(d) => {
            Bson::Document(d.iter().map(|(k, v)| (k.clone(), eval(doc, v))).collect())
        }
        other => other.clone(),
    }
}

fn group(docs: &[Document], id: &Bson, fields: &[(String, Acc)]) -> Vec<Document> {
    // Groups in first-seen order; linear lookup is fine at simulator sizes.
    let mut groups: Vec<(Bson, Vec<&Document>)> = Vec::new();
    for d in docs {
        let key = eval(d, id);
        match groups
            .iter_mut()
            .find(|(k, _)| super::query::values_equal(k, &key))
        {
            Some((_, members)) => members.push(d),
            None => groups.push((key, vec![d])),
        }
    }
    groups
        .into_iter()
        .map(|(key, members)| {
            let mut out = Document::new();
            out.insert("_id", key);
            for (name, acc) in fields {
                out.insert(name.clone(), accumulate(acc, &members));
            }
            out
        })
        .collect()
}

fn accumulate(acc: &Acc, members: &[&Document]) -> Bson {
    let values = |e: &Bson| members.iter().map(|d| eval(d, e)).collect::<Vec<_>>();
    match acc {
        Acc::Sum(e) => sum(values(e).iter()),
        Acc::Avg(e) => {
            let v: Vec<f64> = values(e).iter().filter_map(number).collect();
            if v.is_empty() {
                Bson::Null
            } else {
                Bson::Double(v.iter().sum::<f64>() / v.len() as f64)
            }
        }
        Acc::Min(e) => extreme(values(e), std::cmp::Ordering::Less),
        Acc::Max(e) => extreme(values(e), std::cmp::Ordering::Greater),
        Acc::First(e) => values(e).into_iter().next().unwrap_or(Bson::Null),
        Acc::Last(e) => values(e).into_iter().last().unwrap_or(Bson::Null),
    }
}

/// `$sum`: numbers only (others ignored), Int32 while it fits, then Int64, Double if any
/// double takes part.
fn sum<'a>(values: impl Iterator<Item = &'a Bson>) -> Bson {
    values
        .filter(|v| number(v).is_some())
        .fold(Bson::Int32(0), |acc, v| add(&acc, v).unwrap_or(acc))
}

fn extreme(values: Vec<Bson>, want: std::cmp::Ordering) -> Bson {
    values
        .into_iter()
        .filter(|v| !matches!(v, Bson::Null))
        .reduce(|best, v| if compare(&v, &best) == want { v } else { best })
        .unwrap_or(Bson::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn docs() -> Vec<Document> {
        (1..=6)
            .map(|i| doc! {"_id": {"p": i % 2, "s": i}, "qty": 10})
            .collect()
    }

    #[test]
    fn group_sum_and_count() {
        let p = parse(&[
            Bson::Document(doc! {"$match": {"qty": 10}}),
            Bson::Document(
                doc! {"$group": {"_id": "$_id.p", "total": {"$sum": "$qty"}, "n": {"$sum": 1}}},
            ),
            Bson::Document(doc! {"$sort": {"_id": 1}}),
        ])
        .expect("parses");
        let out = run(&p, docs());
        assert_eq!(
            out,
            vec![
                doc! {"_id": 0, "total": 30, "n": 3},
                doc! {"_id": 1, "total": 30, "n": 3}
            ]
        );
        let p = parse(&[Bson::Document(
            doc! {"$group": {"_id": 1, "n": {"$sum": 1}}},
        )])
        .expect("parses");
        assert_eq!(run(&p, docs()), vec![doc! {"_id": 1, "n": 6}]);
        let p = parse(&[Bson::Document(doc! {"$count": "c"})]).expect("parses");
        assert_eq!(run(&p, docs()), vec![doc! {"c": 6}]);
    }

    #[test]
    fn unknown_stage_is_refused() {
        assert!(parse(&[Bson::Document(doc! {"$lookup": {}})]).is_err());
        assert!(parse(&[Bson::Document(
            doc! {"$group": {"_id": null, "x": {"$push": 1}}}
        )])
        .is_err());
    }

    #[test]
    fn unwind_repeats_the_id() {
        let input = vec![
            doc! {"_id": 1, "sizes": [36, 38, 40]},
            doc! {"_id": 2, "sizes": []},
            doc! {"_id": 3},
            doc! {"_id": 4, "sizes": 42},
        ];
        for spec in [
            Bson::String("$sizes".into()),
            Bson::Document(doc! {"path": "$sizes"}),
        ] {
            let p = parse(&[Bson::Document(doc! {"$unwind": spec})]).expect("parses");
            assert_eq!(
                run(&p, input.clone()),
                vec![
                    doc! {"_id": 1, "sizes": 36},
                    doc! {"_id": 1, "sizes": 38},
                    doc! {"_id": 1, "sizes": 40},
                    doc! {"_id": 4, "sizes": 42},
                ]
            );
        }
        assert!(parse(&[Bson::Document(doc! {"$unwind": "sizes"})]).is_err());
        assert!(parse(&[Bson::Document(doc! {"$unwind": "$a.b"})]).is_err());
    }

    #[test]
    fn project_computed() {
        let p =
            parse(&[Bson::Document(doc! {"$project": {"q": "$qty", "_id": 0}})]).expect("parses");
        assert_eq!(
            run(&p, vec![doc! {"_id": 1, "qty": 3}]),
            vec![doc! {"q": 3}]
        );
    }
}
