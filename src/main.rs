//! rollgate: a release proves itself before it goes live. See README.md.

mod cli;
mod dispatch;

use rollgate::commands::{console, demo, status, up};
use rollgate::engine::{self, Ask};
use rollgate::error::{self, Error};
use rollgate::render::table::Layout;
use rollgate::sample;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use cli::{Cli, Command};
use dispatch::{ended, printed};

/// `rollgate listen-exec`: the release's environment says that fd 3 is its socket and that it
/// is meant for this very process, then the release replaces it (same pid).
fn listen_exec(name: &str, program: &[std::ffi::OsString]) -> u8 {
    use std::os::unix::process::CommandExt;
    let Some((executable, args)) = program.split_first() else {
        return error::REFUSED;
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
    127
}

/// `rollgate container-run`: the container's exit code as this process's (a code past 255, or
/// none, is 255); what went wrong with the engine on stderr, exit 125 as `docker run` does.
fn container_run(args: cli::ContainerRunArgs) -> u8 {
    let spec = rollgate::host::container::RunSpec {
        name: args
            .name
            .unwrap_or_else(|| format!("rollgate-{}", std::process::id())),
        image: args.image,
        labels: args
            .label
            .iter()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        pass: args.pass,
        user: args.user,
        memory_mb: args.memory_mb,
        pids: args.pids,
        cpu_pct: args.cpu_pct,
        nofile: args.nofile,
        binds: args.bind,
        grace: Duration::from_millis(args.grace_ms),
        cgroup_parent: None,
        volumes: Vec::new(),
        unconfined: args.unconfined,
        verdict: args
            .verdict_fd
            .and_then(handed_file)
            .map(std::sync::Arc::new),
        command: args.command,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("rollgate container-run: {e}");
            return 125;
        }
    };
    match runtime.block_on(rollgate::host::container::run(&spec)) {
        Ok(code) => u8::try_from(code).unwrap_or(255),
        Err(why) => {
            eprintln!("rollgate container-run: {why}");
            125
        }
    }
}

/// The file behind `fd`, where it is one this process was handed open (never a number that
/// names nothing or a standard stream).
fn handed_file(fd: i32) -> Option<std::fs::File> {
    use std::os::fd::FromRawFd;
    let open = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_ok();
    // SAFETY: an open descriptor past the standard streams that nothing else in this process
    // owns (rollgate passed it to be this file's, and nothing here has opened any yet).
    (fd > 2 && open).then(|| unsafe { std::fs::File::from_raw_fd(fd) })
}

/// `rollgate logs`: a release's bytes reach a terminal escaped (issue 66); a pipe gets them as
/// written.
fn logs(request: rollgate::commands::logs::Request) -> Result<u8, Error> {
    let (stdout, mut said) = (std::io::stdout().lock(), std::io::stderr());
    let mut out: Box<dyn std::io::Write> = match std::io::IsTerminal::is_terminal(&stdout) {
        true => Box::new(rollgate::host::output::Printable::new(stdout)),
        false => Box::new(stdout),
    };
    rollgate::commands::logs::run(&request, &mut out, &mut said)?;
    Ok(error::SUCCESS)
}

/// mimalloc for every command (see Cargo.toml): the proxy's hot path allocates per request.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The one way out: every command's exit status, whatever ran it.
fn main() -> ExitCode {
    ExitCode::from(exit_status(Cli::parse().command))
}

/// Runs `command` to its exit status: the few that run before any runtime (a release's own
/// program, its output pump, its start with a held socket, a container's or a process's
/// keeper) each in its own way, every other one through [`run`], its error rendered here.
fn exit_status(command: Command) -> u8 {
    match command {
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
            let stdin = std::io::stdin().lock();
            match rollgate::host::output::pump(&file, rotation, stdin, first, true) {
                Ok(()) => error::SUCCESS,
                Err(_) => error::FAILED,
            }
        }
        // A release's start with its held socket: no runtime, only the exec.
        Command::ListenExec { name, program } => listen_exec(&name, &program),
        // A container release's supervisor: one small runtime, no output of its own.
        Command::ContainerRun(args) => container_run(args),
        // A release process's keeper: one small runtime, its report on stdout.
        Command::Keep { .. } => rollgate::supervision::keep::keep_main(),
        command => match run(command) {
            Ok(code) => code,
            Err(error) => {
                eprint!("{}", error.render());
                error.code()
            }
        },
    }
}

/// Runs one command; what it answers is printed as it goes. `Ok` is the exit code of how it
/// ended (an outcome: promoted, rolled back, paused...), `Err` what went wrong.
// One arm per command, each only unpacking clap's words into one call (the longer ones are
// functions of their own in `dispatch`): long because the commands are many, not because an
// arm does much. Issue 61 splits it by command family.
fn run(command: Command) -> Result<u8, Error> {
    match command {
        Command::Policy(command) => dispatch::policy::run_policy(command),
        Command::Log(command) => dispatch::log::run_log(command),
        Command::Release(command) => dispatch::release::run_release(command),
        Command::Schedules(command) => dispatch::release::run_schedules(command),
        Command::Fleet(command) => dispatch::fleet::run_fleet(command),
        Command::Webhooks(command) => dispatch::fleet::run_webhooks(command),
        Command::Config(command) => dispatch::config::run_config(command),
        Command::Secret(command) => dispatch::config::run_secret(command),
        Command::Deploy(args) => dispatch::deploys::run_deploy(args),
        Command::Rollout(args) => dispatch::deploys::run_rollout(args),
        Command::Rollback(args) => dispatch::deploys::run_rollback(args),
        Command::Restart(args) => dispatch::deploys::run_restart(args),
        Command::Scale(args) => dispatch::deploys::run_scale(args),
        Command::Stop {
            service,
            target,
            reason,
        } => dispatch::deploys::run_stop(service, target.root, reason),
        Command::Start { service, target } => dispatch::deploys::run_start(service, target.root),
        Command::Run {
            service,
            target,
            release,
            command,
        } => dispatch::deploys::run_one_off(service, target.root, release, command),
        Command::Up {
            mut roots,
            supervise,
            ready_ms,
            max_restarts,
            backoff_ms,
        } => printed(up::up(up::Options {
            roots: {
                if roots.is_empty() {
                    roots.push(PathBuf::from("."));
                }
                roots
            },
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
        Command::Logs {
            service,
            target,
            follow,
            release,
            since,
            lines,
            process_type,
            schedule,
            no_time,
        } => logs(rollgate::commands::logs::Request {
            root: target.root,
            service,
            follow,
            release,
            since: since
                .map(|t| rollgate::render::time::parse_time(&t))
                .transpose()
                .map_err(|e| error::refused(format!("--since: {e}")))?,
            lines,
            process_type,
            schedule,
            times: !no_time,
        }),
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
        Command::KeepClock { target } => rollgate::supervision::clock::keep_clock(target.root),
        Command::SweepRemoved { target } => {
            rollgate::release::install::sweep_removed(&target.root.join("releases"));
            Ok(error::SUCCESS)
        }
        Command::SampleService(_)
        | Command::OutputPump { .. }
        | Command::ListenExec { .. }
        | Command::ContainerRun(_)
        | Command::Keep { .. } => {
            unreachable!("run by main before the commands")
        }
        Command::Proxy(args) => dispatch::proxy::run_proxy(args),
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
        Command::Traffic { action } => dispatch::proxy::run_traffic(action),
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
