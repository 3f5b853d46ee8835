//! `rollgate scale SVC TYPE=N...`: how many processes of each of the live release's other types
//! run, changed without a new release (issue 69, 5). The counts are kept in the root
//! (`scale.json`, over the policy's `processes.TYPE.replicas`, for every later deploy too) and
//! applied at once by a run of the engine that starts or stops only the difference, as
//! Heroku's `ps:scale` does (issue 80, 4): each new process through its type's gate, the extra
//! ones stopped with their type's grace once the new ones are ready; web and every process
//! already running stay as they are, so no port is needed. The engine keeps the counts when
//! the run completes; one that fails or is cut short leaves them as they were.
//!
//! `web=N` is the web replica set's size (`replicas.json`, not `scale.json`): the run is then
//! a rollout of the live version to N fresh replicas (a single release's root becomes a
//! replica set), the other types moving in step with web's waves.

use std::collections::BTreeMap;

use super::rollback::{self, RollbackRequest};
use crate::engine::Outcome;
use crate::error::{refused, Error};
use crate::host::state::Root;

/// A count asked for: so many (`worker=4`), or so many more or fewer than run (`worker=+1`,
/// `worker=-2`: Heroku's `ps:scale worker+1`), decided by the engine under the lock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Count {
    To(usize),
    By(i64),
}

/// `TYPE=N`, `TYPE=+N` or `TYPE=-N`, read from the command line.
pub fn parse_count(asked: &str) -> Result<(String, Count), Error> {
    let (name, count) = asked.split_once('=').ok_or_else(|| {
        refused(format!(
            "`{asked}`: give TYPE=COUNT (worker=4), or TYPE=+N / TYPE=-N"
        ))
    })?;
    crate::host::names::check_name("process type", name)?;
    let bad = || {
        refused(format!(
            "`{asked}`: the count must be an integer from 0 to 1000, or +N / -N (N up to 1000)"
        ))
    };
    let number = |text: &str| {
        text.parse::<u16>()
            .ok()
            .filter(|n| *n <= 1000)
            .ok_or_else(bad)
    };
    let count = if let Some(more) = count.strip_prefix('+') {
        Count::By(number(more)?.into())
    } else if let Some(fewer) = count.strip_prefix('-') {
        Count::By(-i64::from(number(fewer)?))
    } else {
        Count::To(number(count)?.into())
    };
    Ok((name.to_string(), count))
}

/// Scales the live release's types as `counts` asks (its restart is `request`).
pub fn scale(request: RollbackRequest, asked: &[(String, Count)]) -> Result<Outcome, Error> {
    let said: Vec<String> = asked
        .iter()
        .map(|(name, count)| match count {
            Count::To(n) => format!("{name}={n}"),
            Count::By(by) => format!("{name}={by:+}"),
        })
        .collect();
    let mut counts = Vec::new();
    let mut scale_by = BTreeMap::new();
    for (name, count) in asked {
        match count {
            Count::To(n) => counts.push((name.clone(), *n)),
            Count::By(_) if name == "web" => return Err(refused(
                "web=+N / web=-N: give web's count itself (web=3): it is the replica set's size",
            )),
            Count::By(by) => {
                scale_by.insert(name.clone(), *by);
            }
        }
    }
    crate::host::names::check_name("service", &request.service)?;
    let root = Root::existing(request.root.clone())?;
    let web = counts
        .iter()
        .rev()
        .find(|(name, _)| name == "web")
        .map(|(_, n)| *n);
    if web == Some(0) {
        return Err(refused(format!(
            "web=0 would leave nobody answering: `rollgate stop {}` stops the service",
            request.service
        )));
    }
    let counts: Vec<(String, usize)> = counts
        .iter()
        .filter(|(name, _)| name != "web")
        .cloned()
        .collect();
    // The release web runs is the release (a scale moves no type to another one).
    let live = crate::engine::what_runs(&root)?
        .filter(|f| f.service == request.service)
        .and_then(|f| {
            f.processes
                .into_iter()
                .find(|p| p.process_type == crate::host::state::WEB)
        })
        .ok_or_else(|| {
            refused(format!(
                "nothing of {} is live under {}; nothing to scale",
                request.service,
                root.0.display()
            ))
        })?;
    let types: Vec<String> =
        crate::release::procfile::Procfile::of_release(&root.release_dir(&live.version))?
            .map(|p| p.others().into_iter().map(|(name, _)| name).collect())
            .unwrap_or_default();
    let unknown = counts
        .iter()
        .map(|(name, _)| name)
        .chain(scale_by.keys())
        .find(|name| !types.contains(name));
    if let Some(unknown) = unknown {
        return Err(refused(format!(
            "release {} has no `{unknown}:` line in its Procfile (its types besides web: {})",
            live.version,
            match types.is_empty() {
                true => "none".to_string(),
                false => types.join(", "),
            }
        )));
    }
    // The engine plans the restart with these counts and makes them the root's when it
    // completes: a scale cut short or gone back leaves `scale.json` as the processes are.
    let mut after: BTreeMap<String, usize> = root.read_scale()?;
    after.extend(counts.iter().cloned());
    if web.is_none() {
        return scale_types(request, live.version, said, after, scale_by);
    }
    if !scale_by.is_empty() {
        return Err(refused(
            "with web=N, give the other types' counts themselves (worker=3): web's fresh replicas restart every type",
        ));
    }
    // Said by the engine once it has planned the restart, not before a refusal (a singleton
    // scaled past one was announced, then refused: issue 81).
    let scaling = format!(
        "rollgate: scaling {} {} to {}: every process started again through its gate",
        request.service,
        live.version,
        said.join(" ")
    );
    rollback::restart_sized(request, web, Some(scaling), Some(after))
}

/// The other types alone, to the counts `after`: only the difference starts and stops.
fn scale_types(
    request: RollbackRequest,
    version: String,
    asked: Vec<String>,
    after: BTreeMap<String, usize>,
    scale_by: BTreeMap<String, i64>,
) -> Result<Outcome, Error> {
    let deploy = request.deploy;
    let args = crate::engine::settings::Args {
        types_only: true,
        scale_by,
        ..deploy.rollout_args()
    };
    super::rollout::rollout(super::rollout::Request {
        announce: Some(format!(
            "rollgate: scaling {} {version} to {}: only the difference starts or stops; web and the processes running stay",
            request.service,
            asked.join(" ")
        )),
        service: request.service,
        version,
        root: request.root,
        policy: deploy.policy,
        policy_entry: deploy.policy_entry,
        eval: deploy.eval,
        give_service_config: false,
        scale: Some(after),
        args,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_absolute_or_relative_and_bounded() {
        let count = |asked: &str| {
            parse_count(asked)
                .map(|(_, c)| c)
                .map_err(|e| e.to_string())
        };
        assert_eq!(count("worker=4"), Ok(Count::To(4)));
        assert_eq!(count("worker=+1"), Ok(Count::By(1)));
        assert_eq!(count("worker=-2"), Ok(Count::By(-2)));
        assert_eq!(count("worker=0"), Ok(Count::To(0)));
        // "+1" is an integer to Rust's parser: the sign must make it relative, never absolute.
        assert_ne!(count("worker=+1"), Ok(Count::To(1)));
        for bad in [
            "worker=1001",
            "worker=+1001",
            "worker=--1",
            "worker=+-1",
            "worker=",
            "worker",
        ] {
            assert!(count(bad).is_err(), "{bad}");
        }
    }
}
