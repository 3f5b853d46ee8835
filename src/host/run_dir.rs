//! rollgate's own run folder, for the local sockets it answers on and the claims it holds
//! (issue 66): `/run/rollgate` when rollgate is root, else `$XDG_RUNTIME_DIR/rollgate`, else
//! `/tmp/rollgate-UID`. Only rollgate's user can make a name in it, so no other process can
//! take a socket's name first (an abstract Unix name can be bound by anyone who knows it).
//! Each folder is checked, not trusted: a link, or a folder someone else owns or may write, is
//! refused by name.

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A claim held for as long as the value lives (an exclusive `flock` on a file in the run
/// folder): released by the kernel when the last descriptor of its open file closes — when its
/// holder drops it or dies. Never unlocked by hand: a claim a proxy was handed over is the open
/// file the old proxy holds too, and a `LOCK_UN` from a new proxy that failed to start would
/// take it from the old one, which still serves (nix's `Flock` unlocks so on drop).
#[derive(Debug)]
pub struct Claim(File);

impl Claim {
    /// Claims the open file `file` (a claim's file handed over by another process is the same
    /// open file: locking it again succeeds at once). None while another open file holds it.
    pub fn lock(file: File) -> std::io::Result<Option<Claim>> {
        use rustix::fs::{flock, FlockOperation};
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(Claim(file))),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

impl std::os::fd::AsFd for Claim {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Who may enter a folder of the run folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Only rollgate's user (the proxy's control socket, claims).
    Private,
    /// Others may reach a name in it they know, never list it (a release sends its
    /// notifications to its own socket by the name in its environment).
    Searchable,
}

/// The folder `name` of the run folder, made if missing, checked either way.
pub fn folder(name: &str, reach: Reach) -> std::io::Result<PathBuf> {
    let base = base();
    checked(&base, Reach::Searchable).map_err(std::io::Error::other)?;
    let folder = base.join(name);
    checked(&folder, reach).map_err(std::io::Error::other)?;
    Ok(folder)
}

fn base() -> PathBuf {
    let me = nix::unistd::geteuid();
    if me.is_root() {
        return PathBuf::from("/run/rollgate");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if Path::new(&dir).is_absolute() => Path::new(&dir).join("rollgate"),
        _ => std::env::temp_dir().join(format!("rollgate-{me}")),
    }
}

/// `folder` made (mode by `reach`) or found: a folder, not a link, rollgate's user's, and
/// writable by nobody else.
fn checked(folder: &Path, reach: Reach) -> Result<(), String> {
    let mode = match reach {
        Reach::Private => 0o700,
        Reach::Searchable => 0o711,
    };
    match std::fs::DirBuilder::new().mode(mode).create(folder) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot make {}: {e}", folder.display())),
    }
    let meta = std::fs::symlink_metadata(folder)
        .map_err(|e| format!("cannot read {}: {e}", folder.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    let refused = |why: String| {
        Err(format!(
            "{} {why}: rollgate keeps its sockets there only when it alone may write it; remove it and run again",
            folder.display()
        ))
    };
    if !meta.is_dir() {
        return refused("is not a folder (a link?)".into());
    }
    if meta.uid() != me {
        return refused(format!(
            "belongs to uid {}, not rollgate's uid {me}",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return refused(format!(
            "may be written by others (mode {:04o})",
            meta.mode() & 0o7777
        ));
    }
    if meta.mode() & 0o777 != mode {
        std::fs::set_permissions(folder, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(|e| format!("cannot set the mode of {}: {e}", folder.display()))?;
    }
    Ok(())
}

/// Claims `path` (a lock file in the run folder): None while another process holds it.
pub fn claim(path: &Path) -> std::io::Result<Option<Claim>> {
    let fail = |e: std::io::Error| {
        std::io::Error::new(e.kind(), format!("cannot lock {}: {e}", path.display()))
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(fail)?;
    Claim::lock(file).map_err(fail)
}

/// A short name for something whose own name may be long or hold any byte (a config file's
/// path, an address): the first 16 bytes of its SHA-256, in hex.
pub fn short_name(of: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(of)[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_someone_else_may_write_is_refused_and_a_claim_is_held_once() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let why = checked(&open, Reach::Private).unwrap_err();
        assert!(
            why.contains("may be written by others (mode 0777)"),
            "{why}"
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(checked(&link, Reach::Private)
            .unwrap_err()
            .contains("is not a folder"));
        let mine = dir.path().join("mine");
        checked(&mine, Reach::Private).unwrap();
        let lock = mine.join("x.lock");
        let first = claim(&lock).unwrap();
        assert!(first.is_some());
        assert!(claim(&lock).unwrap().is_none(), "held once");
        drop(first);
        assert!(claim(&lock).unwrap().is_some(), "released with its holder");
    }
}
