//! `--dry-run` of deploy and rollout: the values and where each came from, the checks, and a
//! root left byte for byte as it was with no process started.

use crate::common::*;

use std::collections::BTreeMap;
use std::path::Path;

/// Every file under `dir`: relative path → (mode, bytes). Symlinks by their target.
fn snapshot(dir: &Path) -> BTreeMap<String, (u32, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let name = path.strip_prefix(dir).unwrap().display().to_string();
            if meta.is_dir() {
                files.insert(format!("{name}/"), (meta.permissions().mode(), Vec::new()));
                stack.push(path);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                files.insert(name, (0, target.display().to_string().into_bytes()));
            } else {
                files.insert(
                    name,
                    (meta.permissions().mode(), std::fs::read(&path).unwrap()),
                );
            }
        }
    }
    files
}

/// A root with v1 live and v2 installed; v2 leaves a mark in its folder if it is ever started.
fn site_with_v1_live() -> (Site, u16) {
    let site = Site::new();
    site.release("v1", "");
    let port = free_port();
    let out = site.deploy(port, "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The release's words reach its output file through the output pump, a moment after the
    // deploy returns: the snapshots the tests compare are taken once they are there.
    let output = site.root().join("output/v1/edge-svc.output");
    assert!(wait_for(10, || std::fs::read_to_string(&output)
        .is_ok_and(|text| text.contains("ready from"))));
    let bin = crate::common::bin();
    site.script(
        "v2",
        &format!(
            "touch \"$(dirname \"$0\")/started\"\nexec '{}' sample-service\n",
            bin.display()
        ),
    );
    (site, port)
}

fn dry_deploy(site: &Site, port: u16, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["--dry-run"];
    args.extend_from_slice(extra);
    site.deploy(port, "v2", &args)
}

#[test]
fn a_dry_deploy_says_what_it_would_do_and_changes_nothing() {
    let (site, _) = site_with_v1_live();
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 900\n  poll_ms: 60\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  drain_timeout_ms: 700\n  probe: {kind: tcp}\n",
    );
    let before = snapshot(site.root());
    let processes = site.processes().len();
    let out = dry_deploy(
        &site,
        free_port(),
        &["--policy", policy.to_str().unwrap(), "--grace-ms", "250"],
    );
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    for line in [
        "deadline       900 ms  (policy)",
        "poll           60 ms  (policy)",
        "stop grace     250 ms  (command line)",
        "drain timeout  700 ms  (policy)",
        "probe          TCP connect, timeout 1000 ms  (policy)",
        "watch          2000 ms, switching back after 3 failed probes in a row  (default)",
        "then drain v1 and watch the new release for 2000 ms with v1 kept running",
        "else stop v1 (grace 250 ms)",
        "it would go ahead",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
    assert_eq!(snapshot(site.root()), before, "the root changed");
    assert_eq!(site.processes().len(), processes, "a process was started");
    assert!(!site.root().join("releases/v2/started").exists());
}

#[test]
fn a_dry_deploy_lists_every_check_that_would_refuse_it() {
    let (site, live_port) = site_with_v1_live();
    let before = snapshot(site.root());
    let out = dry_deploy(&site, live_port, &["0"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("REFUSED the deadline-ms argument is 0 ms"),
        "{text}"
    );
    assert!(text.contains("it would be refused (1 check)"), "{text}");

    let out = dry_deploy(&site, live_port, &[]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains(&format!(
            "REFUSED port {live_port} is the live release's (edge-svc v1)"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("REFUSED port {live_port} is busy")),
        "{text}"
    );
    assert!(text.contains("it would be refused (2 checks)"), "{text}");
    assert_eq!(snapshot(site.root()), before, "the root changed");
}

#[test]
fn a_dry_rollout_shows_the_waves_and_budgets_and_changes_nothing() {
    let (site, _) = site_with_v1_live();
    let before = snapshot(site.root());
    let first = port_block(31);
    let out = rollgate()
        .args([
            "rollout",
            "edge-svc",
            "v2",
            "--replicas",
            "10",
            "--dry-run",
            "--root",
        ])
        .arg(site.root())
        .args([
            "--ports",
            &format!("{first}-{}", first + 30),
            "--soak",
            "2s",
        ])
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    for line in [
        "replicas           10  (command line)",
        "surge              3 process(es) beside the pool  (default)",
        "soak               2000 ms  (command line)",
        "move 10 replica(s) from v1 to v2",
        "wave 0 (canary): slot(s) 0\n",
        "wave 3: slot(s) 5, 6, 7, 8, 9\n",
        "it would go ahead",
    ] {
        assert!(text.contains(line), "{line:?} in\n{text}");
    }
    assert_eq!(snapshot(site.root()), before, "the root changed");
    assert!(!site.root().join("rollout.json").exists());

    // A first rollout without ports is refused, and says so.
    let out = rollgate()
        .args(["rollout", "edge-svc", "v2", "--dry-run", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stdout(&out).contains("REFUSED --ports A-B is needed"),
        "{}",
        stdout(&out)
    );
    assert_eq!(snapshot(site.root()), before, "the root changed");
}
