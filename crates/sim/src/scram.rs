//! SCRAM-SHA-256 (RFC 5802 with SHA-256, RFC 7677), as MongoDB speaks it: user names are
//! not prepared, passwords are used as given (the simulator's users have ASCII passwords,
//! which SASLprep leaves alone), no channel binding (`n,,`). Both sides: the server's for the
//! simulated cluster's auth, the client's for tests that authenticate raw connections.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// The iteration count the simulator's credentials use (the drivers' floor).
pub const ITERATIONS: u32 = 4096;

/// Why a SCRAM message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("scram: {0}")]
pub struct ScramError(pub String);

fn err(what: impl Into<String>) -> ScramError {
    ScramError(what.into())
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC takes keys of every length; were one refused, the all-zero MAC would only fail
    // the authentication.
    let Ok(mut m) = <Hmac<Sha256> as KeyInit>::new_from_slice(key) else {
        return [0; 32];
    };
    m.update(data);
    m.finalize().into_bytes().into()
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

/// `Hi()` of RFC 5802: PBKDF2 with HMAC-SHA-256 and one output block.
fn salted_password(password: &str, salt: &[u8], iterations: u32) -> [u8; 32] {
    let mut first = salt.to_vec();
    first.extend_from_slice(&1u32.to_be_bytes());
    let mut u = hmac(password.as_bytes(), &first);
    let mut out = u;
    for _ in 1..iterations {
        u = hmac(password.as_bytes(), &u);
        for (o, x) in out.iter_mut().zip(u) {
            *o ^= x;
        }
    }
    out
}

/// What the server keeps of a password.
#[derive(Debug, Clone)]
pub struct Credential {
    pub salt: Vec<u8>,
    pub iterations: u32,
    stored_key: [u8; 32],
    server_key: [u8; 32],
}

impl Credential {
    pub fn new(password: &str, salt: &[u8], iterations: u32) -> Credential {
        let salted = salted_password(password, salt, iterations);
        Credential {
            salt: salt.to_vec(),
            iterations,
            stored_key: sha256(&hmac(&salted, b"Client Key")),
            server_key: hmac(&salted, b"Server Key"),
        }
    }
}

/// `key=value` attributes of a SCRAM message, in order.
fn attributes(msg: &str) -> Vec<(char, &str)> {
    msg.split(',')
        .filter_map(|part| {
            let mut chars = part.chars();
            let key = chars.next()?;
            let value = part.get(key.len_utf8()..)?.strip_prefix('=')?;
            Some((key, value))
        })
        .collect()
}

fn attribute<'a>(attrs: &[(char, &'a str)], key: char) -> Option<&'a str> {
    attrs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// The server's side after the client's first message.
#[derive(Debug, Clone)]
pub struct ServerFirst {
    pub user: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

/// Reads the client's first message: the user name (unescaped) and its nonce.
pub fn client_first(payload: &[u8]) -> Result<(String, String, String), ScramError> {
    let text = std::str::from_utf8(payload).map_err(|_| err("client-first is not UTF-8"))?;
    let bare = text
        .strip_prefix("n,,")
        .or_else(|| text.strip_prefix("y,,"))
        .ok_or_else(|| err("client-first must start with the gs2 header n,,"))?;
    let attrs = attributes(bare);
    let user = attribute(&attrs, 'n').ok_or_else(|| err("client-first has no user"))?;
    let nonce = attribute(&attrs, 'r').ok_or_else(|| err("client-first has no nonce"))?;
    if attribute(&attrs, 'm').is_some() || nonce.is_empty() {
        return Err(err("client-first has an extension or an empty nonce"));
    }
    let user = user.replace("=2C", ",").replace("=3D", "=");
    Ok((user, nonce.to_string(), bare.to_string()))
}

impl ServerFirst {
    /// The server's first message for `user`'s `cred`, adding `server_nonce` to the client's.
    pub fn new(
        user: String,
        client_nonce: &str,
        client_first_bare: String,
        server_nonce: &str,
        cred: &Credential,
    ) -> ServerFirst {
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!(
            "r={nonce},s={},i={}",
            STANDARD.encode(&cred.salt),
            cred.iterations
        );
        ServerFirst {
            user,
            client_first_bare,
            server_first,
            nonce,
        }
    }

    pub fn message(&self) -> &[u8] {
        self.server_first.as_bytes()
    }

    /// Checks the client's proof; the server's final message (`v=...`) when it holds.
    pub fn finish(&self, payload: &[u8], cred: &Credential) -> Result<Vec<u8>, ScramError> {
        let text = std::str::from_utf8(payload).map_err(|_| err("client-final is not UTF-8"))?;
        let (without_proof, proof) = text
            .rsplit_once(",p=")
            .ok_or_else(|| err("client-final has no proof"))?;
        let attrs = attributes(without_proof);
        if attribute(&attrs, 'c') != Some("biws") && attribute(&attrs, 'c') != Some("eSws") {
            return Err(err("channel binding is not supported"));
        }
        if attribute(&attrs, 'r') != Some(self.nonce.as_str()) {
            return Err(err("nonce mismatch"));
        }
        let proof = STANDARD
            .decode(proof)
            .map_err(|_| err("proof is not base64"))?;
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first_bare, self.server_first
        );
        let signature = hmac(&cred.stored_key, auth_message.as_bytes());
        if proof.len() != signature.len() {
            return Err(err("proof has the wrong length"));
        }
        let client_key: Vec<u8> = proof.iter().zip(signature).map(|(p, s)| p ^ s).collect();
        if sha256(&client_key) != cred.stored_key {
            return Err(err("wrong password"));
        }
        let server_signature = hmac(&cred.server_key, auth_message.as_bytes());
        Ok(format!("v={}", STANDARD.encode(server_signature)).into_bytes())
    }
}

/// The client's side of one conversation.
#[derive(Debug, Clone)]
pub struct Client {
    user: String,
    password: String,
    nonce: String,
    server_signature: Option<[u8; 32]>,
}

impl Client {
    /// A conversation for `user` with a client nonce (printable, no commas).
    pub fn new(user: &str, password: &str, nonce: &str) -> Client {
        Client {
            user: user.to_string(),
            password: password.to_string(),
            nonce: nonce.to_string(),
            server_signature: None,
        }
    }

    fn first_bare(&self) -> String {
        let user = self.user.replace('=', "=3D").replace(',', "=2C");
        format!("n={user},r={}", self.nonce)
    }

    /// The client's first message.
    pub fn first(&self) -> Vec<u8> {
        format!("n,,{}", self.first_bare()).into_bytes()
    }

    /// The client's final message, answering the server's first.
    pub fn last(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let text =
            std::str::from_utf8(server_first).map_err(|_| err("server-first is not UTF-8"))?;
        let attrs = attributes(text);
        let nonce = attribute(&attrs, 'r').ok_or_else(|| err("server-first has no nonce"))?;
        if !nonce.starts_with(&self.nonce) {
            return Err(err("the server's nonce does not extend ours"));
        }
        let salt = attribute(&attrs, 's')
            .and_then(|s| STANDARD.decode(s).ok())
            .ok_or_else(|| err("server-first has no salt"))?;
        let iterations: u32 = attribute(&attrs, 'i')
            .and_then(|i| i.parse().ok())
            .filter(|&i| i >= ITERATIONS)
            .ok_or_else(|| err("server-first has no iteration count of at least 4096"))?;
        let salted = salted_password(&self.password, &salt, iterations);
        let client_key = hmac(&salted, b"Client Key");
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{text},{without_proof}", self.first_bare());
        let signature = hmac(&sha256(&client_key), auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(signature)
            .map(|(k, s)| k ^ s)
            .collect();
        self.server_signature = Some(hmac(&hmac(&salted, b"Server Key"), auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes())
    }

    /// Whether the server's final message proves it knows the password.
    pub fn verify(&self, server_final: &[u8]) -> bool {
        let Ok(text) = std::str::from_utf8(server_final) else {
            return false;
        };
        let attrs = attributes(text);
        let v = attribute(&attrs, 'v').and_then(|v| STANDARD.decode(v).ok());
        matches!((v, self.server_signature), (Some(v), Some(s)) if v == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conversation of RFC 7677, section 3 (user "user", password "pencil").
    #[test]
    fn rfc_7677_example() {
        let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").expect("salt");
        let cred = Credential::new("pencil", &salt, 4096);
        let (user, nonce, bare) = client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").expect("first");
        assert_eq!(
            (user.as_str(), nonce.as_str()),
            ("user", "rOprNGfwEbeRWgbNEkqO")
        );
        let server = ServerFirst::new(user, &nonce, bare, "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0", &cred);
        assert_eq!(
            server.message(),
            b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let last = b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
        let fin = server.finish(last, &cred).expect("proof holds");
        assert_eq!(fin, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");

        let mut client = Client::new("user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(client.first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        assert_eq!(client.last(server.message()).expect("last"), last.to_vec());
        assert!(client.verify(&fin));
    }

    #[test]
    fn a_wrong_password_or_nonce_is_refused() {
        let cred = Credential::new("right", b"salty", ITERATIONS);
        let mut client = Client::new("u", "wrong", "abc");
        let (user, nonce, bare) = client_first(&client.first()).expect("first");
        let server = ServerFirst::new(user, &nonce, bare, "xyz", &cred);
        let last = client.last(server.message()).expect("last");
        assert_eq!(server.finish(&last, &cred), Err(err("wrong password")));
        let forged = String::from_utf8(last)
            .expect("utf8")
            .replace("r=abcxyz", "r=abcxyq");
        assert!(server.finish(forged.as_bytes(), &cred).is_err());
        assert!(client_first(b"p=tls-unique,,n=u,r=a").is_err());
        assert!(!client.verify(b"v=AAAA"));
    }
}
