//! `--dry-run`: what a deploy (or a rollout) would do, with every value it would run by and
//! where that value came from, and every check that would refuse it. Reads only: no lock is
//! taken, no recovery runs, no file is written and no process is started, so the root stays
//! byte for byte as it was.

use std::fmt::Write as _;

use super::deploy::Request;
use super::preflight;
use super::rollout::Request as RolloutRequest;
use crate::engine;
use crate::engine::plan::{self, Settings};
use crate::error::{refused, Error};
use crate::host::lock;
use crate::host::state::Root;
use crate::policy::RolloutSettings;
use crate::release;

/// What a dry run found: the values, what would happen, and the checks.
#[derive(Debug, Default)]
pub struct Report {
    pub title: String,
    /// (name, value, where it came from)
    pub values: Vec<(String, String, &'static str)>,
    pub would: Vec<String>,
    /// (passed, what)
    pub checks: Vec<(bool, String)>,
    /// A `--policy` other than the service's kept one: the kept one's digest, and what it
    /// would change field by field.
    pub policy_changes: Option<(String, Vec<String>)>,
}

impl Report {
    pub fn value(&mut self, name: &str, value: impl Into<String>, source: &'static str) {
        self.values.push((name.into(), value.into(), source));
    }

    pub fn check<E: std::fmt::Display>(&mut self, result: Result<String, E>) {
        match result {
            Ok(what) => self.checks.push((true, what)),
            Err(why) => self.checks.push((false, why.to_string())),
        }
    }

    pub fn refused(&self) -> bool {
        self.checks.iter().any(|(passed, _)| !passed)
    }

    /// Exit 0 with the report when every check passed; exit 2 with it when any would refuse.
    pub fn finish(self) -> Result<String, Error> {
        if self.refused() {
            Err(refused(self.render()))
        } else {
            Ok(self.render())
        }
    }

    pub fn render(&self) -> String {
        let mut out = format!("{} (dry run: nothing was changed)\n", self.title);
        let width = self
            .values
            .iter()
            .map(|(n, _, _)| n.len())
            .max()
            .unwrap_or(0);
        for (name, value, source) in &self.values {
            let _ = writeln!(out, "  {name:width$}  {value}  ({source})");
        }
        if let Some((kept, changes)) = &self.policy_changes {
            match changes.is_empty() {
                true => {
                    let _ = writeln!(
                        out,
                        "policy: the same fields as the service's kept policy (sha256 {kept})"
                    );
                }
                false => {
                    let _ = writeln!(out, "policy changes against the service's kept policy (sha256 {kept}), taking effect only if this release goes live:");
                    for change in changes {
                        let _ = writeln!(out, "  {change}");
                    }
                }
            }
        }
        if !self.would.is_empty() {
            out.push_str("would:\n");
            for step in &self.would {
                let _ = writeln!(out, "  - {step}");
            }
        }
        out.push_str("checks:\n");
        for (passed, what) in &self.checks {
            let _ = writeln!(
                out,
                "  {} {what}",
                if *passed { "ok     " } else { "REFUSED" }
            );
        }
        let refusals = self.checks.iter().filter(|(passed, _)| !passed).count();
        let _ = match refusals {
            0 => writeln!(out, "it would go ahead"),
            n => writeln!(
                out,
                "it would be refused ({n} check{})",
                if n == 1 { "" } else { "s" }
            ),
        };
        out
    }
}

/// Where a value came from: the command line, the policy, or the defaults.
pub fn source(from_args: bool, from_policy: bool) -> &'static str {
    match (from_args, from_policy) {
        (true, _) => "command line",
        (false, true) => "policy",
        (false, false) => "default",
    }
}

/// The gate's values, each with its source.
pub fn gate_values(
    report: &mut Report,
    settings: &Settings,
    (grace_arg, drain_arg): (Option<u64>, Option<u64>),
    policy: Option<&RolloutSettings>,
) {
    let has = |f: fn(&RolloutSettings) -> bool| policy.is_some_and(f);
    report.value(
        "deadline",
        format!("{} ms", settings.deadline.as_millis()),
        settings.deadline_source,
    );
    report.value(
        "poll",
        format!("{} ms", settings.poll.as_millis()),
        source(false, policy.is_some()),
    );
    report.value(
        "on stall",
        format!("{:?}", settings.on_stall).to_lowercase(),
        source(false, policy.is_some()),
    );
    report.value(
        "stop grace",
        format!("{} ms", settings.grace.as_millis()),
        source(grace_arg.is_some(), has(|p| p.stop_grace_ms.is_some())),
    );
    report.value(
        "drain timeout",
        format!("{} ms", settings.drain.as_millis()),
        source(drain_arg.is_some(), has(|p| p.drain_timeout_ms.is_some())),
    );
    report.value(
        "probe",
        settings.launch.probe.describe(),
        source(false, has(|p| p.probe.is_some())),
    );
}

/// A dry run's policy: the settings it would run by (a refusal in words), and what a
/// `--policy` would change against the service's kept one.
pub struct PolicyFacts {
    pub settings: Result<Option<RolloutSettings>, String>,
    pub changes: Option<(String, Vec<String>)>,
}

impl PolicyFacts {
    /// From the chosen policy: a given `--policy` is compared with the root's kept one.
    fn of(root: &std::path::Path, chosen: Result<Option<preflight::Chosen>, String>) -> Self {
        let kept = Root::existing(root.to_path_buf()).ok().and_then(|root| {
            crate::host::kept_policy::KeptPolicy::of_live(&root)
                .ok()
                .flatten()
        });
        let changes = match (&chosen, kept) {
            (Ok(Some(chosen)), Some((_, kept))) if chosen.given => Some((
                kept.short_digest().to_string(),
                kept.changes_to(&chosen.kept),
            )),
            _ => None,
        };
        PolicyFacts {
            settings: chosen.map(|c| c.map(|c| c.settings)),
            changes,
        }
    }
}

/// The checks every dry run starts with: the names, and the policy (its refusal as a check).
fn names_and_policy(
    report: &mut Report,
    service: &str,
    version: &str,
    file: Option<&std::path::Path>,
    facts: PolicyFacts,
) -> Option<RolloutSettings> {
    report.policy_changes = facts.changes;
    let policy = facts.settings;
    report.check(
        crate::host::names::check_name("service", service)
            .and_then(|()| crate::host::names::check_name("version", version))
            .map(|()| "service and version names".to_string()),
    );
    match policy {
        Ok(policy) => {
            if let Some(path) = file {
                report.check(Ok::<_, String>(format!(
                    "policy {} passes its contract",
                    path.display()
                )));
            }
            policy
        }
        Err(e) => {
            report.check(Err(e));
            None
        }
    }
}

/// The hooks the run would call (listed, never run by a dry run).
pub fn hook_values(report: &mut Report, hooks: &crate::host::hooks::Hooks) {
    use crate::host::hooks::Hook;
    for hook in [Hook::PreDeploy, Hook::PostPromote, Hook::PostRollback] {
        if let Some(command) = hooks.command(hook) {
            report.value(
                hook.name(),
                format!("{} (limit {} ms)", command.join(" "), hooks.timeout_ms),
                "policy",
            );
        }
    }
}

/// What the release would run — its executable, or its Procfile's `web:` line — and its
/// Procfile's release phase, if it has one (listed, never run by a dry run).
fn what_the_release_runs(
    report: &mut Report,
    root: &std::path::Path,
    version: &str,
    service: &str,
) {
    // The release's own words: escaped before they reach a terminal.
    use crate::host::output::printable;
    use crate::release::procfile::{Procfile, RELEASE_PHASE, WEB};
    let folder = root.join("releases").join(version);
    let procfile = match Procfile::of_release(&folder) {
        Ok(procfile) => procfile,
        Err(e) => return report.check(Err(e)),
    };
    let line = |name: &str| {
        procfile
            .as_ref()
            .and_then(|p| p.types.iter().find(|t| t.name == name))
    };
    report.check(
        preflight::release_executable(root, version, service)
            .map(|(_, path)| match line(WEB) {
                Some(web) => format!(
                    "the release runs its Procfile's web: `{}` (line {})",
                    printable(&web.command),
                    web.line
                ),
                None => format!("release executable {}", path.display()),
            })
            .map_err(|e| e.to_string()),
    );
    if let Some(phase) = line(RELEASE_PHASE) {
        report.value(
            "release phase",
            format!(
                "`{}` (line {}), before anything starts, unless {version} is live already",
                printable(&phase.command),
                phase.line
            ),
            "Procfile",
        );
    }
}

/// A check that the root is free for a deployer now (nobody holds the lock).
pub fn lock_check(root: &Root) -> Result<String, Error> {
    if lock::is_free(&root.lock_path()) {
        Ok("no other deploy or rollout holds the root's lock".into())
    } else {
        Err(refused(format!(
            "another deploy or rollout holds {}",
            root.lock_path().display()
        )))
    }
}

/// What admission would say of the release (signature, floor) without copying anything.
pub fn admission_check(root: &Root, service: &str, version: &str) -> Result<String, Error> {
    match release::would_admit(&root.0, service, version, chrono::Utc::now())? {
        None => Ok("no trust file: releases are not signature-checked".into()),
        Some(signed) => Ok(format!(
            "signed release (sequence {}) verified and above the release floor",
            signed.sequence
        )),
    }
}

/// The release's config as a start would read it: its variables by name, its secrets by name
/// (never a value), refused as the start would refuse it (a line it cannot parse, a secret
/// missing or readable by others).
fn config_check(root: &Root, version: &str, give_service_config: bool) -> Result<String, String> {
    use crate::host::config::{secrets_dir, Config};
    let (config, said) = match give_service_config {
        // What the deploy would give it: its own, else the service's (said with the change
        // from the live one).
        true => {
            let candidate =
                super::config::for_candidate(root, version).map_err(|e| e.to_string())?;
            let said = candidate.said();
            (candidate.config, Some(said))
        }
        false => (
            Config::of_release(&root.release_dir(version)).map_err(|e| e.0)?,
            None,
        ),
    };
    config.resolve(&secrets_dir(&root.0)).map_err(|e| e.0)?;
    if config.variables.is_empty() && config.secrets.is_empty() {
        return Ok(said.unwrap_or_else(|| "no config of its own (no env or secrets file)".into()));
    }
    let names = |keys: Vec<&String>| match keys.as_slice() {
        [] => "none".to_string(),
        keys => keys
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let secrets: Vec<String> = config
        .secrets
        .iter()
        .map(|(key, name)| format!("{key} from secret {name}"))
        .collect();
    Ok(format!(
        "{}config {}: variables {}; secrets {}",
        said.map_or(String::new(), |said| format!("{said}: ")),
        config.digest(),
        names(config.variables.keys().collect()),
        if secrets.is_empty() {
            "none".into()
        } else {
            secrets.join(", ")
        }
    ))
}

/// `rollgate deploy ... --dry-run`: the report, and whether the deploy would be refused.
pub fn deploy(request: &Request) -> (String, bool) {
    let chosen = policy_of(
        &request.root,
        request.policy.as_deref(),
        request.policy_entry.as_deref(),
        &request.service,
        &request.eval,
    );
    let source = chosen
        .as_ref()
        .ok()
        .and_then(|c| c.as_ref().map(|c| c.source().to_path_buf()));
    let policy = PolicyFacts::of(&request.root, chosen);
    refused_or_not(deploy_report(request, policy, source.as_deref()))
}

/// `rollgate rollout ... --dry-run`: the report, and whether the rollout would be refused.
pub fn rollout(request: &RolloutRequest) -> (String, bool) {
    let policy = policy_of(
        &request.root,
        request.policy.as_deref(),
        request.policy_entry.as_deref(),
        &request.service,
        &request.eval,
    );
    refused_or_not(rollout_report(
        request,
        PolicyFacts::of(&request.root, policy),
    ))
}

/// The request's policy entry, checked by the contract, else the one kept in the root (None:
/// the defaults); a refusal is reported, not raised: the dry run goes on to say everything
/// else it can.
fn policy_of(
    root: &std::path::Path,
    policy: Option<&std::path::Path>,
    entry: Option<&str>,
    service: &str,
    eval: &crate::policy::EvalOptions,
) -> Result<Option<preflight::Chosen>, String> {
    preflight::policy_entry(root, policy, entry, service, eval).map_err(|e| e.to_string())
}

fn refused_or_not(report: Result<String, Error>) -> (String, bool) {
    match report {
        Ok(report) => (report, false),
        Err(e) => (e.to_string(), true),
    }
}

fn deploy_report(
    request: &Request,
    policy: PolicyFacts,
    source: Option<&std::path::Path>,
) -> Result<String, Error> {
    let mut report = Report {
        title: format!(
            "deploy {} {} in {}",
            request.service,
            request.version,
            request.root.display()
        ),
        ..Report::default()
    };
    let policy = names_and_policy(
        &mut report,
        &request.service,
        &request.version,
        request.policy.as_deref(),
        policy,
    );
    // Chosen as the deploy would before its recovery (which may free one more of a range).
    let chosen_port = request
        .port
        .resolve(policy.as_ref())
        .and_then(|choice| choice.decide(&Root::new(request.root.clone())));
    let port = match chosen_port {
        Ok(port) => port,
        Err(e) => {
            report.check(Err(e.to_string()));
            return report.finish();
        }
    };
    report.title = format!(
        "deploy {} {} on port {port} in {}",
        request.service,
        request.version,
        request.root.display()
    );
    let settings = request
        .resolve(policy.as_ref())
        .and_then(|s| plan::check_bounds(&s).map(|()| s));
    let settings = match settings {
        Ok(settings) => settings,
        Err(e) => {
            report.check(Err(e));
            return report.finish();
        }
    };
    gate_values(
        &mut report,
        &settings,
        (request.grace_ms, request.drain_ms),
        policy.as_ref(),
    );
    watch_and_output_values(&mut report, request, &settings, policy.as_ref());
    match preflight::policy_hooks(policy.as_ref(), source) {
        Ok(hooks) => hook_values(&mut report, &hooks),
        Err(e) => report.check(Err(e)),
    }
    let root = Root::new(request.root.clone());
    what_the_release_runs(
        &mut report,
        &request.root,
        &request.version,
        &request.service,
    );
    if !root.0.is_dir() {
        return report.finish();
    }
    report.check(lock_check(&root));
    report.check(engine::not_a_replica_set(
        &root,
        &request.service,
        &request.version,
    ));
    let live = root.read_pointer();
    match &live {
        Ok(live) => report.check(engine::beside_the_live(live.as_ref(), port)),
        Err(e) => report.check(Err(e.to_string())),
    }
    // A crash loop's standby is retired before the deploy plans: its port will be free.
    let standby = live
        .as_ref()
        .ok()
        .and_then(Option::as_ref)
        .and_then(|p| p.fallback.as_ref())
        .filter(|f| f.standby && f.port == port);
    report.check(match standby {
        Some(standby) => Ok(format!(
            "port {port} is the crash loop's standby's ({} pid {}): the deploy retires it first",
            standby.version, standby.pid
        )),
        None => engine::port_free(port),
    });
    report.check(admission_check(&root, &request.service, &request.version));
    report.check(config_check(
        &root,
        &request.version,
        request.give_service_config,
    ));
    if let Some(spec) = &settings.launch.listen {
        report.would.push(holder_check(&root, spec));
    }
    if root.candidate_path().exists() {
        report.would.push(format!(
            "first finish what an earlier deploy left ({}): recovery",
            root.candidate_path().display()
        ));
    }
    deploy_would(&mut report, request, port, &settings, live, &root);
    report.finish()
}

/// The watch and the output bounds a deploy would run by, with where each came from.
fn watch_and_output_values(
    report: &mut Report,
    request: &Request,
    settings: &Settings,
    policy: Option<&RolloutSettings>,
) {
    report.value(
        "watch",
        format!(
            "{} ms, switching back after {} failed probes in a row",
            settings.watch.as_millis(),
            settings.watch_failures
        ),
        source(
            request.watch_ms.is_some(),
            policy.is_some_and(|p| p.watch_ms.is_some()),
        ),
    );
    report.value(
        "output",
        format!(
            "rotated at {} bytes, {} files kept",
            settings.output.max_bytes, settings.output.keep
        ),
        source(
            false,
            policy.is_some_and(|p| p.output_max_bytes.is_some() || p.output_keep.is_some()),
        ),
    );
    if let Some(spec) = &settings.launch.listen {
        report.value(
            "listen",
            format!(
                "{} (backlog {}), handed to the release as fd 3",
                spec.address, spec.backlog
            ),
            "policy",
        );
    }
    report.value(
        "confinement",
        confinement_words(settings),
        source(false, policy.is_some_and(|p| p.isolation.is_some())),
    );
    if !settings.launch.unconfined {
        report.value(
            "runs as",
            crate::host::account::planned(&request.root, settings.launch.user.as_deref()),
            source(false, settings.launch.user.is_some()),
        );
    }
}

/// How the release would be confined, in words: what it runs without, where its tree would be,
/// its limits, and what this host cannot hold.
fn confinement_words(settings: &Settings) -> String {
    if settings.launch.unconfined {
        return "NONE: isolation.enabled = false, it runs with rollgate's own privileges".into();
    }
    let tree = match crate::host::cgroup::base() {
        Some(base) => format!("its own process tree under {}", base.display()),
        None => "its process group (no writable cgroup v2 hierarchy here)".into(),
    };
    let l = &settings.launch.limits;
    let mut limits: Vec<String> = Vec::new();
    if let Some(mb) = l.memory_mb {
        limits.push(format!("memory {mb} MiB"));
    }
    if let Some(pids) = l.pids {
        limits.push(format!("{pids} processes"));
    }
    if let Some(pct) = l.cpu_pct {
        limits.push(format!("{pct} % of a core"));
    }
    if let Some(files) = l.nofile {
        limits.push(format!("{files} open files"));
    }
    let unheld = l.unheld();
    format!(
        "no new privileges, no capability, no supplementary group; {}; {tree}; limits: {}{}",
        crate::host::filesystem::describe(),
        if limits.is_empty() {
            "none".to_string()
        } else {
            limits.join(", ")
        },
        if unheld.is_empty() {
            String::new()
        } else {
            format!(" (NOT held on this host: {})", unheld.join(", "))
        }
    )
}

/// Who holds the root's socket, or that a holder would be started (binding the address).
fn holder_check(root: &Root, spec: &crate::host::listen::Spec) -> String {
    use crate::host::listen;
    match listen::holder_record(&root.0) {
        Some(holder)
            if crate::host::identity::Identity {
                pid: holder.pid,
                start_time: holder.start_time,
            }
            .is_running() =>
        {
            format!(
                "the socket on {} is held by pid {} ({})",
                holder.address, holder.pid, holder.origin
            )
        }
        _ => format!(
            "no holder runs: one would be started, binding {} (or taking a live release's copy)",
            spec.address
        ),
    }
}

/// What the deploy would do: start the candidate, gate it, then switch or roll back.
fn deploy_would(
    report: &mut Report,
    request: &Request,
    port: u16,
    settings: &Settings,
    live: Result<Option<crate::host::state::Pointer>, crate::host::fault::Fault>,
    root: &Root,
) {
    let how = match settings.launch.probe.is_notify() {
        true => format!("wait for {}", settings.launch.probe.describe()),
        false => format!(
            "probe it every {} ms ({})",
            settings.poll.as_millis(),
            settings.launch.probe.describe()
        ),
    };
    report.would.push(format!(
        "start {} {} on port {} beside the live release, {how} for at most {} ms",
        request.service,
        request.version,
        port,
        settings.deadline.as_millis()
    ));
    let previous = match live {
        Ok(Some(live)) if !settings.watch.is_zero() => format!(
            "then drain {v} and watch the new release for {} ms with {v} kept running: switch back if it fails, else stop {v} (grace {} ms)",
            settings.watch.as_millis(),
            settings.grace.as_millis(),
            v = live.version,
        ),
        Ok(Some(live)) => format!(
            "then drain and stop {} (grace {} ms)",
            live.version,
            settings.grace.as_millis()
        ),
        _ => "as the first live release".into(),
    };
    report.would.push(format!(
        "when ready: switch {} to it, {previous}; otherwise {}",
        root.pointer_path().display(),
        match settings.on_stall {
            crate::policy::OnStall::Escalate => {
                "roll back (a stall at the deadline escalates to a person instead)"
            }
            crate::policy::OnStall::Rollback => "roll back and keep the live release",
        }
    ));
}

fn rollout_report(request: &RolloutRequest, policy: PolicyFacts) -> Result<String, Error> {
    use crate::engine::settings;
    let mut report = Report {
        title: format!(
            "rollout {} {} in {}",
            request.service,
            request.version,
            request.root.display()
        ),
        ..Report::default()
    };
    let policy = names_and_policy(
        &mut report,
        &request.service,
        &request.version,
        request.policy.as_deref(),
        policy,
    );
    what_the_release_runs(
        &mut report,
        &request.root,
        &request.version,
        &request.service,
    );
    let root = Root::new(request.root.clone());
    if !root.0.is_dir() {
        return report.finish();
    }
    report.check(lock_check(&root));
    let previous = match engine::saved_run(&root) {
        Ok(previous) => previous,
        Err(e) => {
            report.check(Err(e));
            None
        }
    };
    if let Some(p) = previous.as_ref().filter(|p| !p.is_over()) {
        report.check(Err(format!(
            "rollout {} of {} to {} is unfinished; one rollout at a time",
            p.id, p.service, p.to
        )));
    }
    let baseline = match settings::baseline(&root, &request.service) {
        Ok(baseline) => baseline,
        Err(e) => {
            report.check(Err(e));
            return report.finish();
        }
    };
    let resolved =
        match settings::resolve(&request.args, policy.as_ref(), previous.as_ref(), &baseline) {
            Ok(resolved) => resolved,
            Err(e) => {
                report.check(Err(e));
                return report.finish();
            }
        };
    let args = &request.args;
    rollout_values(
        &mut report,
        args,
        policy.as_ref(),
        &resolved,
        baseline.is_empty(),
    );
    match plan::resolve(
        args.deadline_ms,
        args.grace_ms,
        args.drain_ms,
        policy.as_ref(),
    ) {
        Ok(gate) => gate_values(
            &mut report,
            &gate,
            (args.grace_ms, args.drain_ms),
            policy.as_ref(),
        ),
        Err(e) => report.check(Err(e)),
    }
    report.check(ports_free(resolved.settings.ports, resolved.settings.surge));
    report.check(admission_check(&root, &request.service, &request.version));
    if let Some(analysis) = &resolved.settings.analysis {
        report.value(
            "analysis",
            analysis.describe(resolved.settings.soak_ms),
            "policy",
        );
        report.check(engine::proxy_counts(&root).map(|proxy| {
            format!(
                "a rollgate proxy (pid {proxy}) serves the root: the analysis can read its counts"
            )
        }));
    }
    match settings::plan(
        &request.service,
        &request.version,
        &resolved,
        &baseline,
        0.0,
    ) {
        None => report.would.push(format!(
            "nothing: every replica already runs {}",
            request.version
        )),
        Some(planned) => planned_moves(&mut report, &planned),
    }
    report.finish()
}

/// The numbers a rollout would run by, each with where it came from: the same resolved
/// settings the real run plans from.
fn rollout_values(
    report: &mut Report,
    args: &crate::engine::settings::Args,
    policy: Option<&RolloutSettings>,
    resolved: &crate::engine::settings::Resolved,
    first_install: bool,
) {
    let has = |f: fn(&RolloutSettings) -> bool| policy.is_some_and(f);
    let s = &resolved.settings;
    report.value(
        "replicas",
        s.replicas.to_string(),
        match (args.replicas.is_some(), has(|p| p.replicas.is_some())) {
            (false, false) if !first_install => "the pool as it is",
            (a, p) => source(a, p),
        },
    );
    report.value(
        "surge",
        format!("{} process(es) beside the pool", s.surge),
        source(false, policy.is_some()),
    );
    report.value(
        "unavailable",
        format!("{} replica(s) out of the pool at once", s.unavailable),
        source(false, policy.is_some()),
    );
    report.value(
        "waves",
        s.wave_percents
            .iter()
            .map(|p| format!("{p}%"))
            .collect::<Vec<_>>()
            .join(", "),
        source(args.waves.is_some(), has(|p| p.waves.is_some())),
    );
    report.value(
        "soak",
        format!("{} ms", s.soak_ms),
        source(args.soak_ms.is_some(), has(|p| p.soak_ms.is_some())),
    );
    report.value(
        "watch",
        if s.watch_ms == 0 && first_install {
            "none (a first install has nothing to go back to)".to_string()
        } else {
            format!("{} ms after the last wave", s.watch_ms)
        },
        source(args.watch_ms.is_some(), has(|p| p.watch_ms.is_some())),
    );
    report.value(
        "min ready",
        format!("{} ms", s.min_ready_ms),
        source(false, has(|p| p.min_ready_ms.is_some())),
    );
    report.value(
        "max failure ratio",
        s.max_failure_ratio.to_string(),
        source(false, has(|p| p.max_failure_ratio.is_some())),
    );
    report.value(
        "release deadline",
        format!("{} ms", (s.release_deadline * 1000.0).round() as u64),
        source(false, has(|p| p.release_deadline_ms.is_some())),
    );
    report.value(
        "ports",
        format!("{}-{}", s.ports.0, s.ports.1),
        if args.ports.is_some() {
            "command line"
        } else {
            "the previous rollout"
        },
    );
    if !resolved.classes.is_empty() {
        report.value(
            "classes",
            resolved
                .classes
                .iter()
                .map(|(slot, class)| {
                    let name = serde_json::to_value(class).unwrap_or_default();
                    format!("{slot}: {}", name.as_str().unwrap_or("?"))
                })
                .collect::<Vec<_>>()
                .join(", "),
            "policy",
        );
    }
}

/// Enough free ports in the rollout's range for the processes it starts at once.
fn ports_free(ports: (u16, u16), surge: usize) -> Result<String, String> {
    let free = (ports.0..=ports.1)
        .filter(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .count();
    let needed = surge.max(1);
    if free >= needed {
        Ok(format!(
            "{free} free port(s) in {}-{} (at least {needed} needed at once)",
            ports.0, ports.1
        ))
    } else {
        Err(format!(
            "only {free} free port(s) in {}-{}; at least {needed} needed at once",
            ports.0, ports.1
        ))
    }
}

/// What the planned rollout would move, wave by wave, and what it leaves or scales down.
fn planned_moves(report: &mut Report, planned: &crate::engine::Rollout) {
    use crate::engine::SlotState;
    report.would.push(format!(
        "move {} replica(s) from {} to {}",
        planned.waves.iter().map(Vec::len).sum::<usize>(),
        planned.from.as_deref().unwrap_or("nothing"),
        planned.to
    ));
    for (k, wave) in planned.waves.iter().enumerate() {
        let slots: Vec<String> = wave.iter().map(usize::to_string).collect();
        report.would.push(format!(
            "wave {k}{}: slot(s) {}",
            if k == 0 { " (canary)" } else { "" },
            slots.join(", ")
        ));
    }
    let kept: Vec<String> = planned
        .slots
        .iter()
        .filter(|slot| matches!(slot.state, SlotState::Skipped | SlotState::LeftBehind))
        .map(|slot| format!("{} ({:?})", slot.slot, slot.state).to_lowercase())
        .collect();
    if !kept.is_empty() {
        report
            .would
            .push(format!("leave as they are: {}", kept.join(", ")));
    }
    let surplus: Vec<String> = planned
        .slots
        .iter()
        .filter(|slot| slot.state == SlotState::Surplus)
        .map(|slot| slot.slot.to_string())
        .collect();
    if !surplus.is_empty() {
        report.would.push(format!(
            "first scale down to {} replicas: drain and stop slot(s) {}",
            planned.settings.replicas,
            surplus.join(", ")
        ));
    }
}
