//! The cheap read itself, with the official driver on staleguard's own connections: the
//! clients (one per upstream, made again when the settings they were made from change), the
//! view lookup, and the read.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, Bson, Document};
use mongodb::error::ErrorKind;
use mongodb::options::{ReadPreference, ReadPreferenceOptions, SelectionCriteria};
use mongodb::Client;
use tokio::sync::mpsc;

use crate::command::ReadPrefMode;
use crate::config::Config;
use crate::policy::{self, Confirmation, NsPolicy, Reason};
use crate::wire::ReplyStatus;

/// Cheap reads per question, sent at once: mongos picks the member of each, so a stale or
/// hung secondary beside a healthy one is met by at least one of three seven times in eight.
pub(super) const TRIES: usize = 3;

/// Views followed to their source at most this deep (a view on a view on ...).
const VIEW_DEPTH: usize = 4;

/// Time past `confirm_time` allowed for the reply and for a lookup before the answer is
/// "unknown" (mongos keeps its limit; this only bounds a silent one).
const SLACK: Duration = Duration::from_secs(1);

/// The driver clients, per upstream.
#[derive(Default)]
pub(super) struct Clients {
    built: Option<Built>,
    by_upstream: HashMap<String, Client>,
}

/// The settings the clients were made from.
#[derive(PartialEq)]
struct Built {
    upstreams: Vec<String>,
    tls: Option<(Option<std::path::PathBuf>, bool)>,
    creds: Option<(String, String)>,
    connect_timeout: Duration,
}

impl Clients {
    /// The client for `upstream` (made on first need; all made again when the settings
    /// change). `None`: not one of the configured upstreams, or the driver refused them.
    pub(super) fn get(&mut self, config: &Config, upstream: &str) -> Option<Client> {
        let want = Built {
            upstreams: config.upstreams.clone(),
            tls: config
                .upstream_tls
                .as_ref()
                .map(|t| (t.ca.clone(), t.insecure_skip_verify)),
            creds: config
                .confirm
                .credentials
                .as_ref()
                .map(|c| (c.username.clone(), c.auth_source.clone())),
            connect_timeout: config.connect_timeout,
        };
        if self.built.as_ref() != Some(&want) {
            self.by_upstream.clear();
            self.built = Some(want);
        }
        if let Some(c) = self.by_upstream.get(upstream) {
            return Some(c.clone());
        }
        if !config.upstreams.iter().any(|u| u == upstream) {
            return None;
        }
        let creds = config.confirm.credentials.as_ref();
        let made = crate::upstream::driver_client(
            config,
            upstream,
            "staleguard-confirm",
            config.connect_timeout,
            creds,
        );
        match made {
            Ok(c) => {
                self.by_upstream.insert(upstream.to_string(), c.clone());
                Some(c)
            }
            Err(e) => {
                tracing::error!(upstream = %upstream, error = %e, "confirming reads: cannot set up a driver client");
                None
            }
        }
    }
}

/// The mode of a cheap read: `secondary` when the read asked for it, else
/// `secondaryPreferred` (a read that only a secondary, or the primary when no secondary is
/// selectable, answers).
pub(super) fn mode(read: Option<ReadPrefMode>) -> ReadPreference {
    let options = Some(ReadPreferenceOptions::default());
    match read {
        Some(ReadPrefMode::Secondary) => ReadPreference::Secondary { options },
        _ => ReadPreference::SecondaryPreferred { options },
    }
}

/// One cheap read to run.
pub(super) struct Cheap {
    pub(super) client: Client,
    pub(super) ns: Arc<str>,
    /// The collection to read when known (a view's source, or the namespace itself).
    pub(super) source: Option<Arc<str>>,
    pub(super) mode: ReadPreference,
    pub(super) limit: Duration,
    pub(super) policy: Arc<NsPolicy>,
    /// Cheap reads sent at once ([`TRIES`], or `breaker::CLOSE_READS` for a close question).
    pub(super) tries: usize,
    /// A close question: FailedToSatisfyReadPreference (133) declines too (no secondary
    /// could be chosen), where a time limit's question calls it unknown.
    pub(super) close: bool,
}

/// What a cheap read came to.
pub(super) struct Done {
    pub(super) key: super::Key,
    pub(super) confirmation: Confirmation,
    /// The collection the namespace reads, when it was looked up.
    pub(super) learned: Option<Arc<str>>,
    /// The `result` label of `confirm_reads_total`.
    pub(super) label: &'static str,
}

impl Cheap {
    pub(super) async fn run(self, key: super::Key, done: mpsc::UnboundedSender<Done>) {
        let deadline = self.limit + SLACK;
        let (learned, source) = match &self.source {
            Some(s) => (None, Some(s.clone())),
            None => match tokio::time::timeout(deadline, self.lookup()).await {
                Ok(Some(s)) => (Some(s.clone()), Some(s)),
                _ => (None, None),
            },
        };
        let confirmation = match source {
            // Whether it is a view is not known: a read of it might run a view's pipeline.
            None => Confirmation::Unknown,
            Some(src) => {
                let reads =
                    (0..self.tries).map(|_| tokio::time::timeout(deadline, self.read(&src)));
                let answers = futures::future::join_all(reads).await;
                let judged = answers.into_iter().map(|a| match a {
                    Ok(status) => judge(&self.policy, status.as_ref(), self.close),
                    Err(_) => Confirmation::Unknown,
                });
                combined(judged)
            }
        };
        let label = match confirmation {
            Confirmation::Confirmed { .. } => "confirmed",
            Confirmation::Unconfirmed => "unconfirmed",
            Confirmation::Unknown => "unknown",
        };
        let _ = done.send(Done {
            key,
            confirmation,
            learned,
            label,
        });
    }

    /// The collection `ns` reads: itself, or the source of the view it is (followed at most
    /// [`VIEW_DEPTH`] views deep). `None`: the lookup failed (no rights, an error).
    async fn lookup(&self) -> Option<Arc<str>> {
        let (db, mut coll) = split(&self.ns);
        for _ in 0..VIEW_DEPTH {
            let cmd = doc! {"listCollections": 1, "filter": {"name": &coll}, "nameOnly": false};
            let criteria = SelectionCriteria::ReadPreference(self.mode.clone());
            let reply = self
                .client
                .database(db)
                .run_command(cmd)
                .selection_criteria(criteria)
                .await
                .ok()?;
            match view_source(&reply, &coll) {
                Some(src) => coll = src,
                None => return Some(Arc::from(format!("{db}.{coll}"))),
            }
        }
        None
    }

    /// The cheap read of `src`; `None` when no reply could be read.
    async fn read(&self, src: &str) -> Option<ReplyStatus> {
        let (db, coll) = split(src);
        let ms = self.limit.as_millis().clamp(1, i32::MAX as u128) as i64;
        let cmd = doc! {
            "find": coll,
            "filter": {},
            // Keeps nothing: every document comes back as `{}`.
            "projection": {"_id": 0, "staleguard_confirm_nothing": 1},
            "limit": 1,
            "batchSize": 1,
            "singleBatch": true,
            "maxTimeMS": ms,
        };
        let criteria = SelectionCriteria::ReadPreference(self.mode.clone());
        let r = self
            .client
            .database(db)
            .run_command(cmd)
            .selection_criteria(criteria)
            .await;
        match r {
            Ok(_) => Some(ReplyStatus {
                ok: true,
                code: None,
                code_name: None,
            }),
            Err(e) => match *e.kind {
                ErrorKind::Command(c) => Some(ReplyStatus {
                    ok: false,
                    code: Some(c.code),
                    code_name: Some(c.code_name),
                }),
                _ => None,
            },
        }
    }
}

/// One cheap read's reply: [`policy::confirmation`], and for a close question 133 (no
/// member matched: the read did not reach a secondary) declines.
fn judge(policy: &NsPolicy, status: Option<&ReplyStatus>, close: bool) -> Confirmation {
    match status {
        Some(s) if close && !s.ok && s.code == Some(NO_MEMBER) => Confirmation::Confirmed {
            code: NO_MEMBER,
            reason: Reason::of_code(NO_MEMBER),
        },
        _ => policy::confirmation(policy, status),
    }
}

/// FailedToSatisfyReadPreference.
const NO_MEMBER: i32 = 133;

/// What several cheap reads of one question say together: confirmed when any failed (mongos
/// picks a member for each, so together they reach a stale or hung one that a single read
/// would miss half the time beside a healthy one), unconfirmed when every one was answered,
/// otherwise unknown.
fn combined(judged: impl Iterator<Item = Confirmation>) -> Confirmation {
    let mut all_answered = true;
    for c in judged {
        match c {
            Confirmation::Confirmed { .. } => return c,
            Confirmation::Unconfirmed => {}
            Confirmation::Unknown => all_answered = false,
        }
    }
    match all_answered {
        true => Confirmation::Unconfirmed,
        false => Confirmation::Unknown,
    }
}

/// `db` and `coll` of `db.coll`.
fn split(ns: &str) -> (&str, String) {
    let (db, coll) = ns.split_once('.').unwrap_or((ns, ""));
    (db, coll.to_string())
}

/// The source collection of `coll` when a `listCollections` reply names it as a view. Only
/// the entry named `coll` is read (a server that ignored the filter lists others first).
fn view_source(reply: &Document, coll: &str) -> Option<String> {
    let batch = reply
        .get_document("cursor")
        .ok()?
        .get_array("firstBatch")
        .ok()?;
    let entry = batch.iter().find_map(|e| match e {
        Bson::Document(d) if d.get_str("name").ok() == Some(coll) => Some(d),
        _ => None,
    })?;
    if entry.get_str("type").ok()? != "view" {
        return None;
    }
    entry
        .get_document("options")
        .ok()?
        .get_str("viewOn")
        .ok()
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_is_followed_to_its_source() {
        let view = doc! {"cursor": {"firstBatch": [
            {"name": "v", "type": "view", "options": {"viewOn": "src", "pipeline": []}}
        ], "id": 0_i64}, "ok": 1};
        assert_eq!(view_source(&view, "v").as_deref(), Some("src"));
        assert_eq!(view_source(&view, "w"), None, "another name's entry");
        let coll = doc! {"cursor": {"firstBatch": [{"name": "c", "type": "collection"}], "id": 0_i64}, "ok": 1};
        assert_eq!(view_source(&coll, "c"), None);
        let none = doc! {"cursor": {"firstBatch": [], "id": 0_i64}, "ok": 1};
        assert_eq!(view_source(&none, "v"), None);
        // A server that ignored the filter: every collection, the view not first.
        let all = doc! {"cursor": {"firstBatch": [
            {"name": "a", "type": "view", "options": {"viewOn": "x", "pipeline": []}},
            {"name": "c", "type": "collection"},
            {"name": "v", "type": "view", "options": {"viewOn": "src", "pipeline": []}}
        ], "id": 0_i64}, "ok": 1};
        assert_eq!(view_source(&all, "v").as_deref(), Some("src"));
        assert_eq!(view_source(&all, "c"), None);
    }

    #[test]
    fn a_close_question_declines_on_133_where_a_time_limit_s_calls_it_unknown() {
        let p = NsPolicy::with_defaults("pay.t", crate::policy::Mode::Strict);
        let no_member = ReplyStatus {
            ok: false,
            code: Some(NO_MEMBER),
            code_name: None,
        };
        assert_eq!(judge(&p, Some(&no_member), false), Confirmation::Unknown);
        assert!(matches!(
            judge(&p, Some(&no_member), true),
            Confirmation::Confirmed { code: 133, .. }
        ));
        let ok = ReplyStatus {
            ok: true,
            code: None,
            code_name: None,
        };
        for close in [false, true] {
            assert_eq!(judge(&p, Some(&ok), close), Confirmation::Unconfirmed);
            assert_eq!(judge(&p, None, close), Confirmation::Unknown);
        }
        let stale = ReplyStatus {
            ok: false,
            code: Some(13388),
            code_name: None,
        };
        assert!(matches!(
            judge(&p, Some(&stale), true),
            Confirmation::Confirmed { code: 13388, .. }
        ));
    }

    #[test]
    fn any_failure_confirms_and_all_answers_unconfirm() {
        let failed = Confirmation::Confirmed {
            code: 50,
            reason: Reason::TimeLimit,
        };
        let (ok, unknown) = (Confirmation::Unconfirmed, Confirmation::Unknown);
        assert_eq!(combined([ok, failed, ok].into_iter()), failed);
        assert_eq!(combined([unknown, failed].into_iter()), failed);
        assert_eq!(combined([ok, ok, ok].into_iter()), ok);
        assert_eq!(combined([ok, unknown, ok].into_iter()), unknown);
    }

    #[test]
    fn the_cheap_read_keeps_secondary_and_prefers_secondaries_otherwise() {
        assert!(matches!(
            mode(Some(ReadPrefMode::Secondary)),
            ReadPreference::Secondary { .. }
        ));
        for m in [
            None,
            Some(ReadPrefMode::Nearest),
            Some(ReadPrefMode::PrimaryPreferred),
            Some(ReadPrefMode::SecondaryPreferred),
        ] {
            assert!(matches!(mode(m), ReadPreference::SecondaryPreferred { .. }));
        }
    }
}
