//! The keeper: one small process of rollgate's own beside every release process it starts
//! (issue 68). It is the release's parent — so it learns how the release ended (its exit status
//! or signal) the moment it ends — and it outlives the rollgate that started it, so a release
//! keeps being restarted after its deploy has exited, with no other command or daemon.
//!
//! Every way a release process is started goes through [`start`]: a deploy's or rollout's
//! candidate, a release brought back, `up` after a reboot, `start`, `restart`. The record of how
//! it is started (the launch record, `host::launch`) travels to the keeper whole; the keeper
//! spawns the release with [`super::process::spawn`] exactly as the deployer used to, and says
//! the release's pid back. The state names the *release* (its pid and start time), never the
//! keeper: stopping, probing and confining are as they were.
//!
//! What the keeper does when its release ends is the supervision layer's (`supervision::keep`):
//! a release the state names as live, while no run holds the root, is started again; any other
//! end (a candidate that failed its gate, a retired or stopped release, an end while a run holds
//! the root and so owns its processes) makes the keeper exit *as its release did* — the same
//! exit code, or the same signal — so the run that waits on a candidate sees its very end.
//!
//! Each running keeper holds an exclusive lock on a file of its own under `ROOT/.keepers/`
//! that names the release it keeps; [`kept`] lists those, so `up` and the commands after a run
//! adopt a live release whose keeper is gone (killed, or a release started by an older
//! rollgate) instead of leaving it unsupervised.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::identity::Identity;
use super::launch::LaunchRecord;
use super::output::Rotation;

pub use super::identity::{is_keeper, KEEP_COMMAND};
/// Where the keepers of a root say what they keep.
pub const KEEPERS_DIR: &str = ".keepers";
/// How long a starter waits for its keeper to say the release started (a confined start makes
/// a user and folders first).
const REPORT_WAIT: Duration = Duration::from_secs(120);

/// Everything a keeper needs to start its release: a `process::Launch`, owned, and what the
/// keeper is for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Spec {
    pub root: PathBuf,
    pub service: String,
    pub executable: PathBuf,
    pub workdir: PathBuf,
    pub output: PathBuf,
    pub port: u16,
    pub version: String,
    pub token: String,
    pub slot: Option<usize>,
    /// The notification socket's address and the watchdog interval (ms).
    pub notify: Option<(String, Option<u64>)>,
    pub secrets: PathBuf,
    pub rotation: Rotation,
    /// The held socket arrives as fd 3.
    pub listen: bool,
    pub record: LaunchRecord,
    pub grace_ms: u64,
    /// Adopt this running release instead of starting one (its keeper is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<Identity>,
    #[serde(default)]
    pub backoff: Backoff,
}

/// How the releases a keeper starts again back off, and when it gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    pub first_ms: u64,
    pub max_restarts: u32,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            first_ms: crate::defaults::UP_BACKOFF.as_millis() as u64,
            max_restarts: crate::defaults::UP_MAX_RESTARTS,
        }
    }
}

impl Spec {
    /// The service and the process kept, as `ps` shows the keeper: `shop web`, `shop web.2`
    /// (a replica), `shop worker.1` — read off its output file's name (`SERVICE[.TYPE].N.output`).
    fn shown_as(&self) -> [String; 2] {
        let file = self
            .output
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stem = file.strip_suffix(".output").unwrap_or(&file);
        let process = match stem.strip_prefix(&format!("{}.", self.service)) {
            Some(rest) if rest.chars().all(|c| c.is_ascii_digit()) => format!("web.{rest}"),
            Some(rest) => rest.to_string(),
            None => "web".to_string(),
        };
        [self.service.clone(), process]
    }

    pub fn of(launch: &super::process::Launch, service: &str) -> Spec {
        Spec {
            root: launch.root.to_path_buf(),
            service: service.to_string(),
            executable: launch.executable.to_path_buf(),
            workdir: launch.workdir.to_path_buf(),
            output: launch.output.to_path_buf(),
            port: launch.port,
            version: launch.version.to_string(),
            token: launch.token.to_string(),
            slot: launch.slot,
            notify: launch.notify.map(|(address, watchdog)| {
                (address.to_string(), watchdog.map(|w| w.as_millis() as u64))
            }),
            secrets: launch.secrets.to_path_buf(),
            rotation: launch.rotation,
            listen: launch.listen.is_some(),
            record: launch.record.clone(),
            grace_ms: launch.grace.as_millis() as u64,
            adopt: None,
            backoff: Backoff::default(),
        }
    }

    /// A keeper for `release`, running without one; what it starts again it reads from the
    /// state, as every restart does. `output` is the release's output file, which names the
    /// process the keeper shows as (an adopted worker's keeper showed as `web`).
    pub fn adopting(
        root: &Path,
        service: &str,
        release: Identity,
        record: &LaunchRecord,
        output: &Path,
        backoff: Backoff,
    ) -> Spec {
        Spec {
            root: root.to_path_buf(),
            service: service.to_string(),
            executable: PathBuf::new(),
            workdir: PathBuf::new(),
            output: output.to_path_buf(),
            port: 0,
            version: String::new(),
            token: String::new(),
            slot: None,
            notify: None,
            secrets: PathBuf::new(),
            rotation: Rotation::default(),
            listen: false,
            record: record.clone(),
            grace_ms: 0,
            adopt: Some(release),
            backoff,
        }
    }

    /// The launch, as the keeper gives it to `process::spawn`.
    pub fn launch(&self) -> super::process::Launch<'_> {
        super::process::Launch {
            executable: &self.executable,
            workdir: &self.workdir,
            output: &self.output,
            port: self.port,
            version: &self.version,
            token: &self.token,
            slot: self.slot,
            notify: self
                .notify
                .as_ref()
                .map(|(address, watchdog)| (address.as_str(), watchdog.map(Duration::from_millis))),
            secrets: &self.secrets,
            rotation: self.rotation,
            listen: self.listen.then_some(super::listen::FIRST_FD),
            record: &self.record,
            root: &self.root,
            grace: Duration::from_millis(self.grace_ms),
        }
    }
}

/// A release started through its keeper: the keeper (whose end is the release's end, for as
/// long as the release is not live) and the release itself.
pub struct Kept {
    pub keeper: tokio::process::Child,
    pub release: Identity,
}

impl Kept {
    /// Waits for the keeper, which ends as the release did unless it restarts it.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.keeper.wait().await
    }
}

/// Starts a release process through a keeper of its own and returns once it runs (or why it
/// could not start, in the words `process::spawn` gives).
pub fn start(
    launch: &super::process::Launch,
    service: &str,
    backoff: Backoff,
) -> std::io::Result<Kept> {
    let spec = Spec {
        backoff,
        ..Spec::of(launch, service)
    };
    let (child, report) = spawn_keeper(&spec, launch.listen)?;
    let mut said = String::new();
    let read = read_report(report, &mut said);
    let mut words = said.trim().splitn(3, ' ');
    match (read, words.next(), words.next(), words.next()) {
        (Ok(()), Some("started"), Some(pid), Some(start_time)) => {
            let release = Identity {
                pid: pid.parse().map_err(|_| bad_report(&said))?,
                start_time: start_time.parse().map_err(|_| bad_report(&said))?,
            };
            Ok(Kept {
                keeper: child,
                release,
            })
        }
        (Ok(()), Some("error"), ..) => Err(std::io::Error::other(
            said.trim()
                .strip_prefix("error ")
                .unwrap_or_default()
                .to_string(),
        )),
        (Err(e), ..) => Err(e),
        _ => Err(bad_report(&said)),
    }
}

/// Starts a keeper for a live release that runs without one (its keeper was killed, or an
/// older rollgate started it): it watches the release and restarts it as any keeper does.
pub fn adopt(spec: &Spec) -> std::io::Result<()> {
    // Not this command's to wait for: the runtime reaps it if it ends while this one runs.
    let (_keeper, report) = spawn_keeper(spec, None)?;
    let mut said = String::new();
    read_report(report, &mut said)?;
    match said.trim() {
        "adopted" => Ok(()),
        _ => Err(bad_report(&said)),
    }
}

fn bad_report(said: &str) -> std::io::Error {
    let said = super::output::printable(said.trim());
    match said.is_empty() {
        true => {
            std::io::Error::other("its keeper ended before it said whether the release started")
        }
        false => std::io::Error::other(format!("its keeper said something unexpected: {said}")),
    }
}

/// `rollgate keep` in its own session (a signal to the starter's group or terminal does not
/// reach it), in the root's folder, its spec on stdin, its one line of report on a pipe, the
/// held socket (if any) at fd 3.
fn spawn_keeper(
    spec: &Spec,
    listen: Option<std::os::fd::RawFd>,
) -> std::io::Result<(tokio::process::Child, OwnedFd)> {
    let (spec_read, spec_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (report_read, report_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // Shown by `ps` as what it keeps (`rollgate keep shop worker.1`), not `/proc/self/exe keep`.
    let args = std::iter::once(KEEP_COMMAND.to_string()).chain(spec.shown_as());
    let mut command = super::daemon::command(args, &spec.root, move || match listen {
        Some(fd) => super::listen::place_in_child(fd),
        None => Ok(()),
    });
    command
        .stdin(Stdio::from(spec_read))
        .stdout(Stdio::from(report_write))
        .stderr(Stdio::null());
    // The test suite's: a keeper killed after it started its release, before it said so.
    if super::files::fault("keeper-dies-before-report") {
        command.env(KEEPER_FAULT, "dies-before-report");
    }
    let child = command.spawn()?;
    let text = serde_json::to_vec(spec).map_err(std::io::Error::other)?;
    let mut spec_write = std::fs::File::from(spec_write);
    // A keeper that died at once closed its end: what it did not say is read below.
    let _ = spec_write.write_all(&text);
    drop(spec_write);
    Ok((child, report_read))
}

/// The variable that carries the test suite's fault into a keeper (see `start`).
pub const KEEPER_FAULT: &str = "ROLLGATE_KEEPER_FAULT";

/// Reads the keeper's one line, waiting at most [`REPORT_WAIT`] for it.
fn read_report(report: OwnedFd, said: &mut String) -> std::io::Result<()> {
    let mut file = std::fs::File::from(report);
    let deadline = std::time::Instant::now() + REPORT_WAIT;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut poll = [nix::poll::PollFd::new(
            std::os::fd::AsFd::as_fd(&file),
            nix::poll::PollFlags::POLLIN,
        )];
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        match nix::poll::poll(&mut poll, nix::poll::PollTimeout::from(ms)) {
            Ok(0) if left.is_zero() => {
                return Err(std::io::Error::other(format!(
                    "its keeper did not say within {} s whether the release started",
                    REPORT_WAIT.as_secs()
                )))
            }
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                bytes.extend_from_slice(&chunk[..n]);
                if bytes.contains(&b'\n') || bytes.len() > 64 * 1024 {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    *said = String::from_utf8_lossy(&bytes).into_owned();
    Ok(())
}

/// The keeper's side of the report: one line on its stdout, which is then closed (pointed at
/// /dev/null) so the starter reads to its end.
pub fn report(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 of two descriptors this process owns.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
}

/// A keeper's entry under `ROOT/.keepers/`: locked for as long as the keeper runs, naming the
/// release it keeps now, and the token of its standby while it has one (written before the
/// standby starts: a keeper gone leaves a standby the next pass retires).
pub struct Registration {
    file: nix::fcntl::Flock<std::fs::File>,
    release: Identity,
    standby: Option<String>,
}

impl Registration {
    /// Registers this process as the keeper of `release`.
    pub fn new(root: &Path, release: Identity) -> std::io::Result<Registration> {
        let dir = root.join(KEEPERS_DIR);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)?;
        let path = dir.join(std::process::id().to_string());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(&path)?;
        let file = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
            .map_err(|(_, e)| std::io::Error::from(e))?;
        let mut registration = Registration {
            file,
            release,
            standby: None,
        };
        registration.keeps(release)?;
        Ok(registration)
    }

    /// Says that the release it keeps is now `release` (started again). Written while the root
    /// is locked, as [`kept`] is read.
    pub fn keeps(&mut self, release: Identity) -> std::io::Result<()> {
        self.release = release;
        self.write(None)
    }

    /// Says, before it starts its release again, the token the new process will carry: a keeper
    /// killed between that start and its record leaves a process that [`kept`] names, so the
    /// next pass stops it instead of letting a second copy run.
    pub fn starting(&mut self, release: Identity, token: &str) -> std::io::Result<()> {
        self.release = release;
        self.write(Some(token))
    }

    /// Says the token of its standby (before it starts), or that it has none any more.
    pub fn standby(&mut self, token: Option<&str>) -> std::io::Result<()> {
        self.standby = token.map(str::to_string);
        self.write(None)
    }

    fn write(&mut self, starting: Option<&str>) -> std::io::Result<()> {
        use std::io::Seek;
        let mut text = format!("{} {}\n", self.release.pid, self.release.start_time);
        if let Some(token) = starting {
            text.push_str(&format!("starting {token}\n"));
        }
        if let Some(token) = &self.standby {
            text.push_str(&format!("standby {token}\n"));
        }
        self.file.set_len(0)?;
        self.file.rewind()?;
        self.file.write_all(text.as_bytes())?;
        Ok(())
    }
}

/// What the keepers' entries under a root say: the releases running keepers keep, and the
/// tokens of restarts that keepers which are gone began (a process may carry one).
#[derive(Debug, Default)]
pub struct Keepers {
    /// Each running keeper (its pid, from its entry's name) and the release it keeps.
    pub running: Vec<(i32, Identity)>,
    pub abandoned: Vec<String>,
    /// The tokens of standbys whose keepers are gone: the next pass retires them.
    pub abandoned_standbys: Vec<String>,
}

impl Keepers {
    /// The releases running keepers keep.
    pub fn releases(&self) -> Vec<Identity> {
        self.running.iter().map(|(_, release)| *release).collect()
    }

    /// The running keepers (their pids) that keep one of `releases`.
    pub fn keepers_of(&self, releases: &[Identity]) -> Vec<i32> {
        self.running
            .iter()
            .filter(|(_, release)| releases.contains(release))
            .map(|(keeper, _)| *keeper)
            .collect()
    }
}

/// A keeper's file locked (shared) if no keeper holds it — one killed a moment ago and still on
/// its way out is waited for rather than taken for a live one (found as `up`, run right after a
/// `kill -9` of the keepers, saw a standby still kept).
fn lock_unless_held(
    file: std::fs::File,
    path: &Path,
) -> Result<nix::fcntl::Flock<std::fs::File>, std::fs::File> {
    use nix::fcntl::{Flock, FlockArg};
    let keeper = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse::<i32>().ok());
    super::daemon::unless_held_by_a_live_one(keeper, file, |file| {
        Flock::lock(file, FlockArg::LockSharedNonblock).map_err(|(back, _)| back)
    })
}

/// The releases a running keeper keeps under `root`. With `tidy` (the root locked), the
/// entries of keepers that are gone are removed, and the restarts they had begun are returned.
pub fn kept(root: &Path, tidy: bool) -> Keepers {
    let mut kept = Keepers::default();
    let Ok(entries) = std::fs::read_dir(root.join(KEEPERS_DIR)) else {
        return kept;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(file) = std::fs::File::open(&path) else {
            continue;
        };
        match lock_unless_held(file, &path) {
            // Nobody holds it: its keeper is gone.
            Ok(mut file) => {
                if tidy {
                    let mut text = String::new();
                    let _ = file.read_to_string(&mut text);
                    let tokens = |prefix: &str| -> Vec<String> {
                        text.lines()
                            .filter_map(|l| l.strip_prefix(prefix))
                            .filter(|t| super::names::check_name("token", t).is_ok())
                            .map(str::to_string)
                            .collect()
                    };
                    kept.abandoned.extend(tokens("starting "));
                    kept.abandoned_standbys.extend(tokens("standby "));
                    let _ = std::fs::remove_file(&path);
                }
            }
            Err(mut file) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let keeper = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.parse::<i32>().ok());
                if let (Some(keeper), Some(release)) = (keeper, release_named(&text)) {
                    kept.running.push((keeper, release));
                }
            }
        }
    }
    kept
}

/// The release a keeper's entry names on its first line (`PID START_TIME`).
fn release_named(text: &str) -> Option<Identity> {
    let mut words = text.split_whitespace().map(|w| w.parse::<u64>());
    match (words.next(), words.next()) {
        (Some(Ok(pid)), Some(Ok(start_time))) => Some(Identity {
            pid: i32::try_from(pid).ok()?,
            start_time,
        }),
        _ => None,
    }
}

/// Asks the keepers `pids` to go (SIGTERM, through a pidfd opened on the keeper itself) and
/// waits, at most `within`, until they are gone: a keeper asked so lets its release be.
pub async fn ask_to_go(pids: &[i32], within: Duration) {
    let mut ends = Vec::new();
    for pid in pids {
        let Some(identity) = Identity::of(*pid) else {
            continue;
        };
        let Some(fd) = super::identity::pidfd(identity) else {
            continue;
        };
        // The pid is still a keeper's (the pidfd now pins that very process).
        if !is_keeper(&pid.to_string()) {
            continue;
        }
        // SAFETY: pidfd_send_signal takes a pidfd this process owns, a signal and no info.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                libc::SIGTERM,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        ends.push(fd);
    }
    let all_gone = async {
        for fd in &ends {
            let _ = fd.readable().await;
        }
    };
    let _ = tokio::time::timeout(within, all_gone).await;
}
