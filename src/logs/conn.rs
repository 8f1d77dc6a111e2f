//! The connection span (`conn{client.addr, id}`), on every line a session logs, at the cost
//! of a thread-local write per poll of the session's task instead of the span's entry and
//! exit (the registry's span stack, a reference count taken and given back, the layers told):
//! about 500 instructions of a governed round trip's 14,400, two polls a round trip.
//!
//! A session's poll only notes its span as the thread's current connection
//! ([`ConnSpan::enter`]); the subscriber the binary installs ([`ConnScoped`]) enters it
//! around an event, or a span created, while one is noted, so that the line is written, and
//! filtered, exactly as if the span had been entered for the whole poll. Lines are rare next
//! to polls. Without that subscriber (tests, a library user's own, `RUST_LOG`'s `EnvFilter`,
//! whose span directives look at the spans entered), [`note_spans`] is never called and the span
//! is entered for each poll, as `tracing::Instrument` does.

use std::cell::Cell;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Dispatch, Event, Metadata, Span, Subscriber};
use tracing_core::span::Current;

/// The global subscriber is a [`ConnScoped`]: a poll notes its connection's span.
static LAZY: AtomicBool = AtomicBool::new(false);

std::thread_local! {
    /// The span of the connection whose task this thread is polling.
    static CURRENT: Cell<Option<NonZeroU64>> = const { Cell::new(None) };
}

/// From now on, a session's poll notes its span rather than entering it: to be called once
/// the global subscriber is a [`ConnScoped`] (and only then: another would write the lines
/// without the span).
pub fn note_spans() {
    LAZY.store(true, Ordering::Relaxed);
}

/// A connection's span, as its session's task holds it (no larger than the span: every
/// idle connection's task holds it).
#[derive(Debug)]
pub struct ConnSpan(Span);

impl ConnSpan {
    pub fn new(span: Span) -> ConnSpan {
        ConnSpan(span)
    }

    /// For one poll of the session's task: the span noted as the thread's connection (see
    /// the module), or entered. A disabled span (its level is off) costs a branch.
    pub fn enter(&self) -> Entered<'_> {
        let Some(id) = self.0.id() else {
            return Entered::Off;
        };
        if LAZY.load(Ordering::Relaxed) {
            Entered::Noted(CURRENT.replace(Some(id.into_non_zero_u64())))
        } else {
            Entered::Entered(self.0.enter())
        }
    }
}

/// A poll's hold on its connection's span, given back when dropped.
#[must_use]
pub enum Entered<'a> {
    Off,
    /// The connection noted before this one (none but in a nested poll).
    Noted(Option<NonZeroU64>),
    Entered(tracing::span::Entered<'a>),
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Entered::Noted(before) = *self {
            CURRENT.set(before);
        }
    }
}

/// A subscriber that enters the thread's noted connection span (see the module) around
/// what is logged under it. Everything else goes to `S` as is.
#[derive(Debug)]
pub struct ConnScoped<S>(pub S);

impl<S: Subscriber> ConnScoped<S> {
    /// `f` with the noted connection's span entered, for a `contextual` event or span
    /// (unless a span is entered already: one the session entered, itself under the
    /// connection's, is the current one).
    fn within<R>(&self, contextual: bool, f: impl FnOnce(&S) -> R) -> R {
        match CURRENT.get() {
            Some(id) if contextual && self.0.current_span().id().is_none() => {
                let id = Id::from_non_zero_u64(id);
                self.0.enter(&id);
                let r = f(&self.0);
                self.0.exit(&id);
                r
            }
            _ => f(&self.0),
        }
    }
}

impl<S: Subscriber> Subscriber for ConnScoped<S> {
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        self.0.on_register_dispatch(subscriber)
    }

    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        self.0.register_callsite(metadata)
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.0.enabled(metadata)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        self.0.max_level_hint()
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        self.within(span.is_contextual(), |s| s.new_span(span))
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        self.0.record(span, values)
    }

    fn record_follows_from(&self, span: &Id, follows: &Id) {
        self.0.record_follows_from(span, follows)
    }

    fn event_enabled(&self, event: &Event<'_>) -> bool {
        self.within(event.is_contextual(), |s| s.event_enabled(event))
    }

    fn event(&self, event: &Event<'_>) {
        self.within(event.is_contextual(), |s| s.event(event))
    }

    fn enter(&self, span: &Id) {
        self.0.enter(span)
    }

    fn exit(&self, span: &Id) {
        self.0.exit(span)
    }

    fn clone_span(&self, id: &Id) -> Id {
        self.0.clone_span(id)
    }

    fn try_close(&self, id: Id) -> bool {
        self.0.try_close(id)
    }

    fn current_span(&self) -> Current {
        self.within(true, |s| s.current_span())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    use crate::logs::LogBuf as Buf;

    /// What a session logs, written by `S` with its span noted (as the binary's
    /// subscriber), and entered (as any other).
    fn both<F: Fn(Buf) -> Dispatch>(subscriber: F) -> (String, String) {
        let log = |note: bool| {
            let buf = Buf::default();
            tracing::dispatcher::with_default(&subscriber(buf.clone()), || {
                let conn = ConnSpan::new(tracing::info_span!(
                    "conn",
                    client.addr = "10.0.0.7:5123",
                    id = 42
                ));
                {
                    let _in = match note {
                        true => Entered::Noted(
                            CURRENT.replace(conn.0.id().map(|id| id.into_non_zero_u64())),
                        ),
                        false => conn.enter(),
                    };
                    tracing::warn!(ns = "shop.orders", "closing client");
                    tracing::debug!("not written at info");
                    let _inner = tracing::info_span!("inner", n = 1).entered();
                    tracing::info!("inside a span of its own");
                }
                assert_eq!(CURRENT.get(), None, "the poll gave its note back");
                tracing::info!("after the poll");
            });
            buf.text()
        };
        (log(true), log(false))
    }

    #[test]
    fn a_noted_span_is_on_the_lines_as_an_entered_one() {
        let pretty = |buf: Buf| {
            let fmt = tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .without_time()
                .with_writer(buf);
            let filter =
                tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO);
            let s = tracing_subscriber::registry().with(filter).with(fmt);
            Dispatch::new(ConnScoped(s))
        };
        let (noted, entered) = both(pretty);
        assert_eq!(noted, entered);
        let lines: Vec<&str> = noted.lines().collect();
        assert_eq!(lines.len(), 3, "{noted}");
        assert!(
            lines[0].contains("conn{client.addr=\"10.0.0.7:5123\" id=42}: "),
            "{noted}"
        );
        assert!(
            lines[0].ends_with("closing client ns=\"shop.orders\""),
            "{noted}"
        );
        assert!(lines[1].contains("conn{client.addr=\"10.0.0.7:5123\" id=42}:inner{n=1}: "));
        assert!(!lines[2].contains("conn{"), "{noted}");

        let json = |buf: Buf| {
            let fmt = tracing_subscriber::fmt::layer()
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .without_time()
                .with_writer(buf);
            let filter =
                tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO);
            Dispatch::new(ConnScoped(
                tracing_subscriber::registry().with(filter).with(fmt),
            ))
        };
        let (noted, entered) = both(json);
        assert_eq!(noted, entered);
        assert!(
            noted.lines().next().is_some_and(|l| l.contains(
                "\"span\":{\"client.addr\":\"10.0.0.7:5123\",\"id\":42,\"name\":\"conn\"}"
            )),
            "{noted}"
        );
    }
}
