//! Classification: one pass over a command body (`RawDocument`) into a `CommandInfo`.
//!
//! Bodies are read with the wire crate's element scanner ([`crate::wire::scan`]) rather than
//! `RawDocument::iter_elements`: it is about twice as fast, it yields the byte range of every
//! element (which `rewrite` splices), and it checks every declared length against the
//! enclosing one, so malformed input is an error, never a panic.

use std::fmt;

use bson::RawDocument;

use crate::wire::scan::{self, Elem, Elements, Malformed};
use crate::wire::Request;

/// `$readPreference.mode`; a missing `$readPreference` means `Primary` (drivers never send
/// mode primary to mongos).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadPrefMode {
    Primary,
    PrimaryPreferred,
    Secondary,
    SecondaryPreferred,
    Nearest,
}

impl ReadPrefMode {
    pub const ALL: [ReadPrefMode; 5] = [
        ReadPrefMode::Primary,
        ReadPrefMode::PrimaryPreferred,
        ReadPrefMode::Secondary,
        ReadPrefMode::SecondaryPreferred,
        ReadPrefMode::Nearest,
    ];

    /// The camelCase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ReadPrefMode::Primary => "primary",
            ReadPrefMode::PrimaryPreferred => "primaryPreferred",
            ReadPrefMode::Secondary => "secondary",
            ReadPrefMode::SecondaryPreferred => "secondaryPreferred",
            ReadPrefMode::Nearest => "nearest",
        }
    }

    pub fn parse(s: &str) -> Option<ReadPrefMode> {
        ReadPrefMode::ALL.into_iter().find(|m| m.as_str() == s)
    }

    /// A bit for use in a `u8` set of modes.
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// One namespace a command touches, borrowed from the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ns<'a> {
    pub db: &'a str,
    pub coll: &'a str,
}

impl fmt::Display for Ns<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.db, self.coll)
    }
}

/// The top-level `readConcern` of a command, if any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadConcernInfo<'a> {
    /// `readConcern` is present (even as an empty document).
    pub present: bool,
    pub level: Option<&'a str>,
    pub after_cluster_time: bool,
    pub at_cluster_time: bool,
    /// `readConcern` has fields other than level/afterClusterTime/atClusterTime.
    pub other_fields: bool,
    /// `readConcern` is not a document, or its `level` is not a string (the server rejects
    /// such a command; it is never eligible).
    pub malformed: bool,
}

/// What the policy needs to know about one command. Built by [`classify`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandInfo<'a> {
    /// The first key of the body (for `explain`, still `"explain"`).
    pub name: &'a str,
    /// `$db`.
    pub db: Option<&'a str>,
    /// The primary collection: the string value of the first key (of the inner command when
    /// wrapped in `explain`); `None` for `aggregate: 1` and non-string values.
    pub collection: Option<&'a str>,
    /// `$readPreference.mode`; `None` when absent (= primary).
    pub read_pref: Option<ReadPrefMode>,
    /// `$readPreference` present with a mode we do not know.
    pub read_pref_unknown: bool,
    pub read_concern: ReadConcernInfo<'a>,
    /// `autocommit` present (any value) or `startTransaction` present.
    pub in_transaction: bool,
    /// `txnNumber` present.
    pub txn_number: bool,
    /// `maxTimeMS` as an integer (int32, int64 or a whole double).
    pub max_time_ms: Option<i64>,
    /// The command is `explain` wrapping another.
    pub explain: bool,
    /// The command (or its inner command under explain) is `aggregate` and some stage, at
    /// any depth, is `$out` / `$merge` / `$changeStream`.
    pub has_out: bool,
    pub has_merge: bool,
    pub has_change_stream: bool,
    /// A stage whose namespaces cannot be determined (e.g. `$lookup` with a `from` of an
    /// unexpected type); strict policy treats the command as touching an unknown namespace.
    pub opaque_stage: bool,
    /// Every namespace the command reads besides the primary one: `$lookup.from`,
    /// `$graphLookup.from`, `$unionWith`, recursively through `$lookup.pipeline`,
    /// `$unionWith.pipeline` and `$facet`. Empty (and not allocated) for most commands.
    pub other_namespaces: Vec<Ns<'a>>,
}

impl<'a> CommandInfo<'a> {
    /// The primary namespace, when both `$db` and a collection are known.
    pub fn primary_ns(&self) -> Option<Ns<'a>> {
        Some(Ns {
            db: self.db?,
            coll: self.collection?,
        })
    }
}

/// Command names whose reads the policy can act on.
pub fn is_read_command(name: &str) -> bool {
    matches!(name, "find" | "aggregate" | "count" | "distinct")
}

/// Why a body could not be classified. The session relays such a command unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClassifyError {
    #[error("malformed bson in command body: {0}")]
    Malformed(&'static str),
    #[error("command body has no first key")]
    NoCommand,
}

impl From<Malformed> for ClassifyError {
    fn from(m: Malformed) -> Self {
        ClassifyError::Malformed(m.0)
    }
}

/// Pipelines nested deeper than this are not walked; the command is marked `opaque_stage`.
pub const MAX_PIPELINE_DEPTH: u32 = 32;

/// Classifies a command body in one pass over its top-level elements (plus a walk of the
/// `pipeline` of an `aggregate`). Allocates only when a pipeline names other namespaces.
///
/// Under `explain`, `collection` and the pipeline come from the inner command; the outer
/// `readConcern` and `maxTimeMS` win, the inner ones are used only when the outer are absent.
pub fn classify(body: &RawDocument) -> Result<CommandInfo<'_>, ClassifyError> {
    let mut elems = Elements::new(body.as_bytes())?;
    let first = elems.next_elem()?.ok_or(ClassifyError::NoCommand)?;
    classify_from(first, elems)
}

/// [`classify`] for a request opened once: starts from the first element the request
/// already found (its command name), without reading the header or the first key again.
pub fn classify_request(req: &Request) -> Result<CommandInfo<'_>, ClassifyError> {
    let (first, elems) = req.scan_body()?.ok_or(ClassifyError::NoCommand)?;
    classify_from(first, elems)
}

/// Classification from the body's first element, `elems` positioned after it.
fn classify_from<'a>(
    first: Elem<'a>,
    mut elems: Elements<'a>,
) -> Result<CommandInfo<'a>, ClassifyError> {
    let mut info = CommandInfo {
        name: scan::key_str(first.key)?,
        ..CommandInfo::default()
    };
    let mut pipeline = None;
    if info.name == "explain" {
        info.explain = true;
        if first.tag == scan::DOCUMENT {
            pipeline = classify_explained(first.value, &mut info)?;
        }
    } else {
        info.collection = string_value(&first)?;
    }
    let is_aggregate = info.name == "aggregate";
    while let Some(e) = elems.next_elem()? {
        match e.key {
            b"$db" => info.db = string_value(&e)?,
            b"$readPreference" => read_preference(&e, &mut info)?,
            b"readConcern" => info.read_concern = read_concern(&e)?,
            b"autocommit" | b"startTransaction" => info.in_transaction = true,
            b"txnNumber" => info.txn_number = true,
            b"maxTimeMS" => info.max_time_ms = scan::int_value(&e),
            b"pipeline" if is_aggregate => pipeline = Some(e),
            _ => {}
        }
    }
    if let Some(p) = pipeline {
        // Walked after the top level because `$db` (needed for `$lookup: {from: "c"}`)
        // usually comes last.
        let primary = info.primary_ns();
        let mut walk = Walk {
            db: info.db,
            primary,
            info: &mut info,
        };
        walk.pipeline_elem(&p, 0)?;
    }
    Ok(info)
}

/// Reads the inner command of `explain`; returns its `pipeline` element when it is an aggregate.
fn classify_explained<'a>(
    inner: &'a [u8],
    info: &mut CommandInfo<'a>,
) -> Result<Option<Elem<'a>>, ClassifyError> {
    let mut elems = Elements::new(inner)?;
    let Some(first) = elems.next_elem()? else {
        return Ok(None);
    };
    info.collection = string_value(&first)?;
    let is_aggregate = first.key == b"aggregate";
    let mut pipeline = None;
    while let Some(e) = elems.next_elem()? {
        match e.key {
            // Read before the outer fields, which overwrite these when present.
            b"readConcern" => info.read_concern = read_concern(&e)?,
            b"maxTimeMS" => info.max_time_ms = scan::int_value(&e),
            b"pipeline" if is_aggregate => pipeline = Some(e),
            _ => {}
        }
    }
    Ok(pipeline)
}

fn read_preference<'a>(e: &Elem<'a>, info: &mut CommandInfo<'a>) -> Result<(), ClassifyError> {
    info.read_pref = None;
    info.read_pref_unknown = true;
    if e.tag != scan::DOCUMENT {
        return Ok(());
    }
    let mut elems = Elements::new(e.value)?;
    while let Some(f) = elems.next_elem()? {
        if f.key == b"mode" {
            let mode = string_value(&f)?.and_then(ReadPrefMode::parse);
            info.read_pref = mode;
            info.read_pref_unknown = mode.is_none();
        }
    }
    Ok(())
}

fn read_concern<'a>(e: &Elem<'a>) -> Result<ReadConcernInfo<'a>, ClassifyError> {
    let mut rc = ReadConcernInfo {
        present: true,
        ..ReadConcernInfo::default()
    };
    if e.tag != scan::DOCUMENT {
        rc.malformed = true;
        return Ok(rc);
    }
    let mut elems = Elements::new(e.value)?;
    while let Some(f) = elems.next_elem()? {
        match f.key {
            b"level" => match string_value(&f)? {
                Some(level) => rc.level = Some(level),
                None => rc.malformed = true,
            },
            b"afterClusterTime" => rc.after_cluster_time = true,
            b"atClusterTime" => rc.at_cluster_time = true,
            _ => rc.other_fields = true,
        }
    }
    Ok(rc)
}

/// The value of a string element, `None` for any other type.
fn string_value<'a>(e: &Elem<'a>) -> Result<Option<&'a str>, ClassifyError> {
    if e.tag != scan::STRING {
        return Ok(None);
    }
    Ok(Some(scan::str_value(e.value)?))
}

/// A recursive walk of one aggregation pipeline and its sub-pipelines.
struct Walk<'a, 'i> {
    db: Option<&'a str>,
    primary: Option<Ns<'a>>,
    info: &'i mut CommandInfo<'a>,
}

impl<'a> Walk<'a, '_> {
    fn opaque(&mut self) {
        self.info.opaque_stage = true;
    }

    /// `e` should be an array of stages; anything else is an opaque shape.
    fn pipeline_elem(&mut self, e: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
        if e.tag != scan::ARRAY {
            self.opaque();
            return Ok(());
        }
        if depth >= MAX_PIPELINE_DEPTH {
            self.opaque();
            return Ok(());
        }
        let mut stages = Elements::new(e.value)?;
        while let Some(stage) = stages.next_elem()? {
            if stage.tag != scan::DOCUMENT {
                self.opaque();
                continue;
            }
            match Elements::new(stage.value)?.next_elem()? {
                Some(spec) => self.stage(&spec, depth)?,
                None => self.opaque(),
            }
        }
        Ok(())
    }

    /// One stage, `spec` being its single `{$name: value}` element.
    fn stage(&mut self, spec: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
        match spec.key {
            b"$lookup" => self.lookup(spec, depth),
            b"$graphLookup" => self.graph_lookup(spec),
            b"$unionWith" => self.union_with(spec, depth),
            b"$facet" => self.facet(spec, depth),
            b"$out" => {
                self.info.has_out = true;
                Ok(())
            }
            b"$merge" => {
                self.info.has_merge = true;
                Ok(())
            }
            b"$changeStream" => {
                self.info.has_change_stream = true;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn lookup(&mut self, spec: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
        if spec.tag != scan::DOCUMENT {
            self.opaque();
            return Ok(());
        }
        let mut fields = Elements::new(spec.value)?;
        while let Some(f) = fields.next_elem()? {
            match f.key {
                b"from" => match f.tag {
                    scan::STRING => self.same_db(scan::str_value(f.value)?),
                    scan::DOCUMENT => self.db_coll(f.value)?,
                    _ => self.opaque(),
                },
                b"pipeline" => self.pipeline_elem(&f, depth + 1)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// `from: {db: "d", coll: "c"}`.
    fn db_coll(&mut self, doc: &'a [u8]) -> Result<(), ClassifyError> {
        let (mut db, mut coll) = (None, None);
        let mut fields = Elements::new(doc)?;
        while let Some(f) = fields.next_elem()? {
            match f.key {
                b"db" => db = string_value(&f)?,
                b"coll" => coll = string_value(&f)?,
                _ => {}
            }
        }
        match (db, coll) {
            (Some(db), Some(coll)) => self.push(Ns { db, coll }),
            _ => self.opaque(),
        }
        Ok(())
    }

    fn graph_lookup(&mut self, spec: &Elem<'a>) -> Result<(), ClassifyError> {
        if spec.tag == scan::DOCUMENT {
            let mut fields = Elements::new(spec.value)?;
            while let Some(f) = fields.next_elem()? {
                if f.key == b"from" {
                    match string_value(&f)? {
                        Some(coll) => self.same_db(coll),
                        None => self.opaque(),
                    }
                    return Ok(());
                }
            }
        }
        // Not a document, or no `from`: the server rejects it, but we cannot tell what it reads.
        self.opaque();
        Ok(())
    }

    fn union_with(&mut self, spec: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
        match spec.tag {
            scan::STRING => self.same_db(scan::str_value(spec.value)?),
            scan::DOCUMENT => {
                let mut fields = Elements::new(spec.value)?;
                while let Some(f) = fields.next_elem()? {
                    match f.key {
                        b"coll" => match string_value(&f)? {
                            Some(coll) => self.same_db(coll),
                            None => self.opaque(),
                        },
                        b"pipeline" => self.pipeline_elem(&f, depth + 1)?,
                        _ => {}
                    }
                }
            }
            _ => self.opaque(),
        }
        Ok(())
    }

    fn facet(&mut self, spec: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
        if spec.tag != scan::DOCUMENT {
            self.opaque();
            return Ok(());
        }
        let mut facets = Elements::new(spec.value)?;
        while let Some(f) = facets.next_elem()? {
            self.pipeline_elem(&f, depth + 1)?;
        }
        Ok(())
    }

    fn same_db(&mut self, coll: &'a str) {
        match self.db {
            Some(db) => self.push(Ns { db, coll }),
            None => self.opaque(),
        }
    }

    fn push(&mut self, ns: Ns<'a>) {
        if self.primary != Some(ns) && !self.info.other_namespaces.contains(&ns) {
            self.info.other_namespaces.push(ns);
        }
    }
}

/// A read the policy may act on, before looking at namespaces and read preference: one of
/// find/aggregate/count/distinct (not under `explain`), outside a transaction, with a
/// readConcern level of none/local/majority/available and no `atClusterTime`, and no
/// `$out`/`$merge`/`$changeStream` stage.
pub fn is_eligible_shape(info: &CommandInfo<'_>) -> bool {
    let rc = &info.read_concern;
    let level_ok = matches!(
        rc.level,
        None | Some("local") | Some("majority") | Some("available")
    );
    is_read_command(info.name)
        && !info.explain
        && !info.in_transaction
        && level_ok
        && !rc.at_cluster_time
        && !rc.malformed
        && !info.has_out
        && !info.has_merge
        && !info.has_change_stream
}
