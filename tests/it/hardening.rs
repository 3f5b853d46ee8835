//! The deployer's failure paths (issue 11): each test is named after the defect it pins and
//! fails on the code that had it. Real processes on 127.0.0.1, the real binary.

use crate::common::*;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn first_release(site: &Site) -> u16 {
    site.release("v1", "");
    let port = free_port();
    let out = site.deploy(port, "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    port
}

/// The state an interrupted `promote` leaves: `current` already names the escalated candidate
/// B (v2), whose record still says `escalated` with A (v1) as the previous release.
fn interrupted_promote(site: &Site) -> (i32, u16, ReleaseProcess) {
    first_release(site);
    let previous = site.pointer().unwrap();
    let a = site.live_pid().unwrap();
    let port = free_port();
    let b = start_release_process(site, "v2", port);
    let b_pid = b.pid();
    write(
        site.root(),
        "current",
        &pointer_for("v2", port, b_pid).to_string(),
    );
    let mut fields = process_fields(b_pid);
    fields["stage"] = "escalated".into();
    fields["grace_ms"] = 3000.into();
    fields["drain_ms"] = 1000.into();
    fields["previous"] = previous;
    left_deploy(site, port, "t-escalated", fields);
    (a, port, b)
}

fn by_hand(site: &Site, verb: &str) -> std::process::Output {
    rollgate()
        .args([verb, "edge-svc", "--root"])
        .arg(site.root())
        .timeout(Duration::from_secs(30))
        .output()
        .unwrap()
}

#[test]
fn defect_01_promote_after_an_interrupted_promote_finishes_the_switch_and_keeps_the_live_release() {
    let site = Site::new();
    let (a, port, _b) = interrupted_promote(&site);
    let out = by_hand(&site, "promote");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(version_on(port).as_deref(), Some("v2"), "B still answers");
    assert!(
        wait_for(5, || !alive(a)),
        "A, the real previous release, is stopped"
    );
    assert_eq!(site.pointer().unwrap()["version"], "v2");
    assert_eq!(count_events(&site, "promoted", "v2"), 1);
    assert!(!site.root().join("candidate").exists());
}

#[test]
fn defect_01_abort_after_an_interrupted_promote_refuses_and_says_how_to_roll_forward() {
    let site = Site::new();
    let (a, port, _b) = interrupted_promote(&site);
    let out = by_hand(&site, "abort");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("already happened"), "{err}");
    assert!(err.contains("roll forward"), "{err}");
    assert_eq!(version_on(port).as_deref(), Some("v2"), "B still answers");
    assert!(alive(a), "nothing was stopped");
    assert_eq!(count_events(&site, "rolled_back", "v2"), 0);
}

#[test]
fn defect_01_a_hangup_during_promote_does_not_cut_the_switch_short() {
    let site = Site::new();
    // A previous release that ignores SIGTERM keeps promote busy for the whole grace (3 s).
    site.release("v1", "--ignore-sigterm");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let previous = site.pointer().unwrap();
    let a = site.live_pid().unwrap();
    site.release("v2", "");
    let port = free_port();
    let b = start_release_process(&site, "v2", port);
    let b_pid = b.pid();
    let mut fields = process_fields(b_pid);
    fields["stage"] = "escalated".into();
    fields["grace_ms"] = 3000.into();
    fields["drain_ms"] = 0.into();
    fields["previous"] = previous;
    left_deploy(&site, port, "t-hup", fields);
    let mut promote = std::process::Command::new(crate::common::bin())
        .args(["promote", "edge-svc", "--root"])
        .arg(site.root())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(10, || site.pointer().unwrap()["version"] == "v2"));
    std::thread::sleep(Duration::from_millis(300));
    for signal in [1, 2, 15] {
        send_signal(promote.id() as i32, signal);
    }
    let status = promote.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "promote finished despite the signals"
    );
    assert_eq!(count_events(&site, "promoted", "v2"), 1);
    assert!(wait_for(5, || !alive(a)));
    assert!(!site.root().join("candidate").exists());
}

#[test]
fn defect_03_a_policy_with_a_zero_poll_is_refused_before_anything_starts() {
    let site = Site::new();
    site.release("v1", "");
    // A `.ncl` policy does not have to apply the bundled contract.
    let policy = write(
        site.root(),
        "loose.ncl",
        "{ edge_svc = { progress_deadline_ms = 1000, poll_ms = 0, max_unavailable_pct = 0, max_surge_pct = 100, on_stall = 'rollback } }",
    );
    let out = site.deploy(free_port(), "v1", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("poll_ms"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    assert!(!site.root().join("candidate").exists());
    assert!(token_carriers(&site).is_empty());
    assert!(site.log_lines().is_empty(), "nothing was logged");

    let out = site.deploy(free_port(), "v1", &["0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("deadline-ms"), "{}", stderr(&out));
    assert!(token_carriers(&site).is_empty());
}

#[test]
fn defect_04_a_rollback_leaves_nothing_of_the_candidates_process_group() {
    let site = Site::new();
    first_release(&site);
    // The leader exits at once; its background child would keep running (and often the port).
    site.script("v2", "sleep 1000 &\nexit 78\n");
    let out = site.deploy(free_port(), "v2", &["--grace-ms", "300"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let started = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "candidate_started")
        .unwrap();
    let pgid = started["pid"].as_i64().unwrap() as i32;
    assert!(
        wait_for(5, || group_members(pgid).is_empty()),
        "left in the candidate's group: {:?}",
        group_members(pgid)
    );
}

#[test]
fn defect_04_an_old_release_whose_worker_ignores_sigterm_is_stopped_whole() {
    let site = Site::new();
    let bin = crate::common::bin();
    // The leader exits on SIGTERM; the worker it started ignores it.
    site.script(
        "v1",
        &format!(
            "(trap '' TERM; exec sleep 1000) &\nexec '{}' sample-service\n",
            bin.display()
        ),
    );
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let old = site.live_pid().unwrap();
    assert!(wait_for(5, || group_members(old).len() == 2));
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &["--grace-ms", "300"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        wait_for(5, || group_members(old).is_empty()),
        "left in the old release's group: {:?}",
        group_members(old)
    );
    assert!(
        site.last_detail().contains("old release v1 killed"),
        "{}",
        site.last_detail()
    );
}

#[test]
fn defect_05_a_log_that_cannot_be_written_after_the_spawn_stops_the_candidate() {
    let site = Site::new();
    first_release(&site);
    let before = std::fs::read(site.root().join("current")).unwrap();
    let live = site.live_pid().unwrap();
    std::fs::rename(site.root().join("deploy.log"), site.root().join("kept.log")).unwrap();
    std::fs::create_dir(site.root().join("deploy.log")).unwrap();
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("deploy.log"), "{err}");
    assert!(err.contains("current unchanged"), "{err}");
    assert!(wait_for(5, || token_carriers(&site).is_empty()));
    assert_eq!(std::fs::read(site.root().join("current")).unwrap(), before);
    assert!(alive(live), "the live release is untouched");
    // Issue 67, A: with no outcome line written, its record stays for the next command, which
    // ends the attempt with one once the log can be written again.
    assert!(err.contains("its record stays"), "{err}");
    std::fs::remove_dir(site.root().join("deploy.log")).unwrap();
    std::fs::rename(site.root().join("kept.log"), site.root().join("deploy.log")).unwrap();
    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v2_outcomes: Vec<String> = site
        .events()
        .into_iter()
        .filter(|(e, v)| v == "v2" && (e == "promoted" || e == "rolled_back"))
        .map(|(e, _)| e)
        .collect();
    assert_eq!(v2_outcomes, vec!["rolled_back"]);
    assert!(!site.root().join("candidate").exists());
}

#[test]
fn defect_06_a_huge_output_file_is_neither_read_whole_nor_quoted() {
    let site = Site::new();
    first_release(&site);
    site.script("v2", "echo this run says goodbye\nexit 78\n");
    // 2 GiB from earlier runs (sparse, so it costs no disk), ending with an old line.
    let output = site.root().join("output/v2/edge-svc.output");
    std::fs::create_dir_all(output.parent().unwrap()).unwrap();
    let file = std::fs::File::create(&output).unwrap();
    file.set_len(2 << 30).unwrap();
    drop(file);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&output)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"\nan earlier run's words\n"))
        .unwrap();
    // The peak RSS as GNU time reports it for its child. Not wait4 on a child of this test
    // process: a child started by vfork or fork records the parent's resident size as its own
    // high-water mark at exec, and the parent here is the whole test suite.
    let measured = site.root().join("deploy.maxrss");
    let out = std::process::Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o"])
        .arg(&measured)
        .arg(crate::common::bin())
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v2",
            "--root",
        ])
        .arg(site.root())
        .stderr(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "rolled back");
    // Its last line (a line before it says the command exited 1).
    let peak_kib: u64 = std::fs::read_to_string(&measured)
        .unwrap()
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .expect("GNU time's %M");
    assert!(peak_kib < 64 * 1024, "peak RSS {peak_kib} KiB");
    let detail = site.last_detail();
    assert!(
        detail.contains("candidate output: this run says goodbye"),
        "{detail}"
    );
    assert!(!detail.contains("earlier run"), "{detail}");
    let kept = std::fs::metadata(site.root().join("output/v2/edge-svc.output.1")).unwrap();
    assert!(
        kept.len() > 2 << 30,
        "the previous run's output is kept as .output.1"
    );
}

/// A log line as the deployer writes it, under a deploy token.
fn logged(site: &Site, event: &str, version: &str, token: &str, ts: f64) {
    let line = serde_json::json!({"ts": ts, "event": event, "version": version, "detail": "x",
        "service": "edge-svc", "token": token});
    let path = site.root().join("deploy.log");
    let mut text = std::fs::read_to_string(&path).unwrap_or_default();
    text.push_str(&format!("{line}\n"));
    std::fs::write(path, text).unwrap();
}

#[test]
fn defect_07_a_crash_after_logging_promoted_leaves_one_outcome() {
    let site = Site::new();
    first_release(&site);
    let previous = site.pointer().unwrap();
    let port = free_port();
    let b = start_release_process(&site, "v2", port);
    let b_pid = b.pid();
    let started = now();
    write(
        site.root(),
        "current",
        &pointer_for("v2", port, b_pid).to_string(),
    );
    let mut fields = process_fields(b_pid);
    fields["started_at"] = started.into();
    fields["previous"] = previous;
    left_deploy(&site, port, "t-7", fields);
    logged(&site, "candidate_started", "v2", "t-7", started);
    logged(&site, "promoted", "v2", "t-7", started + 0.2);

    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        count_events(&site, "promoted", "v2"),
        1,
        "{:?}",
        site.events()
    );
    assert_eq!(count_events(&site, "rolled_back", "v2"), 0);
    assert_eq!(site.pointer().unwrap()["version"], "v3");
}

#[test]
fn defect_07_a_crash_after_logging_rolled_back_leaves_one_outcome() {
    let site = Site::new();
    first_release(&site);
    let previous = site.pointer().unwrap();
    let started = now();
    left_deploy(
        &site,
        free_port(),
        "t-7b",
        serde_json::json!({"pid": 999999, "start_time": 1, "started_at": started, "previous": previous}),
    );
    logged(&site, "candidate_started", "v2", "t-7b", started);
    logged(&site, "rolled_back", "v2", "t-7b", started + 0.2);

    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        count_events(&site, "rolled_back", "v2"),
        1,
        "{:?}",
        site.events()
    );
}

#[test]
fn defect_08_a_failed_folder_fsync_after_the_rename_still_finishes_the_switch() {
    let site = Site::new();
    first_release(&site);
    let old = site.live_pid().unwrap();
    site.release("v2", "");
    let port = free_port();
    let out = rollgate()
        .args(["deploy", "edge-svc", &port.to_string(), "v2", "--root"])
        .arg(site.root())
        .env("ROLLGATE_FAULT", "fsync-dir-after-current")
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v2");
    let detail = site.last_detail();
    assert!(detail.contains("durability unknown"), "{detail}");
    assert!(!detail.contains("intact"), "{detail}");
    assert!(wait_for(5, || !alive(old)), "one release live, not two");
    assert_eq!(version_on(port).as_deref(), Some("v2"));
    assert!(!site.root().join("candidate").exists());
}

#[test]
fn defect_02_with_umask_077_the_state_files_stay_readable_by_a_proxy_of_another_user() {
    use std::os::unix::fs::PermissionsExt;
    let site = Site::new();
    site.release("v1", "");
    let port = free_port();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "umask 077; exec '{}' deploy edge-svc {port} v1 --root '{}'",
            crate::common::bin().display(),
            site.root().display()
        ))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for name in ["current", "deploy.log", "deploy.lock"] {
        let mode = std::fs::metadata(site.root().join(name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644, "{name}");
    }
}

#[test]
fn sighup_during_the_gate_rolls_back_and_says_so() {
    let site = Site::new();
    first_release(&site);
    site.release("v2", "--ready-after-ms 60000");
    let mut deploy = site.deploy_in_background("v2", "30000");
    std::thread::sleep(Duration::from_millis(200));
    send_signal(deploy.id() as i32, 1);
    let status = deploy.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    assert_eq!(site.events().last().unwrap().0, "rolled_back");
    assert!(
        site.last_detail().starts_with("interrupted by SIGHUP"),
        "{}",
        site.last_detail()
    );
    assert!(token_carriers(&site).is_empty());
}

#[test]
fn defect_03_promote_and_abort_of_a_record_with_absurd_numbers_do_not_panic() {
    for verb in ["promote", "abort"] {
        let site = Site::new();
        first_release(&site);
        left_deploy(
            &site,
            1,
            "t-absurd",
            serde_json::json!({"pid": 999_999_999, "start_time": u64::MAX, "stage": "escalated",
                "started_at": -1e300, "grace_ms": u64::MAX, "drain_ms": u64::MAX}),
        );
        let out = by_hand(&site, verb);
        assert!(
            !stderr(&out).contains("panicked"),
            "{verb}: {}",
            stderr(&out)
        );
        assert_eq!(out.status.code(), Some(1), "{verb}: {}", stderr(&out));
        assert_eq!(site.events().last().unwrap().0, "rolled_back");
        assert!(!site.root().join("candidate").exists());
    }
}

#[test]
fn defect_02_a_drain_the_proxy_does_not_confirm_keeps_the_old_release_for_the_drain_timeout() {
    let site = Site::new();
    first_release(&site);
    let old = site.live_pid().unwrap();
    // A stand-in for a proxy that could not re-read the pointer: the real proxy answers this
    // way, but no deploy can make it fail to read a pointer the deployer just wrote.
    let peer = unconfirming_proxy(
        &site,
        "error cannot re-read the pointer: permission denied\n",
        2,
    );
    site.release("v2", "");
    let started = std::time::Instant::now();
    let mut deploy = std::process::Command::new(crate::common::bin())
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v2",
            "--root",
        ])
        .arg(site.root())
        .args(["--drain-timeout-ms", "2000"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(10, || site.pointer().unwrap()["version"] == "v2"));
    let switched = started.elapsed();
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        alive(old),
        "the old release was stopped before the drain timeout"
    );
    assert!(deploy.wait().unwrap().success());
    assert!(started.elapsed() >= switched + Duration::from_millis(1900));
    // Asked to confirm the switch (the old release is the watch's fallback: nothing to wait
    // for), then, after the watch, to drain it.
    let asked = peer.join().unwrap();
    assert!(
        asked[0].starts_with("switch ") && asked[1].starts_with("drain "),
        "{asked:?}"
    );
    let detail = site.last_detail();
    assert!(detail.contains("did not confirm"), "{detail}");
    assert!(wait_for(5, || !alive(old)));
}

/// A `candidate` record an older rollgate left in its watch (stage `watching`, `current` naming
/// the candidate with the previous release as its fallback) is read into the engine's state by
/// the next deploy and finished as the watch would have been: one final probe, then promoted
/// and the previous release stopped.
#[test]
fn a_legacy_record_left_in_its_watch_is_finished_by_one_final_probe() {
    let site = Site::new();
    first_release(&site);
    let previous = site.pointer().unwrap();
    let a = site.live_pid().unwrap();
    let port = free_port();
    let b = start_release_process(&site, "v2", port);
    let mut pointer = pointer_for("v2", port, b.pid());
    pointer["fallback"] = serde_json::json!({"version": "v1", "port": previous["port"], "pid": a});
    write(site.root(), "current", &pointer.to_string());
    let mut fields = process_fields(b.pid());
    fields["stage"] = "watching".into();
    fields["previous"] = previous;
    fields["watch"] = serde_json::json!({"until": 1.0, "poll_ms": 50, "failures": 3,
        "gate_detail": "ready after 120 ms (2 probes)", "gate_elapsed_ms": 120,
        "switch_detail": "no proxy; "});
    left_deploy(&site, port, "t-watching", fields);

    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines = site.log_lines();
    let finished = lines
        .iter()
        .find(|l| l["token"] == "t-watching")
        .expect("the left watch has its outcome");
    assert_eq!(finished["event"], "promoted");
    assert_eq!(finished["version"], "v2");
    let detail = finished["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("ready after 120 ms (2 probes); passed the watch (cut short: deployer pid 999999 was gone; decided by one final probe); at the switch: no proxy; after the watch: old release v1 stopped"),
        "{detail}"
    );
    assert!(detail.contains("old release v1 stopped"), "{detail}");
    assert!(wait_for(5, || !alive(a)), "the previous release");
    assert_eq!(site.pointer().unwrap()["version"], "v3");
    assert_eq!(lines.last().unwrap()["event"], "promoted");
    assert!(!site.root().join("candidate").exists());
    assert!(!site.root().join("rollout.json").exists());
}

#[test]
fn a_root_that_is_not_a_folder_is_refused_by_every_command_that_reads_one_in_the_same_words() {
    let site = Site::new();
    let typo = site.root().join("edeg");
    let commands: [&[&str]; 10] = [
        &["status"],
        &["rollout", "status", "edge-svc"],
        &["rollout", "pause", "edge-svc"],
        &["rollout", "resume", "edge-svc"],
        &["rollout", "abort", "edge-svc"],
        &["rollback", "edge-svc"],
        &["up"],
        &["promote", "edge-svc"],
        &["abort", "edge-svc"],
        &["deploy", "edge-svc", "9999", "v1"],
    ];
    for args in commands {
        let out = rollgate()
            .args(args)
            .arg("--root")
            .arg(&typo)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert_eq!(
            stderr(&out),
            format!("error: root {} is not a folder\n", typo.display()),
            "{args:?}"
        );
    }
    let out = rollgate()
        .args(["log", "summary"])
        .arg(typo.join("deploy.log"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("edeg/deploy.log"), "{}", stderr(&out));
    // A folder with nothing in it yet is a root with nothing promoted.
    let out = rollgate()
        .arg("status")
        .arg("--root")
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("nothing promoted yet"));
}

/// Issue 67, A and C: the disk fills while a deploy runs (here, the file size limit a full
/// disk acts as: `RLIMIT_FSIZE` just past the candidate's first line, so its next line — the
/// rollback of a candidate that never got ready — is cut short). The short line is cut back
/// rather than glued to the next, the failed attempt still ends with exactly one outcome line
/// (the next command writes it: the record was kept), and every line of the log is whole.
#[test]
fn defect_67a_a_write_cut_short_after_the_candidate_started_tears_no_line_and_loses_no_outcome() {
    let site = Site::new();
    first_release(&site);
    // Inert lines first, so the limit is far above every other file the deploy writes.
    let log = site.root().join("deploy.log");
    let padding: String = (0..500)
        .map(|n| {
            format!("{{\"ts\":1796000000.{n},\"event\":\"hook_ran\",\"version\":\"v1\",\"detail\":\"padding {n} of the log so that its size limit is far above every state file\",\"service\":\"edge-svc\"}}\n")
        })
        .collect();
    let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut file, padding.as_bytes()).unwrap();
    drop(file);
    let started = site
        .log_lines()
        .iter()
        .find(|l| l["event"] == "candidate_started")
        .map(|l| serde_json::to_string(l).unwrap().len() as u64)
        .unwrap();
    let limit = std::fs::metadata(&log).unwrap().len() + started + 64;
    // A candidate that never gets ready: its rolled_back line is the one cut short.
    site.release("v2", "--readyz-status 503");
    let mut deploy = std::process::Command::new(crate::common::bin());
    deploy
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v2",
            "600",
            "--root",
        ])
        .arg(site.root())
        .env("NO_COLOR", "1");
    // SAFETY: setrlimit and signal take integers; the child has one thread.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut deploy, move || {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let cap = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &cap) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = deploy.output().unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.ends_with('\n'),
        "a torn last line: {:?}",
        &text[text.len() - 200..]
    );
    let v2_started = text
        .lines()
        .filter(|l| {
            l.contains("\"event\":\"candidate_started\"") && l.contains("\"version\":\"v2\"")
        })
        .count();
    assert_eq!(
        v2_started, 1,
        "the candidate started (the cut came after it)"
    );

    // The next deploy, with room: the failed attempt is finished, and every line is whole.
    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a torn line {l:?}: {e}")))
        .collect();
    let mut attempts: std::collections::BTreeMap<String, usize> = Default::default();
    for line in &lines {
        let Some(token) = line["token"].as_str() else {
            continue;
        };
        let outcome = matches!(line["event"].as_str(), Some("promoted" | "rolled_back"));
        *attempts.entry(token.to_string()).or_default() += usize::from(outcome);
    }
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    assert!(attempts.values().all(|n| *n == 1), "{attempts:?}");
    assert_eq!(site.pointer().unwrap()["version"], "v3");
}

/// Issue 67, 11: a start the kernel refuses (the release's interpreter does not exist) leaves
/// no cgroup folder behind: the child makes its tree between fork and exec, and its failed
/// exec used to leave it for a later sweep.
#[test]
fn defect_67_11_a_refused_start_leaves_no_cgroup_folder() {
    let Some(base) = ["/sys/fs/cgroup/unified/rollgate", "/sys/fs/cgroup/rollgate"]
        .into_iter()
        .map(std::path::Path::new)
        .find(|p| p.is_dir())
    else {
        return; // No cgroup trees on this host: nothing to leave.
    };
    let site = Site::new();
    first_release(&site);
    let exe = write(
        site.root(),
        "releases/v2/edge-svc",
        "#!/nonexistent/interpreter\n",
    );
    make_executable(&exe);
    let deploy = std::process::Command::new(crate::common::bin())
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v2",
            "--root",
        ])
        .arg(site.root())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its trees are named after its run (`DEPLOYERPID-TIME-SLOT-…~PID-START`).
    let run = format!("{}-", deploy.id());
    let out = deploy.wait_with_output().unwrap();
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/nonexistent/interpreter") || stderr(&out).contains("No such file"),
        "{}",
        stderr(&out)
    );
    let left: Vec<String> = std::fs::read_dir(base)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&run))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "{}", stderr(&out));
}
