//! Views: a namespace that reads another collection of its database through a pipeline
//! (`create` with `viewOn` and `pipeline`, or `simControl: createView`, which also gives
//! the pipeline a cost). A read of a view reads the source collection and runs the view's
//! pipeline before the read's own filter, as mongos does once a shard has answered that the
//! namespace is a view; on every node the read reaches, the pipeline's work takes the view's
//! cost, inside the read's `maxTimeMS` (a view whose pipeline is expensive is slow for every
//! read of it, however small: `find {} limit 1` included). `listCollections` shows views
//! with `type: "view"`.

use std::time::Duration;

use bson::{doc, Bson, Document};

use super::commands::read_spec;
use super::model::lock;
use super::pipeline::{self, Stage};
use super::query::{check_filter, matches, where_cost};
use super::routing::number;
use super::{Cluster, SimError};

/// Views chained on views, at most (the server's limit).
const MAX_DEPTH: usize = 20;

/// One view, with what it reads resolved through any views it is defined on.
#[derive(Debug, Clone)]
pub struct View {
    /// `viewOn` as given (a collection or view of the same database).
    pub view_on: String,
    /// `pipeline` as given.
    pub pipeline: Vec<Bson>,
    /// The collection finally read (`db.coll`).
    pub source: String,
    /// Every stage from the source up, parsed.
    pub stages: Vec<Stage>,
    /// The work of every pipeline from the source up, per node read.
    pub cost: Duration,
    depth: usize,
}

impl Cluster {
    /// Defines view `ns` (`db.name`) on `view_on` (a collection or view of the same
    /// database) through `pipeline`, whose work takes `cost` on each node a read reaches.
    pub fn create_view(
        &self,
        ns: &str,
        view_on: &str,
        pipeline: &[Bson],
        cost: Duration,
    ) -> Result<(), SimError> {
        let Some((db, name)) = ns
            .split_once('.')
            .filter(|(d, n)| !d.is_empty() && !n.is_empty())
        else {
            return Err(SimError::invalid_namespace(format!(
                "invalid view namespace '{ns}'"
            )));
        };
        if view_on.is_empty() || name == view_on {
            return Err(SimError::bad_value("viewOn must name another collection"));
        }
        let own = pipeline::parse(pipeline)?;
        let on = format!("{db}.{view_on}");
        let mut st = lock(&self.state);
        let exists = st.views.contains_key(ns)
            || st.config.contains_key(ns)
            || st
                .shards
                .iter()
                .any(|s| s.data.get(ns).is_some_and(|c| !c.is_empty()));
        if exists {
            return Err(SimError::new(
                48,
                "NamespaceExists",
                format!("Namespace {ns} already exists"),
            ));
        }
        let view = match st.views.get(&on) {
            Some(inner) if inner.depth + 1 >= MAX_DEPTH => {
                return Err(SimError::new(
                    165,
                    "ViewDepthLimitExceeded",
                    format!(
                        "View depth too deep or view cycle detected; maximum depth is {MAX_DEPTH}"
                    ),
                ))
            }
            Some(inner) => View {
                view_on: view_on.to_string(),
                pipeline: pipeline.to_vec(),
                source: inner.source.clone(),
                stages: inner.stages.iter().cloned().chain(own).collect(),
                cost: inner.cost + cost,
                depth: inner.depth + 1,
            },
            None => View {
                view_on: view_on.to_string(),
                pipeline: pipeline.to_vec(),
                source: on,
                stages: own,
                cost,
                depth: 1,
            },
        };
        st.views.insert(ns.to_string(), view);
        Ok(())
    }

    /// The view `ns`, if it is one.
    pub(crate) fn view(&self, ns: &str) -> Option<View> {
        lock(&self.state).views.get(ns).cloned()
    }
}

/// The documents a read of `view` with filter `filter` sees, before its sort, skip,
/// limit and projection; `served` gets the nodes that answered.
pub async fn read(
    cluster: &Cluster,
    view: &View,
    filter: &Document,
    body: &Document,
    served: &mut Vec<usize>,
) -> Result<Vec<Document>, SimError> {
    check_filter(filter)?;
    let mut spec = read_spec(
        view.source.clone(),
        pipeline::leading_match(&view.stages),
        body,
    )?;
    spec.cost += view.cost + where_cost(filter);
    let docs = super::commands::read_docs(cluster, &spec, served).await?;
    let mut docs = pipeline::run(&view.stages, docs);
    docs.retain(|d| matches(d, filter));
    Ok(docs)
}

/// `{create: <name>, viewOn, pipeline}`: a view (collections appear on their first insert).
pub fn create(cluster: &Cluster, db: &str, body: &Document) -> Result<Document, SimError> {
    let ns = super::commands::namespace(db, body)?;
    let Ok(view_on) = body.get_str("viewOn") else {
        return Err(SimError::illegal(
            "the simulator creates only views ({create, viewOn, pipeline}); collections appear on their first insert",
        ));
    };
    let pipeline = match body.get("pipeline") {
        None => Vec::new(),
        Some(Bson::Array(a)) => a.clone(),
        Some(_) => return Err(SimError::bad_value("pipeline must be an array")),
    };
    cluster.create_view(&ns, view_on, &pipeline, Duration::ZERO)?;
    Ok(doc! { "ok": 1.0 })
}

/// `simControl: createView`: `{ns, viewOn, pipeline, costMS}`.
pub fn control(cluster: &Cluster, body: &Document) -> Result<Document, SimError> {
    let ns = body
        .get_str("ns")
        .map_err(|_| SimError::bad_value("createView needs ns: \"db.view\""))?;
    let view_on = body
        .get_str("viewOn")
        .map_err(|_| SimError::bad_value("createView needs viewOn: \"<collection>\""))?;
    let pipeline = body.get_array("pipeline").cloned().unwrap_or_default();
    let cost = match body.get("costMS").map(number) {
        None => Duration::ZERO,
        Some(Some(ms)) if ms >= 0.0 => Duration::from_millis(ms as u64),
        Some(_) => return Err(SimError::bad_value("costMS must be a non-negative number")),
    };
    cluster.create_view(ns, view_on, &pipeline, cost)?;
    Ok(doc! { "ns": ns, "viewOn": view_on, "costMS": cost.as_millis() as i64, "ok": 1.0 })
}

/// `listCollections` entries of `db`'s views.
pub fn catalog_entries(cluster: &Cluster, db: &str) -> Vec<(String, Document)> {
    let prefix = format!("{db}.");
    let st = lock(&cluster.state);
    st.views
        .iter()
        .filter_map(|(ns, v)| {
            let name = ns.strip_prefix(&prefix)?;
            Some((
                name.to_string(),
                doc! {
                    "name": name,
                    "type": "view",
                    "options": { "viewOn": &v.view_on, "pipeline": v.pipeline.clone() },
                    "info": { "readOnly": true },
                },
            ))
        })
        .collect()
}
