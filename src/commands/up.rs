//! `rollgate up`: starts every live release the root's state names that is not running (after
//! a reboot, or a crash), on the same port, in the same folder and environment the deployer
//! gives it, and records the new process where the old one was named. `--supervise` keeps
//! doing so, with backoff, and gives up on a release that keeps crashing (reported and logged,
//! left stopped) rather than restarting it for ever.
//!
//! The state is only changed under the root's lock; `--supervise` takes it for each restart
//! and skips a round while a deploy holds it, so it never fights a deployer.

use crate::defaults;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::engine;
use crate::error::Error;
use crate::host::identity::Identity;
use crate::host::journal::{self, LogEvent};
use crate::host::lock;
use crate::host::notify::{self, Notifier};
use crate::host::process;
use crate::host::signals::Signals;
use crate::host::state::Root;

/// A release that stayed up this long has stopped crashing: its count starts again.
const STABLE: Duration = Duration::from_secs(30);
/// How long a hung release gets between SIGTERM and SIGKILL.
const HUNG_GRACE: Duration = Duration::from_secs(5);
/// How long a dead notify-probed release's last datagrams are given to be read.
const NOTICES_SETTLE: Duration = Duration::from_millis(20);
/// How often `--supervise` looks.
const SUPERVISE_POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
pub struct Options {
    /// Every root to bring up (a host's services: one root each).
    pub roots: Vec<PathBuf>,
    pub supervise: bool,
    /// How long a started release may take to pass its probe.
    pub ready: Duration,
    pub max_restarts: u32,
    pub backoff: Duration,
}

/// One live process as the state names it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Live {
    pub(crate) service: String,
    /// A replica's slot (None: the single release `current` names).
    slot: Option<usize>,
    pub(crate) version: String,
    pub(crate) port: u16,
    pub(crate) identity: Identity,
    /// How it was started when it was deployed (its probe, held socket, confinement, limits,
    /// user, writable folders): it is started and probed so again.
    launch: crate::host::launch::LaunchRecord,
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

    /// What `--supervise` counts crashes by: a new deploy makes a new key.
    fn key(&self) -> Key {
        (self.slot, self.version.clone(), self.port)
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

/// Starts the release and waits until it passes its own probe (the one its gate used), or it
/// exits, or `ready` passes (it is left running: it is the live release, ready or not).
async fn start(
    root: &Root,
    live: &Live,
    ready: Duration,
    attempt: u64,
) -> Result<(Identity, String), String> {
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
    let output = match live.slot {
        Some(slot) => root.replica_output_path(&live.version, &live.service, slot),
        None => root.output_path(&live.version, &live.service),
    };
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
    let mut child = process::spawn(&process::Launch {
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
    })
    .map_err(|e| format!("cannot start {}: {e}", executable.display()))?;
    let pid = child.id().map_or(0, |p| p as i32);
    let identity = Identity::of(pid).unwrap_or(Identity { pid, start_time: 0 });
    let notifier = socket.map(|socket| socket.listen(pid, false));
    let subject = crate::host::probe::Subject {
        spec: live.launch.probe.clone(),
        port: live.port,
        workdir: root.release_dir(&live.version),
        notices: notifier.as_ref().map(|n| n.notices()),
        image: live.launch.image_of(&root.release_dir(&live.version)),
    };
    let deadline = tokio::time::Instant::now() + ready;
    let mut last = String::from("no probe yet");
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                // The release's words, with no secret value of the root in them.
                let secrets = crate::host::config::known_values(&crate::host::config::secrets_dir(&root.0));
                let tail = crate::host::config::redact(&crate::host::output::tail_settled(&output, 2, crate::host::output::SETTLE), &secrets);
                return Err(format!("exited with {status} before it was ready{}",
                    if tail.is_empty() { String::new() } else { format!("; output: {tail}") }));
            }
            _ = tokio::time::sleep_until(deadline) => {
                return Ok((identity, format!("pid {pid}, not ready after {} ms (last probe: {last})", ready.as_millis())));
            }
            _ = tokio::time::sleep(Duration::from_millis(50)) => {
                let (passed, probe) = subject.check().await;
                if passed {
                    return Ok((identity, format!("pid {pid}, ready ({probe})")));
                }
                if probe.is_fatal() {
                    return Ok((identity, format!("pid {pid}, not ready: {probe}")));
                }
                last = probe.to_string();
            }
        }
    }
}

fn log(root: &Root, live: &Live, event: LogEvent, pid: Option<i32>, detail: String) {
    let entry = journal::Entry {
        port: Some(live.port),
        pid,
        slot: live.slot,
        ..journal::Entry::new(event, &live.version, &live.service, detail)
    };
    if let Err(e) = journal::append(&root.log_path(), &entry) {
        eprintln!(
            "rollgate up: cannot append to {}: {e}",
            root.log_path().display()
        );
    }
}

/// Restarts one release that is not running; the caller holds the lock.
pub(crate) async fn restart(
    root: &Root,
    live: &Live,
    ready: Duration,
    attempt: u64,
    why: &str,
) -> Result<String, String> {
    let (new, how) = match start(root, live, ready, attempt).await {
        Ok(started) => started,
        Err(e) => {
            log(
                root,
                live,
                LogEvent::RestartFailed,
                None,
                format!("{why}; restart failed: {e}"),
            );
            return Err(e);
        }
    };
    if let Err(e) = engine::record_restart(root, live.slot, live.identity, new) {
        // Not ours to keep: the state names something else now.
        let stopped = process::stop_group(new, Duration::from_secs(5)).await;
        return Err(format!("{e}; the process started for it {stopped}"));
    }
    log(
        root,
        live,
        LogEvent::Restarted,
        Some(new.pid),
        format!("{why}; started again: {how}"),
    );
    Ok(how)
}

/// `rollgate up`: once, or for ever with `--supervise`. The text says what each release is.
pub fn up(options: Options) -> Result<String, Error> {
    let roots = options
        .roots
        .iter()
        .map(|root| Root::existing(root.clone()))
        .collect::<Result<Vec<Root>, _>>()?;
    crate::engine::runtime()?.block_on(async {
        let mut signals = Signals::install()?;
        // Each root in turn, under its own lock: one root that cannot be brought up does not
        // keep the others down.
        let (mut said, mut all_ok, mut failed) = (String::new(), true, Vec::new());
        for root in &roots {
            let (report, failed_here) = once(root, &options).await?;
            all_ok &= report.iter().all(|(ok, _)| *ok);
            said.push_str(&lines(root, &report, roots.len() > 1));
            failed.push(failed_here);
        }
        if !options.supervise {
            return if all_ok {
                Ok(said)
            } else {
                Err(Error::Failed(said))
            };
        }
        eprint!("{said}");
        // The roots' webhooks are sent while they are supervised (one sender at a time).
        let sending = roots.clone();
        std::thread::spawn(move || crate::webhooks::keep_sending(sending, || true));
        // One supervisor per root, all stopped by the first signal.
        let (stop, stopped) = tokio::sync::watch::channel(None);
        let mut supervisors = tokio::task::JoinSet::new();
        for (root, failed) in roots.into_iter().zip(failed) {
            let (options, stopped) = (options.clone(), stopped.clone());
            supervisors.spawn(async move { supervise(&root, &options, failed, stopped).await });
        }
        let name = tokio::select! {
            name = signals.recv() => name,
            ended = supervisors.join_next() => match ended {
                Some(Ok(Err(e))) => return Err(e),
                _ => "the end of a supervisor",
            },
        };
        let _ = stop.send(Some(name));
        while supervisors.join_next().await.is_some() {}
        Ok(format!(
            "rollgate up: stopped by {name}; the releases keep running\n"
        ))
    })
}

/// A root's lines; with several roots, under the root's name.
fn lines(root: &Root, report: &[(bool, String)], several: bool) -> String {
    let mut out = match several {
        true => format!("{}:\n", root.0.display()),
        false => String::new(),
    };
    if report.is_empty() {
        out.push_str("nothing is live under this root\n");
    }
    for (_, line) in report {
        out.push_str(&format!("{line}\n"));
    }
    out
}

/// A release's identity for counting its crashes: a new deploy makes a new key.
type Key = (Option<usize>, String, u16);

/// One pass under the lock: finish what a dead deployer left, then start what is not running.
/// Returns a line per release, and the releases that could not be started.
async fn once(root: &Root, options: &Options) -> Result<(Vec<(bool, String)>, Vec<Key>), Error> {
    let _lock = lock::acquire(&root.lock_path())?;
    engine::recover_leaving_escalated(root).await?;
    let mut report = Vec::new();
    let mut failed = Vec::new();
    // A service a person stopped is left stopped (a boot included).
    if let Some(stopped) = crate::host::stopped::read(&root.0)? {
        report.push((
            true,
            format!(
                "{}: {}; `rollgate start {}` starts it",
                stopped.service,
                stopped.words(),
                stopped.service
            ),
        ));
        return Ok((report, failed));
    }
    for (n, live) in live_set(root).map_err(Error::Refused)?.iter().enumerate() {
        if live.identity.is_running() {
            report.push((
                true,
                format!("{}: running (pid {})", live.name(), live.identity.pid),
            ));
            continue;
        }
        let why = format!("pid {} was not running (rollgate up)", live.identity.pid);
        match restart(root, live, options.ready, n as u64, &why).await {
            Ok(how) => report.push((true, format!("{}: started ({how})", live.name()))),
            Err(e) => {
                failed.push(live.key());
                report.push((false, format!("{}: NOT started: {e}", live.name())));
            }
        }
    }
    Ok((report, failed))
}

/// Keeps a reader on the socket of every running notify-probed live release (bound again: the
/// release proved readiness before), and lets go of those no longer live.
fn read_notifications(set: &[Live], notifiers: &mut HashMap<Identity, Notifier>) {
    notifiers.retain(|who, _| set.iter().any(|l| l.identity == *who));
    for live in set.iter().filter(|l| l.launch.probe.is_notify()) {
        if live.identity.is_running() && !notifiers.contains_key(&live.identity) {
            // Not waiting for a holder: whoever holds it now watches it; try next round.
            if let Some(notifier) = Notifier::watch_live(live.identity.pid, Duration::ZERO) {
                notifiers.insert(live.identity, notifier);
            }
        }
    }
}

/// Why a release counts as hung, like systemd's `WatchdogSec=`: it asked to be
/// (`WATCHDOG=trigger`) or sent no `WATCHDOG=1` for longer than the policy's `watchdog_ms`.
fn hang(notifier: &Notifier, probe: &crate::host::probe::Spec) -> Option<String> {
    let said = notifier.notices().borrow().clone();
    if said.watchdog_triggered {
        return Some("it sent WATCHDOG=trigger".into());
    }
    let since = said.watchdog_missed(probe.watchdog()?)?;
    Some(format!("no WATCHDOG=1 for {} ms", since.as_millis()))
}

/// Per release: restarts in a row that did not stay up, and when the next may happen.
#[derive(Debug, Default)]
struct Crashes {
    in_a_row: u32,
    last_start: Option<Instant>,
    next_allowed: Option<Instant>,
    given_up: bool,
}

async fn supervise(
    root: &Root,
    options: &Options,
    failed_at_start: Vec<Key>,
    mut stopped: tokio::sync::watch::Receiver<Option<&'static str>>,
) -> Result<String, Error> {
    // A release the first pass could not start has exited once already.
    let mut crashes: HashMap<Key, Crashes> = failed_at_start
        .into_iter()
        .map(|key| {
            let crashed = Crashes {
                in_a_row: 1,
                last_start: Some(Instant::now()),
                next_allowed: Some(Instant::now() + options.backoff),
                given_up: false,
            };
            (key, crashed)
        })
        .collect();
    let mut attempt = 1000u64;
    // What notify-probed live releases say, and the hung ones this supervisor stopped (why).
    let mut notifiers: HashMap<Identity, Notifier> = HashMap::new();
    let mut hung: HashMap<Identity, String> = HashMap::new();
    loop {
        tokio::select! {
            _ = stopped.changed() => return Ok(String::new()),
            _ = tokio::time::sleep(SUPERVISE_POLL) => {}
        }
        if !root.0.is_dir() {
            return Err(Error::Failed(format!(
                "root {} is gone; nothing left to supervise",
                root.0.display()
            )));
        }
        // Stopped by a person: nothing of it is brought back until `rollgate start`.
        if crate::host::stopped::read(&root.0).ok().flatten().is_some() {
            continue;
        }
        let Ok(set) = live_set(root) else { continue };
        if lock::is_free(&root.lock_path()) {
            read_notifications(&set, &mut notifiers);
        } else {
            // A deploy or rollout holds the root: its own executor reads the sockets now.
            notifiers.clear();
        }
        stop_the_hung(root, &set, &notifiers, &mut hung).await;
        let dead: Vec<&Live> = set.iter().filter(|l| !l.identity.is_running()).collect();
        if dead.iter().any(|l| notifiers.contains_key(&l.identity)) {
            // What a release said just before it exited (STOPPING=1) may still be queued on
            // its socket: the readers get a turn before it is judged.
            tokio::time::sleep(NOTICES_SETTLE).await;
        }
        for live in dead {
            revive(
                root,
                options,
                live,
                &mut crashes,
                &notifiers,
                &mut hung,
                &mut attempt,
            )
            .await;
        }
    }
}

/// Stops each running release whose notifications say it hangs (a missed watchdog, an
/// ERRNO=), under the lock and only if the state still names it, so the next round restarts it.
async fn stop_the_hung(
    root: &Root,
    set: &[Live],
    notifiers: &HashMap<Identity, Notifier>,
    hung: &mut HashMap<Identity, String>,
) {
    for live in set.iter().filter(|l| l.identity.is_running()) {
        let Some(why) = notifiers
            .get(&live.identity)
            .and_then(|n| hang(n, &live.launch.probe))
        else {
            continue;
        };
        let Ok(_lock) = lock::acquire(&root.lock_path()) else {
            continue;
        };
        if !live_set(root).is_ok_and(|now| now.contains(live)) {
            continue;
        }
        eprintln!(
            "rollgate up: {}: {why}; stopping it to start it again",
            live.name()
        );
        process::stop_group(live.identity, HUNG_GRACE).await;
        hung.insert(live.identity, why);
    }
}

/// One release found not running: restarted now (an orderly stop, or a crash once its backoff
/// allows), or given up after `max_restarts` crashes in a row; left alone while a deploy holds
/// the root.
async fn revive(
    root: &Root,
    options: &Options,
    live: &Live,
    crashes: &mut HashMap<Key, Crashes>,
    notifiers: &HashMap<Identity, Notifier>,
    hung: &mut HashMap<Identity, String>,
    attempt: &mut u64,
) {
    let entry = crashes.entry(live.key()).or_default();
    // A release that said STOPPING=1 before it exited stopped in order: not a crash.
    let orderly = !hung.contains_key(&live.identity)
        && notifiers
            .get(&live.identity)
            .is_some_and(|n| n.notices().borrow().stopping);
    let waits = entry.next_allowed.is_some_and(|t| Instant::now() < t);
    if entry.given_up || (waits && !orderly) {
        return;
    }
    // A deploy holds the lock: it owns the state now; look again next round.
    let Ok(_lock) = lock::acquire(&root.lock_path()) else {
        return;
    };
    // What a deployer that died left is finished first (a watch it cut short decides
    // whether its release stays): never restart a release it had not promoted yet.
    if let Err(e) = engine::recover_leaving_escalated(root).await {
        eprintln!("rollgate up: {e}");
        return;
    }
    // Read again under the lock: the deploy that just let go may have replaced it.
    if !live_set(root).is_ok_and(|now| now.contains(live)) {
        return;
    }
    if orderly {
        *attempt += 1;
        let why = format!(
            "pid {} stopped in order (it sent STOPPING=1); not counted as a crash",
            live.identity.pid
        );
        entry.last_start = Some(Instant::now());
        match restart(root, live, options.ready, *attempt, &why).await {
            Ok(how) => eprintln!("rollgate up: {}: restarted ({how})", live.name()),
            Err(e) => eprintln!("rollgate up: {}: restart failed: {e}", live.name()),
        }
        return;
    }
    // This exit, counted with those before it unless the release had stayed up.
    let stayed_up = entry.last_start.is_some_and(|t| t.elapsed() >= STABLE);
    entry.in_a_row = if stayed_up { 1 } else { entry.in_a_row + 1 };
    if entry.in_a_row >= options.max_restarts {
        entry.given_up = true;
        let detail = format!(
                "exited {} times in a row, each within {} s of its start; not restarted again (left stopped) until the next deploy or `rollgate up`",
                entry.in_a_row,
                STABLE.as_secs()
            );
        eprintln!("rollgate up: {}: {detail}", live.name());
        log(root, live, LogEvent::RestartGivenUp, None, detail);
        return;
    }
    *attempt += 1;
    let how_it_ended = match hung.remove(&live.identity) {
        Some(why) => format!("hung ({why}) and was stopped"),
        None => "exited".to_string(),
    };
    let why = format!(
        "pid {} {how_it_ended} ({} in a row; given up at {})",
        live.identity.pid, entry.in_a_row, options.max_restarts
    );
    entry.last_start = Some(Instant::now());
    let backoff = options
        .backoff
        .saturating_mul(1 << (entry.in_a_row - 1).min(16))
        .min(defaults::UP_MAX_BACKOFF);
    entry.next_allowed = Some(Instant::now() + backoff);
    match restart(root, live, options.ready, *attempt, &why).await {
        Ok(how) => eprintln!("rollgate up: {}: restarted ({how})", live.name()),
        Err(e) => eprintln!("rollgate up: {}: restart failed: {e}", live.name()),
    }
}
