//! The session threads of `layout = "per-core"`: one single-threaded tokio runtime per core.
//! The accept loop hands each connection to the next thread in turn; its session (client
//! socket, upstream socket, timers, the relay) then lives on that thread for good, so its
//! wake-ups never cross threads and no other thread ever polls it.
//!
//! The threads end when the accept loop is done with them (this is dropped), whether the
//! proxy stopped or the runtime that ran the loop went away.

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
    /// counts CPU affinity and cgroup quotas).
    pub(super) fn start() -> io::Result<Cores> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        let end = CancellationToken::new();
        let mut cores = Cores {
            handles: Vec::with_capacity(n),
            signals: Vec::new(),
            next: 0,
            end: end.clone(),
        };
        for i in 0..n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                // Its blocking pool (a decompression set aside, a DNS lookup when dialing).
                .thread_name(format!("sg-blocking-{i}"))
                .build()?;
            cores.handles.push(runtime.handle().clone());
            let end = end.clone();
            // On an error here `cores` is dropped, which ends the threads already started.
            std::thread::Builder::new()
                .name(format!("sg-session-{i}"))
                .spawn(move || {
                    runtime.block_on(end.cancelled());
                    // Tasks still there were killed already (or their proxy is gone); a
                    // decompression still running on this runtime's blocking pool finishes
                    // on its own thread.
                    runtime.shutdown_background();
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
