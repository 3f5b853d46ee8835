//! rollgate: a release proves itself before it goes live. See README.md.

mod cli;

use rollgate::commands::{console, demo, deploy, rollback, rollout, status, up};
use rollgate::engine::settings;
use rollgate::engine::{self, Ask, Outcome};
use rollgate::error::{self, Error};
use rollgate::render::table::Layout;
use rollgate::{fleet, log, policy, proxy, release, sample, webhooks};

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use cli::{
    Cli, Command, ConfigCommand, EvalArgs, FleetCommand, LogCommand, PolicyCommand, ReadArgs,
    ReleaseCommand, RolloutArgs, RolloutCommand, SecretCommand, WebhooksCommand,
};
use policy::EvalOptions;

/// `rollgate webhooks ...`.
fn run_webhooks(command: WebhooksCommand) -> Result<u8, Error> {
    let root = |target: cli::RootArgs| {
        rollgate::host::state::Root::existing(target.root).map_err(Error::from)
    };
    match command {
        WebhooksCommand::Send { target } => {
            let pass = webhooks::send_pass(&root(target)?)?;
            if pass.skipped {
                eprintln!("rollgate: another sender holds the webhooks' lock; nothing sent");
            }
            printed(format!(
                "{} delivered, {} failed\n",
                pass.delivered, pass.failed
            ))
        }
        WebhooksCommand::Deliveries { target, format } => printed(webhooks::render_deliveries(
            &webhooks::deliveries(&root(target)?),
            format,
        )),
        WebhooksCommand::Redeliver { id, target } => {
            let attempts = webhooks::redeliver(&root(target)?, &id)?;
            let lines: String = attempts
                .iter()
                .map(|a| {
                    format!(
                        "{} {}: {}\n",
                        a.endpoint,
                        a.id,
                        a.error.clone().unwrap_or_else(|| "delivered".into())
                    )
                })
                .collect();
            print(&lines);
            Ok(if attempts.iter().all(|a| a.ok) {
                error::SUCCESS
            } else {
                error::FAILED
            })
        }
    }
}

fn run_fleet(command: FleetCommand) -> Result<u8, Error> {
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
            printed(fleet::playbook(&request, &eval_options(eval))?)
        }
    }
}

/// `rollgate listen-exec`: the release's environment says that fd 3 is its socket and that it
/// is meant for this very process, then the release replaces it (same pid).
fn listen_exec(name: &str, program: &[std::ffi::OsString]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let Some((executable, args)) = program.split_first() else {
        return ExitCode::from(error::REFUSED);
    };
    let error = std::process::Command::new(executable)
        .args(args)
        .env("LISTEN_FDS", "1")
        .env("LISTEN_PID", std::process::id().to_string())
        .env("LISTEN_FDNAMES", name)
        .exec();
    eprintln!(
        "rollgate listen-exec: cannot start {}: {error}",
        executable.to_string_lossy()
    );
    ExitCode::from(127)
}

/// mimalloc for every command (see Cargo.toml): the proxy's hot path allocates per request.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        // The test releases' own program, with exit statuses of its own.
        Command::SampleService(args) => sample::run(args),
        // A release's output pump: no runtime, no thread, nothing on stdout.
        Command::OutputPump {
            max_bytes,
            keep,
            file,
        } => {
            let rotation = rollgate::host::output::Rotation { max_bytes, keep };
            // Its stdout is FILE, opened and locked by the rollgate that started it.
            let first = rollgate::host::output::stdout_if_it_is(&file);
            match rollgate::host::output::pump(&file, rotation, std::io::stdin().lock(), first) {
                Ok(()) => ExitCode::SUCCESS,
                Err(_) => ExitCode::from(error::FAILED),
            }
        }
        // A release's start with its held socket: no runtime, only the exec.
        Command::ListenExec { name, program } => listen_exec(&name, &program),
        command => match run(command) {
            Ok(code) => ExitCode::from(code),
            Err(error) => {
                eprint!("{}", error.render());
                ExitCode::from(error.code())
            }
        },
    }
}

/// Runs one command; what it answers is printed as it goes. `Ok` is the exit code of how it
/// ended (an outcome: promoted, rolled back, paused...), `Err` what went wrong.
// About 100 lines on purpose: one arm per command, each only unpacking clap's words into one
// call (the longer ones are functions of their own).
fn run(command: Command) -> Result<u8, Error> {
    match command {
        Command::Policy(command) => run_policy(command),
        Command::Log(command) => run_log(command),
        Command::Release(command) => run_release(command),
        Command::Fleet(command) => run_fleet(command),
        Command::Webhooks(command) => run_webhooks(command),
        Command::Config(command) => run_config(command),
        Command::Secret(command) => run_secret(command),
        Command::Deploy(args) => run_deploy(args),
        Command::Rollout(args) => run_rollout(args),
        Command::Rollback(args) => run_rollback(args),
        Command::Up {
            target,
            supervise,
            ready_ms,
            max_restarts,
            backoff_ms,
        } => printed(up::up(up::Options {
            root: target.root,
            supervise,
            ready: Duration::from_millis(ready_ms.min(24 * 3600 * 1000)),
            max_restarts,
            backoff: Duration::from_millis(backoff_ms.min(60_000)),
        })?),
        Command::Watch {
            service,
            token,
            target,
        } => Ok(ended(engine::watch(target.root, &service, &token)?)),
        Command::Promote { service, target } => {
            Ok(ended(engine::ask(target.root, &service, Ask::Accept)?))
        }
        Command::Abort { service, target } => {
            Ok(ended(engine::ask(target.root, &service, Ask::Reject)?))
        }
        Command::Status {
            target,
            format,
            wide,
        } => printed(status::status(
            target.root,
            format,
            Layout::of_stdout(wide),
        )?),
        Command::Hold {
            target,
            listen,
            backlog,
        } => rollgate::commands::hold::run(&target.root, listen, backlog),
        Command::SampleService(_) | Command::OutputPump { .. } | Command::ListenExec { .. } => {
            unreachable!("run by main before the commands")
        }
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
            metrics_listen,
            no_counting,
        } => {
            proxy::run(proxy::Options {
                listen,
                root: target.root,
                version_header,
                max_connections: max_connections as usize,
                header_read_timeout: Duration::from_millis(header_read_timeout_ms),
                max_header_bytes: max_header_bytes as usize,
                threads: threads.map(usize::from),
                body_idle: Duration::from_millis(body_idle_timeout_ms),
                tunnel_idle: Duration::from_millis(tunnel_idle_timeout_ms),
                trust_forwarded,
                metrics_listen,
                counting: !no_counting,
            })?;
            Ok(error::SUCCESS)
        }
        Command::Console {
            roots,
            listen,
            read_only,
        } => {
            console::run(console::Options {
                roots,
                listen,
                read_only,
            })?;
            Ok(error::SUCCESS)
        }
        Command::Demo { root } => {
            demo::run(root)?;
            Ok(error::SUCCESS)
        }
        Command::Completions { shell } => {
            // Into memory first: a reader that goes away (`| head`) must not make it panic.
            let mut definition = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut definition, "rollgate", &mut script);
            printed(String::from_utf8_lossy(&script).into_owned())
        }
        Command::Man => {
            let page = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
            let mut roff = Vec::new();
            page.render(&mut roff)
                .map_err(|e| Error::Failed(format!("cannot render the man page: {e}")))?;
            printed(String::from_utf8_lossy(&roff).into_owned())
        }
    }
}

/// `rollgate deploy`: the request from its words, then the dry run's report or the deploy.
fn run_deploy(args: cli::DeployArgs) -> Result<u8, Error> {
    let cli::DeployArgs {
        service,
        positional,
        ports,
        target,
        gate,
        no_wait,
        dry_run,
    } = args;
    let asked = deploy::Positional::parse(&positional)?;
    let deadline_ms = match (asked.deadline_ms, gate.deadline_ms) {
        (Some(_), Some(_)) => {
            return Err(Error::Refused(
                "the deadline is given twice (DEADLINE_MS and --deadline-ms): give it once".into(),
            ))
        }
        (positional, flag) => positional.or(flag),
    };
    let port = match asked.port {
        Some(port) => deploy::PortAsked::Given(port),
        None => deploy::PortAsked::from_range(
            ports,
            format!(
                "no port for {}: give `rollgate deploy {service} PORT {}`, --ports A-B or a policy with `ports` (rollgate picks the one that is not live)",
                asked.version, asked.version
            ),
        ),
    };
    let request = deploy::Request {
        service,
        port,
        version: asked.version,
        deadline_ms,
        root: target.root,
        policy: gate.policy,
        policy_entry: gate.policy_entry,
        grace_ms: gate.grace_ms,
        drain_ms: gate.drain_timeout_ms,
        watch_ms: gate.watch_ms,
        no_wait,
        eval: eval_options(gate.eval),
    };
    if dry_run {
        Ok(report_dry_run(deploy::dry_run(&request)))
    } else {
        Ok(ended(deploy::deploy(request)?))
    }
}

/// `rollgate rollback`: a replica root rolls back with a rollout, any other with a deploy.
fn run_rollback(args: cli::RollbackArgs) -> Result<u8, Error> {
    let cli::RollbackArgs {
        service,
        target,
        port,
        ports,
        gate,
    } = args;
    let cli::GateArgs {
        policy,
        policy_entry,
        deadline_ms,
        grace_ms,
        drain_timeout_ms,
        watch_ms,
        eval,
    } = gate;
    let eval = eval_options(eval);
    match rollback::replica_target(&target.root, &service)? {
        Some((current, earlier)) => {
            eprintln!("rollgate: rolling {service}'s replicas back from {current} to {earlier} (the release live before it), through the gate");
            let request = rollout::Request {
                service,
                version: earlier,
                root: target.root,
                policy,
                policy_entry,
                eval,
                args: settings::Args {
                    deadline_ms,
                    grace_ms,
                    drain_ms: drain_timeout_ms,
                    ..Default::default()
                },
            };
            Ok(ended(rollout::rollout(request)?))
        }
        None => Ok(ended(rollback::rollback(rollback::RollbackRequest {
            service: service.clone(),
            root: target.root.clone(),
            port,
            ports,
            deploy: deploy::Request {
                service,
                port: deploy::PortAsked::Given(0),
                version: String::new(),
                deadline_ms,
                root: target.root,
                policy,
                policy_entry,
                grace_ms,
                drain_ms: drain_timeout_ms,
                watch_ms,
                no_wait: false,
                eval,
            },
        })?)),
    }
}

/// Prints a command's answer: it succeeded.
fn printed(text: String) -> Result<u8, Error> {
    print(&text);
    Ok(error::SUCCESS)
}

/// Colour only for a person at a terminal, and never when NO_COLOR is set (no-color.org).
fn stderr_color() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `rollgate release ...`: exit 0, 1 when refused or failed (the reason first), 2 on usage.
// About 100 lines on purpose: one arm per `release` command, each unpacking its words into
// one call.
fn run_release(command: ReleaseCommand) -> Result<u8, Error> {
    let now = chrono::Utc::now();
    let result = match command {
        ReleaseCommand::List {
            target,
            format,
            wide,
        } => {
            return printed(rollgate::commands::releases::list(
                &target.root,
                format,
                Layout::of_stdout(wide),
            )?)
        }
        ReleaseCommand::Prune {
            target,
            keep,
            dry_run,
        } => {
            let pruned = rollgate::commands::releases::prune(&target.root, keep, dry_run)?;
            return printed(rollgate::commands::releases::said(&pruned, dry_run));
        }
        ReleaseCommand::Add {
            service,
            version,
            source,
            target,
            manifest,
            max_bytes,
            max_entries,
        } => {
            let request = release::install::Request {
                root: &target.root,
                service: &service,
                version: &version,
                source: &source,
                manifest: manifest.as_deref(),
                now: now.timestamp_millis() as f64 / 1000.0,
                max_bytes,
                max_entries,
            };
            return printed(installed_words(
                &release::install::add(&request)?,
                &service,
                &version,
            ));
        }
        ReleaseCommand::Keygen { out } => release::keys::generate(&out)
            .map(|(pin, public)| {
                format!(
                    "{pin}\nkey: {} (keep it offline)\npublic key: {}\n",
                    out.display(),
                    public.display()
                )
            })
            .map_err(Error::from),
        ReleaseCommand::Sign {
            dir,
            service,
            version,
            sequence,
            expires,
            key,
            cosigners,
        } => release::parse_duration(&expires)
            .map_err(|e| Error::Invalid(e.to_string()))
            .and_then(|expires_in| {
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
            let at = at
                .as_deref()
                .map(release::parse_time)
                .transpose()
                .map_err(|e| Error::Refused(format!("--at: {e}")))?
                .unwrap_or(now);
            trust.check()?;
            release::verify(&manifest, &trust, at, service.as_deref(), dir.as_deref())
                .map(|v| {
                    format!(
                        "verified: {} {} sequence {} (manifest sha256 {})\n",
                        v.body.service, v.body.version, v.body.sequence, v.manifest_sha256
                    )
                })
                .map_err(|refusal| Error::Invalid(format!("refused: {refusal}")))
        }
    };
    printed(result?)
}

/// What `release add` says of the release it installed (or found installed).
fn installed_words(
    installed: &release::install::Installed,
    service: &str,
    version: &str,
) -> String {
    match installed {
        release::install::Installed::New(record) => format!(
            "installed: {service} {version} ({} file{}, {} bytes, sha256 {})\n",
            record.files,
            if record.files == 1 { "" } else { "s" },
            record.size,
            record.sha256
        ),
        release::install::Installed::Already(record) => format!(
            "already installed: {service} {version} (sha256 {})\n",
            record.sha256
        ),
    }
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
fn report_dry_run((report, refused): (String, bool)) -> u8 {
    print(&report);
    if refused {
        error::REFUSED
    } else {
        error::SUCCESS
    }
}

/// How a run ended, said on the one stream its command says it on (a deploy's family on
/// stderr, a rollout's commands on stdout); the exit code follows from it.
fn ended(outcome: Outcome) -> u8 {
    match outcome.stream {
        engine::Stream::Stderr => eprintln!("{}", outcome.said()),
        engine::Stream::Stdout => println!("{}", outcome.said()),
    }
    outcome.exit_code()
}

/// `rollgate rollout ...`: the outcome on stdout, exit 0/1/3 as the outcome says, 2 refused.
fn run_rollout(args: RolloutArgs) -> Result<u8, Error> {
    let result = match args.command {
        Some(RolloutCommand::Status {
            service,
            target,
            format,
            wide,
        }) => {
            return printed(rollout::status(
                &service,
                target.root,
                format,
                Layout::of_stdout(wide),
            )?)
        }
        Some(RolloutCommand::Pause {
            service,
            target,
            reason,
        }) => engine::ask(target.root, &service, Ask::Pause { reason }),
        Some(RolloutCommand::Resume { service, target }) => {
            engine::ask(target.root, &service, Ask::Resume)
        }
        Some(RolloutCommand::Abort {
            service,
            target,
            reason,
            rollback,
        }) => engine::ask(target.root, &service, Ask::Abort { reason, rollback }),
        None if args.dry_run => match rollout_request(args) {
            Ok(request) => return Ok(report_dry_run(rollout::dry_run(&request))),
            Err(e) => Err(e),
        },
        None => rollout_request(args).and_then(rollout::rollout),
    };
    Ok(ended(result?))
}

fn run_secret(command: SecretCommand) -> Result<u8, Error> {
    use rollgate::commands::secret;
    printed(match command {
        SecretCommand::Set { name, target } => {
            secret::set(&target.root, &name, &mut std::io::stdin().lock())?
        }
        SecretCommand::List { target } => secret::list(&target.root)?,
        SecretCommand::Rm { name, target } => secret::remove(&target.root, &name)?,
    })
}

/// `rollgate config ...`. `set` prints the new release's version on stdout, then deploys it
/// (its outcome as `deploy` or `rollout` says it).
fn run_config(command: ConfigCommand) -> Result<u8, Error> {
    use rollgate::commands::config;
    match command {
        ConfigCommand::Show {
            version, target, ..
        } => printed(config::show(&target.root, version.as_deref())?),
        ConfigCommand::Diff { a, b, target, .. } => printed(config::diff(&target.root, &a, &b)?),
        ConfigCommand::Set {
            service,
            sets,
            unset,
            secret,
            target,
            ports,
            policy,
            no_deploy,
        } => {
            let change = config::Change::parse(&sets, &unset, &secret)?;
            let now = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
            let (from, version) = config::make_release(&target.root, &service, &change, now)?;
            print(&format!("{version}\n"));
            eprintln!("rollgate: {version} made from {from} with the config change");
            if no_deploy {
                return Ok(error::SUCCESS);
            }
            let replicas = rollgate::host::state::Root::new(target.root.clone())
                .read_replicas()?
                .is_some();
            if replicas {
                let request = rollout::Request {
                    service,
                    version,
                    root: target.root,
                    policy,
                    policy_entry: None,
                    eval: policy::EvalOptions::default(),
                    args: settings::Args::default(),
                };
                return Ok(ended(rollout::rollout(request)?));
            }
            let port = deploy::PortAsked::from_range(
                ports,
                format!(
                    "{version} is made; to deploy it give --ports A-B, a policy with `ports`, or `rollgate deploy {service} PORT {version}`"
                ),
            );
            let request = deploy::Request {
                service,
                port,
                version,
                deadline_ms: None,
                root: target.root,
                policy,
                policy_entry: None,
                grace_ms: None,
                drain_ms: None,
                watch_ms: None,
                no_wait: false,
                eval: policy::EvalOptions::default(),
            };
            Ok(ended(deploy::deploy(request)?))
        }
    }
}

fn rollout_request(args: RolloutArgs) -> Result<rollout::Request, Error> {
    use settings::{parse_ports, parse_wait, parse_waves};
    let usage = Error::Refused;
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

fn run_policy(command: PolicyCommand) -> Result<u8, Error> {
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
                let exported =
                    fleet::export::export(&file, engine, &workload, &eval_options(eval))?;
                print(&exported.text);
                for what in exported.lost {
                    eprintln!("not expressed in {}: {what}", engine.name());
                }
                return Ok(error::SUCCESS);
            }
            printed(policy::export(&file, format, &eval_options(eval))?)
        }
        PolicyCommand::Check {
            files,
            format,
            eval,
        } => {
            let outcomes = policy::check::check_files(&files, &eval_options(eval));
            let (report, all_ok) = policy::check::render(&outcomes, format);
            print(&report);
            Ok(if all_ok {
                error::SUCCESS
            } else {
                error::FAILED
            })
        }
        PolicyCommand::Contract => printed(policy::ROLLOUT_POLICY_NCL.to_string()),
    }
}

fn reading(args: ReadArgs) -> Result<log::Reading, log::LogError> {
    let time = |t: Option<String>| {
        t.map(|t| {
            rollgate::render::time::parse_time(&t).map_err(|e| log::LogError::Usage(e.to_string()))
        })
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
        reported: false,
    })
}

fn run_log(command: LogCommand) -> Result<u8, Error> {
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
            wide,
            read,
        } => reading(read).and_then(|r| match at {
            Some(at) => rollgate::render::time::parse_time(&at)
                .map_err(|e| log::LogError::Usage(e.to_string()))
                .and_then(|at| log::live_at(&logs, at, format, &r))
                .map(log::Answer::Text),
            None => log::history(&logs, format, Layout::of_stdout(wide), &r),
        }),
        LogCommand::Follow {
            log,
            from_start,
            format,
            read,
        } => {
            let start = if from_start {
                log::follow::Start::Beginning
            } else {
                log::follow::Start::End
            };
            let reading = reading(read)?;
            let mut out = std::io::stdout().lock();
            log::follow::print_records(&log, start, format, &reading, &mut out, || true)?;
            return Ok(error::SUCCESS);
        }
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
    // Rows are written as they are rendered; a reader that went away (`| head`) ends it.
    let answer = result?;
    let mut out = std::io::stdout().lock();
    let _ = answer.write_to(&mut out).and_then(|()| out.flush());
    Ok(error::SUCCESS)
}
