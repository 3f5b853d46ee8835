//! The command line, defined once: every flag with its help text. `main` only dispatches.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use rollgate::policy::check::CheckFormat;
use rollgate::policy::ExportAs;
use rollgate::render::Format;

#[derive(Debug, Parser)]
#[command(
    name = "rollgate",
    version,
    about = "Make a release prove itself before it goes live.",
    long_about = "rollgate checks rollout policies against Nickel contracts, deploys a release \
beside the live one and switches only once it is ready, and answers questions from the deploy log.",
    after_help = "Examples:
  rollgate demo                                   deploy five sample releases, roll out three, show the log
  rollgate policy check policies/*.ncl            refuse bad policies in CI
  rollgate deploy edge-svc v2 --root /srv/edge --ports 8081-8082 --policy policy.ncl
  rollgate log summary /srv/edge/deploy.log

Exit codes: 0 success; 1 refused policy, rolled-back deploy or failed check;
2 usage error or deploy refused before anything started; 3 deploy escalated."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check and export rollout policies (Nickel contracts, evaluated in-process).
    #[command(
        subcommand,
        after_help = "Examples:
  rollgate policy export contracts/policy.ncl
  rollgate policy check --format github policies/*.ncl
  rollgate policy contract > rollout-policy.ncl"
    )]
    Policy(PolicyCommand),
    /// Installed releases (add one whole, list them, prune old ones) and signed ones (keys known
    /// by their pins, a threshold of signers, an expiry, a sequence that never goes backwards).
    #[command(
        subcommand,
        after_help = "Examples:
  rollgate release add edge-svc v2 ./target/release/edge-svc --root /srv/edge
  rollgate release list --root /srv/edge
  rollgate release prune --keep 5 --root /srv/edge
  rollgate release keygen --out ~/keys/alice.pem
  rollgate release sign dist --service edge-svc --version v2 --sequence 14 \\
      --key ~/keys/alice.pem --cosigners ~/keys/bob.pub.pem
  rollgate release cosign dist/manifest.json --key ~/keys/bob.pem
  rollgate release verify dist/manifest.json --pins sha256/...,sha256/... --threshold 2 --dir dist"
    )]
    Release(ReleaseCommand),
    /// The policy's schedules: when each is due next and how its last run went, or
    /// one run now under its rules.
    #[command(
        subcommand,
        after_help = "Examples:
  rollgate schedules list --root /srv/edge
  rollgate schedules run edge-svc nightly --root /srv/edge

The clock is kept by rollgate itself (a keeper per root, started by `up` and after every
deploy): each run in the live release, its lines in deploy.log, its output read with
`rollgate logs SVC --schedule NAME`. Exit codes: list 0; run: the run's own exit status, 2
when refused (unknown schedule, the last run still runs under 'forbid, the service stopped)."
    )]
    Schedules(SchedulesCommand),
    /// Past one host: hand the reviewed policy to the tools that drive many hosts.
    #[command(
        subcommand,
        after_help = "Examples:
  rollgate fleet playbook --policy policy.ncl --service edge-svc --version v2 --group edge --hosts 12 > roll.yml
  ansible-playbook -i inventory.ini roll.yml"
    )]
    Fleet(FleetCommand),
    /// Signed webhooks from the log: send what is due, list attempts, send one again.
    #[command(
        subcommand,
        after_help = "Examples:
  rollgate webhooks send --root /srv/edge          # one pass (cron); the console sends too
  rollgate webhooks deliveries --root /srv/edge
  rollgate webhooks redeliver msg_2049_1311769_48211 --root /srv/edge

ROOT/webhooks.json lists the endpoints:
  {\"endpoints\": [{\"name\": \"chat\", \"url\": \"http://127.0.0.1:9000/hook\",
                  \"secret\": \"whsec_...\", \"events\": [\"promoted\", \"rolled_back\"]}]}"
    )]
    Webhooks(WebhooksCommand),
    /// A release's configuration: show it, compare two, or change it (a new release, gated).
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The root's secrets (ROOT/secrets/, 0600): set from standard input, list, remove.
    #[command(subcommand)]
    Secret(SecretCommand),
    /// Answer questions from deploy logs (JSON lines: ts, event, version, detail).
    #[command(
        subcommand,
        after_help = "Examples:
  rollgate log summary fixtures/gated.log
  rollgate log history deploy.log --at 2026-11-02T10:00:00Z
  rollgate log stats deploy.log --format json
  rollgate log query deploy.log --sql \"SELECT version, count(*) AS n FROM log GROUP BY version\"

Only lines that begin with `{` are records. A record line that is not valid JSON is skipped
with a warning naming the file and line (--strict makes it an error).
Exit codes: 0 answered; 1 a log could not be read, or --strict found bad lines; 2 usage."
    )]
    Log(LogCommand),
    /// Start a release beside the live one, gate it on /readyz, then switch or roll back.
    #[command(after_help = "Examples:
  rollgate deploy edge-svc v2 --root /srv/edge --ports 8081-8082
  rollgate deploy edge-svc v3 --root /srv/edge --ports 8081-8082 --deadline-ms 2000
  rollgate deploy edge-svc v3 --root /srv/edge --policy policy.ncl   (ports from the policy)
  rollgate deploy edge-svc 8083 v3 2000 --root /srv/edge             (older form: PORT VERSION [DEADLINE_MS])

The root holds releases/<version>/<svc> (the executable), `current` (the live release, JSON),
deploy.log (JSON lines) and deploy.lock. The candidate runs in releases/<version>/ with
PORT=<new-port> and ROLLGATE_VERSION=<version>; its output goes to output/<version>/<svc>.output.
Deadline and poll interval: the deadline-ms argument, else the policy, else 1500 ms / 100 ms.

Exit codes: 0 promoted; 1 rolled back (the log says why); 2 refused before anything started;
3 escalated (on_stall = 'escalate: the candidate is left running for `promote` or `abort`).")]
    Deploy(DeployArgs),
    /// Go back to the release that was live before the current one (found in the log, still
    /// installed), through the gate like any deploy; on a replica root, with a rollout.
    #[command(after_help = "Examples:
  rollgate rollback edge-svc --root /srv/edge
  rollgate rollback edge-svc --root /srv/edge --port 8091 --policy policy.ncl

Exit codes: as `deploy` (or `rollout` on a replica root); 2 when there is no earlier release
still installed, or nothing is live.")]
    Rollback(RollbackArgs),
    /// A fresh process of the live release beside the running one, gated and switched, the old
    /// one drained: a restart users do not see (through `rollgate proxy`).
    #[command(after_help = "Examples:
  rollgate restart edge-svc --root /srv/edge --ports 8081-8082
  rollgate restart edge-svc --root /srv/edge          # the policy's ports

It is a deploy of the live version (logged as one, under the service's kept policy); on a
replica root, a rollout of the version its replicas run that gives each a fresh process within
the rollout's budgets. Exit codes: as `deploy` (or `rollout`).")]
    Restart(RollbackArgs),
    /// How many processes of each of the live release's types (its Procfile's lines) run,
    /// without a new release: kept in the root; only the difference starts or stops.
    #[command(after_help = "Examples:
  rollgate scale edge-svc worker=4 --root /srv/edge
  rollgate scale edge-svc worker=1 mailer=0 --root /srv/edge
  rollgate scale edge-svc worker=+1 --root /srv/edge      # one more than run now
  rollgate scale edge-svc web=3 --ports 8081-8090 --root /srv/edge

The counts are kept in ROOT/scale.json, over the policy's processes.TYPE.replicas, for every
later deploy too. They are applied at once: only the difference starts (each new process
through its type's gate) or stops (once the new ones are ready); web and the processes already
running keep running, and no port is needed. The counts are kept once that run completes; a
scale killed is taken back whole by the next command. web=N is the web replica set's size: a
rollout of the live version to N fresh replicas (--ports or the policy's ports; a single
release's root becomes a replica set). A singleton stays at most 1; web=0 is `rollgate stop`.
Exit codes: as `restart` (or `rollout`); 2 for a type the live release has no line for, or a
count refused.")]
    Scale(ScaleArgs),
    /// Stop a service on purpose: the proxy answers its maintenance page, each live process is
    /// drained and stopped whole, and nothing starts it again (not `up`, not a deploy) until
    /// `rollgate start`.
    #[command(after_help = "Example:
  rollgate stop web --root /srv/web --reason \"disk replaced\"

Logged as a `stopped` line; `status` and `release list` say stopped. Exit codes: 0 stopped
(or already stopped); 2 refused (nothing live, another service's root, a deploy holds the lock).")]
    Stop {
        /// Service name.
        service: String,
        #[command(flatten)]
        target: RootArgs,
        /// Why, kept with the stop and in its log line.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Start a stopped service again: its live release started as it ran (its launch record),
    /// gated on its probe; then the maintenance and the stop are lifted.
    #[command(after_help = "Example:
  rollgate start web --root /srv/web

Logged as a `started` line. Exit codes: 0 running; 1 a release could not be started (the
service stays stopped); 2 refused (nothing live, another service's root, a lock held).")]
    Start {
        /// Service name.
        service: String,
        #[command(flatten)]
        target: RootArgs,
    },
    /// Run a one-off command in the service's live release (or --release V): its folder,
    /// configuration and secrets, its user, confinement and limits, the terminal attached.
    #[command(after_help = "Examples:
  rollgate run web --root /srv/web -- venv/bin/python manage.py createsuperuser
  rollgate run web --root /srv/web --release v41 -- sh

A path is taken from the release's folder; an image release's command runs in a container of
its image (output streamed, no stdin). Ctrl-C, a hang-up and SIGTERM reach the command;
whatever it leaves running ends with it. Logged as a `run` line (who, what, exit status,
duration; never the environment). The root's lock is not taken. Exit codes: the command's own;
2 refused (nothing live, no such release, a command that cannot start).")]
    Run {
        /// Service name.
        service: String,
        #[command(flatten)]
        target: RootArgs,
        /// Run in this installed release instead of the live one (as the live one's user).
        #[arg(long, value_name = "VERSION")]
        release: Option<String>,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Start every live release the root names that is not running (what a boot runs); with
    /// --supervise, keep doing so, with backoff, and give up on one that keeps crashing.
    #[command(after_help = "Examples:
  rollgate up --root /srv/edge
  rollgate up --root /srv/edge --supervise

Each release starts on its port, in its release folder, with PORT and ROLLGATE_VERSION set,
and the new pid is recorded where the old one was named; each restart is logged (restarted,
restart_failed, restart_given_up). Exit codes: 0 everything live is running; 1 some release
could not be started; 2 refused (not a root, a deploy holds the lock).")]
    Up {
        /// A root to bring up (repeatable: every service of the host in one unit) [default: .].
        #[arg(long = "root", value_name = "DIR")]
        roots: Vec<PathBuf>,
        /// Keep watching: restart a live release that exits, with backoff.
        #[arg(long)]
        supervise: bool,
        /// How long a started release may take to pass its probe (the one its deploy gated it with).
        #[arg(long, value_name = "MS", default_value_t = rollgate::defaults::UP_READY.as_millis() as u64)]
        ready_ms: u64,
        /// With --supervise: exits in a row (each within 30 s of its start) at which it gives up.
        #[arg(long, default_value_t = rollgate::defaults::UP_MAX_RESTARTS, value_parser = clap::value_parser!(u32).range(1..=1000))]
        max_restarts: u32,
        /// With --supervise: the first wait before a restart, doubled each time (at most 60 s).
        #[arg(long, value_name = "MS", default_value_t = rollgate::defaults::UP_BACKOFF.as_millis() as u64)]
        backoff_ms: u64,
    },
    /// Finish the watch a `deploy --no-wait` recorded (started by that deploy).
    #[command(hide = true)]
    Watch {
        service: String,
        #[arg(long)]
        token: String,
        #[command(flatten)]
        target: RootArgs,
    },
    /// Move N replicas of a service to a new version in waves, within surge and unavailable
    /// budgets, with a soak between waves; pause, resume or abort it from another shell.
    #[command(
        args_conflicts_with_subcommands = true,
        subcommand_negates_reqs = true,
        after_help = "Examples:
  rollgate rollout edge-svc v2 --root /srv/edge --replicas 10 --ports 9001-9020
  rollgate rollout edge-svc v3 --root /srv/edge --policy policy.ncl --soak 30s
  rollgate rollout status edge-svc --root /srv/edge
  rollgate rollout pause edge-svc --root /srv/edge --reason \"error rate up\"
  rollgate rollout abort edge-svc --root /srv/edge --rollback

Each replica runs releases/<version>/<svc> with PORT, ROLLGATE_VERSION and ROLLGATE_SLOT set, its
output in output/<version>/<svc>.<slot>.output. The pool is ROOT/replicas.json (what
`rollgate proxy` balances across); the rollout's state is ROOT/rollout.json.
Budgets: surge = ceil(N x max_surge_pct / 100), unavailable = floor(N x max_unavailable_pct / 100)
(1 if both are 0); without a policy 25 % and 0 %.

Exit codes: 0 completed; 1 aborted (the cause is in the log and in `rollout status`);
2 refused before anything started; 3 paused (waiting for `rollout resume` or `rollout abort`)."
    )]
    Rollout(RolloutArgs),
    /// Promote an escalated candidate by hand (same switch as a ready one).
    #[command(after_help = "Example:
  rollgate promote edge-svc --root /srv/edge

Exit codes: 0 promoted; 1 the candidate had died and was rolled back; 2 nothing to promote.")]
    Promote {
        service: String,
        #[command(flatten)]
        target: RootArgs,
    },
    /// Abort an escalated candidate by hand (same rollback as a failed one).
    #[command(after_help = "Example:
  rollgate abort edge-svc --root /srv/edge

Exit codes: 0 aborted (logged as rolled_back); 2 nothing to abort.")]
    Abort {
        service: String,
        #[command(flatten)]
        target: RootArgs,
    },
    /// What the application printed: the live release's output (stdout and stderr), and with
    /// -f what it prints next, following each switch to the next live release.
    #[command(after_help = "Examples:
  rollgate logs edge-svc --root /srv/edge -f
  rollgate logs edge-svc --root /srv/edge -n 50
  rollgate logs edge-svc --root /srv/edge --release v3
  rollgate logs edge-svc --root /srv/edge --since 2026-12-05T10:00:00Z

A release's output is kept in ROOT/output/VERSION/SERVICE.output (rotated at the
policy's output_max_bytes), each line begun with the time rollgate read it (UTC, to the
millisecond), printed first: `2026-12-07T14:30:36.123Z [worker.1] job 7 done`. --since picks
every release live at T or since (from the deploy log), of each the files written since T, and
of those the lines said since T. When -f follows a switch, a line on stderr names the release
now live.")]
    Logs {
        service: String,
        #[command(flatten)]
        target: RootArgs,
        /// Go on printing what is written, across deploys and rollbacks (until interrupted).
        #[arg(long, short)]
        follow: bool,
        /// This release's output, live or not (never follows a switch).
        #[arg(long, value_name = "VERSION")]
        release: Option<String>,
        /// Releases live at or after this time (RFC 3339 or Unix seconds), files written since.
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Only the last N lines of what is there now.
        #[arg(long, short = 'n', value_name = "N")]
        lines: Option<usize>,
        /// Another process type's output (its Procfile's line: `worker`), each of its
        /// processes' labelled; `web` (the default) is the web process's.
        #[arg(long = "type", value_name = "TYPE")]
        process_type: Option<String>,
        /// A schedule's runs' output (the policy's `schedules.NAME`): its last run's, the one
        /// before it first.
        #[arg(long, value_name = "NAME", conflicts_with_all = ["process_type", "release"])]
        schedule: Option<String>,
        /// Print the lines without the time each was said.
        #[arg(long)]
        no_time: bool,
    },
    /// The live release (version, port, pid, uptime, answering) and the last outcomes.
    #[command(after_help = "Examples:
  rollgate status --root /srv/edge
  rollgate status --root /srv/edge --format json")]
    Status {
        #[command(flatten)]
        target: RootArgs,
        #[arg(long, short, value_enum, default_value = "table")]
        format: Format,
        /// On a terminal, every column of the tables (printed to a pipe they always have).
        #[arg(long)]
        wide: bool,
    },
    /// Reverse proxy in front of the live release: follows each switch, drains the old release.
    #[command(after_help = "Examples:
  rollgate proxy --listen 127.0.0.1:8080 --root /srv/edge
  rollgate proxy --listen 0.0.0.0:80 --root /srv/edge --version-header x-release
  rollgate proxy --listen 127.0.0.1:8080 --root /srv/edge --metrics-listen 127.0.0.1:9180
  rollgate proxy --root /srv/edge --listen 0.0.0.0:80 --tls-listen 0.0.0.0:443 \\
    --tls-cert edge.example.com=/etc/rollgate/edge.pem,/etc/rollgate/edge.key --hsts
  rollgate proxy --config /etc/rollgate/proxy.toml
  rollgate proxy reload --config /etc/rollgate/proxy.toml

Forwards every request to 127.0.0.1:<port> of the release `current` names (503 when none,
502 when it refuses). Sets X-Forwarded-For (appends to the client's only with
--trust-forwarded) and X-Forwarded-Proto, keeps Host. The deployer
asks it over ROOT/proxy.sock to drain the old release before stopping it. It counts what each
release answers (status class, failures, latency): a rollout's `analysis` judges a canary on
those counts, and --metrics-listen serves them as Prometheus' /metrics.
With --tls-listen it serves HTTPS (TLS 1.3/1.2, HTTP/2 or HTTP/1.1 by ALPN) with the
--tls-cert certificate the client's SNI names, and --listen redirects to it (308); a bad
certificate file refuses the start (exit 2); SIGHUP reads the certificate files again.
With --config FILE it serves every service of the host: each [[route]] names hosts, an optional
path prefix and a root (docs/proxy.md); a request no route takes gets 404. SIGHUP or
`rollgate proxy reload --config FILE` reads the file again without dropping a connection; a
file that does not parse is refused at its line and column and the routes in force go on.
SIGTERM or SIGINT: stop accepting, finish in-flight requests, keep WebSockets up to
--drain-timeout-ms (then a Close with 1001), exit 0. --take-over: take a running proxy's
sockets on the same --listen (a restart or an upgrade with no failed request); systemd's socket
activation (LISTEN_FDS) is served too (docs/operations.md).")]
    #[command(args_conflicts_with_subcommands = true)]
    Proxy(ProxyArgs),
    /// What the proxy lets through to a service: maintenance (503 and a page), a pause
    /// (requests wait), or serving again. Kept in ROOT/traffic.json; logged in deploy.log.
    #[command(after_help = "Examples:
  rollgate traffic maintenance edge-svc --root /srv/edge --message 'Back at 14:00' --retry-after 600
  rollgate traffic pause edge-svc --root /srv/edge --max-pause-ms 20000 --reason 'db migration'
  rollgate traffic resume edge-svc --root /srv/edge
  rollgate traffic status --root /srv/edge --root /srv/api

Every proxy serving the root follows the file at once, and reads it again at its start: the
state survives a restart of the proxy or of the host. A deploy or rollout goes on meanwhile
(its gate talks to the release, not through the proxy).")]
    Traffic {
        #[command(subcommand)]
        action: TrafficAction,
    },
    /// A page and a JSON API over one or more roots: live releases, rollouts, escalations,
    /// history, an event stream, and pause/resume/abort/promote behind a token.
    #[command(after_help = "Examples:
  rollgate console --root /srv/edge
  rollgate console --root /srv/edge --root /srv/api --listen 127.0.0.1:8700
  rollgate console --root /srv/edge --read-only
  curl -N http://127.0.0.1:8700/api/v1/events

At its first start the console makes ROOT/console.token (0600, in the first root) and prints a
link that sets it as a cookie; scripts send it as `Authorization: Bearer TOKEN`. A state change
without it, or from another site, gets 403. --read-only shows no buttons and refuses every
state-changing request. Binding beyond loopback needs the token file to exist.

Exit codes: 0 stopped by Ctrl-C; 2 refused (no root, a busy address, beyond loopback without a
token file).")]
    Console {
        /// A root to show (repeatable: one section per service).
        #[arg(long = "root", value_name = "DIR", required = true)]
        roots: Vec<PathBuf>,
        /// Where to listen.
        #[arg(long, value_name = "ADDR", default_value = rollgate::defaults::CONSOLE_LISTEN)]
        listen: std::net::SocketAddr,
        /// No buttons, and no endpoint that changes anything.
        #[arg(long)]
        read_only: bool,
    },
    /// Deploy five sample releases through the real deployer, roll out three behind the proxy, and show what the log says.
    #[command(after_help = "Examples:
  rollgate demo
  rollgate demo --root /tmp/edge-demo

First act: v1 and v2 become ready and are promoted; v3 is ready only after 60 s and is rolled
back at the 1500 ms deadline; v4 exits 78 at boot and is rolled back at once; v5 says READY=1
on its notification socket and is promoted. The live release is v5.
Second act: five replicas behind `rollgate proxy` under a small load are rolled out to v2 in
waves; a v3 that exits at boot pauses itself beyond the canary and is aborted with rollback; a
v4 that is ready but answers 10 % of users with 500 is rolled back by the traffic judge. The
failed requests are counted (0).
The demo stops the live release at the end, so nothing is left running; the files stay.")]
    Demo {
        /// Folder to deploy into (created if needed; must not hold a deploy). Default: a new
        /// temporary folder.
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
    },
    /// Print a completion script for a shell, generated from rollgate's own arguments.
    #[command(after_help = "Examples:
  rollgate completions bash > ~/.local/share/bash-completion/completions/rollgate
  rollgate completions zsh > \"${fpath[1]}/_rollgate\"
  rollgate completions fish > ~/.config/fish/completions/rollgate.fish")]
    Completions { shell: clap_complete::Shell },
    /// Print rollgate's man page (roff), generated from its own arguments.
    #[command(after_help = "Example:
  rollgate man | man -l -")]
    Man,
    /// A small HTTP service with knobs, standing in for a release in tests and the demo.
    #[command(hide = true)]
    SampleService(rollgate::sample::SampleArgs),
    /// Starts a release with the service's held socket: sets LISTEN_FDS=1, LISTEN_PID (this
    /// process's pid, which the release keeps) and LISTEN_FDNAMES, then execs PROGRAM. Used by
    /// rollgate itself (see `host::listen`), not by hand.
    #[command(hide = true, name = "listen-exec")]
    ListenExec {
        #[arg(long)]
        name: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        program: Vec<std::ffi::OsString>,
    },
    /// Runs a container release's container to its end through the Docker Engine: its output
    /// on stdout and stderr, stopped (SIGTERM, the grace, kill) when this process is asked to
    /// stop, its exit code this one's. Started by rollgate for a container release, not by
    /// hand (see `host::container`).
    #[command(hide = true, name = "container-run")]
    ContainerRun(ContainerRunArgs),
    /// Starts one release process and keeps it: started again when it exits while it is live,
    /// ended as it ended otherwise. Its spec comes on stdin. Started by rollgate for every
    /// release process, not by hand (see `host::keeper`).
    #[command(hide = true, name = "keep")]
    Keep {
        /// The service and the process kept (`shop worker.1`): only for `ps` to show.
        #[arg(hide = true)]
        named: Vec<String>,
    },
    /// Keeps a root's schedules: runs each at its due times in the live release. Started by
    /// rollgate's supervisor for a policy with `schedules`, not by hand (see `supervision::clock`).
    #[command(hide = true, name = "keep-clock")]
    KeepClock {
        #[command(flatten)]
        target: RootArgs,
    },
    /// Deletes the releases a prune or `release rm` renamed out of ROOT/releases (hidden
    /// `.removing-*` folders), in the background, after the command that removed them has
    /// said so. Started by rollgate, not by hand (see `release::install::remove`).
    #[command(hide = true, name = "sweep-removed")]
    SweepRemoved {
        #[command(flatten)]
        target: RootArgs,
    },
    /// Holds a service's listening socket for its root and hands a copy to each release
    /// rollgate starts (SCM_RIGHTS on ROOT/listen.sock). Started by rollgate when a policy
    /// has `listen`, not by hand.
    #[command(hide = true)]
    Hold {
        #[command(flatten)]
        target: RootArgs,
        #[arg(long)]
        listen: std::net::SocketAddr,
        #[arg(long)]
        backlog: u32,
    },
    /// Copies a release's output (stdin) into FILE, rotated by size: started by rollgate beside
    /// each release it starts (see `host::output`), not by hand.
    #[command(hide = true, name = "output-pump")]
    OutputPump {
        #[arg(long)]
        max_bytes: u64,
        #[arg(long)]
        keep: u64,
        file: PathBuf,
    },
}

/// `rollgate traffic`'s changes and its status.
#[derive(Debug, Subcommand)]
pub enum TrafficAction {
    /// Answer every request 503 with Retry-After and a page (JSON for `Accept:
    /// application/json`).
    Maintenance {
        service: String,
        #[command(flatten)]
        target: RootArgs,
        /// Said to users on the page and in the JSON (at most 1000 characters).
        #[arg(long, value_name = "TEXT")]
        message: Option<String>,
        /// The Retry-After header, in seconds.
        #[arg(long, value_name = "S")]
        retry_after: Option<u64>,
        /// Serve this HTML file as the page instead of rollgate's own (at most 1 MiB).
        #[arg(long, value_name = "FILE")]
        page: Option<PathBuf>,
        /// Why (at most 500 characters; kept in the state and the deploy log).
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Hold new requests, in order, until `resume` (each waits up to --max-pause-ms, then 503).
    Pause {
        service: String,
        #[command(flatten)]
        target: RootArgs,
        /// The longest a request waits before it is answered 503.
        #[arg(long, value_name = "MS", default_value_t = rollgate::host::traffic::DEFAULT_MAX_PAUSE_MS,
              value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
        max_pause_ms: u64,
        /// Why (at most 500 characters; kept in the state and the deploy log).
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Serve again: requests held by a pause go on in the order they came.
    Resume {
        service: String,
        #[command(flatten)]
        target: RootArgs,
        /// Why (at most 500 characters; kept in the state and the deploy log).
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Each root's traffic state.
    Status {
        /// A root to show (repeatable) [default: .].
        #[arg(long = "root", value_name = "DIR")]
        roots: Vec<PathBuf>,
        #[arg(long, short, value_enum, default_value = "table")]
        format: Format,
    },
}

/// What `rollgate proxy` may be asked besides serving.
/// `rollgate proxy`'s words (its flags, or `reload`).
#[derive(Debug, clap::Args)]
pub struct ProxyArgs {
    #[command(subcommand)]
    pub action: Option<ProxyAction>,
    /// Address to listen on (else the config file's `listen`) [default: 127.0.0.1:8080]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// Folder holding releases/, current, deploy.log: the one service served [default: .].
    #[arg(long, value_name = "DIR", conflicts_with = "config")]
    pub root: Option<PathBuf>,
    /// Serve the routes of this TOML file (one [[route]] per service: host, path_prefix,
    /// strip_prefix, root, service) and its settings (the flags' names: listen,
    /// tls_listen, tls_cert, hsts, acme_*); a flag given wins over the file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Add this response header naming the release that answered (off by default: it
    /// tells the world your versions).
    #[arg(long, value_name = "NAME")]
    pub version_header: Option<String>,
    /// Connections served at once, upgraded tunnels included; more wait in the accept
    /// queue.
    #[arg(long, value_name = "N", default_value_t = rollgate::defaults::PROXY_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// A client must send its request headers within this (slowloris guard); also the
    /// idle timeout of a keep-alive connection.
    #[arg(long, value_name = "MS", default_value_t = rollgate::defaults::PROXY_HEADER_READ_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub header_read_timeout_ms: u64,
    /// Largest request head accepted, in bytes (larger: 431). At least 8192, the smallest
    /// buffer the HTTP parser works with.
    #[arg(long, value_name = "BYTES", default_value_t = rollgate::defaults::PROXY_MAX_HEADER_BYTES,
          value_parser = clap::value_parser!(u32).range(8192..=1_048_576))]
    pub max_header_bytes: u32,
    /// A request or response body that sends nothing for this long is cut (the client
    /// gets 502 or a closed connection), and so is a client that reads nothing of an
    /// answer for this long, so slow clients cannot hold every slot.
    #[arg(long, value_name = "MS", default_value_t = rollgate::defaults::PROXY_BODY_IDLE_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub body_idle_timeout_ms: u64,
    /// An upgraded connection (WebSocket) where no byte moves either way for this long is
    /// closed.
    #[arg(long, value_name = "MS", default_value_t = rollgate::defaults::PROXY_TUNNEL_IDLE_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub tunnel_idle_timeout_ms: u64,
    /// Once the proxy stops accepting (SIGTERM, a hand-over to a new proxy), how long it keeps
    /// upgraded connections open; then a WebSocket gets a Close with 1001 (going away) and
    /// any other tunnel is shut, and the proxy exits.
    #[arg(long, value_name = "MS", default_value_t = rollgate::defaults::PROXY_DRAIN_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub drain_timeout_ms: u64,
    /// The proxy sits behind another proxy: append to the client's X-Forwarded-For
    /// instead of replacing it (otherwise any client could claim any address).
    #[arg(long)]
    pub trust_forwarded: bool,
    /// Serving threads, each with its own listener and upstream pool. Default: one per
    /// core. Fewer leave more CPU to the releases on a small host.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Option<u16>,
    /// Serve the counts of what each release answered at http://ADDR/metrics, in
    /// Prometheus' text format (docs/analysis.md lists the series).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Count nothing (only to measure what counting costs: bench/proxy_bench.sh).
    #[arg(long, hide = true)]
    pub no_counting: bool,
    /// Serve as this user: bind the listeners and the control socket and read the
    /// certificates as root, then switch to NAME (its group, no other) for serving
    /// (docs/isolation.md). The ACME state folder is handed to it.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Serve HTTPS on ADDR (TLS 1.3 and 1.2; HTTP/2 or HTTP/1.1 by ALPN); plain HTTP on
    /// --listen then answers every request with a 308 to https.
    #[arg(long, value_name = "ADDR")]
    pub tls_listen: Option<std::net::SocketAddr>,
    /// A certificate to serve over TLS, chosen by the name the client asks for (SNI):
    /// NAME=CERT,KEY with PEM files, NAME a host, `*.domain`, or `default` (for a client
    /// that names no host or one nothing else covers; without it such a client gets a TLS
    /// alert). Repeatable. SIGHUP reads every file again; a bad one keeps the old set.
    #[arg(long = "tls-cert", value_name = "NAME=CERT,KEY")]
    pub tls_certs: Vec<rollgate::proxy::certs::CertSpec>,
    /// Answers over TLS say `Strict-Transport-Security: max-age=31536000`.
    #[arg(long)]
    pub hsts: bool,
    /// Get certificates from this ACME (RFC 8555) directory for each --acme-name (Let's
    /// Encrypt: https://acme-v02.api.letsencrypt.org/directory; its staging, ZeroSSL,
    /// step-ca or a private CA work the same). Needs --tls-listen and --acme-state.
    #[arg(long, value_name = "URL", requires_all = ["acme_state", "tls_listen"])]
    pub acme_directory: Option<String>,
    /// The ACME account's contact (`mailto:ops@example.com`). Repeatable.
    #[arg(long, value_name = "URI", requires = "acme_directory")]
    pub acme_contact: Vec<String>,
    /// A CA file (PEM) to trust the ACME directory's HTTPS with (a private or test CA).
    #[arg(long, value_name = "PEM", requires = "acme_directory")]
    pub acme_ca_file: Option<std::path::PathBuf>,
    /// Where the account and the certificates are kept (made 0700; files 0600). A restart
    /// reuses them: no new order while a certificate is good.
    #[arg(long, value_name = "DIR", requires = "acme_directory")]
    pub acme_state: Option<std::path::PathBuf>,
    /// A name to get a certificate for. Repeatable. Only these are ever ordered, never a
    /// name a client asks for.
    #[arg(long, value_name = "NAME", requires = "acme_directory")]
    pub acme_name: Vec<String>,
    /// How the ACME server checks the names: http-01 (answered on --listen, which must be
    /// port 80 to the server) or tls-alpn-01 (answered on --tls-listen, port 443 to it).
    #[arg(long, value_name = "TYPE", default_value = "http-01",
          value_parser = ["http-01", "tls-alpn-01"])]
    pub acme_challenge: String,
    /// Write one JSON line per request to ROOT/access.log of each route (ts, route, host,
    /// method, path, status, bytes, duration_ms, release, slot, client, request_id), for
    /// `rollgate log query --access`. Rotated by size like a release's output.
    #[arg(long)]
    pub access_log: bool,
    /// Rotate the access log when it would pass this [default: 20971520].
    #[arg(long, value_name = "BYTES")]
    pub access_log_max_bytes: Option<u64>,
    /// Access log files kept in all, the one written among them [default: 5].
    #[arg(long, value_name = "N")]
    pub access_log_keep: Option<u64>,
    /// Keep the query string on the logged path (off: a query may carry tokens).
    #[arg(long)]
    pub access_log_query: bool,
    /// Log one request in N (each serving thread counts its own) [default: 1, every
    /// request: the log's counts then equal what clients got].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub access_log_sample: Option<u64>,
    /// Take the listening sockets of the proxy running on the same --listen address (this
    /// binary or another): serve on them, then that one stops accepting and finishes its
    /// requests. Nothing is refused meanwhile; a take-over that cannot start leaves the
    /// running proxy serving.
    #[arg(long)]
    pub take_over: bool,
    /// Start the proxy in the background and return once it serves (exit 0), or with its exit
    /// status if it cannot start: a unit's `ExecReload=` with `--take-over`.
    #[arg(long)]
    pub background: bool,
}

#[derive(Debug, Subcommand)]
pub enum ProxyAction {
    /// Ask the proxy serving a config file to read it again: routes added, removed or changed
    /// apply to new requests, nothing in flight is dropped. A file that does not parse (or
    /// changes a listener) is refused at its line and column, exit 2; the routes in force go on.
    Reload {
        /// The config file the proxy was started with.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
}

/// The folder a deploy works in.
#[derive(Debug, Clone, Args)]
pub struct RootArgs {
    /// Folder holding releases/, current, deploy.log.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub root: PathBuf,
}

/// What a deploy (and a rollback, which is one) runs by beyond its release: the policy, and
/// the numbers the command line sets over it.
#[derive(Debug, Args)]
pub struct GateArgs {
    /// Rollout policy (Nickel, or its exported JSON), checked by the contracts first.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Policy entry to read (default: the service name with `-` as `_`).
    #[arg(long, value_name = "NAME")]
    pub policy_entry: Option<String>,
    /// Readiness deadline of the candidate in milliseconds (over the policy's
    /// progress_deadline_ms, else 1500); the same as the positional DEADLINE_MS, which
    /// needs a PORT before it.
    #[arg(long, value_name = "MS")]
    pub deadline_ms: Option<u64>,
    /// After SIGTERM, how long the old release (or a failed candidate) gets before SIGKILL
    /// (default: the policy's stop_grace_ms, else 5000).
    #[arg(long, value_name = "MS")]
    pub grace_ms: Option<u64>,
    /// When `rollgate proxy` serves the root: how long it may take to finish the old
    /// release's requests before SIGTERM (default: the policy's drain_timeout_ms, else 30000).
    #[arg(long, value_name = "MS")]
    pub drain_timeout_ms: Option<u64>,
    /// After the switch, watch the new release this long with the previous one kept
    /// running, and switch back if it exits or keeps failing its probe (default: the
    /// policy's watch_ms, else 2000; 0 = no watch).
    #[arg(long, value_name = "MS")]
    pub watch_ms: Option<u64>,
    #[command(flatten)]
    pub eval: EvalArgs,
}

/// `rollgate deploy`'s arguments.
#[derive(Debug, Args)]
pub struct DeployArgs {
    /// Service name: the executable's file name under releases/<version>/.
    pub service: String,
    /// `VERSION` (the port taken from --ports), or `PORT VERSION [DEADLINE_MS]`: the port
    /// the candidate listens on (127.0.0.1) beside the live release's, the version (a
    /// folder under releases/), and a readiness deadline in milliseconds (over the
    /// policy's).
    #[arg(required = true, num_args = 1..=3, value_name = "[PORT] VERSION [DEADLINE_MS]")]
    pub positional: Vec<String>,
    /// Ports to pick the candidate's from when none is given (`8081-8082`: at least two):
    /// the lowest that is neither the live release's nor its fallback's and is free. The
    /// policy's `ports` serves when neither PORT nor this is given.
    #[arg(long, value_name = "A-B")]
    pub ports: Option<String>,
    #[command(flatten)]
    pub target: RootArgs,
    #[command(flatten)]
    pub gate: GateArgs,
    /// Exit once switched, leaving the watch to a background `rollgate watch` (its pid is
    /// printed and recorded in the root).
    #[arg(long)]
    pub no_wait: bool,
    /// Print what would happen (the values and where each came from, the checks that
    /// would refuse it) and change nothing; exit 2 if a check would refuse it.
    #[arg(long)]
    pub dry_run: bool,
}

/// `rollgate rollback`'s arguments.
#[derive(Debug, Args)]
pub struct RollbackArgs {
    pub service: String,
    #[command(flatten)]
    pub target: RootArgs,
    /// Port for the earlier release (default: chosen from --ports or the policy's `ports`,
    /// else the one it was live on).
    #[arg(long)]
    pub port: Option<u16>,
    /// Ports to pick the earlier release's from, as for `deploy`.
    #[arg(long, value_name = "A-B", conflicts_with = "port")]
    pub ports: Option<String>,
    #[command(flatten)]
    pub gate: GateArgs,
    /// Why rollgate itself rolls back (a keeper that saw a crash loop after the switch): said
    /// in the `rolled_back` line, which names the keeper as what ended the release.
    #[arg(long, hide = true)]
    pub because: Option<String>,
    /// Roll back only from this version (a keeper's rollback: another keeper of the same
    /// release may have rolled it back already).
    #[arg(long, hide = true, value_name = "VERSION")]
    pub from: Option<String>,
}

#[derive(Debug, Args)]
pub struct ScaleArgs {
    pub service: String,
    /// TYPE=COUNT, one or more (worker=4).
    #[arg(required = true, value_name = "TYPE=COUNT")]
    pub counts: Vec<String>,
    #[command(flatten)]
    pub target: RootArgs,
    /// Ports for web's fresh replicas when web=N is asked (as for `rollout`); other types
    /// take no port.
    #[arg(long, value_name = "A-B")]
    pub ports: Option<String>,
    #[command(flatten)]
    pub gate: GateArgs,
}

#[derive(Debug, Args)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub command: Option<RolloutCommand>,
    /// Service name: the executable's file name under releases/<version>/.
    #[arg(required = true)]
    pub service: Option<String>,
    /// Version to roll out: a folder under releases/.
    #[arg(required = true)]
    pub version: Option<String>,
    #[command(flatten)]
    pub target: RootArgs,
    /// Rollout policy (Nickel, or its exported JSON), checked by the contracts first.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Policy entry to read (default: the service name with `-` as `_`).
    #[arg(long, value_name = "NAME")]
    pub policy_entry: Option<String>,
    /// Replicas (default: the policy's, else the pool's size, else 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub replicas: Option<u64>,
    /// Ports replica processes take, first-last (needed for a root's first rollout; later
    /// ones reuse the range).
    #[arg(long, value_name = "A-B")]
    pub ports: Option<String>,
    /// Cumulative percentages of the replicas each wave moves (default: the policy's, else
    /// 1,10,50,100).
    #[arg(long, value_name = "PCTS")]
    pub waves: Option<String>,
    /// Wait between waves, watching the new replicas (`30s`, `500ms`, `2m`; default: the
    /// policy's soak_ms, else none).
    #[arg(long, value_name = "DURATION")]
    pub soak: Option<String>,
    /// Readiness deadline of each replica in milliseconds (overrides the policy).
    #[arg(long, value_name = "MS")]
    pub deadline_ms: Option<u64>,
    /// After SIGTERM, how long a replica gets before SIGKILL (default: the policy's
    /// stop_grace_ms, else 5000).
    #[arg(long, value_name = "MS")]
    pub grace_ms: Option<u64>,
    /// How long `rollgate proxy` may take to finish a replica's requests before it is stopped
    /// (default: the policy's drain_timeout_ms, else 30000).
    #[arg(long, value_name = "MS")]
    pub drain_timeout_ms: Option<u64>,
    /// After the last wave, watch the new replicas this long before the rollout is promoted
    /// (a replica that fails goes back; default: the policy's watch_ms, else 2000; 0 = none).
    #[arg(long, value_name = "MS")]
    pub watch_ms: Option<u64>,
    /// Print the plan (values and where each came from, the waves, the checks that would
    /// refuse it) and change nothing; exit 2 if a check would refuse it.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub eval: EvalArgs,
}

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// Where the service's rollout stands: waves, each replica's state, the abort cause.
    Status {
        service: String,
        #[command(flatten)]
        target: RootArgs,
        #[arg(long, short, value_enum, default_value = "table")]
        format: Format,
        /// On a terminal, every column of the replicas' table (without it: slot, wave, state,
        /// serving, finished, error). Printed to a pipe it always has every column.
        #[arg(long)]
        wide: bool,
    },
    /// Stop starting replicas; those mid-upgrade go back to their previous version (exit 0).
    Pause {
        service: String,
        #[command(flatten)]
        target: RootArgs,
        /// Why (at most 500 characters; kept in the state and the log).
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
    },
    /// Continue a paused rollout, or one whose rollgate died; runs it to its end here (exit
    /// codes as for a rollout).
    Resume {
        service: String,
        #[command(flatten)]
        target: RootArgs,
    },
    /// Stop the rollout for good; replicas mid-upgrade go back to their previous version, and
    /// with --rollback every replica that took the new version too (exit 0).
    Abort {
        service: String,
        #[command(flatten)]
        target: RootArgs,
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        /// Return every replica to the version it ran before the rollout.
        #[arg(long)]
        rollback: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum LogCommand {
    /// The lesson's summary line: outcomes, rollback reasons, and the live release.
    #[command(after_help = "Examples:
  rollgate log summary fixtures/gated.log
  rollgate log summary a.log b.log --merge
  rollgate log summary deploy.log --format table

Prints {\"releases\",\"promoted\",\"rolled_back\",\"reasons\",\"live\"}: releases counts outcomes
(promoted and rolled_back) only; a reason is the detail up to its first \"; \"; live is the
version of the last promoted record, never a rolled-back one.")]
    Summary {
        #[arg(required = true, value_name = "LOG")]
        logs: Vec<PathBuf>,
        /// Treat all logs as one history ordered by ts (default: one line per log).
        #[arg(long)]
        merge: bool,
        /// Compute the summary with this Nickel query instead of the built-in one: a function
        /// from the records ({ ts, event, version, detail }) to a record of the summary's shape.
        #[arg(long, value_name = "FILE.ncl")]
        query: Option<PathBuf>,
        /// Also sum up a proxy access log (ROOT/access.log, its rotated files too): requests
        /// by status class, and by release and class, on a line after the summary.
        /// Repeatable.
        #[arg(long = "access", value_name = "FILE")]
        access: Vec<PathBuf>,
        #[command(flatten)]
        eval: EvalArgs,
        #[arg(long, short, value_enum, default_value = "json")]
        format: Format,
        #[command(flatten)]
        read: ReadArgs,
    },
    /// One row per attempt: started, finished, outcome, time to outcome, reason, time live.
    #[command(after_help = "Examples:
  rollgate log history deploy.log
  rollgate log history deploy.log --format csv > attempts.csv
  rollgate log history deploy.log --at 1730540400
  rollgate log history deploy.log --at 2026-11-02T10:00:00+01:00")]
    History {
        #[arg(required = true, value_name = "LOG")]
        logs: Vec<PathBuf>,
        /// Instead of the history, say which release was live at this time (Unix seconds or
        /// RFC 3339).
        #[arg(long, value_name = "TIME")]
        at: Option<String>,
        #[arg(long, short, value_enum, default_value = "table")]
        format: Format,
        /// On a terminal, every column (without it: version, finished, outcome, time to
        /// outcome and reason). Printed to a pipe or a file the table always has every column.
        #[arg(long)]
        wide: bool,
        #[command(flatten)]
        read: ReadArgs,
    },
    /// Print each record as it is appended, like `tail -F`: whole records only, through
    /// rotation (`deploy.log` renamed to `deploy.log.1`) and truncation; Ctrl-C stops it.
    #[command(after_help = "Examples:
  rollgate log follow /srv/edge/deploy.log
  rollgate log follow deploy.log --format json | jq -c 'select(.event == \"rolled_back\")'
  rollgate log follow deploy.log --from-start --version v2 --format csv")]
    Follow {
        #[arg(value_name = "LOG")]
        log: PathBuf,
        /// Start at the log's first record instead of its end.
        #[arg(long)]
        from_start: bool,
        #[arg(long, short, value_enum, default_value = "table")]
        format: Format,
        #[command(flatten)]
        read: ReadArgs,
    },
    /// Each schedule's runs: how many, succeeded and failed, the success rate, the
    /// due times skipped and missed, the last success and failure, the longest run.
    #[command(after_help = "Examples:
  rollgate log schedules /srv/edge/deploy.log
  rollgate log schedules deploy.log --since 2026-11-01 --format json")]
    Schedules {
        #[arg(required = true, value_name = "LOG")]
        logs: Vec<PathBuf>,
        #[arg(long, short, value_enum, default_value = "table")]
        format: Format,
        #[command(flatten)]
        read: ReadArgs,
    },
    /// Attempts, promotion frequency, candidate rejection rate, rollbacks by reason and version,
    /// time to promotion and to rollback, exposure to releases rolled back after promotion.
    #[command(after_help = "Examples:
  rollgate log stats deploy.log
  rollgate log stats deploy.log --since 2026-11-01 --format json

Candidate rejection rate = rolled_back / (promoted + rolled_back): failures the gate caught
before users saw them, not DORA's change failure rate. Time to ready = candidate_started to
promoted: not lead time (the log has no commit times).")]
    Stats {
        #[arg(required = true, value_name = "LOG")]
        logs: Vec<PathBuf>,
        #[arg(long, short, value_enum, default_value = "table")]
        format: Format,
        #[command(flatten)]
        read: ReadArgs,
    },
    /// Run polars SQL over table `log` (line, ts, event, version, detail, and any extra
    /// fields), table `attempts` (as `history` shows them) and, with --access, table `access`
    /// (the proxy's access log: ts, route, host, method, path, status, bytes, duration_ms,
    /// release, slot, client, request_id, file).
    #[command(after_help = "Examples:
  rollgate log query deploy.log --sql \"SELECT event, count(*) AS n FROM log GROUP BY event ORDER BY n DESC\"
  rollgate log query deploy.log --sql \"SELECT version, time_to_outcome_s FROM attempts WHERE outcome = 'promoted'\" --format csv
  rollgate log query deploy.log --access access.log --access access.log.1 --sql \"SELECT release, status, count(*) AS n FROM access GROUP BY release, status\"")]
    Query {
        #[arg(required = true, value_name = "LOG")]
        logs: Vec<PathBuf>,
        /// A proxy access log (ROOT/access.log, its rotated files too), as table `access`.
        /// Repeatable.
        #[arg(long = "access", value_name = "FILE")]
        access: Vec<PathBuf>,
        /// The query.
        #[arg(long)]
        sql: String,
        #[arg(long, short, value_enum, default_value = "table")]
        format: Format,
        #[command(flatten)]
        read: ReadArgs,
    },
}

/// Which records to read; shared by every `log` command.
#[derive(Debug, Clone, Args)]
pub struct ReadArgs {
    /// Refuse a log with any bad record line (exit 1) instead of warning and skipping it.
    #[arg(long)]
    pub strict: bool,
    /// Only records at or after this time (Unix seconds or RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Only records at or before this time (Unix seconds or RFC 3339).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
    /// Only records of this version.
    #[arg(long = "version", value_name = "VERSION")]
    pub only_version: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum SchedulesCommand {
    /// Each schedule of the live release's policy: its expression, state, next due time, last
    /// run and its result, the runs going.
    List {
        #[command(flatten)]
        target: RootArgs,
        #[arg(long, short, value_enum, default_value = "table")]
        format: Format,
        /// On a terminal, every column (printed to a pipe the table always has every one).
        #[arg(long)]
        wide: bool,
    },
    /// Run a schedule now, in the live release, under its rules; its exit status is this
    /// command's.
    Run {
        /// Service name.
        service: String,
        /// The schedule (the policy's `schedules.NAME`).
        name: String,
        #[command(flatten)]
        target: RootArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum ReleaseCommand {
    /// Install a release whole: SOURCE is an executable (it becomes releases/VERSION/SERVICE),
    /// a folder holding an executable SERVICE, or a .tar.gz/.tgz archive of such a folder.
    #[command(after_help = "Examples:
  rollgate release add edge-svc v2 ./target/release/edge-svc --root /srv/edge
  rollgate release add edge-svc v3 dist/edge-svc-v3.tgz --root /srv/edge
  rollgate release add edge-svc v4 dist/v4/ --root /srv/edge --manifest dist/v4/manifest.json

Staged inside releases/ under a hidden name, synced, then renamed in at once: a release is
either absent or whole. releases/VERSION/release.json records when, from where, the size and
the SHA-256 of the executable and of the whole tree. Refused (exit 2, nothing installed): a bad
name, a VERSION already installed with other bytes (the same bytes: exit 0, already
installed), an archive entry that is absolute, has `..`, is a link leading outside, a device,
fifo or socket, or replaces release.json; a truncated or corrupt archive; more than 2 GiB of
content or 100000 entries; a --manifest that does not verify against ROOT/trust.json.")]
    Add {
        /// Service name: the executable's file name in the release folder.
        service: String,
        /// The release's version: its folder's name under releases/.
        version: String,
        /// An executable, a folder holding SERVICE, a .tar.gz/.tgz archive of such a folder, or
        /// an image: `docker-archive:FILE.tar` (what `docker save` writes; see docs/containers.md).
        source: PathBuf,
        #[command(flatten)]
        target: RootArgs,
        /// A signed release's manifest, verified (against ROOT/trust.json, with the staged
        /// files) before anything is installed, and kept with the release.
        #[arg(long, value_name = "MANIFEST")]
        manifest: Option<PathBuf>,
        /// The most bytes of content (uncompressed) the release may hold.
        #[arg(long, value_name = "BYTES", default_value_t = rollgate::release::install::MAX_BYTES)]
        max_bytes: u64,
        /// The most entries (files, folders, links) the release may hold.
        #[arg(long, value_name = "N", default_value_t = rollgate::release::install::MAX_ENTRIES)]
        max_entries: usize,
    },
    /// Remove the oldest releases beyond the newest N, never one that is live, a fallback, in
    /// flight, running in a replica, the last good one or the signed floor.
    #[command(
        after_help = "Each is renamed out of releases/ first (a hidden name), then deleted: a
release is never seen half-removed, and what a killed prune left is deleted by the next one."
    )]
    Prune {
        #[command(flatten)]
        target: RootArgs,
        /// How many of the newest releases to keep (whatever they are).
        #[arg(long, value_name = "N", default_value_t = rollgate::defaults::KEEP_RELEASES)]
        keep: usize,
        /// Say what would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Remove one release, whatever its age (a broken build frees its version name), unless it
    /// is live, a fallback, in flight, running in a replica, the last good one or the floor.
    #[command(after_help = "Example:
  rollgate release rm v7 --root /srv/edge

Refused (exit 2, nothing removed) for a release that is not installed or is marked in
`release list`. Removed as prune removes: renamed out of releases/ first, then deleted.")]
    Rm {
        /// The release's version, as `release list` shows it.
        version: String,
        #[command(flatten)]
        target: RootArgs,
        /// Say whether it would be removed; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Every installed release: when, size, digest, signed, config, its last outcome, and
    /// what it is now (live, fallback, in_flight, last_good, floor, replica).
    List {
        #[command(flatten)]
        target: RootArgs,
        #[arg(long, short, value_enum, default_value = "table")]
        format: Format,
        /// On a terminal, every column (printed to a pipe the table always has every one).
        #[arg(long)]
        wide: bool,
    },
    /// Make a new P-256 signing key (PKCS#8 PEM, mode 0600) and its public key beside it
    /// (KEY.pub.pem); print its pin. Never overwrites a file.
    Keygen {
        #[arg(long, value_name = "KEY.pem")]
        out: PathBuf,
    },
    /// Write DIR/manifest.json: the folder's files with their digests, signed by KEY.
    #[command(
        after_help = "Every regular file at the top of DIR is an artifact, except
manifest.json, hidden files and rollgate's *.output files. Cosigners' public keys are listed
in the manifest so that they can add their signatures with `rollgate release cosign`."
    )]
    Sign {
        dir: PathBuf,
        #[arg(long)]
        service: String,
        #[arg(long)]
        version: String,
        /// Above every earlier release's: a root refuses a sequence at or below its floor.
        #[arg(long)]
        sequence: u64,
        /// How long the signature is good for (30d, 12h, 90m, 45s).
        #[arg(long, default_value = "30d")]
        expires: String,
        #[arg(long, value_name = "KEY.pem")]
        key: PathBuf,
        /// Public keys of the other signers (comma-separated .pub.pem files).
        #[arg(long, value_delimiter = ',', value_name = "A.pub.pem,B.pub.pem")]
        cosigners: Vec<PathBuf>,
    },
    /// Add KEY's signature to a manifest that lists it.
    Cosign {
        manifest: PathBuf,
        #[arg(long, value_name = "KEY.pem")]
        key: PathBuf,
    },
    /// Check a manifest: exit 0, or 1 with the reason (malformed, not-canonical, threshold,
    /// expired, product, digest).
    Verify {
        manifest: PathBuf,
        /// Pins of the trusted keys (comma-separated sha256/...).
        #[arg(long, value_delimiter = ',', required = true)]
        pins: Vec<String>,
        /// How many distinct pinned keys must have signed.
        #[arg(long)]
        threshold: usize,
        /// Also check every artifact's size and digest in this folder.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// The service the release must be for.
        #[arg(long)]
        service: Option<String>,
        /// Check as of this time (RFC 3339 or Unix seconds) instead of now.
        #[arg(long, value_name = "TIME")]
        at: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum WebhooksCommand {
    /// One pass: every record due to each endpoint, in order, until one fails.
    Send {
        #[command(flatten)]
        target: RootArgs,
    },
    /// Every delivery attempt: when, to which endpoint, which message, what it answered.
    Deliveries {
        #[command(flatten)]
        target: RootArgs,
        #[arg(long, short, value_enum, default_value = "table")]
        format: Format,
    },
    /// Send one message again (by its id, as `deliveries` lists it) to every endpoint that
    /// asks for its event.
    Redeliver {
        id: String,
        #[command(flatten)]
        target: RootArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// Write an Ansible playbook (stdout) that rolls VERSION across an inventory group, each
    /// host running `rollgate deploy` (or `rollgate rollout`) under the same policy, in the
    /// policy's waves.
    #[command(
        after_help = "Inventory variables per host: rollgate_root (its root folder),
rollgate_ports (a range: rollgate picks the port that is not live) or rollgate_port; a host
whose root has replicas.json (or rollgate_replicas=true) is moved by a rollout; optional
rollgate_class (required | best_effort | left_behind) and rollgate_bin (default: rollgate).

Exit codes: 0 written; 1 the policy was refused; 2 usage."
    )]
    Playbook {
        /// The reviewed policy (.ncl, or .json/.yaml/.yml/.toml); it travels inside the
        /// playbook as its exported JSON.
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// Policy entry (default: the service name with `-` as `_`).
        #[arg(long, value_name = "NAME")]
        entry: Option<String>,
        #[arg(long)]
        service: String,
        #[arg(long)]
        version: String,
        /// The inventory group holding the service's hosts.
        #[arg(long, value_name = "GROUP")]
        group: String,
        /// How many of the group's hosts move (left-behind ones not counted): the waves are
        /// cut for this many, and the play refuses to run on a group of another size.
        #[arg(long, value_name = "N")]
        hosts: usize,
        /// The rollgate executable on each host (default: `rollgate` on its PATH).
        #[arg(long, value_name = "PATH", default_value = "rollgate")]
        rollgate: String,
        #[command(flatten)]
        eval: EvalArgs,
    },
    /// One host's step of the play `fleet playbook` writes: keep the policy read from
    /// standard input in the root, then move the host: `rollout` where the root runs replicas
    /// (replicas.json, or --replicas), `deploy` otherwise.
    #[command(
        after_help = "The policy on standard input is the JSON `rollgate policy export` writes (the playbook
carries it); it is kept as ROOT/.rollgate-fleet-policy.json, the copy the host was held to,
and checked by the contract like any --policy file.

Examples:
  rollgate policy export policy.ncl | rollgate fleet move edge-svc v2 --root /srv/edge --ports 8081-8082

Exit codes: those of the deploy or rollout it runs: 0 promoted; 1 rolled back; 2 refused
before anything started (not a root, a policy that is not JSON, --port on a replica root);
3 escalated."
    )]
    Move {
        service: String,
        version: String,
        #[command(flatten)]
        target: RootArgs,
        /// The one port a deploy starts the release on.
        #[arg(long, conflicts_with = "ports")]
        port: Option<u16>,
        /// Ports to pick from (a deploy: the one that is not live), or the replicas' range.
        #[arg(long, value_name = "A-B")]
        ports: Option<String>,
        /// Move by a rollout even before the root's first replicas.json.
        #[arg(long)]
        replicas: bool,
        /// Policy entry (default: the service name with `-` as `_`).
        #[arg(long, value_name = "NAME")]
        policy_entry: Option<String>,
        #[command(flatten)]
        eval: EvalArgs,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Evaluate a policy and print it as `nickel export` would, or hand it to an orchestrator.
    #[command(after_help = "Examples:
  rollgate policy export contracts/policy.ncl
  rollgate policy export contracts/policy.ncl --format yaml
  rollgate policy export contracts/policy.ncl --format k8s --image registry.example/edge:v2
  rollgate policy export contracts/policy.ncl --format argo --strict > edge-rollout.yaml
  rollgate policy export contracts/policy.ncl --format nomad | jq .Job.TaskGroups[0].Update
  rollgate policy export app.ncl --format k8s --image registry.example/app:v4 --procfile Procfile

`import \"rollout-policy.ncl\"` resolves to, in order: the importing file's folder, each
--import-path, each folder of NICKEL_IMPORT_PATH, then the contract bundled in rollgate.
JSON, YAML and TOML files are maps of service name to policy; the bundled RolloutPolicy
contract is applied to every entry.

k8s, argo and nomad write one document per service entry in that engine's own fields; what the
engine cannot express is listed on stderr (`not expressed in ENGINE: ...`) and named in the
document (an annotation or Meta field). --strict refuses such a policy instead.

Exit codes: 0 exported; 1 the policy was refused (Nickel's diagnostic on stderr), or the engine
would refuse it, or --strict found something the engine cannot express; 2 usage.")]
    Export {
        /// The policy file (.ncl, or .json/.yaml/.yml/.toml).
        file: PathBuf,
        /// Output format: the policy itself (json, yaml, toml), or a Kubernetes Deployment
        /// (k8s), an Argo Rollouts Rollout (argo) or a Nomad job's update block (nomad).
        #[arg(long, short, value_enum, default_value = "json")]
        format: ExportAs,
        /// With k8s, argo or nomad: refuse a policy the engine cannot express in full.
        #[arg(long)]
        strict: bool,
        /// With k8s or argo: the container image (without it the object names none).
        #[arg(long, value_name = "IMAGE")]
        image: Option<String>,
        /// With k8s or argo: the port the service listens on (the probe's `http` port, and
        /// `PORT` in its environment).
        #[arg(long, value_name = "PORT", default_value_t = rollgate::defaults::EXPORT_PORT)]
        port: u16,
        /// With k8s or nomad: the release's Procfile, whose types run as a Deployment (a task
        /// group) each and whose `release:` line runs before them (docs/process-types.md).
        #[arg(long, value_name = "PROCFILE")]
        procfile: Option<PathBuf>,
        #[command(flatten)]
        eval: EvalArgs,
    },
    /// Check many policy files in one process: one line per file, then a total.
    #[command(after_help = "Examples:
  rollgate policy check policies/*.ncl
  rollgate policy check --format github policies/*.ncl policies/*.yaml
  rollgate policy check --format json policy.ncl | jq .

Exit codes: 0 every file passed; 1 at least one failed; 2 usage.")]
    Check {
        /// Policy files (.ncl, .json, .yaml, .yml, .toml).
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Report format.
        #[arg(long, short, value_enum, default_value = "text")]
        format: CheckFormat,
        #[command(flatten)]
        eval: EvalArgs,
    },
    /// Print the policy a service is held to: the one kept in its root for the live release
    /// (or `--release V`), which every command not given `--policy` runs under.
    #[command(after_help = "Examples:
  rollgate policy show --root /srv/edge
  rollgate policy show --root /srv/edge --release v3 | jq .kept.value.isolation

Prints JSON: {\"version\": the release, \"kept\": {\"source\", \"sha256\", \"entry\", \"value\"}}, with
\"kept\": null for a release deployed without a policy (the defaults).

Exit codes: 0 printed; 2 no such root, or nothing is live and no --release was named.")]
    Show {
        #[command(flatten)]
        target: RootArgs,
        /// This release's kept policy instead of the live one's.
        #[arg(long, value_name = "VERSION")]
        release: Option<String>,
    },
    /// Print the bundled RolloutPolicy contract.
    Contract,
}

/// How policies are evaluated; shared by every command that reads one.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// Extra folder to look up imports in (repeatable), as Nickel's `--import-path`.
    #[arg(long = "import-path", short = 'I', value_name = "DIR")]
    pub import_paths: Vec<PathBuf>,
    /// Give up on an evaluation after this many milliseconds.
    #[arg(long, value_name = "MS", default_value_t = rollgate::defaults::EVAL_TIMEOUT_MS)]
    pub timeout_ms: u64,
    /// Refuse policy files (and files they import) larger than this.
    #[arg(long, value_name = "BYTES", default_value_t = rollgate::defaults::EVAL_MAX_FILE_BYTES)]
    pub max_file_bytes: u64,
    /// Let a policy import files outside its own folder tree, the import-path folders and the
    /// bundled contract. Off by default: a policy from a pull request could otherwise read any
    /// file the CI job can (`import "/proc/self/environ" as 'Text`) and print it.
    #[arg(long)]
    pub allow_import_anywhere: bool,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// The live (or named) release's env, secrets by name only.
    Show {
        service: String,
        version: Option<String>,
        #[command(flatten)]
        target: RootArgs,
    },
    /// What changed from release A's config to B's.
    Diff {
        service: String,
        a: String,
        b: String,
        #[command(flatten)]
        target: RootArgs,
    },
    /// Make a new release from the live one with this config change (named e.g. v2+c1,
    /// printed), then deploy it through the gate (a rollout on a replica root).
    #[command(after_help = "Examples:
  rollgate config set edge-svc LOG_LEVEL=debug --root /srv/edge --ports 8081-8082
  rollgate config set edge-svc --secret API_TOKEN=api-token --root /srv/edge --ports 8081-8082
  rollgate config set edge-svc --unset LOG_LEVEL --no-deploy --root /srv/edge

The executable and every other file are shared with the live release by hard links; the new
release has its own env and secrets files. A config that makes the release fail its gate rolls
back on its own, the old config still serving; `rollgate rollback` brings the old config back
exactly, because it is the old release.")]
    Set {
        service: String,
        /// KEY=VALUE pairs to set.
        #[arg(value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Remove a variable (repeatable).
        #[arg(long, value_name = "KEY")]
        unset: Vec<String>,
        /// KEY gets the value of the root's secret NAME (repeatable).
        #[arg(long, value_name = "KEY=NAME")]
        secret: Vec<String>,
        #[command(flatten)]
        target: RootArgs,
        /// Ports to pick the candidate's from (as for `deploy`, the policy's `ports` otherwise;
        /// a replica root keeps its own).
        #[arg(long, value_name = "A-B")]
        ports: Option<String>,
        /// The root's policy, as for `deploy` and `rollout`.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Only make the release; deploy nothing.
        #[arg(long)]
        no_deploy: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Set NAME to the value read from standard input (never from the command line).
    Set {
        name: String,
        #[command(flatten)]
        target: RootArgs,
    },
    /// The secrets' names and when each was set.
    List {
        #[command(flatten)]
        target: RootArgs,
    },
    /// Remove a secret.
    Rm {
        name: String,
        #[command(flatten)]
        target: RootArgs,
    },
}

/// `rollgate container-run`'s words (see `host::container::RunSpec`).
#[derive(Debug, clap::Args)]
pub struct ContainerRunArgs {
    /// The image ID (`sha256:…`).
    #[arg(long)]
    pub image: String,
    /// The container's name.
    #[arg(long)]
    pub name: Option<String>,
    /// A label, `KEY=VALUE` (prefixed `dev.rollgate.`).
    #[arg(long, value_name = "KEY=VALUE")]
    pub label: Vec<String>,
    /// An environment variable of this process the container gets.
    #[arg(long, value_name = "NAME")]
    pub pass: Vec<String>,
    /// `UID:GID` the container runs as.
    #[arg(long)]
    pub user: Option<String>,
    #[arg(long)]
    pub memory_mb: Option<u64>,
    #[arg(long)]
    pub pids: Option<u64>,
    #[arg(long)]
    pub cpu_pct: Option<u64>,
    #[arg(long)]
    pub nofile: Option<u64>,
    /// A folder mounted read-write at the same path.
    #[arg(long, value_name = "PATH")]
    pub bind: Vec<PathBuf>,
    /// How long a stop waits after SIGTERM before the container is killed.
    #[arg(long, default_value_t = 10_000)]
    pub grace_ms: u64,
    /// The engine's defaults instead of rollgate's confinement (`isolation.enabled = false`).
    #[arg(long)]
    pub unconfined: bool,
    /// An open file rollgate hands over, where an OOM kill of the container is recorded.
    #[arg(long, value_name = "FD")]
    pub verdict_fd: Option<i32>,
    /// A command run in the image instead of its own (`rollgate run` of an image release).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}
