//! Following a log as it grows, the way `tail -F` does: whole records only, through rotation
//! and truncation, from a position that can be written down and resumed from.
//!
//! A position is a [`Cursor`]: the file's identity (device and inode) and the offset just past
//! the last whole record read. Rotation renames the file (`deploy.log` to `deploy.log.1`, the
//! inode going with it), so a cursor still finds its place afterwards: the follower finishes the
//! file it was reading, then moves to the next newer one (`.2` to `.1` to the live log) at its
//! beginning. A file that shrank under its cursor was truncated (`copytruncate`) and is read
//! again from its start, and so is one truncated and written again past its old length (the
//! bytes just before the cursor are checked on every read). A line is a record only once its
//! newline is there; a half-written line waits for the rest.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where a follower is: a file by identity, and the offset just past its last whole record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub dev: u64,
    pub inode: u64,
    pub offset: u64,
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.dev, self.inode, self.offset)
    }
}

impl std::str::FromStr for Cursor {
    type Err = String;

    fn from_str(text: &str) -> Result<Cursor, String> {
        let parts: Vec<&str> = text.split('.').collect();
        let number = |i: usize| -> Result<u64, String> {
            parts
                .get(i)
                .and_then(|p| p.parse().ok())
                .ok_or_else(|| format!("{text:?} is not a log position (DEV.INODE.OFFSET)"))
        };
        if parts.len() != 3 {
            return Err(format!("{text:?} is not a log position (DEV.INODE.OFFSET)"));
        }
        Ok(Cursor {
            dev: number(0)?,
            inode: number(1)?,
            offset: number(2)?,
        })
    }
}

/// One whole record as it is in the file, and the position just past it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub text: String,
    pub after: Cursor,
}

/// Where a new follower starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Only records appended from now on.
    End,
    /// Every record of the live log, then what is appended.
    Beginning,
    /// Just past this position, wherever rotation has taken its file since.
    After(Cursor),
}

/// The file being read: its identity, the offset past its last whole record, and the bytes
/// just before that offset as they were read (to tell a rewritten file from a grown one).
struct Open {
    file: File,
    id: (u64, u64),
    offset: u64,
    seen: Vec<u8>,
}

impl Open {
    fn new(file: File, offset: u64) -> std::io::Result<Open> {
        let meta = file.metadata()?;
        Ok(Open {
            file,
            id: (meta.dev(), meta.ino()),
            offset,
            seen: Vec::new(),
        })
    }
}

/// How many bytes before the cursor are checked.
const SEEN: usize = 64;

pub struct Follower {
    path: PathBuf,
    open: Option<Open>,
    start: Start,
    /// Set when a resumed position's file could not be found: its records may be missed.
    pub lost_place: bool,
}

/// The largest record read; anything longer without a newline is skipped, not kept in memory.
const MAX_LINE: usize = 16 << 20;

impl Follower {
    pub fn new(path: &Path, start: Start) -> Follower {
        Follower {
            path: path.to_path_buf(),
            open: None,
            start,
            lost_place: false,
        }
    }

    /// Where the follower is now (None until the log exists).
    pub fn cursor(&self) -> Option<Cursor> {
        self.open.as_ref().map(|open| Cursor {
            dev: open.id.0,
            inode: open.id.1,
            offset: open.offset,
        })
    }

    /// Whether a file is being read (false while the log does not exist yet).
    pub fn is_reading(&self) -> bool {
        self.open.is_some()
    }

    /// The whole records appended since the last call, oldest first.
    pub fn poll(&mut self) -> std::io::Result<Vec<Line>> {
        let mut lines = Vec::new();
        if self.open.is_none() && !self.open_first()? {
            return Ok(lines);
        }
        // A rotated file is finished first, then the next newer one is read from its start:
        // at most as many moves as there are rotated files.
        for _ in 0..64 {
            self.read_whole_lines(&mut lines)?;
            let Some(open) = &self.open else {
                break;
            };
            let id = open.id;
            match identity(&self.path) {
                Some(live) if live == id => break,
                // Rotated away (or the log is not there now): the next newer file, if any.
                _ => match self.newer_than(id) {
                    Some(next) => self.open = Some(Open::new(File::open(&next)?, 0)?),
                    None => break,
                },
            }
        }
        Ok(lines)
    }

    /// Opens the file the start names; false while the log does not exist.
    fn open_first(&mut self) -> std::io::Result<bool> {
        let (path, offset) = match self.start {
            Start::End | Start::Beginning => {
                let Ok(file) = File::open(&self.path) else {
                    // Not there yet: everything it will hold is new.
                    self.start = Start::Beginning;
                    return Ok(false);
                };
                let offset = match self.start {
                    // From the end, but not inside a half-written record.
                    Start::End => whole_records_end(&file, file.metadata()?.len())?,
                    _ => 0,
                };
                self.open = Some(Open::new(file, offset)?);
                self.start = Start::Beginning;
                return Ok(true);
            }
            Start::After(cursor) => match self.find((cursor.dev, cursor.inode)) {
                Some(path) => (path, cursor.offset),
                None => {
                    // Its file is gone (rotated out of reach): from the oldest one there is.
                    self.lost_place = true;
                    match self.rotated().into_iter().next() {
                        Some(oldest) => (oldest, 0),
                        None => (self.path.clone(), 0),
                    }
                }
            },
        };
        let Ok(file) = File::open(&path) else {
            return Ok(false);
        };
        let offset = if file.metadata()?.len() < offset {
            0
        } else {
            offset
        };
        self.open = Some(Open::new(file, offset)?);
        self.start = Start::Beginning;
        Ok(true)
    }

    fn read_whole_lines(&mut self, lines: &mut Vec<Line>) -> std::io::Result<()> {
        let Some(open) = self.open.as_mut() else {
            return Ok(());
        };
        let len = open.file.metadata()?.len();
        if len < open.offset || !still_there(open)? {
            // Truncated in place (and perhaps written again): what is there now is new.
            open.offset = 0;
            open.seen.clear();
        }
        if len <= open.offset {
            return Ok(());
        }
        open.file.seek(SeekFrom::Start(open.offset))?;
        let mut buffer = Vec::new();
        (&open.file)
            .take((len - open.offset).min(64 << 20))
            .read_to_end(&mut buffer)?;
        let mut start = 0;
        while let Some(end) = memchr::memchr(b'\n', &buffer[start..]) {
            let line = &buffer[start..start + end];
            start += end + 1;
            let text = String::from_utf8_lossy(line)
                .trim_end_matches('\r')
                .to_string();
            if text.trim().is_empty() {
                continue;
            }
            lines.push(Line {
                text,
                after: Cursor {
                    dev: open.id.0,
                    inode: open.id.1,
                    offset: open.offset + start as u64,
                },
            });
        }
        if start == 0 && buffer.len() >= MAX_LINE {
            // A "line" this long with no end is not a record: step over it.
            start = buffer.len();
        }
        if start > 0 {
            let mut seen = std::mem::take(&mut open.seen);
            seen.extend_from_slice(&buffer[..start]);
            let keep = seen.len().min(SEEN);
            open.seen = seen.split_off(seen.len() - keep);
        }
        open.offset += start as u64;
        Ok(())
    }

    /// The rotated copies of the log, oldest first (`deploy.log.3`, `.2`, `.1`).
    fn rotated(&self) -> Vec<PathBuf> {
        let mut numbered: Vec<(u32, PathBuf)> = Vec::new();
        let (Some(dir), Some(name)) = (self.path.parent(), self.path.file_name()) else {
            return Vec::new();
        };
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let prefix = format!("{}.", name.to_string_lossy());
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let file_name = entry.file_name().to_string_lossy().into_owned();
                if let Some(n) = file_name
                    .strip_prefix(&prefix)
                    .and_then(|n| n.parse::<u32>().ok())
                {
                    numbered.push((n, entry.path()));
                }
            }
        }
        numbered.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
        numbered.into_iter().map(|(_, path)| path).collect()
    }

    /// The oldest-first chain of files: the rotated copies, then the live log.
    fn chain(&self) -> Vec<PathBuf> {
        let mut chain = self.rotated();
        chain.push(self.path.clone());
        chain
    }

    fn find(&self, id: (u64, u64)) -> Option<PathBuf> {
        self.chain()
            .into_iter()
            .find(|path| identity(path) == Some(id))
    }

    /// The file after the one with `id` in the chain (the live log after `.1`).
    fn newer_than(&self, id: (u64, u64)) -> Option<PathBuf> {
        let chain = self.chain();
        match chain.iter().position(|path| identity(path) == Some(id)) {
            Some(i) => chain.get(i + 1).cloned(),
            // Ours is gone from the chain: the live log, if it is a file.
            None => identity(&self.path).map(|_| self.path.clone()),
        }
    }
}

/// Whether the bytes just before the cursor are the ones read there.
fn still_there(open: &mut Open) -> std::io::Result<bool> {
    if open.seen.is_empty() {
        return Ok(true);
    }
    let from = open.offset - open.seen.len() as u64;
    open.file.seek(SeekFrom::Start(from))?;
    let mut now = vec![0; open.seen.len()];
    match open.file.read_exact(&mut now) {
        Ok(()) => Ok(now == open.seen),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The end of the last whole record within the first `len` bytes.
fn whole_records_end(file: &File, len: u64) -> std::io::Result<u64> {
    let mut file = file;
    let from = len.saturating_sub(MAX_LINE as u64);
    file.seek(SeekFrom::Start(from))?;
    let mut tail = Vec::new();
    file.take(len - from).read_to_end(&mut tail)?;
    Ok(match memchr::memrchr(b'\n', &tail) {
        Some(at) => from + at as u64 + 1,
        None => from,
    })
}

/// How often `log follow` looks for new records.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// `rollgate log follow`: every new record the selection admits, written as it is appended
/// (json: the record as it is; table: one line each; csv: a header, then a row each), until
/// the reader goes away (`| head`) or rollgate is stopped. A line that is not a record is said
/// on stderr and skipped, or with `strict` ends it.
pub fn print_records(
    path: &Path,
    start: Start,
    format: crate::render::Format,
    reading: &super::Reading,
    out: &mut dyn std::io::Write,
    mut keep_going: impl FnMut() -> bool,
) -> Result<(), super::LogError> {
    use crate::render::{csv_field, time::format_time, Format};
    let mut follower = Follower::new(path, start);
    if format == Format::Csv && writeln!(out, "ts,event,service,version,slot,detail").is_err() {
        return Ok(());
    }
    let mut said_waiting = false;
    while keep_going() {
        let lines = follower
            .poll()
            .map_err(|e| super::LogError::Usage(format!("{}: {e}", path.display())))?;
        // Said once, after a poll found no file: from then on everything the log will hold is
        // printed from its first record, so a person (or a script) may start writing it.
        if !follower.is_reading() && !said_waiting {
            eprintln!(
                "rollgate: {} does not exist yet; waiting for it (every record it gets will be printed)",
                path.display()
            );
            said_waiting = true;
        }
        for line in lines {
            let record: serde_json::Value = match serde_json::from_str(&line.text) {
                Ok(value @ serde_json::Value::Object(_)) => value,
                _ => {
                    let said = format!("{}: a line that is not a record", path.display());
                    if reading.strict {
                        return Err(super::LogError::Usage(format!("{said} (--strict)")));
                    }
                    eprintln!("rollgate: {said}, skipped");
                    continue;
                }
            };
            let text = |field: &str| record.get(field).and_then(|v| v.as_str()).unwrap_or("");
            let ts = record.get("ts").and_then(serde_json::Value::as_f64);
            if !reading
                .selection
                .admits(ts, record.get("version").and_then(|v| v.as_str()))
            {
                continue;
            }
            let slot = record
                .get("slot")
                .and_then(serde_json::Value::as_u64)
                .map_or(String::new(), |s| s.to_string());
            let written = match format {
                Format::Json => writeln!(out, "{}", line.text),
                Format::Table => writeln!(
                    out,
                    "{}  {:<18} {} {}{}  {}",
                    ts.map_or("-".to_string(), format_time),
                    text("event"),
                    text("service"),
                    text("version"),
                    if slot.is_empty() {
                        String::new()
                    } else {
                        format!(" #{slot}")
                    },
                    text("detail")
                ),
                Format::Csv => writeln!(
                    out,
                    "{},{},{},{},{},{}",
                    ts.map_or(String::new(), |t| t.to_string()),
                    csv_field(text("event")),
                    csv_field(text("service")),
                    csv_field(text("version")),
                    slot,
                    csv_field(text("detail"))
                ),
            };
            if written.and_then(|()| out.flush()).is_err() {
                // The reader went away.
                return Ok(());
            }
        }
        std::thread::sleep(FOLLOW_POLL);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn append(path: &Path, text: &str) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        file.write_all(text.as_bytes()).unwrap();
    }

    fn texts(lines: &[Line]) -> Vec<&str> {
        lines.iter().map(|l| l.text.as_str()).collect()
    }

    #[test]
    fn whole_records_through_rotation_and_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("deploy.log");
        append(&log, "{\"n\":0}\n{\"n\":1");
        let mut follower = Follower::new(&log, Start::Beginning);
        assert_eq!(texts(&follower.poll().unwrap()), ["{\"n\":0}"]);
        // The rest of a half-written line makes it whole.
        append(&log, "}\n");
        assert_eq!(texts(&follower.poll().unwrap()), ["{\"n\":1}"]);
        // Rotation: a last line in the old file, then the new file's.
        append(&log, "{\"n\":2}\n");
        std::fs::rename(&log, dir.path().join("deploy.log.1")).unwrap();
        append(&dir.path().join("deploy.log.1"), "{\"n\":3}\n");
        append(&log, "{\"n\":4}\n");
        assert_eq!(
            texts(&follower.poll().unwrap()),
            ["{\"n\":2}", "{\"n\":3}", "{\"n\":4}"]
        );
        // Truncation in place: what comes after is read from the start.
        std::fs::write(&log, "").unwrap();
        append(&log, "{\"n\":5}\n");
        assert_eq!(texts(&follower.poll().unwrap()), ["{\"n\":5}"]);
    }

    #[test]
    fn a_cursor_resumes_after_its_record_even_once_its_file_was_rotated() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("deploy.log");
        append(&log, "a\nb\nc\n");
        let mut follower = Follower::new(&log, Start::Beginning);
        let lines = follower.poll().unwrap();
        let after_b = lines[1].after;
        assert_eq!(after_b.to_string().parse::<Cursor>(), Ok(after_b));
        // Rotated twice since, with new records in each file.
        std::fs::rename(&log, dir.path().join("deploy.log.1")).unwrap();
        append(&log, "d\n");
        std::fs::rename(
            dir.path().join("deploy.log.1"),
            dir.path().join("deploy.log.2"),
        )
        .unwrap();
        std::fs::rename(&log, dir.path().join("deploy.log.1")).unwrap();
        append(&log, "e\n");
        let mut resumed = Follower::new(&log, Start::After(after_b));
        assert_eq!(texts(&resumed.poll().unwrap()), ["c", "d", "e"]);
        assert!(!resumed.lost_place);
        // From the end: only what comes next.
        let mut tail = Follower::new(&log, Start::End);
        assert!(tail.poll().unwrap().is_empty());
        append(&log, "f\n");
        assert_eq!(texts(&tail.poll().unwrap()), ["f"]);
    }
}
