//! After a crash: what a deployer killed mid-deploy left behind is found by the next command
//! that takes the root. A deploy is the engine's one-replica case, so its state file says what
//! it had done; a `candidate` record an older rollgate left is read into the same terms first.

use super::state::Root;
use super::{refused, DeployError};
use crate::rollout::{single, state as rollout_state};

/// A deploy left unfinished by a deployer that died (we hold the lock, so it is dead): a switch
/// that happened is finished, one that did not is undone and logged as rolled back. An
/// escalated candidate waits for a person instead (refused with what to run).
pub(crate) async fn recover(root: &Root) -> Result<(), DeployError> {
    single::adopt_legacy(root)?;
    match rollout_state::load(root).map_err(refused)? {
        Some(left) if left.unsettled_deploy() => single::finish(root, left).await,
        _ => Ok(()),
    }
}
