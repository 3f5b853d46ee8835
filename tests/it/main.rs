//! The integration tests in one binary: each file beside this one was a test target of its own;
//! together they link once and run in parallel (issue 49).

mod common;

mod analysis;
mod bench_scripts;
mod cli;
mod config;
mod console;
mod console_browser;
mod crash;
mod deploy;
mod deploy_ports;
mod docs;
mod dry_run;
mod engines;
mod fleet;
mod follow;
mod hardening;
mod hooks;
mod lab;
mod layers;
mod listen;
mod log;
mod notify;
mod policy;
mod probes;
mod proxy;
mod recovery;
mod release;
mod release_add;
mod release_list;
mod rollback;
mod rollout;
mod terminal;
mod up;
mod watch;
mod webhooks;
