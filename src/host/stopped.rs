//! `ROOT/stopped.json`: a service a person stopped (`rollgate stop`, issue 68). Written before
//! anything is stopped and removed only once `rollgate start` has the live release serving
//! again, so nothing brings the service back in between — not `up` at boot, not `up
//! --supervise`, not a deploy (refused until it is started) — even after a crash halfway.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fault::Fault;
use super::files::{read_json, write_atomically};

pub const STOPPED_FILE: &str = "stopped.json";

/// Who stopped the service, when and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stopped {
    pub service: String,
    /// Unix seconds.
    pub since: f64,
    pub by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl Stopped {
    /// `stopped by alice at 12:03:04 UTC (why)`, for refusals and `status`.
    pub fn words(&self) -> String {
        let at = chrono::DateTime::from_timestamp_millis((self.since * 1000.0) as i64)
            .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
            .unwrap_or_default();
        match &self.why {
            Some(why) => format!("stopped by {} at {at} ({why})", self.by),
            None => format!("stopped by {} at {at}", self.by),
        }
    }
}

pub fn path(root: &Path) -> PathBuf {
    root.join(STOPPED_FILE)
}

/// The root's stop, if a person stopped it.
pub fn read(root: &Path) -> Result<Option<Stopped>, Fault> {
    read_json(&path(root))
}

/// Records the stop, whole (atomically).
pub fn write(root: &Path, stopped: &Stopped) -> Result<(), Fault> {
    let path = path(root);
    let text = serde_json::to_vec_pretty(stopped)
        .map_err(|e| Fault::unwritable(&path, format!("cannot write {}: {e}", path.display())))?;
    write_atomically(&path, &text)
        .map_err(|e| Fault::unwritable(&path, format!("cannot write {}: {e}", path.display())))
}

/// The service is started again: its stop is forgotten.
pub fn clear(root: &Path) -> Result<(), Fault> {
    super::files::remove_if_there(&path(root))
}
