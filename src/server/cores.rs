//! The session threads of `layout = "per-core"`: one single-threaded tokio runtime per core.
//! The accept loop hands each connection to the next thread in turn; its session (client
//! socket, upstream socket, timers, the relay) then lives on that thread for good, so its
//! wake-ups never cross threads and no other thread ever polls it.
//!
//! The threads end when the accept loop is done with them (this is dropped), whether the
//! proxy stopped or the runtime that ran the loop went away.
//!
//! With `layout = "uring"` each thread also has an io_uring (crate `staleguard-ring`): its
//! driver task runs on the thread's runtime, the runtime's `on_thread_park` hands the ring
//! its queued submissions, and the ring is torn down after the runtime. A thread whose ring
//! cannot be set up fails [`Cores::start`], and with it the proxy's start.

use std::io;

use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// The running session threads; dropping this ends them.
pub(super) struct Cores {
    handles: Vec<Handle>,
    /// Per thread, the children of the stop and of the kill its sessions wait on
    /// ([`Cores::signals`]).
    signals: Vec<(CancellationToken, CancellationToken)>,
    next: usize,
    /// Cancelled on drop: each thread leaves its runtime, dropping what still runs there.
    end: CancellationToken,
    /// Each thread has an io_uring (`layout = "uring"`).
    uring: bool,
}

/// A session thread, as a connection handed to it sees it.
pub(super) struct Core<'a> {
    pub(super) handle: &'a Handle,
    /// What its sessions wait on: a child of the proxy's stop and of its kill, one per
    /// thread (a node's lock is taken from its own thread only, and a session costs no
    /// node of its own).
    pub(super) stop: &'a CancellationToken,
    pub(super) kill: &'a CancellationToken,
}

impl Cores {
    /// One session thread per core the process may use (`available_parallelism`, which
    /// counts CPU affinity and cgroup quotas); each with an io_uring when `uring`.
    pub(super) fn start(uring: bool) -> io::Result<Cores> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        let end = CancellationToken::new();
        let mut cores = Cores {
            handles: Vec::with_capacity(n),
            signals: Vec::new(),
            next: 0,
            end: end.clone(),
            uring,
        };
        // Each thread says whether its ring is up before the proxy goes on.
        let (made, rings) = std::sync::mpsc::channel::<io::Result<()>>();
        for i in 0..n {
            let mut builder = tokio::runtime::Builder::new_current_thread();
            builder
                .enable_all()
                // Its blocking pool (a decompression set aside, a DNS lookup when dialing).
                .thread_name(format!("sg-blocking-{i}"));
            if uring {
                ring_hook(&mut builder);
            }
            let runtime = builder.build()?;
            cores.handles.push(runtime.handle().clone());
            let (end, made) = (end.clone(), made.clone());
            // On an error here `cores` is dropped, which ends the threads already started.
            std::thread::Builder::new()
                .name(format!("sg-session-{i}"))
                .spawn(move || {
                    runtime.block_on(async {
                        let up = if uring { start_ring() } else { Ok(()) };
                        let failed = up.is_err();
                        let _ = made.send(up);
                        if !failed {
                            end.cancelled().await;
                        }
                    });
                    // Tasks still there were killed already (or their proxy is gone); a
                    // decompression still running on this runtime's blocking pool finishes
                    // on its own thread.
                    runtime.shutdown_background();
                    if uring {
                        stop_ring();
                    }
                })?;
        }
        drop(made);
        for _ in 0..n {
            let up = rings
                .recv()
                .unwrap_or_else(|_| Err(io::Error::other("a session thread ended at its start")));
            up.map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("layout = \"uring\": cannot set up io_uring: {e}"),
                )
            })?;
        }
        Ok(cores)
    }

    /// The sessions of each thread wait on a child of `stop` and of `kill` of their
    /// thread's own.
    pub(super) fn signals(&mut self, stop: &CancellationToken, kill: &CancellationToken) {
        self.signals = (self.handles.iter())
            .map(|_| (stop.child_token(), kill.child_token()))
            .collect();
    }

    /// Each thread has an io_uring (`layout = "uring"`): plain sockets go on it.
    pub(super) fn uring(&self) -> bool {
        self.uring
    }

    /// The thread the next connection goes to (after [`Cores::signals`]).
    pub(super) fn next(&mut self) -> Core<'_> {
        let i = self.next % self.handles.len();
        self.next = self.next.wrapping_add(1);
        let (stop, kill) = &self.signals[i];
        Core {
            handle: &self.handles[i],
            stop,
            kill,
        }
    }
}

impl Drop for Cores {
    fn drop(&mut self) {
        self.end.cancel();
    }
}

/// The runtime hands its ring the queued submissions before its thread parks.
#[cfg(target_os = "linux")]
fn ring_hook(builder: &mut tokio::runtime::Builder) {
    builder.on_thread_park(staleguard_ring::park);
}

/// This thread's ring and its driver task (inside the thread's runtime).
#[cfg(target_os = "linux")]
fn start_ring() -> io::Result<()> {
    tokio::spawn(staleguard_ring::start()?);
    Ok(())
}

#[cfg(target_os = "linux")]
fn stop_ring() {
    staleguard_ring::stop();
}

// Elsewhere the config refuses `layout = "uring"`; these are never reached.
#[cfg(not(target_os = "linux"))]
fn ring_hook(_: &mut tokio::runtime::Builder) {}

#[cfg(not(target_os = "linux"))]
fn start_ring() -> io::Result<()> {
    Err(io::ErrorKind::Unsupported.into())
}

#[cfg(not(target_os = "linux"))]
fn stop_ring() {}
