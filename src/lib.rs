//! rollgate as a library: policy contracts, readiness-gated deploys, signed releases, the
//! proxy, deploy-log analysis, keeping live releases up, and the pure rollout planner. The
//! binary (`src/main.rs`) is the command line over it.
//!
//! The direction of the code (kept by `tests/it/layers.rs`): `commands` drive the `engine`, which
//! stands on `host`; `policy` and `render` are leaves; `release`, `proxy` and `log` use the host.

pub mod commands;
pub mod defaults;
pub mod engine;
pub mod error;
pub mod fleet;
pub mod host;
pub mod log;
pub mod policy;
pub mod proxy;
pub mod release;
pub mod render;
pub mod sample;
pub mod supervision;
pub mod webhooks;
