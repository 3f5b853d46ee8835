//! `rollgate stop SVC` and `rollgate start SVC` (issue 68, 3): a person takes a service down on
//! purpose and brings it back. `stop` records the stop first (`host/stopped.rs`, so nothing
//! brings the service back behind the person's back — `up` at boot, `up --supervise`, a deploy
//! — even after a crash halfway), puts the proxy's routes to it in maintenance (a 503 with
//! `Retry-After` and the page, the answer users get for a service that is down on purpose,
//! rather than a bare 502), lets each live process finish what the proxy sent it, and stops
//! each whole (SIGTERM, the grace, the tree killed). `start` starts the live release again from
//! its launch record, gated on its probe as `up` gates, and only once it answers lifts the
//! maintenance and the stop.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{refused, Error};
use crate::host::journal::{self, Entry, LogEvent};
use crate::host::lock;
use crate::host::state::Root;
use crate::host::stopped::{self, Stopped};
use crate::host::traffic::{self, Mode, Traffic};
use crate::proxy::control::{Ask, Tunnels};
use crate::supervision::supervise::{live_set, restart_together, Spawn};

/// Who set the maintenance a stop puts the proxy in: what tells it from a person's own.
const STOP_MARKER: &str = "rollgate stop";

/// What `stop` or `start` was asked.
#[derive(Debug, Clone)]
pub struct StopRequest {
    pub service: String,
    pub root: PathBuf,
    pub why: Option<String>,
}

/// `rollgate stop`: the service stopped and kept stopped; the text says what was stopped.
pub fn stop(request: &StopRequest) -> Result<String, Error> {
    let root = the_services_root(request)?;
    crate::engine::runtime()?.block_on(async {
        let (lock, set) = locked_live_set(&root, request, "nothing to stop").await?;
        let identities: Vec<_> = set.iter().map(|l| l.identity).collect();
        let keepers = crate::host::keeper::kept(&root.0, false).keepers_of(&identities);
        let record = match stopped::read(&root.0)? {
            Some(earlier) => earlier,
            None => Stopped {
                service: request.service.clone(),
                since: journal::now(),
                by: traffic::who(),
                why: request.why.clone(),
            },
        };
        stopped::write(&root.0, &record)?;
        crate::engine::fault_point();
        let maintenance = put_in_maintenance(&root, &record)?;
        let grace = stop_grace(&root);
        let mut said = Vec::new();
        // A standby through a crash-loop window is the service's too.
        if let Some(words) = crate::engine::retire_standby(&root, "the service was stopped").await?
        {
            said.push(words);
        }
        for live in set.iter().filter(|l| l.identity.is_running()) {
            // A service being stopped has no next release: its tunnels are sent away (a
            // WebSocket's Close, 1001) rather than waited for.
            let ask = Ask::Drain(Tunnels::SendAway);
            let drained =
                crate::proxy::control::request(&root.0, live.port, ask, Duration::from_secs(30))
                    .await;
            let how = crate::host::process::stop_group(live.identity, grace).await;
            crate::engine::fault_point();
            said.push(format!("{} {how} ({drained})", live.name()));
        }
        // And what its schedules are running: a stopped service runs nothing.
        said.extend(crate::supervision::clock::stop_runs(&root, grace).await);
        let detail = format!(
            "{}{}: {}",
            record.words(),
            maintenance,
            match said.is_empty() {
                true => "nothing of it was running".to_string(),
                false => said.join("; "),
            }
        );
        log(
            &root,
            &set[0].version,
            &request.service,
            LogEvent::Stopped,
            &detail,
        )?;
        crate::engine::fault_point();
        // Their keepers go too (one waiting out a crash's backoff would linger until its end):
        // asked once the lock is let go, which a keeper whose release just ended waits for.
        drop(lock);
        crate::host::keeper::ask_to_go(&keepers, KEEPERS_GO_WITHIN).await;
        Ok(format!("{} {detail}\n", request.service))
    })
}

/// How long `stop` waits for the keepers of what it stopped to go.
const KEEPERS_GO_WITHIN: Duration = Duration::from_secs(5);

/// `rollgate start`: the stopped service's live release started again, gated; then its
/// maintenance and its stop are lifted.
pub fn start(request: &StopRequest) -> Result<String, Error> {
    let root = the_services_root(request)?;
    crate::engine::runtime()?.block_on(async {
        let (lock, set) = locked_live_set(&root, request, "deploy a release instead").await?;
        let was = stopped::read(&root.0)?;
        let ready = ready_within(&root);
        // What a start cut short left running, named by nothing, goes first (as `up` does):
        // never a second copy beside the one started now.
        let kept = crate::host::keeper::kept(&root.0, true);
        let mut said = crate::supervision::supervise::stop_strays(&root, &kept).await;
        let mut failed = Vec::new();
        // What runs of the service now: found running (a stop cut short left it) or started.
        let mut running = Vec::new();
        let mut dead = Vec::new();
        for (n, live) in set.iter().enumerate() {
            if live.identity.is_running() {
                said.push(format!(
                    "{}: running (pid {})",
                    live.name(),
                    live.identity.pid
                ));
                running.push((live.name(), live.identity));
                continue;
            }
            dead.push((live, n as u64, "started by rollgate start"));
        }
        let kept = Spawn::Kept(crate::host::keeper::Backoff::default());
        let results = restart_together(&root, dead.iter().copied(), ready, kept).await;
        for ((live, _, _), result) in dead.iter().zip(results) {
            match result {
                Ok(started) => {
                    crate::engine::fault_point();
                    said.push(format!("{}: started ({})", live.name(), started.how));
                    running.push((live.name(), started.identity));
                }
                Err(e) => failed.push(format!("{}: NOT started: {e}", live.name())),
            }
        }
        if !failed.is_empty() {
            // The service stays stopped, so nothing of it runs: what this start started goes
            // again, and so does what it found running (a stop killed halfway left it), each
            // with its keeper.
            let identities: Vec<_> = running.iter().map(|(_, who)| *who).collect();
            let keepers = crate::host::keeper::kept(&root.0, false).keepers_of(&identities);
            for (name, who) in running {
                let how = crate::host::process::stop_group(who, stop_grace(&root)).await;
                said.push(format!("{name}: {how}, since the service stays stopped"));
            }
            said.extend(crate::supervision::clock::stop_runs(&root, stop_grace(&root)).await);
            drop(lock);
            crate::host::keeper::ask_to_go(&keepers, KEEPERS_GO_WITHIN).await;
            said.extend(failed);
            return Err(Error::Failed(format!(
                "{}\n{} stays stopped: nothing else starts it until `rollgate start` succeeds",
                said.join("\n"),
                request.service
            )));
        }
        lift_maintenance(&root)?;
        crate::engine::fault_point();
        // Said before the stop is lifted: a start cut short after this line is finished by the
        // next one, which says it again.
        if let Some(was) = was {
            let detail = format!(
                "{} was {}; {}",
                request.service,
                was.words(),
                said.join("; ")
            );
            log(
                &root,
                &set[0].version,
                &request.service,
                LogEvent::Started,
                &detail,
            )?;
            crate::engine::fault_point();
        }
        stopped::clear(&root.0)?;
        crate::engine::fault_point();
        // The schedules resume with the service.
        match crate::supervision::clock::ensure(&root).await {
            Some(started) if started.is_ok() => {
                said.push(crate::supervision::clock::said(&started))
            }
            Some(failed) => eprintln!("rollgate: {}", crate::supervision::clock::said(&failed)),
            None => {}
        }
        Ok(said.join("\n") + "\n")
    })
}

/// The root's lock, what a dead run left finished, and the live processes the state names
/// (refused, with `otherwise`, when it names none).
async fn locked_live_set(
    root: &Root,
    request: &StopRequest,
    otherwise: &str,
) -> Result<(lock::Lock, Vec<crate::supervision::supervise::Live>), Error> {
    let held = lock::acquire(&root.lock_path())?;
    crate::engine::recover_leaving_escalated(root).await?;
    let set = live_set(root).map_err(Error::Refused)?;
    if set.is_empty() {
        return Err(refused(format!(
            "nothing of {} is live under {}; {otherwise}",
            request.service,
            root.0.display()
        )));
    }
    Ok((held, set))
}

/// The root, refused unless it serves `service`.
fn the_services_root(request: &StopRequest) -> Result<Root, Error> {
    crate::host::names::check_name("service", &request.service)?;
    let root = Root::existing(request.root.clone())?;
    let serves = crate::engine::service_of(&root);
    if serves != request.service {
        return Err(refused(format!(
            "{} serves {serves}, not {}",
            root.0.display(),
            request.service
        )));
    }
    Ok(root)
}

/// The proxy answers the service's routes with its maintenance page while it is stopped
/// (unless a person set a mode of their own); words for the log line.
fn put_in_maintenance(root: &Root, record: &Stopped) -> Result<&'static str, Error> {
    if traffic::read(&root.0)?.is_some_and(|t| t.mode != Mode::Serving) {
        return Ok("; the proxy's mode, set by a person, left as it is");
    }
    let state = Traffic {
        service: record.service.clone(),
        mode: Mode::Maintenance,
        message: Some(format!("{} is stopped", record.service)),
        retry_after_s: Some(60),
        since: journal::now(),
        by: STOP_MARKER.into(),
        why: Some(record.words()),
        ..Traffic::default()
    };
    traffic::write(&root.0, &state)?;
    crate::engine::fault_point();
    proxy_takes(root, Mode::Maintenance);
    Ok("; the proxy answers its maintenance page (503)")
}

/// The proxy takes the mode from the file (it watches it): waits, at most 2 s, until a proxy
/// serving the root says it is in `mode`, so the command's last word is what users get. No
/// proxy (or one that cannot say): no wait.
fn proxy_takes(root: &Root, mode: Mode) {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        // A zero timeout would be no timeout at all on the socket: stop short of the deadline.
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left < Duration::from_millis(10) {
            break;
        }
        match crate::proxy::control::traffic_now(&root.0, left.min(Duration::from_millis(500))) {
            Some(now) if now != mode.as_str() => std::thread::sleep(Duration::from_millis(20)),
            _ => break,
        }
    }
}

/// The maintenance a stop set, lifted (a person's own mode stays).
fn lift_maintenance(root: &Root) -> Result<(), Error> {
    if let Some(held) = traffic::read(&root.0)?.filter(|t| t.by == STOP_MARKER) {
        let state = Traffic {
            mode: Mode::Serving,
            message: None,
            retry_after_s: None,
            since: journal::now(),
            why: Some("started by rollgate start".into()),
            ..held
        };
        traffic::write(&root.0, &state)?;
        proxy_takes(root, Mode::Serving);
    }
    Ok(())
}

/// The stop grace of the service's policy (kept in the root), else the default.
fn stop_grace(root: &Root) -> Duration {
    kept_settings(root)
        .and_then(|s| s.stop_grace_ms)
        .map_or(crate::defaults::GRACE, Duration::from_millis)
}

/// How long a started release may take to answer its probe: the policy's deadline, else `up`'s.
fn ready_within(root: &Root) -> Duration {
    kept_settings(root)
        .map(|s| Duration::from_millis(s.progress_deadline_ms))
        .unwrap_or(crate::defaults::UP_READY)
}

fn kept_settings(root: &Root) -> Option<crate::policy::RolloutSettings> {
    let (version, kept) = crate::host::kept_policy::KeptPolicy::of_live(root).ok()??;
    kept.settings(&crate::host::kept_policy::KeptPolicy::path(root, &version))
        .ok()
}

fn log(
    root: &Root,
    version: &str,
    service: &str,
    event: LogEvent,
    detail: &str,
) -> Result<(), Error> {
    journal::append(
        &root.log_path(),
        &Entry::new(event, version, service, detail.to_string()),
    )
    .map_err(|e| {
        Error::Failed(format!(
            "{detail}, but it is not in {}: {e}",
            root.log_path().display()
        ))
    })
}
