//! `rollgate rollback SVC`: back to the release live before the current one, through the gate,
//! for a single release and for a replica set; refused when there is none.

use crate::common::*;

use std::time::Duration;

fn rollback(site: &Site, extra: &[&str]) -> std::process::Output {
    rollgate()
        .args(["rollback", "edge-svc", "--root"])
        .arg(site.root())
        .args(extra)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap()
}

#[test]
fn rollback_brings_the_previous_release_back_through_the_gate() {
    let site = Site::new();
    site.release("v1", "--ready-after-ms 150");
    site.release("v2", "");
    let v1_port = free_port();
    assert_eq!(site.deploy(v1_port, "v1", &[]).status.code(), Some(0));
    let first_v1 = site.live_pid().unwrap();
    assert_eq!(
        site.deploy(free_port(), "v2", &["--watch-ms", "0"])
            .status
            .code(),
        Some(0)
    );
    let v2 = site.live_pid().unwrap();
    assert!(wait_for(5, || !alive(first_v1)));

    let out = rollback(&site, &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("back from v2 to v1"),
        "{}",
        stderr(&out)
    );
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["version"], "v1");
    assert_eq!(pointer["port"], v1_port, "on the port it was live on");
    assert_eq!(version_on(v1_port).as_deref(), Some("v1"));
    assert!(wait_for(5, || !alive(v2)));
    // A fresh v1 that went through the gate: started, probed until ready (150 ms), promoted.
    let lines = site.log_lines();
    let tail: Vec<(&str, &str)> = lines[lines.len() - 3..]
        .iter()
        .map(|l| (l["event"].as_str().unwrap(), l["version"].as_str().unwrap()))
        .collect();
    // Then (issue 58) the release users had is on the record as rolled back: a rollback used
    // to read as an ordinary promotion of the older release.
    assert_eq!(
        tail,
        [
            ("candidate_started", "v1"),
            ("promoted", "v1"),
            ("rolled_back", "v2")
        ]
    );
    // Probed until ready: more than one probe (its gate clock starts after the spawn, so its
    // elapsed time can read under the 150 ms a loaded machine took to start it).
    let promoted = lines[lines.len() - 2]["detail"].as_str().unwrap();
    assert!(
        promoted.starts_with("ready after ") && !promoted.contains("(1 probe)"),
        "{promoted}"
    );
    let back = lines.last().unwrap();
    assert_eq!(back["exposure"]["ended_by"], "a person (rollgate rollback)");
    assert!(back["exposure"]["live_s"].as_f64().unwrap() > 0.0, "{back}");
    assert!(
        back["detail"].as_str().unwrap().starts_with(
            "rolled back after its promotion by rollgate rollback, back to v1; users had it for "
        ),
        "{back}"
    );
    let log = site.root().join("deploy.log");
    let read = |args: &[&str]| {
        let out = rollgate().args(args).arg(&log).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stdout(&out)
    };
    // Only `promoted` changes what is live: v1, for the summary and for "live at".
    assert!(read(&["log", "summary"]).contains("\"live\":\"v1\""));
    let v2 = read(&["log", "history", "--format", "json"])
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["version"] == "v2")
        .unwrap();
    assert_eq!(v2["outcome"], "promoted", "{v2}");
    assert!(v2["rolled_back_at"].is_number(), "{v2}");
    assert!(v2["exposure_s"].as_f64().unwrap() > 0.0, "{v2}");
    assert_eq!(v2["ended_by"], "a person (rollgate rollback)", "{v2}");
    let stats: serde_json::Value =
        serde_json::from_str(&read(&["log", "stats", "--format", "json"])).unwrap();
    let had = &stats["rolled_back_after_users_had_them"];
    assert_eq!(had.as_array().unwrap().len(), 1, "{stats}");
    assert_eq!(had[0]["how"], "after promotion", "{stats}");
    assert!(read(&["log", "stats"]).contains("rolled back after users had them"));
}

#[test]
fn rollback_refuses_when_there_is_nothing_to_go_back_to() {
    let site = Site::new();
    let out = rollback(&site, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("nothing of edge-svc is live"),
        "{}",
        stderr(&out)
    );

    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let before = site.log_lines().len();
    let out = rollback(&site, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no release of edge-svc was live before v1"),
        "{}",
        stderr(&out)
    );
    assert_eq!(site.log_lines().len(), before, "nothing was started");

    // The earlier release removed from the host: refused, naming it.
    site.release("v2", "");
    assert_eq!(
        site.deploy(free_port(), "v2", &["--watch-ms", "0"])
            .status
            .code(),
        Some(0)
    );
    std::fs::remove_dir_all(site.root().join("releases/v1")).unwrap();
    let out = rollback(&site, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no longer installed (v1)"),
        "{}",
        stderr(&out)
    );
    assert_eq!(site.pointer().unwrap()["version"], "v2");
}

#[test]
fn rollback_moves_a_replica_set_back_with_a_rollout() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "");
    let first = port_block(20);
    let ports = format!("{first}-{}", first + 19);
    for version in ["v1", "v2"] {
        let out = site.rollout(version, &["--replicas", "3", "--ports", &ports]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let out = rollback(&site, &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let versions = replica_versions(&site);
    assert_eq!(versions, ["v1", "v1", "v1"]);
}

/// Issue 67, 1: the policy belongs to the service. A deploy given `--policy` keeps it in the
/// root beside its release; a rollback and a deploy given none run under it — the user the
/// live release runs as and its limits, not the defaults (a rollback that forgot the user
/// once gave the state to another uid and broke the live service). `policy show` prints it.
#[test]
fn a_rollback_and_a_deploy_without_policy_run_under_the_policy_kept_in_the_root() {
    let site = Site::new();
    let policy = isolation_policy(&site, 20_000, r#"{"user": "nobody", "memory_mb": 256}"#);
    let uid_of = |pid: i32| -> String {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let ids = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap();
        ids.split_whitespace().next().unwrap().to_string()
    };
    for version in ["v1", "v2"] {
        site.release(version, "");
        let out = site.deploy(free_port(), version, &["--policy", &policy]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(uid_of(site.live_pid().unwrap()), "65534");
    }
    let out = rollback(&site, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("no --policy: the service's policy, kept in the root (entry edge_svc of"),
        "{}",
        stderr(&out)
    );
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    let live = site.live_pid().unwrap();
    assert_eq!(
        uid_of(live),
        "65534",
        "the rollback kept the service's user"
    );
    assert_eq!(site.pointer().unwrap()["limits"]["memory_mb"], 256);

    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(uid_of(site.live_pid().unwrap()), "65534");

    let shown = rollgate()
        .args(["policy", "show", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["version"], "v3");
    assert_eq!(shown["kept"]["entry"], "edge_svc");
    assert_eq!(shown["kept"]["value"]["isolation"]["user"], "nobody");
    let file = std::fs::read(&policy).unwrap();
    use sha2_010::Digest;
    let digest: String = sha2_010::Sha256::digest(&file)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(shown["kept"]["sha256"], digest.as_str());

    // Every attempt's lines name the policy it ran under; `log history` and `status` too.
    let named: Vec<serde_json::Value> = site
        .log_lines()
        .into_iter()
        .filter(|l| {
            l["version"] == "v3" && (l["event"] == "candidate_started" || l["event"] == "promoted")
        })
        .map(|l| l["policy"].clone())
        .collect();
    assert_eq!(named, [digest.as_str(), digest.as_str()]);
    let history = rollgate()
        .args(["log", "history", "--format", "json"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    assert!(
        stdout(&history)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .all(|a| a["policy"] == digest.as_str()),
        "{}",
        stdout(&history)
    );
    let status = rollgate()
        .args(["status", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["policy"]["sha256"], digest.as_str(), "{status}");
    assert_eq!(status["policy"]["entry"], "edge_svc", "{status}");

    // A different --policy in a dry run: what it would change, field by field.
    let wider = isolation_policy(&site, 20_000, r#"{"user": "nobody", "memory_mb": 512}"#);
    site.release("v4", "");
    let out = site.deploy(free_port(), "v4", &["--policy", &wider, "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!(
            "policy changes against the service's kept policy (sha256 {})",
            &digest[..12]
        )) && stdout(&out).contains("\n  isolation.memory_mb: 256 → 512\n"),
        "{}",
        stdout(&out)
    );
    assert!(!stdout(&out).contains("isolation.user"), "{}", stdout(&out));
}

/// Issue 67, 7: a release a person rolled back out of production is never the one to go back
/// to: after `rollback` from v2 to v1, a second `rollback` is refused (it used to bring v2, the
/// bad one, back) and `release list` marks no release last_good.
#[test]
fn a_second_rollback_never_brings_back_the_release_the_first_took_out() {
    let site = Site::new();
    for version in ["v1", "v2"] {
        site.release(version, "");
        let out = site.deploy(free_port(), version, &[]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let out = rollback(&site, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    let out = rollback(&site, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing to roll back to"),
        "{}",
        stderr(&out)
    );
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    let listed = rollgate()
        .args(["release", "list", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert!(
        !stdout(&listed).contains("last_good"),
        "{}",
        stdout(&listed)
    );
}

/// Issue 68, 4: `restart` — a fresh process of the live release beside the running one,
/// gated, switched, the old one drained: 0 failed requests through the proxy under load.
#[test]
fn restart_replaces_the_live_process_with_a_fresh_one_and_no_failed_request() {
    use crate::common::http::{assert_none_failed, Load, Proxy};
    let site = Site::new();
    site.add_sample("v1", "");
    let first = port_block(2);
    let ports = format!("{first}-{}", first + 1);
    let out = rollgate()
        .args(["deploy", "edge-svc", "v1", "--ports", &ports, "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let before = site.live_pid().unwrap();
    let proxy = Proxy::start(&site, &[]);
    let load = Load::start(proxy.port, 4, std::time::Duration::from_millis(5));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = rollgate()
        .args([
            "restart",
            "edge-svc",
            "--ports",
            &ports,
            "--watch-ms",
            "0",
            "--root",
        ])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_none_failed(&load.finish(), "the restart");
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["version"], "v1");
    assert_ne!(pointer["pid"], before);
    assert!(wait_for(10, || !alive(before)));
    // Nothing live: refused.
    let empty = Site::new();
    let out = rollgate()
        .args(["restart", "edge-svc", "--root"])
        .arg(empty.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Issue 68, 4, on a replica root: every replica gets a fresh process of the version it runs,
/// within the rollout's budgets, and users through the proxy see no failure.
#[test]
fn restart_of_a_replica_root_gives_each_replica_a_fresh_process_with_no_failed_request() {
    use crate::common::http::{assert_none_failed, Load, Proxy};
    let site = Site::new();
    site.release("v1", "");
    let first = port_block(20);
    let ports = format!("{first}-{}", first + 19);
    let out = site.rollout("v1", &["--replicas", "3", "--ports", &ports]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pids = || -> Vec<i64> {
        let set: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(site.root().join("replicas.json")).unwrap(),
        )
        .unwrap();
        set["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["pid"].as_i64().unwrap())
            .collect()
    };
    let before = pids();
    let proxy = Proxy::start(&site, &[]);
    let load = Load::start(proxy.port, 4, std::time::Duration::from_millis(5));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = rollgate()
        .args(["restart", "edge-svc", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_none_failed(&load.finish(), "the replicas' restart");
    assert_eq!(replica_versions(&site), ["v1", "v1", "v1"]);
    let after = pids();
    assert!(
        after.iter().all(|p| !before.contains(p)),
        "{before:?} -> {after:?}"
    );
}
