//! `rollgate keep`: the keeper of one release process (issue 68; `host::keeper` starts it).
//!
//! A keeper restarts its release only when the state names that very process as live, no run
//! is in flight (a run owns its processes: its own gate, watch and soak judge an exit) and
//! nobody stopped the service; every restart happens under the root's lock, after reading the
//! state again, so two keepers, or a keeper and `up`, never start one release twice. Restarts
//! back off (1 s doubling to 60 s) and are given up after five exits in a row that did not stay
//! up 30 s; a crash loop right after the switch is rolled back instead (policy `crash_loop`).
//! Any other end lets the release go, and the keeper ends as its release did.

use std::time::{Duration, Instant};

use super::standby::{self, Standby};
use super::supervise::{launch, live_set, log, restart_token, said_last, Live, Spawn};
use crate::defaults;
use crate::engine;
use crate::host::identity::Identity;
use crate::host::journal::{self, LogEvent};
use crate::host::keeper::{self, Backoff, Registration, Spec};
use crate::host::lock;
use crate::host::notify;
use crate::host::process;
use crate::host::state::Root;

/// A release that stayed up this long has stopped crashing: its count starts again.
const STABLE: Duration = Duration::from_secs(30);

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

/// `rollgate keep`: reads its spec on stdin, starts (or adopts) the release, says so, and keeps
/// it. Its exit is its release's when it lets the release end.
pub fn keep_main() -> u8 {
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
            return crate::error::FAILED;
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(keep(spec)),
        Err(e) => {
            keeper::report(&format!("error its keeper could not start: {e}"));
            crate::error::FAILED
        }
    }
}

async fn keep(spec: Spec) -> u8 {
    // A terminal's or a session's end is not the release's: caught and left unread, not
    // ignored, so the release (whose exec resets caught signals) gets them as it would anywhere.
    use tokio::signal::unix::{signal, SignalKind};
    let _caught = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    );
    let root = Root(spec.root.clone());
    // Orphans of the release come here, not to PID 1, and are reaped at once (issue 81, 6).
    crate::host::reaper::become_subreaper();
    let Ok(children) = signal(SignalKind::child()) else {
        keeper::report("error its keeper could not watch its children");
        return crate::error::FAILED;
    };
    let (watched, release, said) = match spec.adopt {
        Some(who) => (
            Watched::Adopted(crate::host::identity::pidfd(who)),
            who,
            "adopted".to_string(),
        ),
        None => match process::spawn(&spec.launch()) {
            Ok(child) => {
                let pid = child.id().map_or(0, |p| p as i32);
                let who = Identity::of(pid).unwrap_or(Identity { pid, start_time: 0 });
                let said = format!("started {} {}", who.pid, who.start_time);
                (Watched::Child(child), who, said)
            }
            Err(e) => {
                keeper::report(&format!("error {e}"));
                return crate::error::FAILED;
            }
        },
    };
    if std::env::var(keeper::KEEPER_FAULT).is_ok_and(|f| f == "dies-before-report") {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
    if spec.listen {
        // The release has its own copy of the held socket; a restart asks the holder again.
        // SAFETY: closes this process's fd 3, which its starter put there for the release.
        unsafe {
            libc::close(crate::host::listen::FIRST_FD);
        }
    }
    // Registered before its starter hears of it: a starter killed right after, and the `up`
    // that follows, find the release kept (not adopted a second time). Unregistered (the
    // folder could not be written), it still keeps its release; `up` would give the release a
    // second keeper, which restarts nothing the first one did.
    let registration = Registration::new(&root.0, release).ok();
    keeper::report(&said);
    let Ok(terminate) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return crate::error::FAILED;
    };
    let keeper = Keeper {
        root,
        spec,
        release,
        registration,
        terminate,
        children,
        crashes: Crashes {
            in_a_row: 0,
            last_start: Instant::now(),
            next_allowed: None,
        },
        attempt: 0,
        since_switch: Vec::new(),
        rollback_tried: None,
        standby: None,
        wants_standby: None,
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
    /// SIGCHLD: a child ended — the release, its standby, or an orphan of theirs to reap.
    children: tokio::signal::unix::Signal,
    crashes: Crashes,
    attempt: u64,
    /// How each exit since the release's switch ended, while within the crash-loop window.
    since_switch: Vec<String>,
    /// A crash-loop rollback that could not happen, and why (not tried again).
    rollback_tried: Option<String>,
    /// The release live before this one, running beside it through its crash-loop window.
    standby: Option<Standby>,
    /// A standby to start once the release runs again, with the end of its window.
    wants_standby: Option<tokio::time::Instant>,
}

/// What befalls a standby: it ends (stopped by someone, or on its own), or its window does.
enum StandbyEvent {
    Ended(Option<std::process::ExitStatus>),
    WindowOver,
}

/// The next thing to befall `standby`; never, when there is none.
async fn next_for(standby: &mut Option<Standby>) -> StandbyEvent {
    match standby {
        Some(standby) => tokio::select! {
            status = standby.launched.child.wait() => StandbyEvent::Ended(status.ok()),
            _ = tokio::time::sleep_until(standby.until) => StandbyEvent::WindowOver,
        },
        None => std::future::pending().await,
    }
}

impl Keeper {
    /// Keeps the release (and its standby, while it has one); ends as [`Keeper::keep_watching`]
    /// does, with no standby left running.
    async fn run(mut self, watched: Watched) -> u8 {
        let code = self.keep_watching(watched).await;
        if let Some(standby) = self.standby.take() {
            // Not under the lock (whoever asked this keeper to go may hold it): its entry in
            // `current` is retired by the next pass, which finds its token left behind.
            process::stop_group(standby.live.identity, standby.live.launch.grace()).await;
        }
        // What its release's tree left exiting is reaped before the keeper goes (it would
        // pass to PID 1 otherwise).
        self.reap_orphans();
        code
    }

    /// Reaps the orphans reparented to this keeper (never its release or standby, whose ends
    /// are awaited).
    fn reap_orphans(&self) {
        let standby = self.standby.as_ref().map(|s| s.live.identity.pid);
        let awaited: Vec<i32> = std::iter::once(self.release.pid).chain(standby).collect();
        crate::host::reaper::reap_orphans(&awaited);
    }

    /// Watches the release until it ends, then starts it again or lets it go (ending so).
    async fn keep_watching(&mut self, mut watched: Watched) -> u8 {
        let mut notes = Notes::default();
        // Only a notify-probed release has anything to read: the others cost no wake-ups.
        let every = match self.spec.record.probe.is_notify() {
            true => LOOK,
            false => Duration::from_secs(3600),
        };
        let mut look = tokio::time::interval(every);
        // Whether its root still exists, looked at now and then.
        let mut gone = tokio::time::interval(ROOT_LOOK);
        gone.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let status = tokio::select! {
                // Asked to stop: the release keeps running (`up` gives it a keeper again).
                _ = self.terminate.recv() => return 0,
                status = watched.end() => status,
                _ = gone.tick() => {
                    if self.root.0.is_dir() {
                        continue;
                    }
                    // Its root was removed: nothing can name, stop or start it any more.
                    process::stop_group(self.release, self.spec.record.grace()).await;
                    return 0;
                }
                _ = look.tick() => {
                    notes.look(&self.root, self.release, &self.spec.record.probe).await;
                    continue;
                }
                event = next_for(&mut self.standby) => {
                    self.after_standby(event).await;
                    continue;
                }
                _ = self.children.recv() => {
                    self.reap_orphans();
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
            if let Some(until) = self.wants_standby.take() {
                self.bring_standby(until).await;
            }
        }
    }

    /// Starts the release live before this one as its standby (see `supervision::standby`); why
    /// not, logged, when it cannot be.
    async fn bring_standby(&mut self, until: tokio::time::Instant) {
        let Some(live) = keeps_it(&self.root, self.release) else {
            return;
        };
        self.attempt += 1;
        let token = restart_token(self.attempt);
        if let Some(registration) = self.registration.as_mut() {
            let _ = registration.standby(Some(&token));
        }
        match standby::bring(&self.root, &live, self.attempt, until).await {
            Ok(standby) => self.standby = Some(standby),
            Err(why) => {
                if let Some(registration) = self.registration.as_mut() {
                    let _ = registration.standby(None);
                }
                let detail = format!(
                    "no standby for {} through its crash-loop window: {why}",
                    live.name()
                );
                log(&self.root, &live, LogEvent::Standby, None, None, detail);
            }
        }
    }

    /// Its standby ended or its window did: retired (out of `current`, stopped, logged).
    async fn after_standby(&mut self, event: StandbyEvent) {
        let why = match &event {
            StandbyEvent::WindowOver => format!(
                "the crash-loop window of {} ended",
                self.standby
                    .as_ref()
                    .map_or("", |s| s.live.service.as_str())
            ),
            StandbyEvent::Ended(status) => format!(
                "it ended ({})",
                status.map_or("its status unknown".into(), |s| s.to_string())
            ),
        };
        let lock = lock::acquire(&self.root.lock_path());
        if let (StandbyEvent::WindowOver, Err(_), Some(standby)) =
            (&event, &lock, self.standby.as_mut())
        {
            // A run holds the root (and retires the standby itself): looked at again soon.
            standby.until = tokio::time::Instant::now() + Duration::from_secs(1);
            return;
        }
        let Some(standby) = self.standby.take() else {
            return;
        };
        if lock.is_ok() {
            let _ = engine::retire_standby(&self.root, &why).await;
        }
        // Whatever `current` says now, this keeper's standby does not outlive its window.
        process::stop_group(standby.live.identity, standby.live.launch.grace()).await;
        if let Some(registration) = self.registration.as_mut() {
            let _ = registration.standby(None);
        }
    }

    /// This keeper keeps its standby from now on: made live in its release's place.
    fn keep_the_standby(&mut self, standby: Standby) -> tokio::process::Child {
        self.release = standby.live.identity;
        if let Some(registration) = self.registration.as_mut() {
            let _ = registration.standby(None);
            let _ = registration.keeps(self.release);
        }
        self.spec.record = standby.live.launch.clone();
        self.crashes = Crashes {
            in_a_row: 0,
            last_start: Instant::now(),
            next_allowed: None,
        };
        self.since_switch.clear();
        self.rollback_tried = None;
        standby.launched.child
    }

    /// After the release ended: started again (its new process, to watch), or let go (the
    /// code this keeper ends with: its release's).
    async fn after_end(
        &mut self,
        status: Option<std::process::ExitStatus>,
        mut words: String,
        mut orderly: bool,
    ) -> Result<tokio::process::Child, u8> {
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
                    let because = self.because(&live);
                    if let Some(standby) = self.standby.take() {
                        // Ready beside it already: made live with no start and no port to find.
                        match standby::make_live(&root, &live, &standby, &because) {
                            Ok(()) => return Ok(self.keep_the_standby(standby)),
                            // Left for its window's end (or the rollback's run) to retire.
                            Err(_) => self.standby = Some(standby),
                        }
                    }
                    drop(lock);
                    match self.roll_back(&live, status, &because).await {
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
            // What its ended process left running (a `/bin/sh -c` line's program, a fork) goes
            // with it before it starts again: it would run beside the next copy — two clocks
            // (issue 81, 6). Its tree's rest, or its process group where it has no tree. (Only
            // when it is started again: a candidate's end is its deploy's to judge and clean.)
            process::stop_group(self.release, self.spec.record.grace()).await;
            self.reap_orphans();
            self.crashes.last_start = Instant::now();
            // Started and recorded under the lock, then let go of it: a deploy is never kept
            // waiting while the release gets ready.
            if let Some(registration) = self.registration.as_mut() {
                let _ = registration.starting(self.release, &restart_token(self.attempt));
            }
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
    /// policy's `crash_loop.restarts` exits within `within_ms` of its switch — of `current`'s
    /// for a single release, of the end of the rollout that placed it for a replica.
    fn crash_loop(&mut self, live: &Live, words: &str) -> bool {
        let rule = live.launch.crash_loop;
        if rule.restarts == 0 {
            return false;
        }
        let Some(switched_at) = self.switched_at(live) else {
            return false;
        };
        let since = journal::now() - switched_at;
        if since * 1000.0 > rule.within_ms as f64 {
            self.since_switch.clear();
            return false;
        }
        self.since_switch.push(words.to_string());
        let first = self.since_switch.len() == 1;
        // A standby is web's (the proxy's fallback); another type's process has none.
        let web = live.slot.is_none() && live.process.is_none();
        if first && web && rule.restarts >= 2 && self.standby.is_none() {
            let left = rule.within_ms as f64 / 1000.0 - since;
            self.wants_standby =
                Some(tokio::time::Instant::now() + Duration::from_secs_f64(left.max(0.0)));
        }
        self.since_switch.len() >= rule.restarts as usize
    }

    /// When the release this keeper keeps went live: `current`'s switch to it (for another
    /// type's process, to its release); for a replica, the end of its place in the completed
    /// rollout that moved the set to its version from another (one there is something to go
    /// back to). None: not a switch to judge.
    fn switched_at(&self, live: &Live) -> Option<f64> {
        if live.process.is_some() {
            // Another type's process: its release's switch (web's, the release's last step).
            return self
                .root
                .read_pointer()
                .ok()
                .flatten()
                .filter(|p| p.service == live.service && p.version == live.version)
                .map(|p| p.promoted_at);
        }
        let Some(slot) = live.slot else {
            return self
                .root
                .read_pointer()
                .ok()
                .flatten()
                .filter(|p| p.names(self.release))
                .map(|p| p.promoted_at);
        };
        let run = engine::saved_run(&self.root).ok().flatten()?;
        let moved = run.phase == engine::Phase::Completed
            && run.to == live.version
            && run.from.as_ref().is_some_and(|from| *from != live.version);
        moved.then_some(())?;
        run.slots.iter().find(|s| s.slot == slot)?.finished
    }

    /// Why the crash loop is rolled back: its exits since the switch.
    fn because(&self, live: &Live) -> String {
        let since = self.switched_at(live).map_or(0.0, |at| journal::now() - at);
        format!(
            "a crash loop: it exited {} times within {since:.1} s of its switch ({})",
            self.since_switch.len(),
            self.since_switch.join("; ")
        )
    }

    /// Rolls the crash-looping release back to the one live before it: `rollgate rollback`,
    /// through the gate, its `rolled_back` line naming the exits. The code this keeper then
    /// ends with, or why it could not.
    async fn roll_back(
        &mut self,
        live: &Live,
        status: Option<std::process::ExitStatus>,
        because: &str,
    ) -> Result<u8, String> {
        let mut command = tokio::process::Command::new("/proc/self/exe");
        command
            .args(["rollback", &live.service, "--because", because])
            .args(["--from", &live.version, "--root"])
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

/// How often a keeper looks whether its root still exists.
const ROOT_LOOK: Duration = Duration::from_secs(5);
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
) -> u8 {
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
fn mirror(status: Option<std::process::ExitStatus>) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    let Some(status) = status else {
        return crate::error::FAILED;
    };
    if let Some(code) = status.code() {
        return code.clamp(0, 255) as u8;
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
        return 128u8.saturating_add(signal as u8);
    }
    crate::error::FAILED
}
