//! `rollgate rollout`: N replicas behind the real proxy, moved in waves by the real binary,
//! with the budgets sampled from outside while it runs.

use crate::common::http::*;
use crate::common::*;

use std::collections::BTreeMap;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A block of 100 ports for one test, below the kernel's ephemeral range (so no outgoing
/// connection lands in it) and away from `port_block`'s ports. The blocks of one run sit together
/// at a place chosen by the process id, so two test runs on one machine rarely share ports; the
/// first block from there that is wholly free is taken.
fn ports(block: u16) -> String {
    let run = (std::process::id() % 8) as u16;
    (0..16)
        .map(|shift| 20_000 + ((run + shift) % 8) * 1_200 + block * 100)
        .find(|first| {
            (*first..*first + 100).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        })
        .map(|first| format!("{first}-{}", first + 99))
        .expect("a free block of 100 ports")
}

fn rollout(site: &Site, version: &str, args: &[&str]) -> Output {
    rollgate()
        .args(["rollout", "edge-svc", version, "--root"])
        .arg(site.root())
        .args(args)
        .env("NO_COLOR", "1")
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap()
}

/// What a rollgate run said, both streams, for failure messages.
fn said(out: &Output) -> String {
    format!("{}{}", stdout(out), stderr(out))
}

fn control(site: &Site, what: &[&str]) -> Output {
    rollgate()
        .args(["rollout", what[0], "edge-svc", "--root"])
        .arg(site.root())
        .args(&what[1..])
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap()
}

fn rollout_in_background(site: &Site, version: &str, args: &[&str]) -> std::process::Child {
    std::process::Command::new(crate::common::bin())
        .args(["rollout", "edge-svc", version, "--root"])
        .arg(site.root())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn status(site: &Site) -> Value {
    let out = control(site, &["status", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `replicas.json`: slot → (version, port, pid).
fn pool(site: &Site) -> BTreeMap<u64, (String, u16, i32)> {
    let text = std::fs::read_to_string(site.root().join("replicas.json")).unwrap();
    let set: Value = serde_json::from_str(&text).unwrap();
    set["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["slot"].as_u64().unwrap(),
                (
                    r["version"].as_str().unwrap().to_string(),
                    r["port"].as_u64().unwrap() as u16,
                    r["pid"].as_i64().unwrap() as i32,
                ),
            )
        })
        .collect()
}

fn versions(site: &Site) -> Vec<String> {
    pool(site).into_values().map(|(v, _, _)| v).collect()
}

/// Replica processes of this root: started by a rollout (they carry `ROLLGATE_SLOT`).
fn replica_processes(site: &Site) -> Vec<i32> {
    site.processes()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                env.split(|b| *b == 0)
                    .any(|var| var.starts_with(b"ROLLGATE_SLOT="))
            })
        })
        .collect()
}

fn ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.starts_with("HTTP/1.1 200")
}

/// Every 50 ms while a rollout runs: the fewest ready replicas in the pool and the most
/// replica processes seen.
struct Sampler {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<(usize, usize, usize)>>,
    thread: std::thread::JoinHandle<()>,
}

impl Sampler {
    fn start(site: &Site) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new((usize::MAX, 0, 0)));
        let root = site.root().to_path_buf();
        let (s, k) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            let real = root;
            let read_pool = || {
                std::fs::read_to_string(real.join("replicas.json"))
                    .ok()
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                    .map(|v| {
                        v["replicas"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|r| r["port"].as_u64().unwrap() as u16)
                            .collect::<Vec<u16>>()
                    })
            };
            while !s.load(Ordering::SeqCst) {
                let before = read_pool();
                let ready_now = before
                    .as_ref()
                    .map(|ports| ports.iter().filter(|p| ready(**p)).count());
                let after = read_pool();
                let processes = replica_processes_under(&real);
                let mut k = k.lock().unwrap();
                // A pool that changed while it was probed is sampled again.
                if let (Some(n), true) = (ready_now, before == after) {
                    k.0 = k.0.min(n);
                    k.2 += 1;
                }
                k.1 = k.1.max(processes);
                drop(k);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Sampler { stop, seen, thread }
    }

    /// (fewest ready in the pool, most processes, samples).
    fn finish(self) -> (usize, usize, usize) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap();
        *self.seen.lock().unwrap()
    }
}

fn replica_processes_under(root: &std::path::Path) -> usize {
    let root = std::fs::canonicalize(root).unwrap();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(&root))
                && !is_zombie(*pid)
                && std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                    env.split(|b| *b == 0)
                        .any(|var| var.starts_with(b"ROLLGATE_SLOT="))
                })
        })
        .count()
}

fn summary(site: &Site) -> Value {
    let out = rollgate()
        .args(["log", "summary"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `replicas` of v1 on the test's port block: a first install starts every replica at once,
/// so a busy machine gets a generous gate.
fn install(site: &Site, replicas: usize, block: u16) {
    site.release("v1", "");
    let out = rollout(
        site,
        "v1",
        &[
            "--replicas",
            &replicas.to_string(),
            "--ports",
            &ports(block),
            "--deadline-ms",
            "20000",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(versions(site), vec!["v1"; replicas]);
}

/// Ten replicas of v1 behind the proxy.
fn ten_of_v1(site: &Site, block: u16) -> Proxy {
    install(site, 10, block);
    Proxy::start(site, &[])
}

#[test]
fn ten_replicas_move_in_waves_behind_the_proxy_with_no_failed_request_and_the_budgets_kept() {
    let site = Site::new();
    let proxy = ten_of_v1(&site, 0);
    site.release("v2", "--ready-after-ms 150");
    let load = Load::start(proxy.port, 4, Duration::from_millis(2));
    let sampler = Sampler::start(&site);
    let out = rollout(&site, "v2", &["--waves", "1,10,50,100", "--soak", "1s"]);
    let (fewest_ready, most_processes, samples) = sampler.finish();
    let seen = load.finish();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_none_failed(&seen, "rollout v1 → v2");
    assert!(seen.len() > 200, "only {} requests", seen.len());
    assert!(seen.iter().any(|(_, body, _)| body == "v1"));
    assert!(seen.iter().any(|(_, body, _)| body == "v2"));
    // Budgets without a policy: surge ceil(10 × 25 %) = 3, unavailable 0.
    assert!(samples > 20, "only {samples} samples");
    assert_eq!(fewest_ready, 10, "the pool fell below N - unavailable");
    assert!(
        most_processes <= 13,
        "{most_processes} processes > N + surge"
    );
    assert_eq!(versions(&site), vec!["v2"; 10]);
    assert_eq!(replica_processes(&site).len(), 10, "no old replica left");

    let s = status(&site);
    assert_eq!(s["state"], "completed");
    assert_eq!(s["counts"]["succeeded"], 10);
    let sizes: Vec<usize> = s["waves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, [1, 1, 3, 5], "cumulative 1, 2, 5, 10");
    // Exactly one promoted for the rollout, and the lesson's summary calls v2 live.
    assert_eq!(count_events(&site, "promoted", "v2"), 1);
    assert_eq!(count_events(&site, "wave_completed", "v2"), 4);
    assert_eq!(count_events(&site, "replica_ready", "v2"), 10);
    assert_eq!(summary(&site)["live"], "v2");
    // `rollgate status` tells the pool and the last rollout.
    let out = rollgate()
        .args(["status", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let root_status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(root_status["replicas"].as_array().unwrap().len(), 10);
    assert_eq!(root_status["rollout"]["state"], "completed");
    assert_eq!(root_status["live"]["version"], "v2");
    // Each replica got its slot and its own output file.
    for slot in 0..10 {
        assert!(site
            .root()
            .join(format!("output/v2/edge-svc.{slot}.output"))
            .exists());
    }
    drop(proxy);
}

#[test]
fn a_wave_that_fails_pauses_itself_and_abort_with_rollback_returns_every_replica() {
    let site = Site::new();
    let proxy = ten_of_v1(&site, 1);
    let bin = crate::common::bin();
    // Waves of 1, 2, 5, 10: wave 2 holds slots 2, 3 and 4, where v3 is never ready.
    site.script(
        "v3",
        &format!(
            "case \"$ROLLGATE_SLOT\" in 2|3|4) exec '{b}' sample-service --readyz-status 503;; esac\nexec '{b}' sample-service\n",
            b = bin.display()
        ),
    );
    let load = Load::start(proxy.port, 4, Duration::from_millis(2));
    let out = rollout(
        &site,
        "v3",
        &[
            "--waves",
            "1,10,50,100",
            "--soak",
            "200ms",
            "--deadline-ms",
            "800",
        ],
    );
    assert_eq!(out.status.code(), Some(3), "paused: {}", said(&out));
    assert!(stdout(&out).contains("paused itself"), "{}", stdout(&out));
    let s = status(&site);
    assert_eq!(s["state"], "paused");
    assert_eq!(s["current_wave"], 2);
    let reason = s["pause_reason"].as_str().unwrap();
    assert!(reason.contains("wave 2 paused itself"), "{reason}");
    assert!(reason.contains("not ready after 800 ms"), "{reason}");
    let paused = site
        .log_lines()
        .into_iter()
        .filter(|l| l["event"] == "rollout_paused")
        .collect::<Vec<_>>();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0]["wave"], 2);
    // Slots 0 and 1 took v3; the wave's others are back on v1 (or never left it).
    let now = versions(&site);
    assert_eq!(&now[..2], ["v3", "v3"]);
    assert!(now[2..].iter().all(|v| v == "v1"), "{now:?}");
    assert_eq!(
        replica_processes(&site).len(),
        10,
        "failed replicas stopped"
    );

    let out = control(
        &site,
        &["abort", "--rollback", "--reason", "v3 fails on wave 2"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let seen = load.finish();
    assert_none_failed(&seen, "pause, then abort --rollback");
    assert_eq!(versions(&site), vec!["v1"; 10]);
    assert_eq!(replica_processes(&site).len(), 10);
    let s = status(&site);
    assert_eq!(s["state"], "aborted");
    assert_eq!(s["counts"]["rolled_back"], 2);
    assert_eq!(s["abort_cause"]["reason"], "v3 fails on wave 2");
    assert_eq!(count_events(&site, "rolled_back", "v3"), 1);
    assert_eq!(count_events(&site, "promoted", "v3"), 0);
    assert_eq!(summary(&site)["live"], "v1");
    // History and stats tell the rollout by its waves.
    let out = rollgate()
        .args(["log", "history", "--format", "json"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    let rows: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let v3 = rows.iter().find(|r| r["version"] == "v3").unwrap();
    assert_eq!(v3["outcome"], "rolled_back");
    assert_eq!(v3["waves"], 2, "waves 0 and 1 completed");
    assert_eq!(v3["failures_per_wave"], "0, 0, 1");
    assert_eq!(v3["pauses"], 1);
    let out = rollgate()
        .args(["log", "stats", "--format", "json"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &stats["rollouts"];
    assert_eq!(
        (&r["rollouts"], &r["completed"], &r["aborted"]),
        (&2.into(), &1.into(), &1.into())
    );
    assert_eq!(r["replica_failures"], 1);
    assert_eq!(r["pauses"], 1);
    assert_eq!(r["wave_time"]["count"], 6, "4 waves of v1, 2 of v3");
    // An aborted rollout changes no more.
    let out = control(&site, &["resume"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("only a running or paused rollout can be resumed"),
        "{}",
        stderr(&out)
    );
    drop(proxy);
}

fn policy(site: &Site, extra: &str) -> std::path::PathBuf {
    write(
        site.root(),
        "policy.json",
        &format!(
            r#"{{"edge_svc": {{"progress_deadline_ms": 700, "poll_ms": 50, "max_unavailable_pct": 0,
                "max_surge_pct": 100, "on_stall": "rollback" {extra}}}}}"#
        ),
    )
}

#[test]
fn a_required_replica_not_confirmed_by_the_release_deadline_aborts_with_its_cause() {
    let site = Site::new();
    site.release("v2", "");
    install(&site, 3, 2);
    // Slot 2 is required and in the last wave; the soak before it outlasts the deadline.
    let file = policy(
        &site,
        r#", "replicas": 3, "waves": [34, 67, 100], "soak_ms": 5000,
            "release_deadline_ms": 1500, "classes": {"2": "required"}"#,
    );
    let out = rollout(&site, "v2", &["--policy", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "aborted: {}", said(&out));
    // Aborted at the deadline, by the run's own clock (its log's times): not after the 5 s
    // soak. (Timed by the wall clock around the command, a loaded machine once failed it.)
    let ts = |event: &str| {
        site.log_lines()
            .iter()
            .find(|l| l["event"] == event)
            .and_then(|l| l["ts"].as_f64())
            .unwrap()
    };
    let took = ts("rolled_back") - ts("rollout_started");
    assert!(
        (1.5..5.0).contains(&took),
        "aborted {took:.3} s after the start, not at the 1500 ms deadline: {:#?}",
        site.log_lines()
    );
    let s = status(&site);
    assert_eq!(s["state"], "aborted");
    assert_eq!(s["abort_cause"]["slot"], 2);
    // Still soaking the first wave: the canary phase.
    assert_eq!(s["abort_cause"]["phase"], "canary");
    let reason = s["abort_cause"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("not confirmed by the release deadline"),
        "{reason}"
    );
    let rolled_back: Vec<Value> = site
        .log_lines()
        .into_iter()
        .filter(|l| l["event"] == "rolled_back")
        .collect();
    assert_eq!(rolled_back.len(), 1);
    assert_eq!(rolled_back[0]["slot"], 2);
    // Users had the canary wave; what ended it was the deadline, not a person.
    assert_eq!(
        rolled_back[0]["exposure"]["ended_by"], "the release deadline",
        "{}",
        rolled_back[0]
    );
    assert_eq!(summary(&site)["live"], "v1");
}

#[test]
fn a_required_failure_aborts_at_once_a_best_effort_one_under_the_ratio_does_not_and_left_behind_stays(
) {
    let site = Site::new();
    let bin = crate::common::bin();
    install(&site, 4, 3);
    // v2 exits at boot on slot 1 only.
    site.script(
        "v2",
        &format!(
            "[ \"$ROLLGATE_SLOT\" = 1 ] && exec '{b}' sample-service --exit-after-ms 0 --exit-code 9\nexec '{b}' sample-service\n",
            b = bin.display()
        ),
    );
    // One wave of slots 0-2 (slot 3 is left behind); one failure in three is under 0.5.
    let file = policy(
        &site,
        r#", "waves": [100], "max_failure_ratio": 0.5, "classes": {"3": "left_behind"}"#,
    );
    let out = rollout(&site, "v2", &["--policy", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "completed: {}", said(&out));
    assert_eq!(versions(&site), ["v2", "v1", "v2", "v1"]);
    let s = status(&site);
    assert_eq!(s["counts"]["failed"], 1);
    assert_eq!(s["counts"]["left_behind"], 1);
    let error = s["slots"][1]["error"].as_str().unwrap();
    assert!(error.contains("exited with exit status: 9"), "{error}");
    // Each replica that got ready says so: the two of v2.
    assert_eq!(count_events(&site, "replica_ready", "v2"), 2);

    // Now slot 1 is required: its failure aborts at once, naming it — before the others, which
    // take 10 s, are ready (a run that waited for its wave would log them ready).
    site.script(
        "v3",
        &format!(
            "[ \"$ROLLGATE_SLOT\" = 1 ] && exec '{b}' sample-service --exit-after-ms 0\nexec '{b}' sample-service --ready-after-ms 10000\n",
            b = bin.display()
        ),
    );
    let file = policy(
        &site,
        r#", "waves": [100], "max_failure_ratio": 0.5, "classes": {"1": "required", "3": "left_behind"}"#,
    );
    let out = rollout(&site, "v3", &["--policy", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert_eq!(
        count_events(&site, "replica_ready", "v3"),
        0,
        "not at once: a v3 replica got ready before the abort"
    );
    let s = status(&site);
    assert_eq!(s["abort_cause"]["slot"], 1);
    assert_eq!(s["abort_cause"]["phase"], "canary");
    assert_eq!(versions(&site), ["v2", "v1", "v2", "v1"]);
    assert_eq!(replica_processes(&site).len(), 4);
}

#[test]
fn pause_resume_and_abort_from_another_shell_and_refusals() {
    let site = Site::new();
    site.release("v2", "");
    // Nothing to change yet.
    let out = control(&site, &["pause"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no rollout"), "{}", said(&out));
    install(&site, 4, 4);
    let out = control(&site, &["resume"]);
    assert_eq!(out.status.code(), Some(2), "a completed rollout");

    let mut running = rollout_in_background(&site, "v2", &["--soak", "3s"]);
    assert!(
        wait_for(20, || count_events(&site, "wave_completed", "v2") >= 1),
        "first wave"
    );
    let long = "x".repeat(501);
    let out = control(&site, &["pause", "--reason", &long]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("at most 500"), "{}", said(&out));
    let out = control(&site, &["resume"]);
    assert_eq!(out.status.code(), Some(2), "running, not paused");
    let out = control(&site, &["pause", "--reason", "checking dashboards"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let status_code = running.wait().unwrap().code();
    assert_eq!(
        status_code,
        Some(3),
        "the rollout's own rollgate exits paused"
    );
    let s = status(&site);
    assert_eq!(s["state"], "paused");
    assert_eq!(s["pause_reason"], "checking dashboards");
    let out = control(&site, &["pause"]);
    assert_eq!(out.status.code(), Some(2), "already paused");

    // Resume runs it here, to the end.
    let out = control(&site, &["resume"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(versions(&site), vec!["v2"; 4]);
    assert_eq!(count_events(&site, "rollout_resumed", "v2"), 1);

    // Abort from another shell while it runs: its rollgate exits 1.
    site.release("v3", "");
    let mut running = rollout_in_background(&site, "v3", &["--soak", "3s"]);
    assert!(wait_for(20, || count_events(&site, "wave_completed", "v3") >= 1));
    let out = control(&site, &["abort", "--reason", "not today"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(running.wait().unwrap().code(), Some(1));
    let s = status(&site);
    assert_eq!(s["state"], "aborted");
    assert_eq!(s["abort_cause"]["reason"], "not today");
    // Without --rollback the canary keeps v3.
    assert_eq!(versions(&site).iter().filter(|v| *v == "v3").count(), 1);
}

#[test]
fn a_rollout_whose_rollgate_was_killed_is_resumed_to_the_same_end_with_nothing_left_over() {
    let site = Site::new();
    site.release("v2", "--ready-after-ms 300");
    install(&site, 6, 5);
    let mut running = rollout_in_background(&site, "v2", &["--soak", "200ms"]);
    // Killed while wave 2's replicas are being gated.
    assert!(wait_for(30, || count_events(
        &site,
        "replica_started",
        "v2"
    ) >= 3));
    send_signal(running.id() as i32, 9);
    running.wait().unwrap();
    // A new rollout is refused while this one is unfinished.
    let out = rollout(&site, "v2", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("rollout resume"), "{}", said(&out));
    let out = control(&site, &["resume"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(versions(&site), vec!["v2"; 6]);
    let live: Vec<i32> = pool(&site).into_values().map(|(_, _, pid)| pid).collect();
    let mut running_now = replica_processes(&site);
    running_now.sort();
    let mut expected = live.clone();
    expected.sort();
    assert_eq!(running_now, expected, "exactly the pool runs");
    assert_eq!(count_events(&site, "promoted", "v2"), 1);
}

#[test]
fn a_single_deploy_is_refused_on_a_root_served_by_replicas() {
    let site = Site::new();
    install(&site, 2, 6);
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("rollgate rollout"), "{}", said(&out));
    // The first rollout needs ports; a bad range is named.
    let other = Site::new();
    other.release("v1", "");
    let out = rollout(&other, "v1", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--ports"), "{}", said(&out));
    let out = rollout(&other, "v1", &["--ports", "9010-9001"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("empty"), "{}", said(&out));
    assert!(!other.root().join("rollout.json").exists());
}

#[test]
fn a_rollout_killed_during_a_soak_resumes_the_soak_not_the_release_deadline() {
    let site = Site::new();
    site.release("v2", "");
    install(&site, 3, 7);
    let mut running = rollout_in_background(&site, "v2", &["--soak", "1s"]);
    assert!(wait_for(30, || count_events(&site, "wave_completed", "v2") >= 1));
    send_signal(running.id() as i32, 9);
    running.wait().unwrap();
    let started = Instant::now();
    let out = control(&site, &["resume"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    // Two more soaks of 1 s and three quick gates; the release deadline is 124.5 s away.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(60), "resume took {took:?}");
    assert_eq!(versions(&site), vec!["v2"; 3]);
}

/// A replica is judged in its soak as a deploy is in its watch: a hiccup of two readiness
/// probes answered 503 (fewer than `watch_failures`, 3 by default) is tolerated; three in a row
/// fail it. (CI saw a wave pause itself for one probe that got no answer within 1 s on a loaded
/// host.) The hiccup is armed at the replica's `replica_ready` line: it falls in the soak.
#[test]
fn a_soak_tolerates_fewer_failed_probes_in_a_row_than_watch_failures() {
    for (hiccup, fails) in [(2, false), (3, true)] {
        let site = Site::new();
        install(&site, 2, 11);
        let armed = site.armed_file("v2");
        site.release(
            "v2",
            &format!("--unready-probes {hiccup} --armed-by '{}'", armed.display()),
        );
        let file = write(
            site.root(),
            "policy.json",
            r#"{"edge_svc": {"progress_deadline_ms": 20000, "poll_ms": 100, "max_unavailable_pct": 0,
                "max_surge_pct": 100, "on_stall": "rollback", "waves": [50, 100], "soak_ms": 3000}}"#,
        );
        let arming = site.arm_at("v2", "replica_ready");
        let out = rollout(&site, "v2", &["--policy", file.to_str().unwrap()]);
        arming.join().unwrap();
        if fails {
            assert_eq!(out.status.code(), Some(3), "paused: {}", said(&out));
            let reason = status(&site)["pause_reason"].as_str().unwrap().to_string();
            assert!(
                reason.contains("failed 3 probes in a row during the soak (last: HTTP 503)"),
                "{reason}"
            );
            assert_eq!(versions(&site), ["v1", "v1"]);
        } else {
            assert_eq!(out.status.code(), Some(0), "{}", said(&out));
            assert_eq!(versions(&site), ["v2", "v2"]);
        }
    }
}

#[test]
fn a_replica_must_stay_ready_for_min_ready_ms_before_it_joins_the_pool() {
    let site = Site::new();
    install(&site, 2, 8);
    // Ready at once, gone 300 ms later: the single deploy's gate alone would pass it.
    site.release("v2", "--exit-after-ms 300");
    let file = policy(&site, r#", "waves": [100], "min_ready_ms": 1000"#);
    let out = rollout(&site, "v2", &["--policy", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "paused: {}", said(&out));
    let s = status(&site);
    let reason = s["pause_reason"].as_str().unwrap();
    assert!(reason.contains("ms after it was first ready"), "{reason}");
    assert_eq!(versions(&site), ["v1", "v1"], "it never joined the pool");
    assert_eq!(count_events(&site, "replica_ready", "v2"), 0);
}

#[test]
fn a_smaller_replica_count_scales_the_pool_down_first_with_no_failed_request() {
    let site = Site::new();
    install(&site, 5, 9);
    let proxy = Proxy::start(&site, &[]);
    let removed: Vec<i32> = pool(&site)
        .into_iter()
        .filter(|(slot, _)| *slot >= 3)
        .map(|(_, (_, _, pid))| pid)
        .collect();
    site.release("v2", "");
    let dry = rollout(&site, "v2", &["--replicas", "3", "--dry-run"]);
    assert!(
        stdout(&dry).contains("first scale down to 3 replicas: drain and stop slot(s) 3, 4"),
        "{}",
        said(&dry)
    );
    let load = Load::start(proxy.port, 4, Duration::from_millis(2));
    let out = rollout(&site, "v2", &["--replicas", "3", "--soak", "200ms"]);
    let seen = load.finish();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_none_failed(&seen, "rollout v1 → v2 from 5 replicas to 3");
    assert_eq!(pool(&site).keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(versions(&site), vec!["v2"; 3]);
    for pid in removed {
        assert!(!alive(pid), "removed replica {pid} still runs");
    }
    let mut running = replica_processes(&site);
    running.sort();
    let mut live: Vec<i32> = pool(&site).into_values().map(|(_, _, pid)| pid).collect();
    live.sort();
    assert_eq!(running, live, "exactly the pool runs");
    // The removals are logged under the version they ran, before any replica started.
    let events = site.events();
    let first_start = events
        .iter()
        .position(|(e, v)| e == "replica_started" && v == "v2");
    let removals: Vec<usize> = (0..events.len())
        .filter(|i| events[*i].0 == "replica_removed")
        .collect();
    assert_eq!(removals.len(), 2, "{events:?}");
    assert!(removals
        .iter()
        .all(|i| Some(*i) < first_start && events[*i].1 == "v1"));
    let s = status(&site);
    assert_eq!(s["state"], "completed");
    assert_eq!(s["counts"]["removed"], 2);
    // Scaling down again on the same version is a rollout of its own, not "nothing to do".
    let out = rollout(&site, "v2", &["--replicas", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(pool(&site).keys().copied().collect::<Vec<_>>(), [0]);
    assert_eq!(replica_processes(&site).len(), 1);
    drop(proxy);
}

/// Issue 36: two replicas rolled to v2 in waves of 50 and 100 %, paused in the canary's soak;
/// meanwhile the canary's v2 process is killed. The resume used to print "completed … 1
/// succeeded, 1 failed" and exit 0 with slot 0 back on v1. A failure found while paused counts:
/// the resume starts slot 0 again, and "completed" means both replicas run v2.
#[test]
fn a_replica_that_dies_while_paused_is_not_waved_through_by_the_resume() {
    let site = Site::new();
    site.release("v2", "");
    install(&site, 2, 10);
    let mut running = rollout_in_background(&site, "v2", &["--waves", "50,100", "--soak", "5s"]);
    assert!(
        wait_for(30, || count_events(&site, "wave_completed", "v2") >= 1),
        "the canary's wave"
    );
    let out = control(&site, &["pause", "--reason", "looking"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(running.wait().unwrap().code(), Some(3));
    let (_, (version, _, canary)) = pool(&site)
        .into_iter()
        .find(|(_, (v, _, _))| v == "v2")
        .expect("the canary on v2");
    assert_eq!(version, "v2");
    send_signal(canary, 9);
    assert!(wait_for(10, || !alive(canary) || is_zombie(canary)));

    let out = control(&site, &["resume"]);
    let text = said(&out);
    assert!(
        !text.contains("1 failed"),
        "a failed replica waved through: {text}"
    );
    match out.status.code() {
        // Started again and ready: every replica on v2, the dead canary replaced.
        Some(0) => {
            assert_eq!(versions(&site), ["v2", "v2"], "{text}");
            assert!(pool(&site).values().all(|(_, _, pid)| *pid != canary));
            assert_eq!(count_events(&site, "promoted", "v2"), 1);
        }
        // Or paused again for a person, with the failure counted.
        Some(3) => assert_eq!(status(&site)["state"], "paused", "{text}"),
        other => panic!("resume exited {other:?}: {text}"),
    }
    let mut running_now = replica_processes(&site);
    running_now.retain(|pid| !is_zombie(*pid));
    let described: Vec<String> = running_now
        .iter()
        .map(|pid| {
            format!(
                "{pid}: {:?}",
                std::fs::read_link(format!("/proc/{pid}/cwd"))
            )
        })
        .collect();
    assert_eq!(
        running_now.len(),
        2,
        "exactly the pool runs: {described:?} {:?}\n{}",
        pool(&site),
        site.log_lines()
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Issue 67, 2 (the replica root's part): a rollout that would change the service's user is
/// refused before anything starts, saying so — the old replicas keep serving as they were.
#[test]
fn a_rollout_that_changes_the_services_user_is_refused_before_anything_starts() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "");
    let first = port_block(20);
    let ports = format!("{first}-{}", first + 19);
    let out = site.rollout("v1", &["--replicas", "2", "--ports", &ports]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let before = site.log_lines().len();
    let policy = isolation_policy(&site, 5_000, r#"{"user": "nobody"}"#);
    let out = site.rollout(
        "v2",
        &["--replicas", "2", "--ports", &ports, "--policy", &policy],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("replicas run as its own uid, and the policy says user nobody"),
        "{}",
        stderr(&out)
    );
    assert_eq!(replica_versions(&site), ["v1", "v1"]);
    assert_eq!(site.log_lines().len(), before, "nothing was started");
}
