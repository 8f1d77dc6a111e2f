//! The tick: every `TICK`, judge the passive signal of every upstream, then act
//! (`on_write_stall`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    lock, passive_stalled, Ctx, Evidence, Needs, Observation, PassiveSample, SignalKind,
    StallWatch, UpstreamWrites, TICK,
};
use crate::config::{Config, Mode, StallAction};
use crate::metrics::{UpstreamLabel, UpstreamResult};

pub(super) async fn tick(shared: Ctx, stop: CancellationToken) {
    let mut every = tokio::time::interval(TICK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        let config = shared.config.load_full();
        judge_passive(&shared, &config, Instant::now());
        act(&shared, &config, Instant::now());
    }
}

/// The passive signal of every upstream, judged now.
fn judge_passive(shared: &Ctx, config: &Config, now: Instant) {
    let watch = &shared.stall;
    let m = &shared.metrics.stall;
    if !config.stall.passive {
        watch.retain(&shared.metrics, SignalKind::Passive, |_| false);
        return;
    }
    watch.upstreams.retain(|addr, _| {
        let keep = config.upstreams.contains(addr);
        if !keep {
            let label = UpstreamLabel {
                upstream: addr.clone(),
            };
            m.writes_in_flight.remove(&label);
            m.oldest_write.remove(&label);
        }
        keep
    });
    watch.retain(&shared.metrics, SignalKind::Passive, |t| {
        config.upstreams.iter().any(|u| u == t)
    });
    let c = &config.stall;
    let needs = Needs {
        min_in_flight: c.min_in_flight,
        min_addresses: c.min_client_addresses,
    };
    for addr in &config.upstreams {
        let up = watch.upstream(addr);
        let at = watch.clock(now);
        let s = up.sample(at, c.stall_after);
        export_passive(shared, addr, &up, &s);
        // Judged every tick: a reply to any write clears it at once; clients leaving (their
        // writes stop counting) end the rule but are no progress, so a raised signal stays
        // until `clear_after` has passed without its rule holding.
        let rule = passive_stalled(&s, c.stall_after, needs);
        let raised = lock(&up.eval).judge(rule, at, s.last_reply_at, c.clear_after());
        let since = passive_since(watch, &s, now);
        let mut summary = passive_summary(&s, c.stall_after);
        if raised && !rule {
            summary.push_str(&format!(
                "; kept raised: no write answered since it rose (it clears at the first answer, or after {} without this evidence)",
                humantime::format_duration(c.clear_after())
            ));
        }
        watch.update(
            &shared.metrics,
            SignalKind::Passive,
            addr,
            &format!("upstream {addr}"),
            Observation {
                raised,
                since,
                summary,
                evidence: Evidence {
                    writes_in_flight: Some(s.in_flight),
                    connections_waiting: Some(s.connections),
                    client_addresses_waiting: Some(s.addresses),
                    oldest_write_seconds: s.oldest_age.map(|d| d.as_secs_f64()),
                    last_completion_seconds_ago: s.since_reply.map(|d| d.as_secs_f64()),
                    writes_completed: Some(s.completed),
                    writes_abandoned: Some(s.abandoned),
                    ..Evidence::default()
                },
            },
        );
    }
}

/// When writes stopped completing: the last reply to a write, or the oldest waiting write's
/// start if it came later.
fn passive_since(watch: &StallWatch, s: &PassiveSample, now: Instant) -> Instant {
    let last = s.since_reply.map(|d| now - d.min(now - watch.epoch));
    let oldest = s.oldest_age.map(|d| now - d.min(now - watch.epoch));
    match (last, oldest) {
        (Some(a), Some(b)) => a.max(b),
        (a, b) => a.or(b).unwrap_or(now),
    }
}

fn passive_summary(s: &PassiveSample, stall_after: Duration) -> String {
    let plural = |n: u32| if n == 1 { "" } else { "s" };
    let waiting = match (s.in_flight, s.oldest_age) {
        (0, _) => "no write waiting".to_string(),
        (n, Some(a)) => format!(
            "{n} write{} waiting, the oldest for {:.1} s; {} connection{} from {} client address{} with one waiting {:.1} s or more",
            plural(n),
            a.as_secs_f64(),
            s.connections,
            plural(s.connections),
            s.addresses,
            if s.addresses == 1 { "" } else { "es" },
            stall_after.as_secs_f64()
        ),
        (n, None) => format!("{n} write{} waiting", plural(n)),
    };
    let done = match s.since_reply {
        None => "none answered yet".to_string(),
        Some(d) if d >= stall_after => format!("none answered for {:.1} s", d.as_secs_f64()),
        Some(d) => format!("last answered {:.1} s ago", d.as_secs_f64()),
    };
    let left = if s.abandoned > 0 {
        format!(
            "; {} left unanswered by clients that went away",
            s.abandoned
        )
    } else {
        String::new()
    };
    format!("{waiting}; {done}{left}")
}

fn export_passive(shared: &Ctx, addr: &str, up: &UpstreamWrites, s: &PassiveSample) {
    let m = &shared.metrics.stall;
    let label = UpstreamLabel {
        upstream: addr.to_string(),
    };
    m.writes_in_flight
        .get_or_create(&label)
        .set(i64::from(s.in_flight));
    m.oldest_write
        .get_or_create(&label)
        .set(s.oldest_age.map_or(0.0, |d| d.as_secs_f64()));
    let mut eval = lock(&up.eval);
    for (i, (result, now)) in [
        ("completed", s.completed),
        ("failed", s.failed),
        ("abandoned", s.abandoned),
    ]
    .into_iter()
    .enumerate()
    {
        let delta = now.saturating_sub(eval.exported[i]);
        if delta > 0 || eval.exported[i] == 0 {
            m.write_replies
                .get_or_create(&UpstreamResult {
                    upstream: addr.to_string(),
                    result,
                })
                .inc_by(delta);
        }
        eval.exported[i] = now;
    }
}

/// `on_write_stall`: holds fallback breakers open while any signal is raised; releases
/// them when every signal has cleared. Whatever the action, the moment every signal clears
/// (writes complete again, so secondaries can refresh) every open breaker probes at its
/// next read instead of waiting out its cooldown.
fn act(shared: &Ctx, config: &Config, now: Instant) {
    let watch = &shared.stall;
    let raised = watch.first_raised();
    let cleared = watch.was_raised.swap(raised.is_some(), Ordering::SeqCst) && raised.is_none();
    let acting = config.stall.on_write_stall == StallAction::OpenFallbackBreakers;
    match raised {
        Some(signal) if acting => {
            let why = signal
                .headline()
                .unwrap_or_else(|| "write stall suspected".to_string());
            let why = format!("write stall suspected: {why}");
            let exact = config
                .policy
                .entries()
                .iter()
                .filter(|p| p.mode == Mode::Fallback && !p.pattern.ends_with('*'))
                .map(|p| p.pattern.clone());
            let with_breaker = shared.breakers.snapshot().into_iter().filter_map(|b| {
                let fallback =
                    b.ns.split_once('.')
                        .and_then(|(db, coll)| config.policy.lookup(db, coll))
                        .is_some_and(|p| p.mode == Mode::Fallback);
                (fallback && !b.held).then_some(b.ns)
            });
            let namespaces: Vec<String> = exact.chain(with_breaker).collect();
            shared
                .breakers
                .hold_fallback(namespaces.iter().map(String::as_str), &why, now);
            if !watch.holding.swap(true, Ordering::SeqCst) {
                tracing::warn!(
                    action = "open_fallback_breakers",
                    "write stall: holding the breakers of fallback namespaces open"
                );
            }
        }
        _ => {
            if watch.holding.swap(false, Ordering::SeqCst) {
                shared.breakers.end_hold(now);
            }
        }
    }
    if cleared {
        shared.breakers.probe_early();
    }
}
