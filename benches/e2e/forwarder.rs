//! The floor (role `forwarder`): a bare tokio `copy_bidirectional` relay on the same runtime
//! staleguard's `run` builds (multi-thread, default workers), nodelay on both sides as
//! staleguard sets them. Anything staleguard costs beyond this is its own work.

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};

pub fn run(args: &[String]) {
    let upstream = args
        .iter()
        .position(|a| a == "--upstream")
        .and_then(|i| args.get(i + 1))
        .cloned()
        .expect("--upstream host:port");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        crate::procs::announce(listener.local_addr().expect("addr"));
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
    });
}
