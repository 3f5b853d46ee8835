//! The release that was live before the current one, read from the deploy log's promotions:
//! what `rollback` goes back to and what `release list` marks as the last good one. A release
//! counts only while its executable is still installed.

use std::io::BufRead;

use serde::Deserialize;

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
    detail: Option<String>,
}

/// A release that was live: its version and the port it was promoted on.
#[derive(Debug, Clone, PartialEq)]
pub struct Earlier {
    pub version: String,
    pub port: Option<u16>,
}

/// The promotions of `service` in the log, oldest first (unreadable lines skipped); a release
/// a person rolled back out of production after its promotion (issue 67, 7) is no release to
/// go back to: its earlier promotions are dropped (a later one counts again).
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
        if line.service.as_deref() != Some(service) {
            continue;
        }
        let version = match line.version {
            Some(serde_json::Value::String(v)) => v,
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => continue,
        };
        let taken_out = line.event.as_deref() == Some(LogEvent::RolledBack.as_str())
            && line
                .detail
                .as_deref()
                .is_some_and(|d| d.starts_with(crate::host::journal::ROLLED_BACK_IN_PRODUCTION));
        if taken_out {
            found.retain(|earlier: &Earlier| earlier.version != version);
            continue;
        }
        if line.event.as_deref() != Some(LogEvent::Promoted.as_str()) {
            continue;
        }
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
        let installed = root.executable(&earlier.version, service).is_file()
            || crate::release::procfile::Procfile::web_of_release(
                &root.release_dir(&earlier.version),
            )
            .is_some();
        if installed {
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

    /// Issue 67, 7: after `rollback` from v2 to v1, v2 is no release to go back to (a second
    /// rollback would bring the bad one back); promoted again later, it counts again.
    #[test]
    fn a_release_rolled_back_out_of_production_is_never_gone_back_to() {
        let taken_out = format!(
            r#"{{"ts":3,"event":"rolled_back","version":"v2","detail":"{}, back to v1; users had it","service":"edge-svc"}}"#,
            crate::host::journal::ROLLED_BACK_IN_PRODUCTION
        );
        let lines = [
            promoted("v1", 8001),
            promoted("v2", 8002),
            promoted("v1", 8001),
            taken_out.clone(),
        ];
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let (_dir, root) = root_with(&lines, &["v1", "v2"]);
        let refused = previous_release(&root, "edge-svc", "v1").unwrap_err();
        assert!(
            refused.to_string().contains("nothing to roll back to"),
            "{refused}"
        );
        let lines = [
            promoted("v1", 8001),
            promoted("v2", 8002),
            promoted("v1", 8001),
            taken_out,
            promoted("v2", 8002),
            promoted("v3", 8001),
        ];
        let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
        let (_dir, root) = root_with(&lines, &["v1", "v2", "v3"]);
        assert_eq!(
            previous_release(&root, "edge-svc", "v3").unwrap().version,
            "v2"
        );
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
