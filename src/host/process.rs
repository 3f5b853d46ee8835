//! Release processes: started in their own session, recognised by pid *and* start time, stopped
//! as a whole process group with SIGTERM and, after a grace period, SIGKILL.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

use super::identity::{stat, Identity};

/// What stopping this release means: its whole process group when it leads one (every
/// release rollgate starts does), the process alone otherwise, nothing if it is gone.
///
/// The group outlives its leader: a release that exited may have left workers (a backgrounded
/// `sleep` holding the port). The kernel does not hand out a pid that is still some group's
/// id, so while any member lives, the number names our group; and if the number now names a
/// process with another start time, our group was empty when it was reused.
fn stop_target(who: &Identity) -> StopTarget {
    // 0 and below name our own group or every process to kill(2): never a release.
    if who.pid <= 1 {
        return StopTarget::Nothing;
    }
    match stat(who.pid) {
        Some(s) if s.start_time != who.start_time => StopTarget::Nothing,
        Some(s) if s.process_group == who.pid => StopTarget::Group(who.pid),
        Some(_) => StopTarget::Process(*who),
        None => StopTarget::Group(who.pid),
    }
}

#[derive(Debug, Clone, Copy)]
enum StopTarget {
    Group(i32),
    Process(Identity),
    Nothing,
}

impl StopTarget {
    /// Anything left to stop (zombies are gone already: only their parent's wait is missing).
    fn remains(&self) -> bool {
        match self {
            StopTarget::Group(pgid) => group_has_live_member(*pgid),
            StopTarget::Process(who) => who.is_running(),
            StopTarget::Nothing => false,
        }
    }

    fn send(&self, signal: Signal) {
        let _ = match self {
            StopTarget::Group(pgid) => killpg(Pid::from_raw(*pgid), signal),
            StopTarget::Process(who) => kill(Pid::from_raw(who.pid), signal),
            StopTarget::Nothing => Ok(()),
        };
    }
}

/// Whether any live (non-zombie) process belongs to process group `pgid`.
fn group_has_live_member(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(stat)
        .any(|s| s.process_group == pgid && s.state != 'Z' && s.state != 'X')
}

/// How a stop went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// It was no longer running (or the pid now belongs to another process).
    AlreadyGone,
    /// It exited within the grace period after SIGTERM.
    Terminated,
    /// It ignored SIGTERM and was killed with SIGKILL.
    Killed,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stopped::AlreadyGone => "was already gone",
            Stopped::Terminated => "stopped (SIGTERM)",
            Stopped::Killed => "killed (ignored SIGTERM for the grace period)",
        })
    }
}

/// How often a stop looks whether anything is left.
const STOP_POLL: Duration = Duration::from_millis(10);
/// How long after SIGKILL a stop waits to see the group gone.
const AFTER_KILL: Duration = Duration::from_secs(2);

/// Stops the release `who` led, with every process left in its group: SIGTERM to the group,
/// wait up to `grace` for all of it to exit, then SIGKILL to whatever remains. Never signals a
/// pid whose start time differs (it was reused).
pub async fn stop_group(who: Identity, grace: Duration) -> Stopped {
    if let Some(tree) = super::cgroup::of(&who) {
        return stop_tree(&tree, &who, grace).await;
    }
    let target = stop_target(&who);
    if !target.remains() {
        return Stopped::AlreadyGone;
    }
    target.send(Signal::SIGTERM);
    if wait_until_gone(target, grace.min(crate::host::MAX_WAIT)).await {
        return Stopped::Terminated;
    }
    target.send(Signal::SIGKILL);
    wait_until_gone(target, AFTER_KILL).await;
    Stopped::Killed
}

/// Stops a release's whole tree: SIGTERM to every process in it, up to `grace` for all of them
/// to exit, then `cgroup.kill`; the empty tree is removed. A daemon that left the release's
/// process group goes with it. A container's supervisor killed before it removed its container
/// (the engine was slow to stop it): the container, dead with the tree, is removed here.
async fn stop_tree(tree: &super::cgroup::Tree, who: &Identity, grace: Duration) -> Stopped {
    let gone = |limit: Duration| wait_until_empty(limit, || tree.is_populated());
    if !tree.is_populated() {
        tree.remove();
        return Stopped::AlreadyGone;
    }
    tree.signal(Signal::SIGTERM);
    if gone(grace.min(crate::host::MAX_WAIT)).await {
        tree.remove();
        return Stopped::Terminated;
    }
    let holds_a_container = tree.has_inner();
    tree.kill();
    gone(AFTER_KILL).await;
    if holds_a_container {
        super::container::remove_supervised_by(who).await;
    }
    tree.remove();
    Stopped::Killed
}

/// True once nothing of `target` remains, false if something still does after `limit`.
async fn wait_until_gone(target: StopTarget, limit: Duration) -> bool {
    wait_until_empty(limit, || target.remains()).await
}

/// True once `remains` says nothing is left, false if something still is after `limit`.
async fn wait_until_empty(limit: Duration, remains: impl Fn() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if !remains() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(STOP_POLL).await;
    }
}

/// How a release's process ended, in words: the kernel's OOM kill said as what it was ("killed:
/// out of memory at its 512 MiB limit"), not as the signal it came as.
pub fn ended_words(
    status: std::io::Result<std::process::ExitStatus>,
    who: Option<&Identity>,
) -> String {
    if let Some(limit_mb) = who.and_then(super::cgroup::out_of_memory) {
        return format!("killed: out of memory at its {limit_mb} MiB limit");
    }
    match status {
        Ok(status) => status.to_string(),
        Err(e) => format!("an unknown status ({e})"),
    }
}

/// What a candidate is started with.
pub struct Launch<'a> {
    pub executable: &'a Path,
    pub workdir: &'a Path,
    pub output: &'a Path,
    pub port: u16,
    pub version: &'a str,
    pub token: &'a str,
    /// A rollout's replica, given as `ROLLGATE_SLOT` (a single deploy has none).
    pub slot: Option<usize>,
    /// Readiness by notification: the socket's address and the watchdog interval, if any.
    pub notify: Option<(&'a str, Option<Duration>)>,
    /// The root's secrets folder, where the release's `secrets` map finds its values.
    pub secrets: &'a Path,
    /// How `output` is bounded.
    pub rotation: super::output::Rotation,
    /// The service's held listening socket, handed over as fd 3 with `LISTEN_FDS` (see
    /// `host::listen`).
    pub listen: Option<std::os::fd::RawFd>,
    /// How it is started, as decided for it and kept with it: confined or not, its limits,
    /// its user, the folders it may write (its probe and held socket are the caller's).
    pub record: &'a super::launch::LaunchRecord,
    /// The service's root: where its user is recorded and its own folders are.
    pub root: &'a Path,
    /// How long a stop waits after SIGTERM (a container release's supervisor stops its
    /// container within it).
    pub grace: Duration,
}

/// Starts the candidate in its own session (so its process group can be signalled as one and it
/// outlives rollgate once promoted), stdout and stderr written to `output` by the pump
/// ([`super::output`]: rotated by size; the previous run's output moves to `output.1`, so the
/// log quotes this run only).
pub fn spawn(launch: &Launch) -> std::io::Result<tokio::process::Child> {
    // The release's own configuration first (its env file, then its secrets' values): a
    // release that cannot be configured does not start, and the reason names file and line.
    let config = super::config::Config::of_release(launch.workdir)
        .and_then(|config| config.resolve(launch.secrets))
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.0))?;
    // A container release runs through its supervisor, which holds the container's limits
    // and user for the engine (see `container`).
    let runner = launch.record.runner(launch.workdir);
    let image = runner.image().map(str::to_string);
    if image.is_some() && launch.listen.is_some() {
        return Err(std::io::Error::other(
            "a held socket (policy `listen`) reaches a process release only; a container release listens on $PORT itself",
        ));
    }
    // Who it runs as, its folders, its filesystem and its cgroup (see `confine`).
    let release_dirs: Vec<&Path> = std::iter::once(launch.workdir)
        .chain(launch.executable.parent())
        .collect();
    let confinement = super::confine::Confinement::for_process(
        launch.record.isolation(),
        &runner,
        &super::confine::Placement {
            root: launch.root,
            release: &release_dirs,
            readable: &[],
            label: launch.token,
            ports: &[launch.port],
        },
    )?;
    let user = confinement.user.clone();
    let output = std::fs::File::from(super::output::start(launch.output, launch.rotation)?);
    if let Some(user) = &user {
        std::os::unix::fs::fchown(&output, Some(user.uid), Some(user.gid))?;
    }
    // With a held socket the release starts through `rollgate listen-exec`, which names its own
    // pid in LISTEN_PID and execs the release in place (same pid, same start time).
    let passed: Vec<String> = config.iter().map(|(name, _)| name.clone()).collect();
    // What it runs: its Procfile's line for it (`/bin/sh -c …`), else its executable.
    let runs: Vec<&std::ffi::OsStr> = match &launch.record.command {
        Some(words) if !words.is_empty() => words.iter().map(std::ffi::OsStr::new).collect(),
        _ => vec![launch.executable.as_os_str()],
    };
    let mut command = match (&image, launch.listen) {
        (Some(image), _) => supervisor(image, launch, &confinement, passed),
        (None, Some(_)) => {
            let mut trampoline = tokio::process::Command::new("/proc/self/exe");
            trampoline
                .args(["listen-exec", "--name", super::listen::FD_NAME, "--"])
                .args(&runs);
            trampoline
        }
        (None, None) => {
            let mut command = tokio::process::Command::new(runs[0]);
            command.args(&runs[1..]);
            command
        }
    };
    confinement.give_environment(&mut command);
    command.envs(config);
    command
        .current_dir(launch.workdir)
        .env("PORT", launch.port.to_string())
        .env("ROLLGATE_VERSION", launch.version)
        .env("ROLLGATE_DEPLOY_TOKEN", launch.token);
    if let Some(slot) = launch.slot {
        command.env("ROLLGATE_SLOT", slot.to_string());
    }
    if let Some((address, watchdog)) = launch.notify {
        command.env(super::notify::SOCKET_VARIABLE, address);
        if let Some(watchdog) = watchdog {
            command.env(
                super::notify::WATCHDOG_VARIABLE,
                watchdog.as_micros().to_string(),
            );
        }
    }
    command
        .stdin(Stdio::null())
        .stdout(output.try_clone()?)
        .stderr(output);
    let listen = launch.listen;
    // A container supervisor's verdict file, open for it (see `cgroup::verdict_file`).
    let verdict = image
        .as_ref()
        .and_then(|_| super::cgroup::verdict_file(launch.token));
    let verdict_fd = verdict
        .as_ref()
        .map(|file| std::os::fd::AsRawFd::as_raw_fd(file));
    if let Some(fd) = verdict_fd {
        command.arg("--verdict-fd").arg(fd.to_string());
    }
    // In the child, last: the held socket at fd 3.
    confinement.install(&mut command, move || {
        if let Some(fd) = listen {
            super::listen::place_in_child(fd)?;
        }
        if let Some(fd) = verdict_fd {
            let flags = nix::fcntl::FdFlag::empty();
            nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(flags))
                .map_err(std::io::Error::from)?;
        }
        Ok(())
    });
    command.spawn().map_err(|e| {
        super::cgroup::remove_empty(launch.token);
        super::confine::Confinement::explain(user.as_ref(), launch.executable, e)
    })
}

/// A one-off command inside a container of the image (`rollgate run` of an image release):
/// its supervisor as a release's, given the command to run instead of the image's own.
pub(super) fn one_off_in_container(
    image: &str,
    launch: &Launch,
    confinement: &super::confine::Confinement,
    config: Vec<String>,
    run: &[String],
) -> tokio::process::Command {
    let mut command = supervisor(image, launch, confinement, config);
    command.arg("--").args(run);
    command
}

/// The supervisor of a container release (`rollgate container-run`): the image, the run's
/// labels, the names of the variables the container gets (their values travel in the
/// supervisor's environment, never on a command line), the service's user and limits, its
/// folders mounted at the same paths.
fn supervisor(
    image: &str,
    launch: &Launch,
    confinement: &super::confine::Confinement,
    config: Vec<String>,
) -> tokio::process::Command {
    let service = launch
        .executable
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mut command = tokio::process::Command::new("/proc/self/exe");
    command.args(["container-run", "--image", image]);
    let token = super::cgroup::label_of(launch.token);
    command.args([
        "--name",
        &format!("rollgate-{service}-{}-{token}", launch.version),
    ]);
    let root = launch.root.display().to_string();
    let release = launch.workdir.display().to_string();
    let port = launch.port.to_string();
    for (key, value) in [
        ("service", service.as_str()),
        ("version", launch.version),
        ("root", root.as_str()),
        ("token", launch.token),
        ("release", release.as_str()),
        ("port", port.as_str()),
    ] {
        command.arg("--label").arg(format!("{key}={value}"));
    }
    let fixed = [
        "PORT",
        "ROLLGATE_VERSION",
        "ROLLGATE_DEPLOY_TOKEN",
        "ROLLGATE_SLOT",
        "STATE_DIRECTORY",
        "HOME",
        "TMPDIR",
    ];
    for name in fixed.iter().map(|n| n.to_string()).chain(config) {
        command.arg("--pass").arg(name);
    }
    if let Some(user) = &confinement.user {
        command
            .arg("--user")
            .arg(format!("{}:{}", user.uid, user.gid));
    }
    let limits = &launch.record.limits;
    for (flag, value) in [
        ("--memory-mb", limits.memory_mb),
        ("--pids", limits.pids),
        ("--cpu-pct", limits.cpu_pct),
        ("--nofile", limits.nofile),
    ] {
        if let Some(value) = value {
            command.arg(flag).arg(value.to_string());
        }
    }
    let folders = [&confinement.folders.data, &confinement.folders.tmp];
    for folder in folders.into_iter().chain(&launch.record.writable) {
        command.arg("--bind").arg(folder);
    }
    if launch.record.unconfined {
        command.arg("--unconfined");
    }
    // Within the grace rollgate gives it, with a moment left for the supervisor's own exit.
    let grace = launch.grace.saturating_sub(Duration::from_millis(500));
    command.arg("--grace-ms").arg(grace.as_millis().to_string());
    command
}

/// The release processes a run with this token started: the candidate of a deployer that died
/// between spawning it and recording its pid. Found by the cgroup trees labelled with the
/// token where the host gives trees (a tree whose leader is gone still names it, and stopping
/// it ends what is left); by `ROLLGATE_DEPLOY_TOKEN=token` in `/proc/*/environ` where not.
pub fn find_by_token(token: &str) -> Vec<Identity> {
    if super::cgroup::base().is_some() {
        return super::cgroup::started_by(token)
            .into_iter()
            .map(|(_, who)| who)
            .collect();
    }
    let needle = format!("ROLLGATE_DEPLOY_TOKEN={token}");
    find_by_environment(|var| var == needle.as_bytes())
}

/// Every release process a run whose token starts with `prefix` started (all the replicas a
/// rollout started), with its token; by cgroup where the host gives trees, as
/// [`find_by_token`].
pub fn find_by_token_prefix(prefix: &str) -> Vec<(Identity, String)> {
    if super::cgroup::base().is_some() {
        return super::cgroup::started_by_prefix(prefix)
            .into_iter()
            .map(|(_, who, token)| (who, token))
            .collect();
    }
    let needle = format!("ROLLGATE_DEPLOY_TOKEN={prefix}");
    let found = find_by_environment(|var| var.starts_with(needle.as_bytes()));
    found
        .into_iter()
        .filter_map(|who| {
            let env = std::fs::read(format!("/proc/{}/environ", who.pid)).ok()?;
            let token = env
                .split(|b| *b == 0)
                .find_map(|var| var.strip_prefix(b"ROLLGATE_DEPLOY_TOKEN=".as_slice()))?;
            Some((who, String::from_utf8_lossy(token).into_owned()))
        })
        .collect()
}

fn find_by_environment(matches: impl Fn(&[u8]) -> bool) -> Vec<Identity> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(&matches))
                .unwrap_or(false)
        })
        .filter_map(Identity::of)
        .collect()
}
