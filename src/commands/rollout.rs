//! `rollgate rollout`: N replicas moved in waves by the engine. Read [`rollout`] top to bottom:
//! refuse what can be refused, then hand it to the engine's front door (`engine::start`),
//! which plans the waves from the pool as it is under the lock and moves it. `rollout status`
//! is here too; `pause|resume|abort` are a person's word, `engine::ask`.

use std::path::PathBuf;

use super::preflight;
use crate::engine::{self, settings, view as render, Outcome, Plan, Start};
use crate::error::{refused, Error};
use crate::host::journal;
use crate::host::state::Root;
use crate::policy::EvalOptions;
use crate::render::{table::Layout, Format};

/// `rollgate rollout SVC VERSION`.
#[derive(Debug, Clone)]
pub struct Request {
    pub service: String,
    pub version: String,
    pub root: PathBuf,
    pub policy: Option<PathBuf>,
    pub policy_entry: Option<String>,
    pub eval: EvalOptions,
    pub args: settings::Args,
    /// As a deploy's: a new release gets the service's config (a rollback's does not).
    pub give_service_config: bool,
    /// What the engine says once it has planned the run (`engine::Start::announce`).
    pub announce: Option<String>,
    /// The type counts this run makes the root's (`engine::Start::scale`).
    pub scale: Option<std::collections::BTreeMap<String, usize>>,
}

/// The request's policy: its `--policy` entry, checked by the contract, else the one kept in
/// the root (None: the defaults).
fn load_policy(request: &Request) -> Result<Option<preflight::Chosen>, Error> {
    preflight::policy_entry(
        &request.root,
        request.policy.as_deref(),
        request.policy_entry.as_deref(),
        &request.service,
        &request.eval,
    )
}

/// The whole rollout.
pub fn rollout(request: Request) -> Result<Outcome, Error> {
    crate::host::names::check_name("service", &request.service)?;
    crate::host::names::check_name("version", &request.version)?;
    // The policy is evaluated in a forked sandbox: before the runtime starts any thread.
    let chosen = load_policy(&request)?;
    if let Some(chosen) = &chosen {
        chosen.say_if_kept();
    }
    let policy = chosen.as_ref().map(|c| c.settings.clone());
    let hooks = preflight::policy_hooks(policy.as_ref(), chosen.as_ref().map(|c| c.source()))?;
    let (root, executable) =
        preflight::release_executable(&request.root, &request.version, &request.service)?;
    if request.give_service_config {
        super::deploy::give_service_config(&root, &request.version)?;
    }
    preflight::keep(&root, &request.version, chosen.as_ref())?;

    let plan = Plan::Rollout {
        args: request.args,
        policy: policy.clone().map(Box::new),
    };
    super::releases::start_then_prune(
        Start {
            root,
            service: request.service,
            version: request.version,
            executable,
            hooks,
            plan,
            announce: request.announce,
            scale: request.scale,
            tail: None,
        },
        policy.as_ref(),
    )
}

/// `rollgate rollout status`.
pub fn status(
    service: &str,
    root: PathBuf,
    format: Format,
    layout: Layout,
) -> Result<String, Error> {
    let root = Root::existing(root)?;
    match engine::saved_run(&root)? {
        Some(rollout) if rollout.service == service => {
            Ok(render::status(&rollout, format, layout, journal::now()))
        }
        Some(rollout) => Err(refused(format!(
            "the rollout under {} is of {}, not {service}",
            root.0.display(),
            rollout.service
        ))),
        None => Err(refused(format!(
            "no rollout under {} yet",
            root.0.display()
        ))),
    }
}
