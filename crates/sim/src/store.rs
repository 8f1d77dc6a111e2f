//! One shard's copy of one collection: documents bucketed by the hash of their `_id`, so
//! chunk ranges (copy to a recipient, orphan deletion, orphan counts) are range scans.

use std::collections::BTreeMap;

use bson::{Bson, Document};

use super::query::values_equal;
use super::routing::hash_value;

/// Documents of one collection on one shard, iterated in hash order.
#[derive(Debug, Default, Clone)]
pub struct Collection {
    by_hash: BTreeMap<i64, Vec<Document>>,
    len: usize,
}

/// An insert whose `_id` is already present.
#[derive(Debug, Clone, PartialEq)]
pub struct DuplicateKey(pub Bson);

impl Collection {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Inserts `doc`, which must carry an `_id`.
    pub fn insert(&mut self, doc: Document) -> Result<(), DuplicateKey> {
        let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
        let bucket = self.by_hash.entry(hash_value(&id)).or_default();
        if bucket
            .iter()
            .any(|d| d.get("_id").is_some_and(|x| values_equal(x, &id)))
        {
            return Err(DuplicateKey(id));
        }
        bucket.push(doc);
        self.len += 1;
        Ok(())
    }

    /// Every document with its `_id` hash.
    pub fn iter(&self) -> impl Iterator<Item = (i64, &Document)> {
        self.by_hash
            .iter()
            .flat_map(|(h, docs)| docs.iter().map(move |d| (*h, d)))
    }

    /// Visits every document mutably, in hash order, until `visit` returns false.
    pub fn for_each_mut(&mut self, mut visit: impl FnMut(i64, &mut Document) -> bool) {
        for (h, docs) in self.by_hash.iter_mut() {
            for d in docs.iter_mut() {
                if !visit(*h, d) {
                    return;
                }
            }
        }
    }

    /// Removes documents for which `remove` says so, up to `limit` (0 = no limit); returns
    /// how many went.
    pub fn remove_where(
        &mut self,
        limit: usize,
        mut remove: impl FnMut(&Document) -> bool,
    ) -> usize {
        let mut removed = 0;
        for docs in self.by_hash.values_mut() {
            docs.retain(|d| {
                if (limit == 0 || removed < limit) && remove(d) {
                    removed += 1;
                    false
                } else {
                    true
                }
            });
        }
        self.by_hash.retain(|_, docs| !docs.is_empty());
        self.len -= removed;
        removed
    }

    /// Copies of the documents whose hash is in `[min, max)`.
    pub fn range(&self, min: i128, max: i128) -> Vec<Document> {
        self.in_range(min, max).cloned().collect()
    }

    /// How many documents have a hash in `[min, max)`.
    #[cfg(test)]
    pub fn count_range(&self, min: i128, max: i128) -> usize {
        self.in_range(min, max).count()
    }

    fn in_range(&self, min: i128, max: i128) -> impl Iterator<Item = &Document> {
        self.by_hash
            .iter()
            .filter(move |(h, _)| {
                let h = **h as i128;
                min <= h && h < max
            })
            .flat_map(|(_, docs)| docs.iter())
    }

    /// Removes every document whose hash is in `[min, max)`; returns how many.
    pub fn remove_range(&mut self, min: i128, max: i128) -> usize {
        let before = self.len;
        self.by_hash.retain(|h, _| {
            let h = *h as i128;
            !(min <= h && h < max)
        });
        self.len = self.by_hash.values().map(Vec::len).sum();
        before - self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn insert_dup_range() {
        let mut c = Collection::default();
        for i in 0..50 {
            c.insert(doc! {"_id": i}).expect("new");
        }
        assert_eq!(
            c.insert(doc! {"_id": 3_i64}),
            Err(DuplicateKey(Bson::Int64(3)))
        );
        let all = c.count_range(i64::MIN as i128, i64::MAX as i128 + 1);
        assert_eq!(all, 50);
        let low = c.count_range(i64::MIN as i128, 0);
        assert_eq!(c.remove_range(i64::MIN as i128, 0), low);
        assert_eq!(c.len(), 50 - low);
        assert_eq!(c.remove_where(1, |_| true), 1);
        assert_eq!(c.len(), 49 - low);
    }
}
