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

use super::fate::Fate;
use super::wire::{host_name_bytes, push_decimal, push_ip};
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
    /// Log one request in this many (1: every request, the default; the counts in the log
    /// then equal what clients got).
    pub sample: u64,
}

/// A serving thread's count of requests seen, on a cache line of its own (threads count at
/// once).
#[repr(align(64))]
#[derive(Default)]
struct Seen(AtomicU64);

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
    writer: Mutex<Writer>,
    /// Requests seen by each thread, for `sample`.
    seen: Box<[Seen]>,
    /// Request ids are `{proxy start, ms, hex}-{thread}-{n}`: unique across the proxy's runs.
    /// This is their `{start}-`.
    id_prefix: String,
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
            writer: Mutex::default(),
            seen: (0..threads.max(1)).map(|_| Seen::default()).collect(),
            id_prefix: format!("{started_ms:x}-"),
        }
    }

    pub fn keeps_query(&self) -> bool {
        self.settings.query
    }

    /// Whether this request of `thread` is one the log keeps (every one unless sampled).
    pub fn samples(&self, thread: usize) -> bool {
        let every = self.settings.sample;
        every <= 1
            || self.seen[thread % self.seen.len()]
                .0
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(every)
    }

    fn buffer(&self, thread: usize) -> std::sync::MutexGuard<'_, Buffer> {
        self.buffers[thread % self.buffers.len()]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Moves every buffer to the file, rotating it first when the lines would take it past
    /// its bound.
    pub fn flush(&self) {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let writer = &mut *writer;
        // Copied out, so every buffer keeps its memory: a buffer left empty would grow again
        // from nothing after each flush (allocations and page faults at every request rate).
        writer.spare.clear();
        for buffer in self.buffers.iter() {
            let mut buffer = buffer.lock().unwrap_or_else(|p| p.into_inner());
            writer.spare.extend_from_slice(&buffer.text);
            buffer.text.clear();
        }
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            eprintln!(
                "rollgate proxy: {dropped} access log lines dropped: {} could not keep up",
                self.path.display()
            );
        }
        if writer.spare.is_empty() {
            return;
        }
        let text = std::mem::take(&mut writer.spare);
        if let Err(e) = self.append(writer, &text) {
            // Closed, so the next flush opens the file again (it may have been moved away).
            writer.file = None;
            eprintln!(
                "rollgate proxy: cannot write {}: {e} ({} bytes of lines lost)",
                self.path.display(),
                text.len()
            );
        }
        writer.spare = text;
    }

    /// Appends whole lines, beginning a new file (the others shifted) whenever the next lines
    /// would take this one past its bound: no file is ever larger than the bound (but for a
    /// single line larger than it, alone in its file). The file stays open between flushes.
    fn append(&self, writer: &mut Writer, mut text: &[u8]) -> std::io::Result<()> {
        let max = self.settings.rotation.max_bytes;
        while !text.is_empty() {
            let (file, size) = match &mut writer.file {
                Some((file, size)) => (file, size),
                slot => {
                    let file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&self.path)?;
                    let size = file.metadata()?.len();
                    let (file, size) = slot.insert((file, size));
                    (file, size)
                }
            };
            let room = max.saturating_sub(*size) as usize;
            // The longest run of whole lines that fits.
            let fits = match text.len() <= room {
                true => text.len(),
                false => text[..room]
                    .iter()
                    .rposition(|b| *b == b'\n')
                    .map_or(0, |at| at + 1),
            };
            let take = match (fits, *size) {
                (0, 0) => text
                    .iter()
                    .position(|b| *b == b'\n')
                    .map_or(text.len(), |at| at + 1),
                (0, _) => {
                    writer.file = None;
                    shift(&self.path, self.settings.rotation.keep)?;
                    continue;
                }
                (fits, _) => fits,
            };
            file.write_all(&text[..take])?;
            *size += take as u64;
            text = &text[take..];
        }
        Ok(())
    }
}

/// The file being written and the flush's own buffer.
#[derive(Default)]
struct Writer {
    file: Option<(std::fs::File, u64)>,
    spare: Vec<u8>,
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

/// A request's line, begun when its head has come: its first fields are written at once
/// (`ts`, `route`, `host`, `method`, `path`), the rest when it is answered. Written by hand
/// into one buffer (digits without `fmt`, strings copied whole unless they need escaping):
/// it runs for every request while the log is on (BENCHMARKS.md has what it costs).
pub struct Begun {
    at: std::time::Instant,
    line: Vec<u8>,
    /// The client's `X-Request-Id`, else one is made at the end.
    request_id: Option<String>,
}

impl Begun {
    /// `line` is a buffer to reuse (a connection's: no allocation per request once it has
    /// grown); it is cleared first.
    pub fn new(
        log: &AccessLog,
        mut line: Vec<u8>,
        route: &str,
        host: &[u8],
        method: &str,
        target: &str,
        request_id: Option<String>,
    ) -> Begun {
        line.clear();
        line.extend_from_slice(b"{\"ts\":");
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        push_decimal(&mut line, since.as_secs());
        line.push(b'.');
        push_padded(&mut line, u64::from(since.subsec_micros()), 6);
        line.extend_from_slice(b",\"route\":");
        json_string(&mut line, route.as_bytes(), false);
        line.extend_from_slice(b",\"host\":");
        json_string(&mut line, host_name_bytes(host), true);
        line.extend_from_slice(b",\"method\":");
        json_string(&mut line, method.as_bytes(), false);
        line.extend_from_slice(b",\"path\":");
        json_string(
            &mut line,
            logged_path(target, log.keeps_query()).as_bytes(),
            false,
        );
        Begun {
            at: std::time::Instant::now(),
            line,
            request_id,
        }
    }

    /// Ends the line (the answer's status and how the request ended, bytes sent after the
    /// head, the release named) and adds it to `thread`'s buffer of `log`; gives the buffer
    /// back.
    pub fn finish(
        mut self,
        log: &AccessLog,
        thread: usize,
        (status, fate): (u16, Fate),
        bytes: u64,
        release: Option<(&[u8], u16)>,
        client: IpAddr,
    ) -> Vec<u8> {
        let micros = self.at.elapsed().as_micros() as u64;
        let line = &mut self.line;
        line.extend_from_slice(b",\"status\":");
        push_decimal(line, u64::from(status));
        line.extend_from_slice(b",\"fate\":\"");
        line.extend_from_slice(fate.label().as_bytes());
        line.push(b'"');
        line.extend_from_slice(b",\"bytes\":");
        push_decimal(line, bytes);
        line.extend_from_slice(b",\"duration_ms\":");
        push_decimal(line, micros / 1000);
        line.push(b'.');
        push_padded(line, micros % 1000, 3);
        line.extend_from_slice(b",\"release\":");
        match release {
            Some((version, slot)) => {
                json_string(line, version, false);
                line.extend_from_slice(b",\"slot\":");
                push_decimal(line, u64::from(slot));
            }
            None => line.extend_from_slice(b"null,\"slot\":null"),
        }
        line.extend_from_slice(b",\"client\":\"");
        push_ip(line, client);
        line.extend_from_slice(b"\",\"request_id\":");
        let mut buffer = log.buffer(thread);
        match &self.request_id {
            Some(id) => json_string(line, id.as_bytes(), false),
            None => {
                buffer.counted += 1;
                line.push(b'"');
                line.extend_from_slice(log.id_prefix.as_bytes());
                push_decimal(line, thread as u64);
                line.push(b'-');
                push_decimal(line, buffer.counted);
                line.push(b'"');
            }
        }
        line.extend_from_slice(b"}\n");
        if buffer.text.len() > MAX_BUFFERED {
            log.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            buffer.text.extend_from_slice(line);
        }
        drop(buffer);
        std::mem::take(&mut self.line)
    }
}

/// `n` in at least `width` digits, zeros first.
fn push_padded(out: &mut Vec<u8>, n: u64, width: usize) {
    let start = out.len();
    push_decimal(out, n);
    let written = out.len() - start;
    if written < width {
        let zeros = width - written;
        out.splice(start..start, std::iter::repeat_n(b'0', zeros));
    }
}

/// `text` as a JSON string (`lower`: in lowercase): `"` and `\` escaped, control bytes as
/// `\u00XX`, bytes past ASCII percent-encoded (a path is ASCII on the wire; anything else
/// stays readable and valid). Text with none of these is copied whole.
fn json_string(out: &mut Vec<u8>, text: &[u8], lower: bool) {
    out.push(b'"');
    let plain = |b: &u8| (0x20..0x7f).contains(b) && *b != b'"' && *b != b'\\';
    if text.iter().all(plain) {
        let start = out.len();
        out.extend_from_slice(text);
        if lower {
            out[start..].make_ascii_lowercase();
        }
    } else {
        for &byte in text {
            match byte {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                0..=0x1f | 0x7f => {
                    let _ = write!(out, "\\u{byte:04x}");
                }
                0x80..=0xff => {
                    let _ = write!(out, "%{byte:02X}");
                }
                _ if lower => out.push(byte.to_ascii_lowercase()),
                _ => out.push(byte),
            }
        }
    }
    out.push(b'"');
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
                sample: 1,
            },
            2,
            1,
        );
        for n in 0..200 {
            let begun = Begun::new(&log, Vec::new(), "app", b"A.test:80", "GET", "/x?t=1", None);
            begun.finish(
                &log,
                n % 2,
                (200, Fate::Answered),
                5,
                Some((b"v1", 0)),
                "127.0.0.1".parse().unwrap(),
            );
            if n % 20 == 0 {
                log.flush();
            }
        }
        let odd = Begun::new(
            &log,
            Vec::new(),
            "app",
            b"a",
            "GET",
            "/q\"\\\u{1}\u{e9}",
            Some("id-1".into()),
        );
        odd.finish(
            &log,
            0,
            (404, Fate::Own(super::super::counts::Reason::NotFound)),
            0,
            None,
            "::1".parse().unwrap(),
        );
        drop(log);
        let mut lines = 0;
        let mut odd_seen = false;
        for name in ["access.log", "access.log.1", "access.log.2"] {
            let path = dir.path().join(name);
            assert!(std::fs::metadata(&path).unwrap().len() <= 4096, "{name}");
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                let value: serde_json::Value = serde_json::from_str(line).unwrap();
                lines += 1;
                if value["request_id"] == "id-1" {
                    odd_seen = true;
                    assert_eq!(value["path"], "/q\"\\\u{1}%C3%A9");
                    assert_eq!(value["release"], serde_json::Value::Null);
                    assert_eq!(value["client"], "::1");
                    assert_eq!(value["fate"], "not_found");
                    continue;
                }
                assert_eq!(value["path"], "/x");
                assert_eq!(value["fate"], "answered");
                assert_eq!(value["host"], "a.test");
                assert_eq!(
                    (value["status"].as_u64(), value["slot"].as_u64()),
                    (Some(200), Some(0))
                );
                assert!(value["ts"].as_f64().unwrap() > 1.7e9);
                assert!(value["request_id"].as_str().unwrap().starts_with("1-"));
            }
        }
        assert!(odd_seen);
        assert!(!dir.path().join("access.log.3").exists());
        assert!(lines > 0 && lines < 201, "rotated away the oldest: {lines}");
    }
}
