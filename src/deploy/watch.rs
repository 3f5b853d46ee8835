//! After the switch: the new release is watched for `watch_ms` with the previous release kept
//! running (drained, not stopped). If the new one exits, or fails `watch_failures` probes in a
//! row, `current` goes back to the previous release in the same atomic way, the new one is
//! stopped, and `rolled_back` is logged with the phase `watch`. Only a release that passed its
//! watch is logged `promoted`, so the lesson's summary never calls a switched-back release live.
//!
//! Order, so that a crash at any moment leaves nothing half-done: the record says `watching`
//! (with the watch's numbers) before `current` changes; whoever finds that record later (the
//! next deploy, `promote`, a background watcher) finishes the watch with one final probe.

use std::time::Duration;

use super::journal::{self, Event as LogEvent};
use super::plan::WatchJudge;
use super::process::{self, Identity};
use super::state::{Candidate, Fallback, Pointer, Root, Stage, WatchRecord, WriteError};
use super::{
    drain_before_stop, finish_switch, lock, log, log_in_phase, refused, DeployError, Outcome,
};

/// How the watch ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Watched {
    Passed,
    Failed(String),
}

/// Watches the process until `until` (Unix seconds): its exit, or too many failed probes in a
/// row, fails it. Exit is noticed at the next poll (the watcher may not be its parent).
pub(crate) async fn observe(
    identity: Identity,
    subject: &super::probe::Subject,
    until: f64,
    poll: Duration,
    failures: u32,
) -> Watched {
    let switched_at = journal::now();
    let end =
        tokio::time::Instant::now() + Duration::from_secs_f64((until - journal::now()).max(0.0));
    let mut ticker = tokio::time::interval(poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut judge = WatchJudge::new(failures);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(end) => return Watched::Passed,
            _ = ticker.tick() => {}
        }
        if !identity.is_running() {
            return Watched::Failed(format!(
                "exited during the watch, {} ms after the switch",
                ((journal::now() - switched_at) * 1000.0).round() as u64
            ));
        }
        let (passed, probe) = subject.check().await;
        if let Some(reason) = judge.observe(passed, &probe) {
            return Watched::Failed(reason);
        }
    }
}

/// The switch with a watch: record it, switch `current`, drain the previous release (kept
/// running), then watch here, or leave a watcher in the background (`--no-wait`).
pub(crate) async fn switch_and_watch(
    root: &Root,
    candidate: &mut Candidate,
    identity: Identity,
    previous: &Pointer,
    watch: WatchRecord,
    no_wait: bool,
) -> Result<Outcome, DeployError> {
    let watch_ms = ((watch.until - journal::now()) * 1000.0).round().max(0.0) as u64;
    candidate.stage = Stage::Watching;
    candidate.watch = Some(watch);
    root.write_candidate(candidate)
        .map_err(|e| DeployError::Failed(format!("cannot record the watch: {e}")))?;
    let pointer = candidate.pointer(
        identity,
        Some(Fallback {
            version: previous.version.clone(),
            port: previous.port,
            pid: previous.pid,
        }),
    );
    let durability = match root.write_pointer(&pointer) {
        Ok(()) => String::new(),
        // The rename happened: readers see the new release, so the switch goes on.
        Err(error @ WriteError::NotDurable(_)) => format!("current {error}; "),
        Err(WriteError::NotWritten(e)) => {
            return Err(DeployError::Failed(format!(
                "cannot switch {}: {e}; the old pointer is intact",
                root.pointer_path().display(),
            )))
        }
    };
    let drained = drain_before_stop(root, previous.port, candidate.drain_ms).await;
    if let Some(watch) = candidate.watch.as_mut() {
        watch.switch_detail = format!("{durability}{drained}");
        // The watch runs its whole length after the drain, which may have taken the whole
        // drain timeout: a release is never promoted unwatched.
        watch.until = journal::now() + watch_ms as f64 / 1000.0;
    }
    root.write_candidate(candidate)
        .map_err(|e| DeployError::Failed(format!("cannot record the watch: {e}")))?;
    log(
        root,
        candidate,
        LogEvent::Switched,
        format!(
            "switched from {}; watching for {watch_ms} ms with {} kept running; {}",
            previous.version,
            previous.version,
            drained.trim_end_matches("; ")
        ),
        None,
    )?;
    if no_wait {
        return leave_watcher(root, candidate).await;
    }
    conclude(root, candidate, identity).await
}

/// Watches until the record's end, then promotes or switches back.
pub(crate) async fn conclude(
    root: &Root,
    candidate: &Candidate,
    identity: Identity,
) -> Result<Outcome, DeployError> {
    let Some(watch) = candidate.watch.clone() else {
        return Err(DeployError::Failed("the watch was not recorded".into()));
    };
    let subject = candidate.probe_subject(root, &candidate.version, candidate.port);
    let verdict = observe(
        identity,
        &subject,
        watch.until,
        Duration::from_millis(watch.poll_ms),
        watch.failures,
    )
    .await;
    decide(root, candidate, identity, verdict, "").await
}

/// A watch's verdict carried out: promoted (the previous release stopped now), or switched back.
async fn decide(
    root: &Root,
    candidate: &Candidate,
    identity: Identity,
    verdict: Watched,
    how: &str,
) -> Result<Outcome, DeployError> {
    let Some(watch) = candidate.watch.clone() else {
        return Err(DeployError::Failed("the watch was not recorded".into()));
    };
    let elapsed = Some(Duration::from_millis(watch.gate_elapsed_ms));
    match verdict {
        Watched::Passed => {
            // The previous release leaves the proxy's fallback first, then is drained again
            // (requests it took as the fallback finish) before finish_switch stops it.
            if let Ok(Some(mut pointer)) = root.read_pointer() {
                if pointer.fallback.is_some()
                    && candidate.identity().is_some_and(|i| pointer.names(i))
                {
                    pointer.fallback = None;
                    if let Err(WriteError::NotWritten(e)) = root.write_pointer(&pointer) {
                        return Err(DeployError::Failed(format!(
                            "{} passed its watch, but cannot write {}: {e}; the previous release keeps running",
                            candidate.version,
                            root.pointer_path().display()
                        )));
                    }
                }
            }
            // finish_switch adds "; old release ... stopped" after what the switch said.
            finish_switch(
                root,
                candidate,
                candidate.previous.as_ref(),
                format!(
                    "{}; passed the watch{how}; {}",
                    watch.gate_detail,
                    watch.switch_detail.trim_end_matches("; ")
                )
                .trim_end_matches("; ")
                .to_string(),
                elapsed,
                true,
            )
            .await
        }
        Watched::Failed(reason) => {
            switch_back(
                root,
                candidate,
                identity,
                &format!("{reason}{how}"),
                elapsed,
            )
            .await?;
            Ok(Outcome::RolledBack)
        }
    }
}

/// `current` back to the previous release (still running: it was only drained), then the new
/// release's group stopped and `rolled_back` logged with the phase `watch`.
async fn switch_back(
    root: &Root,
    candidate: &Candidate,
    identity: Identity,
    reason: &str,
    elapsed: Option<Duration>,
) -> Result<(), DeployError> {
    let back =
        match &candidate.previous {
            Some(previous) if previous.identity().is_running() => {
                match root.write_pointer(previous) {
                Ok(()) => format!("switched back to {}", previous.version),
                Err(WriteError::NotDurable(e)) => format!(
                    "switched back to {} (the folder's fsync failed: {e})",
                    previous.version
                ),
                Err(WriteError::NotWritten(e)) => {
                    return Err(DeployError::Failed(format!(
                        "{} failed its watch ({reason}) but cannot switch back: {e}; current still names it",
                        candidate.version
                    )))
                }
            }
            }
            Some(previous) => format!(
                "WARNING previous release {} is gone, nothing to switch back to",
                previous.version
            ),
            None => "no previous release".into(),
        };
    let stopped = process::stop_group(identity, Duration::from_millis(candidate.grace_ms)).await;
    let output = process::tail(&root.output_path(&candidate.version, &candidate.service), 3);
    let mut detail = format!("{reason}; {back}; candidate {stopped}");
    if !output.is_empty() {
        detail.push_str(&format!("; candidate output: {output}"));
    }
    log_in_phase(
        root,
        candidate,
        LogEvent::RolledBack,
        detail,
        elapsed,
        Some("watch"),
    )?;
    root.clear_candidate().map_err(|e| {
        DeployError::Failed(format!(
            "switched back, but cannot clear the candidate record: {e}"
        ))
    })
}

/// A record found `watching` by someone other than the watcher (the watcher died, or the next
/// command came first): the watch is cut short by one final probe.
pub(crate) async fn finish_found(
    root: &Root,
    candidate: &Candidate,
) -> Result<Outcome, DeployError> {
    let identity = candidate.identity().unwrap_or(Identity {
        pid: 0,
        start_time: 0,
    });
    let verdict = if !identity.is_running() {
        Watched::Failed("exited during the watch".into())
    } else {
        let subject = candidate.probe_subject(root, &candidate.version, candidate.port);
        match subject.check().await {
            (true, _) => Watched::Passed,
            (false, probe) => Watched::Failed(format!("failed a final probe ({probe})")),
        }
    };
    let how = match candidate.watch.as_ref().and_then(|w| w.watcher_pid) {
        Some(pid) => {
            format!(" (cut short: watcher pid {pid} was gone; decided by one final probe)")
        }
        None => format!(
            " (cut short: deployer pid {} was gone; decided by one final probe)",
            candidate.deployer_pid
        ),
    };
    decide(root, candidate, identity, verdict, &how).await
}

/// `--no-wait`: a detached `rollgate watch` takes over once this deploy lets go of the lock;
/// its pid goes into the record, so `status` shows it and a later command sees it.
async fn leave_watcher(root: &Root, candidate: &mut Candidate) -> Result<Outcome, DeployError> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()
        .map_err(|e| DeployError::Failed(format!("cannot find rollgate's own executable: {e}")))?;
    let output = std::fs::File::create(root.0.join(WATCHER_OUTPUT))
        .map_err(|e| DeployError::Failed(format!("cannot create the watcher's output: {e}")))?;
    let err = output
        .try_clone()
        .map_err(|e| DeployError::Failed(e.to_string()))?;
    let child = std::process::Command::new(exe)
        .args([
            "watch",
            &candidate.service,
            "--token",
            &candidate.token,
            "--root",
        ])
        .arg(&root.0)
        .stdin(std::process::Stdio::null())
        .stdout(output)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| DeployError::Failed(format!("cannot start the watcher: {e}")))?;
    if let Some(watch) = candidate.watch.as_mut() {
        watch.watcher_pid = Some(child.id());
    }
    root.write_candidate(candidate)
        .map_err(|e| DeployError::Failed(format!("cannot record the watcher: {e}")))?;
    Ok(Outcome::Watching(child.id()))
}

/// The background watcher's output (its errors), in the root.
pub const WATCHER_OUTPUT: &str = "watcher.output";

/// `rollgate watch SVC --token T` (started by `deploy --no-wait`): waits for the deployer to
/// let go of the lock, then finishes the watch it recorded, if that record is still there.
pub fn run_watcher(
    service: &str,
    root: std::path::PathBuf,
    token: &str,
) -> Result<Outcome, DeployError> {
    let root = Root::new(root);
    super::runtime()?.block_on(async {
        let started = std::time::Instant::now();
        let _lock = loop {
            match lock::acquire(&root.lock_path()) {
                Ok(lock) => break lock,
                Err(_) if started.elapsed() < Duration::from_secs(30) => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => return Err(refused(e)),
            }
        };
        let Some(candidate) = root.read_candidate().map_err(refused)? else {
            return Ok(Outcome::Aborted);
        };
        if candidate.token != token
            || candidate.service != service
            || candidate.stage != Stage::Watching
        {
            // Someone else finished this watch first.
            return Ok(Outcome::Aborted);
        }
        if !super::recover::switched(&root, &candidate)? {
            return super::recover::recover(&root)
                .await
                .map(|()| Outcome::RolledBack);
        }
        let identity = candidate.identity().unwrap_or(Identity {
            pid: 0,
            start_time: 0,
        });
        conclude(&root, &candidate, identity).await
    })
}
