//! The readers of a command's `$readPreference` and `readConcern` documents, and of a string
//! value, for classification (`mod.rs`).

use super::{
    ClassifyError, CommandInfo, ReadConcernInfo, ReadPrefMode, Seen, K_AFTER, K_AT, K_LEVEL, K_MODE,
};
use crate::wire::scan::{self, Elem, Elements};

pub(super) fn read_preference<'a>(
    e: &Elem<'a>,
    info: &mut CommandInfo<'a>,
    dup: &mut Option<&'a str>,
) -> Result<(), ClassifyError> {
    info.read_pref = None;
    info.read_pref_unknown = true;
    info.read_pref_tags = false;
    info.read_pref_staleness = false;
    if e.tag != scan::DOCUMENT {
        return Ok(());
    }
    let mut elems = Elements::new(e.value)?;
    let mut seen = Seen::default();
    while let Some(f) = elems.next_elem()? {
        if f.key == b"tags" || f.key == b"tagSets" {
            info.read_pref_tags |= pins(&f)?;
        } else if f.key == b"maxStalenessSeconds" {
            info.read_pref_staleness |= scan::int_value(&f) != Some(-1);
        } else if f.key == b"mode" {
            seen.mark(K_MODE, "$readPreference.mode", dup);
            // A known mode is ASCII: matched on its bytes, with no UTF-8 check; any other
            // value is read as text (one that is not UTF-8 is an error, as it always was).
            let text = f.value.get(4..f.value.len().saturating_sub(1));
            let known = text.filter(|_| f.tag == scan::STRING);
            let mode = match known.and_then(ReadPrefMode::from_bytes) {
                Some(mode) => Some(mode),
                None => string_value(&f)?.and_then(ReadPrefMode::parse),
            };
            info.read_pref = mode;
            info.read_pref_unknown = mode.is_none();
        }
    }
    Ok(())
}

/// A tag-set list that pins a read: anything but an array of empty documents.
fn pins(e: &Elem<'_>) -> Result<bool, ClassifyError> {
    if e.tag != scan::ARRAY {
        return Ok(true);
    }
    let mut sets = Elements::new(e.value)?;
    while let Some(set) = sets.next_elem()? {
        // An empty document is exactly 5 bytes (length and terminator).
        if set.tag != scan::DOCUMENT || set.value.len() > 5 {
            return Ok(true);
        }
    }
    Ok(false)
}

pub(super) fn read_concern<'a>(
    e: &Elem<'a>,
    dup: &mut Option<&'a str>,
) -> Result<ReadConcernInfo<'a>, ClassifyError> {
    let mut rc = ReadConcernInfo {
        present: true,
        ..ReadConcernInfo::default()
    };
    if e.tag != scan::DOCUMENT {
        rc.malformed = true;
        return Ok(rc);
    }
    let mut elems = Elements::new(e.value)?;
    let mut seen = Seen::default();
    while let Some(f) = elems.next_elem()? {
        match f.key {
            b"level" => {
                seen.mark(K_LEVEL, "readConcern.level", dup);
                match string_value(&f)? {
                    Some(level) => rc.level = Some(level),
                    None => rc.malformed = true,
                }
            }
            b"afterClusterTime" => {
                seen.mark(K_AFTER, "readConcern.afterClusterTime", dup);
                rc.after_cluster_time = true;
            }
            b"atClusterTime" => {
                seen.mark(K_AT, "readConcern.atClusterTime", dup);
                rc.at_cluster_time = true;
            }
            _ => rc.other_fields = true,
        }
    }
    Ok(rc)
}

/// The value of a string element, `None` for any other type.
pub(super) fn string_value<'a>(e: &Elem<'a>) -> Result<Option<&'a str>, ClassifyError> {
    if e.tag != scan::STRING {
        return Ok(None);
    }
    Ok(Some(scan::str_value(e.value)?))
}

/// Where a body's first top-level `readConcern`, `maxTimeMS` and `$readPreference` start
/// (`None`: none), as classification met them (`CommandInfo::places`): a rewrite reads them
/// there instead of scanning the body again (`rewrite.rs`); an offset not holding its key
/// makes it scan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Places {
    pub read_concern: Option<usize>,
    pub max_time: Option<usize>,
    pub read_pref: Option<usize>,
}
