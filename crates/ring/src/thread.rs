//! A session thread's ring: set up ([`start`]), its submissions handed over before the
//! thread parks ([`park`]), its completions reaped by the driver task, torn down ([`stop`]).

use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use io_uring::types::{SubmitArgs, Timespec};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::driver::{Driver, COUNTS, RING};

/// How long [`stop`] waits for the operations still in flight.
const STOP_WAIT: Duration = Duration::from_secs(2);

static IDS: AtomicU64 = AtomicU64::new(1);

/// Sockets open on the process's rings and operations in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Live {
    pub sockets: usize,
    pub ops: usize,
}

/// What is open on every ring of the process right now.
pub fn live() -> Live {
    let counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    Live {
        sockets: counts
            .iter()
            .map(|c| c.sockets.load(Ordering::Relaxed))
            .sum(),
        ops: counts.iter().map(|c| c.ops.load(Ordering::Relaxed)).sum(),
    }
}

/// This thread's ring, if it has one (its id).
pub fn here() -> Option<u64> {
    RING.try_with(|r| r.try_borrow().ok()?.as_ref().map(|d| d.id))
        .ok()
        .flatten()
}

/// Sets up this thread's ring (inside its runtime: the ring's fd joins the reactor) and
/// returns its driver task, to spawn on the same runtime. Errors when the kernel has no
/// io_uring (or it is disabled), when the thread has a ring already, or when the reactor
/// refuses the fd.
pub fn start() -> io::Result<impl Future<Output = ()>> {
    if here().is_some() {
        return Err(io::Error::other("this thread has an io_uring already"));
    }
    let driver = Driver::new(IDS.fetch_add(1, Ordering::Relaxed))?;
    // The reactor watches a duplicate of the ring's fd, owned by the driver task: it stays
    // open for as long as the `AsyncFd` whatever becomes of the ring.
    // SAFETY: `dup` of the ring's open fd; a fresh fd, owned by nobody else.
    let dup = unsafe { libc::dup(driver.uring.as_raw_fd()) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `dup` is a valid fd that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(dup) };
    // SAFETY: the fd is the `OwnedFd`'s, which the `AsyncFd` owns: open, and the same file,
    // for the `AsyncFd`'s whole life.
    let fd = unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) }
        .map_err(|e| e.into_parts().1)?;
    RING.with(|r| *r.borrow_mut() = Some(driver));
    Ok(async move {
        loop {
            let Ok(mut ready) = fd.readable().await else {
                return;
            };
            turn(false);
            ready.clear_ready();
        }
    })
}

/// Before the thread parks (the runtime's `on_thread_park`): hands the queued submissions to
/// the kernel, then reaps and wakes (a task woken here runs instead of the thread parking).
pub fn park() {
    turn(true);
}

/// Submits (when `submit`, or when reaping re-armed something), reaps, wakes.
fn turn(submit: bool) {
    let woken = RING.try_with(|r| {
        let mut r = r.try_borrow_mut().ok()?;
        let d = r.as_mut()?;
        if submit {
            d.submit();
        }
        d.reap();
        d.rearm_starved();
        // What the completions queued (the rest of a partial send, a receive re-armed).
        d.submit();
        Some(d.take_woken())
    });
    let Ok(Some(mut woken)) = woken else {
        return;
    };
    for w in woken.drain(..) {
        w.wake();
    }
    let _ = RING.try_with(|r| {
        if let Some(d) = r
            .try_borrow_mut()
            .ok()
            .as_deref_mut()
            .and_then(Option::as_mut)
        {
            d.put_woken(woken);
        }
    });
}

/// Tears down this thread's ring, once its runtime (and every stream on it) is gone: cancels
/// what is still in flight, waits up to `STOP_WAIT` for it, closes the sockets and the ring.
/// Should an operation not complete by then, the ring and its buffers are leaked rather than
/// freed under the kernel.
pub fn stop() {
    let Ok(Some(mut d)) = RING.try_with(|r| r.try_borrow_mut().ok().and_then(|mut r| r.take()))
    else {
        return;
    };
    let keys: Vec<usize> = d.socks.iter().map(|(k, _)| k).collect();
    for key in keys {
        let s = &mut d.socks[key];
        s.dropped = true;
        if s.ops > 0 {
            d.cancel(key);
        } else {
            d.close(key);
        }
    }
    let deadline = Instant::now() + STOP_WAIT;
    let wait = Timespec::new().nsec(50_000_000);
    while d.inflight > 0 && Instant::now() < deadline {
        let _ = d
            .uring
            .submitter()
            .submit_with_args(1, &SubmitArgs::new().timespec(&wait));
        d.reap();
    }
    d.counts.up.store(false, Ordering::Relaxed);
    if d.inflight > 0 {
        std::mem::forget(d);
    }
}

/// What the process's rings say now; `None` when no ring was ever set up.
pub fn stats() -> Option<crate::Stats> {
    let counts = COUNTS.lock().unwrap_or_else(|e| e.into_inner());
    if counts.is_empty() {
        return None;
    }
    let mut st = crate::Stats::default();
    for c in counts.iter() {
        if c.up.load(Ordering::Relaxed) {
            if c.one_shot.load(Ordering::Relaxed) {
                st.one_shot += 1;
            } else {
                st.multishot += 1;
            }
        }
        st.sockets += c.sockets.load(Ordering::Relaxed);
        st.starved += c.starved.load(Ordering::Relaxed);
    }
    Some(st)
}
