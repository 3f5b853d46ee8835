//! Issue 78: what a release *ships* is hostile. Each test performs one of the escapes found
//! with the source in hand — links a release ships where rollgate, as root, used to create,
//! overwrite or read a file, a shipped secrets map, the proxy's hand-over channel — and checks
//! that rollgate now refuses it or never touches the path. Each failed on the rollgate before.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::*;

/// A build folder: the sample service as `edge-svc`, these files, and these symlinks
/// (name -> target) beside it, as a release's author would ship them.
fn build(files: &[(&str, &str)], links: &[(&str, &str)]) -> tempfile::TempDir {
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
    for (name, target) in links {
        std::os::unix::fs::symlink(target, build.path().join(name)).unwrap();
    }
    build
}

fn add(site: &Site, version: &str, folder: &Path) -> Output {
    site.run(&[
        "release",
        "add",
        "edge-svc",
        version,
        folder.to_str().unwrap(),
    ])
}

/// A file of root's, mode 0600, outside every root: what an escape would overwrite.
fn precious(dir: &Path) -> PathBuf {
    let path = dir.join("precious");
    std::fs::write(&path, "precious\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// A path in /etc that no test or host uses (a cron.d line is what the attack would write).
fn etc_target(what: &str) -> PathBuf {
    PathBuf::from(format!(
        "/etc/rollgate-shipped-{what}-{}-{}",
        std::process::id(),
        free_port()
    ))
}

/// Escape 1: a release ships `edge-svc.output` (and a worker's `edge-svc.worker.0.output`) as
/// a link to a file in /etc. rollgate opened it as root with O_CREAT|O_APPEND and its output
/// pump wrote the release's words there: a root-owned file anywhere. Its output now lives in
/// `ROOT/output/VERSION/`, rollgate's own, and the links are never opened.
#[test]
fn an_output_file_shipped_as_a_link_never_makes_root_create_or_write_its_target() {
    let site = Site::new();
    let (web, worker) = (etc_target("web"), etc_target("worker"));
    let folder = build(
        &[("Procfile", "worker: echo worker up; exec sleep 600\n")],
        &[
            ("edge-svc.output", web.to_str().unwrap()),
            ("edge-svc.worker.0.output", worker.to_str().unwrap()),
        ],
    );
    let out = add(&site, "v1", folder.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.deploy(free_port(), "v1", &[]);
    let (web_made, worker_made) = (web.exists(), worker.exists());
    let _ = std::fs::remove_file(&web);
    let _ = std::fs::remove_file(&worker);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        !web_made && !worker_made,
        "root created a file through a shipped link"
    );
    // What the release said is kept, in rollgate's own folder.
    let kept = site.root().join("output/v1/edge-svc.output");
    assert!(
        wait_for(10, || std::fs::read_to_string(&kept)
            .is_ok_and(|t| t.contains("ready"))),
        "{}",
        std::fs::read_to_string(&kept).unwrap_or_default()
    );
    let mode = std::fs::metadata(site.root().join("output/v1"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    assert!(!web.exists() && !worker.exists());
}

/// Deploys `version` of `site` with its release phase holding until the test has planted, in
/// the release's folder, the link the attack needs for the deployer's own pid (the name of the
/// temporary file `write_atomically` used: `.release.output.tmp.PID`), then lets it finish.
fn deploy_with_planted_link(site: &Site, version: &str, target: &Path, extra: &[&str]) -> Output {
    let child = std::process::Command::new(bin())
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            version,
            "--root",
        ])
        .arg(site.root())
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let folder = site.root().join("releases").join(version);
    std::os::unix::fs::symlink(
        target,
        folder.join(format!(".release.output.tmp.{}", child.id())),
    )
    .unwrap();
    std::fs::write(folder.join("armed"), "").unwrap();
    child.wait_with_output().unwrap()
}

/// A release phase that waits for `armed` in its folder, then says something.
const HELD_RELEASE_PHASE: &str =
    "release: while [ ! -e armed ]; do sleep 0.05; done; echo OWNED-BY-THE-RELEASE\n";

/// Escape 2: `.release.output.tmp.PID` in the release folder, a link to a root-only file: the
/// release phase's output was written over it and the file left 0644. The temporary file is
/// now made with O_EXCL|O_NOFOLLOW under a random name, in rollgate's own folder.
#[test]
fn a_link_where_rollgate_puts_a_temporary_file_never_makes_root_overwrite_its_target() {
    let site = Site::new();
    let outside = tempfile::tempdir().unwrap();
    let victim = precious(outside.path());
    let folder = build(&[("Procfile", HELD_RELEASE_PHASE)], &[]);
    let out = add(&site, "v1", folder.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy_with_planted_link(&site, "v1", &victim, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    let mode = std::fs::metadata(&victim).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{mode:o}");
    let kept = std::fs::read_to_string(site.root().join("output/v1/release.output")).unwrap();
    assert!(kept.contains("OWNED-BY-THE-RELEASE"), "{kept}");
}

/// Escape 3: the same links aimed at `/proc/self/root/ROOT/policies/V.json` (a path the
/// lexical "not into the root" check did not see) rewrote the kept policy to
/// `isolation.enabled = false`, and the next restart ran the release as root. A link into
/// /proc is now refused at `release add`; and planted after it, it is never followed.
#[test]
fn a_link_through_proc_to_the_kept_policy_is_refused_and_never_rewrites_it() {
    let site = Site::new();
    let kept = site.root().join("policies/v1.json");
    let through_proc = format!("/proc/self/root{}", kept.display());
    let folder = build(
        &[("Procfile", HELD_RELEASE_PHASE)],
        &[(".release.output.tmp.1", &through_proc)],
    );
    let out = add(&site, "v1", folder.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(".release.output.tmp.1")
            && stderr(&out).contains("not a folder of the system"),
        "{}",
        stderr(&out)
    );
    assert!(!site.root().join("releases/v1").exists());

    // Planted after the install (as if a check had missed it): the policy stays as deployed.
    std::fs::remove_file(folder.path().join(".release.output.tmp.1")).unwrap();
    let out = add(&site, "v1", folder.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let policy = write(
        site.root(),
        "policy.json",
        r#"{"edge_svc": {"progress_deadline_ms": 30000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0}}"#,
    );
    let out = deploy_with_planted_link(
        &site,
        "v1",
        Path::new(&through_proc),
        &["--policy", policy.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&kept).unwrap();
    assert!(!text.contains("OWNED-BY-THE-RELEASE"), "{text}");
    let _: serde_json::Value = serde_json::from_str(&text).unwrap();
    let pid = site.live_pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(!uid.split_whitespace().skip(1).any(|u| u == "0"), "{uid}");
}

/// Escape 5: `Procfile -> /etc/shadow` (or another service's `key: value` file) was read as
/// root; each line became a process whose command line carried it. The Procfile is read
/// beneath the release's folder, never through a link: refused at `release add`, naming it,
/// and nothing of the target is said.
#[test]
fn a_procfile_shipped_as_a_link_to_a_root_only_file_is_refused_unread() {
    let site = Site::new();
    let outside = tempfile::tempdir().unwrap();
    let secret = write(
        outside.path(),
        "other-service.conf",
        "password: hunter2-do-not-print\n",
    );
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    for target in [Path::new("/etc/shadow"), secret.as_path()] {
        let folder = build(&[], &[("Procfile", target.to_str().unwrap())]);
        // A link to /etc is one a release may ship (it reads what it points at with its own
        // rights); a link to the temporary folder is not. Either way, never read as root.
        let out = add(&site, "v1", folder.path());
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let said = stderr(&out);
        assert!(said.contains("Procfile"), "{said}");
        assert!(
            !said.contains("hunter2") && !said.contains("root:"),
            "{said}"
        );
        assert!(!site.root().join("releases/v1").exists());
    }
}

/// Escape 6: `Procfile -> /proc/self/root/ROOT/data/Procfile`, which the running release turns
/// into a FIFO: the next deploy blocked in open(2) as root, holding the root's lock. A link
/// into /proc is refused at install; a FIFO where a file of the release should be is refused
/// without blocking wherever rollgate reads one (`image.json`, `env` alike).
#[test]
fn a_procfile_leading_to_a_fifo_the_release_made_never_wedges_a_deploy() {
    let site = Site::new();
    let data = site.root().join("data");
    std::fs::create_dir_all(&data).unwrap();
    nix::unistd::mkfifo(&data.join("Procfile"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let through_proc = format!("/proc/self/root{}/Procfile", data.display());
    let folder = build(&[], &[("Procfile", &through_proc)]);
    let out = site.run(&[
        "release",
        "add",
        "edge-svc",
        "v1",
        folder.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a folder of the system"),
        "{}",
        stderr(&out)
    );

    // The same FIFO under names rollgate reads from an installed release, planted after the
    // install: each deploy says why and returns, none waits on it.
    let folder = build(&[], &[]);
    let out = add(&site, "v2", folder.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for name in ["Procfile", "image.json", "env"] {
        let planted = site.root().join("releases/v2").join(name);
        nix::unistd::mkfifo(&planted, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let out = site.deploy(free_port(), "v2", &[]);
        std::fs::remove_file(&planted).unwrap();
        assert_ne!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(name) && stderr(&out).contains("not a regular file"),
            "{name}: {}",
            stderr(&out)
        );
    }
}

/// Escape 9: a `secrets` map shipped in the release (`REG=registry-auth`) handed it the root's
/// registry login. A release's secrets are the operator's to give: a shipped map is refused at
/// install, and the registry login is given to no process, whoever names it.
#[test]
fn a_shipped_secrets_map_is_refused_and_the_registry_login_is_never_given() {
    let site = Site::new();
    let folder = build(&[("secrets", "REG=registry-auth\n")], &[]);
    let out = add(&site, "v1", folder.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("ships `secrets`") && stderr(&out).contains("config set"),
        "{}",
        stderr(&out)
    );
    assert!(!site.root().join("releases/v1").exists());

    let folder = build(&[], &[]);
    let out = add(&site, "v1", folder.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.run(&[
        "config",
        "set",
        "edge-svc",
        "--secret",
        "REG=registry-auth",
        "--no-deploy",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("registry login") && stderr(&out).contains("no process is given it"),
        "{}",
        stderr(&out)
    );
}

/// Escape 4: the proxy left root for `--user` before it offered its hand-over channel, so the
/// channel sat in a folder of that user and trusted that uid: a process of the same user took
/// the listening sockets. The channel is now bound as root, in root's run folder, and trusts
/// root alone; and a root `--take-over` of a `--user` proxy works, as documented.
#[test]
fn a_process_of_the_proxys_user_cannot_take_its_sockets_and_root_can() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let port = free_port();
    let mut first = proxy_as_nobody(&site, port, &[]);
    let uid = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .map(|l| l.split_whitespace().nth(2).unwrap_or("").to_string())
            .unwrap_or_default()
    };
    assert!(wait_for(20, || uid(first.0.id()) == "65534"
        && version_on(port).is_some()));

    // The attacker: any process of user nobody (a release whose isolation.user is the proxy's
    // would be one), looking wherever a channel could be and asking for the sockets.
    let attack = r#"
import array, glob, os, socket, sys
os.setgroups([]); os.setgid(65534); os.setuid(65534)
found = []
for pattern in ["/run/rollgate/proxy/handover-*.sock", "/tmp/rollgate-65534/proxy/handover-*.sock",
                "/run/user/65534/rollgate/proxy/handover-*.sock"]:
    found += glob.glob(pattern)
took = 0
for path in found:
    try:
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(path)
        s.sendall(b"take\n")
        fds = array.array("i")
        msg, anc, flags, addr = s.recvmsg(4096, socket.CMSG_LEN(64 * fds.itemsize))
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[:len(data) - (len(data) % fds.itemsize)])
        took += len(fds)
    except Exception as e:
        print("refused:", path, type(e).__name__, e)
print("took", took)
"#;
    let out = std::process::Command::new("/usr/bin/python3")
        .args(["-c", attack])
        .current_dir("/")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("took 0"), "{said}{}", stderr(&out));
    assert!(
        version_on(port).is_some(),
        "the first proxy no longer serves"
    );

    // And no service is given the proxy's user: a deploy asking for it is refused, nothing
    // started.
    let policy = write(
        site.root(),
        "policy.json",
        r#"{"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0,
            "isolation": {"user": "nobody"}}}"#,
    );
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is the user `rollgate proxy`"),
        "{}",
        stderr(&out)
    );
    assert_eq!(site.pointer().unwrap()["version"], "v1");

    // Root hands it over.
    let mut second = proxy_as_nobody(&site, port, &["--take-over"]);
    let first_ended = wait_for(30, || matches!(first.0.try_wait(), Ok(Some(_))));
    let serving = version_on(port).is_some();
    let second_alive = matches!(second.0.try_wait(), Ok(None));
    assert!(
        first_ended && serving && second_alive,
        "root's --take-over of a --user proxy"
    );
}

/// Escape 8: `rollgate stop` returned 0 while a run its clock had started went on (an hour
/// without `timeout_ms`), though a stopped service runs nothing. `stop` now ends every
/// process of the service, its schedules' runs included, and says so.
#[test]
fn stop_ends_a_scheduled_run_that_is_going_and_says_so() {
    let site = Site::new();
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 0\n  schedules:\n    long:\n      cron: \"@every 1s\"\n      command: [\"sh\", \"long.sh\"]\n",
    );
    let folder = build(
        &[(
            "long.sh",
            "echo $$ > \"$STATE_DIRECTORY/long.pid\"\nexec sleep 600\n",
        )],
        &[],
    );
    let out = add(&site, "v1", folder.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.deploy(free_port(), "v1", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pid_file = site.root().join("data/long.pid");
    let run = || -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        (alive(pid) && !is_zombie(pid)).then_some(pid)
    };
    assert!(
        wait_for(20, || run().is_some()),
        "the schedule's run never started"
    );
    let pid = run().unwrap();
    let out = site.run(&["stop", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let running_on = alive(pid) && !is_zombie(pid);
    if running_on {
        send_signal(pid, libc::SIGKILL);
    }
    assert!(
        !running_on,
        "the scheduled run (pid {pid}) outlived the stop"
    );
    assert!(
        stdout(&out).contains("schedule long's run"),
        "{}",
        stdout(&out)
    );
}

/// Escape 7: limits applied per process tree, and a release chooses how many trees it has (its
/// Procfile's types): under `memory_mb = 32` ten types used 258 MiB. A release's processes now
/// share one group holding the policy's limits: ten types that each hold 40 MiB under
/// `memory_mb = 128` cannot all live, while two of them fit; and a Procfile may name at most
/// 32 types, refused at `release add` with the numbers.
#[test]
fn a_releases_types_share_its_limits_instead_of_multiplying_them() {
    let site = Site::new();
    let policy = write(
        site.root(),
        "policy.json",
        r#"{"edge_svc": {"progress_deadline_ms": 15000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0,
            "isolation": {"memory_mb": 128}}}"#,
    );
    let hold = "exec /usr/bin/python3 -c 'import time; b = bytearray(40 << 20); print(\"holding\", flush=True); time.sleep(600)'";
    let procfile =
        |types: usize| -> String { (0..types).map(|n| format!("hold{n}: {hold}\n")).collect() };
    let folder = build(&[("Procfile", &procfile(2))], &[]);
    let out = add(&site, "v1", folder.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.deploy(free_port(), "v1", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "two types of 40 MiB fit in 128: {}",
        stderr(&out)
    );

    let folder = build(&[("Procfile", &procfile(10))], &[]);
    let out = add(&site, "v2", folder.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.deploy(free_port(), "v2", &["--policy", policy.to_str().unwrap()]);
    assert_ne!(
        out.status.code(),
        Some(0),
        "ten types of 40 MiB in 128: {}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("out of memory"), "{}", stderr(&out));
    // v1 is still what runs.
    assert_eq!(site.pointer().unwrap()["version"], "v1");

    let folder = build(&[("Procfile", &procfile(33))], &[]);
    let out = add(&site, "v3", folder.path());
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("hold32") && stderr(&out).contains("32 types"),
        "{}",
        stderr(&out)
    );
}

/// `rollgate proxy --user nobody` in front of `site` on `port`, started by root.
fn proxy_as_nobody(site: &Site, port: u16, extra: &[&str]) -> Killed {
    let listen = format!("127.0.0.1:{port}");
    Killed(
        std::process::Command::new(bin())
            .args(["proxy", "--listen", &listen, "--user", "nobody", "--root"])
            .arg(site.root())
            .args(extra)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// A process the test started, killed and reaped however the test ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
