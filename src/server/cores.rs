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
    next: usize,
    /// Cancelled on drop: each thread leaves its runtime, dropping what still runs there.
    end: CancellationToken,
}

impl Cores {
    /// One session thread per core the process may use (`available_parallelism`, which
    /// counts CPU affinity and cgroup quotas).
    pub(super) fn start() -> io::Result<Cores> {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        let end = CancellationToken::new();
        let mut cores = Cores {
            handles: Vec::with_capacity(n),
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

    /// The thread the next connection goes to.
    pub(super) fn next(&mut self) -> &Handle {
        let i = self.next % self.handles.len();
        self.next = self.next.wrapping_add(1);
        &self.handles[i]
    }
}

impl Drop for Cores {
    fn drop(&mut self) {
        self.end.cancel();
    }
}
