//! `rollgate logs`: the application's own output, read where rollgate keeps it, and followed
//! across switches (issue 58: it lived in `releases/V/SVC.output`, and `tail -f` broke at every
//! deploy).

use crate::common::*;

use std::process::{Command, Stdio};

fn logs(site: &Site, extra: &[&str]) -> std::process::Output {
    rollgate()
        .args(["logs", "edge-svc", "--root"])
        .arg(site.root())
        .args(extra)
        .timeout(std::time::Duration::from_secs(20))
        .output()
        .unwrap()
}

#[test]
fn logs_print_the_live_release_and_follow_it_across_a_deploy() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "--ready-after-ms 200");
    let ports = port_block(2);
    let deploy = |version: &str| {
        rollgate()
            .args(["deploy", "edge-svc", version, "--ports"])
            .arg(format!("{ports}-{}", ports + 1))
            .arg("--root")
            .arg(site.root())
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap()
    };
    // Nothing live yet: refused, and it says how to name a release.
    let out = logs(&site, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--release"), "{}", stderr(&out));

    assert_eq!(deploy("v1").status.code(), Some(0));
    let out = logs(&site, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Each line with the time it was said, first (issue 80, 7); `--no-time` leaves it off.
    assert!(stdout(&out).lines().all(timed), "{}", stdout(&out));
    assert!(
        untimed(&stdout(&out)).starts_with("sample-service v1: listening on 127.0.0.1:"),
        "{}",
        stdout(&out)
    );
    let out = logs(&site, &["-n", "1", "--no-time"]);
    assert_eq!(stdout(&out).lines().count(), 1, "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("sample-service: ready from"),
        "{}",
        stdout(&out)
    );

    // Following: v1's output, then the switch to v2 said on stderr, then v2's from its boot.
    let said = tempfile::NamedTempFile::new().unwrap();
    let printed = tempfile::NamedTempFile::new().unwrap();
    let follower = ReleaseProcess(
        Command::new(crate::common::bin())
            .args(["logs", "edge-svc", "-f", "--root"])
            .arg(site.root())
            .stdout(Stdio::from(printed.reopen().unwrap()))
            .stderr(Stdio::from(said.reopen().unwrap()))
            .spawn()
            .unwrap(),
    );
    let text = || std::fs::read_to_string(printed.path()).unwrap();
    assert!(wait_for(10, || text().contains("sample-service v1: listening")));
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert_eq!(deploy("v2").status.code(), Some(0));
    assert!(
        wait_for(10, || text().contains("sample-service v2: listening")),
        "{}",
        text()
    );
    // v1 was told to stop after the switch: its last words reach the follower too, before the
    // follower moves on, and the move is said once.
    let now = text();
    let v1_at = now.find("sample-service v1: listening").unwrap();
    let v2_at = now.find("sample-service v2: listening").unwrap();
    assert!(v1_at < v2_at, "{now}");
    assert!(
        wait_for(5, || std::fs::read_to_string(said.path())
            .unwrap()
            .contains("rollgate logs: v2 is live now (was v1)")),
        "{}",
        std::fs::read_to_string(said.path()).unwrap()
    );
    drop(follower);

    // A release by name, live or not; --since gives every release live since then, and of
    // their lines those said since then: v1's last words, not its boot.
    let out = logs(&site, &["--release", "v1", "--no-time"]);
    assert!(
        stdout(&out).starts_with("sample-service v1:"),
        "{}",
        stdout(&out)
    );
    let out = logs(&site, &["--since", &format!("{before}"), "--no-time"]);
    let all = stdout(&out);
    let (v1_boot, v1_end, v2) = (
        all.find("sample-service v1: listening"),
        all.find("sample-service: SIGTERM, exiting"),
        all.find("sample-service v2: listening"),
    );
    assert!(v1_boot.is_none(), "said before --since: {all}");
    assert!(v1_end.is_some() && v1_end < v2, "{all}");
    let out = logs(&site, &["--release", "v9"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("release v9 is not installed"),
        "{}",
        stderr(&out)
    );
}
