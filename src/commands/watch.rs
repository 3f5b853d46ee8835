//! After the switch: the new release is watched for `watch_ms` with the previous release kept
//! running as the proxy's fallback (drained, not stopped). If the new one exits, or fails
//! `watch_failures` probes in a row, `current` goes back to the previous release in the same
//! atomic way, the new one is stopped, and `rolled_back` is logged with the phase `watch`. Only
//! a release that passed its watch is logged `promoted`, so the lesson's summary never calls a
//! switched-back release live.
//!
//! The watch is the last soak of the deploy's one-replica rollout (see `engine::single`); this
//! module holds the background watcher that `deploy --no-wait` leaves to finish it.

use std::time::Duration;

use super::deploy::DeployOutcome;
use crate::engine::recover::Redo;
use crate::engine::state::{self as rollout_state, Phase};
use crate::engine::{single, step::Event};
use crate::error::{refused, Error};
use crate::host::lock;
use crate::host::signals::Signals;
use crate::host::state::Root;

/// `rollgate watch SVC --token T` (started by `deploy --no-wait`): waits for the deployer to
/// let go of the lock, then finishes the watch it recorded, if that deploy is still watching.
pub fn run_watcher(
    service: &str,
    root: std::path::PathBuf,
    token: &str,
) -> Result<DeployOutcome, Error> {
    let root = Root::existing(root).map_err(refused)?;
    crate::engine::runtime()?.block_on(async {
        let mut signals = Signals::install().map_err(refused)?;
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
        let watching = rollout_state::load(&root).map_err(refused)?.filter(|r| {
            r.id == token
                && r.service == service
                && r.unsettled_deploy()
                && r.phase == Phase::Running
                && r.soak_until.is_some()
        });
        // Someone else finished this watch first.
        let Some(rollout) = watching else {
            return Ok(DeployOutcome::Aborted);
        };
        let mut executor = single::executor(&root, rollout)
            .redo(Redo::default())
            .await?;
        Ok(match executor.run(Event::Tick, &mut signals).await? {
            Phase::Completed => DeployOutcome::Promoted,
            _ => DeployOutcome::RolledBack,
        })
    })
}
