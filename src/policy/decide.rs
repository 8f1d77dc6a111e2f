//! Deciding: which namespace governs a command and what to do with it. Pure functions over
//! values: `resolve` (command + pattern table → target) and `decide` (target + breaker
//! admission → `Decision`).

use std::sync::Arc;
use std::time::Duration;

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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadKind {
    /// The policy acts on it (breaker, retry, rewrite, fail-fast).
    Eligible,
    /// The client asked for `readConcern: available` itself.
    AsksAvailable,
    /// A read the policy leaves alone (primary, transaction, snapshot, explain, $out, ...).
    Ineligible,
}

/// What the session does with one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Send the original bytes; do not look at the reply.
    Forward,
    /// Send (the original bytes, or with `maxTimeMS` capped) and inspect the reply: count
    /// trigger errors; when `retry`, a trigger error is answered by resending with
    /// `available` instead of being shown to the client.
    Track {
        /// `maxTimeMS` to set before sending (the cap was lower than the client's value).
        cap_ms: Option<i64>,
        /// The half-open probe.
        probe: bool,
        retry: bool,
    },
    /// Rewrite to `available` before sending (fallback, breaker open).
    Rewrite {
        drop_after_cluster_time: bool,
        cap_ms: Option<i64>,
    },
    /// Reply an error at once, send nothing (strict, breaker open).
    FailFast {
        reason: Reason,
        probe_in: Duration,
        errors: u32,
    },
    /// Reply an error at once, send nothing (strict namespace asked for `available`).
    Refuse,
}

fn strictness(mode: Mode) -> u8 {
    match mode {
        Mode::Passthrough => 0,
        Mode::Fallback => 1,
        Mode::Strict => 2,
    }
}

/// Finds the governing namespace of a read command. `None`: no namespace it touches has an
/// acting policy, so the command is forwarded untouched.
pub fn resolve<'a>(info: &CommandInfo<'a>, table: &PolicyTable) -> Option<Target<'a>> {
    if !is_read_command(info.name) && !info.explain {
        return None;
    }
    info.db?;
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
    let (ns, policy) = best?;
    let mode = policy.mode;
    // Fallback acts only when the primary namespace itself is fallback; a pipeline that
    // merely reads a fallback namespace from an unlisted one is left alone.
    if mode == Mode::Fallback && (primary != Some(ns) || info.opaque_stage || touches_passthrough) {
        return None;
    }
    let kind = if info.read_concern.level == Some("available") {
        ReadKind::AsksAvailable
    } else if is_eligible_shape(info) && pref_allowed(info.read_pref, policy.read_preferences) {
        ReadKind::Eligible
    } else {
        ReadKind::Ineligible
    };
    Some(Target {
        ns,
        policy: policy.clone(),
        mode,
        kind,
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
pub fn decide(target: &Target<'_>, info: &CommandInfo<'_>, admission: Admission) -> Decision {
    let p = &target.policy;
    match (target.kind, target.mode) {
        (ReadKind::AsksAvailable, Mode::Strict) => return Decision::Refuse,
        (ReadKind::Eligible, _) => {}
        _ => return Decision::Forward,
    }
    let cap_ms = capped_max_time(info.max_time_ms, p.max_time);
    let causal_skip = info.read_concern.after_cluster_time && p.causal == Causal::Skip;
    match (target.mode, admission) {
        (Mode::Fallback, _) if causal_skip => Decision::Forward,
        (Mode::Fallback, Admission::Closed) => Decision::Track {
            cap_ms,
            probe: false,
            retry: true,
        },
        (Mode::Fallback, Admission::Probe) => Decision::Track {
            cap_ms,
            probe: true,
            retry: true,
        },
        (Mode::Fallback, Admission::Open { .. }) => Decision::Rewrite {
            drop_after_cluster_time: true,
            cap_ms,
        },
        (_, Admission::Closed) => Decision::Track {
            cap_ms,
            probe: false,
            retry: false,
        },
        (_, Admission::Probe) => Decision::Track {
            cap_ms,
            probe: true,
            retry: false,
        },
        (
            _,
            Admission::Open {
                reason,
                probe_in,
                errors,
            },
        ) => Decision::FailFast {
            reason,
            probe_in,
            errors,
        },
    }
}

impl Decision {
    pub fn name(&self) -> &'static str {
        match self {
            Decision::Forward => "forward",
            Decision::Track { retry: true, .. } => "track_retry",
            Decision::Track { .. } => "track",
            Decision::Rewrite { .. } => "rewrite",
            Decision::FailFast { .. } => "fail_fast",
            Decision::Refuse => "refuse",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::classify;
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
    fn run(body: &bson::RawDocument, admission: Admission) -> Option<(String, Decision)> {
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
        // No client maxTimeMS: the 500 ms cap is imposed.
        assert_eq!(
            d,
            Decision::Track {
                cap_ms: Some(500),
                probe: false,
                retry: true
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
                cap_ms: Some(500),
                probe: true,
                retry: true
            }
        );
    }

    #[test]
    fn decision_table_strict() {
        let find = rawdoc! {"find": "transactions", "$db": "pay", "maxTimeMS": 100, "$readPreference": secondary()};
        let (ns, d) = run(&find, Admission::Closed).expect("governed");
        assert_eq!(ns, "pay.transactions");
        assert_eq!(
            d,
            Decision::Track {
                cap_ms: None,
                probe: false,
                retry: false
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
            Decision::Refuse
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
