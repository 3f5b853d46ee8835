//! Reaping what rollgate started (issue 81, 6): a keeper is the subreaper of the release it
//! keeps, as systemd is of a service. A release's child whose own parent died first (a
//! `/bin/sh -c` line's program, a daemon's fork) is reparented to the keeper instead of PID 1,
//! and the keeper reaps it when it exits — found as a stopped clock's zombie that lingered up
//! to 1.4 s until a slow PID 1 came round to it.

/// Makes this process the subreaper of everything it starts from now on.
pub fn become_subreaper() -> bool {
    nix::sys::prctl::set_child_subreaper(true).is_ok()
}

/// Reaps this process's exited children that were reparented to it: those in another session
/// than its own (every release leads a session of its own; what this process starts for
/// itself stays in its), leaving `awaited` (the release, its standby: a waiter of their own
/// reads their exit status) alone. How many it reaped.
pub fn reap_orphans(awaited: &[i32]) -> usize {
    let me = std::process::id() as i32;
    let Some(own_session) = super::identity::stat(me).map(|s| s.session) else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let orphans: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| !awaited.contains(pid))
        .filter(|pid| {
            super::identity::stat(*pid)
                .is_some_and(|s| s.parent == me && s.state == 'Z' && s.session != own_session)
        })
        .collect();
    orphans
        .into_iter()
        .filter(|pid| {
            use nix::sys::wait::{waitpid, WaitPidFlag};
            let pid = nix::unistd::Pid::from_raw(*pid);
            waitpid(pid, Some(WaitPidFlag::WNOHANG)).is_ok()
        })
        .count()
}
