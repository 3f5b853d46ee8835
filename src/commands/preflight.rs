//! The checks a deploy or a rollout makes before anything starts, shared by the real run and
//! its `--dry-run`: the policy entry and its hooks, the release's executable under the root.

use std::path::PathBuf;

use crate::engine::plan;
use crate::error::{refused, Error};
use crate::host::fault::Fault;
use crate::host::hooks;
use crate::host::state::Root;
use crate::policy::{self, EvalOptions};

/// The policy's hooks, resolved against the policy file's folder (none without a policy).
pub(crate) fn policy_hooks(
    policy: Option<&policy::RolloutSettings>,
    file: Option<&std::path::Path>,
) -> Result<hooks::Hooks, Fault> {
    match (policy.and_then(|p| p.hooks.as_ref()), file) {
        (Some(hooks), Some(file)) => hooks::Hooks::from_policy(hooks, file),
        _ => Ok(hooks::Hooks::default()),
    }
}

/// A service's entry of a policy file (`--policy-entry`, else the service name with `-` as
/// `_`), checked by the contract; a refusal quotes Nickel's diagnostic. Deploys and rollouts.
pub(crate) fn policy_entry(
    file: Option<&std::path::Path>,
    entry: Option<&str>,
    service: &str,
    eval: &EvalOptions,
) -> Result<Option<policy::RolloutSettings>, Error> {
    let Some(path) = file else {
        return Ok(None);
    };
    let entry = entry.map_or_else(|| plan::policy_entry_for(service), str::to_string);
    policy::load_entry(path, &entry, eval)
        .map(Some)
        .map_err(|e| {
            refused(match e {
                policy::PolicyError::Nickel(_) => {
                    format!("{e}\nthe policy was refused; nothing was started")
                }
                other => format!("policy refused: {other}"),
            })
        })
}

/// The root and the release's executable under it, refused unless both are there.
pub(crate) fn release_executable(
    root: &std::path::Path,
    version: &str,
    service: &str,
) -> Result<(Root, PathBuf), Error> {
    let root = Root::existing(root.to_path_buf())?;
    let executable = root.executable(version, service);
    check_executable(&executable, version, service)?;
    Ok((root, executable))
}

fn check_executable(path: &std::path::Path, version: &str, service: &str) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Err(_) => Err(refused(format!(
            "release {version} of {service} not found: {} does not exist",
            path.display()
        ))),
        Ok(m) if !m.is_file() => Err(refused(format!("{} is not a file", path.display()))),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Err(refused(format!(
            "{} is not executable (chmod +x it)",
            path.display()
        ))),
        Ok(_) => Ok(()),
    }
}
