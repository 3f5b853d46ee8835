//! Rollout policies: Nickel files (or JSON/YAML/TOML maps of them) checked against the bounded
//! `RolloutPolicy` contract inside this process, before any release is touched.

mod bundle;
pub mod check;
mod diagnostic;
mod eval;
mod imports;
mod sandbox;

use std::path::{Path, PathBuf};
use std::time::Duration;

use nickel_lang_core::serialize::ExportFormat;
use serde::{Deserialize, Serialize};

pub use bundle::ROLLOUT_POLICY_NCL;
pub use diagnostic::Diagnostic;
pub use eval::{evaluate_applied, EvalOptions};

/// Everything that can stop a policy from being used. Serializable because evaluation errors
/// come back from the sandbox process as JSON.
#[derive(Debug, thiserror::Error, serde::Serialize, serde::Deserialize)]
pub enum PolicyError {
    #[error("{}: {reason}", path.display())]
    Input { path: PathBuf, reason: String },
    #[error(
        "{}: evaluation did not finish within {} ms (an endless recursion?); \
         raise the limit with --timeout-ms if the policy is just slow",
        path.display(), limit.as_millis()
    )]
    Timeout { path: PathBuf, limit: Duration },
    /// Nickel refused the policy; the text is Nickel's own diagnostic.
    #[error("{}", .0.rendered.trim_end())]
    Nickel(Box<Diagnostic>),
    #[error("{0}")]
    Bundle(String),
    /// An import the policy may not make (outside the allowed folders, or too large).
    #[error("{}:{line}:{column}: import \"{import}\" refused: {reason}", file.display())]
    Import {
        file: PathBuf,
        line: usize,
        column: usize,
        import: String,
        reason: String,
    },
    #[error("{}: {how}; simplify the policy", path.display())]
    Crashed { path: PathBuf, how: String },
    #[error(
        "Nickel failed internally ({0}); please report this policy to the rollgate maintainers"
    )]
    Internal(String),
    #[error("{}: no policy entry `{entry}` (entries: {available})", path.display())]
    MissingEntry {
        path: PathBuf,
        entry: String,
        available: String,
    },
}

/// Output formats of `policy export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportAs {
    Json,
    Yaml,
    Toml,
    /// A Kubernetes Deployment per service entry (YAML); written by `fleet::k8s`.
    K8s,
    /// An Argo Rollouts `Rollout` per service entry (YAML); written by `fleet::argo`.
    Argo,
    /// A Nomad job's update block and service check per entry (JSON job form); written by
    /// `fleet::nomad`.
    Nomad,
}

/// Evaluates a policy and renders it the way `nickel export` would. The engines' formats
/// (k8s, argo, nomad) are `fleet::export`'s; asked here, they give the JSON those start from.
pub fn export(path: &Path, format: ExportAs, opts: &EvalOptions) -> Result<String, PolicyError> {
    let nickel_format = match format {
        ExportAs::Json | ExportAs::K8s | ExportAs::Argo | ExportAs::Nomad => ExportFormat::Json,
        ExportAs::Yaml => ExportFormat::Yaml,
        ExportAs::Toml => ExportFormat::Toml,
    };
    Ok(eval::evaluate(path, nickel_format, eval::Purpose::Export, opts)?.text)
}

/// What a stall at the deadline leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnStall {
    #[default]
    Rollback,
    Escalate,
}

/// The fields of one checked policy entry the deployer acts on.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RolloutSettings {
    pub progress_deadline_ms: u64,
    pub poll_ms: u64,
    pub max_unavailable_pct: u64,
    pub max_surge_pct: u64,
    pub on_stall: OnStall,
    #[serde(default)]
    pub stop_grace_ms: Option<u64>,
    #[serde(default)]
    pub drain_timeout_ms: Option<u64>,
    /// Rollouts of several replicas (all optional; see the contract).
    #[serde(default)]
    pub replicas: Option<u64>,
    #[serde(default)]
    pub waves: Option<Vec<u64>>,
    #[serde(default)]
    pub soak_ms: Option<u64>,
    #[serde(default)]
    pub min_ready_ms: Option<u64>,
    #[serde(default)]
    pub max_failure_ratio: Option<f64>,
    #[serde(default)]
    pub release_deadline_ms: Option<u64>,
    #[serde(default)]
    pub classes: Option<std::collections::BTreeMap<String, String>>,
    /// How readiness is proven (see the contract); today's `GET /readyz` = 200 when absent.
    #[serde(default)]
    pub probe: Option<ProbePolicy>,
    #[serde(default)]
    pub watch_ms: Option<u64>,
    #[serde(default)]
    pub watch_failures: Option<u64>,
    #[serde(default)]
    pub hooks: Option<HooksPolicy>,
    /// After each promotion, how many releases to keep (0: all; see `release prune`).
    #[serde(default)]
    pub keep_releases: Option<u64>,
    /// The candidate's port range (`A-B`, two ports at least) when no port is given.
    #[serde(default)]
    pub ports: Option<String>,
    /// A release's output file is rotated at this size, this many files kept in all.
    #[serde(default)]
    pub output_max_bytes: Option<u64>,
    #[serde(default)]
    pub output_keep: Option<u64>,
    /// The socket rollgate holds for the service and hands to each release (`LISTEN_FDS`).
    #[serde(default)]
    pub listen: Option<ListenPolicy>,
    /// Judge a canary by the proxy's counts (`engine::analysis`; defaults there).
    #[serde(default)]
    pub analysis: Option<AnalysisPolicy>,
    /// When exits after a switch roll the release back (`host::launch::CrashLoop`).
    #[serde(default)]
    pub crash_loop: Option<CrashLoopPolicy>,
    /// How releases are confined (on unless `enabled = false`).
    #[serde(default)]
    pub isolation: Option<IsolationPolicy>,
    /// The release's process types besides web, by type (its Procfile's other lines).
    #[serde(default)]
    pub processes: Option<std::collections::BTreeMap<String, ProcessPolicy>>,
    /// Jobs on a clock, run in the live release, by name (issue 70).
    #[serde(default)]
    pub schedules: Option<std::collections::BTreeMap<String, SchedulePolicy>>,
}

/// One schedule as written (`schedules.NAME`; the contract checks the expression).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulePolicy {
    pub cron: String,
    pub command: Vec<String>,
    pub timeout_ms: Option<u64>,
    pub concurrency: Option<Concurrency>,
    pub catch_up: Option<CatchUp>,
    pub zone: Option<String>,
}

/// A run due while the last one still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Concurrency {
    /// Skipped (and logged).
    #[default]
    Forbid,
    /// The old run is stopped first.
    Replace,
    /// Both run.
    Allow,
}

/// A due time missed while rollgate was not running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// Said, not run.
    #[default]
    None,
    /// Run once on return.
    Last,
}

/// One process type's formation and rules as written (`processes.TYPE`; the contract bounds
/// them and holds the rules between them).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessPolicy {
    pub replicas: Option<u64>,
    pub stop_grace_ms: Option<u64>,
    pub min_ready_ms: Option<u64>,
    pub ready: Option<ProcessReadyPolicy>,
    pub overlap: Option<bool>,
    pub singleton: Option<bool>,
}

/// How a process that serves nothing proves it is ready (`processes.TYPE.ready`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessReadyPolicy {
    pub kind: ReadyKind,
    pub command: Option<Vec<String>>,
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadyKind {
    Notify,
    Exec,
}

impl ProcessPolicy {
    /// At most one process of the type, ever.
    pub fn is_singleton(&self) -> bool {
        self.singleton == Some(true)
    }

    /// How many processes of the type run: its `replicas`, 1 when it names none.
    pub fn count(&self) -> u64 {
        self.replicas.unwrap_or(1)
    }

    /// New processes start beside the old ones (the default), unless the type says otherwise
    /// or is a singleton.
    pub fn overlaps(&self) -> bool {
        !self.is_singleton() && self.overlap != Some(false)
    }
}

/// The policy's `isolation` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IsolationPolicy {
    pub enabled: Option<bool>,
    pub memory_mb: Option<u64>,
    pub pids: Option<u64>,
    pub cpu_pct: Option<u64>,
    pub nofile: Option<u64>,
    pub user: Option<String>,
    pub writable: Option<Vec<String>>,
}

/// The policy's `crash_loop` as written (see `host::launch::CrashLoop`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrashLoopPolicy {
    pub restarts: Option<u64>,
    pub within_ms: Option<u64>,
}

/// The policy's `analysis` as written (every field optional; the contract bounds them).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnalysisPolicy {
    pub min_requests: Option<u64>,
    pub max_error_increase_pct: Option<f64>,
    pub max_latency_ratio: Option<f64>,
    pub latency_quantile: Option<f64>,
    pub confidence: Option<f64>,
    pub interval_ms: Option<u64>,
    pub on_fail: Option<String>,
    pub on_inconclusive: Option<String>,
    pub inconclusive_wait_ms: Option<u64>,
    pub warmup_ms: Option<u64>,
}

/// The policy's `listen` as written; `host::listen::Spec::parse` checks it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenPolicy {
    pub address: String,
    pub backlog: Option<u64>,
}

/// The policy's `hooks` as written; `host::hooks::Hooks::from_policy` checks and resolves them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HooksPolicy {
    pub pre_deploy: Option<Vec<String>>,
    pub post_promote: Option<Vec<String>>,
    pub post_rollback: Option<Vec<String>>,
    pub timeout_ms: Option<u64>,
}

/// The policy's `probe` as written; `host::probe::Spec::from_policy` checks and resolves it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbePolicy {
    pub kind: Option<String>,
    pub path: Option<String>,
    pub host: Option<String>,
    pub status_min: Option<u64>,
    pub status_max: Option<u64>,
    pub command: Option<Vec<String>>,
    pub timeout_ms: Option<u64>,
    pub success_threshold: Option<u64>,
    /// A notify probe's confirmation ('http or 'tcp), watchdog and deadline extension bound.
    pub confirm: Option<String>,
    pub watchdog_ms: Option<u64>,
    pub extend_max_ms: Option<u64>,
}

/// Loads entry `entry` of a policy file, checked by the contract on the way.
pub fn load_entry(
    path: &Path,
    entry: &str,
    opts: &EvalOptions,
) -> Result<RolloutSettings, PolicyError> {
    load_entry_value(path, entry, opts).map(|(_, settings)| settings)
}

/// Entry `entry` of a policy file as exported (JSON), and read as settings.
pub fn load_entry_value(
    path: &Path,
    entry: &str,
    opts: &EvalOptions,
) -> Result<(serde_json::Value, RolloutSettings), PolicyError> {
    let evaluated = eval::evaluate(path, ExportFormat::Json, eval::Purpose::Use, opts);
    // The deployer runs on for seconds or minutes: no finished evaluator waits for it.
    sandbox::reap_exited_evaluators();
    let evaluated = evaluated?;
    let missing = || PolicyError::MissingEntry {
        path: path.to_path_buf(),
        entry: entry.to_string(),
        available: evaluated
            .value
            .as_object()
            .map(|o| o.keys().cloned().collect::<Vec<_>>().join(", "))
            .unwrap_or_default(),
    };
    let value = evaluated.value.get(entry).ok_or_else(missing)?;
    let settings = serde_json::from_value(value.clone()).map_err(|e| PolicyError::Input {
        path: path.to_path_buf(),
        reason: format!(
            "entry `{entry}` is not a rollout policy ({e}); wrap it with `| RolloutPolicy`"
        ),
    })?;
    Ok((value.clone(), settings))
}
