//! The walk of an aggregation pipeline and its sub-pipelines (`$lookup`, `$graphLookup`,
//! `$unionWith`, `$facet`): every namespace it names, repeated stage keys, opaque stages.

use super::ids;
use super::*;

/// A recursive walk of one aggregation pipeline and its sub-pipelines.
pub(super) struct Walk<'a, 'i> {
    pub(super) db: Option<&'a str>,
    pub(super) primary: Option<Ns<'a>>,
    pub(super) info: &'i mut CommandInfo<'a>,
}

impl<'a> Walk<'a, '_> {
    fn opaque(&mut self) {
        self.info.opaque_stage = true;
    }

    fn mark(&mut self, seen: &mut Seen, bit: u16, path: &'a str) {
        seen.mark(bit, path, &mut self.info.duplicate);
    }

    /// `e` should be an array of stages; anything else is an opaque shape.
    pub(super) fn pipeline_elem(&mut self, e: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
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
            let mut fields = Elements::new(stage.value)?;
            let Some(spec) = fields.next_elem()? else {
                self.opaque();
                continue;
            };
            // A stage is exactly one field (the server rejects more); a repeated stage name
            // is a duplicate, another field makes the stage unreadable. The common case is
            // told by the offsets alone: the first field ends at the document's final NUL.
            if spec.end + 1 < stage.value.len() {
                self.extra_stage_field(&spec, &mut fields)?;
            }
            if depth == 0 && self.info.unique_ids && !ids::stage_keeps_ids(&spec)? {
                self.info.unique_ids = false;
            }
            self.stage(&spec, depth)?;
        }
        Ok(())
    }

    /// A stage document with a field after `spec` (the rest in `fields`).
    #[cold]
    fn extra_stage_field(
        &mut self,
        spec: &Elem<'a>,
        fields: &mut Elements<'a>,
    ) -> Result<(), ClassifyError> {
        while let Some(extra) = fields.next_elem()? {
            if extra.key == spec.key {
                let name = scan::key_str(spec.key)?;
                self.info.duplicate.get_or_insert(name);
            } else {
                self.opaque();
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
        let mut seen = Seen::default();
        while let Some(f) = fields.next_elem()? {
            match f.key {
                b"from" => {
                    self.mark(&mut seen, K_FROM, "$lookup.from");
                    match f.tag {
                        scan::STRING => self.same_db(scan::str_value(f.value)?),
                        scan::DOCUMENT => self.db_coll(f.value)?,
                        _ => self.opaque(),
                    }
                }
                b"pipeline" => {
                    self.mark(&mut seen, K_STAGE_PIPELINE, "$lookup.pipeline");
                    self.pipeline_elem(&f, depth + 1)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// `from: {db: "d", coll: "c"}`. When `db` or `coll` is repeated, the namespaces of the
    /// first and of the last occurrences are both recorded.
    fn db_coll(&mut self, doc: &'a [u8]) -> Result<(), ClassifyError> {
        let (mut db, mut coll) = (None, None);
        let (mut first_db, mut first_coll) = (None, None);
        let mut fields = Elements::new(doc)?;
        let mut seen = Seen::default();
        while let Some(f) = fields.next_elem()? {
            match f.key {
                b"db" => {
                    self.mark(&mut seen, K_FROM_DB, "$lookup.from.db");
                    db = string_value(&f)?;
                    first_db = first_db.or(Some(db));
                }
                b"coll" => {
                    self.mark(&mut seen, K_COLL, "$lookup.from.coll");
                    coll = string_value(&f)?;
                    first_coll = first_coll.or(Some(coll));
                }
                _ => {}
            }
        }
        match (db, coll) {
            (Some(db), Some(coll)) => self.push(Ns { db, coll }),
            _ => self.opaque(),
        }
        if let (Some(Some(db)), Some(Some(coll))) = (first_db, first_coll) {
            self.push(Ns { db, coll });
        }
        Ok(())
    }

    fn graph_lookup(&mut self, spec: &Elem<'a>) -> Result<(), ClassifyError> {
        let mut found = false;
        if spec.tag == scan::DOCUMENT {
            let mut fields = Elements::new(spec.value)?;
            let mut seen = Seen::default();
            while let Some(f) = fields.next_elem()? {
                if f.key == b"from" {
                    self.mark(&mut seen, K_FROM, "$graphLookup.from");
                    found = true;
                    match string_value(&f)? {
                        Some(coll) => self.same_db(coll),
                        None => self.opaque(),
                    }
                }
            }
        }
        if !found {
            // Not a document, or no `from`: the server rejects it, but we cannot tell what
            // it reads.
            self.opaque();
        }
        Ok(())
    }

    fn union_with(&mut self, spec: &Elem<'a>, depth: u32) -> Result<(), ClassifyError> {
        match spec.tag {
            scan::STRING => self.same_db(scan::str_value(spec.value)?),
            scan::DOCUMENT => {
                let mut fields = Elements::new(spec.value)?;
                let mut seen = Seen::default();
                while let Some(f) = fields.next_elem()? {
                    match f.key {
                        b"coll" => {
                            self.mark(&mut seen, K_COLL, "$unionWith.coll");
                            match string_value(&f)? {
                                Some(coll) => self.same_db(coll),
                                None => self.opaque(),
                            }
                        }
                        b"pipeline" => {
                            self.mark(&mut seen, K_STAGE_PIPELINE, "$unionWith.pipeline");
                            self.pipeline_elem(&f, depth + 1)?;
                        }
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
