//! Files rollgate writes and reads under a root, whatever they hold: replaced atomically (the
//! old content or the new, whole, never torn), appended to with the state files' mode, and read
//! back with an error that names the file, the line and what it should hold. The state records
//! (`state`), the lock, the journal and the holder of a socket all stand on these.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use serde::Deserialize;

use super::fault::Fault;

/// Mode of every state file: whatever the deployer's umask, a proxy running as another user
/// must be able to read `current` (an unreadable pointer is a proxy that cannot follow a switch).
pub const STATE_FILE_MODE: u32 = 0o644;

/// How an atomic replacement failed: before the rename (the old content is intact) or after it
/// (the new content is in place, but the folder's fsync failed, so a power loss could undo it).
#[derive(Debug)]
pub enum WriteError {
    NotWritten(std::io::Error),
    NotDurable(std::io::Error),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::NotWritten(e) => write!(f, "{e} (the old content is intact)"),
            WriteError::NotDurable(e) => write!(
                f,
                "replaced, but the folder's fsync failed ({e}): durability unknown"
            ),
        }
    }
}

/// A fault the test suite injects into the real binary: `ROLLGATE_FAULT=name[,name...]`.
/// Nothing sets it in normal use; each name is one failing step that cannot be provoked on a
/// healthy file system.
pub fn fault(name: &str) -> bool {
    std::env::var("ROLLGATE_FAULT").is_ok_and(|v| v.split(',').any(|n| n == name))
}

/// Replaces `path` so that readers see the old content or the new, whole, with mode
/// [`STATE_FILE_MODE`] whatever the umask.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    write_atomically_with_mode(path, bytes, STATE_FILE_MODE)
}

/// Mode of a file only its owner may read: keys, account credentials.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// [`write_atomically`] with `mode` (a private key's [`PRIVATE_FILE_MODE`]); the temporary
/// file has the mode from its creation, so the bytes are never readable by others.
pub fn write_atomically_with_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), WriteError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state");
    // A new name each time, made with O_EXCL|O_NOFOLLOW: whatever lies in the folder under a
    // name that could be guessed (a link a release shipped, aimed at a root-only file) is never
    // opened, truncated or chmodded — the open fails and the next name is tried.
    let (tmp, mut file) = new_temporary(dir, name, mode).map_err(WriteError::NotWritten)?;
    let written = (|| {
        // The mode given to open(2) is filtered by the umask; set it outright (on the
        // descriptor, never by path).
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(WriteError::NotWritten(e));
    }
    let synced = if fault(&format!("fsync-dir-after-{name}")) {
        Err(std::io::Error::other("injected fault"))
    } else {
        File::open(dir).and_then(|d| d.sync_all())
    };
    synced.map_err(WriteError::NotDurable)
}

/// A temporary file in `dir` for `name`, new (`O_CREAT|O_EXCL|O_NOFOLLOW`) under a name no
/// other process chose: `.NAME.tmp.PID.RANDOM`.
fn new_temporary(dir: &Path, name: &str, mode: u32) -> std::io::Result<(std::path::PathBuf, File)> {
    let mut last = None;
    for _ in 0..16 {
        let mut random = [0u8; 6];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut random);
        let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let tmp = dir.join(format!(".{name}.tmp.{}.{suffix}", std::process::id()));
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(mode)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no temporary name was free")))
}

/// Appends `line` (which ends with a newline) to `path` as one whole line, made with the
/// state files' mode if it is new, and fsynced. A line is never torn and never glued: a write
/// that fails part-way (a full disk) is cut back to where the file ended, and a torn line an
/// earlier run left at the end (it died between the part and the cut) is cut back to the
/// last whole line before this one is written.
pub fn append_line(path: &Path, line: &[u8]) -> std::io::Result<()> {
    let mut file = open_append(path)?;
    let whole = whole_lines_end(&file)?;
    if whole < file.metadata()?.len() {
        file.set_len(whole)?;
    }
    if let Err(e) = file.write_all(line) {
        let _ = file.set_len(whole);
        return Err(e);
    }
    file.sync_data()
}

/// Where the file's last whole line ends (its length when it ends with a newline, or is empty).
fn whole_lines_end(file: &File) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    let mut end = len;
    let mut chunk = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(chunk.len() as u64);
        let piece = &mut chunk[..(end - start) as usize];
        file.read_exact_at(piece, start)?;
        if end == len && piece.last() == Some(&b'\n') {
            return Ok(len);
        }
        if let Some(at) = piece.iter().rposition(|b| *b == b'\n') {
            return Ok(start + at as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Opens `path` to append to it (and read its end), made with the state files' mode if new.
fn open_append(path: &Path) -> std::io::Result<File> {
    match fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create_new(true)
        .mode(STATE_FILE_MODE)
        .open(path)
    {
        Ok(file) => {
            file.set_permissions(fs::Permissions::from_mode(STATE_FILE_MODE))?;
            Ok(file)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            fs::OpenOptions::new().read(true).append(true).open(path)
        }
        Err(e) => Err(e),
    }
}

/// A value read from a state file passes the checks the same value typed on the command line
/// does: the error names the file and the field.
pub fn checked<T, E: std::fmt::Display>(
    path: &Path,
    field: &str,
    result: Result<T, E>,
) -> Result<T, Fault> {
    result.map_err(|e| {
        Fault::unreadable(
            path,
            format!(
                "{}: field `{field}`: {e}; the file was not written by this rollgate (edited, or damaged)",
                path.display()
            ),
        )
    })
}

/// Reads `input` to its end, but never more than `most` bytes: `None` when it held more (a
/// pipe that would fill memory is cut there).
pub fn read_at_most(input: impl Read, most: u64) -> std::io::Result<Option<Vec<u8>>> {
    let mut bytes = Vec::new();
    input.take(most.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= most).then_some(bytes))
}

/// A JSON file a person writes (`webhooks.json`, `trust.json`), or None when there is none.
/// A file that does not parse is named with the line and column, what is wrong there, and
/// `shape`: what the file holds.
pub fn read_config<T: for<'de> Deserialize<'de>>(
    path: &Path,
    shape: &str,
) -> Result<Option<T>, Fault> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            let text = e.to_string();
            let what = text
                .rsplit_once(" at line ")
                .map_or(text.as_str(), |(what, _)| what);
            Fault::unreadable(
                path,
                format!(
                    "{}:{}:{}: {what}; {shape}",
                    path.display(),
                    e.line(),
                    e.column()
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Fault::unreadable(
            path,
            format!("cannot read {}: {e}", path.display()),
        )),
    }
}

/// Removes one of the root's files; one that is not there is already removed.
pub fn remove_if_there(path: &Path) -> Result<(), Fault> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Fault::unwritable(
            path,
            format!("cannot remove {}: {e}", path.display()),
        )),
    }
}

/// Reads one of the root's JSON files; a missing file is `None`.
pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, Fault> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Fault::unreadable(
                path,
                format!(
                    "{} is not a rollgate state file ({e}); move it aside if it is not rollgate's",
                    path.display()
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Fault::unreadable(
            path,
            format!("cannot read {}: {e}", path.display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_line_is_cut_back_before_the_next_is_appended() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("deploy.log");
        append_line(&log, b"{\"n\":1}\n").unwrap();
        // What a write cut short by a full disk leaves, from a run that died before its cut.
        let mut torn = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        torn.write_all(b"{\"n\":2,\"det").unwrap();
        append_line(&log, b"{\"n\":3}\n").unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), b"{\"n\":1}\n{\"n\":3}\n");
        // A line longer than one read of the end, torn: cut back to the line before it.
        let long = vec![b'x'; 100_000];
        torn.write_all(&long).unwrap();
        append_line(&log, b"{\"n\":4}\n").unwrap();
        assert_eq!(
            std::fs::read(&log).unwrap(),
            b"{\"n\":1}\n{\"n\":3}\n{\"n\":4}\n"
        );
        // Nothing but a torn piece: cut to nothing.
        let only = dir.path().join("only.log");
        std::fs::write(&only, b"{\"n\"").unwrap();
        append_line(&only, b"{}\n").unwrap();
        assert_eq!(std::fs::read(&only).unwrap(), b"{}\n");
    }

    #[test]
    fn read_at_most_takes_the_limit_and_refuses_one_byte_more() {
        let limit = [7u8; 16];
        assert_eq!(
            read_at_most(&limit[..], 16).unwrap().as_deref(),
            Some(&limit[..])
        );
        assert_eq!(read_at_most(&[7u8; 17][..], 16).unwrap(), None);
        assert_eq!(read_at_most(&b""[..], 0).unwrap(), Some(Vec::new()));
    }

    #[test]
    fn atomic_write_replaces_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("current");
        write_atomically(&path, b"old").unwrap();
        write_atomically(&path, b"new content").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new content");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("current")]);
    }

    #[test]
    fn state_files_are_readable_by_all_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let old = unsafe { libc::umask(0o077) };
        let written = write_atomically(&dir.path().join("current"), b"x");
        let appended = open_append(&dir.path().join("deploy.log"));
        unsafe { libc::umask(old) };
        written.unwrap();
        appended.unwrap();
        for name in ["current", "deploy.log"] {
            let mode = fs::metadata(dir.path().join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o644, "{name}");
        }
    }

    #[test]
    fn a_config_a_person_wrote_is_refused_at_its_line_and_column_with_its_shape() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Pins {
            pins: Vec<String>,
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trust.json");
        assert!(read_config::<Pins>(&path, "").unwrap().is_none());
        fs::write(&path, "{\n  \"pins\": [],\n  \"pin\": 1\n}\n").unwrap();
        let err = read_config::<Pins>(&path, "it holds {\"pins\": [...]}")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "{}:3:7: unknown field `pin`, expected `pins`; it holds {{\"pins\": [...]}}",
                path.display()
            )
        );
    }
}
