//! The deployment files: the Kubernetes manifests parse and say what the README promises
//! (probes, ConfigMap mounted as a folder, grace period from `shutdown_timeout`, requests,
//! a PodDisruptionBudget, a NetworkPolicy that opens the exposed admin port only to listed
//! peers), their embedded configs pass `staleguard check-config`; the systemd unit passes
//! `systemd-analyze verify`; `staleguard --version` names the commit.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_norway::Value as Yaml;

const BIN: &str = env!("CARGO_BIN_EXE_staleguard");

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every document of a multi-document YAML file.
fn documents(rel: &str) -> Vec<Yaml> {
    let text = read(rel);
    serde_norway::Deserializer::from_str(&text)
        .map(|d| {
            serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{rel}: not YAML: {e}"))
        })
        .collect()
}

fn by_kind<'a>(docs: &'a [Yaml], kind: &str) -> Vec<&'a Yaml> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn one<'a>(docs: &'a [Yaml], kind: &str) -> &'a Yaml {
    let found = by_kind(docs, kind);
    assert_eq!(found.len(), 1, "one {kind}");
    found[0]
}

fn seconds(d: &str) -> u64 {
    humantime::parse_duration(d)
        .unwrap_or_else(|e| panic!("{d}: {e}"))
        .as_secs()
}

/// The staleguard container of a pod spec: among the containers, or a native sidecar
/// (an init container with `restartPolicy: Always`).
fn staleguard_container(pod: &Yaml) -> &Yaml {
    let containers = pod["containers"].as_sequence().into_iter().flatten();
    let sidecars = pod["initContainers"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|c| c["restartPolicy"] == "Always");
    containers
        .chain(sidecars)
        .find(|c| c["name"] == "staleguard")
        .expect("a staleguard container")
}

/// Writes each ConfigMap's `staleguard.toml` to a folder and runs `check-config` on it;
/// returns the parsed TOML by ConfigMap name.
fn check_embedded_configs(docs: &[Yaml]) -> BTreeMap<String, toml::Table> {
    let mut out = BTreeMap::new();
    for cm in by_kind(docs, "ConfigMap") {
        let name = cm["metadata"]["name"].as_str().expect("name").to_string();
        let text = cm["data"]["staleguard.toml"]
            .as_str()
            .unwrap_or_else(|| panic!("ConfigMap {name} has no staleguard.toml"));
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("staleguard.toml");
        std::fs::write(&file, text).expect("write");
        let out_ = Command::new(BIN)
            .arg("check-config")
            .arg(&file)
            // The shared variant reads the probe password from a Secret through this, and
            // both the admin token.
            .env("STALEGUARD_PROBE_PASSWORD", "from-the-secret")
            .env("STALEGUARD_ADMIN_TOKEN", "from-the-admin-secret")
            .output()
            .expect("run check-config");
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&out_.stdout),
            String::from_utf8_lossy(&out_.stderr)
        );
        assert!(
            out_.status.success(),
            "ConfigMap {name}: check-config failed:\n{printed}"
        );
        out.insert(name, text.parse::<toml::Table>().expect("TOML"));
    }
    out
}

/// What both variants share: probes on the admin port, config from the ConfigMap mounted
/// as a folder (so the kubelet's swap reaches it), requests, a locked-down container, and a
/// grace period covering `shutdown_timeout` (plus `pre_stop` seconds).
fn check_pod(
    deployment: &Yaml,
    configs: &BTreeMap<String, toml::Table>,
    pre_stop: u64,
) -> toml::Table {
    let pod = &deployment["spec"]["template"]["spec"];
    let c = staleguard_container(pod);
    let admin_port = c["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .find(|p| p["name"] == "admin")
        .and_then(|p| p["containerPort"].as_u64())
        .expect("admin port");
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["port"], "admin", "{probe} on the admin port");
    }
    // The config file: a ConfigMap volume mounted as a folder, never through subPath.
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .filter_map(Yaml::as_str)
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--config")
        .expect("--config");
    let file = Path::new(args[at + 1]);
    let mount = c["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .find(|m| m["mountPath"].as_str().map(Path::new) == file.parent())
        .expect("the config folder is mounted");
    assert!(
        mount["subPath"].is_null(),
        "a subPath mount never sees ConfigMap updates"
    );
    let volume = pod["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("volume");
    let cm = volume["configMap"]["name"]
        .as_str()
        .expect("a ConfigMap volume");
    let config = configs
        .get(cm)
        .unwrap_or_else(|| panic!("ConfigMap {cm} in the file"));
    let file_name = file
        .file_name()
        .and_then(|n| n.to_str())
        .expect("file name");
    assert_eq!(file_name, "staleguard.toml");
    // The admin endpoint must be reachable from the kubelet (the pod's IP).
    let admin = config["admin"]["listen"].as_str().expect("[admin] listen");
    assert_eq!(admin, format!("0.0.0.0:{admin_port}"));
    // Graceful stop: the pod may take shutdown_timeout (plus the preStop pause), and not
    // much more.
    let shutdown = seconds(
        config["shutdown_timeout"]
            .as_str()
            .expect("shutdown_timeout"),
    );
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("terminationGracePeriodSeconds");
    assert!(
        grace > shutdown + pre_stop && grace <= shutdown + pre_stop + 10,
        "grace {grace}s for shutdown_timeout {shutdown}s + preStop {pre_stop}s"
    );
    let requests = &c["resources"]["requests"];
    assert!(requests["cpu"].as_str().is_some() && requests["memory"].as_str().is_some());
    assert!(c["resources"]["limits"]["memory"].as_str().is_some());
    let sc = &c["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    config.clone()
}

/// The admin port is reachable beyond loopback, so it is protected: its token comes from a
/// Secret of the same file through `token_env` (never written in the ConfigMap).
fn check_admin_token(docs: &[Yaml], deployment: &Yaml, config: &toml::Table) {
    let admin = config["admin"].as_table().expect("[admin]");
    assert!(
        admin.get("token").is_none() && admin.get("token_file").is_none(),
        "the token is not in the ConfigMap"
    );
    let var = admin
        .get("token_env")
        .and_then(|v| v.as_str())
        .expect("[admin] token_env");
    let c = staleguard_container(&deployment["spec"]["template"]["spec"]);
    let env = c["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"] == var)
        .unwrap_or_else(|| panic!("the container sets {var}"));
    let secret = &env["valueFrom"]["secretKeyRef"];
    let named = by_kind(docs, "Secret")
        .into_iter()
        .find(|s| s["metadata"]["name"] == secret["name"])
        .expect("the token's Secret is in the file");
    let key = secret["key"].as_str().expect("key");
    assert!(named["stringData"][key].as_str().is_some(), "{key}");
}

/// Issue 30, item 3: the admin port is exposed (`0.0.0.0`), so a NetworkPolicy selecting the
/// Deployment's pods lets only listed peers reach it: every ingress rule that admits the
/// admin port (naming it, or naming no port) names its peers. Every other port a container
/// of the pod declares is open to some rule (a policy selecting the pod governs them all),
/// unless `loopback` (staleguard's own port when it listens on the pod's loopback only).
fn check_admin_policy(docs: &[Yaml], deployment: &Yaml, loopback: &[&str]) {
    let np = one(docs, "NetworkPolicy");
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"], deployment["spec"]["selector"]["matchLabels"],
        "the NetworkPolicy selects the Deployment's pods"
    );
    assert!(
        np["spec"]["policyTypes"]
            .as_sequence()
            .is_some_and(|t| t.iter().any(|t| t == "Ingress")),
        "an Ingress policy"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    let c = staleguard_container(pod);
    let port_of = |c: &Yaml, name: &str| {
        c["ports"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
    };
    let admin_number = port_of(c, "admin").expect("admin port");
    let rules = np["spec"]["ingress"].as_sequence().expect("ingress rules");
    let admits = |r: &Yaml, name: &str, number: u64| match r["ports"].as_sequence() {
        None => true,
        Some(ps) => ps.iter().any(|p| p["port"] == name || p["port"] == number),
    };
    let admin_rules: Vec<&Yaml> = rules
        .iter()
        .filter(|r| admits(r, "admin", admin_number))
        .collect();
    assert!(
        !admin_rules.is_empty(),
        "the admin port is reachable by someone"
    );
    assert!(
        admin_rules
            .iter()
            .all(|r| r["from"].as_sequence().is_some_and(|f| !f.is_empty())),
        "the admin port is open only to listed peers: {admin_rules:?}"
    );
    let containers = pod["containers"]
        .as_sequence()
        .into_iter()
        .flatten()
        .chain(pod["initContainers"].as_sequence().into_iter().flatten());
    for container in containers {
        for p in container["ports"].as_sequence().into_iter().flatten() {
            let name = p["name"].as_str().unwrap_or_default();
            let number = p["containerPort"].as_u64().expect("containerPort");
            if name == "admin" || loopback.contains(&name) {
                continue;
            }
            assert!(
                rules.iter().any(|r| admits(r, name, number)),
                "port {name} ({number}) of container {:?} is open to no rule: the policy would cut it off",
                container["name"]
            );
        }
    }
}

#[test]
fn sidecar_manifest_parses_and_its_config_is_valid() {
    let docs = documents("config/kubernetes/sidecar.yaml");
    let configs = check_embedded_configs(&docs);
    let d = one(&docs, "Deployment");
    let config = check_pod(d, &configs, 0);
    check_admin_token(&docs, d, &config);
    // The application talks to staleguard over the pod's loopback.
    let listen = config["listen"].as_str().expect("listen");
    assert!(listen.starts_with("127.0.0.1:"), "{listen}");
    let pod = &d["spec"]["template"]["spec"];
    let app = pod["containers"]
        .as_sequence()
        .expect("containers")
        .iter()
        .find(|c| c["name"] != "staleguard")
        .expect("the application container");
    let uri = app["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "MONGODB_URI")
        .and_then(|e| e["value"].as_str())
        .expect("MONGODB_URI");
    assert!(uri.starts_with(&format!("mongodb://{listen}/")), "{uri}");
    // The admin port is exposed: a NetworkPolicy guards it (the mongodb port is loopback).
    check_admin_policy(&docs, d, &["mongodb"]);
    // A native sidecar: started before the application, stopped after it.
    assert!(pod["initContainers"]
        .as_sequence()
        .is_some_and(|s| s.iter().any(|c| c["name"] == "staleguard")));
}

#[test]
fn shared_manifest_parses_and_its_config_is_valid() {
    let docs = documents("config/kubernetes/shared.yaml");
    let configs = check_embedded_configs(&docs);
    let d = one(&docs, "Deployment");
    let c = staleguard_container(&d["spec"]["template"]["spec"]);
    let pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
        .as_sequence()
        .and_then(|cmd| cmd.last())
        .and_then(Yaml::as_str)
        .and_then(|s| s.parse::<u64>().ok())
        .expect("preStop sleep");
    let config = check_pod(d, &configs, pre_stop);
    check_admin_token(&docs, d, &config);
    // And a NetworkPolicy: the admin port only from the listed peers, the mongodb port
    // from anywhere.
    check_admin_policy(&docs, d, &[]);
    let np = one(&docs, "NetworkPolicy");
    let rules = np["spec"]["ingress"].as_sequence().expect("ingress rules");
    assert!(
        rules.iter().any(|r| r["from"].is_null()
            && r["ports"]
                .as_sequence()
                .is_some_and(|ps| ps.iter().any(|p| p["port"] == "mongodb"))),
        "applications reach the mongodb port"
    );
    assert!(config["listen"]
        .as_str()
        .is_some_and(|l| l.starts_with("0.0.0.0:")));
    assert!(d["spec"]["replicas"].as_u64().is_some_and(|r| r >= 2));
    // The Service selects the pods and sends the mongos port to staleguard's.
    let svc = one(&docs, "Service");
    let labels = &d["spec"]["template"]["metadata"]["labels"];
    for (k, v) in svc["spec"]["selector"].as_mapping().expect("selector") {
        assert_eq!(&labels[k.as_str().expect("key")], v);
    }
    let ports = svc["spec"]["ports"].as_sequence().expect("ports");
    assert!(ports
        .iter()
        .any(|p| p["port"] == 27017 && p["targetPort"] == "mongodb"));
    let pdb = one(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    assert!(pdb["spec"]["maxUnavailable"] == 1 || pdb["spec"]["minAvailable"].as_u64().is_some());
    // The probe password comes from the Secret, not the ConfigMap.
    let probe = config["stall_watch"]["probe"]
        .as_table()
        .expect("[stall_watch.probe]");
    assert!(probe.get("password").is_none() && probe.get("password_env").is_some());
    let env_from = c["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"] == probe["password_env"].as_str().unwrap_or_default())
        .expect("the password variable");
    let secret = &env_from["valueFrom"]["secretKeyRef"]["name"];
    assert!(
        by_kind(&docs, "Secret")
            .iter()
            .any(|s| &s["metadata"]["name"] == secret),
        "the password's Secret {secret:?} is in the file"
    );
}

#[test]
fn systemd_unit_verifies_and_reloads_with_sighup() {
    let unit = read("config/systemd/staleguard.service");
    for line in [
        "ExecReload=/bin/kill -HUP $MAINPID",
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "LimitNOFILE=65536",
    ] {
        assert!(unit.lines().any(|l| l == line), "unit lacks `{line}`");
    }
    // Every file the unit points at (Documentation=, the binary) is one its install steps
    // put there.
    let installs: Vec<&str> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("#   install "))
        .collect();
    for (key, path) in unit.lines().filter_map(|l| l.split_once('=')) {
        let Some(file) = path.strip_prefix("file:") else {
            continue;
        };
        assert!(
            installs
                .iter()
                .any(|i| i.split_whitespace().any(|w| w == file)),
            "{key}={path}: no install step puts a file there: {installs:?}"
        );
    }
    // The stop timeout covers shutdown_timeout's default (10 s).
    let stop = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .map(seconds)
        .expect("TimeoutStopSec");
    assert!(stop > 10, "{stop}");

    // `systemd-analyze verify` where systemd is installed (Debian's `systemd` package; it
    // needs no running systemd). It exits 0 on unknown keys but prints them: any output
    // at all fails. The binary path is the one built here.
    let Some(analyze) = which("systemd-analyze") else {
        println!("systemd-analyze not installed: unit checked by reading only");
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("staleguard.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/staleguard", BIN)).expect("write");
    let verify = |p: &Path| {
        let out = Command::new(&analyze)
            .arg("verify")
            .arg(p)
            .env("SYSTEMD_LOG_COLOR", "0")
            .output()
            .expect("run systemd-analyze");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = verify(&path);
    assert!(
        ok && text.trim().is_empty(),
        "systemd-analyze verify:\n{text}"
    );
    // The check has teeth: a misspelt key is reported.
    let bad = dir.path().join("bad.service");
    std::fs::write(
        &bad,
        unit.replace("/usr/local/bin/staleguard", BIN)
            .replace("ProtectSystem=strict", "ProtectSystm=strict"),
    )
    .expect("write");
    let (_, text) = verify(&bad);
    assert!(text.contains("ProtectSystm"), "{text}");
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[test]
fn version_names_the_commit() {
    let out = Command::new(BIN)
        .arg("--version")
        .output()
        .expect("staleguard --version");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let want_version = format!("staleguard {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(text.starts_with(&want_version), "{text}");
    let commit = text
        .strip_prefix(&want_version)
        .and_then(|r| r.strip_suffix(')'))
        .expect("(commit ...)");
    // Built from a git checkout here: the commit is HEAD's (or the one CI passed in).
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match (std::env::var("STALEGUARD_GIT_COMMIT").ok(), head) {
        (Some(given), _) if !given.is_empty() => assert_eq!(commit, given),
        (_, Some(head)) => assert_eq!(commit, head, "rebuilt when HEAD moves"),
        (_, None) => assert_eq!(commit, "unknown"),
    }
}

#[test]
fn containerfile_builds_the_release_binary_and_runs_it_unprivileged() {
    let c = read("Containerfile");
    let from: Vec<&str> = c.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(from.len(), 2, "multi-stage: {from:?}");
    assert!(c.contains("cargo build --release --locked --no-default-features"));
    let user = c
        .lines()
        .filter_map(|l| l.strip_prefix("USER "))
        .next_back()
        .expect("USER");
    assert!(!user.starts_with('0') && user != "root", "runs as {user}");
    assert!(c.contains("/etc/staleguard"), "config mounted there");
    // Everything the build needs is copied in (cargo reads every target the manifest
    // names: the benches, and the tests with required-features), and `.dockerignore` lets
    // it into the build context.
    let ignore = read(".dockerignore");
    let allowed: Vec<&str> = ignore
        .lines()
        .filter_map(|l| l.trim().strip_prefix('!'))
        .collect();
    for path in [
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "src",
        "crates",
        "benches",
        "tests",
    ] {
        assert!(
            c.lines().any(|l| l.starts_with("COPY") && l.contains(path)),
            "{path} is not copied"
        );
        assert!(repo(path).exists());
        assert!(allowed.contains(&path), ".dockerignore keeps {path} out");
    }
    let manifest: toml::Table = read("Cargo.toml").parse().expect("Cargo.toml");
    for t in manifest["test"].as_array().expect("[[test]]") {
        let name = t["name"].as_str().expect("name");
        assert!(
            repo(&format!("tests/{name}.rs")).exists(),
            "tests/{name}.rs"
        );
    }
}

/// The build context is an allowlist (`*`, then the files the build copies): no `target/`
/// (gigabytes), no `.git`.
#[test]
fn dockerignore_keeps_the_build_context_to_the_sources() {
    let ignore = read(".dockerignore");
    let rules: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        rules.first(),
        Some(&"*"),
        "everything excluded first: {rules:?}"
    );
    for kept in rules.iter().filter_map(|r| r.strip_prefix('!')) {
        assert!(
            !kept.starts_with("target") && !kept.starts_with(".git") && kept != "*",
            "{kept} let back in"
        );
        assert!(repo(kept).exists(), "{kept} does not exist");
    }
    assert!(rules.contains(&"**/target"), "{rules:?}");
}

/// Every `FROM` names its image by digest (with the tag beside it, for people).
#[test]
fn container_base_images_are_pinned_by_digest() {
    let c = read("Containerfile");
    let from: Vec<&str> = c.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(from.len(), 2, "{from:?}");
    for l in from {
        let image = l.split_whitespace().nth(1).expect("image");
        let (name, digest) = image
            .split_once("@sha256:")
            .unwrap_or_else(|| panic!("not pinned: {l}"));
        assert!(name.contains(':'), "the tag beside the digest: {l}");
        assert!(
            digest.len() == 64
                && digest
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
            "{l}"
        );
    }
}

/// The config baked into the image: reachable from outside the container (0.0.0.0), the
/// admin endpoint behind a token from the environment, valid for `check-config`; without
/// the token the proxy does not start.
#[test]
fn the_container_config_listens_on_all_interfaces_behind_an_admin_token() {
    let c = read("Containerfile");
    assert!(
        c.lines()
            .any(|l| l == "COPY config/container.toml /etc/staleguard/staleguard.toml"),
        "the container config is baked in"
    );
    assert!(c.contains("CMD [\"run\", \"--config\", \"/etc/staleguard/staleguard.toml\"]"));
    let text = read("config/container.toml");
    let t: toml::Table = text.parse().expect("TOML");
    assert_eq!(t["listen"].as_str(), Some("0.0.0.0:27018"));
    assert_eq!(t["admin"]["listen"].as_str(), Some("0.0.0.0:9187"));
    assert_eq!(
        t["admin"]["token_env"].as_str(),
        Some("STALEGUARD_ADMIN_TOKEN")
    );
    assert!(t["admin"].get("token").is_none(), "no token in the file");
    let check = |token: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.arg("check-config").arg(repo("config/container.toml"));
        cmd.env_remove("STALEGUARD_ADMIN_TOKEN");
        if let Some(t) = token {
            cmd.env("STALEGUARD_ADMIN_TOKEN", t);
        }
        let out = cmd.output().expect("run check-config");
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), printed)
    };
    let (code, printed) = check(Some("s3cret-admin-token"));
    assert_eq!(code, Some(0), "{printed}");
    assert!(
        printed.contains("admin.token               set"),
        "{printed}"
    );
    assert!(!printed.contains("warning"), "{printed}");
    let (code, printed) = check(None);
    assert_eq!(code, Some(2), "{printed}");
    assert!(
        printed.contains("admin.token_env") && printed.contains("STALEGUARD_ADMIN_TOKEN"),
        "{printed}"
    );
}
