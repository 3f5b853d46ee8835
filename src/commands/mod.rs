//! The commands that drive the engine, one file each: `console` (the page, API and event
//! stream over roots), `deploy`, `rollout` (and its status), `rollback`, `status`, `releases`
//! (`release list`), `up`, `logs` (a release's own output), the `demo`, and the checks the real runs and their dry runs share
//! (`preflight`, `dry_run`). Each builds a request and goes through the engine's front door
//! (`engine::start`, `engine::ask`, `engine::watch`): a person's pause, resume, abort,
//! promote and the background watcher of `deploy --no-wait` need no command module at all.

pub mod config;
pub mod console;
pub mod demo;
pub mod deploy;
pub mod dry_run;
pub mod fleet_move;
pub mod hold;
pub mod logs;
pub mod policy_show;
pub(crate) mod preflight;
pub mod releases;
pub mod rollback;
pub mod rollout;
pub mod run;
pub mod scale;
pub mod schedules;
pub mod secret;
pub mod status;
pub mod stop;
pub mod traffic;
pub mod up;
