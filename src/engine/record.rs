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
    let now = journal::now();
    // Rolled back after a replica of it had joined the pool: users had it (the canary).
    let exposure = (event == LogEvent::RolledBack)
        .then(|| served_from(root, rollout))
        .flatten()
        .map(|from| {
            let reason = detail.split("; ").next().unwrap_or("");
            exposure(root, &rollout.to, now - from, ended_by(reason))
        });
    let detail = match &exposure {
        Some(exposure) => format!("{detail}; {}", exposure.words()),
        None => detail,
    };
    let entry = journal::Entry::new(event, &rollout.to, &rollout.service, detail);
    let elapsed = ((entry.ts - rollout.started_at).max(0.0) * 1000.0) as u64;
    append(
        root,
        &journal::Entry {
            ts: now,
            elapsed_ms: Some(elapsed),
            token: Some(&rollout.id),
            slot: rollout.abort_cause.as_ref().and_then(|c| c.slot),
            wave: Some(rollout.wave.min(rollout.waves.len().saturating_sub(1))),
            exposure,
            ..entry
        },
    )
}

/// When users began to have this run's release: its switch (a deploy), or its first replica
/// ready in the pool (a rollout); None when they never had it.
fn served_from(root: &Root, rollout: &Rollout) -> Option<f64> {
    journal::served_from(&root.log_path(), &rollout.id, rollout.started_at)
        .ok()
        .flatten()
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
    // Switched back in its watch: users had it. The line says for how long, what it answered
    // them and what ended it, so no log reader counts it among the candidates users never saw.
    let exposure =
        (entry.event == LogEvent::RolledBack && entry.phase == Some("watch")).then(|| {
            let from = served_from(root, rollout).unwrap_or(rollout.started_at);
            // The reason as the line gives it (its detail up to the first "; ").
            let reason = entry.detail.split("; ").next().unwrap_or("");
            exposure(root, &rollout.to, entry.ts - from, ended_by(reason))
        });
    let detail = match &exposure {
        Some(exposure) => format!("{}; {}", entry.detail, exposure.words()),
        None => entry.detail.clone(),
    };
    append(
        root,
        &journal::Entry {
            port: Some(rollout.settings.ports.0),
            pid: new.map(|p| p.pid),
            token: Some(&rollout.id),
            sequence: signed.map(|s| s.sequence),
            manifest_sha256: signed.map(|s| s.manifest_sha256.as_str()),
            detail,
            exposure,
            ..entry.clone()
        },
    )
}

/// `rollgate rollback` took `version` (promoted at `promoted_at`) from users and `back_to` is
/// live again: a `rolled_back` line for it, after the promotion of `back_to`, with what users
/// had of it. It carries no run's token: it ends no attempt, it marks a promoted release as
/// failed in production (the lesson's rule stands: only `promoted` changes what is live).
pub(crate) fn log_rolled_back_in_production(
    root: &Root,
    service: &str,
    version: &str,
    promoted_at: f64,
    back_to: &str,
    because: Option<&str>,
) -> Result<(), Error> {
    let now = journal::now();
    let ended_by = match because {
        Some(_) => "its keeper (a crash loop after its switch)",
        None => "a person (rollgate rollback)",
    };
    let exposure = exposure(root, version, now - promoted_at, ended_by.into());
    let because = because.map(|why| format!(": {why}")).unwrap_or_default();
    let detail = format!(
        "{}, back to {back_to}{because}; {}",
        journal::ROLLED_BACK_IN_PRODUCTION,
        exposure.words()
    );
    append(
        root,
        &journal::Entry {
            ts: now,
            exposure: Some(exposure),
            ..journal::Entry::new(LogEvent::RolledBack, version, service, detail)
        },
    )
}

/// What users had of `version` over `live_s` seconds: the proxy's counts of it (since the
/// proxy started, when one serves the root and answers within half a second), and what ended
/// it.
pub(crate) fn exposure(
    root: &Root,
    version: &str,
    live_s: f64,
    ended_by: String,
) -> journal::Exposure {
    let counts = crate::proxy::control::counts_now(&root.0, std::time::Duration::from_millis(500))
        .ok()
        .map(|now| super::analysis::Side::between(None, &now, version));
    let users_had = counts.as_ref().map(super::analysis::Side::users_had);
    journal::Exposure {
        live_s: live_s.max(0.0),
        requests: users_had.map(|(requests, _)| requests),
        failed: users_had.map(|(_, failed)| failed),
        retried: counts.as_ref().map(|c| c.retried).filter(|n| *n > 0),
        ended_by,
    }
}

/// Who or what ended a release's time with users, from the reason its run gave. A reason the
/// engine did not word is a person's (`rollout abort --reason`, or "aborted by a person").
pub(crate) fn ended_by(reason: &str) -> String {
    // A required process's failure is judged by how it failed; a gate's words by theirs.
    let failed = reason
        .strip_prefix("required replica ")
        .or_else(|| reason.strip_prefix("process "))
        .and_then(|rest| rest.split_once(" failed: "));
    if let Some((_, how)) = failed {
        return ended_by(how);
    }
    if let Some(how) = reason.strip_prefix("candidate ") {
        return ended_by(how);
    }
    let by = if reason.contains("not confirmed by the release deadline") {
        "the release deadline"
    } else if reason.starts_with("not ready") || reason.starts_with("stopped being ready") {
        "its readiness gate"
    } else if reason.starts_with("analysis") {
        "the traffic judge"
    } else if reason.starts_with("killed: out of memory") {
        "the kernel (out of memory at its limit)"
    } else if reason.starts_with("interrupted by") {
        "a signal to the deployer"
    } else if reason.starts_with("exited") {
        "the release itself (it exited)"
    } else if reason.contains("probe") || reason.contains("during the watch") {
        "the watch's probes"
    } else if reason.is_empty() {
        "the watch"
    } else {
        "a person"
    };
    by.to_string()
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
    // The other types' live processes first: web's switch is the release's last step.
    if rollout.types_only {
        // Web did not move: its files and the pointer (with its fallback) stay as they are.
        super::formation::write_other_types(root, &rollout.formation()).map_err(|e| {
            failed(format!(
                "cannot write {}: {e}",
                root.formation_path().display()
            ))
        })?;
        return Ok(None);
    }
    if rollout.is_whole_release() {
        super::formation::write_other_types(root, &rollout.formation()).map_err(|e| {
            failed(format!(
                "cannot write {}: {e}",
                root.formation_path().display()
            ))
        })?;
    }
    let pool = rollout.pool();
    if rollout.single.is_none() {
        super::formation::write_replicas(root, &pool).map_err(|e| {
            failed(format!(
                "cannot write {}: {e}",
                root.replicas_path().display()
            ))
        })?;
    }
    let Some(first) = pool.replicas.first() else {
        return Ok(None);
    };
    let Some(live) = rollout.slot(first.slot).live.as_ref() else {
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
            start_time: kept.start_time,
            standby: false,
        });
    let mut pointer = Pointer {
        promoted_at: journal::now(),
        fallback,
        ..rollout.pointer_to(live)
    };
    // The same process stays live since it was switched to (only its fallback may change).
    // A new process of the live version (a restart, a scale, a deploy of the same version)
    // keeps the version's switch time: the crash-loop window and what users had of a release
    // count from the switch to its code, which a restart does not move (issue 80, 2: a
    // restart re-armed the crash-loop rollback, and a few exits rolled the code back).
    if let Some(live) = root.read_pointer().ok().flatten() {
        let same_process =
            live.version == pointer.version && live.pid == pointer.pid && live.port == pointer.port;
        if same_process && live.fallback == pointer.fallback {
            return Ok(None);
        }
        if live.service == pointer.service && live.version == pointer.version {
            pointer.promoted_at = live.promoted_at;
        }
    }
    match super::formation::write_pointer(root, &pointer) {
        Ok(()) => Ok(None),
        Err(error @ WriteError::NotDurable(_)) => Ok(Some(error.to_string())),
        Err(WriteError::NotWritten(e)) => Err(failed(format!(
            "cannot switch {}: {e}; the old pointer is intact",
            root.pointer_path().display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::ended_by;

    /// Every reason the engine words names what ended the release, not "a person" (a rollout
    /// aborted at its release deadline said "ended by a person").
    #[test]
    fn an_engine_reason_names_what_ended_the_release_and_only_a_persons_says_a_person() {
        let cases = [
            (
                "required replica 2 not confirmed by the release deadline",
                "the release deadline",
            ),
            (
                "required replica 1 failed: candidate exited with exit status: 9 before ready",
                "the release itself (it exited)",
            ),
            (
                "process worker.0 failed: candidate killed: out of memory at its 64 MiB limit",
                "the kernel (out of memory at its limit)",
            ),
            (
                "required replica 0 failed: not ready after 700 ms",
                "its readiness gate",
            ),
            ("analysis failed: canary 5xx", "the traffic judge"),
            ("aborted by a person", "a person"),
            ("bad data in the canary, says ops", "a person"),
        ];
        for (reason, by) in cases {
            assert_eq!(ended_by(reason), by, "{reason}");
        }
    }
}
