//! The commands that drive the engine, one file each: `console` (the page, API and event
//! stream over roots), `deploy`, `rollout` (and its pause,
//! resume, abort and status), `rollback`, `escalation` (promote/abort of an escalated deploy),
//! `watch` (the background watcher of `deploy --no-wait`), `status`, `releases` (`release
//! list`), `up`, the `demo`, and the
//! checks the real runs and their dry runs share (`preflight`, `dry_run`).

pub mod config;
pub mod console;
pub mod demo;
pub mod deploy;
pub(crate) mod dry_run;
pub mod escalation;
pub(crate) mod preflight;
pub mod releases;
pub mod rollback;
pub mod rollout;
pub mod secret;
pub mod status;
pub mod up;
pub mod watch;
