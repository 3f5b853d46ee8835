//! From clap's words to one call each: the functions `main` dispatches to, grouped by the
//! commands they serve, and what they share (printing an answer, the exit code of an outcome,
//! the policy evaluation options). Nothing here decides anything; each function unpacks a
//! command's arguments into the request a command module (`rollgate::commands`, `log`,
//! `policy`, `release`, `fleet`) takes, and turns its answer into the exit code.

pub mod config;
pub mod deploys;
pub mod fleet;
pub mod log;
pub mod policy;
pub mod proxy;
pub mod release;

use std::io::{IsTerminal, Write};
use std::time::Duration;

use rollgate::engine::{self, Outcome};
use rollgate::error::{self, Error};
use rollgate::policy::EvalOptions;

use crate::cli::EvalArgs;

/// Prints a command's answer: it succeeded.
pub fn printed(text: String) -> Result<u8, Error> {
    print(&text);
    Ok(error::SUCCESS)
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
pub fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
}

/// Colour only for a person at a terminal, and never when NO_COLOR is set (no-color.org).
pub fn stderr_color() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

pub fn eval_options(args: EvalArgs) -> EvalOptions {
    EvalOptions {
        import_paths: args.import_paths,
        timeout: Duration::from_millis(args.timeout_ms),
        max_file_bytes: args.max_file_bytes,
        color: stderr_color(),
        allow_import_anywhere: args.allow_import_anywhere,
    }
}

/// How a run ended, said on the one stream its command says it on (a deploy's family on
/// stderr, a rollout's commands on stdout); the exit code follows from it.
pub fn ended(outcome: Outcome) -> u8 {
    match outcome.stream {
        engine::Stream::Stderr => eprintln!("{}", outcome.said()),
        engine::Stream::Stdout => println!("{}", outcome.said()),
    }
    outcome.exit_code()
}

/// A dry run's report on stdout; exit 0 if it would go ahead, 2 if it would be refused.
pub fn report_dry_run((report, refused): (String, bool)) -> u8 {
    print(&report);
    if refused {
        error::REFUSED
    } else {
        error::SUCCESS
    }
}
