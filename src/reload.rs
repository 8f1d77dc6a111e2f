//! Hot reload: read and validate the config file again, then swap it in atomically. An
//! invalid file changes nothing. Triggered by SIGHUP (the binary), a change of the file
//! (a watcher on its folder: applied once the file is whole, renamed or linked into place,
//! or written in place and then quiet for [`WRITE_QUIET`] and closed, and reading the same
//! twice) or `Running::reload` (the server's API).
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
use tokio::time::Instant;
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
/// A file written in place is applied only once no data change has come for
/// [`WRITE_QUIET`], someone has closed it since (inotify's close-write), and it reads the
/// same twice: a close alone proves nothing (a `touch` in the writer's pause closes the file
/// too), so a write whose pauses are shorter than [`WRITE_QUIET`] is never applied
/// half-written, whatever else opens and closes the file (see [`Settle`]).
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
    /// The file's data changed in place (a write, a truncation, a new regular file): an
    /// in-place write, settled only by [`WRITE_QUIET`] without another such event.
    Written,
    /// Someone who had the file open for writing closed it (inotify's close-write). Not
    /// proof that the writer is done: a `touch`, an autosave check or an agent fixing
    /// permissions opens and closes the file for writing in the middle of a slow write.
    Closed,
    /// A whole content was put in place at once: a file or a link renamed over the name,
    /// a symlink made.
    Replaced,
    /// Something else (attributes, a removal): look again after the short quiet period.
    Unknown,
    /// Events were lost (the kernel's queue overflowed): a write may be in progress and its
    /// close may be lost; settled as an in-place write whose close was seen.
    Lost,
}

impl Change {
    fn of(kind: &EventKind, path: &Path) -> Option<Change> {
        use notify::event::{AccessKind, AccessMode, ModifyKind};
        Some(match kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => Change::Closed,
            // Opens and reads (ours included) change nothing.
            EventKind::Access(_) => return None,
            EventKind::Modify(ModifyKind::Name(_)) => Change::Replaced,
            EventKind::Modify(ModifyKind::Metadata(_)) => Change::Unknown,
            EventKind::Modify(_) => Change::Written,
            EventKind::Create(_) => {
                let link =
                    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
                if link {
                    Change::Replaced
                } else {
                    Change::Written
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

/// Whether the platform's watcher reports close-write (Linux's inotify does): then an
/// in-place write is also waited for until someone closes the file, however long its
/// writer pauses (as long as nothing else closes it meanwhile).
const CLOSE_EVENTS: bool = cfg!(target_os = "linux");

/// How long a file written in place must go without a data change before its content is
/// applied, whoever closes it meanwhile: the longest pause an in-place writer may make
/// between two pieces when something else (a `touch`) may close the file in that pause.
pub const WRITE_QUIET: Duration = Duration::from_secs(5);

/// The pause between the two reads that must agree before a content is applied.
const REREAD: Duration = Duration::from_millis(50);

/// Where the events since the last applied content leave the file: when its content may be
/// read, as a pure function of the events and the clock (table-tested below).
#[derive(Debug, Clone, Copy)]
struct Settle {
    /// The last data change of an in-place write not settled yet.
    written_at: Option<Instant>,
    /// A close-write (or lost events) came after `written_at`.
    closed: bool,
    /// The last event of any kind.
    last_event: Instant,
}

/// What the debounce task does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Nothing to read before this long has passed (or another event comes).
    Wait(Duration),
    /// An in-place write has been quiet long enough but nobody has closed the file: wait
    /// for an event.
    WaitForClose,
    /// Read the content (twice, [`REREAD`] apart).
    Read,
}

impl Settle {
    fn new(now: Instant) -> Settle {
        Settle {
            written_at: None,
            closed: false,
            last_event: now,
        }
    }

    fn note(&mut self, change: Change, now: Instant) {
        self.last_event = now;
        match change {
            Change::Written => {
                self.written_at = Some(now);
                self.closed = false;
            }
            Change::Closed => self.closed = self.written_at.is_some(),
            Change::Replaced => {
                // A new file under the name: the old one's writer writes elsewhere now.
                self.written_at = None;
                self.closed = false;
            }
            Change::Lost => {
                self.written_at = Some(now);
                self.closed = true;
            }
            Change::Unknown => {}
        }
    }

    fn step(&self, now: Instant) -> Step {
        let Some(written) = self.written_at else {
            return wait_until(self.last_event + DEBOUNCE, now);
        };
        match wait_until(written + WRITE_QUIET, now) {
            Step::Read if CLOSE_EVENTS && !self.closed => Step::WaitForClose,
            step => step,
        }
    }
}

fn wait_until(at: Instant, now: Instant) -> Step {
    if now < at {
        Step::Wait(at - now)
    } else {
        Step::Read
    }
}

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
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => return,
            ev = rx.recv() => match ev {
                Some(c) => c,
                None => return,
            },
        };
        let mut settle = Settle::new(Instant::now());
        settle.note(first, Instant::now());
        // Wait for the events to settle (see `Settle`), then the content, read twice alike.
        let mut told = false;
        let content = loop {
            let wait = match settle.step(Instant::now()) {
                Step::Wait(d) => Some(d),
                Step::WaitForClose => {
                    if !std::mem::replace(&mut told, true) {
                        tracing::debug!(file = %path.display(), "config file written in place and not closed yet; waiting for its close");
                    }
                    None
                }
                Step::Read => {
                    // Read twice: a content that changes between the reads is not whole.
                    let first = read(&path);
                    tokio::time::sleep(REREAD).await;
                    let mut moved = false;
                    while let Ok(c) = rx.try_recv() {
                        settle.note(c, Instant::now());
                        moved = true;
                    }
                    let second = read(&path);
                    if !moved && first == second {
                        break second;
                    }
                    continue;
                }
            };
            tokio::select! {
                _ = stop.cancelled() => return,
                ev = rx.recv() => match ev {
                    Some(c) => settle.note(c, Instant::now()),
                    None => return,
                },
                _ = sleep_or_forever(wait) => {}
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

async fn sleep_or_forever(wait: Option<Duration>) {
    match wait {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
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
    fn events_say_what_happened_to_the_content() {
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
        assert_eq!(of(data, &file), Some(Change::Written));
        assert_eq!(of(created, &file), Some(Change::Written));
        assert_eq!(of(created, &link), Some(Change::Replaced));
        assert_eq!(of(close, &file), Some(Change::Closed));
        assert_eq!(of(renamed, &file), Some(Change::Replaced));
        let opened = EventKind::Access(AccessKind::Open(AccessMode::Any));
        assert_eq!(of(opened, &file), None);
        let read = EventKind::Access(AccessKind::Close(AccessMode::Read));
        assert_eq!(of(read, &file), None);
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_replacement_settles_after_the_short_quiet() {
        let t0 = Instant::now();
        let mut s = Settle::new(t0);
        s.note(Change::Replaced, t0);
        assert_eq!(s.step(t0), Step::Wait(DEBOUNCE));
        assert_eq!(s.step(t0 + DEBOUNCE), Step::Read);
        // A touch of a file nobody wrote: the short quiet, then the content decides.
        let mut s = Settle::new(t0);
        s.note(Change::Closed, t0);
        s.note(Change::Unknown, t0 + ms(1));
        assert_eq!(s.step(t0 + ms(1) + DEBOUNCE), Step::Read);
    }

    /// The case: a slow in-place write, and a `touch` (its close-write) in the
    /// writer's pause. The close does not end the write: only `WRITE_QUIET` without a data
    /// change does.
    #[test]
    fn a_close_in_a_writers_pause_does_not_settle_the_write() {
        let t0 = Instant::now();
        let mut s = Settle::new(t0);
        s.note(Change::Written, t0);
        let touch = t0 + ms(1_200);
        s.note(Change::Closed, touch);
        s.note(Change::Unknown, touch);
        assert_eq!(
            s.step(touch + DEBOUNCE),
            Step::Wait(WRITE_QUIET - ms(1_200) - DEBOUNCE)
        );
        // The writer's second piece restarts the quiet and needs a close of its own.
        let second = t0 + ms(2_500);
        s.note(Change::Written, second);
        assert_eq!(s.step(second + WRITE_QUIET), Step::WaitForClose);
        s.note(Change::Closed, second + ms(10));
        assert_eq!(s.step(second + ms(10)), Step::Wait(WRITE_QUIET - ms(10)));
        assert_eq!(s.step(second + WRITE_QUIET), Step::Read);
        // Written and then replaced by a rename: the replacement is what counts.
        s.note(Change::Written, second + ms(20));
        s.note(Change::Replaced, second + ms(30));
        assert_eq!(s.step(second + ms(30) + DEBOUNCE), Step::Read);
    }

    #[test]
    fn lost_events_settle_as_a_closed_write() {
        let t0 = Instant::now();
        let mut s = Settle::new(t0);
        s.note(Change::Written, t0);
        s.note(Change::Lost, t0 + ms(100));
        assert_eq!(s.step(t0 + ms(100) + WRITE_QUIET), Step::Read);
        assert!(matches!(s.step(t0 + ms(200)), Step::Wait(_)));
    }
}
