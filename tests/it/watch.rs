//! The watch after the switch: a release that is ready at once and falls over is switched back
//! with the previous release still running; a healthy one is promoted only after its watch; a
//! `--no-wait` watcher finishes in the background, and one killed mid-watch leaves nothing
//! half-done for the next command.

use crate::common::http::*;
use crate::common::*;

use std::time::{Duration, Instant};

/// A policy with a fast poll and the given watch, so the gate sees a short-lived release ready.
fn policy(site: &Site, watch_ms: u64) -> String {
    write(
        site.root(),
        "watch.yaml",
        &format!(
            "edge_svc:\n  progress_deadline_ms: 1500\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  stop_grace_ms: 1000\n  drain_timeout_ms: 2000\n  watch_ms: {watch_ms}\n"
        ),
    )
    .display()
    .to_string()
}

fn summary_live(site: &Site) -> serde_json::Value {
    let out = rollgate()
        .args(["log", "summary"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    summary["live"].clone()
}

#[test]
fn a_release_that_falls_over_after_the_switch_is_switched_back_without_failed_requests() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let v1 = site.live_pid().unwrap();
    let proxy = Proxy::start(&site, &[]);
    let load = Load::start(proxy.port, 4, Duration::from_millis(5));
    std::thread::sleep(Duration::from_millis(300));

    // Ready at once, gone 200 ms after its switch.
    site.crashing_release_with("v2", 200, 3);
    let armed = site.arm_at("v2", "switched");
    // A 10 s watch: switched back when it fell, long before the watch would have ended (a
    // bound generous for a loaded machine).
    let policy = policy(&site, 10_000);
    let started = Instant::now();
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    let took = started.elapsed();
    armed.join().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let seen = load.finish();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        took < Duration::from_millis(6000),
        "switched back only after {took:?}"
    );
    assert_none_failed(&seen, "a switch and a switch back");
    assert!(seen.iter().any(|(_, body, _)| body == "v1"));

    // current names v1's very process again, which never stopped.
    assert_eq!(site.live_pid(), Some(v1));
    assert!(alive(v1));
    let v2: Vec<serde_json::Value> = site
        .log_lines()
        .into_iter()
        .filter(|l| l["version"] == "v2")
        .collect();
    let events: Vec<&str> = v2.iter().map(|l| l["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["candidate_started", "switched", "rolled_back"]);
    let rolled_back = &v2[2];
    assert_eq!(rolled_back["phase"], "watch");
    let detail = rolled_back["detail"].as_str().unwrap();
    assert!(detail.starts_with("exited during the watch"), "{detail}");
    assert!(detail.contains("switched back to v1"), "{detail}");
    assert_eq!(summary_live(&site), "v1");
    assert!(!site.root().join("candidate").exists());
}

#[test]
fn a_healthy_release_is_promoted_after_its_watch_and_only_then_the_previous_one_stops() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let v1 = site.live_pid().unwrap();
    site.release("v2", "");
    let policy = policy(&site, 1500);
    let port = free_port();
    let mut deploy = std::process::Command::new(crate::common::bin())
        .args(["deploy", "edge-svc", &port.to_string(), "v2", "--root"])
        .arg(site.root())
        .args(["--policy", &policy])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(10, || site
        .pointer()
        .is_some_and(|p| p["version"] == "v2")));
    let switched = Instant::now();
    // Mid-watch: v2 serves, v1 still runs, and the log does not call v2 live yet.
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        alive(v1),
        "the previous release stopped before the watch ended"
    );
    assert_eq!(summary_live(&site), "v1");
    assert!(deploy.wait().unwrap().success());
    assert!(switched.elapsed() >= Duration::from_millis(1200));
    assert!(
        wait_for(5, || !alive(v1)),
        "the previous release outlived the watch"
    );
    let last = site.log_lines().last().cloned().unwrap();
    assert_eq!(last["event"], "promoted");
    let detail = last["detail"].as_str().unwrap();
    // Two drains (at the switch, after the watch), each named; no proxy said once.
    assert!(
        detail.contains(
            "; passed the watch; at the switch: no proxy; after the watch: old release v1 stopped"
        ),
        "{detail}"
    );
    assert_eq!(detail.matches("no proxy").count(), 1, "{detail}");
    assert_eq!(summary_live(&site), "v2");
    // "What was live at T" in the watch: v1, with v2 serving beside it, said as such.
    let ts_of = |event: &str| {
        site.log_lines()
            .iter()
            .find(|l| l["event"] == event && l["version"] == "v2")
            .unwrap()["ts"]
            .as_f64()
            .unwrap()
    };
    let at = |t: f64| {
        let out = rollgate()
            .args(["log", "history", "--format", "json", "--at", &t.to_string()])
            .arg(site.root().join("deploy.log"))
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let in_watch = at(ts_of("switched") + 0.1);
    assert_eq!(in_watch["live"], "v1", "{in_watch}");
    assert_eq!(
        (
            &in_watch["also_serving"][0]["version"],
            &in_watch["also_serving"][0]["how"]
        ),
        (&serde_json::json!("v2"), &serde_json::json!("watch")),
        "{in_watch}"
    );
    let after = at(ts_of("promoted") + 0.001);
    assert_eq!(
        (&after["live"], &after["also_serving"]),
        (&serde_json::json!("v2"), &serde_json::json!([]))
    );
    assert_eq!(version_on(port).as_deref(), Some("v2"));
}

#[test]
fn no_wait_leaves_a_recorded_watcher_that_finishes_the_watch() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let v1 = site.live_pid().unwrap();
    site.release("v2", "");
    let started = Instant::now();
    // A watch long enough that a deploy that waited for it could not be mistaken for one that
    // did not, however loaded the machine (a 1.5 s watch against a 1.4 s bound was not).
    let out = site.deploy(free_port(), "v2", &["--watch-ms", "8000", "--no-wait"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_millis(7000),
        "it waited for the watch"
    );
    assert!(
        !site
            .events()
            .contains(&("promoted".to_string(), "v2".to_string())),
        "the watch ended before the deploy returned"
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("candidate")).unwrap())
            .unwrap();
    assert_eq!(record["stage"], "watching");
    let watcher = record["watch"]["watcher_pid"].as_i64().unwrap() as i32;
    assert!(alive(watcher));
    let status = rollgate()
        .args(["status", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert!(
        stdout(&status).contains(&format!("watcher pid {watcher}")),
        "{}",
        stdout(&status)
    );
    assert!(alive(v1));
    assert!(wait_for(30, || !site.root().join("candidate").exists()));
    assert!(wait_for(5, || !alive(watcher)));
    assert!(wait_for(5, || !alive(v1)));
    assert_eq!(site.log_lines().last().unwrap()["event"], "promoted");
    assert_eq!(site.pointer().unwrap()["version"], "v2");
}

#[test]
fn a_watcher_killed_mid_watch_is_finished_by_the_next_deploy() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let v1 = site.live_pid().unwrap();
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &["--watch-ms", "60000", "--no-wait"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("candidate")).unwrap())
            .unwrap();
    let watcher = record["watch"]["watcher_pid"].as_i64().unwrap() as i32;
    // Let it take over the lock, then kill it mid-watch.
    std::thread::sleep(Duration::from_millis(500));
    send_signal(watcher, 9);
    assert!(wait_for(5, || !alive(watcher) || is_zombie(watcher)));
    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let promoted: Vec<serde_json::Value> = site
        .log_lines()
        .into_iter()
        .filter(|l| l["event"] == "promoted")
        .collect();
    let versions: Vec<&str> = promoted
        .iter()
        .map(|l| l["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions, ["v1", "v2", "v3"]);
    let v2 = promoted[1]["detail"].as_str().unwrap();
    assert!(
        v2.contains(&format!("cut short: watcher pid {watcher} was gone")),
        "{v2}"
    );
    assert!(!alive(v1));
    assert_eq!(site.pointer().unwrap()["version"], "v3");
}

#[test]
fn a_rollouts_last_wave_is_watched_before_it_is_promoted() {
    let site = Site::new();
    site.release("v1", "");
    let first = port_block(10);
    let ports = format!("{first}-{}", first + 9);
    let rollout = |version: &str, extra: &[&str]| {
        rollgate()
            .args(["rollout", "edge-svc", version, "--replicas", "1", "--root"])
            .arg(site.root())
            .args(["--ports", &ports, "--waves", "100"])
            .args(extra)
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap()
    };
    let out = rollout("v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Ready, gone a second later: inside the watch after the (only) wave.
    site.crashing_release_with("v2", 1000, 5);
    let armed = site.arm_at("v2", "replica_ready");
    let out = rollout("v2", &["--watch-ms", "4000"]);
    armed.join().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("during the soak"), "{}", stdout(&out));
    let versions = replica_versions(&site);
    assert_eq!(versions, ["v1"], "the failed replica went back");
    assert_eq!(count_events(&site, "promoted", "v2"), 0);
    assert_eq!(summary_live(&site), "v1");
}

#[test]
fn failed_probes_in_a_row_during_the_watch_switch_back() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let v1 = site.live_pid().unwrap();
    // Ready, then answering 503 from 400 ms on, while it keeps running.
    site.release("v2", "--unready-after-ms 400");
    let policy = write(
        site.root(),
        "watch.yaml",
        "edge_svc:\n  progress_deadline_ms: 1500\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 5000\n  watch_failures: 4\n",
    );
    let out = site.deploy(free_port(), "v2", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(site.live_pid(), Some(v1));
    let last = site.log_lines().last().cloned().unwrap();
    assert_eq!(last["event"], "rolled_back");
    assert_eq!(last["phase"], "watch");
    let detail = last["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("failed 4 probes in a row during the watch (last: HTTP 503)"),
        "{detail}"
    );
    assert!(detail.contains("switched back to v1"), "{detail}");
}

#[test]
fn the_watch_runs_its_whole_length_after_a_slow_drain() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    // A proxy that answers the switch without confirming it: the old release runs on as the
    // fallback whatever it says (before issue 79 the switch drained it, and an unconfirmed
    // drain held the watch for the whole drain timeout, 1500 ms).
    let peer = unconfirming_proxy(&site, "error not now\n", 1);
    // Gone 500 ms after its `switched` line: inside the 1 s watch that follows.
    site.crashing_release_with("v2", 500, 1);
    let armed = site.arm_at("v2", "switched");
    let out = site.deploy(
        free_port(),
        "v2",
        &["--watch-ms", "1000", "--drain-timeout-ms", "1500"],
    );
    peer.join().unwrap();
    armed.join().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let last = site.log_lines().last().cloned().unwrap();
    assert_eq!(last["event"], "rolled_back");
    assert_eq!(last["phase"], "watch");
    assert_eq!(summary_live(&site), "v1");
}

/// `current`'s `promoted_at` is the switch, not the end of the watch: once the fallback leaves
/// the pointer, the release has been live since it was switched to.
#[test]
fn the_pointer_keeps_the_switch_time_when_the_watch_drops_the_fallback() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &["--watch-ms", "1000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pointer = site.pointer().unwrap();
    assert!(pointer.get("fallback").is_none(), "{pointer}");
    let lines = site.log_lines();
    let ts = |event: &str| {
        lines
            .iter()
            .rev()
            .find(|l| l["event"] == event)
            .and_then(|l| l["ts"].as_f64())
            .unwrap()
    };
    let promoted_at = pointer["promoted_at"].as_f64().unwrap();
    assert!(
        (promoted_at - ts("switched")).abs() < 0.5,
        "promoted_at {promoted_at}, switched at {}",
        ts("switched")
    );
    assert!(
        ts("promoted") - promoted_at >= 0.9,
        "promoted_at {promoted_at} is the watch's end ({})",
        ts("promoted")
    );
}

/// Issue 67, B: a deploy on a port range killed with -9 in its watch (`current` names the new
/// release, the old one kept beside it as the fallback: both ports of the range in use). The
/// next identical deploy chooses its port under the lock, after its recovery finished the
/// dead one's switch and stopped the fallback — not before, where both ports looked taken and
/// it was refused "no port of --ports A-B is free".
#[test]
fn a_deploy_after_one_killed_in_its_watch_finishes_that_switch_then_takes_the_freed_port() {
    let site = Site::new();
    let first = port_block(2);
    let range = format!("{first}-{}", first + 1);
    let deploy = |version: &str, extra: &[&str]| {
        rollgate()
            .args(["deploy", "edge-svc", version, "--ports", &range, "--root"])
            .arg(site.root())
            .args(extra)
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap()
    };
    site.release("v1", "");
    let out = deploy("v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    site.release("v2", "");
    let mut watching = std::process::Command::new(crate::common::bin())
        .args([
            "deploy",
            "edge-svc",
            "v2",
            "--ports",
            &range,
            "--watch-ms",
            "60000",
            "--root",
        ])
        .arg(site.root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(30, || site
        .events()
        .contains(&("switched".to_string(), "v2".to_string()))));
    watching.kill().unwrap();
    watching.wait().unwrap();
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["version"], "v2");
    assert!(pointer["fallback"].is_object(), "{pointer}");

    site.release("v3", "");
    let out = deploy("v3", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = site.events();
    let v2_outcomes: Vec<&String> = events
        .iter()
        .filter(|(e, v)| v == "v2" && (e == "promoted" || e == "rolled_back"))
        .map(|(e, _)| e)
        .collect();
    assert_eq!(v2_outcomes, vec!["promoted"], "{events:?}");
    assert_eq!(site.pointer().unwrap()["version"], "v3");
}

/// Issue 68's launch record: a release switched back to in the watch is recorded in `current`
/// as it was started — its own limits — not with the policy of the release that failed (the
/// pointer used to take the failed run's settings, so `up` after a reboot would have started
/// the old release within the new release's limits).
#[test]
fn a_release_switched_back_to_keeps_the_limits_it_was_started_with() {
    let site = Site::new();
    let policy = |memory_mb: u64| {
        write(
            site.root(),
            &format!("policy-{memory_mb}.json"),
            &format!(
                r#"{{"edge_svc": {{"progress_deadline_ms": 5000, "poll_ms": 100, "max_unavailable_pct": 0,
                    "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 8000,
                    "isolation": {{"memory_mb": {memory_mb}}}}}}}"#
            ),
        )
    };
    site.add_sample("v1", "");
    let first = policy(256);
    let out = site.deploy(free_port(), "v1", &["--policy", first.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let live = site.live_pid().unwrap();
    site.add_sample("v2", "--exit-after-ms 1500");
    let second = policy(512);
    let out = site.deploy(free_port(), "v2", &["--policy", second.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["version"], "v1");
    assert_eq!(pointer["pid"], live);
    assert_eq!(pointer["limits"]["memory_mb"], 256, "{pointer}");
}
