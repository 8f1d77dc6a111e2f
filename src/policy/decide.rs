//! Deciding: which namespace governs a command and what to do with it. Pure functions over
//! values: `resolve` (command + pattern table → target) and `decide` (target + breaker
//! admission → `Decision`).

use std::sync::Arc;
use std::time::Duration;

use super::budget::{attempt_budget, primary_rung_ms};
use super::reason::{Admission, Reason};
use super::table::{Causal, Mode, NsPolicy, PolicyTable};
use crate::command::{is_eligible_shape, is_read_command, CommandInfo, Ns, ReadPrefMode};

/// The namespace whose policy and breaker govern a command, and what kind of read it is.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    /// The governing namespace: the primary one, or the first strict one it touches.
    pub ns: Ns<'a>,
    pub policy: Arc<NsPolicy>,
    /// Effective mode (strictest of every namespace touched): Fallback or Strict.
    pub mode: Mode,
    pub kind: ReadKind,
    /// Strict only because a pipeline stage could not be read (nested deeper than
    /// `MAX_PIPELINE_DEPTH`, or of an unexpected shape) on a database that has strict
    /// namespaces: `ns` is then the command's own namespace, not a strict one.
    pub unreadable: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadKind {
    /// The policy acts on it (breaker, retry, rewrite, fail-fast).
    Eligible,
    /// The client asked for `readConcern: available` itself.
    AsksAvailable,
    /// A read the policy leaves alone (primary, transaction, snapshot, explain, $out, ...).
    Ineligible,
    /// A policy-relevant field is repeated (`CommandInfo::duplicate`) and a database the
    /// command names has fallback or strict namespaces: refused whatever the mode.
    Duplicate,
}

/// Why a request is refused (answered with an error, not sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal<'a> {
    /// A strict namespace asked for `readConcern: available`.
    Available,
    /// `available` asked with a pipeline that cannot be read fully, on a database that has
    /// strict namespaces.
    AvailableUnreadable,
    /// The field at this path appears twice in its document.
    Duplicate(&'a str),
}

/// What the session does with one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision<'a> {
    /// Send the original bytes; do not look at the reply.
    Forward,
    /// Send (the original bytes, or with `maxTimeMS` lowered) and inspect the reply: count
    /// trigger errors; a trigger error climbs the ladder (`primary`, then `retry`) instead
    /// of reaching the client.
    Track {
        /// `maxTimeMS` to set before sending: the cap, or the first attempt's share of the
        /// budget when a rung follows.
        cap_ms: Option<i64>,
        /// The read's whole budget (client `maxTimeMS`, capped by `max_time`): the next rung
        /// spends what the first attempt left. `None`: no limit.
        budget_ms: Option<i64>,
        /// A sample of an open breaker (a probe, or a read sent bounded).
        probe: bool,
        /// On a trigger error, resend with `available` (fallback).
        retry: bool,
        /// On a trigger error, resend once to the primary first (`ladder`).
        primary: bool,
        /// Sent while the breaker is open, bounded by `open_time_limit` (`on_open =
        /// "bound"`): a trigger error is answered with the fail-fast error.
        bounded: Option<Bounded>,
    },
    /// Rewrite to `available` before sending (fallback, breaker open).
    Rewrite {
        drop_after_cluster_time: bool,
        cap_ms: Option<i64>,
    },
    /// Send to the primary before anything else (breaker open, `ladder` has `primary`);
    /// when the primary rung is refused (guard) or fails, `then`.
    Primary {
        /// `maxTimeMS` to set on the primary read.
        cap_ms: Option<i64>,
        budget_ms: Option<i64>,
        then: AfterPrimary,
    },
    /// Reply an error at once, send nothing (strict, breaker open).
    FailFast {
        reason: Reason,
        probe_in: Duration,
        errors: u32,
    },
    /// Reply an error at once, send nothing: a strict namespace asked for `available`, or
    /// a policy-relevant field is repeated.
    Refuse(Refusal<'a>),
}

/// A strict read sent while its breaker is open, with its time bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounded {
    /// Why the breaker is open (the fail-fast error's code and text).
    pub reason: Reason,
    pub errors: u32,
    /// The bound was set by staleguard (below the read's own budget): a time-limit error is
    /// the bound's, and is answered with the fail-fast error.
    pub ours: bool,
}

/// What a read whose breaker is open does when its primary rung cannot answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterPrimary {
    /// Strict: the fail-fast error.
    FailFast {
        reason: Reason,
        probe_in: Duration,
        errors: u32,
    },
    /// Fallback: `available`, its `maxTimeMS` lowered to the cap when the client asked for
    /// more (or nothing).
    Available {
        drop_after_cluster_time: bool,
        cap_ms: Option<i64>,
    },
}

fn strictness(mode: Mode) -> u8 {
    match mode {
        Mode::Passthrough => 0,
        Mode::Fallback => 1,
        Mode::Strict => 2,
    }
}

/// Finds the governing namespace of a command. `None`: nothing governs it, so it is
/// forwarded untouched.
///
/// - A command with a repeated policy-relevant field is governed (to be refused) when any
///   database it names (every `$db`, every pipeline namespace) has a fallback or strict
///   pattern.
/// - A read (find/aggregate/count/distinct, or explain) is governed by the strictest
///   namespace it touches; a pipeline stage that cannot be read, on a database that has
///   strict patterns, counts as a strict namespace.
/// - Any other command is governed only when it asks for `readConcern: available` and
///   names a strict namespace (to be refused).
pub fn resolve<'a>(info: &CommandInfo<'a>, table: &PolicyTable) -> Option<Target<'a>> {
    if info.duplicate.is_some() {
        return duplicate_target(info, table);
    }
    let read = is_read_command(info.name) || info.explain;
    let asks_available = info.read_concern.level == Some("available");
    if !read && !asks_available {
        return None;
    }
    let db = info.db?;
    let primary = info.primary_ns();
    let mut best: Option<(Ns<'a>, &Arc<NsPolicy>)> = None;
    // A passthrough entry is a promise to leave that namespace alone: a read touching one
    // is never relaxed, though a strict namespace it also touches still governs it.
    let mut touches_passthrough = false;
    let touched = primary.iter().chain(info.other_namespaces.iter());
    for ns in touched {
        let Some(p) = table.lookup(ns.db, ns.coll) else {
            continue;
        };
        if p.mode == Mode::Passthrough {
            touches_passthrough = true;
            continue;
        }
        if best.is_none_or(|(_, b)| strictness(p.mode) > strictness(b.mode)) {
            best = Some((*ns, p));
        }
    }
    // What an unreadable stage reads is unknown: on a database with strict namespaces it
    // may be one of them.
    let mut unreadable = false;
    if info.opaque_stage && best.is_none_or(|(_, b)| b.mode != Mode::Strict) {
        if let Some(p) = table.acting_in_db(db, true) {
            best = Some((primary.unwrap_or(Ns { db, coll: "$cmd" }), p));
            unreadable = true;
        }
    }
    let (ns, policy) = best?;
    let mode = policy.mode;
    let target = |kind| {
        Some(Target {
            ns,
            policy: policy.clone(),
            mode,
            kind,
            unreadable,
        })
    };
    if !read {
        return if mode == Mode::Strict {
            target(ReadKind::AsksAvailable)
        } else {
            None
        };
    }
    // Fallback acts only when the primary namespace itself is fallback; a pipeline that
    // merely reads a fallback namespace from an unlisted one is left alone.
    if mode == Mode::Fallback && (primary != Some(ns) || info.opaque_stage || touches_passthrough) {
        return None;
    }
    let kind = if asks_available {
        ReadKind::AsksAvailable
    } else if unreadable {
        // No breaker stands for an unknown strict namespace: never relaxed, never tracked.
        ReadKind::Ineligible
    } else if is_eligible_shape(info) && pref_allowed(info.read_pref, policy.read_preferences) {
        ReadKind::Eligible
    } else {
        ReadKind::Ineligible
    };
    target(kind)
}

/// The target of a command with a repeated policy-relevant field: the first database it
/// names (last `$db`, first `$db`, pipeline namespaces) that has a fallback or strict pattern.
fn duplicate_target<'a>(info: &CommandInfo<'a>, table: &PolicyTable) -> Option<Target<'a>> {
    let dbs = info.db.into_iter().chain(info.first_db);
    let mut dbs = dbs.chain(info.other_namespaces.iter().map(|ns| ns.db));
    let (db, policy) = dbs.find_map(|db| Some((db, table.acting_in_db(db, false)?)))?;
    Some(Target {
        ns: Ns {
            db,
            coll: info.collection.unwrap_or("$cmd"),
        },
        policy: policy.clone(),
        mode: policy.mode,
        kind: ReadKind::Duplicate,
        unreadable: false,
    })
}

fn pref_allowed(pref: Option<ReadPrefMode>, set: u8) -> bool {
    set & pref.unwrap_or(ReadPrefMode::Primary).bit() != 0
}

/// `maxTimeMS` to impose: the policy's cap, when it is below what the client asked for.
pub fn capped_max_time(client_ms: Option<i64>, cap: Option<Duration>) -> Option<i64> {
    let cap = cap?.as_millis().min(i64::MAX as u128) as i64;
    match client_ms {
        Some(c) if c > 0 && c <= cap => None,
        _ => Some(cap),
    }
}

/// What to do with a request, given its target and what the breaker admits.
pub fn decide<'a>(
    target: &Target<'_>,
    info: &CommandInfo<'a>,
    admission: Admission,
) -> Decision<'a> {
    let p = &target.policy;
    match (target.kind, target.mode) {
        (ReadKind::Duplicate, _) => {
            return Decision::Refuse(Refusal::Duplicate(info.duplicate.unwrap_or_default()))
        }
        (ReadKind::AsksAvailable, Mode::Strict) if target.unreadable => {
            return Decision::Refuse(Refusal::AvailableUnreadable)
        }
        (ReadKind::AsksAvailable, Mode::Strict) => return Decision::Refuse(Refusal::Available),
        (ReadKind::Eligible, _) => {}
        _ => return Decision::Forward,
    }
    let cap_ms = capped_max_time(info.max_time_ms, p.max_time);
    let causal_skip = info.read_concern.after_cluster_time && p.causal == Causal::Skip;
    if target.mode == Mode::Fallback && causal_skip {
        return Decision::Forward;
    }
    let fallback = target.mode == Mode::Fallback;
    // A read pinned by tag sets never climbs to the primary: the client chose its members.
    let primary_rung = p.primary_rung && !info.read_pref_tags;
    // A rung follows the first attempt: it gets a share of the budget, the rung the rest.
    let climbs = fallback || primary_rung;
    let split = attempt_budget(
        info.max_time_ms,
        p.max_time,
        p.attempt_share,
        p.attempt_limit,
    );
    let track = |probe| {
        if climbs {
            Decision::Track {
                cap_ms: split.first_ms,
                budget_ms: split.total_ms,
                probe,
                retry: fallback,
                primary: primary_rung,
                bounded: None,
            }
        } else {
            Decision::Track {
                cap_ms,
                budget_ms: split.total_ms,
                probe,
                retry: false,
                primary: false,
                bounded: None,
            }
        }
    };
    match admission {
        Admission::Closed => track(false),
        Admission::Probe => track(true),
        Admission::Bounded { reason, errors } => {
            let bound = p.open_time_limit.as_millis().clamp(1, i32::MAX as u128) as i64;
            let (cap, ours) = match split.total_ms {
                Some(total) if total <= bound => (cap_ms, false),
                _ => (Some(bound), true),
            };
            Decision::Track {
                cap_ms: cap,
                budget_ms: split.total_ms,
                probe: true,
                retry: false,
                primary: false,
                bounded: Some(Bounded {
                    reason,
                    errors,
                    ours,
                }),
            }
        }
        Admission::Open {
            reason,
            probe_in,
            errors,
        } => match (fallback, primary_rung) {
            (true, false) => Decision::Rewrite {
                drop_after_cluster_time: true,
                cap_ms,
            },
            // Primary first, with room left for `available` after it.
            (true, true) => Decision::Primary {
                cap_ms: Some(primary_rung_ms(
                    split.total_ms,
                    true,
                    p.attempt_share,
                    p.attempt_limit,
                )),
                budget_ms: split.total_ms,
                then: AfterPrimary::Available {
                    drop_after_cluster_time: true,
                    cap_ms,
                },
            },
            // The primary is the last rung: the whole budget, never unbounded.
            (false, true) => Decision::Primary {
                cap_ms: Some(primary_rung_ms(
                    split.total_ms,
                    false,
                    p.attempt_share,
                    p.attempt_limit,
                )),
                budget_ms: split.total_ms,
                then: AfterPrimary::FailFast {
                    reason,
                    probe_in,
                    errors,
                },
            },
            (false, false) => Decision::FailFast {
                reason,
                probe_in,
                errors,
            },
        },
    }
}

impl Decision<'_> {
    pub fn name(&self) -> &'static str {
        match self {
            Decision::Forward => "forward",
            Decision::Track { retry: true, .. } => "track_retry",
            Decision::Track {
                bounded: Some(_), ..
            } => "bounded",
            Decision::Track { .. } => "track",
            Decision::Rewrite { .. } => "rewrite",
            Decision::Primary { .. } => "primary",
            Decision::FailFast { .. } => "fail_fast",
            Decision::Refuse(_) => "refuse",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::classify;
    use crate::policy::PRIMARY_RUNG_CEILING_MS;
    use bson::rawdoc;

    fn table() -> PolicyTable {
        let mut inv = NsPolicy::with_defaults("demo.store_inventory", Mode::Fallback);
        inv.max_time = Some(Duration::from_millis(500));
        let mut causal = NsPolicy::with_defaults("demo.causal_skip", Mode::Fallback);
        causal.causal = Causal::Skip;
        PolicyTable::from_policies(vec![
            inv,
            causal,
            NsPolicy::with_defaults("pay.*", Mode::Strict),
            NsPolicy::with_defaults("pay.audit", Mode::Passthrough),
        ])
        .expect("valid table")
    }

    fn secondary() -> bson::RawDocumentBuf {
        rawdoc! {"mode": "secondaryPreferred"}
    }

    fn open() -> Admission {
        Admission::Open {
            reason: Reason::StaleRouting,
            probe_in: Duration::from_secs(5),
            errors: 3,
        }
    }

    /// Classifies, resolves and decides one body; `None` when nothing governs it.
    fn run(body: &bson::RawDocument, admission: Admission) -> Option<(String, Decision<'_>)> {
        let t = table();
        let info = classify(body).expect("classifies");
        let target = resolve(&info, &t)?;
        Some((target.ns.to_string(), decide(&target, &info, admission)))
    }

    #[test]
    fn decision_table_fallback() {
        let find =
            rawdoc! {"find": "store_inventory", "$db": "demo", "$readPreference": secondary()};
        let (ns, d) = run(&find, Admission::Closed).expect("governed");
        assert_eq!(ns, "demo.store_inventory");
        // No client maxTimeMS: the 500 ms cap is the budget; the first attempt gets half,
        // the `available` retry the rest.
        assert_eq!(
            d,
            Decision::Track {
                cap_ms: Some(250),
                budget_ms: Some(500),
                probe: false,
                retry: true,
                primary: false,
                bounded: None,
            }
        );
        let (_, d) = run(&find, open()).expect("governed");
        assert_eq!(
            d,
            Decision::Rewrite {
                drop_after_cluster_time: true,
                cap_ms: Some(500)
            }
        );
        let (_, d) = run(&find, Admission::Probe).expect("governed");
        assert_eq!(
            d,
            Decision::Track {
                cap_ms: Some(250),
                budget_ms: Some(500),
                probe: true,
                retry: true,
                primary: false,
                bounded: None,
            }
        );
    }

    #[test]
    fn fallback_without_any_budget_gets_the_attempt_limit() {
        let mut p = NsPolicy::with_defaults("demo.plain", Mode::Fallback);
        p.attempt_limit = Some(Duration::from_millis(700));
        let t = PolicyTable::from_policies(vec![p]).expect("valid");
        let find = rawdoc! {"find": "plain", "$db": "demo", "$readPreference": secondary()};
        let info = classify(&find).expect("classifies");
        let target = resolve(&info, &t).expect("governed");
        assert_eq!(
            decide(&target, &info, Admission::Closed),
            Decision::Track {
                cap_ms: Some(700),
                budget_ms: None,
                probe: false,
                retry: true,
                primary: false,
                bounded: None,
            }
        );
        // With the client's own 1 s: half of it.
        let find = rawdoc! {"find": "plain", "$db": "demo", "maxTimeMS": 1000, "$readPreference": secondary()};
        let info = classify(&find).expect("classifies");
        assert_eq!(
            decide(&target, &info, Admission::Closed),
            Decision::Track {
                cap_ms: Some(500),
                budget_ms: Some(1000),
                probe: false,
                retry: true,
                primary: false,
                bounded: None,
            }
        );
    }

    #[test]
    fn ladder_rungs() {
        let mut strict = NsPolicy::with_defaults("pay.ladder", Mode::Strict);
        strict.primary_rung = true;
        let mut fb = NsPolicy::with_defaults("demo.ladder", Mode::Fallback);
        fb.primary_rung = true;
        let t = PolicyTable::from_policies(vec![strict, fb]).expect("valid");
        fn decide_with<'b>(
            t: &PolicyTable,
            body: &'b bson::RawDocument,
            a: Admission,
        ) -> Decision<'b> {
            let info = classify(body).expect("classifies");
            let target = resolve(&info, t).expect("governed");
            decide(&target, &info, a)
        }
        let decide_on = |body, a| decide_with(&t, body, a);
        let pay = rawdoc! {"find": "ladder", "$db": "pay", "maxTimeMS": 1000, "$readPreference": secondary()};
        // Closed: the first attempt keeps room for the primary rung.
        assert_eq!(
            decide_on(&pay, Admission::Closed),
            Decision::Track {
                cap_ms: Some(500),
                budget_ms: Some(1000),
                probe: false,
                retry: false,
                primary: true,
                bounded: None,
            }
        );
        // Open: straight to the primary with the whole budget, then the fail-fast error.
        assert_eq!(
            decide_on(&pay, open()),
            Decision::Primary {
                cap_ms: Some(1000),
                budget_ms: Some(1000),
                then: AfterPrimary::FailFast {
                    reason: Reason::StaleRouting,
                    probe_in: Duration::from_secs(5),
                    errors: 3
                },
            }
        );
        // Fallback with the primary rung: primary first (half), then available.
        let inv = rawdoc! {"find": "ladder", "$db": "demo", "maxTimeMS": 1000, "$readPreference": secondary()};
        assert_eq!(
            decide_on(&inv, open()),
            Decision::Primary {
                cap_ms: Some(500),
                budget_ms: Some(1000),
                then: AfterPrimary::Available {
                    drop_after_cluster_time: true,
                    cap_ms: None,
                },
            }
        );
        assert!(matches!(
            decide_on(&inv, Admission::Closed),
            Decision::Track {
                retry: true,
                primary: true,
                ..
            }
        ));
    }

    /// A read pinned by tag sets (`tags`, or the Rust driver's `tagSets`) never climbs to
    /// the primary; its breaker, budget and fail-fast are those of a namespace without the
    /// rung. The primary rung's `maxTimeMS` is never unbounded.
    #[test]
    fn ladder_table_tags_and_bounds() {
        let mut strict = NsPolicy::with_defaults("pay.ladder", Mode::Strict);
        strict.primary_rung = true;
        let mut strict_off = NsPolicy::with_defaults("pay.off", Mode::Strict);
        strict_off.primary_rung = true;
        strict_off.attempt_limit = None;
        let mut fb = NsPolicy::with_defaults("demo.ladder", Mode::Fallback);
        fb.primary_rung = true;
        let mut fb_off = NsPolicy::with_defaults("demo.off", Mode::Fallback);
        fb_off.primary_rung = true;
        fb_off.attempt_limit = None;
        let t = PolicyTable::from_policies(vec![strict, strict_off, fb, fb_off]).expect("valid");
        let fail_fast = AfterPrimary::FailFast {
            reason: Reason::StaleRouting,
            probe_in: Duration::from_secs(5),
            errors: 3,
        };
        let avail = AfterPrimary::Available {
            drop_after_cluster_time: true,
            cap_ms: None,
        };
        let track = |cap_ms, budget_ms, retry, primary| Decision::Track {
            cap_ms,
            budget_ms,
            probe: false,
            retry,
            primary,
            bounded: None,
        };
        let primary = |cap_ms, budget_ms, then| Decision::Primary {
            cap_ms: Some(cap_ms),
            budget_ms,
            then,
        };
        let secondary = rawdoc! {"mode": "secondary"};
        let tags = rawdoc! {"mode": "secondary", "tags": [{"node": "a1"}]};
        let tag_sets = rawdoc! {"mode": "nearest", "tagSets": [{"node": "a1"}, {}]};
        let any = rawdoc! {"mode": "secondary", "tags": [{}]};
        type Row<'r> = (
            &'r str,
            &'r bson::RawDocument,
            Option<i64>,
            Admission,
            Decision<'static>,
        );
        let rows: Vec<Row> = vec![
            // Untagged: climbs; the primary gets the whole budget (strict) ...
            (
                "pay.ladder",
                &secondary,
                Some(1000),
                open(),
                primary(1000, Some(1000), fail_fast),
            ),
            // ... the ceiling without a budget (attempt_limit only when longer) ...
            (
                "pay.ladder",
                &secondary,
                None,
                open(),
                primary(PRIMARY_RUNG_CEILING_MS, None, fail_fast),
            ),
            (
                "pay.off",
                &secondary,
                None,
                open(),
                primary(PRIMARY_RUNG_CEILING_MS, None, fail_fast),
            ),
            (
                "demo.ladder",
                &secondary,
                None,
                open(),
                primary(500, None, avail),
            ),
            (
                "demo.off",
                &secondary,
                None,
                open(),
                primary(PRIMARY_RUNG_CEILING_MS, None, avail),
            ),
            (
                "demo.ladder",
                &secondary,
                Some(4000),
                open(),
                primary(500, Some(4000), avail),
            ),
            // `tags: [{}]` matches any member: not pinned.
            (
                "pay.ladder",
                &any,
                None,
                open(),
                primary(PRIMARY_RUNG_CEILING_MS, None, fail_fast),
            ),
            (
                "pay.ladder",
                &any,
                Some(1000),
                Admission::Closed,
                track(Some(500), Some(1000), false, true),
            ),
            // Pinned: never to the primary. Strict fails fast when open and, closed, keeps
            // the client's own limit (no rung to leave room for) ...
            (
                "pay.ladder",
                &tags,
                Some(1000),
                Admission::Closed,
                track(None, Some(1000), false, false),
            ),
            (
                "pay.ladder",
                &tag_sets,
                None,
                Admission::Closed,
                track(None, None, false, false),
            ),
            (
                "pay.ladder",
                &tags,
                None,
                open(),
                Decision::FailFast {
                    reason: Reason::StaleRouting,
                    probe_in: Duration::from_secs(5),
                    errors: 3,
                },
            ),
            (
                "pay.ladder",
                &tag_sets,
                Some(1000),
                open(),
                Decision::FailFast {
                    reason: Reason::StaleRouting,
                    probe_in: Duration::from_secs(5),
                    errors: 3,
                },
            ),
            // ... fallback goes straight to `available`.
            (
                "demo.ladder",
                &tags,
                Some(1000),
                Admission::Closed,
                track(Some(500), Some(1000), true, false),
            ),
            (
                "demo.ladder",
                &tag_sets,
                None,
                open(),
                Decision::Rewrite {
                    drop_after_cluster_time: true,
                    cap_ms: None,
                },
            ),
        ];
        for (ns, rp, max_time, admission, want) in rows {
            let (db, coll) = ns.split_once('.').expect("db.coll");
            let mut body = rawdoc! {"find": coll, "$db": db, "$readPreference": rp.to_owned()};
            if let Some(ms) = max_time {
                body.append(bson::raw::cstr!("maxTimeMS"), ms);
            }
            let info = classify(&body).expect("classifies");
            let target = resolve(&info, &t).expect("governed");
            assert_eq!(
                decide(&target, &info, admission),
                want,
                "{ns} {rp:?} {max_time:?} {admission:?}"
            );
        }
    }

    #[test]
    fn decision_table_strict() {
        let find = rawdoc! {"find": "transactions", "$db": "pay", "maxTimeMS": 100, "$readPreference": secondary()};
        let (ns, d) = run(&find, Admission::Closed).expect("governed");
        assert_eq!(ns, "pay.transactions");
        // No ladder: no share taken, the client's own limit stands.
        assert_eq!(
            d,
            Decision::Track {
                cap_ms: None,
                budget_ms: Some(100),
                probe: false,
                retry: false,
                primary: false,
                bounded: None,
            }
        );
        match run(&find, open()).expect("governed").1 {
            Decision::FailFast { reason, errors, .. } => {
                assert_eq!((reason, errors), (Reason::StaleRouting, 3))
            }
            other => panic!("expected fail fast, got {other:?}"),
        }
        let asks = rawdoc! {"find": "transactions", "$db": "pay", "readConcern": {"level": "available"}, "$readPreference": secondary()};
        assert_eq!(
            run(&asks, Admission::Closed).expect("governed").1,
            Decision::Refuse(Refusal::Available)
        );
    }

    #[test]
    fn client_asking_available_on_fallback_is_forwarded() {
        let find = rawdoc! {"find": "store_inventory", "$db": "demo", "readConcern": {"level": "available"}, "$readPreference": secondary()};
        assert_eq!(run(&find, open()).expect("governed").1, Decision::Forward);
    }

    #[test]
    fn ineligible_reads_are_forwarded_even_when_open() {
        let cases = [
            // primary read: no $readPreference
            rawdoc! {"find": "store_inventory", "$db": "demo"},
            rawdoc! {"find": "store_inventory", "$db": "demo", "$readPreference": secondary(), "autocommit": false, "txnNumber": 1_i64},
            rawdoc! {"find": "store_inventory", "$db": "demo", "$readPreference": secondary(), "readConcern": {"level": "snapshot"}},
            rawdoc! {"aggregate": "store_inventory", "$db": "demo", "$readPreference": secondary(), "pipeline": [{"$out": "x"}], "cursor": {}},
            rawdoc! {"explain": {"find": "store_inventory"}, "$db": "demo", "$readPreference": secondary()},
            rawdoc! {"getMore": 12_i64, "collection": "store_inventory", "$db": "demo"},
            rawdoc! {"insert": "store_inventory", "$db": "demo", "documents": []},
        ];
        for body in &cases {
            let d = run(body, open()).map(|(_, d)| d);
            assert!(
                matches!(d, None | Some(Decision::Forward)),
                "{body:?} gave {d:?}"
            );
        }
    }

    #[test]
    fn strictest_namespace_wins() {
        let agg = rawdoc! {
            "aggregate": "store_inventory", "$db": "demo", "$readPreference": secondary(), "cursor": {},
            "pipeline": [{"$facet": {"a": [{"$unionWith": {"coll": "x", "pipeline": [{"$lookup": {"from": {"db": "pay", "coll": "transactions"}, "as": "t", "pipeline": []}}]}}]}}],
        };
        let (ns, d) = run(&agg, open()).expect("governed");
        assert_eq!(ns, "pay.transactions");
        assert!(matches!(d, Decision::FailFast { .. }), "{d:?}");
    }

    #[test]
    fn fallback_only_when_the_primary_namespace_is_fallback() {
        let agg = rawdoc! {
            "aggregate": "other", "$db": "demo", "$readPreference": secondary(), "cursor": {},
            "pipeline": [{"$lookup": {"from": "store_inventory", "as": "i", "localField": "a", "foreignField": "b"}}],
        };
        assert!(run(&agg, open()).is_none());
    }

    #[test]
    fn passthrough_entry_overrides_a_wider_strict_pattern() {
        let find = rawdoc! {"find": "audit", "$db": "pay", "$readPreference": secondary()};
        assert!(run(&find, open()).is_none());
    }

    #[test]
    fn causal_reads() {
        let ts = bson::Timestamp {
            time: 5,
            increment: 1,
        };
        let drop = rawdoc! {"find": "store_inventory", "$db": "demo", "$readPreference": secondary(), "readConcern": {"afterClusterTime": ts}};
        assert_eq!(
            run(&drop, open()).expect("governed").1,
            Decision::Rewrite {
                drop_after_cluster_time: true,
                cap_ms: Some(500)
            }
        );
        let skip = rawdoc! {"find": "causal_skip", "$db": "demo", "$readPreference": secondary(), "readConcern": {"afterClusterTime": ts}};
        assert_eq!(run(&skip, open()).expect("governed").1, Decision::Forward);
    }

    #[test]
    fn repeated_fields_are_refused_where_a_named_database_is_governed() {
        let mut twice_db = rawdoc! {"find": "transactions"};
        twice_db.append(bson::raw::cstr!("$db"), "other");
        twice_db.append(bson::raw::cstr!("$db"), "pay");
        let (ns, d) = run(&twice_db, Admission::Closed).expect("governed");
        assert_eq!(ns, "pay.transactions");
        assert_eq!(d, Decision::Refuse(Refusal::Duplicate("$db")));
        // The first `$db` counts as much as the last.
        let mut first = rawdoc! {"find": "t"};
        first.append(bson::raw::cstr!("$db"), "demo");
        first.append(bson::raw::cstr!("$db"), "other");
        assert_eq!(
            run(&first, Admission::Closed).map(|(ns, _)| ns),
            Some("demo.t".to_string())
        );
        // Any command, and a database with a fallback pattern only.
        let mut ping = rawdoc! {"ping": 1, "$db": "demo"};
        ping.append(bson::raw::cstr!("ping"), 1);
        assert_eq!(
            run(&ping, Admission::Closed),
            Some((
                "demo.$cmd".to_string(),
                Decision::Refuse(Refusal::Duplicate("ping"))
            ))
        );
        // No governed database: forwarded untouched.
        let mut other = rawdoc! {"find": "t", "$db": "other"};
        other.append(bson::raw::cstr!("maxTimeMS"), 1);
        other.append(bson::raw::cstr!("maxTimeMS"), 2);
        assert!(run(&other, Admission::Closed).is_none());
    }

    #[test]
    fn any_command_asking_available_on_a_strict_namespace_is_refused() {
        let rc = || rawdoc! {"level": "available"};
        for body in [
            rawdoc! {"mapReduce": "transactions", "out": {"inline": 1}, "readConcern": rc(), "$db": "pay"},
            rawdoc! {"geoSearch": "transactions", "readConcern": rc(), "$db": "pay"},
            rawdoc! {"listIndexes": "transactions", "readConcern": rc(), "$db": "pay"},
        ] {
            let (ns, d) = run(&body, Admission::Closed).expect("governed");
            assert_eq!(
                (ns.as_str(), d),
                ("pay.transactions", Decision::Refuse(Refusal::Available))
            );
        }
        // Fallback, passthrough, or no readConcern: not governed.
        for body in [
            rawdoc! {"mapReduce": "store_inventory", "readConcern": rc(), "$db": "demo"},
            rawdoc! {"mapReduce": "audit", "readConcern": rc(), "$db": "pay"},
            rawdoc! {"mapReduce": "transactions", "$db": "pay"},
        ] {
            assert!(run(&body, open()).is_none(), "{body:?}");
        }
    }

    /// An aggregate on `coll` whose `$unionWith` pipelines nest `depth` levels.
    fn deep(db: &str, coll: &str, depth: u32, rc: Option<&str>) -> bson::RawDocumentBuf {
        let mut p = bson::rawdoc! {"$match": {}};
        for _ in 0..depth {
            let mut arr = bson::RawArrayBuf::new();
            arr.push(p);
            p = rawdoc! {"$unionWith": {"coll": "x", "pipeline": arr}};
        }
        let mut arr = bson::RawArrayBuf::new();
        arr.push(p);
        let mut body = rawdoc! {"aggregate": coll, "pipeline": arr, "cursor": {}, "$db": db, "$readPreference": secondary()};
        if let Some(level) = rc {
            body.append(bson::raw::cstr!("readConcern"), rawdoc! {"level": level});
        }
        body
    }

    #[test]
    fn an_unreadable_pipeline_on_a_database_with_strict_patterns_is_strict() {
        let t = PolicyTable::from_policies(vec![
            NsPolicy::with_defaults("shop.stock", Mode::Fallback),
            NsPolicy::with_defaults("shop.ledger", Mode::Strict),
            NsPolicy::with_defaults("demo.inv", Mode::Fallback),
        ])
        .expect("table");
        let too_deep = crate::command::MAX_PIPELINE_DEPTH + 1;
        let body = deep("shop", "stock", too_deep, Some("available"));
        let info = classify(&body).expect("classifies");
        assert!(info.opaque_stage);
        let target = resolve(&info, &t).expect("governed");
        assert_eq!((target.mode, target.unreadable), (Mode::Strict, true));
        assert_eq!(
            decide(&target, &info, Admission::Closed),
            Decision::Refuse(Refusal::AvailableUnreadable)
        );
        // Without `available`: never relaxed, never tracked (no breaker stands for it).
        let body = deep("shop", "stock", too_deep, None);
        let info = classify(&body).expect("classifies");
        let target = resolve(&info, &t).expect("governed");
        assert_eq!(target.kind, ReadKind::Ineligible);
        assert_eq!(decide(&target, &info, open()), Decision::Forward);
        // Readable depth on the fallback namespace: an ordinary fallback read.
        let body = deep("shop", "stock", 3, None);
        let info = classify(&body).expect("classifies");
        assert_eq!(resolve(&info, &t).map(|t| t.mode), Some(Mode::Fallback));
        // A database without strict patterns: left alone, as before.
        let body = deep("demo", "inv", too_deep, Some("available"));
        let info = classify(&body).expect("classifies");
        assert!(resolve(&info, &t).is_none());
    }

    #[test]
    fn max_time_cap() {
        let cap = Some(Duration::from_millis(500));
        assert_eq!(capped_max_time(None, cap), Some(500));
        assert_eq!(capped_max_time(Some(10_000), cap), Some(500));
        assert_eq!(capped_max_time(Some(100), cap), None);
        // maxTimeMS 0 means "no limit" to the server, so the cap applies.
        assert_eq!(capped_max_time(Some(0), cap), Some(500));
        assert_eq!(capped_max_time(Some(100), None), None);
    }
}
