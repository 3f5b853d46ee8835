//! Following the `current` pointer: an inotify watch on the root (a switch is one rename, so
//! one event), a periodic re-read in case an event is missed, and an immediate re-read when the
//! deployer asks to drain.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use super::routes::{Routes, Switched};
use crate::deploy::state::{Root, POINTER_FILE};

/// Re-read period when no file event arrives.
const FALLBACK_PERIOD: Duration = Duration::from_secs(1);

struct Watch(Inotify);

impl AsRawFd for Watch {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Reads `current` and points the routes at it. A missing pointer means nothing is live; an
/// unreadable one keeps the current target (a bad file must not take traffic down) and is the
/// error returned, so a drain is never confirmed on a pointer the proxy could not read.
pub fn refresh(root: &Root, routes: &Routes) -> Result<(), String> {
    match root.read_pointer() {
        Ok(Some(p)) => {
            if let Switched::Changed { replaced } = routes.switch(Some((&p.version, p.port, p.pid)))
            {
                let was = replaced.map_or("nothing".to_string(), |t| {
                    format!("{} on port {}", t.version, t.port)
                });
                eprintln!(
                    "rollgate proxy: now forwarding to {} on port {} (was {was})",
                    p.version, p.port
                );
            }
        }
        Ok(None) => {
            if let Switched::Changed { .. } = routes.switch(None) {
                eprintln!(
                    "rollgate proxy: {} is gone; answering 503",
                    root.pointer_path().display()
                );
            }
        }
        Err(e) => {
            eprintln!("rollgate proxy: keeping the current target: {e}");
            return Err(e);
        }
    }
    Ok(())
}

/// Runs forever: re-reads the pointer on every change under the root, every second, and
/// whenever `now` is notified.
pub async fn follow(root: Root, routes: Arc<Routes>, now: Arc<Notify>) {
    let watch = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .and_then(|i| {
            i.add_watch(
                &root.0,
                AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_CLOSE_WRITE
                    | AddWatchFlags::IN_DELETE,
            )?;
            Ok(i)
        })
        .ok()
        .and_then(|i| {
            // SAFETY: `Watch` owns the inotify fd, which stays open and the same for the
            // AsyncFd's whole life.
            unsafe { AsyncFd::register(Watch(i)) }.ok()
        });
    if watch.is_none() {
        eprintln!(
            "rollgate proxy: no file watch on {}; re-reading every second",
            root.0.display()
        );
    }
    let mut ticker = tokio::time::interval(FALLBACK_PERIOD);
    loop {
        tokio::select! {
            ready = async { watch.as_ref().expect("guarded").readable().await }, if watch.is_some() => {
                if let Ok(mut guard) = ready {
                    let events = guard.get_inner().0.read_events().unwrap_or_default();
                    guard.clear_ready();
                    if !events.iter().any(|e| e.name.as_deref().is_some_and(|n| n == POINTER_FILE)) {
                        continue;
                    }
                }
            }
            _ = ticker.tick() => {}
            _ = now.notified() => {}
        }
        let _ = refresh(&root, &routes);
    }
}
