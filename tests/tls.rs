//! TLS on both legs, with certificates made here (rcgen): the `mongodb` crate and pymongo
//! connect to staleguard over TLS (with and without client certificates), and staleguard
//! reaches mongos over TLS through a small TLS terminator in front of the fake mongos.
//! Config errors about TLS files name file, line and key.

use crate::ops_support;
use crate::support;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document};
use ops_support::certs::Pki;
use ops_support::http::get;
use ops_support::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use staleguard::config::Config;
use staleguard::server::Running;
use support::mongos::FakeMongos;
use support::within;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca: &Path) -> RootCertStore {
    let mut store = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).expect("ca file") {
        store.add(c.expect("ca cert")).expect("add ca");
    }
    store
}

fn chain(cert: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(cert)
        .expect("cert file")
        .map(|c| c.expect("cert"))
        .collect()
}

fn key(path: &Path) -> PrivateKeyDer<'static> {
    PrivateKeyDer::from_pem_file(path).expect("key file")
}

/// A TLS terminator in front of the fake mongos: it requires a client certificate signed
/// by the test CA and relays the decrypted bytes to `backend`.
struct TlsFront {
    addr: SocketAddr,
    /// Handshakes completed, each with a verified client certificate.
    handshakes: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn tls_front(pki: &Pki, backend: SocketAddr) -> TlsFront {
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots(&pki.ca)), provider())
            .build()
            .expect("client verifier");
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain(&pki.server_cert), key(&pki.server_key))
        .expect("server config");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind front");
    let addr = listener.local_addr().expect("front addr");
    let handshakes = Arc::new(AtomicUsize::new(0));
    let count = handshakes.clone();
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, count) = (acceptor.clone(), count.clone());
            conns.spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                if tls.get_ref().1.peer_certificates().is_some() {
                    count.fetch_add(1, Ordering::SeqCst);
                }
                let Ok(mut plain) = TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    TlsFront {
        addr,
        handshakes,
        task,
    }
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// Loads `text` as `staleguard.toml` in the PKI folder (relative TLS paths resolve there).
fn load(pki: &Pki, text: &str) -> Result<Config, Vec<staleguard::config::ConfigError>> {
    let file = pki.dir.path().join("staleguard.toml");
    std::fs::write(&file, text).expect("write config");
    Config::load(&file)
}

/// Client-facing TLS (optionally mutual) in front of `upstream`, plain upstream.
async fn tls_proxy(pki: &Pki, upstream: SocketAddr, mutual: bool) -> Running {
    let client_ca = if mutual {
        "client_ca = \"ca.pem\"\n"
    } else {
        ""
    };
    let text = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"{upstream}\"]\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n{client_ca}"
    );
    let mut c = load(pki, &text).unwrap_or_else(|e| panic!("{e:?}"));
    c.health_interval = None;
    start(c).await
}

async fn driver(uri: String) -> mongodb::Client {
    mongodb::Client::with_uri_str(uri)
        .await
        .expect("driver client")
}

/// ping, insert, find through `client`.
async fn round_trip(client: &mongodb::Client, name: &str) {
    let ping = within(
        "ping",
        client.database("admin").run_command(doc! { "ping": 1 }),
    )
    .await
    .expect("ping over tls");
    assert_eq!(ping.get_f64("ok").ok(), Some(1.0));
    let coll = client.database("shop").collection::<Document>("items");
    within(
        "insert",
        coll.insert_one(doc! { "_id": name, "via": "tls" }),
    )
    .await
    .expect("insert over tls");
    let found = within("find", coll.find_one(doc! { "_id": name }))
        .await
        .expect("find over tls");
    assert_eq!(
        found.and_then(|d| d.get_str("via").ok().map(str::to_string)),
        Some("tls".into())
    );
}

#[tokio::test]
async fn rust_driver_over_client_tls() {
    let pki = Pki::new();
    let fake = FakeMongos::start().await;
    fake.set_await_cap(Duration::from_millis(100));
    let proxy = tls_proxy(&pki, fake.addr(), false).await;
    let uri = format!(
        "mongodb://{}/?tls=true&tlsCAFile={}&serverSelectionTimeoutMS=5000",
        proxy.local_addr(),
        path(&pki.ca)
    );
    let client = driver(uri).await;
    round_trip(&client, "rust").await;
    assert_eq!(fake.documents("shop.items").len(), 1);
    // Plain TCP against a TLS listener gets nothing useful, and is counted.
    let mut plain = support::raw::RawClient::connect(proxy.local_addr()).await;
    plain
        .send(&support::raw::msg(
            1,
            0,
            &bson::rawdoc! { "ping": 1, "$db": "admin" },
        ))
        .await;
    assert!(plain.expect_closed().await.is_empty());
    // Counted just after the socket is dropped (the client may see the close first).
    let counted = "staleguard_tls_handshake_failures_total{side=\"client\"} 1";
    let since = std::time::Instant::now();
    loop {
        let m = get(admin(&proxy), "/metrics", &[]).await.body;
        if m.contains(counted) {
            break;
        }
        assert!(since.elapsed() < Duration::from_secs(5), "{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.shutdown().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn mutual_tls_requires_a_client_certificate_from_the_ca() {
    let pki = Pki::new();
    let fake = FakeMongos::start().await;
    fake.set_await_cap(Duration::from_millis(100));
    let proxy = tls_proxy(&pki, fake.addr(), true).await;
    let uri = format!(
        "mongodb://{}/?tls=true&tlsCAFile={}&tlsCertificateKeyFile={}&serverSelectionTimeoutMS=5000",
        proxy.local_addr(),
        path(&pki.ca),
        path(&pki.client_pem)
    );
    let client = driver(uri).await;
    round_trip(&client, "mtls").await;
    client.shutdown().await;

    // Without a certificate the handshake is refused.
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots(&pki.ca))
        .with_no_client_auth();
    let tcp = TcpStream::connect(proxy.local_addr())
        .await
        .expect("connect");
    let name = ServerName::try_from("localhost").expect("name");
    let result = within("handshake", async {
        let mut tls = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        // TLS 1.3: the server's refusal arrives with the first read.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tls.write_all(b"x").await?;
        let mut buf = [0u8; 1];
        tls.read(&mut buf).await
    })
    .await;
    assert!(matches!(result, Err(_) | Ok(0)), "{result:?}");
    proxy.shutdown().await;
}

#[tokio::test]
async fn upstream_tls_with_a_client_certificate() {
    let pki = Pki::new();
    let fake = FakeMongos::start().await;
    fake.set_await_cap(Duration::from_millis(100));
    let front = tls_front(&pki, fake.addr()).await;
    let text = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nhealth_interval = \"200ms\"\n\
         health_timeout = \"200ms\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [upstream_tls]\nca = \"ca.pem\"\nserver_name = \"localhost\"\n\
         cert = \"client.pem\"\nkey = \"client.key\"\n",
        front.addr
    );
    let proxy = start(load(&pki, &text).unwrap_or_else(|e| panic!("{e:?}"))).await;
    let client = driver(format!(
        "mongodb://{}/?serverSelectionTimeoutMS=5000",
        proxy.local_addr()
    ))
    .await;
    round_trip(&client, "upstream-tls").await;
    assert_eq!(fake.documents("shop.items").len(), 1);
    // The driver's connections and the health check all went through TLS with our cert.
    assert!(front.handshakes.load(Ordering::SeqCst) >= 2);
    wait_until("upstream healthy over tls", || {
        proxy.shared().upstreams.list()[0].health() == staleguard::upstream::Health::Up
    })
    .await;
    client.shutdown().await;
    proxy.shutdown().await;
}

/// `layout = "uring"`: a TLS leg stays on epoll while the plain one goes on the session
/// thread's io_uring; both arrangements relay for the driver.
#[tokio::test]
async fn uring_layout_with_tls_on_either_leg() {
    let pki = Pki::new();
    let fake = FakeMongos::start().await;
    fake.set_await_cap(Duration::from_millis(100));
    // Client-facing TLS, plain upstream.
    let text = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nlayout = \"uring\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n[tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n",
        fake.addr()
    );
    let mut c = load(&pki, &text).unwrap_or_else(|e| panic!("{e:?}"));
    c.health_interval = None;
    let proxy = start(c).await;
    let client = driver(format!(
        "mongodb://{}/?tls=true&tlsCAFile={}&serverSelectionTimeoutMS=5000",
        proxy.local_addr(),
        path(&pki.ca)
    ))
    .await;
    round_trip(&client, "uring-client-tls").await;
    client.shutdown().await;
    proxy.shutdown().await;
    // Plain client, upstream TLS.
    let front = tls_front(&pki, fake.addr()).await;
    let text = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nlayout = \"uring\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n[upstream_tls]\nca = \"ca.pem\"\nserver_name = \"localhost\"\n\
         cert = \"client.pem\"\nkey = \"client.key\"\n",
        front.addr
    );
    let mut c = load(&pki, &text).unwrap_or_else(|e| panic!("{e:?}"));
    c.health_interval = None;
    let proxy = start(c).await;
    let client = driver(format!(
        "mongodb://{}/?serverSelectionTimeoutMS=5000",
        proxy.local_addr()
    ))
    .await;
    round_trip(&client, "uring-upstream-tls").await;
    assert!(front.handshakes.load(Ordering::SeqCst) >= 1);
    assert_eq!(fake.documents("shop.items").len(), 2);
    client.shutdown().await;
    proxy.shutdown().await;
}

#[tokio::test]
async fn upstream_tls_with_the_wrong_ca_fails_on_the_upstream_side() {
    let pki = Pki::new();
    let fake = FakeMongos::start().await;
    let front = tls_front(&pki, fake.addr()).await;
    let text = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nhealth_interval = \"200ms\"\n\
         health_timeout = \"200ms\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
         [upstream_tls]\nca = \"other-ca.pem\"\nserver_name = \"localhost\"\n",
        front.addr
    );
    let proxy = start(load(&pki, &text).unwrap_or_else(|e| panic!("{e:?}"))).await;
    wait_until("upstream down", || {
        proxy.shared().upstreams.list()[0].health() == staleguard::upstream::Health::Down
    })
    .await;
    let info = proxy.shared().upstreams.list()[0].info();
    let err = info.last_error.unwrap_or_default();
    assert!(
        err.starts_with("tls handshake:") && err.contains("UnknownIssuer"),
        "{err}"
    );
    // A client is closed (no upstream), and the failure is counted on the upstream side.
    let mut c = support::raw::RawClient::connect(proxy.local_addr()).await;
    c.send(&support::raw::msg(
        1,
        0,
        &bson::rawdoc! { "ping": 1, "$db": "admin" },
    ))
    .await;
    assert!(c.expect_closed().await.is_empty());
    let m = get(admin(&proxy), "/metrics", &[]).await.body;
    assert!(
        m.contains("staleguard_tls_handshake_failures_total{side=\"upstream\"}"),
        "{m}"
    );
    proxy.shutdown().await;
}

// ------------------------------------------------------------------------------ pymongo

const PYMONGO_SCRIPT: &str = r#"
import sys, pymongo
uri, ca, cert = sys.argv[1:4]
c = pymongo.MongoClient(uri, tls=True, tlsCAFile=ca, tlsCertificateKeyFile=cert,
                        serverSelectionTimeoutMS=5000, connectTimeoutMS=5000)
print("ping", c.admin.command("ping")["ok"])
items = c.shop.items
items.insert_one({"_id": "py", "via": "tls"})
print("found", items.find_one({"_id": "py"})["via"])
c.close()
"#;

/// Runs the script; returns stdout (fails the test on a non-zero exit or after 60 s).
fn run_pymongo(uri: &str, ca: &Path, cert: &Path) -> String {
    let python = support::py::venv_python();
    let mut child = Command::new(&python)
        .args(["-c", PYMONGO_SCRIPT, uri])
        .arg(ca)
        .arg(cert)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", python.display()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("pymongo script ran past 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("script output");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "pymongo script failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_over_tls_on_both_legs() {
    let pki = Pki::new();
    let fake = FakeMongos::start().await;
    fake.set_await_cap(Duration::from_millis(100));
    let front = tls_front(&pki, fake.addr()).await;
    let text = format!(
        "listen = \"127.0.0.1:0\"\nupstreams = [\"{}\"]\nhealth_interval = \"off\"\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\
         [tls]\ncert = \"server.pem\"\nkey = \"server.key\"\nclient_ca = \"ca.pem\"\n\
         [upstream_tls]\nca = \"ca.pem\"\ncert = \"client.pem\"\nkey = \"client.key\"\n",
        front.addr
    );
    // No server_name: the upstream's host (127.0.0.1, an IP SAN of the certificate) is used.
    let proxy = start(load(&pki, &text).unwrap_or_else(|e| panic!("{e:?}"))).await;
    let uri = format!("mongodb://{}/?directConnection=true", proxy.local_addr());
    let (ca, cert) = (pki.ca.clone(), pki.client_pem.clone());
    let out = tokio::task::spawn_blocking(move || run_pymongo(&uri, &ca, &cert))
        .await
        .expect("pymongo task");
    assert!(
        out.contains("ping 1.0") && out.contains("found tls"),
        "{out}"
    );
    assert!(front.handshakes.load(Ordering::SeqCst) >= 1);
    assert_eq!(fake.documents("shop.items").len(), 1);
    proxy.shutdown().await;
}

// -------------------------------------------------------------------------- config errors

fn errors(pki: &Pki, text: &str) -> Vec<String> {
    match load(pki, text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn tls_config_errors_name_file_line_and_key() {
    let pki = Pki::new();
    let file = path(&pki.dir.path().join("staleguard.toml"));
    let e = errors(
        &pki,
        "[tls]\ncert = \"missing.pem\"\nkey = \"server.key\"\n",
    );
    assert!(
        e[0].starts_with(&format!("{file}:2: tls.cert: cannot read ")),
        "{e:?}"
    );
    assert!(e[0].contains("missing.pem"), "{e:?}");

    let e = errors(&pki, "[tls]\ncert = \"server.pem\"\nkey = \"client.key\"\n");
    assert!(e[0].starts_with(&format!("{file}:3: tls.key: ")), "{e:?}");
    assert!(e[0].contains("does not fit certificate"), "{e:?}");

    let e = errors(&pki, "\n[tls]\ncert = \"server.pem\"\n");
    assert!(
        e[0].starts_with(&format!("{file}:2: tls.key: missing")),
        "{e:?}"
    );

    let e = errors(&pki, "[tls]\ncert = \"server.key\"\nkey = \"server.key\"\n");
    assert!(
        e[0].contains("tls.cert: ") && e[0].contains("no PEM certificate"),
        "{e:?}"
    );

    let e = errors(
        &pki,
        "[tls]\ncert = \"server.pem\"\nkey = \"server.key\"\nclient_ca = \"nope.pem\"\n",
    );
    assert!(
        e[0].starts_with(&format!("{file}:4: tls.client_ca: cannot read")),
        "{e:?}"
    );

    let e = errors(&pki, "[upstream_tls]\nserver_name = \"localhost\"\n");
    assert!(
        e[0].starts_with(&format!("{file}:1: upstream_tls.ca: missing")),
        "{e:?}"
    );

    let e = errors(
        &pki,
        "[upstream_tls]\nca = \"ca.pem\"\ncert = \"client.pem\"\n",
    );
    assert!(
        e[0].starts_with(&format!(
            "{file}:3: upstream_tls.cert: is set without `key`"
        )),
        "{e:?}"
    );

    let e = errors(
        &pki,
        "[upstream_tls]\nca = \"ca.pem\"\nserver_name = \"bad name!\"\n",
    );
    assert!(
        e[0].starts_with(&format!("{file}:3: upstream_tls.server_name: ")),
        "{e:?}"
    );

    let e = errors(
        &pki,
        "[upstream_tls]\nca = \"ca.pem\"\ninsecure_skip_verify = true\n",
    );
    assert!(
        e[0].starts_with(&format!("{file}:2: upstream_tls.ca: has no effect")),
        "{e:?}"
    );

    let e = errors(
        &pki,
        "[tls]\ncert = \"server.pem\"\nkey = \"server.key\"\nverify = true\n",
    );
    assert!(
        e[0].starts_with(&format!("{file}:4: tls.verify: unknown key")),
        "{e:?}"
    );

    // Absolute paths work as well as paths relative to the config file.
    let text = format!(
        "[tls]\ncert = \"{}\"\nkey = \"server.key\"\n[upstream_tls]\ninsecure_skip_verify = true\n",
        path(&pki.server_cert)
    );
    let c = load(&pki, &text).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(c.tls.is_some() && c.upstream_tls.is_some_and(|t| t.insecure_skip_verify));
}
