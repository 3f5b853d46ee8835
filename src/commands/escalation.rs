//! `rollgate promote` and `rollgate abort`: a person finishes an escalated deploy. The deploy is
//! held by the engine (its rollout paused with the replica held); a person's word is one more
//! event for the same planner and executor.

use std::path::PathBuf;

use super::deploy::DeployOutcome;
use crate::engine::single;
use crate::engine::state::{self as rollout_state, Phase};
use crate::engine::step::Event;
use crate::engine::{recover, runtime};
use crate::error::{refused, Error};
use crate::host::journal;
use crate::host::lock;
use crate::host::signals::Signals;
use crate::host::state::Root;

/// `rollgate promote` / `rollgate abort`: finish an escalated deploy by hand.
pub fn finish_escalated(
    service: &str,
    root: PathBuf,
    promote: bool,
) -> Result<DeployOutcome, Error> {
    crate::host::names::check_name("service", service).map_err(refused)?;
    let root = Root::existing(root).map_err(refused)?;
    runtime()?.block_on(async {
        // Installed first and kept to the end: a Ctrl-C or a lost terminal between the rename
        // and the log line must not leave a switch half-recorded.
        let _signals = Signals::install().map_err(refused)?;
        let _lock = lock::acquire(&root.lock_path()).map_err(refused)?;
        single::adopt_legacy(&root)?;
        let held = rollout_state::load(&root)
            .map_err(refused)?
            .filter(|r| r.unsettled_deploy() && r.slot(0).held);
        if held.is_none() {
            // A promote or abort that died after its decision (or any other dead rollgate's
            // work) is finished first; then there is nothing left to decide.
            recover::recover(&root).await?;
        }
        let rollout = match held {
            Some(r) if r.service == service => r,
            Some(r) => {
                return Err(refused(format!(
                    "the escalated candidate under {} is for service {}, not {service}",
                    root.0.display(),
                    r.service
                )))
            }
            None => {
                return Err(refused(format!(
                    "no escalated deploy of {service} waits under {}",
                    root.0.display()
                )))
            }
        };
        // From a file: a start time in the future, far past or not a number gives zero.
        let elapsed_ms = std::time::Duration::try_from_secs_f64(journal::now() - rollout.started_at)
            .map_or(0, |d| d.as_millis() as u64);
        let held = rollout.new_process().cloned();
        // An earlier promote renamed the pointer and was interrupted: the candidate is live.
        // Finish that switch; never stop the release the pointer names.
        if single::is_switched(&root, &rollout)? {
            if !promote {
                return Err(refused(format!(
                    "the switch to {v} already happened: current names it (pid {pid}), so aborting would stop the live release. \
                     Run `rollgate promote {service} --root {root}` to finish the switch, then roll forward: deploy the release you want live",
                    v = rollout.to,
                    pid = held.as_ref().map_or(0, |h| h.pid),
                    root = root.0.display()
                )));
            }
            let detail =
                "promoted by hand; the switch had happened in an interrupted promote, finished now";
            single::complete_switch(single::executor(&root, rollout), detail.into(), Some(elapsed_ms))
                .await?;
            return Ok(DeployOutcome::Promoted);
        }
        let mut executor = single::executor(&root, rollout);
        let running = held.as_ref().is_some_and(|h| h.identity().is_running());
        if let Some(s) = executor.rollout_mut().single.as_mut() {
            s.gate_elapsed_ms = Some(if running { elapsed_ms } else { 0 });
        }
        let (event, outcome) = if !running {
            executor.words_mut().context = Some("found by a person".into());
            let reason = "candidate exited while escalated".to_string();
            (Event::Abort { reason, rollback: false }, DeployOutcome::RolledBack)
        } else if promote {
            let (_, answer) = executor.subject_for_new().check().await;
            if let Some(s) = executor.rollout_mut().single.as_mut() {
                s.gate_detail = Some(format!(
                    "promoted by hand after escalation (probe: {answer})"
                ));
            }
            (Event::Accept { slot: 0 }, DeployOutcome::Promoted)
        } else {
            executor.words_mut().context = Some("decided by a person".into());
            let reason = "aborted by hand after escalation".to_string();
            (Event::Abort { reason, rollback: false }, DeployOutcome::Aborted)
        };
        executor.handle(event).await?;
        executor.run_post_hook().await;
        match executor.rollout().phase {
            Phase::Completed | Phase::Aborted => Ok(outcome),
            _ => Err(Error::Failed(
                "the escalated deploy did not end; its state stays for the next command".into(),
            )),
        }
    })
}
