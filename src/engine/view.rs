//! What a person sees of a rollout: the live line on a terminal and `rollgate rollout status`.
//! Rendering only; every figure comes from the persisted [`Rollout`].

use std::io::IsTerminal;

use comfy_table::{presets::UTF8_FULL, ContentArrangement, Table};
use std::collections::BTreeMap;

use serde::Serialize;

use super::state::{AbortCause, Phase, Rollout, SlotState};
use crate::host::state::ReplicaClass;
use crate::render::table::{Cell, Grid, Layout};
use crate::render::time::{format_duration, format_time};
use crate::render::Format;

const STATES: [SlotState; 10] = [
    SlotState::Pending,
    SlotState::Upgrading,
    SlotState::Succeeded,
    SlotState::Failed,
    SlotState::Skipped,
    SlotState::RollingBack,
    SlotState::RolledBack,
    SlotState::LeftBehind,
    SlotState::Surplus,
    SlotState::Removed,
];

fn state_name(state: SlotState) -> &'static str {
    match state {
        SlotState::Pending => "pending",
        SlotState::Upgrading => "upgrading",
        SlotState::Succeeded => "succeeded",
        SlotState::Failed => "failed",
        SlotState::Skipped => "skipped",
        SlotState::RollingBack => "rolling_back",
        SlotState::RolledBack => "rolled_back",
        SlotState::LeftBehind => "left_behind",
        SlotState::Surplus => "surplus",
        SlotState::Removed => "removed",
    }
}

fn phase_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Running => "running",
        Phase::Paused => "paused",
        Phase::Completed => "completed",
        Phase::Aborted => "aborted",
    }
}

fn class_name(class: ReplicaClass) -> &'static str {
    match class {
        ReplicaClass::Required => "required",
        ReplicaClass::BestEffort => "best_effort",
        ReplicaClass::LeftBehind => "left_behind",
    }
}

/// The live line on stderr while a rollout runs (a terminal only).
pub struct Progress {
    enabled: bool,
}

impl Progress {
    /// Shown on a terminal, when `wanted`.
    pub fn new(wanted: bool) -> Progress {
        Progress {
            enabled: wanted && std::io::stderr().is_terminal(),
        }
    }

    pub fn show(&self, rollout: &Rollout) {
        if self.enabled {
            eprint!("\r\x1b[2K{}", line(rollout));
        }
    }

    pub fn finish(&self) {
        if self.enabled {
            eprintln!();
        }
    }
}

/// `r17… to v2 · running · wave 2 of 4 · 3 upgrading, 5 succeeded · surge 2/3 · unavailable 0/0`
/// (`all 4 waves` once completed).
/// Waves are counted from 0 here as everywhere (status, pause reasons, the dry run, the log).
pub fn line(rollout: &Rollout) -> String {
    let upgrading = |in_place: bool| {
        rollout
            .slots
            .iter()
            .filter(|s| s.state == SlotState::Upgrading && s.left_pool == in_place)
            .count()
    };
    let counts: Vec<String> = STATES
        .iter()
        .filter(|s| rollout.count(**s) > 0)
        .map(|s| format!("{} {}", rollout.count(*s), state_name(*s)))
        .collect();
    format!(
        "{} to {} · {} · {} · {} · surge {}/{} · unavailable {}/{}",
        rollout.id,
        rollout.to,
        phase_name(rollout.phase),
        match rollout.phase {
            Phase::Completed => format!("all {} waves", rollout.waves.len()),
            _ => format!(
                "wave {} of {}",
                rollout.wave.min(rollout.waves.len().saturating_sub(1)),
                rollout.waves.len()
            ),
        },
        counts.join(", "),
        upgrading(false),
        rollout.settings.surge,
        upgrading(true),
        rollout.settings.unavailable,
    )
}

/// Required replicas that have not confirmed the new version yet.
fn required_waiting(rollout: &Rollout) -> Vec<usize> {
    rollout
        .slots
        .iter()
        .filter(|s| s.awaits_confirmation())
        .map(|s| s.slot)
        .collect()
}

/// A rollout as `rollout status --format json`, `status --format json`, the console's API and
/// its page show it: one typed view of the persisted run, with the countdowns at `now`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RolloutStatus {
    /// The one line a person reads (`r17… to v2 · running · wave 2 of 4 · …`).
    pub line: String,
    pub id: String,
    pub service: String,
    pub from: Option<String>,
    pub version: String,
    pub state: Phase,
    pub started_at: f64,
    pub replicas: usize,
    pub surge: usize,
    pub unavailable: usize,
    pub wave_percents: Vec<u64>,
    pub waves: Vec<Vec<usize>>,
    pub current_wave: usize,
    pub max_failure_ratio: f64,
    pub soak_ms: u64,
    /// How many slots are in each state, every state named.
    pub counts: BTreeMap<SlotState, usize>,
    pub pause_reason: Option<String>,
    pub abort_cause: Option<AbortCause>,
    pub required_waiting: Vec<usize>,
    pub release_deadline_left_ms: Option<u64>,
    /// What is left of the soak in hand (a running rollout only).
    pub soak_left_ms: Option<u64>,
    /// The traffic judge's last look (policy `analysis`), its numbers and verdict.
    pub analysis: Option<crate::engine::analysis::Verdict>,
    pub slots: Vec<SlotStatus>,
}

/// One slot of a [`RolloutStatus`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotStatus {
    pub slot: usize,
    pub class: ReplicaClass,
    pub wave: Option<usize>,
    pub state: SlotState,
    pub from_version: Option<String>,
    pub version: Option<String>,
    pub port: Option<u16>,
    pub pid: Option<i32>,
    pub started: Option<f64>,
    pub finished: Option<f64>,
    pub error: Option<String>,
}

impl RolloutStatus {
    pub fn of(rollout: &Rollout, now: f64) -> RolloutStatus {
        let left_ms = |until: f64| ((until - now).max(0.0) * 1000.0) as u64;
        let running = !rollout.is_over();
        RolloutStatus {
            line: line(rollout),
            id: rollout.id.clone(),
            service: rollout.service.clone(),
            from: rollout.from.clone(),
            version: rollout.to.clone(),
            state: rollout.phase,
            started_at: rollout.started_at,
            replicas: rollout.settings.replicas,
            surge: rollout.settings.surge,
            unavailable: rollout.settings.unavailable,
            wave_percents: rollout.settings.wave_percents.clone(),
            waves: rollout.waves.clone(),
            current_wave: rollout.wave.min(rollout.waves.len().saturating_sub(1)),
            max_failure_ratio: rollout.settings.max_failure_ratio,
            soak_ms: rollout.settings.soak_ms,
            counts: STATES.iter().map(|s| (*s, rollout.count(*s))).collect(),
            pause_reason: rollout.pause_reason.clone(),
            abort_cause: rollout.abort_cause.clone(),
            required_waiting: required_waiting(rollout),
            release_deadline_left_ms: running.then(|| left_ms(rollout.settings.release_deadline)),
            soak_left_ms: rollout.soak_until.filter(|_| running).map(left_ms),
            analysis: rollout.last_analysis.clone(),
            slots: rollout
                .slots
                .iter()
                .map(|s| SlotStatus {
                    slot: s.slot,
                    class: s.class,
                    wave: s.wave,
                    state: s.state,
                    from_version: s.from_version.clone(),
                    version: s.live.as_ref().map(|l| l.version.clone()),
                    port: s.live.as_ref().map(|l| l.port),
                    pid: s.live.as_ref().map(|l| l.pid),
                    started: s.started,
                    finished: s.finished,
                    error: s.error.clone(),
                })
                .collect(),
        }
    }
}

/// What `rollout status` shows a person on a terminal without `--wide`.
const SLOTS_FIRST: &[&str] = &["slot", "wave", "state", "serving", "finished", "error"];

pub fn status(rollout: &Rollout, format: Format, layout: Layout, now: f64) -> String {
    if format == Format::Json {
        let mut text = serde_json::to_string_pretty(&RolloutStatus::of(rollout, now))
            .expect("a status serializes");
        text.push('\n');
        return text;
    }
    let mut out = String::new();
    let from = rollout.from.as_deref().unwrap_or("nothing");
    out.push_str(&format!(
        "rollout {} of {}: {from} → {}, {}\n",
        rollout.id,
        rollout.service,
        rollout.to,
        phase_name(rollout.phase)
    ));
    let sizes: Vec<String> = rollout.waves.iter().map(|w| w.len().to_string()).collect();
    out.push_str(&format!(
        "waves: {} replicas ({}); current wave {} of {}; soak {}; max failure ratio {}\n",
        sizes.join(" + "),
        rollout
            .settings
            .wave_percents
            .iter()
            .map(|p| format!("{p}%"))
            .collect::<Vec<_>>()
            .join(", "),
        rollout.wave.min(rollout.waves.len().saturating_sub(1)),
        rollout.waves.len(),
        format_duration(rollout.settings.soak_ms as f64 / 1000.0),
        rollout.settings.max_failure_ratio,
    ));
    let counts: Vec<String> = STATES
        .iter()
        .map(|s| format!("{} {}", rollout.count(*s), state_name(*s)))
        .collect();
    out.push_str(&format!("replicas: {}\n", counts.join(", ")));
    if let Some(reason) = &rollout.pause_reason {
        out.push_str(&format!("paused: {reason}\n"));
    }
    if let Some(look) = &rollout.last_analysis {
        out.push_str(&format!("analysis: {}\n", look.words));
    }
    if let Some(cause) = &rollout.abort_cause {
        let slot = cause.slot.map_or(String::new(), |s| format!("slot {s}, "));
        out.push_str(&format!(
            "abort cause: {} ({slot}{})\n",
            cause.reason, cause.phase
        ));
    }
    let waiting = required_waiting(rollout);
    if !rollout.is_over() && !waiting.is_empty() {
        let left = (rollout.settings.release_deadline - now).max(0.0);
        out.push_str(&format!(
            "required replicas to confirm: {} (release deadline in {})\n",
            waiting
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            format_duration(left)
        ));
    }
    let header = [
        "slot", "class", "wave", "state", "from", "serving", "started", "finished", "error",
    ];
    if layout != Layout::Pipe {
        let mut out = crate::render::table::wrap(&out, layout);
        let mut grid = Grid::new(header, SLOTS_FIRST);
        for s in &rollout.slots {
            grid.push(vec![
                s.slot.to_string().into(),
                class_name(s.class).into(),
                s.wave.map_or("-".into(), |w| w.to_string()).into(),
                state_name(s.state).into(),
                s.from_version.clone().unwrap_or_else(|| "-".into()).into(),
                serving(s).into(),
                Cell::Time(s.started),
                Cell::Time(s.finished),
                s.error.clone().unwrap_or_default().into(),
            ]);
        }
        out.push_str(&grid.render(layout));
        return out;
    }
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header);
    for s in &rollout.slots {
        table.add_row([
            s.slot.to_string(),
            class_name(s.class).to_string(),
            s.wave.map_or("-".into(), |w| w.to_string()),
            state_name(s.state).to_string(),
            s.from_version.clone().unwrap_or_else(|| "-".into()),
            serving(s),
            s.started.map_or("-".into(), format_time),
            s.finished.map_or("-".into(), format_time),
            s.error.clone().unwrap_or_default(),
        ]);
    }
    out.push_str(&table.to_string());
    out.push('\n');
    out
}

/// The version and port serving a slot, or `-`.
fn serving(s: &super::state::Slot) -> String {
    s.live
        .as_ref()
        .map_or("-".into(), |l| format!("{} :{}", l.version, l.port))
}
