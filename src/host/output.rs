//! A release's output, bounded. A release's stdout and stderr go into a pipe, and a small
//! process of rollgate's own — the pump, `rollgate output-pump` — copies the pipe into
//! `<svc>.output`, rotating it by size: when the next write would take the file past
//! `max_bytes`, it becomes `<svc>.output.1` (`.1` becomes `.2`, and so on), and a new file is
//! begun; `keep` files are kept in all, the one being written among them. So a release that
//! writes without end holds at most `keep × max_bytes` of disk (caprover#98 was a 17 GB log).
//!
//! The pump is its own process, not a task of rollgate's, because a promoted release outlives
//! the rollgate that started it. It runs in its own session (a signal to the release's group
//! does not reach it), ignores SIGTERM, SIGINT and SIGHUP, and ends when the pipe does: when the
//! release and everything it started have closed their end. So it never outlives the release,
//! and the release's last words are written before it goes. While it runs it holds an exclusive
//! `flock` on the file it writes; [`tail_settled`] waits (a bounded time) for that lock, so a
//! rollback reason quotes the words a release said just before it exited.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::fault::Fault;

/// The hidden command that runs the pump (`rollgate output-pump --max-bytes N --keep K FILE`).
pub const PUMP_COMMAND: &str = "output-pump";

/// How a release's output file is bounded (the policy's `output_max_bytes` and `output_keep`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rotation {
    pub max_bytes: u64,
    /// Files kept in all, the one being written among them (1: the file is begun anew).
    pub keep: u64,
}

impl Default for Rotation {
    fn default() -> Rotation {
        Rotation {
            max_bytes: crate::defaults::OUTPUT_MAX_BYTES,
            keep: crate::defaults::OUTPUT_KEEP,
        }
    }
}

impl Rotation {
    /// The policy's fields over the defaults; refused outside the contract's ranges (a `.ncl`
    /// policy need not apply the bundled contract).
    pub fn from_policy(max_bytes: Option<u64>, keep: Option<u64>) -> Result<Rotation, Fault> {
        let rotation = Rotation {
            max_bytes: max_bytes.unwrap_or(crate::defaults::OUTPUT_MAX_BYTES),
            keep: keep.unwrap_or(crate::defaults::OUTPUT_KEEP),
        };
        if !(MIN_MAX_BYTES..=MAX_MAX_BYTES).contains(&rotation.max_bytes) {
            return Err(Fault::setting(
                "output_max_bytes",
                format!(
                    "output_max_bytes is {}; it must be an integer from {MIN_MAX_BYTES} to {MAX_MAX_BYTES}",
                    rotation.max_bytes
                ),
            ));
        }
        if !(1..=MAX_KEEP).contains(&rotation.keep) {
            return Err(Fault::setting(
                "output_keep",
                format!(
                    "output_keep is {}; it must be an integer from 1 to {MAX_KEEP}",
                    rotation.keep
                ),
            ));
        }
        Ok(rotation)
    }
}

/// The contract's bounds (`contracts/rollout-policy.ncl`).
const MIN_MAX_BYTES: u64 = 64 * 1024;
const MAX_MAX_BYTES: u64 = 16 << 30;
const MAX_KEEP: u64 = 100;

/// rollgate's own files of each release, under the root: `ROOT/output/VERSION/` (see
/// `state::Root::output_dir`).
pub const OUTPUT_DIR: &str = "output";

/// `ROOT/output/VERSION`, made if missing (mode 0700: a process's output may quote its
/// secrets): the folder of release `version`'s output, its hooks' and its release phase's.
pub fn own_folder(root: &Path, version: &str) -> std::io::Result<PathBuf> {
    let folder = root.join(OUTPUT_DIR).join(version);
    make_own(&folder)?;
    Ok(folder)
}

/// Makes `folder` (and what is missing above it) rollgate's own, mode 0700.
fn make_own(folder: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(folder)
}

/// Generation `n` of the output file `path`: `path` itself for 0, else `path.n`.
pub fn generation(path: &Path, n: u64) -> PathBuf {
    if n == 0 {
        return path.to_path_buf();
    }
    let mut name: OsString = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    name.into()
}

/// Whether a file name in a release folder is rollgate's output (`x.output`, `x.output.3`),
/// which installs, digests and signatures leave out.
pub fn is_output_file(name: &str) -> bool {
    if name.ends_with(".output") {
        return true;
    }
    match name.rsplit_once('.') {
        Some((stem, n)) => {
            stem.ends_with(".output") && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// Moves every generation one up (`path` becomes `path.1`, ...), dropping those at `keep` and
/// beyond, so that `path` can be begun anew. Each step is one rename: a crash between two
/// leaves every file whole, under one name or the next.
pub fn shift(path: &Path, keep: u64) -> std::io::Result<()> {
    // Generations past `keep` (left by a larger `output_keep` before) go first.
    let mut beyond = keep.max(1);
    while generation(path, beyond).exists() {
        remove_if_there(&generation(path, beyond))?;
        beyond += 1;
    }
    if keep <= 1 {
        return remove_if_there(path);
    }
    for n in (1..keep).rev() {
        match std::fs::rename(generation(path, n - 1), generation(path, n)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn remove_if_there(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// How long a start waits for the lock on its output file: a pump still writing an earlier
/// run's last words lets go of it at once; one that does not is another process of the same
/// file still running, and the start is refused rather than left hanging.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Whether a pump holds the lock on the output file at `path` (a process of that place runs).
/// The file is rollgate's own (`ROOT/output/VERSION`, mode 0700, never in a release's tree or
/// `ROOT/data`), so it is opened by path, `O_NOFOLLOW` as [`start`] opens it.
fn held_by_a_pump(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    else {
        return false;
    };
    // SAFETY: flock on a descriptor owned here; it reads or writes no memory. A lock taken is
    // let go when `file` closes, at the end of this function.
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    !taken && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}

/// Takes the exclusive lock on `file` (at `path`), waiting at most `wait`.
fn lock_within(file: &std::fs::File, path: &Path, wait: Duration) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let deadline = std::time::Instant::now() + wait;
    loop {
        // SAFETY: flock on a descriptor the caller owns; it reads or writes no memory.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::WouldBlock {
            return Err(error);
        }
        if std::time::Instant::now() >= deadline {
            return Err(std::io::Error::other(format!(
                "{} is still being written by another process of the same release after {} s (an earlier run of it still running?)",
                path.display(),
                wait.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Before a new run of a release: the last run's output moves to `.1` (if it said anything;
/// with `keep` 1 it goes, so the bound holds from the first byte), so the log quotes this run
/// only. Then the pump starts; the returned end of its pipe is the release's stdout and stderr.
pub fn start(path: &Path, rotation: Rotation) -> std::io::Result<OwnedFd> {
    // Its folder is rollgate's own (`ROOT/output/VERSION`, mode 0700), never the release's.
    if let Some(folder) = path.parent() {
        make_own(folder)?;
    }
    // A file still held by a running process of the same place (the live copy a restart or a
    // rollout starts beside) moves away too, said something or not: its pump writes on into
    // `.1`, and this run gets a file of its own at once (issue 80: a silent worker's held
    // empty file made every restart wait 10 s and be refused).
    if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) || held_by_a_pump(path) {
        shift(path, rotation.keep)?;
    }
    // The file is opened and locked here, before the release can say anything, and handed to
    // the pump as its stdout: the lock is the open file's, so it passes to the pump, and a
    // reader waiting for it cannot read before the pump has begun.
    let first = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    // Not nix's `Flock`: its drop would unlock the file for the pump too. Closing this copy
    // after the spawn leaves the lock with the pump's.
    lock_within(&first, path, LOCK_WAIT)?;
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // `/proc/self/exe` is this very binary even if it was replaced on disk since it started.
    let mut command = tokio::process::Command::new("/proc/self/exe");
    command
        .arg0("rollgate")
        .arg(PUMP_COMMAND)
        .arg("--max-bytes")
        .arg(rotation.max_bytes.to_string())
        .arg("--keep")
        .arg(rotation.keep.to_string())
        .arg(path)
        .env_clear()
        .current_dir("/")
        .stdin(std::process::Stdio::from(read))
        .stdout(std::process::Stdio::from(first))
        .stderr(std::process::Stdio::null());
    // SAFETY: close, setsid and sigaction are async-signal-safe and touch nothing of the
    // parent.
    unsafe {
        command.pre_exec(|| {
            use nix::sys::signal::{signal, SigHandler, Signal};
            super::lock::close_held_in_child();
            // Its stdin, stdout and stderr are all it uses: nothing else of its starter's
            // goes with it (a release's held socket, placed at fd 3 for the release, kept the
            // service's port listening after the release and its holder were gone).
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            for ignored in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
                signal(ignored, SigHandler::SigIgn).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    // Not waited for here: tokio reaps it when it ends, and once rollgate has exited, init
    // does. The lock is the pump's from here on (its stdout holds the locked file), and what
    // the release says before the pump runs waits in the pipe.
    command.spawn()?;
    Ok(write)
}

/// The pump: copies `input` into `path` until the input ends, rotating by size, each line
/// begun with the time its first byte was read when `stamped` ([`Stamp`]). A write that
/// fails (the disk is full) loses that piece of output, never the release: the pipe is drained
/// whatever happens, so a release never blocks or dies on its own output.
///
/// `first`, if given, is `path` opened (and locked) by the rollgate that started the pump.
pub fn pump(
    path: &Path,
    rotation: Rotation,
    mut input: impl Read,
    first: Option<std::fs::File>,
    stamped: bool,
) -> std::io::Result<()> {
    let mut sink = Sink {
        path: path.to_path_buf(),
        rotation,
        file: None,
        written: 0,
        partial: Some(Vec::new()),
    };
    match first {
        Some(file) => sink.adopt(file),
        None => sink.open(),
    }
    let mut buffer = vec![0u8; 64 * 1024];
    let mut stamp = Stamp::default();
    let mut out = Vec::with_capacity(buffer.len());
    loop {
        let n = match input.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        match stamped {
            true => {
                stamp.lines(&buffer[..n], &now_stamp(), &mut out);
                sink.write(&out);
            }
            false => sink.write(&buffer[..n]),
        }
    }
}

/// Each line of a release's output begins with the time the pump read its first byte, in UTC
/// to the millisecond and one space (`2026-12-07T14:30:36.123Z `), as svlogd's `-tt` and
/// Heroku's router stamp lines: `rollgate logs` shows when each line was said (issue 80, 7),
/// and `--since` picks lines, not files. Readers take a line without one as it is (a line
/// longer than a whole file, split; a file an older rollgate wrote).
#[derive(Debug)]
pub struct Stamp {
    /// The next byte read begins a line.
    at_line_start: bool,
}

impl Default for Stamp {
    fn default() -> Stamp {
        Stamp {
            at_line_start: true,
        }
    }
}

/// How long a line's stamp is, its space included.
pub const STAMP_LEN: usize = 25;

impl Stamp {
    /// `chunk` into `out` (cleared first), `now` before each line it begins.
    pub fn lines(&mut self, chunk: &[u8], now: &str, out: &mut Vec<u8>) {
        out.clear();
        for piece in chunk.split_inclusive(|b| *b == b'\n') {
            if self.at_line_start {
                out.extend_from_slice(now.as_bytes());
            }
            out.extend_from_slice(piece);
            self.at_line_start = piece.ends_with(b"\n");
        }
    }
}

/// Now, as a line's stamp (its space included).
fn now_stamp() -> String {
    chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ ")
        .to_string()
}

/// A line's stamp and the words after it; None for a line without one.
pub fn stamp_of(line: &str) -> Option<(&str, &str)> {
    let bytes = line.as_bytes();
    if bytes.len() < STAMP_LEN {
        return None;
    }
    let shape = b"dddd-dd-ddTdd:dd:dd.dddZ ";
    let fits = shape.iter().zip(bytes).all(|(want, got)| match want {
        b'd' => got.is_ascii_digit(),
        other => other == got,
    });
    fits.then(|| (&line[..STAMP_LEN - 1], &line[STAMP_LEN..]))
}

/// A line without its stamp (as it is when it has none).
pub fn unstamped(line: &str) -> &str {
    stamp_of(line).map_or(line, |(_, words)| words)
}

/// The pump's stdout, when it is `path` (as the rollgate that starts a pump makes it): the
/// file that rollgate opened and locked before the release could say anything.
pub fn stdout_if_it_is(path: &Path) -> Option<std::fs::File> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned().ok()?);
    let (ours, named) = (stdout.metadata().ok()?, std::fs::metadata(path).ok()?);
    (ours.dev() == named.dev() && ours.ino() == named.ino()).then_some(stdout)
}

/// The file being written, locked, and how much it holds.
struct Sink {
    path: PathBuf,
    rotation: Rotation,
    file: Option<nix::fcntl::Flock<std::fs::File>>,
    written: u64,
    /// What the file holds past its last newline: a line begun, carried into the next file
    /// at a rotation so that no file ends or begins in the middle of a line (the pipe's
    /// chunks are no lines). None: too long to carry (split, as a line longer than a file).
    partial: Option<Vec<u8>>,
}

/// The longest begun line a rotation carries into the next file.
const CARRIED_AT_MOST: usize = 64 * 1024;

impl Sink {
    fn open(&mut self) {
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
        {
            Ok(file) => self.adopt(file),
            Err(_) => {
                self.file = None;
                self.written = 0;
            }
        }
    }

    /// Writes to `file` from now on, locked (a lock it holds already is kept).
    fn adopt(&mut self, file: std::fs::File) {
        self.file = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).ok();
        self.written = self
            .file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .map_or(0, |m| m.len());
    }

    /// Writes `chunk`, rotating first whenever it would take the file past its size. A file is
    /// cut after its last whole line that fits — a line begun by an earlier write is taken off
    /// it and carried into the next file (a line longer than a whole file is split).
    fn write(&mut self, mut chunk: &[u8]) {
        if self.file.is_none() {
            self.open();
        }
        while !chunk.is_empty() {
            let room = self.rotation.max_bytes.saturating_sub(self.written) as usize;
            if chunk.len() <= room {
                self.put(chunk);
                return;
            }
            let cut = match chunk[..room].iter().rposition(|b| *b == b'\n') {
                Some(newline) => newline + 1,
                None if self.written == 0 => room,
                None => 0,
            };
            self.put(&chunk[..cut]);
            chunk = &chunk[cut..];
            self.rotate();
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        match file.write_all(bytes) {
            Ok(()) => self.written += bytes.len() as u64,
            // Lost, and the file begun again at the next write.
            Err(_) => {
                self.file = None;
                return;
            }
        }
        let begun = match bytes.iter().rposition(|b| *b == b'\n') {
            Some(newline) => {
                self.partial = Some(Vec::new());
                &bytes[newline + 1..]
            }
            None => bytes,
        };
        if let Some(partial) = &mut self.partial {
            partial.extend_from_slice(begun);
            if partial.len() > CARRIED_AT_MOST {
                self.partial = None;
            }
        }
    }

    /// The line the file ends in, taken off it to begin the next one (unless it is the whole
    /// file: a line longer than a file is split).
    fn take_begun_line(&mut self) -> Vec<u8> {
        let begun = self.partial.replace(Vec::new()).unwrap_or_default();
        let cut = self.written.saturating_sub(begun.len() as u64);
        if begun.is_empty() || cut == 0 {
            return Vec::new();
        }
        match self.file.as_ref().map(|f| f.set_len(cut)) {
            Some(Ok(())) => begun,
            _ => Vec::new(),
        }
    }

    fn rotate(&mut self) {
        let begun = self.take_begun_line();
        self.file = None;
        if shift(&self.path, self.rotation.keep).is_err() {
            // Older output goes before the bound does.
            let _ = std::fs::remove_file(&self.path);
        }
        self.open();
        if self.written >= self.rotation.max_bytes {
            // Still full (the file could be neither moved nor removed): this piece is lost,
            // and the next write tries again. Counting from nothing keeps `write` moving.
            self.file = None;
            self.written = 0;
            return;
        }
        self.put(&begun);
    }
}

/// How long a reader waits for the pump to have written what a release said before it exited.
pub const SETTLE: Duration = Duration::from_secs(2);

/// The last `lines` lines of a release's output, once the pump has written them (at most
/// `wait` for it: a release's child that keeps the pipe open keeps the pump running). For a
/// release that has exited: its last words, not the ones still in the pipe.
pub fn tail_settled(path: &Path, lines: usize, wait: Duration) -> String {
    let deadline = std::time::Instant::now() + wait;
    while let Ok(file) = std::fs::File::open(path) {
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock) {
            Ok(_unlocked_on_drop) => break,
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(_) => break,
        }
    }
    tail(path, lines)
}

/// What a log line quotes of a release that failed: the first line of its output that names an
/// error (a traceback's exception, else the first line that looks like an error), when it is not
/// among the last lines, then the last `lines` lines. A crashed application often says why
/// early (gunicorn's `ModuleNotFoundError` at line 38 of 111) and only then how it gave up
/// (`HaltServer 'Worker failed to boot.'`): the log quotes both.
pub fn quote_settled(path: &Path, lines: usize, wait: Duration) -> String {
    let last = tail_settled(path, lines, wait);
    match first_error(path) {
        Some(cause) if !last.contains(cause.trim()) => format!("{} [...] {last}", cause.trim()),
        _ => last,
    }
}

/// How much of the start of an output file is searched for the first error.
const HEAD_BYTES: u64 = 1024 * 1024;

/// The first line of a release's output that says what went wrong: the exception line that ends
/// the first Python traceback, else the first line that looks like an error (`Error:`,
/// `SomethingError`, `Exception`, `panicked at`, `fatal`, `[ERROR]`...). Only the file's first
/// MiB is read.
pub fn first_error(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(HEAD_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines().map(unstamped);
    let mut first_looking = None;
    while let Some(line) = lines.next() {
        if line
            .trim_start()
            .starts_with("Traceback (most recent call last)")
        {
            // The frames are indented; the exception is the first line that is not.
            let exception = lines
                .by_ref()
                .find(|l| !l.trim().is_empty() && !l.starts_with(char::is_whitespace));
            if let Some(exception) = exception {
                return Some(printable(exception));
            }
            break;
        }
        if first_looking.is_none() && looks_like_an_error(line) {
            first_looking = Some(line.to_string());
        }
    }
    first_looking.map(|line| printable(&line))
}

/// Whether a line of output reads as an error report.
fn looks_like_an_error(line: &str) -> bool {
    const MARKS: [&str; 9] = [
        "Error:",
        "Error ",
        "Exception",
        "panicked at",
        "FATAL",
        "fatal:",
        "error:",
        "[ERROR]",
        "ERROR:",
    ];
    let words_end_in_error = line
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .any(|word| word.len() > 5 && word.ends_with("Error"));
    words_end_in_error || MARKS.iter().any(|mark| line.contains(mark))
}

/// A release's words made safe for a terminal and a log line (issue 66): every control
/// character (C0, DEL, C1 — an escape sequence's start among them) and every bidirectional
/// override is written as its escape (`\u{1b}`), so output that sets a window title, clears the
/// screen or reorders the text reaches the operator as visible characters. Tabs become spaces.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\t' => out.push(' '),
            c if c.is_control() || is_bidi_control(c) => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// A writer that passes a release's output on line by line, each made [`printable`]: for
/// `rollgate logs` on a terminal.
pub struct Printable<W: std::io::Write> {
    inner: W,
    line: Vec<u8>,
}

impl<W: std::io::Write> Printable<W> {
    pub fn new(inner: W) -> Printable<W> {
        Printable {
            inner,
            line: Vec::new(),
        }
    }

    fn pass_on(&mut self) -> std::io::Result<()> {
        let text = printable(&String::from_utf8_lossy(&self.line));
        self.line.clear();
        self.inner.write_all(text.as_bytes())
    }
}

impl<W: std::io::Write> std::io::Write for Printable<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        for piece in bytes.split_inclusive(|b| *b == b'\n') {
            match piece.strip_suffix(b"\n") {
                Some(line) => {
                    self.line.extend_from_slice(line);
                    self.pass_on()?;
                    self.inner.write_all(b"\n")?;
                }
                None => self.line.extend_from_slice(piece),
            }
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.pass_on()?;
        self.inner.flush()
    }
}

/// The characters that reorder text as it is shown (embeddings, overrides, isolates).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}' | '\u{061c}')
}

/// How much of the end of an output file is read to quote its last lines.
const TAIL_BYTES: u64 = 64 * 1024;

/// The last lines of a file, for the log's detail (a crashed candidate's own words). Only the
/// file's last 64 KiB are read, whatever its size.
pub fn tail(path: &Path, lines: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let Ok(len) = file.seek(SeekFrom::End(0)) else {
        return String::new();
    };
    let from = len.saturating_sub(TAIL_BYTES);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(from)).is_err()
        || file.take(TAIL_BYTES).read_to_end(&mut bytes).is_err()
    {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut kept: Vec<&str> = text
        .lines()
        .map(unstamped)
        .filter(|l| !l.trim().is_empty())
        .collect();
    // A read that starts mid-file starts mid-line: that first piece is not a whole line.
    if from > 0 && !kept.is_empty() {
        kept.remove(0);
    }
    printable(&kept[kept.len().saturating_sub(lines)..].join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rotation(max_bytes: u64, keep: u64) -> Rotation {
        Rotation { max_bytes, keep }
    }

    fn sizes(path: &Path, up_to: u64) -> Vec<Option<u64>> {
        (0..up_to)
            .map(|n| std::fs::metadata(generation(path, n)).ok().map(|m| m.len()))
            .collect()
    }

    #[test]
    fn output_file_names_are_told_from_a_release_own_files() {
        for name in [
            "edge-svc.output",
            "edge-svc.0.output",
            "edge-svc.output.1",
            "x.output.12",
        ] {
            assert!(is_output_file(name), "{name}");
        }
        for name in [
            "edge-svc",
            "output",
            "edge-svc.output.",
            "a.output.x",
            "a.outputs.1",
        ] {
            assert!(!is_output_file(name), "{name}");
        }
    }

    #[test]
    fn the_pump_keeps_keep_files_of_at_most_max_bytes_and_cuts_at_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.output");
        let line = "0123456789abcdefghi\n"; // 20 bytes
        let text: String = (0..1000).map(|i| format!("{i:05}{}", &line[5..])).collect();
        pump(&path, rotation(1000, 3), text.as_bytes(), None, false).unwrap();
        let sizes = sizes(&path, 5);
        assert_eq!(
            sizes[..3],
            [Some(1000), Some(1000), Some(1000)],
            "{sizes:?}"
        );
        assert_eq!(sizes[3..], [None, None], "{sizes:?}");
        // The newest file ends with the last line, and every file holds whole lines.
        let newest = std::fs::read_to_string(&path).unwrap();
        assert!(newest.ends_with("0099956789abcdefghi\n"), "{newest}");
        for n in 0..3 {
            let text = std::fs::read_to_string(generation(&path, n)).unwrap();
            assert!(text.lines().all(|l| l.len() == 19), "generation {n}");
        }
        let older = std::fs::read_to_string(generation(&path, 1)).unwrap();
        assert!(older.ends_with("0094956789abcdefghi\n"), "{older}");
    }

    /// A pipe's reads: these chunks, one a read.
    struct Chunks(std::collections::VecDeque<Vec<u8>>);

    impl Read for Chunks {
        fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
            let Some(chunk) = self.0.pop_front() else {
                return Ok(0);
            };
            buffer[..chunk.len()].copy_from_slice(&chunk);
            Ok(chunk.len())
        }
    }

    #[test]
    fn a_line_begun_in_one_read_and_ended_in_the_next_is_never_cut_by_a_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.output");
        // The first read fits and ends mid-line; the second has no newline within the room
        // left: the file must not end with "bb", nor the next begin with "b".
        let reads = ["aaaa\nbb", "b\ncc\n", "dddd\neeee\nf", "ff\n"];
        let chunks = Chunks(reads.iter().map(|r| r.as_bytes().to_vec()).collect());
        pump(&path, rotation(8, 9), chunks, None, false).unwrap();
        let files: Vec<String> = (0..5)
            .rev()
            .filter_map(|n| std::fs::read_to_string(generation(&path, n)).ok())
            .collect();
        assert_eq!(files.concat(), reads.concat(), "nothing lost: {files:?}");
        for file in &files {
            assert!(file.len() <= 8, "{files:?}");
            assert!(file.ends_with('\n'), "whole lines only: {files:?}");
        }
    }

    #[test]
    fn a_line_longer_than_a_file_is_split_and_nothing_is_lost_below_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.output");
        let text = "x".repeat(2500);
        pump(&path, rotation(1000, 5), text.as_bytes(), None, false).unwrap();
        assert_eq!(
            sizes(&path, 4),
            [Some(500), Some(1000), Some(1000), None],
            "newest first"
        );
    }

    #[test]
    fn keep_one_begins_the_file_anew_and_a_smaller_keep_drops_older_generations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.output");
        for n in 0..6 {
            std::fs::write(generation(&path, n), "old\n").unwrap();
        }
        shift(&path, 3).unwrap();
        assert_eq!(
            sizes(&path, 7),
            [None, Some(4), Some(4), None, None, None, None]
        );
        std::fs::write(&path, "now\n").unwrap();
        shift(&path, 1).unwrap();
        assert_eq!(sizes(&path, 3), [None, None, None]);
    }

    #[test]
    fn a_settled_tail_reads_at_once_when_no_pump_holds_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("svc.output");
        std::fs::write(&path, "one\ntwo\nthree\n").unwrap();
        let started = std::time::Instant::now();
        assert_eq!(tail_settled(&path, 2, SETTLE), "two | three");
        assert!(started.elapsed() < SETTLE);
        assert_eq!(tail_settled(&dir.path().join("none"), 2, SETTLE), "");
    }

    #[test]
    fn the_tail_reads_the_end_of_a_long_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out");
        let mut text = "x".repeat(200_000);
        text.push_str("\nsecond to last\n\nlast words\n");
        std::fs::write(&path, text).unwrap();
        assert_eq!(tail(&path, 2), "second to last | last words");
        assert_eq!(tail(&dir.path().join("missing"), 3), "");
    }

    #[test]
    fn each_line_is_stamped_once_where_it_begins_whatever_the_reads() {
        let mut stamp = Stamp::default();
        let mut out = Vec::new();
        let mut file = Vec::new();
        // A line begun in one read and ended in the next gets one time, the first read's.
        for (read, now) in [
            ("one\ntw", "2026-12-07T10:00:00.001Z "),
            ("o\n", "2026-12-07T10:00:00.002Z "),
            ("\nthree", "2026-12-07T10:00:00.003Z "),
        ] {
            stamp.lines(read.as_bytes(), now, &mut out);
            file.extend_from_slice(&out);
        }
        assert_eq!(
            String::from_utf8(file).unwrap(),
            "2026-12-07T10:00:00.001Z one\n2026-12-07T10:00:00.001Z two\n\
             2026-12-07T10:00:00.003Z \n2026-12-07T10:00:00.003Z three"
        );
        assert_eq!(now_stamp().len(), STAMP_LEN);
        assert!(stamp_of(&now_stamp()).is_some(), "{}", now_stamp());
    }

    #[test]
    fn a_stamp_is_told_from_words_that_merely_look_like_one() {
        assert_eq!(
            stamp_of("2026-12-07T10:00:00.001Z job 7 done"),
            Some(("2026-12-07T10:00:00.001Z", "job 7 done"))
        );
        for line in [
            "job 7 done",
            "2026-12-07 10:00:00.001Z job",
            "2026-12-07T10:00:00Z job 7 done",
            "2026-12-07T10:00:00.001Zjob",
            "2026-12-07T10:00:00.001Z",
        ] {
            assert_eq!(stamp_of(line), None, "{line}");
            assert_eq!(unstamped(line), line);
        }
    }

    #[test]
    fn quotes_of_a_stamped_file_leave_the_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.output");
        let stamped: String = GUNICORN_BOOT_FAILURE
            .lines()
            .map(|l| format!("2026-12-07T10:00:00.001Z {l}\n"))
            .collect();
        std::fs::write(&path, stamped).unwrap();
        assert_eq!(
            first_error(&path).as_deref(),
            Some("ModuleNotFoundError: No module named 'flaskx'")
        );
        assert_eq!(
            tail(&path, 2),
            "[2026-12-05 10:00:01 +0000] [7] [ERROR] Shutting down: Master | \
             [2026-12-05 10:00:01 +0000] [7] [ERROR] Reason: Worker failed to boot."
        );
    }

    /// What gunicorn prints when a worker cannot import the application: the cause in the
    /// middle, and three lines of shutting down after it.
    const GUNICORN_BOOT_FAILURE: &str = "\
[2026-12-05 10:00:00 +0000] [7] [INFO] Starting gunicorn 23.0.0
[2026-12-05 10:00:00 +0000] [7] [INFO] Listening at: http://127.0.0.1:8081 (7)
[2026-12-05 10:00:00 +0000] [8] [INFO] Booting worker with pid: 8
[2026-12-05 10:00:00 +0000] [8] [ERROR] Exception in worker process
Traceback (most recent call last):
  File \"/srv/app/venv/lib/python3.11/site-packages/gunicorn/arbiter.py\", line 608, in spawn_worker
    worker.init_process()
  File \"/srv/app/app.py\", line 1, in <module>
    import flaskx
ModuleNotFoundError: No module named 'flaskx'
[2026-12-05 10:00:00 +0000] [8] [INFO] Worker exiting (pid: 8)
[2026-12-05 10:00:01 +0000] [7] [ERROR] Worker (pid:8) exited with code 3
[2026-12-05 10:00:01 +0000] [7] [ERROR] Shutting down: Master
[2026-12-05 10:00:01 +0000] [7] [ERROR] Reason: Worker failed to boot.
";

    #[test]
    fn the_quote_names_a_tracebacks_exception_before_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.output");
        std::fs::write(&path, GUNICORN_BOOT_FAILURE).unwrap();
        assert_eq!(
            first_error(&path).as_deref(),
            Some("ModuleNotFoundError: No module named 'flaskx'")
        );
        let quote = quote_settled(&path, 3, SETTLE);
        assert!(
            quote.starts_with("ModuleNotFoundError: No module named 'flaskx' [...] "),
            "{quote}"
        );
        assert!(quote.ends_with("Reason: Worker failed to boot."), "{quote}");
    }

    #[test]
    fn the_first_error_looking_line_is_quoted_when_there_is_no_traceback() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.output");
        let node = "node:internal/modules/cjs/loader:1228\n  throw err;\n  ^\n\n\
                    Error: Cannot find module 'express'\nRequire stack:\n- /srv/app/server.js\n\
                    - a\n- b\n- c\n";
        std::fs::write(&path, node).unwrap();
        assert_eq!(
            first_error(&path).as_deref(),
            Some("Error: Cannot find module 'express'")
        );
        assert_eq!(
            quote_settled(&path, 3, SETTLE),
            "Error: Cannot find module 'express' [...] - a | - b | - c"
        );
        // Nothing that looks like an error, or the error among the last lines: the tail alone.
        std::fs::write(&path, "starting\nlistening on 8081\nbye\n").unwrap();
        assert_eq!(first_error(&path), None);
        assert_eq!(quote_settled(&path, 2, SETTLE), "listening on 8081 | bye");
        std::fs::write(&path, "starting\nfatal: no config\n").unwrap();
        assert_eq!(
            quote_settled(&path, 3, SETTLE),
            "starting | fatal: no config"
        );
    }
}
