//! `rollgate release list` (issue 37.4): every installed release with its record, its last
//! outcome and what it is to the root now.

use crate::common::*;

use serde_json::Value;

pub(crate) fn list(site: &Site) -> Vec<Value> {
    let out = rollgate()
        .args(["release", "list", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `rollgate deploy edge-svc VERSION --ports PORTS EXTRA... --root ROOT`.
fn deploy(site: &Site, version: &str, ports: &str, extra: &[&str]) -> std::process::Output {
    rollgate()
        .args(["deploy", "edge-svc", version, "--ports", ports])
        .args(extra)
        .arg("--root")
        .arg(site.root())
        .output()
        .unwrap()
}

fn marks(listed: &[Value], version: &str) -> Vec<String> {
    let found = listed
        .iter()
        .find(|l| l["version"] == version)
        .unwrap_or_else(|| panic!("{version} listed: {listed:?}"));
    found["marks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn installed_releases_are_listed_with_their_outcome_and_what_they_are_now() {
    let site = Site::new();
    for (version, args) in [("v1", ""), ("v2", ""), ("v3", "--ready-after-ms 60000")] {
        site.add_sample(version, args);
    }
    // One put in by hand (no record), and a staging folder a dead installer left.
    site.release("v0", "");
    std::fs::create_dir_all(site.root().join("releases/.staging-v9-999999")).unwrap();
    let first = first_of(30);
    let ports = format!("{first}-{}", first + 1);
    for version in ["v1", "v2", "v3"] {
        deploy(&site, version, &ports, &[]);
    }
    let listed = list(&site);
    let versions: Vec<&str> = listed
        .iter()
        .map(|l| l["version"].as_str().unwrap())
        .collect();
    assert_eq!(versions.len(), 4, "{versions:?}");
    assert!(!versions.iter().any(|v| v.starts_with('.')), "{versions:?}");
    assert_eq!(marks(&listed, "v2"), ["live"]);
    assert_eq!(
        marks(&listed, "v1"),
        ["last_good"],
        "what a rollback would go to"
    );
    assert!(marks(&listed, "v3").is_empty());
    let v3 = listed.iter().find(|l| l["version"] == "v3").unwrap();
    assert_eq!(v3["last_outcome"], "rolled_back");
    let v2 = listed.iter().find(|l| l["version"] == "v2").unwrap();
    assert_eq!(v2["last_outcome"], "promoted");
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(site.root().join("releases/v2/release.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(v2["sha256"], record["sha256"]);
    assert_eq!(v2["size"], record["size"]);
    // The one put in by hand: no record, its digest computed, no outcome.
    let v0 = listed.iter().find(|l| l["version"] == "v0").unwrap();
    assert_eq!(v0["size"], Value::Null);
    assert_eq!(v0["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(v0["last_outcome"], Value::Null);

    // The table names the same.
    let out = rollgate()
        .args(["release", "list", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let table = stdout(&out);
    assert!(
        table.contains("last_good") && table.contains("live") && table.contains("rolled_back"),
        "{table}"
    );
}

#[test]
fn a_replica_roots_releases_are_marked_as_running_in_a_replica() {
    let site = Site::new();
    site.release("v1", "");
    site.replicas_of("v1", 2, 31);
    let listed = list(&site);
    assert!(
        marks(&listed, "v1").contains(&"replica".to_string()),
        "{listed:?}"
    );
}

fn installed(site: &Site) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(site.root().join("releases"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    names.sort();
    names
}

/// Issue 37.5: thirty deploys, then `release prune --keep 3`: the three newest stay, and of the
/// older ones only those the root still needs (the live one, the last good one); never one
/// that runs. `--dry-run` removes nothing.
#[test]
fn prune_keeps_the_newest_and_every_release_the_root_still_needs() {
    let site = Site::new();
    let first = first_of(32);
    let ports = format!("{first}-{}", first + 1);
    // keep_releases = 0: every release stays until the prune this test is about.
    let elsewhere = tempfile::tempdir().unwrap();
    let keep_all = write(
        elsewhere.path(),
        "keep-all.json",
        r#"{"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 100, "max_unavailable_pct": 0, "max_surge_pct": 100, "on_stall": "rollback", "keep_releases": 0}}"#,
    );
    let keep_all = ["--policy", keep_all.to_str().unwrap()];
    for n in 1..=30 {
        let version = format!("v{n:02}");
        site.add_sample(&version, "");
        let out = deploy(
            &site,
            &version,
            &ports,
            &[&["--watch-ms", "0"][..], &keep_all].concat(),
        );
        assert_eq!(out.status.code(), Some(0), "{version}: {}", stderr(&out));
    }
    // Two more installed after the live one, never deployed: the newest three are v31, v32
    // and the live v30; v29 is the last good one.
    site.add_sample("v31", "");
    site.add_sample("v32", "");
    let prune = |extra: &[&str]| {
        rollgate()
            .args(["release", "prune", "--keep", "3", "--root"])
            .arg(site.root())
            .args(extra)
            .output()
            .unwrap()
    };
    let out = prune(&["--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("would remove: v01 v02"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("kept v29: last_good"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        site.release_folders().len(),
        32,
        "a dry run removes nothing"
    );
    let out = prune(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Renamed out at once; their files deleted in the background.
    assert_eq!(site.release_folders(), ["v29", "v30", "v31", "v32"]);
    assert_eq!(site.pointer().unwrap()["version"], "v30");
    let live = site.live_pid().unwrap();
    assert!(alive(live), "the live release runs on");
    // And a rollback still has somewhere to go.
    let out = rollgate()
        .args(["rollback", "edge-svc", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v29");
}

/// A prune killed at any moment leaves every version it did not finish removing whole (its
/// tree digest is its record's), and the next prune finishes the job.
#[test]
fn a_prune_killed_at_any_moment_leaves_nothing_half_removed() {
    let site = Site::new();
    let work = tempfile::tempdir().unwrap();
    let folder = work.path().join("big");
    std::fs::create_dir_all(folder.join("data")).unwrap();
    let bin = crate::common::bin();
    write(
        &folder,
        "edge-svc",
        &format!("#!/bin/sh\nexec '{}' sample-service\n", bin.display()),
    );
    std::fs::set_permissions(
        folder.join("edge-svc"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    for i in 0..150 {
        write(&folder, &format!("data/f{i}"), "x");
    }
    for round in 0..6u64 {
        for n in 0..4 {
            let out = rollgate()
                .args(["release", "add", "edge-svc", &format!("r{round}-{n}")])
                .arg(&folder)
                .arg("--root")
                .arg(site.root())
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        }
        let mut child = std::process::Command::new(&bin)
            .args(["release", "prune", "--keep", "0", "--root"])
            .arg(site.root())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(round * 15));
        send_signal(child.id() as i32, 9);
        let _ = child.wait();
        for name in installed(&site).iter().filter(|n| !n.starts_with('.')) {
            // Whole: its record and every one of its files are there.
            let dir = site.root().join("releases").join(name);
            assert!(dir.join("release.json").is_file(), "{name} lost its record");
            assert!(dir.join("edge-svc").is_file(), "{name} lost its executable");
            let files = std::fs::read_dir(dir.join("data")).map_or(0, |d| d.count());
            assert_eq!(files, 150, "{name} is half-removed");
        }
    }
    let out = rollgate()
        .args(["release", "prune", "--keep", "0", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Renamed out at once; their files deleted by the sweep in the background (issue 81).
    assert!(
        installed(&site).iter().all(|n| n.starts_with(".removing-")),
        "{:?}",
        installed(&site)
    );
    assert!(
        wait_for(20, || installed(&site).is_empty()),
        "{:?}",
        installed(&site)
    );
}

/// Issue 37.5: the policy's `keep_releases` prunes after each promotion: thirty deploys with
/// `keep_releases: 3` leave the three newest and what the root still needs, never one that runs.
#[test]
fn keep_releases_prunes_after_each_promotion_and_never_what_runs() {
    let site = Site::new();
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 0\n  keep_releases: 3\n",
    );
    let first = first_of(33);
    let ports = format!("{first}-{}", first + 1);
    for n in 1..=30 {
        let version = format!("v{n:02}");
        site.add_sample(&version, "");
        let out = deploy(
            &site,
            &version,
            &ports,
            &["--policy", policy.to_str().unwrap()],
        );
        assert_eq!(out.status.code(), Some(0), "{version}: {}", stderr(&out));
        // Versions: a pruned one renamed out is being deleted in the background (issue 81).
        let kept: Vec<String> = installed(&site)
            .into_iter()
            .filter(|n| !n.starts_with(".removing-"))
            .collect();
        assert!(kept.len() <= 4, "after {version}: {kept:?}");
        assert!(kept.contains(&version), "the live one stays: {kept:?}");
        assert!(alive(site.live_pid().unwrap()));
    }
    assert!(
        wait_for(20, || installed(&site) == ["v28", "v29", "v30"]),
        "{:?}",
        installed(&site)
    );
    // A bound outside the contract is refused before anything starts.
    let bad = write(
        site.root(),
        "bad.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  keep_releases: 5000\n",
    );
    let out = rollgate()
        .args(["policy", "check"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stdout(&out).contains("keep_releases must be an integer from 0 to 1000"),
        "{}",
        stdout(&out)
    );
}

/// The sum of the sizes of `output/VERSION/edge-svc.output*`, and how many files there are.
fn output_on_disk(site: &Site, version: &str) -> (u64, usize) {
    let dir = site.root().join("output").join(version);
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("edge-svc.output")
        })
        .filter_map(|e| e.metadata().ok())
        .fold((0, 0), |(bytes, files), m| (bytes + m.len(), files + 1))
}

/// Issue 37.5: a release's output is bounded by the policy's `output_max_bytes` ×
/// `output_keep`, rotated in whole lines, however fast it writes and after rollgate has exited;
/// a failing release's rollback reason still quotes its last words; nothing of the pump is
/// left once the release is gone.
#[test]
fn a_release_output_is_rotated_by_size_and_a_failing_one_still_quoted() {
    let site = Site::new();
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 0\n  output_max_bytes: 1048576\n  output_keep: 3\n",
    );
    let bin = crate::common::bin();
    let line = "a line of output from v1, as fast as a busy release writes it";
    // About 20 MB/s from a child of the release, for as long as the release runs.
    site.add_release(
        "v1",
        &format!(
            "( while kill -0 $$ 2>/dev/null; do yes '{line}' | head -n 32000; sleep 0.1; done ) &\nexec '{}' sample-service\n",
            bin.display()
        ),
    );
    let first = first_of(34);
    let ports = format!("{first}-{}", first + 1);
    let out = deploy(&site, "v1", &ports, &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pid = site.live_pid().unwrap();
    // rollgate has exited: the bound holds all the same, for seconds of writing.
    let bound = 3 * 1_048_576;
    for _ in 0..40 {
        let (bytes, files) = output_on_disk(&site, "v1");
        assert!(bytes <= bound, "{bytes} bytes in {files} files");
        assert!(files <= 3, "{files} files");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let rotated = site.root().join("output/v1/edge-svc.output.2");
    let older = std::fs::read_to_string(&rotated).unwrap();
    assert!(older.len() > 1_000_000, "a full file: {}", older.len());
    assert!(
        older.lines().all(|l| timed(l) && &l[25..] == line),
        "whole lines only, each with its time"
    );
    assert!(alive(pid), "the release runs on");

    // A release that says a lot, then its last words, and exits: the reason quotes them.
    site.add_release(
        "v2",
        "yes 'v2 talks a lot at boot' | head -c 3000000\necho 'v2 last words: the config is wrong'\nexit 3\n",
    );
    let out = deploy(&site, "v2", &ports, &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let detail = site.last_detail();
    assert!(
        detail.contains("v2 last words: the config is wrong"),
        "{detail}"
    );
    let (bytes, _) = output_on_disk(&site, "v2");
    assert!(bytes <= bound, "{bytes}");

    // Once the release and its writer are gone (its keeper first: nothing starts it again),
    // so is its pump.
    site.kill_keepers();
    send_signal(-pid, 9);
    let pump_of = site.root().join("output/v1/edge-svc.output");
    let marker = pump_of.to_str().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while a_process_mentions(marker) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!a_process_mentions(marker), "the pump outlived its release");
}

/// Issue 67, 7: a broken release that never went live used to block its version name for
/// good (prune keeps the newest, and there was no other way out). `release rm` removes it;
/// a release the root needs is refused with its marks, and nothing is removed.
#[test]
fn release_rm_frees_a_broken_versions_name_and_refuses_what_the_root_needs() {
    let site = Site::new();
    let first = port_block(2);
    let ports = format!("{first}-{}", first + 1);
    site.add_sample("v1", "");
    assert_eq!(deploy(&site, "v1", &ports, &[]).status.code(), Some(0));
    site.add_release("v2", "exit 3\n");
    let out = deploy(&site, "v2", &ports, &["--deadline-ms", "1500"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let rm = |version: &str, extra: &[&str]| {
        rollgate()
            .args(["release", "rm", version, "--root"])
            .arg(site.root())
            .args(extra)
            .output()
            .unwrap()
    };
    // The live one stays, said with its marks.
    let out = rm("v1", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(stderr(&out).contains("v1 is live"), "{}", stderr(&out));
    assert!(site.root().join("releases/v1/edge-svc").is_file());
    // Not installed: refused.
    let out = rm("v9", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no release v9"), "{}", stderr(&out));
    // A dry run removes nothing.
    let out = rm("v2", &["--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "would remove: v2\n");
    assert!(site.root().join("releases/v2").is_dir());
    let out = rm("v2", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "removed: v2\n");
    assert!(!site.root().join("releases/v2").exists());
    assert!(list(&site).iter().all(|l| l["version"] != "v2"));
    // Issue 81: its files are deleted out of the command's time, by a process of its own; a
    // folder a deletion left (its remover killed) is finished by the next one.
    let left = site.root().join("releases/.removing-v0-999999999");
    std::fs::create_dir_all(left.join("venv/lib")).unwrap();
    std::fs::write(left.join("venv/lib/x.py"), "x").unwrap();
    let hidden = || {
        std::fs::read_dir(site.root().join("releases"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".removing-"))
            .count()
    };
    site.add_release("v3", "exit 3\n");
    assert_eq!(rm("v3", &[]).status.code(), Some(0));
    assert!(
        wait_for(10, || hidden() == 0),
        "{} hidden folders left",
        hidden()
    );
    // The name is free: a fixed build goes in under it, and deploys.
    site.add_sample("v2", "");
    assert_eq!(deploy(&site, "v2", &ports, &[]).status.code(), Some(0));
    assert_eq!(site.pointer().unwrap()["version"], "v2");
}
