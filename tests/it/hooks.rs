//! The policy's hooks through the real binary: a failing or hanging pre_deploy refuses with
//! nothing started, post hooks see what happened, and a failing post hook undoes nothing.

use crate::common::*;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// `hooks.yaml` beside executable scripts `name.sh` (body given), with these hooks.
fn policy(site: &Site, hooks: &str, scripts: &[(&str, &str)]) -> String {
    use std::os::unix::fs::PermissionsExt;
    for (name, body) in scripts {
        let path = write(
            site.root(),
            &format!("hooks/{name}.sh"),
            &format!("#!/bin/sh\n{body}"),
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    write(
        site.root(),
        "hooks/hooks.yaml",
        &format!(
            "edge_svc:\n  progress_deadline_ms: 500\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  stop_grace_ms: 1000\n  watch_ms: 0\n  hooks: {hooks}\n"
        ),
    )
    .display()
    .to_string()
}

/// The `ROLLGATE_*` variables a hook wrote with `env > file`.
fn facts(path: &std::path::Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.starts_with("ROLLGATE_"))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn v1_live(site: &Site) -> u16 {
    site.release("v1", "");
    let port = free_port();
    assert_eq!(site.deploy(port, "v1", &[]).status.code(), Some(0));
    port
}

#[test]
fn a_failing_pre_deploy_refuses_with_nothing_started() {
    let site = Site::new();
    v1_live(&site);
    let policy = policy(
        &site,
        "{pre_deploy: [./check.sh, --strict]}",
        &[("check", "echo \"change freeze: $1\" >&2\nexit 4\n")],
    );
    site.script("v2", "touch \"$(dirname \"$0\")/started\"\nsleep 30\n");
    let before = site.log_lines().len();
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("hook pre_deploy"), "{said}");
    assert!(said.contains("exit status: 4"), "{said}");
    assert!(said.contains("change freeze: --strict"), "{said}");
    assert!(said.contains("nothing was started"), "{said}");
    assert_eq!(site.log_lines().len(), before);
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    assert!(!site.root().join("releases/v2/started").exists());
}

#[test]
fn a_hanging_hook_is_killed_at_its_limit() {
    let site = Site::new();
    v1_live(&site);
    let marker = format!("29.{}", std::process::id());
    let policy = policy(
        &site,
        "{pre_deploy: [./hang.sh], timeout_ms: 300}",
        &[("hang", &format!("sleep {marker}\n"))],
    );
    site.release("v2", "");
    let started = Instant::now();
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        stderr(&out).contains("did not finish within 300 ms and was killed"),
        "{}",
        stderr(&out)
    );
    assert!(
        wait_for(5, || !a_process_mentions(&marker)),
        "the hook's sleep outlived its limit"
    );
}

#[test]
fn post_hooks_see_what_happened() {
    let site = Site::new();
    let v1_port = v1_live(&site);
    let policy = policy(
        &site,
        "{pre_deploy: [./pre.sh], post_promote: [./promoted.sh], post_rollback: [./rolled-back.sh]}",
        &[
            ("pre", "env > \"$ROLLGATE_ROOT/pre.env\"\n"),
            ("promoted", "env > \"$ROLLGATE_ROOT/promoted.env\"\n"),
            ("rolled-back", "env > \"$ROLLGATE_ROOT/rolled-back.env\"\n"),
        ],
    );
    site.release("v2", "");
    let v2_port = free_port();
    let out = site.deploy(v2_port, "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pre = facts(&site.root().join("pre.env"));
    assert_eq!(pre["ROLLGATE_HOOK"], "pre_deploy");
    let promoted = facts(&site.root().join("promoted.env"));
    assert_eq!(promoted["ROLLGATE_HOOK"], "post_promote");
    assert_eq!(promoted["ROLLGATE_SERVICE"], "edge-svc");
    assert_eq!(promoted["ROLLGATE_VERSION"], "v2");
    assert_eq!(promoted["ROLLGATE_PREVIOUS_VERSION"], "v1");
    assert_eq!(promoted["ROLLGATE_PORTS"], v2_port.to_string());
    assert_eq!(promoted["ROLLGATE_PREVIOUS_PORTS"], v1_port.to_string());
    assert_eq!(promoted["ROLLGATE_REASON"], "");
    assert!(!site.root().join("rolled-back.env").exists());

    site.release("v3", "--readyz-status 503");
    let out = site.deploy(free_port(), "v3", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let rolled_back = facts(&site.root().join("rolled-back.env"));
    assert_eq!(rolled_back["ROLLGATE_VERSION"], "v3");
    assert_eq!(rolled_back["ROLLGATE_PREVIOUS_VERSION"], "v2");
    assert_eq!(rolled_back["ROLLGATE_REASON"], "not ready after 500 ms");
}

#[test]
fn a_failing_post_hook_is_logged_and_undoes_nothing() {
    let site = Site::new();
    v1_live(&site);
    let policy = policy(
        &site,
        "{post_promote: [./notify.sh]}",
        &[("notify", "echo 'chat server down' >&2\nexit 1\n")],
    );
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v2");
    let last = site.log_lines().last().cloned().unwrap();
    assert_eq!(last["event"], "hook_failed");
    let detail = last["detail"].as_str().unwrap();
    assert!(detail.starts_with("hook post_promote"), "{detail}");
    assert!(detail.contains("chat server down"), "{detail}");
    let summary = rollgate()
        .args(["log", "summary"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    assert!(
        stdout(&summary).contains("\"live\":\"v2\""),
        "{}",
        stdout(&summary)
    );
}

#[test]
fn a_rollouts_post_promote_sees_every_new_replicas_port() {
    let site = Site::new();
    site.release("v1", "");
    let policy = policy(
        &site,
        "{post_promote: [./promoted.sh]}",
        &[("promoted", "env > \"$ROLLGATE_ROOT/promoted.env\"\n")],
    );
    let first = port_block(10);
    let ports = format!("{first}-{}", first + 9);
    let out = site.rollout(
        "v1",
        &["--replicas", "3", "--policy", &policy, "--ports", &ports],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let promoted = facts(&site.root().join("promoted.env"));
    assert_eq!(promoted["ROLLGATE_VERSION"], "v1");
    assert_eq!(
        promoted["ROLLGATE_PORTS"].split(',').count(),
        3,
        "{promoted:?}"
    );
}

#[test]
fn a_hook_that_exits_at_once_is_judged_by_its_exit_not_by_a_background_child_holding_its_output() {
    let site = Site::new();
    v1_live(&site);
    let marker = format!("31.{}", std::process::id());
    // Exit 0 at once, leaving a child that keeps the hook's stdout open past the time limit.
    let policy = policy(
        &site,
        "{pre_deploy: [./bg.sh], timeout_ms: 500}",
        &[("bg", &format!("echo checked\nsleep {marker} &\nexit 0\n"))],
    );
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v2");
    send_signal_to_marker(&marker);
}

/// Ends the background process a hook left (by its marker argument).
fn send_signal_to_marker(marker: &str) {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(marker) {
            send_signal(pid, 9);
        }
    }
}
