//! The checks a deploy or a rollout makes before anything starts, shared by the real run and
//! its `--dry-run`: the policy entry and its hooks, the release's executable under the root.

use std::path::PathBuf;

use crate::engine::judge;
use crate::error::{refused, Error};
use crate::host::hooks;
use crate::host::state::{Pointer, Root};
use crate::policy::{self, EvalOptions};

/// The policy's hooks, resolved against the policy file's folder (none without a policy).
pub(crate) fn policy_hooks(
    policy: Option<&policy::RolloutSettings>,
    file: Option<&std::path::Path>,
) -> Result<hooks::Hooks, String> {
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
    let entry = entry.map_or_else(|| judge::policy_entry_for(service), str::to_string);
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
    let root = Root::existing(root.to_path_buf()).map_err(refused)?;
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

/// A deploy moves one release: a root its replica set serves moves by `rollgate rollout`.
pub(crate) fn not_a_replica_set(
    root: &Root,
    service: &str,
    version: &str,
) -> Result<String, String> {
    match root.read_replicas()? {
        None => Ok("the root is not served by a replica set".into()),
        Some(set) => Err(format!(
            "{} is served by its replica set ({} replicas in {}); move it with `rollgate rollout {service} {version} --root {}`",
            root.0.display(),
            set.replicas.len(),
            root.replicas_path().display(),
            root.0.display()
        )),
    }
}

/// The candidate starts beside the live release, so never on its port.
pub(crate) fn beside_the_live(live: Option<&Pointer>, port: u16) -> Result<String, String> {
    match live {
        Some(live) if live.port == port => Err(format!(
            "port {port} is the live release's ({} {}); deploy the candidate beside it on another port",
            live.service, live.version
        )),
        Some(live) => Ok(format!(
            "live release {} on port {} stays until the candidate is ready",
            live.version, live.port
        )),
        None => Ok("no live release: this would be the first".into()),
    }
}

/// The candidate's port is free on 127.0.0.1 now.
pub(crate) fn port_free(port: u16) -> Result<String, String> {
    std::net::TcpListener::bind(("127.0.0.1", port))
        .map(|_| format!("port {port} is free on 127.0.0.1"))
        .map_err(|e| {
            format!("port {port} is busy on 127.0.0.1 ({e}); pick a free port for the candidate")
        })
}
