//! The schedules' read model (issue 70): the live release's policy's schedules as the clock
//! keeper runs them ([`kept_schedules`]), and what `rollgate schedules list`, `status` and the
//! console show of each ([`ScheduleStatus`]): its state, next due time, last run, runs going.

use serde::Serialize;

use super::clock::Schedule;
use crate::host::launch::LaunchRecord;
use crate::host::schedule_book::{Book, Ended};
use crate::host::state::Root;

/// The live release and the schedules its kept policy gives.
#[derive(Debug, Clone)]
pub struct KeptSchedules {
    pub service: String,
    pub version: String,
    /// How the live release's processes start: a run starts the same way.
    pub launch: LaunchRecord,
    pub schedules: Vec<Schedule>,
    /// A schedule the policy names that cannot run, and why.
    pub refused: Vec<String>,
}

/// The live release and its kept policy's schedules, stopped or not; None when nothing is live
/// (or its policy record cannot be read: then nothing runs on a clock until a deploy keeps one).
pub fn kept_schedules(root: &Root) -> Option<KeptSchedules> {
    let pointer = root.read_pointer().ok().flatten()?;
    let (version, kept) = crate::host::kept_policy::KeptPolicy::of_live(root).ok()??;
    let settings = kept
        .settings(&crate::host::kept_policy::KeptPolicy::path(root, &version))
        .ok()?;
    let mut schedules = Vec::new();
    let mut refused = Vec::new();
    for (name, policy) in settings.schedules.iter().flatten() {
        match Schedule::of(name, policy) {
            Ok(schedule) => schedules.push(schedule),
            Err(why) => refused.push(why.to_string()),
        }
    }
    Some(KeptSchedules {
        service: pointer.service,
        version: pointer.version,
        launch: pointer.launch,
        schedules,
        refused,
    })
}

/// Whether a person stopped the service (its schedules pause with it).
pub fn is_stopped(root: &Root) -> bool {
    crate::host::stopped::read(&root.0).ok().flatten().is_some()
}

/// One schedule as everything that shows a root shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleStatus {
    pub schedule: String,
    pub cron: String,
    pub command: Vec<String>,
    pub concurrency: String,
    /// `kept`, `paused (the service is stopped)` or `not kept (...)`.
    pub state: String,
    pub next_due: Option<f64>,
    /// The pids of its runs going.
    pub running: Vec<i32>,
    pub last: Option<Ended>,
}

/// Each schedule of the live policy, in its order, with what `book` holds of it.
pub fn schedules(root: &Root, kept: &KeptSchedules, book: &Book, now: f64) -> Vec<ScheduleStatus> {
    let state = match (
        is_stopped(root),
        crate::host::lock::is_free(&crate::host::schedule_book::keeper_lock(&root.0)),
    ) {
        (true, _) => "paused (the service is stopped)",
        (false, false) => "kept",
        (false, true) => "not kept (no clock keeper runs: `rollgate up`)",
    };
    kept.schedules
        .iter()
        .map(|s| {
            let taken = book.schedules.get(&s.name).cloned().unwrap_or_default();
            ScheduleStatus {
                schedule: s.name.clone(),
                cron: s.expression.clone(),
                command: s.command.clone(),
                concurrency: format!("{:?}", s.concurrency).to_lowercase(),
                state: state.to_string(),
                next_due: s.next_after(taken.last_due.unwrap_or(now).max(now)),
                running: taken
                    .running
                    .iter()
                    .filter(|r| r.pid > 0 && r.identity().is_running())
                    .map(|r| r.pid)
                    .collect(),
                last: taken.last,
            }
        })
        .collect()
}
