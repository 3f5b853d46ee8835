//! The policy's hooks: `pre_deploy` (its failure refuses the deploy before anything starts),
//! `post_promote` and `post_rollback` (their failure is logged and never undoes the outcome).
//! Each runs in the folder of the release it is about, with that release's configuration and
//! secrets in its environment (a migration needs the database password the release gets) and
//! what happened in `ROLLGATE_*` variables. It is confined as its service's releases are (the
//! same user, no privileges, the same filesystem rules plus its own folder to read, a cgroup
//! of its own with the same limits; `isolation.enabled = false` lifts it for hooks too), and
//! its whole tree ends with it: when it exits (what it left running is killed, as systemd does
//! for a oneshot unit) or at `timeout_ms`. Its output, the last 64 KiB of it, is kept in
//! `output/VERSION/HOOK.output` and the end of it quoted in the log line that says how it
//! went.

use crate::defaults;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

use crate::policy::HooksPolicy;

use super::fault::Fault;

/// How much of a hook's output a refusal or a log line quotes (its end).
const OUTPUT_QUOTED: usize = 400;
/// How much of a hook's output is kept (its end), in memory and in its file.
const OUTPUT_KEPT: usize = 64 * 1024;
/// How long output still in the pipes is read once a hook has exited.
const OUTPUT_AFTER_EXIT: Duration = Duration::from_millis(100);

/// The hooks of one deploy or rollout, resolved: programs named relative to the policy file
/// are made absolute, so they run the same from a watcher or a later recovery. Persisted with
/// the deploy's record and the rollout's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hooks {
    pub pre_deploy: Option<Vec<String>>,
    pub post_promote: Option<Vec<String>>,
    pub post_rollback: Option<Vec<String>>,
    pub timeout_ms: u64,
    /// The release phase of the version deployed (`/bin/sh -c` its Procfile's `release:`),
    /// set by the run that deploys a new version: not the policy's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    PreDeploy,
    PostPromote,
    PostRollback,
    /// The release phase: the release's own `release:` command from its Procfile, run like a
    /// `pre_deploy` hook but in the new release (see `release::procfile`).
    Release,
}

impl Hook {
    pub fn name(self) -> &'static str {
        match self {
            Hook::PreDeploy => "pre_deploy",
            Hook::PostPromote => "post_promote",
            Hook::PostRollback => "post_rollback",
            Hook::Release => "release",
        }
    }
}

/// Whether a `hook_ran`/`hook_failed` line's detail is of a hook run before anything of the
/// run started (`pre_deploy`, or the release phase): its failure refused the run.
pub fn ran_before_start(detail: &str) -> bool {
    detail
        .strip_prefix("hook ")
        .is_some_and(|words| words.starts_with(Hook::PreDeploy.name()))
        || detail.starts_with(RELEASE_PHASE_WORDS)
}

/// How a release phase's lines begin.
const RELEASE_PHASE_WORDS: &str = "the release phase";

pub use super::confine::Isolation;

/// What a hook is told, as `ROLLGATE_*` variables.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    pub service: String,
    pub version: String,
    pub previous_version: Option<String>,
    /// The new release's port(s).
    pub ports: Vec<u16>,
    pub previous_ports: Vec<u16>,
    pub reason: Option<String>,
}

impl Hooks {
    /// The policy's hooks; relative programs (`./notify.sh`) are found beside the policy file.
    pub fn from_policy(policy: &HooksPolicy, policy_file: &Path) -> Result<Hooks, Fault> {
        Hooks::resolved(policy, policy_file).map_err(|why| Fault::setting("hooks", why))
    }

    fn resolved(policy: &HooksPolicy, policy_file: &Path) -> Result<Hooks, String> {
        let base = policy_file
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let resolve = |field: &str, words: &Option<Vec<String>>| -> Result<_, String> {
            let Some(words) = words else { return Ok(None) };
            if words.is_empty() || words.iter().any(String::is_empty) {
                return Err(format!(
                    "hooks.{field} must be a non-empty list of non-empty strings: the program, then its arguments"
                ));
            }
            let mut words = words.clone();
            if words[0].contains('/') && !words[0].starts_with('/') {
                let absolute = base.join(&words[0]);
                let absolute = absolute.canonicalize().unwrap_or(absolute);
                words[0] = absolute.display().to_string();
            }
            Ok(Some(words))
        };
        let timeout_ms = policy
            .timeout_ms
            .unwrap_or(defaults::HOOK_TIMEOUT.as_millis() as u64);
        if !(100..=600_000).contains(&timeout_ms) {
            return Err(format!(
                "hooks.timeout_ms is {timeout_ms}; it must be an integer from 100 to 600000"
            ));
        }
        Ok(Hooks {
            pre_deploy: resolve("pre_deploy", &policy.pre_deploy)?,
            post_promote: resolve("post_promote", &policy.post_promote)?,
            post_rollback: resolve("post_rollback", &policy.post_rollback)?,
            timeout_ms,
            release: None,
        })
    }

    pub fn command(&self, hook: Hook) -> Option<&[String]> {
        match hook {
            Hook::PreDeploy => self.pre_deploy.as_deref(),
            Hook::PostPromote => self.post_promote.as_deref(),
            Hook::PostRollback => self.post_rollback.as_deref(),
            Hook::Release => self.release.as_deref(),
        }
    }

    /// Runs `hook` if the policy has it: None when it has not; Ok with how it went (exit 0,
    /// the time and the end of its output) for the log, Err with what went wrong (exit status
    /// or the time limit, and the end of its output).
    pub async fn run(
        &self,
        hook: Hook,
        root: &Path,
        facts: &Facts,
        isolation: &Isolation<'_>,
    ) -> Option<Result<String, Fault>> {
        let command = self.command(hook)?;
        Some(
            run_command(
                hook,
                command,
                root,
                facts,
                isolation,
                Duration::from_millis(self.timeout_ms),
            )
            .await
            .map_err(|why| Fault::Hook {
                hook: hook.name(),
                why,
            }),
        )
    }
}

/// Where a hook about `version` runs and what it is given: the release's folder and its
/// configuration (variables, and its secrets' values), or the root when the release is not
/// installed (a hook's own command can still say why).
pub(super) fn release_context(
    root: &Path,
    version: &str,
) -> Result<(PathBuf, Vec<(String, String)>), String> {
    let folder = root.join("releases").join(version);
    if super::names::check_name("version", version).is_err() || !folder.is_dir() {
        return Ok((root.to_path_buf(), Vec::new()));
    }
    let config = super::config::Config::of_release(&folder)
        .and_then(|config| config.resolve(&super::config::secrets_dir(root)))
        .map_err(|e| format!("the release's configuration cannot be given to it: {}", e.0))?;
    Ok((folder, config))
}

/// Keeps a hook's output with its release's own files (`ROOT/output/VERSION/HOOK.output`,
/// never in the release's folder, where a link it shipped could be waiting under that name),
/// with the root's secret values blanked. Best effort: the log line quotes its end either way.
fn keep_output(root: &Path, version: &str, hook: Hook, output: &[u8]) {
    if super::names::check_name("version", version).is_err() {
        return;
    }
    let Ok(folder) = super::output::own_folder(root, version) else {
        return;
    };
    let secrets = super::config::known_values(&super::config::secrets_dir(root));
    let text = super::config::redact(&String::from_utf8_lossy(output), &secrets);
    let path = folder.join(format!("{}.output", hook.name()));
    let _ = super::files::write_atomically(&path, text.as_bytes());
}

/// Begins the label of every hook's tree.
const HOOK_LABEL: &str = "hook-";

/// The label of a hook's tree: the hook and its root (`hook-release-svc-ROOTHASH`). Hooks run
/// only while a command holds the root's lock, so such a tree the next holder finds is one a
/// dead holder left: [`end_left_behind`] ends it.
fn tree_label(root: &Path, hook: Hook) -> String {
    format!(
        "{HOOK_LABEL}{}-{}",
        hook.name(),
        super::cgroup::group_of(root, None)
    )
}

/// Ends the hooks a command killed while it ran them left running on `root` (a release phase
/// migrating on, beside the next deploy's: issue 80), whole, tree and all; the caller holds
/// the root's lock. Words for each.
pub async fn end_left_behind(root: &Path) -> Vec<String> {
    let ours = format!(
        "-{}",
        super::cgroup::label_of(&super::cgroup::group_of(root, None))
    );
    let mut said = Vec::new();
    for (tree, who, label) in super::cgroup::started_by_prefix(HOOK_LABEL) {
        if !label.ends_with(&ours) {
            continue;
        }
        tree.end().await;
        let hook = label
            .strip_prefix(HOOK_LABEL)
            .and_then(|rest| rest.strip_suffix(&ours))
            .unwrap_or("?");
        said.push(format!(
            "hook {hook} (pid {}), left running by a rollgate killed while it ran it: stopped",
            who.pid
        ));
    }
    said
}

fn ports(list: &[u16]) -> String {
    list.iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

async fn run_command(
    hook: Hook,
    command: &[String],
    root: &Path,
    facts: &Facts,
    isolation: &Isolation<'_>,
    limit: Duration,
) -> Result<String, String> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| format!("hooks.{} is empty", hook.name()))?;
    // How it is named in what is said of it.
    let what = match hook {
        Hook::Release => format!(
            "{RELEASE_PHASE_WORDS} (`{}`)",
            super::output::printable(command.last().map_or("", String::as_str))
        ),
        _ => format!("hook {} ({program})", hook.name()),
    };
    let (folder, config) =
        release_context(root, &facts.version).map_err(|why| format!("{what}: {why}"))?;
    let could_not_start = |e: std::io::Error| format!("{what} could not start: {e}");
    // Its release folder as a release's (made readable to the service's user); its own folder
    // (beside the policy file) only read, and left as it is.
    let release: Vec<&Path> = match folder == root {
        true => Vec::new(),
        false => vec![folder.as_path()],
    };
    let own_folder: Vec<&Path> = Path::new(program).parent().into_iter().collect();
    // A hook runs on the host, an image release's too (its program is beside the policy).
    let confinement = super::confine::Confinement::for_process(
        *isolation,
        &super::launch::Runner::Host,
        &super::confine::Placement {
            root,
            release: &release,
            readable: &own_folder,
            label: &tree_label(root, hook),
            ports: &[],
        },
    )
    .map_err(could_not_start)?;
    let user = confinement.user.clone();
    let started = Instant::now();
    let mut command = tokio::process::Command::new(program);
    confinement.give_environment(&mut command);
    confinement.install(&mut command, || Ok(()));
    let mut child = command
        .args(args)
        .current_dir(&folder)
        .envs(config)
        .env("ROLLGATE_HOOK", hook.name())
        .env("ROLLGATE_SERVICE", &facts.service)
        .env("ROLLGATE_VERSION", &facts.version)
        .env(
            "ROLLGATE_PREVIOUS_VERSION",
            facts.previous_version.as_deref().unwrap_or(""),
        )
        .env("ROLLGATE_PORTS", ports(&facts.ports))
        .env("ROLLGATE_PREVIOUS_PORTS", ports(&facts.previous_ports))
        .env("ROLLGATE_REASON", facts.reason.as_deref().unwrap_or(""))
        .env("ROLLGATE_ROOT", root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| super::confine::Confinement::explain(user.as_ref(), Path::new(program), e))
        .map_err(could_not_start)?;
    let pid = child.id().map(|p| p as i32);
    // Its tree (made before exec, so there now): what ends the hook ends all it started.
    let tree = pid
        .and_then(super::identity::Identity::of)
        .and_then(|who| super::cgroup::of(&who));
    // The hook is judged by its exit, not by the end of its output: a background process it
    // started may hold the pipes open long after it exited. What is read is bounded.
    let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        child
            .stderr
            .take()
            .map(|e| Box::new(e) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|pipe| tokio::spawn(keep_tail(pipe, output.clone())))
    .collect();
    let outcome = tokio::select! {
        status = child.wait() => Ok(status),
        _ = tokio::time::sleep(limit) => Err(()),
    };
    if outcome.is_ok() {
        // What it wrote before it exited is in the pipes already.
        for reader in &readers {
            let _ = tokio::time::timeout(OUTPUT_AFTER_EXIT, async {
                while !reader.is_finished() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
        }
    }
    // Whatever it left running ends with it (its output was judged by its exit already).
    if let Some(tree) = &tree {
        tree.end().await;
    }
    for reader in &readers {
        reader.abort();
    }
    let output = output.lock().map(|o| o.clone()).unwrap_or_default();
    if folder != root {
        keep_output(root, &facts.version, hook, &output);
    }
    let outcome = outcome.map(|status| (status, output));
    let took = started.elapsed().as_millis();
    match outcome {
        Ok((Ok(status), output)) if status.success() => Ok(format!(
            "{what} exited 0 after {took} ms in {}{}",
            folder.display(),
            quote(&output)
        )),
        Ok((Ok(status), output)) => Err(format!(
            "{what} failed with {status} after {took} ms{}",
            quote(&output)
        )),
        Ok((Err(e), _)) => Err(format!("{what}: {e}")),
        Err(()) => {
            // Its leader is still unreaped (the wait is pending), so the group id is ours (the
            // tree, where there is one, was ended above).
            if let Some(pid) = pid.filter(|p| *p > 1) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            Err(format!(
                "{what} did not finish within {} ms and was killed",
                limit.as_millis()
            ))
        }
    }
}

/// Reads a pipe to its end, keeping only its last bytes (enough to quote).
async fn keep_tail(
    mut pipe: Box<dyn tokio::io::AsyncRead + Unpin + Send>,
    kept: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
) {
    let mut buffer = [0u8; 4096];
    while let Ok(n) = pipe.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        if let Ok(mut kept) = kept.lock() {
            kept.extend_from_slice(&buffer[..n]);
            let excess = kept.len().saturating_sub(OUTPUT_KEPT);
            kept.drain(..excess);
        }
    }
}

/// The end of a hook's output, on one line.
fn quote(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let text = text.trim();
    if text.is_empty() {
        return String::new();
    }
    let start = text
        .char_indices()
        .map(|(i, _)| i)
        .find(|i| text.len() - i <= OUTPUT_QUOTED)
        .unwrap_or(0);
    let one_line = text[start..].replace('\n', " | ");
    format!(": {}", super::output::printable(&one_line))
}
