//! What a dead rollgate leaves is finished by whoever comes next (issue 24): each test is a
//! sequence a user could hit, run with the real binary and real processes, and fails on the
//! code before the fix.

use crate::common::*;

use std::process::Output;
use std::time::Duration;

use serde_json::Value;

fn run(site: &Site, args: &[&str]) -> Output {
    rollgate()
        .args(args)
        .arg("--root")
        .arg(site.root())
        .env("NO_COLOR", "1")
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap()
}

fn said(out: &Output) -> String {
    format!("{}{}", stdout(out), stderr(out))
}

fn json(site: &Site, file: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(site.root().join(file)).unwrap()).unwrap()
}

/// A policy with tiny deadlines and these budgets; `extra` is more JSON fields.
fn policy(site: &Site, surge_pct: u32, unavailable_pct: u32, extra: &str) -> String {
    let path = write(
        site.root(),
        "policy.json",
        &format!(
            r#"{{"edge_svc": {{"progress_deadline_ms": 8000, "poll_ms": 50, "stop_grace_ms": 1000,
                "drain_timeout_ms": 0, "watch_ms": 0, "on_stall": "rollback",
                "max_surge_pct": {surge_pct}, "max_unavailable_pct": {unavailable_pct} {extra}}}}}"#
        ),
    );
    path.to_str().unwrap().to_string()
}

fn rollout_in_background(site: &Site, args: &[&str]) -> std::process::Child {
    std::process::Command::new(crate::common::bin())
        .args(args)
        .arg("--root")
        .arg(site.root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// The pids `replicas.json` names, and whether each runs.
fn pool_running(site: &Site) -> Vec<(String, bool)> {
    json(site, "replicas.json")["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["version"].as_str().unwrap().to_string(),
                alive(r["pid"].as_i64().unwrap() as i32),
            )
        })
        .collect()
}

#[test]
fn defect_02_abort_of_an_in_place_rollout_whose_rollgate_died_brings_its_replica_back() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "--ready-after-ms 60000");
    let policy = policy(&site, 0, 0, "");
    let out = run(
        &site,
        &[
            "rollout",
            "edge-svc",
            "v1",
            "--replicas",
            "1",
            "--ports",
            &ten_ports(0),
            "--policy",
            &policy,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let mut running =
        rollout_in_background(&site, &["rollout", "edge-svc", "v2", "--policy", &policy]);
    // The only replica left the pool for its v2, which is being gated when rollgate dies.
    assert!(wait_for(20, || count_events(
        &site,
        "replica_started",
        "v2"
    ) == 1));
    send_signal(running.id() as i32, 9);
    running.wait().unwrap();
    let out = run(&site, &["rollout", "abort", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(
        pool_running(&site),
        [("v1".to_string(), true)],
        "{}",
        said(&out)
    );
}

/// Three replicas of v1, then a rollout to v2 that paused itself in its second wave (slot 2's
/// v2 exits at boot); slots 0 and 1 run v2.
fn paused_with_two_on_v2(site: &Site, block: u16) -> String {
    site.release("v1", "");
    fails_on_slot(site, "v2", 2);
    let policy = policy(site, 34, 0, r#", "waves": [34, 100]"#);
    let out = run(
        site,
        &[
            "rollout",
            "edge-svc",
            "v1",
            "--replicas",
            "3",
            "--ports",
            &ten_ports(block),
            "--policy",
            &policy,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let out = run(site, &["rollout", "edge-svc", "v2", "--policy", &policy]);
    assert_eq!(out.status.code(), Some(3), "paused: {}", said(&out));
    policy
}

/// Kills slot 0's v2 process, as a crash of the release itself while the rollout is paused.
fn kill_slot_zero(site: &Site) {
    let slot0 = &json(site, "replicas.json")["replicas"][0];
    assert_eq!(slot0["version"], "v2");
    let pid = slot0["pid"].as_i64().unwrap() as i32;
    send_signal(pid, 9);
    assert!(wait_for(5, || !alive(pid)));
}

/// The resume counts slot 0's death as a failure (it once completed regardless: issue 36,
/// "completed … 1 succeeded, 2 failed" with exit 0). Resumed, the failed replicas are started
/// again; slot 2's v2 exits at boot again, so the rollout pauses again (exit 3), and nothing
/// calls it complete.
#[test]
fn defect_03_resume_after_a_paused_rollouts_new_replica_died_counts_it_failed() {
    let site = Site::new();
    paused_with_two_on_v2(&site, 1);
    kill_slot_zero(&site);
    let out = run(&site, &["rollout", "resume", "edge-svc"]);
    assert_eq!(out.status.code(), Some(3), "paused again: {}", said(&out));
    assert!(stdout(&out).contains("paused itself"), "{}", said(&out));
    assert_eq!(
        count_events(&site, "promoted", "v2"),
        0,
        "never called complete"
    );
    let failed = site
        .log_lines()
        .into_iter()
        .find(|l| l["event"] == "replica_failed" && l["slot"] == 0)
        .expect("slot 0's failure is logged");
    assert!(failed["detail"]
        .as_str()
        .unwrap()
        .contains("no rollgate watched it"));
    let resumed = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "rollout_resumed")
        .unwrap();
    assert_eq!(resumed["detail"], "retrying failed replica(s) 0, 2");
    // Every slot is served: slot 0 by v1 brought back (or by v2 again, had it been retried
    // before slot 2 failed again), slot 1 by v2, slot 2 by v1.
    let pool = pool_running(&site);
    assert!(pool[0].1, "{pool:?}");
    assert_eq!(pool[1], ("v2".to_string(), true), "{pool:?}");
    assert_eq!(pool[2], ("v1".to_string(), true), "{pool:?}");
}

#[test]
fn defect_03_abort_with_rollback_after_a_paused_rollouts_new_replica_died_starts_one_old_process() {
    let site = Site::new();
    paused_with_two_on_v2(&site, 2);
    let before = site
        .log_lines()
        .iter()
        .filter(|l| l["event"] == "replica_started" && l["slot"] == 0)
        .count();
    kill_slot_zero(&site);
    let out = run(&site, &["rollout", "abort", "edge-svc", "--rollback"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let started = site
        .log_lines()
        .iter()
        .filter(|l| l["event"] == "replica_started" && l["slot"] == 0)
        .count();
    assert_eq!(started - before, 1, "one v1 process for slot 0");
    let pool = pool_running(&site);
    assert!(pool.iter().all(|(v, up)| v == "v1" && *up), "{pool:?}");
    assert_eq!(token_carriers_outside_the_pool(&site), Vec::<i32>::new());
}

/// Processes carrying a deploy token that `replicas.json` does not name.
fn token_carriers_outside_the_pool(site: &Site) -> Vec<i32> {
    let named: Vec<i64> = json(site, "replicas.json")["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pid"].as_i64().unwrap())
        .collect();
    site.processes()
        .into_iter()
        .filter(|pid| !named.contains(&i64::from(*pid)))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|var| var.starts_with(b"ROLLGATE_DEPLOY_TOKEN="))
            })
        })
        .collect()
}

#[test]
fn defect_05_up_starts_the_live_release_while_an_escalated_deploy_waits() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "--ready-after-ms 600000");
    let port = free_port();
    let out = site.deploy(port, "v1", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let policy = write(
        site.root(),
        "escalate.json",
        r#"{"edge_svc": {"progress_deadline_ms": 300, "poll_ms": 50, "on_stall": "escalate",
            "max_surge_pct": 100, "max_unavailable_pct": 0}}"#,
    );
    let out = site.deploy(free_port(), "v2", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "escalated: {}", said(&out));
    // A reboot: the live release is gone.
    let live = site.live_pid().unwrap();
    send_signal(live, 9);
    assert!(wait_for(5, || !alive(live)));
    let out = run(&site, &["up"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(alive(site.live_pid().unwrap()), "v1 serves again");
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    // The escalation still waits for its person.
    let out = run(&site, &["abort", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(said(&out).contains("aborted"), "{}", said(&out));
}

/// A deploy of v2 with a long watch, its rollgate SIGKILLed once it switched.
fn killed_in_the_watch(site: &Site) {
    let port = free_port().to_string();
    let args = ["deploy", "edge-svc", &port, "v2", "--watch-ms", "30000"];
    let mut deploying = rollout_in_background(site, &args);
    assert!(wait_for(20, || count_events(site, "switched", "v2") == 1));
    send_signal(deploying.id() as i32, 9);
    deploying.wait().unwrap();
}

#[test]
fn defect_06_a_reboot_in_the_middle_of_a_watch_leaves_pointer_log_and_processes_agreeing() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "");
    let out = site.deploy(free_port(), "v1", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    // The reboot: rollgate and both releases die at once.
    killed_in_the_watch(&site);
    for pid in site.processes() {
        send_signal(pid, 9);
    }
    assert!(wait_for(5, || site.processes().is_empty()));
    let out = run(&site, &["up"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let outcome = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "promoted" || l["event"] == "rolled_back")
        .unwrap();
    assert_eq!(outcome["event"], "rolled_back", "{outcome}");
    assert_eq!(outcome["version"], "v2");
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["version"], "v1", "the pointer agrees with the log");
    assert!(
        alive(pointer["pid"].as_i64().unwrap() as i32),
        "and v1 runs"
    );
    assert_eq!(site.processes().len(), 1, "nothing else runs");
}

#[test]
fn defect_07_a_pause_that_loses_the_race_with_the_rollouts_end_is_refused_and_runs_no_hook_again() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "");
    hook_recorder(&site);
    let policy = policy(
        &site,
        100,
        0,
        r#", "hooks": {"post_promote": ["./post.sh"]}"#,
    );
    let out = run(
        &site,
        &[
            "rollout",
            "edge-svc",
            "v2",
            "--replicas",
            "2",
            "--ports",
            &ten_ports(3),
            "--policy",
            &policy,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let hooks = || std::fs::read_to_string(hooks_out(&site)).unwrap();
    assert_eq!(hooks().lines().count(), 1);
    // As the pause is asked, the rollout is still running and its rollgate holds the lock;
    // then it completes and lets go without taking the request.
    let state = site.root().join("rollout.json");
    let completed = std::fs::read_to_string(&state).unwrap();
    std::fs::write(&state, completed.replace("\"completed\"", "\"running\"")).unwrap();
    let mut holder = std::process::Command::new("flock")
        .arg(site.root().join("deploy.lock"))
        .args(["sleep", "1.5"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let pause = rollout_in_background(&site, &["rollout", "pause", "edge-svc"]);
    std::thread::sleep(Duration::from_millis(400));
    std::fs::write(&state, &completed).unwrap();
    holder.wait().unwrap();
    let out = pause.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2), "refused: {}", said(&out));
    assert_eq!(hooks().lines().count(), 1, "post_promote ran once");
    assert_eq!(json(&site, "rollout.json")["phase"], "completed");
}

#[test]
fn defect_09_a_stale_abort_request_does_not_steer_the_next_deploy() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "--ready-after-ms 500");
    let out = site.deploy(free_port(), "v1", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    // Left by an abort asked of a rollout that is long gone.
    write(
        site.root(),
        "rollout.request",
        r#"{"rollout": "r1", "ask": "abort", "reason": "stale", "rollback": true}"#,
    );
    let out = site.deploy(free_port(), "v2", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v2");
}

#[test]
fn defect_10_values_in_state_files_pass_the_command_lines_checks() {
    let site = Site::new();
    let port = free_port();
    write(
        site.root(),
        "current",
        &format!(
            r#"{{"service": "edge-svc", "version": "../../tmp/x", "port": {port}, "pid": 1,
                "start_time": 1, "promoted_at": 1.0}}"#
        ),
    );
    let out = run(&site, &["up"]);
    assert_ne!(out.status.code(), Some(0), "{}", said(&out));
    let said_up = stderr(&out);
    assert!(said_up.contains("current: field `version`"), "{said_up}");
    assert!(said_up.contains("starts with a dot"), "{said_up}");
    std::fs::remove_file(site.root().join("current")).unwrap();

    write(
        site.root(),
        "replicas.json",
        &format!(
            r#"{{"service": "edge-svc", "replicas": [{{"slot": 4000000000, "version": "v1",
                "port": {port}, "pid": 1, "start_time": 1}}]}}"#
        ),
    );
    site.release("v1", "");
    for args in [&["up"][..], &["rollout", "edge-svc", "v1"][..]] {
        let out = run(&site, args);
        assert_ne!(out.status.code(), Some(0), "{}", said(&out));
        assert!(
            stderr(&out).contains("replicas.json: field `replicas[0].slot`"),
            "{}",
            said(&out)
        );
    }
    std::fs::remove_file(site.root().join("replicas.json")).unwrap();

    // A real rollout's state, edited: its port range turned around.
    let out = run(
        &site,
        &[
            "rollout",
            "edge-svc",
            "v1",
            "--replicas",
            "1",
            "--ports",
            &ten_ports(4),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let mut state = json(&site, "rollout.json");
    state["settings"]["ports"] = serde_json::json!([5, 3]);
    write(site.root(), "rollout.json", &state.to_string());
    let out = run(&site, &["rollout", "status", "edge-svc"]);
    assert_ne!(out.status.code(), Some(0), "{}", said(&out));
    assert!(
        stderr(&out).contains("rollout.json: field `settings.ports`"),
        "{}",
        said(&out)
    );
}

#[test]
fn defect_11_supervise_finishes_a_dead_deployers_watch_before_restarting_anything() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "");
    let out = site.deploy(free_port(), "v1", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    // Supervising since before the deploy.
    let mut supervisor = std::process::Command::new(crate::common::bin())
        .args(["up", "--supervise", "--root"])
        .arg(site.root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its first pass (under the lock) is over before the deploy takes the lock.
    std::thread::sleep(Duration::from_millis(1500));
    killed_in_the_watch(&site);
    // The new release dies in its watch, with nobody watching it but the supervisor.
    let new = site.live_pid().unwrap();
    send_signal(new, 9);
    let decided = wait_for(20, || {
        count_events(&site, "rolled_back", "v2") + count_events(&site, "restarted", "v2") > 0
    });
    std::thread::sleep(Duration::from_millis(500));
    send_signal(supervisor.id() as i32, 15);
    supervisor.wait().unwrap();
    assert!(decided, "{:?}", site.events());
    assert_eq!(
        count_events(&site, "rolled_back", "v2"),
        1,
        "{:?}",
        site.events()
    );
    assert_eq!(
        count_events(&site, "restarted", "v2"),
        0,
        "{:?}",
        site.events()
    );
    assert_eq!(site.pointer().unwrap()["version"], "v1");
}

#[test]
fn the_workers_of_a_live_replica_are_not_taken_for_strays_after_a_crash() {
    let site = Site::new();
    // A release that is a shell running the service as its child (not exec'd): the child is a
    // worker of the release and carries the rollout's token too.
    let bin = crate::common::bin();
    for version in ["v1", "v2"] {
        site.script(version, &format!("'{}' sample-service\n", bin.display()));
    }
    let policy = policy(&site, 34, 0, r#", "waves": [34, 100]"#);
    let out = run(
        &site,
        &[
            "rollout",
            "edge-svc",
            "v1",
            "--replicas",
            "3",
            "--ports",
            &ten_ports(5),
            "--policy",
            &policy,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    // Killed half-way through the move to v2, then resumed: recovery sweeps for strays.
    let out = rollgate()
        .args(["rollout", "edge-svc", "v2", "--policy", &policy, "--root"])
        .arg(site.root())
        .env("ROLLGATE_FAULT", "kill-after-action:12")
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(9)
    );
    let out = run(&site, &["rollout", "resume", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let pool = json(&site, "replicas.json");
    for replica in pool["replicas"].as_array().unwrap() {
        let port = replica["port"].as_u64().unwrap() as u16;
        assert_eq!(
            version_on(port).as_deref(),
            Some("v2"),
            "replica {replica} answers: {:?}",
            site.events()
        );
    }
}
