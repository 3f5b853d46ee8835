//! The console's page in a real headless Chromium (Debian's `chromium` and `chromium-driver`),
//! against real rollouts and deploys of real processes: what it shows, and what its buttons do,
//! checked in the state files and by the CLI. A screenshot of each state is saved under
//! `target/screenshots/` for a person to look at.

mod common;
use common::browser::Browser;
use common::*;

use std::process::Stdio;

use serde_json::Value;

fn phase(site: &Site) -> String {
    std::fs::read_to_string(site.root().join("rollout.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["phase"].as_str().map(str::to_string))
        .unwrap_or_default()
}

fn cli_state(site: &Site) -> String {
    let out = rollgate()
        .args([
            "rollout", "status", "edge-svc", "--format", "json", "--root",
        ])
        .arg(site.root())
        .output()
        .unwrap();
    serde_json::from_slice::<Value>(&out.stdout)
        .map(|v| v["state"].as_str().unwrap_or("").to_string())
        .unwrap_or_default()
}

#[test]
fn the_page_shows_waves_failures_and_the_deadline_and_its_buttons_pause_resume_and_abort() {
    let site = Site::new();
    four_replicas_of_v1(&site, 102);
    // v2 fails on replica 1; the policy tolerates it, so the rollout goes on and shows it.
    fails_on_slot(&site, "v2", 1);
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 25\n  on_stall: rollback\n  soak_ms: 3000\n  max_failure_ratio: 1.0\n",
    );
    let mut running = std::process::Command::new(assert_cmd::cargo::cargo_bin("rollgate"))
        .args(["rollout", "edge-svc", "v2", "--root"])
        .arg(site.root())
        .arg("--policy")
        .arg(&policy)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let console = Console::start(&[site.root()], &[]);
    let browser = Browser::start();
    // The printed link sets the token's cookie and lands on the page.
    browser.open(&console.link);
    assert!(
        wait_for(30, || browser.has("tr.failure")),
        "the failure shows:\n{}",
        browser.text()
    );
    let text = browser.text();
    assert!(text.contains("Rollout v1 → v2"), "{text}");
    assert!(text.contains("release deadline in"), "{text}");
    assert!(browser.has("tr.wave"), "the waves show");
    assert!(
        text.contains("exited") || text.contains("exit"),
        "why it failed: {text}"
    );
    browser.screenshot("console-rollout-running");

    browser.type_into(
        "form[action$='rollout/pause'] input[name=reason]",
        "checking dashboards",
    );
    browser.click("button[data-action='rollout/pause']");
    assert!(
        wait_for(30, || phase(&site) == "paused"),
        "the state file says paused"
    );
    assert_eq!(cli_state(&site), "paused", "rollout status agrees");
    assert!(wait_for(20, || browser
        .text()
        .contains("paused: checking dashboards")));
    browser.screenshot("console-rollout-paused");
    assert_eq!(running.wait().unwrap().code(), Some(3));

    browser.click("button[data-action='rollout/resume']");
    assert!(wait_for(30, || phase(&site) == "running"), "resumed");
    assert!(wait_for(20, || cli_state(&site) == "running"));
    assert!(wait_for(20, || browser.has("button[data-action='rollout/pause']")));
    browser.screenshot("console-rollout-resumed");

    browser.type_into(
        "form[action$='rollout/abort'] input[name=reason]",
        "bad numbers",
    );
    browser.click("button[data-action='rollout/abort']");
    assert!(wait_for(60, || phase(&site) == "aborted"), "aborted");
    assert!(wait_for(60, || site
        .log_lines()
        .iter()
        .any(|l| l["event"] == "rolled_back" && l["version"] == "v2")));
    assert!(wait_for(20, || browser
        .text()
        .contains("aborted: bad numbers")));
    let versions = || -> Vec<String> {
        std::fs::read_to_string(site.root().join("replicas.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|v| v["replicas"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|r| r["version"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert!(
        wait_for(60, || versions() == ["v1"; 4]),
        "every replica rolled back: {:?}",
        versions()
    );
    browser.screenshot("console-rollout-aborted");
}

#[test]
fn promote_finishes_an_escalated_deploy_and_read_only_shows_no_button() {
    let site = Site::new();
    site.release("v1", "");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    site.release("v2", "--ready-after-ms 1500");
    let policy = write(
        site.root(),
        "escalate.yaml",
        "edge_svc:\n  progress_deadline_ms: 500\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: escalate\n",
    );
    let out = site.deploy(free_port(), "v2", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "escalated: {}", stderr(&out));

    // Read-only first: the escalation shows, no button does, and the endpoint refuses.
    let read_only = Console::start(&[site.root()], &["--read-only"]);
    let browser = Browser::start();
    browser.open(&format!("http://127.0.0.1:{}/", read_only.port));
    assert!(
        wait_for(20, || browser.text().contains("escalated")),
        "{}",
        browser.text()
    );
    assert!(!browser.has("button"), "a read-only page has no button");
    browser.screenshot("console-read-only");
    let refused = browser.script(&format!(
        "var r = new XMLHttpRequest(); r.open('POST', 'http://127.0.0.1:{}/api/v1/roots/edge-svc/promote', false); r.send(); return r.status;",
        read_only.port
    ));
    assert_eq!(refused, 404);
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    drop(read_only);

    let console = Console::start(&[site.root()], &[]);
    // Without the token: no buttons, and a request changes nothing (403).
    browser.open(&format!("http://127.0.0.1:{}/", console.port));
    assert!(wait_for(20, || browser.text().contains("escalated")));
    assert!(!browser.has("button"));
    let status = browser.script(
        "var r = new XMLHttpRequest(); r.open('POST', '/api/v1/roots/edge-svc/promote', false); r.send(); return r.status;",
    );
    assert_eq!(status, 403);
    assert_eq!(site.pointer().unwrap()["version"], "v1", "nothing changed");

    browser.open(&console.link);
    browser.screenshot("console-escalated");
    browser.click("button[data-action='promote']");
    assert!(
        wait_for(30, || site.pointer().is_some_and(|p| p["version"] == "v2")),
        "promoted: current names v2"
    );
    assert!(wait_for(20, || site
        .events()
        .last()
        .is_some_and(|(e, v)| e == "promoted" && v == "v2")));
    assert!(wait_for(20, || browser.text().contains("promoted")));
    browser.screenshot("console-promoted");
}
