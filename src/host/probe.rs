//! Readiness probes, bounded by a timeout so a probe that hangs never stretches the deadline.
//! Three kinds, from the policy's `probe` (today's `GET /readyz` = 200 when it says nothing):
//! an HTTP request (path, Host header, a status range), a TCP connect, or a command run in the
//! release folder (exit 0 = ready), or the release's own `READY=1` on a notification socket
//! (`host::notify`), optionally confirmed by an http or tcp probe. A release is ready after
//! `success_threshold` passes in a row.

use crate::defaults;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

use super::launch::Runner;
use super::notify::Notices;
use crate::policy::ProbePolicy;
use tokio::sync::watch;

use super::fault::Fault;

/// How readiness is proven. Persisted in a rollout's settings, so a resumed rollout probes as
/// the one that started it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    pub target: Target,
    pub timeout_ms: u64,
    pub success_threshold: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Target {
    Http {
        path: String,
        host: Option<String>,
        status_min: u16,
        status_max: u16,
    },
    Tcp,
    /// The program and its arguments, run in the release folder with `PORT` set.
    Exec {
        command: Vec<String>,
    },
    /// A process that serves nothing (a worker, a clock: issue 69) is ready while it runs; its
    /// gate's hold (`min_ready_ms`) is what proves it stays up.
    Up,
    /// The release says `READY=1` on its notification socket (see `host::notify`); then, if
    /// `confirm` is set, that probe must pass too.
    Notify {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        confirm: Option<Box<Target>>,
        /// Once ready, the release must send `WATCHDOG=1` at least this often.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        watchdog_ms: Option<u64>,
        /// How far `EXTEND_TIMEOUT_USEC=` may push the gate's deadline (0: not at all).
        #[serde(default)]
        extend_max_ms: u64,
    },
}

impl Spec {
    /// The spec, unless it is the default one (which records leave out).
    pub fn unless_default(spec: &Spec) -> Option<Spec> {
        (*spec != Spec::default()).then(|| spec.clone())
    }
}

impl Default for Spec {
    fn default() -> Spec {
        Spec {
            target: Target::Http {
                path: defaults::PROBE_PATH.into(),
                host: None,
                status_min: defaults::PROBE_STATUS,
                status_max: defaults::PROBE_STATUS,
            },
            timeout_ms: defaults::PROBE_TIMEOUT.as_millis() as u64,
            success_threshold: 1,
        }
    }
}

impl Spec {
    /// The policy's probe, checked again here: a `.ncl` policy need not apply the bundled
    /// contract, so the deployer keeps the contract's bounds itself. Errors name the field.
    pub fn from_policy(policy: &ProbePolicy) -> Result<Spec, Fault> {
        Spec::resolved(policy).map_err(|why| Fault::setting("probe", why))
    }

    // Long on purpose: one match over the probe kinds, each kind with the fields it takes and
    // the bounds the contract gives them, so a field is checked where its kind is.
    fn resolved(policy: &ProbePolicy) -> Result<Spec, String> {
        let kind = policy.kind.as_deref().unwrap_or("http");
        let stray = |field: &str, present: bool| {
            if present {
                Err(format!("probe.{field} is not a field of a {kind} probe"))
            } else {
                Ok(())
            }
        };
        let target = match kind {
            "http" => {
                stray("command", policy.command.is_some())?;
                notify_fields_stray(&stray, policy)?;
                http_target(policy)?
            }
            "tcp" | "exec" => {
                http_fields_stray(&stray, policy)?;
                notify_fields_stray(&stray, policy)?;
                if kind == "tcp" {
                    stray("command", policy.command.is_some())?;
                    Target::Tcp
                } else {
                    match &policy.command {
                        Some(words) if !words.is_empty() && words.iter().all(|w| !w.is_empty()) => {
                            Target::Exec {
                                command: words.clone(),
                            }
                        }
                        _ => {
                            return Err("probe.command is required for an exec probe: a non-empty list of non-empty strings, the program then its arguments".into())
                        }
                    }
                }
            }
            "notify" => {
                stray("command", policy.command.is_some())?;
                let confirm = match policy.confirm.as_deref() {
                    None => None,
                    Some("http") => Some(Box::new(http_target(policy)?)),
                    Some("tcp") => Some(Box::new(Target::Tcp)),
                    Some(other) => {
                        return Err(format!(
                            "probe.confirm is {other:?}; allowed are http and tcp (a probe that must also pass after READY=1)"
                        ))
                    }
                };
                if policy.confirm.as_deref() != Some("http") {
                    http_fields_stray(
                        &|field: &str, present: bool| {
                            if present {
                                Err(format!("probe.{field} is a field of an http confirmation (confirm = 'http)"))
                            } else {
                                Ok(())
                            }
                        },
                        policy,
                    )?;
                }
                let watchdog_ms = match policy.watchdog_ms {
                    Some(ms)
                        if !(defaults::WATCHDOG_MIN_MS..=defaults::WATCHDOG_MAX_MS)
                            .contains(&ms) =>
                    {
                        return Err(format!(
                            "probe.watchdog_ms is {ms}; it must be an integer from {} to {}",
                            defaults::WATCHDOG_MIN_MS,
                            defaults::WATCHDOG_MAX_MS
                        ))
                    }
                    ms => ms,
                };
                let extend_max_ms = policy.extend_max_ms.unwrap_or(0);
                if extend_max_ms > defaults::EXTEND_MAX_MS {
                    return Err(format!(
                        "probe.extend_max_ms is {extend_max_ms}; it must be an integer from 0 to {}",
                        defaults::EXTEND_MAX_MS
                    ));
                }
                Target::Notify {
                    confirm,
                    watchdog_ms,
                    extend_max_ms,
                }
            }
            other => {
                return Err(format!(
                    "probe.kind is {other:?}; allowed are http, tcp, exec and notify"
                ))
            }
        };
        let timeout_ms = policy
            .timeout_ms
            .unwrap_or(defaults::PROBE_TIMEOUT.as_millis() as u64);
        if !(10..=60_000).contains(&timeout_ms) {
            return Err(format!(
                "probe.timeout_ms is {timeout_ms}; it must be an integer from 10 to 60000"
            ));
        }
        let success_threshold = policy.success_threshold.unwrap_or(1);
        if !(1..=100).contains(&success_threshold) {
            return Err(format!(
                "probe.success_threshold is {success_threshold}; it must be an integer from 1 to 100"
            ));
        }
        Ok(Spec {
            target,
            timeout_ms,
            success_threshold: success_threshold as u32,
        })
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Whether one probe's result counts as ready.
    pub fn passes(&self, probe: &Probe) -> bool {
        target_passes(&self.target, probe)
    }

    /// A notify probe's watchdog, when the policy sets one.
    pub fn watchdog(&self) -> Option<Duration> {
        match &self.target {
            Target::Notify {
                watchdog_ms: Some(ms),
                ..
            } => Some(Duration::from_millis(*ms)),
            _ => None,
        }
    }

    /// How far a release may extend its gate's deadline (`EXTEND_TIMEOUT_USEC=`).
    pub fn extend_max(&self) -> Duration {
        match &self.target {
            Target::Notify { extend_max_ms, .. } => Duration::from_millis(*extend_max_ms),
            _ => Duration::ZERO,
        }
    }

    pub fn is_notify(&self) -> bool {
        matches!(self.target, Target::Notify { .. })
    }

    /// The probe in a few words, for the log and a dry run.
    pub fn describe(&self) -> String {
        // Nothing is polled: the timeout and the threshold do not apply.
        if let Target::Notify { confirm: None, .. } = &self.target {
            return describe(&self.target);
        }
        let times = match self.success_threshold {
            1 => String::new(),
            n => format!(", {n} in a row"),
        };
        format!(
            "{}{times}, timeout {} ms",
            describe(&self.target),
            self.timeout_ms
        )
    }
}

fn target_passes(target: &Target, probe: &Probe) -> bool {
    match (target, probe) {
        (
            Target::Http {
                status_min,
                status_max,
                ..
            },
            Probe::Status(code),
        ) => (*status_min..=*status_max).contains(code),
        (Target::Tcp, Probe::Connected) => true,
        (Target::Exec { .. }, Probe::Command(Some(0))) => true,
        (Target::Up, Probe::Running) => true,
        (Target::Notify { confirm: None, .. }, Probe::Notified) => true,
        (
            Target::Notify {
                confirm: Some(confirm),
                ..
            },
            probe,
        ) => target_passes(confirm, probe),
        _ => false,
    }
}

fn describe(target: &Target) -> String {
    match target {
        Target::Http {
            path,
            host,
            status_min,
            status_max,
        } => {
            let status = if status_min == status_max {
                status_min.to_string()
            } else {
                format!("{status_min}-{status_max}")
            };
            match host {
                Some(host) => format!("GET {path} (Host {host}) = {status}"),
                None => format!("GET {path} = {status}"),
            }
        }
        Target::Tcp => "TCP connect".into(),
        Target::Up => "stays up".into(),
        Target::Exec { command } => format!("exec {} = exit 0", command.join(" ")),
        Target::Notify {
            confirm,
            watchdog_ms,
            extend_max_ms: _,
        } => {
            let mut words = "READY=1 on NOTIFY_SOCKET".to_string();
            if let Some(confirm) = confirm {
                words.push_str(&format!(", then {}", describe(confirm)));
            }
            if let Some(ms) = watchdog_ms {
                words.push_str(&format!(", WATCHDOG=1 every {ms} ms"));
            }
            words
        }
    }
}

/// The `GET` a policy's http fields describe (an http probe, or a notify probe's confirmation).
fn http_target(policy: &ProbePolicy) -> Result<Target, String> {
    let path = policy
        .path
        .clone()
        .unwrap_or_else(|| defaults::PROBE_PATH.into());
    if !path.starts_with('/') || path.len() > 1024 || path.chars().any(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "probe.path is {path:?}; it must be a path from / of printable characters without spaces"
        ));
    }
    if let Some(host) = &policy.host {
        let ok = !host.is_empty()
            && host.len() <= 259
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
        if !ok {
            return Err(format!("probe.host is {host:?}; it must be a host name"));
        }
    }
    let status_min = status(
        "probe.status_min",
        policy.status_min,
        defaults::PROBE_STATUS,
    )?;
    let status_max = status("probe.status_max", policy.status_max, status_min)?;
    if status_min > status_max {
        return Err(format!(
            "probe.status_min ({status_min}) must not be above probe.status_max ({status_max})"
        ));
    }
    Ok(Target::Http {
        path,
        host: policy.host.clone(),
        status_min,
        status_max,
    })
}

type Stray<'a> = &'a dyn Fn(&str, bool) -> Result<(), String>;

fn http_fields_stray(stray: Stray, policy: &ProbePolicy) -> Result<(), String> {
    stray("path", policy.path.is_some())?;
    stray("host", policy.host.is_some())?;
    stray("status_min", policy.status_min.is_some())?;
    stray("status_max", policy.status_max.is_some())
}

fn notify_fields_stray(stray: Stray, policy: &ProbePolicy) -> Result<(), String> {
    stray("confirm", policy.confirm.is_some())?;
    stray("watchdog_ms", policy.watchdog_ms.is_some())?;
    stray("extend_max_ms", policy.extend_max_ms.is_some())
}

fn status(field: &str, value: Option<u64>, default: u16) -> Result<u16, String> {
    match value {
        None => Ok(default),
        Some(v) if (100..=599).contains(&v) => Ok(v as u16),
        Some(v) => Err(format!(
            "{field} is {v}; it must be an integer from 100 to 599"
        )),
    }
}

/// One release to probe: where it listens, the folder an exec probe runs in, and for a notify
/// probe what the release has said (None where nobody reads its socket).
#[derive(Debug, Clone)]
pub struct Subject {
    pub spec: Spec,
    pub port: u16,
    pub workdir: PathBuf,
    pub notices: Option<watch::Receiver<Notices>>,
    /// The service's root and the process's launch record: an exec probe of an image release
    /// runs inside its container; of any other, as the release's own processes run (its user,
    /// its confinement, a clean environment) — never as root, since the program is the
    /// release's.
    pub root: PathBuf,
    pub launch: super::launch::LaunchRecord,
}

impl Subject {
    /// One probe, given at most `limit` (and never more than the probe's own timeout).
    pub async fn probe(&self, limit: Duration) -> Probe {
        self.probe_target(&self.spec.target, limit).await
    }

    /// Whether its probe connects to the release's port (HTTP or TCP, or a notify probe's
    /// confirmation by either): what answers there must then be the release's own.
    pub fn probes_its_port(&self) -> bool {
        match &self.spec.target {
            Target::Http { .. } | Target::Tcp => true,
            Target::Notify {
                confirm: Some(confirm),
                ..
            } => matches!(**confirm, Target::Http { .. } | Target::Tcp),
            _ => false,
        }
    }

    /// Whether, as things stand, a poll would tell anything: a notify probe is not polled
    /// before `READY=1` (the notification wakes the gate), nor after it unless it confirms.
    pub fn polls(&self) -> bool {
        match &self.spec.target {
            Target::Notify { confirm, .. } => {
                confirm.is_some()
                    && self
                        .notices
                        .as_ref()
                        .is_none_or(|n| n.borrow().ready_at.is_some())
            }
            _ => true,
        }
    }

    async fn probe_target(&self, target: &Target, limit: Duration) -> Probe {
        let timeout = limit.min(self.spec.timeout());
        match target {
            Target::Http { path, host, .. } => {
                let host = host
                    .clone()
                    .unwrap_or_else(|| format!("127.0.0.1:{}", self.port));
                bounded(timeout, http(self.port, path, &host)).await
            }
            Target::Tcp => bounded(timeout, tcp(self.port)).await,
            // Whether it still runs is the gate's own watch (its exit ends the gate).
            Target::Up => Probe::Running,
            Target::Exec { command } if self.launch.runner(&self.workdir) != Runner::Host => {
                exec_inside(command, &self.workdir, self.port, timeout).await
            }
            Target::Exec { command } => self.exec(command, timeout).await,
            Target::Notify {
                confirm,
                watchdog_ms,
                ..
            } => {
                let said = match &self.notices {
                    Some(notices) => notices.borrow().clone(),
                    // Nobody here reads its socket: only the confirmation can be asked.
                    None => {
                        return match confirm {
                            Some(confirm) => Box::pin(self.probe_target(confirm, limit)).await,
                            None => Probe::Unwatched,
                        }
                    }
                };
                if let Some(errno) = said.errno {
                    return Probe::Reported(errno);
                }
                if said.watchdog_triggered {
                    return Probe::WatchdogTriggered;
                }
                if said.ready_at.is_none() {
                    return Probe::NotYet {
                        status: said.status,
                        ignored: said.ignored,
                    };
                }
                let watchdog = watchdog_ms.map(Duration::from_millis);
                if let Some(since) = watchdog.and_then(|w| said.watchdog_missed(w)) {
                    return Probe::WatchdogMissed(since);
                }
                match confirm {
                    Some(confirm) => Box::pin(self.probe_target(confirm, limit)).await,
                    None => Probe::Notified,
                }
            }
        }
    }

    /// One probe within the probe's timeout: whether it passes, and what it saw.
    pub async fn check(&self) -> (bool, Probe) {
        let probe = self.probe(self.spec.timeout()).await;
        (self.spec.passes(&probe), probe)
    }
}

async fn bounded(timeout: Duration, probe: impl std::future::Future<Output = Probe>) -> Probe {
    match tokio::time::timeout(timeout, probe).await {
        Ok(result) => result,
        Err(_) => Probe::TimedOut(timeout),
    }
}

/// `GET /readyz` as today's gate sends it (status, the demo and the old-release check use it).
pub async fn readyz(port: u16, timeout: Duration) -> Probe {
    bounded(
        timeout,
        http(port, defaults::PROBE_PATH, &format!("127.0.0.1:{port}")),
    )
    .await
}

async fn connect(port: u16) -> Result<TcpStream, Probe> {
    TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => Probe::Refused,
            _ => Probe::Failed(format!("connect: {e}")),
        })
}

async fn tcp(port: u16) -> Probe {
    match connect(port).await {
        Ok(_) => Probe::Connected,
        Err(probe) => probe,
    }
}

async fn http(port: u16, path: &str, host: &str) -> Probe {
    let stream = match connect(port).await {
        Ok(s) => s,
        Err(probe) => return probe,
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => return Probe::Failed(format!("handshake: {e}")),
        };
    let driver = tokio::spawn(connection);
    let request = match hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::USER_AGENT, "rollgate")
        .body(Empty::<Bytes>::new())
    {
        Ok(request) => request,
        Err(e) => return Probe::Failed(format!("request {path}: {e}")),
    };
    let result = match sender.send_request(request).await {
        Ok(response) => Probe::Status(response.status().as_u16()),
        Err(e) => Probe::Failed(format!("request: {e}")),
    };
    driver.abort();
    result
}

impl Subject {
    /// An exec probe of a process release: the release's program, so it runs as the release's
    /// own processes do (its user, its filesystem rules, a cgroup tree, a clean environment
    /// with `PORT`), never with rollgate's privileges. At the timeout its session is killed;
    /// whatever it leaves running ends with its tree.
    async fn exec(&self, command: &[String], timeout: Duration) -> Probe {
        let Some((program, args)) = command.split_first() else {
            return Probe::Failed("empty probe command".into());
        };
        // A relative program names a file in the release folder, as the release's own path does.
        let program = if program.contains('/') && !program.starts_with('/') {
            self.workdir.join(program)
        } else {
            PathBuf::from(program)
        };
        // On the host (an image release's exec probe runs inside its container instead).
        let confinement = match super::confine::Confinement::for_process(
            self.launch.isolation(),
            &super::launch::Runner::Host,
            &super::confine::Placement {
                root: &self.root,
                release: &[self.workdir.as_path()],
                readable: &[],
                label: "probe",
                ports: &[],
            },
        ) {
            Ok(confinement) => confinement,
            Err(e) => return Probe::Failed(format!("cannot confine {}: {e}", program.display())),
        };
        let user = confinement.user.clone();
        let mut command = tokio::process::Command::new(&program);
        confinement.give_environment(&mut command);
        confinement.install(&mut command, || Ok(()));
        let spawned = command
            .args(args)
            .current_dir(&self.workdir)
            .env("PORT", self.port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let e = super::confine::Confinement::explain(user.as_ref(), &program, e);
                return Probe::Failed(format!("cannot run {}: {e}", program.display()));
            }
        };
        let pid = child.id().map_or(0, |pid| pid as i32);
        let tree = super::identity::Identity::of(pid).and_then(|who| super::cgroup::of(&who));
        // Dropped first (declared last): the session it leads is killed while the leader is
        // still ours, unreaped, so the number cannot name anyone else's group.
        let mut group = GroupKiller(Some(pid));
        let probe = match tokio::time::timeout(timeout, child.wait()).await {
            Ok(Ok(status)) => Probe::Command(status.code()),
            Ok(Err(e)) => Probe::Failed(format!("waiting for {}: {e}", program.display())),
            Err(_) => Probe::TimedOut(timeout),
        };
        if matches!(probe, Probe::Command(_)) {
            // Reaped: its number may be anyone's now; its tree holds what it left.
            group.0 = None;
        }
        drop(group);
        if let Some(tree) = &tree {
            tree.end().await;
        }
        probe
    }
}

/// An exec probe of a container release: run inside its container (see
/// `container::exec_inside`).
async fn exec_inside(command: &[String], release: &Path, port: u16, timeout: Duration) -> Probe {
    use super::container::ExecEnd;
    match super::container::exec_inside(release, port, command, timeout).await {
        ExecEnd::Exited(code) => Probe::Command(code.and_then(|c| i32::try_from(c).ok())),
        ExecEnd::TimedOut => Probe::TimedOut(timeout),
        ExecEnd::Failed(why) => Probe::Failed(why),
    }
}

/// Kills an exec probe's process group when the probe ends without its leader's exit: at its
/// timeout, or when the gate drops the probe (the deadline passed, the release exited).
struct GroupKiller(Option<i32>);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        if let Some(pid) = self.0.filter(|pid| *pid > 1) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// What one readiness probe saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    Status(u16),
    /// A TCP probe's connect succeeded.
    Connected,
    /// An exec probe's exit code (None: killed by a signal).
    Command(Option<i32>),
    Refused,
    TimedOut(Duration),
    Failed(String),
    /// A notify probe: `READY=1` was said (and no watchdog was missed since).
    Notified,
    /// A notify probe: no `READY=1` yet; the last `STATUS=` if any.
    NotYet {
        status: Option<String>,
        /// Datagrams dropped so far: from outside the release's process group, or unreadable.
        ignored: u32,
    },
    /// A notify probe: the release said `ERRNO=`: it failed.
    Reported(i32),
    /// A notify probe: no `WATCHDOG=1` for this long, over the policy's `watchdog_ms`.
    WatchdogMissed(Duration),
    WatchdogTriggered,
    /// A notify probe where nobody reads the release's socket (`rollgate status`).
    Unwatched,
    /// An up probe: the process runs.
    Running,
}

impl Probe {
    /// A result that ends a gate or a watch at once, whatever the thresholds: the release
    /// said it failed, or stopped proving it is alive.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Probe::Reported(_) | Probe::WatchdogMissed(_) | Probe::WatchdogTriggered
        )
    }
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Probe::Status(code) => write!(f, "HTTP {code}"),
            Probe::Connected => write!(f, "connected"),
            Probe::Command(Some(code)) => write!(f, "exit status {code}"),
            Probe::Command(None) => write!(f, "killed by a signal"),
            Probe::Refused => write!(f, "connection refused"),
            Probe::TimedOut(after) => write!(f, "no answer within {} ms", after.as_millis()),
            Probe::Failed(why) => write!(f, "{why}"),
            Probe::Notified => write!(f, "READY=1"),
            Probe::NotYet { status, ignored } => {
                write!(f, "no READY=1 yet")?;
                let mut said = Vec::new();
                if let Some(status) = status {
                    said.push(format!("STATUS={status}"));
                }
                if *ignored > 0 {
                    said.push(format!(
                        "{ignored} datagram{} from outside its process group ignored",
                        if *ignored == 1 { "" } else { "s" }
                    ));
                }
                match said.is_empty() {
                    true => Ok(()),
                    false => write!(f, " ({})", said.join("; ")),
                }
            }
            Probe::Reported(errno) => write!(
                f,
                "it reported ERRNO={errno} ({})",
                nix::errno::Errno::from_raw(*errno).desc()
            ),
            Probe::WatchdogMissed(since) => {
                write!(f, "no WATCHDOG=1 for {} ms", since.as_millis())
            }
            Probe::WatchdogTriggered => write!(f, "it sent WATCHDOG=trigger"),
            Probe::Unwatched => write!(f, "readiness by notification (not read here)"),
            Probe::Running => write!(f, "running"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> ProbePolicy {
        ProbePolicy::default()
    }

    #[test]
    fn no_probe_in_the_policy_is_todays_readyz() {
        let spec = Spec::from_policy(&policy()).unwrap();
        assert_eq!(spec, Spec::default());
        assert!(spec.passes(&Probe::Status(200)));
        assert!(!spec.passes(&Probe::Status(204)));
        assert!(!spec.passes(&Probe::Connected));
    }

    #[test]
    fn each_kind_passes_only_on_its_own_answer() {
        let http = Spec::from_policy(&ProbePolicy {
            status_min: Some(200),
            status_max: Some(299),
            ..policy()
        })
        .unwrap();
        assert!(http.passes(&Probe::Status(204)));
        assert!(!http.passes(&Probe::Status(301)));
        let tcp = Spec::from_policy(&ProbePolicy {
            kind: Some("tcp".into()),
            ..policy()
        })
        .unwrap();
        assert!(tcp.passes(&Probe::Connected));
        assert!(!tcp.passes(&Probe::Refused));
        let exec = Spec::from_policy(&ProbePolicy {
            kind: Some("exec".into()),
            command: Some(vec!["./ok".into()]),
            ..policy()
        })
        .unwrap();
        assert!(exec.passes(&Probe::Command(Some(0))));
        assert!(!exec.passes(&Probe::Command(Some(1))));
        assert!(!exec.passes(&Probe::Command(None)));
    }

    #[test]
    fn a_bad_probe_names_its_field() {
        let cases = [
            (
                ProbePolicy {
                    kind: Some("exec".into()),
                    ..policy()
                },
                "probe.command",
            ),
            (
                ProbePolicy {
                    kind: Some("tcp".into()),
                    path: Some("/x".into()),
                    ..policy()
                },
                "probe.path",
            ),
            (
                ProbePolicy {
                    status_max: Some(199),
                    ..policy()
                },
                "probe.status_min (200) must not be above",
            ),
            (
                ProbePolicy {
                    timeout_ms: Some(5),
                    ..policy()
                },
                "probe.timeout_ms",
            ),
            (
                ProbePolicy {
                    success_threshold: Some(0),
                    ..policy()
                },
                "probe.success_threshold",
            ),
            (
                ProbePolicy {
                    path: Some("readyz".into()),
                    ..policy()
                },
                "probe.path",
            ),
            (
                ProbePolicy {
                    kind: Some("udp".into()),
                    ..policy()
                },
                "probe.kind",
            ),
        ];
        for (bad, field) in cases {
            let err = Spec::from_policy(&bad).unwrap_err().to_string();
            assert!(err.starts_with(field), "{bad:?}: {err}");
        }
    }
}
