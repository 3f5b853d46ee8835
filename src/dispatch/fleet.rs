//! `fleet ...` and `webhooks ...`: the hand-off past one host, and the deploy log's deliveries.

use rollgate::commands::fleet_move;
use rollgate::error::{self, Error};
use rollgate::{fleet, webhooks};

use super::{ended, eval_options, print, printed};
use crate::cli::{self, FleetCommand, WebhooksCommand};

pub fn run_fleet(command: FleetCommand) -> Result<u8, Error> {
    match command {
        FleetCommand::Playbook {
            policy,
            entry,
            service,
            version,
            group,
            hosts,
            rollgate,
            eval,
        } => {
            let request = fleet::PlaybookRequest {
                policy: &policy,
                entry: entry.as_deref(),
                service: &service,
                version: &version,
                group: &group,
                hosts,
                rollgate: &rollgate,
            };
            printed(fleet::playbook(&request, &eval_options(eval))?)
        }
        FleetCommand::Move {
            service,
            version,
            target,
            port,
            ports,
            replicas,
            policy_entry,
            eval,
        } => {
            let request = fleet_move::MoveRequest {
                service,
                version,
                root: target.root,
                port,
                ports,
                replicas,
                policy_entry,
                eval: eval_options(eval),
            };
            Ok(ended(fleet_move::run(request, std::io::stdin().lock())?))
        }
    }
}

/// `rollgate webhooks ...`.
pub fn run_webhooks(command: WebhooksCommand) -> Result<u8, Error> {
    let root = |target: cli::RootArgs| {
        rollgate::host::state::Root::existing(target.root).map_err(Error::from)
    };
    match command {
        WebhooksCommand::Send { target } => {
            let pass = webhooks::send_pass(&root(target)?)?;
            if pass.skipped {
                eprintln!("rollgate: another sender holds the webhooks' lock; nothing sent");
            }
            printed(format!(
                "{} delivered, {} failed\n",
                pass.delivered, pass.failed
            ))
        }
        WebhooksCommand::Deliveries { target, format } => printed(webhooks::render_deliveries(
            &webhooks::deliveries(&root(target)?),
            format,
        )),
        WebhooksCommand::Redeliver { id, target } => {
            let attempts = webhooks::redeliver(&root(target)?, &id)?;
            let lines: String = attempts
                .iter()
                .map(|a| {
                    format!(
                        "{} {}: {}\n",
                        a.endpoint,
                        a.id,
                        a.error.clone().unwrap_or_else(|| "delivered".into())
                    )
                })
                .collect();
            print(&lines);
            Ok(if attempts.iter().all(|a| a.ok) {
                error::SUCCESS
            } else {
                error::FAILED
            })
        }
    }
}
