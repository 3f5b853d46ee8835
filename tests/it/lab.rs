//! The lab's checker on the starter, after each task, on the solution, and the project's own
//! check.sh, with the summary query in Nushell (the lesson's `rollouts.nu`) and in Nickel (run
//! by rollgate) alike; and the demo, which must leave nothing running.

use crate::common::*;

use std::path::Path;

const EXPECTED: &str = r#"exported: {"max_polls":15,"max_surge_pct":100,"max_unavailable_pct":0,"on_stall":"rollback","poll_ms":100,"progress_deadline_ms":1500}
RESULT policy_exports_bounded PASS
contract refused { max_unavailable_pct = 0, }: error: missing definition for `progress_deadline_ms`
RESULT contract_rejects_missing_deadline PASS
contract refused { progress_deadline_ms = 900000, max_unavailable_pct = 0, }: progress_deadline_ms must be an integer from 100 to 600000
RESULT contract_rejects_long_deadline PASS
contract refused { progress_deadline_ms = 1500, max_unavailable_pct = 50, }: max_unavailable_pct must be an integer from 0 to 25
RESULT contract_rejects_wide_unavailable PASS
gated.log   -> {"releases":3,"promoted":1,"rolled_back":2,"reasons":[{"version":"v3","reason":"not ready after 1500 ms"},{"version":"v4","reason":"candidate exited with exit status: 78 before ready"}],"live":"v2"}
ungated.log -> {"releases":3,"promoted":3,"rolled_back":0,"reasons":[],"live":"v4"}
RESULT query_gated_log PASS
RESULT query_ungated_log PASS
"#;

const STARTER_SUMMARY: &str =
    r#"{"releases":6,"promoted":6,"rolled_back":0,"reasons":[],"live":"v4"}"#;

/// Which summary query the checker runs.
#[derive(Debug, Clone, Copy)]
enum Query {
    /// `rollouts.nu`, run by Nushell.
    Nushell,
    /// `rollouts.ncl`, run by `rollgate log summary --query`.
    Nickel,
}

impl Query {
    const BOTH: [Query; 2] = [Query::Nushell, Query::Nickel];

    fn file(self) -> &'static str {
        match self {
            Query::Nushell => "rollouts.nu",
            Query::Nickel => "rollouts.ncl",
        }
    }
}

/// `sh lab/check.sh` in `dir` with the query chosen: its exit code, the line naming the query,
/// and the rest of what it printed.
fn run_check(dir: &Path, query: Query) -> (Option<i32>, String) {
    let out = std::process::Command::new("sh")
        .arg(repo().join("lab/check.sh"))
        .current_dir(dir)
        .env("ROLLGATE", crate::common::bin())
        .env("NU", nushell())
        .env("QUERY", query.file())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let first = String::from_utf8_lossy(&out.stderr).into_owned();
    let named = match query {
        Query::Nushell => "query: rollouts.nu, run by Nushell 0.115",
        Query::Nickel => "query: rollouts.ncl, run by rollgate log summary --query",
    };
    // The query is named on stderr: stdout is the lesson's lines only.
    assert!(first.starts_with(named), "{query:?}: {first}");
    (out.status.code(), text)
}

fn results(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .map(|l| {
            let (name, verdict) = l.split_once(' ').unwrap();
            (name.to_string(), verdict.to_string())
        })
        .collect()
}

fn verdicts(text: &str) -> Vec<String> {
    results(text).into_iter().map(|(_, v)| v).collect()
}

/// A student's copy of the starter, fixtures included.
fn student_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for file in [
        "rollout-policy.ncl",
        "policy.ncl",
        "rollouts.ncl",
        "rollouts.nu",
    ] {
        std::fs::copy(repo().join("lab/starter").join(file), dir.path().join(file)).unwrap();
    }
    std::fs::create_dir(dir.path().join("fixtures")).unwrap();
    for log in ["gated.log", "ungated.log"] {
        std::fs::copy(
            repo().join("fixtures").join(log),
            dir.path().join("fixtures").join(log),
        )
        .unwrap();
    }
    dir
}

fn apply(dir: &Path, file: &str) {
    std::fs::copy(repo().join("lab/solution").join(file), dir.join(file)).unwrap();
}

#[test]
fn the_starter_fails_all_six_and_shows_the_starters_summaries() {
    for query in Query::BOTH {
        starter_fails_all_six(query);
    }
}

fn starter_fails_all_six(query: Query) {
    let (code, text) = run_check(&repo().join("lab/starter"), query);
    assert_eq!(code, Some(1));
    let names: Vec<String> = results(&text).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "policy_exports_bounded",
            "contract_rejects_missing_deadline",
            "contract_rejects_long_deadline",
            "contract_rejects_wide_unavailable",
            "query_gated_log",
            "query_ungated_log"
        ]
    );
    assert_eq!(verdicts(&text), vec!["FAIL"; 6], "{text}");
    assert!(
        text.contains(&format!("gated.log   -> {STARTER_SUMMARY}\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("ungated.log -> {STARTER_SUMMARY}\n")),
        "{text}"
    );
}

#[test]
fn each_task_turns_its_checks_green() {
    for query in Query::BOTH {
        each_task_turns_its_checks_green_with(query);
    }
}

fn each_task_turns_its_checks_green_with(query: Query) {
    let dir = student_copy();
    let d = dir.path();

    apply(d, "rollout-policy.ncl");
    let (code, text) = run_check(d, query);
    assert_eq!(code, Some(1));
    assert_eq!(
        verdicts(&text),
        ["FAIL", "PASS", "PASS", "PASS", "FAIL", "FAIL"],
        "{text}"
    );
    // The quiet failure became a loud one, about the student's own policy.
    assert!(
        text.starts_with("export failed: error: missing definition for `progress_deadline_ms`\n"),
        "{text}"
    );

    apply(d, "policy.ncl");
    let (_, text) = run_check(d, query);
    assert_eq!(
        verdicts(&text),
        ["PASS", "PASS", "PASS", "PASS", "FAIL", "FAIL"],
        "{text}"
    );

    apply(d, query.file());
    let (code, text) = run_check(d, query);
    assert_eq!(code, Some(0));
    assert_eq!(text, EXPECTED);
}

#[test]
fn a_query_that_takes_the_last_line_calls_v4_live() {
    for (query, right, wrong) in [
        (
            Query::Nickel,
            "(std.array.last promotions).version",
            "(std.array.last records).version",
        ),
        (
            Query::Nushell,
            "($promotions | last).version?",
            "($records | last).version?",
        ),
    ] {
        let dir = student_copy();
        let d = dir.path();
        for file in ["rollout-policy.ncl", "policy.ncl", query.file()] {
            apply(d, file);
        }
        let text = std::fs::read_to_string(d.join(query.file())).unwrap();
        assert!(text.contains(right), "{query:?}");
        std::fs::write(d.join(query.file()), text.replace(right, wrong)).unwrap();
        let (code, text) = run_check(d, query);
        assert_eq!(code, Some(1));
        assert!(text.contains("\"live\":\"v4\"}\nungated.log"), "{text}");
        assert_eq!(verdicts(&text)[4..], ["FAIL", "PASS"]);
    }
}

#[test]
fn the_solution_prints_the_lessons_expected_result() {
    for query in Query::BOTH {
        let (code, text) = run_check(&repo().join("lab/solution"), query);
        assert_eq!(code, Some(0), "{query:?}");
        assert_eq!(text, EXPECTED, "{query:?}");
    }
}

#[test]
fn the_checker_picks_nushell_when_it_can_and_says_so_when_it_cannot() {
    let check = |query: Option<&str>, nu: &Path| {
        let mut command = std::process::Command::new("sh");
        command
            .arg(repo().join("lab/check.sh"))
            .current_dir(repo().join("lab/solution"))
            .env("ROLLGATE", crate::common::bin())
            .env("NU", nu)
            .env_remove("QUERY");
        if let Some(query) = query {
            command.env("QUERY", query);
        }
        command.output().unwrap()
    };
    let missing = Path::new("/nonexistent/nu");
    let out = check(None, &nushell());
    assert!(stderr(&out).starts_with("query: rollouts.nu, run by Nushell"));
    let out = check(None, missing);
    assert!(stderr(&out).starts_with("query: rollouts.ncl, run by rollgate"));
    assert_eq!(out.status.code(), Some(0));
    let out = check(Some("rollouts.nu"), missing);
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).is_empty());
    assert!(
        stderr(&out).contains("QUERY=rollouts.nu needs Nushell"),
        "{}",
        stderr(&out)
    );
}

/// A log with what real logs carry besides records: noise lines, CRLF endings, a torn last
/// line, versions in other scripts and as numbers, details with and without a reason's `; `.
fn awkward_log(seed: u64) -> String {
    let versions = ["v1", "2.0.1", "ü-7", "版本3", "🚀", "4", "5.5"];
    let events = ["candidate_started", "promoted", "rolled_back", "escalated"];
    let mut state = seed;
    let mut next = |n: usize| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as usize) % n
    };
    let mut text = String::from("# deploy log\n\n");
    for i in 0..120 {
        let version = versions[next(versions.len())];
        // Bare numbers for the numeric-looking versions, strings for the rest.
        let version = if version.parse::<f64>().is_ok() && next(2) == 0 {
            version.to_string()
        } else {
            format!("{version:?}")
        };
        let detail = match next(3) {
            0 => "\"not ready after 1500 ms; old release v1 still answering\"".to_string(),
            1 => "\"candidate exited with exit status: 78 before ready\"".to_string(),
            _ => format!("\"ready after {i} ms\""),
        };
        let end = if next(4) == 0 { "\r\n" } else { "\n" };
        text.push_str(&format!(
            "{{\"ts\":{},\"event\":\"{}\",\"version\":{version},\"detail\":{detail}}}{end}",
            1_790_000_000 + i,
            events[next(events.len())],
        ));
        if next(10) == 0 {
            text.push_str("  an indented note, not a record\n");
        }
    }
    text.push_str("{\"ts\":1790000999,\"event\":\"promo");
    text
}

#[test]
fn the_nushell_solution_and_rollgates_summary_agree() {
    let dir = tempfile::tempdir().unwrap();
    let mut logs: Vec<std::path::PathBuf> = ["gated.log", "ungated.log"]
        .iter()
        .map(|name| repo().join("fixtures").join(name))
        .collect();
    for seed in 1..=4 {
        logs.push(write(
            dir.path(),
            &format!("awkward{seed}.log"),
            &awkward_log(seed),
        ));
    }
    for log in &logs {
        let by_nu = std::process::Command::new(nushell())
            .arg(repo().join("lab/solution/rollouts.nu"))
            .arg(log)
            .output()
            .unwrap();
        assert!(by_nu.status.success(), "{}", stderr(&by_nu));
        let by_rollgate = rollgate()
            .args(["log", "summary"])
            .arg(log)
            .output()
            .unwrap();
        assert!(by_rollgate.status.success(), "{}", stderr(&by_rollgate));
        assert_eq!(
            stdout(&by_nu).trim_end(),
            stdout(&by_rollgate).trim_end(),
            "{}",
            log.display()
        );
    }
}

#[test]
fn the_projects_own_check_passes() {
    let out = std::process::Command::new("sh")
        .arg(repo().join("check.sh"))
        .env("ROLLGATE", crate::common::bin())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Exactly the lesson's twelve lines on stdout; the query's name on stderr.
    assert_eq!(String::from_utf8_lossy(&out.stdout), EXPECTED);
    assert_eq!(EXPECTED.lines().count(), 12);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "query: rollgate's built-in summary\n"
    );
}

/// `rollgate demo --root ROOT`, its words written to files rather than pipes: a demo stopped at
/// `limit` (a test that failed) must not leave the test waiting for ever on a pipe that the
/// releases it started still hold. Past the limit it is killed, with every process whose
/// folder is under ROOT, and the test fails saying what it had said.
fn demo_within(root: &std::path::Path, limit: std::time::Duration) -> std::process::Output {
    let words = tempfile::tempdir().unwrap();
    let file = |name: &str| std::fs::File::create(words.path().join(name)).unwrap();
    let mut child = std::process::Command::new(bin())
        .arg("demo")
        .arg("--root")
        .arg(root)
        .stdout(file("stdout"))
        .stderr(file("stderr"))
        .spawn()
        .unwrap();
    let began = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if began.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            for pid in under(root) {
                send_signal(pid, libc::SIGKILL);
            }
            panic!(
                "the demo took more than {} s: {}{}",
                limit.as_secs(),
                std::fs::read_to_string(words.path().join("stdout")).unwrap_or_default(),
                std::fs::read_to_string(words.path().join("stderr")).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: std::fs::read(words.path().join("stdout")).unwrap_or_default(),
        stderr: std::fs::read(words.path().join("stderr")).unwrap_or_default(),
    }
}

/// The live processes whose working folder is under `root`.
fn under(root: &std::path::Path) -> Vec<i32> {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c.starts_with(&root))
                && !is_zombie(*pid)
        })
        .collect()
}

#[test]
fn the_demo_tells_the_story_and_leaves_nothing_running() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("demo");
    let out = demo_within(&root, std::time::Duration::from_secs(180));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("  v1  ready after 200 ms     -> promoted\n"),
        "{text}"
    );
    assert!(
        text.contains("  v3  ready only after 60 s  -> rolled back: not ready after 1500 ms\n"),
        "{text}"
    );
    assert!(
        text.contains("-> rolled back: candidate exited with exit status: 78 before ready\n"),
        "{text}"
    );
    // The last release goes live on its own READY=1 (the notify probe).
    assert!(
        text.contains("  v5  says READY=1 at 250 ms -> promoted\n"),
        "{text}"
    );
    assert!(text.contains(r#"{"releases":5,"promoted":3,"rolled_back":2,"reasons":[{"version":"v3","reason":"not ready after 1500 ms"},{"version":"v4","reason":"candidate exited with exit status: 78 before ready"}],"live":"v5"}"#), "{text}");
    assert!(
        text.contains("Live release: v5 (answering on /readyz)"),
        "{text}"
    );
    assert!(text.contains(&root.join("deploy.log").display().to_string()));
    // The second act: a good rollout, a bad one that pauses itself, an abort with rollback,
    // one stopped by its numbers, and not one failed request through the proxy.
    assert!(text.contains("exit 0: completed: "), "{text}");
    assert!(
        text.contains("exit 3: paused: wave 1 paused itself"),
        "{text}"
    );
    assert!(text.contains("exit 0: aborted: "), "{text}");
    assert!(text.contains("  replicas now: v2 v2 v2 v2 v2\n"), "{text}");
    assert!(text.contains(", failed: 0, 500 from v4's canary"), "{text}");
    // v4 is ready but answers 10 % of users with 500: the traffic judge rolls it back.
    assert!(
        text.contains("exit 1: aborted: analysis failed: canary 5xx "),
        "{text}"
    );
    let fleet_log = std::fs::read_to_string(root.join("fleet/deploy.log")).unwrap();
    assert_eq!(
        fleet_log
            .matches(r#""event":"rolled_back","version":"v3""#)
            .count(),
        1
    );
    // Both acts end as `rollgate stop` ends a service: logged, and every keeper gone with
    // what it kept (a keeper the demo left to notice the stop on its own outlived it).
    for log in [root.join("deploy.log"), root.join("fleet/deploy.log")] {
        let text = std::fs::read_to_string(&log).unwrap();
        let stop = text
            .lines()
            .rfind(|l| l.contains(r#""event":"stopped""#))
            .unwrap_or_else(|| panic!("no stop in {}: {text}", log.display()));
        assert!(stop.contains("(the demo leaves nothing running)"), "{stop}");
    }
    let survivors = under(&root);
    assert!(survivors.is_empty(), "left running: {survivors:?}");
    // Refuses to mix with an existing deploy.
    let out = rollgate()
        .arg("demo")
        .arg("--root")
        .arg(&root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("already holds a deploy"));
}
