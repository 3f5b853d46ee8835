//! A log is read from a map of the file. Should the file be truncated meanwhile (logrotate's
//! `copytruncate` does exactly that), touching a page past its new end raises SIGBUS, which
//! would kill rollgate with "Bus error" and no word of why. While a map is read, a handler
//! turns a SIGBUS inside it into a clear error and exit status 1; a SIGBUS anywhere else still
//! gets the default action.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

/// The map being read and what to say if it shrinks, for the handler (which may only read
/// atomics and call async-signal-safe functions).
static ACTIVE: AtomicBool = AtomicBool::new(false);
static MAP_START: AtomicUsize = AtomicUsize::new(0);
static MAP_LEN: AtomicUsize = AtomicUsize::new(0);
static MESSAGE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static MESSAGE_LEN: AtomicUsize = AtomicUsize::new(0);

/// Installed while one map is read; dropping it restores the previous SIGBUS action. Only one
/// map is guarded at a time (rollgate reads its files one after another); a second reader in
/// the same process meanwhile reads unguarded, as before.
pub struct Guard {
    previous: SigAction,
    /// What the handler writes; freed (as a field, after `drop`) once the handler is gone.
    _message: Box<[u8]>,
}

impl Guard {
    pub fn install(map: &[u8], path: &Path) -> Option<Guard> {
        if ACTIVE.swap(true, Ordering::SeqCst) {
            return None;
        }
        let mut message: Box<[u8]> = format!(
            "error: {}: the file was truncated while it was read (a log rotated with copytruncate?); nothing was answered, run the command again\n",
            path.display()
        )
        .into_bytes()
        .into_boxed_slice();
        MAP_START.store(map.as_ptr() as usize, Ordering::SeqCst);
        MAP_LEN.store(map.len(), Ordering::SeqCst);
        MESSAGE_LEN.store(message.len(), Ordering::SeqCst);
        MESSAGE.store(message.as_mut_ptr(), Ordering::SeqCst);
        let action = SigAction::new(
            SigHandler::SigAction(on_sigbus),
            SaFlags::SA_SIGINFO,
            SigSet::empty(),
        );
        // SAFETY: the handler only reads atomics and calls write(2) and _exit(2), both
        // async-signal-safe.
        match unsafe { sigaction(Signal::SIGBUS, &action) } {
            Ok(previous) => Some(Guard {
                previous,
                _message: message,
            }),
            Err(_) => {
                ACTIVE.store(false, Ordering::SeqCst);
                None
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // The handler first, so it never reads the message after it is freed.
        // SAFETY: restores the action that was there before `install`.
        let _ = unsafe { sigaction(Signal::SIGBUS, &self.previous) };
        MESSAGE.store(std::ptr::null_mut(), Ordering::SeqCst);
        MESSAGE_LEN.store(0, Ordering::SeqCst);
        MAP_LEN.store(0, Ordering::SeqCst);
        ACTIVE.store(false, Ordering::SeqCst);
    }
}

extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let address = unsafe { (*info).si_addr() } as usize;
    let start = MAP_START.load(Ordering::SeqCst);
    let len = MAP_LEN.load(Ordering::SeqCst);
    let message = MESSAGE.load(Ordering::SeqCst);
    if !message.is_null() && address >= start && address - start < len {
        // SAFETY: the message lives as long as the guard, which restores the default action
        // before freeing it.
        unsafe {
            libc::write(2, message.cast(), MESSAGE_LEN.load(Ordering::SeqCst));
            libc::_exit(1);
        }
    }
    // Not the log's map: a real fault. With the default action back, returning runs the
    // faulting access again and the process dies of SIGBUS as it would have.
    // SAFETY: signal(2) is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
}
