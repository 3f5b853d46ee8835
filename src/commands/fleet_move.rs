//! `rollgate fleet move`: one host's step of a fleet play (`rollgate fleet playbook`), in one
//! process. The play hands it the reviewed policy on standard input; it keeps that policy in
//! the root (the copy the host was held to, written like every other state file) and moves the
//! host the way its root says: by a rollout where the root runs replicas (`replicas.json`, or
//! `--replicas` before the first one), by a deploy otherwise.
//!
//! Why one command and not the play's own tasks: Ansible starts a Python module for each task
//! on each host (a `copy` is two: a `stat`, then the copy), over SSH a round trip each. Four
//! module runs a host became one, and which way a host moves is decided by rollgate from the
//! root it is about to lock, not by the play from a `stat` made a moment before.

use std::io::Read;
use std::path::PathBuf;

use super::{deploy, rollout};
use crate::engine::{settings, Outcome};
use crate::error::{refused, Error};
use crate::host::files::{read_at_most, write_atomically};
use crate::host::state::Root;
use crate::policy::EvalOptions;

/// The reviewed policy as the last play left it on the host, in its root.
pub const POLICY_FILE: &str = ".rollgate-fleet-policy.json";

/// `rollgate fleet move SERVICE VERSION ...`.
#[derive(Debug, Clone)]
pub struct MoveRequest {
    pub service: String,
    pub version: String,
    pub root: PathBuf,
    /// `--port`: the one port a deploy starts the release on.
    pub port: Option<u16>,
    /// `--ports`: the range a deploy picks from, or a rollout's replicas take.
    pub ports: Option<String>,
    /// `--replicas`: move by a rollout even before the root's first `replicas.json`.
    pub replicas: bool,
    pub policy_entry: Option<String>,
    pub eval: EvalOptions,
}

/// How the host is moved, decided from its root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    Deploy,
    Rollout,
}

/// A rollout where the root runs replicas or the inventory says it will; a deploy otherwise.
pub fn way(root: &Root, replicas: bool) -> Way {
    if replicas || root.replicas_path().exists() {
        Way::Rollout
    } else {
        Way::Deploy
    }
}

/// Reads the policy from `input` (at most the policy files' bound), keeps it in the root, then
/// deploys or rolls out under it. A policy that is not a JSON object is refused with nothing
/// written; its entry is checked by the contract as any `--policy` file is.
pub fn run(request: MoveRequest, input: impl Read) -> Result<Outcome, Error> {
    let root = Root::existing(request.root.clone())?;
    let way = way(&root, request.replicas);
    if let (Way::Rollout, Some(port)) = (way, request.port) {
        return Err(refused(format!(
            "{} is moved by a rollout (it runs replicas), whose replicas take a range: give --ports A-B (the inventory's rollgate_ports), not --port {port}",
            root.0.display()
        )));
    }
    let text = read_bounded(input, request.eval.max_file_bytes)?;
    let policy: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        refused(format!(
            "the policy on standard input: line {}, column {}: {e}; `rollgate fleet move` takes the JSON `rollgate policy export` writes",
            e.line(),
            e.column()
        ))
    })?;
    if !policy.is_object() {
        return Err(refused(
            "the policy on standard input is not a JSON object (a map of entry name to policy)",
        ));
    }
    let kept = root.0.join(POLICY_FILE);
    let mut bytes = text.trim_end().as_bytes().to_vec();
    bytes.push(b'\n');
    write_atomically(&kept, &bytes)
        .map_err(|e| refused(format!("{}: not written: {e}", kept.display())))?;
    match way {
        Way::Deploy => deploy::deploy(deploy::Request {
            service: request.service,
            port: match request.port {
                Some(port) => deploy::PortAsked::Given(port),
                None => deploy::PortAsked::from_range(
                    request.ports,
                    "no port: give --port P or --ports A-B (the inventory's rollgate_port or rollgate_ports)".into(),
                ),
            },
            version: request.version,
            deadline_ms: None,
            root: request.root,
            policy: Some(kept),
            policy_entry: request.policy_entry,
            grace_ms: None,
            drain_ms: None,
            watch_ms: None,
            no_wait: false,
            eval: request.eval,
            give_service_config: true,
            announce: None,
            scale: None,
        }),
        Way::Rollout => rollout::rollout(rollout::Request {
            service: request.service,
            version: request.version,
            root: request.root,
            policy: Some(kept),
            policy_entry: request.policy_entry,
            eval: request.eval,
            give_service_config: true,
            announce: None,
            scale: None,
            args: settings::Args {
                ports: request
                    .ports
                    .as_deref()
                    .map(settings::parse_ports)
                    .transpose()
                    .map_err(|e| refused(format!("--ports: {e}")))?,
                ..Default::default()
            },
        }),
    }
}

/// The whole input, refused past `most` bytes or if it is not UTF-8.
fn read_bounded(input: impl Read, most: u64) -> Result<String, Error> {
    let bytes = read_at_most(input, most)
        .map_err(|e| refused(format!("the policy on standard input: {e}")))?
        .ok_or_else(|| {
            refused(format!(
                "the policy on standard input is over {most} bytes (--max-file-bytes)"
            ))
        })?;
    String::from_utf8(bytes)
        .map_err(|e| refused(format!("the policy on standard input is not UTF-8: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_with_a_pool_or_the_flag_is_rolled_out_any_other_deployed() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().to_path_buf());
        assert_eq!(way(&root, false), Way::Deploy);
        assert_eq!(way(&root, true), Way::Rollout);
        std::fs::write(dir.path().join("replicas.json"), "{}").unwrap();
        assert_eq!(way(&root, false), Way::Rollout);
    }

    #[test]
    fn input_past_the_bound_or_not_utf8_is_refused() {
        assert_eq!(read_bounded(&b"{}"[..], 2).unwrap(), "{}");
        let over = read_bounded(&b"{ }"[..], 2).unwrap_err().to_string();
        assert!(over.contains("over 2 bytes"), "{over}");
        let binary = read_bounded(&[0xff, 0xfe][..], 10).unwrap_err().to_string();
        assert!(binary.contains("not UTF-8"), "{binary}");
    }
}
