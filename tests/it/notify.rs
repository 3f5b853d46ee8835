//! Readiness by notification (`probe = { kind = 'notify }`): real releases speaking systemd's
//! notify protocol to rollgate through the real binary. A release whose HTTP readiness never
//! passes goes live on READY=1; ERRNO= fails the gate at once; READY=1 from outside the
//! release's process group does not count; a missed watchdog switches the watch back; STATUS=
//! reaches the log; a rollout's replicas are gated the same way.

use crate::common::*;

use std::process::Output;
use std::time::{Duration, Instant};

/// `notify.yaml`: edge_svc's numbers, this deadline and watch, and this probe.
fn policy(site: &Site, deadline_ms: u64, watch_ms: u64, probe: &str) -> String {
    write(
        site.root(),
        "notify.yaml",
        &format!(
            "edge_svc:\n  progress_deadline_ms: {deadline_ms}\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  stop_grace_ms: 1000\n  drain_timeout_ms: 1000\n  watch_ms: {watch_ms}\n  probe: {probe}\n"
        ),
    )
    .display()
    .to_string()
}

fn line_of<'a>(
    lines: &'a [serde_json::Value],
    event: &str,
    version: &str,
) -> &'a serde_json::Value {
    lines
        .iter()
        .rev()
        .find(|l| l["event"] == event && l["version"] == version)
        .unwrap_or_else(|| panic!("no {event} line for {version}: {lines:?}"))
}

#[test]
fn a_release_whose_http_readiness_never_passes_goes_live_on_ready_1() {
    let site = Site::new();
    // /readyz answers 503 for ever; READY=1 goes out 200 ms after the start.
    site.release(
        "v1",
        "--readyz-status 503 --notify --ready-after-ms 200 --notify-status 'warmed 3 caches'",
    );
    let notify = policy(&site, 5000, 300, "{kind: notify}");
    let out = site.deploy(free_port(), "v1", &["--policy", &notify]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    let lines = site.log_lines();
    let promoted = line_of(&lines, "promoted", "v1");
    // STATUS= reaches the log, on the outcome line.
    assert_eq!(promoted["status"], "warmed 3 caches", "{promoted}");
    let detail = promoted["detail"].as_str().unwrap();
    assert!(detail.starts_with("ready after "), "{detail}");

    // The same release behind the HTTP probe is never ready: READY=1 is what passed it.
    let http = Site::new();
    http.release("v1", "--readyz-status 503 --notify --ready-after-ms 200");
    let plain = policy(&http, 800, 300, "{kind: http}");
    let out = http.deploy(free_port(), "v1", &["--policy", &plain]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(http.pointer().is_none());
}

#[test]
fn errno_fails_the_gate_at_once_with_its_reason() {
    let site = Site::new();
    site.release("v1", "--notify --notify-errno 2 --ready-after-ms 100");
    // A 30 s deadline: the rollback must not wait for it.
    let notify = policy(&site, 30_000, 300, "{kind: notify}");
    let started = Instant::now();
    let out = site.deploy(free_port(), "v1", &["--policy", &notify]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(took < Duration::from_secs(10), "rolled back after {took:?}");
    assert!(site.pointer().is_none());
    let lines = site.log_lines();
    let rolled_back = line_of(&lines, "rolled_back", "v1");
    let detail = rolled_back["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("it reported ERRNO=2 (No such file or directory) before ready"),
        "{detail}"
    );
    assert_eq!(rolled_back["status"], "failed to start", "{rolled_back}");
}

#[test]
fn ready_1_from_outside_the_releases_process_group_does_not_pass_the_gate() {
    let site = Site::new();
    // The release says nothing itself; it leaves its NOTIFY_SOCKET where the test finds it.
    let bin = crate::common::bin();
    let told = site.root().join("data/notify-socket");
    site.script(
        "v1",
        &format!(
            "printf %s \"$NOTIFY_SOCKET\" > \"$STATE_DIRECTORY/notify-socket\"\nexec '{}' sample-service --readyz-status 503\n",
            bin.display()
        ),
    );
    let notify = policy(&site, 1500, 300, "{kind: notify}");
    let mut deploy = std::process::Command::new(&bin)
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v1",
            "--policy",
            &notify,
        ])
        .arg("--root")
        .arg(site.root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // This test process (another group) says READY=1 until the deploy ends.
    let outsider = std::os::unix::net::UnixDatagram::unbound().unwrap();
    let mut sent = 0;
    let status = loop {
        if let Some(status) = deploy.try_wait().unwrap() {
            break status;
        }
        if let Ok(address) = std::fs::read_to_string(&told) {
            if !address.is_empty() && outsider.send_to(b"READY=1", &address).is_ok() {
                sent += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(sent > 0, "the release never said where its socket is");
    assert_eq!(status.code(), Some(1));
    assert!(
        site.pointer().is_none(),
        "an outsider's READY=1 promoted it"
    );
    let detail = site.last_detail();
    assert!(detail.starts_with("not ready after 1500 ms"), "{detail}");
    assert!(
        detail.contains("from outside its process group ignored"),
        "{detail}"
    );
}

#[test]
fn a_confirmation_must_pass_after_ready_1() {
    // READY=1, and /readyz answers 200 too: promoted.
    let confirmed = Site::new();
    confirmed.release("v1", "--notify --ready-after-ms 100");
    let notify = policy(
        &confirmed,
        1500,
        0,
        "{kind: notify, confirm: http, path: /readyz}",
    );
    let out = confirmed.deploy(free_port(), "v1", &["--policy", &notify]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // READY=1, but /readyz keeps answering 503: the confirmation never passes.
    let unconfirmed = Site::new();
    unconfirmed.release("v1", "--notify --ready-after-ms 100 --readyz-status 503");
    let notify = policy(
        &unconfirmed,
        1500,
        0,
        "{kind: notify, confirm: http, path: /readyz}",
    );
    let out = unconfirmed.deploy(free_port(), "v1", &["--policy", &notify]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let detail = unconfirmed.last_detail();
    assert!(
        detail.starts_with("not ready after 1500 ms") && detail.contains("HTTP 503"),
        "{detail}"
    );
}

#[test]
fn a_missed_watchdog_during_the_watch_switches_back() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let v1 = site.live_pid().unwrap();
    // Pings every 150 ms (half the watchdog), then none from 900 ms after its start.
    site.release(
        "v2",
        "--readyz-status 503 --notify --ready-after-ms 100 --watchdog-stops-after-ms 900",
    );
    let notify = policy(&site, 5000, 5000, "{kind: notify, watchdog_ms: 300}");
    let started = Instant::now();
    let out = site.deploy(free_port(), "v2", &["--policy", &notify]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        took < Duration::from_millis(4500),
        "switched back after {took:?}"
    );
    assert_eq!(site.live_pid(), Some(v1), "current names v1 again");
    let lines = site.log_lines();
    let rolled_back = line_of(&lines, "rolled_back", "v2");
    assert_eq!(rolled_back["phase"], "watch");
    let detail = rolled_back["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("no WATCHDOG=1 for ") && detail.contains("during the watch"),
        "{detail}"
    );
}

#[test]
fn a_watchdog_kept_up_passes_the_watch() {
    let site = Site::new();
    site.release("v1", "--readyz-status 503 --notify --ready-after-ms 100");
    let notify = policy(&site, 5000, 1500, "{kind: notify, watchdog_ms: 300}");
    let out = site.deploy(free_port(), "v1", &["--policy", &notify]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pid = site.live_pid().unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.contains("WATCHDOG_USEC=300000"), "{environ}");
    // Issue 66: a name in rollgate's run folder, which no other process can take first.
    assert!(
        environ.contains("NOTIFY_SOCKET=/run/rollgate/notify/"),
        "{environ}"
    );
}

/// Replicas of v1 (notify, ready at once) rolled out, then v2 in one wave with replica
/// `odd_slot` started with `odd_knobs` as well; the soak, the probe and the ratio 0.5 as given.
/// Returns v2's rollout and what it said.
fn one_wave_of_v2(
    site: &Site,
    replicas: usize,
    (odd_slot, odd_knobs): (usize, &str),
    soak_ms: u64,
    probe: &str,
    block: u16,
) -> (Output, String) {
    let bin = crate::common::bin();
    site.release("v1", "--readyz-status 503 --notify --ready-after-ms 50");
    site.script(
        "v2",
        &format!(
            "if [ \"$ROLLGATE_SLOT\" = {odd_slot} ]; then odd='{odd_knobs}'; fi\nexec '{}' sample-service --readyz-status 503 --notify --ready-after-ms 50 $odd\n",
            bin.display()
        ),
    );
    let policy = write(
        site.root(),
        "rollout.yaml",
        &format!("edge_svc:\n  progress_deadline_ms: 20000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  stop_grace_ms: 1000\n  drain_timeout_ms: 500\n  soak_ms: {soak_ms}\n  waves: [100]\n  max_failure_ratio: 0.5\n  probe: {probe}\n"),
    )
    .display()
    .to_string();
    let ports = ten_ports(block);
    let count = replicas.to_string();
    let out = site.rollout(
        "v1",
        &["--replicas", &count, "--ports", &ports, "--policy", &policy],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = site.rollout("v2", &["--policy", &policy]);
    let said = format!("{}{}", stdout(&out), stderr(&out));
    (out, said)
}

fn replica_failed(site: &Site, slot: usize) -> serde_json::Value {
    let lines = site.log_lines();
    lines
        .iter()
        .find(|l| l["event"] == "replica_failed" && l["slot"] == slot)
        .cloned()
        .unwrap_or_else(|| panic!("{lines:?}"))
}

#[test]
fn a_rollouts_replicas_are_each_gated_by_their_own_ready_1() {
    let site = Site::new();
    let started = Instant::now();
    // Replica 1 of v2 reports a failure; the others go live on READY=1 alone.
    let (out, said) = one_wave_of_v2(&site, 3, (1, "--notify-errno 5"), 200, "{kind: notify}", 20);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "waited for a deadline"
    );
    assert_eq!(out.status.code(), Some(0), "{said}");
    // One wave: replica 1 failed on its ERRNO (1 of 3, within the ratio) and kept v1; the
    // others moved.
    assert_eq!(replica_versions(&site), ["v2", "v1", "v2"], "{said}");
    let failed = replica_failed(&site, 1);
    let detail = failed["detail"].as_str().unwrap();
    assert!(detail.contains("ERRNO=5 (I/O error)"), "{detail}");
    assert_eq!(failed["status"], "failed to start", "{failed}");
}

#[test]
fn a_replica_that_stops_pinging_its_watchdog_fails_the_soak() {
    let site = Site::new();
    // Replica 0 of v2 stops its pings 700 ms after its start, inside the 3 s soak.
    let (out, said) = one_wave_of_v2(
        &site,
        2,
        (0, "--watchdog-stops-after-ms 700"),
        3000,
        "{kind: notify, watchdog_ms: 300}",
        21,
    );
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert_eq!(replica_versions(&site), ["v1", "v2"], "{said}");
    let failed = replica_failed(&site, 0);
    let detail = failed["detail"].as_str().unwrap();
    assert!(
        detail.contains("no WATCHDOG=1 for ") && detail.contains("during the soak"),
        "{detail}"
    );
}

/// A running `up --supervise`, killed when dropped (also when a test fails).
struct Supervisor(std::process::Child);

impl Drop for Supervisor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn supervise(site: &Site, extra: &[&str]) -> Supervisor {
    Supervisor(
        std::process::Command::new(crate::common::bin())
            .args(["up", "--supervise", "--backoff-ms", "50", "--root"])
            .arg(site.root())
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn restarts(site: &Site) -> Vec<String> {
    site.log_lines()
        .iter()
        .filter(|l| l["event"] == "restarted")
        .map(|l| l["detail"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn supervise_restarts_a_live_release_that_stops_pinging_its_watchdog() {
    let site = Site::new();
    // Pings every 150 ms, none from 1.5 s after its start: hung, though it still runs.
    site.release(
        "v1",
        "--readyz-status 503 --notify --watchdog-stops-after-ms 1500",
    );
    let notify = policy(&site, 5000, 0, "{kind: notify, watchdog_ms: 300}");
    let out = site.deploy(free_port(), "v1", &["--policy", &notify]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let hung = site.live_pid().unwrap();
    let supervisor = supervise(&site, &[]);
    assert!(
        wait_for(15, || !restarts(&site).is_empty()),
        "{:?}",
        site.events()
    );
    let detail = &restarts(&site)[0];
    assert!(
        detail.starts_with(&format!("pid {hung} hung (no WATCHDOG=1 for ")),
        "{detail}"
    );
    assert!(!alive(hung), "the hung release was stopped");
    assert!(site.live_pid().is_some_and(|p| p != hung && alive(p)));
    drop(supervisor);
}

#[test]
fn supervise_counts_an_exit_after_stopping_1_as_orderly_not_as_a_crash() {
    let site = Site::new();
    // Says STOPPING=1, then exits 0, 1.5 s after each start.
    site.release(
        "v1",
        "--notify --notify-stopping --exit-after-ms 1500 --exit-code 0",
    );
    let notify = policy(&site, 5000, 0, "{kind: notify}");
    let out = site.deploy(free_port(), "v1", &["--policy", &notify]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Two crashes in a row would be given up on; three orderly stops are not.
    let supervisor = supervise(&site, &["--max-restarts", "2"]);
    assert!(
        wait_for(20, || restarts(&site).len() >= 3),
        "{:?}",
        site.events()
    );
    drop(supervisor);
    assert_eq!(count_events(&site, "restart_given_up", "v1"), 0);
    for detail in restarts(&site).iter().take(3) {
        assert!(
            detail.contains("stopped in order (it sent STOPPING=1)"),
            "{detail}"
        );
    }

    // The same exits without STOPPING=1 are crashes: given up on.
    let crashing = Site::new();
    crashing.release("v1", "--notify --exit-after-ms 1500 --exit-code 0");
    let notify = policy(&crashing, 5000, 0, "{kind: notify}");
    let out = crashing.deploy(free_port(), "v1", &["--policy", &notify]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let supervisor = supervise(&crashing, &["--max-restarts", "2"]);
    assert!(
        wait_for(20, || count_events(&crashing, "restart_given_up", "v1")
            == 1),
        "{:?}",
        crashing.events()
    );
    drop(supervisor);
}

#[test]
fn extend_timeout_usec_moves_the_deadline_only_as_far_as_the_policy_allows() {
    // Ready 1.5 s after its start, past an 800 ms deadline; it asks for 3 s more at boot.
    let allowed = Site::new();
    allowed.release(
        "v1",
        "--notify --ready-after-ms 1500 --extend-timeout-ms 3000",
    );
    let notify = policy(&allowed, 800, 0, "{kind: notify, extend_max_ms: 5000}");
    let out = allowed.deploy(free_port(), "v1", &["--policy", &notify]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // A policy that allows 500 ms more: the gate ends at 1300 ms, before READY=1.
    let bounded = Site::new();
    bounded.release(
        "v1",
        "--notify --ready-after-ms 1500 --extend-timeout-ms 3000",
    );
    let notify = policy(&bounded, 800, 0, "{kind: notify, extend_max_ms: 500}");
    let out = bounded.deploy(free_port(), "v1", &["--policy", &notify]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let detail = bounded.last_detail();
    assert!(detail.starts_with("not ready after 1300 ms"), "{detail}");
    assert!(
        detail.contains("no READY=1 yet (STATUS=starting)"),
        "{detail}"
    );
}
