//! rollgate's own long-lived helpers — a release process's keeper (`rollgate keep`) and the
//! schedules' keeper (`rollgate keep-clock`) — started one way, and waited for one way when one
//! was killed a moment ago.

use std::ffi::OsStr;
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a holder on its way out (SIGKILLed, exiting) is given to let go of what it holds.
pub const DYING_HOLDER_WAIT: Duration = Duration::from_secs(2);

/// `rollgate ARGS…` (so `ps` shows it), in a session of its own (a signal to the starter's group
/// or terminal does not reach it), in `root`, with none of the starter's locks and without the
/// crash tests' fault (which is the starting command's). `in_child` runs last before exec.
pub fn command<I, S>(
    args: I,
    root: &Path,
    mut in_child: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
) -> tokio::process::Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = tokio::process::Command::new("/proc/self/exe");
    command
        .arg0("rollgate")
        .args(args)
        .current_dir(root)
        .env_remove("ROLLGATE_FAULT");
    // SAFETY: close, setsid and what `in_child` does are system calls; nothing of the parent is
    // touched.
    unsafe {
        command.pre_exec(move || {
            super::lock::close_held_in_child();
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            in_child()
        });
    }
    command
}

/// Tries `take` until it succeeds, while the `holder` of what it takes is dying, for at most
/// [`DYING_HOLDER_WAIT`]: a helper killed a moment ago holds its lock until it has exited, and
/// is not to be taken for a live one. Each try is given what the last one gave back (`state`
/// the first time); the last try's answer.
pub fn unless_held_by_a_live_one<S, T>(
    holder: Option<i32>,
    state: S,
    mut take: impl FnMut(S) -> Result<T, S>,
) -> Result<T, S> {
    let since = Instant::now();
    let mut state = state;
    loop {
        match take(state) {
            Ok(taken) => return Ok(taken),
            Err(back) => {
                let dying = holder.is_some_and(super::identity::is_dying);
                if !dying || since.elapsed() > DYING_HOLDER_WAIT {
                    return Err(back);
                }
                state = back;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dying_holder_is_waited_for_and_a_live_one_is_not() {
        // A live holder: one try, its failure answered.
        let mut live = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut tries = 0;
        let answer = unless_held_by_a_live_one(Some(live.id() as i32), 0, |n| {
            tries += 1;
            Err::<(), _>(n + 1)
        });
        assert_eq!((answer, tries), (Err(1), 1));
        live.kill().unwrap();
        live.wait().unwrap();
        // A dying one (exited, not reaped yet): tried again, each try given the last one's
        // answer, until it succeeds.
        let mut ended = std::process::Command::new("true").spawn().unwrap();
        let pid = ended.id() as i32;
        while !super::super::identity::is_dying(pid) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let answer = unless_held_by_a_live_one(Some(pid), 0, |n| match n {
            3 => Ok(n),
            _ => Err(n + 1),
        });
        assert_eq!(answer, Ok(3));
        // And given up on after the wait.
        let since = Instant::now();
        let answer = unless_held_by_a_live_one(Some(pid), 0, |n| Err::<(), _>(n + 1));
        assert!(answer.is_err() && since.elapsed() >= DYING_HOLDER_WAIT);
        ended.wait().unwrap();
    }
}
