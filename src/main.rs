//! rollgate: a release proves itself before it goes live. See README.md.

mod cli;

use rollgate::commands::{demo, deploy, escalation, rollback, rollout, status, up, watch};
use rollgate::engine::{control, settings};
use rollgate::error::DeployError;
use rollgate::{fleet, log, policy, proxy, release, sample};

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use cli::{
    Cli, Command, EvalArgs, FleetCommand, LogCommand, PolicyCommand, ReadArgs, ReleaseCommand,
    RolloutArgs, RolloutCommand,
};
use policy::EvalOptions;

/// A fleet command's error: a refused policy in Nickel's words, else one line.
fn fleet_failed(error: fleet::FleetError) -> ExitCode {
    match error {
        fleet::FleetError::Policy(e) => {
            eprint!("{}", render_error(&e));
            ExitCode::from(1)
        }
        e => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn run_fleet(command: FleetCommand) -> ExitCode {
    match command {
        FleetCommand::Playbook {
            policy,
            entry,
            service,
            version,
            group,
            hosts,
            rollgate,
            eval,
        } => {
            let request = fleet::PlaybookRequest {
                policy: &policy,
                entry: entry.as_deref(),
                service: &service,
                version: &version,
                group: &group,
                hosts,
                rollgate: &rollgate,
            };
            match fleet::playbook(&request, &eval_options(eval)) {
                Ok(text) => {
                    print(&text);
                    ExitCode::SUCCESS
                }
                Err(e) => fleet_failed(e),
            }
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Policy(command) => run_policy(command),
        Command::Log(command) => run_log(command),
        Command::Release(command) => run_release(command),
        Command::Fleet(command) => run_fleet(command),
        Command::Deploy {
            service,
            new_port,
            new_version,
            deadline_ms,
            target,
            policy,
            policy_entry,
            grace_ms,
            drain_timeout_ms,
            watch_ms,
            no_wait,
            dry_run,
            eval,
        } => {
            let request = deploy::Request {
                service,
                port: new_port,
                version: new_version,
                deadline_ms,
                root: target.root,
                policy,
                policy_entry,
                grace_ms,
                drain_ms: drain_timeout_ms,
                watch_ms,
                no_wait,
                eval: eval_options(eval),
            };
            if dry_run {
                report_dry_run(deploy::dry_run(&request))
            } else {
                finish_deploy(deploy::deploy(request))
            }
        }
        Command::Rollout(args) => run_rollout(args),
        Command::Rollback {
            service,
            target,
            port,
            policy,
            policy_entry,
            grace_ms,
            drain_timeout_ms,
            watch_ms,
            eval,
        } => {
            let eval = eval_options(eval);
            match rollback::replica_target(&target.root, &service) {
                Err(e) => finish_deploy(Err(e)),
                Ok(Some((current, earlier))) => {
                    eprintln!("rollgate: rolling {service}'s replicas back from {current} to {earlier} (the release live before it), through the gate");
                    let request = rollout::Request {
                        service,
                        version: earlier,
                        root: target.root,
                        policy,
                        policy_entry,
                        eval,
                        args: settings::Args {
                            grace_ms,
                            drain_ms: drain_timeout_ms,
                            ..Default::default()
                        },
                    };
                    finish_rollout(rollout::rollout(request))
                }
                Ok(None) => finish_deploy(rollback::rollback(rollback::RollbackRequest {
                    service: service.clone(),
                    root: target.root.clone(),
                    port,
                    deploy: deploy::Request {
                        service,
                        port: 0,
                        version: String::new(),
                        deadline_ms: None,
                        root: target.root,
                        policy,
                        policy_entry,
                        grace_ms,
                        drain_ms: drain_timeout_ms,
                        watch_ms,
                        no_wait: false,
                        eval,
                    },
                })),
            }
        }
        Command::Up {
            target,
            supervise,
            ready_ms,
            max_restarts,
            backoff_ms,
        } => answer(
            up::up(up::Options {
                root: target.root,
                supervise,
                ready: Duration::from_millis(ready_ms.min(24 * 3600 * 1000)),
                max_restarts,
                backoff: Duration::from_millis(backoff_ms.min(60_000)),
            }),
            |e| e.exit_code(),
        ),
        Command::Watch {
            service,
            token,
            target,
        } => finish_deploy(watch::run_watcher(&service, target.root, &token)),
        Command::Promote { service, target } => {
            finish_deploy(escalation::finish_escalated(&service, target.root, true))
        }
        Command::Abort { service, target } => {
            finish_deploy(escalation::finish_escalated(&service, target.root, false))
        }
        Command::Status { target, format } => {
            answer(status::status(target.root, format), |e| e.exit_code())
        }
        Command::SampleService(args) => sample::run(args),
        Command::Proxy {
            listen,
            target,
            version_header,
            max_connections,
            header_read_timeout_ms,
            max_header_bytes,
            threads,
            body_idle_timeout_ms,
            tunnel_idle_timeout_ms,
            trust_forwarded,
        } => answer(
            proxy::run(proxy::Options {
                listen,
                root: target.root,
                version_header,
                max_connections: max_connections as usize,
                header_read_timeout: Duration::from_millis(header_read_timeout_ms),
                max_header_bytes: max_header_bytes as usize,
                upstream_idle: Duration::from_secs(30),
                threads: threads.map(usize::from),
                body_idle: Duration::from_millis(body_idle_timeout_ms),
                tunnel_idle: Duration::from_millis(tunnel_idle_timeout_ms),
                trust_forwarded,
            })
            .map(|()| String::new()),
            |_| 1,
        ),
        Command::Demo { root } => answer(demo::run(root).map(|()| String::new()), |_| 1),
        Command::Completions { shell } => {
            // Into memory first: a reader that goes away (`| head`) must not make it panic.
            let mut definition = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut definition, "rollgate", &mut script);
            answer::<String>(Ok(String::from_utf8_lossy(&script).into_owned()), |_| 1)
        }
        Command::Man => {
            let page = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
            let mut roff = Vec::new();
            let rendered = page
                .render(&mut roff)
                .map(|()| String::from_utf8_lossy(&roff).into_owned());
            answer(rendered, |_| 1)
        }
    }
}

/// Prints a command's answer, or its error with the exit code the error calls for.
fn answer<E: std::fmt::Display>(result: Result<String, E>, code: impl Fn(&E) -> u8) -> ExitCode {
    match result {
        Ok(text) => {
            print(&text);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(code(&e))
        }
    }
}

/// Colour only for a person at a terminal, and never when NO_COLOR is set (no-color.org).
fn stderr_color() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `rollgate release ...`: exit 0, 1 when refused or failed (the reason first), 2 on usage.
fn run_release(command: ReleaseCommand) -> ExitCode {
    let now = chrono::Utc::now();
    let result = match command {
        ReleaseCommand::Keygen { out } => release::keys::generate(&out).map(|(pin, public)| {
            format!(
                "{pin}\nkey: {} (keep it offline)\npublic key: {}\n",
                out.display(),
                public.display()
            )
        }),
        ReleaseCommand::Sign {
            dir,
            service,
            version,
            sequence,
            expires,
            key,
            cosigners,
        } => release::parse_duration(&expires).and_then(|expires_in| {
            release::sign(&release::SignRequest {
                dir: &dir,
                service: &service,
                version: &version,
                sequence,
                expires_in,
                key: &key,
                cosigners: &cosigners,
                now,
            })
            .map(|path| format!("signed: {}\n", path.display()))
        }),
        ReleaseCommand::Cosign { manifest, key } => release::cosign(&manifest, &key)
            .map(|kid| format!("cosigned by {kid}: {}\n", manifest.display())),
        ReleaseCommand::Verify {
            manifest,
            pins,
            threshold,
            dir,
            service,
            at,
        } => {
            let trust = release::Trust { pins, threshold };
            let at = match at.as_deref().map(release::parse_time).transpose() {
                Ok(at) => at.unwrap_or(now),
                Err(e) => {
                    eprintln!("error: --at: {e}");
                    return ExitCode::from(2);
                }
            };
            if let Err(e) = trust.check() {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
            release::verify(&manifest, &trust, at, service.as_deref(), dir.as_deref())
                .map(|v| {
                    format!(
                        "verified: {} {} sequence {} (manifest sha256 {})\n",
                        v.body.service, v.body.version, v.body.sequence, v.manifest_sha256
                    )
                })
                .map_err(|refusal| format!("refused: {refusal}"))
        }
    };
    answer(result, |_| 1)
}

fn eval_options(args: EvalArgs) -> EvalOptions {
    EvalOptions {
        import_paths: args.import_paths,
        timeout: Duration::from_millis(args.timeout_ms),
        max_file_bytes: args.max_file_bytes,
        color: stderr_color(),
        allow_import_anywhere: args.allow_import_anywhere,
    }
}

/// A dry run's report on stdout; exit 0 if it would go ahead, 2 if it would be refused.
fn report_dry_run((report, refused): (String, bool)) -> ExitCode {
    print(&report);
    ExitCode::from(if refused { 2 } else { 0 })
}

fn finish_deploy(result: Result<deploy::DeployOutcome, DeployError>) -> ExitCode {
    match result {
        Ok(outcome) => {
            let line = match outcome {
                deploy::DeployOutcome::Promoted => "promoted",
                deploy::DeployOutcome::RolledBack => "rolled back (see deploy.log for why)",
                deploy::DeployOutcome::Escalated => "escalated: left running, not promoted; run `rollgate promote` or `rollgate abort`",
                deploy::DeployOutcome::Aborted => "aborted: candidate stopped, logged as rolled_back",
                deploy::DeployOutcome::Watching(pid) => {
                    eprintln!("rollgate: switched; watcher pid {pid} finishes the watch (promoted or switched back); see `rollgate status`");
                    return ExitCode::SUCCESS;
                }
            };
            eprintln!("rollgate: {line}");
            ExitCode::from(outcome.exit_code())
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// `rollgate rollout ...`: the outcome on stdout, exit 0/1/3 as the outcome says, 2 refused.
fn run_rollout(args: RolloutArgs) -> ExitCode {
    use control::Ask;
    let result = match args.command {
        Some(RolloutCommand::Status {
            service,
            target,
            format,
        }) => {
            return answer(rollout::status(&service, target.root, format), |e| {
                e.exit_code()
            })
        }
        Some(RolloutCommand::Pause {
            service,
            target,
            reason,
        }) => rollout::control(&service, target.root, Ask::Pause, reason, false),
        Some(RolloutCommand::Resume { service, target }) => {
            rollout::control(&service, target.root, Ask::Resume, None, false)
        }
        Some(RolloutCommand::Abort {
            service,
            target,
            reason,
            rollback,
        }) => rollout::control(&service, target.root, Ask::Abort, reason, rollback),
        None if args.dry_run => match rollout_request(args) {
            Ok(request) => return report_dry_run(rollout::dry_run(&request)),
            Err(e) => Err(e),
        },
        None => rollout_request(args).and_then(rollout::rollout),
    };
    finish_rollout(result)
}

/// A rollout command's outcome on stdout, exit 0/1/3 as it says; an error on stderr, exit 2.
fn finish_rollout(result: Result<rollout::RolloutOutcome, DeployError>) -> ExitCode {
    match result {
        Ok(outcome) => {
            println!("{}", outcome.message());
            ExitCode::from(outcome.exit_code())
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn rollout_request(args: RolloutArgs) -> Result<rollout::Request, DeployError> {
    use settings::{parse_ports, parse_wait, parse_waves};
    let usage = DeployError::Refused;
    let soak_ms = args
        .soak
        .as_deref()
        .map(parse_wait)
        .transpose()
        .map_err(|e| usage(format!("--soak: {e}")))?;
    Ok(rollout::Request {
        service: args.service.unwrap_or_default(),
        version: args.version.unwrap_or_default(),
        root: args.target.root,
        policy: args.policy,
        policy_entry: args.policy_entry,
        eval: eval_options(args.eval),
        args: settings::Args {
            replicas: args.replicas.map(|n| n as usize),
            ports: args
                .ports
                .as_deref()
                .map(parse_ports)
                .transpose()
                .map_err(|e| usage(format!("--ports: {e}")))?,
            waves: args
                .waves
                .as_deref()
                .map(parse_waves)
                .transpose()
                .map_err(|e| usage(format!("--waves: {e}")))?,
            soak_ms,
            deadline_ms: args.deadline_ms,
            grace_ms: args.grace_ms,
            drain_ms: args.drain_timeout_ms,
            watch_ms: args.watch_ms,
        },
    })
}

/// Writes to stdout; a closed pipe (`| head`) is not an error worth a panic.
fn print(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|_| out.flush());
}

fn run_policy(command: PolicyCommand) -> ExitCode {
    match command {
        PolicyCommand::Export {
            file,
            format,
            strict,
            image,
            port,
            eval,
        } => {
            if let Some(engine) = fleet::export::Engine::of(format) {
                let workload = fleet::export::Workload {
                    image,
                    port,
                    strict,
                };
                return match fleet::export::export(&file, engine, &workload, &eval_options(eval)) {
                    Ok(exported) => {
                        print(&exported.text);
                        for what in exported.lost {
                            eprintln!("not expressed in {}: {what}", engine.name());
                        }
                        ExitCode::SUCCESS
                    }
                    Err(e) => fleet_failed(e),
                };
            }
            match policy::export(&file, format, &eval_options(eval)) {
                Ok(text) => {
                    print(&text);
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprint!("{}", render_error(&e));
                    ExitCode::from(1)
                }
            }
        }
        PolicyCommand::Check {
            files,
            format,
            eval,
        } => {
            let outcomes = policy::check::check_files(&files, &eval_options(eval));
            let (report, all_ok) = policy::check::render(&outcomes, format);
            print(&report);
            ExitCode::from(if all_ok { 0 } else { 1 })
        }
        PolicyCommand::Contract => {
            print(policy::ROLLOUT_POLICY_NCL);
            ExitCode::SUCCESS
        }
    }
}

/// Nickel diagnostics are printed byte for byte as `nickel export` prints them (they start with
/// `error:` and end with a blank line); other errors get the prefix here.
fn render_error(e: &policy::PolicyError) -> String {
    match e {
        policy::PolicyError::Nickel(d) => d.rendered.clone(),
        other => format!("error: {other}\n"),
    }
}

fn reading(args: ReadArgs) -> Result<log::Reading, log::LogError> {
    let time = |t: Option<String>| {
        t.map(|t| rollgate::render::time::parse_time(&t).map_err(log::LogError::Usage))
            .transpose()
    };
    Ok(log::Reading {
        strict: args.strict,
        selection: log::Selection {
            since: time(args.since)?,
            until: time(args.until)?,
            version: args.only_version,
        },
        everything: false,
        release_fields: false,
        rollout_fields: false,
        columns: None,
    })
}

fn run_log(command: LogCommand) -> ExitCode {
    let result = match command {
        LogCommand::Summary {
            logs,
            merge,
            query,
            eval,
            format,
            read,
        } => {
            let eval = eval_options(eval);
            reading(read)
                .and_then(|r| {
                    log::summary(
                        &logs,
                        merge,
                        format,
                        &r,
                        query.as_deref().map(|q| (q, &eval)),
                    )
                })
                .map(log::Answer::Text)
        }
        LogCommand::History {
            logs,
            at,
            format,
            read,
        } => reading(read).and_then(|r| match at {
            Some(at) => rollgate::render::time::parse_time(&at)
                .map_err(log::LogError::Usage)
                .and_then(|at| log::live_at(&logs, at, format, &r))
                .map(log::Answer::Text),
            None => log::history(&logs, format, &r),
        }),
        LogCommand::Stats { logs, format, read } => reading(read)
            .and_then(|r| log::stats(&logs, format, &r))
            .map(log::Answer::Text),
        LogCommand::Query {
            logs,
            sql,
            format,
            read,
        } => reading(read).and_then(|r| log::query(&logs, &sql, format, &r)),
    };
    if let Err(log::LogError::Nickel(diagnostic)) = &result {
        // Nickel's diagnostic carries its own `error:` heading.
        eprintln!("{diagnostic}");
        return ExitCode::from(1);
    }
    // Rows are written as they are rendered; a reader that went away (`| head`) ends it.
    let written = result.map(|answer| {
        let mut out = std::io::stdout().lock();
        let _ = answer.write_to(&mut out).and_then(|()| out.flush());
        String::new()
    });
    answer(written, |e| match e {
        log::LogError::Usage(_) => 2,
        _ => 1,
    })
}
