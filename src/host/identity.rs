//! A process as rollgate names it in its records: its pid *and* its start time, so a pid the
//! kernel handed to another process since is never taken for ours. Read from `/proc`; nothing
//! here starts or stops anything (that is `process`).

use serde::{Deserialize, Serialize};

/// A process as rollgate recognises it later: its pid and its start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    pub pid: i32,
    pub start_time: u64,
}

/// What `/proc/PID/stat` says of a process.
pub(super) struct Stat {
    pub(super) state: char,
    pub(super) parent: i32,
    pub(super) process_group: i32,
    pub(super) session: i32,
    /// The kernel's flags for the task (field 9): `PF_EXITING` once it is on its way out.
    pub(super) flags: u64,
    pub(super) start_time: u64,
}

/// Reads `/proc/PID/stat`: the state (field 3), the parent (field 4), the process group (field 5), the session
/// (field 6) and the start time (field 22). The command name (field 2) may hold spaces and parentheses, so fields are
/// counted after its last `)`.
pub(super) fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        parent: fields.get(1)?.parse().ok()?,
        process_group: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        flags: fields.get(6)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// The hidden command that runs a keeper (`rollgate keep`, see `keeper`); its spec comes on
/// stdin.
pub const KEEP_COMMAND: &str = "keep";

/// Whether `holder` (a pid, as a lock file names its holder) is a running keeper.
pub fn is_keeper(holder: &str) -> bool {
    holder.parse::<i32>().is_ok_and(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmdline| cmdline.split(|b| *b == 0).nth(1) == Some(KEEP_COMMAND.as_bytes()))
    })
}

/// Whether `pid` is gone or on its way out: a zombie, exiting (`PF_EXITING`: its memory and
/// files are being let go), or with SIGKILL pending (a `kill -9` is delivered when it next
/// runs). Until it has exited, its locks are still held.
pub fn is_dying(pid: i32) -> bool {
    const PF_EXITING: u64 = 0x4;
    let Some(stat) = stat(pid) else {
        return true;
    };
    if matches!(stat.state, 'Z' | 'X') || stat.flags & PF_EXITING != 0 {
        return true;
    }
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    status
        .lines()
        .filter_map(|l| {
            l.strip_prefix("SigPnd:")
                .or_else(|| l.strip_prefix("ShdPnd:"))
        })
        .filter_map(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .any(|mask| mask & SIGKILL_BIT != 0)
}

/// The process group `pid` is in, while it exists.
pub fn group_of(pid: i32) -> Option<i32> {
    stat(pid).map(|s| s.process_group)
}

impl Identity {
    pub fn of(pid: i32) -> Option<Identity> {
        stat(pid).map(|s| Identity {
            pid,
            start_time: s.start_time,
        })
    }

    /// The session this process belongs to, while it is the same process. Every release
    /// rollgate starts leads a session of its own, so its workers (forked children that carry
    /// the same environment, its token included) are told from strays by this.
    pub fn session(&self) -> Option<i32> {
        stat(self.pid)
            .filter(|s| s.start_time == self.start_time)
            .map(|s| s.session)
    }

    /// How long the process has run, while it is the same process (from its start time in
    /// clock ticks since boot and the system's uptime).
    pub fn running_for(&self) -> Option<std::time::Duration> {
        if !self.is_running() {
            return None;
        }
        let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        let started = self.start_time as f64 / ticks.max(1) as f64;
        Some(std::time::Duration::from_secs_f64(
            (uptime - started).max(0.0),
        ))
    }

    /// The same process is still there and not a zombie.
    pub fn is_running(&self) -> bool {
        matches!(stat(self.pid), Some(s) if s.start_time == self.start_time && s.state != 'Z' && s.state != 'X')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_process_is_dying_until_reaped_and_after() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(!is_dying(pid), "a sleeping process lives");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
        let since = std::time::Instant::now();
        while stat(pid).is_some_and(|s| s.state != 'Z') && since.elapsed().as_secs() < 10 {
            assert!(is_dying(pid), "SIGKILL pending, or on its way out");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(is_dying(pid), "a zombie");
        child.wait().unwrap();
        assert!(is_dying(pid), "gone");
    }

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

/// A pidfd for `who`, readable once it ends; None when it is gone already.
pub fn pidfd(who: Identity) -> Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, who.pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the descriptor was just returned to this process and is owned here alone.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    // Opened on the same process the state names, not on one that took its pid since.
    if Identity::of(who.pid) != Some(who) {
        return None;
    }
    // SAFETY: the AsyncFd owns the descriptor, so it stays open for as long as it is registered.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .ok()
}
