//! `rollgate rollback SVC`: back to the release that was live before the current one, with no
//! version to look up in an incident. It is an ordinary deploy (or rollout) of that version, so
//! the release must prove itself ready again through the gate (and the watch).

use std::io::BufRead;
use std::path::PathBuf;

use serde::Deserialize;

use super::deploy::{self, Request};
use crate::engine::Outcome;
use crate::error::{refused, Error};
use crate::host::journal::LogEvent;
use crate::host::state::Root;

/// The fields of a log line the search needs; anything else on the line is ignored.
#[derive(Deserialize)]
struct Line {
    event: Option<String>,
    version: Option<serde_json::Value>,
    service: Option<String>,
    port: Option<u16>,
}

/// A release that was live: its version and the port it was promoted on.
#[derive(Debug, Clone, PartialEq)]
pub struct Earlier {
    pub version: String,
    pub port: Option<u16>,
}

/// The promotions of `service` in the log, oldest first (unreadable lines skipped).
fn promotions(root: &Root, service: &str) -> Result<Vec<Earlier>, String> {
    let path = root.log_path();
    let file = match std::fs::File::open(&path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let mut found = Vec::new();
    for line in std::io::BufReader::new(file).split(b'\n') {
        let line = line.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let Ok(line) = serde_json::from_slice::<Line>(&line) else {
            continue;
        };
        if line.event.as_deref() != Some(LogEvent::Promoted.as_str())
            || line.service.as_deref() != Some(service)
        {
            continue;
        }
        let version = match line.version {
            Some(serde_json::Value::String(v)) => v,
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => continue,
        };
        found.push(Earlier {
            version,
            port: line.port,
        });
    }
    Ok(found)
}

/// The last release promoted before `current` took over, other than `current`, whose
/// executable is still installed. The refusal names what was found and why none fits.
pub fn previous_release(root: &Root, service: &str, current: &str) -> Result<Earlier, Error> {
    let promoted = promotions(root, service).map_err(refused)?;
    // Only what was promoted before the current release's last promotion counts.
    let before = match promoted.iter().rposition(|p| p.version == current) {
        Some(at) => &promoted[..at],
        None => &promoted[..],
    };
    let mut gone = Vec::new();
    for earlier in before.iter().rev().filter(|p| p.version != current) {
        if gone.contains(&earlier.version) {
            continue;
        }
        if root.executable(&earlier.version, service).is_file() {
            return Ok(earlier.clone());
        }
        gone.push(earlier.version.clone());
    }
    Err(refused(if gone.is_empty() {
        format!(
            "no release of {service} was live before {current} (per {}); nothing to roll back to",
            root.log_path().display()
        )
    } else {
        format!(
            "the releases live before {current} are no longer installed ({}); deploy a version by name",
            gone.join(", ")
        )
    }))
}

/// For a root served by a replica set: the version most replicas run and the release live
/// before it (to move the replicas back with a rollout). None for a single-release root.
pub fn replica_target(
    root: &std::path::Path,
    service: &str,
) -> Result<Option<(String, String)>, Error> {
    let root = Root::existing(root.to_path_buf())?;
    let Some(set) = root.read_replicas()? else {
        return Ok(None);
    };
    let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
    for r in &set.replicas {
        *counts.entry(r.version.as_str()).or_default() += 1;
    }
    let Some((current, _)) = counts.into_iter().max_by_key(|(_, n)| *n) else {
        return Err(refused(format!(
            "{} names no replica; nothing to roll back from",
            root.replicas_path().display()
        )));
    };
    let earlier = previous_release(&root, service, current)?;
    Ok(Some((current.to_string(), earlier.version)))
}

/// What `rollgate rollback` was asked.
#[derive(Debug, Clone)]
pub struct RollbackRequest {
    pub service: String,
    pub root: PathBuf,
    /// The port to start the earlier release on: this one, else chosen from `ports` (`--ports`)
    /// or the policy's `ports`, else the one it was promoted on.
    pub port: Option<u16>,
    pub ports: Option<String>,
    /// Everything else a deploy takes (policy, grace, watch...).
    pub deploy: Request,
}

/// Finds the earlier release and deploys it; what it chose is said on stderr first.
pub fn rollback(request: RollbackRequest) -> Result<Outcome, Error> {
    crate::host::names::check_name("service", &request.service)?;
    let root = Root::existing(request.root.clone())?;
    let live = root.read_pointer()?.ok_or_else(|| {
        refused(format!(
            "nothing of {} is live under {}; nothing to roll back from",
            request.service,
            root.0.display()
        ))
    })?;
    if live.service != request.service {
        return Err(refused(format!(
            "{} serves {}, not {}",
            root.pointer_path().display(),
            live.service,
            request.service
        )));
    }
    let earlier = previous_release(&root, &request.service, &live.version)?;
    let port = match request.port {
        Some(port) => deploy::PortAsked::Given(port),
        None => deploy::PortAsked::Chosen {
            range: request.ports,
            otherwise: match earlier.port {
                Some(port) if port != live.port => Ok(port),
                _ => Err(format!(
                    "{} was last live on port {}; name a free port for it with --port, or a range with --ports A-B (or the policy's ports)",
                    earlier.version,
                    earlier.port.map_or("(unknown)".into(), |p| p.to_string())
                )),
            },
        },
    };
    eprintln!(
        "rollgate: rolling {} back from {} to {} (the release live before it), through the gate",
        request.service, live.version, earlier.version
    );
    deploy::deploy(Request {
        service: request.service,
        port,
        version: earlier.version,
        root: request.root,
        ..request.deploy
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with(lines: &[&str], installed: &[&str]) -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("deploy.log"), lines.join("\n") + "\n").unwrap();
        for v in installed {
            let folder = dir.path().join("releases").join(v);
            std::fs::create_dir_all(&folder).unwrap();
            std::fs::write(folder.join("edge-svc"), "#!/bin/sh\n").unwrap();
        }
        let root = Root::new(dir.path().to_path_buf());
        (dir, root)
    }

    fn promoted(version: &str, port: u16) -> String {
        format!(
            r#"{{"ts":1,"event":"promoted","version":"{version}","detail":"","service":"edge-svc","port":{port}}}"#
        )
    }

    #[test]
    fn the_release_live_before_the_current_one_is_chosen() {
        let lines = [
            promoted("v1", 8001),
            promoted("v2", 8002),
            r#"{"ts":2,"event":"rolled_back","version":"v3","detail":"x","service":"edge-svc"}"#
                .into(),
            "not json".into(),
            promoted("v4", 8001),
        ];
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let (_dir, root) = root_with(&lines, &["v1", "v2", "v4"]);
        assert_eq!(
            previous_release(&root, "edge-svc", "v4").unwrap(),
            Earlier {
                version: "v2".into(),
                port: Some(8002)
            }
        );
        // After a rollback to v2, the one before v2's last promotion is v1.
        assert_eq!(
            previous_release(&root, "edge-svc", "v2").unwrap().version,
            "v1"
        );
    }

    #[test]
    fn none_before_or_none_installed_is_refused_with_the_reason() {
        let one = promoted("v1", 8001);
        let (_dir, root) = root_with(&[&one], &["v1"]);
        let err = previous_release(&root, "edge-svc", "v1")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("no release of edge-svc was live before v1"),
            "{err}"
        );
        let two = [promoted("v1", 8001), promoted("v2", 8002)];
        let (_dir, root) = root_with(&[&two[0], &two[1]], &["v2"]);
        let err = previous_release(&root, "edge-svc", "v2")
            .unwrap_err()
            .to_string();
        assert!(err.contains("no longer installed (v1)"), "{err}");
    }
}
