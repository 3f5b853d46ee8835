//! Rollouts of N replicas (issue 12). This first step holds the arithmetic every later step
//! relies on, pure and tested on its own: the surge and unavailable budgets, and the waves.

pub mod plan;
