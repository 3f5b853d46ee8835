//! What the console's page shows, as types: the JSON its API answers for a root (`GET
//! /api/v1/roots/{service}`) and for its history, read once into these structs. The page names
//! each field here and nowhere else; a field the API renames or retypes fails to read here (a
//! test reads a real root's status through it), not quietly as a "-" on the page. Every field
//! may be missing (`serde(default)`): an older console's API, or a root with nothing live.

use serde::Deserialize;
use serde_json::Value;

/// One root: its state and its recent outcomes, oldest first.
#[derive(Debug, Default)]
pub struct Section {
    pub state: RootView,
    pub history: Vec<OutcomeView>,
    /// Why the state could not be read, if it could not (the section says so).
    pub unreadable: Option<String>,
}

impl Section {
    /// A root's section from the API's JSON; what does not read is said, not dropped.
    pub fn read(state: &Value, history: &[Value]) -> Section {
        let mut unreadable = None;
        let state = RootView::deserialize(state).unwrap_or_else(|e| {
            unreadable = Some(format!("the root's state could not be read: {e}"));
            RootView {
                service: state
                    .get("service")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_string(),
                ..RootView::default()
            }
        });
        let mut outcomes = Vec::with_capacity(history.len());
        for outcome in history {
            match OutcomeView::deserialize(outcome) {
                Ok(read) => outcomes.push(read),
                Err(e) => {
                    unreadable
                        .get_or_insert(format!("an outcome of its log could not be read: {e}"));
                }
            }
        }
        let history = outcomes;
        Section {
            state,
            history,
            unreadable,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RootView {
    pub service: String,
    pub root: String,
    pub live: Option<LiveView>,
    pub replicas: Option<Vec<ReplicaView>>,
    pub candidate: Option<CandidateView>,
    pub rollout: Option<RolloutView>,
    /// The proxy's TLS, when it serves some.
    pub tls: Option<TlsView>,
    /// What `rollgate traffic` set (none: never set: serving).
    pub traffic: Option<TrafficView>,
    /// The routes of the proxy config serving the root, in words.
    pub routes: Option<Vec<String>>,
    /// A person stopped the service (`rollgate stop`).
    pub stopped: Option<StoppedView>,
    /// The live release's other process types' processes (`formation.json`).
    pub processes: Vec<ProcessView>,
    /// The live policy's schedules (issue 70).
    pub schedules: Vec<ScheduleView>,
}

/// One schedule: when it runs next, how its last run went.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ScheduleView {
    pub schedule: String,
    pub cron: String,
    pub state: String,
    pub next_due: Option<f64>,
    pub running: Vec<i32>,
    pub last: Option<LastRunView>,
}

/// A schedule's last run.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct LastRunView {
    pub version: String,
    pub ok: bool,
    pub words: String,
    pub finished_at: Option<f64>,
    pub took_ms: u64,
}

/// One process of another type than web (a worker, a clock).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProcessView {
    /// `worker.1`.
    pub process: String,
    pub version: String,
    pub pid: Option<i32>,
    pub running: bool,
    pub up_for_s: Option<f64>,
    pub restarts: RestartsView,
    pub command: Option<String>,
}

/// `ROOT/stopped.json`: who stopped the service, when and why.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StoppedView {
    pub since: Option<f64>,
    pub by: String,
    pub why: Option<String>,
}

/// `ROOT/traffic.json`: the mode, who set it and why.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TrafficView {
    pub mode: String,
    pub message: Option<String>,
    pub since: Option<f64>,
    pub by: String,
    pub why: Option<String>,
}

/// The certificates the proxy serves, and its last reload of them.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TlsView {
    pub certificates: Vec<CertView>,
    pub last_reload: Option<ReloadView>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CertView {
    pub name: String,
    pub issuer: String,
    pub not_after: Option<f64>,
    pub source: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ReloadView {
    pub at: Option<f64>,
    /// None: taken.
    pub refused: Option<String>,
}

/// The release `current` names.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct LiveView {
    pub version: String,
    pub port: Option<u16>,
    pub pid: Option<i32>,
    pub live_for_s: Option<f64>,
    pub answering: bool,
    /// How it is held (absent from an older console's API: nothing said).
    pub confined: Option<bool>,
    pub uid: Option<u32>,
    pub own_user: bool,
    pub tree: Option<String>,
    pub limits: super::confinement::Limits,
    /// Its keeper runs (absent from an older console's API: nothing said).
    pub kept: Option<bool>,
    pub restarts: RestartsView,
}

/// How often the live release was started again since it went live.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RestartsView {
    pub count: u32,
    pub last_at: Option<f64>,
    pub last_ended: Option<String>,
}

/// One replica of the pool.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ReplicaView {
    pub slot: Option<u64>,
    pub version: String,
    pub port: Option<u16>,
    pub pid: Option<i32>,
    pub up_for_s: Option<f64>,
    pub answering: Option<bool>,
    pub class: String,
}

/// A single deploy in flight.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CandidateView {
    pub version: String,
    pub port: Option<u16>,
    pub pid: Option<i32>,
    pub stage: String,
    pub started_at: Option<f64>,
    pub waiting_s: Option<f64>,
    pub orphaned: bool,
    pub deployer_pid: Option<u32>,
}

/// A rollout of replicas, running or the last one.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RolloutView {
    pub state: String,
    pub from: Option<String>,
    pub version: String,
    pub release_deadline_left_ms: Option<f64>,
    pub soak_left_ms: Option<f64>,
    pub pause_reason: Option<String>,
    pub analysis: Option<LookView>,
    pub abort_cause: Option<CauseView>,
    pub slots: Vec<SlotView>,
    pub required_waiting: Vec<u64>,
    /// The slots of each wave, in order.
    pub waves: Vec<Vec<u64>>,
    pub current_wave: Option<u64>,
}

/// One slot of a rollout.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct SlotView {
    pub slot: Option<u64>,
    pub class: String,
    pub wave: Option<u64>,
    pub state: String,
    pub version: Option<String>,
    pub error: Option<String>,
}

/// Why a rollout aborted (no slot when a person asked).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct CauseView {
    pub slot: Option<u64>,
    pub reason: String,
    pub phase: String,
}

/// The traffic judge's last look.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct LookView {
    pub verdict: String,
    pub canary: String,
    pub baseline: String,
    pub canary_requests: Option<f64>,
    pub canary_errors: Option<f64>,
    pub canary_error_pct: Option<f64>,
    pub canary_latency_ms: Option<f64>,
    pub baseline_requests: Option<f64>,
    pub baseline_errors: Option<f64>,
    pub baseline_error_pct: Option<f64>,
    pub baseline_latency_ms: Option<f64>,
    pub words: String,
}

/// One outcome of the log (promoted, rolled back, ...).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct OutcomeView {
    pub ts: Option<f64>,
    pub when: String,
    pub event: String,
    pub version: String,
    pub elapsed_ms: Option<u64>,
    /// None for a promotion.
    pub reason: Option<String>,
    /// A release rolled back after users had it: for how long, what it answered them, and
    /// what ended it (the log line's `exposure`, in words).
    #[serde(default)]
    pub users_had_it: Option<String>,
}
