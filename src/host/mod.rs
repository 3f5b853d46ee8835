//! The host: what rollgate touches on one machine, below the engine and the commands. A root's
//! files and their formats (`state`), the deploy log (`journal`), the lock, signals, processes,
//! probes (and readiness by notification), hooks, names, a release's own configuration
//! (`config`: its env file and secrets). Nothing here knows about rollouts, deploys or commands; a test reads
//! the `use crate::...` lines of every layer to keep it that way.

pub mod account;
pub mod attach;
pub mod beneath;
pub mod cgroup;
pub mod config;
pub mod confine;
pub mod container;
pub mod daemon;
pub mod fault;
pub mod files;
pub mod filesystem;
pub mod hooks;
pub mod identity;
pub mod ipc;
pub mod journal;
pub mod keeper;
pub mod kept_policy;
pub mod launch;
pub mod listen;
pub mod lock;
pub mod names;
pub mod notify;
pub mod oci;
pub mod one_off;
pub mod output;
pub mod ports;
pub mod probe;
pub mod process;
pub mod progress;
pub mod reaper;
pub mod run_dir;
pub mod schedule_book;
pub mod signals;
pub mod state;
pub mod stopped;
pub mod traffic;

/// The longest any single wait may be (deadline, poll, grace, drain, soak): a day. A `.ncl`
/// policy need not apply the bundled contract, so rollgate keeps its own ceiling: an absurd
/// wait would overflow a timer or hang.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_millis(24 * 3600 * 1000);
