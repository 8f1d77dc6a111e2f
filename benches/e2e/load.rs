//! The load generator: N connections, each a closed loop of one `find` round trip at a time,
//! a warm-up, then a measured window in which every round trip's latency is kept and the
//! proxy's CPU time is sampled at both ends.

use std::net::SocketAddr;
use std::time::Duration;

use bson::{rawdoc, RawDocument, RawDocumentBuf};
use bytes::{Buf, BytesMut};
use staleguard::wire::opmsg::OpMsg;
use staleguard::wire::HEADER_LEN;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::callgrind;
use crate::counts::{self, Counts};
use crate::msgs;
use crate::procs;

pub struct Spec {
    pub addr: SocketAddr,
    pub conns: usize,
    pub warmup: Duration,
    pub measure: Duration,
    /// The request to repeat; its requestID (bytes 4..8) is rewritten for every send.
    pub request: Vec<u8>,
    /// Replies of another length are counted as unexpected (an error reply, say).
    pub reply_len: usize,
    /// The process whose CPU time is sampled (the proxy), if any.
    pub cpu_pid: Option<u32>,
    /// The fake mongos's process, whose CPU time is sampled too (the third process on the
    /// machine; with the proxy's and the load generator's, it accounts for the throughput).
    pub upstream_pid: Option<u32>,
    /// Also count that process's system calls and context switches (`E2E_COUNT`).
    pub count: bool,
    /// Offered load in round trips per second over all connections (`E2E_RATE`): each
    /// connection sends on a schedule of `conns / rate` seconds instead of as soon as its
    /// last reply arrived (a late reply delays only that connection's next send).
    pub rate: Option<f64>,
    /// The proxy runs under callgrind: count its instructions in the window
    /// (`E2E_CALLGRIND`).
    pub callgrind: bool,
    /// How many of the connections send (`E2E_ACTIVE`); the others stay open and idle
    /// after their handshake.
    pub active: Option<usize>,
}

pub struct Outcome {
    /// Round trips that started after the warm-up and ended inside the window.
    pub round_trips: u64,
    pub secs: f64,
    /// Latencies of those round trips in nanoseconds, sorted.
    pub lat_ns: Vec<u32>,
    /// Proxy CPU seconds (user, system) spent during the window.
    pub cpu_secs: Option<(f64, f64)>,
    /// The load generator's own CPU time in the window (this process, user + system).
    pub load_cpu_secs: Option<f64>,
    /// The fake mongos's CPU time in the window (user + system).
    pub upstream_cpu_secs: Option<f64>,
    pub unexpected: u64,
    /// System calls and context switches of the proxy in the window, when asked for.
    pub counts: Option<Result<Counts, String>>,
    /// Instructions the proxy executed in the window (callgrind), when asked for.
    pub instructions: Option<Result<u64, String>>,
}

impl Outcome {
    pub fn per_sec(&self) -> f64 {
        self.round_trips as f64 / self.secs
    }

    /// The latency at quantile `q` in microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        if self.lat_ns.is_empty() {
            return f64::NAN;
        }
        let i = ((self.lat_ns.len() as f64 * q).ceil() as usize).clamp(1, self.lat_ns.len()) - 1;
        self.lat_ns[i] as f64 / 1000.0
    }

    /// Proxy CPU time per round trip in µs (user + system).
    pub fn cpu_us_per_rt(&self) -> Option<f64> {
        self.cpu_secs
            .map(|(u, s)| (u + s) * 1e6 / self.round_trips.max(1) as f64)
    }

    /// The share of the proxy's CPU time spent in the kernel.
    /// The load generator's CPU per round trip, µs.
    pub fn load_cpu_us_per_rt(&self) -> Option<f64> {
        self.load_cpu_secs
            .map(|c| c * 1e6 / self.round_trips.max(1) as f64)
    }

    /// The fake mongos's CPU per round trip, µs.
    pub fn upstream_cpu_us_per_rt(&self) -> Option<f64> {
        self.upstream_cpu_secs
            .map(|c| c * 1e6 / self.round_trips.max(1) as f64)
    }

    /// Proxy instructions per round trip (callgrind), when counted.
    pub fn instructions_per_rt(&self) -> Option<f64> {
        match &self.instructions {
            Some(Ok(n)) => Some(*n as f64 / self.round_trips.max(1) as f64),
            _ => None,
        }
    }

    pub fn sys_share(&self) -> Option<f64> {
        self.cpu_secs
            .filter(|(u, s)| u + s > 0.0)
            .map(|(u, s)| s / (u + s))
    }
}

/// One client connection speaking raw OP_MSG.
pub struct Client {
    sock: TcpStream,
    buf: BytesMut,
    next_id: i32,
}

impl Client {
    /// Connects and does the driver's opening `isMaster`, so the proxy has paired the
    /// connection with its upstream before any timing starts.
    pub async fn connect(addr: SocketAddr) -> std::io::Result<Client> {
        let sock = TcpStream::connect(addr).await?;
        sock.set_nodelay(true)?;
        let mut c = Client {
            sock,
            buf: BytesMut::with_capacity(4096),
            next_id: 1,
        };
        let hello = msgs::op_msg(0, &msgs::hello_request(), false);
        c.round_trip(&mut hello.clone()).await?;
        Ok(c)
    }

    /// Sends `req` under a fresh requestID and reads its reply; returns the reply's length.
    pub async fn round_trip(&mut self, req: &mut [u8]) -> std::io::Result<usize> {
        let id = self.send(req).await?;
        let len = self.reply_len(id).await?;
        self.buf.advance(len);
        Ok(len)
    }

    /// Runs one command and returns the reply's body.
    pub async fn command(&mut self, body: &RawDocument) -> std::io::Result<RawDocumentBuf> {
        let id = self.send(&mut msgs::op_msg(0, body, false)).await?;
        let len = self.reply_len(id).await?;
        let frame = self.buf.split_to(len);
        let m = OpMsg::parse(&frame[HEADER_LEN..]).map_err(|e| bad(&e.to_string()))?;
        Ok(m.body.to_owned())
    }

    async fn send(&mut self, req: &mut [u8]) -> std::io::Result<i32> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1) & i32::MAX;
        req[4..8].copy_from_slice(&id.to_le_bytes());
        self.sock.write_all(req).await?;
        Ok(id)
    }

    /// Waits until the reply to `id` is whole at the front of the buffer; its length.
    async fn reply_len(&mut self, id: i32) -> std::io::Result<usize> {
        loop {
            if self.buf.len() >= 16 {
                let len = i32::from_le_bytes(self.buf[0..4].try_into().expect("4 bytes"));
                if len < 16 {
                    return Err(bad("reply length below 16"));
                }
                let len = len as usize;
                if self.buf.len() >= len {
                    let response_to = i32::from_le_bytes(self.buf[8..12].try_into().expect("4"));
                    if response_to != id {
                        return Err(bad("reply answers another request"));
                    }
                    return Ok(len);
                }
                self.buf.reserve(len - self.buf.len());
            }
            if self.sock.read_buf(&mut self.buf).await? == 0 {
                return Err(bad("connection closed before the reply"));
            }
        }
    }
}

/// The fake mongos's counters (`{benchStats: 1}`).
#[derive(Debug, Clone, Copy, Default)]
pub struct UpstreamStats {
    pub connections: i64,
    pub stale_ns_finds: i64,
    pub stale_ns_available: i64,
    pub stale_sent: i64,
}

pub async fn upstream_stats(addr: SocketAddr) -> Result<UpstreamStats, String> {
    let mut c = Client::connect(addr).await.map_err(|e| e.to_string())?;
    let doc = c
        .command(&rawdoc! { "benchStats": 1_i32, "$db": "admin" })
        .await
        .map_err(|e| e.to_string())?;
    let get = |k: &str| doc.get_i64(k).map_err(|e| format!("benchStats {k}: {e}"));
    Ok(UpstreamStats {
        // Without this control connection.
        connections: doc.get_i64("connections").unwrap_or(1) - 1,
        stale_ns_finds: get("staleNsFinds")?,
        stale_ns_available: get("staleNsAvailable")?,
        stale_sent: get("staleSent")?,
    })
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// Opens `n` clients, at most 128 handshakes at a time.
pub async fn connect_many(addr: SocketAddr, n: usize) -> Result<Vec<Client>, String> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let batch = (n - out.len()).min(128);
        let joins: Vec<_> = (0..batch)
            .map(|_| tokio::spawn(Client::connect(addr)))
            .collect();
        for j in joins {
            let c = j
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("connect to {addr} (after {} ok): {e}", out.len()))?;
            out.push(c);
        }
    }
    Ok(out)
}

struct ConnResult {
    lat_ns: Vec<u32>,
    unexpected: u64,
}

pub async fn run(spec: &Spec) -> Result<Outcome, String> {
    let mut clients = connect_many(spec.addr, spec.conns).await?;
    let active = spec.active.unwrap_or(spec.conns).min(spec.conns);
    // Held open, idle, until the window ends.
    let idle = clients.split_off(active);
    let t0 = Instant::now();
    let warm_end = t0 + spec.warmup;
    let end = warm_end + spec.measure;
    let (count, measure, spec_pid) = (spec.count, spec.measure, spec.cpu_pid);
    let up_pid = spec.upstream_pid;
    let grind = spec.callgrind.then_some(spec.cpu_pid).flatten();
    // Each connection's interval between sends at the offered rate, and its first send
    // spread over one interval so the connections do not send in step.
    let interval = spec
        .rate
        .map(|r| Duration::from_secs_f64(active.max(1) as f64 / r.max(1.0)));
    let n = active.max(1) as u32;
    // The proxy's CPU (all its threads) and this process's own (the load generator; the
    // orchestrator is idle meanwhile), both from /proc/PID/stat at both ends of the window.
    let me = std::process::id();
    let sampler = tokio::spawn(async move {
        tokio::time::sleep_until(warm_end).await;
        let zeroed = match grind {
            Some(pid) => Some(blocking(move || callgrind::zero(pid)).await),
            None => None,
        };
        let window = match (count, spec_pid) {
            (true, Some(pid)) => Some(counts::start(pid, measure)),
            _ => None,
        };
        let a = spec_pid.and_then(procs::cpu_seconds);
        let la = procs::cpu_seconds(me);
        let ua = up_pid.and_then(procs::cpu_seconds);
        tokio::time::sleep_until(end).await;
        let ub = up_pid.and_then(procs::cpu_seconds);
        let b = spec_pid.and_then(procs::cpu_seconds);
        let lb = procs::cpu_seconds(me);
        let instructions = match (grind, zeroed) {
            (Some(pid), Some(Ok(()))) => Some(blocking(move || callgrind::instructions(pid)).await),
            (_, Some(Err(e))) => Some(Err(e)),
            _ => None,
        };
        let counted = match window {
            Some(Ok(w)) => Some(
                tokio::task::spawn_blocking(move || w.finish())
                    .await
                    .unwrap_or_else(|e| Err(e.to_string())),
            ),
            Some(Err(e)) => Some(Err(e)),
            None => None,
        };
        let load = la.zip(lb).map(|(a, b)| (b.0 + b.1) - (a.0 + a.1));
        let up = ua.zip(ub).map(|(a, b)| (b.0 + b.1) - (a.0 + a.1));
        let cpu = a.zip(b).map(|(a, b)| (b.0 - a.0, b.1 - a.1));
        (cpu, load, up, counted, instructions)
    });
    let joins: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let req = spec.request.clone();
            let reply_len = spec.reply_len;
            let pace = interval.map(|every| Pace {
                every,
                next: t0 + every * i as u32 / n,
            });
            tokio::spawn(drive(c, req, reply_len, warm_end, end, pace))
        })
        .collect();
    let mut lat_ns = Vec::new();
    let mut unexpected = 0;
    for j in joins {
        let r = j.await.map_err(|e| e.to_string())??;
        lat_ns.extend_from_slice(&r.lat_ns);
        unexpected += r.unexpected;
    }
    let (cpu_secs, load_cpu_secs, upstream_cpu_secs, counts, instructions) =
        sampler.await.map_err(|e| e.to_string())?;
    drop(idle);
    lat_ns.sort_unstable();
    Ok(Outcome {
        round_trips: lat_ns.len() as u64,
        secs: spec.measure.as_secs_f64(),
        lat_ns,
        cpu_secs,
        load_cpu_secs,
        upstream_cpu_secs,
        unexpected,
        counts,
        instructions,
    })
}

/// Runs `f` on the blocking pool (a helper program the load's workers must not wait on).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}

/// A connection's send schedule at a fixed offered rate.
struct Pace {
    every: Duration,
    next: Instant,
}

async fn drive(
    mut c: Client,
    mut req: Vec<u8>,
    reply_len: usize,
    warm_end: Instant,
    end: Instant,
    mut pace: Option<Pace>,
) -> Result<ConnResult, String> {
    let mut r = ConnResult {
        lat_ns: Vec::with_capacity(4096),
        unexpected: 0,
    };
    loop {
        if let Some(p) = &mut pace {
            if p.next >= end {
                break;
            }
            tokio::time::sleep_until(p.next).await;
            p.next += p.every;
        }
        let start = Instant::now();
        if start >= end {
            break;
        }
        let len = c.round_trip(&mut req).await.map_err(|e| e.to_string())?;
        let done = Instant::now();
        if start >= warm_end && done <= end {
            let ns = (done - start).as_nanos().min(u32::MAX as u128) as u32;
            r.lat_ns.push(ns);
            if len != reply_len {
                r.unexpected += 1;
            }
        }
    }
    Ok(r)
}
