//! Shared helpers for the integration tests: the real binary, run on files the test writes.
#![allow(dead_code)]

pub mod browser;
pub mod engine;
pub mod http;
pub mod websocket;

use std::path::{Path, PathBuf};
use std::process::Output;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The rollgate binary the tests run, reachable by every user: releases run as a uid of their
/// own service (issue 59) and exec it by this path (`rollgate sample-service`), so a binary
/// under a folder only root may enter (cargo's target folder under /root) is linked (or copied)
/// once into a folder of the system's temporary one that everyone may enter.
pub fn bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let built = assert_cmd::cargo::cargo_bin("rollgate");
        if reachable_by_everyone(&built) {
            return built;
        }
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = std::fs::metadata(&built).expect("binary built");
        let dir = std::env::temp_dir().join("rollgate-it-bin").join(format!(
            "{}-{}-{}",
            meta.ino(),
            meta.len(),
            meta.mtime_nsec()
        ));
        let reachable = dir.join("rollgate");
        if !reachable.is_file() {
            // Another build's copy is of no more use once its run is over: a hard link keeps
            // its 270 MB alive. One made in the last hours may be a run still going beside
            // this one (a second clone's tests on the same machine): it stays.
            let all = dir.parent().unwrap();
            let stale = |entry: &std::fs::DirEntry| {
                entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|made| made.elapsed().ok())
                    .is_some_and(|age| age > std::time::Duration::from_secs(3 * 3600))
            };
            for old in std::fs::read_dir(all).into_iter().flatten().flatten() {
                if stale(&old) {
                    let _ = std::fs::remove_dir_all(old.path());
                }
            }
            std::fs::create_dir_all(&dir).unwrap();
            for d in [dir.parent().unwrap(), dir.as_path()] {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            let partial = dir.join(format!("rollgate.{}", std::process::id()));
            if std::fs::hard_link(&built, &partial).is_err() {
                std::fs::copy(&built, &partial).unwrap();
            }
            std::fs::rename(&partial, &reachable).unwrap();
        }
        reachable
    })
    .clone()
}

/// Whether every folder above `file` lets others search it.
fn reachable_by_everyone(file: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    file.ancestors()
        .skip(1)
        .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

pub fn rollgate() -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::new(bin());
    cmd.env_remove("NICKEL_IMPORT_PATH").env("NO_COLOR", "1");
    cmd
}

pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// `rollgate policy export [ARGS] FILE`.
pub fn export(file: &Path, args: &[&str]) -> Output {
    rollgate()
        .args(["policy", "export"])
        .args(args)
        .arg(file)
        .output()
        .unwrap()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether a line begins with the output pump's time (`2026-12-07T14:30:36.123Z `).
pub fn timed(line: &str) -> bool {
    let shape = b"dddd-dd-ddTdd:dd:dd.dddZ ";
    line.len() >= shape.len()
        && shape
            .iter()
            .zip(line.as_bytes())
            .all(|(want, got)| match want {
                b'd' => got.is_ascii_digit(),
                other => other == got,
            })
}

/// Output as the release said it: each line's time (the pump's, or `logs`') taken off.
pub fn untimed(text: &str) -> String {
    text.lines()
        .map(|line| match timed(line) {
            true => &line[25..],
            false => line,
        })
        .map(|line| format!("{line}\n"))
        .collect()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A deploy root in a temporary folder, with releases that run the real binary's
/// `sample-service`. Dropping it kills every process still running from it.
pub struct Site {
    pub dir: tempfile::TempDir,
}

impl Site {
    pub fn new() -> Site {
        Site {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The release folders under `releases/`, sorted: hidden ones (`.staging-…` being installed,
    /// `.removing-…` being deleted by the background sweep) are not releases.
    pub fn release_folders(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.root().join("releases"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| !name.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    /// `releases/<version>/edge-svc` running `rollgate sample-service <args>`.
    pub fn release(&self, version: &str, args: &str) {
        let bin = crate::common::bin();
        self.script(
            version,
            &format!("exec '{}' sample-service {args}\n", bin.display()),
        );
    }

    /// The file that arms `version`'s sample service (`--armed-by`): a crash or a hiccup
    /// counted from the moment a test chose, not from the process's start.
    pub fn armed_file(&self, version: &str) -> std::path::PathBuf {
        self.root().join(format!("releases/{version}-armed"))
    }

    /// A sample release that, once `arm(version)` has been called, exits with status 4
    /// `after_ms` after every start (the one running then: `after_ms` after the arming). A test
    /// arms it once its deploy is done, so a slow gate or watch on a loaded machine never meets
    /// the crash.
    pub fn crashing_release(&self, version: &str, after_ms: u64) {
        self.crashing_release_with(version, after_ms, 4);
    }

    /// `crashing_release`, exiting with `code`.
    pub fn crashing_release_with(&self, version: &str, after_ms: u64, code: u8) {
        let armed = self.armed_file(version);
        self.release(
            version,
            &format!(
                "--exit-after-ms {after_ms} --exit-code {code} --armed-by '{}'",
                armed.display()
            ),
        );
    }

    /// From now on `version`'s armed sample service does what it was armed for.
    pub fn arm(&self, version: &str) {
        std::fs::write(self.armed_file(version), "").unwrap();
    }

    /// Arms `version` (see `arm`) from a thread of its own as soon as the deploy log has
    /// `event` (`switched`, `replica_ready`) for it: what it was armed for falls at that moment
    /// of the run, however long the gate before it took on a loaded machine.
    pub fn arm_at(&self, version: &str, event: &str) -> std::thread::JoinHandle<()> {
        let (root, armed, version, event) = (
            self.root().to_path_buf(),
            self.armed_file(version),
            version.to_string(),
            event.to_string(),
        );
        std::thread::spawn(move || {
            let logged = || {
                std::fs::read_to_string(root.join("deploy.log"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .any(|l| l["event"] == event.as_str() && l["version"] == version.as_str())
            };
            if wait_for(120, logged) {
                std::fs::write(armed, "").unwrap();
            }
        })
    }

    /// `releases/<version>/edge-svc` with a shell body of its own.
    pub fn script(&self, version: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = write(
            self.root(),
            &format!("releases/{version}/edge-svc"),
            &format!("#!/bin/sh\n{body}"),
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Installs `version` with `rollgate release add` from an executable with this shell body
    /// (made in a folder of its own, outside the root), as a user would.
    pub fn add_release(&self, version: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let build = tempfile::tempdir().unwrap();
        let exe = write(build.path(), "edge-svc", &format!("#!/bin/sh\n{body}"));
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = rollgate()
            .args(["release", "add", "edge-svc", version])
            .arg(&exe)
            .arg("--root")
            .arg(self.root())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }

    /// [`Site::add_release`] of `rollgate sample-service <args>`.
    pub fn add_sample(&self, version: &str, args: &str) {
        let bin = crate::common::bin();
        self.add_release(
            version,
            &format!("exec '{}' sample-service {args}\n", bin.display()),
        );
    }

    /// Installs `version` with `rollgate release add` from a folder: the sample service as
    /// its executable, and these files beside it (a Procfile, the scripts a type or a schedule
    /// runs).
    pub fn add_sample_with(&self, version: &str, files: &[(&str, &str)]) {
        use std::os::unix::fs::PermissionsExt;
        let build = tempfile::tempdir().unwrap();
        let exe = write(
            build.path(),
            "edge-svc",
            &format!("#!/bin/sh\nexec '{}' sample-service\n", bin().display()),
        );
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        for (name, body) in files {
            write(build.path(), name, body);
        }
        let out = self.run(&[
            "release",
            "add",
            "edge-svc",
            version,
            build.path().to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }

    /// `replicas` replicas of `version` (installed already) live, on the test's `block` of ten
    /// ports ([`ten_ports`]).
    pub fn replicas_of(&self, version: &str, replicas: usize, block: u16) {
        let out = rollgate()
            .args([
                "rollout",
                "edge-svc",
                version,
                "--replicas",
                &replicas.to_string(),
            ])
            .args(["--ports", &ten_ports(block), "--root"])
            .arg(self.root())
            .timeout(std::time::Duration::from_secs(120))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }

    pub fn deploy(&self, port: u16, version: &str, extra: &[&str]) -> Output {
        rollgate()
            .args(["deploy", "edge-svc", &port.to_string(), version, "--root"])
            .arg(self.root())
            .args(extra)
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap()
    }

    /// `rollgate ARGS... --root ROOT`, with a minute's limit.
    pub fn run(&self, args: &[&str]) -> Output {
        rollgate()
            .args(args)
            .arg("--root")
            .arg(self.root())
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap()
    }

    /// `rollgate rollout edge-svc VERSION --root ROOT EXTRA...`, with a minute's limit.
    pub fn rollout(&self, version: &str, extra: &[&str]) -> Output {
        rollgate()
            .args(["rollout", "edge-svc", version, "--root"])
            .arg(self.root())
            .args(extra)
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap()
    }

    /// Starts a deploy in the background and waits until its candidate_started line is logged.
    pub fn deploy_in_background(&self, version: &str, deadline_ms: &str) -> std::process::Child {
        let before = self.log_lines().len();
        let child = std::process::Command::new(crate::common::bin())
            .args([
                "deploy",
                "edge-svc",
                &free_port().to_string(),
                version,
                deadline_ms,
                "--root",
            ])
            .arg(self.root())
            .env("NO_COLOR", "1")
            .spawn()
            .unwrap();
        assert!(
            wait_for(10, || self.log_lines().len() > before),
            "deploy of {version} started"
        );
        child
    }

    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.root().join("deploy.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    pub fn events(&self) -> Vec<(String, String)> {
        self.log_lines()
            .iter()
            .map(|v| {
                (
                    v["event"].as_str().unwrap().to_string(),
                    v["version"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    pub fn last_detail(&self) -> String {
        self.log_lines()
            .last()
            .map(|v| v["detail"].as_str().unwrap().to_string())
            .unwrap_or_default()
    }

    pub fn pointer(&self) -> Option<serde_json::Value> {
        std::fs::read(self.root().join("current"))
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    pub fn live_pid(&self) -> Option<i32> {
        self.pointer().map(|p| p["pid"].as_i64().unwrap() as i32)
    }

    /// Processes whose working directory is inside this root.
    /// The release processes of the root (its keepers apart: [`Site::keepers`]).
    pub fn processes(&self) -> Vec<i32> {
        self.of_root()
            .into_iter()
            .filter(|pid| !is_keeper(*pid))
            .collect()
    }

    /// The root's keepers (`rollgate keep`, one beside each release process it keeps).
    pub fn keepers(&self) -> Vec<i32> {
        self.of_root()
            .into_iter()
            .filter(|pid| is_keeper(*pid))
            .collect()
    }

    /// Every live process whose folder is in the root: releases and keepers.
    fn of_root(&self) -> Vec<i32> {
        // A root a test removed has nothing left to look for.
        let Ok(root) = std::fs::canonicalize(self.root()) else {
            return Vec::new();
        };
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read_link(format!("/proc/{pid}/cwd"))
                    .is_ok_and(|cwd| cwd.starts_with(&root))
                    && !is_zombie(*pid)
            })
            .collect()
    }
}

/// Kills (SIGKILL) the keepers of the root at `root`, found by their entries under
/// `.keepers/` (a root a `Site` does not own: a fleet's hosts).
pub fn kill_keepers_in(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root.join(".keepers")) else {
        return;
    };
    for entry in entries.flatten() {
        if let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        {
            if is_keeper(pid) {
                unsafe { libc_kill(pid, 9) };
            }
        }
    }
}

/// Held by every test that runs a release as the system's `nobody` (uid 65534), declared
/// before its sites (so they are stopped before it is let go): a service's folder changes
/// hands only while nothing runs as its owner, and `nobody` is one user for the whole machine
/// — a test changing back from it was refused while another ran a release as it (CI).
pub fn as_nobody_alone() -> std::sync::MutexGuard<'static, ()> {
    static NOBODY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    NOBODY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `pid` is a keeper: rollgate's own `keep` command.
pub fn is_keeper(pid: i32) -> bool {
    rollgate::host::identity::is_keeper(&pid.to_string())
}

impl Site {
    /// Kills the root's keepers (SIGKILL): its releases run on, kept by nobody.
    pub fn kill_keepers(&self) {
        for pid in self.keepers() {
            unsafe { libc_kill(pid, 9) };
        }
        assert!(wait_for(10, || self.keepers().is_empty()));
    }

    /// `rollgate stop edge-svc`: the service stopped for good (its keepers let it go).
    pub fn stop_service(&self) {
        let out = rollgate()
            .args(["stop", "edge-svc", "--root"])
            .arg(self.root())
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }

    /// Kills every process of the root, as a reboot would: its releases and their keepers
    /// (whose folder is the root). One keeper may start its release again between two kills:
    /// looked for again until none is left.
    pub fn reboot(&self) {
        for _ in 0..50 {
            let left = self.of_root();
            if left.is_empty() {
                return;
            }
            for pid in left {
                unsafe { libc_kill(pid, 9) };
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        self.reboot();
        // A container root's containers outlive their killed supervisors: removed here.
        let has_images = std::fs::read_dir(self.root().join("releases"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|release| release.path().join("image.json").is_file());
        if has_images {
            engine::remove_containers_of(self.root());
        }
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

pub fn send_signal(pid: i32, signal: i32) {
    unsafe { libc_kill(pid, signal) };
}

pub fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(true)
}

/// Every child of `pid`, over all its threads.
pub fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

pub fn alive(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists() && !is_zombie(pid)
}

/// A port nothing listens on right now, handed to no other test of this run: one of
/// [`port_block`]'s. The kernel's pick (binding port 0) came from the ephemeral range, where the
/// next outgoing connection of a test under load could take it before the test's server bound
/// it (with twelve tests at once that race was real: pebble once never came up).
pub fn free_port() -> u16 {
    port_block(1)
}

/// Polls `condition` every 20 ms for up to `seconds`.
pub fn wait_for(seconds: u64, mut condition: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
    while std::time::Instant::now() < end {
        if condition() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// Now in Unix seconds, as the log's `ts`.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// GET / on a port: the sample service answers with its version.
pub fn version_on(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text.rsplit("\r\n\r\n").next()?.trim().to_string())
}

/// A release process the test started itself; killed and reaped when dropped.
pub struct ReleaseProcess(pub std::process::Child);

impl ReleaseProcess {
    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for ReleaseProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `rollgate sample-service` started by the test itself in `releases/<version>/` as the leader
/// of its own process group, the way the deployer starts releases: for states a deployer left.
pub fn start_release_process(site: &Site, version: &str, port: u16) -> ReleaseProcess {
    use std::os::unix::process::CommandExt;
    let dir = site.root().join("releases").join(version);
    std::fs::create_dir_all(&dir).unwrap();
    let child = std::process::Command::new(crate::common::bin())
        .arg("sample-service")
        .current_dir(&dir)
        .env("PORT", port.to_string())
        .env("ROLLGATE_VERSION", version)
        .process_group(0)
        .spawn()
        .unwrap();
    assert!(
        wait_for(10, || version_on(port).is_some()),
        "{version} answers"
    );
    ReleaseProcess(child)
}

/// Field 22 of `/proc/PID/stat`: what the deployer records beside a pid.
pub fn start_time_of(pid: i32) -> u64 {
    stat_field(pid, 19).unwrap()
}

fn stat_field(pid: i32, index: usize) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(index)?
        .parse()
        .ok()
}

/// Live (non-zombie) processes whose process group is `pgid`.
pub fn group_members(pgid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| stat_field(*pid, 2) == Some(pgid as u64) && !is_zombie(*pid))
        .collect()
}

/// Live processes of this root started by a deploy (they carry `ROLLGATE_DEPLOY_TOKEN`),
/// other than the live release's group.
pub fn token_carriers(site: &Site) -> Vec<i32> {
    let live = site.live_pid().map(group_members).unwrap_or_default();
    site.processes()
        .into_iter()
        .filter(|pid| !live.contains(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|var| var.starts_with(b"ROLLGATE_DEPLOY_TOKEN="))
            })
        })
        .collect()
}

/// The pointer JSON the deployer writes for a process.
pub fn pointer_for(version: &str, port: u16, pid: i32) -> serde_json::Value {
    serde_json::json!({"service": "edge-svc", "version": version, "port": port, "pid": pid,
        "start_time": start_time_of(pid), "promoted_at": 1.0})
}

/// How many `event` lines the log holds for `version`.
pub fn count_events(site: &Site, event: &str, version: &str) -> usize {
    site.events()
        .iter()
        .filter(|(e, v)| e == event && v == version)
        .count()
}

/// The folder the tests keep the tools they install in (`.ci/run` fills it first).
pub fn tools_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME is set")
        .join("rollgate-tools")
}

/// The Python tools the tests run, each from PyPI, one virtual environment for all of them.
pub const PYTHON_TOOLS: &[(&str, &str)] = &[
    ("ansible-core", "ansible-playbook"),
    ("kubernetes-validate==1.37.0", "kubernetes-validate"),
];

/// Python libraries the tests import, each from PyPI, with the module that tells it is there:
/// `prometheus-client`'s parser is the real reader of `/metrics` (issue 38); httpx with its
/// HTTP/2 extra is a client of the TLS listener, and its `h2` writes the rapid-reset flood
/// (issue 47); `websockets` is both ends of a WebSocket kept open across reloads (issue 48);
/// gunicorn and uvicorn serve the conformance tests' releases (issue 79).
pub const PYTHON_MODULES: &[(&str, &str)] = &[
    ("prometheus-client==0.26.0", "prometheus_client"),
    ("httpx[http2]==0.28.1", "h2"),
    ("websockets==15.0.1", "websockets"),
    // Servers users run behind the proxy (issue 79's conformance matrix): gunicorn's sync and
    // gthread workers, uvicorn.
    ("gunicorn==23.0.0", "gunicorn"),
    ("uvicorn==0.32.1", "uvicorn"),
];

/// The `bin` folder of the tools' virtual environment, created and filled now if `.ci/run`
/// has not done it.
pub fn python_tools() -> PathBuf {
    static FOUND: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let venv = tools_dir().join("venv");
            let bin = venv.join("bin");
            if !bin.join("python").is_file() {
                let made = std::process::Command::new("python3")
                    .args(["-m", "venv"])
                    .arg(&venv)
                    .status()
                    .expect("python3 runs (the tests need Python tools; .ci/run installs them)");
                assert!(made.success(), "python3 -m venv failed");
            }
            let importable = |module: &str| {
                std::process::Command::new(bin.join("python"))
                    .args(["-c", &format!("import {module}")])
                    .status()
                    .is_ok_and(|s| s.success())
            };
            let missing: Vec<&str> = PYTHON_TOOLS
                .iter()
                .filter(|(_, binary)| !bin.join(binary).is_file())
                .chain(
                    PYTHON_MODULES
                        .iter()
                        .filter(|(_, module)| !importable(module)),
                )
                .map(|(package, _)| *package)
                .collect();
            if !missing.is_empty() {
                let installed = std::process::Command::new(bin.join("pip"))
                    .args(["install", "-q"])
                    .args(&missing)
                    .status()
                    .expect("pip runs");
                assert!(installed.success(), "pip could not install {missing:?}");
            }
            bin
        })
        .clone()
}

/// The folder of npm package `spec` (`name@version`) installed under the tools folder, in a
/// prefix of its own; installed now if `.ci/run` has not done it.
pub fn npm_package(prefix: &str, spec: &str) -> PathBuf {
    let dir = tools_dir().join(prefix);
    let name = spec.rsplit_once('@').map_or(spec, |(name, _)| name);
    let package = dir.join("node_modules").join(name);
    if !package.join("package.json").is_file() {
        let status = std::process::Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--silent", "--prefix"])
            .arg(&dir)
            .arg(spec)
            .status()
            .expect("npm runs (the tests need npm packages; .ci/run installs them)");
        assert!(status.success(), "npm could not install {spec}");
    }
    package
}

/// Nushell for the lab tests: `ROLLGATE_TEST_NU`, else `nu` on the PATH, else the prebuilt one
/// from the npm registry.
pub fn nushell() -> PathBuf {
    static FOUND: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("ROLLGATE_TEST_NU") {
                return PathBuf::from(path);
            }
            let on_path = std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join("nu"))
                    .find(|candidate| candidate.is_file())
            });
            if let Some(path) = on_path {
                return path;
            }
            npm_package("nushell", "@nushell/linux-x64@0.115.1").join("bin/nu")
        })
        .clone()
}

/// A deploy today's rollgate left in flight, as its engine saves it (`rollout.json`: one
/// replica in slot 0, a single deploy's record), for the crash tests. `fields` in a deploy's
/// words: `stage` ("spawning": no process yet, "running": gating, "escalated": held at its
/// deadline for a person, "watching": switched and watched), `pid` and `start_time` of its
/// process, `previous` (the pointer it replaces), `started_at`, `grace_ms`, `drain_ms`,
/// `deployer_pid` and `watch` (`until`, `poll_ms`, `failures`, `gate_detail`,
/// `gate_elapsed_ms`, `switch_detail`). The slot has switched when `current` names its process.
pub fn left_deploy(site: &Site, port: u16, token: &str, fields: serde_json::Value) {
    use serde_json::{json, Value};
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut given = json!({"stage": "running", "pid": null, "start_time": null,
        "deployer_pid": 999999, "started_at": started, "grace_ms": 2000, "drain_ms": 0,
        "previous": null, "watch": null});
    for (key, value) in fields.as_object().expect("fields are an object") {
        given[key] = value.clone();
    }
    let stage = given["stage"].as_str().expect("a stage").to_string();
    let process = |p: &Value, token: &str| match p.is_null() {
        true => Value::Null,
        false => json!({"version": p["version"], "port": p["port"], "pid": p["pid"],
            "start_time": p["start_time"], "token": token}),
    };
    let previous = process(&given["previous"], "");
    let candidate = json!({"version": "v2", "port": port, "pid": given["pid"].as_i64().unwrap_or(0),
        "start_time": given["start_time"].as_u64().unwrap_or(0), "token": token});
    let pointer: Value = std::fs::read_to_string(site.root().join("current"))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null);
    let switched = !given["pid"].is_null()
        && pointer["pid"] == given["pid"]
        && pointer["port"] == json!(port)
        && pointer["version"] == "v2";
    let held = stage == "escalated";
    let watch = &given["watch"];
    let mut slot = json!({"slot": 0, "class": "required", "state": "upgrading",
        "live": previous, "candidate": candidate, "wave": 0,
        "from_version": given["previous"]["version"], "retiring": null, "left_pool": false,
        "started": given["started_at"], "finished": null, "error": null, "held": held});
    if switched {
        slot["state"] = "succeeded".into();
        slot["candidate"] = Value::Null;
        slot["live"] = candidate.clone();
        let kept = if stage == "watching" {
            "fallback"
        } else {
            "retiring"
        };
        slot[kept] = previous.clone();
    }
    let rollout = json!({
        "id": token, "service": "edge-svc", "from": given["previous"]["version"], "to": "v2",
        "started_at": given["started_at"],
        "phase": if held { "paused" } else { "running" },
        "settings": {"replicas": 1, "surge": 1, "unavailable": 0, "progress_deadline_ms": 0,
            "poll_ms": if watch.is_null() { json!(100) } else { watch["poll_ms"].clone() },
            "min_ready_ms": 0, "soak_ms": 0, "max_failure_ratio": 0.0,
            "grace_ms": given["grace_ms"], "drain_ms": given["drain_ms"],
            "release_deadline": given["started_at"].as_f64().unwrap_or(0.0) + 100.0 * 365.0 * 86400.0,
            "ports": [port, port], "wave_percents": [100], "keep_fallback": true},
        "waves": [[0]], "wave": 0, "slots": [slot],
        "soak_until": if switched && stage == "watching" { watch["until"].clone() } else { Value::Null },
        "pause_reason": null, "abort_cause": null,
        "single": {"deployer_pid": given["deployer_pid"], "previous": previous,
            "deadline_source": "", "watch_failures": if watch.is_null() { json!(1) } else { watch["failures"].clone() },
            "gate_detail": watch["gate_detail"], "gate_elapsed_ms": watch["gate_elapsed_ms"],
            "switch_detail": if watch.is_null() { json!("") } else { watch["switch_detail"].clone() }},
        "unsettled": true,
    });
    write(site.root(), "rollout.json", &rollout.to_string());
}

/// `{"pid", "start_time"}` of a running process, as a record names it.
pub fn process_fields(pid: i32) -> serde_json::Value {
    serde_json::json!({"pid": pid, "start_time": start_time_of(pid)})
}

/// Where [`port_block`] hands out ports: above the kernel's ephemeral range (61000-65535 on a
/// default Linux), where no outgoing connection and no `bind(0)` lands, and away from the ports
/// that are picked by scanning without being handed out: [`ten_ports`], rollout.rs's blocks
/// (20000-29599) and the demo's own block (20000-32000; the lab tests run the demo beside the
/// others). Below 32768 on a host whose ephemeral range leaves too little room above it.
/// Read once a run: `port_block` asks for every port a test starts a server on.
fn handed_out_ports() -> (u32, u32) {
    static RANGE: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *RANGE.get_or_init(|| {
        let ephemeral_end = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().nth(1)?.parse::<u32>().ok())
            .unwrap_or(60_999);
        match ephemeral_end + 1 {
            low if 65_535u32.saturating_sub(low) >= 2_000 => (low, 65_535),
            _ => (29_600, 32_767),
        }
    })
}

/// The first port of `len` consecutive ports free now, from [`handed_out_ports`]. All the tests
/// share one process, so a block handed out is never handed out again in it (a cursor moves
/// past it): two tests running at once cannot both find the same block free before either binds
/// it. Where the cursor starts depends on the process id, so two test runs on one machine rarely
/// look at the same ports. Once the cursor has come round, a port handed out in the last
/// [`PORT_REST`] is passed over while others are free: its test may still own it, between two
/// processes on it (CI's hostile test once had its port taken so).
pub fn port_block(len: u16) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    static HANDED: std::sync::Mutex<std::collections::BTreeMap<u32, std::time::Instant>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    let (low, high) = handed_out_ports();
    let (len, ports) = (u32::from(len), high - low + 1);
    let _ = CURSOR.compare_exchange(
        u32::MAX,
        std::process::id() % ports,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    // Two rounds: the first passes over recently handed-out ports, the second takes any free.
    for round in 0..2 {
        for _ in 0..ports / len {
            // Reserve the next `len` ports for this call alone, then check they are free now.
            let reserved = CURSOR.fetch_add(len, Ordering::SeqCst);
            let Some(first) = block_at(reserved, len, (low, high)) else {
                continue;
            };
            let mut handed = HANDED.lock().unwrap_or_else(|e| e.into_inner());
            let resting = (first..first + len)
                .any(|p| handed.get(&p).is_some_and(|at| at.elapsed() < PORT_REST));
            if round == 0 && resting {
                continue;
            }
            let free = (first..first + len)
                .all(|p| std::net::TcpListener::bind(("127.0.0.1", p as u16)).is_ok());
            if free {
                let now = std::time::Instant::now();
                handed.extend((first..first + len).map(|p| (p, now)));
                return first as u16;
            }
        }
    }
    panic!("no free block of {len} ports from {low} to {high}")
}

/// How long a port handed out by [`port_block`] is passed over once the cursor comes round.
const PORT_REST: std::time::Duration = std::time::Duration::from_secs(600);

/// The first port of the block `port_block` reserved at `cursor`: one modulus for every length,
/// so no two reservations share a port until the cursor has gone all the way round; a block
/// that would run past the top is skipped (None).
fn block_at(cursor: u32, len: u32, (low, high): (u32, u32)) -> Option<u32> {
    let first = low + cursor % (high - low + 1);
    (first + len - 1 <= high).then_some(first)
}

#[test]
fn port_blocks_of_mixed_lengths_never_share_a_port_across_the_wrap() {
    // A small range, the cursor starting near its top, reservations of 1 and 10 ports across
    // the wrap. The old modulus (the range less the block's length, so one per length) handed
    // out one port twice here, and in the suite: "port 61119 is busy" in a deploy.
    let range = (100, 199);
    let mut cursor = 95;
    let mut seen = std::collections::BTreeSet::new();
    for len in [1, 10, 1, 1, 10, 10, 1, 10, 1, 10, 1, 1, 10, 10, 1] {
        if let Some(first) = block_at(cursor, len, range) {
            assert!(first + len - 1 <= 199);
            for port in first..first + len {
                assert!(seen.insert(port), "port {port} handed out twice");
            }
        }
        cursor += len;
    }
    assert!(seen.len() > 60, "{seen:?}");
}

/// Whether any process on the machine has `marker` in its command line (to find what a probe
/// or a hook left behind).
pub fn a_process_mentions(marker: &str) -> bool {
    processes_mentioning(marker) > 0
}

/// How many processes on the machine have `marker` in their command line.
pub fn processes_mentioning(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .filter(|cmdline| String::from_utf8_lossy(cmdline).contains(marker))
        .count()
}

/// The version of each replica in `replicas.json`, by slot.
pub fn replica_versions(site: &Site) -> Vec<String> {
    let text = std::fs::read_to_string(site.root().join("replicas.json")).unwrap();
    let set: serde_json::Value = serde_json::from_str(&text).unwrap();
    set["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["version"].as_str().unwrap().to_string())
        .collect()
}

/// A stand-in for a proxy on the root's socket that answers `asks` requests (a switch, a drain)
/// with `answer` (an error line, so none is ever confirmed); joins to the request lines it read.
pub fn unconfirming_proxy(
    site: &Site,
    answer: &'static str,
    asks: usize,
) -> std::thread::JoinHandle<Vec<String>> {
    use std::io::{BufRead, Write};
    let listener = std::os::unix::net::UnixListener::bind(site.root().join("proxy.sock")).unwrap();
    std::thread::spawn(move || {
        (0..asks)
            .map(|_| {
                let (stream, _) = listener.accept().unwrap();
                let mut line = String::new();
                std::io::BufReader::new(&stream)
                    .read_line(&mut line)
                    .unwrap();
                (&stream).write_all(answer.as_bytes()).unwrap();
                line
            })
            .collect()
    })
}

/// `ROOT/post.sh`, a hook that appends `$ROLLGATE_HOOK $ROLLGATE_VERSION` to `ROOT/hooks.out`
/// each time it runs (to count how often post hooks ran).
pub fn hook_recorder(site: &Site) {
    use std::os::unix::fs::PermissionsExt;
    let path = write(
        site.root(),
        "post.sh",
        "#!/bin/sh\necho \"$ROLLGATE_HOOK $ROLLGATE_VERSION\" >> \"$STATE_DIRECTORY/hooks.out\"\n",
    );
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Where [`hook_recorder`]'s hook writes: the service's state folder (a hook runs confined as
/// its releases do, and writes only there).
pub fn hooks_out(site: &Site) -> std::path::PathBuf {
    site.root().join("data/hooks.out")
}

/// Ten ports for one test (its `block`): a test binary's blocks sit together at a place chosen
/// by the process id, below the kernel's ephemeral range, so tests running at once never share
/// one; the first wholly free place is taken.
pub fn ten_ports(block: u16) -> String {
    let run = (std::process::id() % 8) as u16;
    (0..16)
        .map(|shift| 20_000 + ((run + shift) % 8) * 1_200 + block * 10)
        .find(|first| {
            (*first..*first + 10).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        })
        .map(|first| format!("{first}-{}", first + 9))
        .expect("a free block of 10 ports")
}

/// `releases/<version>/edge-svc`: the sample service, except on replica `slot`, where it exits
/// at boot (a release that fails on one replica only).
pub fn fails_on_slot(site: &Site, version: &str, slot: usize) {
    let bin = crate::common::bin();
    site.script(
        version,
        &format!(
            "[ \"$ROLLGATE_SLOT\" = {slot} ] && exit 1\nexec '{}' sample-service\n",
            bin.display()
        ),
    );
}

/// Four replicas of v1 live on the site's root (their ports from `ten_ports(block)`), and v2
/// installed beside them.
pub fn four_replicas_of_v1(site: &Site, block: u16) {
    site.release("v1", "");
    site.release("v2", "");
    let out = rollgate()
        .args(["rollout", "edge-svc", "v1", "--root"])
        .arg(site.root())
        .args([
            "--replicas",
            "4",
            "--ports",
            &ten_ports(block),
            "--deadline-ms",
            "20000",
        ])
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// `rollgate console` on a free loopback port, stopped on drop.
pub struct Console {
    pub child: std::process::Child,
    pub port: u16,
    /// The address it printed first (with `?token=` when it made its token).
    pub link: String,
    /// The token in that link, if there was one.
    pub token: Option<String>,
    /// The console's token, from its file (every route asks for it).
    pub secret: String,
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Console {
    pub fn start(roots: &[&Path], extra: &[&str]) -> Console {
        use std::io::BufRead;
        let port = free_port();
        let mut command = std::process::Command::new(crate::common::bin());
        command.arg("console");
        for root in roots {
            command.arg("--root").arg(root);
        }
        let mut child = command
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let link = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or("")
            .to_string();
        let token = link.split("?token=").nth(1).map(str::to_string);
        assert!(
            wait_for(10, || std::net::TcpStream::connect(("127.0.0.1", port))
                .is_ok()),
            "the console did not listen: {first}"
        );
        let secret = std::fs::read_to_string(roots[0].join("console.token"))
            .unwrap_or_default()
            .trim()
            .to_string();
        Console {
            child,
            port,
            link,
            token,
            secret,
        }
    }

    /// The `Authorization` header's value that lets a request in.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.secret)
    }

    /// The link that sets the token's cookie, whether or not this start printed it.
    pub fn token_link(&self) -> String {
        format!("http://127.0.0.1:{}/?token={}", self.port, self.secret)
    }
}

/// The first port of the test's `block` of ten ([`ten_ports`]): a test that deploys on a port
/// range (`--ports first-(first+1)`) takes a block no other test of its binary takes, so two
/// tests running at once never pick each other's ports.
pub fn first_of(block: u16) -> u16 {
    let range = ten_ports(block);
    range
        .split('-')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port range")
}

/// Mode 0755: what a release's executable needs.
pub fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// `rollgate secret set NAME` with the value on standard input.
/// A policy for `edge_svc` with this readiness deadline, no watch, and this `isolation`
/// (a JSON object), written into the root; its path.
pub fn isolation_policy(site: &Site, deadline_ms: u64, isolation: &str) -> String {
    write(
        site.root(),
        "isolation-policy.json",
        &format!(
            r#"{{"edge_svc": {{"progress_deadline_ms": {deadline_ms}, "poll_ms": 100, "max_unavailable_pct": 0,
                "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0, "isolation": {isolation}}}}}"#
        ),
    )
    .display()
    .to_string()
}

pub fn set_secret(site: &Site, name: &str, value: &str) -> std::process::Output {
    let mut child = std::process::Command::new(crate::common::bin())
        .args(["secret", "set", name, "--root"])
        .arg(site.root())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(value.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// The uid the root's service runs as (`service-user.json`, where rollgate recorded it).
pub fn service_uid(site: &Site) -> u64 {
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(site.root().join("service-user.json")).unwrap(),
    )
    .unwrap();
    record["uid"].as_u64().unwrap()
}

/// The parent of `pid` (field 4 of its stat), while it exists (a zombie too).
pub fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The processes of the other types than web that the root's `formation.json` names (none
/// without one), as written.
pub fn typed_processes(root: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(root.join("formation.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .and_then(|v| v["processes"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p["process_type"] != "web")
        .collect()
}
