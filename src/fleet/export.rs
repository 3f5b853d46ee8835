//! `policy export --format k8s|argo|nomad`: a reviewed policy handed to an orchestrator that
//! runs the service instead of rollgate, in that engine's own fields.
//!
//! Each engine's exporter returns its document and what it could not express; the caller lists
//! those on stderr (`not expressed in ENGINE: entry: ...`) and each document names them too (an
//! annotation or a meta field). `--strict` turns any loss into a refusal, so a pipeline can
//! insist that what runs is exactly what was reviewed.

use std::path::Path;

use serde_json::Value;

pub use super::workload::{Document, ProcessLine, Workload};
use crate::error::Error;
use crate::policy::{self, EvalOptions, ExportAs, RolloutSettings};

/// The engines a policy can be handed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Kubernetes,
    Argo,
    Nomad,
}

impl Engine {
    /// The engine a `policy export --format` names, if it names one.
    pub fn of(format: ExportAs) -> Option<Engine> {
        match format {
            ExportAs::K8s => Some(Engine::Kubernetes),
            ExportAs::Argo => Some(Engine::Argo),
            ExportAs::Nomad => Some(Engine::Nomad),
            ExportAs::Json | ExportAs::Yaml | ExportAs::Toml => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Engine::Kubernetes => "Kubernetes",
            Engine::Argo => "Argo Rollouts",
            Engine::Nomad => "Nomad",
        }
    }
}

/// One engine's documents for every entry, and what they could not express (each line
/// prefixed with its entry's name).
#[derive(Debug)]
pub struct Exported {
    pub text: String,
    pub lost: Vec<String>,
}

/// Exports every service entry of the policy at `path` for `engine`.
pub fn export(
    path: &Path,
    engine: Engine,
    workload: &Workload,
    opts: &EvalOptions,
) -> Result<Exported, Error> {
    let source = path.display().to_string();
    let refused = |why: &dyn std::fmt::Display| Error::Invalid(format!("{source}: {why}"));
    let mut exported = Exported {
        text: String::new(),
        lost: Vec::new(),
    };
    for (name, settings) in entries(path, opts)? {
        let document = match engine {
            Engine::Kubernetes => super::k8s::documents(&name, &settings, workload, &source),
            Engine::Argo => super::argo::rollout(&name, &settings, workload, &source),
            Engine::Nomad => super::nomad::job(&name, &settings, workload).map(|job| {
                let mut document = Document {
                    text: format!("{}\n", job.json),
                    lost: job.lost,
                };
                // Each schedule is a periodic job of its own, after the service's.
                for (schedule_name, schedule) in settings.schedules.iter().flatten() {
                    let (periodic, lost) =
                        super::schedules::periodic_job(&name, schedule_name, schedule);
                    document.text.push_str(&format!("{periodic}\n"));
                    document.lost.extend(lost);
                }
                document
            }),
        }
        .map_err(|e| refused(&e))?;
        exported.text.push_str(&document.text);
        exported
            .lost
            .extend(document.lost.into_iter().map(|l| format!("{name}: {l}")));
    }
    if workload.strict && !exported.lost.is_empty() {
        return Err(refused(&format!(
            "--strict: {} cannot express all of this policy:\n  {}",
            engine.name(),
            exported.lost.join("\n  ")
        )));
    }
    Ok(exported)
}

/// The policy's service entries, in name order: each top-level record holding
/// `progress_deadline_ms`, or the whole document when it is one policy (named after the file).
pub fn entries(path: &Path, opts: &EvalOptions) -> Result<Vec<(String, RolloutSettings)>, Error> {
    let text = policy::export(path, ExportAs::Json, opts)?;
    let refused = |why: String| Error::Invalid(format!("{}: {why}", path.display()));
    let value: Value = serde_json::from_str(&text).map_err(|e| refused(e.to_string()))?;
    let stem = path
        .file_stem()
        .map_or("policy".to_string(), |s| s.to_string_lossy().into_owned());
    let found: Vec<(String, Value)> = match value.as_object() {
        Some(top) if top.contains_key("progress_deadline_ms") => vec![(stem, value.clone())],
        Some(top) => top
            .iter()
            .filter(|(_, v)| v.get("progress_deadline_ms").is_some())
            .map(|(name, v)| (name.clone(), v.clone()))
            .collect(),
        None => Vec::new(),
    };
    if found.is_empty() {
        return Err(refused(
            "the policy has no service entries (records with `progress_deadline_ms`)".into(),
        ));
    }
    found
        .into_iter()
        .map(|(name, value)| {
            serde_json::from_value(value)
                .map(|settings| (name.clone(), settings))
                .map_err(|e| refused(format!("entry `{name}` is not a rollout policy ({e})")))
        })
        .collect()
}
