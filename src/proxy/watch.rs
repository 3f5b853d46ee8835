//! Following the `current` pointer: an inotify watch on the root (a switch is one rename, so
//! one event), a periodic re-read in case an event is missed, and an immediate re-read when the
//! deployer asks to drain.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

use super::leases::{Member, Routes, Switched};
use super::traffic::Gate;
use crate::host::fault::Fault;
use crate::host::state::{Root, POINTER_FILE, REPLICAS_FILE};
use crate::host::traffic::TRAFFIC_FILE;

/// Re-read period when no file event arrives.
const FALLBACK_PERIOD: Duration = Duration::from_secs(1);

struct Watch(Inotify);

impl AsRawFd for Watch {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Reads what is live and points the routes at it: the replicas of `replicas.json` when the
/// root has one, else the release `current` names. A missing state means nothing is live; an
/// unreadable one keeps the current targets (a bad file must not take traffic down) and is the
/// error returned, so a drain is never confirmed on a state the proxy could not read.
pub fn refresh(root: &Root, routes: &Routes) -> Result<(), Fault> {
    let mut fallback = None;
    let members: Vec<(String, u16, i32, u16)> = match root.read_replicas() {
        Ok(Some(set)) => set
            .replicas
            .into_iter()
            .map(|r| {
                (
                    r.version,
                    r.port,
                    r.pid,
                    u16::try_from(r.slot).unwrap_or(u16::MAX),
                )
            })
            .collect(),
        Ok(None) => match root.read_pointer() {
            Ok(pointer) => {
                fallback = pointer.as_ref().and_then(|p| p.fallback.clone());
                pointer
                    .map(|p| (p.version, p.port, p.pid, 0))
                    .into_iter()
                    .collect()
            }
            Err(e) => return keep(e),
        },
        Err(e) => return keep(e),
    };
    let borrowed: Vec<Member> = members
        .iter()
        .map(|(v, p, pid, slot)| (v.as_str(), *p, *pid, *slot))
        .collect();
    let changed = routes.set_pool(&borrowed);
    // After the pool: a previous release that leaves the pool and becomes the fallback keeps
    // its target (and the count of what it still serves).
    routes.set_fallback(
        fallback
            .as_ref()
            .map(|f| (f.version.as_str(), f.port, f.pid, 0)),
    );
    if let Switched::Changed { replaced } = changed {
        let list = |targets: Vec<String>| {
            if targets.is_empty() {
                "nothing".to_string()
            } else {
                targets.join(", ")
            }
        };
        let now = list(
            members
                .iter()
                .map(|(v, p, _, _)| format!("{v} on port {p}"))
                .collect(),
        );
        let was = list(
            replaced
                .iter()
                .map(|t| format!("{} on port {}", t.version, t.port))
                .collect(),
        );
        if members.is_empty() {
            eprintln!(
                "rollgate proxy: nothing is live under {}; answering 503",
                root.0.display()
            );
        } else {
            eprintln!(
                "rollgate proxy: now forwarding to {now} (retired: {was}) for {}",
                root.0.display()
            );
        }
    }
    Ok(())
}

fn keep(e: Fault) -> Result<(), Fault> {
    eprintln!("rollgate proxy: keeping the current targets: {e}");
    Err(e)
}

/// Runs forever: re-reads the pointer (and the traffic state, `gate`) on every change under the
/// root, every second, and whenever `now` is notified.
pub async fn follow(root: Root, routes: Arc<Routes>, gate: Arc<Gate>, now: Arc<Notify>) {
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
        // (targets changed, traffic state changed): the targets are taken first, so that once
        // the gate says `serving` (what `rollgate start` waits for) the release it started is
        // the one requests go to.
        let (targets, traffic) = tokio::select! {
            ready = async { watch.as_ref().expect("guarded").readable().await }, if watch.is_some() => {
                match ready {
                    Ok(mut guard) => {
                        let events = guard.get_inner().0.read_events().unwrap_or_default();
                        guard.clear_ready();
                        let named = |name: &str| {
                            events.iter().any(|e| e.name.as_deref().is_some_and(|n| n == name))
                        };
                        (named(POINTER_FILE) || named(REPLICAS_FILE), named(TRAFFIC_FILE))
                    }
                    Err(_) => (true, false),
                }
            }
            _ = ticker.tick() => (true, true),
            _ = now.notified() => (true, false),
        };
        if targets {
            let _ = refresh(&root, &routes);
        }
        if traffic {
            gate.refresh(&root.0);
        }
    }
}
