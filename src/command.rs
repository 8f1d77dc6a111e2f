//! Classification: one pass over a command body (`RawDocument`) into a `CommandInfo`.

use bson::RawDocument;

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
