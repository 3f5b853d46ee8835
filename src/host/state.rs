//! The files under the root that say what is live and what is in flight.
//!
//! - `current`: the live release. Replaced only by [`write_atomically`]: a temporary file in
//!   the same folder, fsync, rename over the old one, fsync the folder. A crash at any moment
//!   leaves the complete old pointer or the complete new one, never a torn file.
//! - `candidate`: the deploy in flight as deploys have always recorded it, written *before*
//!   the candidate is spawned (with a token the candidate carries in its environment). A deploy
//!   runs on the rollout engine, whose state (`rollout.json`) is the truth; this record is its
//!   view, rewritten with it and removed with it. One left by an older rollgate is read into
//!   that state by the next command (`engine::recover`'s `adopt_legacy`).

use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::host::fault::Fault;
use crate::host::names::check_name;
use crate::host::process::Identity;

pub const POINTER_FILE: &str = "current";
/// The replicas of a multi-replica service that are in the pool (see [`ReplicaSet`]).
pub const REPLICAS_FILE: &str = "replicas.json";
pub const CANDIDATE_FILE: &str = "candidate";
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
    /// How this release proves readiness, when it is not the default (`GET /readyz` = 200):
    /// `status` asks it the way its gate did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<crate::host::probe::Spec>,
    /// The socket held for the service and handed to this release (policy `listen`): `up`
    /// hands it again to a release it starts anew.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<crate::host::listen::Spec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fallback {
    pub version: String,
    pub port: u16,
    pub pid: i32,
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

/// Mode of every state file: whatever the deployer's umask, a proxy running as another user
/// must be able to read `current` (an unreadable pointer is a proxy that cannot follow a switch).
pub const STATE_FILE_MODE: u32 = 0o644;

/// How an atomic replacement failed: before the rename (the old content is intact) or after it
/// (the new content is in place, but the folder's fsync failed, so a power loss could undo it).
#[derive(Debug)]
pub enum WriteError {
    NotWritten(std::io::Error),
    NotDurable(std::io::Error),
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::NotWritten(e) => write!(f, "{e} (the old content is intact)"),
            WriteError::NotDurable(e) => write!(
                f,
                "replaced, but the folder's fsync failed ({e}): durability unknown"
            ),
        }
    }
}

/// A fault the test suite injects into the real binary: `ROLLGATE_FAULT=name[,name...]`.
/// Nothing sets it in normal use; each name is one failing step that cannot be provoked on a
/// healthy file system.
pub fn fault(name: &str) -> bool {
    std::env::var("ROLLGATE_FAULT").is_ok_and(|v| v.split(',').any(|n| n == name))
}

/// Replaces `path` so that readers see the old content or the new, whole, with mode
/// [`STATE_FILE_MODE`] whatever the umask.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state");
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let written = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(STATE_FILE_MODE)
            .open(&tmp)?;
        // The mode given to open(2) is filtered by the umask; set it outright.
        file.set_permissions(fs::Permissions::from_mode(STATE_FILE_MODE))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(WriteError::NotWritten(e));
    }
    let synced = if fault(&format!("fsync-dir-after-{name}")) {
        Err(std::io::Error::other("injected fault"))
    } else {
        File::open(dir).and_then(|d| d.sync_all())
    };
    synced.map_err(WriteError::NotDurable)
}

/// Opens `path` for appending, creating it with [`STATE_FILE_MODE`] whatever the umask.
pub fn open_append(path: &Path) -> std::io::Result<File> {
    match fs::OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(STATE_FILE_MODE)
        .open(path)
    {
        Ok(file) => {
            file.set_permissions(fs::Permissions::from_mode(STATE_FILE_MODE))?;
            Ok(file)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            fs::OpenOptions::new().append(true).open(path)
        }
        Err(e) => Err(e),
    }
}

/// Reads one of the root's JSON files; a missing file is `None`.
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

/// A value read from a state file passes the checks the same value typed on the command line
/// does: the error names the file and the field.
pub fn checked<T, E: std::fmt::Display>(
    path: &Path,
    field: &str,
    result: Result<T, E>,
) -> Result<T, Fault> {
    result.map_err(|e| {
        Fault::unreadable(
            path,
            format!(
                "{}: field `{field}`: {e}; the file was not written by this rollgate (edited, or damaged)",
                path.display()
            ),
        )
    })
}

pub fn too_many(count: usize) -> String {
    format!("{count} replicas named; at most {MAX_SLOTS} are allowed")
}

/// A JSON file a person writes (`webhooks.json`, `trust.json`), or None when there is none.
/// A file that does not parse is named with the line and column, what is wrong there, and
/// `shape`: what the file holds.
pub fn read_config<T: for<'de> Deserialize<'de>>(
    path: &Path,
    shape: &str,
) -> Result<Option<T>, Fault> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            let text = e.to_string();
            let what = text
                .rsplit_once(" at line ")
                .map_or(text.as_str(), |(what, _)| what);
            Fault::unreadable(
                path,
                format!(
                    "{}:{}:{}: {what}; {shape}",
                    path.display(),
                    e.line(),
                    e.column()
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Fault::unreadable(
            path,
            format!("cannot read {}: {e}", path.display()),
        )),
    }
}

pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, Fault> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Fault::unreadable(
                path,
                format!(
                    "{} is not a rollgate state file ({e}); move it aside if it is not rollgate's",
                    path.display()
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Fault::unreadable(
            path,
            format!("cannot read {}: {e}", path.display()),
        )),
    }
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
    /// The candidate's stdout and stderr, beside its executable.
    pub fn output_path(&self, version: &str, service: &str) -> PathBuf {
        self.release_dir(version).join(format!("{service}.output"))
    }

    /// A rollout replica's stdout and stderr: one file per slot, so replicas never share one.
    pub fn replica_output_path(&self, version: &str, service: &str, slot: usize) -> PathBuf {
        self.release_dir(version)
            .join(format!("{service}.{slot}.output"))
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
    fn atomic_write_replaces_whole_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("current");
        write_atomically(&path, b"old").unwrap();
        write_atomically(&path, b"new content").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new content");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("current")]);
    }

    #[test]
    fn state_files_are_readable_by_all_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let old = unsafe { libc::umask(0o077) };
        let written = write_atomically(&dir.path().join("current"), b"x");
        let appended = open_append(&dir.path().join("deploy.log"));
        unsafe { libc::umask(old) };
        written.unwrap();
        appended.unwrap();
        for name in ["current", "deploy.log"] {
            let mode = fs::metadata(dir.path().join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o644, "{name}");
        }
    }

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

    #[test]
    fn a_config_a_person_wrote_is_refused_at_its_line_and_column_with_its_shape() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Pins {
            pins: Vec<String>,
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trust.json");
        assert!(read_config::<Pins>(&path, "").unwrap().is_none());
        fs::write(&path, "{\n  \"pins\": [],\n  \"pin\": 1\n}\n").unwrap();
        let err = read_config::<Pins>(&path, "it holds {\"pins\": [...]}")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "{}:3:7: unknown field `pin`, expected `pins`; it holds {{\"pins\": [...]}}",
                path.display()
            )
        );
    }
}
