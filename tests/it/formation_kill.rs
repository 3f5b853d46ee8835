//! Issue 80, 8: the formation's crash safety. A release of web, two workers, a singleton clock,
//! a release phase and a schedule is deployed, scaled, restarted, stopped and started and
//! rolled back, and in each round something is killed (SIGKILL) at a random moment: the
//! command, a keeper, the schedule clock's keeper, a worker, or the whole lot of them at once.
//! After each round `rollgate up` recovers, and the test checks what the issue lists: never two
//! clocks (sampled every 10 ms the whole time, zombies excluded), every type on one version,
//! one outcome line per attempt, no orphan process, no tree of the service's left populated
//! by what the state does not name, and no scheduled due time run twice.
//!
//! Random, but reproducible: the seed is printed (and taken from `ROLLGATE_KILL_SEED`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;

/// The clock's command line: `sleep` with a number no other test uses.
const CLOCK: &str = "sleep\u{0}7770002\u{0}";

const POLICY: &str = "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 0\n  processes:\n    worker:\n      replicas: 2\n      min_ready_ms: 100\n    clock:\n      singleton: true\n      min_ready_ms: 100\n  schedules:\n    tick:\n      cron: \"@every 2s\"\n      command: [\"sh\", \"tick.sh\"]\n";

/// xorshift64*: enough randomness for choosing, and the same again from the same seed.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn add(site: &Site, version: &str) {
    site.add_sample_with(
        version,
        &[
            (
                "Procfile",
                "worker: exec sleep 7770001\nclock: exec sleep 7770002\nrelease: sh migrate.sh\n",
            ),
            (
                "migrate.sh",
                "echo \"migrated $ROLLGATE_VERSION\" >> \"$STATE_DIRECTORY/migrations\"\nsleep 0.2\n",
            ),
            ("tick.sh", "echo \"tick $ROLLGATE_VERSION\"\n"),
        ],
    );
}

/// Processes whose working folder is in `root` (not zombies), with their command lines.
fn of_root(root: &Path) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(root))
                && !is_zombie(*pid)
        })
        .filter_map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((pid, String::from_utf8_lossy(&cmdline).into_owned()))
        })
        .collect()
}

/// Samples the root's processes every 10 ms until stopped: the most clocks seen at once, and
/// every pid seen there (its trees are checked at the end).
struct Sampler {
    stop: Arc<AtomicBool>,
    most_clocks: Arc<AtomicUsize>,
    seen: Arc<Mutex<BTreeSet<i32>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(root: PathBuf) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let most_clocks = Arc::new(AtomicUsize::new(0));
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let thread = {
            let (stop, most_clocks, seen) = (stop.clone(), most_clocks.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let now = of_root(&root);
                    let clocks = now.iter().filter(|(_, c)| c == CLOCK).count();
                    most_clocks.fetch_max(clocks, Ordering::Relaxed);
                    seen.lock().unwrap().extend(now.iter().map(|(pid, _)| *pid));
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        };
        Sampler {
            stop,
            most_clocks,
            seen,
            thread: Some(thread),
        }
    }

    fn most_clocks(&self) -> usize {
        self.most_clocks.load(Ordering::Relaxed)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a round does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Deploy,
    Scale,
    Restart,
    StopStart,
    Rollback,
}

/// What a round kills.
#[derive(Debug, Clone, Copy)]
enum Target {
    Command,
    AKeeper,
    ClockKeeper,
    AWorker,
    Everything,
}

fn json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// (type, version, pid) of each process of another type than web `formation.json` names.
fn formation(root: &Path) -> Vec<(String, String, i32)> {
    typed_processes(root)
        .iter()
        .map(|p| {
            (
                p["process_type"].as_str().unwrap_or("").to_string(),
                p["version"].as_str().unwrap_or("").to_string(),
                p["pid"].as_i64().unwrap_or(0) as i32,
            )
        })
        .collect()
}

/// What is wrong with the root now, after a recovery; empty when nothing is.
fn faults(site: &Site, root: &Path, workers: usize) -> Vec<String> {
    let mut faults = Vec::new();
    let stopped = root.join("stopped.json").exists();
    let transient = |cmdline: &str| cmdline.contains("tick.sh");
    if stopped {
        let left: Vec<_> = of_root(root)
            .into_iter()
            .filter(|(_, c)| !transient(c))
            .collect();
        if !left.is_empty() {
            faults.push(format!("stopped, yet running: {left:?}"));
        }
        return faults;
    }
    let Some(pointer) = site.pointer() else {
        return vec!["nothing live and not stopped".into()];
    };
    let version = pointer["version"].as_str().unwrap_or("").to_string();
    let web = pointer["pid"].as_i64().unwrap_or(0) as i32;
    let typed = formation(root);
    if let Some(other) = typed.iter().find(|(_, v, _)| *v != version) {
        faults.push(format!("web runs {version}, {other:?} another version"));
    }
    let count = |kind: &str| typed.iter().filter(|(t, _, _)| t == kind).count();
    if count("worker") != workers || count("clock") != 1 {
        faults.push(format!(
            "{} workers (want {workers}) and {} clocks named: {typed:?}",
            count("worker"),
            count("clock")
        ));
    }
    // The formation's web is the one `current` names (a crash between the two writes is
    // mended by the recovery just run); read again a moment later should a keeper be between.
    let web_of = |value: &serde_json::Value| (value["pid"].as_i64(), value["port"].as_u64());
    let in_formation = || -> Vec<(Option<i64>, Option<u64>)> {
        json(&root.join("formation.json"))
            .and_then(|v| v["processes"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter(|p| p["process_type"] == "web")
            .map(web_of)
            .collect()
    };
    let in_view = || {
        site.pointer()
            .map(|p| web_of(&p))
            .into_iter()
            .collect::<Vec<_>>()
    };
    if !wait_for(2, || in_formation() == in_view()) {
        faults.push(format!(
            "the formation names web {:?}, current {:?}",
            in_formation(),
            in_view()
        ));
    }
    let named: BTreeSet<i32> = std::iter::once(web)
        .chain(typed.iter().map(|(_, _, pid)| *pid))
        .collect();
    if let Some(dead) = named.iter().find(|pid| !alive(**pid)) {
        faults.push(format!("named but not running: {dead}"));
    }
    // rollgate's own keepers (`rollgate keep`, `rollgate keep-clock`) are not the release's.
    let keeper = |cmdline: &str| {
        let word = cmdline.split('\0').nth(1).unwrap_or("");
        word == "keep" || word == "keep-clock"
    };
    let orphans: Vec<_> = of_root(root)
        .into_iter()
        .filter(|(pid, c)| !named.contains(pid) && !transient(c) && !keeper(c))
        .collect();
    if !orphans.is_empty() {
        faults.push(format!("orphans (running, named by nothing): {orphans:?}"));
    }
    faults
}

/// For a failure's message: the formation, the keepers' entries, the log's last lines and the
/// parent of each process of the root.
fn what_the_root_says(root: &Path) -> String {
    let read = |path: PathBuf| std::fs::read_to_string(path).unwrap_or_default();
    let log = read(root.join("deploy.log"));
    let tail: Vec<&str> = log
        .lines()
        .rev()
        .filter(|l| !l.contains("\"event\":\"schedule_"))
        .take(16)
        .collect();
    let keepers: Vec<String> = std::fs::read_dir(root.join(".keepers"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| format!("{}: {}", e.file_name().to_string_lossy(), read(e.path())))
        .collect();
    let parents: Vec<String> = of_root(root)
        .into_iter()
        .map(|(pid, cmdline)| {
            let stat = read(PathBuf::from(format!("/proc/{pid}/stat")));
            let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
            let ppid = after_name.split_whitespace().nth(1).unwrap_or("?");
            let token = std::fs::read(format!("/proc/{pid}/environ"))
                .unwrap_or_default()
                .split(|b| *b == 0)
                .find_map(|v| v.strip_prefix(b"ROLLGATE_DEPLOY_TOKEN=".as_slice()))
                .map(|t| String::from_utf8_lossy(t).into_owned())
                .unwrap_or_default();
            let cgroup = read(PathBuf::from(format!("/proc/{pid}/cgroup")));
            let tree = cgroup.lines().find(|l| l.starts_with("0::")).unwrap_or("");
            format!("{pid} (parent {ppid}, token {token:?}, {tree}): {cmdline:?}")
        })
        .collect();
    format!(
        "rollout.json: {}\nformation.json: {}\nkeepers: {keepers:#?}\nprocesses: {parents:#?}\nlog, last first:\n{}",
        read(root.join("rollout.json")),
        read(root.join("formation.json")),
        tail.join("\n")
    )
}

/// Attempts with no outcome line, or more than one (tokens).
fn outcome_faults(site: &Site) -> Vec<String> {
    let mut begun = BTreeSet::new();
    let mut ended: BTreeMap<String, usize> = BTreeMap::new();
    for line in site.log_lines() {
        let Some(token) = line["token"].as_str() else {
            continue;
        };
        match line["event"].as_str() {
            Some("candidate_started" | "rollout_started") => {
                begun.insert(token.to_string());
            }
            Some("promoted" | "rolled_back") => *ended.entry(token.to_string()).or_default() += 1,
            _ => {}
        }
    }
    let mut faults = Vec::new();
    for token in &begun {
        match ended.get(token).copied().unwrap_or(0) {
            1 => {}
            n => faults.push(format!("attempt {token}: {n} outcome lines")),
        }
    }
    faults
}

/// Scheduled due times that started more than once.
fn twice_run(site: &Site) -> Vec<String> {
    let mut starts: BTreeMap<i64, usize> = BTreeMap::new();
    for line in site.log_lines() {
        if line["event"] == "schedule_started" {
            let due = (line["due"].as_f64().unwrap_or(0.0) * 1000.0).round() as i64;
            *starts.entry(due).or_default() += 1;
        }
    }
    starts
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(due, n)| format!("due time {due} ms started {n} times"))
        .collect()
}

/// SIGKILL to `pid` through a pidfd: opened first, then the process checked to be the
/// command (`ours`: the test's unreaped child) or one whose folder is in `root`.
fn kill_by_pidfd(pid: i32, root: &Path, ours: bool) {
    // SAFETY: plain system calls on a number; the descriptor is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return;
    }
    let still_ours = ours
        || std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(root));
    if still_ours {
        // SAFETY: as above.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            );
        }
    }
    // SAFETY: the descriptor opened above.
    unsafe {
        libc::close(fd);
    }
}

/// The pid in `.keepers/clock.lock`: the schedules' keeper.
fn clock_keeper(root: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(root.join(".keepers/clock.lock")).ok()?;
    text.trim().parse().ok().filter(|pid| alive(*pid))
}

#[test]
fn killed_at_random_the_formation_recovers_with_one_clock_no_orphan_and_one_outcome_each() {
    let seed: u64 = std::env::var("ROLLGATE_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("ROLLGATE_KILL_SEED={seed}");
    let mut dice = Dice(seed);
    let site = Site::new();
    let root = std::fs::canonicalize(site.root()).unwrap();
    let policy = write(site.root(), "policy.yaml", POLICY);
    let first = port_block(4);
    let ports = format!("{first}-{}", first + 3);
    add(&site, "v1");
    add(&site, "v2");
    let common = |args: &[&str]| -> Vec<String> {
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend(["--root".into(), site.root().display().to_string()]);
        all
    };
    let with_policy = |args: &[&str]| -> Vec<String> {
        let mut all = common(args);
        all.extend(["--policy".into(), policy.display().to_string()]);
        all
    };
    let out = site.run(&[
        "deploy",
        "edge-svc",
        "v1",
        "--ports",
        &ports,
        "--policy",
        policy.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let sampler = Sampler::start(root.clone());
    let mut workers = 2;
    let mut next = "v2";
    let rounds = 60;
    let mut said = Vec::new();
    // How long each kind of round's command took when nothing stopped it: the kill falls
    // within that, so it lands mid-way far more often than after the end.
    let mut lasts: BTreeMap<Op, Duration> = BTreeMap::new();
    for round in 0..rounds {
        let op = match dice.below(20) {
            0..=6 => Op::Deploy,
            7..=9 => Op::Scale,
            10..=12 => Op::Restart,
            13..=15 => Op::StopStart,
            _ => Op::Rollback,
        };
        let target = match dice.below(10) {
            0..=3 => Target::Command,
            4 => Target::AKeeper,
            5 => Target::ClockKeeper,
            6 => Target::AWorker,
            _ => Target::Everything,
        };
        let last = lasts
            .get(&op)
            .copied()
            .unwrap_or(Duration::from_millis(1500));
        let delay = Duration::from_millis(dice.below(last.as_millis() as u64 + 1));
        let asked_workers = if workers == 2 { 1 } else { 2 };
        let args: Vec<String> = match op {
            Op::Deploy => with_policy(&["deploy", "edge-svc", next, "--ports", &ports]),
            Op::Scale => with_policy(&["scale", "edge-svc", &format!("worker={asked_workers}")]),
            Op::Restart => with_policy(&["restart", "edge-svc", "--ports", &ports]),
            Op::StopStart => common(&["stop", "edge-svc"]),
            Op::Rollback => with_policy(&["rollback", "edge-svc", "--ports", &ports]),
        };
        let mut command = std::process::Command::new(bin())
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let began = std::time::Instant::now();
        // The moment comes, or the command ends first (then the kill falls on what runs).
        while began.elapsed() < delay && command.try_wait().unwrap().is_none() {
            std::thread::sleep(Duration::from_millis(5));
        }
        // Once reaped (`try_wait`), the command's pid is free for any process of the machine:
        // it is killed only while it is still this test's unreaped child.
        let running = command.try_wait().unwrap().is_none();
        if !running {
            lasts.insert(op, began.elapsed());
        }
        let command_pid = running.then_some(command.id() as i32);
        let keepers = site.keepers();
        let killed: Vec<i32> = match target {
            Target::Command => command_pid.into_iter().collect(),
            Target::AKeeper => keepers
                .get(dice.below(keepers.len().max(1) as u64) as usize)
                .copied()
                .into_iter()
                .collect(),
            Target::ClockKeeper => clock_keeper(&root).into_iter().collect(),
            Target::AWorker => formation(&root)
                .into_iter()
                .filter(|(t, _, _)| t == "worker")
                .map(|(_, _, pid)| pid)
                .take(1)
                .collect(),
            Target::Everything => command_pid.into_iter().chain(keepers).collect(),
        };
        // Through a pidfd, the process checked to be the root's (or the command) once it is
        // pinned: a pid reused meanwhile by another test's process is never signalled.
        for pid in &killed {
            kill_by_pidfd(*pid, &root, command_pid == Some(*pid));
        }
        let status = command.wait().unwrap();
        let mut stderr_text = String::new();
        if let Some(mut err) = command.stderr.take() {
            use std::io::Read;
            let _ = err.read_to_string(&mut stderr_text);
        }
        let completed = status.code() == Some(0);
        if let Op::StopStart = op {
            let out = site.run(&["start", "edge-svc"]);
            said.push(format!(
                "start: {:?} {}",
                out.status.code(),
                stderr(&out).trim()
            ));
        }
        let up = site.run(&["up"]);
        let words = format!(
            "round {round} (seed {seed}): {op:?}, {target:?} killed after {delay:?} ({killed:?}); the command {status}: {}; up: {}",
            stderr_text.trim(),
            stderr(&up).trim()
        );
        println!("{words}");
        assert_eq!(up.status.code(), Some(0), "a failed recovery: {words}");
        // What the root's files say of the counts now (a scale killed keeps what ran).
        workers = json(&root.join("scale.json"))
            .and_then(|v| v["worker"].as_u64())
            .map_or(2, |n| n as usize);
        if completed {
            if let Op::Deploy = op {
                next = if next == "v2" { "v1" } else { "v2" };
            }
        }
        // Processes told to stop may take their grace to go: give them a few seconds.
        let mut last = Vec::new();
        let settled = wait_for(15, || {
            last = faults(&site, &root, workers);
            last.is_empty()
        });
        assert!(
            settled,
            "{words}\n{last:#?}\n{said:?}\n{}",
            what_the_root_says(&root)
        );
        let outcomes = outcome_faults(&site);
        assert!(outcomes.is_empty(), "{words}\n{outcomes:#?}");
        assert_eq!(sampler.most_clocks(), 1, "two clocks at once by {words}");
        said.clear();
    }
    let twice = twice_run(&site);
    assert!(twice.is_empty(), "seed {seed}: {twice:#?}");
    // Everything stopped: nothing of the service runs, and no tree its processes led is left
    // populated.
    site.stop_service();
    assert!(
        wait_for(15, || of_root(&root).is_empty()),
        "seed {seed}: {:?}",
        of_root(&root)
    );
    let seen = sampler.seen.lock().unwrap().clone();
    drop(sampler);
    let populated: Vec<PathBuf> = trees_led_by(&seen)
        .into_iter()
        .filter(|tree| {
            std::fs::read_to_string(tree.join("cgroup.procs")).is_ok_and(|p| !p.trim().is_empty())
        })
        .collect();
    assert!(populated.is_empty(), "seed {seed}: {populated:?}");
}

/// The release trees (cgroup v2) whose leader was one of `pids`.
fn trees_led_by(pids: &BTreeSet<i32>) -> Vec<PathBuf> {
    let base = ["/sys/fs/cgroup/rollgate", "/sys/fs/cgroup/unified/rollgate"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_dir());
    let Some(base) = base else {
        return Vec::new();
    };
    std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let identity = name.rsplit_once('~').map_or(name.as_str(), |(_, id)| id);
            identity
                .split('-')
                .next()
                .and_then(|pid| pid.parse::<i32>().ok())
                .is_some_and(|pid| pids.contains(&pid))
        })
        .map(|entry| entry.path())
        .collect()
}
