//! Keeping what was deployed running (issue 68): the live set as the state names it, the
//! restart every path shares (a keeper's, `up`'s, `start`'s), and the pass that gives every live
//! release a keeper (`up`, `up --supervise`, the end of each run). The keeper itself — what it
//! does when its release ends — is `supervision::keep`.

use std::time::Duration;

use crate::defaults;
use crate::engine;
use crate::error::Error;
use crate::host::identity::Identity;
use crate::host::journal::{self, LogEvent};
use crate::host::keeper::{self, Backoff, Spec};
use crate::host::notify;
use crate::host::process;
use crate::host::state::Root;

/// One live process as the state names it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Live {
    pub(crate) service: String,
    /// A replica's slot (None: the single release `current` names, or another type's process).
    pub(crate) slot: Option<usize>,
    /// Another type's process (`formation.json`): its type and place (None: web).
    pub(crate) process: Option<(String, usize)>,
    pub(crate) version: String,
    pub(crate) port: u16,
    pub(crate) identity: Identity,
    /// How it was started when it was deployed (its probe, held socket, confinement, limits,
    /// user, writable folders): it is started and probed so again.
    pub(crate) launch: crate::host::launch::LaunchRecord,
}

impl Live {
    pub(crate) fn name(&self) -> String {
        if let Some((process_type, index)) = &self.process {
            return format!("{} {} ({process_type}.{index})", self.service, self.version);
        }
        match self.slot {
            Some(slot) => format!(
                "{} {} (replica {slot}, port {})",
                self.service, self.version, self.port
            ),
            None => format!("{} {} (port {})", self.service, self.version, self.port),
        }
    }

    pub(crate) fn output(&self, root: &Root) -> std::path::PathBuf {
        if let Some((process_type, index)) = &self.process {
            return root.process_output_path(&self.version, &self.service, process_type, *index);
        }
        match self.slot {
            Some(slot) => root.replica_output_path(&self.version, &self.service, slot),
            None => root.output_path(&self.version, &self.service),
        }
    }
}

/// What the state names as live: every process of the formation (`engine::formation`), web's
/// as the proxy's views name them now.
pub(crate) fn live_set(root: &Root) -> Result<Vec<Live>, String> {
    let Some(formation) = engine::formation::read(root).map_err(|e| e.to_string())? else {
        return Ok(Vec::new());
    };
    let web_replicas = formation.web_replicas;
    Ok(formation
        .processes
        .into_iter()
        .map(|p| {
            let web = p.process_type == crate::host::state::WEB;
            Live {
                service: formation.service.clone(),
                slot: (web && web_replicas).then_some(p.index),
                identity: p.identity(),
                process: (!web).then(|| (p.process_type.clone(), p.index)),
                version: p.version,
                port: p.port.unwrap_or(0),
                launch: p.launch,
            }
        })
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
    /// It passed its probe (else it is running, not known to be ready).
    pub(crate) ready: bool,
    /// Started through a keeper that was killed while it was waited for: it runs, unkept.
    pub(crate) keeper_lost: bool,
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

/// The token a process started again carries (`ROLLGATE_DEPLOY_TOKEN`, its tree's label): this
/// process's pid and the attempt, so a keeper can say it before the start (see
/// `keeper::Registration::starting`).
pub(crate) fn restart_token(attempt: u64) -> String {
    format!("up-{}-{attempt}", std::process::id())
}

/// A release process just started again, not yet known to be ready.
pub(crate) struct Launched {
    /// The release itself, or (`kept`) its keeper, whose child it is.
    pub(crate) child: tokio::process::Child,
    kept: bool,
    pub(crate) identity: Identity,
    subject: crate::host::probe::Subject,
    /// Reads what a notify-probed release says while it is waited for.
    _notifier: Option<notify::Notifier>,
    output: std::path::PathBuf,
}

/// Starts the release as `live` records it was started (through a keeper or directly).
pub(crate) fn launch(
    root: &Root,
    live: &Live,
    attempt: u64,
    spawn: Spawn,
) -> Result<Launched, String> {
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
    let token = restart_token(attempt);
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
        // As its deploy bounded it (the launch record keeps the policy's).
        rotation: live.launch.rotation(),
        listen: held.as_ref().map(std::os::fd::AsRawFd::as_raw_fd),
        record: &live.launch,
        root: &root.0,
        grace: live.launch.grace(),
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
        root: root.0.clone(),
        launch: live.launch.clone(),
    };
    Ok(Launched {
        child,
        kept: matches!(spawn, Spawn::Kept(_)),
        identity,
        subject,
        _notifier: notifier,
        output,
    })
}

impl Launched {
    /// Waits until it passes its probe (how it went, in words), or it exits (the error), or
    /// `ready` passes (it is left running: it is the live release, ready or not).
    async fn ready(&mut self, root: &Root, ready: Duration) -> Result<Started, String> {
        let pid = self.identity.pid;
        let deadline = tokio::time::Instant::now() + ready;
        let mut last = String::from("no probe yet");
        // A keeper killed is not its release ending (issue 80: the release ran on, unkept and
        // named by nothing, and the next start gave a second copy): from then on the release
        // itself is watched.
        let mut keeper_lost = false;
        let (how, passed) = loop {
            tokio::select! {
                status = self.child.wait(), if !keeper_lost => {
                    if self.kept && self.identity.is_running() {
                        keeper_lost = true;
                        continue;
                    }
                    let status = process::ended_words(status, Some(&self.identity));
                    let tail = said_last(root, &self.output);
                    return Err(format!("exited with {status} before it was ready{tail}"));
                }
                _ = tokio::time::sleep_until(deadline) => {
                    break (format!("pid {pid}, not ready after {} ms (last probe: {last})", ready.as_millis()), false);
                }
                _ = tokio::time::sleep(Duration::from_millis(50)) => {
                    if keeper_lost && !self.identity.is_running() {
                        let tail = said_last(root, &self.output);
                        return Err(format!("exited before it was ready (its keeper was killed before it){tail}"));
                    }
                    let (passed, probe) = self.subject.check().await;
                    if passed {
                        break (format!("pid {pid}, ready ({probe})"), true);
                    }
                    if probe.is_fatal() {
                        break (format!("pid {pid}, not ready: {probe}"), false);
                    }
                    last = probe.to_string();
                }
            }
        };
        let (how, passed) = match (passed, self.subject.launch.min_ready_ms) {
            (true, Some(ms)) => match self
                .hold(root, Duration::from_millis(ms), &mut keeper_lost)
                .await?
            {
                None => (how, true),
                Some(lapse) => (format!("pid {pid}, {lapse}"), false),
            },
            _ => (how, passed),
        };
        Ok(Started {
            identity: self.identity,
            how,
            ready: passed,
            keeper_lost,
        })
    }

    /// After its probe first passed: it must stay up and pass at every poll for `held` (as its
    /// deploy's gate held it) — an exit is the error, a failed probe the words of the lapse.
    async fn hold(
        &mut self,
        root: &Root,
        held: Duration,
        keeper_lost: &mut bool,
    ) -> Result<Option<String>, String> {
        let ready_at = tokio::time::Instant::now();
        let since = || ready_at.elapsed().as_millis();
        loop {
            tokio::select! {
                biased;
                status = self.child.wait(), if !*keeper_lost => {
                    if self.kept && self.identity.is_running() {
                        *keeper_lost = true;
                        continue;
                    }
                    let status = process::ended_words(status, Some(&self.identity));
                    let tail = said_last(root, &self.output);
                    return Err(format!(
                        "exited with {status} {} ms after it was first ready (it must stay up {} ms){tail}",
                        since(),
                        held.as_millis()
                    ));
                }
                _ = tokio::time::sleep_until(ready_at + held) => return Ok(None),
                _ = tokio::time::sleep(Duration::from_millis(50)) => {
                    if *keeper_lost && !self.identity.is_running() {
                        let tail = said_last(root, &self.output);
                        return Err(format!("exited {} ms after it was first ready (its keeper was killed before it){tail}", since()));
                    }
                    let (passed, probe) = self.subject.check().await;
                    if !passed {
                        return Ok(Some(format!(
                            "stopped being ready ({probe}) {} ms after it was first ready",
                            since()
                        )));
                    }
                }
            }
        }
    }

    /// [`Launched::ready`] for a process that must pass its probe within `within`: one that
    /// does not is an error (and left running: the caller stops it).
    pub(crate) async fn passes(&mut self, root: &Root, within: Duration) -> Result<Started, Error> {
        match self.ready(root, within).await {
            Ok(started) if started.ready => Ok(started),
            Ok(started) => Err(Error::Failed(started.how)),
            Err(e) => Err(Error::Failed(e)),
        }
    }
}

/// "; output: …": the release's last words, with no secret value of the root in them.
pub(crate) fn said_last(root: &Root, output: &std::path::Path) -> String {
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
        process: live.process.as_ref().map(|(t, n)| format!("{t}.{n}")),
        ..journal::Entry::new(event, &live.version, &live.service, detail)
    };
    super::say(root, &entry);
}

/// Restarts one release that is not running (`ended` says how its process ended, when its
/// keeper saw it); the caller holds the lock. What its last process left goes first — a child
/// still holding its port or its files, a leader whose threads are still on their way out — so
/// the new one never meets it (a `start` after a killed `stop` found the port taken).
pub(crate) async fn restart(
    root: &Root,
    live: &Live,
    ready: Duration,
    attempt: u64,
    (why, ended): (&str, Option<&str>),
    spawn: Spawn,
) -> Result<Started, String> {
    // With the release's own grace, as `stop` gives it: a child finishing its work on SIGTERM
    // (a worker's job, a server's last requests) is let finish as the policy allows.
    let left = match process::stop_group(live.identity, live.launch.grace()).await {
        process::Stopped::AlreadyGone => None,
        stopped => Some(format!("what its last process left {stopped}")),
    };
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
    let mut how = started.how.clone();
    if let Some(left) = left {
        how.push_str(&format!("; {left}"));
    }
    if started.keeper_lost {
        // Named now, so kept again as any running live release is.
        let spec = Spec::adopting(
            &root.0,
            &live.service,
            started.identity,
            &live.launch,
            &live.output(root),
            Backoff::default(),
        );
        match keeper::adopt(&spec) {
            Ok(_) => how.push_str("; its keeper was killed while it started, and it has a new one"),
            Err(e) => how.push_str(&format!(
                "; its keeper was killed while it started, and it is NOT kept: {e}"
            )),
        }
    }
    log(
        root,
        live,
        LogEvent::Restarted,
        Some(started.identity.pid),
        ended,
        format!("{why}; started again: {how}"),
    );
    Ok(Started { how, ..started })
}

/// [`restart`] for several processes of the formation at once (`attempt` tells their tokens
/// apart), each held to its own readiness as a deploy holds them; their results in order.
/// They start one after another (a keeper says each started) and are then waited for
/// together: a formation of slow-to-prove workers starts in the time of its slowest.
pub(crate) async fn restart_together<'a>(
    root: &Root,
    dead: impl Iterator<Item = (&'a Live, u64, &'a str)>,
    ready: Duration,
    spawn: Spawn,
) -> Vec<Result<Started, String>> {
    let restarts =
        dead.map(|(live, attempt, why)| restart(root, live, ready, attempt, (why, None), spawn));
    futures_util::future::join_all(restarts).await
}

/// Every live release under `root` kept, the caller holding the lock: one running without a
/// keeper is given one; one not running is started again through a keeper (what it left
/// behind stopped first, so no second copy ever serves beside it), unless `dead` says to leave
/// one whose keeper gave up on it. A line per release, and one per stray stopped.
pub(crate) async fn ensure(
    root: &Root,
    ready: Duration,
    backoff: Backoff,
    dead: Dead<'_>,
) -> Result<Vec<Found>, Error> {
    let mut report = Vec::new();
    let kept = keeper::kept(&root.0, true);
    for stray in stop_strays(root, &kept).await {
        report.push(Found::Done(stray));
    }
    if !kept.abandoned_standbys.is_empty() {
        // A standby outlives its keeper only until here: nobody would retire it at its window's
        // end, nor make it live — unless it was made live (its keeper killed right after that
        // switch): then it is kept below, as any live release.
        let (live, _) = named(root);
        for token in &kept.abandoned_standbys {
            for who in process::find_by_token(token) {
                if !live.contains(&who) {
                    process::stop_group(who, defaults::GRACE).await;
                }
            }
        }
        if let Some(words) = engine::retire_standby(root, "its keeper is gone").await? {
            report.push(Found::Done(words));
        }
    }
    let kept = kept.releases();
    let lives = live_set(root).map_err(Error::Refused)?;
    // The dead ones are started together, each held to its own readiness (as a deploy starts a
    // formation's processes), their lines in the formation's order: a line per live process,
    // the dead ones' (`None`) known once their starts are done.
    let mut lines: Vec<Option<Found>> = Vec::new();
    let mut dead_ones = Vec::new();
    for (n, live) in lives.iter().enumerate() {
        if live.identity.is_running() {
            if !kept.contains(&live.identity) {
                if let Err(e) = keeper::adopt(&Spec::adopting(
                    &root.0,
                    &live.service,
                    live.identity,
                    &live.launch,
                    &live.output(root),
                    backoff,
                )) {
                    lines.push(Some(Found::Failed(format!(
                        "{}: running (pid {}) but not kept: {e}",
                        live.name(),
                        live.identity.pid
                    ))));
                    continue;
                }
            }
            lines.push(Some(Found::Unchanged(format!(
                "{}: running (pid {})",
                live.name(),
                live.identity.pid
            ))));
            continue;
        }
        let why = match dead {
            Dead::Restart(why) => why,
            Dead::Unkept(_) if kept.contains(&live.identity) => {
                lines.push(Some(Found::Failed(format!(
                    "{}: not running (its keeper gave up on it)",
                    live.name()
                ))));
                continue;
            }
            Dead::Unkept(why) => why,
        };
        let why = format!("pid {} was not running ({why})", live.identity.pid);
        dead_ones.push((lines.len(), n, live, why));
        lines.push(None);
    }
    let results = restart_together(
        root,
        dead_ones
            .iter()
            .map(|(_, n, live, why)| (*live, *n as u64, why.as_str())),
        ready,
        Spawn::Kept(backoff),
    )
    .await;
    for ((line, _, live, _), result) in dead_ones.iter().zip(results) {
        lines[*line] = Some(match result {
            Ok(started) => Found::Done(format!("{}: started ({})", live.name(), started.how)),
            Err(e) => Found::Failed(format!("{}: NOT started: {e}", live.name())),
        });
    }
    report.extend(lines.into_iter().flatten());
    // The root's schedules are kept on the same seam: a clock keeper runs while the service
    // runs and its policy has schedules.
    match super::clock::ensure(root).await {
        Some(started) if started.is_ok() => report.push(Found::Done(super::clock::said(&started))),
        Some(failed) => report.push(Found::Failed(super::clock::said(&failed))),
        None => {}
    }
    Ok(report)
}

/// Every process the root's state names: the live set, `current`'s fallback (by pid: it is
/// recorded so), and the processes of a run in flight.
fn named(root: &Root) -> (Vec<Identity>, Vec<i32>) {
    let mut named: Vec<Identity> = live_set(root)
        .unwrap_or_default()
        .iter()
        .map(|l| l.identity)
        .collect();
    if let Ok(Some(run)) = engine::saved_run(root) {
        named.extend(run.processes().map(|p| p.identity()));
    }
    let fallback = root
        .read_pointer()
        .ok()
        .flatten()
        .and_then(|p| p.fallback)
        .map(|f| f.pid);
    (named, fallback.into_iter().collect())
}

/// Stops the release processes started for this root that nothing names — a keeper (or `up`)
/// killed between starting a release again and recording it left them — so that no second copy
/// of a release ever runs beside the one the next pass starts. Words for each; the caller
/// holds the lock.
pub(crate) async fn stop_strays(root: &Root, kept: &keeper::Keepers) -> Vec<String> {
    let (named, fallback) = named(root);
    let unnamed = |who: &Identity| !named.contains(who) && !fallback.contains(&who.pid);
    let mut strays: Vec<Identity> = kept
        .releases()
        .into_iter()
        .filter(|who| unnamed(who) && who.is_running())
        .collect();
    for token in &kept.abandoned {
        strays.extend(process::find_by_token(token).into_iter().filter(unnamed));
    }
    let mut said = Vec::new();
    for who in strays {
        let how = process::stop_group(who, defaults::GRACE).await;
        said.push(format!(
            "pid {}, started again for the root but named by nothing (its start was cut short): {how}",
            who.pid
        ));
    }
    said
}

/// A deploy's or rollout's tail, under its lock (`engine::Tail`): whatever it left live runs
/// and is kept (a live release that ended while the run held the root was the run's to judge;
/// its keeper let it go). Skipped when the service is stopped; what it started or could not
/// start is said on stderr.
pub(crate) async fn after_a_run(root: &Root) {
    if crate::host::stopped::read(&root.0).ok().flatten().is_some() {
        return;
    }
    let why = Dead::Restart("found not running after a run");
    match ensure(root, defaults::UP_READY, Backoff::default(), why).await {
        Ok(report) => {
            // What it did (a start, a stray stopped) or could not do; not what simply runs.
            for found in report.iter().filter(|f| !matches!(f, Found::Unchanged(_))) {
                eprintln!("rollgate: {}", found.text());
            }
        }
        Err(e) => eprintln!("rollgate: {e}"),
    }
}

/// One line of [`ensure`]'s report.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Found {
    /// Nothing to do: running and kept (or, for `up`, stopped on purpose).
    Unchanged(String),
    /// Started, given a keeper, or a stray stopped.
    Done(String),
    /// Could not be started or kept.
    Failed(String),
}

impl Found {
    pub(crate) fn ok(&self) -> bool {
        !matches!(self, Found::Failed(_))
    }

    pub(crate) fn text(&self) -> &str {
        match self {
            Found::Unchanged(text) | Found::Done(text) | Found::Failed(text) => text,
        }
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
