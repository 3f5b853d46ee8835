//! After a crash: what a deployer killed mid-deploy left behind is found by the next one.

use std::time::Duration;

use super::process::{self, Identity, Stopped};
use super::state::{Root, Stage};
use super::{log, refused, stop_previous, DeployError};

/// A candidate left behind by a deployer that died (we hold the lock, so it is dead): if the
/// switch had happened, record the promotion and stop the old release; otherwise stop the
/// candidate and record the rollback. An escalated candidate waits for a person instead.
pub(super) async fn recover(root: &Root) -> Result<(), DeployError> {
    let Some(left) = root.read_candidate().map_err(refused)? else {
        return Ok(());
    };
    if left.stage == Stage::Escalated {
        return Err(refused(format!(
            "candidate {} of {} is escalated and waiting for a person: run `rollgate promote {svc} --root {root}` or `rollgate abort {svc} --root {root}` first",
            left.version,
            left.service,
            svc = left.service,
            root = root.0.display()
        )));
    }
    let grace = Duration::from_millis(left.grace_ms);
    let pointer = root.read_pointer().map_err(refused)?;
    let switched = pointer
        .as_ref()
        .is_some_and(|p| p.version == left.version && Some(p.pid) == left.pid);
    if switched {
        let old = stop_previous(left.previous.as_ref(), grace).await;
        log(
            root,
            &left,
            "promoted",
            format!(
                "switched before deployer pid {} died; recorded by the next deploy; {old}",
                left.deployer_pid
            ),
            None,
        )?;
        return root
            .clear_candidate()
            .map_err(|e| DeployError::Failed(e.to_string()));
    }
    let mut found: Vec<Identity> = left.identity().into_iter().collect();
    if found.is_empty() {
        found = process::find_by_token(&left.token);
    }
    let mut outcome = Vec::new();
    for who in &found {
        outcome.push(format!(
            "pid {} {}",
            who.pid,
            process::stop_group(*who, grace).await
        ));
    }
    if outcome.is_empty() {
        outcome.push(Stopped::AlreadyGone.to_string());
    }
    log(
        root,
        &left,
        "rolled_back",
        format!(
            "abandoned: deployer pid {} died before an outcome; candidate {}; stopped by the next deploy",
            left.deployer_pid,
            outcome.join(", ")
        ),
        None,
    )?;
    root.clear_candidate()
        .map_err(|e| DeployError::Failed(e.to_string()))
}
