//! After a crash: what a deployer killed mid-deploy left behind is found by the next one.

use std::time::Duration;

use super::journal::Event;
use super::process::{self, Identity, Stopped};
use super::state::{Candidate, Root, Stage};
use super::{finish_switch, log, refused, DeployError};

/// Whether the pointer already names this candidate's process: the switch happened, whatever
/// the record's stage says.
pub(super) fn switched(root: &Root, candidate: &Candidate) -> Result<bool, DeployError> {
    let pointer = root.read_pointer().map_err(refused)?;
    Ok(match (pointer, candidate.identity()) {
        (Some(pointer), Some(process)) => pointer.names(process),
        _ => false,
    })
}

/// A candidate left behind by a deployer that died (we hold the lock, so it is dead): if the
/// switch had happened, finish it (drain and stop the previous release, record the promotion);
/// otherwise stop the candidate and record the rollback. An outcome the dead deployer already
/// logged is not logged again. An escalated candidate waits for a person instead.
pub(crate) async fn recover(root: &Root) -> Result<(), DeployError> {
    let Some(left) = root.read_candidate().map_err(refused)? else {
        return Ok(());
    };
    if left.stage == Stage::Watching && switched(root, &left)? {
        super::watch::finish_found(root, &left).await?;
        return Ok(());
    }
    if switched(root, &left)? {
        finish_switch(
            root,
            &left,
            left.previous.as_ref(),
            format!(
                "switched before deployer pid {} died; recorded by the next deploy",
                left.deployer_pid
            ),
            None,
            true,
        )
        .await?;
        return Ok(());
    }
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
        Event::RolledBack,
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
