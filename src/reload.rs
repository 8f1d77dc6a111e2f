//! Hot reload: read and validate the config file again, then swap it in atomically. An
//! invalid file changes nothing. Triggered by SIGHUP (the binary), a change of the file
//! (a watcher on its folder: applied once the file is whole, closed by its writer or
//! renamed into place, and reading the same twice) or `Running::reload` (the server's API).
//!
//! What survives a reload: breakers whose namespace is still governed by the same pattern
//! with the same mode; upstreams still listed (with their health). Settings that need a
//! restart (`listen`, `layout`, `[admin] listen`, turning `[tls]` on or off, `[fleet]` but
//! its budgets) keep their old
//! values, with a warning.

use std::cell::RefCell;
use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};
use crate::events::Event;
use crate::handles::ReloadHandles;
use crate::state::ReloadStatus;

/// How long the file must stay quiet before a change is reloaded (editors write in steps).
pub const DEBOUNCE: Duration = Duration::from_millis(200);

/// Reloads the file the live config came from, as it reads now. `trigger` names what asked
/// (for logs).
pub fn reload(shared: &ReloadHandles, trigger: &str) -> Result<(), Vec<ConfigError>> {
    let old = shared.config.load_full();
    let result = Config::load(&old.source);
    apply(shared, trigger, old, result)
}

/// Applies `text`, the file's content as the watcher read it (twice, the same): what is
/// validated and swapped in is exactly what was checked to be complete, not a third read.
fn reload_text(shared: &ReloadHandles, trigger: &str, text: &[u8]) -> Result<(), Vec<ConfigError>> {
    let old = shared.config.load_full();
    let result = match std::str::from_utf8(text) {
        Ok(t) => Config::parse(t, &old.source),
        Err(e) => Err(vec![ConfigError {
            file: old.source.display().to_string(),
            line: 0,
            key: "file".to_string(),
            message: format!("cannot read config file: not UTF-8 ({e})"),
        }]),
    };
    apply(shared, trigger, old, result)
}

fn apply(
    shared: &ReloadHandles,
    trigger: &str,
    old: Arc<Config>,
    result: Result<Config, Vec<ConfigError>>,
) -> Result<(), Vec<ConfigError>> {
    let status = |ok, messages| ReloadStatus {
        ok,
        trigger: trigger.to_string(),
        at: SystemTime::now(),
        messages,
    };
    let mut new = match result {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors {
                tracing::error!(file = %e.file, line = e.line, key = %e.key, error = %e.message, trigger, "reload rejected, config unchanged");
            }
            shared.metrics.reload(false);
            let messages: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            let file = old.source.display().to_string();
            shared
                .metrics
                .recent
                .events
                .record(Event::reload(false, trigger, &file, &messages));
            shared.runtime.set_reload_status(status(false, messages));
            return Err(errors);
        }
    };
    let warnings = keep_restart_only(&old, &mut new);
    for w in &warnings {
        tracing::warn!(trigger, "{w}");
    }
    if let Some(t) = new.upstream_tls.as_ref().filter(|t| t.insecure_skip_verify) {
        tracing::warn!(server_name = ?t.server_name, "upstream_tls.insecure_skip_verify = true: mongos certificates are NOT verified");
    }
    retain_breakers(shared, &old, &new);
    // The breaker map's shares follow the new patterns (exact ones reserved at once).
    shared.breakers.set_patterns(&new.policy, new.breaker_share);
    for gone in shared.upstreams.set(&new.upstreams) {
        shared.metrics.upstream_removed(&gone);
    }
    let entries = new.policy.entries().len();
    // Sessions pick it up from their next request; the health checker reconnects with the
    // new settings (e.g. `[upstream_tls]`) from its next round.
    crate::state::publish_limits(&shared.metrics, &new, crate::breaker::DEFAULT_MAX_BREAKERS);
    shared.config.swap(Arc::new(new));
    shared.metrics.reload(true);
    let file = old.source.display().to_string();
    shared
        .metrics
        .recent
        .events
        .record(Event::reload(true, trigger, &file, &warnings));
    tracing::info!(trigger, file = %old.source.display(), entries, "config reloaded");
    shared.runtime.set_reload_status(status(true, warnings));
    Ok(())
}

/// Puts back the settings that need a restart; returns one warning per change ignored.
fn keep_restart_only(old: &Config, new: &mut Config) -> Vec<String> {
    let mut w = Vec::new();
    if new.listen != old.listen {
        w.push(format!(
            "listen: changed to `{}` in the file; needs a restart, still listening on `{}`",
            new.listen, old.listen
        ));
        new.listen.clone_from(&old.listen);
    }
    if new.layout != old.layout {
        w.push(format!(
            "layout: changed to `{}` in the file; needs a restart, still `{}`",
            new.layout.name(),
            old.layout.name()
        ));
        new.layout = old.layout;
    }
    if new.admin_listen != old.admin_listen {
        let show = |a: &Option<String>| a.clone().unwrap_or_else(|| "off".to_string());
        w.push(format!(
            "admin.listen: changed to `{}` in the file; needs a restart, still `{}`",
            show(&new.admin_listen),
            show(&old.admin_listen)
        ));
        new.admin_listen.clone_from(&old.admin_listen);
    }
    if new.tls.is_some() != old.tls.is_some() {
        let on = |b: bool| if b { "on" } else { "off" };
        w.push(format!(
            "tls: turned {} in the file; needs a restart, client TLS stays {}",
            on(new.tls.is_some()),
            on(old.tls.is_some())
        ));
        new.tls.clone_from(&old.tls);
    }
    w.extend(crate::config::FleetConfig::keep_on_reload(
        &old.fleet,
        &mut new.fleet,
    ));
    w
}

/// Drops the breakers whose namespace changed pattern or mode (or lost its policy).
fn retain_breakers(shared: &ReloadHandles, old: &Config, new: &Config) {
    let dropped = RefCell::new(Vec::new());
    shared.breakers.retain(|ns| {
        let Some((db, coll)) = ns.split_once('.') else {
            return false;
        };
        let before = old.policy.lookup(db, coll);
        let after = new.policy.lookup(db, coll);
        let same = matches!((before, after), (Some(a), Some(b)) if a.pattern == b.pattern && a.mode == b.mode);
        if !same {
            dropped.borrow_mut().push(ns.to_string());
        }
        same
    });
    for ns in dropped.into_inner() {
        tracing::info!(ns = %ns, "breaker reset: its policy changed");
        shared.metrics.breaker_dropped(&ns);
    }
}

/// Watches the config file's folder and reloads when the file's content changes, once it
/// is complete.
///
/// Besides writes to the file itself this follows a file replaced by a rename (editors that
/// write a new file and move it over) and a symlink swapped under the path: Kubernetes
/// mounts a ConfigMap as `config.toml -> ..data/config.toml` with `..data -> ..<timestamp>`,
/// and an update renames a new `..data` over the old one, so no event ever names
/// `config.toml`. Events on any link of that chain in the folder count (see [`watched_names`]).
///
/// A file written in place is applied only once its writer has closed it (inotify's
/// close-write) and it reads the same twice: a write in progress, however long its pauses,
/// is never applied half-written (see [`Change`]).
pub fn watch(shared: Arc<ReloadHandles>, stop: CancellationToken) -> Result<(), String> {
    let path = shared.config.load().source.clone();
    if path.file_name().is_none() {
        return Err(format!("{}: not a file name", path.display()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // What the file holds now, read before anything can change it: a change made before
    // the debounce task first runs must still count as one.
    let last = read(&path);
    let (tx, rx) = mpsc::unbounded_channel();
    let watched = path.clone();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let Ok(ev) = res else {
            let _ = tx.send(Change::Lost);
            return;
        };
        if ev.need_rescan() {
            // The kernel's queue overflowed: events were lost (a close among them, maybe).
            let _ = tx.send(Change::Lost);
            return;
        }
        // Read afresh per event: a swap changes where the links point.
        let names = watched_names(&watched);
        let ours = |p: &PathBuf| p.file_name().is_some_and(|n| names.iter().any(|w| w == n));
        let Some(p) = ev.paths.iter().find(|p| ours(p)) else {
            return;
        };
        if let Some(change) = Change::of(&ev.kind, p) {
            let _ = tx.send(change);
        }
    })
    .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|e| format!("cannot watch {}: {e}", dir.display()))?;
    tracing::info!(file = %path.display(), "watching the config file for changes");
    tokio::spawn(debounce(shared, stop, rx, watcher, path, last));
    Ok(())
}

/// What an event on the config file (or a link to it) says about its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// A writer has the file open and is changing it (a write, a truncation, a new regular
    /// file): wait for [`Change::Complete`].
    Writing,
    /// A whole content is in place: a writer closed the file (close-write), a file or a
    /// link was renamed over the name, a symlink was made.
    Complete,
    /// Something else (attributes, a removal): look again after the quiet period.
    Unknown,
    /// Events were lost (the kernel's queue overflowed): whether a writer is at work is not
    /// known any more; the content is applied once it reads the same twice after a quiet
    /// period.
    Lost,
}

impl Change {
    fn of(kind: &EventKind, path: &Path) -> Option<Change> {
        use notify::event::{AccessKind, AccessMode, ModifyKind};
        Some(match kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => Change::Complete,
            // Opens and reads (ours included) change nothing.
            EventKind::Access(_) => return None,
            EventKind::Modify(ModifyKind::Name(_)) => Change::Complete,
            EventKind::Modify(ModifyKind::Metadata(_)) => Change::Unknown,
            EventKind::Modify(_) => Change::Writing,
            EventKind::Create(_) => {
                let link =
                    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
                if link {
                    Change::Complete
                } else {
                    Change::Writing
                }
            }
            EventKind::Remove(_) | EventKind::Any | EventKind::Other => Change::Unknown,
        })
    }
}

/// The names in the config file's folder whose change can change what the path reads: the
/// file's own name, and the first component of every relative symlink target met while
/// resolving it (`..data` for a ConfigMap volume, whose swap is a rename over `..data`).
/// Absolute links are not followed: their folders are not watched.
pub fn watched_names(path: &Path) -> Vec<OsString> {
    let mut names: Vec<OsString> = path
        .file_name()
        .map(OsStr::to_os_string)
        .into_iter()
        .collect();
    let dir = path.parent().unwrap_or(Path::new(""));
    let mut at = path.to_path_buf();
    // Bounded like the kernel's own symlink limit.
    for _ in 0..MAX_LINKS {
        // Only a link in the folder itself names something the watch sees.
        if at.parent() != Some(dir) {
            break;
        }
        let Ok(target) = std::fs::read_link(&at) else {
            break;
        };
        if target.is_absolute() {
            break;
        }
        match target.components().next() {
            Some(Component::Normal(first)) => {
                if !names.iter().any(|n| n == first) {
                    names.push(first.to_os_string());
                }
            }
            _ => break,
        }
        at = dir.join(&target);
    }
    names
}

/// Symlink hops followed by [`watched_names`].
const MAX_LINKS: usize = 8;

/// Whether the platform's watcher reports close-write (Linux's inotify does): then a file
/// being written is waited for until its writer closes it, however long it pauses.
/// Elsewhere a write is taken as finished after [`WRITE_QUIET`] without events.
const CLOSE_EVENTS: bool = cfg!(target_os = "linux");

/// Where close-write is not reported: how long a file being written must stay quiet.
pub const WRITE_QUIET: Duration = Duration::from_secs(2);

/// The pause between the two reads that must agree before a content is applied.
const REREAD: Duration = Duration::from_millis(50);

async fn debounce(
    shared: Arc<ReloadHandles>,
    stop: CancellationToken,
    mut rx: mpsc::UnboundedReceiver<Change>,
    watcher: notify::RecommendedWatcher,
    path: PathBuf,
    mut last: Option<Vec<u8>>,
) {
    // Kept alive for as long as this task runs.
    let _watcher = watcher;
    // A writer changed the file and has not closed it since.
    let mut writing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            ev = rx.recv() => match ev {
                Some(c) => note(&mut writing, c),
                None => return,
            },
        }
        // Wait for the events to settle: a quiet period that every event restarts, and
        // while a writer has the file open, its close. Then the content, read twice alike.
        let mut told = false;
        let content = loop {
            let quiet = if writing { WRITE_QUIET } else { DEBOUNCE };
            tokio::select! {
                _ = stop.cancelled() => return,
                ev = rx.recv() => match ev {
                    Some(c) => note(&mut writing, c),
                    None => return,
                },
                _ = tokio::time::sleep(quiet) => {
                    if writing && CLOSE_EVENTS {
                        if !std::mem::replace(&mut told, true) {
                            tracing::debug!(file = %path.display(), "config file still open for writing; waiting for its close");
                        }
                        continue;
                    }
                    // Read twice: a content that changes between the reads is not whole.
                    let first = read(&path);
                    tokio::time::sleep(REREAD).await;
                    let mut moved = false;
                    while let Ok(c) = rx.try_recv() {
                        note(&mut writing, c);
                        moved = true;
                    }
                    let second = read(&path);
                    if moved || first != second {
                        continue;
                    }
                    writing = false;
                    break second;
                }
            }
        };
        let Some(now) = content else {
            // Gone (a removal, or a rename still to come): nothing to apply.
            continue;
        };
        if last.as_ref() == Some(&now) {
            continue;
        }
        let _ = reload_text(&shared, "file", &now);
        last = Some(now);
    }
}

/// Folds one event into whether a writer is at work.
fn note(writing: &mut bool, change: Change) {
    match change {
        Change::Writing => *writing = true,
        Change::Complete | Change::Lost => *writing = false,
        Change::Unknown => {}
    }
}

fn read(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, ModifyKind, RenameMode};

    #[test]
    fn only_a_close_or_a_rename_completes_a_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("f.toml");
        std::fs::write(&file, "").expect("file");
        let link = dir.path().join("l.toml");
        std::os::unix::fs::symlink("f.toml", &link).expect("link");
        let of = |k: EventKind, p: &Path| Change::of(&k, p);
        let data = EventKind::Modify(ModifyKind::Data(DataChange::Any));
        let close = EventKind::Access(AccessKind::Close(AccessMode::Write));
        let renamed = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        let created = EventKind::Create(CreateKind::File);
        assert_eq!(of(data, &file), Some(Change::Writing));
        assert_eq!(of(created, &file), Some(Change::Writing));
        assert_eq!(of(created, &link), Some(Change::Complete));
        assert_eq!(of(close, &file), Some(Change::Complete));
        assert_eq!(of(renamed, &file), Some(Change::Complete));
        let opened = EventKind::Access(AccessKind::Open(AccessMode::Any));
        assert_eq!(of(opened, &file), None);
        let read = EventKind::Access(AccessKind::Close(AccessMode::Read));
        assert_eq!(of(read, &file), None);

        // A write stays in progress until its close, whatever comes between.
        let mut writing = false;
        for c in [Change::Writing, Change::Unknown, Change::Writing] {
            note(&mut writing, c);
            assert!(writing);
        }
        note(&mut writing, Change::Complete);
        assert!(!writing);
        note(&mut writing, Change::Writing);
        note(&mut writing, Change::Lost);
        assert!(
            !writing,
            "lost events: the content decides (read twice alike)"
        );
    }
}
