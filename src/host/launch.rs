//! How one release process is started: the launch record (issue 68's seam). It is decided once,
//! when a run is planned (from the policy), and kept with every process started from it — in
//! the run's state (`Process::launch`), in `current` and in the replica set — so that whatever
//! touches that process later (a revert bringing the previous release back, recovery after a
//! crash, `up` after a reboot, `status` probing it) starts or asks it the way it was started,
//! never re-deriving it from a newer policy. A rollback of a user change therefore runs the old
//! release as its old user (issue 67, 2).
//!
//! The fields keep the names `current` has always had for them (flattened into it), so a
//! pointer written before the record existed reads the same.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::cgroup::Limits;
use super::probe::Spec;

/// The settings one release process is started with, beyond its version, port and token.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LaunchRecord {
    /// How it proves readiness (and how `status` asks it); the default is `GET /readyz` = 200,
    /// which records leave out.
    #[serde(default, skip_serializing_if = "is_default_probe")]
    pub probe: Spec,
    /// The service's held socket, handed to it (policy `listen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<super::listen::Spec>,
    /// Started with rollgate's own privileges (`isolation.enabled = false`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unconfined: bool,
    /// What it may use (policy `isolation`).
    #[serde(default, skip_serializing_if = "Limits::is_empty")]
    pub limits: Limits,
    /// The existing user it runs as (policy `isolation.user`); none: the service's own uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Folders it may write besides its own (policy `isolation.writable`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable: Vec<PathBuf>,
    /// An image release: the engine's image ID its container runs (from the release's
    /// `image.json`, read once when the run is planned); its supervisor starts the container,
    /// and an exec probe runs inside it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// How its keeper tells a crash loop caused by its deploy (policy `crash_loop`); the
    /// defaults when absent.
    #[serde(default, skip_serializing_if = "CrashLoop::is_default")]
    pub crash_loop: CrashLoop,
    /// How its output file is bounded (policy `output_max_bytes`, `output_keep`); none: the
    /// defaults.
    /// (Named apart from a run's own `output`: the record is flattened into the run's settings.)
    #[serde(
        default,
        rename = "output_bounds",
        skip_serializing_if = "Option::is_none"
    )]
    pub output: Option<super::output::Rotation>,
    /// How long a stop waits after SIGTERM (policy `stop_grace_ms`, `--grace-ms`); none: the
    /// default.
    /// (Named apart from a run's own `grace_ms`, as `output` is.)
    #[serde(
        default,
        rename = "stop_grace_ms",
        skip_serializing_if = "Option::is_none"
    )]
    pub grace_ms: Option<u64>,
    /// How long it must stay up and ready once its probe first passes before it counts as
    /// started (policy `min_ready_ms`, or its type's `processes.TYPE.min_ready_ms`): a `start`,
    /// `up` or `restart` holds it as its deploy's gate did, so a process that dies in its first
    /// second is not called started. None: not held (and records written before it).
    /// (Named apart from the run's own `min_ready_ms`, as `output` is.)
    #[serde(
        default,
        rename = "ready_held_ms",
        skip_serializing_if = "Option::is_none"
    )]
    pub min_ready_ms: Option<u64>,
    /// What it runs: its release's Procfile line for its type (`web:`), run by `/bin/sh -c`
    /// in the release's folder, read once when the run is planned; none: the release's
    /// executable at its top.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
}

/// A live release that exits `restarts` times within `within_ms` of its switch is rolled back
/// by its keeper to the release live before it (issue 68, 2); 0 restarts: never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashLoop {
    pub restarts: u32,
    pub within_ms: u64,
}

impl Default for CrashLoop {
    fn default() -> CrashLoop {
        CrashLoop {
            restarts: crate::defaults::CRASH_LOOP_RESTARTS,
            within_ms: crate::defaults::CRASH_LOOP_WITHIN_MS,
        }
    }
}

impl CrashLoop {
    fn is_default(&self) -> bool {
        *self == CrashLoop::default()
    }

    /// The policy's fields over the defaults; refused outside the contract's bounds (a `.ncl`
    /// policy need not apply the bundled contract).
    pub fn from_policy(
        asked: Option<&crate::policy::CrashLoopPolicy>,
    ) -> Result<CrashLoop, super::fault::Fault> {
        let default = CrashLoop::default();
        let restarts = asked
            .and_then(|a| a.restarts)
            .unwrap_or(u64::from(default.restarts));
        let within_ms = asked.and_then(|a| a.within_ms).unwrap_or(default.within_ms);
        if restarts > 100 {
            return Err(super::fault::Fault::setting(
                "crash_loop.restarts",
                format!("crash_loop.restarts is {restarts}; it must be an integer from 0 to 100"),
            ));
        }
        if !(1000..=86_400_000).contains(&within_ms) {
            return Err(super::fault::Fault::setting(
                "crash_loop.within_ms",
                format!(
                    "crash_loop.within_ms is {within_ms}; it must be an integer from 1000 to 86400000"
                ),
            ));
        }
        Ok(CrashLoop {
            restarts: restarts as u32,
            within_ms,
        })
    }
}

fn is_default_probe(spec: &Spec) -> bool {
    *spec == Spec::default()
}

pub use super::confine::Runner;

impl LaunchRecord {
    /// How a process started from it, and so its hooks, are confined.
    pub fn isolation(&self) -> super::confine::Isolation<'_> {
        super::confine::Isolation {
            confined: !self.unconfined,
            user: self.user.as_deref(),
            writable: &self.writable,
            limits: &self.limits,
        }
    }

    /// How a process started from it runs: in a container of the recorded image, else (a record
    /// written before rollgate recorded it) of the one `release_dir`'s `image.json` names — the
    /// one place that is read again — else on the host.
    pub fn runner(&self, release_dir: &std::path::Path) -> Runner {
        let image = self.image.clone().or_else(|| {
            super::container::ImageRelease::of_release(release_dir)
                .ok()
                .flatten()
                .map(|image| image.image)
        });
        match image {
            Some(image) => Runner::Image(image),
            None => Runner::Host,
        }
    }

    /// How its output is bounded when it is started again (the policy's, else the defaults).
    pub fn rotation(&self) -> super::output::Rotation {
        self.output.unwrap_or_default()
    }

    /// How long a stop of it waits after SIGTERM.
    pub fn grace(&self) -> std::time::Duration {
        self.grace_ms
            .map_or(crate::defaults::GRACE, std::time::Duration::from_millis)
    }

    /// Whether a process started from `other` would run as another user than one started from
    /// this record: its folders would change hands (see `account::prepare`).
    pub fn changes_user_from(&self, other: &LaunchRecord) -> bool {
        !self.unconfined && !other.unconfined && self.user != other.user
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_is_the_recorded_image_else_an_older_record_s_image_json_else_the_host() {
        let release = tempfile::tempdir().unwrap();
        let recorded = LaunchRecord {
            image: Some("sha256:aa".into()),
            ..LaunchRecord::default()
        };
        assert_eq!(
            recorded.runner(release.path()),
            Runner::Image("sha256:aa".into())
        );
        assert_eq!(LaunchRecord::default().runner(release.path()), Runner::Host);
        std::fs::write(
            release.path().join("image.json"),
            r#"{"image": "sha256:bb", "source": "docker-archive:/a.tar"}"#,
        )
        .unwrap();
        let older = LaunchRecord::default().runner(release.path());
        assert_eq!(older, Runner::Image("sha256:bb".into()));
        assert_eq!(older.image(), Some("sha256:bb"));
        // The record's own image wins over the folder's.
        assert_eq!(recorded.runner(release.path()).image(), Some("sha256:aa"));
    }

    #[test]
    fn a_default_record_writes_nothing_and_an_old_pointers_fields_read_back() {
        assert_eq!(
            serde_json::to_value(LaunchRecord::default()).unwrap(),
            serde_json::json!({})
        );
        let written = serde_json::json!({"user": "www", "unconfined": true,
            "limits": {"memory_mb": 256}, "writable": ["/srv/shared"]});
        let record: LaunchRecord = serde_json::from_value(written.clone()).unwrap();
        assert_eq!(record.user.as_deref(), Some("www"));
        assert_eq!(record.limits.memory_mb, Some(256));
        assert_eq!(record.probe, Spec::default());
        assert_eq!(serde_json::to_value(&record).unwrap(), written);
    }
}
