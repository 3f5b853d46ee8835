//! `rollgate scale SVC TYPE=N...`: how many processes of each of the live release's other types
//! run, changed without a new release (issue 69, 5). The counts are kept in the root
//! (`scale.json`, over the policy's `processes.TYPE.replicas`, for every later deploy too) and
//! applied at once by a restart of the live release: every process of it started again through
//! its gate — web beside the old one, so users see nothing — with the new counts, the extra
//! ones stopped with their type's grace once it is promoted. The engine keeps the counts when
//! the restart completes; one that fails or is cut short leaves them as they were.
//!
//! `web=N` is the web replica set's size (`replicas.json`, not `scale.json`): the restart is
//! then a rollout of the live version to N fresh replicas (a single release's root becomes a
//! replica set), the other types moving in step with web's waves.

use std::collections::BTreeMap;

use super::rollback::{self, RollbackRequest};
use crate::engine::Outcome;
use crate::error::{refused, Error};
use crate::host::state::Root;

/// `TYPE=N`, read from the command line.
pub fn parse_count(asked: &str) -> Result<(String, usize), Error> {
    let (name, count) = asked
        .split_once('=')
        .ok_or_else(|| refused(format!("`{asked}`: give TYPE=COUNT (worker=4)")))?;
    crate::host::names::check_name("process type", name)?;
    let count: usize = count.parse().ok().filter(|n| *n <= 1000).ok_or_else(|| {
        refused(format!(
            "`{asked}`: the count must be an integer from 0 to 1000"
        ))
    })?;
    Ok((name.to_string(), count))
}

/// Scales the live release's types as `counts` asks (its restart is `request`).
pub fn scale(request: RollbackRequest, counts: &[(String, usize)]) -> Result<Outcome, Error> {
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
    let live = root
        .read_pointer()?
        .filter(|p| p.service == request.service)
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
    if let Some((unknown, _)) = counts.iter().find(|(name, _)| !types.contains(name)) {
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
    let mut asked: Vec<String> = counts.iter().map(|(n, c)| format!("{n}={c}")).collect();
    asked.extend(web.map(|n| format!("web={n}")));
    // Said by the engine once it has planned the restart, not before a refusal (a singleton
    // scaled past one was announced, then refused: issue 81).
    let scaling = format!(
        "rollgate: scaling {} {} to {}: every process started again through its gate",
        request.service,
        live.version,
        asked.join(" ")
    );
    rollback::restart_sized(request, web, Some(scaling), Some(after))
}
