//! `rollgate demo`: the lesson's story, deployed for real. Five releases of a sample service
//! (v1 good; v2 good; v3 ready only after 60 s; v4 exits 78 at boot; v5 says READY=1 on its
//! notification socket) go through the real deployer under the example policy (v5 under the
//! same numbers with `probe = { kind = 'notify }`); then the log tells what happened. A second act moves
//! five replicas behind `rollgate proxy` under a small load: a good rollout in waves, then a
//! bad one that pauses itself and is aborted with rollback, then one whose canary answers 10 %
//! of users with 500 while its probe says ready, rolled back by the traffic judge on its
//! numbers (policy `analysis`), and the requests counted.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::host::state::Root;
use crate::render::Format;

const EXAMPLE_POLICY: &str = include_str!("../../contracts/policy.ncl");

/// The story: version, what it does, the sample-service knobs that make it do that.
const RELEASES: [(&str, &str, &str); 5] = [
    ("v1", "ready after 200 ms", "--ready-after-ms 200"),
    ("v2", "ready after 300 ms", "--ready-after-ms 300"),
    ("v3", "ready only after 60 s", "--ready-after-ms 60000"),
    ("v4", "exits 78 at boot", "--exit-after-ms 0 --exit-code 78"),
    (
        "v5",
        "says READY=1 at 250 ms",
        "--notify --ready-after-ms 250",
    ),
];

/// The example policy with readiness by notification, for the release that speaks it.
const NOTIFY_POLICY: &str = "# The example policy, gated on the release's own READY=1.\nlet reviewed = (import \"policy.ncl\").edge_svc in\n{ edge_svc = reviewed & { probe = { kind = 'notify } } }\n";

/// The demo: both acts, or what kept it from running (exit 1).
pub fn run(root: Option<PathBuf>) -> Result<(), crate::error::Error> {
    both_acts(root).map_err(crate::error::Error::Failed)
}

fn both_acts(root: Option<PathBuf>) -> Result<(), String> {
    let started = Instant::now();
    let root = match root {
        Some(root) => {
            std::fs::create_dir_all(&root)
                .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
            if root.join("current").exists() || root.join("deploy.log").exists() {
                return Err(format!(
                    "{} already holds a deploy (current or deploy.log); give the demo an empty folder",
                    root.display()
                ));
            }
            std::path::absolute(&root).unwrap_or(root)
        }
        None => tempfile::Builder::new()
            .prefix("rollgate-demo-")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary folder: {e}"))?
            .keep(),
    };
    let me = std::env::current_exe().map_err(|e| format!("cannot find rollgate itself: {e}"))?;
    let me = reachable_by_every_user(&me, &root)?;
    write_releases(&root, &me)?;
    let policy = root.join("policy.ncl");
    std::fs::write(&policy, EXAMPLE_POLICY)
        .map_err(|e| format!("cannot write {}: {e}", policy.display()))?;
    let notify_policy = root.join("policy-notify.ncl");
    std::fs::write(&notify_policy, NOTIFY_POLICY)
        .map_err(|e| format!("cannot write {}: {e}", notify_policy.display()))?;

    println!(
        "rollgate demo: five releases of edge-svc, deployed in order under {}",
        root.display()
    );
    println!(
        "policy: policy.ncl (1500 ms to become ready, polled every 100 ms, roll back on a stall);\n        v5 under policy-notify.ncl (the same, ready when it says READY=1)\n"
    );
    for (version, behaviour, knobs) in RELEASES {
        let port = free_port()?;
        let policy = match knobs.contains("--notify") {
            true => &notify_policy,
            false => &policy,
        };
        let out = Command::new(&me)
            .args(["deploy", "edge-svc", &port.to_string(), version, "--policy"])
            .arg(policy)
            .arg("--root")
            .arg(&root)
            .env("NO_COLOR", "1")
            .output()
            .map_err(|e| format!("cannot run the deployer: {e}"))?;
        let outcome = match out.status.code() {
            Some(0) => "promoted".to_string(),
            Some(1) => format!("rolled back: {}", last_reason(&root)),
            _ => format!("refused: {}", String::from_utf8_lossy(&out.stderr).trim()),
        };
        println!("  {version}  {behaviour:<22} -> {outcome}");
    }

    let log = root.join("deploy.log");
    let reading = crate::log::Reading::default();
    let summary = crate::log::summary(
        std::slice::from_ref(&log),
        false,
        Format::Json,
        &reading,
        None,
    )
    .map_err(|e| e.to_string())?;
    let history = crate::log::history(
        std::slice::from_ref(&log),
        Format::Table,
        crate::render::table::Layout::of_stdout(false),
        &reading,
    )
    .map_err(|e| e.to_string())?
    .into_text();
    println!("\nWhat the log says (rollgate log summary deploy.log):\n{summary}");
    println!("Each attempt (rollgate log history deploy.log):\n{history}");

    let stopped = stop_live(&root);
    println!("{stopped}");

    let fleet = root.join("fleet");
    fleet_act(&fleet, &me)?;
    println!(
        "Files: {0}/deploy.log, {0}/current, {0}/releases/, and the second act's {0}/fleet/ (took {1:.1} s). Look again with:\n  rollgate log stats {0}/deploy.log\n  rollgate log history {0}/fleet/deploy.log\n  rollgate rollout status edge-svc --root {0}/fleet",
        root.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The second act's releases: v3 passes as the canary (slot 0) and exits at boot elsewhere;
/// v4 is ready and answers 10 % of users with 500.
const FLEET: [(&str, &str); 4] = [
    ("v1", "exec '{me}' sample-service --ready-after-ms 100"),
    ("v2", "exec '{me}' sample-service --ready-after-ms 150"),
    (
        "v3",
        "[ \"$ROLLGATE_SLOT\" = 0 ] && exec '{me}' sample-service\nexec '{me}' sample-service --exit-after-ms 0 --exit-code 3",
    ),
    ("v4", "exec '{me}' sample-service --error-rate 0.1"),
];

/// The second act's policy for v4: the default waves, a 20 s soak, and the traffic judge, which
/// leaves the canary's first second out (its cold start is no part of the story told).
const JUDGED_POLICY: &str = r#"{"edge_svc": {"progress_deadline_ms": 1500, "poll_ms": 100,
  "max_unavailable_pct": 0, "max_surge_pct": 25, "on_stall": "rollback", "soak_ms": 20000,
  "analysis": {"min_requests": 50, "interval_ms": 1000, "on_fail": "rollback",
               "warmup_ms": 1000}}}
"#;

fn fleet_act(fleet: &Path, me: &Path) -> Result<(), String> {
    write_fleet_releases(fleet, me)?;
    let ports = free_block(8)?;
    let run = |args: &[&str]| {
        Command::new(me)
            .args(args)
            .arg("--root")
            .arg(fleet)
            .env("NO_COLOR", "1")
            .output()
            .map_err(|e| format!("cannot run rollgate: {e}"))
    };
    let first_line = |out: &std::process::Output| {
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().next().unwrap_or_default().to_string();
        if line.is_empty() {
            String::from_utf8_lossy(&out.stderr).trim().to_string()
        } else {
            line
        }
    };
    println!("\nSecond act: five replicas of edge-svc behind `rollgate proxy`, under a small load");
    let out = run(&[
        "rollout",
        "edge-svc",
        "v1",
        "--replicas",
        "5",
        "--ports",
        &ports,
    ])?;
    println!(
        "  v1  installed on 5 replicas                -> {}",
        first_line(&out)
    );
    if out.status.code() != Some(0) {
        stop_fleet(fleet, None);
        return Err("the second act's install failed".into());
    }
    let proxy_port = free_port()?;
    let mut proxy = start_proxy(me, fleet, proxy_port)?;
    let load = Load::start(proxy_port);
    let judged = fleet.join("judged-policy.json");
    std::fs::write(&judged, JUDGED_POLICY)
        .map_err(|e| format!("cannot write {}: {e}", judged.display()))?;
    let judged = judged.display().to_string();
    let steps: [(&str, &[&str]); 4] = [
        (
            "v2  in waves of 1, 2, 3, 5, 500 ms soak  ",
            &["rollout", "edge-svc", "v2", "--soak", "500ms"],
        ),
        (
            "v3  exits at boot except as the canary   ",
            &["rollout", "edge-svc", "v3", "--soak", "500ms"],
        ),
        (
            "abort v3 with rollback                   ",
            &[
                "rollout",
                "abort",
                "edge-svc",
                "--rollback",
                "--reason",
                "v3 exits at boot",
            ],
        ),
        (
            "v4  ready, but 10 % of answers are 500   ",
            &["rollout", "edge-svc", "v4", "--policy", &judged],
        ),
    ];
    for (what, args) in steps {
        let out = run(args)?;
        let code = out.status.code().map_or("killed".into(), |c| c.to_string());
        println!("  {what} -> exit {code}: {}", first_line(&out));
    }
    let (served, failed, errors) = load.finish();
    let on = Root::new(fleet.to_path_buf())
        .read_replicas()
        .ok()
        .flatten()
        .map(|set| {
            set.replicas
                .iter()
                .map(|r| r.version.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    println!("  replicas now: {on}");
    println!(
        "  requests through the proxy: {served}, failed: {failed}, 500 from v4's canary while it was judged: {errors}"
    );
    stop_fleet(fleet, Some(&mut proxy));
    println!("The demo stopped the replicas and the proxy so nothing is left running.\n");
    Ok(())
}

/// The second act's releases: v1 and v2 good, v3 exiting at boot except as the canary.
fn write_fleet_releases(fleet: &Path, me: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    for (version, body) in FLEET {
        let dir = fleet.join("releases").join(version);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join("edge-svc");
        let script = format!(
            "#!/bin/sh\n{}\n",
            body.replace("{me}", &me.display().to_string())
        );
        std::fs::write(&path, script)
            .and_then(|_| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// `rollgate proxy` over the fleet's root on `port`, once it listens.
fn start_proxy(me: &Path, fleet: &Path, port: u16) -> Result<std::process::Child, String> {
    let mut proxy = Command::new(me)
        .args([
            "proxy",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--threads",
            "1",
        ])
        .arg("--root")
        .arg(fleet)
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the proxy: {e}"))?;
    // The load starts once the proxy listens: refusals before that are not the rollout's.
    let listening = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if listening.elapsed() > Duration::from_secs(10) {
            stop_fleet(fleet, Some(&mut proxy));
            return Err("the proxy did not listen within 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(proxy)
}

/// A small steady load through the proxy: one request every few milliseconds, each on a new
/// connection, counting the requests that got no answer and the 500s.
struct Load {
    stop: Arc<AtomicBool>,
    served: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl Load {
    fn start(port: u16) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let (s, ok, bad, five) = (stop.clone(), served.clone(), failed.clone(), errors.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                ok.fetch_add(1, Ordering::SeqCst);
                match status_of_get(port) {
                    Some(200) => {}
                    Some(500) => {
                        five.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {
                        bad.fetch_add(1, Ordering::SeqCst);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Load {
            stop,
            served,
            failed,
            errors,
            thread,
        }
    }

    /// Requests sent, those that got no answer (or another status), and the 500s.
    fn finish(self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.thread.join();
        (
            self.served.load(Ordering::SeqCst),
            self.failed.load(Ordering::SeqCst),
            self.errors.load(Ordering::SeqCst),
        )
    }
}

/// The status of `GET /` through the proxy on a connection of its own (None: no answer).
fn status_of_get(port: u16) -> Option<u16> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(answer.get(..12)?);
    text.strip_prefix("HTTP/1.1 ")?.parse().ok()
}

/// Stops the proxy (SIGTERM, then waits), then the fleet's service as `rollgate stop` does.
fn stop_fleet(fleet: &Path, proxy: Option<&mut std::process::Child>) {
    if let Some(proxy) = proxy {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(proxy.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = proxy.wait();
    }
    let _ = stop_service(fleet);
}

/// The root's service stopped for good by `rollgate stop` itself — every live process and its
/// keeper gone when it returns (a demo leaves nothing running; a real deploy leaves it
/// serving, of course). Err: what stop said when it did not stop it.
fn stop_service(root: &Path) -> Result<(), String> {
    let service = crate::engine::service_of(&Root::new(root.to_path_buf()));
    let me = std::env::current_exe().map_err(|e| format!("cannot find rollgate itself: {e}"))?;
    let out = Command::new(me)
        .args([
            "stop",
            &service,
            "--reason",
            "the demo leaves nothing running",
        ])
        .arg("--root")
        .arg(root)
        .env("NO_COLOR", "1")
        .output()
        .map_err(|e| format!("cannot run rollgate stop: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
    }
}

/// A first port with `count` free ones after it: below the ephemeral range, else from the
/// kernel's pick.
fn free_block(count: u16) -> Result<String, String> {
    // Below the kernel's ephemeral range first (32768 and up on Linux): a busy host's closed
    // client connections wait out TIME_WAIT there and leave few runs of free ports.
    let start = 20_000 + (std::process::id() % 1_000) as u16 * 10;
    for first in (start..32_000).step_by(usize::from(count)).take(200) {
        let last = first + count - 1;
        if (first..=last).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return Ok(format!("{first}-{last}"));
        }
    }
    for _ in 0..50 {
        let first = free_port()?;
        let Some(last) = first.checked_add(count - 1) else {
            continue;
        };
        if (first..=last).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return Ok(format!("{first}-{last}"));
        }
    }
    Err("no block of free ports on 127.0.0.1".into())
}

/// rollgate itself where the demo's releases can run it: each runs as a uid of its own
/// (docs/isolation.md), which cannot enter a folder only root may (a build under /root). Then
/// the demo runs from a link to it (or a copy) in its own folder, and so do its releases.
fn reachable_by_every_user(me: &Path, root: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let searchable =
        |dir: &Path| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
    if me.ancestors().skip(1).all(searchable) {
        return Ok(me.to_path_buf());
    }
    let bin = root.join("bin");
    let copy = bin.join("rollgate");
    let fail = |e: std::io::Error| format!("cannot put rollgate in {}: {e}", bin.display());
    std::fs::create_dir_all(&bin).map_err(fail)?;
    for (dir, bits) in [(root, 0o001), (bin.as_path(), 0o755)] {
        let mode = std::fs::metadata(dir).map_err(fail)?.permissions().mode();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | bits))
            .map_err(fail)?;
    }
    if !copy.is_file() && std::fs::hard_link(me, &copy).is_err() {
        std::fs::copy(me, &copy).map_err(fail)?;
    }
    Ok(copy)
}

fn write_releases(root: &Path, me: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    for (version, _, knobs) in RELEASES {
        let dir = root.join("releases").join(version);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join("edge-svc");
        let script = format!(
            "#!/bin/sh\nexec '{}' sample-service {knobs}\n",
            me.display()
        );
        std::fs::write(&path, script)
            .and_then(|_| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port on 127.0.0.1: {e}"))
}

fn last_reason(root: &Path) -> String {
    let Ok((log, _)) = crate::log::read::read_log(&root.join("deploy.log"), Default::default())
    else {
        return "(no log)".into();
    };
    log.detail
        .last()
        .cloned()
        .flatten()
        .map(|d| crate::log::summary::reason_of(&d).to_string())
        .unwrap_or_default()
}

/// A demo leaves nothing running: the live release is stopped at the end.
fn stop_live(root: &Path) -> String {
    let pointer = match Root::new(root.to_path_buf()).read_pointer() {
        Ok(Some(pointer)) => pointer,
        Ok(None) => return "Nothing is live.".into(),
        Err(e) => return format!("{e}; nothing stopped."),
    };
    let answering = match crate::commands::deploy::answers_ready(pointer.port) {
        true => "answering on /readyz",
        false => "NOT answering",
    };
    match stop_service(root) {
        Ok(()) => format!(
            "Live release: {} ({answering}). The demo stopped it so nothing is left running.",
            pointer.version
        ),
        Err(e) => format!(
            "Live release: {} ({answering}). The demo could not stop it: {e}",
            pointer.version
        ),
    }
}
