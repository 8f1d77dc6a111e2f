//! A client that goes away with a TCP reset (what Node.js's `client.close()` does) ends its
//! session quietly (debug), not with a warning (issue 11, item 7). Its own binary: the log
//! capture is a process-wide subscriber.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bson::rawdoc;
use staleguard::config::Config;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

use support::mongos::FakeMongos;
use support::raw::{self, RawClient};

/// Every event: its level and message.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(Level, String)>>>);

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for Capture {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        let mut log = self.0.lock().unwrap_or_else(|p| p.into_inner());
        log.push((*event.metadata().level(), m.0));
    }
}

impl Capture {
    fn events(&self) -> Vec<(Level, String)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_is_logged_as_a_normal_close() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    tracing::subscriber::set_global_default(subscriber).expect("first subscriber");

    let fake = FakeMongos::start().await;
    let config = Config::for_upstreams("127.0.0.1:0", vec![fake.addr().to_string()]);
    let proxy = staleguard::server::start(Arc::new(config))
        .await
        .expect("start proxy");

    // A reset after a round trip, as Node.js closes its pool.
    let stream = TcpStream::connect(proxy.local_addr())
        .await
        .expect("connect");
    #[allow(deprecated)]
    stream.set_linger(Some(Duration::ZERO)).expect("linger 0");
    let (rd, mut wr) = stream.into_split();
    let ping = raw::msg(1, 0, &rawdoc! { "ping": 1, "$db": "admin" });
    wr.write_all(&ping).await.expect("send");
    let mut frames = tokio_util::codec::FramedRead::new(
        rd,
        staleguard::wire::MessageCodec::new(support::mongos::MAX_MESSAGE_SIZE),
    );
    let reply = support::within("reply", futures::StreamExt::next(&mut frames)).await;
    assert!(reply.is_some_and(|r| r.is_ok()));
    let stream = frames.into_inner().reunite(wr).expect("reunite");
    drop(stream);

    // A clean close (FIN) too.
    let mut clean = RawClient::connect(proxy.local_addr()).await;
    clean.roundtrip(&ping).await;
    drop(clean);

    let deadline = tokio::time::Instant::now() + support::STEP;
    loop {
        let ends = capture
            .events()
            .iter()
            .filter(|(_, m)| m.starts_with("session closed"))
            .count();
        if ends >= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "sessions did not end: {:?}",
            capture.events()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let events = capture.events();
    let warnings: Vec<_> = events
        .iter()
        .filter(|(l, m)| *l <= Level::WARN && m.starts_with("closing client"))
        .collect();
    assert!(
        warnings.is_empty(),
        "no warning for a client leaving: {warnings:?}"
    );
    assert!(
        events
            .iter()
            .any(|(l, m)| *l == Level::DEBUG && m == "session closed: client went away"),
        "the reset is a debug event: {events:?}"
    );
}
