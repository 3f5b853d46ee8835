//! The requests a stop-first run holds (issue 67, 2): a deploy that changes the user the
//! service runs as cannot run the old and the new release side by side (the service's folders
//! belong to one user at a time, and never change hands under a running process), so it stops
//! the live release before starting the new one — and pauses the service's traffic first, so
//! that users' requests wait at the proxy (`traffic.json`, which every proxy serving the root
//! watches) instead of failing. The pause is recorded on the run before it is written, so the
//! run — or the rollgate that recovers it after a crash — always lifts it; a maintenance or a
//! pause a person set is theirs and is left alone.

use super::*;
use crate::host::traffic::{self, Mode, Traffic};
use std::time::Instant;

/// How long the proxy has to say it holds requests before the old release is stopped anyway.
const HOLD_CONFIRM: Duration = Duration::from_secs(2);

/// Who a run's pause names as its setter: what tells it from a person's.
fn hold_marker(rollout: &Rollout) -> String {
    format!("rollgate deploy {}", rollout.id)
}

/// The pause a run that died left on the root, lifted (recovery's last word, whatever path
/// it took): a pause is never left behind by a run that is no more. Nothing when the run held
/// none, or a person changed the mode since.
pub(crate) fn lift_left_pause(root: &Root, rollout: &Rollout) -> Result<(), Error> {
    if !rollout.holds_requests {
        return Ok(());
    }
    let left =
        traffic::read(&root.0)?.filter(|t| t.mode == Mode::Paused && t.by == hold_marker(rollout));
    if let Some(held) = left {
        let state = Traffic {
            mode: Mode::Serving,
            since: journal::now(),
            why: Some(format!("{} ended its stop-first start", rollout.to)),
            ..held
        };
        traffic::write(&root.0, &state)?;
        log_traffic(root, rollout, &state)?;
    }
    Ok(())
}

impl Executor {
    fn hold_marker(&self) -> String {
        hold_marker(&self.rollout)
    }

    /// Pauses the service's traffic before its live release stops, unless a person already
    /// set a mode of their own; returns once the proxy holds requests (or none serves the
    /// root, which is said).
    pub(super) async fn hold_requests(&mut self) -> Result<(), Error> {
        let root = self.context.root.clone();
        if self.rollout.holds_requests {
            return Ok(());
        }
        if traffic::read(&root.0)?.is_some_and(|t| t.mode != Mode::Serving) {
            return Ok(());
        }
        let settings = &self.rollout.settings;
        // Long enough for the old release's drain and stop and the new one's gate, with room
        // to spare: a pause that runs out answers 503.
        let budget = settings.drain_ms + settings.grace_ms + settings.progress_deadline_ms;
        let state = Traffic {
            service: self.rollout.service.clone(),
            mode: Mode::Paused,
            max_pause_ms: Some((budget + 10_000).max(traffic::DEFAULT_MAX_PAUSE_MS)),
            since: journal::now(),
            by: self.hold_marker(),
            why: Some(format!(
                "the service's user changes with {}: its old release stops before the new one starts",
                self.rollout.to
            )),
            ..Traffic::default()
        };
        self.rollout.holds_requests = true;
        self.save()?;
        traffic::write(&root.0, &state)?;
        self.log_traffic(&state)?;
        let asked = Instant::now();
        loop {
            match crate::proxy::control::traffic_now(&root.0, Duration::from_millis(500)) {
                None => {
                    eprintln!(
                        "rollgate: no proxy serves {}: while no release of {} runs, its users' connections are refused",
                        root.0.display(),
                        self.rollout.service
                    );
                    return Ok(());
                }
                Some(mode) if mode == Mode::Paused.as_str() => return Ok(()),
                Some(_) if asked.elapsed() >= HOLD_CONFIRM => return Ok(()),
                Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Lifts the run's pause (the requests waiting go on, in order, to what is live now);
    /// nothing when the run holds none or a person changed the mode since.
    pub(super) fn release_requests(&mut self) -> Result<(), Error> {
        if !self.rollout.holds_requests {
            return Ok(());
        }
        lift_left_pause(&self.context.root, &self.rollout)?;
        self.rollout.holds_requests = false;
        self.save()
    }

    fn log_traffic(&self, state: &Traffic) -> Result<(), Error> {
        log_traffic(&self.context.root, &self.rollout, state)
    }
}

/// The run's `traffic` line: paused by it, or serving again.
fn log_traffic(root: &Root, rollout: &Rollout, state: &Traffic) -> Result<(), Error> {
    let detail = match state.mode {
        Mode::Paused => format!(
            "paused by {} (requests wait up to {} ms): {}",
            state.by,
            state.max_pause_ms.unwrap_or(traffic::DEFAULT_MAX_PAUSE_MS),
            state.why.as_deref().unwrap_or_default()
        ),
        _ => format!(
            "serving again, resumed by {}: {}",
            state.by,
            state.why.as_deref().unwrap_or_default()
        ),
    };
    let entry = journal::Entry {
        token: Some(&rollout.id),
        traffic: serde_json::to_value(state).ok(),
        ..journal::Entry::new(LogEvent::Traffic, &rollout.to, &rollout.service, detail)
    };
    append(root, &entry)
}
