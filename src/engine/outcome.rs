//! How a run, or a person's word about one, ended: one [`Outcome`] for deploys and rollouts
//! alike, with its words, its exit code and the stream a command says it on.
//!
//! A deploy's family (`deploy`, `rollback`, `promote`, `abort`, the background watcher) says
//! its outcome on stderr after `rollgate: `, as it always has: its stdout is the release's to
//! quote in scripts. A rollout's commands (`rollout`, `rollout pause|resume|abort`) say it on
//! stdout. Each command says it on one stream, never both (docs/exit-codes.md).

use crate::error;

/// How a run ended; the exit code follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The new release is live everywhere (a deploy promoted, a rollout completed).
    Completed,
    /// It did not go live: rolled back by its gate or watch, or a rollout aborted.
    Failed,
    /// It waits for a person: an escalated deploy, a paused rollout.
    Waiting,
    /// A person's word (`pause`, `resume`, `abort`) did what it asked.
    Done,
    /// Switched, and a background watcher (this pid) finishes the watch (`--no-wait`).
    Watching(u32),
}

/// Where a command says its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// `rollgate: ` and the words on stderr (a deploy's family).
    Stderr,
    /// The words on stdout (a rollout's commands).
    Stdout,
}

/// A run's ending, its words and its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub ending: Ending,
    pub words: String,
    pub stream: Stream,
}

impl Outcome {
    pub fn exit_code(&self) -> u8 {
        match self.ending {
            Ending::Completed | Ending::Done | Ending::Watching(_) => error::SUCCESS,
            Ending::Failed => error::FAILED,
            Ending::Waiting => error::WAITING,
        }
    }

    /// Whether the new release went live (what `keep_releases` prunes after).
    pub fn went_live(&self) -> bool {
        self.ending == Ending::Completed
    }

    /// What the command prints, on [`Outcome::stream`].
    pub fn said(&self) -> String {
        match self.stream {
            Stream::Stderr => format!("rollgate: {}", self.words),
            Stream::Stdout => self.words.clone(),
        }
    }

    /// A rollout command's outcome (said on stdout).
    pub(crate) fn rollout(ending: Ending, words: String) -> Outcome {
        Outcome {
            ending,
            words,
            stream: Stream::Stdout,
        }
    }

    /// A deploy's outcome with the reason its log line gives when it was rolled back, so the
    /// terminal says why (`rolled back: not ready after 1500 ms; ...`), not only the log.
    pub(crate) fn deploy_as_logged(
        ending: DeployEnding,
        root: &crate::host::state::Root,
        token: &str,
        since: f64,
    ) -> Outcome {
        let mut outcome = Outcome::deploy(ending);
        if ending == DeployEnding::RolledBack {
            let logged = crate::host::journal::outcome_line_for(&root.log_path(), token, since);
            if let Ok(Some((crate::host::journal::LogEvent::RolledBack, reason))) = logged {
                outcome.words = format!("rolled back: {reason}");
            }
        }
        outcome
    }

    /// A deploy's outcome, in the words `rollgate deploy` has always said it on stderr.
    pub(crate) fn deploy(ending: DeployEnding) -> Outcome {
        let (ending, words) = match ending {
            DeployEnding::Promoted => (Ending::Completed, "promoted".to_string()),
            DeployEnding::RolledBack => (
                Ending::Failed,
                "rolled back (see deploy.log for why)".to_string(),
            ),
            DeployEnding::Escalated => (
                Ending::Waiting,
                "escalated: left running, not promoted; run `rollgate promote` or `rollgate abort`"
                    .to_string(),
            ),
            DeployEnding::Aborted => (
                Ending::Done,
                "aborted: candidate stopped, logged as rolled_back".to_string(),
            ),
            DeployEnding::Watching(pid) => (
                Ending::Watching(pid),
                format!(
                    "switched; watcher pid {pid} finishes the watch (promoted or switched back); see `rollgate status`"
                ),
            ),
        };
        Outcome {
            ending,
            words,
            stream: Stream::Stderr,
        }
    }
}

/// The endings a deploy's family has words for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeployEnding {
    Promoted,
    RolledBack,
    Escalated,
    /// `abort` did what it was asked.
    Aborted,
    Watching(u32),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_ending_has_the_exit_code_of_the_table() {
        let code = |e| Outcome::deploy(e).exit_code();
        assert_eq!(code(DeployEnding::Promoted), error::SUCCESS);
        assert_eq!(code(DeployEnding::RolledBack), error::FAILED);
        assert_eq!(code(DeployEnding::Escalated), error::WAITING);
        assert_eq!(code(DeployEnding::Aborted), error::SUCCESS);
        assert_eq!(code(DeployEnding::Watching(7)), error::SUCCESS);
        assert_eq!(
            Outcome::rollout(Ending::Waiting, "paused".into()).exit_code(),
            error::WAITING
        );
    }

    #[test]
    fn a_deploy_says_it_on_stderr_and_a_rollout_on_stdout() {
        let deploy = Outcome::deploy(DeployEnding::Promoted);
        assert_eq!(
            (deploy.stream, deploy.said().as_str()),
            (Stream::Stderr, "rollgate: promoted")
        );
        let rollout = Outcome::rollout(Ending::Completed, "completed: 4 of 4".into());
        assert_eq!(rollout.said(), "completed: 4 of 4");
        assert!(deploy.went_live() && !Outcome::deploy(DeployEnding::Watching(1)).went_live());
    }
}
