//! rollgate as a library: policy contracts, readiness-gated deploys, signed releases, the
//! proxy, deploy-log analysis, keeping live releases up, and the pure rollout planner. The binary (`src/main.rs`) is the
//! command line over it; integration tests drive the planner directly.

pub mod demo;
pub mod deploy;
pub mod fleet;
pub mod host;
pub mod log;
pub mod policy;
pub mod proxy;
pub mod release;
pub mod render;
pub mod rollout;
pub mod sample;
pub mod up;
