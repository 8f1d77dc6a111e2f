//! Issue 21, item 6: a client cannot forge log lines. A `find` on a collection whose name
//! holds a newline, through the real binary, with the default pretty log format and with
//! JSON: no line of the log starts with the text after the newline, and the namespace is
//! there, escaped.

use crate::support;

use bson::rawdoc;
use support::bin::Binary;
use support::mongos::{FakeMongos, Hooked};
use support::raw::{self, RawClient};

const FORGED: &str = "FAKE LOG LINE";

fn config(fake: &FakeMongos) -> String {
    format!(
        r#"listen = "127.0.0.1:0"
upstreams = ["{}"]
health_interval = "off"

[admin]
enabled = false

[[namespaces]]
pattern = "shop.*"
mode = "fallback"
"#,
        fake.addr()
    )
}

/// Sends a secondary `find` on `shop.<coll>` (mongos answers StaleConfig, which is logged
/// with the namespace at info: the trigger error and the retry) and returns the log once
/// the retry is in it.
async fn log_of_find(format: &str, coll: &str) -> String {
    let fake = FakeMongos::start().await;
    fake.set_hook(|body| {
        let stale = body.get_str("find").is_ok() && body.get_document("readConcern").is_err();
        stale.then(|| Hooked::error(13388, "StaleConfig", "shard version not ok"))
    });
    let proxy = Binary::start(&config(&fake), &["--log-format", format]);
    let addr = proxy.listen().await;
    let mut c = RawClient::connect(addr).await;
    let find = raw::msg(
        1,
        0,
        &rawdoc! {
            "find": coll,
            "filter": {},
            "$readPreference": {"mode": "secondary"},
            "$db": "shop",
        },
    );
    c.roundtrip(&find).await;
    proxy.wait_log("resending with readConcern available").await;
    proxy.log()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_name_with_a_newline_forges_no_line_in_the_pretty_log() {
    let coll = format!("x\n{FORGED}\r\u{1b}[2K");
    let log = log_of_find("pretty", &coll).await;
    let forged: Vec<&str> = log.lines().filter(|l| l.starts_with(FORGED)).collect();
    assert!(forged.is_empty(), "forged lines {forged:?} in:\n{log}");
    assert!(!log.contains('\u{1b}'), "no raw escape sequence:\n{log}");
    let trigger = log
        .lines()
        .find(|l| l.contains("trigger error"))
        .unwrap_or_else(|| panic!("a trigger error line in:\n{log}"));
    assert!(
        trigger.contains(&format!("ns=shop.x\\n{FORGED}\\r\\u{{1b}}[2K")),
        "{trigger}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_name_with_a_newline_forges_no_line_in_the_json_log() {
    let coll = format!("x\n{FORGED}");
    let log = log_of_find("json", &coll).await;
    assert!(!log.lines().any(|l| l.starts_with(FORGED)), "{log}");
    let mut seen = false;
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["fields"]["message"] == "trigger error" {
            assert_eq!(v["fields"]["ns"], format!("shop.x\n{FORGED}"), "{line}");
            seen = true;
        }
    }
    assert!(seen, "a trigger error event in:\n{log}");
}
