//! Rollouts of N replicas (issue 12). So far the pure half: the budgets and waves (`plan`),
//! the persisted state (`state`), and the decisions over it (`step`). The executor that
//! performs the actions (spawn, gate, swap, drain, stop) comes next.

pub mod plan;
pub mod state;
pub mod step;
