//! `rollgate status`: what is live under a root, whether it answers, and the last outcomes.

use crate::engine::{ReplicaStatus, RootStatus};
use crate::render::table::{Cell, Grid, Layout};
use crate::render::time::{format_duration, format_time};
use crate::render::{figures_table, Format};

use crate::error::Error;
use crate::host::journal;
use crate::host::state::Root;

/// `rollgate status`: the root's [`RootStatus`], as JSON (the model itself, as the console's
/// API answers it) or as a table for a person.
pub fn status(root: std::path::PathBuf, format: Format, layout: Layout) -> Result<String, Error> {
    let root = Root::existing(root)?;
    let now = journal::now();
    let status = RootStatus::of(&root, now)?;
    if format == Format::Json {
        let text = serde_json::to_string(&status).expect("a status serializes");
        return Ok(format!("{text}\n"));
    }
    Ok(table(&status, now, layout))
}

/// The status as a person reads it: the live release, the proxy's side, the run, the last
/// outcomes.
fn table(status: &RootStatus, now: f64, layout: Layout) -> String {
    let mut rows: Vec<(String, String)> = Vec::new();
    live_rows(status, &mut rows);
    front_rows(status, now, &mut rows);
    in_flight_rows(status, now, &mut rows);
    let mut out = figures_table(&rows);
    out.push_str(&last_outcomes(status, layout));
    out
}

/// The live release: what, where, since when, whether it answers, how it is confined.
fn live_rows(status: &RootStatus, rows: &mut Vec<(String, String)>) {
    if let Some(stopped) = &status.stopped {
        rows.push((
            "STOPPED".into(),
            format!(
                "{}; `rollgate start {}` starts it",
                stopped.words(),
                stopped.service
            ),
        ));
    }
    match &status.live {
        None => rows.push(("live".into(), "(nothing promoted yet)".into())),
        Some(p) => {
            rows.push(("live".into(), format!("{} {}", p.service, p.version)));
            rows.push(("port".into(), p.port.to_string()));
            rows.push((
                "pid".into(),
                format!(
                    "{} ({})",
                    p.pid,
                    match (p.running, &p.ended) {
                        (true, _) => "running".to_string(),
                        (false, Some(how)) => format!("NOT running: {how}"),
                        (false, None) => "NOT running".to_string(),
                    }
                ),
            ));
            rows.push((
                "live since".into(),
                format!(
                    "{} ({})",
                    format_time(p.promoted_at),
                    format_duration(p.live_for_s)
                ),
            ));
            rows.push((
                "answering".into(),
                format!(
                    "{} ({}: {})",
                    if p.answering { "yes" } else { "NO" },
                    p.probe,
                    p.readyz.as_deref().unwrap_or_default()
                ),
            ));
            if let Some(command) = p.command.as_ref().and_then(|c| c.last()) {
                rows.push((
                    "runs".into(),
                    format!(
                        "its Procfile's web: `{}`",
                        crate::host::output::printable(command)
                    ),
                ));
            }
            rows.push(("restarts".into(), restarts(p)));
            if let Some(standby) = &p.standby {
                rows.push((
                    "standby".into(),
                    format!(
                        "{} on port {} (pid {}): the release before it, beside it through its crash-loop window; the proxy sends it what {} refuses",
                        standby.version, standby.port, standby.pid, p.version
                    ),
                ));
            }
            rows.push(("confined".into(), confinement(p)));
            if let Some(image) = &p.image {
                rows.push(("image".into(), image.clone()));
            }
        }
    }
    type_rows(status, rows);
    schedule_rows(status, rows);
    rows.push((
        "policy".into(),
        match &status.policy {
            Some(policy) => format!(
                "entry {} of {}, sha256 {} (kept in the root: `rollgate policy show`)",
                policy.entry,
                policy.source,
                &policy.sha256[..policy.sha256.len().min(12)]
            ),
            None => "(none kept: the defaults)".into(),
        },
    ));
}

/// A row per process type of the release besides web: how many of its processes run, each
/// one's pid, uptime and restarts, and what the type runs.
fn type_rows(status: &RootStatus, rows: &mut Vec<(String, String)>) {
    let mut types: Vec<&str> = Vec::new();
    for p in &status.processes {
        if !types.contains(&p.process_type.as_str()) {
            types.push(&p.process_type);
        }
    }
    for name in types {
        let of_type: Vec<_> = status
            .processes
            .iter()
            .filter(|p| p.process_type == name)
            .collect();
        let running = of_type.iter().filter(|p| p.running).count();
        let each: Vec<String> = of_type
            .iter()
            .map(|p| {
                let state = match p.up_for_s {
                    Some(up) if p.running => format!("up {}", format_duration(up)),
                    _ => "NOT running".into(),
                };
                format!(
                    "{} {} pid {} {state}, {} restart{}",
                    p.process,
                    p.version,
                    p.pid,
                    p.restarts.count,
                    if p.restarts.count == 1 { "" } else { "s" }
                )
            })
            .collect();
        let command = of_type
            .first()
            .and_then(|p| p.command.as_deref())
            .map_or(String::new(), |c| {
                format!("; runs `{}`", crate::host::output::printable(c))
            });
        rows.push((
            name.to_string(),
            format!(
                "{running} of {} running: {}{command}",
                of_type.len(),
                each.join("; ")
            ),
        ));
    }
}

/// A row per schedule of the policy: its expression, state, next due time and last run.
fn schedule_rows(status: &RootStatus, rows: &mut Vec<(String, String)>) {
    let at = |t: f64| crate::render::time::format_time(t);
    for s in &status.schedules {
        let last = match &s.last {
            Some(last) => format!(
                "last {} {}: {}",
                at(last.finished_at),
                if last.ok { "ok" } else { "FAILED" },
                last.words
            ),
            None => "not run yet".into(),
        };
        let next = s.next_due.map_or("none".into(), at);
        rows.push((
            format!("schedule {}", s.schedule),
            format!("`{}` {}; next {next}; {last}", s.cron, s.state),
        ));
    }
}

/// The pool, the held socket, the certificates, the traffic mode and the proxy's routes.
fn front_rows(status: &RootStatus, now: f64, rows: &mut Vec<(String, String)>) {
    if let Some(replicas) = &status.replicas {
        rows.push(("pool".into(), pool_line(replicas)));
    }
    if let Some(socket) = &status.socket {
        rows.push((
            "socket".into(),
            format!(
                "{} held by pid {} ({}{})",
                socket.holder.address,
                socket.holder.pid,
                socket.holder.origin,
                if socket.holder_running {
                    ""
                } else {
                    "; NOT running: the next deploy starts another"
                }
            ),
        ));
    }
    if let Some(tls) = &status.tls {
        for cert in &tls.certificates {
            rows.push((
                "certificate".into(),
                format!(
                    "{}: {}, issued by {}, until {} ({} left; {} {})",
                    cert.name,
                    cert.subject,
                    cert.issuer,
                    format_time(cert.not_after as f64),
                    format_duration((cert.not_after as f64 - now).max(0.0)),
                    cert.source,
                    cert.file.display()
                ),
            ));
        }
        for acme in &tls.acme {
            let next = acme
                .next_attempt
                .map_or("-".into(), |at| format_time(at as f64));
            rows.push((
                format!("acme {}", acme.name),
                match (&acme.last_error, acme.last_attempt) {
                    (Some(why), _) => format!("last order FAILED: {why}; next try {next}"),
                    (None, Some(_)) => format!("issued; renewed after {next}"),
                    (None, None) => "not ordered yet".into(),
                },
            ));
        }
        if let Some(reload) = &tls.last_reload {
            rows.push((
                "certificates read".into(),
                match &reload.refused {
                    None => format!("again at {} (SIGHUP): taken", format_time(reload.at as f64)),
                    Some(why) => format!(
                        "again at {} (SIGHUP): NOT taken, the ones before go on: {why}",
                        format_time(reload.at as f64)
                    ),
                },
            ));
        }
    }
    if let Some(traffic) = status
        .traffic
        .as_ref()
        .filter(|t| t.mode != crate::host::traffic::Mode::Serving)
    {
        rows.push((
            "traffic".into(),
            format!(
                "{} since {} by {}{}",
                traffic.mode.as_str().to_uppercase(),
                format_time(traffic.since),
                traffic.by,
                traffic
                    .why
                    .as_deref()
                    .map_or(String::new(), |why| format!(": {why}"))
            ),
        ));
    }
    for route in status.routes.iter().flatten() {
        rows.push(("proxy route".into(), route.clone()));
    }
}

/// The last rollout, the deploy in flight and its watch.
fn in_flight_rows(status: &RootStatus, now: f64, rows: &mut Vec<(String, String)>) {
    if let Some(rollout) = &status.rollout {
        rows.push(("last rollout".into(), rollout.line.clone()));
    }
    if let Some(c) = &status.candidate {
        rows.push((
            "in flight".into(),
            format!(
                "{} on port {} ({:?}, pid {}{}){}",
                c.version,
                c.port,
                c.stage,
                c.pid.map_or("?".into(), |p| p.to_string()),
                if c.running { "" } else { " NOT running" },
                if c.orphaned {
                    format!(
                        "; its deployer pid {} is gone: the next deploy, rollback or `rollgate up` finishes it",
                        c.deployer_pid
                    )
                } else {
                    String::new()
                }
            ),
        ));
        if let Some(w) = &c.watch {
            let watcher = match w.watcher_pid {
                Some(pid) if w.watcher_running => format!("watcher pid {pid}"),
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
}

/// The last outcomes, as a grid under the figures (nothing when there are none).
fn last_outcomes(status: &RootStatus, layout: Layout) -> String {
    let mut out = String::new();
    if !status.recent.is_empty() {
        let mut t = Grid::new(["when", "outcome", "version", "detail"], &[]);
        for outcome in &status.recent {
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
    out
}

/// How the live release runs: without privileges (or not), its tree, its limits.
/// `1 (last at 12:03:04 UTC: signal: 9 (SIGKILL)); kept` — whether its keeper runs.
fn restarts(p: &crate::engine::LiveStatus) -> String {
    let kept = match p.kept {
        true => "kept (started again if it exits)",
        false => "NOT kept: nothing starts it again if it exits (`rollgate up` gives it a keeper)",
    };
    let r = &p.restarts;
    match (r.count, r.last_at) {
        (0, _) | (_, None) => format!("none since it went live; {kept}"),
        (n, Some(at)) => format!(
            "{n} since it went live (last at {}: {}); {kept}",
            format_time(at),
            r.last_ended.as_deref().map_or_else(
                || "not running at `rollgate up`".to_string(),
                crate::host::output::printable
            )
        ),
    }
}

fn confinement(p: &crate::engine::LiveStatus) -> String {
    use crate::render::confinement::{words, Held, Limits};
    words(&Held {
        confined: p.confined,
        uid: p.uid,
        own_user: p.own_user,
        tree: p.tree.as_deref(),
        limits: Limits {
            memory_mb: p.limits.memory_mb,
            pids: p.limits.pids,
            cpu_pct: p.limits.cpu_pct,
            nofile: p.limits.nofile,
        },
    })
}

/// `4 replicas: 3 on v2 (3 running), 1 on v1 (1 running)`.
fn pool_line(replicas: &[ReplicaStatus]) -> String {
    let mut versions: std::collections::BTreeMap<&str, (usize, usize)> = Default::default();
    for r in replicas {
        let entry = versions.entry(r.replica.version.as_str()).or_default();
        entry.0 += 1;
        if r.answering {
            entry.1 += 1;
        }
    }
    let parts: Vec<String> = versions
        .iter()
        .map(|(v, (n, up))| format!("{n} on {v} ({up} running)"))
        .collect();
    format!("{} replicas: {}", replicas.len(), parts.join(", "))
}
