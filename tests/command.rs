//! Classification of command bodies, request body access and reply inspection on arbitrary
//! input.

use bson::{rawdoc, RawDocument, RawDocumentBuf, Timestamp};
use bytes::Bytes;
use proptest::prelude::*;
use staleguard::command::{
    classify, is_eligible_shape, ClassifyError, CommandInfo, Ns, ReadConcernInfo, ReadPrefMode,
    MAX_PIPELINE_DEPTH,
};
use staleguard::rewrite::Places;
use staleguard::wire::compressed::{self, compress};
use staleguard::wire::opmsg::CHECKSUM_PRESENT;
use staleguard::wire::reply::op_msg;
use staleguard::wire::scan::Elements;
use staleguard::wire::{inspect_reply, Request};
use staleguard::wire::{WireError, DEFAULT_MAX_MESSAGE_SIZE};

const MAX: usize = DEFAULT_MAX_MESSAGE_SIZE;

fn ns<'a>(db: &'a str, coll: &'a str) -> Ns<'a> {
    Ns { db, coll }
}

/// Where a body's first top-level `readConcern`, `maxTimeMS` and `$readPreference` start,
/// found by a scan of its own.
fn places_of(body: &RawDocument) -> Places {
    let mut p = Places::default();
    let mut elems = Elements::new(body.as_bytes()).unwrap();
    while let Some(e) = elems.next_elem().unwrap() {
        let slot = match e.key {
            b"readConcern" => &mut p.read_concern,
            b"maxTimeMS" => &mut p.max_time,
            b"$readPreference" => &mut p.read_pref,
            _ => continue,
        };
        slot.get_or_insert(e.start);
    }
    p
}

fn ts() -> Timestamp {
    Timestamp {
        time: 1_700_000_000,
        increment: 7,
    }
}

#[test]
fn find_with_secondary_preferred_and_tags() {
    let body = rawdoc! {
        "find": "store_inventory",
        "filter": { "sku": "abc", "$or": [ { "qty": { "$gt": 1 } } ] },
        "limit": 10,
        "$db": "demo",
        "lsid": { "id": 1 },
        "$readPreference": { "mode": "secondaryPreferred", "tags": [ { "dc": "a1" }, {} ] },
    };
    let info = classify(&body).unwrap();
    assert_eq!(
        info,
        CommandInfo {
            name: "find",
            db: Some("demo"),
            collection: Some("store_inventory"),
            read_pref: Some(ReadPrefMode::SecondaryPreferred),
            read_pref_tags: true,
            unique_ids: true,
            places: Some(places_of(&body)),
            ..CommandInfo::default()
        }
    );
    assert_eq!(info.primary_ns(), Some(ns("demo", "store_inventory")));
    assert_eq!(
        info.other_namespaces.capacity(),
        0,
        "no allocation for a find"
    );
    assert!(is_eligible_shape(&info));
}

/// Tag sets pin a read (it never climbs to the primary): `tags` or the Rust driver's
/// `tagSets`, unless every set is the empty document (any member).
#[test]
fn read_preference_tag_sets() {
    let pinned = |rp: RawDocumentBuf| {
        classify(&rawdoc! { "find": "c", "$db": "d", "$readPreference": rp })
            .unwrap()
            .read_pref_tags
    };
    assert!(pinned(
        rawdoc! { "mode": "secondary", "tags": [ { "node": "a1" } ] }
    ));
    assert!(pinned(
        rawdoc! { "mode": "secondary", "tags": [ { "dc": "x" }, {} ] }
    ));
    assert!(pinned(
        rawdoc! { "mode": "nearest", "tagSets": [ { "node": "a1" } ] }
    ));
    assert!(
        pinned(rawdoc! { "mode": "secondary", "tags": "a1" }),
        "odd shapes pin"
    );
    assert!(pinned(rawdoc! { "mode": "secondary", "tags": [ 1 ] }));
    assert!(!pinned(rawdoc! { "mode": "secondary" }));
    assert!(!pinned(rawdoc! { "mode": "secondary", "tags": [] }));
    assert!(!pinned(rawdoc! { "mode": "secondary", "tags": [ {} ] }));
    assert!(!pinned(
        rawdoc! { "mode": "secondary", "tagSets": [ {} ], "maxStalenessSeconds": 90 }
    ));
}

#[test]
fn read_preference_variants() {
    let cases: Vec<(RawDocumentBuf, Option<ReadPrefMode>, bool)> = vec![
        (rawdoc! { "find": "c", "$db": "d" }, None, false),
        (
            rawdoc! { "find": "c", "$readPreference": { "mode": "nearest" }, "$db": "d" },
            Some(ReadPrefMode::Nearest),
            false,
        ),
        (
            rawdoc! { "find": "c", "$readPreference": { "mode": "secondary", "maxStalenessSeconds": 90 } },
            Some(ReadPrefMode::Secondary),
            false,
        ),
        (
            rawdoc! { "find": "c", "$readPreference": { "mode": "primaryPreferred" } },
            Some(ReadPrefMode::PrimaryPreferred),
            false,
        ),
        (
            rawdoc! { "find": "c", "$readPreference": { "mode": "Secondary" } },
            None,
            true,
        ),
        (
            rawdoc! { "find": "c", "$readPreference": { "tags": [] } },
            None,
            true,
        ),
        (
            rawdoc! { "find": "c", "$readPreference": "secondary" },
            None,
            true,
        ),
        (
            rawdoc! { "find": "c", "$readPreference": { "mode": 2 } },
            None,
            true,
        ),
    ];
    for (body, mode, unknown) in cases {
        let info = classify(&body).unwrap();
        assert_eq!(info.read_pref, mode, "{body:?}");
        assert_eq!(info.read_pref_unknown, unknown, "{body:?}");
    }
    // A known mode is matched on its bytes; a mode that is not UTF-8 is still an error, and
    // one that is UTF-8 but unknown is unknown.
    let body = rawdoc! { "find": "c", "$readPreference": { "mode": "secondarX" } };
    let at = body
        .as_bytes()
        .windows(9)
        .position(|w| w == b"secondarX")
        .unwrap();
    let mut bytes = body.as_bytes().to_vec();
    bytes[at + 8] = b'Z';
    let doc = RawDocument::from_bytes(&bytes).unwrap();
    assert_eq!(classify(doc).unwrap().read_pref, None);
    assert!(classify(doc).unwrap().read_pref_unknown);
    bytes[at + 8] = 0xff;
    let doc = RawDocument::from_bytes(&bytes).unwrap();
    assert!(matches!(classify(doc), Err(ClassifyError::Malformed(_))));
    bytes[at..at + 9].copy_from_slice(b"secondary");
    let doc = RawDocument::from_bytes(&bytes).unwrap();
    assert_eq!(
        classify(doc).unwrap().read_pref,
        Some(ReadPrefMode::Secondary)
    );
}

#[test]
fn aggregate_with_nested_namespaces() {
    let body = rawdoc! {
        "aggregate": "orders",
        "pipeline": [
            { "$match": { "status": "A" } },
            { "$lookup": { "from": "items", "localField": "sku", "foreignField": "sku", "as": "i" } },
            { "$lookup": { "from": { "db": "config", "coll": "cache.chunks.demo.orders" }, "as": "c" } },
            { "$lookup": {
                "from": "customers",
                "let": { "c": "$cust" },
                "pipeline": [
                    { "$match": { "x": 1 } },
                    { "$unionWith": {
                        "coll": "archived.customers.2023",
                        "pipeline": [
                            { "$facet": {
                                "a": [ { "$graphLookup": { "from": "org.tree", "startWith": "$p", "connectFromField": "p", "connectToField": "_id", "as": "t" } } ],
                                "b": [ { "$unionWith": "legacy" }, { "$lookup": { "from": "orders", "as": "self" } } ],
                            } },
                        ],
                    } },
                ],
                "as": "cust",
            } },
            { "$unionWith": "items" },
        ],
        "cursor": {},
        "$db": "shop",
        "$readPreference": { "mode": "secondary" },
    };
    let info = classify(&body).unwrap();
    assert_eq!(info.name, "aggregate");
    assert_eq!(info.collection, Some("orders"));
    assert_eq!(info.db, Some("shop"));
    assert_eq!(
        info.other_namespaces,
        vec![
            ns("shop", "items"),
            ns("config", "cache.chunks.demo.orders"),
            ns("shop", "customers"),
            ns("shop", "archived.customers.2023"),
            ns("shop", "org.tree"),
            ns("shop", "legacy"),
        ],
        "every namespace once; the primary (orders) and the repeated items are not repeated"
    );
    assert!(!info.opaque_stage);
    assert!(!info.has_out && !info.has_merge && !info.has_change_stream);
    assert!(is_eligible_shape(&info));
}

#[test]
fn db_after_pipeline_and_missing_db() {
    // `$db` before the pipeline gives the same answer as after it.
    let before = rawdoc! {
        "aggregate": "a", "$db": "d", "pipeline": [ { "$lookup": { "from": "b", "as": "x" } } ],
    };
    assert_eq!(
        classify(&before).unwrap().other_namespaces,
        vec![ns("d", "b")]
    );
    // Without `$db`, a same-db `from` cannot be named: opaque, not an error.
    let no_db =
        rawdoc! { "aggregate": "a", "pipeline": [ { "$lookup": { "from": "b", "as": "x" } } ] };
    let info = classify(&no_db).unwrap();
    assert!(info.opaque_stage);
    assert!(info.other_namespaces.is_empty());
    // ...but a {db, coll} form can.
    let no_db2 = rawdoc! {
        "aggregate": "a", "pipeline": [ { "$lookup": { "from": { "db": "x", "coll": "y" }, "as": "x" } } ],
    };
    let info = classify(&no_db2).unwrap();
    assert!(!info.opaque_stage);
    assert_eq!(info.other_namespaces, vec![ns("x", "y")]);
}

#[test]
fn plain_pipeline_does_not_allocate() {
    let body = rawdoc! {
        "aggregate": "c",
        "pipeline": [ { "$match": { "a": 1 } }, { "$group": { "_id": "$a" } }, { "$sort": { "_id": 1 } } ],
        "cursor": { "batchSize": 10 },
        "$db": "d",
    };
    let info = classify(&body).unwrap();
    assert_eq!(info.other_namespaces.capacity(), 0);
    assert!(!info.opaque_stage);
}

#[test]
fn aggregate_one_has_no_collection() {
    let body = rawdoc! {
        "aggregate": 1, "pipeline": [ { "$documents": [ { "x": 1 } ] }, { "$unionWith": { "pipeline": [ { "$documents": [] } ] } } ],
        "cursor": {}, "$db": "admin",
    };
    let info = classify(&body).unwrap();
    assert_eq!(info.collection, None);
    assert_eq!(info.primary_ns(), None);
    assert!(info.other_namespaces.is_empty());
    assert!(!info.opaque_stage, "$unionWith without coll is valid");
}

#[test]
fn write_stages_at_any_depth() {
    let top_out = rawdoc! { "aggregate": "c", "pipeline": [ { "$match": {} }, { "$out": "target" } ], "$db": "d" };
    let info = classify(&top_out).unwrap();
    assert!(info.has_out && !info.has_merge && !info.has_change_stream);
    assert!(!is_eligible_shape(&info));

    let deep_merge = rawdoc! {
        "aggregate": "c",
        "pipeline": [ { "$facet": { "f": [ { "$lookup": { "from": "x", "pipeline": [ { "$merge": { "into": "y" } } ], "as": "z" } } ] } } ],
        "$db": "d",
    };
    let info = classify(&deep_merge).unwrap();
    assert!(!info.has_out && info.has_merge && !info.has_change_stream);
    assert_eq!(info.other_namespaces, vec![ns("d", "x")]);
    assert!(!is_eligible_shape(&info));

    let change_stream = rawdoc! {
        "aggregate": 1,
        "pipeline": [ { "$changeStream": { "allChangesForCluster": true } } ],
        "$db": "admin",
    };
    let info = classify(&change_stream).unwrap();
    assert!(info.has_change_stream && !info.has_out && !info.has_merge);
    assert!(!is_eligible_shape(&info));

    let deep_change_stream = rawdoc! {
        "aggregate": "c",
        "pipeline": [ { "$unionWith": { "coll": "u", "pipeline": [ { "$changeStream": {} } ] } } ],
        "$db": "d",
    };
    assert!(classify(&deep_change_stream).unwrap().has_change_stream);
}

#[test]
fn unexpected_shapes_are_opaque_not_errors() {
    let cases = [
        rawdoc! { "aggregate": "c", "pipeline": [ { "$lookup": { "from": 7, "as": "x" } } ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [ { "$lookup": { "from": { "db": "x" }, "as": "x" } } ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [ { "$lookup": "x" } ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [ { "$lookup": { "from": "x", "pipeline": "p" } } ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [ { "$graphLookup": { "from": 1 } } ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [ { "$graphLookup": { "startWith": "$x" } } ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [ { "$unionWith": 3 } ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [ { "$unionWith": { "coll": 3 } } ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [ { "$facet": { "a": "nope" } } ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [ { "$facet": 1 } ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [ 5 ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": [ {} ], "$db": "d" },
        rawdoc! { "aggregate": "c", "pipeline": { "$match": {} }, "$db": "d" },
    ];
    for body in cases {
        let info = classify(&body).unwrap_or_else(|e| panic!("{body:?}: {e}"));
        assert!(info.opaque_stage, "{body:?}");
    }
}

/// `{$unionWith: {coll: "c<n>", pipeline: [<inner>]}}` nested `levels` deep.
fn nested_union(levels: u32) -> RawDocumentBuf {
    let mut stage = rawdoc! { "$match": {} };
    for i in (0..levels).rev() {
        stage = rawdoc! { "$unionWith": { "coll": format!("c{i}"), "pipeline": [ stage ] } };
    }
    rawdoc! { "aggregate": "top", "pipeline": [ stage ], "$db": "d" }
}

#[test]
fn nesting_limit() {
    // The top pipeline is depth 0; MAX_PIPELINE_DEPTH - 1 nested sub-pipelines are walked.
    let ok = nested_union(MAX_PIPELINE_DEPTH - 1);
    let info = classify(&ok).unwrap();
    assert!(!info.opaque_stage);
    assert_eq!(
        info.other_namespaces.len(),
        (MAX_PIPELINE_DEPTH - 1) as usize
    );

    let deep = nested_union(MAX_PIPELINE_DEPTH);
    let info = classify(&deep).unwrap();
    assert!(info.opaque_stage);
    assert_eq!(info.other_namespaces.len(), MAX_PIPELINE_DEPTH as usize);

    // Far deeper than any stack would like: still no error, no overflow.
    let very_deep = nested_union(500);
    assert!(classify(&very_deep).unwrap().opaque_stage);
}

#[test]
fn explain_wrapping_find_and_aggregate() {
    let find = rawdoc! {
        "explain": { "find": "inv.items", "filter": {}, "readConcern": { "level": "majority" }, "maxTimeMS": 10 },
        "verbosity": "queryPlanner",
        "readConcern": { "level": "local" },
        "$db": "shop",
        "$readPreference": { "mode": "secondary" },
    };
    let info = classify(&find).unwrap();
    assert_eq!(
        info,
        CommandInfo {
            name: "explain",
            db: Some("shop"),
            collection: Some("inv.items"),
            read_pref: Some(ReadPrefMode::Secondary),
            read_concern: ReadConcernInfo {
                present: true,
                level: Some("local"),
                ..ReadConcernInfo::default()
            },
            max_time_ms: Some(10),
            explain: true,
            places: Some(places_of(&find)),
            ..CommandInfo::default()
        }
    );
    assert!(!is_eligible_shape(&info));

    let agg = rawdoc! {
        "explain": {
            "aggregate": "orders",
            "pipeline": [ { "$lookup": { "from": "pay.ledger", "as": "l" } }, { "$out": "x" } ],
            "cursor": {},
        },
        "$db": "shop",
    };
    let info = classify(&agg).unwrap();
    assert!(info.explain);
    assert_eq!(info.name, "explain");
    assert_eq!(info.collection, Some("orders"));
    assert_eq!(info.other_namespaces, vec![ns("shop", "pay.ledger")]);
    assert!(info.has_out);
    assert!(!is_eligible_shape(&info));

    // A `pipeline` of a non-aggregate inner command is not walked.
    let find_pipeline = rawdoc! {
        "explain": { "find": "c", "pipeline": [ { "$lookup": { "from": "x" } } ] }, "$db": "d",
    };
    assert!(classify(&find_pipeline)
        .unwrap()
        .other_namespaces
        .is_empty());
}

#[test]
fn transactions() {
    let cases = [
        (
            rawdoc! { "find": "c", "lsid": {}, "txnNumber": 5_i64, "autocommit": false, "$db": "d" },
            true,
            true,
        ),
        (
            rawdoc! { "find": "c", "lsid": {}, "txnNumber": 1_i64, "startTransaction": true, "autocommit": false, "readConcern": { "level": "snapshot" }, "$db": "d" },
            true,
            true,
        ),
        (
            rawdoc! { "find": "c", "startTransaction": true, "$db": "d" },
            true,
            false,
        ),
        // A retryable write: txnNumber without autocommit.
        (
            rawdoc! { "insert": "c", "lsid": {}, "txnNumber": 2_i64, "$db": "d" },
            false,
            true,
        ),
        (rawdoc! { "find": "c", "$db": "d" }, false, false),
    ];
    for (body, in_txn, txn_number) in cases {
        let info = classify(&body).unwrap();
        assert_eq!(info.in_transaction, in_txn, "{body:?}");
        assert_eq!(info.txn_number, txn_number, "{body:?}");
        if in_txn {
            assert!(!is_eligible_shape(&info));
        }
    }
}

#[test]
fn read_concern_variants() {
    let rc = |present, level, after, at, other, malformed| ReadConcernInfo {
        present,
        level,
        after_cluster_time: after,
        at_cluster_time: at,
        other_fields: other,
        malformed,
    };
    let cases = [
        (
            rawdoc! { "find": "c" },
            rc(false, None, false, false, false, false),
        ),
        (
            rawdoc! { "find": "c", "readConcern": {} },
            rc(true, None, false, false, false, false),
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "level": "majority" } },
            rc(true, Some("majority"), false, false, false, false),
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "afterClusterTime": ts() } },
            rc(true, None, true, false, false, false),
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "level": "local", "afterClusterTime": ts() } },
            rc(true, Some("local"), true, false, false, false),
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "level": "snapshot", "atClusterTime": ts() } },
            rc(true, Some("snapshot"), false, true, false, false),
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "level": "available", "provenance": "clientSupplied" } },
            rc(true, Some("available"), false, false, true, false),
        ),
        (
            rawdoc! { "find": "c", "readConcern": "majority" },
            rc(true, None, false, false, false, true),
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "level": 1 } },
            rc(true, None, false, false, false, true),
        ),
    ];
    for (body, want) in cases {
        assert_eq!(classify(&body).unwrap().read_concern, want, "{body:?}");
    }
}

#[test]
fn max_time_ms_types() {
    let cases = [
        (rawdoc! { "find": "c", "maxTimeMS": 1500 }, Some(1500)),
        // Above int32: the server refuses it, so it is no budget (and the read is left alone).
        (
            rawdoc! { "find": "c", "maxTimeMS": 5_000_000_000_i64 },
            None,
        ),
        (
            rawdoc! { "find": "c", "maxTimeMS": 2_000_000_000_i64 },
            Some(2_000_000_000),
        ),
        (rawdoc! { "find": "c", "maxTimeMS": 250.0 }, Some(250)),
        (rawdoc! { "find": "c", "maxTimeMS": 250.5 }, None),
        (rawdoc! { "find": "c", "maxTimeMS": f64::NAN }, None),
        (rawdoc! { "find": "c", "maxTimeMS": f64::INFINITY }, None),
        (rawdoc! { "find": "c", "maxTimeMS": "100" }, None),
        (rawdoc! { "find": "c" }, None),
    ];
    for (body, want) in cases {
        assert_eq!(classify(&body).unwrap().max_time_ms, want, "{body:?}");
    }
}

#[test]
fn names_and_collections() {
    let cases: [(RawDocumentBuf, &str, Option<&str>); 6] = [
        (
            rawdoc! { "count": "a.b.c", "query": {}, "$db": "d" },
            "count",
            Some("a.b.c"),
        ),
        (
            rawdoc! { "distinct": "system.views", "key": "k", "$db": "d" },
            "distinct",
            Some("system.views"),
        ),
        (
            rawdoc! { "getMore": 42_i64, "collection": "c", "$db": "d" },
            "getMore",
            None,
        ),
        (rawdoc! { "hello": 1, "$db": "admin" }, "hello", None),
        (rawdoc! { "insert": "c", "$db": "d" }, "insert", Some("c")),
        (
            rawdoc! { "find": "café.ü", "$db": "d" },
            "find",
            Some("café.ü"),
        ),
    ];
    for (body, name, coll) in cases {
        let info = classify(&body).unwrap();
        assert_eq!(info.name, name);
        assert_eq!(info.collection, coll);
    }
    let dotted = rawdoc! { "find": "a.b.c", "$db": "d" };
    let info = classify(&dotted).unwrap();
    assert_eq!(info.primary_ns().unwrap().to_string(), "d.a.b.c");
}

#[test]
fn malformed_bson_is_an_error() {
    // Empty document: no first key.
    let empty = RawDocument::from_bytes(b"\x05\0\0\0\0").unwrap();
    assert_eq!(classify(empty), Err(ClassifyError::NoCommand));

    let good = rawdoc! { "find": "c", "filter": { "a": 1 }, "$db": "d" };
    let bytes = good.as_bytes().to_vec();

    // An element type that does not exist.
    let mut bad_type = bytes.clone();
    bad_type[4] = 0x42;
    let doc = RawDocument::from_bytes(&bad_type).unwrap();
    assert!(matches!(classify(doc), Err(ClassifyError::Malformed(_))));

    // A string length that runs past the document.
    let mut long_str = bytes.clone();
    let at = 4 + 1 + 5; // type, "find\0"
    long_str[at..at + 4].copy_from_slice(&1000i32.to_le_bytes());
    let doc = RawDocument::from_bytes(&long_str).unwrap();
    assert!(matches!(classify(doc), Err(ClassifyError::Malformed(_))));

    // A negative string length.
    let mut neg = bytes.clone();
    neg[at..at + 4].copy_from_slice(&(-3i32).to_le_bytes());
    let doc = RawDocument::from_bytes(&neg).unwrap();
    assert!(matches!(classify(doc), Err(ClassifyError::Malformed(_))));

    // An embedded document whose length overruns its parent.
    let mut nested = bytes.clone();
    let at = 4 + 1 + 5 + 6 + 1 + 7; // "find" elem (1+5+4+2), type, "filter\0"
    assert_eq!(nested[at], 12, "filter length");
    nested[at] = 200;
    let doc = RawDocument::from_bytes(&nested).unwrap();
    assert!(matches!(classify(doc), Err(ClassifyError::Malformed(_))));

    // A key without its terminator: a document that is only a type byte and key bytes.
    let raw = [9u8, 0, 0, 0, 0x02, b'f', b'i', b'n', 0];
    let doc = RawDocument::from_bytes(&raw).unwrap();
    assert!(matches!(classify(doc), Err(ClassifyError::Malformed(_))));

    // Invalid UTF-8 in the collection name.
    let mut utf = bytes.clone();
    utf[4 + 1 + 5 + 4] = 0xff;
    let doc = RawDocument::from_bytes(&utf).unwrap();
    assert!(matches!(classify(doc), Err(ClassifyError::Malformed(_))));

    // Malformed inside a pipeline stage is an error too (not opaque).
    let agg =
        rawdoc! { "aggregate": "c", "pipeline": [ { "$lookup": { "from": "x" } } ], "$db": "d" };
    let mut b = agg.as_bytes().to_vec();
    let pos = b.windows(5).position(|w| w == b"from\0").unwrap() + 5;
    b[pos..pos + 4].copy_from_slice(&99i32.to_le_bytes());
    let doc = RawDocument::from_bytes(&b).unwrap();
    assert!(matches!(classify(doc), Err(ClassifyError::Malformed(_))));
}

#[test]
fn eligibility_table() {
    let sp = rawdoc! { "mode": "secondary" };
    let cases: Vec<(RawDocumentBuf, bool)> = vec![
        (
            rawdoc! { "find": "c", "$db": "d", "$readPreference": sp.clone() },
            true,
        ),
        (
            rawdoc! { "aggregate": "c", "pipeline": [], "$db": "d" },
            true,
        ),
        (rawdoc! { "count": "c", "$db": "d" }, true),
        (rawdoc! { "distinct": "c", "key": "k", "$db": "d" }, true),
        // Read preference is the policy's business, not the shape's.
        (rawdoc! { "find": "c", "$db": "d" }, true),
        (
            rawdoc! { "find": "c", "readConcern": { "level": "local" } },
            true,
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "level": "majority" } },
            true,
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "level": "available" } },
            true,
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "level": "local", "afterClusterTime": ts() } },
            true,
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "level": "snapshot" } },
            false,
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "level": "linearizable" } },
            false,
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "level": "something" } },
            false,
        ),
        (
            rawdoc! { "find": "c", "readConcern": { "atClusterTime": ts() } },
            false,
        ),
        (rawdoc! { "find": "c", "readConcern": "local" }, false),
        (rawdoc! { "find": "c", "autocommit": false }, false),
        (rawdoc! { "find": "c", "startTransaction": true }, false),
        (rawdoc! { "getMore": 1_i64, "collection": "c" }, false),
        (rawdoc! { "insert": "c", "documents": [] }, false),
        (rawdoc! { "explain": { "find": "c" } }, false),
        (
            rawdoc! { "aggregate": "c", "pipeline": [ { "$out": "o" } ] },
            false,
        ),
        (
            rawdoc! { "aggregate": "c", "pipeline": [ { "$merge": "o" } ] },
            false,
        ),
        (
            rawdoc! { "aggregate": 1, "pipeline": [ { "$changeStream": {} } ] },
            false,
        ),
        (rawdoc! { "Find": "c" }, false),
    ];
    for (body, want) in cases {
        let info = classify(&body).unwrap();
        assert_eq!(is_eligible_shape(&info), want, "{body:?}");
    }
}

// ---------------------------------------------------------------------------------------
// wire::Request

fn find_body() -> RawDocumentBuf {
    rawdoc! {
        "find": "store_inventory",
        "filter": { "sku": "abc" },
        "$db": "demo",
        "$readPreference": { "mode": "secondary" },
    }
}

/// Wraps a whole OP_MSG into OP_COMPRESSED with the given compressor.
fn compressed(msg: &[u8], compressor: u8) -> Vec<u8> {
    let payload = &msg[16..];
    let data = compress(compressor, payload).unwrap();
    let len = 16 + 9 + data.len();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(len as i32).to_le_bytes());
    out.extend_from_slice(&msg[4..12]);
    out.extend_from_slice(&2012i32.to_le_bytes());
    out.extend_from_slice(&2013i32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as i32).to_le_bytes());
    out.push(compressor);
    out.extend_from_slice(&data);
    out
}

fn op_query(cmd: &RawDocument) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&0i32.to_le_bytes());
    p.extend_from_slice(b"admin.$cmd\0");
    p.extend_from_slice(&0i32.to_le_bytes());
    p.extend_from_slice(&(-1i32).to_le_bytes());
    p.extend_from_slice(cmd.as_bytes());
    let mut out = Vec::new();
    out.extend_from_slice(&((16 + p.len()) as i32).to_le_bytes());
    out.extend_from_slice(&1i32.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&2004i32.to_le_bytes());
    out.extend_from_slice(&p);
    out
}

/// A whole message opened as the relay opens it (decompressed when compressed).
fn open(msg: &[u8], max: usize) -> Result<Request, WireError> {
    Request::open(Bytes::copy_from_slice(msg), max)
}

#[test]
fn request_op_msg_borrows() {
    let body = find_body();
    let msg = Bytes::copy_from_slice(&op_msg(7, 0, 0, &body));
    let req = Request::open(msg.clone(), MAX).unwrap();
    // The body is a view into the message, not a copy.
    assert_eq!(req.body().unwrap().as_bytes().as_ptr(), msg[21..].as_ptr());
    assert_eq!(req.body().unwrap().as_bytes(), body.as_bytes());
    assert_eq!((req.flags(), req.compressor()), (0, None));
    let info = classify(req.body().unwrap()).unwrap();
    assert_eq!(info.primary_ns(), Some(ns("demo", "store_inventory")));
}

#[test]
fn request_checksum() {
    let body = find_body();
    let msg = op_msg(7, 0, CHECKSUM_PRESENT, &body);
    let req = open(&msg, MAX).unwrap();
    assert_eq!(req.body().unwrap().as_bytes(), body.as_bytes());
    assert_eq!(req.flags(), CHECKSUM_PRESENT);

    let mut bad = msg.to_vec();
    let n = bad.len();
    bad[n - 1] ^= 0x55;
    assert!(matches!(
        open(&bad, MAX),
        Err(WireError::ChecksumMismatch { .. })
    ));
    // A flipped byte in the body is caught as well.
    let mut bad = msg.to_vec();
    bad[30] ^= 1;
    assert!(matches!(
        open(&bad, MAX),
        Err(WireError::ChecksumMismatch { .. })
    ));
}

#[test]
fn request_compressed_each_compressor() {
    let body = find_body();
    for flags in [0, CHECKSUM_PRESENT] {
        let msg = op_msg(9, 0, flags, &body);
        for c in [
            compressed::NOOP,
            compressed::SNAPPY,
            compressed::ZLIB,
            compressed::ZSTD,
        ] {
            let wrapped = compressed(&msg, c);
            let req = open(&wrapped, MAX).unwrap();
            let parts = req.parts().expect("an OP_MSG inside");
            assert_eq!(parts.compressor, Some(c));
            assert_eq!(parts.flags, flags);
            assert_eq!(parts.payload, &msg[16..]);
            assert_eq!(req.body().unwrap().as_bytes(), body.as_bytes());
            assert_eq!(
                classify(req.body().unwrap()).unwrap().collection,
                Some("store_inventory")
            );
        }
    }
}

#[test]
fn request_compressed_bad_inner_checksum() {
    let msg = op_msg(9, 0, CHECKSUM_PRESENT, &find_body());
    let mut inner = msg.to_vec();
    let n = inner.len();
    inner[n - 2] ^= 1;
    let wrapped = compressed(&inner, compressed::SNAPPY);
    assert!(matches!(
        open(&wrapped, MAX),
        Err(WireError::ChecksumMismatch { .. })
    ));
}

#[test]
fn request_op_query_and_bad_frames() {
    let q = op_query(&rawdoc! { "isMaster": 1, "helloOk": true });
    let req = open(&q, MAX).unwrap();
    assert!(!req.is_command() && req.body().is_none());
    assert_eq!(req.op_query().unwrap().full_collection_name, "admin.$cmd");

    // OP_COMPRESSED wrapping OP_QUERY: opened once, to the same query.
    let mut wrapped = compressed(&q, compressed::ZLIB);
    wrapped[16..20].copy_from_slice(&2004i32.to_le_bytes());
    let req = open(&wrapped, MAX).unwrap();
    assert!(req.body().is_none());
    assert_eq!(
        req.op_query().unwrap().query.as_bytes(),
        rawdoc! { "isMaster": 1, "helloOk": true }.as_bytes()
    );

    let msg = op_msg(1, 0, 0, &find_body());
    // Header length disagrees with the bytes.
    assert!(open(&msg[..msg.len() - 1], MAX).is_err());
    // Larger than the limit.
    assert!(matches!(open(&msg, 20), Err(WireError::BadLength { .. })));
    // Shorter than a header.
    assert!(open(&msg[..10], MAX).is_err());
}

// ---------------------------------------------------------------------------------------
// Arbitrary input never panics.

/// A valid body to mutate.
fn seed_body() -> Vec<u8> {
    rawdoc! {
        "aggregate": "c",
        "pipeline": [
            { "$lookup": { "from": "x", "pipeline": [ { "$unionWith": { "coll": "u", "pipeline": [] } } ], "as": "y" } },
            { "$facet": { "a": [ { "$graphLookup": { "from": "g" } } ] } },
        ],
        "readConcern": { "level": "local", "afterClusterTime": ts() },
        "maxTimeMS": 5,
        "$readPreference": { "mode": "nearest" },
        "$db": "d",
    }
    .as_bytes()
    .to_vec()
}

/// A document frame (correct length, trailing NUL) around arbitrary element bytes.
fn framed(inner: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(inner.len() + 5);
    d.extend_from_slice(&((inner.len() + 5) as i32).to_le_bytes());
    d.extend_from_slice(inner);
    d.push(0);
    d
}

fn exercise_message(msg: &[u8]) {
    if let Ok(req) = open(msg, 1 << 20) {
        if let Some(body) = req.body() {
            let _ = classify(body);
        }
    }
    let _ = inspect_reply(msg, 1 << 20);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn classify_arbitrary_framed_bytes(inner in proptest::collection::vec(any::<u8>(), 0..200)) {
        let d = framed(&inner);
        let doc = RawDocument::from_bytes(&d).unwrap();
        let _ = classify(doc);
    }

    #[test]
    fn classify_mutated_body(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut d = seed_body();
        let n = d.len();
        for (i, v) in flips {
            let i = i.index(n - 5) + 4; // keep the frame so from_bytes accepts it
            d[i] = v;
        }
        let doc = RawDocument::from_bytes(&d).unwrap();
        if let Ok(info) = classify(doc) {
            let _ = is_eligible_shape(&info);
        }
    }

    #[test]
    fn messages_from_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        exercise_message(&bytes);
    }

    #[test]
    fn messages_with_valid_header(opcode in prop::sample::select(vec![1i32, 2004, 2012, 2013, 7]),
                                  payload in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut msg = Vec::with_capacity(16 + payload.len());
        msg.extend_from_slice(&((16 + payload.len()) as i32).to_le_bytes());
        msg.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        msg.extend_from_slice(&opcode.to_le_bytes());
        msg.extend_from_slice(&payload);
        exercise_message(&msg);
    }

    #[test]
    fn mutated_op_msg(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
                      compressor in prop::sample::select(vec![None, Some(0u8), Some(1), Some(2), Some(3)])) {
        let body = RawDocumentBuf::from_bytes(seed_body()).unwrap();
        let mut msg = op_msg(1, 0, 0, &body).to_vec();
        let n = msg.len();
        for (i, v) in flips {
            let i = i.index(n - 4) + 4; // keep the message length
            msg[i] = v;
        }
        let msg = match compressor {
            Some(c) => compressed(&msg, c),
            None => msg,
        };
        exercise_message(&msg);
    }
}

// ---------------------------------------------------------------------------------------
// Repeated policy-relevant fields (issue 11, item 2): found in the same pass.

/// `base` with `key: v1` and `key: v2` appended.
fn twice(base: RawDocumentBuf, key: &str, v1: bson::RawBson, v2: bson::RawBson) -> RawDocumentBuf {
    let mut out = base;
    let key = bson::raw::CString::try_from(key.to_string()).expect("key");
    out.append(key.clone(), v1);
    out.append(key, v2);
    out
}

#[test]
fn repeated_fields_are_found_by_path() {
    use bson::RawBson as B;
    let s = |v: &str| B::String(v.to_string());
    let d = |v: RawDocumentBuf| B::Document(v);
    let find = || rawdoc! { "find": "c" };
    let cases: Vec<(RawDocumentBuf, &str)> = vec![
        (twice(find(), "$db", s("pay"), s("demo")), "$db"),
        (
            twice(
                find(),
                "readConcern",
                d(rawdoc! {"level": "available"}),
                d(rawdoc! {}),
            ),
            "readConcern",
        ),
        (
            twice(find(), "$readPreference", d(rawdoc! {}), d(rawdoc! {})),
            "$readPreference",
        ),
        (
            twice(find(), "maxTimeMS", B::Int32(1), B::Int32(2)),
            "maxTimeMS",
        ),
        (
            twice(find(), "autocommit", B::Boolean(false), B::Boolean(false)),
            "autocommit",
        ),
        (
            twice(
                find(),
                "startTransaction",
                B::Boolean(true),
                B::Boolean(true),
            ),
            "startTransaction",
        ),
        (twice(rawdoc! {}, "find", s("a"), s("b")), "find"),
        (
            rawdoc! { "find": "c", "readConcern": twice(rawdoc! {}, "level", s("available"), s("local")) },
            "readConcern.level",
        ),
        (
            rawdoc! { "find": "c", "readConcern": twice(rawdoc! {}, "atClusterTime", B::Timestamp(ts()), B::Timestamp(ts())) },
            "readConcern.atClusterTime",
        ),
        (
            rawdoc! { "find": "c", "$readPreference": twice(rawdoc! {}, "mode", s("primary"), s("secondary")) },
            "$readPreference.mode",
        ),
        (
            twice(
                rawdoc! { "aggregate": "c", "cursor": {} },
                "pipeline",
                B::Array(Default::default()),
                B::Array(Default::default()),
            ),
            "pipeline",
        ),
        (
            rawdoc! { "explain": twice(rawdoc! { "find": "c" }, "readConcern", d(rawdoc! {}), d(rawdoc! {})) },
            "explain.readConcern",
        ),
        (
            rawdoc! { "explain": twice(rawdoc! {}, "find", s("a"), s("b")) },
            "find",
        ),
    ];
    for (body, path) in &cases {
        let info = classify(body).expect("classifies");
        assert_eq!(info.duplicate, Some(*path), "{body:?}");
    }
    let first_db = classify(&cases[0].0).unwrap();
    assert_eq!(
        (first_db.first_db, first_db.db),
        (Some("pay"), Some("demo"))
    );
}

#[test]
fn repeated_namespace_keys_in_pipeline_stages_are_found() {
    use bson::RawBson as B;
    let s = |v: &str| B::String(v.to_string());
    let agg = |stage: RawDocumentBuf| rawdoc! { "aggregate": "c", "pipeline": [ stage ], "cursor": {}, "$db": "d" };
    let cases = [
        (
            agg(rawdoc! { "$lookup": twice(rawdoc! { "as": "j" }, "from", s("x"), s("y")) }),
            "$lookup.from",
        ),
        (
            agg(
                rawdoc! { "$lookup": { "from": twice(rawdoc! {}, "db", s("a"), s("b")), "as": "j" } },
            ),
            "$lookup.from.db",
        ),
        (
            agg(
                rawdoc! { "$lookup": twice(rawdoc! { "from": "x" }, "pipeline", B::Array(Default::default()), B::Array(Default::default())) },
            ),
            "$lookup.pipeline",
        ),
        (
            agg(rawdoc! { "$graphLookup": twice(rawdoc! {}, "from", s("x"), s("y")) }),
            "$graphLookup.from",
        ),
        (
            agg(rawdoc! { "$unionWith": twice(rawdoc! {}, "coll", s("x"), s("y")) }),
            "$unionWith.coll",
        ),
        (
            agg(twice(rawdoc! {}, "$unionWith", s("x"), s("y"))),
            "$unionWith",
        ),
    ];
    for (body, path) in &cases {
        let info = classify(body).expect("classifies");
        assert_eq!(info.duplicate, Some(*path), "{body:?}");
    }
    // Both occurrences are namespaces the command touches.
    let info = classify(&cases[0].0).unwrap();
    assert_eq!(info.other_namespaces, vec![ns("d", "x"), ns("d", "y")]);
    let info = classify(&cases[1].0).unwrap();
    assert!(
        info.opaque_stage,
        "a `from` document without coll is unreadable"
    );
    // A stage of two different fields (rejected by the server) is unreadable, not a repeat.
    let two_fields = agg(rawdoc! { "$match": {}, "$unionWith": "x" });
    let info = classify(&two_fields).unwrap();
    assert_eq!(info.duplicate, None);
    assert!(info.opaque_stage);
}

#[test]
fn driver_shaped_commands_have_no_duplicate() {
    let bodies = [
        rawdoc! {
            "find": "c", "filter": { "find": 1, "$db": 2 }, "readConcern": { "level": "local", "afterClusterTime": ts() },
            "$db": "d", "lsid": { "id": 1 }, "$readPreference": { "mode": "secondary", "tags": [ {} ] },
            "autocommit": false, "startTransaction": true, "maxTimeMS": 5,
        },
        rawdoc! {
            "aggregate": "c", "cursor": {}, "$db": "d",
            "pipeline": [ { "$lookup": { "from": "x", "as": "a", "pipeline": [ { "$unionWith": { "coll": "y", "pipeline": [] } } ] } },
                          { "$lookup": { "from": "z", "as": "b" } }, { "$facet": { "a": [], "b": [] } } ],
        },
        rawdoc! { "explain": { "find": "c", "readConcern": {} }, "readConcern": {}, "$db": "d" },
    ];
    for b in &bodies {
        assert_eq!(classify(b).unwrap().duplicate, None, "{b:?}");
    }
}
