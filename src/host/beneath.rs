//! The one way rollgate, often root, opens a file in a tree a release shaped: its release folder
//! (every byte of it the release's, symlinks and FIFOs included) or its state folder
//! (`ROOT/data`, which its processes write).
//!
//! A path is resolved *beneath* a directory descriptor with `openat2(2)`: no `..` or absolute
//! escape (`RESOLVE_BENEATH`), no symlink in any component (`RESOLVE_NO_SYMLINKS`), no
//! `/proc/*/fd`-style magic link (`RESOLVE_NO_MAGICLINKS`). The file is opened non-blocking (a
//! FIFO cannot wedge the opener), must be a regular file (`fstat`: not a FIFO, a device or a
//! folder), and is read up to a cap (a `/dev/zero` could not be reached anyway, a huge file is
//! refused by its size). Where the kernel has no `openat2` (before 5.6) each component is opened
//! in turn with `O_NOFOLLOW`, which gives the same guarantee.
//!
//! A test (`tests/it/layers.rs`) holds the rule that a release tree is read only through here:
//! no other file of `src/` opens a path under a release folder.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// The most rollgate reads of a small file a release ships (a Procfile, `env`, `image.json`).
pub const SMALL_FILE_CAP: u64 = 1 << 20;

/// A folder opened once, every open below it resolved beneath it.
#[derive(Debug)]
pub struct Beneath {
    dir: OwnedFd,
    path: PathBuf,
}

/// Why a file beneath a folder could not be read: said with the file's path.
fn refusal(path: &Path, why: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("{}: {why}", path.display()),
    )
}

impl Beneath {
    /// Opens `dir` itself (not through a link at its last component: a release folder is
    /// rollgate's own, made by `release add`).
    pub fn open(dir: &Path) -> std::io::Result<Beneath> {
        let fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Beneath {
            dir: fd,
            path: dir.to_path_buf(),
        })
    }

    /// The regular file at `relative`, opened for reading (None: there is none). A link in any
    /// component, a `..` or an absolute path, a FIFO, a device or a folder is refused, naming
    /// the file.
    pub fn open_file(&self, relative: &Path) -> std::io::Result<Option<File>> {
        let shown = self.path.join(relative);
        let fd = match open_beneath(&self.dir, relative) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(refusal(
                    &shown,
                    "a symlink, which rollgate does not follow in a release's folder",
                ))
            }
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                return Err(refusal(&shown, "leads out of its folder"))
            }
            Err(e) => return Err(refusal(&shown, e)),
        };
        let stat = rustix::fs::fstat(&fd)?;
        let kind = rustix::fs::FileType::from_raw_mode(stat.st_mode);
        if kind != rustix::fs::FileType::RegularFile {
            return Err(refusal(
                &shown,
                format!("not a regular file ({})", kind_words(kind)),
            ));
        }
        // Opened non-blocking so that a FIFO could not hold the open; a regular file reads the
        // same either way, so the flag is cleared for plain reads.
        let flags = rustix::fs::fcntl_getfl(&fd)?;
        rustix::fs::fcntl_setfl(&fd, flags - OFlags::NONBLOCK)?;
        Ok(Some(File::from(fd)))
    }

    /// The whole file at `relative` if it is at most `cap` bytes (None: there is none).
    pub fn read(&self, relative: &Path, cap: u64) -> std::io::Result<Option<Vec<u8>>> {
        let Some(file) = self.open_file(relative)? else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        file.take(cap + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > cap {
            return Err(refusal(
                &self.path.join(relative),
                format!("larger than {cap} bytes, more than rollgate reads of it"),
            ));
        }
        Ok(Some(bytes))
    }

    /// [`Beneath::read`] as UTF-8 text.
    pub fn read_text(&self, relative: &Path, cap: u64) -> std::io::Result<Option<String>> {
        match self.read(relative, cap)? {
            None => Ok(None),
            Some(bytes) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| refusal(&self.path.join(relative), "not UTF-8 text")),
        }
    }

    /// Whether `relative` is there at all, whatever it is (a link is not followed).
    pub fn has(&self, relative: &Path) -> bool {
        rustix::fs::statat(&self.dir, relative, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).is_ok()
            && plain(relative)
    }
}

/// The regular file `relative` beneath the folder `dir`, at most `cap` bytes (None: none).
pub fn read(dir: &Path, relative: &str, cap: u64) -> std::io::Result<Option<Vec<u8>>> {
    match Beneath::open(dir) {
        Ok(beneath) => beneath.read(Path::new(relative), cap),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(refusal(dir, e)),
    }
}

/// [`read`] as UTF-8 text.
pub fn read_text(dir: &Path, relative: &str, cap: u64) -> std::io::Result<Option<String>> {
    match Beneath::open(dir) {
        Ok(beneath) => beneath.read_text(Path::new(relative), cap),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(refusal(dir, e)),
    }
}

/// The regular file `relative` beneath `dir`, opened for reading (None: none).
pub fn open_file(dir: &Path, relative: &Path) -> std::io::Result<Option<File>> {
    match Beneath::open(dir) {
        Ok(beneath) => beneath.open_file(relative),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(refusal(dir, e)),
    }
}

/// Whether `relative` names only plain components (no `..`, no root).
fn plain(relative: &Path) -> bool {
    relative
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

fn open_beneath(dir: &OwnedFd, relative: &Path) -> std::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(dir, relative, flags, Mode::empty(), resolve) {
        Err(rustix::io::Errno::NOSYS) => open_by_components(dir, relative, flags),
        // Interrupted by a concurrent rename in the folder (EAGAIN): asked again once.
        Err(rustix::io::Errno::AGAIN) => {
            rustix::fs::openat2(dir, relative, flags, Mode::empty(), resolve).map_err(Into::into)
        }
        other => other.map_err(Into::into),
    }
}

/// The same walk without `openat2`: each folder opened with `O_NOFOLLOW|O_DIRECTORY` below
/// the last, the file itself with `O_NOFOLLOW`.
fn open_by_components(dir: &OwnedFd, relative: &Path, last: OFlags) -> std::io::Result<OwnedFd> {
    if !plain(relative) {
        return Err(std::io::Error::from_raw_os_error(libc::EXDEV));
    }
    let names: Vec<_> = relative
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let Some((file, folders)) = names.split_last() else {
        return Err(std::io::Error::from_raw_os_error(libc::EISDIR));
    };
    let mut at: Option<OwnedFd> = None;
    for folder in folders {
        let base = at.as_ref().map_or(dir.as_fd(), |fd| fd.as_fd());
        let next = rustix::fs::openat(
            base,
            *folder,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        at = Some(next);
    }
    let base = at.as_ref().map_or(dir.as_fd(), |fd| fd.as_fd());
    Ok(rustix::fs::openat(base, *file, last, Mode::empty())?)
}

fn kind_words(kind: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType;
    match kind {
        FileType::Fifo => "a FIFO",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Directory => "a folder",
        FileType::Socket => "a socket",
        FileType::Symlink => "a symlink",
        _ => "not a file",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Procfile"), "web: ./serve\n").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/file"), "inner").unwrap();
        dir
    }

    #[test]
    fn a_plain_file_is_read_and_a_missing_one_is_none() {
        let dir = folder();
        let got = read_text(dir.path(), "Procfile", 100).unwrap();
        assert_eq!(got.as_deref(), Some("web: ./serve\n"));
        assert_eq!(
            read_text(dir.path(), "sub/file", 100).unwrap().as_deref(),
            Some("inner")
        );
        assert_eq!(read(dir.path(), "nothing", 100).unwrap(), None);
    }

    #[test]
    fn a_link_anywhere_on_the_way_is_refused_naming_the_file() {
        let dir = folder();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "root only").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("env")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("up")).unwrap();
        std::os::unix::fs::symlink("Procfile", dir.path().join("inside")).unwrap();
        for name in ["env", "up/secret", "inside"] {
            let e = read(dir.path(), name, 100).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains("symlink"), "{name}: {e}");
        }
        for name in ["../x", "/etc/passwd", "sub/../../x"] {
            assert!(read(dir.path(), name, 100).is_err(), "{name}");
        }
    }

    #[test]
    fn a_fifo_is_refused_without_blocking_and_a_large_file_by_its_size() {
        let dir = folder();
        nix::unistd::mkfifo(&dir.path().join("Procfile2"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = read(dir.path(), "Procfile2", 100).unwrap_err().to_string();
        assert!(e.contains("a FIFO"), "{e}");
        let e = read(dir.path(), "sub", 100).unwrap_err().to_string();
        assert!(e.contains("a folder"), "{e}");
        std::fs::write(dir.path().join("big"), vec![b'x'; 101]).unwrap();
        let e = read(dir.path(), "big", 100).unwrap_err().to_string();
        assert!(e.contains("larger than 100 bytes"), "{e}");
        assert_eq!(
            read(dir.path(), "big", 101).unwrap().map(|b| b.len()),
            Some(101)
        );
    }

    #[test]
    fn the_walk_by_components_refuses_what_openat2_refuses() {
        let dir = folder();
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();
        let fd = Beneath::open(dir.path()).unwrap();
        let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        assert!(open_by_components(&fd.dir, Path::new("sub/file"), flags).is_ok());
        let e = open_by_components(&fd.dir, Path::new("etc/passwd"), flags).unwrap_err();
        assert!(
            matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::ENOTDIR)),
            "{e}"
        );
        assert!(open_by_components(&fd.dir, Path::new("../x"), flags).is_err());
    }
}
