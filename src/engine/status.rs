//! The read model: what a root holds now, built once ([`RootStatus::of`]) and shown by
//! `rollgate status` (its table and its JSON), the console's API and its page alike. Typed all
//! the way: a slot's state is the planner's enum, serialized by its one name.

use serde::Serialize;

use super::state;
use super::view::RolloutStatus;
use crate::error::Error;
use crate::host::identity::Identity;
use crate::host::journal::{self, Outcome};
use crate::host::probe::{self, Probe};
use crate::host::state::{Replica, Root, Stage};

/// How many outcomes a status shows.
pub const RECENT: usize = 5;

/// One root, as everything that shows a root shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RootStatus {
    /// The service the root serves: its live release's, else its run's, else the folder's name.
    pub service: String,
    pub root: String,
    pub live: Option<LiveStatus>,
    /// A single deploy in flight (its `candidate` view).
    pub candidate: Option<CandidateStatus>,
    pub replicas: Option<Vec<ReplicaStatus>>,
    /// The root's rollout of replicas, running or the last one (a single deploy is shown as
    /// its candidate, not here).
    pub rollout: Option<RolloutStatus>,
    /// The last outcomes of the log, newest first.
    pub recent: Vec<Outcome>,
    /// The service's held socket (policy `listen`): who holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket: Option<SocketStatus>,
    /// The TLS of the proxy serving the root (`--tls-listen`): its certificates, the last
    /// reload and the handshakes; none without a proxy or without TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::proxy::certs::TlsLine>,
    /// What `rollgate traffic` set for the service (none: never set, serving).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traffic: Option<crate::host::traffic::Traffic>,
    /// The routes of the proxy config serving the root (none: no proxy, or one of `--root`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routes: Option<Vec<String>>,
    /// A person stopped the service (`rollgate stop`): who, when, why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<crate::host::stopped::Stopped>,
    /// The policy the service is held to: the live release's record (none: the defaults).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyStatus>,
    /// The live processes of the release's other types (`formation.json`), in its order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessStatus>,
    /// The live policy's schedules (issue 70): each one's state, next due time, last run.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<super::schedule_status::ScheduleStatus>,
}

/// One process of another type than web (issue 69), as `status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessStatus {
    /// `worker.1`.
    pub process: String,
    pub process_type: String,
    pub version: String,
    pub pid: i32,
    pub running: bool,
    pub up_for_s: Option<f64>,
    /// Its keeper's restarts of it since its release went live.
    pub restarts: crate::host::journal::Restarts,
    /// What it runs: its Procfile line.
    pub command: Option<String>,
}

/// The service's kept policy, as `status` names it (`rollgate policy show` prints it whole).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyStatus {
    pub source: String,
    pub entry: String,
    pub sha256: String,
}

/// The root's socket holder, as it recorded itself, and whether it still runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SocketStatus {
    #[serde(flatten)]
    pub holder: crate::host::listen::Holder,
    pub holder_running: bool,
}

/// The release `current` names, and whether it answers its probe now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LiveStatus {
    pub service: String,
    pub version: String,
    pub port: u16,
    pub pid: i32,
    pub promoted_at: f64,
    pub live_for_s: f64,
    pub running: bool,
    pub answering: bool,
    /// What its probe said (`HTTP 200`, `refused`, ...).
    pub readyz: Option<String>,
    /// How it is probed (`readyz`, or the policy's probe, described).
    pub probe: String,
    /// How it ended, when it is not running and the kernel says why (an OOM kill at its limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// It runs without privileges (false: `isolation.enabled = false`).
    pub confined: bool,
    /// Its process tree (cgroup), where the host gives one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree: Option<String>,
    /// What it may use (the policy's `isolation`).
    pub limits: crate::host::cgroup::Limits,
    /// The uid it runs as, read from the kernel while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Its uid is rollgate's own: rollgate is not root, so it cannot give a service a user.
    pub own_user: bool,
    /// An image release: the engine's image ID it is pinned to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its keeper runs: it is started again if it exits (see `host::keeper`).
    pub kept: bool,
    /// How often it was started again since it went live, and how it last ended.
    pub restarts: crate::host::journal::Restarts,
    /// The release live before it, running beside it through its crash-loop window as the
    /// proxy's fallback (see `engine::retire_standby`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub standby: Option<crate::host::state::Fallback>,
    /// What it runs when not its release's executable: its Procfile's `web:` line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
}

/// A single deploy in flight.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateStatus {
    pub version: String,
    pub port: u16,
    pub pid: Option<i32>,
    pub stage: Stage,
    pub started_at: f64,
    /// How long it has been in flight (an escalated one: waiting for a person).
    pub waiting_s: f64,
    pub deployer_pid: u32,
    pub watch: Option<WatchStatus>,
    /// Its process runs.
    pub running: bool,
    /// Nobody drives it: its deployer (and watcher) died, and it is not escalated (where a
    /// person drives it). The next command that takes the root finishes it (recovery).
    pub orphaned: bool,
}

/// The watch after a deploy's switch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WatchStatus {
    pub until: f64,
    pub left_s: f64,
    pub watcher_pid: Option<u32>,
    pub watcher_running: bool,
}

/// One replica of the set, with whether its process runs and for how long.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaStatus {
    #[serde(flatten)]
    pub replica: Replica,
    /// Its process runs (the page's word for it).
    pub answering: bool,
    pub up_for_s: Option<f64>,
}

impl RootStatus {
    /// What `root` holds at `now`; the live release is probed the way its gate probed it.
    pub fn of(root: &Root, now: f64) -> Result<RootStatus, Error> {
        let pointer = root.read_pointer()?;
        let candidate = root.read_candidate()?;
        let replicas = root.read_replicas()?;
        let run = state::load(root).ok().flatten();
        let live = match &pointer {
            Some(p) => Some(live_status(root, p, now)?),
            None => None,
        };
        let policy = crate::host::kept_policy::KeptPolicy::of_live(root)
            .ok()
            .flatten()
            .map(|(_, kept)| PolicyStatus {
                source: kept.source.display().to_string(),
                entry: kept.entry,
                sha256: kept.sha256,
            });
        Ok(RootStatus {
            stopped: crate::host::stopped::read(&root.0).ok().flatten(),
            policy,
            service: service_of(root),
            root: root.0.display().to_string(),
            live,
            candidate: candidate.map(|c| CandidateStatus {
                running: c
                    .pid
                    .is_some_and(|pid| u32::try_from(pid).is_ok_and(pid_alive)),
                orphaned: c.stage != Stage::Escalated
                    && !pid_alive(c.deployer_pid)
                    && !c
                        .watch
                        .as_ref()
                        .and_then(|w| w.watcher_pid)
                        .is_some_and(pid_alive),
                waiting_s: (now - c.started_at).max(0.0),
                watch: c.watch.as_ref().map(|w| WatchStatus {
                    until: w.until,
                    left_s: (w.until - now).max(0.0),
                    watcher_pid: w.watcher_pid,
                    watcher_running: w.watcher_pid.is_some_and(pid_alive),
                }),
                version: c.version,
                port: c.port,
                pid: c.pid,
                stage: c.stage,
                started_at: c.started_at,
                deployer_pid: c.deployer_pid,
            }),
            replicas: replicas.map(|set| {
                set.replicas
                    .into_iter()
                    .map(|replica| {
                        let identity = Identity {
                            pid: replica.pid,
                            start_time: replica.start_time,
                        };
                        ReplicaStatus {
                            answering: identity.is_running(),
                            up_for_s: identity.running_for().map(|d| d.as_secs_f64()),
                            replica,
                        }
                    })
                    .collect()
            }),
            rollout: run
                .filter(|r| r.single.is_none())
                .map(|r| RolloutStatus::of(&r, now)),
            socket: crate::host::listen::holder_record(&root.0).map(|holder| SocketStatus {
                holder_running: Identity {
                    pid: holder.pid,
                    start_time: holder.start_time,
                }
                .is_running(),
                holder,
            }),
            tls: crate::proxy::control::tls_now(&root.0, std::time::Duration::from_millis(500)),
            // An unreadable file is the traffic command's to say; the status stands.
            traffic: crate::host::traffic::read(&root.0).ok().flatten(),
            routes: crate::proxy::control::routes_now(
                &root.0,
                std::time::Duration::from_millis(500),
            )
            .filter(|routes| !routes.is_empty()),
            // A log that cannot be read leaves the rest of the status standing.
            recent: recent(root),
            processes: processes(root, pointer.as_ref().map_or(0.0, |p| p.promoted_at)),
            schedules: super::schedule_status::kept_schedules(root)
                .map(|kept| {
                    // An unreadable book is `schedules list`'s to say; the status stands.
                    let book = crate::host::schedule_book::Book::read(&root.0).unwrap_or_default();
                    super::schedule_status::schedules(root, &kept, &book, now)
                })
                .unwrap_or_default(),
        })
    }
}

/// The live processes of the release's other types (web's are `live` and `replicas`); their
/// restarts counted since `since`.
fn processes(root: &Root, since: f64) -> Vec<ProcessStatus> {
    let Some(formation) = super::formation::read(root).ok().flatten() else {
        return Vec::new();
    };
    formation
        .other_types()
        .cloned()
        .map(|p| {
            let identity = p.identity();
            let process = p.name();
            ProcessStatus {
                running: identity.is_running(),
                up_for_s: identity.running_for().map(|d| d.as_secs_f64()),
                restarts: crate::host::journal::restarts_since(
                    &root.log_path(),
                    &p.version,
                    Some(&process),
                    since,
                )
                .unwrap_or_default(),
                command: p.launch.command.as_ref().and_then(|c| c.last()).cloned(),
                process,
                process_type: p.process_type,
                version: p.version,
                pid: p.pid,
            }
        })
        .collect()
}

/// The last `RECENT` outcomes, newest first, with the hooks that ran among them (a hook's
/// output is a status's business: a migration that printed a warning, a refused deploy).
fn recent(root: &Root) -> Vec<Outcome> {
    let mut found = Vec::new();
    let mut outcomes = 0;
    let read = journal::events_backwards(&root.log_path(), &journal::RECENT_EVENTS, |line| {
        if journal::OUTCOMES.contains(&line.event) {
            outcomes += 1;
        }
        found.push(line);
        match outcomes < RECENT {
            true => std::ops::ControlFlow::Continue(()),
            false => std::ops::ControlFlow::Break(()),
        }
    });
    // A log that cannot be read leaves the rest of the status standing.
    read.map(|_| found).unwrap_or_default()
}

/// The service a root serves, read from its small files (no probe, no log): its live
/// release's, its run's, its deploy's or its replica set's, else its folder's name.
pub fn service_of(root: &Root) -> String {
    let live = || root.read_pointer().ok().flatten().map(|p| p.service);
    let run = || state::load(root).ok().flatten().map(|r| r.service);
    let candidate = || root.read_candidate().ok().flatten().map(|c| c.service);
    let set = || root.read_replicas().ok().flatten().map(|s| s.service);
    live()
        .or_else(run)
        .or_else(candidate)
        .or_else(set)
        .unwrap_or_else(|| {
            root.0
                .file_name()
                .map_or("service".into(), |n| n.to_string_lossy().into_owned())
        })
}

/// The live release, probed as its gate probed it (its policy's probe, not always `/readyz`).
fn live_status(
    root: &Root,
    p: &crate::host::state::Pointer,
    now: f64,
) -> Result<LiveStatus, Error> {
    let rt = super::runtime()?;
    let subject = probe::Subject {
        spec: p.launch.probe.clone(),
        port: p.port,
        workdir: root.release_dir(&p.version),
        notices: None,
        root: root.0.clone(),
        launch: p.launch.clone(),
    };
    let (passed, said) = rt.block_on(subject.check());
    let running = p.identity().is_running();
    Ok(LiveStatus {
        service: p.service.clone(),
        version: p.version.clone(),
        port: p.port,
        pid: p.pid,
        promoted_at: p.promoted_at,
        live_for_s: now - p.promoted_at,
        running,
        // Its notifications go to whoever watches it: here, running is all one can see.
        answering: passed || (said == Probe::Unwatched && running),
        readyz: Some(said.to_string()),
        probe: match p.launch.probe == probe::Spec::default() {
            true => "readyz".into(),
            false => p.launch.probe.describe(),
        },
        ended: (!running)
            .then(|| crate::host::cgroup::out_of_memory(&p.identity()))
            .flatten()
            .map(|mb| format!("killed: out of memory at its {mb} MiB limit")),
        confined: !p.launch.unconfined,
        tree: crate::host::cgroup::of(&p.identity()).map(|t| t.path().display().to_string()),
        limits: p.launch.limits,
        // The container's uid for an image release, not its supervisor's.
        uid: running
            .then(|| {
                crate::host::account::work_held_as(&p.identity())
                    .first()
                    .map(|h| h.uid)
            })
            .flatten(),
        own_user: !crate::host::account::can_switch_user(),
        image: p
            .launch
            .runner(&root.release_dir(&p.version))
            .image()
            .map(str::to_string),
        kept: crate::host::keeper::kept(&root.0, false)
            .releases()
            .contains(&p.identity()),
        restarts: crate::host::journal::restarts_since(
            &root.log_path(),
            &p.version,
            None,
            p.promoted_at,
        )
        .unwrap_or_default(),
        standby: p.fallback.clone().filter(|f| f.standby),
        command: p.launch.command.clone(),
    })
}

/// Whether a process with this pid exists and is not a zombie (a watcher is not ours to reap).
pub fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}
