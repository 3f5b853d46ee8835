//! A rollout as it is persisted (`ROOT/rollout.json`, replaced atomically before each action):
//! everything needed to continue it after a crash or a pause.

use serde::{Deserialize, Serialize};

use crate::deploy::state::ReplicaClass;

pub const ROLLOUT_FILE: &str = "rollout.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Running,
    Paused,
    Completed,
    Aborted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
    /// Its live process left the pool before its new one was ready (an unavailable place).
    #[serde(default)]
    pub left_pool: bool,
    pub started: Option<f64>,
    pub finished: Option<f64>,
    pub error: Option<String>,
}

/// Why a rollout aborted: the slot, the reason, and the phase (canary: the first wave;
/// release: the rest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbortCause {
    pub slot: Option<usize>,
    pub reason: String,
    pub phase: String,
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollout {
    pub id: String,
    pub service: String,
    pub to: String,
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

    pub fn count(&self, state: SlotState) -> usize {
        self.slots.iter().filter(|s| s.state == state).count()
    }
}
