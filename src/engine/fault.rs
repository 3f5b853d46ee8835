//! The fault seam for crash tests: `ROLLGATE_FAULT=kill-after-action:K` makes rollgate SIGKILL
//! itself right after the K-th persisted action of this process (a save of the engine's state,
//! a pool write, a log line, the floor). Read only here; unset, each point costs one atomic
//! increment. Tests crash at every K of a run, then run what a user would run next.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

pub const VARIABLE: &str = "ROLLGATE_FAULT";

static DONE: AtomicU64 = AtomicU64::new(0);

/// The action after which to die, if the variable asks for one.
fn kill_after() -> Option<u64> {
    static AFTER: OnceLock<Option<u64>> = OnceLock::new();
    *AFTER.get_or_init(|| parse(&std::env::var(VARIABLE).ok()?))
}

fn parse(value: &str) -> Option<u64> {
    let k = value.strip_prefix("kill-after-action:")?.parse().ok()?;
    (k > 0).then_some(k)
}

/// One persisted action is done; die here if it is the one asked for.
pub fn point() {
    let Some(k) = kill_after() else {
        return;
    };
    if DONE.fetch_add(1, Ordering::SeqCst) + 1 == k {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn only_a_positive_action_index_arms_the_seam() {
        assert_eq!(parse("kill-after-action:7"), Some(7));
        assert_eq!(parse("kill-after-action:0"), None);
        assert_eq!(parse("kill-after-action:x"), None);
        assert_eq!(parse("kill-before-action:7"), None);
    }
}
