//! `rollgate up` after every release process was killed (as at a reboot): the same versions on
//! the same ports, answering; `--supervise` restarts a release that exits and gives up on one
//! that keeps crashing.

use crate::common::*;

use std::time::Duration;

fn up(site: &Site, extra: &[&str]) -> std::process::Output {
    rollgate()
        .args(["up", "--root"])
        .arg(site.root())
        .args(extra)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap()
}

/// Kills a release's whole process group, as a reboot would, and waits until it is gone.
fn kill_group(pid: i32) {
    send_signal(-pid, 9);
    assert!(wait_for(5, || !alive(pid) || is_zombie(pid)));
}

#[test]
fn up_after_a_reboot_starts_the_live_release_on_its_port() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let port = free_port();
    assert_eq!(
        site.deploy(port, "v2", &["--watch-ms", "0"]).status.code(),
        Some(0)
    );
    let old = site.live_pid().unwrap();

    // Nothing to do while it runs.
    let out = up(&site, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("v2 (port {port}): running (pid {old})")),
        "{}",
        stdout(&out)
    );

    site.reboot();
    assert_eq!(version_on(port), None);
    let out = up(&site, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("started (pid"), "{}", stdout(&out));
    assert_eq!(version_on(port).as_deref(), Some("v2"));
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["version"], "v2");
    assert_eq!(pointer["port"], port);
    let new = site.live_pid().unwrap();
    assert_ne!(new, old);
    assert!(alive(new));
    let last = site.log_lines().last().cloned().unwrap();
    assert_eq!(last["event"], "restarted");
    assert_eq!(last["pid"], new);
    // The restarted release is the live one for the next deploy: it is drained and stopped.
    site.release("v3", "");
    assert_eq!(
        site.deploy(free_port(), "v3", &["--watch-ms", "0"])
            .status
            .code(),
        Some(0)
    );
    assert!(wait_for(5, || !alive(new)));
}

#[test]
fn up_restores_every_replica_on_its_port() {
    let site = Site::new();
    site.release("v1", "");
    let first = port_block(10);
    let ports = format!("{first}-{}", first + 9);
    let out = site.rollout("v1", &["--replicas", "3", "--ports", &ports]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let set = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(site.root().join("replicas.json")).unwrap())
            .unwrap()
    };
    let before = set();
    let replicas: Vec<(u16, i32)> = before["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["port"].as_u64().unwrap() as u16,
                r["pid"].as_i64().unwrap() as i32,
            )
        })
        .collect();
    site.reboot();
    let out = up(&site, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let after = set();
    for (i, (port, pid)) in replicas.iter().enumerate() {
        let replica = &after["replicas"][i];
        assert_eq!(replica["port"], *port);
        assert_eq!(replica["version"], "v1");
        assert_ne!(replica["pid"], *pid);
        assert_eq!(version_on(*port).as_deref(), Some("v1"), "replica {i}");
    }
    // The next rollout takes the restarted replicas as its baseline and moves them all.
    site.release("v2", "");
    let out = site.rollout("v2", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// `v1` crashes at boot while `crash` exists in the root, else serves; deployed and live.
fn crashable(site: &Site) -> u16 {
    let bin = crate::common::bin();
    site.script(
        "v1",
        &format!(
            "[ -f ../../crash ] && exit 3\nexec '{}' sample-service\n",
            bin.display()
        ),
    );
    let port = free_port();
    assert_eq!(site.deploy(port, "v1", &[]).status.code(), Some(0));
    port
}

/// A running `up --supervise`, killed when dropped (also when a test fails).
struct Supervisor(std::process::Child);

impl Drop for Supervisor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn supervisor(site: &Site) -> Supervisor {
    Supervisor(
        std::process::Command::new(crate::common::bin())
            .args(["up", "--supervise", "--backoff-ms", "50", "--root"])
            .arg(site.root())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

#[test]
fn supervise_restarts_a_release_that_exits() {
    let site = Site::new();
    let port = crashable(&site);
    let supervisor = supervisor(&site);
    for _ in 0..2 {
        let before = site.live_pid().unwrap();
        kill_group(before);
        assert!(wait_for(10, || site
            .live_pid()
            .is_some_and(|p| p != before && alive(p))));
        assert!(wait_for(5, || version_on(port).as_deref() == Some("v1")));
    }
    // The pointer names the new process a moment before the log line is written.
    assert!(wait_for(5, || count_events(&site, "restarted", "v1") >= 2));
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(count_events(&site, "restarted", "v1"), 2);
    drop(supervisor);
}

/// Issue 68, 1: the keeper a deploy started gives up on a release that keeps crashing (no `up`
/// running): each restart is logged with how the process before it ended, five exits in a row
/// are given up on, and nothing starts it again until `up`.
#[test]
fn a_keeper_gives_up_on_a_release_that_crashed_five_times_in_a_row() {
    let site = Site::new();
    let port = crashable(&site);
    write(site.root(), "crash", "");
    kill_group(site.live_pid().unwrap());
    // Exit 1 (the kill), then four restarts that exit at boot: five in a row, given up.
    assert!(
        wait_for(40, || count_events(&site, "restart_given_up", "v1") == 1),
        "{:?}",
        site.events()
    );
    let restarted: Vec<serde_json::Value> = site
        .log_lines()
        .into_iter()
        .filter(|l| l["event"] == "restarted")
        .collect();
    assert_eq!(restarted.len(), 4, "{restarted:#?}");
    assert_eq!(
        restarted[0]["ended"], "signal: 9 (SIGKILL)",
        "{restarted:#?}"
    );
    for later in &restarted[1..] {
        assert_eq!(later["ended"], "exit status: 3", "{restarted:#?}");
    }
    let detail = site.last_detail();
    assert!(detail.starts_with("exited 5 times in a row"), "{detail}");
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        count_events(&site, "restarted", "v1"),
        4,
        "restarted after giving up"
    );
    assert_eq!(version_on(port), None);
    // A person fixes it; `up` starts it again.
    std::fs::remove_file(site.root().join("crash")).unwrap();
    let out = up(&site, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(version_on(port).as_deref(), Some("v1"));
}

/// Issue 58: a host with three services needed three `up` units (`up` refused a second
/// `--root`); one `up` brings every root up, and one `--supervise` restarts each.
#[test]
fn one_up_brings_up_and_supervises_every_root_it_is_given() {
    let (a, b) = (Site::new(), Site::new());
    let mut ports = Vec::new();
    for site in [&a, &b] {
        site.release("v1", "");
        let port = free_port();
        assert_eq!(site.deploy(port, "v1", &[]).status.code(), Some(0));
        site.reboot();
        ports.push(port);
    }
    let out = rollgate()
        .args(["up", "--root"])
        .arg(a.root())
        .arg("--root")
        .arg(b.root())
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for (site, port) in [(&a, ports[0]), (&b, ports[1])] {
        assert!(
            stdout(&out).contains(&format!("{}:\n", site.root().display())),
            "{}",
            stdout(&out)
        );
        assert_eq!(version_on(port).as_deref(), Some("v1"));
    }
    assert_eq!(
        stdout(&out).matches("started (pid").count(),
        2,
        "{}",
        stdout(&out)
    );
    // Supervised together: a release of either root that exits comes back.
    let supervisor = Supervisor(
        std::process::Command::new(crate::common::bin())
            .args(["up", "--supervise", "--backoff-ms", "50", "--root"])
            .arg(a.root())
            .arg("--root")
            .arg(b.root())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    for site in [&b, &a] {
        let before = site.live_pid().unwrap();
        kill_group(before);
        assert!(wait_for(10, || site
            .live_pid()
            .is_some_and(|p| p != before && alive(p))));
    }
    drop(supervisor);
}

/// Issue 68, 3: `stop` takes the service down on purpose — the proxy answers its maintenance
/// page, its process is stopped — and nothing brings it back (`up` at boot leaves it, a deploy
/// is refused) until `start`, which starts the live release again gated and lifts the page.
#[test]
fn stop_keeps_a_service_down_through_up_and_deploys_until_start_brings_it_back_gated() {
    use crate::common::http::{Conn, Proxy};
    let site = Site::new();
    site.add_sample("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let proxy = Proxy::start(&site, &[]);
    let get = || Conn::open(proxy.port).unwrap().get("/", "").unwrap();
    assert_eq!(get().status, 200);
    let live = site.live_pid().unwrap();
    let cmd = |args: &[&str]| {
        rollgate()
            .args(args)
            .arg("--root")
            .arg(site.root())
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap()
    };

    let out = cmd(&["stop", "edge-svc", "--reason", "disk replaced"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!alive(live));
    let answer = get();
    assert_eq!(answer.status, 503, "{}", answer.body);
    assert!(
        answer.body.contains("edge-svc is stopped"),
        "{}",
        answer.body
    );
    let line = site.log_lines().pop().unwrap();
    assert_eq!(line["event"], "stopped", "{line}");
    assert!(
        line["detail"].as_str().unwrap().contains("disk replaced"),
        "{line}"
    );
    let status = cmd(&["status", "--format", "json"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["stopped"]["why"], "disk replaced", "{status}");
    let listed = crate::release_list::list(&site);
    assert!(
        listed[0]["marks"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("stopped")),
        "{listed:?}"
    );

    // A boot leaves it stopped; a deploy is refused.
    let out = cmd(&["up"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("stopped by"), "{}", stdout(&out));
    assert!(!alive(site.live_pid().unwrap()));
    site.add_sample("v2", "");
    let out = site.deploy(free_port(), "v2", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("rollgate start edge-svc"),
        "{}",
        stderr(&out)
    );
    assert_eq!(site.pointer().unwrap()["version"], "v1");

    let out = cmd(&["start", "edge-svc"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let now = site.live_pid().unwrap();
    assert!(alive(now) && now != live);
    // `start` returns once the proxy serving the root has taken the change (CI once asked
    // before it had read that the service runs again): the first request is served.
    let answer = get();
    assert_eq!((answer.status, answer.body.as_str()), (200, "v1"));
    assert!(!site.root().join("stopped.json").exists());
    assert_eq!(site.log_lines().pop().unwrap()["event"], "started");
    // Started again, it deploys as before.
    assert_eq!(site.deploy(free_port(), "v2", &[]).status.code(), Some(0));
}

/// Issue 80, 6: a release inherited the environment of whoever started it (OLDPWD, SHLVL,
/// PYENV_ROOT… of the operator's shell), so the release a deploy started from a terminal ran
/// with another environment than the same release `start`ed by a unit. Now both get one built
/// from nothing: a fixed PATH, the service's folders, rollgate's variables.
#[test]
fn a_release_started_from_a_shell_and_from_a_unit_gets_one_environment() {
    let site = Site::new();
    site.release("v1", "");
    let from_a_shell = rollgate()
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v1",
            "--root",
        ])
        .arg(site.root())
        .env("OLDPWD", "/home/operator/src")
        .env("SHLVL", "3")
        .env("PYENV_ROOT", "/home/operator/.pyenv")
        .env("PATH", "/home/operator/.pyenv/shims:/usr/bin:/bin")
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(
        from_a_shell.status.code(),
        Some(0),
        "{}",
        stderr(&from_a_shell)
    );
    let environment = |pid: i32| -> Vec<String> {
        let bytes = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let mut variables: Vec<String> = bytes
            .split(|b| *b == 0)
            .filter(|v| !v.is_empty())
            .map(|v| String::from_utf8_lossy(v).into_owned())
            // Each start has its own token.
            .filter(|v| !v.starts_with("ROLLGATE_DEPLOY_TOKEN="))
            .collect();
        variables.sort();
        variables
    };
    let by_the_deploy = environment(site.live_pid().unwrap());
    for caller in ["OLDPWD=", "SHLVL=", "PYENV_ROOT="] {
        assert!(
            !by_the_deploy.iter().any(|v| v.starts_with(caller)),
            "{caller} reached the release: {by_the_deploy:?}"
        );
    }
    assert!(
        by_the_deploy.contains(
            &"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()
        ),
        "{by_the_deploy:?}"
    );
    let out = site.run(&["stop", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // As a unit starts it: nothing but a PATH.
    let from_a_unit = rollgate()
        .args(["start", "edge-svc", "--root"])
        .arg(site.root())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(
        from_a_unit.status.code(),
        Some(0),
        "{}",
        stderr(&from_a_unit)
    );
    assert_eq!(environment(site.live_pid().unwrap()), by_the_deploy);
}

/// Issue 80: `start` took its keeper's death for its release's — a keeper killed while `start`
/// waited for the release to be ready failed the start ("exited with signal 9"), and the
/// release ran on, kept by nobody and named by nothing (the next start made a second copy).
/// Now the release is watched itself, named live when ready, and given a new keeper.
#[test]
fn a_keeper_killed_while_start_waits_leaves_its_release_started_named_and_kept() {
    let site = Site::new();
    site.release("v1", "--ready-after-ms 3000");
    let out = site.deploy(free_port(), "v1", &["10000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.run(&["stop", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        site.keepers().is_empty(),
        "stop returns with its keepers gone"
    );
    let start = std::process::Command::new(bin())
        .args(["start", "edge-svc", "--root"])
        .arg(site.root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its keeper, once it has started the release (which is 3 s from ready): the one process
    // of the root whose parent is the one keeper (a process caught between its fork and its
    // exec is neither yet).
    let mut started = None;
    assert!(wait_for(10, || {
        let (keepers, processes) = (site.keepers(), site.processes());
        started = match (keepers.as_slice(), processes.as_slice()) {
            ([keeper], [release]) if parent_of(*release) == Some(*keeper) => {
                Some((*keeper, *release))
            }
            _ => None,
        };
        started.is_some()
    }));
    let (keeper, release) = started.unwrap();
    send_signal(keeper, 9);
    let out = start.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("its keeper was killed while it started, and it has a new one"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        site.live_pid(),
        Some(release),
        "the release started is the one named live"
    );
    assert!(alive(release));
    assert!(wait_for(5, || site
        .keepers()
        .iter()
        .any(|k| *k != keeper && alive(*k))));
    assert_eq!(site.processes(), [release], "one copy");
}

/// Issue 80: a `start` that failed left what it had started running (web, while a worker
/// failed) although the service stays stopped. The broken worker lives 300 ms: a start must
/// hold it to its type's `min_ready_ms` as the deploy did (CI's loaded run met one slow enough
/// to be alive at the first poll, and `start` called it started).
#[test]
fn a_failed_start_leaves_nothing_of_the_service_running() {
    let site = Site::new();
    let worker = "[ -e \"$STATE_DIRECTORY/broken\" ] && { echo broken; sleep 0.3; exit 3; }\nexec sleep 1000\n";
    site.add_sample_with(
        "v1",
        &[
            ("Procfile", "worker: sh worker.sh\n"),
            ("worker.sh", worker),
        ],
    );
    let policy = write(
        site.root(),
        "policy.yaml",
        // Held 1.5 s: a broken worker exits well within it even on a loaded machine (at 300 ms,
        // one was slow enough to start that it counted as ready).
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  processes:\n    worker:\n      min_ready_ms: 1500\n",
    );
    let out = site.deploy(
        free_port(),
        "v1",
        &["--policy", policy.to_str().unwrap(), "--watch-ms", "0"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.run(&["stop", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(wait_for(5, || site.processes().is_empty()));

    std::fs::write(site.root().join("data/broken"), "").unwrap();
    let out = site.run(&["start", "edge-svc"]);
    assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stderr(&out).contains("stays stopped"), "{}", stderr(&out));
    assert!(
        wait_for(5, || site.processes().is_empty()),
        "the service is stopped, yet runs {:?}",
        site.processes()
    );
}

/// `rollgate stop edge-svc`, SIGKILLed by the fault seam after its `k`-th persisted action.
fn stop_killed_after(site: &Site, k: u32) {
    let out = rollgate()
        .args(["stop", "edge-svc", "--root"])
        .arg(site.root())
        .env("ROLLGATE_FAULT", format!("kill-after-action:{k}"))
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), None, "killed: {}", stderr(&out));
    assert!(
        site.root().join("stopped.json").exists(),
        "the stop is recorded first"
    );
}

/// Found by the formation's random-kill test: a `stop` killed after it had stopped web but not
/// the worker; the `start` that followed could not start web, said the service stays stopped,
/// and left the worker it had found running — stopped, yet running, with nothing (not `up`) to
/// ever stop it.
#[test]
fn a_failed_start_after_a_stop_cut_short_stops_what_it_found_running() {
    let site = Site::new();
    site.add_sample_with("v1", &[("Procfile", "worker: exec sleep 7770011\n")]);
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  processes:\n    worker:\n      min_ready_ms: 100\n",
    );
    let port = free_port();
    let out = site.deploy(
        port,
        "v1",
        &["--policy", policy.to_str().unwrap(), "--watch-ms", "0"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let web = site.live_pid().unwrap();
    let worker = typed_processes(site.root())[0]["pid"].as_i64().unwrap() as i32;
    // Its actions: the stop recorded, the proxy's maintenance, web stopped — then killed.
    stop_killed_after(&site, 3);
    assert!(wait_for(5, || !alive(web)), "web was stopped");
    assert!(alive(worker), "the worker was not reached");
    // Web cannot start again: its port is taken.
    let _taken = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let out = site.run(&["start", "edge-svc"]);
    assert_ne!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stderr(&out).contains("stays stopped"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("worker.0): stopped"),
        "{}",
        stderr(&out)
    );
    assert!(
        !alive(worker),
        "the service stays stopped, yet its worker runs"
    );
    assert!(
        wait_for(5, || site.processes().is_empty()
            && site.keepers().is_empty()),
        "stopped, yet running: {:?}, kept by {:?}",
        site.processes(),
        site.keepers()
    );
}

/// Deploys v1 with `extra`, then leaves the root as a `stop` killed halfway and a dead web
/// leave it: the stop recorded, web's keeper killed, then its shell (what the shell started
/// runs on). Web's port and the dead shell's pid.
fn a_dead_web_after_a_stop_cut_short(site: &Site, extra: &[&str]) -> (u16, i32) {
    let port = free_port();
    let out = site.deploy(port, "v1", extra);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let shell = site.live_pid().unwrap();
    stop_killed_after(site, 1);
    site.kill_keepers();
    send_signal(shell, 9);
    assert!(wait_for(5, || !alive(shell)));
    (port, shell)
}

/// What a dead web left — here the server its shell started, still holding the port — is
/// stopped before `start` starts web again: the `start` after a `stop` killed halfway found
/// the port taken and left the service stopped.
#[test]
fn start_stops_what_a_dead_web_left_before_it_starts_web_again() {
    let site = Site::new();
    // A shell that starts the server and waits for it: the shell is web's process.
    site.script(
        "v1",
        &format!("'{}' sample-service &\nwait\n", bin().display()),
    );
    // The server runs on, holding web's port.
    let (port, shell) = a_dead_web_after_a_stop_cut_short(&site, &["--watch-ms", "0"]);
    let server = site.processes();
    assert_eq!(server.len(), 1, "{server:?}");
    assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_err());
    let out = site.run(&["start", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!alive(server[0]), "what the dead web left is gone");
    let web = site.live_pid().unwrap();
    assert_ne!(web, shell);
    assert!(alive(web));
}

/// What a dead process left is stopped with the release's own `stop_grace_ms`, as `stop` gives
/// it, not rollgate's default 5 s: a child that needs 6 s to finish its work on SIGTERM, under
/// a 15 s grace, finishes it (it was killed at 5 s before).
#[test]
fn a_start_stops_what_a_dead_web_left_with_the_release_s_own_grace() {
    let site = Site::new();
    // Web's shell starts the server and a child that takes 6 s to finish on SIGTERM (its
    // `sleep` is signalled with it; the trap's own is not), then waits for both.
    site.script(
        "v1",
        &format!(
            "sh -c 'trap \"sleep 6; echo finished > $STATE_DIRECTORY/finished; exit 0\" TERM; while :; do sleep 1; done' &\n'{}' sample-service &\nwait\n",
            bin().display()
        ),
    );
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 0\n  stop_grace_ms: 15000\n",
    );
    a_dead_web_after_a_stop_cut_short(&site, &["--policy", policy.to_str().unwrap()]);
    let out = site.run(&["start", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let finished = site.root().join("data/finished");
    assert!(
        finished.exists(),
        "the child was killed before its grace ended: {}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("what its last process left stopped (SIGTERM)"),
        "{}",
        stdout(&out)
    );
}

/// Issue 80: a `start` killed while it waited for its release left that release running, named
/// by nothing, and the next `start` never stopped it (as `up` does): it waited on its output or
/// started a second copy beside it.
#[test]
fn the_next_start_stops_what_a_killed_start_left() {
    let site = Site::new();
    site.release("v1", "--ready-after-ms 2000");
    let out = site.deploy(free_port(), "v1", &["10000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.run(&["stop", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut start = std::process::Command::new(bin())
        .args(["start", "edge-svc", "--root"])
        .arg(site.root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The release itself (its sample service), not a process of rollgate's between its fork
    // and its exec (its cwd already the root, its name not yet a keeper's).
    let release = || {
        site.processes().into_iter().find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|line| String::from_utf8_lossy(&line).contains("sample-service"))
        })
    };
    let mut stray = None;
    assert!(wait_for(10, || {
        stray = release();
        stray.is_some()
    }));
    let stray = stray.unwrap();
    start.kill().unwrap();
    start.wait().unwrap();
    let out = site.run(&["start", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("named by nothing"),
        "{}",
        stdout(&out)
    );
    assert!(!alive(stray) || is_zombie(stray), "the stray still runs");
    let live = site.live_pid().unwrap();
    assert_ne!(live, stray);
    assert_eq!(site.processes(), [live], "one copy");
}

/// Issue 80, 6: `up --root A --root B` brought the roots up one after the other, so after a
/// reboot a fast service waited for a slow one to be ready. Now every root's pass runs at once.
#[test]
fn up_brings_every_root_up_at_once_so_a_fast_service_never_waits_for_a_slow_one() {
    use crate::common::http::Conn;
    let (slow, fast) = (Site::new(), Site::new());
    slow.release("v1", "--ready-after-ms 4000");
    fast.release("v1", "");
    let (slow_port, fast_port) = (free_port(), free_port());
    let out = slow.deploy(slow_port, "v1", &["15000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = fast.deploy(fast_port, "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    slow.reboot();
    fast.reboot();
    let up = std::process::Command::new(bin())
        .args(["up", "--root"])
        .arg(slow.root())
        .arg("--root")
        .arg(fast.root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(20, || version_on(fast_port).as_deref() == Some("v1")));
    // The fast one answers while the slow one, listed first, is still getting ready.
    let slow_ready = Conn::open(slow_port)
        .and_then(|mut c| c.get("/readyz", ""))
        .is_ok_and(|answer| answer.status == 200);
    assert!(!slow_ready, "the fast service waited for the slow one");
    let out = up.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).matches("started (pid").count(),
        2,
        "{}",
        stdout(&out)
    );
    let said = stdout(&out);
    let first = said.find(&slow.root().display().to_string()).unwrap();
    let second = said.find(&fast.root().display().to_string()).unwrap();
    assert!(first < second, "said in the order given: {said}");
}
