//! Attempts: each `candidate_started` paired with the outcome that ended it. Pure logic over
//! the columns, so every rule here is tested without files.

use std::collections::HashMap;

use super::read::{Log, ReadOptions, Record, Sink};
use super::summary::{reason_of, PROMOTED, ROLLED_BACK, ROLLOUT_STARTED, STARTED};
use crate::host::journal::LogEvent;

pub const ESCALATED: &str = LogEvent::Escalated.as_str();
const HOOK_RAN: &str = LogEvent::HookRan.as_str();
const HOOK_FAILED: &str = LogEvent::HookFailed.as_str();
const SWITCHED: &str = LogEvent::Switched.as_str();

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Promoted,
    RolledBack,
    /// Left running at the deadline for a person to promote or abort.
    Escalated,
    /// Started, and the log says nothing more (a deploy in progress, or a crashed deployer).
    Unfinished,
    /// Refused before anything started: its `pre_deploy` hook failed (the hook's line is the
    /// attempt's only line).
    Refused,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Promoted => "promoted",
            Outcome::RolledBack => "rolled_back",
            Outcome::Escalated => "escalated",
            Outcome::Unfinished => "unfinished",
            Outcome::Refused => "refused",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    // Strings as `Box<str>`, the big rarely-present parts boxed: a million attempts are held
    // at once, and each word of this struct is 8 MB of them.
    pub version: Option<Box<str>>,
    pub started: Option<f64>,
    pub finished: Option<f64>,
    pub outcome: Outcome,
    /// For a rollback, the detail up to its first `"; "`.
    pub reason: Option<Box<str>>,
    /// For a promotion: when the next promotion replaced it (None while still live).
    pub live_until: Option<f64>,
    /// The release that is live at the end of the log.
    pub live_now: bool,
    /// For a promotion later rolled back in production: when that happened.
    pub rolled_back_at: Option<f64>,
    /// For a signed release: its sequence and the SHA-256 of its manifest body. Boxed like
    /// the rollout facts: most logs have none, and 24 bytes an attempt were 24 MB of `stats`.
    pub signed: Option<Box<SignedFacts>>,
    /// For a rollout of several replicas: how its waves went.
    /// Boxed: most attempts are single deploys, and a million of them are held at once.
    pub rollout: Option<Box<RolloutFacts>>,
}

/// A release's facts, as its deploy's log lines carry them: a signed release's sequence and
/// manifest digest, and the digest of the release's config (its env and its secrets' names).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SignedFacts {
    pub sequence: Option<u64>,
    pub manifest_sha256: Option<Box<str>>,
    pub config: Option<Box<str>>,
    /// The SHA-256 of the policy file it ran under (its record in the root's `policies/`).
    pub policy: Option<Box<str>>,
    /// The hooks that ran for it, as their lines say (`pre_deploy (./migrate.sh) exited 0
    /// after 80 ms ...: migrated`), joined by ` / `.
    pub hooks: Option<Box<str>>,
    /// When users began to have it before its outcome: its `switched` line (a deploy's watch).
    pub switched_at: Option<f64>,
    /// What users had of it, as its rollback's line says (`exposure`).
    pub exposure: Option<crate::host::journal::Exposure>,
}

impl SignedFacts {
    /// Record `i`'s, if it names any.
    fn of(log: &Log, i: usize) -> Option<Box<SignedFacts>> {
        let facts = SignedFacts {
            sequence: log.extra_value("sequence", i).and_then(|v| v.as_u64()),
            manifest_sha256: log
                .extra_value("manifest_sha256", i)
                .and_then(|v| v.as_str())
                .map(Box::from),
            config: log
                .extra_value("config", i)
                .and_then(|v| v.as_str())
                .map(Box::from),
            policy: log
                .extra_value("policy", i)
                .and_then(|v| v.as_str())
                .map(Box::from),
            hooks: None,
            switched_at: None,
            exposure: log
                .extra_value("exposure", i)
                .and_then(|v| serde_json::from_value(v.clone()).ok()),
        };
        (facts != SignedFacts::default()).then(|| Box::new(facts))
    }

    /// An attempt's facts once its outcome's line is read: the start line's release facts
    /// stand (the outcome's fill in what it did not say), what the lines between gathered
    /// (hooks, the switch) is kept, and the outcome's `exposure` is its own.
    fn merged(
        before: Option<Box<SignedFacts>>,
        outcome: Option<Box<SignedFacts>>,
    ) -> Option<Box<SignedFacts>> {
        let Some(mut facts) = before else {
            return outcome;
        };
        if let Some(outcome) = outcome {
            let SignedFacts {
                sequence,
                manifest_sha256,
                config,
                policy,
                exposure,
                ..
            } = *outcome;
            if facts.sequence.is_none() && facts.manifest_sha256.is_none() && facts.config.is_none()
            {
                facts.sequence = sequence;
                facts.manifest_sha256 = manifest_sha256;
                facts.config = config;
            }
            facts.policy = facts.policy.take().or(policy);
            facts.exposure = exposure.or(facts.exposure.take());
        }
        Some(facts)
    }
}

/// A rollout's waves as its log lines tell them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RolloutFacts {
    pub id: String,
    /// Waves that completed.
    pub waves_done: usize,
    /// Per wave: from its first replica's start to its completion (soak excluded), seconds.
    pub wave_times: Vec<Option<f64>>,
    /// Per wave: replicas that failed.
    pub failures: Vec<usize>,
    pub pauses: usize,
}

impl RolloutFacts {
    fn wave(&mut self, wave: usize) -> usize {
        if self.wave_times.len() <= wave {
            self.wave_times.resize(wave + 1, None);
            self.failures.resize(wave + 1, 0);
        }
        wave
    }
}

/// A rollout's id from a line's token: the rollout's own lines carry the id, a replica's
/// process lines `<id>-<slot>-<n>`.
fn rollout_id(token: &str) -> &str {
    token.split('-').next().unwrap_or(token)
}

impl Attempt {
    pub fn sequence(&self) -> Option<u64> {
        self.signed.as_ref().and_then(|s| s.sequence)
    }

    /// The digest of the release's config, when it has one (`releases/VERSION/env`, `secrets`).
    pub fn config(&self) -> Option<&str> {
        self.signed.as_ref().and_then(|s| s.config.as_deref())
    }

    /// The SHA-256 of the policy file it ran under, where its lines name one.
    pub fn policy(&self) -> Option<&str> {
        self.signed.as_ref().and_then(|s| s.policy.as_deref())
    }

    /// The hooks that ran for it, as their lines said.
    pub fn hooks(&self) -> Option<&str> {
        self.signed.as_ref().and_then(|s| s.hooks.as_deref())
    }

    pub fn manifest_sha256(&self) -> Option<&str> {
        self.signed
            .as_ref()
            .and_then(|s| s.manifest_sha256.as_deref())
    }

    /// Time from the candidate's start to its outcome: time to promotion (its watch or soaks
    /// included), time to rollback for a rollback. Not lead time: the log has no commit times.
    pub fn time_to_outcome(&self) -> Option<f64> {
        Some(self.finished? - self.started?)
    }

    /// How long a promoted release served, where the log says (until replaced).
    pub fn live_for(&self) -> Option<f64> {
        Some(self.live_until? - self.finished?)
    }

    /// How long users had a release that was rolled back after they had it (in its watch, or
    /// in production after its promotion). One definition everywhere (issue 81, 4): from its switch to its rollback — what its
    /// rollback's line says (`exposure.live_s`, counted from `current`'s switch), else from its
    /// `switched` line, else (a log with no switch line) from its promotion.
    pub fn exposure(&self) -> Option<f64> {
        let switched = self
            .facts()
            .and_then(|f| f.switched_at)
            .filter(|t| t.is_finite());
        match self.outcome {
            Outcome::RolledBack => match self.served() {
                Some(said) => Some(said.live_s),
                None => Some(self.finished? - switched?),
            },
            _ => {
                let ended = self.rolled_back_at?;
                match self.served() {
                    Some(said) => Some(said.live_s),
                    None => Some(ended - switched.or(self.finished)?),
                }
            }
        }
    }

    /// What its rollback's line says users had of it (requests, failures, what ended it).
    pub fn served(&self) -> Option<&crate::host::journal::Exposure> {
        self.facts()?.exposure.as_ref()
    }

    fn facts(&self) -> Option<&SignedFacts> {
        self.signed.as_deref()
    }
}

/// Pairs records into attempts, in log order.
///
/// Rules: a `candidate_started` opens an attempt for its version; the next `promoted` or
/// `rolled_back` of that version closes the most recent open one (`escalated` marks it and
/// keeps it open). An outcome with no open attempt is an attempt whose start is not in the log,
/// unless it is a rollback of the live release: that is a production rollback of a promotion,
/// recorded on the promotion. Only `promoted` changes which release is live.
pub fn attempts(log: &Log) -> Vec<Attempt> {
    let mut pairing = Pairing::default();
    pairing.feed(log);
    pairing.finish()
}

/// [`attempts`] fed a piece of the log at a time, in order, so a whole file's records never
/// need to be held at once: what it keeps is the attempts and the ones still open.
#[derive(Debug, Default)]
pub struct Pairing {
    attempts: Vec<Attempt>,
    open: OpenAttempts,
    /// `earlier_open[i]`: the attempt of the same version opened before attempt `i` and still
    /// open (a stack per version without a Vec per version).
    earlier_open: Vec<Option<usize>>,
    live: Option<usize>,
    /// Rollouts by id: the attempt that holds their facts, and when each wave began.
    rollouts: HashMap<String, (usize, Vec<Option<f64>>)>,
    /// Records fed so far.
    seen: u64,
    /// A pre_deploy hook's words and the record they were on: the run writes its start on the
    /// very next line (a hook that refused the run is followed by no start, and is no
    /// attempt's).
    hook_before: Option<(u64, Option<Box<str>>, String)>,
    /// The attempt an outcome closed last: a post hook's line follows its outcome.
    last_closed: Option<usize>,
    /// The promotion the last one replaced.
    replaced: Option<usize>,
}

/// Adds a hook's words to an attempt's facts.
fn note_hook(attempt: &mut Attempt, words: &str) {
    let facts = attempt.signed.get_or_insert_with(Default::default);
    facts.hooks = Some(match facts.hooks.take() {
        Some(before) => format!("{before} / {words}").into(),
        None => words.into(),
    });
}

/// The newest open attempt per version (a record without a version is a version of its own).
#[derive(Debug, Default)]
struct OpenAttempts {
    by_version: HashMap<String, usize>,
    without_version: Option<usize>,
}

impl OpenAttempts {
    fn get(&self, version: Option<&str>) -> Option<usize> {
        match version {
            Some(v) => self.by_version.get(v).copied(),
            None => self.without_version,
        }
    }

    fn insert(&mut self, version: Option<&str>, index: usize) -> Option<usize> {
        match version {
            Some(v) => self.by_version.insert(v.to_string(), index),
            None => self.without_version.replace(index),
        }
    }

    fn remove(&mut self, version: Option<&str>) -> Option<usize> {
        match version {
            Some(v) => self.by_version.remove(v),
            None => self.without_version.take(),
        }
    }
}

impl Pairing {
    /// The next records of the log, in order.
    pub fn feed(&mut self, log: &Log) {
        for i in 0..log.len() {
            self.record(log, i);
        }
    }

    fn record(&mut self, log: &Log, i: usize) {
        self.seen += 1;
        let attempts = &mut self.attempts;
        let version = log.version[i].as_deref();
        let ts = log.ts[i];
        let token = log.extra_value("token", i).and_then(|v| v.as_str());
        let wave = log
            .extra_value("wave", i)
            .and_then(|v| v.as_u64())
            .map(|w| w as usize);
        let new_attempt = |outcome| Attempt {
            version: version.map(Box::from),
            started: None,
            finished: None,
            outcome,
            reason: None,
            live_until: None,
            live_now: false,
            rolled_back_at: None,
            signed: SignedFacts::of(log, i),
            rollout: None,
        };
        let event = log.event[i].as_deref();
        if let Some(token) = token.filter(|_| event != Some(ROLLOUT_STARTED)) {
            if let Some((index, begun)) = self.rollouts.get_mut(rollout_id(token)) {
                let attempt = &mut attempts[*index];
                let facts = attempt
                    .rollout
                    .as_mut()
                    .expect("a rollout's attempt has facts");
                note_rollout_line(facts, begun, event, wave, ts);
                // A replica of it joined the pool: from then on users had it.
                if event == Some(LogEvent::ReplicaReady.as_str())
                    && attempt.outcome == Outcome::Unfinished
                {
                    let facts = attempt.signed.get_or_insert_with(Default::default);
                    facts.switched_at.get_or_insert(ts.unwrap_or(f64::NAN));
                }
            }
        }
        match event {
            Some(start @ (STARTED | ROLLOUT_STARTED)) => {
                let mut attempt = new_attempt(Outcome::Unfinished);
                attempt.started = ts;
                if start == ROLLOUT_STARTED {
                    if let Some(id) = token {
                        self.rollouts
                            .insert(id.to_string(), (attempts.len(), Vec::new()));
                        attempt.rollout = Some(Box::new(RolloutFacts {
                            id: id.to_string(),
                            ..RolloutFacts::default()
                        }));
                    }
                }
                attempts.push(attempt);
                let index = attempts.len() - 1;
                self.earlier_open.resize(attempts.len(), None);
                self.earlier_open[index] = self.open.insert(version, index);
                if let Some((on, of, words)) = self.hook_before.take() {
                    if on + 1 == self.seen && of.as_deref() == version {
                        note_hook(&mut attempts[index], &words);
                    }
                }
            }
            Some(SWITCHED) => {
                if let Some(index) = self.open.get(version) {
                    let facts = attempts[index].signed.get_or_insert_with(Default::default);
                    facts.switched_at.get_or_insert(ts.unwrap_or(f64::NAN));
                }
            }
            Some(HOOK_RAN | HOOK_FAILED) => {
                let words = log.detail[i].as_deref().unwrap_or("");
                let pre_deploy = crate::host::hooks::ran_before_start(words);
                let words = words.strip_prefix("hook ").unwrap_or(words);
                if pre_deploy && event == Some(HOOK_FAILED) {
                    // A refused run: an attempt of its own, its only line this one.
                    let mut attempt = new_attempt(Outcome::Refused);
                    (attempt.started, attempt.finished) = (ts, ts);
                    attempt.reason = Some(reason_of(words).into());
                    note_hook(&mut attempt, words);
                    attempts.push(attempt);
                    self.earlier_open.resize(attempts.len(), None);
                } else if pre_deploy {
                    self.hook_before = Some((self.seen, version.map(Box::from), words.to_string()));
                } else if let Some(index) = self
                    .last_closed
                    .filter(|l| attempts[*l].version.as_deref() == version)
                {
                    // A post hook: its run's outcome came before it.
                    note_hook(&mut attempts[index], words);
                }
            }
            Some(ESCALATED) => {
                if let Some(index) = self.open.get(version) {
                    attempts[index].outcome = Outcome::Escalated;
                }
            }
            Some(event @ (PROMOTED | ROLLED_BACK)) => {
                let opened = self.open.remove(version);
                if let Some(index) = opened {
                    if let Some(earlier) = self.earlier_open[index] {
                        self.open.insert(version, earlier);
                    }
                }
                // A rollback of no open attempt: the live release's, or (`rollgate rollback`
                // writes it after the promotion that replaced it) the one live before it: a
                // promoted release failed in production, recorded on its promotion.
                let in_production = [self.live, self.replaced]
                    .into_iter()
                    .flatten()
                    .find(|l| attempts[*l].version.as_deref() == version);
                if let Some(l) = in_production.filter(|_| event == ROLLED_BACK && opened.is_none())
                {
                    attempts[l]
                        .rolled_back_at
                        .get_or_insert(ts.unwrap_or(f64::NAN));
                    if let Some(exposure) = SignedFacts::of(log, i).and_then(|f| f.exposure) {
                        attempts[l]
                            .signed
                            .get_or_insert_with(Default::default)
                            .exposure = Some(exposure);
                    }
                    return;
                }
                let index = opened.unwrap_or_else(|| {
                    attempts.push(new_attempt(Outcome::Unfinished));
                    self.earlier_open.resize(attempts.len(), None);
                    attempts.len() - 1
                });
                self.last_closed = Some(index);
                let attempt = &mut attempts[index];
                attempt.finished = ts;
                attempt.signed =
                    SignedFacts::merged(attempt.signed.take(), SignedFacts::of(log, i));
                if event == PROMOTED {
                    attempt.outcome = Outcome::Promoted;
                    if let Some(previous) = self.live {
                        attempts[previous].live_until = ts;
                    }
                    self.replaced = self.live;
                    self.live = Some(index);
                } else {
                    attempt.outcome = Outcome::RolledBack;
                    attempt.reason = log.detail[i].as_deref().map(|d| reason_of(d).into());
                }
            }
            _ => {}
        }
    }

    /// The attempts of everything fed, in log order.
    pub fn finish(self) -> Vec<Attempt> {
        let mut attempts = self.attempts;
        for attempt in &mut attempts {
            if attempt.rolled_back_at.is_some_and(f64::is_nan) {
                attempt.rolled_back_at = None;
            }
        }
        if let Some(l) = self.live {
            attempts[l].live_now = true;
        }
        // Grown by doubling: give back the unused half before frames are built beside it.
        attempts.shrink_to_fit();
        attempts
    }
}

/// A sink that pairs as the file is read: each block's records, once merged in file order,
/// are fed to a [`Pairing`] and dropped. `log history` and `log stats` of one file hold the
/// attempts, never the records (on a 382 MB log: a third of the memory).
#[derive(Debug)]
pub struct Paired {
    /// A block's records, before they are merged.
    block: Log,
    pub pairing: Pairing,
    /// Records fed, and the first and last times among them.
    pub records: u64,
    pub span: Option<(f64, f64)>,
}

impl Sink for Paired {
    fn new(options: ReadOptions) -> Self {
        Paired {
            block: Log::new(options),
            pairing: Pairing::default(),
            records: 0,
            span: None,
        }
    }

    fn record(&mut self, line: u64, record: Record<'_>) {
        self.block.record(line, record);
    }

    fn reserve(&mut self, lines: usize) {
        self.block.reserve(lines);
    }

    fn absorb(&mut self, later: Self, _line_offset: u64) {
        let block = later.block;
        self.records += block.len() as u64;
        for ts in block.ts.iter().flatten() {
            self.span = Some(match self.span {
                None => (*ts, *ts),
                Some((first, last)) => (first.min(*ts), last.max(*ts)),
            });
        }
        self.pairing.feed(&block);
    }
}

/// One line of a rollout, counted into its facts. `begun[w]`: when wave `w`'s first replica
/// started.
fn note_rollout_line(
    facts: &mut RolloutFacts,
    begun: &mut Vec<Option<f64>>,
    event: Option<&str>,
    wave: Option<usize>,
    ts: Option<f64>,
) {
    const REPLICA_STARTED: &str = LogEvent::ReplicaStarted.as_str();
    const WAVE_COMPLETED: &str = LogEvent::WaveCompleted.as_str();
    const REPLICA_FAILED: &str = LogEvent::ReplicaFailed.as_str();
    const PAUSED: &str = LogEvent::RolloutPaused.as_str();
    match (event, wave) {
        (Some(REPLICA_STARTED), Some(w)) => {
            let w = facts.wave(w);
            if begun.len() <= w {
                begun.resize(w + 1, None);
            }
            if begun[w].is_none() {
                begun[w] = ts;
            }
        }
        (Some(WAVE_COMPLETED), Some(w)) => {
            let w = facts.wave(w);
            // Waves complete in order; one logged again after a resume counts once.
            facts.waves_done = facts.waves_done.max(w + 1);
            let start = begun.get(w).copied().flatten();
            facts.wave_times[w] = ts.zip(start).map(|(end, start)| end - start);
        }
        (Some(REPLICA_FAILED), Some(w)) => {
            let w = facts.wave(w);
            facts.failures[w] += 1;
        }
        (Some(PAUSED), _) => facts.pauses += 1,
        _ => {}
    }
}

/// Which release was live at a moment, and for how long around it.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveAt {
    pub version: Option<String>,
    pub since: f64,
    pub until: Option<f64>,
}

/// The last promotion at or before `at` (records without `ts` cannot be placed and are passed
/// over). `None`: nothing had been promoted yet. Over a whole parsed log: the tests' oracle
/// for the streamed reading (`log history --at` reads with [`Promotions`]).
#[cfg(test)]
pub fn live_at(log: &Log, at: f64) -> Option<LiveAt> {
    let promotions = (0..log.len())
        .filter(|i| log.event[*i].as_deref() == Some(PROMOTED))
        .filter_map(|i| Some((log.ts[i]?, log.version[i].as_deref())));
    live_among(promotions, at)
}

/// [`live_at`] over the promotions of a log (time and version), in log order.
pub fn live_among<'a>(
    promotions: impl Iterator<Item = (f64, Option<&'a str>)>,
    at: f64,
) -> Option<LiveAt> {
    let mut found: Option<LiveAt> = None;
    for (ts, version) in promotions {
        if ts <= at {
            found = Some(LiveAt {
                version: version.map(String::from),
                since: ts,
                until: None,
            });
        } else if let Some(current) = found.as_mut() {
            current.until.get_or_insert(ts);
        }
    }
    found
}

/// A release users reached at a moment though it was not promoted then: a deploy's new release
/// in its watch (`current` named it), or replicas a rollout in progress had moved to it. Said
/// beside what was live, never as it: such a release may yet be rolled back.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AlsoServing {
    pub version: String,
    /// `watch` or `rollout`.
    pub how: &'static str,
    /// A rollout's: how many replicas served it.
    pub replicas: Option<usize>,
    /// When the first of them began to serve.
    pub since: f64,
}

/// One record that changes who serves besides the live release, as "what was live at T"
/// reads it.
/// Kept small: a log of a million deploys keeps one or two of these per deploy.
#[derive(Debug, Clone, PartialEq)]
pub struct Serving {
    pub ts: f64,
    pub event: LogEvent,
    /// Only where it begins to serve (an outcome closes by token alone).
    pub version: Option<Box<str>>,
    pub token: Box<str>,
    pub slot: Option<u64>,
}

const SERVING_EVENTS: [LogEvent; 7] = [
    LogEvent::Switched,
    LogEvent::ReplicaReady,
    LogEvent::ReplicaFailed,
    LogEvent::ReplicaRestored,
    LogEvent::ReplicaRemoved,
    LogEvent::Promoted,
    LogEvent::RolledBack,
];

/// Who served at `at` besides the live release, from the [`Serving`] records in time order:
/// a `switched` deploy until its outcome, and each replica a rollout made ready until it
/// failed, went back or left, or the rollout ended.
pub fn serving_at(records: &[Serving], at: f64) -> Vec<AlsoServing> {
    let mut watched: HashMap<&str, (&str, f64)> = HashMap::new();
    let mut moved: HashMap<(&str, u64), (&str, f64)> = HashMap::new();
    for r in records.iter().take_while(|r| r.ts <= at) {
        let (token, version) = (&*r.token, r.version.as_deref());
        match r.event {
            LogEvent::Switched => {
                if let Some(version) = version {
                    watched.insert(token, (version, r.ts));
                }
            }
            LogEvent::Promoted | LogEvent::RolledBack => {
                watched.remove(token);
                moved.retain(|(rollout, _), _| *rollout != token);
            }
            LogEvent::ReplicaReady => {
                if let (Some(version), Some(slot)) = (version, r.slot) {
                    moved.insert((rollout_id(token), slot), (version, r.ts));
                }
            }
            _ => {
                if let Some(slot) = r.slot {
                    moved.remove(&(rollout_id(token), slot));
                }
            }
        }
    }
    let mut also: Vec<AlsoServing> = watched
        .into_values()
        .map(|(version, since)| AlsoServing {
            version: version.to_string(),
            how: "watch",
            replicas: None,
            since,
        })
        .collect();
    let mut by_version: HashMap<&str, (usize, f64)> = HashMap::new();
    for (version, since) in moved.into_values() {
        let entry = by_version.entry(version).or_insert((0, since));
        entry.0 += 1;
        entry.1 = entry.1.min(since);
    }
    also.extend(
        by_version
            .into_iter()
            .map(|(version, (replicas, since))| AlsoServing {
                version: version.to_string(),
                how: "rollout",
                replicas: Some(replicas),
                since,
            }),
    );
    also.sort_by(|a, b| a.since.total_cmp(&b.since).then(a.version.cmp(&b.version)));
    also
}

/// A sink keeping a log's promotions that have a time, in order, and what may change who
/// serves beside the live release at the moment asked (`ReadOptions::at`; none: the end of
/// the log): all "what was live
/// at T" needs, so a log of years is read without holding its records. A watch or a replica
/// that began and ended before T is dropped once both are read; what is kept is what was
/// still open, and, when older files are read too, the ends that matched nothing read so far
/// (they may end something in an older file).
#[derive(Debug)]
pub struct Promotions {
    options: ReadOptions,
    pub list: Vec<(f64, Option<String>)>,
    /// Watches and replicas begun by T and not ended in what was read.
    opens: Vec<Serving>,
    /// Ends by T, each with whether it ended something in what was read.
    ends: Vec<(Serving, bool)>,
}

impl Promotions {
    /// The records [`serving_at`] needs, in time order.
    pub fn serving(mut self) -> Vec<Serving> {
        let mut all = std::mem::take(&mut self.opens);
        all.extend(self.ends.into_iter().map(|(end, _)| end));
        all.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        all
    }
}

/// Removes from `opens` what `end` ends (a deploy's watch and a rollout's replicas at their
/// outcome; one replica at its failure, return or removal); whether it ended anything.
fn end_in(opens: &mut Vec<Serving>, end: &Serving) -> bool {
    let before = opens.len();
    let token = &*end.token;
    match end.event {
        LogEvent::Promoted | LogEvent::RolledBack => opens.retain(|o| {
            !(o.token.as_ref() == token
                || (o.event == LogEvent::ReplicaReady && rollout_id(&o.token) == token))
        }),
        _ => opens.retain(|o| {
            !(o.event == LogEvent::ReplicaReady
                && rollout_id(&o.token) == rollout_id(token)
                && o.slot == end.slot)
        }),
    }
    opens.len() != before
}

impl Sink for Promotions {
    fn new(options: ReadOptions) -> Self {
        Promotions {
            options,
            list: Vec::new(),
            opens: Vec::new(),
            ends: Vec::new(),
        }
    }

    fn record(&mut self, _line: u64, record: Record<'_>) {
        let admitted = self
            .options
            .selection
            .as_ref()
            .is_none_or(|s| s.admits(record.ts, record.version.as_deref()));
        let (true, Some(ts), Some(event)) = (admitted, record.ts, record.event.as_deref()) else {
            return;
        };
        let Some(kind) = SERVING_EVENTS.into_iter().find(|e| e.as_str() == event) else {
            return;
        };
        let version = record.version.map(std::borrow::Cow::into_owned);
        let opens = matches!(kind, LogEvent::Switched | LogEvent::ReplicaReady);
        let kept_version = version.as_deref().filter(|_| opens).map(Box::from);
        if kind == LogEvent::Promoted {
            self.list.push((ts, version));
        }
        // Only what happened by T counts; only these lines are read whole, for the two fields
        // that say whose they are; a line without a token (an older rollgate's) can neither
        // begin nor end anything.
        if self.options.at.is_some_and(|at| ts > at)
            || memchr::memmem::find(record.raw, b"\"token\"").is_none()
        {
            return;
        }
        #[derive(serde::Deserialize)]
        struct Whose {
            token: Option<Box<str>>,
            slot: Option<u64>,
        }
        let Some(Whose {
            token: Some(token),
            slot,
        }) = serde_json::from_slice(record.raw).ok()
        else {
            return;
        };
        let serving = Serving {
            ts,
            event: kind,
            version: kept_version,
            token,
            slot,
        };
        if opens {
            self.opens.push(serving);
        } else {
            let ended = end_in(&mut self.opens, &serving);
            self.ends.push((serving, ended));
        }
    }

    fn absorb(&mut self, later: Self, _line_offset: u64) {
        self.list.extend(later.list);
        // The later block's ends may end what this one began; one that ended nothing in the
        // whole file read so far is kept for an older file, if one is read.
        for (end, ended_there) in later.ends {
            let ended_here = end_in(&mut self.opens, &end);
            if !(ended_there || ended_here) && self.options.at_older_files {
                self.ends.push((end, false));
            }
        }
        self.opens.extend(later.opens);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::read::{parse_bytes, ReadOptions};

    fn log(text: &str) -> Log {
        parse_bytes::<Log>(text.as_bytes(), ReadOptions::default()).0
    }

    const STORY: &str = r#"{"ts":100,"event":"candidate_started","version":"v2","detail":""}
{"ts":101,"event":"promoted","version":"v2","detail":"ready"}
{"ts":200,"event":"candidate_started","version":"v3","detail":""}
{"ts":201.5,"event":"rolled_back","version":"v3","detail":"not ready after 1500 ms; v2 answering"}
{"ts":300,"event":"candidate_started","version":"v4","detail":""}
{"ts":300.25,"event":"promoted","version":"v4","detail":"ready"}
{"ts":400,"event":"rolled_back","version":"v4","detail":"error rate; manual"}
{"ts":500,"event":"candidate_started","version":"v5","detail":""}
"#;

    #[test]
    fn hooks_join_their_attempt_and_a_refusing_hook_is_a_refused_attempt_of_its_own() {
        let text = r#"{"ts":1,"event":"hook_failed","version":"v2","detail":"hook pre_deploy (./m.sh) failed with exit status: 1; the deploy was refused"}
{"ts":2,"event":"hook_ran","version":"v2","detail":"hook pre_deploy (./m.sh) exited 0: migrated"}
{"ts":3,"event":"candidate_started","version":"v2","detail":""}
{"ts":4,"event":"promoted","version":"v2","detail":"ready"}
{"ts":5,"event":"hook_ran","version":"v2","detail":"hook post_promote (./a.sh) exited 0: told"}
{"ts":6,"event":"hook_failed","version":"v3","detail":"hook pre_deploy (./m.sh) failed; the deploy was refused"}
{"ts":7,"event":"candidate_started","version":"v4","detail":""}
{"ts":8,"event":"rolled_back","version":"v4","detail":"not ready"}
{"ts":9,"event":"hook_ran","version":"v4","detail":"hook post_rollback (./r.sh) exited 0"}
"#;
        let found = attempts(&log(text));
        let hooks: Vec<Option<&str>> = found.iter().map(Attempt::hooks).collect();
        assert_eq!(
            hooks,
            [
                Some("pre_deploy (./m.sh) failed with exit status: 1; the deploy was refused"),
                Some(
                    "pre_deploy (./m.sh) exited 0: migrated / post_promote (./a.sh) exited 0: told"
                ),
                Some("pre_deploy (./m.sh) failed; the deploy was refused"),
                Some("post_rollback (./r.sh) exited 0"),
            ]
        );
        let outcomes: Vec<Outcome> = found.iter().map(|a| a.outcome).collect();
        use Outcome::*;
        assert_eq!(outcomes, [Refused, Promoted, Refused, RolledBack]);
        // A refusal is said with the hook's reason, and never changes which release is live.
        assert_eq!(
            found[2].reason.as_deref(),
            Some("pre_deploy (./m.sh) failed")
        );
        assert_eq!(
            (found[2].started, found[2].finished),
            (Some(6.0), Some(6.0))
        );
        assert!(found[1].live_now && !found[2].live_now);
    }

    #[test]
    fn who_else_served_is_a_watch_until_its_outcome_and_a_rollouts_ready_replicas() {
        let text = r#"{"ts":10,"event":"promoted","version":"v1","detail":"","token":"d1"}
{"ts":20,"event":"switched","version":"v2","detail":"","token":"d2"}
{"ts":22,"event":"rolled_back","version":"v2","detail":"watch","token":"d2"}
{"ts":30,"event":"rollout_started","version":"v3","detail":"","token":"r9"}
{"ts":31,"event":"replica_ready","version":"v3","detail":"","token":"r9-0-1","slot":0}
{"ts":32,"event":"replica_ready","version":"v3","detail":"","token":"r9-1-2","slot":1}
{"ts":33,"event":"replica_failed","version":"v3","detail":"","token":"r9-1-2","slot":1}
{"ts":34,"event":"replica_ready","version":"v3","detail":"","token":"r9-2-3","slot":2}
{"ts":40,"event":"promoted","version":"v3","detail":"","token":"r9"}
"#;
        let for_moment = |t: f64| ReadOptions {
            at: Some(t),
            ..ReadOptions::default()
        };
        // Read for one moment each: what ended before it is dropped as it is read.
        let read_for = |t: f64| parse_bytes::<Promotions>(text.as_bytes(), for_moment(t)).0;
        assert_eq!(read_for(15.0).list.len(), 2);
        let at = |t: f64| serving_at(&read_for(t).serving(), t);
        assert_eq!(at(15.0), vec![]);
        assert_eq!(
            at(21.0),
            vec![AlsoServing {
                version: "v2".into(),
                how: "watch",
                replicas: None,
                since: 20.0
            }]
        );
        // Switched back: the old release alone again.
        assert_eq!(at(25.0), vec![]);
        let replicas = |t: f64| at(t).first().and_then(|a| a.replicas);
        assert_eq!(replicas(32.5), Some(2));
        assert_eq!(replicas(33.5), Some(1), "the failed replica went back");
        assert_eq!(replicas(35.0), Some(2));
        assert_eq!(at(35.0)[0].since, 31.0);
        // The rollout's outcome: v3 is live, nothing else serves.
        assert_eq!(at(41.0), vec![]);

        // What is kept for a moment is small, and the answer the same split across blocks.
        let serving = read_for(35.0).serving();
        // The two replicas still ready; v1's promotion ended nothing, and no older file is
        // read that it could end something in.
        assert_eq!(serving.len(), 2, "{serving:?}");
        let with_older = ReadOptions {
            at_older_files: true,
            ..for_moment(35.0)
        };
        let kept = parse_bytes::<Promotions>(text.as_bytes(), with_older).0;
        assert_eq!(
            kept.serving().len(),
            3,
            "v1's promotion kept for an older file"
        );
        assert_eq!(serving_at(&serving, 35.0)[0].replicas, Some(2));
        let (first, second) = text.split_at(text.find(r#"{"ts":22"#).unwrap());
        // A later block as the reader hands it over: its unmatched ends still in it.
        let block = |t: f64| {
            parse_bytes::<Promotions>(
                second.as_bytes(),
                ReadOptions {
                    at_older_files: true,
                    ..for_moment(t)
                },
            )
            .0
        };
        let mut split = parse_bytes::<Promotions>(first.as_bytes(), for_moment(21.0)).0;
        split.absorb(block(21.0), 0);
        assert_eq!(serving_at(&split.serving(), 21.0)[0].version, "v2");
        let mut split = parse_bytes::<Promotions>(first.as_bytes(), for_moment(25.0)).0;
        split.absorb(block(25.0), 0);
        let serving = split.serving();
        assert!(
            serving.iter().all(|r| r.event != LogEvent::Switched),
            "the watch ended in the later block: {serving:?}"
        );
        assert_eq!(serving_at(&serving, 25.0), vec![]);
    }

    #[test]
    fn pairs_starts_with_outcomes() {
        let a = attempts(&log(STORY));
        assert_eq!(a.len(), 4);
        assert_eq!(a[0].outcome, Outcome::Promoted);
        assert_eq!(a[0].time_to_outcome(), Some(1.0));
        assert_eq!(a[0].live_until, Some(300.25));
        assert_eq!(a[0].live_for(), Some(199.25));
        assert_eq!(a[1].outcome, Outcome::RolledBack);
        assert_eq!(a[1].reason.as_deref(), Some("not ready after 1500 ms"));
        assert_eq!(a[1].time_to_outcome(), Some(1.5));
        // v4 was promoted, then rolled back in production: still the live one by the log's
        // rule, with its exposure recorded.
        assert_eq!(a[2].outcome, Outcome::Promoted);
        assert_eq!(a[2].exposure(), Some(99.75));
        assert!(a[2].live_now);
        assert_eq!(a[3].outcome, Outcome::Unfinished);
        assert_eq!(a[3].started, Some(500.0));
    }

    #[test]
    fn live_at_takes_the_last_promotion_before() {
        let l = log(STORY);
        assert_eq!(live_at(&l, 50.0), None);
        let at = live_at(&l, 250.0).unwrap();
        assert_eq!(at.version.as_deref(), Some("v2"));
        assert_eq!(at.until, Some(300.25));
        let at = live_at(&l, 301.0).unwrap();
        assert_eq!(at.version.as_deref(), Some("v4"));
        assert_eq!(at.until, None);
    }

    #[test]
    fn promotions_kept_while_reading_answer_live_at_as_the_records_do() {
        let text = format!("{STORY}{{\"event\":\"promoted\",\"version\":\"v9\"}}\n");
        let whole = log(&text);
        let kept = parse_bytes::<Promotions>(text.as_bytes(), ReadOptions::default()).0;
        for at in [50.0, 101.0, 250.0, 300.25, 301.0, 1e12] {
            let streamed = live_among(kept.list.iter().map(|(t, v)| (*t, v.as_deref())), at);
            assert_eq!(streamed, live_at(&whole, at), "at {at}");
        }
    }

    #[test]
    fn an_outcome_without_a_start_is_its_own_attempt() {
        let a = attempts(&log(
            r#"{"ts":5,"event":"rolled_back","version":"v9","detail":"x"}"#,
        ));
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].started, None);
        assert_eq!(a[0].time_to_outcome(), None);
    }

    proptest::proptest! {
        /// Pairing a log piece by piece, as `Paired` does block by block, gives the attempts
        /// pairing it whole gives, wherever the pieces break.
        #[test]
        fn pairing_in_pieces_equals_pairing_whole(
            records in proptest::collection::vec((0usize..5, proptest::option::of(0u8..4), 0u8..3), 0..60),
            cuts in proptest::collection::vec(0usize..60, 0..5),
        ) {
            const EVENTS: [&str; 5] = ["candidate_started", "promoted", "rolled_back", "escalated", "rollout_started"];
            let text: String = records
                .iter()
                .enumerate()
                .map(|(i, (event, version, token))| {
                    let mut record = serde_json::json!({"ts": i, "event": EVENTS[*event], "detail": "why; more"});
                    if let Some(v) = version {
                        record["version"] = format!("v{v}").into();
                    }
                    if *token > 0 {
                        record["token"] = format!("r{token}").into();
                        record["wave"] = (*token as u64).into();
                    }
                    record.to_string() + "\n"
                })
                .collect();
            let options = ReadOptions { rollout_fields: true, release_fields: true, ..ReadOptions::default() };
            let whole = parse_bytes::<Log>(text.as_bytes(), options).0;
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c <= whole.len()).collect();
            cuts.extend([0, whole.len()]);
            cuts.sort_unstable();
            let mut pairing = Pairing::default();
            for piece in cuts.windows(2) {
                pairing.feed(&whole.reordered(&(piece[0]..piece[1]).collect::<Vec<_>>()));
            }
            proptest::prop_assert_eq!(pairing.finish(), attempts(&whole));
        }
    }

    #[test]
    fn escalation_stays_open_until_promoted_by_hand() {
        let a = attempts(&log(r#"{"ts":1,"event":"candidate_started","version":"v2"}
{"ts":3,"event":"escalated","version":"v2"}
{"ts":9,"event":"promoted","version":"v2"}"#));
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].outcome, Outcome::Promoted);
        assert_eq!(a[0].time_to_outcome(), Some(8.0));
    }
}
