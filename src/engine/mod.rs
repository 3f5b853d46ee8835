//! The engine: one planner and one executor for every kind of run. A deploy is the one-replica
//! rollout (`single` plans it and words its lines); a rollout of N replicas moves in waves.
//!
//! - `budgets`: the surge and unavailable budgets and the wave sizes, as Kubernetes rounds them;
//! - `state`: the persisted truth of a run in flight (`rollout.json`), saved before each effect;
//! - `step`: the pure planner (state + event -> state + actions), property-tested;
//! - `run`: the executor that performs the planner's actions and feeds it events, with `tasks`
//!   (the gates, soaks and watches it runs) and `record` (the log lines and the pool it writes);
//! - `gate` and `judge`: the readiness gate every replica passes and the verdicts it reaches;
//! - `recover`: after a crash, the state matched against what runs, so a restart is one more pass;
//! - `control`: pause/resume/abort requests from another process; `settings`: a rollout's
//!   numbers from its arguments, the policy and the defaults; `view`: how a run is shown.
//!
//! The engine names the host layer below it (and policy, release, proxy, render), never the
//! commands above it.

pub mod budgets;
pub mod control;
pub(crate) mod fault;
pub(crate) mod gate;
pub mod judge;
pub(crate) mod record;
pub mod recover;
pub(crate) mod run;
pub mod settings;
pub mod single;
pub mod state;
pub mod step;
mod tasks;
pub mod view;
mod voice;

use std::time::{Duration, Instant};

use crate::error::{refused, Error};
use crate::host::state::Root;
use crate::proxy::drain;

/// Where a background watcher (`deploy --no-wait`) writes its output, in the root.
pub const WATCHER_OUTPUT: &str = "watcher.output";

/// The single-threaded runtime every command that drives the engine runs on.
pub fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| refused(format!("cannot start the async runtime: {e}")))
}

/// Asks a proxy serving the root to finish the old release's requests. Unless it confirms (or
/// there is no proxy), it may still be routing to the old release, so the old release is kept
/// for the whole drain timeout before it is stopped.
pub(crate) async fn drain_before_stop(root: &Root, port: u16, drain_ms: u64) -> String {
    let limit = Duration::from_millis(drain_ms).min(crate::host::MAX_WAIT);
    let asked = Instant::now();
    let answer = drain::request(&root.0, port, limit).await;
    if judge::drain_confirmed(&answer) {
        return format!("{answer}; ");
    }
    tokio::time::sleep(limit.saturating_sub(asked.elapsed())).await;
    format!(
        "{answer}; the proxy did not confirm, so the old release was kept for the {} ms drain timeout; ",
        limit.as_millis()
    )
}
