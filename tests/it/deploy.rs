//! `rollgate deploy` with real processes on loopback: the gate's outcomes, refusals, signals,
//! crashes, policies and escalation.

use crate::common::*;

use std::time::{Duration, Instant};

fn first_release(site: &Site) -> u16 {
    site.release("v1", "--ready-after-ms 100");
    let port = free_port();
    let out = site.deploy(port, "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    port
}

#[test]
fn first_deploy_promotes_and_the_release_serves() {
    let site = Site::new();
    let port = first_release(&site);
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["version"], "v1");
    assert_eq!(pointer["port"], port);
    assert!(alive(site.live_pid().unwrap()));
    assert_eq!(version_on(port).as_deref(), Some("v1"));
    assert_eq!(
        site.events(),
        vec![
            ("candidate_started".into(), "v1".into()),
            ("promoted".into(), "v1".into())
        ]
    );
    let promoted = &site.log_lines()[1];
    assert_eq!(promoted["service"], "edge-svc");
    assert!(promoted["elapsed_ms"].as_u64().unwrap() >= 100);
    assert!(!site.root().join("candidate").exists());
    // The candidate's output went beside it.
    assert!(
        std::fs::read_to_string(site.root().join("output/v1/edge-svc.output"))
            .unwrap()
            .contains("listening")
    );
}

#[test]
fn second_deploy_switches_and_stops_the_old_release() {
    let site = Site::new();
    first_release(&site);
    let old = site.live_pid().unwrap();
    site.release("v2", "--ready-after-ms 300");
    let port = free_port();
    let out = site.deploy(port, "v2", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v2");
    assert!(wait_for(5, || !alive(old)), "old release still running");
    assert_eq!(version_on(port).as_deref(), Some("v2"));
    assert!(
        site.last_detail()
            .contains("old release v1 stopped (SIGTERM)"),
        "{}",
        site.last_detail()
    );
    // 503 until ready: more than one probe was needed.
    let probes: u32 = site
        .last_detail()
        .split(" probe")
        .next()
        .unwrap()
        .rsplit('(')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(probes >= 2, "{}", site.last_detail());
}

fn assert_rolled_back(site: &Site, out: &std::process::Output, live_version: &str, reason: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", stderr(out));
    assert_eq!(site.pointer().unwrap()["version"], live_version);
    let last = site.log_lines().last().unwrap().clone();
    assert_eq!(last["event"], "rolled_back");
    let detail = last["detail"].as_str().unwrap();
    assert_eq!(detail.split("; ").next().unwrap(), reason, "{detail}");
    assert!(
        detail.contains(&format!("old release {live_version} still answering")),
        "{detail}"
    );
    // The terminal says why, as the log has it (issue 58: it used to say "see deploy.log").
    assert!(
        stderr(out).contains(&format!("rollgate: rolled back: {detail}\n")),
        "{}",
        stderr(out)
    );
    // Only the live release is left running.
    assert!(
        wait_for(5, || site.processes() == vec![site.live_pid().unwrap()]),
        "{:?}",
        site.processes()
    );
    assert!(!site.root().join("candidate").exists());
}

#[test]
fn never_ready_is_rolled_back_at_the_deadline() {
    let site = Site::new();
    first_release(&site);
    site.release("v3", "--ready-after-ms 60000");
    let started = Instant::now();
    // Long enough for the candidate to be listening (and answering 503) on a
    // loaded runner before the deadline; see the hanging /readyz test.
    let out = site.deploy(free_port(), "v3", &["3000"]);
    assert_rolled_back(&site, &out, "v1", "not ready after 3000 ms");
    assert!(started.elapsed() >= Duration::from_millis(3000));
    assert!(
        site.last_detail().contains("last probes: HTTP 503"),
        "{}",
        site.last_detail()
    );
}

#[test]
fn crash_at_boot_is_seen_at_once() {
    let site = Site::new();
    first_release(&site);
    site.release("v4", "--exit-after-ms 0 --exit-code 78");
    let out = site.deploy(free_port(), "v4", &["20000"]);
    assert_rolled_back(
        &site,
        &out,
        "v1",
        "candidate exited with exit status: 78 before ready",
    );
    // Seen when it happened, not at a 20 s deadline.
    let elapsed = site.log_lines().last().unwrap()["elapsed_ms"]
        .as_u64()
        .unwrap();
    assert!(elapsed < 5000, "{elapsed}");
    assert!(
        site.last_detail()
            .contains("exiting at boot with status 78"),
        "candidate output in detail"
    );
}

/// Issue 58: gunicorn says why early (a traceback's last line) and gives up three lines later;
/// the log and the terminal used to quote only the giving up.
#[test]
fn a_crash_quotes_the_cause_as_well_as_the_last_lines() {
    let site = Site::new();
    first_release(&site);
    site.script(
        "v5",
        "echo '[INFO] Booting worker with pid: 8'\n\
         echo '[ERROR] Exception in worker process'\n\
         echo 'Traceback (most recent call last):'\n\
         echo '  File \"/srv/app/app.py\", line 1, in <module>'\n\
         echo '    import flaskx'\n\
         echo \"ModuleNotFoundError: No module named 'flaskx'\"\n\
         for n in 1 2 3 4 5 6; do echo \"[INFO] shutting down step $n\"; done\n\
         echo '[ERROR] Reason: Worker failed to boot.'\n\
         exit 3\n",
    );
    let out = site.deploy(free_port(), "v5", &["20000"]);
    assert_rolled_back(
        &site,
        &out,
        "v1",
        "candidate exited with exit status: 3 before ready",
    );
    let detail = site.last_detail();
    assert!(
        detail.contains(
            "candidate output: ModuleNotFoundError: No module named 'flaskx' [...] [INFO] shutting down step 5 | [INFO] shutting down step 6 | [ERROR] Reason: Worker failed to boot."
        ),
        "{detail}"
    );
    assert!(
        stderr(&out).contains("No module named 'flaskx'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_candidate_killed_by_a_signal_is_named() {
    let site = Site::new();
    first_release(&site);
    site.script("v5", "kill -9 $$\n");
    let out = site.deploy(free_port(), "v5", &["20000"]);
    assert_rolled_back(
        &site,
        &out,
        "v1",
        "candidate exited with signal: 9 (SIGKILL) before ready",
    );
}

#[test]
fn a_hanging_readyz_never_stretches_the_deadline() {
    let site = Site::new();
    first_release(&site);
    site.release("v6", "--hang-readyz");
    // The deadline leaves the candidate (the debug binary, slow to exec on a
    // loaded 2-core runner: 1.2 s was not always enough) time to listen, so
    // the probes meet the hanging /readyz rather than a closed port.
    let out = site.deploy(free_port(), "v6", &["4000"]);
    assert_rolled_back(&site, &out, "v1", "not ready after 4000 ms");
    let elapsed = site.log_lines().last().unwrap()["elapsed_ms"]
        .as_u64()
        .unwrap();
    assert!((4000..7000).contains(&elapsed), "{elapsed}");
    assert!(
        site.last_detail().contains("no answer within"),
        "{}",
        site.last_detail()
    );
}

#[test]
fn an_old_release_that_ignores_sigterm_is_killed_after_the_grace() {
    let site = Site::new();
    site.release("v1", "--ignore-sigterm");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let old = site.live_pid().unwrap();
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &["--grace-ms", "300"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(wait_for(5, || !alive(old)));
    assert!(
        site.last_detail().contains("old release v1 killed"),
        "{}",
        site.last_detail()
    );
}

#[test]
fn refusals_start_nothing_and_change_nothing() {
    let site = Site::new();
    let live_port = first_release(&site);
    let before_log = std::fs::read(site.root().join("deploy.log")).unwrap();
    let before_pointer = std::fs::read(site.root().join("current")).unwrap();
    site.release("v2", "");
    std::fs::create_dir_all(site.root().join("releases/v7")).unwrap();
    write(site.root(), "releases/v7/edge-svc", "#!/bin/sh\n");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_port = busy.local_addr().unwrap().port();
    let cases: Vec<(u16, &str, &str)> = vec![
        (free_port(), "../v1", "starts with a dot"),
        (free_port(), "a/b", "contains '/'"),
        (free_port(), "", "empty"),
        (free_port(), "v9", "release v9 of edge-svc not found"),
        (free_port(), "v7", "is not executable"),
        (busy_port, "v2", "is busy"),
        (live_port, "v2", "is the live release's"),
    ];
    for (port, version, expected) in cases {
        let out = site.deploy(port, version, &[]);
        assert_eq!(out.status.code(), Some(2), "{version}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(expected),
            "{version}: {}",
            stderr(&out)
        );
    }
    assert_eq!(
        std::fs::read(site.root().join("deploy.log")).unwrap(),
        before_log
    );
    assert_eq!(
        std::fs::read(site.root().join("current")).unwrap(),
        before_pointer
    );
    assert_eq!(site.processes(), vec![site.live_pid().unwrap()]);
}

#[test]
fn an_invalid_policy_is_refused_with_nickels_diagnostic() {
    let site = Site::new();
    site.release("v1", "");
    let policy = write(
        site.root(),
        "policy.ncl",
        "let { RolloutPolicy, .. } = import \"rollout-policy.ncl\" in\n{ edge_svc = { progress_deadline_ms = 900000, poll_ms = 100, max_unavailable_pct = 0, max_surge_pct = 100, on_stall = 'rollback } | RolloutPolicy }\n",
    );
    let out = site.deploy(free_port(), "v1", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("contract broken by the value of `progress_deadline_ms`"),
        "{err}"
    );
    assert!(
        err.contains("progress_deadline_ms must be an integer from 100 to 600000"),
        "{err}"
    );
    assert!(site.log_lines().is_empty());
    assert!(site.processes().is_empty());
}

#[test]
fn the_policy_sets_the_deadline() {
    let site = Site::new();
    first_release(&site);
    site.release("v3", "--ready-after-ms 60000");
    let policy = write(
        site.root(),
        "edge.yaml",
        "edge_svc:\n  progress_deadline_ms: 700\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n",
    );
    let out = site.deploy(free_port(), "v3", &["--policy", policy.to_str().unwrap()]);
    assert_rolled_back(&site, &out, "v1", "not ready after 700 ms");
    let started = &site.log_lines()[site.log_lines().len() - 2];
    assert!(started["detail"]
        .as_str()
        .unwrap()
        .contains("deadline 700 ms (policy); poll 50 ms"));
    // The example Nickel policy works too, through its entry name.
    site.release("v2", "");
    let example = repo().join("contracts/policy.ncl");
    let out = site.deploy(free_port(), "v2", &["--policy", example.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.deploy(
        free_port(),
        "v1",
        &[
            "--policy",
            example.to_str().unwrap(),
            "--policy-entry",
            "nope",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no policy entry `nope` (entries: edge_svc)"),
        "{}",
        stderr(&out)
    );
}

fn escalating_policy(site: &Site) -> String {
    write(
        site.root(),
        "escalate.yaml",
        "edge_svc:\n  progress_deadline_ms: 500\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: escalate\n  stop_grace_ms: 2000\n",
    )
    .to_str()
    .unwrap()
    .to_string()
}

#[test]
fn escalate_then_promote_by_hand() {
    let site = Site::new();
    first_release(&site);
    let old = site.live_pid().unwrap();
    site.release("v2", "--ready-after-ms 1500");
    let policy = escalating_policy(&site);
    let port = free_port();
    let out = site.deploy(port, "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(
        site.events().last().unwrap(),
        &("escalated".to_string(), "v2".to_string())
    );
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    assert_eq!(site.processes().len(), 2, "candidate left running");
    // Another deploy must wait for the person.
    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("escalated and waiting for a person"));

    let out = rollgate()
        .args(["promote", "edge-svc", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v2");
    assert!(wait_for(5, || !alive(old)));
    assert_eq!(version_on(port).as_deref(), Some("v2"));
    assert_eq!(
        site.events().last().unwrap(),
        &("promoted".to_string(), "v2".to_string())
    );
    let out = rollgate()
        .args(["promote", "edge-svc", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "nothing left to promote");
}

#[test]
fn escalate_then_abort_by_hand() {
    let site = Site::new();
    first_release(&site);
    site.release("v2", "--ready-after-ms 60000");
    let policy = escalating_policy(&site);
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let out = rollgate()
        .args(["abort", "edge-svc", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    assert_eq!(
        site.events().last().unwrap(),
        &("rolled_back".to_string(), "v2".to_string())
    );
    assert!(site
        .last_detail()
        .starts_with("aborted by hand after escalation; old release v1 still answering"));
    assert!(wait_for(5, || site.processes() == vec![site.live_pid().unwrap()]));
}

#[test]
fn two_concurrent_deploys_one_wins_one_is_refused() {
    let site = Site::new();
    first_release(&site);
    site.release("v2", "--ready-after-ms 1500");
    site.release("v3", "");
    let mut first = site.deploy_in_background("v2", "3000");
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains(&format!(
            "another deploy is running on this root (pid {}",
            first.id()
        )),
        "{}",
        stderr(&out)
    );
    assert_eq!(first.wait().unwrap().code(), Some(0));
    assert_eq!(site.pointer().unwrap()["version"], "v2");
}

#[test]
fn sigterm_to_rollgate_rolls_back_and_leaves_the_pointer() {
    let site = Site::new();
    first_release(&site);
    let pointer_before = std::fs::read(site.root().join("current")).unwrap();
    site.release("v2", "--ready-after-ms 60000");
    let mut deployer = site.deploy_in_background("v2", "30000");
    send_signal(deployer.id() as i32, 15);
    assert_eq!(deployer.wait().unwrap().code(), Some(1));
    assert_eq!(
        std::fs::read(site.root().join("current")).unwrap(),
        pointer_before
    );
    assert_eq!(
        site.events().last().unwrap(),
        &("rolled_back".to_string(), "v2".to_string())
    );
    assert!(
        site.last_detail()
            .starts_with("interrupted by SIGTERM; old release v1 still answering"),
        "{}",
        site.last_detail()
    );
    assert!(wait_for(5, || site.processes() == vec![site.live_pid().unwrap()]));
}

#[test]
fn after_kill_9_the_next_deploy_cleans_up_and_succeeds() {
    let site = Site::new();
    first_release(&site);
    site.release("v2", "--ready-after-ms 60000");
    site.release("v3", "");
    let mut deployer = site.deploy_in_background("v2", "30000");
    let in_flight = |site: &Site| {
        let out = rollgate()
            .args(["status", "--format", "json", "--root"])
            .arg(site.root())
            .output()
            .unwrap();
        let status: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        status["candidate"].clone()
    };
    // While its deployer gates it, the candidate is driven.
    assert_eq!(in_flight(&site)["orphaned"], false);
    send_signal(deployer.id() as i32, 9);
    deployer.wait().unwrap();
    // The orphaned candidate is still there, and the pointer is whole.
    assert_eq!(site.processes().len(), 2);
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    // `status` says nobody drives it any more, and who will finish it.
    let candidate = in_flight(&site);
    assert_eq!(
        (&candidate["orphaned"], &candidate["running"]),
        (&serde_json::json!(true), &serde_json::json!(true))
    );
    let out = rollgate()
        .args(["status", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("is gone: the next deploy, rollback or `rollgate up` finishes it"),
        "{}",
        stdout(&out)
    );

    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = site.events();
    assert_eq!(events[3], ("rolled_back".to_string(), "v2".to_string()));
    assert!(site.log_lines()[3]["detail"]
        .as_str()
        .unwrap()
        .starts_with("abandoned: deployer pid"));
    assert_eq!(
        events.last().unwrap(),
        &("promoted".to_string(), "v3".to_string())
    );
    assert!(
        wait_for(5, || site.processes() == vec![site.live_pid().unwrap()]),
        "{:?}",
        site.processes()
    );
}

#[test]
fn the_logs_summary_after_a_sequence_matches_what_happened() {
    let site = Site::new();
    first_release(&site);
    site.release("v2", "--ready-after-ms 200");
    site.release("v3", "--ready-after-ms 60000");
    site.release("v4", "--exit-after-ms 0 --exit-code 78");
    assert_eq!(site.deploy(free_port(), "v2", &[]).status.code(), Some(0));
    assert_eq!(
        site.deploy(free_port(), "v3", &["600"]).status.code(),
        Some(1)
    );
    assert_eq!(site.deploy(free_port(), "v4", &[]).status.code(), Some(1));
    let out = rollgate()
        .args(["log", "summary"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    assert_eq!(
        stdout(&out),
        "{\"releases\":4,\"promoted\":2,\"rolled_back\":2,\"reasons\":[{\"version\":\"v3\",\"reason\":\"not ready after 600 ms\"},{\"version\":\"v4\",\"reason\":\"candidate exited with exit status: 78 before ready\"}],\"live\":\"v2\"}\n"
    );
    let out = rollgate()
        .args(["status", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["live"]["version"], "v2");
    assert_eq!(status["live"]["answering"], true);
    assert_eq!(status["recent"][0]["version"], "v4");
    assert_eq!(status["recent"].as_array().unwrap().len(), 4);
}

/// Start time of a process, as `/proc/PID/stat` field 22 gives it.
#[test]
fn a_switch_made_by_a_deployer_that_then_died_is_recorded_and_finished() {
    // The state a deployer killed right after its rename leaves: `current` names the
    // candidate, the candidate record is still there, the old release still runs.
    let site = Site::new();
    first_release(&site);
    let old_pointer = site.pointer().unwrap();
    let old_pid = site.live_pid().unwrap();
    let port = free_port();
    let mut candidate = std::process::Command::new(crate::common::bin())
        .arg("sample-service")
        .current_dir(site.root())
        .env("PORT", port.to_string())
        .env("ROLLGATE_VERSION", "v2")
        .spawn()
        .unwrap();
    let pid = candidate.id() as i32;
    let pointer = serde_json::json!({"service": "edge-svc", "version": "v2", "port": port, "pid": pid,
        "start_time": start_time_of(pid), "promoted_at": 1.0});
    write(site.root(), "current", &pointer.to_string());
    let mut fields = process_fields(pid);
    fields["started_at"] = 1.0.into();
    fields["previous"] = old_pointer;
    left_deploy(&site, port, "t", fields);

    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = site.log_lines();
    assert_eq!(lines[2]["event"], "promoted");
    assert_eq!(lines[2]["version"], "v2");
    assert!(lines[2]["detail"]
        .as_str()
        .unwrap()
        .starts_with("switched before deployer pid 999999 died"));
    assert!(wait_for(5, || !alive(old_pid)), "old release stopped");
    assert_eq!(site.pointer().unwrap()["version"], "v3");
    assert!(wait_for(5, || !alive(pid)), "v2 replaced by v3 and stopped");
    candidate.wait().unwrap();
}

#[test]
fn a_candidate_whose_pid_was_never_recorded_is_found_by_its_token() {
    let site = Site::new();
    first_release(&site);
    let port = free_port();
    let token = "token-from-a-dead-run";
    // Where the host gives cgroup trees, the candidate is found by its tree (labelled with the
    // run's token), even with no token left in its environment; elsewhere by its environment.
    let base = cgroup_base();
    let mut orphan = std::process::Command::new(crate::common::bin());
    orphan
        .arg("sample-service")
        .current_dir(site.root())
        .env("PORT", port.to_string());
    if base.is_empty() {
        orphan.env("ROLLGATE_DEPLOY_TOKEN", token);
    }
    let mut orphan = orphan.spawn().unwrap();
    if !base.is_empty() {
        let pid = orphan.id() as i32;
        let tree =
            std::path::Path::new(&base).join(format!("{token}~{pid}-{}", start_time_of(pid)));
        std::fs::create_dir(&tree).unwrap();
        std::fs::write(tree.join("cgroup.procs"), pid.to_string()).unwrap();
    }
    left_deploy(
        &site,
        port,
        token,
        serde_json::json!({"stage": "spawning", "started_at": 1.0}),
    );
    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let abandoned = &site.log_lines()[2];
    assert_eq!(abandoned["event"], "rolled_back");
    let detail = abandoned["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("pid {} stopped (SIGTERM)", orphan.id())),
        "{detail}"
    );
    assert!(wait_for(5, || !alive(orphan.id() as i32)));
    orphan.wait().unwrap();
    // And its tree with it.
    if !base.is_empty() {
        let left = std::fs::read_dir(&base)
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(token));
        assert!(!left, "the orphan's tree is left behind");
    }
}

#[test]
fn a_terminal_sees_a_live_progress_line_and_a_pipe_does_not() {
    let site = Site::new();
    first_release(&site);
    site.release("v2", "--ready-after-ms 400");
    let bin = crate::common::bin();
    let command = format!(
        "'{}' deploy edge-svc {} v2 --root '{}'",
        bin.display(),
        free_port(),
        site.root().display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(screen.contains("v2: 0."), "{screen}");
    assert!(screen.contains(" s / 1.5 s, "), "{screen}");
    assert!(screen.contains("probes, last: HTTP 503"), "{screen}");
    assert!(screen.contains("rollgate: promoted"), "{screen}");
    // Through a pipe (the other deploys in these tests), only the outcome line.
    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(stderr(&out), "rollgate: promoted\n");
}

#[test]
fn status_as_a_table() {
    let site = Site::new();
    first_release(&site);
    let out = rollgate()
        .args(["status", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let table = stdout(&out);
    assert!(table.contains("edge-svc v1"), "{table}");
    assert!(table.contains("yes (readyz: HTTP 200)"), "{table}");
    assert!(table.contains("Last outcomes"), "{table}");
    assert!(table.contains("promoted"), "{table}");
    let empty = tempfile::tempdir().unwrap();
    let out = rollgate()
        .args(["status", "--root"])
        .arg(empty.path())
        .output()
        .unwrap();
    assert!(stdout(&out).contains("(nothing promoted yet)"));
}

/// The policy is evaluated in a child process that exits after answering; a deploy, which runs
/// on for the whole deadline, must have waited for it rather than leave a zombie behind.
#[test]
fn a_running_deploy_keeps_no_finished_policy_evaluator() {
    let site = Site::new();
    first_release(&site);
    site.release("slow", "--ready-after-ms 60000");
    let policy = write(
        site.root(),
        "policy.ncl",
        "let { RolloutPolicy, .. } = import \"rollout-policy.ncl\" in\n{ edge_svc = { progress_deadline_ms = 4000, poll_ms = 100, max_unavailable_pct = 0, max_surge_pct = 100, on_stall = 'rollback } | RolloutPolicy }\n",
    );
    let mut deploy = std::process::Command::new(crate::common::bin())
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "slow",
            "--root",
        ])
        .arg(site.root())
        .arg("--policy")
        .arg(&policy)
        .env("NO_COLOR", "1")
        .spawn()
        .unwrap();
    assert!(
        wait_for(10, || site
            .events()
            .iter()
            .any(|(e, v)| e == "candidate_started" && v == "slow")),
        "{:?}",
        site.events()
    );
    let children = children_of(deploy.id() as i32);
    assert!(!children.is_empty(), "the candidate is the deploy's child");
    for child in &children {
        assert!(
            !is_zombie(*child),
            "child {child} of the deploy is a zombie"
        );
    }
    assert_eq!(deploy.wait().unwrap().code(), Some(1), "rolled back");
}

/// A deploy is the engine's one-replica rollout: the state file it keeps in flight is the
/// rollout's (`rollout status` reads it), its `candidate` record is that state's view, and the
/// controls of a rollout send a person to promote or abort.
#[test]
fn a_deploy_in_flight_is_a_one_replica_rollout_in_the_same_state_file() {
    let site = Site::new();
    first_release(&site);
    site.release("v2", "--ready-after-ms 1500");
    let policy = escalating_policy(&site);
    let port = free_port();
    let out = site.deploy(port, "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));

    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("rollout.json")).unwrap())
            .unwrap();
    assert_eq!(state["phase"], "paused");
    assert_eq!(state["settings"]["replicas"], 1);
    assert_eq!(state["settings"]["ports"], serde_json::json!([port, port]));
    assert_eq!(state["slots"][0]["class"], "required");
    assert_eq!(state["slots"][0]["held"], true);
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("candidate")).unwrap())
            .unwrap();
    assert_eq!(record["stage"], "escalated");
    assert_eq!(record["token"], state["id"]);
    assert_eq!(record["pid"], state["slots"][0]["candidate"]["pid"]);

    let status = rollgate()
        .args([
            "rollout", "status", "edge-svc", "--format", "json", "--root",
        ])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["state"], "paused");
    assert_eq!(status["version"], "v2");

    // `rollgate status` shows it as the deploy in flight it is, not as a rollout.
    let table = rollgate()
        .args(["status", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let table = stdout(&table);
    assert!(table.contains("in flight"), "{table}");
    assert!(table.contains("Escalated"), "{table}");
    assert!(!table.contains("last rollout"), "{table}");

    let resume = rollgate()
        .args(["rollout", "resume", "edge-svc", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(resume.status.code(), Some(2));
    assert!(
        stderr(&resume).contains("is a single deploy"),
        "{}",
        stderr(&resume)
    );

    let out = rollgate()
        .args(["promote", "edge-svc", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Once its outcome is on record, `current` alone says what is live, as after any deploy.
    assert!(!site.root().join("rollout.json").exists());
    assert!(!site.root().join("candidate").exists());
    assert!(!site.root().join("replicas.json").exists());
    assert_eq!(site.pointer().unwrap()["version"], "v2");
}

/// Deploying the live version again (a restart) and killing the deployer in its gate: the next
/// deploy must tell the killed attempt's candidate from the live release, which runs the same
/// version, and undo the attempt rather than take the live release for a finished switch.
#[test]
fn a_redeploy_of_the_live_version_killed_in_its_gate_is_undone_not_finished() {
    let site = Site::new();
    first_release(&site);
    let live = site.live_pid().unwrap();
    // The same version, now slow to become ready: its candidate is still gated when killed.
    site.release("v1", "--ready-after-ms 60000");
    let mut deployer = site.deploy_in_background("v1", "30000");
    send_signal(deployer.id() as i32, 9);
    deployer.wait().unwrap();
    let candidate = site.log_lines()[2]["pid"].as_i64().unwrap() as i32;
    assert_ne!(candidate, live);
    assert!(alive(candidate));

    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = site.log_lines();
    assert_eq!(lines[3]["event"], "rolled_back", "{lines:?}");
    assert_eq!(lines[3]["version"], "v1");
    assert!(lines[3]["detail"]
        .as_str()
        .unwrap()
        .starts_with("abandoned: deployer pid"));
    assert!(wait_for(5, || !alive(candidate)), "the attempt's candidate");
    let promoted = lines.last().unwrap();
    assert_eq!(promoted["version"], "v2");
    assert!(
        promoted["detail"]
            .as_str()
            .unwrap()
            .contains("old release v1 stopped"),
        "{promoted}"
    );
    assert!(wait_for(5, || !alive(live)), "the release that was live");
    assert!(
        wait_for(5, || site.processes() == vec![site.live_pid().unwrap()]),
        "{:?}",
        site.processes()
    );
}

/// On a terminal a deploy shows its gate's line, as it always has: not the progress line of
/// the rollout engine it runs on.
#[test]
fn a_deploy_on_a_terminal_shows_no_rollout_progress() {
    let site = Site::new();
    first_release(&site);
    site.release("v2", "--ready-after-ms 300");
    let command = format!(
        "'{}' deploy edge-svc {} v2 --root '{}' --watch-ms 300",
        crate::common::bin().display(),
        free_port(),
        site.root().display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(screen.contains("rollgate: promoted"), "{screen}");
    for rollout_word in ["wave", "surge", "unavailable", "upgrading"] {
        assert!(!screen.contains(rollout_word), "{rollout_word} in {screen}");
    }
}

/// Issue 59 (a first step): stopping a release ended its process group only, so a worker that
/// called `setsid` and double-forked outlived the release it belonged to, port and token and
/// all. Each release now runs in a cgroup of its own, and retiring it ends the whole tree.
#[test]
fn a_setsid_daemon_of_a_retired_release_dies_with_it() {
    let site = Site::new();
    let marker = format!("59.{}", std::process::id());
    let bin = crate::common::bin();
    site.script(
        "v1",
        &format!(
            "setsid sh -c 'sleep {marker} & exit 0' </dev/null >/dev/null 2>&1\nexec '{}' sample-service\n",
            bin.display()
        ),
    );
    site.release("v2", "");
    let port = free_port();
    assert_eq!(site.deploy(port, "v1", &[]).status.code(), Some(0));
    assert!(
        wait_for(5, || a_process_mentions(&marker)),
        "the daemon started"
    );
    // It left the release's session and process group: the old way could not reach it.
    let out = site.deploy(free_port(), "v2", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        wait_for(5, || !a_process_mentions(&marker)),
        "the daemon outlived its retired release"
    );
    // Its tree is gone too; v2's is there.
    let v2 = site.live_pid().unwrap();
    let tree = tree_of(v2).expect("v2 has a tree");
    assert!(
        tree.file_name().unwrap().to_string_lossy().contains('~'),
        "named after its run: {}",
        tree.display()
    );
}

/// The cgroup tree rollgate made for release process `pid` (`BASE/TOKEN~PID-STARTTIME`).
pub(crate) fn tree_of(pid: i32) -> Option<std::path::PathBuf> {
    let identity = format!("~{pid}-{}", start_time_of(pid));
    std::fs::read_dir(cgroup_base())
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(&identity))
        .map(|e| e.path())
}

/// The v2 hierarchy rollgate keeps release trees in (`/sys/fs/cgroup/unified` on this hybrid
/// machine, `/sys/fs/cgroup` on a pure v2 host).
pub(crate) fn cgroup_base() -> String {
    ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"]
        .into_iter()
        .find(|m| std::path::Path::new(m).join("rollgate").is_dir())
        .map(|m| format!("{m}/rollgate"))
        .unwrap_or_default()
}

/// Issue 59, no privileges: every release starts with no new privileges, no capability (even
/// as root) and no supplementary group, so it cannot bind a port below 1024 or open a raw
/// socket; `isolation.enabled = false` gives it rollgate's own privileges back, and says so.
#[test]
fn a_release_runs_without_privileges_unless_the_policy_says_isolation_enabled_false() {
    let site = Site::new();
    let bin = crate::common::bin();
    // What it may do, written where the test reads it, before it serves.
    let probe = format!(
        "grep -E '^(NoNewPrivs|CapEff|CapBnd):' /proc/self/status > \"$STATE_DIRECTORY/$ROLLGATE_VERSION-status\"\n\
         python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 81)); print(\"bound\")' > \"$STATE_DIRECTORY/$ROLLGATE_VERSION-bind\" 2>&1\n\
         python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print(\"raw\")' > \"$STATE_DIRECTORY/$ROLLGATE_VERSION-raw\" 2>&1\n\
         exec '{}' sample-service\n",
        bin.display()
    );
    site.script("v1", &probe);
    site.script("v2", &probe);
    let read = |version: &str, name: &str| {
        std::fs::read_to_string(site.root().join(format!("data/{version}-{name}")))
            .unwrap_or_default()
    };
    // Two Pythons start before it serves: a generous deadline, for a loaded machine.
    let out = site.deploy(free_port(), "v1", &["--deadline-ms", "30000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let status = read("v1", "status");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    assert!(status.contains("CapBnd:\t0000000000000000"), "{status}");
    assert!(
        read("v1", "bind").contains("PermissionError"),
        "{}",
        read("v1", "bind")
    );
    assert!(
        read("v1", "raw").contains("PermissionError"),
        "{}",
        read("v1", "raw")
    );
    // `release list` says how the running release is held, as the kernel says it.
    let runs_as = |version: &str| {
        crate::release_list::list(&site)
            .into_iter()
            .find(|l| l["version"] == version)
            .map(|l| l["runs_as"].clone())
    };
    let uid = std::fs::read_to_string(site.root().join("service-user.json"))
        .map(|t| serde_json::from_str::<serde_json::Value>(&t).unwrap()["uid"].clone())
        .unwrap();
    assert_eq!(
        runs_as("v1"),
        Some(serde_json::json!([format!("uid {uid}, confined")]))
    );

    // The way out: the same acts allowed, and the deploy says it is not confined.
    let unconfined = limited(&site, r#"{"enabled": false}"#);
    let out = site.deploy(free_port(), "v2", &["--policy", &unconfined]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("v2 runs NOT confined"),
        "{}",
        stderr(&out)
    );
    let status = read("v2", "status");
    assert!(status.contains("NoNewPrivs:\t0"), "{status}");
    assert!(!status.contains("CapEff:\t0000000000000000"), "{status}");
    assert_eq!(read("v2", "bind").trim(), "bound");
    assert_eq!(read("v2", "raw").trim(), "raw");
    let started = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "candidate_started")
        .unwrap();
    assert!(
        started["detail"]
            .as_str()
            .unwrap()
            .contains("NOT confined (isolation.enabled = false)"),
        "{started}"
    );
    assert_eq!(site.pointer().unwrap()["unconfined"], true);
    assert_eq!(
        runs_as("v2"),
        Some(serde_json::json!(["uid 0, NOT confined"]))
    );
}

/// Issue 59, a user per service: each service's releases run as a uid of its own from
/// 70000-79999 (the same for every release of it, another for another service), own only their
/// state folder (`STATE_DIRECTORY`, 0700) and temporary folder, cannot write their release
/// folder or read another service's secret, and get their own secret in their environment. A
/// policy can name an existing user instead, never root.
#[test]
fn each_service_runs_as_a_uid_of_its_own_which_owns_only_its_state() {
    let _nobody = crate::common::as_nobody_alone();
    let bin = crate::common::bin();
    let (a, b) = (Site::new(), Site::new());
    assert_eq!(set_secret(&a, "db", "hunter2").status.code(), Some(0));
    let acts = |other: &Site| {
        format!(
            "out=\"$STATE_DIRECTORY/$ROLLGATE_VERSION\"\n\
             id -u > \"$out-uid\"\n\
             id -G > \"$out-groups\"\n\
             touch \"$PWD/written\" 2> \"$out-write\" && echo written >> \"$out-write\"\n\
             cat '{}/secrets/db' > \"$out-secret\" 2>&1\n\
             printf %s \"$DB_PASSWORD\" > \"$out-own-secret\"\n\
             touch \"$TMPDIR/t\" && echo ok > \"$out-tmp\"\n\
             exec '{}' sample-service\n",
            other.root().display(),
            bin.display()
        )
    };
    for version in ["v1", "v2"] {
        a.script(version, &acts(&b));
        write(
            a.root(),
            &format!("releases/{version}/secrets"),
            "DB_PASSWORD=db\n",
        );
    }
    b.script("v1", &acts(&a));
    let read = |site: &Site, name: &str| {
        std::fs::read_to_string(site.root().join(format!("data/{name}")))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let dry = a.deploy(free_port(), "v1", &["--dry-run"]);
    assert!(
        stdout(&dry).contains("a uid of its own from 70000-79999, allocated at its first start"),
        "{}",
        stdout(&dry)
    );
    for (site, version) in [(&a, "v1"), (&a, "v2"), (&b, "v1")] {
        let out = site.deploy(free_port(), version, &["--deadline-ms", "30000"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let uid_of = |site: &Site, version: &str| -> u32 {
        read(site, &format!("{version}-uid")).parse().unwrap()
    };
    let (uid_a, uid_b) = (uid_of(&a, "v1"), uid_of(&b, "v1"));
    assert!((70_000..=79_999).contains(&uid_a), "{uid_a}");
    assert!((70_000..=79_999).contains(&uid_b), "{uid_b}");
    assert_ne!(uid_a, uid_b, "two services share a uid");
    assert_eq!(
        uid_of(&a, "v2"),
        uid_a,
        "the service's uid changed between releases"
    );
    // Its own group alone, no supplementary one.
    assert_eq!(read(&a, "v1-groups"), uid_a.to_string());
    // The record in the root says the same.
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.root().join("service-user.json")).unwrap())
            .unwrap();
    assert_eq!(record["uid"], uid_a);
    let dry = a.deploy(free_port(), "v1", &["--dry-run"]);
    assert!(
        stdout(&dry).contains(&format!(
            "uid {uid_a} (its own, recorded in service-user.json)"
        )),
        "{}",
        stdout(&dry)
    );
    let status = rollgate()
        .args(["status", "--root"])
        .arg(a.root())
        .output()
        .unwrap();
    assert!(
        stdout(&status).contains(&format!("yes (uid {uid_a}; no privileges; tree ")),
        "{}",
        stdout(&status)
    );
    // What it owns, and what it may not touch.
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        for folder in ["data", "tmp"] {
            let meta = std::fs::metadata(a.root().join(folder)).unwrap();
            assert_eq!(
                (meta.uid(), meta.permissions().mode() & 0o777),
                (uid_a, 0o700)
            );
        }
    }
    assert_eq!(read(&a, "v1-tmp"), "ok");
    assert!(
        read(&a, "v1-write").contains("Permission denied"),
        "{}",
        read(&a, "v1-write")
    );
    assert!(!a.root().join("releases/v1/written").exists());
    assert!(
        read(&b, "v1-secret").contains("Permission denied"),
        "{}",
        read(&b, "v1-secret")
    );
    assert_eq!(read(&a, "v1-own-secret"), "hunter2");

    // A named user instead. Issue 66: the state never changes hands under a running process
    // of the old user. The deploy stops the live release first (issue 67, 2), but a process of
    // the old user outside it still blocks the change (named), and v1 is started again.
    let named = |user: &str| limited(&b, &format!(r#"{{"user": "{user}"}}"#));
    b.script("v2", &acts(&a));
    let mut stray = std::process::Command::new("setpriv")
        .args(["--reuid", &uid_b.to_string(), "--regid", &uid_b.to_string()])
        .args(["--clear-groups", "sleep", "60"])
        .spawn()
        .unwrap();
    let out = b.deploy(free_port(), "v2", &["--policy", &named("nobody")]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains(&format!(
            "belongs to uid {uid_b}, and process {} ",
            stray.id()
        )),
        "{}",
        stderr(&out)
    );
    assert_eq!(b.pointer().unwrap()["version"], "v1");
    assert!(alive(b.live_pid().unwrap()));
    let _ = stray.kill();
    let _ = stray.wait();
    let out = b.deploy(free_port(), "v2", &["--policy", &named("nobody")]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(read(&b, "v2-uid"), "65534");
    b.script("v3", &acts(&a));
    let out = b.deploy(free_port(), "v3", &["--policy", &named("root")]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr(&out).contains("isolation.user = \"root\" is root"),
        "{}",
        stderr(&out)
    );
    assert_eq!(b.pointer().unwrap()["version"], "v2");
}

/// Issue 59, a filesystem it cannot escape: a confined release reads the system and its own
/// release, but not another root's files or /tmp even where their modes let everyone in, and
/// writes only its state, its TMPDIR and what `isolation.writable` lists; unconfined, the same
/// acts succeed (so the test can fail).
#[test]
fn a_release_reaches_only_the_system_its_release_and_what_the_policy_lists() {
    use std::os::unix::fs::PermissionsExt;
    let bin = crate::common::bin();
    let (site, other) = (Site::new(), Site::new());
    let open_to_all = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    // Another root's file and a file in a folder of /tmp, both readable and writable by all.
    let theirs = write(other.root(), "notes", "other service's notes\n");
    open_to_all(&theirs, 0o666);
    let loose = tempfile::tempdir().unwrap();
    open_to_all(loose.path(), 0o777);
    let listed = tempfile::tempdir().unwrap();
    open_to_all(listed.path(), 0o777);
    let acts = format!(
        "out=\"$STATE_DIRECTORY/$ROLLGATE_VERSION\"\n\
         head -c 4 /etc/hostname >/dev/null 2>&1 && echo ok > \"$out-system\"\n\
         cat ./edge-svc >/dev/null 2>&1 && echo ok > \"$out-release\"\n\
         cat '{theirs}' > \"$out-theirs\" 2>&1\n\
         touch '{loose}/x' 2> \"$out-tmp\" && echo written >> \"$out-tmp\"\n\
         touch '{listed}/x' 2> \"$out-listed\" && echo written >> \"$out-listed\"\n\
         exec '{bin}' sample-service\n",
        theirs = theirs.display(),
        loose = loose.path().display(),
        listed = listed.path().display(),
        bin = bin.display()
    );
    site.script("v1", &acts);
    site.script("v2", &acts);
    let policy = |isolation: &str| limited(&site, isolation);
    let read = |name: &str| {
        std::fs::read_to_string(site.root().join(format!("data/{name}")))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let confined = policy(&format!(
        r#"{{"writable": ["{}"]}}"#,
        listed.path().display()
    ));
    let out = site.deploy(free_port(), "v1", &["--policy", &confined]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(read("v1-system"), "ok");
    assert_eq!(read("v1-release"), "ok");
    assert!(
        read("v1-theirs").contains("Permission denied"),
        "{}",
        read("v1-theirs")
    );
    assert!(
        read("v1-tmp").contains("Permission denied"),
        "{}",
        read("v1-tmp")
    );
    assert_eq!(read("v1-listed"), "written");
    assert!(!loose.path().join("x").exists());

    let out = site.deploy(
        free_port(),
        "v2",
        &["--policy", &policy(r#"{"enabled": false}"#)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(read("v2-theirs"), "other service's notes");
    assert_eq!(read("v2-tmp"), "written");
}

/// Issue 59, rollgate not root: it does what an unprivileged process can (no new privileges,
/// Landlock) and says what it could not — no user of the service's own, no tree where the
/// cgroup folder is root's — in `--dry-run` and `status`, and the deploy still works.
#[test]
fn a_rollgate_that_is_not_root_confines_what_it_can_and_says_what_it_cannot() {
    use std::os::unix::process::CommandExt;
    let site = Site::new();
    site.release("v1", "");
    // A uid of this test alone, not `nobody`'s: the release it leaves running as that uid
    // until the test ends would block another test's data handed back from `nobody` (a
    // service's folder never changes hands while anything runs as its owner).
    let unprivileged = 64_999;
    for entry in [
        site.root().to_path_buf(),
        site.root().join("releases"),
        site.root().join("releases/v1"),
        site.root().join("releases/v1/edge-svc"),
    ] {
        std::os::unix::fs::chown(&entry, Some(unprivileged), Some(unprivileged)).unwrap();
    }
    let as_unprivileged = |args: &[&str]| {
        std::process::Command::new(crate::common::bin())
            .args(args)
            .arg("--root")
            .arg(site.root())
            .uid(unprivileged)
            .gid(unprivileged)
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    };
    let port = free_port().to_string();
    let dry = as_unprivileged(&["deploy", "edge-svc", &port, "v1", "--dry-run"]);
    assert!(
        stdout(&dry).contains(
            "rollgate's own user (uid 64999): only root can run a release as another user"
        ) && stdout(&dry).contains("its process group (no writable cgroup v2 hierarchy here)"),
        "{}",
        stdout(&dry)
    );
    let out = as_unprivileged(&["deploy", "edge-svc", &port, "v1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let status = as_unprivileged(&["status"]);
    assert!(
        stdout(&status).contains(
            "yes (uid 64999, rollgate's own: NOT a user of its own, only root can switch users; no privileges; tree none: its process group;"
        ),
        "{}",
        stdout(&status)
    );
    let pid = site.live_pid().unwrap();
    let own = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(own.contains("NoNewPrivs:\t1"), "{own}");
}

/// A policy whose `isolation` sets these limits (and no watch).
fn limited(site: &Site, isolation: &str) -> String {
    isolation_policy(site, 30_000, isolation)
}

/// Issue 59, limits: a release that touches more memory than `isolation.memory_mb` is killed by
/// the kernel, and the reason says so (not "signal: 9"); one that forks past `pids` is refused
/// the forks beyond it; `nofile` bounds its open files.
#[test]
fn memory_pids_and_open_files_are_held_to_the_policys_limits_and_an_oom_kill_is_the_reason() {
    let site = Site::new();
    let bin = crate::common::bin();
    site.script(
        "hog",
        "exec python3 -c 'b = bytearray(256 << 20); import time; time.sleep(60)'\n",
    );
    let policy = limited(&site, r#"{"memory_mb": 64}"#);
    let dry = site.deploy(free_port(), "hog", &["--policy", &policy, "--dry-run"]);
    assert!(
        stdout(&dry)
            .contains("no new privileges, no capability, no supplementary group; Landlock ABI ")
            && stdout(&dry).contains("; its own process tree under ")
            && stdout(&dry).contains("limits: memory 64 MiB"),
        "{}",
        stdout(&dry)
    );
    let out = site.deploy(free_port(), "hog", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        site.last_detail()
            .starts_with("candidate killed: out of memory at its 64 MiB limit before ready"),
        "{}",
        site.last_detail()
    );
    assert!(
        stderr(&out).contains("out of memory at its 64 MiB limit"),
        "{}",
        stderr(&out)
    );

    site.script(
        "forks",
        &format!(
            "python3 - > \"$STATE_DIRECTORY/forks\" 2>&1 <<'PY'\n\
             import os, resource, time\n\
             made = 0\n\
             for _ in range(200):\n\
             \x20   try:\n\
             \x20       if os.fork() == 0:\n\
             \x20           time.sleep(30); os._exit(0)\n\
             \x20       made += 1\n\
             \x20   except OSError:\n\
             \x20       break\n\
             print(made, resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n\
             PY\n\
             exec '{}' sample-service\n",
            bin.display()
        ),
    );
    let policy = limited(&site, r#"{"pids": 40, "nofile": 100}"#);
    let out = site.deploy(free_port(), "forks", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = std::fs::read_to_string(site.root().join("data/forks")).unwrap();
    let numbers: Vec<u64> = said
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(numbers.len() == 2 && numbers[0] < 40, "{said}");
    assert_eq!(numbers[1], 100, "{said}");
    assert_eq!(site.pointer().unwrap()["limits"]["pids"], 40);
    // Status says how the live release runs.
    let status = rollgate()
        .args(["status", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let table = stdout(&status);
    assert!(
        table.contains("no privileges; tree /sys/fs/cgroup/")
            && table.contains("limits 40 processes, 100 open files)"),
        "{table}"
    );
}

/// Issue 59, CPU: a spinner under `cpu_pct = 50` gets about half a core (measured from the
/// kernel's count of its CPU time), while the live release keeps answering.
#[test]
fn a_cpu_spinner_is_held_to_its_share() {
    let site = Site::new();
    let bin = crate::common::bin();
    site.script(
        "spin",
        &format!(
            "python3 -c 'while True: pass' &\necho $! > \"$STATE_DIRECTORY/spinner\"\nexec '{}' sample-service\n",
            bin.display()
        ),
    );
    let port = free_port();
    let policy = limited(&site, r#"{"cpu_pct": 50}"#);
    let out = site.deploy(port, "spin", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let spinner: i32 = std::fs::read_to_string(site.root().join("data/spinner"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let cpu_ticks = || {
        let stat = std::fs::read_to_string(format!("/proc/{spinner}/stat")).unwrap();
        let after: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        // utime and stime: fields 14 and 15 of the line, the 12th and 13th after the command.
        after[11].parse::<u64>().unwrap() + after[12].parse::<u64>().unwrap()
    };
    let (before, started) = (cpu_ticks(), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(3));
    let used = (cpu_ticks() - before) as f64 / 100.0;
    let share = used / started.elapsed().as_secs_f64();
    // It spins (so the figure is a measurement), but never past its half core. On a loaded
    // machine it may get less than half, so the lower bound is only that it ran.
    assert!(
        used > 0.0 && share < 0.65,
        "the spinner used {share:.2} of a core"
    );
    // And the kernel holds its tree to 50 ms of every 100 ms, whatever the load.
    assert_eq!(cpu_quota_of(spinner), Some((50_000, 100_000)));
    assert_eq!(version_on(port).as_deref(), Some("spin"));
}

/// Issue 59: a release killed for memory during its watch is switched back with the reason
/// said as what happened, and what ended users' time with it is the kernel.
#[test]
fn an_oom_kill_during_the_watch_is_the_reason_it_was_switched_back() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    ready_then_hog(&site, "v2", 0.8);
    let policy = write(
        site.root(),
        "watched.json",
        r#"{"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 10000,
            "isolation": {"memory_mb": 64}}}"#,
    );
    let out = site.deploy(free_port(), "v2", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    let back = site.log_lines().last().unwrap().clone();
    assert_eq!(back["event"], "rolled_back");
    assert!(
        back["detail"]
            .as_str()
            .unwrap()
            .starts_with("killed: out of memory at its 64 MiB limit during the watch"),
        "{back}"
    );
    assert_eq!(
        back["exposure"]["ended_by"], "the kernel (out of memory at its limit)",
        "{back}"
    );
}

/// The CPU quota and period (µs) of the cgroup `pid` is in: v2's `cpu.max` where the v2
/// hierarchy has the controller, else v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us`.
fn cpu_quota_of(pid: i32) -> Option<(i64, i64)> {
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let read = |file: &str| std::fs::read_to_string(file).ok();
        if controllers.split(',').any(|c| c == "cpu") {
            let dir = format!("/sys/fs/cgroup/cpu{path}");
            let quota = read(&format!("{dir}/cpu.cfs_quota_us"))?
                .trim()
                .parse()
                .ok()?;
            let period = read(&format!("{dir}/cpu.cfs_period_us"))?
                .trim()
                .parse()
                .ok()?;
            return Some((quota, period));
        }
        if controllers.is_empty() {
            if let Some(max) = read(&format!("/sys/fs/cgroup{path}/cpu.max")) {
                let mut words = max.split_whitespace();
                return Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?));
            }
        }
    }
    None
}

/// Issue 59: a live release the kernel killed for memory after its promotion: `status` says so,
/// not only that it is not running.
#[test]
fn status_says_a_live_release_was_killed_for_memory() {
    let site = Site::new();
    ready_then_hog(&site, "v1", 1.0);
    let policy = limited(&site, r#"{"memory_mb": 64}"#);
    let out = site.deploy(free_port(), "v1", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pid = site.live_pid().unwrap();
    assert!(
        wait_for(10, || !alive(pid) || is_zombie(pid)),
        "the kernel killed it"
    );
    // Its keeper started it again, and says how the process before ended.
    let status = || {
        let out = rollgate()
            .args(["status", "--root"])
            .arg(site.root())
            .output()
            .unwrap();
        stdout(&out)
    };
    assert!(
        wait_for(10, || status()
            .contains(": killed: out of memory at its 64 MiB limit); kept")),
        "{}",
        status()
    );
    // With its keeper gone, the next kill leaves it down, and status says why from the kernel.
    site.kill_keepers();
    let pid = site.live_pid().unwrap();
    assert!(
        wait_for(10, || !alive(pid) || is_zombie(pid)),
        "the kernel killed it"
    );
    assert!(
        status().contains(&format!(
            "{pid} (NOT running: killed: out of memory at its 64 MiB limit)"
        )),
        "{}",
        status()
    );
}

/// A release that answers ready at once, then (after `after_s` seconds) touches 256 MiB: what a
/// memory limit ends.
fn ready_then_hog(site: &Site, version: &str, after_s: f64) {
    site.script(
        version,
        &format!(
            "exec python3 - <<'PY'\n\
             import http.server, os, threading, time\n\
             def hog():\n\
             \x20   time.sleep({after_s})\n\
             \x20   b = bytearray(256 << 20)\n\
             \x20   time.sleep(60)\n\
             threading.Thread(target=hog, daemon=True).start()\n\
             class Ready(http.server.BaseHTTPRequestHandler):\n\
             \x20   def do_GET(self):\n\
             \x20       self.send_response(200); self.end_headers(); self.wfile.write(b'{version}')\n\
             \x20   def log_message(self, *args):\n\
             \x20       pass\n\
             http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), Ready).serve_forever()\n\
             PY\n"
        ),
    );
}

/// Issue 59: a release that relied on being root (it writes beside its code, it binds port 80)
/// fails confined with the rule that stopped it and the policy line that allows it, on the
/// terminal and in the log — not a bare EACCES.
#[test]
fn a_release_that_relied_on_being_root_fails_naming_the_rule_and_the_policy_line() {
    if !crate::hooks::nix_is_root() {
        return;
    }
    let site = Site::new();
    site.script(
        "v1",
        "/usr/bin/python3 -c \"open('$PWD/cache.db', 'w')\"\nsleep 30\n",
    );
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    let release = site.root().join("releases/v1");
    assert!(
        said.contains(&format!(
            "Permission denied: '{}/cache.db'",
            release.display()
        )),
        "{said}"
    );
    assert!(
        said.contains("is in the release folder, which its user only reads")
            && said.contains("$STATE_DIRECTORY")
            && said.contains("isolation.writable"),
        "{said}"
    );
    let logged = site.log_lines().last().cloned().unwrap();
    assert_eq!(logged["event"], "rolled_back");
    assert!(
        logged["detail"]
            .as_str()
            .unwrap()
            .contains("is in the release folder"),
        "{logged}"
    );

    site.script("v2", "exec /usr/bin/python3 -m http.server 80\n");
    let out = site.deploy(free_port(), "v2", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no privileges, so a port below 1024 is refused")
            && stderr(&out).contains("isolation.enabled = false"),
        "{}",
        stderr(&out)
    );

    // Issue 67, 3: Django's default database beside the code. SQLite says only "unable to
    // open database file", which used to get no hint at all.
    site.script(
        "v3",
        "/usr/bin/python3 -c \"import sqlite3; sqlite3.connect('db.sqlite3').execute('create table t (x)')\"\nsleep 30\n",
    );
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("unable to open database file"), "{said}");
    assert!(
        said.contains("a database beside the code cannot be opened for writing")
            && said.contains(&format!(
                "$STATE_DIRECTORY ({})",
                site.root().join("data").display()
            )),
        "{said}"
    );

    // A virtual environment's console script, built in another folder: its #! names an
    // interpreter the release cannot run. The hint names the script and the interpreter, and
    // never advises making the build folder writable.
    let build = tempfile::tempdir().unwrap();
    let python = build.path().join("venv/bin/python3");
    std::fs::create_dir_all(python.parent().unwrap()).unwrap();
    // A copy, as a venv's own interpreter is (a link would be followed to /usr/bin).
    std::fs::copy("/usr/bin/python3", &python).unwrap();
    let script = site.root().join("releases/v4/venv/bin/gunicorn");
    std::fs::create_dir_all(script.parent().unwrap()).unwrap();
    std::fs::write(&script, format!("#!{}\nprint('never')\n", python.display())).unwrap();
    make_executable(&script);
    site.script("v4", "exec venv/bin/gunicorn\n");
    let out = site.deploy(free_port(), "v4", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains(&format!(
            "venv/bin/gunicorn starts {} (its #! line)",
            python.display()
        )) && said.contains("venv/bin/python -m gunicorn"),
        "{said}"
    );
    assert!(!said.contains("writable"), "{said}");
}

/// A start whose output file another process still writes (holds its lock: a run of the same
/// place still going, as the live copy beside a restart's new one) never waits on it: the held
/// file moves to `.1`, where its writer goes on, and the start gets a file of its own at once.
/// (It waited for ever once, a second clock with it, and `up`; then 10 s and was refused, which
/// made every restart beside a silent process fail: issue 80.)
#[test]
fn a_start_whose_output_file_is_held_moves_it_away_and_goes_ahead() {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let site = Site::new();
    site.add_sample("v1", "");
    let output = site.root().join("output/v1/edge-svc.output");
    std::fs::create_dir_all(output.parent().unwrap()).unwrap();
    let mut held = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&output)
        .unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    held.write_all(b"the earlier run's last words\n").unwrap();
    let moved = std::fs::read_to_string(site.root().join("output/v1/edge-svc.output.1")).unwrap();
    assert_eq!(moved, "the earlier run's last words\n");
    assert!(
        wait_for(5, || std::fs::read_to_string(&output)
            .is_ok_and(|text| text.contains("sample-service v1: listening"))),
        "the new run writes a file of its own"
    );
}
