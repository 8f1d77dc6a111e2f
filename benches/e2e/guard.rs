//! The CI guard: `cargo bench --bench e2e -- --guard` (`.ci/run` runs it). A short
//! side-by-side of staleguard's governed reads (every read tracked, its `maxTimeMS`
//! written), HAProxy in tcp mode and the bare forwarder, through one fake mongos, that fails
//! when staleguard's CPU per governed round trip exceeds [`LIMIT`] times HAProxy's, scaled
//! by the bare forwarder's ratio on a machine where the forwarder alone costs more than
//! HAProxy, plus [`NOISE`] ([`limit`]).
//!
//! Made to hold on a loaded machine: it judges ratios, never times. Each round runs the
//! three targets back to back (their order rotated), so a ratio compares proxies measured
//! seconds apart under the same load; the verdict is the median of the rounds' ratios. The
//! forwarder's ratio is printed beside it: a machine too noisy to compare anything shows as
//! a forwarder far from HAProxy.
//!
//! Defaults (each has its `E2E_*` variable): 64 connections, closed loop, 11 rounds of 1 s
//! after 0.3 s of warm-up: about 45 s once the processes are up. Eleven rounds rather than
//! seven: on the loaded 2-core machine the median of seven moved by ±0.05 from run to run
//! (BENCHMARKS.md, "The CI guard").

use crate::report::Sample;
use crate::{load, Opts};

/// staleguard's CPU per governed round trip may be at most this many times HAProxy's (times
/// the bare forwarder's ratio when the forwarder alone costs more than HAProxy, see
/// [`limit`]).
pub const LIMIT: f64 = 1.3;

/// How far a run's median may move from run to run on one machine: 11 rounds of the same
/// build gave medians 0.05 apart (1.38-1.43x on 2026-12-02); the limit allows twice that.
pub const NOISE: f64 = 0.1;

/// The limit of a run whose forwarder measured `floor` times HAProxy's CPU: [`LIMIT`] times
/// the forwarder's ratio when that is above 1, plus [`NOISE`]. The forwarder is the same
/// runtime and the same system calls with nothing of staleguard's work: what it costs above
/// HAProxy is the machine's (its CPU's price of a wake-up and a system call), not a change of
/// staleguard's. The 1.3x was set on AMD EPYC machines, where the forwarder measured
/// 0.95-1.04x and staleguard 1.06-1.22x; on an Intel Xeon machine of the same kind
/// (2026-12-02) the forwarder measured 1.09-1.11x, and the same staleguard build (32c3a0b)
/// 1.40-1.41x. The regression this guard was made for (30-45 % more CPU) is still far
/// above the limit on either (BENCHMARKS.md, "The CI guard").
pub fn limit(floor: f64) -> f64 {
    let scale = if floor.is_finite() && floor > 1.0 {
        floor
    } else {
        1.0
    };
    LIMIT * scale + NOISE
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs the rounds; `Ok(true)` when staleguard is within [`LIMIT`].
pub fn run(opts: &Opts) -> Result<bool, String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.client_threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let fleet = crate::start_fleet(opts)?;
    if fleet.haproxy.is_none() {
        return Err(format!("no HAProxy to compare with: {:?}", fleet.notes));
    }
    let targets = crate::targets(opts, &fleet);
    let conns = opts.conns.first().copied().unwrap_or(64);
    let reply_len = crate::reply_len(opts);
    println!("{}", crate::report::load_average("at the start"));
    let mut governed = Vec::new();
    let mut floor = Vec::new();
    rt.block_on(async {
        for round in 0..opts.rounds {
            let mut cpu = std::collections::BTreeMap::new();
            for k in 0..targets.len() {
                let t = &targets[(k + round) % targets.len()];
                let spec = load::Spec {
                    addr: t.addr,
                    conns,
                    warmup: opts.warmup,
                    measure: opts.measure,
                    request: t.request.clone(),
                    reply_len,
                    cpu_pid: t.cpu_pid,
                    upstream_pid: None,
                    count: false,
                    rate: opts.rate,
                    callgrind: false,
                    active: opts.active,
                };
                let out = load::run(&spec)
                    .await
                    .map_err(|e| format!("{}: {e}", t.name))?;
                let s = Sample::of(&out);
                if s.unexpected > 0 {
                    return Err(format!("{}: {} unexpected replies", t.name, s.unexpected));
                }
                cpu.insert(t.name.clone(), s.cpu_us.unwrap_or(f64::NAN));
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            let h = cpu["haproxy"];
            let g = cpu["staleguard-governed"] / h;
            let f = cpu["floor"] / h;
            println!(
                "round {}: staleguard-governed/haproxy {g:.2}x, floor/haproxy {f:.2}x",
                round + 1
            );
            governed.push(g);
            floor.push(f);
        }
        Ok::<(), String>(())
    })?;
    let (g, f) = (median(governed), median(floor));
    let max = limit(f);
    let ok = g <= max;
    println!(
        "guard: staleguard's CPU per governed round trip is {g:.2}x HAProxy's (median of {} \
         rounds, {conns} connections; the forwarder {f:.2}x): {} (limit {max:.2}x: {LIMIT}x, \
         times the forwarder's ratio when above 1, plus {NOISE})",
        opts.rounds,
        if ok { "PASS" } else { "FAIL" }
    );
    println!("{}", crate::report::load_average("at the end"));
    Ok(ok)
}
