//! Honest clients through the official Rust driver: each reader is its own client (its own
//! pool, so its own connections, authenticated with SCRAM when auth is on), paced, and runs
//! twice: straight to mongos and through staleguard, on the same schedule. Every read
//! carries a `comment` naming it, so the simulated cluster's read log shows what reached
//! mongos for it (read concern, members, attempts).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::{doc, Bson, Document};
use mongodb::error::ErrorKind;
use mongodb::options::{ClientOptions, FindOneOptions, ReadPreference, SelectionCriteria};
use mongodb::Client;
use tokio::time::Instant;

use super::bed::{INVENTORY, PAYMENTS, VIEW};
use super::rng::Rng;

/// What an honest reader reads, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `find_one {}` on `pay.transactions` (every shard), `secondaryPreferred`, 1 s.
    Strict,
    /// `find_one {_id}` of a document on shard B, `secondaryPreferred`, 1 s.
    StrictB,
    /// `find_one {}` on `demo.store_inventory`, `secondaryPreferred`, 1 s.
    Fallback,
    /// A 1.2 s query (`$where` sleep) on `pay.transactions`, no `maxTimeMS`.
    SlowStrict,
    /// A 1.2 s query on `demo.store_inventory`, `maxTimeMS` 3 s.
    SlowFallback,
    /// `find_one {}` on the 2 s view, `maxTimeMS` 5 s.
    View,
    /// `find_one {}` on `pay.transactions`, `secondaryPreferred` with a tag set no member
    /// has (the primaries answer), 1 s.
    PreferredTags,
    /// `secondary` on `pay.transactions` with tag sets `[{node: <shard A's secondary the
    /// partial incident spares>}, {}]`, 1 s.
    Pinned,
    /// As `Strict`, through pymongo.
    PyStrict,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Strict => "strict",
            Kind::StrictB => "strict_b",
            Kind::Fallback => "fallback",
            Kind::SlowStrict => "slow_strict",
            Kind::SlowFallback => "slow_fallback",
            Kind::View => "view",
            Kind::PreferredTags => "preferred_tags",
            Kind::Pinned => "pinned",
            Kind::PyStrict => "py_strict",
        }
    }

    pub fn ns(self) -> &'static str {
        match self {
            Kind::Fallback | Kind::SlowFallback => INVENTORY,
            Kind::View => VIEW,
            _ => PAYMENTS,
        }
    }

    /// The paced strict reads the incident's share is judged on.
    pub fn strict_paced(self) -> bool {
        matches!(
            self,
            Kind::Strict | Kind::StrictB | Kind::Pinned | Kind::PyStrict
        )
    }

    /// The `$readPreference.mode` its reads carry.
    pub fn mode(self) -> &'static str {
        match self {
            Kind::Pinned => "secondary",
            _ => "secondaryPreferred",
        }
    }

    pub fn max_time(self) -> Option<Duration> {
        match self {
            Kind::SlowStrict => None,
            Kind::SlowFallback => Some(Duration::from_secs(3)),
            Kind::View => Some(Duration::from_secs(5)),
            _ => Some(Duration::from_secs(1)),
        }
    }

    /// When the reader gives up on a read (its driver's socket timeout).
    fn give_up(self) -> Duration {
        self.max_time()
            .map_or(Duration::from_secs(8), |t| t * 3 + Duration::from_secs(2))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Via {
    Direct,
    Staleguard,
}

/// How a read ended, as the application saw it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    Ok,
    /// A server error reply, by code.
    Code(i32),
    /// staleguard's own error reply (`errmsg` starting with `staleguard:`), by code.
    Staleguard(i32),
    /// A network or driver error.
    Network,
    /// The reader gave up waiting.
    GaveUp,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Ok => write!(f, "ok"),
            Outcome::Code(c) => write!(f, "error {c}"),
            Outcome::Staleguard(c) => write!(f, "staleguard {c}"),
            Outcome::Network => write!(f, "network"),
            Outcome::GaveUp => write!(f, "gave up"),
        }
    }
}

/// One read as its reader saw it.
#[derive(Debug, Clone)]
pub struct Read {
    pub kind: Kind,
    pub via: Via,
    pub comment: String,
    /// Sent, since the run started.
    pub sent: Duration,
    pub took: Duration,
    pub outcome: Outcome,
}

impl Read {
    pub fn done(&self) -> Duration {
        self.sent + self.took
    }
}

/// One reader's schedule.
#[derive(Debug, Clone)]
pub struct Reader {
    pub kind: Kind,
    pub via: Via,
    pub index: usize,
    pub every: Duration,
    /// Its first read, since the run started (the same on both paths).
    pub offset: Duration,
    /// For `StrictB`: the `_id` it reads.
    pub id: i32,
    /// For `Pinned`: the node of shard A it is pinned to.
    pub pin: &'static str,
}

pub async fn client(uri: &str) -> Client {
    let o = ClientOptions::parse(uri).await.expect("client options");
    Client::with_options(o).expect("client")
}

fn outcome(e: &mongodb::error::Error) -> Outcome {
    match e.kind.as_ref() {
        ErrorKind::Command(c) if c.message.starts_with("staleguard:") => {
            Outcome::Staleguard(c.code)
        }
        ErrorKind::Command(c) => Outcome::Code(c.code),
        _ => Outcome::Network,
    }
}

fn secondary_preferred() -> SelectionCriteria {
    SelectionCriteria::ReadPreference(ReadPreference::SecondaryPreferred {
        options: Default::default(),
    })
}

/// One read of `r`'s kind, tagged `comment`.
async fn read_once(c: &Client, r: &Reader, comment: &str) -> Result<(), mongodb::error::Error> {
    let (db, coll) = r.kind.ns().split_once('.').expect("db.coll");
    let database = c.database(db);
    if matches!(r.kind, Kind::PreferredTags | Kind::Pinned) {
        // The Rust driver sends tag sets as `tagSets`, which mongos ignores: spelled out.
        let pref = match r.kind {
            Kind::Pinned => doc! { "mode": "secondary", "tags": [{ "node": r.pin }, {}] },
            _ => doc! { "mode": "secondaryPreferred", "tags": [{ "node": "nowhere" }] },
        };
        let mut cmd = doc! {
            "find": coll, "filter": {}, "limit": 1, "singleBatch": true,
            "comment": comment, "$readPreference": pref,
        };
        if let Some(t) = r.kind.max_time() {
            cmd.insert("maxTimeMS", t.as_millis() as i64);
        }
        return database.run_command(cmd).await.map(|_| ());
    }
    let filter = match r.kind {
        Kind::StrictB => doc! { "_id": r.id },
        Kind::SlowStrict | Kind::SlowFallback => doc! { "$where": "sleep(1200) || true" },
        _ => doc! {},
    };
    let mut opts = FindOneOptions::builder()
        .comment(Bson::String(comment.to_string()))
        .selection_criteria(secondary_preferred())
        .build();
    opts.max_time = r.kind.max_time();
    database
        .collection::<Document>(coll)
        .find_one(filter)
        .with_options(opts)
        .await
        .map(|_| ())
}

/// Reads on `r`'s schedule from `start` until `stop`, recording every read.
pub async fn run(c: Client, r: Reader, t0: Instant, stop: Instant, out: Arc<Mutex<Vec<Read>>>) {
    let mut next = t0 + r.offset;
    let mut seq = 0u32;
    while next < stop {
        tokio::time::sleep_until(next).await;
        next += r.every;
        // A reader that fell behind does not make up for it in a burst.
        let now = Instant::now();
        if next < now {
            next = now;
        }
        seq += 1;
        let via = match r.via {
            Via::Direct => "d",
            Via::Staleguard => "s",
        };
        let comment = format!("h/{}/{via}/{}/{seq}", r.kind.name(), r.index);
        let sent = Instant::now();
        let result = tokio::time::timeout(r.kind.give_up(), read_once(&c, &r, &comment)).await;
        let took = sent.elapsed();
        let outcome = match result {
            Ok(Ok(())) => Outcome::Ok,
            Ok(Err(e)) => outcome(&e),
            Err(_) => Outcome::GaveUp,
        };
        out.lock().expect("reads").push(Read {
            kind: r.kind,
            via: r.via,
            comment,
            sent: sent.duration_since(t0),
            took,
            outcome,
        });
    }
}

/// The readers of a run: for each kind, `n` schedules, each run on both paths.
pub fn schedules(
    kinds: &[(Kind, usize, Duration)],
    rng: &mut Rng,
    id_b: i32,
    pin: &'static str,
) -> Vec<Reader> {
    let mut out = Vec::new();
    for &(kind, n, every) in kinds {
        for index in 0..n {
            let offset = Duration::from_millis(500) + rng.jitter(every, 1.0);
            for via in [Via::Direct, Via::Staleguard] {
                out.push(Reader {
                    kind,
                    via,
                    index,
                    every,
                    offset,
                    id: id_b,
                    pin,
                });
            }
        }
    }
    out
}
