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

mod fields;
pub use fields::Places;
mod ids;
mod max_time;
mod walk;

use self::fields::{read_concern, read_preference, string_value};
use self::walk::Walk;

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
        ReadPrefMode::from_bytes(s.as_bytes())
    }

    /// [`ReadPrefMode::parse`] on the name's bytes.
    pub fn from_bytes(s: &[u8]) -> Option<ReadPrefMode> {
        ReadPrefMode::ALL
            .into_iter()
            .find(|m| m.as_str().as_bytes() == s)
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

/// The policy-relevant keys met so far in one document, a bit each: a repeat is noticed in
/// the same pass, without allocating.
#[derive(Debug, Clone, Copy, Default)]
struct Seen(u16);

impl Seen {
    /// Marks `bit`; when it was marked already, `path` is the duplicate (the first one found
    /// is kept).
    #[inline]
    fn mark<'a>(&mut self, bit: u16, path: &'a str, dup: &mut Option<&'a str>) {
        if self.0 & bit != 0 && dup.is_none() {
            *dup = Some(path);
        }
        self.0 |= bit;
    }
}

// Bits of `Seen`, one namespace per document level (the same bit means different keys in
// different documents).
const K_COMMAND: u16 = 1;
const K_DB: u16 = 1 << 1;
const K_READ_PREF: u16 = 1 << 2;
const K_READ_CONCERN: u16 = 1 << 3;
const K_MAX_TIME: u16 = 1 << 4;
const K_PIPELINE: u16 = 1 << 5;
const K_AUTOCOMMIT: u16 = 1 << 6;
const K_START_TXN: u16 = 1 << 7;
// readConcern
const K_LEVEL: u16 = 1;
const K_AFTER: u16 = 1 << 1;
const K_AT: u16 = 1 << 2;
// $readPreference
const K_MODE: u16 = 1;
// stages
const K_FROM: u16 = 1;
const K_COLL: u16 = 1 << 1;
const K_STAGE_PIPELINE: u16 = 1 << 2;
const K_FROM_DB: u16 = 1 << 3;

/// What the policy needs to know about one command. Built by [`classify`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandInfo<'a> {
    /// The first key of the body (for `explain`, still `"explain"`).
    pub name: &'a str,
    /// `$db` (its last occurrence when repeated).
    pub db: Option<&'a str>,
    /// The first `$db`, when `$db` is repeated (a server may read either; see `duplicate`).
    pub first_db: Option<&'a str>,
    /// The primary collection: the string value of the first key (of the inner command when
    /// wrapped in `explain`); `None` for `aggregate: 1` and non-string values.
    pub collection: Option<&'a str>,
    /// `$readPreference.mode`; `None` when absent (= primary).
    pub read_pref: Option<ReadPrefMode>,
    /// `$readPreference` present with a mode we do not know.
    pub read_pref_unknown: bool,
    /// `$readPreference` carries tag sets that pin the read to some members: `tags` (what
    /// mongos reads) or `tagSets` (what the Rust driver sends) with an element other than
    /// the empty document (which matches any member), or of another type than an array.
    pub read_pref_tags: bool,
    /// `speculativeAuthenticate` is present (a handshake that carries its first
    /// authentication step).
    pub speculative_auth: bool,
    /// `$readPreference.maxStalenessSeconds` is present with a value other than -1 (which
    /// means none): it may rule out every secondary.
    pub read_pref_staleness: bool,
    pub read_concern: ReadConcernInfo<'a>,
    /// `autocommit` present (any value) or `startTransaction` present.
    pub in_transaction: bool,
    /// `txnNumber` present.
    pub txn_number: bool,
    /// `maxTimeMS` as the server reads it (see `max_time.rs`; 0 means no limit); `None`
    /// when absent or invalid.
    pub max_time_ms: Option<i64>,
    /// `maxTimeMS` is present with a value the server refuses (negative, fractional, past
    /// 2147483647, NaN, not a number): the read is never eligible, so it goes out
    /// untouched and the server answers it with its own error.
    pub max_time_invalid: bool,
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
    /// A repeated `from`/`coll` adds each occurrence.
    pub other_namespaces: Vec<Ns<'a>>,
    /// The first policy-relevant field found repeated in the same document, by path:
    /// `$db`, `readConcern`, `readConcern.level`, `readConcern.afterClusterTime`,
    /// `readConcern.atClusterTime`, `$readPreference`, `$readPreference.mode`, `maxTimeMS`,
    /// `pipeline`, `autocommit`, `startTransaction`, the command key itself, the same under
    /// `explain`, and in pipeline stages the stage name, `$lookup.from` (and its `db`/`coll`),
    /// `$lookup.pipeline`, `$graphLookup.from`, `$unionWith.coll`, `$unionWith.pipeline`.
    /// Servers differ on which occurrence they read (first, or an error), so such a command
    /// cannot be classified the way the server will read it.
    pub duplicate: Option<&'a str>,
    /// In a result without orphans, no `_id` can appear twice: a `find` whose projection
    /// keeps `_id` as stored, or an `aggregate` whose every stage is on the allow-list of
    /// stages that keep `_id` (see `ids.rs`). Only such reads count orphans.
    pub unique_ids: bool,
    /// Where the body's first top-level `readConcern`, `maxTimeMS` and `$readPreference`
    /// stand, for a rewrite (`None` when the command key is one of them: the rewrite scans).
    pub places: Option<Places>,
}

impl<'a> CommandInfo<'a> {
    /// Only a secondary can have answered this read, or the primary only because no
    /// secondary was selectable at all: `secondary` (whatever its tags), or
    /// `secondaryPreferred` / `nearest` without tag sets or `maxStalenessSeconds`. A
    /// `primaryPreferred` read, or a tag set or staleness bound that can send a
    /// `secondaryPreferred` or `nearest` read to the primary while secondaries are up, may
    /// have been answered by the primary: its success says nothing about the secondaries.
    pub fn secondary_answers(&self) -> bool {
        match self.read_pref {
            Some(ReadPrefMode::Secondary) => true,
            Some(ReadPrefMode::SecondaryPreferred | ReadPrefMode::Nearest) => {
                !self.read_pref_tags && !self.read_pref_staleness
            }
            _ => false,
        }
    }

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
        name: command_name(first.key)?,
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
    let is_find = info.name == "find";
    let mut projection_keeps_id = true;
    // The command key is met already: it is the first.
    let mut seen = Seen(K_COMMAND);
    let mut dup = None;
    let mut places = Places::default();
    while let Some(e) = elems.next_elem()? {
        match e.key {
            b"$db" => {
                // One UTF-8 check for both.
                let db = string_value(&e)?;
                if seen.0 & K_DB == 0 {
                    info.first_db = db;
                }
                seen.mark(K_DB, "$db", &mut dup);
                info.db = db;
            }
            b"$readPreference" => {
                places.read_pref.get_or_insert(e.start);
                seen.mark(K_READ_PREF, "$readPreference", &mut dup);
                read_preference(&e, &mut info, &mut dup)?;
            }
            b"speculativeAuthenticate" => info.speculative_auth = true,
            b"readConcern" => {
                places.read_concern.get_or_insert(e.start);
                seen.mark(K_READ_CONCERN, "readConcern", &mut dup);
                info.read_concern = read_concern(&e, &mut dup)?;
            }
            b"autocommit" => {
                seen.mark(K_AUTOCOMMIT, "autocommit", &mut dup);
                info.in_transaction = true;
            }
            b"startTransaction" => {
                seen.mark(K_START_TXN, "startTransaction", &mut dup);
                info.in_transaction = true;
            }
            b"txnNumber" => info.txn_number = true,
            b"maxTimeMS" => {
                places.max_time.get_or_insert(e.start);
                seen.mark(K_MAX_TIME, "maxTimeMS", &mut dup);
                info.max_time_ms = max_time::parse(&e);
                info.max_time_invalid = info.max_time_ms.is_none();
            }
            b"pipeline" if is_aggregate => {
                seen.mark(K_PIPELINE, "pipeline", &mut dup);
                pipeline = Some(e);
            }
            b"projection" if is_find => projection_keeps_id &= ids::projection_keeps_id(&e)?,
            k if k == first.key => seen.mark(K_COMMAND, info.name, &mut dup),
            _ => {}
        }
    }
    let placed = !matches!(
        first.key,
        b"readConcern" | b"maxTimeMS" | b"$readPreference"
    );
    info.places = placed.then_some(places);
    if info.first_db == info.db {
        info.first_db = None;
    }
    if dup.is_some() {
        info.duplicate = dup;
    }
    info.unique_ids = (is_find && projection_keeps_id) || (is_aggregate && pipeline.is_some());
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
        if info.opaque_stage {
            info.unique_ids = false;
        }
    }
    Ok(info)
}

/// The command name: the read commands a policy follows matched on their bytes (no UTF-8
/// check of a name that is one of them), any other checked.
fn command_name(key: &[u8]) -> Result<&str, Malformed> {
    Ok(match key {
        b"find" => "find",
        b"aggregate" => "aggregate",
        b"count" => "count",
        b"distinct" => "distinct",
        _ => scan::key_str(key)?,
    })
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
    let mut seen = Seen(K_COMMAND);
    let dup = &mut info.duplicate;
    while let Some(e) = elems.next_elem()? {
        match e.key {
            // Read before the outer fields, which overwrite these when present.
            b"readConcern" => {
                seen.mark(K_READ_CONCERN, "explain.readConcern", dup);
                info.read_concern = read_concern(&e, dup)?;
            }
            b"maxTimeMS" => {
                seen.mark(K_MAX_TIME, "explain.maxTimeMS", dup);
                info.max_time_ms = max_time::parse(&e);
                info.max_time_invalid = info.max_time_ms.is_none();
            }
            b"pipeline" if is_aggregate => {
                seen.mark(K_PIPELINE, "explain.pipeline", dup);
                pipeline = Some(e);
            }
            k if k == first.key => seen.mark(K_COMMAND, scan::key_str(k)?, dup),
            _ => {}
        }
    }
    Ok(pipeline)
}

/// A read the policy may act on, before looking at namespaces and read preference: one of
/// find/aggregate/count/distinct (not under `explain`), outside a transaction, with a
/// readConcern level of none/local/majority/available and no `atClusterTime`, no
/// `$out`/`$merge`/`$changeStream` stage, and no `maxTimeMS` the server would refuse.
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
        && !info.max_time_invalid
}
