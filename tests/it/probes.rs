//! Probe kinds from the policy (HTTP path, Host and status range; TCP connect; a command in the
//! release folder; a success threshold), each with a ready and a never-ready release, through
//! the real binary; and bad probe definitions refused by the contract.

use crate::common::http::Conn;
use crate::common::*;

use std::time::Duration;

/// `probe.yaml` with edge_svc's lesson numbers and this probe (YAML flow mapping).
fn policy(site: &Site, probe: &str) -> String {
    write(
        site.root(),
        "probe.yaml",
        &format!(
            "edge_svc:\n  progress_deadline_ms: 800\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  stop_grace_ms: 1000\n  probe: {probe}\n"
        ),
    )
    .display()
    .to_string()
}

fn deploy_with(site: &Site, version: &str, probe: &str) -> std::process::Output {
    let policy = policy(site, probe);
    site.deploy(free_port(), version, &["--policy", &policy])
}

fn assert_promoted(site: &Site, out: &std::process::Output, version: &str) {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    assert_eq!(site.pointer().unwrap()["version"], version);
}

/// Rolled back with the stall's reason, and the last probes the detail shows.
fn assert_never_ready(site: &Site, out: &std::process::Output, last_probe: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", stderr(out));
    assert!(site.pointer().is_none(), "nothing was promoted");
    let detail = site.last_detail();
    assert!(detail.starts_with("not ready after 800 ms"), "{detail}");
    assert!(detail.contains(last_probe), "{detail}");
}

#[test]
fn an_http_probe_uses_its_path_host_and_status_range() {
    let site = Site::new();
    // Readiness only on /healthz for Host edge.test, answered 204 (outside today's `= 200`).
    site.release(
        "v1",
        "--ready-path /healthz --ready-host edge.test --readyz-status 204",
    );
    let out = deploy_with(
        &site,
        "v1",
        "{path: /healthz, host: edge.test, status_min: 200, status_max: 299}",
    );
    assert_promoted(&site, &out, "v1");
    // `status` asks the live release the way its gate did (`/readyz` answers it 404).
    let status = rollgate()
        .args(["status", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
    assert_eq!(status["live"]["answering"], true, "{status}");
    assert_eq!(status["live"]["readyz"], "HTTP 204", "{status}");

    // The same release probed for another host gets 404 and never becomes ready.
    let other = Site::new();
    other.release(
        "v1",
        "--ready-path /healthz --ready-host edge.test --readyz-status 204",
    );
    let out = deploy_with(
        &other,
        "v1",
        "{path: /healthz, host: other.test, status_min: 200, status_max: 299}",
    );
    assert_never_ready(&other, &out, "HTTP 404");

    // And with the default probe a 204 is not ready either.
    let default = Site::new();
    default.release("v1", "--readyz-status 204");
    let out = deploy_with(&default, "v1", "{}");
    assert_never_ready(&default, &out, "HTTP 204");
}

#[test]
fn a_tcp_probe_is_ready_once_the_port_accepts() {
    let site = Site::new();
    // Never answers /readyz with 200, but listens: ready for a TCP probe.
    site.release("v1", "--readyz-status 503");
    let out = deploy_with(&site, "v1", "{kind: tcp}");
    assert_promoted(&site, &out, "v1");

    let other = Site::new();
    other.script("v1", "exec sleep 30\n");
    let out = deploy_with(&other, "v1", "{kind: tcp, timeout_ms: 200}");
    assert_never_ready(&other, &out, "connection refused");
}

/// An exec probe's program is the release's: it runs in the release folder with the port, as
/// the release's own processes run — its user, its filesystem rules, a clean environment —
/// never as root (it ran as root, and could write anywhere: a uid 0 way out of a release).
#[test]
fn an_exec_probe_runs_in_the_release_folder_with_the_port_as_the_release_runs() {
    let site = Site::new();
    site.release("v1", "");
    // Root's alone (the test runs as root in CI): the probe tries to leave its mark there.
    let victim = tempfile::tempdir().unwrap();
    let mark = victim.path().join("written-by-the-probe");
    write(
        site.root(),
        "releases/v1/check.sh",
        &format!(
            "#!/bin/sh\necho \"$PORT $(pwd) $(id -u) ${{CALLERS_OWN:-none}}\" > \"$STATE_DIRECTORY/probe-saw\"\n\
             echo uid0 > '{}' 2>/dev/null\nexit 0\n",
            mark.display()
        ),
    );
    make_executable(&site.root().join("releases/v1/check.sh"));
    let port = free_port();
    let policy = policy(&site, "{kind: exec, command: [./check.sh]}");
    let out = rollgate()
        .args(["deploy", "edge-svc", &port.to_string(), "v1", "--root"])
        .arg(site.root())
        .args(["--policy", &policy])
        .env("CALLERS_OWN", "from-the-shell")
        .output()
        .unwrap();
    assert_promoted(&site, &out, "v1");
    let saw = std::fs::read_to_string(site.root().join("data/probe-saw")).unwrap();
    let folder = site.root().join("releases/v1").canonicalize().unwrap();
    let words: Vec<&str> = saw.split_whitespace().collect();
    assert_eq!(words[..2], [port.to_string(), folder.display().to_string()]);
    assert_eq!(
        words[3], "none",
        "the caller's environment reached the probe"
    );
    if nix::unistd::geteuid().is_root() {
        assert_ne!(words[2], "0", "the probe ran as root");
        assert!(
            !mark.exists(),
            "the release's probe wrote as root outside its release"
        );
    }

    let other = Site::new();
    other.release("v1", "");
    write(other.root(), "releases/v1/check.sh", "#!/bin/sh\nexit 3\n");
    make_executable(&other.root().join("releases/v1/check.sh"));
    let out = deploy_with(&other, "v1", "{kind: exec, command: [./check.sh]}");
    assert_never_ready(&other, &out, "exit status 3");
}

#[test]
fn an_exec_probe_that_hangs_is_killed_at_its_timeout_with_what_it_started() {
    let site = Site::new();
    site.release("v1", "");
    // The marker argument finds the probe's own child among every process on the machine.
    let marker = format!("31.{}", std::process::id());
    write(
        site.root(),
        "releases/v1/check.sh",
        &format!("#!/bin/sh\nsleep {marker}\n"),
    );
    make_executable(&site.root().join("releases/v1/check.sh"));
    let out = deploy_with(
        &site,
        "v1",
        "{kind: exec, command: [./check.sh], timeout_ms: 200}",
    );
    assert_never_ready(&site, &out, "no answer within 200 ms");
    assert!(
        wait_for(5, || !a_process_mentions(&marker)),
        "a probe's sleep {marker} outlived it"
    );
}

#[test]
fn a_success_threshold_waits_for_passes_in_a_row() {
    let site = Site::new();
    site.release("v1", "");
    let out = deploy_with(&site, "v1", "{success_threshold: 6}");
    assert_promoted(&site, &out, "v1");
    // Six passing probes 50 ms apart: at least 250 ms, where one probe would take a few.
    let promoted = site.log_lines().last().cloned().unwrap();
    assert!(
        promoted["elapsed_ms"].as_u64().unwrap() >= 250,
        "{promoted}"
    );
    // The first probes may find the port still closed; six or more were sent in all.
    let detail = promoted["detail"].as_str().unwrap();
    let probes: u32 = detail
        .split_once(" ms (")
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .unwrap();
    assert!(probes >= 6, "{detail}");
}

#[test]
fn a_rollout_probes_every_replica_with_the_policys_probe() {
    let site = Site::new();
    site.release("v1", "--readyz-status 503");
    let policy = policy(&site, "{kind: tcp}");
    let first = port_block(10);
    let ports = format!("{first}-{}", first + 9);
    let out = site.rollout(
        "v1",
        &["--replicas", "3", "--policy", &policy, "--ports", &ports],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("rollout.json")).unwrap())
            .unwrap();
    assert_eq!(saved["phase"], "completed");
    assert_eq!(saved["settings"]["probe"]["target"]["kind"], "tcp");
}

#[test]
fn a_bad_probe_definition_is_refused_by_the_contract_naming_the_field() {
    for (probe, says) in [
        (
            "{kind: exec}",
            "probe.command is required for an exec probe",
        ),
        (
            "{timeout_ms: 5}",
            "probe.timeout_ms must be an integer from 10 to 60000",
        ),
        (
            "{kind: tcp, path: /x}",
            "probe.path is not a field of a tcp probe",
        ),
        (
            "{status_min: 300, status_max: 200}",
            "probe.status_min (300) must not be above probe.status_max (200)",
        ),
        ("{path: healthz}", "probe.path must be a path from /"),
        (
            "{kind: exec, command: []}",
            "probe.command must be a non-empty list",
        ),
        ("{pth: /x}", "extra field `pth`"),
    ] {
        let site = Site::new();
        site.release("v1", "");
        let out = deploy_with(&site, "v1", probe);
        assert_eq!(out.status.code(), Some(2), "{probe}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{probe}: {}", stderr(&out));
        assert!(site.log_lines().is_empty(), "{probe}: nothing started");
    }
}

#[test]
fn up_waits_for_the_probe_the_release_was_deployed_with() {
    let site = Site::new();
    // Accepts connections at once, ready on /healthz only after 1.5 s (/readyz is not its path).
    site.release("v1", "--ready-path /healthz --ready-after-ms 1500");
    let policy = policy(&site, "{path: /healthz}");
    let port = free_port();
    let out = site.deploy(port, "v1", &["--policy", &policy, "10000"]);
    assert_promoted(&site, &out, "v1");
    let old = site.live_pid().unwrap();
    site.reboot();
    assert!(wait_for(5, || !alive(old) || is_zombie(old)));
    let out = rollgate()
        .args(["up", "--ready-ms", "20000", "--root"])
        .arg(site.root())
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("ready (HTTP 200)"),
        "{}",
        stdout(&out)
    );
    // It returned once the release was ready, not once its port accepted a connection.
    let mut conn = Conn::open(port).unwrap();
    assert_eq!(conn.get("/healthz", "").unwrap().status, 200);
}

/// Issue 67, 4: a probe answered 400 (or 421) reached an app that refused the Host it was
/// asked by (Django's ALLOWED_HOSTS): the reason says so and names `probe.host`.
#[test]
fn a_probe_answered_400_says_the_app_may_check_the_host_and_names_probe_host() {
    let site = Site::new();
    site.release("v1", "--readyz-status 400");
    let out = rollgate()
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v1",
            "600",
            "--root",
        ])
        .arg(site.root())
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let detail = site.last_detail();
    assert!(detail.contains("last probes: HTTP 400"), "{detail}");
    assert!(
        detail.contains("the app may check the Host header") && detail.contains("probe.host"),
        "{detail}"
    );
}
