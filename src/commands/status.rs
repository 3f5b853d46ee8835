//! `rollgate status`: what is live under a root, whether it answers, and the last outcomes.

use crate::log::read::{read_with, ReadOptions, Record, Sink};
use crate::render::table::{Cell, Grid, Layout};
use crate::render::time::{format_duration, format_time};
use crate::render::{figures_table, Format};

use crate::error::Error;
use crate::host::journal::{self, LogEvent};
use crate::host::probe;
use crate::host::state::Root;

/// Whether a process with this pid exists and is not a zombie (a watcher is not ours to reap).
fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// How many outcomes the status shows.
const RECENT: usize = 5;

/// One outcome line of the log, as the status shows it.
#[derive(Debug)]
struct RecentOutcome {
    ts: f64,
    event: String,
    version: String,
    detail: String,
}

/// The last [`RECENT`] outcomes of a log, oldest first: all a status keeps of it.
struct Recent(std::collections::VecDeque<RecentOutcome>);

impl Sink for Recent {
    fn new(_: ReadOptions) -> Self {
        Recent(std::collections::VecDeque::with_capacity(RECENT + 1))
    }

    fn record(&mut self, _line: u64, record: Record<'_>) {
        let event = record.event.as_deref().unwrap_or_default();
        if !matches!(
            LogEvent::from_name(event),
            Some(LogEvent::Promoted | LogEvent::RolledBack | LogEvent::Escalated)
        ) {
            return;
        }
        if self.0.len() == RECENT {
            self.0.pop_front();
        }
        self.0.push_back(RecentOutcome {
            ts: record.ts.unwrap_or(0.0),
            event: event.to_string(),
            version: record.version.unwrap_or_default().into_owned(),
            detail: record.detail.unwrap_or_default().into_owned(),
        });
    }

    fn absorb(&mut self, later: Self, _line_offset: u64) {
        for outcome in later.0 {
            if self.0.len() == RECENT {
                self.0.pop_front();
            }
            self.0.push_back(outcome);
        }
    }
}

pub fn status(root: std::path::PathBuf, format: Format, layout: Layout) -> Result<String, Error> {
    let root = Root::existing(root).map_err(Error::Refused)?;
    let pointer = root.read_pointer().map_err(Error::Refused)?;
    let candidate = root.read_candidate().map_err(Error::Refused)?;
    let running = pointer.as_ref().is_some_and(|p| p.identity().is_running());
    // A root served by replicas: how many, on which versions, and its last rollout.
    let replicas = root.read_replicas().map_err(Error::Refused)?;
    // A single deploy in flight is shown by its `candidate` view, not as a rollout.
    let rollout = crate::engine::state::load(&root)
        .ok()
        .flatten()
        .filter(|r| r.single.is_none());
    let pool_line = replicas.as_ref().map(|set| {
        let mut versions: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
        for r in &set.replicas {
            let entry = versions.entry(r.version.as_str()).or_default();
            entry.0 += 1;
            if (crate::host::process::Identity {
                pid: r.pid,
                start_time: r.start_time,
            })
            .is_running()
            {
                entry.1 += 1;
            }
        }
        let parts: Vec<String> = versions
            .iter()
            .map(|(v, (n, up))| format!("{n} on {v} ({up} running)"))
            .collect();
        format!("{} replicas: {}", set.replicas.len(), parts.join(", "))
    });
    let rollout_line = rollout.as_ref().map(crate::engine::view::line);
    let answer = match &pointer {
        Some(p) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::Failed(e.to_string()))?;
            // Asked the way its gate asked it (its policy's probe), not always `/readyz`.
            let subject = probe::Subject {
                spec: p.probe.clone().unwrap_or_default(),
                port: p.port,
                workdir: root.release_dir(&p.version),
                notices: None,
            };
            let (passed, said) = rt.block_on(subject.check());
            // Its notifications go to whoever watches it: here, running is all one can see.
            let passed = passed || (said == probe::Probe::Unwatched && p.identity().is_running());
            Some((passed, said))
        }
        None => None,
    };
    let answering = answer.as_ref().is_some_and(|(passed, _)| *passed);
    let answer = answer.map(|(_, said)| said);
    // Streamed: a log of years of deploys is read without holding its records.
    let recent: Vec<RecentOutcome> = read_with::<Recent>(&root.log_path(), ReadOptions::default())
        .map(|(recent, _)| recent.0.into_iter().rev().collect())
        .unwrap_or_default();
    let now = journal::now();
    if format == Format::Json {
        let value = serde_json::json!({
            "live": pointer.as_ref().map(|p| serde_json::json!({
                "service": p.service, "version": p.version, "port": p.port, "pid": p.pid,
                "promoted_at": p.promoted_at, "live_for_s": now - p.promoted_at,
                "running": running, "answering": answering,
                "readyz": answer.as_ref().map(|a| a.to_string()),
            })),
            "candidate": candidate.as_ref().map(|c| serde_json::json!({
                "version": c.version, "port": c.port, "pid": c.pid,
                "stage": c.stage, "started_at": c.started_at,
                "watch": c.watch.as_ref().map(|w| serde_json::json!({
                    "until": w.until, "left_s": (w.until - now).max(0.0),
                    "watcher_pid": w.watcher_pid,
                    "watcher_running": w.watcher_pid.is_some_and(pid_alive),
                })),
            })),
            "replicas": replicas.as_ref().map(|set| &set.replicas),
            "rollout": rollout.as_ref().map(|r| crate::engine::view::status_json(r, now)),
            "recent": recent.iter().map(|RecentOutcome { ts, event, version, detail }| serde_json::json!({
                "ts": ts, "event": event, "version": version, "detail": detail,
            })).collect::<Vec<_>>(),
        });
        return Ok(format!("{value}\n"));
    }
    let mut rows: Vec<(String, String)> = Vec::new();
    match &pointer {
        None => rows.push(("live".into(), "(nothing promoted yet)".into())),
        Some(p) => {
            rows.push(("live".into(), format!("{} {}", p.service, p.version)));
            rows.push(("port".into(), p.port.to_string()));
            rows.push((
                "pid".into(),
                format!(
                    "{} ({})",
                    p.pid,
                    if running { "running" } else { "NOT running" }
                ),
            ));
            rows.push((
                "live since".into(),
                format!(
                    "{} ({})",
                    format_time(p.promoted_at),
                    format_duration(now - p.promoted_at)
                ),
            ));
            rows.push((
                "answering".into(),
                format!(
                    "{} ({}: {})",
                    if answering { "yes" } else { "NO" },
                    p.probe.as_ref().map_or("readyz".into(), |s| s.describe()),
                    answer.map(|a| a.to_string()).unwrap_or_default()
                ),
            ));
        }
    }
    if let Some(line) = pool_line {
        rows.push(("pool".into(), line));
    }
    if let Some(line) = rollout_line {
        rows.push(("last rollout".into(), line));
    }
    if let Some(c) = &candidate {
        rows.push((
            "in flight".into(),
            format!(
                "{} on port {} ({:?}, pid {})",
                c.version,
                c.port,
                c.stage,
                c.pid.map_or("?".into(), |p| p.to_string())
            ),
        ));
        if let Some(w) = &c.watch {
            let watcher = match w.watcher_pid {
                Some(pid) if pid_alive(pid) => format!("watcher pid {pid}"),
                Some(pid) => {
                    format!("watcher pid {pid} is gone: the next deploy finishes the watch")
                }
                None => format!("deployer pid {}", c.deployer_pid),
            };
            rows.push((
                "watch".into(),
                format!(
                    "{} watched until {} ({} left; {watcher})",
                    c.version,
                    format_time(w.until),
                    format_duration((w.until - now).max(0.0))
                ),
            ));
        }
    }
    let mut out = figures_table(&rows);
    if !recent.is_empty() {
        let mut t = Grid::new(["when", "outcome", "version", "detail"], &[]);
        for outcome in &recent {
            t.push(vec![
                Cell::Time(Some(outcome.ts)),
                outcome.event.as_str().into(),
                outcome.version.as_str().into(),
                outcome.detail.as_str().into(),
            ]);
        }
        out.push_str("\nLast outcomes\n");
        out.push_str(&t.render(layout));
    }
    Ok(out)
}
