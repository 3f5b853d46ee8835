//! What the executor writes besides its state: the log's lines (a rollout's, a single
//! deploy's) and the pool (`replicas.json`, then `current`).

use super::state::Rollout;
use crate::error::Error;
use crate::host::files::WriteError;
use crate::host::journal::{self, LogEvent};
use crate::host::state::{Fallback, Pointer, Root};

fn failed(message: impl Into<String>) -> Error {
    Error::Failed(message.into())
}

/// Appends one line to the root's log.
pub(crate) fn append(root: &Root, entry: &journal::Entry) -> Result<(), Error> {
    journal::append(&root.log_path(), entry).map_err(|e| {
        failed(format!(
            "cannot append to {}: {e}",
            root.log_path().display()
        ))
    })?;
    super::fault::point();
    Ok(())
}

/// An `analysis` line: one look of the traffic judge, its numbers in `analysis`.
pub(crate) fn log_analysis(
    root: &Root,
    rollout: &Rollout,
    verdict: &crate::engine::analysis::Verdict,
) -> Result<(), Error> {
    let entry = journal::Entry::new(
        LogEvent::Analysis,
        &rollout.to,
        &rollout.service,
        verdict.words.clone(),
    );
    append(
        root,
        &journal::Entry {
            token: Some(&rollout.id),
            wave: Some(rollout.wave.min(rollout.waves.len().saturating_sub(1))),
            analysis: serde_json::to_value(verdict).ok(),
            ..entry
        },
    )
}

/// `promoted` or `rolled_back` for a rollout, unless one was already written under its id (by
/// a run that crashed between the line and the next save).
pub(crate) fn log_outcome(
    root: &Root,
    rollout: &Rollout,
    event: LogEvent,
    detail: String,
) -> Result<(), Error> {
    let written = journal::outcome_for(&root.log_path(), &rollout.id, rollout.started_at)
        .map_err(|e| failed(format!("cannot read {}: {e}", root.log_path().display())))?;
    if written.is_some() {
        return Ok(());
    }
    let entry = journal::Entry::new(event, &rollout.to, &rollout.service, detail);
    let elapsed = ((entry.ts - rollout.started_at).max(0.0) * 1000.0) as u64;
    append(
        root,
        &journal::Entry {
            elapsed_ms: Some(elapsed),
            token: Some(&rollout.id),
            slot: rollout.abort_cause.as_ref().and_then(|c| c.slot),
            wave: Some(rollout.wave.min(rollout.waves.len().saturating_sub(1))),
            ..entry
        },
    )
}

/// A single deploy's line: every line carries the deploy's token, port, the new process's
/// pid and a signed release's facts; an outcome already written under the token (by a run
/// that crashed before its next save) is not written again.
pub(crate) fn log_deploy(
    root: &Root,
    rollout: &Rollout,
    entry: &journal::Entry,
) -> Result<(), Error> {
    if entry.event.is_outcome() {
        let written = journal::outcome_for(&root.log_path(), &rollout.id, rollout.started_at)
            .map_err(|e| failed(format!("cannot read {}: {e}", root.log_path().display())))?;
        if written.is_some() {
            return Ok(());
        }
    }
    let new = rollout.new_process().filter(|p| p.pid > 0);
    let signed = rollout.signed.as_ref();
    append(
        root,
        &journal::Entry {
            port: Some(rollout.settings.ports.0),
            pid: new.map(|p| p.pid),
            token: Some(&rollout.id),
            sequence: signed.map(|s| s.sequence),
            manifest_sha256: signed.map(|s| s.manifest_sha256.as_str()),
            ..entry.clone()
        },
    )
}

/// Replaces `replicas.json`, then `current` (the first live replica, with its kept fallback),
/// each atomically. A single deploy's root is served by `current` alone, as it always was.
/// Some(words) when `current` was renamed but its folder's fsync failed.
pub(crate) fn write_pool(root: &Root, rollout: &Rollout) -> Result<Option<String>, Error> {
    let written = write_pool_files(root, rollout);
    super::fault::point();
    written
}

fn write_pool_files(root: &Root, rollout: &Rollout) -> Result<Option<String>, Error> {
    let pool = rollout.pool();
    if rollout.single.is_none() {
        root.write_replicas(&pool).map_err(|e| {
            failed(format!(
                "cannot write {}: {e}",
                root.replicas_path().display()
            ))
        })?;
    }
    let Some(first) = pool.replicas.first() else {
        return Ok(None);
    };
    let fallback = rollout
        .slot(first.slot)
        .fallback
        .as_ref()
        .map(|kept| Fallback {
            version: kept.version.clone(),
            port: kept.port,
            pid: kept.pid,
        });
    let mut pointer = Pointer {
        service: rollout.service.clone(),
        version: first.version.clone(),
        port: first.port,
        pid: first.pid,
        start_time: first.start_time,
        promoted_at: journal::now(),
        fallback,
        probe: crate::host::probe::Spec::unless_default(&rollout.settings.probe),
        listen: rollout.settings.listen,
    };
    // The same process stays live since it was switched to (only its fallback may change).
    if let Some(live) = root.read_pointer().ok().flatten() {
        if live.version == pointer.version && live.pid == pointer.pid && live.port == pointer.port {
            if live.fallback == pointer.fallback {
                return Ok(None);
            }
            pointer.promoted_at = live.promoted_at;
        }
    }
    match root.write_pointer(&pointer) {
        Ok(()) => Ok(None),
        Err(error @ WriteError::NotDurable(_)) => Ok(Some(error.to_string())),
        Err(WriteError::NotWritten(e)) => Err(failed(format!(
            "cannot switch {}: {e}; the old pointer is intact",
            root.pointer_path().display()
        ))),
    }
}
