//! The formation: one record of what runs (issue 80, 1). Every live process of the release —
//! web's, with its port, and each other type's — with its version, pid and launch record, in
//! `ROOT/formation.json`. Supervision (`up`, `start`, `stop`, the keepers), `scale`, `status`,
//! `logs` and the console read what runs here, web as one type among the others.
//!
//! This module alone writes it, and alone writes the proxy's views of web's part: `current`
//! (the single release; its rename *is* the switch, as it always was) and `replicas.json` (a
//! replica set the proxy balances across). Each view written is followed by the formation
//! re-made from it, so a reader never meets a formation that says another web than the proxy
//! routes to — save after a crash between the two writes, which the next command's recovery
//! (under the lock, before anything acts) mends with [`publish`]. Readers that act (`up`, a
//! keeper, `stop`) read through [`read`], which puts web's part as the views name it now.

use crate::host::fault::Fault;
use crate::host::files::WriteError;
use crate::host::state::{Formation, Pointer, ReplicaSet, Root, TypedProcess, WEB};

/// What runs now: web's processes as the proxy's views name them, then every other type's as
/// the formation names them. None: nothing was ever made live under the root.
pub fn read(root: &Root) -> Result<Option<Formation>, Fault> {
    let web = web_part(root)?;
    let written = root.read_formation()?;
    Ok(combine(web, written))
}

/// Web's part of the formation as the views name it: its service, whether it is a replica
/// set, and its processes.
fn web_part(root: &Root) -> Result<Option<Formation>, Fault> {
    if let Some(set) = root.read_replicas()? {
        // Replicas are started and probed as the rollout that placed them did.
        let launch = super::state::load(root)
            .ok()
            .flatten()
            .filter(|r| r.service == set.service)
            .map(|r| r.settings.launch)
            .unwrap_or_default();
        let processes = set
            .replicas
            .iter()
            .map(|r| TypedProcess {
                process_type: WEB.to_string(),
                index: r.slot,
                version: r.version.clone(),
                port: Some(r.port),
                pid: r.pid,
                start_time: r.start_time,
                launch: launch.clone(),
            })
            .collect();
        return Ok(Some(Formation {
            service: set.service,
            web_replicas: true,
            processes,
        }));
    }
    Ok(root.read_pointer()?.map(|p| Formation {
        processes: vec![TypedProcess {
            process_type: WEB.to_string(),
            index: 0,
            version: p.version.clone(),
            port: Some(p.port),
            pid: p.pid,
            start_time: p.start_time,
            launch: p.launch,
        }],
        service: p.service,
        web_replicas: false,
    }))
}

/// Web's part from the views, the other types' from what was written (of the same service).
fn combine(web: Option<Formation>, written: Option<Formation>) -> Option<Formation> {
    match (web, written) {
        (None, None) => None,
        (None, Some(written)) => Some(Formation {
            processes: written.other_types().cloned().collect(),
            web_replicas: false,
            ..written
        }),
        (Some(mut web), written) => {
            let others = written
                .filter(|w| w.service == web.service)
                .map(|w| w.other_types().cloned().collect::<Vec<_>>())
                .unwrap_or_default();
            web.processes.extend(others);
            Some(web)
        }
    }
}

/// Writes the formation again from the views and what it says of the other types, when that
/// differs from what is written. Recovery calls it before anything acts on the root.
pub(crate) fn publish(root: &Root) -> Result<(), WriteError> {
    let not_read = |e: Fault| WriteError::NotWritten(std::io::Error::other(e.to_string()));
    let written = root.read_formation().map_err(not_read)?;
    let now = combine(web_part(root).map_err(not_read)?, written.clone());
    match now {
        Some(now) if Some(&now) != written.as_ref() => root.write_formation(&now),
        _ => Ok(()),
    }
}

/// Replaces the other types' processes (web's part stays as the views name it): one rename.
pub(crate) fn write_other_types(root: &Root, types: &Formation) -> Result<(), WriteError> {
    let web =
        web_part(root).map_err(|e| WriteError::NotWritten(std::io::Error::other(e.to_string())))?;
    let typed = Formation {
        processes: types.other_types().cloned().collect(),
        web_replicas: false,
        ..types.clone()
    };
    let formation = combine(web, Some(typed.clone())).unwrap_or(typed);
    root.write_formation(&formation)
}

/// Replaces `current` (the switch, when it names another process), then the formation.
pub(crate) fn write_pointer(root: &Root, pointer: &Pointer) -> Result<(), WriteError> {
    then_publish(root, root.write_pointer(pointer))
}

/// Replaces `replicas.json`, then the formation.
pub(crate) fn write_replicas(root: &Root, set: &ReplicaSet) -> Result<(), WriteError> {
    then_publish(root, root.write_replicas(set))
}

/// The formation made again after a view was written. A view written and the formation not is
/// not a failed write (what the proxy routes to did change): it is said as one not made durable,
/// and the next command's recovery writes the formation.
fn then_publish(root: &Root, view: Result<(), WriteError>) -> Result<(), WriteError> {
    if let Err(WriteError::NotWritten(e)) = view {
        return Err(WriteError::NotWritten(e));
    }
    let formation = publish(root).map_err(|e| {
        WriteError::NotDurable(std::io::Error::other(format!(
            "{} was not written again: {e}",
            root.formation_path().display()
        )))
    });
    view.and(formation)
}
