//! A rollout as it is persisted (`ROOT/rollout.json`, replaced atomically before each action):
//! everything needed to continue it after a crash or a pause.

use serde::{Deserialize, Serialize};

use crate::host::fault::Fault;
use crate::host::files::{checked, read_json, write_atomically};
use crate::host::identity::Identity;
use crate::host::names::check_name;
use crate::host::state::{
    too_many, Candidate, Pointer, Replica, ReplicaClass, ReplicaSet, Root, Stage, MAX_SLOTS,
};

pub const ROLLOUT_FILE: &str = "rollout.json";

/// A deploy's release deadline: none that a person waiting on an escalation could miss.
pub(super) const NO_RELEASE_DEADLINE_S: f64 = 100.0 * 365.0 * 86_400.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Running,
    Paused,
    Completed,
    Aborted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotState {
    /// Waiting for its wave.
    Pending,
    /// A new-version process is being gated (or must stay ready for `min_ready_ms`).
    Upgrading,
    /// Serves the new version.
    Succeeded,
    /// Its new-version process failed; the slot went back to its previous version.
    Failed,
    /// Already on the new version when the rollout began.
    Skipped,
    /// Going back to the baseline (abort with rollback).
    RollingBack,
    RolledBack,
    /// Keeps its version; outside every wave and gate.
    LeftBehind,
    /// Beyond the replicas asked for (a scale down): leaves the pool before the first wave.
    Surplus,
    /// Left the pool for a scale down: drained and stopped, not brought back by a rollback.
    Removed,
}

/// A process of the service that rollgate started (or found) for a slot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Process {
    pub version: String,
    pub port: u16,
    pub pid: i32,
    pub start_time: u64,
    /// Carried as `ROLLGATE_DEPLOY_TOKEN`, so a process whose pid never got recorded is found.
    pub token: String,
    /// How it was started, when not as the run starts its new processes (the live release a
    /// run found, and the previous release it brings back): see [`Rollout::launch_of`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<crate::host::launch::LaunchRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    pub slot: usize,
    pub class: ReplicaClass,
    pub state: SlotState,
    /// The process in the pool for this slot (None: the slot has never served).
    pub live: Option<Process>,
    /// The new-version process being gated, recorded before it is spawned.
    pub candidate: Option<Process>,
    pub wave: Option<usize>,
    /// The version the slot served when the rollout began (None: a new slot), which a revert
    /// or a rollback brings back.
    #[serde(default)]
    pub from_version: Option<String>,
    /// How the process of `from_version` was started (from `current`), so that a revert or a
    /// rollback brings it back the way it ran — as its own user, within its own limits — not
    /// as the run starts its new version. None: as the run's (a record older than this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_launch: Option<crate::host::launch::LaunchRecord>,
    /// A process out of the pool that is being drained and stopped, recorded first so that a
    /// crash mid-stop never leaves it running unnamed.
    #[serde(default)]
    pub retiring: Option<Process>,
    /// Its live process left the pool before its new one was ready (an unavailable place).
    #[serde(default)]
    pub left_pool: bool,
    pub started: Option<f64>,
    pub finished: Option<f64>,
    pub error: Option<String>,
    /// Its new process stalled at the deadline and is left running for a person (the policy's
    /// `on_stall = 'escalate`): the rollout is paused until it is accepted or aborted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// The process this slot's new one replaced, kept running (drained, out of the pool) as
    /// the proxy's fallback through the watch, so a switch back needs no start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Process>,
    /// Another process type than web (None: a web replica, which the proxy serves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<Kind>,
    /// Its new process passed its gate, and its swap waits until every other type's new
    /// processes are ready too (the web slot of a release of several types).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gated: bool,
}

/// A slot of another process type than web (issue 69): which process of the release it is,
/// and how its new process is started, proven ready and replaced. Decided when the run is
/// planned, from the release's Procfile and the policy's `processes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kind {
    pub process_type: String,
    /// Its place among the type's processes (0, 1, ...).
    pub index: usize,
    /// Its old process stops (its whole tree gone) before its new one starts: the type's
    /// `overlap = false`, or a singleton.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop_first: bool,
    /// How long its new process must stay ready before it counts as ready.
    pub min_ready_ms: u64,
    /// How its new process is started: its Procfile line as `command`, its type's readiness
    /// as `probe`, its type's grace.
    pub launch: crate::host::launch::LaunchRecord,
}

impl Kind {
    /// `worker.1`.
    pub fn name(&self) -> String {
        format!("{}.{}", self.process_type, self.index)
    }
}

/// Why a rollout aborted: the slot, the reason, and the phase (canary: the first wave;
/// release: the rest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbortCause {
    pub slot: Option<usize>,
    pub reason: String,
    pub phase: String,
}

/// A run saved before `soak_failures` existed is judged by the default.
fn soak_failures() -> u32 {
    crate::defaults::WATCH_FAILURES
}

/// The numbers a rollout runs by, fixed when it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub replicas: usize,
    pub surge: usize,
    pub unavailable: usize,
    pub progress_deadline_ms: u64,
    pub poll_ms: u64,
    pub min_ready_ms: u64,
    pub soak_ms: u64,
    pub max_failure_ratio: f64,
    pub grace_ms: u64,
    pub drain_ms: u64,
    /// Unix seconds; the whole rollout's deadline, never restarted.
    pub release_deadline: f64,
    /// The ports replica processes are given, first and last (inclusive).
    pub ports: (u16, u16),
    /// The wave percentages the plan came from.
    pub wave_percents: Vec<u64>,
    /// After the last wave: how long the new replicas are watched (as a soak) before the
    /// rollout is promoted (0 for a first install: nothing to go back to).
    #[serde(default)]
    pub watch_ms: u64,
    /// What a replica that is still running but not ready at the deadline leads to: a failure
    /// (roll back), or a pause with the replica held for a person (escalate).
    #[serde(default)]
    pub on_stall: crate::policy::OnStall,
    /// Failed probes in a row that fail a replica in a soak or the rollout's watch (the
    /// policy's `watch_failures`); an exit or a fatal probe fails it at once.
    #[serde(default = "soak_failures")]
    pub soak_failures: u32,
    /// The last wave's replaced processes are kept as fallbacks through the watch (a single
    /// deploy: N = 1, so the kept one fits the surge place its new one used).
    #[serde(default)]
    pub keep_fallback: bool,
    /// How each replica's output file is bounded (the policy's `output_max_bytes`, `output_keep`).
    #[serde(default)]
    pub output: crate::host::output::Rotation,
    /// The traffic judge's settings (policy `analysis`), if the policy asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<crate::engine::analysis::Analysis>,
    /// The live release is stopped before the new one starts, the service's users' requests
    /// held at the proxy meanwhile (`traffic.json` paused by the run): a deploy that changes
    /// the user the service runs as, whose folders cannot belong to two users at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop_first: bool,
    /// How each new process of the run is started (the policy's probe, held socket,
    /// confinement, limits, user and writable folders), decided when the run was planned.
    #[serde(flatten)]
    pub launch: crate::host::launch::LaunchRecord,
}

impl Settings {
    /// How its releases, and so its hooks, are confined.
    pub fn isolation(&self) -> crate::host::confine::Isolation<'_> {
        self.launch.isolation()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    pub id: String,
    pub service: String,
    /// The version most replicas served when the rollout began (None: a first install).
    pub from: Option<String>,
    pub to: String,
    /// Unix seconds.
    pub started_at: f64,
    pub phase: Phase,
    pub settings: Settings,
    /// The slots of each wave, in order.
    pub waves: Vec<Vec<usize>>,
    /// The wave in progress (== waves.len() once all are done).
    pub wave: usize,
    pub slots: Vec<Slot>,
    /// Unix seconds at which the current wave's soak ends.
    pub soak_until: Option<f64>,
    pub pause_reason: Option<String>,
    pub abort_cause: Option<AbortCause>,
    /// For a signed release: what the release floor becomes once the rollout completes,
    /// whichever rollgate completes it (the one that started it, or a `resume`).
    #[serde(default)]
    pub signed: Option<crate::release::Signed>,
    /// The policy's hooks, resolved: whichever rollgate ends the rollout runs the post hook.
    #[serde(default)]
    pub hooks: crate::host::hooks::Hooks,
    /// Set when this is a single deploy (`rollgate deploy`, the engine's one-replica case): it
    /// speaks the deploy's log lines and ends as a deploy does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub single: Option<Single>,
    /// The ending's effects (reverts and restores, the outcome line, the floor, the post hook)
    /// are still owed. Set while the rollout runs and cleared only once they are all done, so
    /// whoever takes the root after a crash finishes an ended rollout instead of taking it for
    /// done. (Absent in files of an older rollgate: those ended rollouts count as settled.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsettled: bool,
    /// The post hook was started: saved before it runs, so it runs at most once, crash or not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub post_hook_started: bool,
    /// The run paused the service's traffic (a stop-first run) and owes it its resume, a
    /// recovery after a crash included.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub holds_requests: bool,
    /// The traffic judge's last verdict in this run (status and the console show it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_analysis: Option<crate::engine::analysis::Verdict>,
    /// A scale's type counts: written to `scale.json` when the run completes (the same again
    /// when a crash makes that happen twice); an aborted run leaves the file as it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<std::collections::BTreeMap<String, usize>>,
    /// A scale of the other types alone ([`super::settings::Args::types_only`]): web's slots
    /// and every typed process already on the version are `Skipped`; only new places start
    /// and the extra ones stop, and the run writes `formation.json` alone (web's files and the
    /// pointer, with its fallback, stay as they are).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub types_only: bool,
}

/// What a single deploy carries beyond a rollout, for its log lines and whoever finishes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Single {
    pub deployer_pid: u32,
    /// The release live when the deploy began (None: a first release).
    pub previous: Option<Process>,
    /// Where the gate's deadline came from (`--deadline-ms`, the policy, the default).
    pub deadline_source: String,
    /// Failed probes in a row that end the watch.
    pub watch_failures: u32,
    /// What the gate said ("ready after 412 ms (5 probes)"), for the promoted line.
    #[serde(default)]
    pub gate_detail: Option<String>,
    #[serde(default)]
    pub gate_elapsed_ms: Option<u64>,
    /// The gate's last probes, for a rollback's line.
    #[serde(default)]
    pub last_probes: Option<String>,
    /// What the switch said (the proxy's drain answer; a pointer whose folder fsync failed).
    #[serde(default)]
    pub switch_detail: String,
    /// The background watcher of `deploy --no-wait`.
    #[serde(default)]
    pub watcher_pid: Option<u32>,
    /// Its outcome is on record (logged, or there was none: refused before anything ran).
    /// Until then, whoever takes the root next finishes it.
    #[serde(default)]
    pub settled: bool,
}

impl Slot {
    /// Web's slot: its process serves through the proxy (a port, the gate's probe, the switch).
    /// A slot with a `kind` is another type's, which serves nothing; this is the one question
    /// the planner asks of a slot's type.
    pub fn serves(&self) -> bool {
        self.kind.is_none()
    }

    /// Whether a process it replaced still has to go: kept as its fallback, or recorded
    /// leaving (out of the pool, its stop decided) by a run whose rollgate died before it
    /// stopped.
    pub fn has_an_old_process(&self) -> bool {
        self.fallback.is_some() || self.retiring.is_some()
    }

    /// A slot serving `live` (its version is what a revert or a rollback brings back), in no
    /// wave yet, with nothing in flight.
    pub fn new(slot: usize, class: ReplicaClass, state: SlotState, live: Option<Process>) -> Slot {
        Slot {
            slot,
            class,
            state,
            from_version: live.as_ref().map(|l| l.version.clone()),
            from_launch: live.as_ref().and_then(|l| l.launch.clone()),
            live,
            candidate: None,
            wave: None,
            retiring: None,
            left_pool: false,
            started: None,
            finished: None,
            error: None,
            held: false,
            fallback: None,
            kind: None,
            gated: false,
        }
    }

    /// How the slot is named in reasons: `replica 0`, or its process `worker.1`.
    pub fn name(&self) -> String {
        match &self.kind {
            Some(kind) => kind.name(),
            None => format!("replica {}", self.slot),
        }
    }

    /// A required replica that has not confirmed the new version (the release deadline waits
    /// for these).
    pub fn awaits_confirmation(&self) -> bool {
        self.class == ReplicaClass::Required
            && !matches!(
                self.state,
                SlotState::Succeeded | SlotState::Skipped | SlotState::LeftBehind
            )
    }
}

impl Rollout {
    /// The pointer naming `version` on `port` (process `pid`, started at `start_time`) as
    /// live, with what the rollout's settings say of how it runs (probe, listening socket,
    /// confinement); promoted at 0 and without a fallback until the caller says otherwise.
    /// `current` naming `process`, with the record it was started from.
    pub(crate) fn pointer_to(&self, process: &Process) -> Pointer {
        Pointer {
            service: self.service.clone(),
            version: process.version.clone(),
            port: process.port,
            pid: process.pid,
            start_time: process.start_time,
            promoted_at: 0.0,
            fallback: None,
            launch: self.launch_of(process).clone(),
        }
    }

    /// How `process` was started: its own record, else the run's (what every process the run
    /// starts for its new version is started with).
    pub fn launch_of<'a>(&'a self, process: &'a Process) -> &'a crate::host::launch::LaunchRecord {
        process.launch.as_ref().unwrap_or(&self.settings.launch)
    }
}

impl Rollout {
    pub fn slot(&self, slot: usize) -> &Slot {
        &self.slots[slot]
    }

    pub fn slot_mut(&mut self, slot: usize) -> &mut Slot {
        &mut self.slots[slot]
    }

    /// Slots of the current wave.
    pub fn wave_slots(&self) -> &[usize] {
        self.waves.get(self.wave).map_or(&[], Vec::as_slice)
    }

    /// The canary is the first wave; everything after it is the release.
    pub fn phase_name(&self) -> &'static str {
        if self.wave == 0 {
            "canary"
        } else {
            "release"
        }
    }

    /// How many of web's replicas are in `state` (the other types' processes are counted by
    /// [`Rollout::types_in_step`]).
    pub fn count(&self, state: SlotState) -> usize {
        let web = self.slots.iter().filter(|s| s.serves());
        web.filter(|s| s.state == state).count()
    }

    /// The other types' processes the run moves, for its lines: `worker ×2, clock ×1`; None
    /// when it moves web alone.
    pub fn types_in_step(&self, slots: &[usize]) -> Option<String> {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for kind in slots.iter().filter_map(|s| self.slot(*s).kind.as_ref()) {
            match counts
                .iter_mut()
                .find(|(name, _)| *name == kind.process_type)
            {
                Some((_, n)) => *n += 1,
                None => counts.push((kind.process_type.clone(), 1)),
            }
        }
        let said: Vec<String> = counts
            .iter()
            .map(|(name, n)| format!("{name} ×{n}"))
            .collect();
        (!said.is_empty()).then(|| said.join(", "))
    }
}

/// `ROOT/rollout.json`: the service's last rollout (one at a time per root).
pub fn load(root: &Root) -> Result<Option<Rollout>, Fault> {
    let path = root.0.join(ROLLOUT_FILE);
    let rollout: Option<Rollout> = read_json(&path)?;
    if let Some(r) = &rollout {
        r.check()
            .map_err(|(field, e)| checked::<(), String>(&path, &field, Err(e)).unwrap_err())?;
    }
    Ok(rollout)
}

impl Rollout {
    /// What a command line would refuse, refused in the saved state too: names that reach
    /// paths, counts that reach allocations, ranges that reach arithmetic.
    fn check(&self) -> Result<(), (String, String)> {
        let name = |field: &str, kind: &str, value: &str| {
            check_name(kind, value).map_err(|e| (field.to_string(), e.to_string()))
        };
        name("service", "service", &self.service)?;
        name("to", "version", &self.to)?;
        if let Some(from) = &self.from {
            name("from", "version", from)?;
        }
        let slots = self.slots.len();
        if slots > MAX_SLOTS || self.settings.replicas > MAX_SLOTS {
            return Err(("slots".into(), too_many(slots.max(self.settings.replicas))));
        }
        for (n, s) in self.slots.iter().enumerate() {
            if s.slot != n {
                return Err((
                    format!("slots[{n}].slot"),
                    format!("is {}, not its place {n}", s.slot),
                ));
            }
            if let Some(from) = &s.from_version {
                name(&format!("slots[{n}].from_version"), "version", from)?;
            }
            if let Some(kind) = &s.kind {
                name(
                    &format!("slots[{n}].kind.process_type"),
                    "process type",
                    &kind.process_type,
                )?;
            }
            let processes = [&s.live, &s.candidate, &s.retiring, &s.fallback];
            for p in processes.into_iter().flatten() {
                name(
                    &format!("slots[{n}]: a process's version"),
                    "version",
                    &p.version,
                )?;
            }
        }
        for (w, wave) in self.waves.iter().enumerate() {
            if let Some(bad) = wave.iter().find(|slot| **slot >= slots) {
                return Err((
                    format!("waves[{w}]"),
                    format!("names slot {bad}; there are {slots}"),
                ));
            }
        }
        if self.wave > self.waves.len() {
            return Err((
                "wave".into(),
                format!("is {}; there are {} waves", self.wave, self.waves.len()),
            ));
        }
        let (first, last) = self.settings.ports;
        if first > last || first == 0 {
            return Err((
                "settings.ports".into(),
                format!("{first}-{last} is not a range of ports"),
            ));
        }
        Ok(())
    }
}

/// Replaces `rollout.json` atomically. It must be durable before the action it announces, so a
/// folder fsync that fails counts as a failure.
/// A single deploy also keeps its `candidate` record, the view of it that `status` and older
/// tools read (as `current` is the view of the pool).
pub fn save(root: &Root, rollout: &Rollout) -> Result<(), Fault> {
    let path = root.0.join(ROLLOUT_FILE);
    let mut bytes = serde_json::to_vec_pretty(rollout).expect("a rollout serializes");
    bytes.push(b'\n');
    write_atomically(&path, &bytes)
        .map_err(|e| Fault::unwritable(&path, format!("cannot write {}: {e}", path.display())))?;
    if rollout.single.is_some() {
        // Most saves leave the view as it was: it is rewritten only when it changes.
        let view = candidate_view(rollout);
        if root.read_candidate().ok().flatten().as_ref() != Some(&view) {
            let path = root.candidate_path();
            root.write_candidate(&view).map_err(|e| {
                Fault::unwritable(&path, format!("cannot write {}: {e}", path.display()))
            })?;
        }
    }
    Ok(())
}

/// Removes `rollout.json` and its `candidate` view (a single deploy whose outcome is on
/// record).
pub fn clear(root: &Root) -> Result<(), Fault> {
    let path = root.0.join(ROLLOUT_FILE);
    let removing = |path: &std::path::Path, e: &dyn std::fmt::Display| {
        Fault::unwritable(path, format!("cannot remove {}: {e}", path.display()))
    };
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(removing(&path, &e)),
        _ => root
            .clear_candidate()
            .map_err(|e| removing(&root.candidate_path(), &e)),
    }
}

impl Process {
    pub fn identity(&self) -> Identity {
        Identity {
            pid: self.pid,
            start_time: self.start_time,
        }
    }
}

impl Rollout {
    /// The replica set the proxy serves: each slot's live process.
    pub fn pool(&self) -> ReplicaSet {
        ReplicaSet {
            service: self.service.clone(),
            replicas: self
                .slots
                .iter()
                .filter(|s| s.serves())
                .filter_map(|s| {
                    let live = s.live.as_ref()?;
                    Some(Replica {
                        slot: s.slot,
                        version: live.version.clone(),
                        port: live.port,
                        pid: live.pid,
                        start_time: live.start_time,
                        class: s.class,
                    })
                })
                .collect(),
        }
    }

    /// A release of several process types: one slot or more is not web.
    pub fn is_whole_release(&self) -> bool {
        self.slots.iter().any(|s| !s.serves())
    }

    /// The live processes of the other types (the formation's, besides web's): each typed
    /// slot's live one.
    pub fn formation(&self) -> crate::host::state::Formation {
        crate::host::state::Formation {
            service: self.service.clone(),
            web_replicas: false,
            processes: self
                .slots
                .iter()
                .filter_map(|s| {
                    let kind = s.kind.as_ref()?;
                    let live = s.live.as_ref()?;
                    Some(crate::host::state::TypedProcess {
                        process_type: kind.process_type.clone(),
                        index: kind.index,
                        version: live.version.clone(),
                        port: None,
                        pid: live.pid,
                        start_time: live.start_time,
                        launch: self.launch_of(live).clone(),
                    })
                })
                .collect(),
        }
    }

    /// Every process the rollout names (live, being gated, being retired, kept as a fallback).
    pub fn processes(&self) -> impl Iterator<Item = &Process> {
        self.slots.iter().flat_map(|s| {
            s.live
                .iter()
                .chain(s.candidate.iter())
                .chain(s.retiring.iter())
                .chain(s.fallback.iter())
        })
    }

    /// How it ended, in a word (for messages).
    pub fn phase_word(&self) -> &'static str {
        match self.phase {
            Phase::Completed => "completed",
            Phase::Aborted => "aborted",
            Phase::Paused => "paused",
            Phase::Running => "running",
        }
    }

    /// Whether this rollout started the process (its token carries the rollout's id). A
    /// single deploy may deploy the version that is live (a restart): its new process is
    /// told from the live one by this, never by the version.
    pub fn started(&self, process: &Process) -> bool {
        !self.id.is_empty()
            && process
                .token
                .strip_prefix(self.id.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('-'))
    }

    /// A single deploy's new process: being gated, held, or in the pool (and its pid, once
    /// recorded).
    pub fn new_process(&self) -> Option<&Process> {
        let s = self.slots.first()?;
        s.candidate
            .iter()
            .chain(s.live.iter())
            .chain(s.retiring.iter())
            .find(|p| self.started(p))
    }

    pub fn is_over(&self) -> bool {
        matches!(self.phase, Phase::Completed | Phase::Aborted)
    }

    /// Ended, with effects of its ending still owed (its rollgate died before they were done).
    pub fn ended_unsettled(&self) -> bool {
        self.is_over() && self.unsettled
    }

    /// A single deploy whose outcome is not on record: its deployer died (or failed) first.
    pub fn unsettled_deploy(&self) -> bool {
        self.single.as_ref().is_some_and(|s| !s.settled)
    }
}

/// The `candidate` record of a single deploy in flight, as deploys have always written it.
pub fn candidate_view(rollout: &Rollout) -> Candidate {
    let s = rollout.slot(0);
    let single = rollout.single.as_ref();
    let recorded = rollout.new_process().filter(|p| p.pid > 0);
    let watching = s.fallback.is_some() && rollout.soak_until.is_some();
    let stage = match (s.held, watching, recorded) {
        (true, _, _) => Stage::Escalated,
        (false, true, _) => Stage::Watching,
        (false, false, Some(_)) => Stage::Running,
        (false, false, None) => Stage::Spawning,
    };
    let previous = single
        .and_then(|x| x.previous.as_ref())
        .map(|p| rollout.pointer_to(p));
    let watch = match (watching, rollout.soak_until, single) {
        (true, Some(until), Some(single)) => Some(crate::host::state::WatchRecord {
            until,
            poll_ms: rollout.settings.poll_ms,
            failures: single.watch_failures,
            gate_detail: single.gate_detail.clone().unwrap_or_default(),
            gate_elapsed_ms: single.gate_elapsed_ms.unwrap_or(0),
            switch_detail: single.switch_detail.clone(),
            watcher_pid: single.watcher_pid,
        }),
        _ => None,
    };
    Candidate {
        service: rollout.service.clone(),
        version: rollout.to.clone(),
        port: rollout.settings.ports.0,
        token: rollout.id.clone(),
        pid: recorded.map(|p| p.pid),
        start_time: recorded.map(|p| p.start_time),
        stage,
        deployer_pid: single.map_or(0, |x| x.deployer_pid),
        started_at: rollout.started_at,
        grace_ms: rollout.settings.grace_ms,
        drain_ms: rollout.settings.drain_ms,
        previous,
        signed: rollout.signed.clone(),
        probe: rollout.settings.launch.probe.clone(),
        watch,
        hooks: rollout.hooks.clone(),
    }
}
