//! io_uring sockets for staleguard's `layout = "uring"`: each session thread (a tokio
//! current-thread runtime) gets one ring ([`start`]); a plain TCP socket moved onto it
//! ([`RingStream::new`]) is read and written through the ring instead of epoll, behind
//! tokio's `AsyncRead`/`AsyncWrite`, so the session's relay is the same code either way.
//!
//! Per thread: a driver task (the future [`start`] returns) reaps completions when the ring's
//! fd turns readable in tokio's reactor; [`park`] (the runtime's `on_thread_park` hook) hands
//! the queued submissions to the kernel in one `io_uring_enter`, reaps what completed and
//! wakes its streams before the thread would sleep; [`stop`] (after the runtime is gone)
//! cancels what is left, waits for it and closes the ring.
//!
//! The unsafe code of staleguard lives here (the proxy's own crate forbids it): the buffer
//! ring shared with the kernel (`bufs.rs`), submissions pointing at memory the driver keeps
//! until their completion (`driver.rs`), and closing fds once nothing uses them.

#[cfg(target_os = "linux")]
mod bufs;
#[cfg(target_os = "linux")]
mod driver;
#[cfg(target_os = "linux")]
mod stream;
#[cfg(target_os = "linux")]
mod thread;

#[cfg(target_os = "linux")]
pub use stream::{ReadHalf, RingStream, WriteHalf, WRITE_BEHIND};
#[cfg(target_os = "linux")]
pub use thread::{here, live, park, start, stats, stop, Live};
#[cfg(all(test, target_os = "linux"))]
mod tests;

/// The process's rings, for the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Rings set up and not stopped whose receives are multishot.
    pub multishot: usize,
    /// Rings set up and not stopped whose receives are one-shot (the kernel refused the
    /// multishot receive's limit).
    pub one_shot: usize,
    /// Sockets open on every ring.
    pub sockets: usize,
    /// Receives, on every ring since the process started, that found none of their ring's
    /// buffers free and waited for one.
    pub starved: u64,
}

/// Elsewhere there are no rings.
#[cfg(not(target_os = "linux"))]
pub fn stats() -> Option<Stats> {
    None
}
