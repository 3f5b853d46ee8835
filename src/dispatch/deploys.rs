//! `deploy`, `rollback` and `rollout`: the request from their words, then the dry run's report
//! or the run, and its outcome.

use rollgate::commands::{deploy, dry_run, rollback, rollout};
use rollgate::engine::{self, settings, Ask};
use rollgate::error::Error;
use rollgate::render::table::Layout;
use std::path::PathBuf;

use super::{ended, eval_options, printed, report_dry_run};
use crate::cli::{self, RolloutArgs, RolloutCommand};

/// `rollgate deploy`: the request from its words, then the dry run's report or the deploy.
pub fn run_deploy(args: cli::DeployArgs) -> Result<u8, Error> {
    let cli::DeployArgs {
        service,
        positional,
        ports,
        target,
        gate,
        no_wait,
        dry_run,
    } = args;
    let asked = deploy::Positional::parse(&positional)?;
    let deadline_ms = match (asked.deadline_ms, gate.deadline_ms) {
        (Some(_), Some(_)) => {
            return Err(Error::Refused(
                "the deadline is given twice (DEADLINE_MS and --deadline-ms): give it once".into(),
            ))
        }
        (positional, flag) => positional.or(flag),
    };
    let port = match asked.port {
        Some(port) => deploy::PortAsked::Given(port),
        None => deploy::PortAsked::from_range(
            ports,
            format!(
                "no port for {}: give `rollgate deploy {service} PORT {}`, --ports A-B or a policy with `ports` (rollgate picks the one that is not live)",
                asked.version, asked.version
            ),
        ),
    };
    let request = deploy::Request {
        service,
        port,
        version: asked.version,
        deadline_ms,
        root: target.root,
        policy: gate.policy,
        policy_entry: gate.policy_entry,
        grace_ms: gate.grace_ms,
        drain_ms: gate.drain_timeout_ms,
        watch_ms: gate.watch_ms,
        no_wait,
        eval: eval_options(gate.eval),
        give_service_config: true,
        announce: None,
        scale: None,
    };
    if dry_run {
        Ok(report_dry_run(dry_run::deploy(&request)))
    } else {
        Ok(ended(deploy::deploy(request)?))
    }
}

/// `rollgate rollback`: a replica root rolls back with a rollout, any other with a deploy.
pub fn run_rollback(args: cli::RollbackArgs) -> Result<u8, Error> {
    let cli::RollbackArgs {
        service,
        target,
        port,
        ports,
        gate,
        because,
        from,
    } = args;
    let Some((current, earlier)) = rollback::replica_target(&target.root, &service)? else {
        let deploy = same_release_deploy(service.clone(), target.root.clone(), gate);
        return Ok(ended(rollback::rollback(rollback::RollbackRequest {
            service,
            root: target.root,
            port,
            ports,
            deploy,
            because,
            from,
        })?));
    };
    rollback::still_live(from.as_deref(), &current)?;
    eprintln!("rollgate: rolling {service}'s replicas back from {current} to {earlier} (the release live before it), through the gate");
    let request = rollout::Request {
        service,
        version: earlier,
        root: target.root,
        policy: gate.policy,
        policy_entry: gate.policy_entry,
        eval: eval_options(gate.eval),
        give_service_config: false,
        announce: None,
        scale: None,
        args: settings::Args {
            deadline_ms: gate.deadline_ms,
            grace_ms: gate.grace_ms,
            drain_ms: gate.drain_timeout_ms,
            ..Default::default()
        },
    };
    Ok(ended(rollback::rollback_replicas(
        request, &current, because,
    )?))
}

/// `rollgate rollout ...`: the outcome on stdout, exit 0/1/3 as the outcome says, 2 refused.
pub fn run_rollout(args: RolloutArgs) -> Result<u8, Error> {
    let result = match args.command {
        Some(RolloutCommand::Status {
            service,
            target,
            format,
            wide,
        }) => {
            return printed(rollout::status(
                &service,
                target.root,
                format,
                Layout::of_stdout(wide),
            )?)
        }
        Some(RolloutCommand::Pause {
            service,
            target,
            reason,
        }) => engine::ask(target.root, &service, Ask::Pause { reason }),
        Some(RolloutCommand::Resume { service, target }) => {
            engine::ask(target.root, &service, Ask::Resume)
        }
        Some(RolloutCommand::Abort {
            service,
            target,
            reason,
            rollback,
        }) => engine::ask(target.root, &service, Ask::Abort { reason, rollback }),
        None if args.dry_run => match rollout_request(args) {
            Ok(request) => return Ok(report_dry_run(dry_run::rollout(&request))),
            Err(e) => Err(e),
        },
        None => rollout_request(args).and_then(rollout::rollout),
    };
    Ok(ended(result?))
}

pub fn rollout_request(args: RolloutArgs) -> Result<rollout::Request, Error> {
    use settings::{parse_ports, parse_wait, parse_waves};
    let usage = Error::Refused;
    let soak_ms = args
        .soak
        .as_deref()
        .map(parse_wait)
        .transpose()
        .map_err(|e| usage(format!("--soak: {e}")))?;
    Ok(rollout::Request {
        give_service_config: true,
        announce: None,
        scale: None,
        service: args.service.unwrap_or_default(),
        version: args.version.unwrap_or_default(),
        root: args.target.root,
        policy: args.policy,
        policy_entry: args.policy_entry,
        eval: eval_options(args.eval),
        args: settings::Args {
            replicas: args.replicas.map(|n| n as usize),
            ports: args
                .ports
                .as_deref()
                .map(parse_ports)
                .transpose()
                .map_err(|e| usage(format!("--ports: {e}")))?,
            waves: args
                .waves
                .as_deref()
                .map(parse_waves)
                .transpose()
                .map_err(|e| usage(format!("--waves: {e}")))?,
            soak_ms,
            deadline_ms: args.deadline_ms,
            grace_ms: args.grace_ms,
            drain_ms: args.drain_timeout_ms,
            watch_ms: args.watch_ms,
            fresh: false,
            types_only: false,
            scale_by: Default::default(),
        },
    })
}

/// `rollgate stop SVC`: exit 0 stopped, 2 refused.
pub fn run_stop(service: String, root: PathBuf, why: Option<String>) -> Result<u8, Error> {
    let request = rollgate::commands::stop::StopRequest { service, root, why };
    printed(rollgate::commands::stop::stop(&request)?)
}

/// `rollgate start SVC`: exit 0 running, 1 not started (it stays stopped), 2 refused.
pub fn run_start(service: String, root: PathBuf) -> Result<u8, Error> {
    let request = rollgate::commands::stop::StopRequest {
        service,
        root,
        why: None,
    };
    printed(rollgate::commands::stop::start(&request)?)
}

/// `rollgate run SVC -- COMMAND`: the command's own exit status, 2 refused.
pub fn run_one_off(
    service: String,
    root: PathBuf,
    release: Option<String>,
    command: Vec<String>,
) -> Result<u8, Error> {
    rollgate::commands::run::run(&rollgate::commands::run::RunRequest {
        service,
        root,
        release,
        command,
    })
}

/// `rollgate restart SVC`: as `deploy`.
pub fn run_restart(args: cli::RollbackArgs) -> Result<u8, Error> {
    let cli::RollbackArgs {
        service,
        target,
        port,
        ports,
        gate,
        because: _,
        from: _,
    } = args;
    let deploy = same_release_deploy(service.clone(), target.root.clone(), gate);
    Ok(ended(rollback::restart(rollback::RollbackRequest {
        service,
        root: target.root,
        port,
        ports,
        deploy,
        because: None,
        from: None,
    })?))
}

/// `rollgate scale SVC TYPE=N...`: as `restart`.
pub fn run_scale(args: cli::ScaleArgs) -> Result<u8, Error> {
    let cli::ScaleArgs {
        service,
        counts,
        target,
        ports,
        gate,
    } = args;
    let counts = counts
        .iter()
        .map(|asked| rollgate::commands::scale::parse_count(asked))
        .collect::<Result<Vec<_>, _>>()?;
    let deploy = same_release_deploy(service.clone(), target.root.clone(), gate);
    let request = rollback::RollbackRequest {
        service,
        root: target.root,
        port: None,
        ports,
        deploy,
        because: None,
        from: None,
    };
    Ok(ended(rollgate::commands::scale::scale(request, &counts)?))
}

/// What a deploy of a release the command finds itself (a rollback's, a restart's) takes from
/// the command line: the policy and the numbers; the version and port are the command's.
fn same_release_deploy(service: String, root: PathBuf, gate: cli::GateArgs) -> deploy::Request {
    let cli::GateArgs {
        policy,
        policy_entry,
        deadline_ms,
        grace_ms,
        drain_timeout_ms,
        watch_ms,
        eval,
    } = gate;
    deploy::Request {
        service,
        port: deploy::PortAsked::Given(0),
        version: String::new(),
        deadline_ms,
        root,
        policy,
        policy_entry,
        grace_ms,
        drain_ms: drain_timeout_ms,
        watch_ms,
        no_wait: false,
        eval: eval_options(eval),
        give_service_config: false,
        announce: None,
        scale: None,
    }
}
