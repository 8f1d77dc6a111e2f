//! Throw-away certificates (rcgen): a CA, a server certificate for `localhost` and
//! `127.0.0.1`, and a client certificate, written as PEM files into a temp folder.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// Client certificate and key in one file (what drivers take).
    pub client_pem: PathBuf,
    /// A second, unrelated CA (for "wrong CA" cases).
    pub other_ca: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(p, KeyPair::generate().expect("ca key")).expect("ca cert")
}

fn leaf(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    names: &[&str],
    cn: &str,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut p = CertificateParams::new(names).expect("leaf params");
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = vec![usage];
    let key = KeyPair::generate().expect("leaf key");
    let cert = p.signed_by(&key, issuer).expect("leaf cert");
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca_cert = ca("staleguard test CA");
        let other = ca("some other CA");
        let (server_cert, server_key) = leaf(
            &ca_cert,
            &["localhost", "127.0.0.1"],
            "localhost",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = leaf(
            &ca_cert,
            &["app.client"],
            "app.client",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).expect("write pem");
            p
        };
        Pki {
            ca: write("ca.pem", &ca_cert.pem()),
            other_ca: write("other-ca.pem", &other.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            client_pem: write("client-bundle.pem", &format!("{client_cert}{client_key}")),
            dir,
        }
    }
}
