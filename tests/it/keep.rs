//! Issue 68, 1: every release process is kept from the moment it is started, with no `up` and
//! no unit — its keeper starts it again when it exits, says how it ended, and lets it go when it
//! is retired, stopped or fails its gate; a keeper killed is replaced by the next `up`.

use crate::common::*;

use std::time::Duration;

fn status_text(site: &Site) -> String {
    let out = site.run(&["status"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out)
}

fn restarted(site: &Site) -> Vec<serde_json::Value> {
    site.log_lines()
        .into_iter()
        .filter(|l| l["event"] == "restarted")
        .collect()
}

/// The acceptance: after `rollgate deploy` in a bare shell, `kill -9` of the release — it
/// answers again (at once: its keeper is its parent), and `status` shows one restart with the
/// signal.
#[test]
fn a_release_killed_after_a_bare_deploy_answers_again_and_status_shows_the_restart() {
    let site = Site::new();
    site.release("v1", "");
    let port = free_port();
    let out = site.deploy(port, "v1", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // One keeper, beside the live release; the deploy itself has exited.
    assert_eq!(site.keepers().len(), 1, "{:?}", site.keepers());
    assert!(status_text(&site).contains("none since it went live; kept"));
    let killed = site.live_pid().unwrap();
    send_signal(killed, 9);
    assert!(
        wait_for(20, || version_on(port).as_deref() == Some("v1")
            && site.live_pid().is_some_and(|p| p != killed)),
        "{:?}",
        site.events()
    );
    let new = site.live_pid().unwrap();
    assert!(alive(new));
    assert!(wait_for(5, || restarted(&site).len() == 1));
    let line = &restarted(&site)[0];
    assert_eq!(line["ended"], "signal: 9 (SIGKILL)", "{line}");
    assert_eq!(line["pid"], new, "{line}");
    let status = status_text(&site);
    assert!(
        status.contains("1 since it went live (last at ")
            && status.contains(": signal: 9 (SIGKILL)); kept"),
        "{status}"
    );
    // Still one keeper: the same one, now the new process's parent.
    assert_eq!(site.keepers().len(), 1, "{:?}", site.keepers());
}

/// What is not live is not kept: a candidate that fails its gate and a release retired by the
/// next deploy leave no keeper, and `stop` takes the service's keeper with it.
#[test]
fn only_live_releases_are_kept_and_stop_lets_go() {
    let site = Site::new();
    site.release("v1", "");
    site.release("bad", "--exit-after-ms 0 --exit-code 78");
    site.release("v2", "");
    assert_eq!(
        site.deploy(free_port(), "v1", &["--watch-ms", "0"])
            .status
            .code(),
        Some(0)
    );
    let out = site.deploy(free_port(), "bad", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // The candidate's exit reached the deploy as the candidate's own (its keeper ended so).
    assert!(
        site.last_detail()
            .starts_with("candidate exited with exit status: 78 before ready"),
        "{}",
        site.last_detail()
    );
    assert!(
        wait_for(5, || site.keepers().len() == 1),
        "{:?}",
        site.keepers()
    );
    let v1 = site.live_pid().unwrap();
    assert_eq!(
        site.deploy(free_port(), "v2", &["--watch-ms", "0"])
            .status
            .code(),
        Some(0)
    );
    assert!(wait_for(10, || !alive(v1)));
    assert!(
        wait_for(5, || site.keepers().len() == 1),
        "{:?}",
        site.keepers()
    );
    // Nothing restarted the retired release.
    std::thread::sleep(Duration::from_millis(500));
    assert!(restarted(&site).is_empty(), "{:?}", site.events());
    site.stop_service();
    assert!(wait_for(10, || site.keepers().is_empty()
        && site.processes().is_empty()));
}

/// `stop` returns with the service's keepers gone, also one waiting out a crash's backoff
/// (before, it lingered through the backoff — 2 s after a second crash — and a test that
/// looked for the next `start`'s keeper right after `stop` found the old one leaving).
#[test]
fn stop_returns_once_the_keepers_are_gone_even_one_waiting_out_a_backoff() {
    let site = Site::new();
    site.release("v1", "");
    let out = site.deploy(free_port(), "v1", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let first = site.live_pid().unwrap();
    send_signal(first, 9);
    // Started again at once (a first exit has no backoff)...
    assert!(wait_for(10, || site
        .live_pid()
        .is_some_and(|p| p != first && alive(p))));
    // ...and killed again: the keeper now waits 2 s before the next start.
    let second = site.live_pid().unwrap();
    send_signal(second, 9);
    assert!(wait_for(10, || !alive(second)));
    let keepers = site.keepers();
    assert_eq!(keepers.len(), 1, "{keepers:?}");
    let out = site.run(&["stop", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(site.keepers().is_empty(), "{:?}", site.keepers());
    assert!(!alive(keepers[0]));
    assert!(site.processes().is_empty(), "{:?}", site.processes());
}

/// A keeper killed (SIGKILL) leaves its release running and kept by nobody — `status` says so —
/// until the next `up`, which gives it a keeper again; that keeper restarts it when it exits,
/// though it cannot know how it ended (it was not its parent).
#[test]
fn a_release_whose_keeper_was_killed_is_kept_again_by_up() {
    let site = Site::new();
    site.release("v1", "");
    let port = free_port();
    assert_eq!(
        site.deploy(port, "v1", &["--watch-ms", "0"]).status.code(),
        Some(0)
    );
    let live = site.live_pid().unwrap();
    site.kill_keepers();
    assert!(alive(live), "the release outlives its keeper");
    assert!(
        status_text(&site).contains("NOT kept"),
        "{}",
        status_text(&site)
    );
    let out = site.run(&["up"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("running (pid {live})")),
        "{}",
        stdout(&out)
    );
    assert_eq!(site.keepers().len(), 1);
    assert_eq!(site.live_pid(), Some(live), "adopted, not started again");
    send_signal(live, 9);
    assert!(wait_for(20, || version_on(port).as_deref() == Some("v1")
        && site.live_pid().is_some_and(|p| p != live)));
    assert!(wait_for(5, || restarted(&site).len() == 1));
    let ended = restarted(&site)[0]["ended"].as_str().unwrap().to_string();
    assert!(ended.contains("its exit status is unknown"), "{ended}");
}

/// A policy for `edge-svc` with `crash_loop` as given (JSON), written into the site.
/// Issue 81, 5: a keeper shows in `ps` as what it keeps — an adopted one too (`up` gave a
/// worker whose keeper was killed a keeper that showed as `rollgate keep edge-svc web`).
#[test]
fn an_adopted_keeper_shows_the_process_it_keeps() {
    let site = Site::new();
    site.add_sample_with("v1", &[("Procfile", "worker: exec sleep 7770012\n")]);
    let out = site.deploy(free_port(), "v1", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    site.kill_keepers();
    let out = site.run(&["up"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let worker = typed_processes(site.root())[0]["pid"].as_i64().unwrap();
    let web = i64::from(site.live_pid().unwrap());
    // Each keeper's entry names the process it keeps on its first line.
    let mut shown = Vec::new();
    for entry in std::fs::read_dir(site.root().join(".keepers"))
        .unwrap()
        .flatten()
    {
        let Ok(keeper) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path()).unwrap();
        let kept: i64 = text.split_whitespace().next().unwrap().parse().unwrap();
        let cmdline = std::fs::read(format!("/proc/{keeper}/cmdline")).unwrap_or_default();
        shown.push((kept, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
    }
    shown.sort();
    let mut wanted = vec![
        (web, "rollgate keep edge-svc web ".to_string()),
        (worker, "rollgate keep edge-svc worker.0 ".to_string()),
    ];
    wanted.sort();
    assert_eq!(shown, wanted);
}

fn policy_with(site: &Site, crash_loop: &str) -> String {
    let body = format!(
        r#"{{"edge_svc": {{"progress_deadline_ms": 5000, "poll_ms": 50, "on_stall": "rollback",
            "max_surge_pct": 100, "max_unavailable_pct": 0, "watch_ms": 1000{crash_loop}}}}}"#
    );
    write(site.root(), "policy.json", &body)
        .to_str()
        .unwrap()
        .to_string()
}

/// The crashing v2's `rolled_back` line: it names its three exits (`exit status: 4`) and its
/// keeper as what ended it.
fn rolled_back_for_its_crash_loop(site: &Site) -> serde_json::Value {
    let line = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "rolled_back" && l["version"] == "v2")
        .unwrap();
    let detail = line["detail"].as_str().unwrap();
    assert!(
        detail.contains("a crash loop: it exited 3 times within ")
            && detail.matches("exit status: 4").count() == 3,
        "{detail}"
    );
    assert_eq!(
        line["exposure"]["ended_by"], "its keeper (a crash loop after its switch)",
        "{line}"
    );
    line
}

/// v1 live, then v2 — which exits 2.5 s after every start once armed — switched to and
/// promoted, both with `policy_with(crash_loop)`, then armed: the policy's path and v1's port.
fn v1_then_a_crashing_v2(site: &Site, crash_loop: &str) -> (String, u16) {
    site.release("v1", "");
    site.crashing_release("v2", 2500);
    let policy = policy_with(site, crash_loop);
    let first = free_port();
    let out = site.deploy(first, "v1", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "promoted: {}", stderr(&out));
    site.arm("v2");
    (policy, first)
}

/// Issue 68, 2, the acceptance: a release that passes its gate and its watch, then exits a
/// while after every start (the deploy has exited 0), is rolled back on its own to the release
/// before it once it has exited `crash_loop.restarts` times (3 by default) — its `rolled_back`
/// line naming the exits and its keeper as what ended it — instead of being restarted for ever.
/// Through the proxy under load, only its first crash fails requests: from then on the release
/// before it runs beside it as the proxy's fallback (its standby), and is what is made live.
#[test]
fn a_release_that_crash_loops_after_its_switch_is_rolled_back_by_its_keeper() {
    use crate::common::http::{Load, Proxy};
    let site = Site::new();
    site.release("v1", "");
    site.crashing_release("v2", 5000);
    // The issue's numbers: it exits 5 s after each start, after a 2 s watch that it passes.
    let policy = write(
        site.root(),
        "policy.json",
        r#"{"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 50, "on_stall": "rollback",
            "max_surge_pct": 100, "max_unavailable_pct": 0, "watch_ms": 2000}}"#,
    )
    .display()
    .to_string();
    let first = free_port();
    assert_eq!(
        site.deploy(first, "v1", &["--policy", &policy])
            .status
            .code(),
        Some(0)
    );
    let proxy = Proxy::start(&site, &[]);
    let load = Load::start(proxy.port, 4, Duration::from_millis(5));
    // Unix time and the load's clock side by side, to place the log's lines among the answers.
    let (clock, unix) = (std::time::Instant::now(), unix_now());
    let at = |ts: f64| clock + Duration::from_secs_f64((ts - unix).max(0.0));
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "promoted: {}", stderr(&out));
    site.arm("v2");
    assert!(
        wait_for(60, || count_events(&site, "rolled_back", "v2") == 1
            && site.pointer().is_some_and(|p| p["version"] == "v1")),
        "{:?}",
        site.events()
    );
    std::thread::sleep(Duration::from_millis(300));
    let seen = load.finish();
    rolled_back_for_its_crash_loop(&site);
    let lines = site.log_lines();
    // Restarted twice before that, each exit said.
    assert_eq!(
        count_events(&site, "restarted", "v2"),
        2,
        "{:?}",
        site.events()
    );
    // The standby: v1 on the port it was last live on, ready after the first crash; made live
    // (the very process: not started a second time).
    let standby = lines
        .iter()
        .find(|l| l["event"] == "standby" && l["version"] == "v1")
        .unwrap_or_else(|| panic!("no standby line: {:?}", site.events()));
    assert_eq!(standby["port"], first, "{standby}");
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["pid"], standby["pid"], "{pointer} {standby}");
    assert_eq!(pointer["port"], first);
    assert!(pointer.get("fallback").is_none(), "{pointer}");
    let promoted = lines
        .iter()
        .rfind(|l| l["event"] == "promoted" && l["version"] == "v1")
        .unwrap();
    assert!(
        promoted["detail"]
            .as_str()
            .unwrap()
            .contains("made live again from its standby"),
        "{promoted}"
    );
    // Failures through the proxy: only before the standby was ready (the first crash's) and
    // the proxy had read `current` naming it (inotify: a moment, given 250 ms on a busy host).
    let ready_at = at(standby["ts"].as_f64().unwrap()) + Duration::from_millis(250);
    let failed: Vec<_> = seen
        .iter()
        .filter(|(status, _, _)| *status != 200)
        .collect();
    let late: Vec<_> = failed.iter().filter(|(_, _, t)| *t > ready_at).collect();
    assert!(
        late.is_empty(),
        "{} of {} failed after the standby was ready (of {} failed in all): {:?}",
        late.len(),
        seen.len(),
        failed.len(),
        late.iter()
            .take(5)
            .map(|(s, b, _)| (s, b))
            .collect::<Vec<_>>()
    );
    assert!(seen.iter().any(|(_, body, _)| body == "v2"));
    assert!(seen
        .iter()
        .any(|(_, body, t)| body == "v1" && *t > ready_at));
    let port = pointer["port"].as_u64().unwrap() as u16;
    assert_eq!(version_on(port).as_deref(), Some("v1"));
    assert!(wait_for(10, || site.processes().len() == 1
        && site.keepers().len() == 1));
}

/// Issue 80, 2: a restart moves the live release to the other port of a two-port range — the
/// one the release before it was last live on — and a crash loop after it then had no standby
/// ("last live on no other port"): every request failed while it crashed. The standby now
/// takes a free port when its last one is taken, and says so.
#[test]
fn a_standby_comes_when_its_last_port_is_the_crashing_release_s_after_a_restart() {
    let site = Site::new();
    site.release("v1", "");
    site.crashing_release("v2", 2500);
    let policy = policy_with(
        &site,
        r#", "crash_loop": {"restarts": 10, "within_ms": 120000}"#,
    );
    let first = port_block(2);
    let ports = format!("{first}-{}", first + 1);
    let deploy = |version: &str| {
        site.run(&[
            "deploy", "edge-svc", version, "--ports", &ports, "--policy", &policy,
        ])
    };
    assert_eq!(deploy("v1").status.code(), Some(0));
    assert_eq!(deploy("v2").status.code(), Some(0));
    assert_eq!(site.pointer().unwrap()["port"], first + 1);
    let out = site.run(&[
        "restart", "edge-svc", "--ports", &ports, "--policy", &policy,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        site.pointer().unwrap()["port"],
        first,
        "v2 on v1's last port"
    );
    site.arm("v2");
    let standby = || {
        site.log_lines()
            .into_iter()
            .find(|l| l["event"] == "standby")
            .map(|l| l["detail"].as_str().unwrap().to_string())
    };
    assert!(wait_for(20, || standby().is_some()), "{:?}", site.events());
    let said = standby().unwrap();
    assert!(
        said.contains("v1 started beside edge-svc v2")
            && said.contains(&format!(
                "(its last port {first} is v2's now: a free one instead)"
            )),
        "{said}"
    );
    let fallback = wait_for(10, || site.pointer().unwrap().get("fallback").is_some());
    assert!(fallback, "{:?}", site.pointer());
    let port = site.pointer().unwrap()["fallback"]["port"]
        .as_u64()
        .unwrap() as u16;
    assert!(port != first && port != first + 1, "{port}");
    assert_eq!(version_on(port).as_deref(), Some("v1"));
    site.stop_service();
}

/// A standby lasts the crash-loop window: a release that exits once within it gets the release
/// before it beside it, retired when the window ends (nothing of it left, `current` with no
/// fallback); an exit past the window brings no new standby.
#[test]
fn a_standby_is_retired_when_the_crash_loop_window_ends() {
    let site = Site::new();
    site.release("v1", "");
    site.crashing_release("v2", 3000);
    let policy = policy_with(
        &site,
        r#", "crash_loop": {"restarts": 3, "within_ms": 6000}"#,
    );
    let first = free_port();
    let out = site.deploy(first, "v1", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Armed at its switch, so its first exit falls 3 s into the 6 s window (2 s after its 1 s
    // watch) however long the deploy takes to return on a loaded machine (armed after it, CI
    // once saw the exit land past a 4 s window: no standby at all).
    let armed = site.arm_at("v2", "switched");
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "promoted: {}", stderr(&out));
    armed.join().unwrap();
    // The standby started (its line names its pid). Not watched for in `current`: it lasts
    // only what is left of the 4 s window, and on a loaded machine its start takes most of it
    // (CI saw a poll of `current` miss it, as it had seen one over HTTP miss it before).
    assert!(
        wait_for(20, || site
            .log_lines()
            .iter()
            .any(|l| l["event"] == "standby"
                && l["pid"].as_i64().is_some()
                && l["detail"].as_str().unwrap().contains("started beside"))),
        "{:?}",
        site.events()
    );
    assert!(
        wait_for(20, || site.log_lines().iter().any(|l| l["event"]
            == "standby"
            && l["detail"]
                .as_str()
                .unwrap()
                .contains("retired: the crash-loop window"))),
        "{:?}",
        site.events()
    );
    assert!(site.pointer().unwrap().get("fallback").is_none());
    assert_eq!(version_on(first), None);
    // Past the window: restarted as any exit, never rolled back, no second standby.
    assert!(wait_for(20, || count_events(&site, "restarted", "v2") >= 2));
    assert_eq!(count_events(&site, "rolled_back", "v2"), 0);
    let standbys = count_events(&site, "standby", "v1");
    assert_eq!(standbys, 2, "{:?}", site.events());
    assert_eq!(site.pointer().unwrap()["version"], "v2");
}

/// A standby whose keeper is killed is retired by the next command (`up`), and one that is
/// running when a deploy begins is retired by it: never a release process named by nothing.
#[test]
fn a_standby_outlives_neither_its_keeper_nor_the_next_deploy() {
    let site = Site::new();
    site.release("v3", "");
    let (policy, first) = v1_then_a_crashing_v2(
        &site,
        r#", "crash_loop": {"restarts": 10, "within_ms": 120000}"#,
    );
    let standby_pid = || {
        site.pointer()
            .and_then(|p| p["fallback"]["standby"].as_bool().filter(|b| *b).map(|_| p))
            .map(|p| p["fallback"]["pid"].as_i64().unwrap() as i32)
    };
    assert!(
        wait_for(20, || standby_pid().is_some()),
        "{:?}",
        site.events()
    );
    let standby = standby_pid().unwrap();
    // Said by status; left alone by `up` while its keeper runs.
    let status = status_text(&site);
    assert!(
        status.contains(&format!("v1 on port {first} (pid {standby})")),
        "{status}"
    );
    let out = site.run(&["up"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(standby_pid(), Some(standby));
    assert!(alive(standby));
    site.kill_keepers();
    let out = site.run(&["up"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("retired: its keeper is gone"),
        "{}",
        stdout(&out)
    );
    assert!(wait_for(10, || !alive(standby) || is_zombie(standby)));
    assert!(site.pointer().unwrap().get("fallback").is_none());

    // Its new keeper brings a standby again at the next exit; a deploy retires it.
    assert!(
        wait_for(20, || standby_pid().is_some_and(|pid| pid != standby)),
        "{:?}",
        site.events()
    );
    let standby = standby_pid().unwrap();
    // Issue 81, 3: a dry run predicts the deploy — its range's one other port busy, the
    // standby's port is the one it would take (the deploy retires the standby first); it said
    // "no port of --ports ... is free".
    let _busy = std::net::TcpListener::bind(("127.0.0.1", first + 1));
    let ports = format!("{first}-{}", first + 1);
    let args = ["--policy", policy.as_str(), "--ports", &ports, "--dry-run"];
    let dry = site.run(&[&["deploy", "edge-svc", "v3"][..], &args].concat());
    assert_eq!(
        dry.status.code(),
        Some(0),
        "{}{}",
        stdout(&dry),
        stderr(&dry)
    );
    assert!(
        stdout(&dry).contains("it would go ahead"),
        "{}",
        stdout(&dry)
    );
    assert!(
        stdout(&dry).contains(&format!("port {first}")),
        "{}",
        stdout(&dry)
    );
    let out = site.deploy(free_port(), "v3", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!alive(standby) || is_zombie(standby));
    assert!(
        site.log_lines().iter().any(|l| l["event"] == "standby"
            && l["detail"]
                .as_str()
                .unwrap()
                .contains("retired: a run of edge-svc v3 began")),
        "{:?}",
        site.events()
    );
    assert!(wait_for(10, || site.processes().len() == 1
        && site.keepers().len() == 1));
    assert_eq!(site.pointer().unwrap()["version"], "v3");
}

/// A replica set is judged so too: replicas that pass their gates and the rollout's soak, then
/// exit a while after every start, are rolled back on their own — by a rollout to the version
/// before, through the gate — once one of them has exited `crash_loop.restarts` times; the log's
/// `rolled_back` names the exits and the keeper.
#[test]
fn replicas_that_crash_loop_after_their_rollout_are_rolled_back_by_a_rollout() {
    let site = Site::new();
    site.release("v1", "");
    site.crashing_release("v2", 4000);
    let policy = policy_with(&site, "");
    let first = port_block(10);
    let ports = format!("{first}-{}", first + 9);
    let rollout = |version: &str| {
        site.run(&[
            "rollout",
            "edge-svc",
            version,
            "--replicas",
            "2",
            "--ports",
            &ports,
            "--deadline-ms",
            "20000",
            "--policy",
            &policy,
        ])
    };
    let out = rollout("v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = rollout("v2");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    site.arm("v2");
    let versions = || {
        let text = std::fs::read_to_string(site.root().join("replicas.json")).unwrap_or_default();
        serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|set| {
                set["replicas"].as_array().map(|all| {
                    all.iter()
                        .map(|r| r["version"].as_str().unwrap_or("").to_string())
                        .collect::<Vec<_>>()
                })
            })
            .unwrap_or_default()
    };
    assert_eq!(versions(), vec!["v2", "v2"]);
    assert!(
        wait_for(60, || count_events(&site, "rolled_back", "v2") == 1
            && versions() == vec!["v1", "v1"]),
        "{:?} {:?}",
        versions(),
        site.events()
    );
    rolled_back_for_its_crash_loop(&site);
    assert!(wait_for(20, || site.processes().len() == 2
        && site.keepers().len() == 2));
}

/// `crash_loop = { restarts = 0 }` turns it off: the same release is restarted, never rolled back.
#[test]
fn crash_loop_restarts_0_leaves_a_crashing_release_to_its_restarts() {
    let site = Site::new();
    v1_then_a_crashing_v2(&site, r#", "crash_loop": {"restarts": 0}"#);
    assert!(
        wait_for(40, || count_events(&site, "restarted", "v2") >= 3),
        "{:?}",
        site.events()
    );
    assert_eq!(
        count_events(&site, "rolled_back", "v2"),
        0,
        "{:?}",
        site.events()
    );
    assert_eq!(site.pointer().unwrap()["version"], "v2");
}

/// Issue 68, 6: a keeper killed (SIGKILL) at any moment of a restart — before it takes the
/// root, with the new process started but not yet recorded, after — leaves, once the next
/// command has run, one process of the release, the one `current` names, kept once: never two
/// copies, never one kept by nobody.
#[test]
fn a_keeper_killed_at_any_moment_of_a_restart_leaves_one_kept_copy_after_up() {
    let site = Site::new();
    site.release("v1", "");
    let port = free_port();
    assert_eq!(
        site.deploy(port, "v1", &["--watch-ms", "0"]).status.code(),
        Some(0)
    );
    for round in 0..12u64 {
        let live = site.live_pid().unwrap();
        let keepers = site.keepers();
        assert_eq!(keepers.len(), 1, "round {round}: {keepers:?}");
        send_signal(live, 9);
        // A restart takes a few tens of ms: each round cuts it at another moment.
        std::thread::sleep(Duration::from_millis(round * 5));
        send_signal(keepers[0], 9);
        assert!(wait_for(5, || !alive(keepers[0]) || is_zombie(keepers[0])));
        let out = site.run(&["up"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "round {round}: {}",
            stderr(&out)
        );
        let named = site.live_pid().unwrap();
        assert!(
            wait_for(10, || site.processes() == vec![named]
                && site.keepers().len() == 1),
            "round {round}: processes {:?} (current names {named}), keepers {:?}; up said {}",
            site.processes(),
            site.keepers(),
            stdout(&out)
        );
        // It answers: at once, or — a process the killed keeper had just started, adopted by
        // `up` as it runs — once it has booted (CI's load once made that a moment).
        assert!(
            wait_for(10, || version_on(port).as_deref() == Some("v1")),
            "round {round}: nothing answers on {port}"
        );
    }
}

/// A keeper whose root was removed stops its release and goes: nothing could name, stop or
/// start that release any more (and a test's temporary root leaves nothing running).
#[test]
fn a_keeper_whose_root_is_removed_stops_its_release_and_goes() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(
        site.deploy(free_port(), "v1", &["--watch-ms", "0"])
            .status
            .code(),
        Some(0)
    );
    let live = site.live_pid().unwrap();
    let keeper = site.keepers()[0];
    std::fs::remove_dir_all(site.root()).unwrap();
    let gone = |pid: i32| !alive(pid) || is_zombie(pid);
    assert!(wait_for(30, || gone(live) && gone(keeper)));
}

/// The keeper hands its release no ignored signal: SIGHUP and SIGINT reach a release as they
/// would anywhere (the keeper catches them for itself; an exec resets what is caught).
#[test]
fn a_kept_release_is_started_ignoring_no_signal() {
    let site = Site::new();
    let bin = crate::common::bin();
    site.script(
        "v1",
        &format!(
            "grep SigIgn /proc/self/status\nexec '{}' sample-service\n",
            bin.display()
        ),
    );
    assert_eq!(
        site.deploy(free_port(), "v1", &["--watch-ms", "0"])
            .status
            .code(),
        Some(0)
    );
    let said =
        untimed(&std::fs::read_to_string(site.root().join("output/v1/edge-svc.output")).unwrap());
    let mask = said
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        .expect("the release said its ignored signals");
    // Bit 0 is SIGHUP, bit 1 SIGINT.
    assert_eq!(mask & 0b11, 0, "{said}");
}

/// Issue 80, 2: `restart` re-armed the crash-loop rule — its switch was taken for a new
/// release's — so a few exits of web soon after a restart rolled the *code* back to the
/// release before it. The window counts from the switch to the version, which a restart (or a
/// scale) of the same version does not move.
#[test]
fn a_restart_does_not_arm_the_crash_loop_rollback() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "");
    let policy = policy_with(
        &site,
        r#", "crash_loop": {"restarts": 2, "within_ms": 2000}"#,
    );
    for version in ["v1", "v2"] {
        let out = site.deploy(free_port(), version, &["--policy", &policy]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let promoted_at = site.pointer().unwrap()["promoted_at"].as_f64().unwrap();
    assert!(
        wait_for(10, || unix_now() > promoted_at + 2.5),
        "the crash-loop window of v2's switch passed"
    );
    let out = site.run(&[
        "restart",
        "edge-svc",
        "--port",
        &free_port().to_string(),
        "--policy",
        &policy,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        site.pointer().unwrap()["promoted_at"].as_f64(),
        Some(promoted_at),
        "the restart moved the switch to v2"
    );
    // Two exits at once after the restart: restarted each time, never rolled back.
    for n in 1..=2 {
        let pid = site.live_pid().unwrap();
        send_signal(pid, 9);
        assert!(
            wait_for(10, || restarted(&site).len() == n
                && site.live_pid().is_some_and(|p| p != pid && alive(p))),
            "{:?}",
            site.events()
        );
    }
    // Nor was the release before it started beside it as a crash loop's standby.
    assert!(
        site.events().iter().all(|e| e.0 != "standby"),
        "{:?}",
        site.events()
    );
    assert_eq!(site.pointer().unwrap()["version"], "v2");
    assert_eq!(
        count_events(&site, "rolled_back", "v2"),
        0,
        "{:?}",
        site.events()
    );
}

/// Issue 81, 6: a release's child whose own parent died first (the program a `/bin/sh -c`
/// Procfile line runs) went to PID 1, and its zombie lingered until a slow PID 1 reaped it. A
/// keeper is now its release's subreaper: the orphan is its child, and once it exits it is
/// reaped — gone, not a zombie — with nobody else's help.
#[test]
fn a_keeper_is_the_subreaper_of_its_release_and_reaps_its_orphans() {
    let site = Site::new();
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 0\n  processes:\n    worker:\n      min_ready_ms: 100\n",
    );
    // `sh -c` stays the worker's process (two commands), with `sleep` its child.
    site.add_sample_with("v1", &[("Procfile", "worker: sleep 7770004; true\n")]);
    let out = site.deploy(free_port(), "v1", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let shell = typed_processes(site.root())[0]["pid"].as_i64().unwrap() as i32;
    let keeper = parent_of(shell).unwrap();
    assert!(is_keeper(keeper), "the worker's parent is its keeper");
    let child = || {
        site.processes().into_iter().find(|pid| {
            parent_of(*pid) == Some(shell)
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c == b"sleep\x007770004\x00")
        })
    };
    assert!(wait_for(10, || child().is_some()));
    let sleep = child().unwrap();
    send_signal(shell, 9);
    assert!(wait_for(10, || parent_of(sleep) != Some(shell)));
    assert_eq!(
        parent_of(sleep),
        Some(keeper),
        "the orphan went to the keeper, not to PID 1"
    );
    // It ends (the keeper ends its release's tree before starting it again), and is reaped by
    // the keeper: no zombie left.
    assert!(
        wait_for(10, || parent_of(sleep).is_none()),
        "pid {sleep} still there as {:?}",
        std::fs::read_to_string(format!("/proc/{sleep}/stat"))
    );
    site.stop_service();
}

/// A keeper killed after it started its release and before it said so: the run could not know
/// the release started, forgot its candidate, and the process ran on named by nothing — found by
/// the random-kill test as a worker `up` never stopped. The run now stops whatever carries the
/// candidate's token.
#[test]
fn a_keeper_killed_before_it_reports_its_start_leaves_no_process_behind() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let live = site.live_pid().unwrap();
    let out = rollgate()
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v2",
            "--root",
        ])
        .arg(site.root())
        .env("ROLLGATE_FAULT", "keeper-dies-before-report")
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("its keeper ended before it said whether the release started"),
        "{}",
        stderr(&out)
    );
    assert_eq!(site.live_pid(), Some(live));
    assert!(
        wait_for(10, || site.processes() == [live]),
        "v1 alone runs: {:?}",
        site.processes()
    );
    site.stop_service();
}
