//! `rollgate rollback SVC`: back to the release that was live before the current one, with no
//! version to look up in an incident. It is an ordinary deploy (or rollout) of that version, so
//! the release must prove itself ready again through the gate (and the watch).

use std::path::PathBuf;

use super::deploy::{self, Request};
use crate::engine::Outcome;
use crate::error::{refused, Error};
use crate::host::state::Root;
use crate::supervision::earlier::previous_release;

/// For a root served by a replica set: the version most replicas run and the release live
/// before it (to move the replicas back with a rollout). None for a single-release root.
pub fn replica_target(
    root: &std::path::Path,
    service: &str,
) -> Result<Option<(String, String)>, Error> {
    let root = Root::existing(root.to_path_buf())?;
    let Some(set) = root.read_replicas()? else {
        return Ok(None);
    };
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for r in &set.replicas {
        *counts.entry(r.version.as_str()).or_default() += 1;
    }
    let Some((current, _)) = counts.into_iter().max_by_key(|(_, n)| *n) else {
        return Err(refused(format!(
            "{} names no replica; nothing to roll back from",
            root.replicas_path().display()
        )));
    };
    let earlier = previous_release(&root, service, current)?;
    Ok(Some((current.to_string(), earlier.version)))
}

/// A replica root rolled back to the release live before `current` by a rollout (`request`).
/// When rollgate does it on its own (`because`: a replica's crash loop), `current` is then
/// recorded as rolled back in production, with what users had of it since its rollout ended,
/// as a single release's rollback records it.
pub fn rollback_replicas(
    request: super::rollout::Request,
    current: &str,
    because: Option<String>,
) -> Result<Outcome, Error> {
    let root = Root::existing(request.root.clone())?;
    let switched_at = crate::engine::saved_run(&root)?
        .filter(|run| run.to == current)
        .and_then(|run| run.slots.iter().filter_map(|s| s.finished).reduce(f64::max))
        .unwrap_or_else(crate::host::journal::now);
    let (service, earlier) = (request.service.clone(), request.version.clone());
    let outcome = super::rollout::rollout(request)?;
    if let (true, Some(because)) = (outcome.went_live(), because) {
        if let Err(e) = crate::engine::record_rolled_back_in_production(
            &root,
            &service,
            current,
            switched_at,
            &earlier,
            Some(&because),
        ) {
            eprintln!("rollgate: {earlier} is live again, but {e}");
        }
    }
    Ok(outcome)
}

/// What `rollgate rollback` was asked.
#[derive(Debug, Clone)]
pub struct RollbackRequest {
    pub service: String,
    pub root: PathBuf,
    /// The port to start the earlier release on: this one, else chosen from `ports` (`--ports`)
    /// or the policy's `ports`, else the one it was promoted on.
    pub port: Option<u16>,
    pub ports: Option<String>,
    /// Everything else a deploy takes (policy, grace, watch...).
    pub deploy: Request,
    /// Why rollgate rolls back on its own (a crash loop its keeper saw); None: a person.
    pub because: Option<String>,
    /// Only from this version (a keeper's: another keeper of the release may have been first).
    pub from: Option<String>,
}

/// Refused unless `live` is the version a keeper's rollback is from (`from`; none: a person's,
/// from whatever is live).
pub fn still_live(from: Option<&str>, live: &str) -> Result<(), Error> {
    match from {
        Some(from) if from != live => Err(refused(format!(
            "{from} is no longer live ({live} is): nothing to roll back"
        ))),
        _ => Ok(()),
    }
}

/// Finds the earlier release and deploys it; what it chose is said on stderr first.
pub fn rollback(request: RollbackRequest) -> Result<Outcome, Error> {
    crate::host::names::check_name("service", &request.service)?;
    let root = Root::existing(request.root.clone())?;
    let live = root.read_pointer()?.ok_or_else(|| {
        refused(format!(
            "nothing of {} is live under {}; nothing to roll back from",
            request.service,
            root.0.display()
        ))
    })?;
    if live.service != request.service {
        return Err(refused(format!(
            "{} serves {}, not {}",
            root.pointer_path().display(),
            live.service,
            request.service
        )));
    }
    still_live(request.from.as_deref(), &live.version)?;
    let earlier = previous_release(&root, &request.service, &live.version)?;
    let port = match request.port {
        Some(port) => deploy::PortAsked::Given(port),
        None => deploy::PortAsked::Chosen {
            range: request.ports,
            otherwise: match earlier.port {
                Some(port) if port != live.port => Ok(port),
                _ => Err(format!(
                    "{} was last live on port {}; name a free port for it with --port, or a range with --ports A-B (or the policy's ports)",
                    earlier.version,
                    earlier.port.map_or("(unknown)".into(), |p| p.to_string())
                )),
            },
        },
    };
    eprintln!(
        "rollgate: rolling {} back from {} to {} (the release live before it), through the gate",
        request.service, live.version, earlier.version
    );
    let service = request.service.clone();
    let request_because = request.because.clone();
    let outcome = deploy::deploy(Request {
        service: request.service,
        port,
        version: earlier.version.clone(),
        root: request.root,
        // Back as it was: its own config, or the one a deploy gave it then.
        give_service_config: false,
        ..request.deploy
    })?;
    if outcome.went_live() {
        // The release users had is on the record as rolled back, not only its successor as
        // promoted: how long they had it, what it answered them, and that a person ended it.
        if let Err(e) = crate::engine::record_rolled_back_in_production(
            &root,
            &service,
            &live.version,
            live.promoted_at,
            &earlier.version,
            request_because.as_deref(),
        ) {
            eprintln!("rollgate: {} is live again, but {e}", earlier.version);
        }
    }
    Ok(outcome)
}

/// `rollgate restart SVC`: a fresh process of the live release beside the running one, gated,
/// switched, the old one drained (a deploy of the same version: a restart users never see); on
/// a replica root, a rollout of the version its replicas run that gives each a fresh process,
/// within the rollout's budgets.
pub fn restart(request: RollbackRequest) -> Result<Outcome, Error> {
    restart_sized(request, None, None, None)
}

/// A restart that also sets how many web replicas run (`rollgate scale SVC web=N`): a rollout
/// of the live version with a fresh process for each replica, `web` of them — a single
/// release's root becomes a replica set, a replica set grows or shrinks.
///
/// `said_first`: words the engine says before its own once it has planned the restart (a
/// scale's), never if it refuses it; `scale`: the type counts it plans with and keeps once
/// it completes (a scale's).
pub fn restart_sized(
    request: RollbackRequest,
    web: Option<usize>,
    said_first: Option<String>,
    scale: Option<std::collections::BTreeMap<String, usize>>,
) -> Result<Outcome, Error> {
    crate::host::names::check_name("service", &request.service)?;
    let root = Root::existing(request.root.clone())?;
    let set = root.read_replicas()?;
    if set.is_some() || web.is_some() {
        let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
        for replica in set.iter().flat_map(|set| &set.replicas) {
            *counts.entry(replica.version.clone()).or_default() += 1;
        }
        let live = root
            .read_pointer()?
            .filter(|p| p.service == request.service);
        let Some(version) = counts
            .into_iter()
            .max_by_key(|(_, n)| *n)
            .map(|(version, _)| version)
            .or(live.map(|l| l.version))
        else {
            return Err(refused(format!(
                "nothing of {} is live under {}; nothing to restart",
                request.service,
                root.0.display()
            )));
        };
        let replicas = web.or(set.as_ref().map(|s| s.replicas.len())).unwrap_or(1);
        let restarting = format!(
            "rollgate: restarting {}'s {replicas} replicas of {version}: a fresh process for each, through the gate",
            request.service,
        );
        let ports = request
            .ports
            .as_deref()
            .map(crate::engine::settings::parse_ports)
            .transpose()?;
        let deploy = request.deploy;
        let args = crate::engine::settings::Args {
            replicas: web,
            ports,
            fresh: true,
            ..deploy.rollout_args()
        };
        return super::rollout::rollout(super::rollout::Request {
            service: request.service,
            version,
            root: request.root,
            policy: deploy.policy,
            policy_entry: deploy.policy_entry,
            eval: deploy.eval,
            give_service_config: false,
            announce: Some(said_first.map_or(restarting.clone(), |s| format!("{s}\n{restarting}"))),
            scale,
            args,
        });
    }
    let live = root
        .read_pointer()?
        .filter(|p| p.service == request.service)
        .ok_or_else(|| {
            refused(format!(
                "nothing of {} is live under {}; nothing to restart",
                request.service,
                root.0.display()
            ))
        })?;
    let port = match request.port {
        Some(port) => deploy::PortAsked::Given(port),
        None => deploy::PortAsked::from_range(
            request.ports,
            format!(
                "{} {} runs on port {}: name a free port for its fresh process with --port, or a range with --ports A-B (or the policy's ports)",
                request.service, live.version, live.port
            ),
        ),
    };
    let restarting = format!(
        "rollgate: restarting {} {}: a fresh process beside the running one, through the gate",
        request.service, live.version
    );
    deploy::deploy(Request {
        service: request.service,
        port,
        version: live.version,
        root: request.root,
        give_service_config: false,
        announce: Some(said_first.map_or(restarting.clone(), |s| format!("{s}\n{restarting}"))),
        scale,
        ..request.deploy
    })
}
