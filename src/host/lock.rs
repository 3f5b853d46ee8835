//! One deploy per root at a time: an flock on `deploy.lock`, which also names the holder.
//! The kernel drops the lock when its holder dies, so a dead deployer never blocks the next.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use super::fault::Fault;

pub struct Lock {
    _file: Flock<File>,
}

/// Takes the lock or says who holds it.
pub fn acquire(path: &Path) -> Result<Lock, Fault> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| Fault::Unlockable {
            path: path.to_path_buf(),
            why: format!("cannot open {}: {e}", path.display()),
        })?;
    // Like every state file, readable whatever the umask: its content names the holder.
    if let Ok(meta) = file.metadata() {
        if meta.permissions().mode() & 0o777 != crate::host::files::STATE_FILE_MODE {
            let _ = file.set_permissions(std::fs::Permissions::from_mode(
                crate::host::files::STATE_FILE_MODE,
            ));
        }
    }
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(mut locked) => {
            let _ = locked.set_len(0);
            let _ = locked.rewind();
            let _ = writeln!(locked, "{}", std::process::id());
            let _ = locked.sync_data();
            Ok(Lock { _file: locked })
        }
        Err((mut file, nix::Error::EWOULDBLOCK)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            Err(Fault::Busy {
                path: path.to_path_buf(),
                holder: match holder {
                    "" => "unknown".into(),
                    holder => holder.into(),
                },
            })
        }
        Err((_, e)) => Err(Fault::Unlockable {
            path: path.to_path_buf(),
            why: format!("cannot lock {}: {e}", path.display()),
        }),
    }
}

/// Whether nobody holds the lock right now (a look only: the answer may change at once). It
/// reads the kernel's table of locks (`/proc/locks`) instead of taking the lock for a moment,
/// which would refuse a deploy starting at that instant.
pub fn is_free(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return true;
    };
    let Ok(table) = std::fs::read_to_string("/proc/locks") else {
        return true;
    };
    let (major, minor) = (
        nix::sys::stat::major(meta.dev()),
        nix::sys::stat::minor(meta.dev()),
    );
    !table
        .lines()
        .any(|line| holds(line, major, minor, meta.ino()))
}

/// Whether a line of `/proc/locks` (`1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF`) is an
/// flock held on the file with this device and inode (a waiter's line starts with `->`).
fn holds(line: &str, major: u64, minor: u64, inode: u64) -> bool {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.get(1) != Some(&"FLOCK") {
        return false;
    }
    let Some(file) = fields.get(5) else {
        return false;
    };
    let mut parts = file.split(':');
    let hex = |p: Option<&str>| p.and_then(|p| u64::from_str_radix(p, 16).ok());
    let dec = |p: Option<&str>| p.and_then(|p| p.parse::<u64>().ok());
    (hex(parts.next()), hex(parts.next()), dec(parts.next()))
        == (Some(major), Some(minor), Some(inode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn looking_at_the_lock_never_takes_it_from_someone_about_to() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deploy.lock");
        let held = acquire(&path).unwrap();
        assert!(!is_free(&path), "held");
        drop(held);
        assert!(is_free(&path), "let go");
        // While one thread looks as fast as it can, every acquire of the other succeeds.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let looker = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    is_free(&path);
                }
            })
        };
        let refused = (0..2000).filter(|_| acquire(&path).is_err()).count();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        looker.join().unwrap();
        assert_eq!(refused, 0, "acquires refused because of a look");
    }
}
