//! The traffic judge (issue 38): four replicas behind the real proxy under a steady load from
//! the test; a canary is judged by what users got through the proxy, against the old release's
//! replicas serving at the same moment.

use crate::common::http::*;
use crate::common::*;

use std::process::Output;
use std::time::{Duration, Instant};

fn rollout(site: &Site, version: &str, policy: &std::path::Path) -> Output {
    rollgate()
        .args(["rollout", "edge-svc", version, "--root"])
        .arg(site.root())
        .args(["--policy", policy.to_str().unwrap()])
        .env("NO_COLOR", "1")
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap()
}

fn said(out: &Output) -> String {
    format!("{}{}", stdout(out), stderr(out))
}

/// A policy of four replicas, a canary of one, a soak of `soak_ms`, and `analysis`.
fn policy(site: &Site, soak_ms: u64, analysis: &str) -> std::path::PathBuf {
    write(
        site.root(),
        "policy.json",
        &format!(
            r#"{{"edge_svc": {{"progress_deadline_ms": 5000, "poll_ms": 100, "max_unavailable_pct": 0,
                "max_surge_pct": 100, "on_stall": "rollback", "replicas": 4, "waves": [25, 100],
                "soak_ms": {soak_ms}, "analysis": {analysis}}}}}"#
        ),
    )
}

/// The `analysis` lines of the log, in order.
fn verdicts(site: &Site) -> Vec<serde_json::Value> {
    site.log_lines()
        .into_iter()
        .filter(|l| l["event"] == "analysis")
        .collect()
}

/// Requests `version` answered through the proxy serving the site, from its own counts
/// (`counts` on ROOT/proxy.sock).
fn served_by(site: &Site, version: &str) -> u64 {
    use std::io::{BufRead, Write};
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(site.root().join("proxy.sock"))
    else {
        return 0;
    };
    if stream.write_all(b"counts\n").is_err() {
        return 0;
    }
    let mut line = String::new();
    let _ = std::io::BufReader::new(stream).read_line(&mut line);
    let counts: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
    counts["releases"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["release"] == version)
        .flat_map(|r| r["answers"].as_object().into_iter().flatten())
        .filter_map(|(_, n)| n.as_u64())
        .sum()
}

/// Four replicas of v1 behind a proxy, under `clients` clients pausing `pause` between requests.
fn serving(site: &Site, block: u16, clients: usize, pause: Duration) -> (Proxy, Load) {
    site.add_sample("v1", "");
    site.replicas_of("v1", 4, block);
    let proxy = Proxy::start(site, &[]);
    let load = Load::kept(proxy.port, clients, pause);
    (proxy, load)
}

#[test]
fn a_canary_serving_more_5xx_is_rolled_back_by_its_numbers_before_its_soak_ends() {
    let site = Site::new();
    let (proxy, load) = serving(&site, 70, 4, Duration::from_millis(2));
    site.add_sample("v2", "--error-rate 0.05");
    // Judged on its 5xx alone: on a loaded machine the canary's p99 was once 1.5x the
    // baseline's, and latency (1.2x by default) failed it first.
    let file = policy(
        &site,
        30_000,
        r#"{"min_requests": 100, "interval_ms": 1000, "on_fail": "rollback", "max_latency_ratio": 100}"#,
    );
    let started = Instant::now();
    let out = rollout(&site, "v2", &file);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "rolled back: {}", said(&out));
    assert!(
        took < Duration::from_secs(25),
        "stopped after {took:?}, not by its numbers"
    );
    let seen = verdicts(&site);
    let failed = seen.last().expect("an analysis line");
    assert_eq!(failed["analysis"]["verdict"], "fail", "{failed}");
    let words = failed["detail"].as_str().unwrap();
    assert!(words.starts_with("canary 5xx "), "{words}");
    assert!(words.contains("vs baseline 0.0 % (0/"), "{words}");
    assert!(failed["analysis"]["canary_requests"].as_u64().unwrap() >= 100);
    assert!(
        failed["analysis"]["error_p"].as_f64().unwrap()
            < failed["analysis"]["alpha"].as_f64().unwrap()
    );
    // Every look before the failure said pass or inconclusive, never fail.
    assert!(seen[..seen.len() - 1]
        .iter()
        .all(|l| l["analysis"]["verdict"] != "fail"));
    let outcome = site
        .log_lines()
        .into_iter()
        .rev()
        .find(|l| l["event"] == "rolled_back")
        .unwrap();
    assert!(
        outcome["detail"]
            .as_str()
            .unwrap()
            .contains("analysis failed: canary 5xx"),
        "{outcome}"
    );
    // Issue 58: the canary was in the pool, so users had it: its rollback says so, with the
    // proxy's counts of it, and no reader counts it among the candidates users never saw.
    assert_eq!(
        outcome["exposure"]["ended_by"], "the traffic judge",
        "{outcome}"
    );
    let canary_requests = outcome["exposure"]["requests"].as_u64().unwrap();
    assert!(canary_requests >= 100, "{outcome}");
    assert!(
        outcome["exposure"]["failed"].as_u64().unwrap() >= 1,
        "{outcome}"
    );
    let stats = rollgate()
        .args(["log", "stats", "--format", "json"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let had = &stats["rolled_back_after_users_had_them"];
    assert_eq!(had[0]["version"], "v2", "{stats}");
    assert_eq!(had[0]["how"], "as a canary of its rollout", "{stats}");
    assert_eq!(had[0]["requests"], canary_requests, "{stats}");
    assert_eq!(stats["rolled_back_before_users"], 0, "{stats}");
    // Users got the canary's 5xx while it was judged, but no request failed at the socket.
    let answers = load.finish();
    assert!(
        answers.iter().all(|(status, _, _)| *status != 0),
        "a request failed at the socket"
    );
    drop(proxy);
}

#[test]
fn a_canary_sixty_ms_slower_is_paused_with_its_latency_in_the_reason() {
    let site = Site::new();
    let (proxy, load) = serving(&site, 71, 4, Duration::from_millis(2));
    site.add_sample("v2", "--added-latency-ms 60");
    let file = policy(
        &site,
        30_000,
        r#"{"min_requests": 100, "interval_ms": 1000}"#,
    );
    let out = rollout(&site, "v2", &file);
    assert_eq!(out.status.code(), Some(3), "paused: {}", said(&out));
    let last = verdicts(&site).pop().expect("an analysis line");
    assert_eq!(last["analysis"]["verdict"], "fail", "{last}");
    let words = last["detail"].as_str().unwrap();
    assert!(words.starts_with("canary p99 "), "{words}");
    assert!(last["analysis"]["latency_ratio"].as_f64().unwrap() > 1.2);
    let status: serde_json::Value = serde_json::from_slice(
        &rollgate()
            .args([
                "rollout", "status", "edge-svc", "--format", "json", "--root",
            ])
            .arg(site.root())
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(status["state"], "paused");
    assert!(
        status["pause_reason"]
            .as_str()
            .unwrap()
            .starts_with("analysis failed: canary p99"),
        "{status}"
    );
    let out = rollgate()
        .args(["rollout", "abort", "edge-svc", "--root"])
        .arg(site.root())
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let answers = load.finish();
    assert!(answers.iter().all(|(status, _, _)| *status == 200));
    drop(proxy);
}

#[test]
fn a_canary_slow_only_while_cold_fails_without_a_warmup_and_passes_with_one() {
    // v2 answers 100 ms late for 3 s from its first request, then as fast as v1: a cold
    // start. Judged from the soak's start, its latency is many times the baseline's, and
    // significantly; with `warmup_ms` the window starts after the cold start and the same
    // release passes. (On a loaded two-core machine each slow answer holds a client for a
    // quarter of a second and the canary's share of the traffic is small: its slow answers are
    // few — CI saw 3 in the soak's first second — and diluted by its fast ones once warm. So
    // the cold spell is 3 s and 10 requests a side are enough for a verdict: the slow ones
    // alone then decide the first looks.)
    let cold = "--added-latency-ms 100 --slow-for-ms 3000";
    let judged = |block: u16, analysis: &str| {
        let site = Site::new();
        let (proxy, load) = serving(&site, block, 8, Duration::from_millis(2));
        site.add_sample("v2", cold);
        let out = rollout(&site, "v2", &policy(&site, 6000, analysis));
        assert!(load.finish().iter().all(|(status, _, _)| *status == 200));
        drop(proxy);
        (out, verdicts(&site))
    };
    // The last wave has no old release beside it to judge against: no wait at its end.
    let settings = r#""min_requests": 10, "interval_ms": 1000, "max_latency_ratio": 3,
                      "inconclusive_wait_ms": 0"#;
    // The two sites are judged at the same time (each mostly waits on its soak).
    let (without, with) = std::thread::scope(|both| {
        let without = both.spawn(|| judged(75, &format!("{{{settings}}}")));
        let with = both.spawn(|| judged(76, &format!("{{{settings}, \"warmup_ms\": 4000}}")));
        (without.join().unwrap(), with.join().unwrap())
    });

    let (out, seen) = without;
    assert_eq!(
        out.status.code(),
        Some(3),
        "paused: {} {seen:?}",
        said(&out)
    );
    let failed = seen.last().expect("an analysis line");
    assert_eq!(failed["analysis"]["verdict"], "fail", "{failed}");
    assert!(
        failed["detail"]
            .as_str()
            .unwrap()
            .starts_with("canary p99 "),
        "{failed}"
    );

    let (out, seen) = with;
    assert_eq!(out.status.code(), Some(0), "promoted: {}", said(&out));
    assert!(
        seen.iter().all(|l| l["analysis"]["verdict"] != "fail"),
        "{seen:?}"
    );
    let canary_wave: Vec<&serde_json::Value> = seen.iter().filter(|l| l["wave"] == 0).collect();
    assert!(
        canary_wave
            .iter()
            .any(|l| l["analysis"]["verdict"] == "pass"),
        "{seen:?}"
    );
    // The first look after the warm-up says where its counts start; no look came before it.
    assert!(
        canary_wave[0]["detail"]
            .as_str()
            .unwrap()
            .contains("counts start after the 4000 ms warm-up"),
        "{seen:?}"
    );
    assert!(
        canary_wave.len() <= 4,
        "a soak of 6 s with a 4 s warm-up is looked at about twice: {seen:?}"
    );
}

#[test]
fn a_warmup_is_bounded_by_the_contract_naming_the_field() {
    let site = Site::new();
    for (warmup, allowed) in [
        ("0", true),
        ("3600000", true),
        ("3600001", false),
        ("-1", false),
    ] {
        let path = policy(&site, 4000, &format!(r#"{{"warmup_ms": {warmup}}}"#));
        let out = rollgate()
            .args(["policy", "check"])
            .arg(&path)
            .output()
            .unwrap();
        if allowed {
            assert_eq!(out.status.code(), Some(0), "{warmup}: {}", said(&out));
        } else {
            assert_eq!(out.status.code(), Some(1), "{warmup}: {}", said(&out));
            assert!(
                stdout(&out).contains(
                    "contract broken by the value of `warmup_ms`: analysis.warmup_ms must be an integer from 0 to 3600000"
                ),
                "{warmup}: {}",
                said(&out)
            );
        }
    }
}

#[test]
fn an_identical_canary_passes_and_thin_traffic_is_inconclusive_never_a_failure() {
    let site = Site::new();
    let (proxy, load) = serving(&site, 72, 4, Duration::from_millis(2));
    site.add_sample("v2", "");
    // After a 1 s warm-up, and p99 held to 1.5x rather than the default 1.2x: this test is of
    // an identical canary passing, not of the latency bound (other tests hold that). Counted
    // from its first request, a fresh identical canary on a loaded test machine once scored
    // 1.39x (p = 2.4e-4); after the warm-up, CI once saw 1.26x (p = 2.6e-4).
    let file = policy(
        &site,
        5000,
        r#"{"min_requests": 100, "interval_ms": 1000, "warmup_ms": 1000, "max_latency_ratio": 1.5}"#,
    );
    let out = rollout(&site, "v2", &file);
    assert_eq!(out.status.code(), Some(0), "promoted: {}", said(&out));
    let seen = verdicts(&site);
    assert!(seen.len() >= 3, "{seen:?}");
    assert!(
        seen.iter().all(|l| l["analysis"]["verdict"] != "fail"),
        "{seen:?}"
    );
    // The canary's wave is judged against the three replicas still on v1: a pass. (The last
    // wave has no old replica serving beside it: inconclusive, which passes by default.)
    assert!(
        seen.iter()
            .any(|l| l["wave"] == 0 && l["analysis"]["verdict"] == "pass"),
        "{seen:?}"
    );
    assert!(load.finish().iter().all(|(status, _, _)| *status == 200));

    // Two requests a second: every look is inconclusive; the judge looks on for 2 s more at
    // the soak's end, then the rollout goes on.
    let thin = Load::kept(proxy.port, 1, Duration::from_millis(500));
    site.add_sample("v3", "");
    let file = policy(
        &site,
        4000,
        r#"{"min_requests": 100, "interval_ms": 1000, "inconclusive_wait_ms": 2000}"#,
    );
    let out = rollout(&site, "v3", &file);
    assert_eq!(out.status.code(), Some(0), "promoted: {}", said(&out));
    let thin_looks: Vec<serde_json::Value> = verdicts(&site)
        .into_iter()
        .filter(|l| l["version"] == "v3")
        .collect();
    assert!(thin_looks.len() >= 3, "{thin_looks:?}");
    for look in &thin_looks {
        assert_eq!(look["analysis"]["verdict"], "inconclusive", "{look}");
        assert!(
            look["detail"]
                .as_str()
                .unwrap()
                .contains("100 a side are needed"),
            "{look}"
        );
    }
    assert!(
        thin_looks.iter().any(|l| l["detail"]
            .as_str()
            .unwrap()
            .contains("the soak ended inconclusive: looking 2000 ms more")),
        "{thin_looks:?}"
    );
    thin.finish();
    drop(proxy);
}

/// Issue 58: a service's first deploy under an `analysis` policy was refused for want of a
/// proxy, though there is nothing to judge it against yet. It is gated on readiness alone and
/// says so; the next deploy, which has a baseline, still needs the proxy.
#[test]
fn a_first_deploy_under_analysis_is_gated_on_readiness_alone_and_says_why() {
    let site = Site::new();
    site.add_sample("v1", "");
    site.add_sample("v2", "");
    let file = write(
        site.root(),
        "judged.json",
        r#"{"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 500,
            "analysis": {"min_requests": 50, "interval_ms": 1000}}}"#,
    );
    let policy = ["--policy", file.to_str().unwrap()];
    let out = site.deploy(free_port(), "v1", &policy);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(
        stderr(&out).contains("v1 is the service's first release: there is no old release to judge it against, so it is gated on readiness alone"),
        "{}",
        said(&out)
    );
    let out = site.deploy(free_port(), "v2", &policy);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        stderr(&out).contains("no rollgate proxy serves"),
        "{}",
        said(&out)
    );
}

#[test]
fn a_rollout_asking_for_analysis_without_a_proxy_is_refused_before_anything_starts() {
    let site = Site::new();
    site.add_sample("v1", "");
    site.replicas_of("v1", 4, 73);
    site.add_sample("v2", "");
    let file = policy(&site, 1000, "{}");
    let before = std::fs::read_to_string(site.root().join("replicas.json")).unwrap();
    let out = rollout(&site, "v2", &file);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        stderr(&out).contains("the policy asks for analysis"),
        "{}",
        said(&out)
    );
    assert!(
        stderr(&out).contains("no rollgate proxy serves"),
        "{}",
        said(&out)
    );
    assert_eq!(
        std::fs::read_to_string(site.root().join("replicas.json")).unwrap(),
        before
    );
}

#[test]
fn a_killed_proxy_or_a_killed_rollgate_mid_analysis_resumes_with_fresh_counts_and_no_wrong_verdict()
{
    let site = Site::new();
    let (mut proxy, load) = serving(&site, 74, 4, Duration::from_millis(2));
    site.add_sample("v2", "");
    let file = policy(
        &site,
        10_000,
        r#"{"min_requests": 50, "interval_ms": 1000}"#,
    );
    let mut running = std::process::Command::new(crate::common::bin())
        .args(["rollout", "edge-svc", "v2", "--root"])
        .arg(site.root())
        .args(["--policy", file.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        wait_for(30, || verdicts(&site).len() >= 2),
        "{:?}",
        verdicts(&site)
    );
    // The proxy dies mid-analysis; another takes its place on the same address.
    let port = proxy.port;
    proxy.child.kill().unwrap();
    let _ = proxy.child.wait();
    let replacement = Proxy::start_on(&site, port, &[]);
    let fresh = |site: &Site| {
        verdicts(site).iter().any(|l| {
            l["detail"]
                .as_str()
                .unwrap_or("")
                .contains("counts start fresh")
        })
    };
    assert!(wait_for(20, || fresh(&site)), "{:?}", verdicts(&site));
    // Then the rollgate running the rollout dies mid-soak; the next command takes the run over.
    let before_kill = verdicts(&site).len();
    running.kill().unwrap();
    let _ = running.wait();
    let out = rollgate()
        .args(["rollout", "resume", "edge-svc", "--root"])
        .arg(site.root())
        .timeout(Duration::from_secs(90))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "completed: {}", said(&out));
    let seen = verdicts(&site);
    assert!(
        seen[before_kill..].iter().any(|l| l["detail"]
            .as_str()
            .unwrap_or("")
            .contains("counts start now")),
        "{seen:?}"
    );
    // An identical canary: no look ever failed, through both deaths.
    assert!(
        seen.iter().all(|l| l["analysis"]["verdict"] != "fail"),
        "{seen:?}"
    );
    load.finish();
    drop(replacement);
}

#[test]
fn a_deploy_is_judged_in_its_watch_against_the_old_release_before_the_switch() {
    let site = Site::new();
    site.add_sample("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let proxy = Proxy::start(&site, &[]);
    let load = Load::kept(proxy.port, 4, Duration::from_millis(2));
    // The baseline is v1's record through the proxy up to the switch: enough of it to
    // conclude on (0 errors in 68 requests is still consistent with a 10 % rate at p = 8e-4).
    assert!(wait_for(60, || served_by(&site, "v1") >= 500));
    site.add_sample("v2", "--error-rate 0.1");
    let file = write(
        site.root(),
        "policy.json",
        r#"{"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 15000,
            "analysis": {"min_requests": 50, "interval_ms": 1000, "on_fail": "rollback"}}}"#,
    );
    let started = Instant::now();
    let out = site.deploy(free_port(), "v2", &["--policy", file.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "switched back: {} {:?}",
        said(&out),
        verdicts(&site)
    );
    assert!(
        started.elapsed() < Duration::from_secs(14),
        "{:?}",
        started.elapsed()
    );
    let last = verdicts(&site).pop().expect("an analysis line");
    assert_eq!(last["analysis"]["verdict"], "fail", "{last}");
    assert!(
        last["analysis"]["baseline_requests"].as_u64().unwrap() >= 50,
        "{last}"
    );
    let seen = verdicts(&site);
    assert!(
        seen[0]["detail"]
            .as_str()
            .unwrap()
            .contains("baseline: v1's "),
        "{seen:?}"
    );
    let live: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("current")).unwrap())
            .unwrap();
    assert_eq!(live["version"], "v1");
    // Issue 58: users had v2 in its watch. Its rollback says for how long, what it answered
    // them (the proxy's counts) and what ended it, and no reader counts it among the
    // candidates users never saw.
    let lines = site.log_lines();
    let back = lines
        .iter()
        .rfind(|l| l["event"] == "rolled_back")
        .unwrap()
        .clone();
    assert_eq!(back["phase"], "watch", "{back}");
    let exposure = &back["exposure"];
    assert_eq!(exposure["ended_by"], "the traffic judge", "{back}");
    assert!(exposure["live_s"].as_f64().unwrap() > 0.5, "{back}");
    let (requests, failed) = (
        exposure["requests"].as_u64().unwrap(),
        exposure["failed"].as_u64().unwrap(),
    );
    assert!(requests >= 50 && failed >= 1 && failed < requests, "{back}");
    assert!(
        back["detail"]
            .as_str()
            .unwrap()
            .contains("users had it for "),
        "{back}"
    );
    let log = site.root().join("deploy.log");
    let stats = rollgate()
        .args(["log", "stats", "--format", "json"])
        .arg(&log)
        .output()
        .unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["rolled_back"], 1, "{stats}");
    assert_eq!(stats["rolled_back_before_users"], 0, "{stats}");
    assert_eq!(stats["candidate_rejection_rate"], 0.0, "{stats}");
    let had = &stats["rolled_back_after_users_had_them"][0];
    assert_eq!(had["version"], "v2", "{stats}");
    assert_eq!(had["how"], "in its watch", "{stats}");
    assert_eq!(had["requests"], requests, "{stats}");
    assert_eq!(had["ended_by"], "the traffic judge", "{stats}");
    let history = rollgate()
        .args(["log", "history", "--format", "json"])
        .arg(&log)
        .output()
        .unwrap();
    let v2 = stdout(&history)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["version"] == "v2")
        .unwrap();
    assert!(v2["exposure_s"].as_f64().unwrap() > 0.5, "{v2}");
    assert_eq!(v2["users_failed"], failed, "{v2}");
    assert_eq!(v2["ended_by"], "the traffic judge", "{v2}");
    // The lesson's rule stands: the summary still calls v1 live.
    let summary = rollgate()
        .args(["log", "summary"])
        .arg(&log)
        .output()
        .unwrap();
    assert!(
        stdout(&summary).contains("\"live\":\"v1\""),
        "{}",
        stdout(&summary)
    );
    assert!(load.finish().iter().all(|(status, _, _)| *status != 0));
    drop(proxy);
}

/// Issue 67, 5: a release that stops answering in its watch has its requests retried by the
/// proxy on the release it replaced, and users get every answer. Its exposure used to call
/// those tries failed ("180 requests through the proxy, 1 failed" while the clients saw 0
/// failures); they are now counted apart, as retries, and `log history` agrees with the
/// clients.
#[test]
fn requests_retried_on_the_old_release_and_answered_there_are_not_called_failed() {
    let site = Site::new();
    site.add_sample("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let proxy = Proxy::start(&site, &[]);
    let load = Load::kept(proxy.port, 4, Duration::from_millis(2));
    assert!(wait_for(60, || served_by(&site, "v1") >= 100));
    // Serves, then — 500 ms into its watch — its server ends while its process lives on:
    // refused connections until the watch's probes roll it back.
    let bin = crate::common::bin();
    let armed = site.armed_file("v2");
    site.add_release(
        "v2",
        &format!(
            "'{}' sample-service --exit-after-ms 500 --exit-code 0 --armed-by '{}'\nsleep 60\n",
            bin.display(),
            armed.display()
        ),
    );
    let arming = site.arm_at("v2", "switched");
    let file = write(
        site.root(),
        "policy.json",
        r#"{"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 10000}}"#,
    );
    let out = site.deploy(free_port(), "v2", &["--policy", file.to_str().unwrap()]);
    arming.join().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let seen = load.finish();
    assert_none_failed(&seen, "v2's watch");
    let back = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "rolled_back")
        .unwrap();
    let exposure = &back["exposure"];
    assert_eq!(exposure["failed"], 0, "{back}");
    assert!(exposure["retried"].as_u64().unwrap_or(0) >= 1, "{back}");
    assert!(
        back["detail"].as_str().unwrap().contains(" 0 failed; "),
        "{back}"
    );
    let history = rollgate()
        .args(["log", "history", "--format", "json"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    let v2 = stdout(&history)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["version"] == "v2")
        .unwrap();
    assert_eq!(v2["users_failed"], 0, "{v2}");
}
