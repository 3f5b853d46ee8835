//! Crash safety at every action (issue 24): `ROLLGATE_FAULT=kill-after-action:K` makes the real
//! binary SIGKILL itself right after its K-th persisted action. For every K of representative
//! runs, the command a person would run next is run, and the root must end as the same run
//! with no crash leaves it: nothing running that no state file names, a pool that never went
//! empty, one outcome line per ended rollout, each post hook at most once.

use crate::common::*;

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use serde_json::Value;

/// A policy for short runs: tiny deadlines, no drain wait, no watch; a post hook that appends
/// one line per run to `hooks.out`.
fn policy(site: &Site, surge_pct: u32, unavailable_pct: u32) -> PathBuf {
    hook_recorder(site);
    write(
        site.root(),
        "policy.json",
        &format!(
            r#"{{"edge_svc": {{"progress_deadline_ms": 3000, "poll_ms": 50,
                "max_unavailable_pct": {unavailable_pct}, "max_surge_pct": {surge_pct},
                "on_stall": "rollback", "stop_grace_ms": 1000, "drain_timeout_ms": 0,
                "watch_ms": 0, "waves": [34, 100],
                "hooks": {{"post_promote": ["./post.sh"], "post_rollback": ["./post.sh"]}}}}}}"#
        ),
    )
}

fn rollgate_run(site: &Site, args: &[&str], fault: Option<u64>) -> Output {
    let mut command = rollgate();
    command
        .args(args)
        .arg("--root")
        .arg(site.root())
        .env("NO_COLOR", "1")
        // A container release's scenario reaches the test engine (nothing else asks for it).
        .env("DOCKER_HOST", crate::common::engine::docker_host_named())
        .timeout(Duration::from_secs(60));
    if let Some(k) = fault {
        command.env("ROLLGATE_FAULT", format!("kill-after-action:{k}"));
    }
    command.output().unwrap()
}

fn said(out: &Output) -> String {
    format!("{}{}", stdout(out), stderr(out))
}

fn killed(out: &Output) -> bool {
    out.status.signal() == Some(9)
}

fn json(site: &Site, file: &str) -> Option<Value> {
    let text = std::fs::read_to_string(site.root().join(file)).ok()?;
    Some(serde_json::from_str(&text).unwrap())
}

/// Every pid a state file names: the pool, `current` (and its fallback), the rollout in flight.
fn named_pids(site: &Site) -> Vec<i64> {
    let mut pids = Vec::new();
    if let Some(set) = json(site, "replicas.json") {
        pids.extend(
            set["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["pid"].as_i64().unwrap()),
        );
    }
    if let Some(current) = json(site, "current") {
        pids.extend(current["pid"].as_i64());
        pids.extend(current["fallback"]["pid"].as_i64());
    }
    if let Some(rollout) = json(site, "rollout.json") {
        for slot in rollout["slots"].as_array().unwrap() {
            for field in ["live", "candidate", "retiring", "fallback"] {
                pids.extend(slot[field]["pid"].as_i64());
            }
        }
    }
    pids
}

/// The versions the pool serves, sorted.
fn pool_versions(site: &Site) -> Vec<String> {
    let mut versions = match json(site, "replicas.json") {
        Some(set) => set["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["version"].as_str().unwrap().to_string())
            .collect(),
        None => site
            .pointer()
            .map(|p| vec![p["version"].as_str().unwrap().to_string()])
            .unwrap_or_default(),
    };
    versions.sort();
    versions
}

/// What a root looks like once a run (and whatever came next) is over.
#[derive(Debug, PartialEq)]
struct End {
    pool: Vec<String>,
    /// The rollout's state (`completed`, `aborted`, `paused`), None once a deploy cleared it.
    phase: Option<String>,
    /// The outcome events logged under the run's token.
    outcomes: Vec<String>,
}

fn end(site: &Site, token: &str) -> End {
    End {
        pool: pool_versions(site),
        phase: json(site, "rollout.json").map(|r| r["phase"].as_str().unwrap().to_string()),
        outcomes: site
            .log_lines()
            .iter()
            .filter(|l| l["token"] == token)
            .filter(|l| l["event"] == "promoted" || l["event"] == "rolled_back")
            .map(|l| l["event"].as_str().unwrap().to_string())
            .collect(),
    }
}

/// The token of the last run that started (a rollout's id, or a deploy's token).
fn last_token(site: &Site) -> String {
    site.log_lines()
        .iter()
        .rev()
        .find(|l| l["event"] == "rollout_started" || l["event"] == "candidate_started")
        .and_then(|l| l["token"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Nothing of the service runs that no state file names, and the pool serves.
fn assert_whole(site: &Site, k: u64) {
    let named = named_pids(site);
    for pid in site.processes() {
        let ours = std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
            env.split(|b| *b == 0)
                .any(|var| var.starts_with(b"ROLLGATE_DEPLOY_TOKEN="))
        });
        assert!(
            !ours || named.contains(&i64::from(pid)),
            "K={k}: pid {pid} runs and no state file names it; named: {named:?}"
        );
    }
    assert!(!pool_versions(site).is_empty(), "K={k}: the pool is empty");
    assert_trees(site, k);
    // A signed root's floor is the last release promoted there, whoever promoted it.
    if let Some(floor) = json(site, "release-floor") {
        let promoted = site
            .log_lines()
            .iter()
            .rev()
            .find(|l| l["event"] == "promoted")
            .map(|l| l["version"].clone());
        assert_eq!(
            Some(floor["version"].clone()),
            promoted,
            "K={k}: the floor vs the log"
        );
    }
    if json(site, "rollout.json").is_none() {
        // A deploy root: the pointer, the log and what runs agree on the live release.
        let promoted = site
            .log_lines()
            .iter()
            .rev()
            .find(|l| l["event"] == "promoted")
            .map(|l| l["version"].clone());
        let pointer = site.pointer().expect("current");
        assert_eq!(
            Some(pointer["version"].clone()),
            promoted,
            "K={k}: current vs the log"
        );
        let pid = pointer["pid"].as_i64().unwrap() as i32;
        assert!(alive(pid), "K={k}: the live release {pid} does not run");
    }
    let hooks = std::fs::read_to_string(hooks_out(site)).unwrap_or_default();
    assert!(
        hooks.lines().count() <= 1,
        "K={k}: post hooks ran more than once: {hooks}"
    );
    if site.root().join("releases/v1/image.json").is_file() {
        assert_containers(site, k, &named);
    }
}

/// Issue 60: every container of a container root is run by a supervisor a state file names;
/// none is left that rollgate does not know.
fn assert_containers(site: &Site, k: u64, named: &[i64]) {
    use crate::common::engine::{containers_of, inspect};
    for container in containers_of(site.root()) {
        let inspected = inspect(container["ID"].as_str().unwrap());
        let supervisor = inspected["Config"]["Labels"]["dev.rollgate.supervisor"]
            .as_str()
            .and_then(|s| s.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i64>().ok());
        let state = &inspected["State"]["Status"];
        // A container on its way out (its supervisor stopped, removing it) is no stray.
        let leaving = supervisor.is_some_and(|pid| !alive(pid as i32)) && state != "running";
        assert!(
            leaving || supervisor.is_some_and(|pid| named.contains(&pid)),
            "K={k}: container {} ({state}) is run by no process a state file names: {supervisor:?}, named {named:?}",
            container["Names"]
        );
    }
}

/// Issue 59: every release process that runs is in a tree of its own under rollgate's, and no
/// tree of a release that no longer runs is left behind (the sweep takes empty trees only once
/// they are 10 s old, so a tree left by the crash is still there when this looks).
fn assert_trees(site: &Site, k: u64) {
    let base = crate::deploy::cgroup_base();
    if base.is_empty() {
        return;
    }
    for pid in site.processes() {
        let carries_token = std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
            env.split(|b| *b == 0)
                .any(|var| var.starts_with(b"ROLLGATE_DEPLOY_TOKEN="))
        });
        let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        assert!(
            !carries_token || groups.lines().any(|l| l.starts_with("0::/rollgate/")),
            "K={k}: release process {pid} is in no tree of rollgate's: {groups}"
        );
    }
    let logged: std::collections::BTreeSet<i64> = site
        .log_lines()
        .iter()
        .filter_map(|l| l["pid"].as_i64())
        .collect();
    let trees: Vec<String> = std::fs::read_dir(&base)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    for pid in logged.iter().filter(|pid| !alive(**pid as i32)) {
        let identity = format!("~{pid}-");
        let left: Vec<&String> = trees.iter().filter(|t| t.contains(&identity)).collect();
        assert!(
            left.is_empty(),
            "K={k}: the tree of stopped release {pid} is left behind: {left:?}"
        );
    }
    // No empty tree of this root's runs is left (trees are named `TOKEN~PID-STARTTIME`).
    let tokens: std::collections::BTreeSet<String> = site
        .log_lines()
        .iter()
        .filter_map(|l| l["token"].as_str().map(str::to_string))
        .collect();
    for tree in &trees {
        let Some((label, _)) = tree.split_once('~') else {
            continue;
        };
        if tokens.contains(label) {
            let procs =
                std::fs::read_to_string(format!("{base}/{tree}/cgroup.procs")).unwrap_or_default();
            assert!(
                !procs.trim().is_empty()
                    || !std::path::Path::new(&format!("{base}/{tree}")).exists(),
                "K={k}: the empty tree {tree} of this root's run is left behind"
            );
        }
    }
}

struct Scenario<'a> {
    /// Prepares a fresh root (installs the baseline).
    setup: &'a dyn Fn(&Site),
    /// The run crashed at K (its rollgate command line, without `--root`).
    run: &'a dyn Fn(&Site) -> Vec<String>,
    /// What a person runs next when the run was killed.
    next: &'a dyn Fn(&Site) -> Vec<String>,
    /// The documented end of a run cut short before its switch, when it differs from the
    /// clean run's (a single deploy killed before its switch is rolled back).
    undone: Option<End>,
    /// The run starts a rollout or deploy of its own (not a command on one in flight).
    starts_anew: bool,
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn as_strs(list: &[String]) -> Vec<&str> {
    list.iter().map(String::as_str).collect()
}

/// Runs `scenario` once with no crash, then once per action index until the run no longer
/// reaches it; each crashed run is followed by the next command and compared with the clean one.
fn every_action(scenario: Scenario) -> u64 {
    let clean = Site::new();
    (scenario.setup)(&clean);
    let out = rollgate_run(&clean, &as_strs(&(scenario.run)(&clean)), None);
    assert!(!killed(&out), "{}", said(&out));
    let token = last_token(&clean);
    let expected = end(&clean, &token);
    assert_whole(&clean, 0);
    // Its replicas hold ports of the test's block: they go before the crashed runs use it.
    drop(clean);
    let mut k = 1;
    loop {
        let site = Site::new();
        (scenario.setup)(&site);
        let (before, pool_before) = (last_token(&site), pool_versions(&site));
        let out = rollgate_run(&site, &as_strs(&(scenario.run)(&site)), Some(k));
        if !killed(&out) {
            // The run did fewer than K actions: every index was covered.
            assert_eq!(end(&site, &last_token(&site)), expected, "{}", said(&out));
            eprintln!("every action index covered: {}", k - 1);
            return k - 1;
        }
        let token = last_token(&site);
        let next = rollgate_run(&site, &as_strs(&(scenario.next)(&site)), None);
        assert!(!killed(&next), "{}", said(&next));
        assert_whole(&site, k);
        let found = end(&site, &token);
        if token == before && scenario.starts_anew {
            // Killed before the run's start was logged: the root serves what it served.
            assert_eq!(found.pool, pool_before, "K={k}: {found:?}; {}", said(&next));
        } else if Some(&found) != scenario.undone.as_ref() {
            assert_eq!(found, expected, "K={k}: next said {}", said(&next));
        }
        k += 1;
    }
}

/// Three (or `replicas`) replicas of v1, installed by a rollout with no crash.
fn install(site: &Site, block: u16, replicas: usize, surge_pct: u32, unavailable_pct: u32) {
    site.release("v1", "");
    site.release("v2", "");
    install_v1(site, block, replicas, surge_pct, unavailable_pct);
}

/// `replicas` of v1 (already in place) rolled out with no crash, under the test policy.
fn install_v1(site: &Site, block: u16, replicas: usize, surge_pct: u32, unavailable_pct: u32) {
    let policy = policy(site, surge_pct, unavailable_pct);
    let (count, range) = (replicas.to_string(), ten_ports(block));
    let policy = policy.to_str().unwrap();
    let args = [
        "rollout",
        "edge-svc",
        "v1",
        "--replicas",
        &count,
        "--ports",
        &range,
        "--policy",
        policy,
    ];
    let out = rollgate_run(site, &args, None);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    std::fs::remove_file(hooks_out(site)).unwrap();
}

fn rollout_v2(site: &Site) -> Vec<String> {
    let policy = site.root().join("policy.json");
    args(&[
        "rollout",
        "edge-svc",
        "v2",
        "--policy",
        policy.to_str().unwrap(),
    ])
}

/// A rollout whose rollgate died is resumed; one that ended is settled and refused as ended.
fn resume(_: &Site) -> Vec<String> {
    args(&["rollout", "resume", "edge-svc"])
}

#[test]
fn a_rollout_of_three_with_surge_killed_after_any_action_is_finished_by_resume() {
    let covered = every_action(Scenario {
        setup: &|site| install(site, 0, 3, 34, 0),
        run: &rollout_v2,
        next: &resume,
        undone: None,
        starts_anew: true,
    });
    assert!(covered > 10, "only {covered} actions");
}

#[test]
fn an_in_place_rollout_killed_after_any_action_is_finished_by_resume() {
    let covered = every_action(Scenario {
        setup: &|site| install(site, 1, 2, 0, 0),
        run: &rollout_v2,
        next: &resume,
        undone: None,
        starts_anew: true,
    });
    assert!(covered > 10, "only {covered} actions");
}

/// Three replicas of v1, then a rollout to v2 that paused itself in its second wave: slot 2's
/// v2 exits at boot (slot 0 and 1 run v2).
fn paused_in_wave_two(site: &Site, block: u16) {
    install(site, block, 3, 34, 0);
    fails_on_slot(site, "v2", 2);
    let out = rollgate_run(site, &as_strs(&rollout_v2(site)), None);
    assert_eq!(out.status.code(), Some(3), "paused: {}", said(&out));
}

#[test]
fn an_abort_with_rollback_killed_after_any_action_is_finished_by_asking_again() {
    let abort = |_: &Site| args(&["rollout", "abort", "edge-svc", "--rollback"]);
    let covered = every_action(Scenario {
        setup: &|site| paused_in_wave_two(site, 2),
        run: &abort,
        next: &abort,
        undone: None,
        starts_anew: false,
    });
    assert!(covered > 5, "only {covered} actions");
}

#[test]
fn a_resume_killed_after_any_action_is_finished_by_resuming_again() {
    let covered = every_action(Scenario {
        setup: &|site| paused_in_wave_two(site, 3),
        run: &resume,
        next: &resume,
        undone: None,
        starts_anew: false,
    });
    assert!(covered > 3, "only {covered} actions");
}

/// v1 live by a deploy on the block's first port; v2 installed beside it (sample-service with
/// `v2_args`).
fn deployed_v1(site: &Site, block: u16, v2_args: &str) {
    site.release("v1", "");
    site.release("v2", v2_args);
    let port = first_port(block);
    let out = rollgate_run(
        site,
        &[
            "deploy",
            "edge-svc",
            &port.to_string(),
            "v1",
            "--watch-ms",
            "0",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
}

fn first_port(block: u16) -> u16 {
    let range = ten_ports(block);
    range.split('-').next().unwrap().parse().unwrap()
}

fn deploy_v2(block: u16) -> impl Fn(&Site) -> Vec<String> {
    move |_| {
        let port = (first_port(block) + 1).to_string();
        args(&[
            "deploy",
            "edge-svc",
            &port,
            "v2",
            "--watch-ms",
            "600",
            "--grace-ms",
            "1000",
            "--drain-timeout-ms",
            "0",
        ])
    }
}

/// After a reboot, `up` finishes what a dead deployer left and starts what is live.
fn up(_: &Site) -> Vec<String> {
    args(&["up"])
}

fn rolled_back_to_v1() -> End {
    End {
        pool: vec!["v1".into()],
        phase: None,
        outcomes: vec!["rolled_back".into()],
    }
}

#[test]
fn a_deploy_whose_watch_passes_killed_after_any_action_is_finished_or_undone_by_up() {
    let covered = every_action(Scenario {
        setup: &|site| deployed_v1(site, 4, ""),
        run: &deploy_v2(4),
        next: &up,
        undone: Some(rolled_back_to_v1()),
        starts_anew: true,
    });
    assert!(covered > 5, "only {covered} actions");
}

/// Issue 60: a container release's deploy killed after any action is finished or undone by
/// `up`, with no container left that no state file's supervisor runs.
#[test]
fn a_container_deploy_killed_after_any_action_is_finished_or_undone_by_up() {
    let covered = every_action(Scenario {
        setup: &|site| {
            crate::containers::installed_images(site);
            let port = first_port(42);
            let out = rollgate_run(
                site,
                &[
                    "deploy",
                    "edge-svc",
                    &port.to_string(),
                    "v1",
                    "--watch-ms",
                    "0",
                    "--deadline-ms",
                    "30000",
                ],
                None,
            );
            assert_eq!(out.status.code(), Some(0), "{}", said(&out));
        },
        // A container starts in a tenth of a second here, seconds on a loaded machine.
        run: &|site| {
            let mut run = deploy_v2(42)(site);
            run.extend(args(&["--deadline-ms", "30000"]));
            run
        },
        next: &up,
        undone: Some(rolled_back_to_v1()),
        starts_anew: true,
    });
    assert!(covered > 5, "only {covered} actions");
}

/// Issue 60: a rollout of three container replicas killed after any action is finished by
/// resume, with no container left that no state file's supervisor runs.
#[test]
fn a_container_rollout_killed_after_any_action_is_finished_by_resume() {
    let covered = every_action(Scenario {
        setup: &|site| {
            crate::containers::installed_images(site);
            // The test policy, with a deadline a container meets on a loaded machine.
            let file = policy(site, 34, 0);
            let text = std::fs::read_to_string(&file).unwrap().replace(
                "\"progress_deadline_ms\": 3000",
                "\"progress_deadline_ms\": 30000",
            );
            std::fs::write(&file, text).unwrap();
            let range = ten_ports(44);
            let out = rollgate_run(
                site,
                &[
                    "rollout",
                    "edge-svc",
                    "v1",
                    "--replicas",
                    "3",
                    "--ports",
                    &range,
                    "--policy",
                    file.to_str().unwrap(),
                ],
                None,
            );
            assert_eq!(out.status.code(), Some(0), "{}", said(&out));
            std::fs::remove_file(hooks_out(site)).unwrap();
        },
        run: &rollout_v2,
        next: &resume,
        undone: None,
        starts_anew: true,
    });
    assert!(covered > 10, "only {covered} actions");
}

#[test]
fn a_deploy_switched_back_in_its_watch_killed_after_any_action_ends_on_the_old_release() {
    let covered = every_action(Scenario {
        setup: &|site| deployed_v1(site, 5, "--unready-after-ms 150"),
        run: &deploy_v2(5),
        next: &up,
        // A watch cut short is decided by one final probe, which may come before v2 goes bad.
        undone: Some(End {
            pool: vec!["v2".into()],
            phase: None,
            outcomes: vec!["promoted".into()],
        }),
        starts_anew: true,
    });
    assert!(covered > 5, "only {covered} actions");
}

#[test]
fn a_bad_canary_that_pauses_the_rollout_killed_after_any_action_ends_paused_on_v1() {
    let covered = every_action(Scenario {
        setup: &|site| {
            install(site, 6, 3, 34, 0);
            fails_on_slot(site, "v2", 0);
        },
        run: &rollout_v2,
        next: &up,
        undone: None,
        starts_anew: true,
    });
    assert!(covered > 5, "only {covered} actions");
}

#[test]
fn a_required_replica_failing_killed_after_any_action_ends_aborted_on_v1() {
    let covered = every_action(Scenario {
        setup: &|site| {
            install(site, 7, 3, 34, 0);
            fails_on_slot(site, "v2", 2);
            let path = site.root().join("policy.json");
            let mut policy: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            policy["edge_svc"]["classes"] = serde_json::json!({"2": "required"});
            std::fs::write(&path, policy.to_string()).unwrap();
        },
        run: &rollout_v2,
        next: &resume,
        undone: None,
        starts_anew: true,
    });
    assert!(covered > 5, "only {covered} actions");
}

#[test]
fn a_promote_of_an_escalated_deploy_killed_after_any_action_is_finished_by_promoting_again() {
    let promote = |_: &Site| args(&["promote", "edge-svc"]);
    let covered = every_action(Scenario {
        setup: &|site| {
            deployed_v1(site, 8, "--ready-after-ms 600000");
            let policy = write(
                site.root(),
                "escalate.json",
                r#"{"edge_svc": {"progress_deadline_ms": 300, "poll_ms": 50, "on_stall": "escalate",
                    "max_surge_pct": 100, "max_unavailable_pct": 0, "watch_ms": 0,
                    "drain_timeout_ms": 0, "stop_grace_ms": 1000}}"#,
            );
            let port = (first_port(8) + 1).to_string();
            let policy = policy.to_str().unwrap();
            let out = rollgate_run(
                site,
                &["deploy", "edge-svc", &port, "v2", "--policy", policy],
                None,
            );
            assert_eq!(out.status.code(), Some(3), "escalated: {}", said(&out));
        },
        run: &promote,
        next: &promote,
        undone: None,
        starts_anew: false,
    });
    assert!(covered > 3, "only {covered} actions");
}

/// A root with a trust file, v1 and v2 signed (sequences 1 and 2) and two replicas of v1
/// installed: the floor is v1's.
fn signed_install(site: &Site, block: u16) {
    site.release("v1", "");
    site.release("v2", "");
    let key = site.root().join("signer.pem");
    let out = rollgate()
        .args(["release", "keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let pin = stdout(&out).lines().next().unwrap().to_string();
    write(
        site.root(),
        "trust.json",
        &serde_json::json!({"pins": [pin], "threshold": 1}).to_string(),
    );
    for (version, sequence) in [("v1", "1"), ("v2", "2")] {
        let out = rollgate()
            .args(["release", "sign"])
            .arg(site.root().join("releases").join(version))
            .args([
                "--service",
                "edge-svc",
                "--version",
                version,
                "--sequence",
                sequence,
            ])
            .arg("--key")
            .arg(&key)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    }
    install_v1(site, block, 2, 50, 0);
}

#[test]
fn a_signed_rollout_killed_after_any_action_raises_the_floor_once_it_completes() {
    let covered = every_action(Scenario {
        setup: &|site| signed_install(site, 9),
        run: &rollout_v2,
        next: &resume,
        undone: None,
        starts_anew: true,
    });
    assert!(covered > 10, "only {covered} actions");
}

/// Issue 68, 6: `run` killed after its K-th persisted action for every K (then once with no
/// crash), each followed by `next`; `check` then holds the root to what the command promises.
/// Returns how many action indexes there were.
fn every_action_of(
    setup: &dyn Fn(&Site),
    run: &[&str],
    next: &[&str],
    check: &dyn Fn(&Site, u64),
) -> u64 {
    let mut k = 1;
    loop {
        let site = Site::new();
        setup(&site);
        let out = rollgate_run(&site, run, Some(k));
        if !killed(&out) {
            check(&site, 0);
            return k - 1;
        }
        let then = rollgate_run(&site, next, None);
        assert!(!killed(&then), "{}", said(&then));
        check(&site, k);
        k += 1;
    }
}

fn v1_live(site: &Site) {
    site.release("v1", "");
    let out = rollgate_run(
        site,
        &[
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v1",
            "--watch-ms",
            "0",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
}

/// One release process runs, the one `current` names, kept by one keeper, answering as v1.
fn assert_one_kept_v1(site: &Site, k: u64) {
    let pointer = site.pointer().expect("current");
    let pid = pointer["pid"].as_i64().unwrap() as i32;
    assert!(
        wait_for(10, || site.processes() == vec![pid]
            && site.keepers().len() == 1),
        "K={k}: processes {:?} (current names {pid}), keepers {:?}",
        site.processes(),
        site.keepers()
    );
    let port = pointer["port"].as_u64().unwrap() as u16;
    assert_eq!(version_on(port).as_deref(), Some("v1"), "K={k}");
}

/// `stop` killed after any of its actions, then run again: nothing of the service runs (no
/// keeper either), the stop is recorded and logged, and `up` (a boot) leaves it stopped.
#[test]
fn a_stop_killed_after_any_action_is_finished_by_stopping_again() {
    let stop = ["stop", "edge-svc"];
    let covered = every_action_of(&v1_live, &stop, &stop, &|site, k| {
        assert!(
            wait_for(10, || site.processes().is_empty()
                && site.keepers().is_empty()),
            "K={k}: {:?} {:?}",
            site.processes(),
            site.keepers()
        );
        assert!(site.root().join("stopped.json").is_file(), "K={k}");
        assert!(count_events(site, "stopped", "v1") >= 1, "K={k}");
        let out = rollgate_run(site, &["up"], None);
        assert_eq!(out.status.code(), Some(0), "K={k}: {}", said(&out));
        assert!(
            site.processes().is_empty(),
            "K={k}: up started a stopped service"
        );
    });
    assert!(covered >= 3, "{covered}");
}

/// `stop` of a service whose crash-looping release has a standby beside it (the release live
/// before it), killed after any of its actions, then run again: nothing runs — the standby
/// neither — and `current` names no fallback.
#[test]
fn a_stop_beside_a_standby_killed_after_any_action_leaves_nothing_running() {
    let with_a_standby = |site: &Site| {
        site.release("v1", "");
        site.crashing_release("v2", 2500);
        let policy = write(
            site.root(),
            "policy.json",
            r#"{"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 50, "on_stall": "rollback",
                "max_surge_pct": 100, "max_unavailable_pct": 0, "watch_ms": 0,
                "crash_loop": {"restarts": 10, "within_ms": 120000}}}"#,
        );
        for version in ["v1", "v2"] {
            let port = free_port().to_string();
            let args = [
                "deploy",
                "edge-svc",
                &port,
                version,
                "--policy",
                policy.to_str().unwrap(),
            ];
            let out = rollgate_run(site, &args, None);
            assert_eq!(out.status.code(), Some(0), "{}", said(&out));
        }
        site.arm("v2");
        assert!(
            wait_for(20, || site
                .pointer()
                .is_some_and(|p| p["fallback"]["standby"] == true)),
            "{:?}",
            site.events()
        );
    };
    let stop = ["stop", "edge-svc"];
    let covered = every_action_of(&with_a_standby, &stop, &stop, &|site, k| {
        assert!(
            wait_for(10, || site.processes().is_empty()),
            "K={k}: {:?} {:?}",
            site.processes(),
            site.events()
        );
        assert!(
            site.pointer().unwrap().get("fallback").is_none(),
            "K={k}: {:?}",
            site.pointer()
        );
    });
    assert!(covered >= 4, "{covered}");
}

/// `start` killed after any of its actions, then run again: the live release runs once, kept
/// once, the stop lifted and the start logged.
#[test]
fn a_start_killed_after_any_action_is_finished_by_starting_again() {
    let stopped = |site: &Site| {
        v1_live(site);
        let out = rollgate_run(site, &["stop", "edge-svc"], None);
        assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    };
    let start = ["start", "edge-svc"];
    let covered = every_action_of(&stopped, &start, &start, &|site, k| {
        assert_one_kept_v1(site, k);
        assert!(!site.root().join("stopped.json").exists(), "K={k}");
        assert!(count_events(site, "started", "v1") >= 1, "K={k}");
    });
    assert!(covered >= 3, "{covered}");
}

/// `restart` killed after any of its actions, then `up`: one fresh or old process of v1 runs,
/// named by `current`, kept once — never two copies, never one unkept.
#[test]
fn a_restart_killed_after_any_action_is_finished_or_undone_by_up() {
    // Ports of the test's own (a range from 20000 would take the rollout tests' blocks).
    let first = port_block(10);
    let range = format!("{first}-{}", first + 9);
    let restart = ["restart", "edge-svc", "--watch-ms", "0", "--ports", &range];
    let covered = every_action_of(&v1_live, &restart, &["up"], &|site, k| {
        assert_one_kept_v1(site, k);
    });
    assert!(covered >= 3, "{covered}");
}
