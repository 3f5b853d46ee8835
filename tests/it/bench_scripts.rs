//! The shell benchmarks clean up after themselves without touching anyone else's processes
//! (issue 36: they once stopped every process whose command line matched `sample-service`, on the
//! machine, other users' included).

use crate::common::*;

use std::time::Duration;

/// `stop_releases ROOT` (bench/lib.sh) stops the release rollgate started in ROOT, and leaves
/// a `rollgate sample-service` that some other user runs beside it alone.
#[test]
fn a_benchmarks_cleanup_stops_its_own_release_and_no_bystander() {
    let site = Site::new();
    site.release("v1", "");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let live = site.live_pid().expect("v1 live");
    let elsewhere = Site::new();
    let bystander = start_release_process(&elsewhere, "v9", free_port());

    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(". \"$1\"; stop_releases \"$2\"")
        .arg("sh")
        .arg(repo().join("bench/lib.sh"))
        .arg(site.root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        wait_for(10, || !alive(live) || is_zombie(live)),
        "the benchmark's own release is stopped"
    );
    std::thread::sleep(Duration::from_millis(300));
    // Its keeper too: nothing started it again.
    assert!(
        site.processes().is_empty() && site.keepers().is_empty(),
        "{:?} {:?}",
        site.processes(),
        site.keepers()
    );
    assert!(
        alive(bystander.pid()) && !is_zombie(bystander.pid()),
        "someone else's sample-service is left running"
    );
}

/// No benchmark stops processes by name.
#[test]
fn no_benchmark_stops_processes_by_a_name_pattern() {
    for entry in std::fs::read_dir(repo().join("bench")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        // The two commands that stop processes by name (spelled so that this file names neither).
        for word in [format!("p{}", "kill"), format!("kill{}", "all")] {
            assert!(
                !text.contains(&word),
                "{} stops processes by name ({word})",
                path.display()
            );
        }
    }
}

/// A benchmark that runs under `set -e` turns it off first thing in its EXIT trap: a shell
/// stops a trap at its first failing command under `set -e` (dash does), so a kill of a process
/// already gone would skip the rest of the clean-up and leave proxies, nginx or a temporary
/// root behind.
#[test]
fn every_benchmarks_cleanup_under_set_e_runs_whole() {
    let mut checked = 0;
    for entry in std::fs::read_dir(repo().join("bench")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("sh") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        if !text.lines().any(|l| l.trim_start().starts_with("set -e")) {
            continue;
        }
        for trap in text.lines().filter(|l| l.starts_with("trap '")) {
            let body = &trap["trap '".len()..];
            let risky = body.contains("kill") || body.contains("stop_");
            assert!(
                !risky || body.starts_with("set +e;"),
                "{}: the EXIT trap can stop at a failing kill: {trap}",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} traps found");
}

/// dash, the `sh` the benchmarks run under, does stop an EXIT trap at a failing command when
/// `set -e` is on: the reason for the check above.
#[test]
fn a_trap_under_set_e_stops_at_a_failing_command_unless_it_turns_set_e_off() {
    let run = |trap: &str| {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("set -e; trap '{trap}' EXIT; true"))
            .output()
            .unwrap();
        stdout(&out)
    };
    assert_eq!(run("kill 999999999 2>/dev/null; echo cleaned"), "");
    assert_eq!(
        run("set +e; kill 999999999 2>/dev/null; echo cleaned"),
        "cleaned\n"
    );
}
