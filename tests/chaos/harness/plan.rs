//! What a run does, decided from its seed before anything starts: which behaviours run and
//! how many connections each has, the order of the incidents and which secondary the partial
//! one restarts, and a forked random stream for every task. Knobs come from the
//! environment so a failing seed, or one behaviour alone, can be run again:
//!
//! - `CHAOS_SEED`: the seed (default: from the clock; always printed);
//! - `CHAOS_BEHAVIOURS`: `all` (default), `none` (honest clients alone), or a comma list
//!   of the names in [`Behaviour::ALL`]; a leading `-` removes one from `all` (`-views`);
//! - `CHAOS_INCIDENTS`: `partial,full` in any order (default: both, order from the seed);
//! - `CHAOS_AUTH`: `on` (default) or `off` (the simulated cluster without users);
//! - `CHAOS_POLICY`: `shipped` or `ladder` (the primary rung on both namespaces; default:
//!   one of them, from the seed);
//! - `CHAOS_HEALTHY_SECS`, `CHAOS_INCIDENT_SECS`, `CHAOS_AFTER_SECS`, `CHAOS_READERS`
//!   (paced strict and fallback readers per path), `CHAOS_RATE` (their reads per second).

use std::time::Duration;

use super::rng::Rng;

/// A client behaviour the mix may hold beside the honest paced readers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Behaviour {
    /// Honest readers whose healthy reads take 1.2 s (a strict one without `maxTimeMS`, a
    /// fallback one with 3 s): slower than `open_time_limit` and the first attempt's limit.
    SlowReads,
    /// A view whose pipeline takes 2 s (`pay.slow_view`): an honest reader with 3 s, and
    /// clients with a 1.5 s budget whose own limit runs out.
    Views,
    /// Honest `secondaryPreferred` reads with a tag set no member has: the primaries answer.
    PreferredTags,
    /// Honest `secondary` reads pinned by a tag set to shard A's secondary that the partial
    /// incident leaves healthy (`[{node}, {}]`: any secondary of shard B).
    PinnedReads,
    /// Honest paced strict readers through pymongo, beside the Rust driver's.
    Pymongo,
    /// Connections sending their own `maxTimeMS: 1` about every 0.3 s.
    ShortMaxTime,
    /// Slow queries (1.5 s) under their own `maxTimeMS` of 1 s.
    SlowTimeouts,
    /// `secondary` reads with a tag set no member has (133 after mongos's wait).
    UnmatchedTags,
    /// Unauthenticated finds pipelined behind an awaitable hello.
    HelloPipeline,
    /// Unauthenticated finds, one at a time.
    Unauthenticated,
    /// Connections that close right after sending a read, or in the middle of one.
    EarlyClose,
    /// Two reads with the same requestID in flight, and ids reused after their reply.
    RequestIdReuse,
    /// Finds of several MB, and a header that declares 40 MB and stalls.
    HugeMessages,
    /// Aggregations nested 40 levels deep, and pipelines of 500 stages.
    DeepPipelines,
    /// Connections that ask for large batches and never read the replies.
    NonReaders,
}

impl Behaviour {
    pub const ALL: [Behaviour; 15] = [
        Behaviour::SlowReads,
        Behaviour::Views,
        Behaviour::PreferredTags,
        Behaviour::PinnedReads,
        Behaviour::Pymongo,
        Behaviour::ShortMaxTime,
        Behaviour::SlowTimeouts,
        Behaviour::UnmatchedTags,
        Behaviour::HelloPipeline,
        Behaviour::Unauthenticated,
        Behaviour::EarlyClose,
        Behaviour::RequestIdReuse,
        Behaviour::HugeMessages,
        Behaviour::DeepPipelines,
        Behaviour::NonReaders,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Behaviour::SlowReads => "slow_reads",
            Behaviour::Views => "views",
            Behaviour::PreferredTags => "preferred_tags",
            Behaviour::PinnedReads => "pinned_reads",
            Behaviour::Pymongo => "pymongo",
            Behaviour::ShortMaxTime => "short_max_time",
            Behaviour::SlowTimeouts => "slow_timeouts",
            Behaviour::UnmatchedTags => "unmatched_tags",
            Behaviour::HelloPipeline => "hello_pipeline",
            Behaviour::Unauthenticated => "unauthenticated",
            Behaviour::EarlyClose => "early_close",
            Behaviour::RequestIdReuse => "request_id_reuse",
            Behaviour::HugeMessages => "huge_messages",
            Behaviour::DeepPipelines => "deep_pipelines",
            Behaviour::NonReaders => "non_readers",
        }
    }

    pub fn parse(name: &str) -> Option<Behaviour> {
        Behaviour::ALL.into_iter().find(|b| b.name() == name)
    }

    /// Connections of this behaviour at once (from the seed).
    fn connections(self, rng: &mut Rng) -> usize {
        match self {
            // Honest readers: one per path, their pace fixed.
            Behaviour::SlowReads
            | Behaviour::PreferredTags
            | Behaviour::PinnedReads
            | Behaviour::Pymongo => 1,
            Behaviour::HugeMessages | Behaviour::NonReaders => 1,
            // Three connections can open a breaker (threshold 3, one error per connection).
            Behaviour::Views => rng.range(3, 4) as usize,
            Behaviour::ShortMaxTime | Behaviour::HelloPipeline => rng.range(2, 3) as usize,
            _ => rng.range(1, 3) as usize,
        }
    }
}

/// The policies staleguard runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The shipped config: `demo.store_inventory` fallback, `pay.*` strict (bound mode).
    Shipped,
    /// The same with the primary rung: `ladder = ["primary", "available"]` on the fallback
    /// entry, `ladder = ["primary"]` on the strict one.
    Ladder,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incident {
    /// Shard A's primary stalls and one of its secondaries restarts: reads meet a stale
    /// secondary about half the time.
    Partial,
    /// Shard A's primary stalls and both its secondaries restart: every secondary read of
    /// shard A fails.
    Full,
}

/// The knobs of a run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The long run's windows (`cargo bench --bench chaos`), not the short one's.
    pub long: bool,
    pub seed: u64,
    pub behaviours: Vec<Behaviour>,
    /// The incidents in order; `None`: both, in an order the seed picks.
    pub incidents: Option<Vec<Incident>>,
    pub auth: bool,
    /// `None`: either, from the seed.
    pub policy: Option<Policy>,
    /// Clients connect and the secondaries load their routing tables (not judged but for
    /// breakers opening).
    pub warmup: Duration,
    pub healthy: Duration,
    pub incident: Duration,
    /// From each heal to the next incident (or the end).
    pub after: Duration,
    /// Paced strict and fallback readers per path (`None`: 3 or 4, from the seed).
    pub readers: Option<usize>,
    /// Their reads per second each (`None`: 1, 2 or 5, from the seed: sparse honest
    /// traffic leaves an attacker's samples more weight).
    pub rate: Option<u32>,
}

impl Options {
    /// The short run `cargo test --test chaos` makes (about 50 s of clients), or the long
    /// one of `cargo bench --bench chaos` (30 s healthy, each incident 30 s and 15 s after
    /// its heal: about 2 min).
    pub fn sized(long: bool) -> Options {
        let short = Options {
            long: false,
            seed: 0,
            behaviours: Behaviour::ALL.to_vec(),
            incidents: None,
            auth: true,
            policy: None,
            warmup: Duration::from_secs(3),
            healthy: Duration::from_secs(10),
            incident: Duration::from_secs(10),
            after: Duration::from_secs(8),
            readers: None,
            rate: None,
        };
        if !long {
            return short;
        }
        Options {
            long: true,
            healthy: Duration::from_secs(30),
            incident: Duration::from_secs(30),
            after: Duration::from_secs(15),
            ..short
        }
    }

    /// `self` with the environment's knobs applied; a seed from the clock when none is set.
    pub fn with_env(mut self) -> Result<Options, String> {
        self.seed = match env("CHAOS_SEED") {
            Some(s) => s
                .parse()
                .map_err(|_| format!("CHAOS_SEED={s}: not a number"))?,
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_000),
        };
        if let Some(list) = env("CHAOS_BEHAVIOURS") {
            self.behaviours = behaviours(&list)?;
        }
        if let Some(list) = env("CHAOS_INCIDENTS") {
            let parsed = list
                .split(',')
                .map(|s| match s.trim() {
                    "partial" => Ok(Incident::Partial),
                    "full" => Ok(Incident::Full),
                    other => Err(format!("CHAOS_INCIDENTS: unknown incident {other:?}")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            self.incidents = Some(parsed);
        }
        if let Some(a) = env("CHAOS_AUTH") {
            self.auth = match a.as_str() {
                "on" => true,
                "off" => false,
                other => return Err(format!("CHAOS_AUTH={other}: on or off")),
            };
        }
        if let Some(p) = env("CHAOS_POLICY") {
            self.policy = Some(match p.as_str() {
                "shipped" => Policy::Shipped,
                "ladder" => Policy::Ladder,
                other => return Err(format!("CHAOS_POLICY={other}: shipped or ladder")),
            });
        }
        let secs = |name: &str, d: &mut Duration| -> Result<(), String> {
            if let Some(v) = env(name) {
                *d = Duration::from_secs_f64(
                    v.parse::<f64>()
                        .map_err(|_| format!("{name}={v}: not a number of seconds"))?,
                );
            }
            Ok(())
        };
        secs("CHAOS_HEALTHY_SECS", &mut self.healthy)?;
        secs("CHAOS_INCIDENT_SECS", &mut self.incident)?;
        secs("CHAOS_AFTER_SECS", &mut self.after)?;
        if let Some(v) = env("CHAOS_READERS") {
            self.readers = Some(v.parse().map_err(|_| format!("CHAOS_READERS={v}"))?);
        }
        if let Some(v) = env("CHAOS_RATE") {
            self.rate = Some(v.parse().map_err(|_| format!("CHAOS_RATE={v}"))?);
        }
        Ok(self)
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn behaviours(list: &str) -> Result<Vec<Behaviour>, String> {
    let list = list.trim();
    if list == "all" {
        return Ok(Behaviour::ALL.to_vec());
    }
    if list == "none" {
        return Ok(Vec::new());
    }
    let names: Vec<&str> = list.split(',').map(str::trim).collect();
    let lookup = |n: &str| {
        Behaviour::parse(n).ok_or_else(|| {
            let known: Vec<&str> = Behaviour::ALL.iter().map(|b| b.name()).collect();
            format!(
                "CHAOS_BEHAVIOURS: unknown {n:?} (known: {})",
                known.join(", ")
            )
        })
    };
    if names.iter().all(|n| n.starts_with('-')) {
        let out: Vec<Behaviour> = names
            .iter()
            .map(|n| lookup(&n[1..]))
            .collect::<Result<_, _>>()?;
        return Ok(Behaviour::ALL
            .into_iter()
            .filter(|b| !out.contains(b))
            .collect());
    }
    names.into_iter().map(lookup).collect()
}

/// One task of the mix: one connection's worth of a behaviour, with its own stream.
#[derive(Debug, Clone)]
pub struct Task {
    pub behaviour: Behaviour,
    pub rng: Rng,
}

/// Everything the seed decided.
#[derive(Debug, Clone)]
pub struct Plan {
    pub opts: Options,
    pub incidents: Vec<Incident>,
    /// The secondary of shard A the partial incident restarts.
    pub partial_node: &'static str,
    /// Paced strict and fallback readers per path, and their reads per second.
    pub readers: usize,
    pub rate: u32,
    pub policy: Policy,
    /// The simulated cluster's own seed (node choice, cursor ids).
    pub sim_seed: u64,
    pub tasks: Vec<Task>,
    /// Streams for the honest readers and the rest of the setup.
    pub rng: Rng,
}

impl Plan {
    pub fn new(opts: Options) -> Plan {
        let mut rng = Rng::new(opts.seed);
        let incidents = opts.incidents.clone().unwrap_or_else(|| {
            if rng.chance(0.5) {
                vec![Incident::Partial, Incident::Full]
            } else {
                vec![Incident::Full, Incident::Partial]
            }
        });
        let partial_node = *rng.pick(&["a1", "a2"]);
        // Three connections at least: a breaker opens on errors from three (threshold 3,
        // one per connection by default).
        let readers = rng.range(3, 4) as usize;
        let rate = *rng.pick(&[1, 2, 5]);
        let (readers, rate) = (opts.readers.unwrap_or(readers), opts.rate.unwrap_or(rate));
        let policy = if rng.chance(0.5) {
            Policy::Shipped
        } else {
            Policy::Ladder
        };
        let policy = opts.policy.unwrap_or(policy);
        let sim_seed = rng.next();
        let mut tasks = Vec::new();
        for &b in &opts.behaviours {
            for _ in 0..b.connections(&mut rng) {
                tasks.push(Task {
                    behaviour: b,
                    rng: rng.fork(),
                });
            }
        }
        Plan {
            opts,
            incidents,
            partial_node,
            readers,
            rate,
            policy,
            sim_seed,
            tasks,
            rng,
        }
    }

    pub fn has(&self, b: Behaviour) -> bool {
        self.opts.behaviours.contains(&b)
    }

    /// The secondary of shard A the partial incident leaves healthy.
    pub fn healthy_node(&self) -> &'static str {
        if self.partial_node == "a1" {
            "a2"
        } else {
            "a1"
        }
    }

    /// How long the clients run: warmup, healthy, then each incident and its aftermath.
    pub fn total(&self) -> Duration {
        let o = &self.opts;
        o.warmup + o.healthy + (o.incident + o.after) * self.incidents.len() as u32
    }

    /// One line for the log: enough to see what a seed did.
    pub fn describe(&self) -> String {
        let mut counts: Vec<String> = Vec::new();
        for b in &self.opts.behaviours {
            let n = self.tasks.iter().filter(|t| t.behaviour == *b).count();
            counts.push(format!("{}x{n}", b.name()));
        }
        format!(
            "policy {:?}, incidents {:?} (partial restarts {}), auth {}, {} + {} readers x {}/s per path, behaviours [{}]",
            self.policy,
            self.incidents,
            self.partial_node,
            if self.opts.auth { "on" } else { "off" },
            self.readers,
            self.readers,
            self.rate,
            counts.join(" ")
        )
    }
}
