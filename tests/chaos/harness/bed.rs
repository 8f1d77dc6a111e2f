//! The test bed: the simulated cluster (auth on unless asked otherwise, a 2 s view, a 1 ms
//! hop between mongos and the shards, the read log) and one staleguard in front of it with
//! the shipped policies (`demo.store_inventory` fallback, `pay.*` strict, every other
//! setting at its default), or the same with the primary rung, the harness's user as the
//! login of its own confirming connections (`[confirm]`) when auth is on, and its admin
//! endpoint, which is how the harness watches it. The cluster and the proxy each run on a
//! runtime of their own (two threads each), as their own processes would: neither waits
//! behind the clients' tasks for a worker. The incidents are driven here.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::Bson;
use staleguard::config::Config;
use staleguard::server::Running;
use staleguard::sim::{self, SimConfig, SimHandle};
use tokio::runtime::Runtime;
use tokio::time::Instant;

use super::plan::{Incident, Plan, Policy};

pub const USER: &str = "app";
pub const PASSWORD: &str = "chaos-secret";
pub const PAYMENTS: &str = "pay.transactions";
pub const INVENTORY: &str = "demo.store_inventory";
/// A view of `pay.transactions` whose pipeline takes [`VIEW_COST`]: strict by `pay.*`.
pub const VIEW: &str = "pay.slow_view";
pub const VIEW_COST: Duration = Duration::from_secs(2);

pub struct Bed {
    pub sim: SimHandle,
    pub proxy: Running,
    pub mongos: SocketAddr,
    pub guarded: SocketAddr,
    pub admin: SocketAddr,
    pub auth: bool,
    /// How late each runtime's ticks came (see [`Lags`]).
    pub lags: Lags,
    sim_rt: Own,
    proxy_rt: Own,
}

/// Ticks every [`TICK`] on the simulated cluster's runtime and on the proxy's, each
/// recorded when it came more than [`LATE`] late: on a machine busy with other work both
/// wait for a core, the cluster answers late and staleguard's own timers fire late, and a
/// failed check in a window where they did says so (the figures are the machine's too).
#[derive(Clone, Default)]
pub struct Lags(Arc<Mutex<Vec<Late>>>);

/// A tick that came late: when it was due to start waiting, how late, on which runtime.
type Late = (Instant, Duration, &'static str);

const TICK: Duration = Duration::from_millis(50);
const LATE: Duration = Duration::from_millis(20);

impl Lags {
    async fn tick(self, which: &'static str) {
        loop {
            let t = Instant::now();
            tokio::time::sleep(TICK).await;
            let late = t.elapsed().saturating_sub(TICK);
            if late > LATE {
                self.0.lock().expect("lags").push((t, late, which));
            }
        }
    }

    /// How late each runtime's latest tick in `[from, to)` came, by runtime.
    pub fn max_in(&self, from: Instant, to: Instant) -> Vec<(&'static str, Duration)> {
        let mut out: Vec<(&'static str, Duration)> = Vec::new();
        for &(t, late, which) in self.0.lock().expect("lags").iter() {
            if t < from || t >= to {
                continue;
            }
            match out.iter_mut().find(|(w, _)| *w == which) {
                Some((_, m)) => *m = (*m).max(late),
                None => out.push((which, late)),
            }
        }
        out
    }
}

/// A runtime of its own, shut down without blocking when dropped (a runtime dropped in an
/// async context would panic).
struct Own(Option<Runtime>);

impl Own {
    fn new(name: &str) -> Own {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(name)
            .enable_all()
            .build()
            .expect("a runtime");
        Own(Some(rt))
    }

    /// Runs `fut` on this runtime until the runtime shuts down.
    fn spawn<F>(&self, fut: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let rt = self.0.as_ref().expect("the runtime is alive");
        rt.spawn(fut);
    }

    /// Runs `fut` on this runtime and waits for it.
    async fn run<F>(&self, fut: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let rt = self.0.as_ref().expect("the runtime is alive");
        rt.spawn(fut).await.expect("the task ends")
    }
}

impl Drop for Own {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The policies, with the admin endpoint on an ephemeral port, and the login of
/// staleguard's own confirming connections when the cluster requires one.
fn proxy_config(upstream: SocketAddr, policy: Policy, auth: bool) -> String {
    let confirm = if auth {
        format!("\n[confirm]\nusername = \"{USER}\"\npassword = \"{PASSWORD}\"\n")
    } else {
        String::new()
    };
    let (fallback, strict) = match policy {
        Policy::Shipped => ("", ""),
        Policy::Ladder => (
            "ladder = [\"primary\", \"available\"]\n",
            "ladder = [\"primary\"]\n",
        ),
    };
    format!(
        r#"listen = "127.0.0.1:0"
upstreams = ["{upstream}"]
shutdown_timeout = "0s"

[admin]
listen = "127.0.0.1:0"
{confirm}
[[namespaces]]
pattern = "demo.store_inventory"
mode = "fallback"
{fallback}
[[namespaces]]
pattern = "pay.*"
mode = "strict"
{strict}"#
    )
}

impl Bed {
    pub async fn start(plan: &Plan) -> Bed {
        let users = if plan.opts.auth {
            vec![(USER.to_string(), PASSWORD.to_string())]
        } else {
            Vec::new()
        };
        let sim_rt = Own::new("chaos-sim");
        let sim = sim_rt
            .run(sim::start(SimConfig {
                listen: "127.0.0.1:0".into(),
                seed: plan.sim_seed,
                hop_latency: Duration::from_millis(1),
                read_log: 1_000_000,
                users,
                ..SimConfig::default()
            }))
            .await
            .expect("the simulated cluster starts");
        sim.cluster()
            .create_view(VIEW, "transactions", &Vec::<Bson>::new(), VIEW_COST)
            .unwrap_or_else(|e| panic!("view {VIEW}: {e}"));
        let mongos = sim.addr();
        let config = Config::parse(
            &proxy_config(mongos, plan.policy, plan.opts.auth),
            Path::new("chaos.toml"),
        )
        .unwrap_or_else(|e| panic!("chaos config: {e:?}"));
        let proxy_rt = Own::new("chaos-proxy");
        let proxy = proxy_rt
            .run(staleguard::server::start(Arc::new(config)))
            .await
            .expect("staleguard starts");
        let guarded = proxy.local_addr();
        let admin = proxy.admin_addr().expect("the admin endpoint listens");
        let lags = Lags::default();
        sim_rt.spawn(lags.clone().tick("cluster"));
        proxy_rt.spawn(lags.clone().tick("staleguard"));
        Bed {
            sim,
            proxy,
            mongos,
            guarded,
            admin,
            auth: plan.opts.auth,
            lags,
            sim_rt,
            proxy_rt,
        }
    }

    /// The driver URI of `addr` (with the harness's user when auth is on).
    pub fn uri(&self, addr: SocketAddr) -> String {
        let creds = if self.auth {
            format!("{USER}:{PASSWORD}@")
        } else {
            String::new()
        };
        format!(
            "mongodb://{creds}{addr}/?directConnection=true&authSource=admin&serverSelectionTimeoutMS=5000&connectTimeoutMS=5000"
        )
    }

    /// Shard A's primary stalls, and one or both of its secondaries restart.
    pub fn inject(&self, incident: Incident, partial_node: &str) {
        let cluster = self.sim.cluster();
        cluster.stall_primary("shardA").expect("stall shard A");
        let nodes: &[&str] = match incident {
            Incident::Partial => &[partial_node],
            Incident::Full => &["a1", "a2"],
        };
        for n in nodes {
            cluster.restart_node(n).expect("restart a secondary");
        }
    }

    /// The primary resumes: secondaries can refresh again.
    pub fn heal(&self) {
        self.sim
            .cluster()
            .resume_primary("shardA")
            .expect("resume shard A");
    }

    pub async fn stop(self) {
        let Bed {
            sim,
            proxy,
            sim_rt,
            proxy_rt,
            ..
        } = self;
        proxy_rt.run(proxy.shutdown()).await;
        sim_rt.run(sim.shutdown()).await;
    }
}
