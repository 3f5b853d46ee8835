//! After a crash: the rollout as saved is matched against the processes that run, so that the
//! executor can continue from a state that names everything running and nothing else.
//!
//! Work in flight is redone, never guessed at: a process being gated is stopped and its slot
//! starts again; a swap whose save did not happen is undone the same way; a process being
//! retired is stopped; a live replica that died leaves the pool. Any process carrying the
//! rollout's token that the state does not name is stopped.

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
            // Its removal was under way: finished by the stray sweep, never brought back.
            SlotState::Removed => {
                s.live = None;
                continue;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deploy::state::ReplicaClass;
    use crate::rollout::state::{Process, Settings, Slot};

    fn process(version: &str, pid: i32) -> Process {
        Process {
            version: version.into(),
            port: 9000 + pid as u16,
            pid,
            start_time: 7,
            token: format!("r1-{pid}"),
        }
    }

    fn slot(n: usize, state: SlotState, live: Option<Process>) -> Slot {
        Slot {
            slot: n,
            class: ReplicaClass::BestEffort,
            state,
            live,
            candidate: None,
            wave: Some(0),
            from_version: Some("v1".into()),
            retiring: None,
            left_pool: false,
            started: None,
            finished: Some(1.0),
            error: None,
            held: false,
            fallback: None,
        }
    }

    fn rollout(phase: Phase, slots: Vec<Slot>) -> Rollout {
        Rollout {
            id: "r1".into(),
            service: "edge-svc".into(),
            from: Some("v1".into()),
            to: "v2".into(),
            started_at: 0.0,
            phase,
            settings: Settings {
                replicas: slots.len(),
                surge: 1,
                unavailable: 0,
                progress_deadline_ms: 1000,
                poll_ms: 50,
                min_ready_ms: 0,
                soak_ms: 0,
                max_failure_ratio: 0.05,
                grace_ms: 100,
                drain_ms: 100,
                release_deadline: 1e12,
                ports: (9000, 9100),
                wave_percents: vec![100],
                probe: Default::default(),
                watch_ms: 0,
                on_stall: Default::default(),
                keep_fallback: false,
            },
            waves: vec![(0..slots.len()).collect()],
            wave: 0,
            slots,
            soak_until: None,
            pause_reason: None,
            abort_cause: None,
            signed: None,
            hooks: Default::default(),
            single: None,
        }
    }

    #[test]
    fn work_in_flight_is_redone_and_dead_replicas_leave_the_pool() {
        let mut gating = slot(0, SlotState::Upgrading, Some(process("v1", 1)));
        gating.candidate = Some(process("v2", 11));
        gating.left_pool = true;
        // Marked ready, but the swap was never saved: the live one is still v1.
        let mut unswapped = slot(1, SlotState::Succeeded, Some(process("v1", 2)));
        unswapped.candidate = Some(process("v2", 12));
        let mut swapped = slot(2, SlotState::Succeeded, Some(process("v2", 13)));
        swapped.retiring = Some(process("v1", 3));
        let died = slot(3, SlotState::Succeeded, Some(process("v2", 14)));
        let failed_out_of_pool = slot(4, SlotState::Failed, None);
        // Removed by a scale down, its stop cut short: it leaves for good.
        let removing = slot(5, SlotState::Removed, Some(process("v1", 6)));
        let mut r = rollout(
            Phase::Running,
            vec![
                gating,
                unswapped,
                swapped,
                died,
                failed_out_of_pool,
                removing,
            ],
        );
        let saved = r.clone();
        let redo = reconcile(&mut r, |who| who.pid != 14, false);
        let states: Vec<SlotState> = r.slots.iter().map(|s| s.state).collect();
        assert_eq!(
            states,
            [
                SlotState::Pending,
                SlotState::Pending,
                SlotState::Succeeded,
                SlotState::Pending,
                SlotState::Failed,
                SlotState::Removed
            ]
        );
        assert!(r
            .slots
            .iter()
            .all(|s| s.candidate.is_none() && s.retiring.is_none()));
        assert!(!r.slots[0].left_pool);
        assert_eq!(r.slots[3].live, None, "a dead replica leaves the pool");
        // The failed slot out of the pool gets its old version back; pending ones upgrade.
        assert_eq!(redo.bring_back, vec![4]);
        assert!(redo.restore.is_empty());
        // Candidates and the retiring process are strays; live ones never are.
        let strays: Vec<i32> = strays(&saved, &r).iter().map(|who| who.pid).collect();
        assert_eq!(strays, vec![11, 12, 3, 14, 6]);
    }

    #[test]
    fn an_abort_with_rollback_resumes_its_restores_and_a_paused_rollout_serves_its_old_version() {
        let restoring = slot(0, SlotState::RollingBack, Some(process("v2", 1)));
        let restored = slot(1, SlotState::RollingBack, Some(process("v1", 2)));
        let mut r = rollout(Phase::Aborted, vec![restoring, restored]);
        let redo = reconcile(&mut r, |_| true, false);
        assert_eq!(redo.restore, vec![0]);
        assert_eq!(r.slots[1].state, SlotState::RolledBack);

        let paused_out_of_pool = slot(0, SlotState::Pending, None);
        let mut r = rollout(Phase::Paused, vec![paused_out_of_pool]);
        assert_eq!(
            reconcile(&mut r.clone(), |_| true, false).bring_back,
            vec![0]
        );
        // Resuming: it will be upgraded anyway.
        assert!(reconcile(&mut r, |_| true, true).bring_back.is_empty());
    }
}
