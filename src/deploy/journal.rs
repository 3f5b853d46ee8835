//! The deploy log: one JSON line per action, appended and fsynced before rollgate moves on.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// Field order is the line's key order: the lesson's four first, then the optional ones.
#[derive(Debug, Clone, Serialize)]
pub struct Entry<'a> {
    pub ts: f64,
    pub event: &'a str,
    pub version: &'a str,
    pub detail: String,
    pub service: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
}

/// Unix seconds, to the millisecond.
pub fn now() -> f64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (since.as_millis() as f64) / 1000.0
}

/// Appends one line. `O_APPEND` keeps concurrent writers' lines whole; the fsync makes the line
/// survive a crash that follows.
pub fn append(path: &Path, entry: &Entry) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(entry).expect("entries serialize");
    line.push(b'\n');
    let mut file = OpenOptions::new().create(true).append(true).open(path)?;
    file.write_all(&line)?;
    file.sync_data()
}
