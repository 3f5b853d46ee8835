//! Issue 80, 1: what runs is one record, `ROOT/formation.json` — every live process of the
//! release, web's with its port and each other type's — written by the engine alone, following
//! web's views (`current`, `replicas.json`) and mended by the next command after a crash between
//! the two writes; a root an older rollgate left (`processes.json`) is read as before and moved
//! to the formation by its next write.

use crate::common::*;

const POLICY: &str = "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 0\n  processes:\n    worker:\n      replicas: 2\n      min_ready_ms: 200\n";

fn formation_file(site: &Site) -> std::path::PathBuf {
    site.root().join("formation.json")
}

fn formation(site: &Site) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(formation_file(site)).unwrap()).unwrap()
}

/// One process the formation names.
#[derive(Debug, PartialEq)]
struct Entry {
    name: String,
    version: String,
    port: Option<u64>,
    pid: i64,
}

/// Each process the formation names, in its order.
fn entries(site: &Site) -> Vec<Entry> {
    formation(site)["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Entry {
            name: format!("{}.{}", p["process_type"].as_str().unwrap(), p["index"]),
            version: p["version"].as_str().unwrap().to_string(),
            port: p["port"].as_u64(),
            pid: p["pid"].as_i64().unwrap(),
        })
        .collect()
}

/// v1 (web and two workers) deployed; the policy's arguments for the commands after.
fn deployed(site: &Site) -> (u16, Vec<String>) {
    site.add_sample_with("v1", &[("Procfile", "worker: exec sleep 7770101\n")]);
    let policy = write(site.root(), "policy.yaml", POLICY);
    let policy = vec!["--policy".to_string(), policy.display().to_string()];
    let port = free_port();
    let args: Vec<&str> = policy.iter().map(String::as_str).collect();
    let out = site.deploy(port, "v1", &args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    (port, policy)
}

#[test]
fn the_formation_names_every_process_web_included_and_follows_a_keeper_s_restart() {
    let site = Site::new();
    let (port, _) = deployed(&site);
    let web = site.live_pid().unwrap();
    let names: Vec<(String, Option<u64>)> = entries(&site)
        .into_iter()
        .map(|e| (e.name, e.port))
        .collect();
    assert_eq!(
        names,
        [
            ("web.0".to_string(), Some(u64::from(port))),
            ("worker.0".to_string(), None),
            ("worker.1".to_string(), None),
        ]
    );
    let now = entries(&site);
    assert_eq!(now[0].pid, i64::from(web));
    assert!(now.iter().all(|e| e.version == "v1"), "{now:?}");
    assert!(now.iter().all(|e| alive(e.pid as i32)), "{now:?}");
    // Web killed: its keeper starts it again, and the formation names the new process as
    // `current` does (written with it, under the lock).
    send_signal(web, 9);
    assert!(wait_for(20, || site
        .live_pid()
        .is_some_and(|p| p != web && alive(p))));
    let new = site.live_pid().unwrap();
    assert!(
        wait_for(5, || entries(&site)[0].pid == i64::from(new)),
        "{:?}",
        entries(&site)
    );
    // And a worker's restart, the same.
    let worker = entries(&site)[1].pid as i32;
    send_signal(worker, 9);
    assert!(
        wait_for(20, || {
            let now = entries(&site);
            now[1].pid != i64::from(worker) && alive(now[1].pid as i32)
        }),
        "{:?}",
        entries(&site)
    );
}

#[test]
fn a_root_from_before_the_formation_is_read_and_moved_to_it_by_its_next_write() {
    let site = Site::new();
    let (_, policy) = deployed(&site);
    // As an older rollgate left it: the other types in `processes.json`, no formation.
    let mut legacy = formation(&site);
    let workers: Vec<serde_json::Value> = legacy["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["process_type"] != "web")
        .cloned()
        .collect();
    let kept: Vec<i64> = workers.iter().map(|w| w["pid"].as_i64().unwrap()).collect();
    legacy["processes"] = serde_json::Value::Array(workers);
    std::fs::write(
        site.root().join("processes.json"),
        serde_json::to_vec_pretty(&legacy).unwrap(),
    )
    .unwrap();
    std::fs::remove_file(formation_file(&site)).unwrap();
    // Read as before: `scale` finds both workers running and starts only the third.
    let mut args = vec!["scale", "edge-svc", "worker=3"];
    args.extend(policy.iter().map(String::as_str));
    let out = site.run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let now = entries(&site);
    let names: Vec<&str> = now.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["web.0", "worker.0", "worker.1", "worker.2"]);
    assert_eq!(now[1].pid, kept[0], "worker.0 kept its process");
    assert_eq!(now[2].pid, kept[1], "worker.1 kept its process");
    assert!(
        !site.root().join("processes.json").exists(),
        "the older file is gone once the formation holds what it said"
    );
}

#[test]
fn a_formation_a_crash_left_behind_web_s_view_is_mended_before_anything_acts() {
    let site = Site::new();
    deployed(&site);
    let live = site.live_pid().unwrap();
    // As a crash between `current`'s rename and the formation's leaves it: the formation
    // names another web process than `current` does.
    let mut stale = formation(&site);
    stale["processes"][0]["pid"] = serde_json::json!(live + 100_000);
    std::fs::write(
        formation_file(&site),
        serde_json::to_vec_pretty(&stale).unwrap(),
    )
    .unwrap();
    let out = site.run(&["up"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        entries(&site)[0].pid,
        i64::from(live),
        "{:?}",
        entries(&site)
    );
    // Nothing was started for the process it named: web is the one `current` names.
    assert_eq!(site.live_pid(), Some(live));
}
