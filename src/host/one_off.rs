//! A one-off command in a release (`rollgate run`, issue 68): `manage.py createsuperuser`, a
//! shell, a data fix — run as the release's own processes run, from their launch record: in the
//! release's folder, with its configuration and secrets' values, as the service's user, confined
//! and within its limits. The terminal stays the caller's (stdin, stdout and stderr are handed
//! over as they are, so a shell or a REPL works); signals that reach rollgate (Ctrl-C, a
//! hang-up, a stop) are sent on to the command; when it exits, whatever it left running goes
//! with its tree. Its exit status is the caller's to return.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::launch::LaunchRecord;

/// What to run, and where.
pub struct OneOff<'a> {
    pub root: &'a Path,
    pub service: &'a str,
    pub version: &'a str,
    /// The program and its arguments (a path is taken from the release's folder).
    pub command: &'a [String],
    /// How the service's processes are started: its user, confinement, limits, folders.
    pub record: &'a LaunchRecord,
}

/// How a one-off command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// The exit status as a shell gives it: the code, or 128 + the signal that ended it.
    pub code: i32,
    pub took: Duration,
}

impl Ended {
    /// `exit status 7` / `killed by signal 2 (exit status 130)`.
    pub fn words(&self) -> String {
        match self.code {
            code if code > 128 => format!("killed by signal {} (exit status {code})", code - 128),
            code => format!("exit status {code}"),
        }
    }
}

/// Runs it to its end, the terminal attached; Err when it could not start (the reason names
/// what stopped it).
pub async fn run(one_off: &OneOff<'_>) -> std::io::Result<Ended> {
    let label = format!("run-{}", std::process::id());
    let mut prepared = prepare(one_off, &label)?;
    // Listening before the command exists: a Ctrl-C from then on is the command's, never
    // rollgate's death with the command left behind.
    let mut signals = PassedSignals::listen()?;
    let started = Instant::now();
    let mut child = prepared
        .command
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| prepared.could_not_start(&label, e))?;
    let pid = child.id().map_or(0, |p| p as i32);
    // Its tree (made before its exec): what ends the command ends all it started.
    let tree = super::identity::Identity::of(pid).and_then(|who| super::cgroup::of(&who));
    // A container's supervisor is asked to stop the container (SIGTERM, its grace), whatever
    // the signal: killed, it would leave the container behind.
    let status = signals
        .wait_passing(&mut child, pid, prepared.image)
        .await?;
    end_tree(tree.as_ref(), pid).await;
    Ok(Ended {
        code: code_of(status),
        took: started.elapsed(),
    })
}

/// A run whose output goes to a file and whose time is bounded (a schedule's run, issue 70).
pub struct ToFile<'a> {
    pub output: &'a Path,
    /// Its cgroup label and `ROLLGATE_DEPLOY_TOKEN`: how it is found again after a crash.
    pub token: &'a str,
    pub limit: Duration,
    /// After SIGTERM at the limit, how long before its tree is killed.
    pub grace: Duration,
    /// More variables it is given (`ROLLGATE_SCHEDULE`).
    pub env: Vec<(String, String)>,
}

/// How a bounded run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndedToFile {
    pub ended: Ended,
    /// It was stopped at its limit.
    pub timed_out: bool,
}

/// Runs it with its output to a file, told its identity the moment it runs (`spawned`), then
/// to its end or its limit (SIGTERM to its group, the grace, its tree killed); whatever it left
/// running ends with it.
pub async fn run_to_file(
    one_off: &OneOff<'_>,
    to: &ToFile<'_>,
    spawned: impl FnOnce(super::identity::Identity),
) -> std::io::Result<EndedToFile> {
    let mut prepared = prepare(one_off, to.token)?;
    let output = std::fs::File::from(super::output::start(to.output, Default::default())?);
    if let Some(user) = &prepared.user {
        std::os::unix::fs::fchown(&output, Some(user.uid), Some(user.gid))?;
    }
    let started = Instant::now();
    let mut child = prepared
        .command
        .envs(to.env.iter().cloned())
        .env("ROLLGATE_DEPLOY_TOKEN", to.token)
        .stdin(Stdio::null())
        .stdout(output.try_clone()?)
        .stderr(output)
        .spawn()
        .map_err(|e| prepared.could_not_start(to.token, e))?;
    let pid = child.id().map_or(0, |p| p as i32);
    let who = super::identity::Identity::of(pid);
    let tree = who.and_then(|who| super::cgroup::of(&who));
    if let Some(who) = who {
        spawned(who);
    }
    let (status, timed_out) = tokio::select! {
        status = child.wait() => (status?, false),
        _ = tokio::time::sleep(to.limit) => {
            let group = nix::unistd::Pid::from_raw(pid);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGTERM);
            match tokio::time::timeout(to.grace, child.wait()).await {
                Ok(status) => (status?, true),
                Err(_) => {
                    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                    (child.wait().await?, true)
                }
            }
        }
    };
    end_tree(tree.as_ref(), pid).await;
    Ok(EndedToFile {
        ended: Ended {
            code: code_of(status),
            took: started.elapsed(),
        },
        timed_out,
    })
}

/// The command as the release's processes are started, not yet spawned.
struct Prepared {
    command: tokio::process::Command,
    program: std::path::PathBuf,
    user: Option<super::account::ServiceUser>,
    image: bool,
}

impl Prepared {
    fn could_not_start(&self, label: &str, e: std::io::Error) -> std::io::Error {
        super::cgroup::remove_empty(label);
        super::confine::Confinement::explain(self.user.as_ref(), &self.program, e)
    }
}

fn prepare(one_off: &OneOff<'_>, label: &str) -> std::io::Result<Prepared> {
    let (program, args) = one_off
        .command
        .split_first()
        .ok_or_else(|| std::io::Error::other("no command given after --"))?;
    let (folder, config) = super::hooks::release_context(one_off.root, one_off.version)
        .map_err(std::io::Error::other)?;
    let record = one_off.record;
    // An image release's command runs in a container of its image, through the supervisor a
    // release's container has (which holds the container's user and limits for the engine).
    let runner = record.runner(&folder);
    let image = runner.image().map(str::to_string);
    let confinement = super::confine::Confinement::for_process(
        record.isolation(),
        &runner,
        &super::confine::Placement {
            root: one_off.root,
            release: &[folder.as_path()],
            readable: &[],
            label,
            ports: &[],
        },
    )?;
    let user = confinement.user.clone();
    let mut command = match &image {
        Some(image) => {
            let executable = folder.join(one_off.service);
            let secrets = super::config::secrets_dir(one_off.root);
            let launch = super::process::Launch {
                executable: &executable,
                workdir: &folder,
                output: &folder,
                port: 0,
                version: one_off.version,
                token: label,
                slot: None,
                notify: None,
                secrets: &secrets,
                rotation: Default::default(),
                listen: None,
                record,
                root: one_off.root,
                grace: crate::defaults::GRACE,
            };
            let passed = config.iter().map(|(name, _)| name.clone()).collect();
            super::process::one_off_in_container(
                image,
                &launch,
                &confinement,
                passed,
                one_off.command,
            )
        }
        None => {
            let mut command = tokio::process::Command::new(program);
            command.args(args);
            command
        }
    };
    confinement.give_environment(&mut command);
    confinement.install(&mut command, || Ok(()));
    command
        .current_dir(&folder)
        .envs(config)
        .env("ROLLGATE_SERVICE", one_off.service)
        .env("ROLLGATE_VERSION", one_off.version);
    Ok(Prepared {
        command,
        program: std::path::PathBuf::from(program),
        user,
        image: image.is_some(),
    })
}

/// Whatever the command left running goes with it: its tree, or (no tree on this host) its
/// session, which it leads.
async fn end_tree(tree: Option<&super::cgroup::Tree>, pid: i32) {
    if let Some(tree) = tree {
        tree.end().await;
    } else if pid > 0 {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// The exit status as a shell gives it: the code, or 128 + the signal that ended it.
fn code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(1)
}

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT, caught for the command (it leads its own session, so a
/// terminal's Ctrl-C reaches rollgate, not it).
struct PassedSignals {
    received: tokio::sync::mpsc::UnboundedReceiver<nix::sys::signal::Signal>,
    listeners: Vec<tokio::task::JoinHandle<()>>,
}

impl PassedSignals {
    fn listen() -> std::io::Result<PassedSignals> {
        use nix::sys::signal::Signal;
        use tokio::signal::unix::{signal, SignalKind};
        let kinds = [
            (SignalKind::interrupt(), Signal::SIGINT),
            (SignalKind::terminate(), Signal::SIGTERM),
            (SignalKind::hangup(), Signal::SIGHUP),
            (SignalKind::quit(), Signal::SIGQUIT),
        ];
        let (sender, received) = tokio::sync::mpsc::unbounded_channel();
        let mut listeners = Vec::new();
        for (kind, name) in kinds {
            let mut stream = signal(kind)?;
            let sender = sender.clone();
            listeners.push(tokio::spawn(async move {
                while stream.recv().await.is_some() {
                    if sender.send(name).is_err() {
                        break;
                    }
                }
            }));
        }
        Ok(PassedSignals {
            received,
            listeners,
        })
    }

    /// Waits for the command, sending each signal caught on to its process group (as SIGTERM,
    /// `as_stop`).
    async fn wait_passing(
        &mut self,
        child: &mut tokio::process::Child,
        pid: i32,
        as_stop: bool,
    ) -> std::io::Result<std::process::ExitStatus> {
        loop {
            tokio::select! {
                status = child.wait() => return status,
                Some(name) = self.received.recv() => {
                    let name = match as_stop {
                        true => nix::sys::signal::Signal::SIGTERM,
                        false => name,
                    };
                    if pid > 0 {
                        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), name);
                    }
                }
            }
        }
    }
}

impl Drop for PassedSignals {
    fn drop(&mut self) {
        for listener in &self.listeners {
            listener.abort();
        }
    }
}
