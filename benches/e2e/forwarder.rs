//! The floor (role `forwarder`): a bare tokio `copy_bidirectional` relay on the same runtime
//! staleguard's `run` builds (multi-thread, default workers), nodelay on both sides as
//! staleguard sets them. Anything staleguard costs beyond this is its own work.
//!
//! With `--per-core` (target `floor-percore`) it runs the thread-per-core layout instead:
//! one current-thread runtime per core, each accepting on its own `SO_REUSEPORT` listener,
//! each connection pair living on the thread that accepted it (no work stealing, no
//! cross-thread wake-ups).

use std::net::SocketAddr;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The `--upstream host:port` every floor relays to.
pub fn upstream_arg(args: &[String]) -> String {
    args.iter()
        .position(|a| a == "--upstream")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .expect("--upstream host:port")
}

pub fn run(args: &[String]) {
    let upstream = upstream_arg(args);
    if args.iter().any(|a| a == "--per-core") {
        return per_core(upstream);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        crate::procs::announce(listener.local_addr().expect("addr"));
        serve(listener, upstream).await
    });
}

async fn serve(listener: TcpListener, upstream: String) {
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            let Ok(mut up) = TcpStream::connect(upstream.as_str()).await else {
                return;
            };
            let _ = up.set_nodelay(true);
            let _ = copy_bidirectional(&mut client, &mut up).await;
        });
    }
}

fn per_core(upstream: String) {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut addr: SocketAddr = ([127, 0, 0, 1], 0).into();
    let mut workers = Vec::new();
    for _ in 0..threads {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let listener = rt.block_on(async {
            let s = TcpSocket::new_v4().expect("socket");
            s.set_reuseport(true).expect("SO_REUSEPORT");
            s.bind(addr).expect("bind");
            s.listen(4096).expect("listen")
        });
        addr = listener.local_addr().expect("addr");
        let upstream = upstream.clone();
        workers.push(std::thread::spawn(move || {
            rt.block_on(serve(listener, upstream))
        }));
    }
    crate::procs::announce(addr);
    for w in workers {
        let _ = w.join();
    }
}
