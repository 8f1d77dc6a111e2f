//! Authentication, on when `SimConfig::users` names anyone: a connection must then
//! authenticate before any command but the handshake (`hello`, `isMaster`), `ping`,
//! `buildInfo` and the SASL conversation itself, or it gets Unauthorized (13), as from a
//! server started with `--auth`. SCRAM-SHA-256 only (`scram.rs`), for users of the `admin`
//! database: through `saslStart`/`saslContinue`, with or without `skipEmptyExchange`, or
//! started speculatively in the handshake (`speculativeAuthenticate`, answered in the hello
//! reply) and finished with `saslContinue`, as drivers do. The conversation ends with a
//! reply of `done: true` and `ok: 1`; a failed step is AuthenticationFailed (18).

use std::collections::HashMap;

use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document};

use super::model::lock;
use super::scram::{self, Credential, ServerFirst};
use super::{Cluster, SimError};

const MECHANISM: &str = "SCRAM-SHA-256";
/// The database users live on.
const USER_DB: &str = "admin";

/// The users the cluster knows, by name (empty: auth is off).
#[derive(Debug, Default)]
pub struct Users(HashMap<String, Credential>);

impl Users {
    /// Credentials for `(name, password)` pairs; each user's salt is derived from its
    /// name, so a driver's cache of salted passwords is used across its connections.
    pub fn new(users: &[(String, String)]) -> Users {
        Users(
            users
                .iter()
                .map(|(name, password)| {
                    let salt = format!("staleguard-sim:{name}");
                    let cred = Credential::new(password, salt.as_bytes(), scram::ITERATIONS);
                    (name.clone(), cred)
                })
                .collect(),
        )
    }

    pub fn on(&self) -> bool {
        !self.0.is_empty()
    }
}

/// Where one connection stands.
#[derive(Debug, Default)]
pub struct ConnAuth {
    user: Option<String>,
    conversation: Option<Conversation>,
}

#[derive(Debug)]
struct Conversation {
    id: i32,
    skip_empty: bool,
    step: Step,
}

#[derive(Debug)]
enum Step {
    /// The server's first message has gone; the client's proof is next.
    Proof(ServerFirst),
    /// The proof held; the client's empty message ends it (no `skipEmptyExchange`).
    Empty(String),
}

impl ConnAuth {
    pub fn authenticated(&self) -> bool {
        self.user.is_some()
    }
}

/// Whether command `name` needs an authenticated connection when auth is on.
pub fn needs_auth(name: &str) -> bool {
    !matches!(
        name,
        "hello"
            | "isMaster"
            | "ismaster"
            | "ping"
            | "buildInfo"
            | "buildinfo"
            | "saslStart"
            | "saslContinue"
    )
}

/// The server's reply to a command refused for want of authentication.
pub fn unauthorized(name: &str) -> SimError {
    SimError::new(
        13,
        "Unauthorized",
        format!("command {name} requires authentication"),
    )
}

fn failed() -> SimError {
    SimError::new(18, "AuthenticationFailed", "Authentication failed.")
}

fn binary(bytes: Vec<u8>) -> Binary {
    Binary {
        subtype: BinarySubtype::Generic,
        bytes,
    }
}

fn payload(body: &Document) -> Result<Vec<u8>, SimError> {
    match body.get("payload") {
        Some(Bson::Binary(b)) => Ok(b.bytes.clone()),
        Some(Bson::String(s)) => Ok(s.clone().into_bytes()),
        _ => Err(SimError::bad_value("payload must be BinData or a string")),
    }
}

/// `saslStart` (or a handshake's `speculativeAuthenticate`, whose `db` is given) on `db`.
pub fn start(
    cluster: &Cluster,
    conn: &mut ConnAuth,
    db: &str,
    body: &Document,
) -> Result<Document, SimError> {
    conn.conversation = None;
    let mechanism = body.get_str("mechanism").unwrap_or_default();
    if mechanism != MECHANISM {
        return Err(SimError::new(
            334,
            "MechanismUnavailable",
            format!(
                "Received authentication for mechanism {mechanism} which is unknown or not enabled"
            ),
        ));
    }
    let (user, nonce, bare) = scram::client_first(&payload(body)?).map_err(|_| failed())?;
    let users = &cluster.users.0;
    let cred = users
        .get(&user)
        .filter(|_| db == USER_DB)
        .ok_or_else(failed)?;
    let server_nonce = {
        let mut st = lock(&cluster.state);
        format!("{:016x}{:016x}", st.rng.next(), st.rng.next())
    };
    let first = ServerFirst::new(user, &nonce, bare, &server_nonce, cred);
    let reply = doc! {
        "conversationId": 1,
        "done": false,
        "payload": binary(first.message().to_vec()),
        "ok": 1.0,
    };
    let skip_empty = body
        .get_document("options")
        .and_then(|o| o.get_bool("skipEmptyExchange"))
        .unwrap_or(false);
    conn.conversation = Some(Conversation {
        id: 1,
        skip_empty,
        step: Step::Proof(first),
    });
    Ok(reply)
}

/// `saslContinue`.
pub fn continue_(
    cluster: &Cluster,
    conn: &mut ConnAuth,
    body: &Document,
) -> Result<Document, SimError> {
    let id = body.get("conversationId").and_then(super::routing::number);
    let Some(conv) = conn.conversation.take() else {
        return Err(SimError::new(
            17,
            "ProtocolError",
            "No SASL session state found",
        ));
    };
    if id != Some(f64::from(conv.id)) {
        return Err(SimError::new(
            17,
            "ProtocolError",
            "Mismatched SASL conversation id",
        ));
    }
    let data = payload(body)?;
    let (done, reply, user) = match conv.step {
        Step::Proof(first) => {
            let users = &cluster.users.0;
            let cred = users.get(&first.user).ok_or_else(failed)?;
            let last = first.finish(&data, cred).map_err(|_| failed())?;
            if conv.skip_empty {
                (true, last, first.user)
            } else {
                conn.conversation = Some(Conversation {
                    step: Step::Empty(first.user),
                    ..conv
                });
                return Ok(
                    doc! { "conversationId": conv.id, "done": false, "payload": binary(last), "ok": 1.0 },
                );
            }
        }
        Step::Empty(user) if data.is_empty() => (true, Vec::new(), user),
        Step::Empty(_) => return Err(failed()),
    };
    conn.user = Some(user);
    Ok(doc! { "conversationId": conv.id, "done": done, "payload": binary(reply), "ok": 1.0 })
}

/// The handshake's auth fields: `saslSupportedMechs` for a known `"admin.<user>"`, and the
/// first step of a `speculativeAuthenticate` (left out when it fails: the driver then
/// authenticates the usual way and meets the error there).
pub fn hello_fields(cluster: &Cluster, conn: &mut ConnAuth, request: &Document) -> Document {
    let mut out = Document::new();
    if let Ok(who) = request.get_str("saslSupportedMechs") {
        let known = who
            .split_once('.')
            .is_some_and(|(db, user)| db == USER_DB && cluster.users.0.contains_key(user));
        if known {
            out.insert("saslSupportedMechs", vec![MECHANISM]);
        }
    }
    if let Ok(spec) = request.get_document("speculativeAuthenticate") {
        let db = spec.get_str("db").unwrap_or(USER_DB).to_string();
        if let Ok(mut reply) = start(cluster, conn, &db, spec) {
            reply.remove("ok");
            out.insert("speculativeAuthenticate", reply);
        }
    }
    out
}
