//! The files under the root that say what is live and what is in flight.
//!
//! - `current`: the live release. Replaced only by [`write_atomically`](crate::host::files::write_atomically): a temporary file in
//!   the same folder, fsync, rename over the old one, fsync the folder. A crash at any moment
//!   leaves the complete old pointer or the complete new one, never a torn file.
//! - `candidate`: the deploy in flight as deploys have always recorded it, written *before*
//!   the candidate is spawned (with a token the candidate carries in its environment). A deploy
//!   runs on the rollout engine, whose state (`rollout.json`) is the truth; this record is its
//!   view, rewritten with it and removed with it, for `status`, `release list` and the dry
//!   runs; nothing recovers from it.

use std::fs::{self, File};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::host::fault::Fault;
use crate::host::files::{checked, read_json, write_atomically, WriteError};
use crate::host::identity::Identity;
use crate::host::names::check_name;

pub const POINTER_FILE: &str = "current";
/// The replicas of a multi-replica service that are in the pool (see [`ReplicaSet`]).
pub const REPLICAS_FILE: &str = "replicas.json";
pub const CANDIDATE_FILE: &str = "candidate";
/// Every live process of the release, web's and each other type's (see [`Formation`]).
pub const FORMATION_FILE: &str = "formation.json";
/// What rollgate before `formation.json` kept the other types' processes in: read when a root
/// has no formation yet, removed once the formation is written.
pub const LEGACY_PROCESSES_FILE: &str = "processes.json";
/// The counts `rollgate scale` set, by process type: they override the policy's
/// `processes.TYPE.replicas` for every deploy until scaled again.
pub const SCALE_FILE: &str = "scale.json";
pub const LOG_FILE: &str = "deploy.log";
pub const LOCK_FILE: &str = "deploy.lock";

/// The live release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pointer {
    pub service: String,
    pub version: String,
    pub port: u16,
    pub pid: i32,
    /// The process's start time in clock ticks since boot (`/proc/PID/stat`, field 22): a pid
    /// reused by another process has another start time, so it is never signalled.
    pub start_time: u64,
    /// Unix seconds.
    pub promoted_at: f64,
    /// During the watch after a switch: the previous release, still running, which a proxy
    /// sends a request to when this one refuses it (it fell over before the switch back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<Fallback>,
    /// How it was started (its probe, held socket, confinement, limits, user, writable
    /// folders): `up` starts it anew the same way, `status` asks it the way its gate did.
    #[serde(flatten)]
    pub launch: super::launch::LaunchRecord,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fallback {
    pub version: String,
    pub port: u16,
    pub pid: i32,
    /// Its start time (`/proc/PID/stat`), so that a stop never signals a pid reused since
    /// (0 in pointers written before it was recorded).
    #[serde(default)]
    pub start_time: u64,
    /// Not a run's: the release live before this one, started again beside it by its keeper
    /// when it began to crash within its crash-loop window (`supervision::standby`). Retired at the
    /// window's end, by the next run, or made live if the crash loop is rolled back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub standby: bool,
}

impl Fallback {
    pub fn identity(&self) -> Identity {
        Identity {
            pid: self.pid,
            start_time: self.start_time,
        }
    }
}

impl Pointer {
    pub fn identity(&self) -> Identity {
        Identity {
            pid: self.pid,
            start_time: self.start_time,
        }
    }

    /// Whether this pointer names that very process (pid and start time): the way to tell that
    /// a switch to a candidate already happened.
    pub fn names(&self, process: Identity) -> bool {
        self.identity() == process
    }
}

/// How a replica takes part in a rollout (seed 002's classes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaClass {
    /// Its failure aborts the rollout at once; it must confirm by the release deadline.
    Required,
    /// Its failure counts toward the wave's failure ratio.
    #[default]
    BestEffort,
    /// Keeps its version; outside every wave and gate.
    LeftBehind,
}

/// One replica in the pool: a process of the service on its own port.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replica {
    pub slot: usize,
    pub version: String,
    pub port: u16,
    pub pid: i32,
    pub start_time: u64,
    #[serde(default)]
    pub class: ReplicaClass,
}

/// `replicas.json`: the truth of what serves a multi-replica service, replaced atomically as
/// `current` is. The proxy balances across these replicas; a root without the file is served
/// by the single release `current` names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaSet {
    pub service: String,
    pub replicas: Vec<Replica>,
}

/// The process type web's processes have in the formation (the one that serves).
pub const WEB: &str = "web";

/// One live process of the formation: web's (with its port) or another type's (a worker, a
/// clock: issue 69).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypedProcess {
    /// Its Procfile type (`web` for the processes that serve).
    pub process_type: String,
    /// Its place among the type's processes (0, 1, ...; a web replica's slot).
    pub index: usize,
    pub version: String,
    /// The port it serves on: web's alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    pub pid: i32,
    pub start_time: u64,
    /// How it was started (its command, user, limits, readiness): started so again.
    #[serde(default)]
    pub launch: crate::host::launch::LaunchRecord,
}

impl TypedProcess {
    pub fn identity(&self) -> Identity {
        Identity {
            pid: self.pid,
            start_time: self.start_time,
        }
    }

    /// `worker.1`: the type and the place, as `status` and the log name it.
    pub fn name(&self) -> String {
        format!("{}.{}", self.process_type, self.index)
    }
}

/// `formation.json`: every live process of the release — web's and each other type's — with
/// its version, port and launch record, replaced atomically; written by the engine alone
/// (`engine::formation`). Web's part is also kept, as it always was, in the proxy's views —
/// `current` (whose rename is the switch) and `replicas.json` — which the formation follows.
/// No file, or an empty list: nothing runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Formation {
    pub service: String,
    /// Web runs as a replica set (`replicas.json`; its processes' places are their slots), not
    /// as the single release `current` names.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub web_replicas: bool,
    pub processes: Vec<TypedProcess>,
}

impl Formation {
    /// The processes of the other types than web.
    pub fn other_types(&self) -> impl Iterator<Item = &TypedProcess> {
        self.processes.iter().filter(|p| p.process_type != WEB)
    }
}

/// Where a deploy in flight stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Recorded, about to spawn: the pid is not known yet, the token is.
    Spawning,
    /// Spawned and gated.
    Running,
    /// Left running at the deadline for `rollgate promote` or `rollgate abort`.
    Escalated,
    /// Ready, and `current` is being switched to it (or was): watched until `watch_until`
    /// with the previous release kept running, to switch back if it fails.
    Watching,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub service: String,
    pub version: String,
    pub port: u16,
    /// Carried by the candidate as `ROLLGATE_DEPLOY_TOKEN`, to find it if the pid never got
    /// recorded.
    pub token: String,
    pub pid: Option<i32>,
    pub start_time: Option<u64>,
    pub stage: Stage,
    pub deployer_pid: u32,
    pub started_at: f64,
    pub grace_ms: u64,
    #[serde(default)]
    pub drain_ms: u64,
    /// The release that was live when this deploy began, to stop it if the switch happened
    /// and the deployer died before it could.
    pub previous: Option<Pointer>,
    /// For a signed release: what the release floor becomes once it is promoted (whoever
    /// finishes the switch raises it).
    #[serde(default)]
    pub signed: Option<Signed>,
    /// How this deploy proves readiness, for whoever finishes it (`promote`, `abort`, recovery).
    #[serde(default)]
    pub probe: crate::host::probe::Spec,
    /// The watch after the switch (stage `Watching`): when it ends (Unix seconds), how often
    /// to probe, how many failures in a row switch back, and the gate's words for the
    /// promoted line. Recorded so that a watcher in the background, or whoever finds the
    /// record after a crash, finishes the watch as the deploy began it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<WatchRecord>,
    /// The policy's hooks, resolved, so whoever finishes this deploy runs its post hook.
    #[serde(default)]
    pub hooks: crate::host::hooks::Hooks,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatchRecord {
    pub until: f64,
    pub poll_ms: u64,
    pub failures: u32,
    /// What the gate said ("ready after 412 ms (5 probes)"), carried into the promoted line.
    pub gate_detail: String,
    pub gate_elapsed_ms: u64,
    /// What the proxy said when the previous release was drained at the switch, and whether
    /// the pointer's folder fsync failed, for the promoted line.
    #[serde(default)]
    pub switch_detail: String,
    /// The background watcher of `deploy --no-wait`, if one was started.
    #[serde(default)]
    pub watcher_pid: Option<u32>,
}

impl Candidate {
    pub fn identity(&self) -> Option<Identity> {
        Some(Identity {
            pid: self.pid?,
            start_time: self.start_time?,
        })
    }
}

/// The newest signed release a root promoted (`ROOT/release.floor`): nothing older may run
/// there again. Checked and raised by `release`; recorded here because deploys and rollouts
/// carry it in their state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Floor {
    pub sequence: u64,
    pub version: String,
    pub manifest_sha256: String,
}

/// What the deployer records of a signed release it is deploying.
pub type Signed = Floor;

/// The most slots a root's state may name (a rollout moves at most this many replicas).
pub const MAX_SLOTS: usize = 1000;
/// Processes a formation may name: web's slots and as many of the other types'.
pub const MAX_PROCESSES: usize = 2 * MAX_SLOTS;

pub fn too_many(count: usize) -> String {
    format!("{count} replicas named; at most {MAX_SLOTS} are allowed")
}

/// The root folder and the paths in it.
#[derive(Debug, Clone)]
pub struct Root(pub PathBuf);

impl Root {
    /// The root as an absolute path: the candidate runs in its release folder, so relative
    /// paths would point elsewhere from there.
    pub fn new(path: PathBuf) -> Root {
        Root(std::path::absolute(&path).unwrap_or(path))
    }

    /// A root a command reads or changes: refused, in the same words by every command, unless
    /// it is a folder (a typo must not read as "nothing promoted yet").
    pub fn existing(path: PathBuf) -> Result<Root, Fault> {
        let root = Root::new(path);
        match root.0.is_dir() {
            true => Ok(root),
            false => Err(Fault::NotARoot { path: root.0 }),
        }
    }

    pub fn pointer_path(&self) -> PathBuf {
        self.0.join(POINTER_FILE)
    }
    pub fn candidate_path(&self) -> PathBuf {
        self.0.join(CANDIDATE_FILE)
    }
    pub fn log_path(&self) -> PathBuf {
        self.0.join(LOG_FILE)
    }
    pub fn lock_path(&self) -> PathBuf {
        self.0.join(LOCK_FILE)
    }
    pub fn release_dir(&self, version: &str) -> PathBuf {
        self.0.join("releases").join(version)
    }
    pub fn executable(&self, version: &str, service: &str) -> PathBuf {
        self.release_dir(version).join(service)
    }
    /// rollgate's own files of release `version` — its processes' output, its hooks' and its
    /// release phase's — kept apart from the release's folder: that tree is the release's
    /// (every name and link in it shipped by whoever built it), so nothing rollgate writes as
    /// root ever lands where a release could have put a link first. Made by rollgate (mode
    /// 0700, [`crate::host::output::own_folder`]), never shipped, never writable by a release.
    pub fn output_dir(&self, version: &str) -> PathBuf {
        self.0.join(crate::host::output::OUTPUT_DIR).join(version)
    }

    /// The candidate's stdout and stderr.
    pub fn output_path(&self, version: &str, service: &str) -> PathBuf {
        self.output_dir(version).join(format!("{service}.output"))
    }

    /// A rollout replica's stdout and stderr: one file per slot, so replicas never share one.
    pub fn replica_output_path(&self, version: &str, service: &str, slot: usize) -> PathBuf {
        self.output_dir(version)
            .join(format!("{service}.{slot}.output"))
    }

    /// A process of another type's stdout and stderr: one file per type and place.
    pub fn process_output_path(
        &self,
        version: &str,
        service: &str,
        process_type: &str,
        index: usize,
    ) -> PathBuf {
        self.output_dir(version)
            .join(format!("{service}.{process_type}.{index}.output"))
    }

    pub fn formation_path(&self) -> PathBuf {
        self.0.join(FORMATION_FILE)
    }

    fn legacy_processes_path(&self) -> PathBuf {
        self.0.join(LEGACY_PROCESSES_FILE)
    }

    /// The formation as last written (a root from before `formation.json`: its other types'
    /// processes from `processes.json`); names that reach paths are checked. Read it through
    /// `engine::formation::read`, which puts web's part as the proxy's views name it.
    pub fn read_formation(&self) -> Result<Option<Formation>, Fault> {
        let mut path = self.formation_path();
        let mut formation: Option<Formation> = read_json(&path)?;
        if formation.is_none() {
            path = self.legacy_processes_path();
            formation = read_json(&path)?;
        }
        if let Some(f) = &formation {
            checked(&path, "service", check_name("service", &f.service))?;
            if f.processes.len() > MAX_PROCESSES {
                let e = format!(
                    "{} processes named; at most {MAX_PROCESSES} are allowed",
                    f.processes.len()
                );
                return checked(&path, "processes", Err(e));
            }
            for (n, p) in f.processes.iter().enumerate() {
                checked(
                    &path,
                    &format!("processes[{n}].version"),
                    check_name("version", &p.version),
                )?;
                checked(
                    &path,
                    &format!("processes[{n}].process_type"),
                    check_name("process type", &p.process_type),
                )?;
            }
        }
        Ok(formation)
    }

    /// The live processes of the release's other types than web (none without a formation).
    pub fn read_processes(&self) -> Result<Option<Formation>, Fault> {
        Ok(self.read_formation()?.map(|f| Formation {
            processes: f.other_types().cloned().collect(),
            ..f
        }))
    }

    /// Replaces `formation.json` (only `engine::formation` calls it); a `processes.json` an
    /// older rollgate left is removed once the formation holds what it said.
    pub fn write_formation(&self, formation: &Formation) -> Result<(), WriteError> {
        let mut bytes = serde_json::to_vec_pretty(formation).expect("a formation serializes");
        bytes.push(b'\n');
        write_atomically(&self.formation_path(), &bytes)?;
        match fs::remove_file(self.legacy_processes_path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(WriteError::NotDurable(e)),
            _ => Ok(()),
        }
    }

    pub fn scale_path(&self) -> PathBuf {
        self.0.join(SCALE_FILE)
    }

    /// The counts `rollgate scale` set (none: the policy's); each type's name checked, each
    /// count within 0-1000.
    pub fn read_scale(&self) -> Result<std::collections::BTreeMap<String, usize>, Fault> {
        let path = self.scale_path();
        let scale: Option<std::collections::BTreeMap<String, usize>> = read_json(&path)?;
        let scale = scale.unwrap_or_default();
        for (name, count) in &scale {
            checked(&path, name, check_name("process type", name))?;
            if *count > 1000 {
                return checked(&path, name, Err(format!("{count} is above 1000")));
            }
        }
        Ok(scale)
    }

    pub fn write_scale(
        &self,
        scale: &std::collections::BTreeMap<String, usize>,
    ) -> Result<(), WriteError> {
        let mut bytes = serde_json::to_vec_pretty(scale).expect("counts serialize");
        bytes.push(b'\n');
        write_atomically(&self.scale_path(), &bytes)
    }

    pub fn read_pointer(&self) -> Result<Option<Pointer>, Fault> {
        let path = self.pointer_path();
        let pointer: Option<Pointer> = read_json(&path)?;
        if let Some(p) = &pointer {
            checked(&path, "service", check_name("service", &p.service))?;
            checked(&path, "version", check_name("version", &p.version))?;
            if let Some(fallback) = &p.fallback {
                checked(
                    &path,
                    "fallback.version",
                    check_name("version", &fallback.version),
                )?;
            }
        }
        Ok(pointer)
    }
    pub fn write_pointer(&self, pointer: &Pointer) -> Result<(), WriteError> {
        let mut bytes = serde_json::to_vec_pretty(pointer).expect("pointer serializes");
        bytes.push(b'\n');
        write_atomically(&self.pointer_path(), &bytes)
    }
    pub fn replicas_path(&self) -> PathBuf {
        self.0.join(REPLICAS_FILE)
    }
    pub fn read_replicas(&self) -> Result<Option<ReplicaSet>, Fault> {
        let path = self.replicas_path();
        let set: Option<ReplicaSet> = read_json(&path)?;
        if let Some(set) = &set {
            checked(&path, "service", check_name("service", &set.service))?;
            if set.replicas.len() > MAX_SLOTS {
                return checked(&path, "replicas", Err(too_many(set.replicas.len())));
            }
            for (n, r) in set.replicas.iter().enumerate() {
                checked(
                    &path,
                    &format!("replicas[{n}].version"),
                    check_name("version", &r.version),
                )?;
                if r.slot >= MAX_SLOTS {
                    let e = format!(
                        "slot {} is out of range; slots are 0 to {}",
                        r.slot,
                        MAX_SLOTS - 1
                    );
                    return checked(&path, &format!("replicas[{n}].slot"), Err(e));
                }
            }
        }
        Ok(set)
    }
    pub fn write_replicas(&self, set: &ReplicaSet) -> Result<(), WriteError> {
        let mut bytes = serde_json::to_vec_pretty(set).expect("a replica set serializes");
        bytes.push(b'\n');
        write_atomically(&self.replicas_path(), &bytes)
    }
    pub fn read_candidate(&self) -> Result<Option<Candidate>, Fault> {
        read_json(&self.candidate_path())
    }
    /// The candidate record must be durable before the spawn it announces, so a folder fsync
    /// that fails counts as a failed write here.
    pub fn write_candidate(&self, candidate: &Candidate) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(candidate).expect("candidate serializes");
        write_atomically(&self.candidate_path(), &bytes).map_err(|e| match e {
            WriteError::NotWritten(e) | WriteError::NotDurable(e) => e,
        })
    }
    pub fn clear_candidate(&self) -> std::io::Result<()> {
        match fs::remove_file(self.candidate_path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => File::open(&self.0)?.sync_all(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foreign_pointer_file_is_refused_with_advice() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("current"), "v1\n").unwrap();
        let err = Root::new(dir.path().into())
            .read_pointer()
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a rollgate state file"), "{err}");
    }
}
