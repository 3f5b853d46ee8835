//! Release processes: started in their own session, recognised by pid *and* start time, stopped
//! as a whole process group with SIGTERM and, after a grace period, SIGKILL.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// A process as rollgate recognises it later: its pid and its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub pid: i32,
    pub start_time: u64,
}

/// What `/proc/PID/stat` says of a process.
struct Stat {
    state: char,
    process_group: i32,
    start_time: u64,
}

/// Reads `/proc/PID/stat`: the state (field 3), the process group (field 5) and the start time
/// (field 22). The command name (field 2) may hold spaces and parentheses, so fields are
/// counted after its last `)`.
fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        process_group: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

impl Identity {
    pub fn of(pid: i32) -> Option<Identity> {
        stat(pid).map(|s| Identity {
            pid,
            start_time: s.start_time,
        })
    }

    /// The same process is still there and not a zombie.
    pub fn is_running(&self) -> bool {
        matches!(stat(self.pid), Some(s) if s.start_time == self.start_time && s.state != 'Z' && s.state != 'X')
    }

    /// Signals the process's whole group when it leads one (every release rollgate starts
    /// does), else the process alone: never a group that merely shares the number.
    fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(self.pid);
        match stat(self.pid) {
            Some(s) if s.process_group == self.pid => {
                let _ = killpg(pid, signal);
            }
            Some(_) => {
                let _ = kill(pid, signal);
            }
            None => {}
        }
    }
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

/// Stops the process group led by `who`: SIGTERM, wait up to `grace`, then SIGKILL. Never
/// signals a pid whose start time differs (it was reused).
pub async fn stop_group(who: Identity, grace: Duration) -> Stopped {
    if !who.is_running() {
        return Stopped::AlreadyGone;
    }
    who.signal(Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        if !who.is_running() {
            return Stopped::Terminated;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if !who.is_running() {
        return Stopped::Terminated;
    }
    who.signal(Signal::SIGKILL);
    for _ in 0..400 {
        if !who.is_running() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Stopped::Killed
}

/// What a candidate is started with.
pub struct Launch<'a> {
    pub executable: &'a Path,
    pub workdir: &'a Path,
    pub output: &'a Path,
    pub port: u16,
    pub version: &'a str,
    pub token: &'a str,
}

/// Starts the candidate in its own session (so its process group can be signalled as one and it
/// outlives rollgate once promoted), stdout and stderr appended to `output`.
pub fn spawn(launch: &Launch) -> std::io::Result<tokio::process::Child> {
    let output = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(launch.output)?;
    let mut command = tokio::process::Command::new(launch.executable);
    command
        .current_dir(launch.workdir)
        .env("PORT", launch.port.to_string())
        .env("ROLLGATE_VERSION", launch.version)
        .env("ROLLGATE_DEPLOY_TOKEN", launch.token)
        .stdin(Stdio::null())
        .stdout(output.try_clone()?)
        .stderr(output);
    // SAFETY: setsid is async-signal-safe and touches nothing of the parent.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    command.spawn()
}

/// Finds processes started with `ROLLGATE_DEPLOY_TOKEN=token`: the candidate of a deployer
/// that died between spawning it and recording its pid.
pub fn find_by_token(token: &str) -> Vec<Identity> {
    let needle = format!("ROLLGATE_DEPLOY_TOKEN={token}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
                .unwrap_or(false)
        })
        .filter_map(Identity::of)
        .collect()
}

/// The last lines of a file, for the log's detail (a crashed candidate's own words).
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(bytes) = std::fs::read(path) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let kept: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    kept[kept.len().saturating_sub(lines)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_of_this_process_is_running_and_a_wrong_start_time_is_not() {
        let me = Identity::of(std::process::id() as i32).unwrap();
        assert!(me.is_running());
        let impostor = Identity {
            pid: me.pid,
            start_time: me.start_time + 1,
        };
        assert!(!impostor.is_running());
    }
}
