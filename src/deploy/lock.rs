//! One deploy per root at a time: an flock on `deploy.lock`, which also names the holder.
//! The kernel drops the lock when its holder dies, so a dead deployer never blocks the next.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

pub struct Lock {
    _file: Flock<File>,
}

/// Takes the lock or says who holds it.
pub fn acquire(path: &Path) -> Result<Lock, String> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // Like every state file, readable whatever the umask: its content names the holder.
    if let Ok(meta) = file.metadata() {
        if meta.permissions().mode() & 0o777 != super::state::STATE_FILE_MODE {
            let _ = file.set_permissions(std::fs::Permissions::from_mode(
                super::state::STATE_FILE_MODE,
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
            Err(format!(
                "another deploy is running on this root (pid {}, holding {}); wait for it to finish",
                if holder.is_empty() { "unknown" } else { holder },
                path.display()
            ))
        }
        Err((_, e)) => Err(format!("cannot lock {}: {e}", path.display())),
    }
}

/// Whether nobody holds the lock right now (a look only: the answer may change at once).
pub fn is_free(path: &Path) -> bool {
    let Ok(file) = OpenOptions::new().read(true).open(path) else {
        return true;
    };
    Flock::lock(file, FlockArg::LockExclusiveNonblock).is_ok()
}
