//! The process types an export runs besides web (issue 69): the lines of the release's Procfile
//! (`policy export --procfile`), each with its entry in the policy's `processes` (or the
//! defaults), in the file's order. A policy that names a type the Procfile lacks, or names types
//! with no Procfile given, is refused: an orchestrator would run the image's web command in their
//! place.

use super::workload::Workload;
use super::Inexpressible;
use crate::policy::{ProcessPolicy, RolloutSettings};

/// The Procfile types that are neither the web process nor the release phase.
const WEB: &str = "web";
const RELEASE_PHASE: &str = "release";

/// One type as the exports run it.
#[derive(Debug, Clone)]
pub struct Type<'a> {
    pub name: &'a str,
    pub command: &'a str,
    pub policy: ProcessPolicy,
}

/// Entry `entry`'s types besides web and the release phase, or why they cannot be exported.
pub fn of<'a>(
    entry: &str,
    settings: &RolloutSettings,
    workload: &'a Workload,
) -> Result<Vec<Type<'a>>, Inexpressible> {
    let declared = settings.processes.clone().unwrap_or_default();
    let Some(lines) = &workload.procfile else {
        if declared.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<&str> = declared.keys().map(String::as_str).collect();
        return Err(Inexpressible::new(
            entry,
            format!(
                "processes names {}: give the release's Procfile with --procfile, so each \
                 type's command is known",
                names.join(", ")
            ),
        ));
    };
    if let Some(missing) = declared
        .keys()
        .find(|name| !lines.iter().any(|line| &line.name == *name))
    {
        return Err(Inexpressible::new(
            entry,
            format!("processes.{missing}: the Procfile given has no `{missing}:` line"),
        ));
    }
    Ok(lines
        .iter()
        .filter(|line| line.name != WEB && line.name != RELEASE_PHASE)
        .map(|line| Type {
            name: &line.name,
            command: &line.command,
            policy: declared.get(&line.name).cloned().unwrap_or_default(),
        })
        .collect())
}

/// The release phase's command, when the Procfile given has one.
pub fn release_phase(workload: &Workload) -> Option<&str> {
    workload.command_of(RELEASE_PHASE)
}

/// The web process's command, when the Procfile given has one (else the image's own).
pub fn web(workload: &Workload) -> Option<&str> {
    workload.command_of(WEB)
}
