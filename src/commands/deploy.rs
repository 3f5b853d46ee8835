//! Readiness-gated deploys on one host. Read [`deploy`] top to bottom: refuse what can be
//! refused before anything starts (names, the policy, the port, the release), then hand the
//! deploy to the engine's front door (`engine::start`), which runs it as the one-replica
//! rollout: it starts the candidate beside the live release, gates it until the deadline,
//! switches `current` with one rename (watching it, with the previous release as the
//! fallback) or rolls back.

use std::path::PathBuf;

use super::preflight::{policy_entry, policy_hooks, release_executable};
use crate::engine::plan::{self, Settings};
use crate::engine::{runtime, Outcome, Plan, PortChoice, Start};
use crate::error::{refused, Error};
use crate::host::fault::Fault;
use crate::host::probe::{self, Probe};
use crate::host::state::Root;
use crate::policy::{self, EvalOptions};

pub use crate::host::names::check_name;

/// `rollgate deploy`.
#[derive(Debug, Clone)]
pub struct Request {
    pub service: String,
    pub port: PortAsked,
    pub version: String,
    pub deadline_ms: Option<u64>,
    pub root: PathBuf,
    pub policy: Option<PathBuf>,
    pub policy_entry: Option<String>,
    pub grace_ms: Option<u64>,
    pub drain_ms: Option<u64>,
    /// `--watch-ms`: overrides the policy's `watch_ms`.
    pub watch_ms: Option<u64>,
    /// `--no-wait`: leave the watch to a background watcher and exit after the switch.
    pub no_wait: bool,
    pub eval: EvalOptions,
    /// A release that carries no config of its own gets the service's (the live release's):
    /// a deploy of a new release. A rollback brings a release back as it was, and does not.
    pub give_service_config: bool,
    /// What the engine says once it has planned the run (`engine::Start::announce`).
    pub announce: Option<String>,
    /// The type counts this run makes the root's (`engine::Start::scale`).
    pub scale: Option<std::collections::BTreeMap<String, usize>>,
}

impl Request {
    /// The numbers this deploy runs by: its arguments, then the policy, then the defaults.
    pub fn resolve(&self, policy: Option<&policy::RolloutSettings>) -> Result<Settings, Fault> {
        plan::resolve_with_watch(
            self.deadline_ms,
            self.grace_ms,
            self.drain_ms,
            self.watch_ms,
            policy,
        )
    }

    /// The numbers given on its command line, as a rollout it becomes (a restart, a scale)
    /// takes them; the rest of the rollout's arguments are the caller's.
    pub fn rollout_args(&self) -> crate::engine::settings::Args {
        crate::engine::settings::Args {
            deadline_ms: self.deadline_ms,
            grace_ms: self.grace_ms,
            drain_ms: self.drain_ms,
            watch_ms: self.watch_ms,
            ..Default::default()
        }
    }
}

/// `rollgate deploy SERVICE ...`'s positional words: `VERSION`, or `PORT VERSION
/// [DEADLINE_MS]` (the form every script written before `--ports` uses).
#[derive(Debug, Clone, PartialEq)]
pub struct Positional {
    pub port: Option<u16>,
    pub version: String,
    pub deadline_ms: Option<u64>,
}

impl Positional {
    pub fn parse(words: &[String]) -> Result<Positional, Error> {
        Positional::parsed(words).map_err(Error::Refused)
    }

    fn parsed(words: &[String]) -> Result<Positional, String> {
        let port = |word: &str| {
            word.parse::<u16>().map_err(|_| {
                format!(
                    "`{word}` is not a port (1 to 65535): with two or three words the first is \
                     the PORT (PORT VERSION [DEADLINE_MS]); with --ports or the policy's ports \
                     give VERSION alone, and a deadline with --deadline-ms"
                )
            })
        };
        match words {
            [version] => Ok(Positional {
                port: None,
                version: version.clone(),
                deadline_ms: None,
            }),
            [p, version] => Ok(Positional {
                port: Some(port(p)?),
                version: version.clone(),
                deadline_ms: None,
            }),
            [p, version, deadline] => Ok(Positional {
                port: Some(port(p)?),
                version: version.clone(),
                deadline_ms: Some(
                    deadline
                        .parse()
                        .map_err(|_| format!("`{deadline}` is not a deadline in milliseconds"))?,
                ),
            }),
            _ => Err("give VERSION, or PORT VERSION [DEADLINE_MS]".into()),
        }
    }
}

/// Where a deploy's candidate port comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum PortAsked {
    /// `PORT` on the command line.
    Given(u16),
    /// Chosen by the engine under the lock (`PortChoice::decide`) from `--ports` (`range`),
    /// else from the policy's `ports`; without either, `otherwise` (a rollback's: the port the
    /// earlier release was live on), or its refusal.
    Chosen {
        range: Option<String>,
        otherwise: Result<u16, String>,
    },
}

impl PortAsked {
    /// `--ports` if given, else the policy's `ports`, else refused with `refusal`.
    pub fn from_range(range: Option<String>, refusal: String) -> PortAsked {
        PortAsked::Chosen {
            range,
            otherwise: Err(refusal),
        }
    }

    /// Where the port comes from, under the same rule for `deploy`, `rollback` and `config
    /// set`: one given, or a range the engine chooses from.
    pub fn resolve(&self, policy: Option<&policy::RolloutSettings>) -> Result<PortChoice, Error> {
        match self {
            PortAsked::Given(port) => Ok(PortChoice::Given(*port)),
            PortAsked::Chosen { range, otherwise } => {
                match (range, policy.and_then(|p| p.ports.as_ref())) {
                    (Some(range), _) => port_range(range, "--ports"),
                    (None, Some(range)) => port_range(range, "the policy's ports"),
                    // With a held socket the release is reached on it; PORT is only where its
                    // probe asks, so any free port serves.
                    (None, None) if policy.is_some_and(|p| p.listen.is_some()) => {
                        probe_port().map(PortChoice::Given)
                    }
                    (None, None) => otherwise.clone().map(PortChoice::Given).map_err(refused),
                }
            }
        }
    }
}

/// A free port on 127.0.0.1 for a release that is reached on its held socket: where its
/// probe asks (`PORT`), nothing more.
fn probe_port() -> Result<u16, Error> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| refused(format!("no free port on 127.0.0.1 for the probe: {e}")))
}

/// A range (`A-B`, at least two ports; `source` says where it was written) to choose the
/// candidate's port from: the engine chooses under the lock, after recovery
/// ([`engine::PortChoice::decide`]).
pub fn port_range(range: &str, source: &str) -> Result<PortChoice, Error> {
    let (first, last) = crate::engine::settings::parse_ports(range)
        .map_err(|e| refused(format!("{source}: {e}")))?;
    if first == last {
        return Err(refused(format!(
            "{source} {range} holds one port; give at least two, so the candidate can start beside the live release"
        )));
    }
    Ok(PortChoice::Range {
        first,
        last,
        source: source.to_string(),
    })
}

/// The whole deploy.
pub fn deploy(request: Request) -> Result<Outcome, Error> {
    crate::host::names::check_name("service", &request.service)?;
    crate::host::names::check_name("version", &request.version)?;
    // The policy is evaluated in a forked sandbox: before the runtime starts any thread.
    let chosen = load_policy(&request)?;
    if let Some(chosen) = &chosen {
        chosen.say_if_kept();
    }
    let policy = chosen.as_ref().map(|c| c.settings.clone());
    let port = request.port.resolve(policy.as_ref())?;
    if port == PortChoice::Given(0) {
        return Err(refused("port 0 is not a port a release can be probed on"));
    }
    let hooks = policy_hooks(policy.as_ref(), chosen.as_ref().map(|c| c.source()))?;
    let settings = request
        .resolve(policy.as_ref())
        .map_err(|e| refused(format!("policy refused: {e}")))?;
    plan::check_bounds(&settings)?;
    // The release must be there before anything starts (it runs from a verified copy if signed).
    let (root, executable) = release_executable(&request.root, &request.version, &request.service)?;
    if request.give_service_config {
        give_service_config(&root, &request.version)?;
    }
    super::preflight::keep(&root, &request.version, chosen.as_ref())?;

    let plan = Plan::Deploy {
        port,
        settings: Box::new(settings),
        no_wait: request.no_wait,
    };
    super::releases::start_then_prune(
        Start {
            root,
            service: request.service,
            version: request.version,
            executable,
            hooks,
            plan,
            announce: request.announce,
            scale: request.scale,
            tail: None,
        },
        policy.as_ref(),
    )
}

/// A new release gets the service's config unless it carries its own (`config::for_candidate`),
/// and the deploy says which on stderr, with how it differs from the live one.
pub(crate) fn give_service_config(root: &Root, version: &str) -> Result<(), Error> {
    let candidate = super::config::for_candidate(root, version)?;
    candidate.give(root)?;
    // A service with no config anywhere has nothing to be told.
    if !candidate.is_empty() {
        eprintln!("rollgate: {}", candidate.said());
    }
    Ok(())
}

/// The request's policy: its `--policy` entry, checked by the contract, else the one kept in
/// the root (None: the defaults).
fn load_policy(request: &Request) -> Result<Option<super::preflight::Chosen>, Error> {
    policy_entry(
        &request.root,
        request.policy.as_deref(),
        request.policy_entry.as_deref(),
        &request.service,
        &request.eval,
    )
}

/// Whether a release on `port` answers `/readyz` with 200 now (for the demo).
pub fn answers_ready(port: u16) -> bool {
    runtime().is_ok_and(|rt| {
        rt.block_on(probe::readyz(port, crate::defaults::PROBE_TIMEOUT)) == Probe::Status(200)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(words: &[&str]) -> Result<Positional, String> {
        Positional::parsed(&words.iter().map(|w| w.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn the_positional_forms_are_version_or_port_version_deadline() {
        let whole = |port, deadline_ms| Positional {
            port,
            version: "v2".into(),
            deadline_ms,
        };
        assert_eq!(parsed(&["v2"]), Ok(whole(None, None)));
        assert_eq!(parsed(&["8081", "v2"]), Ok(whole(Some(8081), None)));
        assert_eq!(
            parsed(&["8081", "v2", "3000"]),
            Ok(whole(Some(8081), Some(3000)))
        );
        // A deadline after a version alone reads as a version after a port: the refusal says
        // which form was read and where a deadline goes with --ports.
        let refusal = parsed(&["v2", "3000"]).unwrap_err();
        assert!(
            refusal.starts_with("`v2` is not a port (1 to 65535): with two or three words")
                && refusal.contains("--deadline-ms"),
            "{refusal}"
        );
        assert!(parsed(&["8081", "v2", "soon"])
            .unwrap_err()
            .contains("not a deadline"));
        assert!(parsed(&["a", "b", "c", "d"]).is_err());
    }
}
