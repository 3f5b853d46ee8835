//! One error type for every command, and the exit codes rollgate has.
//!
//! An [`Error`] says what went wrong in words for a person and which class of failure it is;
//! the class gives the exit code ([`Error::code`]) and [`Error::render`] gives what stderr shows.
//! `main` has one route from any error to both. How a run ended when nothing went wrong (promoted,
//! rolled back, paused, escalated) is an outcome, not an error; outcomes take their codes from
//! the same table, [`EXIT_CODES`], from which `docs/exit-codes.md` is generated (and checked by
//! `tests/it/docs.rs`).

/// Success: exported, every file passed, promoted, answered, aborted as asked.
pub const SUCCESS: u8 = 0;
/// Something was refused or failed, or a run ended rolled back.
pub const FAILED: u8 = 1;
/// Refused before anything started: nothing changed.
pub const REFUSED: u8 = 2;
/// A run waits for a person: an escalated deploy, a paused rollout.
pub const WAITING: u8 = 3;

/// Every exit code and what it means, in the words of `docs/exit-codes.md`.
pub const EXIT_CODES: [(u8, &str); 4] = [
    (
        SUCCESS,
        "success: exported, all files passed, promoted, answered, aborted as asked",
    ),
    (
        FAILED,
        "refused policy, a failed check, a refused or unverifiable release (`release verify`), a \
         rolled-back deploy (in its gate or its watch), `up` that could not start a live \
         release, an aborted rollout, a deploy that failed after it started (the message says \
         what state is left), an unreadable log, `--strict` found bad lines or something an \
         engine cannot express, a proxy that could not start",
    ),
    (
        REFUSED,
        "usage error; a deploy or rollout refused before anything started (a failing \
         `pre_deploy` hook included; a `--dry-run` whose checks would refuse); `rollback` with \
         no earlier release installed; a pause, resume or abort of no running or paused rollout \
         (an unsigned, unverified or older release on a root with a trust file included); \
         nothing to promote or abort; `abort` of a candidate that is already live; `release rm` \
         of a release not installed or marked (live, fallback, in flight, last good, floor)",
    ),
    (
        WAITING,
        "deploy escalated: the candidate is left running for `promote` or `abort`; rollout \
         paused, waiting for `rollout resume` or `rollout abort`",
    ),
];

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Refused before anything started, or asked wrongly: nothing changed (exit 2).
    #[error("{0}")]
    Refused(String),
    /// Failed after the work began; the message says what state is left (exit 1).
    #[error("{0}")]
    Failed(String),
    /// Input that cannot be used: a policy the contract refuses, a log that cannot be read, a
    /// release that does not verify, something an engine cannot express (exit 1).
    #[error("{0}")]
    Invalid(String),
    /// Nickel's own diagnostic, shown byte for byte as `nickel export` shows it (exit 1).
    #[error("{}", .0.trim_end())]
    Diagnostic(String),
    /// What the host would not do or refused to take (a name, a busy root, a setting, a
    /// file), kept typed; whether the command is refused (exit 2) or failed (exit 1) is the
    /// fault's to say.
    #[error(transparent)]
    Host(#[from] crate::host::fault::Fault),
}

impl Error {
    /// Refused before anything started: nothing changed.
    pub fn is_refused(&self) -> bool {
        self.code() == REFUSED
    }

    pub fn code(&self) -> u8 {
        match self {
            Error::Refused(_) => REFUSED,
            Error::Failed(_) | Error::Invalid(_) | Error::Diagnostic(_) => FAILED,
            Error::Host(fault) if fault.refuses() => REFUSED,
            Error::Host(_) => FAILED,
        }
    }

    /// What stderr shows: `error: ` and the message, or a Nickel diagnostic as Nickel wrote it
    /// (it has its own `error:` heading and ends with a blank line).
    pub fn render(&self) -> String {
        match self {
            Error::Diagnostic(text) => {
                let mut text = text.clone();
                if !text.ends_with('\n') {
                    text.push('\n');
                }
                text
            }
            other => format!("error: {other}\n"),
        }
    }
}

/// A policy that cannot be used: Nickel's refusal in Nickel's words, anything else as one line.
impl From<crate::policy::PolicyError> for Error {
    fn from(error: crate::policy::PolicyError) -> Error {
        match error {
            crate::policy::PolicyError::Nickel(diagnostic) => {
                Error::Diagnostic(diagnostic.rendered)
            }
            other => Error::Invalid(other.to_string()),
        }
    }
}

/// A refusal: nothing was started and nothing changed.
pub fn refused(message: impl Into<String>) -> Error {
    Error::Refused(message.into())
}

/// The exit-code table of `docs/exit-codes.md`, generated from [`EXIT_CODES`].
pub fn exit_code_table() -> String {
    let mut table = String::from("| code | meaning |\n| --- | --- |\n");
    for (code, meaning) in EXIT_CODES {
        table.push_str(&format!("| {code} | {meaning} |\n"));
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_a_code_the_table_explains() {
        let errors = [
            Error::Refused("r".into()),
            Error::Failed("f".into()),
            Error::Invalid("i".into()),
            Error::Diagnostic("error: d\n\n".into()),
        ];
        for error in &errors {
            assert!(EXIT_CODES.iter().any(|(code, _)| *code == error.code()));
        }
        assert_eq!(errors[0].code(), 2);
        assert_eq!(errors[1].render(), "error: f\n");
        assert_eq!(errors[3].render(), "error: d\n\n");
        assert_eq!(Error::Diagnostic("x".into()).render(), "x\n");
    }

    #[test]
    fn a_host_fault_decides_refused_or_failed_itself() {
        use crate::host::fault::Fault;
        let busy = Error::from(Fault::Busy {
            path: "/srv/edge/deploy.lock".into(),
            holder: "41".into(),
        });
        assert_eq!((busy.code(), busy.is_refused()), (REFUSED, true));
        assert!(busy
            .render()
            .starts_with("error: another deploy is running on this root (pid 41"));
        let unwritable = Error::from(Fault::unwritable(
            std::path::Path::new("/x"),
            "cannot write /x",
        ));
        assert_eq!(
            (unwritable.code(), unwritable.render()),
            (FAILED, "error: cannot write /x\n".to_string())
        );
        let name = Error::from(crate::host::names::check_name("version", "../v1").unwrap_err());
        assert_eq!(name.code(), REFUSED);
    }
}
