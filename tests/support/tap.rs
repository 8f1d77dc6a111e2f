//! A recording TCP tap: relays whole frames between clients and a target unchanged and
//! keeps a copy of each, so a test can compare what a client really sent and got.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use bytes::Bytes;
use futures::StreamExt;
use staleguard::wire::MessageCodec;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::codec::FramedRead;

use super::mongos::MAX_MESSAGE_SIZE;

/// Frames seen in one direction, with a wake-up for waiters.
#[derive(Default)]
struct Seen {
    frames: Mutex<Vec<Bytes>>,
    changed: Notify,
}

impl Seen {
    fn push(&self, msg: Bytes) {
        self.frames.lock().expect("tap record").push(msg);
        self.changed.notify_waiters();
    }

    fn get(&self) -> Vec<Bytes> {
        self.frames.lock().expect("tap record").clone()
    }
}

type Record = Arc<Seen>;

pub struct Tap {
    addr: SocketAddr,
    to_server: Record,
    to_client: Record,
    accept: JoinHandle<()>,
}

impl Tap {
    /// Listens on `127.0.0.1:0`; each connection is relayed to a new connection to `target`.
    pub async fn start(target: SocketAddr) -> Tap {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind tap");
        let addr = listener.local_addr().expect("tap address");
        let (to_server, to_client) = (Record::default(), Record::default());
        let accept = tokio::spawn(accept_loop(
            listener,
            target,
            to_server.clone(),
            to_client.clone(),
        ));
        Tap {
            addr,
            to_server,
            to_client,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every message clients sent, in order of arrival at the tap.
    pub fn to_server(&self) -> Vec<Bytes> {
        self.to_server.get()
    }

    /// Every message clients were sent, in order.
    pub fn to_client(&self) -> Vec<Bytes> {
        self.to_client.get()
    }

    /// Waits until `pred(to_server, to_client)` holds (fails after [`super::STEP`]).
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&[Bytes], &[Bytes]) -> bool) {
        super::within(what, async {
            loop {
                let up = self.to_server.changed.notified();
                let down = self.to_client.changed.notified();
                tokio::pin!(up, down);
                up.as_mut().enable();
                down.as_mut().enable();
                if pred(&self.to_server(), &self.to_client()) {
                    return;
                }
                tokio::select! {
                    _ = up => {}
                    _ = down => {}
                }
            }
        })
        .await
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, up: Record, down: Record) {
    let mut pumps = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let Ok(server) = TcpStream::connect(target).await else { continue };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (client_rd, client_wr) = client.into_split();
                let (server_rd, server_wr) = server.into_split();
                pumps.spawn(pump(client_rd, server_wr, up.clone()));
                pumps.spawn(pump(server_rd, client_wr, down.clone()));
            }
            Some(_) = pumps.join_next(), if !pumps.is_empty() => {}
        }
    }
}

/// Copies frames from `from` to `to`, recording each; passes EOF on.
async fn pump(from: OwnedReadHalf, mut to: OwnedWriteHalf, record: Record) {
    let mut frames = FramedRead::new(from, MessageCodec::new(MAX_MESSAGE_SIZE));
    while let Some(Ok(msg)) = frames.next().await {
        record.push(msg.clone());
        if to.write_all(&msg).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
