//! `ROOT/traffic.json`: whether the proxy lets a service's users through (issue 48). Written
//! atomically by `rollgate traffic`, read by every proxy serving the root (it watches the file),
//! so the state survives a proxy restart and a reboot. No file: serving.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fault::Fault;
use super::files::{read_json, write_atomically};

pub const TRAFFIC_FILE: &str = "traffic.json";

/// The longest a paused request may wait, unless `--max-pause-ms` says otherwise.
pub const DEFAULT_MAX_PAUSE_MS: u64 = 30_000;
/// The largest custom maintenance page served (it is held in memory by the proxy).
pub const MAX_PAGE_BYTES: u64 = 1 << 20;

/// What users of the service get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Requests go to the live release.
    #[default]
    Serving,
    /// Every request is answered 503 with `Retry-After` and a page (or JSON).
    Maintenance,
    /// New requests wait, in order, until resumed or `max_pause_ms`; then 503.
    Paused,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Serving => "serving",
            Mode::Maintenance => "maintenance",
            Mode::Paused => "paused",
        }
    }
}

/// The file's contents.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Traffic {
    pub service: String,
    pub mode: Mode,
    /// Said to users during maintenance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `Retry-After` during maintenance, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u64>,
    /// A page of the operator's own for maintenance (HTML, at most 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<PathBuf>,
    /// How long a paused request may wait.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pause_ms: Option<u64>,
    /// Unix seconds the mode was set.
    pub since: f64,
    /// Who set it, and why.
    pub by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

pub fn path(root: &Path) -> PathBuf {
    root.join(TRAFFIC_FILE)
}

/// The root's traffic state (None: no file, serving).
pub fn read(root: &Path) -> Result<Option<Traffic>, Fault> {
    read_json(&path(root))
}

/// Replaces the root's traffic state, whole.
pub fn write(root: &Path, traffic: &Traffic) -> Result<(), Fault> {
    let path = path(root);
    let text = serde_json::to_vec_pretty(traffic)
        .map_err(|e| Fault::unwritable(&path, format!("cannot write {}: {e}", path.display())))?;
    write_atomically(&path, &text)
        .map_err(|e| Fault::unwritable(&path, format!("cannot write {}: {e}", path.display())))
}

/// Who is running this: the user behind sudo, else the process's user, else its uid.
pub fn who() -> String {
    if let Ok(user) = std::env::var("SUDO_USER") {
        if !user.is_empty() {
            return user;
        }
    }
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => format!("uid {uid}"),
    }
}
