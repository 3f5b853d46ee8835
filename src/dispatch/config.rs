//! `config` and `secret`: a release's own configuration, and `config set`'s deploy of the
//! release it makes.

use rollgate::commands::{deploy, rollout};
use rollgate::engine::settings;
use rollgate::error::{self, Error};
use rollgate::policy;

use super::{ended, print, printed};
use crate::cli::{ConfigCommand, SecretCommand};

/// `rollgate config ...`. `set` prints the new release's version on stdout, then deploys it
/// (its outcome as `deploy` or `rollout` says it).
pub fn run_config(command: ConfigCommand) -> Result<u8, Error> {
    use rollgate::commands::config;
    match command {
        ConfigCommand::Show {
            version, target, ..
        } => printed(config::show(&target.root, version.as_deref())?),
        ConfigCommand::Diff { a, b, target, .. } => printed(config::diff(&target.root, &a, &b)?),
        ConfigCommand::Set {
            service,
            sets,
            unset,
            secret,
            target,
            ports,
            policy,
            no_deploy,
        } => {
            let change = config::Change::parse(&sets, &unset, &secret)?;
            let root = rollgate::host::state::Root::existing(target.root.clone())?;
            if config::live_version(&root).is_err() {
                if !no_deploy {
                    return Err(error::refused(format!(
                        "nothing of {service} is live under {}: stage the config with --no-deploy (the first release deployed gets it), or deploy a release first",
                        target.root.display()
                    )));
                }
                eprintln!(
                    "rollgate: {}",
                    config::stage(&target.root, &service, &change)?
                );
                return Ok(error::SUCCESS);
            }
            let now = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
            let (from, version) = config::make_release(&target.root, &service, &change, now)?;
            print(&format!("{version}\n"));
            eprintln!("rollgate: {version} made from {from} with the config change");
            if no_deploy {
                return Ok(error::SUCCESS);
            }
            let replicas = rollgate::host::state::Root::new(target.root.clone())
                .read_replicas()?
                .is_some();
            if replicas {
                let request = rollout::Request {
                    service,
                    version,
                    root: target.root,
                    policy,
                    policy_entry: None,
                    eval: policy::EvalOptions::default(),
                    args: settings::Args::default(),
                    give_service_config: false,
                    announce: None,
                    scale: None,
                };
                return Ok(ended(rollout::rollout(request)?));
            }
            let port = deploy::PortAsked::from_range(
                ports,
                format!(
                    "{version} is made; to deploy it give --ports A-B, a policy with `ports`, or `rollgate deploy {service} PORT {version}`"
                ),
            );
            let request = deploy::Request {
                service,
                port,
                version,
                deadline_ms: None,
                root: target.root,
                policy,
                policy_entry: None,
                grace_ms: None,
                drain_ms: None,
                watch_ms: None,
                no_wait: false,
                eval: policy::EvalOptions::default(),
                give_service_config: false,
                announce: None,
                scale: None,
            };
            Ok(ended(deploy::deploy(request)?))
        }
    }
}

pub fn run_secret(command: SecretCommand) -> Result<u8, Error> {
    use rollgate::commands::secret;
    printed(match command {
        SecretCommand::Set { name, target } => {
            secret::set(&target.root, &name, &mut std::io::stdin().lock())?
        }
        SecretCommand::List { target } => secret::list(&target.root)?,
        SecretCommand::Rm { name, target } => secret::remove(&target.root, &name)?,
    })
}
