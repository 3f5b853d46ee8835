//! Supervision (issue 80, 4): what keeps a service's processes running once a run has
//! started them, a layer of its own between the engine and the commands. It names the host,
//! the policy, the release files and the engine's front door; no command. The commands
//! (`up`, `stop`/`start`, `schedules`, `logs`) and the deploy's tail call it.
//!
//! - `supervise.rs`: the live set read from the formation (`engine::formation`), and `ensure` —
//!   every process it names running and kept, strays stopped — for `up`, `start` and after a
//!   run.
//! - `keep.rs`: a release process's keeper (`rollgate keep`): restarts with backoff, the
//!   crash-loop rule, and the standby.
//! - `standby.rs`: a crash-looping release's standby.
//! - `clock.rs`: the schedules' keeper (`rollgate keep-clock`) and their runs.
//! - `earlier.rs`: the release live before another, from the deploy log.
//!
//! Both keepers are started and waited for one way (`host::daemon`), and every line supervision
//! says goes to the deploy log through [`say`].

pub mod clock;
pub(crate) mod earlier;
pub mod keep;
pub(crate) mod standby;
pub mod supervise;

/// Appends `entry` to the root's deploy log: every line supervision says (a restart, a crash
/// loop, a standby, a schedule's run). One that cannot be written is said on stderr — which a
/// keeper has closed: there is nowhere else.
pub(crate) fn say(root: &crate::host::state::Root, entry: &crate::host::journal::Entry) {
    if let Err(e) = crate::host::journal::append(&root.log_path(), entry) {
        eprintln!(
            "rollgate: cannot append to {}: {e}",
            root.log_path().display()
        );
    }
}
