//! The console's page in a real headless Chromium (Debian's `chromium` and `chromium-driver`),
//! against real rollouts and deploys of real processes: what it shows, and what its buttons do,
//! checked in the state files and by the CLI. A screenshot of each state is saved under
//! `target/screenshots/` for a person to look at.

use crate::common::browser::Browser;
use crate::common::*;

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
    // v2 fails on replica 1, in the first of two waves; the policy tolerates it, so the rollout
    // goes on and shows it, then soaks 20 s: long enough for the page's pause, resume and
    // abort to land however slow the machine is (the abort ends the soak).
    fails_on_slot(&site, "v2", 1);
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 25\n  on_stall: rollback\n  waves: [50, 100]\n  soak_ms: 20000\n  max_failure_ratio: 1.0\n",
    );
    let mut running = std::process::Command::new(crate::common::bin())
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
    // Once the soak has begun no record comes for 20 s, so the page keeps the form typed in.
    assert!(
        wait_for(30, || browser.text().contains("soak ends in")),
        "the soak shows:\n{}",
        browser.text()
    );

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
    // Issue 66: nothing without the token, read-only too; its link lets the browser in.
    browser.open(&format!("http://127.0.0.1:{}/", read_only.port));
    assert!(
        wait_for(20, || browser.text().contains("needs its token")),
        "{}",
        browser.text()
    );
    assert!(!browser.text().contains("escalated"));
    browser.open(&read_only.token_link());
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
    // Without the token: no page, no buttons, and a request changes nothing (401). The
    // read-only console's cookie was for the same token, so it is cleared first.
    browser.open(&format!("http://127.0.0.1:{}/", console.port));
    browser.clear_cookies();
    browser.open(&format!("http://127.0.0.1:{}/", console.port));
    assert!(wait_for(20, || browser.text().contains("needs its token")));
    assert!(!browser.has("button"));
    let status = browser.script(
        "var r = new XMLHttpRequest(); r.open('POST', '/api/v1/roots/edge-svc/promote', false); r.send(); return r.status;",
    );
    assert_eq!(status, 401);
    assert_eq!(site.pointer().unwrap()["version"], "v1", "nothing changed");

    browser.open(&console.token_link());
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
    // Issue 59: how the live release is held, as `status` says it.
    if let Ok(record) = std::fs::read_to_string(site.root().join("service-user.json")) {
        let uid = serde_json::from_str::<serde_json::Value>(&record).unwrap()["uid"].clone();
        let held = format!("confined: yes (uid {uid}; no privileges; tree ");
        assert!(
            wait_for(20, || browser.text().contains(&held)),
            "{}",
            browser.text()
        );
    }
    // Issue 68: kept, and a restart shown with how the process before it ended.
    assert!(
        wait_for(20, || browser
            .text()
            .contains("restarts: none since it went live · kept")),
        "{}",
        browser.text()
    );
    send_signal(site.live_pid().unwrap(), 9);
    assert!(
        wait_for(20, || browser
            .text()
            .contains(": signal: 9 (SIGKILL)) · kept")),
        "{}",
        browser.text()
    );
    browser.screenshot("console-promoted");
}

/// Issue 36: a rollout whose canary failed and was aborted. The canary's wave once showed
/// `1/2` in green (a failure counted as progress), the failed slot showed `v1` beside v3's
/// reason, the abort said `slot -`, and the timeline was dots with no axis. Now: failures red
/// and apart from progress, waves named as the CLI names them, the version that failed said,
/// and a timeline with a time axis and a label per outcome.
#[test]
fn a_failed_canary_is_red_not_progress_and_the_timeline_has_an_axis() {
    let site = Site::new();
    four_replicas_of_v1(&site, 104);
    let rollout = |version: &str| {
        rollgate()
            .args(["rollout", "edge-svc", version, "--root"])
            .arg(site.root())
            .timeout(std::time::Duration::from_secs(120))
            .output()
            .unwrap()
    };
    assert_eq!(rollout("v2").status.code(), Some(0));
    site.release("v3", "--ready-after-ms 60000");
    let out = rollout("v3");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("wave 0 paused itself"),
        "{}",
        stdout(&out)
    );
    let out = rollgate()
        .args([
            "rollout",
            "abort",
            "edge-svc",
            "--rollback",
            "--reason",
            "bad canary",
            "--root",
        ])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let console = Console::start(&[site.root()], &[]);
    let browser = Browser::start();
    browser.open(&console.link);
    assert!(
        wait_for(30, || browser.text().contains("aborted: bad canary")),
        "{}",
        browser.text()
    );
    let text = browser.text();
    assert!(text.contains("aborted: bad canary (canary)"), "{text}");
    assert!(!text.contains("slot -"), "{text}");
    // The canary's row: named as the CLI names it, nothing on v3, its failure in red.
    let inner = |css: &str| {
        browser
            .script(&format!(
                "return document.querySelector(\"{css}\").innerText;"
            ))
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let canary = inner("tr.wave");
    assert!(canary.contains("wave 0 of 4 (canary)"), "{canary}");
    assert!(
        canary.contains("0 of 1 on v3") && canary.contains("1 failed"),
        "{canary}"
    );
    let width = |part: &str| {
        browser.script(&format!(
            "return document.querySelector('tr.wave .bar .{part}').style.width;"
        ))
    };
    assert_eq!(width("moved"), "0%");
    assert_eq!(width("failed"), "100%");
    let red = browser.script(
        "return getComputedStyle(document.querySelector('tr.wave .bar .failed')).backgroundColor;",
    );
    assert_eq!(red, "rgb(179, 38, 30)");
    // The failed slot says which version failed; the version it serves is v1 again.
    let failed = inner("tr.failure");
    assert!(failed.contains("v3 failed: not ready after"), "{failed}");
    assert!(failed.contains("wave 0 of 4"), "{failed}");
    // The timeline: an axis of five clock times, and a label per outcome with its version.
    let ticks =
        browser.script("return document.querySelectorAll('svg.timeline text.tick').length;");
    assert_eq!(ticks, 5);
    let labels = browser.script(
        "return Array.from(document.querySelectorAll('svg.timeline text.label')).map(t => t.textContent).join(' | ');",
    );
    let labels = labels.as_str().unwrap_or_default().to_string();
    for label in ["v1 ✓", "v2 ✓", "v3 ✗"] {
        assert!(labels.contains(label), "{label} in {labels}");
    }
    browser.screenshot("console-canary-failed-and-aborted");
}

/// Issue 48: the traffic buttons in a real browser: Maintenance with a message (users then get
/// the 503 page through the proxy), Resume traffic.
#[test]
fn the_maintenance_button_takes_a_message_and_users_get_the_page_until_resume() {
    let site = Site::new();
    site.release("v1", "");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let proxy = crate::common::http::Proxy::start(&site, &[]);
    let console = Console::start(&[site.root()], &[]);
    let browser = Browser::start();
    browser.open(&console.link);
    assert!(wait_for(20, || browser
        .has("button[data-action='traffic/maintenance']")));
    browser.type_into("input[name='message']", "Back after the migration");
    browser.screenshot("console-traffic-serving");
    browser.click("button[data-action='traffic/maintenance']");
    // The answer's line (which quotes the message) shows before the sections are fetched
    // again, so the button is waited for, not assumed once the message shows.
    assert!(
        wait_for(20, || browser.has("button[data-action='traffic/resume']")),
        "the resume button shows:\n{}",
        browser.text()
    );
    assert!(browser.text().contains("Back after the migration"));
    assert!(!browser.has("button[data-action='traffic/maintenance']"));
    browser.screenshot("console-traffic-maintenance");
    let through_proxy = || {
        crate::common::http::Conn::open(proxy.port)
            .unwrap()
            .get("/", "Accept: text/html\r\n")
            .unwrap()
    };
    assert!(wait_for(10, || through_proxy().status == 503));
    assert!(through_proxy().body.contains("Back after the migration"));
    browser.click("button[data-action='traffic/resume']");
    assert!(wait_for(20, || browser
        .has("button[data-action='traffic/maintenance']")));
    assert!(wait_for(10, || through_proxy().status == 200));
    browser.screenshot("console-traffic-resumed");
}

/// Issue 69: the page shows the live release's other process types, a row per process.
#[test]
fn the_page_shows_each_process_of_the_release_s_other_types() {
    let site = Site::new();
    site.release("v1", "");
    write(
        site.root(),
        "releases/v1/Procfile",
        "worker: exec sh loop.sh\nclock: exec sh loop.sh\n",
    );
    write(
        site.root(),
        "releases/v1/loop.sh",
        "trap 'exit 0' TERM\nwhile :; do sleep 0.2; done\n",
    );
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  processes:\n    worker:\n      replicas: 2\n      min_ready_ms: 100\n    clock:\n      singleton: true\n      min_ready_ms: 100\n",
    );
    let out = site.deploy(free_port(), "v1", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let console = Console::start(&[site.root()], &[]);
    let browser = Browser::start();
    browser.open(&console.link);
    assert!(
        wait_for(20, || browser.has("table.processes")),
        "{}",
        browser.text()
    );
    let text = browser.text();
    for process in ["worker.0", "worker.1", "clock.0"] {
        assert!(text.contains(process), "{process}: {text}");
    }
    assert!(text.contains("exec sh loop.sh"), "{text}");
    browser.screenshot("console-process-types");
    site.stop_service();
}

/// Issue 70: the page shows each schedule — when it runs next, its last run — a failed run in
/// red.
#[test]
fn the_page_shows_each_schedule_and_a_failed_run_in_red() {
    let site = Site::new();
    site.release("v1", "");
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  schedules:\n    report:\n      cron: \"0 3 * * *\"\n      command: [\"sh\", \"-c\", \"echo 12 rows\"]\n    sync:\n      cron: \"@hourly\"\n      command: [\"sh\", \"-c\", \"echo no database >&2; exit 3\"]\n",
    );
    let out = site.deploy(free_port(), "v1", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for (name, code) in [("report", 0), ("sync", 3)] {
        let out = site.run(&["schedules", "run", "edge-svc", name]);
        assert_eq!(out.status.code(), Some(code), "{}", stderr(&out));
    }
    let console = Console::start(&[site.root()], &[]);
    let browser = Browser::start();
    browser.open(&console.link);
    assert!(
        wait_for(20, || browser.has("table.schedules")),
        "{}",
        browser.text()
    );
    assert!(browser.has("tr[data-schedule='report'] td.good"));
    assert!(browser.has("tr[data-schedule='sync'] td.bad"));
    let text = browser.text();
    assert!(text.contains("FAILED: exit status 3"), "{text}");
    assert!(
        text.contains("0 3 * * *") && text.contains("kept"),
        "{text}"
    );
    browser.screenshot("console-schedules");
    site.stop_service();
}
