//! Keeping what was deployed running (issue 68): what a keeper (`host::keeper`) does when its
//! release ends, the restart every path shares (a keeper's, `up`'s), and the pass that gives
//! every live release a keeper.
//!
//! A keeper restarts its release only when the state names that very process as live, no run
//! holds the root (a run owns its processes: its own gate, watch and soak judge an exit) and
//! nobody stopped the service; every restart happens under the root's lock, after reading the
//! state again, so two keepers, or a keeper and `up`, never start one release twice. Restarts
//! back off (1 s doubling to 60 s) and are given up after five exits in a row that did not stay
//! up 30 s.

use std::time::{Duration, Instant};

use crate::defaults;
use crate::engine;
use crate::error::Error;
use crate::host::identity::Identity;
use crate::host::journal::{self, LogEvent};
use crate::host::keeper::{self, Backoff, Registration, Spec};
use crate::host::lock;
use crate::host::notify;
use crate::host::process;
use crate::host::state::Root;

/// A release that stayed up this long has stopped crashing: its count starts again.
pub(crate) const STABLE: Duration = Duration::from_secs(30);

/// One live process as the state names it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Live {
    pub(crate) service: String,
    /// A replica's slot (None: the single release `current` names).
    pub(crate) slot: Option<usize>,
    pub(crate) version: String,
    pub(crate) port: u16,
    pub(crate) identity: Identity,
    /// How it was started when it was deployed (its probe, held socket, confinement, limits,
    /// user, writable folders): it is started and probed so again.
    pub(crate) launch: crate::host::launch::LaunchRecord,
}

impl Live {
    pub(crate) fn name(&self) -> String {
        match self.slot {
            Some(slot) => format!(
                "{} {} (replica {slot}, port {})",
                self.service, self.version, self.port
            ),
            None => format!("{} {} (port {})", self.service, self.version, self.port),
        }
    }

    fn output(&self, root: &Root) -> std::path::PathBuf {
        match self.slot {
            Some(slot) => root.replica_output_path(&self.version, &self.service, slot),
            None => root.output_path(&self.version, &self.service),
        }
    }
}

/// What the state names as live: the replica set, else `current`.
pub(crate) fn live_set(root: &Root) -> Result<Vec<Live>, String> {
    if let Some(set) = root.read_replicas().map_err(|e| e.to_string())? {
        // Replicas are probed as the rollout that placed them probed them.
        let settings = engine::saved_run(root)
            .ok()
            .flatten()
            .filter(|r| r.service == set.service)
            .map(|r| r.settings);
        let launch = settings.map(|s| s.launch).unwrap_or_default();
        return Ok(set
            .replicas
            .into_iter()
            .map(|r| Live {
                service: set.service.clone(),
                slot: Some(r.slot),
                version: r.version,
                port: r.port,
                identity: Identity {
                    pid: r.pid,
                    start_time: r.start_time,
                },
                launch: launch.clone(),
            })
            .collect());
    }
    Ok(root
        .read_pointer()
        .map_err(|e| e.to_string())?
        .map(|p| Live {
            identity: p.identity(),
            launch: p.launch,
            service: p.service,
            slot: None,
            version: p.version,
            port: p.port,
        })
        .into_iter()
        .collect())
}

/// How a restart's process is started: through a keeper of its own (`up`, whose processes
/// must be kept after it), or as this process's own child (a keeper starting its release
/// again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spawn {
    Kept(Backoff),
    Direct,
}

/// A release started again and how it went (its pid, whether it passed its probe).
pub(crate) struct Started {
    pub(crate) identity: Identity,
    pub(crate) how: String,
}

/// Starts the release and waits until it passes its own probe (the one its gate used), or it
/// exits, or `ready` passes (it is left running: it is the live release, ready or not).
async fn start(
    root: &Root,
    live: &Live,
    ready: Duration,
    attempt: u64,
    spawn: Spawn,
) -> Result<Started, String> {
    launch(root, live, attempt, spawn)?.ready(root, ready).await
}

/// A release process just started again, not yet known to be ready.
pub(crate) struct Launched {
    child: tokio::process::Child,
    identity: Identity,
    subject: crate::host::probe::Subject,
    /// Reads what a notify-probed release says while it is waited for.
    _notifier: Option<notify::Notifier>,
    output: std::path::PathBuf,
}

/// Starts the release as `live` records it was started (through a keeper or directly).
fn launch(root: &Root, live: &Live, attempt: u64, spawn: Spawn) -> Result<Launched, String> {
    // A signed release runs from the copy that was verified when it was deployed.
    let verified = root
        .0
        .join(".verified")
        .join(&live.version)
        .join(&live.service);
    let executable = if verified.is_file() {
        verified
    } else {
        root.executable(&live.version, &live.service)
    };
    let output = live.output(root);
    let token = format!("up-{}-{attempt}", std::process::id());
    // Its socket again from the root's holder (started now after a reboot: it binds it).
    let held = match &live.launch.listen {
        Some(spec) => {
            Some(crate::host::listen::obtain_or_hold(&root.0, spec).map_err(|e| e.to_string())?)
        }
        None => None,
    };
    let socket = match live.launch.probe.is_notify() {
        true => Some(notify::Socket::for_token(&token).map_err(|e| e.to_string())?),
        false => None,
    };
    let launch = process::Launch {
        executable: &executable,
        workdir: &root.release_dir(&live.version),
        output: &output,
        port: live.port,
        version: &live.version,
        token: &token,
        slot: live.slot,
        notify: socket
            .as_ref()
            .map(|s| (s.address(), live.launch.probe.watchdog())),
        secrets: &crate::host::config::secrets_dir(&root.0),
        // The policy is not at hand here: the defaults bound the restarted release's output.
        rotation: crate::host::output::Rotation::default(),
        listen: held.as_ref().map(std::os::fd::AsRawFd::as_raw_fd),
        record: &live.launch,
        root: &root.0,
        grace: crate::defaults::GRACE,
    };
    let cannot = |e: std::io::Error| format!("cannot start {}: {e}", executable.display());
    let (child, identity) = match spawn {
        Spawn::Kept(backoff) => {
            let kept = keeper::start(&launch, &live.service, backoff).map_err(cannot)?;
            (kept.keeper, kept.release)
        }
        Spawn::Direct => {
            let child = process::spawn(&launch).map_err(cannot)?;
            let pid = child.id().map_or(0, |p| p as i32);
            (
                child,
                Identity::of(pid).unwrap_or(Identity { pid, start_time: 0 }),
            )
        }
    };
    let notifier = socket.map(|socket| socket.listen(identity.pid, false));
    let subject = crate::host::probe::Subject {
        spec: live.launch.probe.clone(),
        port: live.port,
        workdir: root.release_dir(&live.version),
        notices: notifier.as_ref().map(|n| n.notices()),
        image: live.launch.image_of(&root.release_dir(&live.version)),
    };
    Ok(Launched {
        child,
        identity,
        subject,
        _notifier: notifier,
        output,
    })
}

impl Launched {
    /// Waits until it passes its probe (how it went, in words), or it exits (the error), or
    /// `ready` passes (it is left running: it is the live release, ready or not).
    async fn ready(mut self, root: &Root, ready: Duration) -> Result<Started, String> {
        let pid = self.identity.pid;
        let deadline = tokio::time::Instant::now() + ready;
        let mut last = String::from("no probe yet");
        let how = loop {
            tokio::select! {
                status = self.child.wait() => {
                    let status = process::ended_words(status, Some(&self.identity));
                    let tail = said_last(root, &self.output);
                    return Err(format!("exited with {status} before it was ready{tail}"));
                }
                _ = tokio::time::sleep_until(deadline) => {
                    break format!("pid {pid}, not ready after {} ms (last probe: {last})", ready.as_millis());
                }
                _ = tokio::time::sleep(Duration::from_millis(50)) => {
                    let (passed, probe) = self.subject.check().await;
                    if passed {
                        break format!("pid {pid}, ready ({probe})");
                    }
                    if probe.is_fatal() {
                        break format!("pid {pid}, not ready: {probe}");
                    }
                    last = probe.to_string();
                }
            }
        };
        Ok(Started {
            identity: self.identity,
            how,
        })
    }
}

/// "; output: …": the release's last words, with no secret value of the root in them.
fn said_last(root: &Root, output: &std::path::Path) -> String {
    let secrets = crate::host::config::known_values(&crate::host::config::secrets_dir(&root.0));
    let tail = crate::host::config::redact(
        &crate::host::output::tail_settled(output, 2, crate::host::output::SETTLE),
        &secrets,
    );
    match tail.is_empty() {
        true => String::new(),
        false => format!("; output: {tail}"),
    }
}

pub(crate) fn log(
    root: &Root,
    live: &Live,
    event: LogEvent,
    pid: Option<i32>,
    ended: Option<&str>,
    detail: String,
) {
    let entry = journal::Entry {
        port: Some(live.port),
        pid,
        slot: live.slot,
        ended: ended.map(str::to_string),
        ..journal::Entry::new(event, &live.version, &live.service, detail)
    };
    if let Err(e) = journal::append(&root.log_path(), &entry) {
        eprintln!(
            "rollgate: cannot append to {}: {e}",
            root.log_path().display()
        );
    }
}

/// Restarts one release that is not running (`ended` says how its process ended, when its
/// keeper saw it); the caller holds the lock.
pub(crate) async fn restart(
    root: &Root,
    live: &Live,
    ready: Duration,
    attempt: u64,
    (why, ended): (&str, Option<&str>),
    spawn: Spawn,
) -> Result<Started, String> {
    let started = match start(root, live, ready, attempt, spawn).await {
        Ok(started) => started,
        Err(e) => {
            log(
                root,
                live,
                LogEvent::RestartFailed,
                None,
                ended,
                format!("{why}; restart failed: {e}"),
            );
            return Err(e);
        }
    };
    if let Err(e) = engine::record_restart(root, live.slot, live.identity, started.identity) {
        // Not ours to keep: the state names something else now.
        let stopped = process::stop_group(started.identity, Duration::from_secs(5)).await;
        return Err(format!("{e}; the process started for it {stopped}"));
    }
    log(
        root,
        live,
        LogEvent::Restarted,
        Some(started.identity.pid),
        ended,
        format!("{why}; started again: {}", started.how),
    );
    Ok(started)
}

/// Every live release under `root` kept, the caller holding the lock: one running without a
/// keeper is given one; one not running is started again through a keeper (what it left
/// behind stopped first, so no second copy ever serves beside it), unless `dead` says to leave
/// one whose keeper gave up on it. A line per release (whether it runs).
pub(crate) async fn ensure(
    root: &Root,
    ready: Duration,
    backoff: Backoff,
    dead: Dead<'_>,
) -> Result<Vec<(bool, String)>, Error> {
    let mut report = Vec::new();
    let kept = keeper::kept(&root.0, true);
    for (n, live) in live_set(root).map_err(Error::Refused)?.iter().enumerate() {
        if live.identity.is_running() {
            if !kept.contains(&live.identity) {
                if let Err(e) = keeper::adopt(&Spec::adopting(
                    &root.0,
                    &live.service,
                    live.identity,
                    &live.launch,
                    backoff,
                )) {
                    report.push((
                        false,
                        format!(
                            "{}: running (pid {}) but not kept: {e}",
                            live.name(),
                            live.identity.pid
                        ),
                    ));
                    continue;
                }
            }
            report.push((
                true,
                format!("{}: running (pid {})", live.name(), live.identity.pid),
            ));
            continue;
        }
        let why = match dead {
            Dead::Restart(why) => why,
            Dead::Unkept(_) if kept.contains(&live.identity) => {
                report.push((
                    false,
                    format!("{}: not running (its keeper gave up on it)", live.name()),
                ));
                continue;
            }
            Dead::Unkept(why) => why,
        };
        // A worker it left may still hold its port or its files.
        process::stop_group(live.identity, defaults::GRACE).await;
        let why = format!("pid {} was not running ({why})", live.identity.pid);
        match restart(
            root,
            live,
            ready,
            n as u64,
            (&why, None),
            Spawn::Kept(backoff),
        )
        .await
        {
            Ok(started) => {
                report.push((true, format!("{}: started ({})", live.name(), started.how)))
            }
            Err(e) => report.push((false, format!("{}: NOT started: {e}", live.name()))),
        }
    }
    Ok(report)
}

/// After a deploy or rollout let go of the root: whatever it left live runs and is kept (a live
/// release that ended while the run held the root was the run's to judge; its keeper let it
/// go). Skipped when the root is taken again already or the service is stopped; what it
/// started or could not start is said on stderr.
pub(crate) fn after_a_run(root: &std::path::Path) {
    let root = Root(root.to_path_buf());
    let Ok(_lock) = lock::acquire(&root.lock_path()) else {
        return;
    };
    if crate::host::stopped::read(&root.0).ok().flatten().is_some() {
        return;
    }
    let Ok(runtime) = engine::runtime() else {
        return;
    };
    let why = Dead::Restart("found not running after a run");
    match runtime.block_on(ensure(&root, defaults::UP_READY, Backoff::default(), why)) {
        Ok(report) => {
            for (ok, line) in report {
                if !ok || line.contains(": started (") {
                    eprintln!("rollgate: {line}");
                }
            }
        }
        Err(e) => eprintln!("rollgate: {e}"),
    }
}

/// What [`ensure`] does with a live release that is not running.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Dead<'a> {
    /// Start it again, saying why in its `restarted` line.
    Restart(&'a str),
    /// Start it again unless its keeper still holds it (it gave up on it).
    Unkept(&'a str),
}

/// A keeper's count of its release's exits in a row that did not stay up.
#[derive(Debug)]
struct Crashes {
    in_a_row: u32,
    last_start: Instant,
    next_allowed: Option<tokio::time::Instant>,
}

/// What a keeper watches: its own child, or (adopted) a process it did not start.
enum Watched {
    Child(tokio::process::Child),
    Adopted(Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>),
}

impl Watched {
    /// Its end: the exit status when it was this keeper's child.
    async fn end(&mut self) -> Option<std::process::ExitStatus> {
        match self {
            Watched::Child(child) => child.wait().await.ok(),
            Watched::Adopted(Some(fd)) => {
                let _ = fd.readable().await;
                None
            }
            Watched::Adopted(None) => None,
        }
    }
}

/// A pidfd for `who`, readable once it ends; None when it is gone already.
fn pidfd_of(who: Identity) -> Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, who.pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the descriptor was just returned to this process and is owned here alone.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    // Opened on the same process the state names, not on one that took its pid since.
    if Identity::of(who.pid) != Some(who) {
        return None;
    }
    // SAFETY: the AsyncFd owns the descriptor, so it stays open for as long as it is registered.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .ok()
}

/// `rollgate keep`: reads its spec on stdin, starts (or adopts) the release, says so, and keeps
/// it. Its exit is its release's when it lets the release end.
pub fn keep_main() -> std::process::ExitCode {
    use std::io::Read;
    let mut text = Vec::new();
    let spec = std::io::stdin()
        .lock()
        .take(1 << 20)
        .read_to_end(&mut text)
        .map_err(|e| e.to_string())
        .and_then(|_| serde_json::from_slice::<Spec>(&text).map_err(|e| e.to_string()));
    let spec = match spec {
        Ok(spec) => spec,
        Err(e) => {
            keeper::report(&format!("error its keeper could not read its spec: {e}"));
            return std::process::ExitCode::from(crate::error::FAILED);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(keep(spec)),
        Err(e) => {
            keeper::report(&format!("error its keeper could not start: {e}"));
            std::process::ExitCode::from(crate::error::FAILED)
        }
    }
}

async fn keep(spec: Spec) -> std::process::ExitCode {
    // A terminal's or a session's end is not the release's.
    for ignored in [libc::SIGINT, libc::SIGHUP, libc::SIGPIPE] {
        // SAFETY: setting a signal's disposition to ignore.
        unsafe {
            libc::signal(ignored, libc::SIG_IGN);
        }
    }
    let root = Root(spec.root.clone());
    let (watched, release) = match spec.adopt {
        Some(who) => {
            keeper::report("adopted");
            (Watched::Adopted(pidfd_of(who)), who)
        }
        None => match process::spawn(&spec.launch()) {
            Ok(child) => {
                let pid = child.id().map_or(0, |p| p as i32);
                let who = Identity::of(pid).unwrap_or(Identity { pid, start_time: 0 });
                keeper::report(&format!("started {} {}", who.pid, who.start_time));
                (Watched::Child(child), who)
            }
            Err(e) => {
                keeper::report(&format!("error {e}"));
                return std::process::ExitCode::from(crate::error::FAILED);
            }
        },
    };
    if spec.listen {
        // The release has its own copy of the held socket; a restart asks the holder again.
        // SAFETY: closes this process's fd 3, which its starter put there for the release.
        unsafe {
            libc::close(crate::host::listen::FIRST_FD);
        }
    }
    // Unregistered (the folder could not be written), it still keeps its release; `up` would
    // give the release a second keeper, which restarts nothing the first one did.
    let registration = Registration::new(&root.0, release).ok();
    let Ok(terminate) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return std::process::ExitCode::from(crate::error::FAILED);
    };
    let keeper = Keeper {
        root,
        spec,
        release,
        registration,
        terminate,
        crashes: Crashes {
            in_a_row: 0,
            last_start: Instant::now(),
            next_allowed: None,
        },
        attempt: 0,
        since_switch: Vec::new(),
        rollback_tried: None,
    };
    keeper.run(watched).await
}

/// A keeper at work: the release it keeps now, and its count of that release's exits.
struct Keeper {
    root: Root,
    spec: Spec,
    release: Identity,
    registration: Option<Registration>,
    terminate: tokio::signal::unix::Signal,
    crashes: Crashes,
    attempt: u64,
    /// How each exit since the release's switch ended, while within the crash-loop window.
    since_switch: Vec<String>,
    /// A crash-loop rollback that could not happen, and why (not tried again).
    rollback_tried: Option<String>,
}

impl Keeper {
    /// Watches the release until it ends, then starts it again or lets it go (ending so).
    async fn run(mut self, mut watched: Watched) -> std::process::ExitCode {
        let mut notes = Notes::default();
        // Only a notify-probed release has anything to read: the others cost no wake-ups.
        let every = match self.spec.record.probe.is_notify() {
            true => LOOK,
            false => Duration::from_secs(3600),
        };
        let mut look = tokio::time::interval(every);
        loop {
            let status = tokio::select! {
                // Asked to stop: the release keeps running (`up` gives it a keeper again).
                _ = self.terminate.recv() => return std::process::ExitCode::SUCCESS,
                status = watched.end() => status,
                _ = look.tick() => {
                    notes.look(&self.root, self.release, &self.spec.record.probe).await;
                    continue;
                }
            };
            if notes.notifier.is_some() {
                // What it said just before it exited (STOPPING=1) may still be queued.
                tokio::time::sleep(NOTICES_SETTLE).await;
            }
            let hung = notes.hung.take();
            let orderly = hung.is_none() && notes.said_stopping();
            notes.notifier = None;
            let words = match (hung, &watched, status) {
                (Some(why), ..) => format!("hung ({why}) and was stopped"),
                (None, Watched::Child(_), Some(status)) => {
                    process::ended_words(Ok(status), Some(&self.release))
                }
                _ => "ended (its exit status is unknown: it was adopted, not started, by this keeper)"
                    .to_string(),
            };
            watched = match self.after_end(status, words, orderly).await {
                Ok(child) => Watched::Child(child),
                Err(code) => return code,
            };
        }
    }

    /// After the release ended: started again (its new process, to watch), or let go (the
    /// code this keeper ends with: its release's).
    async fn after_end(
        &mut self,
        status: Option<std::process::ExitStatus>,
        mut words: String,
        mut orderly: bool,
    ) -> Result<tokio::process::Child, std::process::ExitCode> {
        let root = self.root.clone();
        loop {
            if let (false, Some(at)) = (orderly, self.crashes.next_allowed) {
                tokio::select! {
                    _ = self.terminate.recv() => return Err(mirror(status)),
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            let Some((lock, live)) = still_live(&root, self.release).await else {
                return Err(mirror(status));
            };
            self.attempt += 1;
            let was_orderly = std::mem::replace(&mut orderly, false);
            let why = match was_orderly {
                // Said STOPPING=1 before it exited: stopped in order, not a crash.
                true => format!(
                    "pid {} stopped in order (it sent STOPPING=1); not counted as a crash",
                    self.release.pid
                ),
                false if self.rollback_tried.is_none() && self.crash_loop(&live, &words) => {
                    drop(lock);
                    match self.roll_back(&live, status).await {
                        Ok(code) => return Err(code),
                        // Not rolled back (nothing to go back to): started again as any exit.
                        Err(why) => self.rollback_tried = Some(why),
                    }
                    continue;
                }
                false => match self.crashes.count(&self.spec.backoff) {
                    Some(in_a_row) => format!(
                        "pid {} {words} ({in_a_row} in a row; given up at {}){}{}",
                        self.release.pid,
                        self.spec.backoff.max_restarts,
                        said_last(&root, &live.output(&root)),
                        self.rollback_tried
                            .as_ref()
                            .map(|why| format!("; a crash loop, not rolled back: {why}"))
                            .unwrap_or_default(),
                    ),
                    None => {
                        self.give_up(&live, &words);
                        drop(lock);
                        // Still its keeper, so `up --supervise` leaves it stopped too, until
                        // the state names another process (a deploy, `up`) or it is asked to go.
                        return Err(linger(&root, self.release, status, &mut self.terminate).await);
                    }
                },
            };
            let ended = (!was_orderly).then(|| words.clone());
            self.crashes.last_start = Instant::now();
            // Started and recorded under the lock, then let go of it: a deploy is never kept
            // waiting while the release gets ready.
            let launched = match launch(&root, &live, self.attempt, Spawn::Direct) {
                Ok(launched) => launched,
                Err(e) => {
                    let detail = format!("{why}; restart failed: {e}");
                    log(
                        &root,
                        &live,
                        LogEvent::RestartFailed,
                        None,
                        ended.as_deref(),
                        detail,
                    );
                    words = "could not be started again".into();
                    continue;
                }
            };
            let new = launched.identity;
            if engine::record_restart(&root, live.slot, live.identity, new).is_err() {
                // The state names something else now: not this keeper's to keep.
                process::stop_group(new, Duration::from_secs(5)).await;
                return Err(mirror(status));
            }
            self.release = new;
            if let Some(registration) = self.registration.as_mut() {
                let _ = registration.keeps(new);
            }
            drop(lock);
            // Said at once (whether it gets ready shows in what follows: its next exit).
            let detail = format!("{why}; started again: pid {}", new.pid);
            log(
                &root,
                &live,
                LogEvent::Restarted,
                Some(new.pid),
                ended.as_deref(),
                detail,
            );
            return Ok(launched.child);
        }
    }

    /// Whether this exit (how it ended: `words`) makes a crash loop caused by the deploy: the
    /// policy's `crash_loop.restarts` exits within `within_ms` of the switch. A replica set is
    /// not judged so yet (its rollback is a rollout).
    fn crash_loop(&mut self, live: &Live, words: &str) -> bool {
        let rule = live.launch.crash_loop;
        let Ok(Some(pointer)) = self.root.read_pointer() else {
            return false;
        };
        if rule.restarts == 0 || live.slot.is_some() || !pointer.names(self.release) {
            return false;
        }
        let since = journal::now() - pointer.promoted_at;
        if since * 1000.0 > rule.within_ms as f64 {
            self.since_switch.clear();
            return false;
        }
        self.since_switch.push(words.to_string());
        self.since_switch.len() >= rule.restarts as usize
    }

    /// Rolls the crash-looping release back to the one live before it: `rollgate rollback`,
    /// through the gate, its `rolled_back` line naming the exits. The code this keeper then
    /// ends with, or why it could not.
    async fn roll_back(
        &mut self,
        live: &Live,
        status: Option<std::process::ExitStatus>,
    ) -> Result<std::process::ExitCode, String> {
        let pointer = self.root.read_pointer().ok().flatten();
        let since = pointer.map_or(0.0, |p| journal::now() - p.promoted_at);
        let because = format!(
            "a crash loop: it exited {} times within {since:.1} s of its switch ({})",
            self.since_switch.len(),
            self.since_switch.join("; ")
        );
        let mut command = tokio::process::Command::new("/proc/self/exe");
        command
            .args(["rollback", &live.service, "--because", &because, "--root"])
            .arg(&self.root.0)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let child = command
            .spawn()
            .map_err(|e| format!("cannot start rollgate rollback: {e}"))?;
        let ran = tokio::select! {
            _ = self.terminate.recv() => return Ok(mirror(status)),
            ran = child.wait_with_output() => ran,
        };
        let said = ran.map_err(|e| e.to_string())?;
        if keeps_it(&self.root, self.release).is_none() {
            return Ok(mirror(status));
        }
        let words = String::from_utf8_lossy(&said.stderr);
        let last = words
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        Err(crate::host::output::printable(
            last.trim_start_matches("error: "),
        ))
    }

    /// Too many exits in a row: said and logged; the release is left stopped.
    fn give_up(&self, live: &Live, words: &str) {
        let detail = format!(
            "exited {} times in a row, each within {} s of its start (last: pid {} {words}); not restarted again (left stopped) until the next deploy or `rollgate up`",
            self.crashes.in_a_row,
            STABLE.as_secs(),
            self.release.pid,
        );
        log(
            &self.root,
            live,
            LogEvent::RestartGivenUp,
            None,
            Some(words),
            detail,
        );
    }
}

/// How often a keeper reads what its release said (a watchdog missed).
const LOOK: Duration = Duration::from_millis(200);
/// How long a hung release gets between SIGTERM and SIGKILL.
const HUNG_GRACE: Duration = Duration::from_secs(5);
/// How long a dead notify-probed release's last datagrams are given to be read.
const NOTICES_SETTLE: Duration = Duration::from_millis(20);

impl Crashes {
    /// One more exit: how many in a row (the backoff before the next restart set), or None
    /// when that is as many as `backoff` allows (given up).
    fn count(&mut self, backoff: &Backoff) -> Option<u32> {
        let stayed_up = self.last_start.elapsed() >= STABLE;
        self.in_a_row = if stayed_up { 1 } else { self.in_a_row + 1 };
        if self.in_a_row >= backoff.max_restarts {
            return None;
        }
        let wait = Duration::from_millis(backoff.first_ms)
            .saturating_mul(1 << (self.in_a_row - 1).min(16))
            .min(defaults::UP_MAX_BACKOFF);
        self.next_allowed = Some(tokio::time::Instant::now() + wait);
        Some(self.in_a_row)
    }
}

/// What a notify-probed release says while it is live and no run holds its root: a keeper
/// reads it (a run reads it itself), stops a release that hangs, and tells an orderly exit.
#[derive(Default)]
struct Notes {
    notifier: Option<notify::Notifier>,
    /// Why the keeper stopped its release (it hung).
    hung: Option<String>,
}

impl Notes {
    fn said_stopping(&self) -> bool {
        self.notifier
            .as_ref()
            .is_some_and(|n| n.notices().borrow().stopping)
    }

    async fn look(&mut self, root: &Root, release: Identity, probe: &crate::host::probe::Spec) {
        if !probe.is_notify() || self.hung.is_some() {
            return;
        }
        if !lock::is_free(&root.lock_path()) {
            // A deploy or rollout holds the root: its own executor reads the socket now.
            self.notifier = None;
            return;
        }
        if self.notifier.is_none() {
            // Not waiting for a holder: whoever holds it now watches it; try next time.
            self.notifier = notify::Notifier::watch_live(release.pid, Duration::ZERO);
        }
        let Some(why) = self.notifier.as_ref().and_then(|n| hang(n, probe)) else {
            return;
        };
        let Ok(_lock) = lock::acquire(&root.lock_path()) else {
            return;
        };
        if !live_set(root).is_ok_and(|set| set.iter().any(|l| l.identity == release)) {
            return;
        }
        process::stop_group(release, HUNG_GRACE).await;
        self.hung = Some(why);
    }
}

/// Why a release counts as hung, like systemd's `WatchdogSec=`: it asked to be
/// (`WATCHDOG=trigger`) or sent no `WATCHDOG=1` for longer than the policy's `watchdog_ms`.
fn hang(notifier: &notify::Notifier, probe: &crate::host::probe::Spec) -> Option<String> {
    let said = notifier.notices().borrow().clone();
    if said.watchdog_triggered {
        return Some("it sent WATCHDOG=trigger".into());
    }
    let since = said.watchdog_missed(probe.watchdog()?)?;
    Some(format!("no WATCHDOG=1 for {} ms", since.as_millis()))
}

/// The root locked and the state naming `release` as live, with nobody having stopped the
/// service: the release is this keeper's to start again. None when a run holds the root (it
/// owns its processes) or the release is no longer live.
async fn still_live(root: &Root, release: Identity) -> Option<(lock::Lock, Live)> {
    // Looked at first without the lock (a command finding it taken would take a keeper for a
    // run), then again under it.
    keeps_it(root, release)?;
    let lock = lock::acquire(&root.lock_path()).ok()?;
    let live = keeps_it(root, release)?;
    Some((lock, live))
}

/// The live release `release` when it is a keeper's to start again: nobody stopped the service,
/// no run is in flight (a paused or escalated one, or one whose rollgate died: it owns its
/// processes, and the next command finishes it) and the state names that very process.
fn keeps_it(root: &Root, release: Identity) -> Option<Live> {
    if crate::host::stopped::read(&root.0).ok()?.is_some() {
        return None;
    }
    let run = engine::saved_run(root).ok()?;
    if run.is_some_and(|run| !run.is_over() || run.unsettled_deploy()) {
        return None;
    }
    live_set(root)
        .ok()?
        .into_iter()
        .find(|live| live.identity == release)
}

/// A keeper that gave up: it stays registered for the release it let go until the state no
/// longer names it, then ends as the release did.
async fn linger(
    root: &Root,
    release: Identity,
    status: Option<std::process::ExitStatus>,
    terminate: &mut tokio::signal::unix::Signal,
) -> std::process::ExitCode {
    loop {
        tokio::select! {
            _ = terminate.recv() => return mirror(status),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        let named = live_set(root).is_ok_and(|set| set.iter().any(|l| l.identity == release));
        if !named {
            return mirror(status);
        }
    }
}

/// Ends this keeper as its release ended: the same exit code, or the same signal.
fn mirror(status: Option<std::process::ExitStatus>) -> std::process::ExitCode {
    use std::os::unix::process::ExitStatusExt;
    let Some(status) = status else {
        return std::process::ExitCode::from(crate::error::FAILED);
    };
    if let Some(code) = status.code() {
        return std::process::ExitCode::from(code.clamp(0, 255) as u8);
    }
    if let Some(signal) = status.signal() {
        // SAFETY: no core file, the signal's default action, then the signal to itself.
        unsafe {
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &none);
            libc::signal(signal, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, signal);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), signal);
        }
        return std::process::ExitCode::from(128u8.saturating_add(signal as u8));
    }
    std::process::ExitCode::from(crate::error::FAILED)
}
