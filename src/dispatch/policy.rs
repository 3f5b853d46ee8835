//! `policy ...`: checking and exporting rollout policies.

use rollgate::error::{self, Error};
use rollgate::{fleet, policy};

use super::{eval_options, print, printed};
use crate::cli::PolicyCommand;

pub fn run_policy(command: PolicyCommand) -> Result<u8, Error> {
    match command {
        PolicyCommand::Export {
            file,
            format,
            strict,
            image,
            port,
            procfile,
            eval,
        } => {
            if let Some(engine) = fleet::export::Engine::of(format) {
                let procfile = match procfile {
                    Some(path) => Some(procfile_lines(&path)?),
                    None => None,
                };
                let workload = fleet::export::Workload {
                    image,
                    port,
                    strict,
                    procfile,
                };
                let exported =
                    fleet::export::export(&file, engine, &workload, &eval_options(eval))?;
                print(&exported.text);
                for what in exported.lost {
                    eprintln!("not expressed in {}: {what}", engine.name());
                }
                return Ok(error::SUCCESS);
            }
            printed(policy::export(&file, format, &eval_options(eval))?)
        }
        PolicyCommand::Check {
            files,
            format,
            eval,
        } => {
            let outcomes = policy::check::check_files(&files, &eval_options(eval));
            let (report, all_ok) = policy::check::render(&outcomes, format);
            print(&report);
            Ok(if all_ok {
                error::SUCCESS
            } else {
                error::FAILED
            })
        }
        PolicyCommand::Show { target, release } => printed(rollgate::commands::policy_show::show(
            &target.root,
            release.as_deref(),
        )?),
        PolicyCommand::Contract => printed(policy::ROLLOUT_POLICY_NCL.to_string()),
    }
}

/// The Procfile `policy export --procfile` names, as the exports read it.
fn procfile_lines(path: &std::path::Path) -> Result<Vec<fleet::export::ProcessLine>, Error> {
    Ok(rollgate::release::procfile::Procfile::read(path)?
        .types
        .into_iter()
        .map(|t| fleet::export::ProcessLine {
            name: t.name,
            command: t.command,
        })
        .collect())
}
