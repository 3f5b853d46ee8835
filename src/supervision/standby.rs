//! A crash-looping release's standby (issue 68, 2): at the first exit of a release within its
//! crash-loop window, its keeper starts the release live before it beside it — on the port it
//! was last live on, as the live release is started now (its user, confinement, limits) — and,
//! once that passes its probe, records it as `current`'s fallback (marked `standby`). The proxy
//! sends it whatever the crashing release refuses, so users see the failures of the first crash
//! only. If the crash loop is rolled back, the standby is made live (it passed its probe: no
//! second start, no port to find); else it is retired at the window's end
//! (`engine::retire_standby`, which also retires it when a run begins or its keeper is gone).
//!
//! Not for a replica set (its rollback is a rollout), a release served through a held socket
//! (its socket queues connections while it restarts; the two releases would share it), nor a
//! release of several types (made live, a standby moved web alone, the workers and clock left
//! on the crashing release: such a release is rolled back whole by a deploy).

use super::supervise::{launch, log, Launched, Live, Spawn};
use crate::defaults;
use crate::engine;
use crate::error::{refused, Error};
use crate::host::identity::Identity;
use crate::host::journal::{self, LogEvent};
use crate::host::state::{Fallback, Pointer, Root};

/// The release live before a crashing one, running beside it as the proxy's fallback.
pub(crate) struct Standby {
    pub(crate) live: Live,
    pub(crate) launched: Launched,
    /// The crash-loop window's end: retired then unless made live before.
    pub(crate) until: tokio::time::Instant,
}

/// Why a standby is not started for `crashing`, or None when one can be.
fn not_possible(root: &Root, crashing: &Live) -> Option<&'static str> {
    if crashing.slot.is_some() {
        return Some("a replica set is rolled back by a rollout");
    }
    if crashing.launch.listen.is_some() {
        return Some("its socket is held: connections wait in its queue while it restarts");
    }
    // A standby is web's alone: made live, it would leave the release's workers and clock on
    // the crashing version (issue 80, 1). Such a release goes back whole, by a deploy.
    let has_types = root
        .read_processes()
        .ok()
        .flatten()
        .is_some_and(|formation| {
            formation
                .processes
                .iter()
                .any(|p| p.version == crashing.version)
        });
    if has_types {
        return Some("a release of several types is rolled back whole, every type by its gate");
    }
    None
}

/// Starts the release live before `crashing` (the keeper's process `crashing.identity` now
/// runs) as its standby, with the token of `attempt`, waits until it passes its probe, and
/// records it in `current` under the lock. Anything short of that stops what it started.
pub(crate) async fn bring(
    root: &Root,
    crashing: &Live,
    attempt: u64,
    until: tokio::time::Instant,
) -> Result<Standby, Error> {
    if let Some(why) = not_possible(root, crashing) {
        return Err(refused(why));
    }
    let earlier = super::earlier::previous_release(root, &crashing.service, &crashing.version)?;
    let (port, why_there) = standby_port(earlier.port, crashing)?;
    let mut record = crashing.launch.clone();
    // The earlier release's own image and command, if it has them (read once, as a run
    // reads them).
    let folder = root.release_dir(&earlier.version);
    record.image = crate::host::container::ImageRelease::of_release(&folder)
        .map_err(|e| refused(e.to_string()))?
        .map(|image| image.image);
    record.command = crate::release::procfile::Procfile::web_of_release(&folder);
    let mut live = Live {
        service: crashing.service.clone(),
        slot: None,
        process: None,
        version: earlier.version,
        port,
        identity: Identity {
            pid: 0,
            start_time: 0,
        },
        launch: record,
    };
    let mut launched = launch(root, &live, attempt, Spawn::Direct).map_err(Error::Failed)?;
    live.identity = launched.identity;
    let started = launched
        .passes(root, defaults::UP_READY)
        .await
        .and_then(|started| record_it(root, crashing.identity, &live).map(|()| started));
    let started = match started {
        Ok(started) => started,
        Err(e) => {
            crate::host::process::stop_group(live.identity, live.launch.grace()).await;
            return Err(e);
        }
    };
    let detail = format!(
        "{} started beside {} {} (which exited within its crash-loop window) on port {port}{why_there}, {}: the proxy sends it what {} refuses until the window ends",
        live.version, crashing.service, crashing.version, started.how, crashing.version
    );
    log(
        root,
        &live,
        LogEvent::Standby,
        Some(live.identity.pid),
        None,
        detail,
    );
    Ok(Standby {
        live,
        launched,
        until,
    })
}

/// Where the standby listens: the port its release was last live on, when that is free and not
/// the crashing release's; else any port free on 127.0.0.1, which the kernel picks (the proxy
/// finds the standby by `current`'s fallback, never by a range). A restart alternates the live
/// release between a two-port range's ports, so the last port was often the crashing one's,
/// and no standby came: 617 of 985 requests failed through a crash loop (issue 80, 2). Also
/// words for the log line when the port is not the last one.
fn standby_port(last: Option<u16>, crashing: &Live) -> Result<(u16, String), Error> {
    let busy = match last {
        Some(port) if port == crashing.port => Some(format!(
            "its last port {port} is {}'s now",
            crashing.version
        )),
        Some(port) => engine::port_free(port)
            .err()
            .map(|_| format!("its last port {port} is busy")),
        None => Some("no last port on record".to_string()),
    };
    let Some(busy) = busy else {
        return Ok((last.unwrap_or_default(), String::new()));
    };
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| refused(format!("no free port on 127.0.0.1 for a standby: {e}")))?;
    Ok((port, format!(" ({busy}: a free one instead)")))
}

/// Records `standby` as `current`'s fallback, the root locked and `current` still naming the
/// crashing release (else it is not this keeper's any more).
fn record_it(root: &Root, crashing: Identity, standby: &Live) -> Result<(), Error> {
    let _lock = crate::host::lock::acquire(&root.lock_path())?;
    let mut pointer = root
        .read_pointer()?
        .filter(|p| p.names(crashing) && p.fallback.is_none())
        .ok_or_else(|| {
            refused("current names another release now, or has a fallback of its own")
        })?;
    if engine::saved_run(root)?.is_some_and(|run| !run.is_over()) {
        return Err(refused("a run holds the root"));
    }
    pointer.fallback = Some(Fallback {
        version: standby.version.clone(),
        port: standby.port,
        pid: standby.identity.pid,
        start_time: standby.identity.start_time,
        standby: true,
    });
    engine::formation::write_pointer(root, &pointer).map_err(|e| Error::Failed(e.to_string()))
}

/// Makes the standby live in the crashing release's place: `current` names it (switched in
/// one rename), then `promoted` is logged for it and `rolled_back` for the crashing release,
/// naming `because`. The caller holds the lock and has found `crashing` live.
pub(crate) fn make_live(
    root: &Root,
    crashing: &Live,
    standby: &Standby,
    because: &str,
) -> Result<(), Error> {
    let was = root
        .read_pointer()?
        .filter(|p| p.names(crashing.identity))
        .ok_or_else(|| refused("current names another release now"))?;
    let live = &standby.live;
    let pointer = Pointer {
        service: live.service.clone(),
        version: live.version.clone(),
        port: live.port,
        pid: live.identity.pid,
        start_time: live.identity.start_time,
        promoted_at: journal::now(),
        fallback: None,
        launch: live.launch.clone(),
    };
    engine::formation::write_pointer(root, &pointer).map_err(|e| Error::Failed(e.to_string()))?;
    engine::fault_point();
    let detail = format!(
        "{} made live again from its standby (ready since the crash loop began), in the place of {}: {because}",
        live.version, crashing.version
    );
    log(
        root,
        live,
        LogEvent::Promoted,
        Some(live.identity.pid),
        None,
        detail,
    );
    engine::record_rolled_back_in_production(
        root,
        &crashing.service,
        &crashing.version,
        was.promoted_at,
        &live.version,
        Some(because),
    )
}
