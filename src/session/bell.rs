//! Wake-ups that say where they came from. A session's task has one waker, so when it wakes
//! it cannot tell which of the things it waits on is ready, and polling each again costs a
//! lock (a socket's readiness, a token, a timer) per turn. A [`Bell`] is a waker of its own
//! for one source: the source rings it, the bell wakes the task, and the relay polls that
//! source again only when its bell rang. The lifecycle's signals share one bell (`life`);
//! each peer's read side has its own ([`Ear`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures::task::AtomicWaker;
use futures::{Stream, StreamExt};

/// Rung by a source; wakes the session's task.
#[derive(Debug, Default)]
pub(super) struct Bell {
    rung: AtomicBool,
    task: AtomicWaker,
}

impl std::task::Wake for Bell {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.rung.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl Bell {
    /// A bell and the waker that rings it.
    pub(super) fn new() -> (Arc<Bell>, Waker) {
        let bell = Arc::new(Bell::default());
        let waker = Waker::from(bell.clone());
        (bell, waker)
    }

    /// Whether it rang since the last [`Bell::answer`] (one load).
    pub(super) fn rang(&self) -> bool {
        self.rung.load(Ordering::Acquire)
    }

    /// Before the source is polled: the task's waker is left with the bell, and the ring is
    /// taken (whatever the source does after its poll rings again).
    pub(super) fn answer(&self, cx: &Context<'_>) {
        self.task.register(cx.waker());
        self.rung.store(false, Ordering::Release);
    }
}

/// A peer's read side, polled with its own bell: again after it gave something (more may
/// be there), or once it rang; otherwise a turn costs one load.
pub(super) struct Ear {
    bell: Arc<Bell>,
    waker: Waker,
    /// The last poll gave an item, or none was made yet: poll again.
    ready: bool,
}

impl std::fmt::Debug for Ear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ear").field("ready", &self.ready).finish()
    }
}

impl Default for Ear {
    fn default() -> Ear {
        let (bell, waker) = Bell::new();
        Ear {
            bell,
            waker,
            ready: true,
        }
    }
}

impl Ear {
    /// The next item of `s`, as `StreamExt::next` gives it, with `s` polled only when it
    /// may have one.
    pub(super) fn next<'a, S: Stream + Unpin>(
        &'a mut self,
        s: &'a mut S,
    ) -> impl std::future::Future<Output = Option<S::Item>> + 'a {
        std::future::poll_fn(move |cx| {
            if !self.ready && !self.bell.rang() {
                return Poll::Pending;
            }
            self.bell.answer(cx);
            let mut own = Context::from_waker(&self.waker);
            let polled = s.poll_next_unpin(&mut own);
            self.ready = polled.is_ready();
            polled
        })
    }
}
