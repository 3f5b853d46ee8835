//! One deploy per root at a time: an flock on `deploy.lock`, which also names the holder.
//! The kernel drops the lock when its holder dies, so a dead deployer never blocks the next.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use super::fault::Fault;

pub struct Lock {
    file: Flock<File>,
}

/// The descriptors of the locks this process holds, for a child to close between fork and
/// exec (issue 67, 10): a forked child shares the lock's open file, and would hold the root
/// until its exec closed it (close-on-exec) — past its parent's death, if it was killed in
/// that moment. Atomics, not a mutex: a child must not wait on a lock another thread held at
/// the fork. -1: a free place.
static HELD: [std::sync::atomic::AtomicI32; 8] =
    [const { std::sync::atomic::AtomicI32::new(-1) }; 8];

impl Lock {
    fn held(file: Flock<File>) -> Lock {
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        // More than eight roots locked at once: the ninth is closed at exec as before.
        let _ = HELD.iter().find(|place| {
            place
                .compare_exchange(
                    -1,
                    fd,
                    std::sync::atomic::Ordering::SeqCst,
                    std::sync::atomic::Ordering::SeqCst,
                )
                .is_ok()
        });
        Lock { file }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        no_longer_held(self.file.as_raw_fd());
    }
}

/// The descriptor `fd` is no lock's any more: a child leaves it alone.
fn no_longer_held(fd: i32) {
    for place in &HELD {
        let _ = place.compare_exchange(
            fd,
            -1,
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::SeqCst,
        );
    }
}

/// In a child between fork and exec: closes its copies of the root locks its parent holds, so
/// the child never holds a root (only `close(2)`, which a child may call there).
pub fn close_held_in_child() {
    for place in &HELD {
        let fd = place.load(std::sync::atomic::Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: closes this process's copy of a descriptor; the parent's stays open.
            unsafe {
                libc::close(fd);
            }
        }
    }
}

/// How long a command waits for a keeper that holds the root to start its release again (it
/// holds it for the start alone, not while the release gets ready).
const KEEPER_HOLDS: std::time::Duration = std::time::Duration::from_secs(3);

/// What a lock file names while its holder has not written its pid yet.
const UNKNOWN_HOLDER: &str = "unknown";

/// Takes the lock or says who holds it; a keeper holding it (see `keeper`) is waited for a
/// moment instead.
pub fn acquire(path: &Path) -> Result<Lock, Fault> {
    let since = std::time::Instant::now();
    loop {
        match acquire_now(path) {
            // A keeper, or a holder that has not written its pid yet (the lock is taken, then
            // the file is truncated and the pid written: read in between it names nobody):
            // waited for a moment too — found as `up` refused right after a keeper took it.
            // So is a holder gone or on its way out (a keeper killed mid-restart): the lock is
            // let go as it exits, or a moment later by a child it had just forked, which holds
            // a copy until it closes it (`close_held_in_child`) — `up` refused once, naming the
            // dead keeper as "another deploy", on a loaded machine.
            Err(Fault::Busy { holder, .. })
                if since.elapsed() < KEEPER_HOLDS
                    && (holder == UNKNOWN_HOLDER
                        || super::identity::is_keeper(&holder)
                        || holder.parse().is_ok_and(super::identity::is_dying)) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            taken => return taken,
        }
    }
}

fn acquire_now(path: &Path) -> Result<Lock, Fault> {
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
            Ok(Lock::held(locked))
        }
        Err((mut file, nix::Error::EWOULDBLOCK)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            Err(Fault::Busy {
                path: path.to_path_buf(),
                holder: match holder {
                    "" => UNKNOWN_HOLDER.into(),
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

    /// A lock taken whose holder has not written its pid yet is waited for, not refused as a
    /// deploy's (it is a keeper's start, a moment long); one that names a deploy is refused.
    #[test]
    fn a_holder_that_has_not_said_its_pid_yet_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deploy.lock");
        let file = std::fs::File::create(&path).unwrap();
        let taken = Flock::lock(file, FlockArg::LockExclusiveNonblock).unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(taken);
        });
        let started = std::time::Instant::now();
        assert!(acquire(&path).is_ok(), "waited for, then taken");
        assert!(started.elapsed() >= std::time::Duration::from_millis(250));
        releaser.join().unwrap();
        // A holder that named itself (a deploy: not a keeper) is refused at once.
        let _held = acquire(&path).unwrap();
        let started = std::time::Instant::now();
        assert!(matches!(acquire_now(&path), Err(Fault::Busy { .. })));
        assert!(
            matches!(acquire(&path), Err(Fault::Busy { holder, .. }) if holder == std::process::id().to_string())
        );
        assert!(started.elapsed() < KEEPER_HOLDS);
    }

    /// A lock still held a moment after the holder it names is gone (a child it forked holds
    /// a copy until it closes it) is waited for, not refused as another deploy's.
    #[test]
    fn a_lock_whose_named_holder_is_gone_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deploy.lock");
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let gone_pid = gone.id();
        gone.wait().unwrap();
        std::fs::write(&path, format!("{gone_pid}\n")).unwrap();
        // The copy a child holds: another open of the file, locked.
        let copy = std::fs::File::open(&path).unwrap();
        let taken = Flock::lock(copy, FlockArg::LockExclusiveNonblock).unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            drop(taken);
        });
        let taken = acquire(&path);
        assert!(taken.is_ok(), "refused: {:?}", taken.err());
        releaser.join().unwrap();
    }

    /// Issue 67, 10: a child between fork and exec (here held there for a second) does not
    /// hold its parent's root lock: once the parent dies, the next command takes it.
    #[test]
    fn a_child_between_fork_and_exec_does_not_hold_its_parents_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deploy.lock");
        let held = acquire(&path).unwrap();
        let spawner = std::thread::spawn(|| {
            let mut child = std::process::Command::new("true");
            // SAFETY: close and sleep are system calls.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut child, || {
                    close_held_in_child();
                    libc::sleep(1);
                    Ok(())
                });
            }
            child.status().unwrap()
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        // The parent dies (kill -9): its descriptor closes without an unlock.
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*held.file);
        no_longer_held(fd);
        std::mem::forget(held);
        // SAFETY: the forgotten lock's descriptor, closed once.
        unsafe {
            libc::close(fd);
        }
        let again = acquire(&path);
        assert!(again.is_ok(), "the child kept the lock: {:?}", again.err());
        assert!(spawner.join().unwrap().success());
    }

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
