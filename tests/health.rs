//! Upstream health: a periodic `hello` per upstream; one that stops answering is skipped
//! for new client connections and comes back when it answers again; with every upstream
//! down they are still tried. Health shows in `/readyz`, `/status` and `/metrics`.

use crate::ops_support;
use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::rawdoc;
use ops_support::http::get;
use ops_support::*;
use staleguard::server::Running;
use staleguard::upstream::Health;
use support::mongos::{FakeMongos, Hooked};
use support::raw::{self, RawClient};

/// A fake whose `hello` can be made to hang (as a mongos that stopped answering).
struct Fake {
    fake: FakeMongos,
    stalled: Arc<AtomicBool>,
}

impl Fake {
    async fn start() -> Fake {
        let fake = FakeMongos::start().await;
        let stalled = Arc::new(AtomicBool::new(false));
        let flag = stalled.clone();
        fake.set_hook(move |body| {
            let hello = body.get("hello").ok().flatten().is_some();
            (hello && flag.load(Ordering::Relaxed)).then(|| Hooked::delay(Duration::from_secs(5)))
        });
        Fake { fake, stalled }
    }

    fn addr(&self) -> String {
        self.fake.addr().to_string()
    }

    fn stall(&self, on: bool) {
        self.stalled.store(on, Ordering::Relaxed);
    }

    fn pings(&self) -> usize {
        let cmds = self.fake.received_commands();
        cmds.iter().filter(|(n, _)| n == "ping").count()
    }
}

async fn proxy(upstreams: Vec<String>) -> Running {
    let mut c = config(upstreams, vec![]);
    // Short enough for a quick test, long enough for a busy CI machine to answer in time.
    c.health_interval = Some(Duration::from_millis(250));
    c.health_timeout = Duration::from_millis(250);
    start(c).await
}

fn health_of(p: &Running, addr: &str) -> Health {
    let list = p.shared().upstreams.list();
    list.iter()
        .find(|u| u.addr == addr)
        .expect("upstream")
        .health()
}

/// Opens `n` client connections through the proxy and pings on each.
async fn ping_clients(p: &Running, n: i32) {
    for id in 0..n {
        let mut c = RawClient::connect(p.local_addr()).await;
        let reply = c
            .roundtrip(&raw::msg(id, 0, &rawdoc! { "ping": 1, "$db": "admin" }))
            .await;
        assert_eq!(raw::body(&reply).get_f64("ok").ok(), Some(1.0));
    }
}

#[tokio::test]
async fn an_upstream_that_stops_answering_is_skipped_until_it_answers_again() {
    let (a, b) = (Fake::start().await, Fake::start().await);
    let p = proxy(vec![a.addr(), b.addr()]).await;
    wait_until("both upstreams healthy", || {
        health_of(&p, &a.addr()) == Health::Up && health_of(&p, &b.addr()) == Health::Up
    })
    .await;

    a.stall(true);
    wait_until("a marked down", || health_of(&p, &a.addr()) == Health::Down).await;
    let admin = admin(&p);
    assert_eq!(
        get(admin, "/readyz", &[]).await.status,
        200,
        "b is still up"
    );
    let s = get(admin, "/status", &[]).await.json();
    let ups = s["upstreams"].as_array().expect("upstreams");
    assert_eq!(ups[0]["address"], a.addr());
    assert_eq!(ups[0]["health"], "down");
    let err = ups[0]["last_error"].as_str().unwrap_or_default();
    assert!(err.contains("no hello reply within 250ms"), "{err}");
    assert_eq!(ups[1]["health"], "up");
    assert!(ups[1]["last_hello_ms"].as_f64().is_some_and(|ms| ms >= 0.0));
    let m = get(admin, "/metrics", &[]).await.body;
    for line in [
        format!("staleguard_upstream_up{{upstream=\"{}\"}} 0", a.addr()),
        format!("staleguard_upstream_up{{upstream=\"{}\"}} 1", b.addr()),
    ] {
        assert!(m.lines().any(|l| l == line), "missing {line}:\n{m}");
    }
    assert!(m.contains("staleguard_upstream_hello_seconds_count"), "{m}");
    // The change is an event, with the address and the error.
    let down = s["events"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["kind"] == "upstream_down"))
        .cloned()
        .unwrap_or_else(|| panic!("no upstream_down event: {s:#}"));
    assert_eq!(down["place"], a.addr());
    let reason = down["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("no hello reply within 250ms"), "{reason}");

    let (a0, b0) = (a.pings(), b.pings());
    ping_clients(&p, 4).await;
    assert_eq!(
        a.pings(),
        a0,
        "no new client goes to the unhealthy upstream"
    );
    assert_eq!(b.pings(), b0 + 4);

    a.stall(false);
    wait_until("a healthy again", || health_of(&p, &a.addr()) == Health::Up).await;
    ping_clients(&p, 4).await;
    assert!(a.pings() > a0, "a takes new clients again");
    p.shutdown().await;
}

#[tokio::test]
async fn with_every_upstream_down_they_are_still_tried() {
    let a = Fake::start().await;
    a.stall(true);
    let p = proxy(vec![a.addr()]).await;
    wait_until("a marked down", || health_of(&p, &a.addr()) == Health::Down).await;
    let admin = admin(&p);
    let r = get(admin, "/readyz", &[]).await;
    assert_eq!(r.status, 503);
    assert!(r.body.contains("no upstream answered"), "{}", r.body);
    assert_eq!(get(admin, "/status", &[]).await.json()["ready"], false);
    // Better to try than to refuse: the client is still served.
    ping_clients(&p, 1).await;
    assert_eq!(a.pings(), 1);
    a.stall(false);
    wait_until("a healthy again", || health_of(&p, &a.addr()) == Health::Up).await;
    assert_eq!(get(admin, "/readyz", &[]).await.status, 200);
    p.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_upstream_is_down_with_the_reason() {
    // A port nobody listens on: bind, note it, close.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").to_string()
    };
    let b = Fake::start().await;
    let p = proxy(vec![dead.clone(), b.addr()]).await;
    wait_until("dead marked down", || health_of(&p, &dead) == Health::Down).await;
    let info = p.shared().upstreams.list()[0].info();
    let err = info.last_error.unwrap_or_default();
    assert!(err.starts_with("connect:"), "{err}");
    // New clients are not delayed by the dead one.
    ping_clients(&p, 3).await;
    assert_eq!(b.pings(), 3);
    p.shutdown().await;
}

/// The commands a fake received on its health-check connections, in order (names only).
fn hello_names(fake: &FakeMongos) -> Vec<String> {
    fake.received_commands()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| matches!(n.as_str(), "hello" | "isMaster" | "ismaster"))
        .collect()
}

#[tokio::test]
async fn a_server_that_does_not_know_hello_is_checked_with_the_legacy_hello() {
    // MongoDB 4.0 before 4.0.21 and 4.2.0 to 4.2.9: no `hello`, no `helloOk` in the reply.
    let old = FakeMongos::start().await;
    old.set_hook(|body| {
        let name = body.iter().next()?.ok()?.0.as_str().to_string();
        match name.as_str() {
            "hello" => Some(Hooked::error(
                59,
                "CommandNotFound",
                "no such command: 'hello'",
            )),
            "isMaster" | "ismaster" => Some(Hooked::reply(rawdoc! {
                "ismaster": true, "msg": "isdbgrid", "maxWireVersion": 8, "ok": 1.0,
            })),
            _ => None,
        }
    });
    let p = proxy(vec![old.addr().to_string()]).await;
    let addr = old.addr().to_string();
    wait_until("three checks", || hello_names(&old).len() >= 3).await;
    assert_eq!(health_of(&p, &addr), Health::Up);
    let names = hello_names(&old);
    assert!(names.iter().all(|n| n == "isMaster"), "{names:?}");
    let (_, first) = &old.received_commands()[0];
    assert_eq!(first.get_bool("helloOk").ok(), Some(true), "{first:?}");
    assert_eq!(first.get_str("$db").ok(), Some("admin"));
}

#[tokio::test]
async fn a_server_that_offers_hello_is_checked_with_hello_after_the_handshake() {
    let modern = FakeMongos::start().await;
    let p = proxy(vec![modern.addr().to_string()]).await;
    let addr = modern.addr().to_string();
    wait_until("three checks", || hello_names(&modern).len() >= 3).await;
    assert_eq!(health_of(&p, &addr), Health::Up);
    let names = hello_names(&modern);
    assert_eq!(
        names[0], "isMaster",
        "the handshake starts with the legacy hello"
    );
    assert!(names[1..].iter().all(|n| n == "hello"), "{names:?}");
}
