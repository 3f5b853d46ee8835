//! The live progress line a person sees on a terminal during the gate.

use std::io::IsTerminal;
use std::time::Duration;

use super::probe::Probe;

/// A live line on a terminal: elapsed / deadline, probes, last answer. Silent otherwise.
pub(crate) struct Progress {
    enabled: bool,
    version: String,
    deadline: Duration,
}

impl Progress {
    pub(crate) fn new(version: &str, deadline: Duration) -> Self {
        Progress {
            enabled: std::io::stderr().is_terminal(),
            version: version.to_string(),
            deadline,
        }
    }

    pub(crate) fn show(&self, elapsed: Duration, probes: u32, last: Option<&Probe>) {
        if self.enabled {
            let last = last.map_or("-".to_string(), Probe::to_string);
            eprint!(
                "\r\x1b[2K{}: {:.1} s / {:.1} s, {probes} probes, last: {last}",
                self.version,
                elapsed.as_secs_f64(),
                self.deadline.as_secs_f64()
            );
        }
    }

    pub(crate) fn finish(&self) {
        if self.enabled {
            eprintln!();
        }
    }
}
