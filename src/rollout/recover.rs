//! After a crash: the rollout as saved is matched against the processes that run, so that the
//! executor can continue from a state that names everything running and nothing else.
//!
//! Work in flight is redone, never guessed at: a process being gated is stopped and its slot
//! starts again; a swap whose save did not happen is undone the same way; a process being
//! retired is stopped; a live replica that died leaves the pool. Any process carrying the
//! rollout's token that the state does not name is stopped.

use std::time::Duration;

use super::state::{Phase, Rollout, SlotState};
use crate::deploy::process::{self, Identity};

/// What the executor must restart once recovery is done.
#[derive(Debug, Default, PartialEq)]
pub struct Redo {
    /// Slots whose previous version must serve again (their new process failed or the
    /// rollout stopped while they were out of the pool).
    pub bring_back: Vec<usize>,
    /// Slots an abort with rollback had not returned yet.
    pub restore: Vec<usize>,
}

/// Decides, from the saved rollout and which recorded processes still run, what the state
/// becomes; touches nothing. `running(process)` answers for one recorded process; `resuming`:
/// the rollout is about to run again, so its pending slots need not serve their old version.
pub fn reconcile(
    rollout: &mut Rollout,
    running: impl Fn(Identity) -> bool,
    resuming: bool,
) -> Redo {
    let to = rollout.to.clone();
    let phase = rollout.phase;
    let mut redo = Redo::default();
    for s in &mut rollout.slots {
        // A process being gated (or a restore's) is stopped by the caller; the slot's step is
        // taken again.
        s.candidate = None;
        // A retired process is out of the pool already (or is taken out now).
        s.retiring = None;
        if s.live.as_ref().is_some_and(|l| !running(l.identity())) {
            s.live = None;
        }
        let on_new = s.live.as_ref().is_some_and(|l| l.version == to);
        match s.state {
            SlotState::Upgrading => {
                s.state = SlotState::Pending;
                s.left_pool = false;
            }
            // The swap did not happen (or the new replica died since): do it again.
            SlotState::Succeeded if !on_new && phase == Phase::Running => {
                s.state = SlotState::Pending;
                s.finished = None;
            }
            SlotState::RollingBack if !on_new => {
                s.state = SlotState::RolledBack;
            }
            SlotState::RollingBack => redo.restore.push(s.slot),
            _ => {}
        }
        let upgrades_later = (phase == Phase::Running || resuming) && s.state == SlotState::Pending;
        if s.live.is_none() && s.from_version.is_some() && !upgrades_later {
            redo.bring_back.push(s.slot);
        }
    }
    redo
}

/// Every recorded process of the saved rollout that is not live (candidates, retiring), plus
/// any process carrying the rollout's token that is not live: all of it is to be stopped.
pub fn strays(saved: &Rollout, reconciled: &Rollout) -> Vec<Identity> {
    let live: Vec<Identity> = reconciled
        .slots
        .iter()
        .filter_map(|s| s.live.as_ref().map(|l| l.identity()))
        .collect();
    let mut stray: Vec<Identity> = saved
        .processes()
        .filter(|p| p.pid > 0)
        .map(|p| p.identity())
        .filter(|who| !live.contains(who))
        .collect();
    for (who, _) in process::find_by_token_prefix(&format!("{}-", saved.id)) {
        if !live.contains(&who) && !stray.contains(&who) {
            stray.push(who);
        }
    }
    stray
}

pub async fn stop_all(strays: &[Identity], grace: Duration) {
    for who in strays {
        process::stop_group(*who, grace).await;
    }
}
