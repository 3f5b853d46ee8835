//! Pause, resume and abort from another shell while a rollout runs: the command writes one
//! request file (atomically) naming the rollout it is for, and the executor, which holds the
//! root's lock, takes it within [`super::run`]'s control poll. A request for another rollout
//! (a stale file, or one for a rollout that ended meanwhile) is refused, never applied. When no
//! executor holds the lock, the command acts itself.

use crate::defaults;
use serde::{Deserialize, Serialize};

use super::step::Event;
use crate::host::fault::Fault;
use crate::host::files::{read_json, write_atomically};
use crate::host::state::Root;

pub const REQUEST_FILE: &str = "rollout.request";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ask {
    Pause,
    Resume,
    Abort,
}

impl Ask {
    pub fn as_str(self) -> &'static str {
        match self {
            Ask::Pause => "pause",
            Ask::Resume => "resume",
            Ask::Abort => "abort",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The id of the rollout it is for.
    #[serde(default)]
    pub rollout: String,
    pub ask: Ask,
    pub reason: String,
    #[serde(default)]
    pub rollback: bool,
}

impl Request {
    pub fn event(&self) -> Event {
        match self.ask {
            Ask::Pause => Event::Pause {
                reason: self.reason.clone(),
            },
            Ask::Resume => Event::Resume,
            Ask::Abort => Event::Abort {
                reason: self.reason.clone(),
                rollback: self.rollback,
            },
        }
    }
}

/// Refuses a reason longer than [`defaults::MAX_REASON_CHARS`] or with control characters (it would
/// break the status table and the log's one-line details).
pub fn check_reason(reason: &str) -> Result<(), Fault> {
    let chars = reason.chars().count();
    if chars > defaults::MAX_REASON_CHARS {
        return Err(Fault::setting(
            "--reason",
            format!(
                "--reason is {chars} characters; at most {} are allowed",
                defaults::MAX_REASON_CHARS
            ),
        ));
    }
    if reason.chars().any(char::is_control) {
        return Err(Fault::setting(
            "--reason",
            "--reason contains a control character (a newline?); give one line",
        ));
    }
    Ok(())
}

/// Leaves a request for the running executor.
pub fn send(root: &Root, request: &Request) -> Result<(), Fault> {
    let path = root.0.join(REQUEST_FILE);
    let bytes = serde_json::to_vec(request).expect("a request serializes");
    write_atomically(&path, &bytes)
        .map_err(|e| Fault::unwritable(&path, format!("cannot write {}: {e}", path.display())))
}

/// Whether a request is still waiting to be taken.
pub fn waiting(root: &Root) -> bool {
    root.0.join(REQUEST_FILE).exists()
}

/// Takes the waiting request for rollout `id`, if any. The file is first renamed to a name of
/// this process's own, so a request written meanwhile waits for the next poll instead of
/// being removed unread. One that cannot be read, or is for another rollout, is dropped and
/// reported: it must not be retried forever, nor steer a rollout it was not meant for.
pub fn take(root: &Root, id: &str) -> Option<Request> {
    let path = root.0.join(REQUEST_FILE);
    let taken = root
        .0
        .join(format!("{REQUEST_FILE}.taken.{}", std::process::id()));
    std::fs::rename(&path, &taken).ok()?;
    let request = read_json::<Request>(&taken);
    let _ = std::fs::remove_file(&taken);
    match request {
        Ok(Some(request)) if request.rollout == id => Some(request),
        Ok(Some(request)) => {
            eprintln!(
                "rollgate: refused a {} request for rollout {:?}: the rollout here is {id}",
                request.ask.as_str(),
                request.rollout
            );
            None
        }
        Ok(None) => None,
        Err(e) => {
            eprintln!("rollgate: ignoring a rollout request: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_bounded_and_one_line() {
        assert!(check_reason(&"x".repeat(500)).is_ok());
        assert!(check_reason(&"é".repeat(500)).is_ok());
        let long = check_reason(&"x".repeat(501)).unwrap_err().to_string();
        assert!(long.contains("501 characters; at most 500"), "{long}");
        assert!(check_reason("two\nlines").is_err());
    }

    #[test]
    fn a_request_round_trips_and_is_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().into());
        let request = Request {
            rollout: "r7".into(),
            ask: Ask::Abort,
            reason: "error budget".into(),
            rollback: true,
        };
        send(&root, &request).unwrap();
        assert!(waiting(&root));
        assert_eq!(take(&root, "r7"), Some(request.clone()));
        assert_eq!(take(&root, "r7"), None);
        std::fs::write(dir.path().join(REQUEST_FILE), "{not json").unwrap();
        assert_eq!(take(&root, "r7"), None);
        assert!(!waiting(&root), "a bad request is removed");
        // A request left for an earlier rollout (or a single deploy) steers nothing.
        send(&root, &request).unwrap();
        assert_eq!(take(&root, "r8"), None);
        assert!(!waiting(&root), "a request for another rollout is dropped");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "nothing is left behind: {left:?}");
    }
}
