//! `staleguard demo` tells the articles' story: with short phases, the numbers must show
//! the difference staleguard makes on each path, and staleguard must say that writes are not
//! completing before the first read fails.

use std::time::Duration;

use staleguard::demo::{self, DemoOptions, Path, Workload};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_shows_fallback_answering_and_strict_failing_fast() {
    let opts = DemoOptions {
        phase: Duration::from_millis(2500),
        refresh_timeout: Duration::from_millis(1500),
        app_timeout: Duration::from_millis(700),
        payment_max_time: Duration::from_millis(500),
        rate: 20,
        seed: 11,
    };
    let report = demo::run(&staleguard::demo_proxy::InProcess, opts, false)
        .await
        .expect("demo runs");
    let t = |w, p| report.tallies.get(&(w, p)).cloned().expect("tally");
    let inv_direct = t(Workload::Inventory, Path::Direct);
    let inv_guard = t(Workload::Inventory, Path::Staleguard);
    let pay_direct = t(Workload::Payments, Path::Direct);
    let pay_guard = t(Workload::Payments, Path::Staleguard);
    println!("{}", demo::summary(&report));
    for line in &report.timeline {
        println!("{line}");
    }
    // The incident hurts reads that go straight to mongos ...
    assert!(inv_direct.requests > 100 && inv_direct.ok < inv_direct.requests);
    assert!(pay_direct.ok < pay_direct.requests);
    // ... the fallback path keeps answering, at the price of orphans ...
    assert!(
        inv_guard.ok * inv_direct.requests > inv_direct.ok * inv_guard.requests,
        "staleguard inventory answered a larger share"
    );
    assert!(inv_guard.orphans > 0, "available served orphans");
    assert_eq!(inv_direct.orphans, 0, "versioned reads filter orphans");
    // ... and the strict path fails fast (bounded by open_time_limit while the breaker is
    // open, so healthy secondaries still answer) and is never relaxed.
    assert_eq!(pay_guard.orphans, 0);
    assert!(
        pay_guard.errors.keys().any(|k| k.starts_with("fail-fast")),
        "{:?}",
        pay_guard.errors
    );
    assert!(
        pay_guard_error_p50(&pay_direct) >= 400.0,
        "direct errors hang"
    );
    // The partial incident (phase 3: a1 stale, a2 healthy): payments through staleguard
    // answered about as often as straight to mongos (an all-or-nothing breaker answered a
    // fraction of it).
    assert!(
        pay_guard.partial_ok * pay_direct.partial_requests * 10
            >= pay_direct.partial_ok * pay_guard.partial_requests * 8,
        "partial incident: staleguard {}/{}, direct {}/{}",
        pay_guard.partial_ok,
        pay_guard.partial_requests,
        pay_direct.partial_ok,
        pay_direct.partial_requests
    );
    // The timeline names the phases, the write stall and the breaker transitions.
    let text = report.timeline.join("\n");
    for needle in [
        "stalls",
        "writes are not completing through upstream",
        "writes are not completing on shard A",
        "a1 is restarted",
        "demo.store_inventory breaker OPEN",
        "pay.transactions breaker OPEN",
        "resumes",
        "writes complete again",
    ] {
        assert!(text.contains(needle), "timeline lacks {needle:?}:\n{text}");
    }
    // staleguard says writes are not completing before the first read fails ...
    let line = |needle: &str| {
        report
            .timeline
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in\n{text}"))
    };
    let stall = line("WRITE STALL suspected");
    assert!(
        line("phase 2:") < stall && stall < line("phase 3:"),
        "{text}"
    );
    let detected = report.stall_detected_at.expect("stall detected");
    let first_error = [inv_direct.first_error_at, pay_direct.first_error_at]
        .into_iter()
        .flatten()
        .min()
        .expect("direct reads failed");
    assert!(
        detected < first_error,
        "stall seen at {detected:?}, first read error at {first_error:?}"
    );
    // ... and acts on it: the inventory breaker is held open before a1 restarts.
    assert!(
        report.timeline[stall..line("phase 3:")]
            .iter()
            .any(|l| l.contains("demo.store_inventory breaker OPEN") && l.contains("held open")),
        "{text}"
    );
    // With the primary ladder, payments answer at least as often as straight to mongos,
    // faster at p99, with no orphans.
    let pay_ladder = t(Workload::Payments, Path::Ladder);
    assert!(
        pay_ladder.ok * pay_direct.requests >= pay_direct.ok * pay_ladder.requests,
        "ladder answered {}/{}, direct {}/{}",
        pay_ladder.ok,
        pay_ladder.requests,
        pay_direct.ok,
        pay_direct.requests
    );
    assert_eq!(pay_ladder.orphans, 0);
    assert!(
        pay_ladder.percentile(99.0) < pay_direct.percentile(99.0),
        "ladder p99 {} direct p99 {}",
        pay_ladder.percentile(99.0),
        pay_direct.percentile(99.0)
    );
    // The orphan estimate is within a factor of 2 of what the display really received
    // twice (the estimate misses a copy in another batch or past the cap; the display misses
    // replies it gave up on).
    let (estimate, truth) = (report.orphans_estimated, inv_guard.orphans);
    assert!(
        truth > 0 && estimate * 2 >= truth && estimate <= truth * 2,
        "estimate {estimate}, ground truth {truth}"
    );
    let orders = t(Workload::Orders, Path::Staleguard);
    assert!(orders.ok > 0 && orders.requests > orders.ok, "{orders:?}");
    // The summary says what each phase's numbers mean, with this run's numbers: phase 4's
    // direct answers that came after the primary resumed, which staleguard had failed fast.
    let summary = demo::summary(&report);
    for needle in [
        "What each phase shows",
        "  3 a1 restarts (a1 stale, a2 healthy): straight to mongos ",
        &format!(
            "Straight to mongos, {} of its {} answers in this phase came after the primary resumed",
            pay_direct.answered_late[3], pay_direct.by_phase[3].1
        ),
        "the price of not hanging",
        "  sg+ladder: ",
    ] {
        assert!(
            summary.contains(needle),
            "summary lacks {needle:?}:\n{summary}"
        );
    }
}

/// A taken default admin address (a staleguard already running on this machine) gives the
/// demo's proxy a free port for its page, not an error it cannot act on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_page_goes_on_a_free_port_when_the_default_is_taken() {
    use staleguard::demo::Launch;
    // Taken: by this listener, or by whatever already holds it.
    let _held = std::net::TcpListener::bind(staleguard::config::DEFAULT_ADMIN_LISTEN);
    let config =
        "listen = \"127.0.0.1:0\"\nupstreams = [\"127.0.0.1:1\"]\nhealth_interval = \"off\"\n";
    let proxy = staleguard::demo_proxy::InProcess
        .start(config, true)
        .await
        .expect("starts");
    let admin = proxy.admin_addr().expect("a page on a free port");
    assert_ne!(admin.to_string(), staleguard::config::DEFAULT_ADMIN_LISTEN);
    assert!(admin.ip().is_loopback(), "{admin}");
    proxy.shutdown().await;
}

fn pay_guard_error_p50(t: &demo::Tally) -> f64 {
    let mut v = t.error_ms.clone();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
