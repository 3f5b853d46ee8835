//! Issue 69: a release's process types besides web (its Procfile's other lines) run as slots of
//! its deploy. Each type's new processes start by its rule (workers beside their old ones; a
//! singleton clock only once everything else is ready, and only after its old one is gone),
//! are gated by its readiness, and web switches last; the old workers run on until the release
//! is promoted. A type that fails rolls the whole release back: web never switched, the old
//! workers and clock still running, untouched.

use crate::common::http::{assert_none_failed, Load, Proxy};
use crate::common::*;

const POLICY: &str = "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  processes:\n    worker:\n      replicas: 2\n      min_ready_ms: 300\n    clock:\n      singleton: true\n      min_ready_ms: 300\n";

/// A process that says when it starts and stops, in `$STATE_DIRECTORY/NAME.log`.
fn looping(name: &str) -> String {
    format!(
        "echo \"{name} up on $ROLLGATE_VERSION\"\n\
         echo \"start $ROLLGATE_VERSION $$ $(date +%s%N)\" >> \"$STATE_DIRECTORY/{name}.log\"\n\
         trap 'echo \"stop $ROLLGATE_VERSION $$ $(date +%s%N)\" >> \"$STATE_DIRECTORY/{name}.log\"; exit 0' TERM\n\
         while :; do sleep 0.05; done\n"
    )
}

/// Installs `version`: web (the sample service), and this Procfile with its scripts.
fn add(site: &Site, version: &str, procfile: &str, scripts: &[(&str, String)]) {
    let mut files: Vec<(&str, &str)> = vec![("Procfile", procfile)];
    files.extend(scripts.iter().map(|(name, body)| (*name, body.as_str())));
    site.add_sample_with(version, &files);
}

fn good(site: &Site, version: &str) {
    add(
        site,
        version,
        "worker: exec sh worker.sh\nclock: exec sh clock.sh\n",
        &[
            ("worker.sh", looping("worker")),
            ("clock.sh", looping("clock")),
        ],
    );
}

/// `formation.json`: (type.index, version, pid) of each live process of another type.
fn formation(site: &Site) -> Vec<(String, String, i32)> {
    typed_processes(site.root())
        .iter()
        .map(|p| {
            (
                format!("{}.{}", p["process_type"].as_str().unwrap(), p["index"]),
                p["version"].as_str().unwrap().to_string(),
                p["pid"].as_i64().unwrap() as i32,
            )
        })
        .collect()
}

/// The (start, stop) times of each clock process, by pid, from its log.
fn clock_intervals(site: &Site) -> Vec<(u128, u128)> {
    let text = std::fs::read_to_string(site.root().join("data/clock.log")).unwrap_or_default();
    let mut intervals: Vec<(String, u128, u128)> = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split(' ').collect();
        let (what, pid, at) = (
            words[0],
            words[2].to_string(),
            words[3].parse::<u128>().unwrap(),
        );
        match what {
            "start" => intervals.push((pid, at, u128::MAX)),
            // The stop of the latest process of that pid still running: pids are reused (the
            // kernel's pid_max here is 32768, and a long test starts many clocks), and an earlier
            // clock of the same pid once took a later one's stop — two clocks at once, seen
            // where there were none.
            _ => {
                if let Some(i) = intervals
                    .iter_mut()
                    .rev()
                    .find(|i| i.0 == pid && i.2 == u128::MAX)
                {
                    i.2 = at;
                }
            }
        }
    }
    intervals.into_iter().map(|(_, a, b)| (a, b)).collect()
}

/// No two clock processes ever ran at once (their logged intervals never overlap).
fn never_two_clocks(site: &Site, when: &str) {
    let mut clocks = clock_intervals(site);
    clocks.sort();
    for pair in clocks.windows(2) {
        assert!(
            pair[0].1 < pair[1].0,
            "{when}: two clocks at once: {clocks:?}"
        );
    }
}

#[test]
fn a_release_s_workers_and_clock_are_replaced_with_it_and_a_failing_worker_rolls_it_back_whole() {
    let site = Site::new();
    let policy = write(site.root(), "policy.yaml", POLICY);
    let policy = ["--policy", policy.to_str().unwrap(), "--watch-ms", "300"];
    good(&site, "v1");
    let out = site.deploy(free_port(), "v1", &policy);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v1 = formation(&site);
    let names: Vec<&str> = v1.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["worker.0", "worker.1", "clock.0"]);
    assert!(v1.iter().all(|p| p.1 == "v1" && alive(p.2)), "{v1:?}");
    // Issue 81, 5: `ps` shows each keeper as what it keeps (it was `/proc/self/exe keep`).
    let shown = |pid: i32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let parent = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap();
        let cmdline = std::fs::read(format!("/proc/{parent}/cmdline")).unwrap();
        String::from_utf8_lossy(&cmdline)
            .replace('\0', " ")
            .trim()
            .to_string()
    };
    assert_eq!(
        shown(site.live_pid().unwrap()),
        "rollgate keep edge-svc web"
    );
    for (name, _, pid) in &v1 {
        assert_eq!(shown(*pid), format!("rollgate keep edge-svc {name}"));
    }

    // v2: every process replaced; the old ones stopped; never two clocks.
    good(&site, "v2");
    let port = free_port();
    let out = site.deploy(port, "v2", &policy);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(version_on(port).as_deref(), Some("v2"));
    let v2 = formation(&site);
    assert!(v2.iter().all(|p| p.1 == "v2" && alive(p.2)), "{v2:?}");
    assert!(
        wait_for(10, || v1.iter().all(|p| !alive(p.2))),
        "v1's processes still run"
    );
    let clocks = clock_intervals(&site);
    assert_eq!(clocks.len(), 2, "{clocks:?}");
    assert!(clocks[0].1 < clocks[1].0, "two clocks at once: {clocks:?}");
    let worker_log = std::fs::read_to_string(site.root().join("data/worker.log")).unwrap();
    assert_eq!(worker_log.matches("start v2").count(), 2, "{worker_log}");
    // Each process of the release is on the record, by name.
    let said: Vec<String> = site
        .log_lines()
        .into_iter()
        .filter(|l| l["event"] == "process" && l["version"] == "v2")
        .map(|l| l["detail"].as_str().unwrap().to_string())
        .collect();
    assert!(
        said.iter().any(|d| d.starts_with("worker.1 v2 ready")),
        "{said:?}"
    );

    // `release list` names each release's types.
    let out = site.run(&["release", "list", "--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v2_listed = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["version"] == "v2")
        .unwrap();
    assert_eq!(v2_listed["types"], serde_json::json!(["worker", "clock"]));

    // `logs --type` reads each process of a type, labelled.
    let out = site.run(&["logs", "edge-svc", "--type", "worker"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(
        said.contains("[worker.0] worker up on v2") && said.contains("[worker.1] worker up on v2"),
        "{said}"
    );
    let out = site.run(&["logs", "edge-svc", "--type", "mailer"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("has run no `mailer` process"),
        "{}",
        stderr(&out)
    );

    // v3's worker exits at start: rolled back whole — web never switched, v2's processes the
    // very same ones, the clock never touched.
    add(
        &site,
        "v3",
        "worker: echo 'cannot open the database' >&2; exit 3\nclock: exec sh clock.sh\n",
        &[("clock.sh", looping("clock"))],
    );
    let live = site.pointer().unwrap();
    let out = site.deploy(free_port(), "v3", &policy);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["pid"], live["pid"]);
    assert_eq!(version_on(port).as_deref(), Some("v2"));
    assert_eq!(formation(&site), v2);
    assert!(v2.iter().all(|p| alive(p.2)));
    assert_eq!(clock_intervals(&site).len(), 2, "v3's clock never started");
    let rolled_back = site
        .log_lines()
        .into_iter()
        .find(|l| l["event"] == "rolled_back" && l["version"] == "v3")
        .unwrap();
    let detail = rolled_back["detail"].as_str().unwrap();
    // It names the process that failed, and quotes what it said.
    assert!(detail.starts_with("process worker."), "{detail}");
    assert!(
        detail.contains("output: cannot open the database"),
        "{detail}"
    );

    // A worker killed is started again by its keeper, and `processes.json` follows it.
    let killed = v2[0].2;
    send_signal(killed, 9);
    assert!(
        wait_for(20, || formation(&site)
            .first()
            .is_some_and(|p| p.2 != killed && alive(p.2))),
        "{:?}",
        formation(&site)
    );
    // `status` shows each type: how many run, each one's pid, uptime and restarts.
    let status = stdout(&site.run(&["status"]));
    let worker_row = status
        .lines()
        .find(|l| l.contains("worker.0 v2 pid"))
        .unwrap_or_default();
    assert!(
        worker_row.contains("2 of 2 running: worker.0 v2 pid"),
        "{status}"
    );
    assert!(
        worker_row.contains("1 restart;") && worker_row.contains("runs `exec sh worker.sh`"),
        "{status}"
    );
    let clock_row = status
        .lines()
        .find(|l| l.contains("clock.0 v2 pid"))
        .unwrap_or_default();
    assert!(
        clock_row.contains("1 of 1 running: clock.0 v2 pid") && clock_row.contains("0 restarts"),
        "{status}"
    );
    // `stop` stops every process of the release; `start` starts every one again.
    site.stop_service();
    let stopped = formation(&site);
    assert!(
        wait_for(10, || stopped.iter().all(|p| !alive(p.2))),
        "{stopped:?}"
    );
    let out = site.run(&["start", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let started = formation(&site);
    assert!(
        started.iter().all(|p| p.1 == "v2" && alive(p.2)),
        "{started:?}"
    );
    assert_eq!(
        clock_intervals(&site).len(),
        3,
        "one clock again, after the stop"
    );
    site.stop_service();
}

/// The processes running a script of the root's releases (`NAME.sh` in their command line,
/// their folder in the root); not the script's own forks (a `sleep` or a `$(date)` before its
/// exec carries the script's command line).
fn running(site: &Site, script: &str) -> Vec<i32> {
    running_in(site.root(), script)
}

/// [`running`], for the root at `root`.
fn running_in(root: &std::path::Path, script: &str) -> Vec<i32> {
    let found = scripts(root, script);
    let parent = |pid: i32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|p| p.trim().parse::<i32>().ok())
    };
    let top: Vec<i32> = found
        .iter()
        .copied()
        .filter(|pid| parent(*pid).is_none_or(|p| !found.contains(&p)))
        .collect();
    // /proc is not read at one instant: an old process that ended and its successor that
    // started while the scan went on were both seen. Each is looked at again once the scan is
    // over; every one still there then was there at the same time as the others (each was seen
    // before the first of these second looks, and is still there after it).
    let mentions = |pid: &i32| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).contains(script) && !is_zombie(*pid)
    };
    top.into_iter().filter(mentions).collect()
}

fn scripts(root: &std::path::Path, script: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let mentions = String::from_utf8_lossy(&cmdline).contains(script);
        let here =
            std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(root));
        if mentions && here && !is_zombie(pid) {
            found.push(pid);
        }
    }
    found
}

/// Issue 69, 7: a deploy of web, two workers and a singleton clock, killed (-9) after each of
/// its actions in turn — its keepers with it — then `up`: the release is whole (every process of one version, all
/// running, web answering on what `current` names), the attempt has one outcome line, and two
/// clocks never ran at once.
#[test]
fn a_deploy_of_several_types_killed_after_any_action_is_finished_whole_by_up() {
    killed_after_each_action_then_up(Run::Deploy { watch_ms: "200" });
}

/// The same with no watch: the old processes of the other types go right after the switch.
#[test]
fn a_deploy_of_several_types_with_no_watch_killed_after_any_action_is_finished_whole_by_up() {
    killed_after_each_action_then_up(Run::Deploy { watch_ms: "0" });
}

/// The same for `restart` (a fresh process of each beside the running one): the formation's
/// random-kill test found an old worker running on, named by nothing, after a restart killed
/// once it had promoted.
#[test]
fn a_restart_of_several_types_killed_after_any_action_is_finished_whole_by_up() {
    killed_after_each_action_then_up(Run::Restart);
}

/// What [`killed_after_each_action_then_up`] runs again and again.
#[derive(Clone, Copy)]
enum Run {
    /// A deploy of the other version, on a port of its own.
    Deploy { watch_ms: &'static str },
    /// A restart of the live version, on the root's range of ports.
    Restart,
}

fn killed_after_each_action_then_up(run: Run) {
    use std::os::unix::process::ExitStatusExt;
    let site = Site::new();
    let policy = write(site.root(), "policy.yaml", POLICY);
    good(&site, "v1");
    good(&site, "v2");
    let first = port_block(4);
    let range = format!("{first}-{}", first + 3);
    // Every run takes its port from the root's four (a fresh port each time took dozens from
    // the ports the whole suite shares, and once they came round again another test's port
    // was handed out while its release was between two processes).
    let deploy = |version: &str, fault: Option<u64>| {
        let mut command = rollgate();
        let args: Vec<&str> = match (run, fault) {
            (Run::Deploy { watch_ms }, _) => vec![
                "deploy",
                "edge-svc",
                version,
                "--ports",
                &range,
                "--watch-ms",
                watch_ms,
            ],
            (Run::Restart, None) => vec!["deploy", "edge-svc", version, "--ports", &range],
            (Run::Restart, Some(_)) => vec!["restart", "edge-svc", "--ports", &range],
        };
        command
            .args(args)
            .arg("--root")
            .arg(site.root())
            .args(["--policy", policy.to_str().unwrap()])
            .timeout(std::time::Duration::from_secs(60));
        if let Some(k) = fault {
            command.env("ROLLGATE_FAULT", format!("kill-after-action:{k}"));
        }
        command.output().unwrap()
    };
    let out = deploy("v1", None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut k = 1;
    loop {
        let live = site.pointer().unwrap()["version"]
            .as_str()
            .unwrap()
            .to_string();
        let next = if live == "v1" { "v2" } else { "v1" };
        let out = deploy(next, Some(k));
        let killed = out.status.signal() == Some(9);
        if killed {
            // The whole group goes, as at a `kill -9` of the unit: with no keeper left to name
            // a process, only the state can.
            site.kill_keepers();
        }
        let up = site.run(&["up"]);
        assert_eq!(up.status.code(), Some(0), "K={k}: {}", stderr(&up));
        let pointer = site.pointer().unwrap();
        let version = pointer["version"].as_str().unwrap().to_string();
        let port = pointer["port"].as_u64().unwrap() as u16;
        assert_eq!(version_on(port).as_deref(), Some(version.as_str()), "K={k}");
        let whole = formation(&site);
        assert_eq!(whole.len(), 3, "K={k}: {whole:?}");
        assert!(
            whole.iter().all(|p| p.1 == version && alive(p.2)),
            "K={k}: {version} {whole:?}"
        );
        assert_eq!(running(&site, "worker.sh").len(), 2, "K={k}: workers");
        let clocks_running = running(&site, "clock.sh");
        assert_eq!(
            clocks_running.len(),
            1,
            "K={k}: clocks {clocks_running:?}: {:?} {}",
            clocks_running
                .iter()
                .map(|p| std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default())
                .collect::<Vec<_>>(),
            std::fs::read_to_string(site.root().join("data/clock.log")).unwrap_or_default()
                + &site
                    .log_lines()
                    .iter()
                    .rev()
                    .take(14)
                    .map(|l| format!("\n{} {} {}", l["event"], l["version"], l["detail"]))
                    .collect::<String>()
                + &stdout(&up)
        );
        never_two_clocks(&site, &format!("K={k}"));
        // Every attempt that started a candidate has one outcome, and none has two.
        let lines = site.log_lines();
        let tokens: std::collections::BTreeSet<String> = lines
            .iter()
            .filter(|l| l["event"] == "candidate_started")
            .filter_map(|l| l["token"].as_str().map(str::to_string))
            .collect();
        for token in tokens {
            let outcomes = lines
                .iter()
                .filter(|l| l["token"] == token.as_str())
                .filter(|l| l["event"] == "promoted" || l["event"] == "rolled_back")
                .count();
            assert_eq!(outcomes, 1, "K={k}: token {token}");
        }
        if !killed {
            assert_eq!(out.status.code(), Some(0), "K={k}: {}", stderr(&out));
            break;
        }
        k += 1;
    }
    assert!(k > 10, "the deploy had {k} actions");
    site.stop_service();
}

/// `rollgate scale`: a type's count changed without a new release, kept for later deploys; a
/// singleton cannot go past 1, an unknown type is refused —
/// and a refused scale keeps the counts that run. Issue 80, 4: only the difference starts and
/// stops (web, the clock and the workers already running keep their processes), and no port
/// is asked for.
#[test]
fn scale_changes_a_type_s_count_without_a_release_and_keeps_it() {
    let site = Site::new();
    let policy = write(site.root(), "policy.yaml", POLICY);
    let policy = ["--policy", policy.to_str().unwrap()];
    good(&site, "v1");
    let out = site.deploy(
        free_port(),
        "v1",
        &[&policy[..], &["--watch-ms", "0"]].concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let scale = |counts: &[&str]| {
        let mut args = vec!["scale", "edge-svc"];
        args.extend_from_slice(counts);
        args.extend_from_slice(&policy);
        args.extend_from_slice(&["--watch-ms", "0"]);
        site.run(&args)
    };
    let names = |site: &Site| -> Vec<String> { formation(site).into_iter().map(|p| p.0).collect() };
    let pid_of = |site: &Site, name: &str| {
        formation(site)
            .into_iter()
            .find(|p| p.0 == name)
            .map(|p| p.2)
    };
    let (web, worker, clock) = (
        site.live_pid().unwrap(),
        pid_of(&site, "worker.0").unwrap(),
        pid_of(&site, "clock.0").unwrap(),
    );

    // Up and down under load through the proxy: no request fails.
    let proxy = Proxy::start(&site, &[]);
    let load = Load::kept(proxy.port, 4, std::time::Duration::from_millis(5));
    let out = scale(&["worker=4"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("only the difference starts or stops"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        names(&site),
        ["worker.0", "worker.1", "worker.2", "worker.3", "clock.0"]
    );
    assert!(formation(&site).iter().all(|p| p.1 == "v1" && alive(p.2)));
    let unmoved = |site: &Site| {
        site.live_pid() == Some(web)
            && pid_of(site, "worker.0") == Some(worker)
            && pid_of(site, "clock.0") == Some(clock)
            && alive(web)
            && alive(worker)
            && alive(clock)
    };
    assert!(
        unmoved(&site),
        "web, worker.0 and the clock kept their processes: {:?}",
        formation(&site)
    );
    let four = formation(&site);

    let out = scale(&["worker=1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(names(&site), ["worker.0", "clock.0"]);
    assert!(
        wait_for(10, || four.iter().skip(1).take(3).all(|p| !alive(p.2))),
        "the extra workers stopped"
    );
    assert!(unmoved(&site), "{:?}", formation(&site));
    // Asked for what runs: nothing moves, and it says so.
    let out = scale(&["worker=1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("nothing started or stopped"),
        "{}",
        stdout(&out)
    );
    assert!(unmoved(&site));
    // Relative counts, decided from what runs: one more, then one fewer.
    let out = scale(&["worker=+1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(names(&site), ["worker.0", "worker.1", "clock.0"]);
    assert!(unmoved(&site));
    let out = scale(&["worker=-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(names(&site), ["worker.0", "clock.0"]);
    assert!(unmoved(&site));
    assert_eq!(running(&site, "worker.sh").len(), 1);
    // The last lines of each worker that runs, labelled — not of the files the three scaled
    // away left behind (issue 80, 7: `-n 2` gave two stale lines of those).
    // Each line with its time, first (issue 80, 7).
    let out = site.run(&["logs", "edge-svc", "--type", "worker", "-n", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(timed(&stdout(&out)), "{}", stdout(&out));
    assert_eq!(untimed(&stdout(&out)), "[worker.0] worker up on v1\n");
    let seen = load.finish();
    assert_none_failed(&seen, "scaling the workers up and down");
    assert!(seen.len() > 50, "{} requests", seen.len());
    drop(proxy);

    for (counts, said) in [
        (&["clock=2"][..], "clock is a singleton"),
        (&["mailer=1"][..], "no `mailer:` line in its Procfile"),
        (&["worker"][..], "give TYPE=COUNT"),
        (&["worker=-2"][..], "worker=-2: 1 run, so that asks for -1"),
        (&["worker=+x"][..], "or +N / -N"),
        (&["web=+1"][..], "give web's count itself"),
    ] {
        let out = scale(counts);
        assert_eq!(out.status.code(), Some(2), "{counts:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(said), "{counts:?}: {}", stderr(&out));
        // Issue 81, 5: refused before anything was announced ("scaling… restarting…").
        assert!(
            !stderr(&out).contains("scaling") && !stderr(&out).contains("restarting"),
            "{counts:?}: {}",
            stderr(&out)
        );
    }
    let kept = std::fs::read_to_string(site.root().join("scale.json")).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&kept).unwrap(),
        serde_json::json!({"worker": 1})
    );
    assert_eq!(names(&site), ["worker.0", "clock.0"]);

    // The next release runs the kept count, not the policy's.
    good(&site, "v2");
    let out = site.deploy(
        free_port(),
        "v2",
        &[&policy[..], &["--watch-ms", "0"]].concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(names(&site), ["worker.0", "clock.0"]);
    site.stop_service();
}

/// A worker that drains `$STATE_DIRECTORY/jobs/todo`: each job claimed by a rename (so two
/// workers never take one), done, and written to `done.log` with the release that did it; on
/// SIGTERM it finishes the job in hand, then exits. A stop's SIGTERM reaches the whole tree (its
/// `mv`, `sleep`, `rm` too), so what a child did is checked by its effect, not its status.
const DRAINING_WORKER: &str =
    "mkdir -p \"$STATE_DIRECTORY/jobs/todo\" \"$STATE_DIRECTORY/jobs/doing\"\n\
cd \"$STATE_DIRECTORY/jobs\" || exit 1\n\
stop=\"\"\n\
trap 'stop=1' TERM\n\
while [ -z \"$stop\" ]; do\n\
  took=\"\"\n\
  for job in todo/*; do\n\
    [ -e \"$job\" ] || break\n\
    name=${job#todo/}\n\
    mv \"$job\" \"doing/$name.$$\" 2>/dev/null\n\
    [ -e \"doing/$name.$$\" ] || continue\n\
    sleep 0.01\n\
    echo \"$name $ROLLGATE_VERSION $$\" >> done.log\n\
    rm -f \"doing/$name.$$\" || rm -f \"doing/$name.$$\"\n\
    took=1\n\
    break\n\
  done\n\
  [ -n \"$took\" ] || sleep 0.02\n\
done\n";

/// Issue 69's acceptance, on one host: a Django-like application — web, two workers draining a
/// job table, a singleton clock, a release phase that migrates — deployed back and forth ten
/// times under load through the proxy (0 failed requests), with jobs arriving all along (each
/// done once: none lost, none twice), two clocks never seen at once (sampled every 10 ms), the
/// migration run once per deploy; then a release whose migration fails leaves everything as it
/// was.
#[test]
fn a_django_like_app_deploys_under_load_with_every_job_done_once_and_one_clock() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let site = Site::new();
    let policy = write(
        site.root(),
        "policy.yaml",
        &POLICY.replace(
            "      min_ready_ms: 300\n    clock:",
            "      min_ready_ms: 300\n      stop_grace_ms: 10000\n    clock:",
        ),
    );
    let app = |version: &str, migrate: &str| {
        add(
            &site,
            version,
            "worker: exec sh worker.sh\nclock: exec sh clock.sh\nrelease: sh migrate.sh\n",
            &[
                ("worker.sh", DRAINING_WORKER.to_string()),
                ("clock.sh", looping("clock")),
                ("migrate.sh", migrate.to_string()),
            ],
        )
    };
    let migrate = "echo \"$ROLLGATE_VERSION\" >> \"$STATE_DIRECTORY/migrations\"\n";
    app("v1", migrate);
    app("v2", migrate);
    let deploy = |version: &str| {
        site.run(&[
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            version,
            "--policy",
            policy.to_str().unwrap(),
            "--watch-ms",
            "300",
        ])
    };
    let out = deploy("v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let proxy = Proxy::start(&site, &[]);
    let todo = site.root().join("data/jobs/todo");
    assert!(
        wait_for(10, || todo.is_dir()),
        "the workers made their job table"
    );

    // Jobs arrive all along; the clocks are counted every 10 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicUsize::new(0));
    let producer = {
        let (stop, made, todo) = (stop.clone(), made.clone(), todo.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let n = made.fetch_add(1, Ordering::SeqCst);
                std::fs::File::create(todo.join(format!("job{n:05}"))).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(15));
            }
        })
    };
    let most_clocks = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (stop, most, root) = (stop.clone(), most_clocks.clone(), site.root().to_path_buf());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                most.fetch_max(running_in(&root, "clock.sh").len(), Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    let load = Load::kept(proxy.port, 4, std::time::Duration::from_millis(5));
    for round in 0..10 {
        let version = if round % 2 == 0 { "v2" } else { "v1" };
        let out = deploy(version);
        assert_eq!(
            out.status.code(),
            Some(0),
            "round {round}: {}",
            stderr(&out)
        );
    }
    let seen = load.finish();
    assert_none_failed(&seen, "ten deploys of web, two workers and a clock");
    assert!(seen.len() > 200, "{} requests", seen.len());
    stop.store(true, Ordering::SeqCst);
    producer.join().unwrap();
    sampler.join().unwrap();
    assert_eq!(most_clocks.load(Ordering::SeqCst), 1, "two clocks at once");
    // What the clocks said of themselves agrees: each started after the one before it stopped.
    let said = std::fs::read_to_string(site.root().join("data/clock.log")).unwrap();
    let mut lines: Vec<(u128, &str)> = said
        .lines()
        .map(|l| {
            let words: Vec<&str> = l.split(' ').collect();
            (words[3].parse().unwrap(), words[0])
        })
        .collect();
    lines.sort();
    let kinds: Vec<&str> = lines.iter().map(|l| l.1).collect();
    assert!(
        kinds
            .chunks(2)
            .all(|pair| pair[0] == "start" && pair.get(1).is_none_or(|k| *k == "stop")),
        "{said}"
    );

    // Every job done once: none lost, none twice.
    let made = made.load(Ordering::SeqCst);
    let jobs = site.root().join("data/jobs");
    assert!(
        wait_for(20, || std::fs::read_dir(jobs.join("todo")).unwrap().count()
            == 0
            && std::fs::read_dir(jobs.join("doing")).unwrap().count() == 0),
        "jobs left undone"
    );
    let done = std::fs::read_to_string(jobs.join("done.log")).unwrap();
    let mut names: Vec<&str> = done.lines().map(|l| l.split(' ').next().unwrap()).collect();
    names.sort();
    let total = names.len();
    names.dedup();
    assert_eq!(total, names.len(), "a job done twice");
    assert_eq!(
        names.len(),
        made,
        "jobs lost: {} of {made} done",
        names.len()
    );
    let by_both = ["v1", "v2"].map(|v| {
        done.lines()
            .filter(|l| l.contains(&format!(" {v} ")))
            .count()
    });
    assert!(by_both.iter().all(|n| *n > 0), "{by_both:?}");
    // The migration ran once per deploy of a new version: the first, then ten.
    let migrations = std::fs::read_to_string(site.root().join("data/migrations")).unwrap();
    assert_eq!(migrations.lines().count(), 11, "{migrations}");

    // v3's migration fails: refused, nothing of it started, v1's processes the same ones.
    app(
        "v3",
        "echo 'relation \"jobs\" already exists' >&2; exit 1\n",
    );
    let (live, whole) = (site.pointer().unwrap(), formation(&site));
    let out = deploy("v3");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("relation \"jobs\" already exists"),
        "{}",
        stderr(&out)
    );
    assert_eq!(site.pointer().unwrap()["pid"], live["pid"]);
    assert_eq!(formation(&site), whole);
    drop(proxy);
    site.stop_service();
}

/// A good v1 (web, two workers, a clock) deployed under `POLICY` with `crash_loop` 2 exits in
/// 60 s; the deploy of a version under that policy (no watch), for what the test installs next.
fn good_v1_with_a_crash_loop_rule(site: &Site) -> impl Fn(&str) -> std::process::Output + '_ {
    let policy = write(
        site.root(),
        "policy.yaml",
        &format!("{POLICY}  crash_loop:\n    restarts: 2\n    within_ms: 60000\n"),
    );
    let deploy = move |version: &str| {
        site.deploy(
            free_port(),
            version,
            &["--policy", policy.to_str().unwrap(), "--watch-ms", "0"],
        )
    };
    good(site, "v1");
    let out = deploy("v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    deploy
}

/// A worker that crash-loops after its release's switch rolls the whole release back (policy
/// `crash_loop`), as web's crash loop does — once, though both of its processes loop (the
/// second keeper's rollback finds it done: `--from` the crashing version).
#[test]
fn a_worker_crash_looping_after_the_switch_rolls_the_release_back_once() {
    let site = Site::new();
    let deploy = good_v1_with_a_crash_loop_rule(&site);
    // Its workers stay up until armed (after the switch: a worker gone before it fails the
    // deploy before users are switched), then exit at every start.
    add(
        &site,
        "v2",
        "worker: while [ ! -e \"$STATE_DIRECTORY/armed\" ]; do sleep 0.05; done; echo 'lost the database' >&2; exit 1\nclock: exec sh clock.sh\n",
        &[("clock.sh", looping("clock"))],
    );
    let out = deploy("v2");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    std::fs::write(site.root().join("data/armed"), "").unwrap();
    assert!(
        wait_for(40, || site.pointer().unwrap()["version"] == "v1"),
        "not rolled back: {:?}",
        site.events()
    );
    assert!(wait_for(20, || {
        let whole = formation(&site);
        whole.len() == 3 && whole.iter().all(|p| p.1 == "v1" && alive(p.2))
    }));
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(
        site.pointer().unwrap()["version"],
        "v1",
        "rolled back once, and stays back"
    );
    let rolled_back: Vec<String> = site
        .log_lines()
        .into_iter()
        .filter(|l| l["event"] == "rolled_back" && l["version"] == "v2")
        .map(|l| l["detail"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(rolled_back.len(), 1, "{rolled_back:?}");
    assert!(rolled_back[0].contains("a crash loop"), "{rolled_back:?}");
    site.stop_service();
}

/// `replicas.json`: (version, pid) of each web replica.
fn web_replicas(site: &Site) -> Vec<(String, i32)> {
    let text = std::fs::read_to_string(site.root().join("replicas.json")).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    value["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["version"].as_str().unwrap().to_string(),
                r["pid"].as_i64().unwrap() as i32,
            )
        })
        .collect()
}

/// Issue 69, 4 and 5 for a replica set: `scale web=N` turns a single release into N web
/// replicas (and back), a `rollout` moves web in waves with each type in step (a worker once
/// half of web moved, the clock with the last wave), all under load with no failed request and
/// never two clocks; a release whose worker fails goes back whole, web replicas included.
#[test]
fn a_replica_set_rolls_out_every_type_in_step_and_scale_sets_web_s_count() {
    let site = Site::new();
    let policy = write(site.root(), "policy.yaml", POLICY);
    let policy = ["--policy", policy.to_str().unwrap(), "--watch-ms", "0"];
    let first = port_block(12);
    let ports = format!("{first}-{}", first + 11);
    good(&site, "v1");
    let out = site.deploy(free_port(), "v1", &policy);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let single = formation(&site);
    let proxy = Proxy::start(&site, &[]);
    let load = Load::kept(proxy.port, 4, std::time::Duration::from_millis(5));

    let scale = |counts: &[&str]| {
        let mut args = vec!["scale", "edge-svc"];
        args.extend_from_slice(counts);
        args.extend_from_slice(&policy);
        args.extend_from_slice(&["--ports", &ports]);
        site.run(&args)
    };
    let out = scale(&["web=2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let web = web_replicas(&site);
    assert_eq!(web.len(), 2, "{web:?}");
    assert!(web.iter().all(|r| r.0 == "v1" && alive(r.1)), "{web:?}");
    let v1 = formation(&site);
    assert_eq!(v1.len(), 3, "{v1:?}");
    assert!(v1.iter().all(|p| p.1 == "v1" && alive(p.2)), "{v1:?}");
    assert!(
        wait_for(10, || single.iter().all(|p| !alive(p.2))),
        "a fresh process of each type"
    );

    // v2 in two waves: web replica 0, worker.0; then web replica 1, worker.1, the clock.
    good(&site, "v2");
    let rollout = |version: &str| {
        let mut args = vec!["rollout", "edge-svc", version, "--waves", "50,100"];
        args.extend_from_slice(&policy);
        args.extend_from_slice(&["--ports", &ports]);
        site.run(&args)
    };
    let out = rollout("v2");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let web = web_replicas(&site);
    assert!(
        web.len() == 2 && web.iter().all(|r| r.0 == "v2" && alive(r.1)),
        "{web:?}"
    );
    let v2 = formation(&site);
    assert!(v2.iter().all(|p| p.1 == "v2" && alive(p.2)), "{v2:?}");
    assert!(
        wait_for(10, || v1.iter().all(|p| !alive(p.2))),
        "v1's stopped"
    );
    assert_eq!(running(&site, "worker.sh").len(), 2);
    assert_eq!(running(&site, "clock.sh").len(), 1);
    let lines = site.log_lines();
    let wave_of = |process: &str| {
        lines
            .iter()
            .find(|l| {
                l["event"] == "replica_ready"
                    && l["version"] == "v2"
                    && l["detail"] == format!("{process} ready").as_str()
            })
            .map(|l| l["wave"].clone())
    };
    assert_eq!(wave_of("worker.0"), Some(serde_json::json!(0)), "{lines:?}");
    assert_eq!(wave_of("worker.1"), Some(serde_json::json!(1)));
    assert_eq!(wave_of("clock.0"), Some(serde_json::json!(1)));
    let said = |event: &str| {
        let line = lines.iter().rev().find(|l| l["event"] == event).unwrap();
        line["detail"].as_str().unwrap().to_string()
    };
    assert!(
        said("rollout_started")
            .contains("waves of 1 + 1 (50%, 100%); worker ×2, clock ×1 in step;"),
        "{}",
        said("rollout_started")
    );
    assert!(
        said("wave_completed").contains("1 of 1 replicas on v2 with worker ×1, clock ×1"),
        "{}",
        said("wave_completed")
    );
    assert!(
        said("promoted").contains("2 replica(s) on v2 with worker ×2, clock ×1, 0 failed"),
        "{}",
        said("promoted")
    );

    // The replica set's other types scale too; web back to one.
    let out = scale(&["worker=3"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(formation(&site).len(), 4);
    assert_eq!(web_replicas(&site).len(), 2);
    let out = scale(&["web=1", "worker=2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(web_replicas(&site).len(), 1);
    assert_eq!(formation(&site).len(), 3);
    assert!(wait_for(10, || running(&site, "worker.sh").len() == 2));
    // Kept for later runs: a rollout's completion writes the counts as a deploy's does.
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("scale.json")).unwrap())
            .unwrap();
    assert_eq!(kept, serde_json::json!({"worker": 2}));
    let out = scale(&["web=0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("web=0 would leave nobody answering"));

    // v3's worker cannot start: everything moved goes back, the v2 workers never stopped.
    let out = scale(&["web=2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let before = formation(&site);
    add(
        &site,
        "v3",
        "worker: echo 'cannot open the database' >&2; exit 3\nclock: exec sh clock.sh\n",
        &[("clock.sh", looping("clock"))],
    );
    let out = rollout("v3");
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("process worker.0 failed"),
        "{}",
        stdout(&out)
    );
    let web = web_replicas(&site);
    assert!(web.iter().all(|r| r.0 == "v2" && alive(r.1)), "{web:?}");
    assert_eq!(formation(&site), before);
    assert!(before.iter().all(|p| alive(p.2)));

    let seen = load.finish();
    assert_none_failed(&seen, "scaling web and rolling out every type");
    assert!(seen.len() > 50, "{} requests", seen.len());
    never_two_clocks(&site, "under load");
    drop(proxy);
    site.stop_service();
}

/// Issue 69, 7 with web (2): a rollout of two web replicas, two workers, a singleton clock and a
/// release phase, killed (-9) after each of its actions in turn. `up` leaves it paused with
/// everything serving (every process it names running, web answering, one clock); the next
/// command — `rollout resume`, or `rollout abort --rollback` every other time — finishes it whole,
/// on one version, with one outcome line; two clocks never ran at once.
#[test]
fn a_rollout_of_several_types_killed_after_any_action_is_finished_whole() {
    use std::os::unix::process::ExitStatusExt;
    let site = Site::new();
    let policy = write(site.root(), "policy.yaml", POLICY);
    let first = port_block(12);
    let ports = format!("{first}-{}", first + 11);
    let release = |version: &str| {
        add(
            &site,
            version,
            "release: echo migrated >> \"$STATE_DIRECTORY/migrations\"\nworker: exec sh worker.sh\nclock: exec sh clock.sh\n",
            &[("worker.sh", looping("worker")), ("clock.sh", looping("clock"))],
        )
    };
    release("v1");
    release("v2");
    let run = |args: &[&str], fault: Option<u64>| {
        let mut command = rollgate();
        command
            .args(args)
            .arg("--root")
            .arg(site.root())
            .timeout(std::time::Duration::from_secs(60));
        if let Some(k) = fault {
            command.env("ROLLGATE_FAULT", format!("kill-after-action:{k}"));
        }
        command.output().unwrap()
    };
    let rollout = |version: &str, fault: Option<u64>| {
        let args = [
            "rollout",
            "edge-svc",
            version,
            "--replicas",
            "2",
            "--waves",
            "50,100",
            "--ports",
            &ports,
            "--policy",
            policy.to_str().unwrap(),
            "--watch-ms",
            "0",
        ];
        run(&args, fault)
    };
    let out = rollout("v1", None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut k = 1;
    loop {
        let live = web_replicas(&site)[0].0.clone();
        let next = if live == "v1" { "v2" } else { "v1" };
        let out = rollout(next, Some(k));
        let killed = out.status.signal() == Some(9);
        if killed {
            // The whole group goes, as at a `kill -9` of the unit: with no keeper left to name
            // a process, only the state can.
            site.kill_keepers();
        }
        let up = site.run(&["up"]);
        assert_eq!(up.status.code(), Some(0), "K={k}: {}", stderr(&up));
        // Serving, whatever the crash cut: web answers, every process named runs, one clock.
        let web = web_replicas(&site);
        assert!(
            web.iter().any(|r| alive(r.1)),
            "K={k}: no web replica: {web:?}"
        );
        let pointer = site.pointer().unwrap();
        let port = pointer["port"].as_u64().unwrap() as u16;
        assert!(version_on(port).is_some(), "K={k}: web does not answer");
        let named = formation(&site);
        assert!(named.iter().all(|p| alive(p.2)), "K={k}: {named:?}");
        assert_eq!(running(&site, "clock.sh").len(), 1, "K={k}: clocks");
        if killed {
            let finish = match k % 2 {
                0 => run(&["rollout", "abort", "edge-svc", "--rollback"], None),
                _ => run(&["rollout", "resume", "edge-svc"], None),
            };
            let said = format!("{}{}", stdout(&finish), stderr(&finish));
            // A crash before the rollout was saved left nothing to finish.
            assert!(
                finish.status.code() == Some(0)
                    || said.contains("only a running or paused rollout"),
                "K={k}: {said}"
            );
        }
        // Whole: every process of one version, all running.
        let web = web_replicas(&site);
        let version = web[0].0.clone();
        assert!(
            web.len() == 2 && web.iter().all(|r| r.0 == version && alive(r.1)),
            "K={k}: {web:?}"
        );
        let whole = formation(&site);
        assert_eq!(whole.len(), 3, "K={k}: {whole:?}");
        assert!(
            whole.iter().all(|p| p.1 == version && alive(p.2)),
            "K={k}: {version} {whole:?}"
        );
        assert!(
            wait_for(10, || running(&site, "worker.sh").len() == 2),
            "K={k}: workers"
        );
        assert_eq!(running(&site, "clock.sh").len(), 1, "K={k}: clocks");
        never_two_clocks(&site, &format!("K={k}"));
        // Every rollout that started has one outcome, and none has two.
        let lines = site.log_lines();
        for started in lines.iter().filter(|l| l["event"] == "rollout_started") {
            let outcomes = lines
                .iter()
                .filter(|l| l["token"] == started["token"])
                .filter(|l| l["event"] == "promoted" || l["event"] == "rolled_back")
                .count();
            assert_eq!(outcomes, 1, "K={k}: {}", started["detail"]);
        }
        if !killed {
            assert_eq!(out.status.code(), Some(0), "K={k}: {}", stdout(&out));
            break;
        }
        k += 1;
    }
    assert!(k > 10, "the rollout had {k} actions");
    site.stop_service();
}

/// Issue 80: a live process that had printed nothing yet held its empty output file (its pump's
/// lock), and the new copy `restart` starts beside it waited 10 s for that lock and was
/// refused ("still being written by another process of the same release"). The held file moves
/// away as a written one does.
#[test]
fn a_restart_beside_a_process_that_printed_nothing_goes_ahead() {
    let site = Site::new();
    let policy = write(site.root(), "policy.yaml", POLICY);
    let policy = ["--policy", policy.to_str().unwrap()];
    add(
        &site,
        "v1",
        "worker: exec sleep 1000\nclock: exec sleep 1001\n",
        &[],
    );
    let first = port_block(2);
    let ports = format!("{first}-{}", first + 1);
    let out = site.run(
        &[
            &[
                "deploy",
                "edge-svc",
                "v1",
                "--ports",
                &ports,
                "--watch-ms",
                "0",
            ][..],
            &policy,
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let before = formation(&site);
    let out = site.run(
        &[
            &["restart", "edge-svc", "--ports", &ports, "--watch-ms", "0"][..],
            &policy,
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let after = formation(&site);
    assert_eq!(after.len(), 3, "{after:?}");
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(old.0, new.0);
        assert_ne!(old.2, new.2, "{} was not restarted", old.0);
        assert!(alive(new.2));
    }
}

/// Issue 80, 3: a worker that passed its readiness (stayed up its `min_ready_ms`) and exited
/// before web's switch was not seen: web switched, users got the release, and only then was it
/// rolled back, "2 ms after the switch". Readiness holds until the switch: the release is
/// rolled back before it, users never on it, the reason naming the worker and its time.
#[test]
fn a_worker_ready_then_gone_before_web_s_switch_fails_the_deploy_before_the_switch() {
    let site = Site::new();
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 8000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  processes:\n    worker:\n      replicas: 2\n      min_ready_ms: 300\n",
    );
    let policy = ["--policy", policy.to_str().unwrap()];
    add(
        &site,
        "v1",
        "worker: exec sh worker.sh\n",
        &[("worker.sh", looping("worker"))],
    );
    let out = site.deploy(
        free_port(),
        "v1",
        &[&policy[..], &["--watch-ms", "0"]].concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // v2's web is ready 2.5 s after its start; its workers stay up 1 s, past their 300 ms.
    let web = format!(
        "#!/bin/sh\nexec '{}' sample-service --ready-after-ms 2500\n",
        bin().display()
    );
    add(
        &site,
        "v2",
        "worker: sleep 1; exit 3\n",
        &[("edge-svc", web)],
    );
    let out = site.deploy(
        free_port(),
        "v2",
        &[&policy[..], &["--watch-ms", "0"]].concat(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    let events = site.events();
    assert!(
        !events.iter().any(|e| e.0 == "switched" && e.1 == "v2"),
        "users were switched to v2: {events:?}"
    );
    let rolled_back = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "rolled_back" && l["version"] == "v2")
        .unwrap();
    let detail = rolled_back["detail"].as_str().unwrap();
    assert!(
        detail.contains("exited after it was ready, before web's switch"),
        "{detail}"
    );
    assert!(detail.contains("worker."), "{detail}");
}

/// Issue 80: a scale-down stopped the surplus workers before anything else, and when the
/// rest of the run then failed (rolled back) nothing brought them back: the release ran on
/// with one worker of three. A scaled-down type's extra processes now run until the run
/// completes; a run that goes back leaves them as they were.
#[test]
fn a_scale_down_that_rolls_back_leaves_every_worker_running() {
    let site = Site::new();
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 3000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  processes:\n    worker:\n      replicas: 3\n      min_ready_ms: 300\n    mailer:\n      replicas: 0\n      min_ready_ms: 300\n",
    );
    let policy = ["--policy", policy.to_str().unwrap()];
    // Its mailer fails to start once `broken` is in its state folder.
    let mailer = format!(
        "[ -e \"$STATE_DIRECTORY/broken\" ] && exit 1\n{}",
        looping("mailer")
    );
    add(
        &site,
        "v1",
        "worker: exec sh worker.sh\nmailer: exec sh mailer.sh\n",
        &[("worker.sh", looping("worker")), ("mailer.sh", mailer)],
    );
    let first = port_block(2);
    let ports = format!("{first}-{}", first + 1);
    let out = site.run(
        &[
            &[
                "deploy",
                "edge-svc",
                "v1",
                "--ports",
                &ports,
                "--watch-ms",
                "0",
            ][..],
            &policy,
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let three = formation(&site);
    assert_eq!(three.len(), 3, "{three:?}");

    std::fs::write(site.root().join("data/broken"), "").unwrap();
    let out = site.run(
        &[
            &[
                "scale",
                "edge-svc",
                "worker=1",
                "mailer=1",
                "--watch-ms",
                "0",
            ][..],
            &policy,
        ]
        .concat(),
    );
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    for (name, _, pid) in &three {
        assert!(
            alive(*pid),
            "{name} (pid {pid}) was stopped by a scale that went back"
        );
    }
    assert_eq!(
        formation(&site),
        three,
        "processes.json names the three as before"
    );
    assert_eq!(running(&site, "worker.sh").len(), 3);
    assert!(
        wait_for(10, || running(&site, "mailer.sh").is_empty()),
        "the mailer that failed is gone"
    );
    assert!(
        !site.root().join("scale.json").exists(),
        "the counts are as they were"
    );
}

/// Issue 80: a `scale` killed halfway left `scale.json` at the new count and the processes at
/// the old (it wrote the file first, then restarted). The engine now plans the restart with the
/// counts and keeps them when the run completes, so whatever action the scale is killed after,
/// once `up` has finished it the counts kept are the processes that run.
#[test]
fn a_scale_killed_after_any_action_leaves_the_counts_kept_and_the_processes_agreeing() {
    use std::os::unix::process::ExitStatusExt;
    let site = Site::new();
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  processes:\n    worker:\n      replicas: 1\n      min_ready_ms: 100\n",
    );
    let policy = ["--policy", policy.to_str().unwrap()];
    add(
        &site,
        "v1",
        "worker: exec sh worker.sh\n",
        &[("worker.sh", looping("worker"))],
    );
    let first = port_block(2);
    let ports = format!("{first}-{}", first + 1);
    let out = site.run(
        &[
            &[
                "deploy",
                "edge-svc",
                "v1",
                "--ports",
                &ports,
                "--watch-ms",
                "0",
            ][..],
            &policy,
        ]
        .concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let kept = |site: &Site| -> usize {
        std::fs::read_to_string(site.root().join("scale.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|v| v["worker"].as_u64())
            .map_or(1, |n| n as usize)
    };
    let mut k = 1;
    loop {
        // From one worker to two, and back: each scale killed after its K-th action.
        let asked = if kept(&site) == 1 {
            "worker=2"
        } else {
            "worker=1"
        };
        let out = rollgate()
            .args([
                "scale",
                "edge-svc",
                asked,
                "--ports",
                &ports,
                "--watch-ms",
                "0",
                "--root",
            ])
            .arg(site.root())
            .args(policy)
            .env("ROLLGATE_FAULT", format!("kill-after-action:{k}"))
            .timeout(std::time::Duration::from_secs(60))
            .output()
            .unwrap();
        let killed = out.status.signal() == Some(9);
        if killed {
            // The whole group goes, as at a `kill -9` of the unit: with no keeper left to name
            // a process, only the state can.
            site.kill_keepers();
        }
        let up = site.run(&["up"]);
        assert_eq!(up.status.code(), Some(0), "K={k}: {}", stderr(&up));
        let workers = formation(&site);
        assert!(workers.iter().all(|p| alive(p.2)), "K={k}: {workers:?}");
        assert_eq!(
            kept(&site),
            workers.len(),
            "K={k} ({asked}): scale.json and the workers that run disagree: {workers:?}"
        );
        assert_eq!(running(&site, "worker.sh").len(), workers.len(), "K={k}");
        if !killed {
            assert_eq!(out.status.code(), Some(0), "K={k}: {}", stderr(&out));
            break;
        }
        k += 1;
    }
    assert!(k > 5, "the scale had {k} actions");
    site.stop_service();
}

/// Issue 80, 1: a web crash loop after the switch was rolled back through the standby — web
/// alone: the workers and the clock stayed on the crashing release, and `up` called that
/// running. A release of several types goes back whole.
#[test]
fn a_web_crash_loop_after_the_switch_rolls_every_type_back() {
    let site = Site::new();
    let deploy = good_v1_with_a_crash_loop_rule(&site);
    // v2: its web exits 300 ms after every start once armed; its worker and clock are sound.
    site.crashing_release("v2", 300);
    for (name, body) in [
        (
            "Procfile",
            "worker: exec sh worker.sh\nclock: exec sh clock.sh\n".to_string(),
        ),
        ("worker.sh", looping("worker")),
        ("clock.sh", looping("clock")),
    ] {
        write(site.root(), &format!("releases/v2/{name}"), &body);
    }
    let out = deploy("v2");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(formation(&site).iter().all(|p| p.1 == "v2"));
    site.arm("v2");
    assert!(
        wait_for(60, || site.pointer().unwrap()["version"] == "v1"),
        "not rolled back: {:?}",
        site.events()
    );
    assert!(
        wait_for(30, || {
            let whole = formation(&site);
            whole.len() == 3 && whole.iter().all(|p| p.1 == "v1" && alive(p.2))
        }),
        "the workers and clock stayed on v2: {:?}",
        formation(&site)
    );
    never_two_clocks(&site, "after the crash loop's rollback");
    // The keeper's rollback says so once its deploy has returned.
    assert!(wait_for(30, || count_events(&site, "rolled_back", "v2") == 1));
    assert!(wait_for(30, || site
        .run(&["stop", "edge-svc"])
        .status
        .code()
        == Some(0)));
}
