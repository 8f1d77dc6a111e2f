//! The end phase of the soak, once the abuse has stopped: what one idle connection pair keeps
//! after a 40 MB `ping`, what a client that does not read a 16 MB reply costs while the proxy
//! holds it (streamed: a primary read; judged: a secondary read on a fallback namespace,
//! issue 21's remaining gap), and whether `write_timeout` closed them. RSS is read in
//! `/proc`, as the median of five samples 100 ms apart.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::abuse21::{big_find, drained, first_bytes, ping_then_idle, small_window};

#[derive(Debug, Default, Clone)]
pub struct EndFigures {
    pub rss_base: u64,
    pub idle_pairs: usize,
    pub rss_idle: u64,
    pub non_readers: usize,
    pub rss_non_readers: u64,
    pub non_readers_closed: usize,
    pub tracked: usize,
    pub rss_tracked: u64,
    pub tracked_closed: usize,
    /// Slow readers (1 MiB/s) of a streamed and of a judged 16 MB reply: RSS while
    /// they read, how many were still open after [`SLOW_FOR`] (> `write_timeout`), bytes
    /// they read by then.
    pub slow_readers: usize,
    pub rss_before_slow: u64,
    pub rss_slow_streamed: u64,
    pub slow_streamed_open: usize,
    pub rss_slow_judged: u64,
    pub slow_judged_open: usize,
    pub slow_read_bytes: usize,
    /// How long the 40 MB pings of the idle pairs took, and the whole phase.
    pub pings_took: Duration,
    pub took: Duration,
    /// Set when the phase could not run as planned.
    pub error: Option<String>,
}

impl EndFigures {
    /// RSS kept per idle pair after a 40 MB ping, bytes.
    pub fn per_pair(&self) -> f64 {
        per(self.rss_idle, self.rss_base, self.idle_pairs)
    }

    /// RSS per client not reading a streamed 16 MB reply, bytes.
    pub fn per_non_reader(&self) -> f64 {
        per(self.rss_non_readers, self.rss_idle, self.non_readers)
    }

    /// RSS per client not reading a judged 16 MB reply, bytes.
    pub fn per_tracked(&self) -> f64 {
        per(self.rss_tracked, self.rss_idle, self.tracked)
    }

    /// RSS per slow reader of a streamed, and of a judged, 16 MB reply, bytes.
    pub fn per_slow_streamed(&self) -> f64 {
        per(
            self.rss_slow_streamed,
            self.rss_before_slow,
            self.slow_readers,
        )
    }

    pub fn per_slow_judged(&self) -> f64 {
        per(
            self.rss_slow_judged,
            self.rss_before_slow,
            self.slow_readers,
        )
    }
}

fn per(after: u64, before: u64, n: usize) -> f64 {
    after.saturating_sub(before) as f64 / n.max(1) as f64
}

/// How long a slow reader reads before it is judged: over twice `write_timeout`.
pub const SLOW_FOR: Duration = Duration::from_secs(8);
/// What a slow reader takes every 250 ms: 1 MiB/s.
const SLOW_CHUNK: usize = 256 * 1024;

pub struct Plan {
    pub proxy: SocketAddr,
    pub pid: u32,
    pub idle_pairs: usize,
    pub non_readers: usize,
    pub tracked: usize,
    pub slow_readers: usize,
    pub write_timeout: Duration,
    pub ping: Arc<Vec<u8>>,
    /// The idle pairs are held until then (the soak's last memory sample).
    pub hold_until: Instant,
}

async fn rss_median(pid: u32) -> u64 {
    let mut v = Vec::with_capacity(5);
    for _ in 0..5 {
        v.push(super::mem_now(pid).0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    v.sort_unstable();
    v[2]
}

/// `n` clients that ask for the 16 MB batch and never read; the RSS 1.5 s after their
/// replies started, and how many the proxy had closed `write_timeout` + 3 s after that.
async fn non_readers(
    plan: &Plan,
    n: usize,
    tracked: bool,
    id: i32,
) -> Result<(u64, usize), String> {
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = small_window(plan.proxy)
            .await
            .ok_or("a non-reader could not connect")?;
        s.write_all(&big_find(id + i as i32, tracked))
            .await
            .map_err(|e| e.to_string())?;
        conns.push(s);
    }
    for s in &conns {
        if !first_bytes(s).await {
            return Err("a 16 MB reply did not start within 20 s".into());
        }
    }
    let answered = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let rss = rss_median(plan.pid).await;
    tokio::time::sleep_until((answered + plan.write_timeout + Duration::from_secs(3)).into()).await;
    let mut closed = 0;
    for s in conns.iter_mut() {
        if drained(s).await.0 {
            closed += 1;
        }
    }
    Ok((rss, closed))
}

/// `n` clients that ask for the 16 MB batch and read it at 1 MiB/s (256 KiB every 250 ms):
/// the RSS after 3 s, how many were still open after [`SLOW_FOR`] (they have read what the
/// sockets held by then, so a close shows as the end), and what they read.
async fn slow_readers(
    plan: &Plan,
    n: usize,
    tracked: bool,
    id: i32,
) -> Result<(u64, usize, usize), String> {
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let mut s = small_window(plan.proxy)
            .await
            .ok_or("a slow reader could not connect")?;
        s.write_all(&big_find(id + i as i32, tracked))
            .await
            .map_err(|e| e.to_string())?;
        conns.push((s, true, 0usize));
    }
    let started = Instant::now();
    let mut rss = 0;
    let mut buf = vec![0u8; 64 * 1024];
    while started.elapsed() < SLOW_FOR {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for (s, open, got) in conns.iter_mut().filter(|c| c.1) {
            let mut this = 0;
            while this < SLOW_CHUNK {
                match tokio::time::timeout(Duration::from_millis(20), s.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => {
                        *open = false;
                        break;
                    }
                    Ok(Ok(k)) => this += k,
                    Err(_) => break,
                }
            }
            *got += this;
        }
        if rss == 0 && started.elapsed() >= Duration::from_secs(3) {
            rss = rss_median(plan.pid).await;
        }
    }
    let open = conns.iter().filter(|c| c.1).count();
    let read = conns.iter().map(|c| c.2).sum();
    Ok((rss, open, read))
}

async fn phase(plan: &Plan, f: &mut EndFigures, pairs: &mut Vec<TcpStream>) -> Result<(), String> {
    f.rss_base = rss_median(plan.pid).await;
    let pings = Instant::now();
    for _ in 0..plan.idle_pairs {
        let mut s = TcpStream::connect(plan.proxy)
            .await
            .map_err(|e| e.to_string())?;
        let _ = s.set_nodelay(true);
        let pinged =
            tokio::time::timeout(Duration::from_secs(30), ping_then_idle(&mut s, &plan.ping));
        if !matches!(pinged.await, Ok(true)) {
            return Err("a 40 MB ping was not answered".into());
        }
        pairs.push(s);
    }
    f.idle_pairs = pairs.len();
    f.pings_took = pings.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    f.rss_idle = rss_median(plan.pid).await;
    (f.rss_non_readers, f.non_readers_closed) =
        non_readers(plan, plan.non_readers, false, 1000).await?;
    f.non_readers = plan.non_readers;
    (f.rss_tracked, f.tracked_closed) = non_readers(plan, plan.tracked, true, 2000).await?;
    f.tracked = plan.tracked;
    if plan.slow_readers > 0 {
        f.slow_readers = plan.slow_readers;
        tokio::time::sleep(Duration::from_secs(2)).await;
        f.rss_before_slow = rss_median(plan.pid).await;
        let (rss, open, read) = slow_readers(plan, plan.slow_readers, false, 3000).await?;
        (f.rss_slow_streamed, f.slow_streamed_open) = (rss, open);
        let (rss, open, read2) = slow_readers(plan, plan.slow_readers, true, 4000).await?;
        (f.rss_slow_judged, f.slow_judged_open, f.slow_read_bytes) = (rss, open, read + read2);
    }
    Ok(())
}

/// Runs the end phase; the idle pairs stay open until `hold_until`.
pub async fn end_phase(plan: Plan) -> EndFigures {
    let mut f = EndFigures::default();
    let mut pairs = Vec::new();
    let started = Instant::now();
    if let Err(e) = phase(&plan, &mut f, &mut pairs).await {
        f.error = Some(e);
    }
    f.took = started.elapsed();
    tokio::time::sleep_until(plan.hold_until.into()).await;
    drop(pairs);
    f
}
