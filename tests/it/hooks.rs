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
    site.script("v2", "touch \"$STATE_DIRECTORY/started\"\nsleep 30\n");
    let before = site.log_lines().len();
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("hook pre_deploy"), "{said}");
    assert!(said.contains("exit status: 4"), "{said}");
    assert!(said.contains("change freeze: --strict"), "{said}");
    assert!(said.contains("nothing was started"), "{said}");
    // On the record (issue 58: a refused deploy wrote nothing): one hook_failed line, the
    // refusal as the terminal said it.
    let lines = site.log_lines();
    assert_eq!(lines.len(), before + 1);
    let refused = &lines[before];
    assert_eq!(refused["event"], "hook_failed");
    assert_eq!(refused["version"], "v2");
    assert!(refused["token"].is_string(), "{refused}");
    let detail = refused["detail"].as_str().unwrap();
    assert!(
        detail.contains("change freeze: --strict") && detail.contains("was refused"),
        "{detail}"
    );
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    assert!(!site.root().join("data/started").exists());

    // Issue 67, 7: an attempt like any other — `log history` and `release list` say it was
    // refused and why, and v1 stays the live release.
    let json_lines = |args: &[&str]| -> Vec<serde_json::Value> {
        let out = rollgate().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let log = site.root().join("deploy.log");
    let history = json_lines(&["log", "history", "--format", "json", log.to_str().unwrap()]);
    let refused = history.last().unwrap();
    assert_eq!(refused["version"], "v2", "{history:?}");
    assert_eq!(refused["outcome"], "refused", "{history:?}");
    assert!(
        refused["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("pre_deploy (") && r.contains("exit status: 4")),
        "{refused}"
    );
    assert!(
        history
            .iter()
            .any(|a| a["version"] == "v1" && a["live_now"] == true),
        "{history:?}"
    );
    let root = site.root();
    let listed = json_lines(&[
        "release",
        "list",
        "--format",
        "json",
        "--root",
        root.to_str().unwrap(),
    ]);
    let outcome =
        |v: &str| listed.iter().find(|r| r["version"] == v).unwrap()["last_outcome"].clone();
    assert_eq!(outcome("v2"), "refused", "{listed:?}");
    assert_eq!(outcome("v1"), "promoted", "{listed:?}");
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
            ("pre", "env > \"$STATE_DIRECTORY/pre.env\"\n"),
            ("promoted", "env > \"$STATE_DIRECTORY/promoted.env\"\n"),
            ("rolled-back", "env > \"$STATE_DIRECTORY/rolled-back.env\"\n"),
        ],
    );
    site.release("v2", "");
    let v2_port = free_port();
    let out = site.deploy(v2_port, "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pre = facts(&site.root().join("data/pre.env"));
    assert_eq!(pre["ROLLGATE_HOOK"], "pre_deploy");
    let promoted = facts(&site.root().join("data/promoted.env"));
    assert_eq!(promoted["ROLLGATE_HOOK"], "post_promote");
    assert_eq!(promoted["ROLLGATE_SERVICE"], "edge-svc");
    assert_eq!(promoted["ROLLGATE_VERSION"], "v2");
    assert_eq!(promoted["ROLLGATE_PREVIOUS_VERSION"], "v1");
    assert_eq!(promoted["ROLLGATE_PORTS"], v2_port.to_string());
    assert_eq!(promoted["ROLLGATE_PREVIOUS_PORTS"], v1_port.to_string());
    assert_eq!(promoted["ROLLGATE_REASON"], "");
    assert!(!site.root().join("data/rolled-back.env").exists());

    site.release("v3", "--readyz-status 503");
    let out = site.deploy(free_port(), "v3", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let rolled_back = facts(&site.root().join("data/rolled-back.env"));
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
        &[("promoted", "env > \"$STATE_DIRECTORY/promoted.env\"\n")],
    );
    let first = port_block(10);
    let ports = format!("{first}-{}", first + 9);
    let out = site.rollout(
        "v1",
        &["--replicas", "3", "--policy", &policy, "--ports", &ports],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let promoted = facts(&site.root().join("data/promoted.env"));
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
    // Issue 59: what a hook leaves running ends with it (its cgroup is killed as it exits).
    if !crate::deploy::cgroup_base().is_empty() {
        assert!(
            wait_for(5, || !a_process_mentions(&marker)),
            "the hook's background child outlived it"
        );
    }
    send_signal_to_marker(&marker);
}

/// Issue 59: a hook runs as its service's releases do — the service's uid, no privileges, the
/// same filesystem rules — and `isolation.enabled = false` gives it rollgate's own back.
#[test]
fn a_hook_runs_confined_as_its_service_unless_isolation_is_off() {
    if !nix_is_root() {
        return;
    }
    let site = Site::new();
    v1_live(&site);
    let acts = "id -u > \"$STATE_DIRECTORY/$ROLLGATE_HOOK.uid\"\n\
                grep NoNewPrivs /proc/self/status >> \"$STATE_DIRECTORY/$ROLLGATE_HOOK.uid\"\n\
                (echo x > \"$ROLLGATE_ROOT/escaped\") 2>/dev/null && echo wrote-root >> \"$STATE_DIRECTORY/$ROLLGATE_HOOK.uid\"\n\
                (ls /root) >/dev/null 2>&1 && echo listed-root >> \"$STATE_DIRECTORY/$ROLLGATE_HOOK.uid\"\n\
                exit 0\n";
    let confined = policy(&site, "{pre_deploy: [./acts.sh]}", &[("acts", acts)]);
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &["--policy", &confined]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(site.root().join("service-user.json")).unwrap(),
    )
    .unwrap();
    let said = std::fs::read_to_string(site.root().join("data/pre_deploy.uid")).unwrap();
    let mut lines = said.lines();
    assert_eq!(
        lines.next(),
        Some(record["uid"].to_string().as_str()),
        "{said}"
    );
    assert_eq!(
        lines
            .next()
            .map(str::split_whitespace)
            .and_then(|mut w| w.nth(1)),
        Some("1"),
        "{said}"
    );
    assert_eq!(
        lines.next(),
        None,
        "a confined hook reached what it must not: {said}"
    );
    assert!(!site.root().join("escaped").exists());

    // Off: rollgate's own user and privileges, and it can write in the root.
    let off = std::fs::read_to_string(&confined).unwrap() + "  isolation:\n    enabled: false\n";
    std::fs::write(&confined, off).unwrap();
    site.release("v3", "");
    let out = site.deploy(free_port(), "v3", &["--policy", &confined]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = std::fs::read_to_string(site.root().join("data/pre_deploy.uid")).unwrap();
    assert!(said.starts_with("0\n"), "{said}");
    assert!(
        said.contains("wrote-root") && said.contains("listed-root"),
        "{said}"
    );
    assert!(site.root().join("escaped").exists());
}

pub(crate) fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
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

/// Issue 58: a pre_deploy hook (a migration) ran in the root, without the release's config or
/// secrets, and a hook that succeeded said nothing anywhere.
#[test]
fn a_migration_runs_in_its_release_with_its_config_and_its_output_is_kept_and_shown() {
    let site = Site::new();
    v1_live(&site);
    let secret = "pw-7f3a-do-not-print";
    assert!(set_secret(&site, "db", secret).status.success());
    site.release("v2", "");
    write(site.root(), "releases/v2/env", "GREETING=hi\n");
    write(site.root(), "releases/v2/secrets", "DB_PASSWORD=db\n");
    let policy = policy(
        &site,
        "{pre_deploy: [./migrate.sh], post_promote: [./announce.sh]}",
        &[
            (
                "migrate",
                "echo \"migrating in $(pwd) as $GREETING with $DB_PASSWORD\"\n\
                 test \"$DB_PASSWORD\" = pw-7f3a-do-not-print || exit 9\n\
                 echo 'migrated 3 tables'\n",
            ),
            ("announce", "echo \"v=$ROLLGATE_VERSION live\"\n"),
        ],
    );
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let release = site.root().join("releases/v2");
    // Its whole output kept with the release's own files (never in its folder), the secret's
    // value blanked.
    let kept = std::fs::read_to_string(site.root().join("output/v2/pre_deploy.output")).unwrap();
    assert!(
        kept.contains(&format!(
            "migrating in {} as hi with [secret]",
            release.display()
        )),
        "{kept}"
    );
    assert!(
        kept.contains("migrated 3 tables") && !kept.contains(secret),
        "{kept}"
    );
    // On the record, with the run's token; the post hook too.
    let lines = site.log_lines();
    let ran: Vec<&serde_json::Value> = lines.iter().filter(|l| l["event"] == "hook_ran").collect();
    assert_eq!(ran.len(), 2, "{lines:?}");
    let started = lines
        .iter()
        .rfind(|l| l["event"] == "candidate_started")
        .unwrap();
    assert_eq!(ran[0]["token"], started["token"]);
    assert!(
        ran[0]["detail"]
            .as_str()
            .unwrap()
            .contains("migrated 3 tables"),
        "{}",
        ran[0]
    );
    assert!(!serde_json::to_string(&lines).unwrap().contains(secret));
    // Shown by status and by the history.
    let status = rollgate()
        .args(["status", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert!(stdout(&status).contains("hook_ran"), "{}", stdout(&status));
    assert!(
        stdout(&status).contains("migrated 3 tables"),
        "{}",
        stdout(&status)
    );
    let history = rollgate()
        .args(["log", "history", "--format", "json"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    let last: serde_json::Value =
        serde_json::from_str(stdout(&history).lines().last().unwrap()).unwrap();
    assert_eq!(last["version"], "v2");
    let hooks = last["hooks"].as_str().unwrap();
    assert!(
        hooks.starts_with("pre_deploy (") && hooks.contains("migrated 3 tables"),
        "{hooks}"
    );
    assert!(
        hooks.contains(" / post_promote (") && hooks.contains("v=v2 live"),
        "{hooks}"
    );
}
