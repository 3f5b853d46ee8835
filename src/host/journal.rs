//! The deploy log: one JSON line per action, appended and fsynced before rollgate moves on.

use std::io::{Read, Seek, SeekFrom};
use std::ops::ControlFlow;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// Declares the log's event vocabulary once: each variant with the name written in the log,
/// so the enum, its names and the list of all of them cannot drift apart.
macro_rules! events {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal,)+) => {
        /// The events the deployer writes: one vocabulary for the writer and the code that looks
        /// back.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum LogEvent {
            $($(#[doc = $doc])* $variant,)+
        }

        impl LogEvent {
            /// Every event, for readers that recognise names without allocating.
            pub const ALL: &'static [LogEvent] = &[$(LogEvent::$variant,)+];

            /// The name a log line carries.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(LogEvent::$variant => $name,)+
                }
            }
        }
    };
}

events! {
    CandidateStarted => "candidate_started",
    Promoted => "promoted",
    RolledBack => "rolled_back",
    Escalated => "escalated",
    /// A rollout of several replicas began (its plan in the detail).
    RolloutStarted => "rollout_started",
    /// One replica's new process was started and is being gated.
    ReplicaStarted => "replica_started",
    /// One replica passed its gate and joined the pool.
    ReplicaReady => "replica_ready",
    /// One replica's new process failed (gate or soak); the slot went back.
    ReplicaFailed => "replica_failed",
    /// One replica went back to the baseline (abort with rollback) or its previous version.
    ReplicaRestored => "replica_restored",
    /// A replica beyond the count asked for left the pool (a rollout that scales down).
    ReplicaRemoved => "replica_removed",
    WaveCompleted => "wave_completed",
    RolloutPaused => "rollout_paused",
    RolloutResumed => "rollout_resumed",
    /// `current` names a ready release that is now watched; `promoted` or `rolled_back`
    /// (phase `watch`) follows when the watch ends.
    Switched => "switched",
    /// A hook failed: a pre_deploy's refused the deploy (nothing was started), a post hook's
    /// outcome stands. The detail quotes the end of its output.
    HookFailed => "hook_failed",
    /// A hook ran and exited 0; the detail quotes the end of its output (all of it, bounded,
    /// is kept in `output/VERSION/HOOK.output`).
    HookRan => "hook_ran",
    /// `rollgate up` started a live release that was not running (after a reboot or a crash).
    Restarted => "restarted",
    /// `rollgate up` could not start a live release.
    RestartFailed => "restart_failed",
    /// `rollgate up --supervise` stopped restarting a release that keeps crashing.
    RestartGivenUp => "restart_given_up",
    /// The traffic judge looked at the canary against the baseline (its numbers in
    /// `analysis`); a failed look pauses or rolls back the rollout.
    Analysis => "analysis",
    /// `rollgate traffic` set what the proxy lets through (its mode, who and why in
    /// `traffic`): maintenance, a pause, or serving again.
    Traffic => "traffic",
    /// `rollgate run`: a one-off command ran in a release (who, what, its exit and how long;
    /// never its environment).
    Run => "run",
    /// `rollgate stop`: a person stopped the service; nothing starts it until `rollgate start`.
    Stopped => "stopped",
    /// `rollgate start`: the stopped service's live release serves again.
    Started => "started",
    /// A crash-looping release's keeper started the release live before it beside it, as the
    /// proxy's fallback through the crash-loop window; or that standby was retired (the
    /// window ended, a run began, the service was stopped) — the detail says which.
    Standby => "standby",
    /// A process of another type than web (a worker, a clock: issue 69) was started, was
    /// ready, failed, or was stopped; the detail names it (`worker.1`) and says which.
    Process => "process",
    /// A schedule's run began (issue 70): its `schedule`, the `due` time it is for, the
    /// release it runs in (`version`) and its `pid`.
    ScheduleStarted => "schedule_started",
    /// A schedule's run ended: its exit status (or its time limit), `elapsed_ms`, its release.
    ScheduleFinished => "schedule_finished",
    /// A due time not run, and why (the last run still runs under `'forbid`).
    ScheduleSkipped => "schedule_skipped",
    /// Due times that passed while nothing kept the clock (rollgate down, the service
    /// stopped): said once, how many and which was the last (`due`).
    ScheduleMissed => "schedule_missed",
}

/// Written as its name, the one `as_str` gives.
impl Serialize for LogEvent {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl LogEvent {
    /// The event a log line names, if it is one rollgate writes.
    pub fn from_name(name: &str) -> Option<LogEvent> {
        LogEvent::ALL.iter().copied().find(|e| e.as_str() == name)
    }

    /// Ends an attempt; recorded once per deploy token.
    pub const fn is_outcome(self) -> bool {
        matches!(self, LogEvent::Promoted | LogEvent::RolledBack)
    }
}

/// Field order is the line's key order: the lesson's four first, then the optional ones.
#[derive(Debug, Clone, Serialize)]
pub struct Entry<'a> {
    pub ts: f64,
    pub event: LogEvent,
    pub version: &'a str,
    pub detail: String,
    pub service: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
    /// The deploy's token: lets recovery see that an outcome was already written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<&'a str>,
    /// A signed release's sequence and the SHA-256 of its canonical manifest body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub manifest_sha256: Option<&'a str>,
    /// A rollout's replica and wave (counted from 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slot: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wave: Option<usize>,
    /// Where an outcome was decided when it was not the gate: `watch` (after the switch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<&'a str>,
    /// What a release notified as its `STATUS=` last (readiness by notification).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// An `analysis` line's numbers: counts, rates, quantiles, p-values and the verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub analysis: Option<serde_json::Value>,
    /// A `traffic` line's state: mode, by, why, and the mode's settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic: Option<serde_json::Value>,
    /// A rollback of a release users had (switched back in its watch, or rolled back after
    /// its promotion): [`Exposure`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exposure: Option<Exposure>,
    /// How a live release's process ended before it was started again (`restarted`,
    /// `restart_failed`, `restart_given_up`): its exit status or signal, as its keeper saw it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// The process of another type than web a line is about (`worker.1`; issue 69).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    /// The schedule a line is about (`nightly`; issue 70), and the due time (Unix seconds)
    /// its run is for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub due: Option<f64>,
    /// A schedule's run: whether it succeeded (exit 0 within its limit); a webhook endpoint
    /// for `schedule_finished` sees a failed run by `ok: false`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
}

/// What users had of a release that was rolled back after it served them: how long it was
/// live, what it answered them (the proxy's counts, when a proxy served it), and who or what
/// ended it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Exposure {
    /// From the switch (or the promotion) to the rollback, seconds.
    pub live_s: f64,
    /// Requests it answered through the proxy, and how many of them failed (5xx, or no
    /// answer); none without a proxy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<u64>,
    /// Tries of its that failed and that the proxy then sent to another release, which
    /// answered: not among `requests` or `failed` (the users did not see them fail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried: Option<u64>,
    /// `the traffic judge`, `the watch's probes`, `a person (rollgate rollback)`, ...
    pub ended_by: String,
}

impl Exposure {
    /// In words, for a line's detail: `users had it for 3.2 s (612 requests, 612 failed);
    /// ended by the traffic judge`.
    pub fn words(&self) -> String {
        let retried = self
            .retried
            .map(|n| format!("; {n} more retried on another release and answered there"))
            .unwrap_or_default();
        let served = match (self.requests, self.failed) {
            (Some(requests), Some(failed)) => {
                format!(" ({requests} requests through the proxy, {failed} failed{retried})")
            }
            _ => String::new(),
        };
        format!(
            "users had it for {:.1} s{served}; ended by {}",
            self.live_s, self.ended_by
        )
    }
}

impl<'a> Entry<'a> {
    /// A line stamped now with none of the optional fields; set those with struct update.
    pub fn new(event: LogEvent, version: &'a str, service: &'a str, detail: String) -> Entry<'a> {
        Entry {
            ts: now(),
            event,
            version,
            detail,
            service,
            port: None,
            pid: None,
            elapsed_ms: None,
            token: None,
            sequence: None,
            manifest_sha256: None,
            slot: None,
            wave: None,
            phase: None,
            status: None,
            analysis: None,
            traffic: None,
            exposure: None,
            ended: None,
            process: None,
            schedule: None,
            due: None,
            ok: None,
        }
    }
}

/// Unix seconds, to the millisecond.
pub fn now() -> f64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (since.as_millis() as f64) / 1000.0
}

/// Appends one line. `O_APPEND` keeps concurrent writers' lines whole; the fsync makes the line
/// survive a crash that follows.
///
/// No secret value of the root is ever written: a detail that quotes a release's output (one
/// that printed its environment as it failed) has every known value replaced by `[secret]`.
pub fn append(path: &Path, entry: &Entry) -> std::io::Result<()> {
    let line = with_config(path, entry);
    let secrets = path
        .parent()
        .map(|root| crate::host::config::known_values(&crate::host::config::secrets_dir(root)))
        .unwrap_or_default();
    // Each value as it stands in the text and as JSON escapes it.
    let forms: Vec<String> = secrets
        .iter()
        .flat_map(|v| {
            let escaped = serde_json::to_string(v).expect("a string serializes");
            [v.clone(), escaped[1..escaped.len() - 1].to_string()]
        })
        .collect();
    let mut line = crate::host::config::redact(&line, &forms).into_bytes();
    line.push(b'\n');
    crate::host::files::append_line(path, &line)
}

/// The entry as a JSON line, with the release's `config` (the digest of its env and its
/// secrets' names) and those names (`secrets`) on the records that start or end a release's
/// attempt, when the release has a config, and the SHA-256 of the policy file it runs under
/// (`policy`, from its record in `policies/`): "what changed between the good and the bad
/// release" then has an answer in the log. Never a secret's value.
fn with_config(path: &Path, entry: &Entry) -> String {
    let starts_or_ends = matches!(
        entry.event,
        LogEvent::CandidateStarted
            | LogEvent::RolloutStarted
            | LogEvent::ReplicaStarted
            | LogEvent::Promoted
            | LogEvent::RolledBack
    );
    let root = path
        .parent()
        .filter(|_| starts_or_ends)
        .filter(|_| crate::host::names::check_name("version", entry.version).is_ok());
    let policy =
        root.and_then(|root| super::kept_policy::KeptPolicy::digest_of(root, entry.version));
    let config = root
        .map(|root| root.join("releases").join(entry.version))
        .filter(|dir| {
            dir.join(crate::host::config::ENV_FILE).is_file()
                || dir.join(crate::host::config::SECRETS_FILE).is_file()
        })
        .and_then(|dir| crate::host::config::Config::of_release(&dir).ok());
    if config.is_none() && policy.is_none() {
        return serde_json::to_string(entry).expect("entries serialize");
    }
    let mut value = serde_json::to_value(entry).expect("entries serialize");
    if let serde_json::Value::Object(map) = &mut value {
        if let Some(policy) = policy {
            map.insert("policy".into(), policy.into());
        }
        let Some(config) = config else {
            return value.to_string();
        };
        map.insert("config".into(), config.digest().into());
        if !config.secrets.is_empty() {
            let names: Vec<String> = config
                .secrets
                .iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            map.insert("secrets".into(), names.into());
        }
    }
    value.to_string()
}

/// The outcome (`promoted` or `rolled_back`) already written for deploy `token`, looking back
/// from the end of the log no further than records older than `since` (the deploy's start, in
/// Unix seconds): a crash between the outcome's line and clearing the candidate record must not
/// make recovery write it twice. Reads backwards, so a long log costs nothing extra.
pub fn outcome_for(path: &Path, token: &str, since: f64) -> std::io::Result<Option<LogEvent>> {
    Ok(outcome_line_for(path, token, since)?.map(|(event, _)| event))
}

/// `outcome_for` with the outcome line's detail (why a release was rolled back, as the log
/// says it), for the terminal of the command that ran the deploy.
pub fn outcome_line_for(
    path: &Path,
    token: &str,
    since: f64,
) -> std::io::Result<Option<(LogEvent, String)>> {
    let mut found = None;
    lines_backwards(path, |line| {
        let Ok(record) = serde_json::from_slice::<RunLine>(line) else {
            return ControlFlow::Continue(());
        };
        if record.token == Some(token) {
            found = [LogEvent::Promoted, LogEvent::RolledBack]
                .into_iter()
                .find(|e| e.as_str() == record.event)
                .map(|event| {
                    (
                        event,
                        record.detail.as_deref().unwrap_or_default().to_string(),
                    )
                });
            if found.is_some() {
                return ControlFlow::Break(());
            }
        }
        if record.ts > 0.0 && record.ts < since - 1.0 {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    })?;
    Ok(found)
}

/// What a look back for one run's lines reads of each line: when, what, whose, and (for an
/// outcome's words) the detail, borrowed where JSON gives it without escapes.
#[derive(serde::Deserialize)]
struct RunLine<'a> {
    #[serde(default)]
    ts: f64,
    #[serde(default)]
    event: &'a str,
    #[serde(default)]
    token: Option<&'a str>,
    #[serde(default, borrow)]
    detail: Option<std::borrow::Cow<'a, str>>,
}

/// When users began to have run `token`'s release: its `switched` line (a deploy's), or its
/// first `replica_ready` (a rollout's replica joined the pool), looking back no further than
/// `since` (the run's start).
pub fn served_from(path: &Path, token: &str, since: f64) -> std::io::Result<Option<f64>> {
    let mut found = None;
    lines_backwards(path, |line| {
        let Ok(record) = serde_json::from_slice::<RunLine>(line) else {
            return ControlFlow::Continue(());
        };
        let serves = [LogEvent::Switched, LogEvent::ReplicaReady]
            .iter()
            .any(|e| e.as_str() == record.event);
        if record.token == Some(token) && serves {
            // Read backwards: the last one seen is the first one written.
            found = Some(record.ts);
        }
        if record.ts > 0.0 && record.ts < since - 1.0 {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    })?;
    Ok(found)
}

/// One outcome of the log: a release promoted, rolled back or escalated. The one reader of
/// outcomes that `status`, the console and `release list` share.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub ts: f64,
    pub event: LogEvent,
    pub version: String,
    /// How long its gate took, where the line says.
    pub elapsed_ms: Option<u64>,
    pub detail: String,
    /// What users had of it, for a release rolled back after it served them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exposure: Option<Exposure>,
}

impl Outcome {
    /// Why it did not go live: the detail up to its first `; ` (none for a promotion).
    pub fn reason(&self) -> Option<&str> {
        matches!(
            self.event,
            LogEvent::RolledBack | LogEvent::Escalated | LogEvent::HookFailed
        )
        .then(|| self.detail.split("; ").next().unwrap_or(""))
    }
}

impl Outcome {
    /// A `hook_failed` line of a `pre_deploy` hook or a release phase: the attempt it ends was
    /// refused before anything started, and this line is all the log has of it.
    pub fn is_refusal(&self) -> bool {
        self.event == LogEvent::HookFailed && crate::host::hooks::ran_before_start(&self.detail)
    }

    /// The attempt's outcome as `log history` and `release list` name it: the event's name,
    /// `refused` for a refusal.
    pub fn word(&self) -> &'static str {
        match self.is_refusal() {
            true => "refused",
            false => self.event.as_str(),
        }
    }
}

/// How the `rolled_back` line of a release a person took out of production after its promotion
/// (`rollgate rollback`) begins: that release is then no release to go back to.
pub const ROLLED_BACK_IN_PRODUCTION: &str = "rolled back after its promotion by rollgate rollback";

/// The events that end a release's attempt, as [`Outcome`]s.
pub const OUTCOMES: [LogEvent; 3] = [
    LogEvent::Promoted,
    LogEvent::RolledBack,
    LogEvent::Escalated,
];

/// What a status shows of the recent past: the outcomes and the hooks that ran around them.
pub const RECENT_EVENTS: [LogEvent; 5] = [
    LogEvent::Promoted,
    LogEvent::RolledBack,
    LogEvent::Escalated,
    LogEvent::HookRan,
    LogEvent::HookFailed,
];

/// The log's outcomes, newest first, handed to `each` until it breaks. A log that is not there
/// has none; a line that is not a whole record (torn by a crash) is passed over.
pub fn outcomes_backwards(
    path: &Path,
    each: impl FnMut(Outcome) -> ControlFlow<()>,
) -> std::io::Result<()> {
    events_backwards(path, &OUTCOMES, each)
}

/// The log's lines of these `events`, newest first, as [`Outcome`]s, handed to `each` until it
/// breaks.
pub fn events_backwards(
    path: &Path,
    events: &[LogEvent],
    mut each: impl FnMut(Outcome) -> ControlFlow<()>,
) -> std::io::Result<()> {
    #[derive(serde::Deserialize)]
    struct Line {
        #[serde(default)]
        ts: f64,
        #[serde(default)]
        event: String,
        #[serde(default)]
        version: String,
        #[serde(default)]
        elapsed_ms: Option<u64>,
        #[serde(default)]
        detail: String,
        #[serde(default)]
        exposure: Option<Exposure>,
    }
    lines_backwards(path, |line| {
        let Ok(record) = serde_json::from_slice::<Line>(line) else {
            return ControlFlow::Continue(());
        };
        match LogEvent::from_name(&record.event).filter(|e| events.contains(e)) {
            Some(event) => each(Outcome {
                ts: record.ts,
                event,
                version: record.version,
                elapsed_ms: record.elapsed_ms,
                detail: record.detail,
                exposure: record.exposure,
            }),
            None => ControlFlow::Continue(()),
        }
    })
}

/// A live release's restarts since `since` (Unix seconds; its promotion): how many, and the
/// last one's time and how its process had ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Restarts {
    pub count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_at: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_ended: Option<String>,
}

/// The `restarted` lines of `version` written since `since` (of another type's `process`, or
/// web's: lines naming no process), read from the end of the log.
pub fn restarts_since(
    path: &Path,
    version: &str,
    process: Option<&str>,
    since: f64,
) -> std::io::Result<Restarts> {
    #[derive(serde::Deserialize)]
    struct Line {
        #[serde(default)]
        ts: f64,
        #[serde(default)]
        event: String,
        #[serde(default)]
        version: String,
        #[serde(default)]
        ended: Option<String>,
        #[serde(default)]
        process: Option<String>,
    }
    let mut restarts = Restarts::default();
    lines_backwards(path, |line| {
        let Ok(record) = serde_json::from_slice::<Line>(line) else {
            return ControlFlow::Continue(());
        };
        if record.ts < since {
            return ControlFlow::Break(());
        }
        if record.event == LogEvent::Restarted.as_str()
            && record.version == version
            && record.process.as_deref() == process
        {
            restarts.count += 1;
            if restarts.last_at.is_none() {
                restarts.last_at = Some(record.ts);
                restarts.last_ended = record.ended;
            }
        }
        ControlFlow::Continue(())
    })?;
    Ok(restarts)
}

/// The last `limit` outcomes of the log, oldest first.
pub fn last_outcomes(path: &Path, limit: usize) -> std::io::Result<Vec<Outcome>> {
    last_of(path, &OUTCOMES, limit)
}

/// The last `limit` lines of these `events`, oldest first.
pub fn last_of(path: &Path, events: &[LogEvent], limit: usize) -> std::io::Result<Vec<Outcome>> {
    let mut found = Vec::with_capacity(limit.min(1024));
    if limit > 0 {
        events_backwards(path, events, |outcome| {
            found.push(outcome);
            match found.len() < limit {
                true => ControlFlow::Continue(()),
                false => ControlFlow::Break(()),
            }
        })?;
    }
    found.reverse();
    Ok(found)
}

/// The log's lines from the last to the first, handed to `each` until it breaks. Reads in
/// blocks from the end, so looking at the recent past of a long log costs only that past.
fn lines_backwards(
    path: &Path,
    mut each: impl FnMut(&[u8]) -> ControlFlow<()>,
) -> std::io::Result<()> {
    const BLOCK: u64 = 64 * 1024;
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut end = file.seek(SeekFrom::End(0))?;
    // Bytes after the last newline seen so far, carried to the next (earlier) block.
    let mut carry: Vec<u8> = Vec::new();
    loop {
        let start = end.saturating_sub(BLOCK);
        let mut block = vec![0; (end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut block)?;
        block.extend_from_slice(&carry);
        let mut lines: Vec<&[u8]> = block.split(|b| *b == b'\n').collect();
        // The first piece may be the end of a line that began in an earlier block.
        let first = if start > 0 {
            lines.remove(0).to_vec()
        } else {
            Vec::new()
        };
        for line in lines.iter().rev().filter(|l| !l.is_empty()) {
            if each(line).is_break() {
                return Ok(());
            }
        }
        if start == 0 {
            return Ok(());
        }
        carry = first;
        end = start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ts: f64, event: LogEvent, token: &str) -> String {
        let mut line = serde_json::to_string(&Entry {
            ts,
            event,
            version: "v1",
            detail: "d".into(),
            service: "s",
            port: None,
            pid: None,
            elapsed_ms: None,
            token: Some(token),
            sequence: None,
            manifest_sha256: None,
            slot: None,
            wave: None,
            phase: None,
            status: None,
            analysis: None,
            traffic: None,
            exposure: None,
            ended: None,
            process: None,
            schedule: None,
            due: None,
            ok: None,
        })
        .unwrap();
        line.push('\n');
        line
    }

    #[test]
    fn every_event_is_written_and_read_back_by_one_name() {
        let mut names: Vec<&str> = LogEvent::ALL.iter().map(|e| e.as_str()).collect();
        for event in LogEvent::ALL {
            let written = serde_json::to_string(event).unwrap();
            assert_eq!(written, format!("\"{}\"", event.as_str()));
            assert_eq!(LogEvent::from_name(event.as_str()), Some(*event));
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), LogEvent::ALL.len(), "two events share a name");
        assert_eq!(LogEvent::from_name("noise"), None);
    }

    #[test]
    fn an_outcome_is_found_by_its_token_across_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deploy.log");
        let mut text = String::new();
        text.push_str(&entry(100.0, LogEvent::Promoted, "old"));
        text.push_str(&entry(200.0, LogEvent::CandidateStarted, "t1"));
        // A long line between them, so the search crosses a block boundary mid-line.
        text.push_str(&format!(
            "{{\"ts\":201,\"event\":\"noise\",\"detail\":\"{}\"}}\n",
            "n".repeat(100_000)
        ));
        text.push_str(&entry(202.0, LogEvent::RolledBack, "t1"));
        text.push_str(&entry(300.0, LogEvent::CandidateStarted, "t2"));
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            outcome_for(&path, "t1", 200.0).unwrap(),
            Some(LogEvent::RolledBack)
        );
        assert_eq!(outcome_for(&path, "t2", 300.0).unwrap(), None);
        // Older than the deploy's start: not looked at.
        assert_eq!(outcome_for(&path, "old", 300.0).unwrap(), None);
        assert_eq!(
            outcome_for(&path, "old", 100.0).unwrap(),
            Some(LogEvent::Promoted)
        );
        assert_eq!(
            outcome_for(&dir.path().join("none"), "t", 0.0).unwrap(),
            None
        );
    }

    #[test]
    fn the_last_outcomes_are_read_from_the_end_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deploy.log");
        let mut text = String::new();
        for n in 0..200 {
            text.push_str(&entry(f64::from(n), LogEvent::Promoted, &format!("t{n}")));
            text.push_str(&entry(f64::from(n) + 0.5, LogEvent::CandidateStarted, "x"));
        }
        text.push_str(&entry(300.0, LogEvent::RolledBack, "t300"));
        // A torn last line, as a crash mid-write leaves it.
        text.push_str("{\"ts\":301,\"event\":\"promo");
        std::fs::write(&path, text).unwrap();
        let last = last_outcomes(&path, 3).unwrap();
        let seen: Vec<(f64, LogEvent)> = last.iter().map(|o| (o.ts, o.event)).collect();
        assert_eq!(
            seen,
            [
                (198.0, LogEvent::Promoted),
                (199.0, LogEvent::Promoted),
                (300.0, LogEvent::RolledBack)
            ]
        );
        assert_eq!(last[2].reason(), Some("d"));
        assert_eq!(last[0].reason(), None);
        assert_eq!(last_outcomes(&path, 0).unwrap(), Vec::new());
        assert_eq!(last_outcomes(&path, 1000).unwrap().len(), 201);
        assert!(last_outcomes(&dir.path().join("none"), 5)
            .unwrap()
            .is_empty());
    }
}
