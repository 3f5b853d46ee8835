//! After a crash: what a deployer killed mid-deploy left behind is found by the next command
//! that takes the root. A deploy is the engine's one-replica case, so its state file says what
//! it had done; a `candidate` record an older rollgate left is read into the same terms first.

use super::{refused, DeployError};
use crate::host::state::Root;
use crate::rollout::{self, single, state as rollout_state};

/// Whatever a rollgate that died left on the root (we hold the lock, so it is dead), finished
/// by the same executor. A deploy: a switch that happened is finished, one that did not is
/// undone and logged as rolled back; an escalated candidate waits for a person instead
/// (refused with what to run). A rollout: an ended one is settled, a running one is paused
/// with every replica serving (see [`rollout::recover::finish`]).
pub(crate) async fn recover(root: &Root) -> Result<(), DeployError> {
    single::adopt_legacy(root)?;
    match rollout_state::load(root).map_err(refused)? {
        Some(left) if left.unsettled_deploy() => single::finish(root, left).await,
        Some(left) if left.single.is_none() => rollout::recover::finish(root, left).await,
        _ => Ok(()),
    }
}

/// For `up` (and each pass of `up --supervise`), `promote` and `abort`: the same, except that
/// an escalated deploy is left waiting for its person. The release it would replace is live and is started meanwhile:
/// after a reboot, nothing waits on a decision to serve.
pub(crate) async fn recover_leaving_escalated(root: &Root) -> Result<(), DeployError> {
    single::adopt_legacy(root)?;
    if let Some(left) = rollout_state::load(root).map_err(refused)? {
        if left.unsettled_deploy() && left.slot(0).held && !single::is_switched(root, &left)? {
            return Ok(());
        }
    }
    recover(root).await
}
