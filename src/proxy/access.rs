//! The access log (issue 48): one JSON line per request a route answered, in the service's
//! root (`ROOT/access.log`), so `rollgate log query --access` can join it to `deploy.log` by
//! time. Off unless asked (`--access-log`, or `access_log = true` in the config).
//!
//! Off the hot path: a request's line is written into its serving thread's own buffer (a lock
//! no other request takes); a task moves the buffers to the file every [`FLUSH_EVERY`], rotating
//! it by size as a release's output is (`access.log.1`, … `keep` files in all). A buffer that
//! grows past [`MAX_BUFFERED`] (the disk stalls) drops lines and counts them, rather than
//! taking the proxy's memory.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::Serialize;

use crate::host::output::{shift, Rotation};

pub const ACCESS_FILE: &str = "access.log";
/// How often the buffers go to the file.
pub const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// A thread's buffer past this drops lines (counted) until the next flush.
const MAX_BUFFERED: usize = 8 << 20;

/// How a proxy's routes log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub rotation: Rotation,
    /// Keep the query string on `path` (off: it may carry tokens).
    pub query: bool,
}

/// One line.
#[derive(Serialize)]
pub struct Line<'a> {
    /// Unix seconds, to the microsecond, when the request's head had come (as deploy.log's
    /// `ts`, so the two join by time).
    pub ts: f64,
    pub route: &'a str,
    pub host: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    pub status: u16,
    /// Bytes of the answer sent to the client after its head.
    pub bytes: u64,
    pub duration_ms: f64,
    /// The release that answered (none: rollgate answered itself — maintenance, nothing live).
    pub release: Option<&'a str>,
    pub slot: Option<u16>,
    pub client: IpAddr,
    pub request_id: &'a str,
}

struct Buffer {
    text: Vec<u8>,
    /// This thread's requests numbered, for request ids.
    counted: u64,
}

/// A route's access log.
pub struct AccessLog {
    path: PathBuf,
    settings: Settings,
    buffers: Box<[Mutex<Buffer>]>,
    dropped: AtomicU64,
    /// Request ids are `{proxy start, ms, hex}-{thread}-{n}`: unique across the proxy's runs.
    started_ms: u64,
}

impl AccessLog {
    pub fn new(root: &Path, settings: Settings, threads: usize, started_ms: u64) -> AccessLog {
        AccessLog {
            path: root.join(ACCESS_FILE),
            settings,
            buffers: (0..threads.max(1))
                .map(|_| {
                    Mutex::new(Buffer {
                        text: Vec::with_capacity(16 << 10),
                        counted: 0,
                    })
                })
                .collect(),
            dropped: AtomicU64::new(0),
            started_ms,
        }
    }

    pub fn keeps_query(&self) -> bool {
        self.settings.query
    }

    /// A request id for a request of `thread` that brought none.
    pub fn request_id(&self, thread: usize) -> String {
        let mut buffer = self.buffer(thread);
        buffer.counted += 1;
        format!("{:x}-{thread}-{}", self.started_ms, buffer.counted)
    }

    fn buffer(&self, thread: usize) -> std::sync::MutexGuard<'_, Buffer> {
        self.buffers[thread % self.buffers.len()]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `line` to `thread`'s buffer.
    pub fn write(&self, thread: usize, line: &Line<'_>) {
        let mut buffer = self.buffer(thread);
        if buffer.text.len() > MAX_BUFFERED {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if serde_json::to_writer(&mut buffer.text, line).is_ok() {
            buffer.text.push(b'\n');
        }
    }

    /// Moves every buffer to the file, rotating it first when the lines would take it past
    /// its bound.
    pub fn flush(&self) {
        let mut text = Vec::new();
        for buffer in self.buffers.iter() {
            let mut buffer = buffer.lock().unwrap_or_else(|p| p.into_inner());
            if text.is_empty() {
                std::mem::swap(&mut text, &mut buffer.text);
            } else {
                text.extend_from_slice(&buffer.text);
                buffer.text.clear();
            }
        }
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            eprintln!(
                "rollgate proxy: {dropped} access log lines dropped: {} could not keep up",
                self.path.display()
            );
        }
        if text.is_empty() {
            return;
        }
        if let Err(e) = self.append(&text) {
            eprintln!(
                "rollgate proxy: cannot write {}: {e} ({} bytes of lines lost)",
                self.path.display(),
                text.len()
            );
        }
    }

    /// Appends whole lines, beginning a new file (the others shifted) whenever the next lines
    /// would take this one past its bound: no file is ever larger than the bound (but for a
    /// single line larger than it, alone in its file).
    fn append(&self, mut text: &[u8]) -> std::io::Result<()> {
        let max = self.settings.rotation.max_bytes;
        let mut size = std::fs::metadata(&self.path).map_or(0, |m| m.len());
        while !text.is_empty() {
            let room = max.saturating_sub(size) as usize;
            // The longest run of whole lines that fits.
            let fits = match text.len() <= room {
                true => text.len(),
                false => text[..room]
                    .iter()
                    .rposition(|b| *b == b'\n')
                    .map_or(0, |at| at + 1),
            };
            let take = match (fits, size) {
                (0, 0) => text
                    .iter()
                    .position(|b| *b == b'\n')
                    .map_or(text.len(), |at| at + 1),
                (0, _) => {
                    shift(&self.path, self.settings.rotation.keep)?;
                    size = 0;
                    continue;
                }
                (fits, _) => fits,
            };
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
            file.write_all(&text[..take])?;
            size += take as u64;
            text = &text[take..];
        }
        Ok(())
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Runs while the route is configured: flushes `log` every [`FLUSH_EVERY`] (it holds the log
/// weakly: a route a reload removed is flushed one last time when its last request ends).
pub async fn keep_flushing(log: Weak<AccessLog>) {
    let mut ticker = tokio::time::interval(FLUSH_EVERY);
    loop {
        ticker.tick().await;
        match log.upgrade() {
            Some(log) => log.flush(),
            None => return,
        }
    }
}

/// The path as logged: the query string cut off unless kept.
pub fn logged_path(target: &str, keep_query: bool) -> &str {
    match (keep_query, target.split_once('?')) {
        (false, Some((path, _))) => path,
        _ => target,
    }
}

/// A request id a client sent, if it is one a log line may carry (printable, at most 128).
pub fn given_request_id(value: &[u8]) -> Option<String> {
    (!value.is_empty() && value.len() <= 128 && value.iter().all(|b| b.is_ascii_graphic()))
        .then(|| String::from_utf8_lossy(value).into_owned())
}

/// What a request's line needs from its start.
pub struct Begun {
    pub at: std::time::Instant,
    pub ts: f64,
    pub host: String,
    pub method: String,
    pub path: String,
    pub request_id: String,
}

impl Begun {
    /// Writes the request's line into `log`.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        &self,
        log: &AccessLog,
        thread: usize,
        route: &str,
        status: u16,
        bytes: u64,
        release: Option<(&str, u16)>,
        client: IpAddr,
    ) {
        log.write(
            thread,
            &Line {
                ts: self.ts,
                route,
                host: &self.host,
                method: &self.method,
                path: &self.path,
                status,
                bytes,
                duration_ms: self.at.elapsed().as_secs_f64() * 1e3,
                release: release.map(|(version, _)| version),
                slot: release.map(|(_, slot)| slot),
                client,
                request_id: &self.request_id,
            },
        );
    }
}

/// Unix seconds now, to the microsecond.
pub fn now_ts() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| (d.as_micros() as f64) / 1e6)
}

/// Starts the flusher for `log` on the current runtime; the handle aborts it.
pub fn start(log: &Arc<AccessLog>) -> tokio::task::AbortHandle {
    tokio::spawn(keep_flushing(Arc::downgrade(log))).abort_handle()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_go_to_the_file_whole_and_it_rotates_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let log = AccessLog::new(
            dir.path(),
            Settings {
                rotation: Rotation {
                    max_bytes: 4096,
                    keep: 3,
                },
                query: false,
            },
            2,
            1,
        );
        let begun = Begun {
            at: std::time::Instant::now(),
            ts: 1.5,
            host: "a.test".into(),
            method: "GET".into(),
            path: logged_path("/x?token=1", false).into(),
            request_id: log.request_id(1),
        };
        for n in 0..200 {
            begun.finish(
                &log,
                n % 2,
                "app",
                200,
                5,
                Some(("v1", 0)),
                "127.0.0.1".parse().unwrap(),
            );
            if n % 20 == 0 {
                log.flush();
            }
        }
        drop(log);
        let mut lines = 0;
        for name in ["access.log", "access.log.1", "access.log.2"] {
            let path = dir.path().join(name);
            assert!(std::fs::metadata(&path).unwrap().len() <= 4096, "{name}");
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let value: serde_json::Value = serde_json::from_str(line).unwrap();
                assert_eq!(value["path"], "/x");
                assert_eq!(value["request_id"], "1-1-1");
                lines += 1;
            }
        }
        assert!(!dir.path().join("access.log.3").exists());
        assert!(lines > 0 && lines < 200, "rotated away the oldest: {lines}");
    }
}
