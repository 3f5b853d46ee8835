//! The checks a deploy or a rollout makes before anything starts, shared by the real run and
//! its `--dry-run`: the policy entry and its hooks, the release's executable under the root.

use std::path::PathBuf;

use crate::engine::plan;
use crate::error::{refused, Error};
use crate::host::fault::Fault;
use crate::host::hooks;
use crate::host::kept_policy::KeptPolicy;
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

/// The policy a command on a root runs under (issue 67): the file it was given (`--policy`),
/// else the one the service is held to, kept in the root (the live release's record); none
/// where there is neither (the defaults).
pub(crate) struct Chosen {
    pub settings: policy::RolloutSettings,
    /// What is kept for the release it runs (see [`keep`]); its source is where the hooks are.
    pub kept: KeptPolicy,
    /// Given on the command line (not the kept one).
    pub given: bool,
}

impl Chosen {
    /// The policy file, where its hooks are found.
    pub fn source(&self) -> &std::path::Path {
        &self.kept.source
    }

    /// Says, once, that a command not given `--policy` runs under the service's kept policy
    /// (nothing to say of a policy given on the command line).
    pub fn say_if_kept(&self) {
        if !self.given {
            eprintln!(
                "rollgate: no --policy: the service's policy, kept in the root (entry {} of {}, sha256 {})",
                self.kept.entry,
                self.kept.source.display(),
                self.kept.short_digest()
            );
        }
    }
}

/// The policy for `service` under `root`: the given file's entry (`--policy-entry`, else the
/// service name with `-` as `_`), checked by the contract (a refusal quotes Nickel's
/// diagnostic); without a file, the policy kept in the root. Deploys, rollouts, rollbacks,
/// `config set` and their dry runs.
pub(crate) fn policy_entry(
    root: &std::path::Path,
    file: Option<&std::path::Path>,
    entry: Option<&str>,
    service: &str,
    eval: &EvalOptions,
) -> Result<Option<Chosen>, Error> {
    let Some(path) = file else {
        return kept_for(root);
    };
    let entry = entry.map_or_else(|| plan::policy_entry_for(service), str::to_string);
    let (value, settings) = policy::load_entry_value(path, &entry, eval).map_err(|e| {
        refused(match e {
            policy::PolicyError::Nickel(_) => {
                format!("{e}\nthe policy was refused; nothing was started")
            }
            other => format!("policy refused: {other}"),
        })
    })?;
    Ok(Some(Chosen {
        settings,
        kept: KeptPolicy::of_file(path, &entry, value),
        given: true,
    }))
}

/// The policy the service under `root` is held to (none for a root that is not there yet:
/// the command refuses it by its own words).
fn kept_for(root: &std::path::Path) -> Result<Option<Chosen>, Error> {
    let Ok(root) = Root::existing(root.to_path_buf()) else {
        return Ok(None);
    };
    let Some((version, kept)) = KeptPolicy::of_live(&root)? else {
        return Ok(None);
    };
    let settings = kept.settings(&KeptPolicy::path(&root, &version))?;
    Ok(Some(Chosen {
        settings,
        kept,
        given: false,
    }))
}

/// Records the policy `version` runs under as its own (the defaults: none), unless `version`
/// is the live release, whose record is the service's policy while it runs.
pub(crate) fn keep(root: &Root, version: &str, chosen: Option<&Chosen>) -> Result<(), Error> {
    let live = root.read_pointer()?.map(|p| p.version);
    if live.as_deref() == Some(version) {
        return Ok(());
    }
    match chosen {
        Some(chosen) => chosen.kept.keep(root, version)?,
        None => KeptPolicy::forget(root, version)?,
    }
    Ok(())
}

/// The root and the release's executable under it, refused unless both are there.
pub(crate) fn release_executable(
    root: &std::path::Path,
    version: &str,
    service: &str,
) -> Result<(Root, PathBuf), Error> {
    let root = Root::existing(root.to_path_buf())?;
    let executable = root.executable(version, service);
    // A release whose Procfile has a `web:` line runs that instead (the path is unused).
    let web = crate::release::procfile::Procfile::web_of_release(&root.release_dir(version));
    if web.is_none() {
        check_executable(&executable, version, service)?;
    }
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
