//! `rollgate promote` and `rollgate abort`: a person finishes an escalated deploy through the
//! same switch and rollback code a deploy uses.

use std::path::PathBuf;
use std::time::Duration;

use super::plan;
use super::process::Identity;
use super::recover::switched;
use super::signals::Signals;
use super::state::{Root, Stage};
use super::{
    finish_switch, journal, lock, refused, roll_back, runtime, switch, DeployError, Outcome,
};

/// `rollgate promote` / `rollgate abort`: finish an escalated deploy by hand.
pub fn finish_escalated(
    service: &str,
    root: PathBuf,
    promote: bool,
) -> Result<Outcome, DeployError> {
    plan::check_name("service", service).map_err(refused)?;
    let root = Root::new(root);
    runtime()?.block_on(async {
        // Installed first and kept to the end: a Ctrl-C or a lost terminal between the rename
        // and the log line must not leave a switch half-recorded.
        let _signals = Signals::install().map_err(refused)?;
        let _lock = lock::acquire(&root.lock_path()).map_err(refused)?;
        let candidate = match root.read_candidate().map_err(refused)? {
            Some(c) if c.stage == Stage::Escalated && c.service == service => c,
            Some(c) if c.stage == Stage::Escalated => {
                return Err(refused(format!(
                    "the escalated candidate under {} is for service {}, not {service}",
                    root.0.display(),
                    c.service
                )))
            }
            _ => {
                return Err(refused(format!(
                    "no escalated deploy of {service} waits under {}",
                    root.0.display()
                )))
            }
        };
        // From a file: a start time in the future, far past or not a number gives zero.
        let elapsed = Duration::try_from_secs_f64(journal::now() - candidate.started_at)
            .unwrap_or(Duration::ZERO);
        // An earlier promote renamed the pointer and was interrupted: the candidate is live.
        // Finish that switch; never stop the release the pointer names.
        if switched(&root, &candidate)? {
            if !promote {
                return Err(refused(format!(
                    "the switch to {v} already happened: current names it (pid {pid}), so aborting would stop the live release. \
                     Run `rollgate promote {service} --root {root}` to finish the switch, then roll forward: deploy the release you want live",
                    v = candidate.version,
                    pid = candidate.pid.unwrap_or(0),
                    root = root.0.display()
                )));
            }
            return finish_switch(
                &root,
                &candidate,
                candidate.previous.as_ref(),
                "promoted by hand; the switch had happened in an interrupted promote, finished now"
                    .into(),
                Some(elapsed),
                true,
            )
            .await;
        }
        let live = root.read_pointer().map_err(refused)?;
        let Some(identity) = candidate.identity().filter(Identity::is_running) else {
            roll_back(
                &root,
                &candidate,
                candidate.identity().unwrap_or(Identity {
                    pid: 0,
                    start_time: 0,
                }),
                None,
                live.as_ref(),
                "candidate exited while escalated".into(),
                "found by a person".into(),
                Duration::ZERO,
            )
            .await?;
            return Ok(Outcome::RolledBack);
        };
        if promote {
            let (_, answer) = candidate
                .probe_subject(&root, &candidate.version, candidate.port)
                .check()
                .await;
            switch(
                &root,
                &candidate,
                identity,
                live,
                format!("promoted by hand after escalation (probe: {answer})"),
                elapsed,
            )
            .await
        } else {
            roll_back(
                &root,
                &candidate,
                identity,
                None,
                live.as_ref(),
                "aborted by hand after escalation".into(),
                "decided by a person".into(),
                elapsed,
            )
            .await?;
            Ok(Outcome::Aborted)
        }
    })
}
