//! The engine: one planner and one executor for every kind of run. A deploy is the one-replica
//! rollout; a rollout of N replicas moves in waves.
//!
//! This file is its front door, and the only part of it a command names: [`start`] a run
//! ([`Start`] with its [`Plan`]), [`ask`] something of one in flight ([`Ask`]), [`watch`] a
//! deploy's watch in the background, read what a root holds ([`RootStatus`], [`saved_run`]),
//! and the two writes `up` needs ([`record_restart`], `recover_leaving_escalated`). Every run
//! ends in one [`Outcome`]. Behind it, private:
//!
//! - `start`: the one start sequence; `ask`: a person's word; `outcome`: how a run ended;
//! - `budgets`: the surge and unavailable budgets and the wave sizes, as Kubernetes rounds them;
//! - `plan` and `settings`: a deploy's and a rollout's numbers and plans, from the command
//!   line, the policy and the defaults;
//! - `state`: the persisted truth of a run in flight (`rollout.json`), saved before each effect;
//! - `step`: the pure planner (state + event -> state + actions), property-tested;
//! - `run`: the executor that performs the planner's actions and feeds it events, with `tasks`
//!   (the gates, soaks and watches it runs) and `record` (the log lines and the pool it writes);
//! - `gate` and `judge`: the readiness gate every replica passes and the verdicts it reaches;
//! - `voice` and `deploy_voice`: the words of a rollout's and a deploy's lines;
//! - `recover`: after a crash, the state matched against what runs, so a restart is one more
//!   pass (a deploy's included);
//! - `control`: pause/resume/abort requests from another process; `view` and `status`: how a
//!   run and a root are shown.
//!
//! The engine names the host layer below it (and policy, release, proxy, render), never the
//! commands above it.

pub mod analysis;
mod ask;
pub mod budgets;
pub mod clock;
mod control;
mod deploy_voice;
mod fault;
pub mod formation;
mod gate;
mod judge;
mod outcome;
pub mod plan;
mod record;
mod recover;
mod retire;
mod rollout_voice;
mod run;
mod runtime;
pub mod schedule_status;
pub mod settings;
mod standby;
mod start;
mod state;
pub mod status;
mod step;
mod tasks;
mod types;
#[cfg(test)]
mod types_tests;
pub mod view;
mod voice;

pub use ask::{ask, watch, Ask};
pub use outcome::{Ending, Outcome, Stream};
pub use recover::record_restart;
pub(crate) use recover::recover_leaving_escalated;
pub use run::WATCHER_OUTPUT;
pub use runtime::runtime;
pub use standby::retire_standby;
pub use start::{
    beside_the_live, not_a_replica_set, port_free, proxy_counts, start, Plan, PortChoice, Start,
    Tail,
};
pub use state::{Phase, Rollout, SlotState};
pub use status::{service_of, LiveStatus, ReplicaStatus, RootStatus};

use crate::error::Error;
use crate::host::state::Root;

/// `rollgate rollback` took a promoted release from users: its `rolled_back` line, with how
/// long they had it and what it answered them (`record::log_rolled_back_in_production`).
pub fn record_rolled_back_in_production(
    root: &Root,
    service: &str,
    version: &str,
    promoted_at: f64,
    back_to: &str,
    because: Option<&str>,
) -> Result<(), Error> {
    record::log_rolled_back_in_production(root, service, version, promoted_at, back_to, because)
}

/// A command's persisted action outside a run (`stop`, `start`): a point where the crash tests'
/// `ROLLGATE_FAULT=kill-after-action:K` may kill it, counted with the engine's own.
pub fn fault_point() {
    fault::point();
}

/// What runs under a root: every process of the live release, web's as the proxy's views
/// name them (see `formation`). None: nothing was ever made live there.
pub fn what_runs(root: &Root) -> Result<Option<crate::host::state::Formation>, Error> {
    Ok(formation::read(root)?)
}

/// The run in flight under a root (or the last one, ended), as the engine saved it: what
/// `status`, `rollout status`, `release list` and the console read. Only the engine writes it.
pub fn saved_run(root: &Root) -> Result<Option<Rollout>, Error> {
    Ok(state::load(root)?)
}
