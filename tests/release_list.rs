//! `rollgate release list` (issue 37.4): every installed release with its record, its last
//! outcome and what it is to the root now.

mod common;
use common::*;

use serde_json::Value;

fn list(site: &Site) -> Vec<Value> {
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
    let work = tempfile::tempdir().unwrap();
    let bin = assert_cmd::cargo::cargo_bin("rollgate");
    for (version, args) in [("v1", ""), ("v2", ""), ("v3", " --ready-after-ms 60000")] {
        let exe = write(
            work.path(),
            version,
            &format!("#!/bin/sh\nexec '{}' sample-service{args}\n", bin.display()),
        );
        std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let out = rollgate()
            .args(["release", "add", "edge-svc", version])
            .arg(&exe)
            .arg("--root")
            .arg(site.root())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    // One put in by hand (no record), and a staging folder a dead installer left.
    site.release("v0", "");
    std::fs::create_dir_all(site.root().join("releases/.staging-v9-999999")).unwrap();
    let first = port_block(2);
    let ports = format!("{first}-{}", first + 1);
    for version in ["v1", "v2", "v3"] {
        rollgate()
            .args(["deploy", "edge-svc", version, "--ports", &ports, "--root"])
            .arg(site.root())
            .output()
            .unwrap();
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
    let first = port_block(10);
    let out = rollgate()
        .args([
            "rollout",
            "edge-svc",
            "v1",
            "--replicas",
            "2",
            "--ports",
            &format!("{first}-{}", first + 9),
            "--root",
        ])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let listed = list(&site);
    assert!(
        marks(&listed, "v1").contains(&"replica".to_string()),
        "{listed:?}"
    );
}
