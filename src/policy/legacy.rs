//! Legacy OP_QUERY requests (plain or inside OP_COMPRESSED): the read policy is not applied
//! to them (no rewrite, retry or reply inspection speaks OP_QUERY), so on a database that
//! has fallback or strict namespaces they are refused, except the handshake and
//! authentication commands every server still accepts over OP_QUERY.

use super::outcome::{legacy_refusal_reply, ErrorReply};
use super::table::PolicyTable;
use crate::wire::legacy::OpQuery;
use crate::wire::WireError;

/// The OP_QUERY commands servers accept from 5.1 on (the rest get UnsupportedOpQueryCommand):
/// the handshake and authentication. Drivers still send their first `isMaster`/`hello` as
/// OP_QUERY.
pub const ALLOWED_OP_QUERY_COMMANDS: [&str; 9] = [
    "hello",
    "isMaster",
    "ismaster",
    "saslStart",
    "saslContinue",
    "authenticate",
    "buildinfo",
    "buildInfo",
    "_isSelf",
];

/// A refused OP_QUERY: the error to answer with, as an OP_REPLY.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LegacyRefusal {
    /// The namespace the refusal is counted on (`fullCollectionName`, or `db.$cmd` of a
    /// governed `$db` inside the query).
    pub ns: String,
    pub reply: ErrorReply,
    /// Not a command (`<db>.<collection>`): old drivers read the error from the
    /// QueryFailure flag and `$err`.
    pub query_failure: bool,
}

impl LegacyRefusal {
    /// The OP_REPLY answering request `response_to`.
    pub fn to_message(&self, request_id: i32, response_to: i32) -> bytes::Bytes {
        self.reply
            .to_op_reply(request_id, response_to, self.query_failure)
    }
}

/// Judges an OP_QUERY (plain or unwrapped from OP_COMPRESSED, as [`crate::wire::Request`]
/// opened it): `Some` when it must be refused. An OP_QUERY on databases without fallback or
/// strict namespaces, or running a handshake or authentication command, is `None` (relayed
/// as before). A query whose BSON cannot be read is an error (the client is closed, as for
/// a malformed OP_MSG).
pub fn judge_op_query(
    q: &OpQuery<'_>,
    table: &PolicyTable,
) -> Result<Option<LegacyRefusal>, WireError> {
    let readings = q.readings()?;
    let mut dbs = std::iter::once(q.database()).chain(readings.dbs.iter().copied());
    let Some(db) = dbs.find(|db| table.acting_in_db(db, false).is_some()) else {
        return Ok(None);
    };
    let allowed = q.is_command()
        && !readings.names.is_empty()
        && readings
            .names
            .iter()
            .all(|n| ALLOWED_OP_QUERY_COMMANDS.contains(n));
    if allowed {
        return Ok(None);
    }
    let ns = if db == q.database() {
        q.full_collection_name.to_string()
    } else {
        format!("{db}.$cmd")
    };
    let command = q
        .is_command()
        .then(|| readings.names.first().copied())
        .flatten();
    Ok(Some(LegacyRefusal {
        ns,
        reply: legacy_refusal_reply(q.full_collection_name, command),
        query_failure: !q.is_command(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Mode, NsPolicy};
    use bson::{rawdoc, RawDocument};
    use bytes::{BufMut, BytesMut};

    fn table() -> PolicyTable {
        PolicyTable::from_policies(vec![
            NsPolicy::with_defaults("pay.*", Mode::Strict),
            NsPolicy::with_defaults("demo.inv", Mode::Fallback),
            NsPolicy::with_defaults("open.*", Mode::Passthrough),
        ])
        .expect("table")
    }

    /// An OP_QUERY payload (after the header) for `ns` with `doc`.
    fn payload(ns: &str, doc: &RawDocument) -> Vec<u8> {
        let mut b = BytesMut::new();
        b.put_i32_le(0);
        b.put_slice(ns.as_bytes());
        b.put_u8(0);
        b.put_i32_le(0);
        b.put_i32_le(-1);
        b.put_slice(doc.as_bytes());
        b.to_vec()
    }

    fn verdict(ns: &str, doc: &RawDocument) -> Option<LegacyRefusal> {
        let p = payload(ns, doc);
        judge_op_query(&OpQuery::parse(&p).expect("op_query"), &table()).expect("judged")
    }

    #[test]
    fn handshake_and_auth_pass_everywhere() {
        for doc in [
            rawdoc! { "isMaster": 1, "helloOk": true },
            rawdoc! { "$query": { "ismaster": 1 }, "$readPreference": { "mode": "secondary" } },
            rawdoc! { "hello": 1 },
            rawdoc! { "saslStart": 1, "mechanism": "SCRAM-SHA-256" },
        ] {
            assert_eq!(verdict("pay.$cmd", &doc), None, "{doc:?}");
        }
    }

    #[test]
    fn other_commands_and_queries_on_governed_databases_are_refused() {
        let r = verdict(
            "pay.$cmd",
            &rawdoc! { "$query": { "find": "t" }, "$readPreference": { "mode": "secondary" } },
        )
        .expect("refused");
        assert_eq!((r.ns.as_str(), r.query_failure), ("pay.$cmd", false));
        assert!(
            r.reply.errmsg.contains("OP_QUERY command find on pay.$cmd"),
            "{}",
            r.reply.errmsg
        );
        assert!(verdict("demo.$cmd", &rawdoc! { "count": "inv" }).is_some());
        let q = verdict("pay.t", &rawdoc! { "$query": {} }).expect("refused");
        assert!(q.query_failure);
        // `isMaster` first, but a wrapper a server may unwrap instead.
        assert!(verdict(
            "pay.$cmd",
            &rawdoc! { "isMaster": 1, "$query": { "find": "t" } }
        )
        .is_some());
        // A wrapper that is not a document names no command.
        assert!(verdict("pay.$cmd", &rawdoc! { "$query": 1 }).is_some());
        // A governed `$db` inside, from an ungoverned database.
        let r = verdict(
            "x.$cmd",
            &rawdoc! { "$query": { "find": "t", "$db": "pay" } },
        )
        .expect("refused");
        assert_eq!(r.ns, "pay.$cmd");
    }

    #[test]
    fn ungoverned_databases_pass() {
        for ns in ["x.$cmd", "open.$cmd", "x.t"] {
            assert_eq!(verdict(ns, &rawdoc! { "find": "t" }), None, "{ns}");
        }
    }
}
