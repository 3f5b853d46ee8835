//! The lab's checker on the starter, after each task, on the solution, and the project's own
//! check.sh; and the demo, which must leave nothing running.

mod common;
use common::*;

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

fn run_check(dir: &Path) -> (Option<i32>, String) {
    let out = std::process::Command::new("sh")
        .arg(repo().join("lab/check.sh"))
        .current_dir(dir)
        .env("ROLLGATE", assert_cmd::cargo::cargo_bin("rollgate"))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
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
    for file in ["rollout-policy.ncl", "policy.ncl", "rollouts.ncl"] {
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
    let (code, text) = run_check(&repo().join("lab/starter"));
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
    let dir = student_copy();
    let d = dir.path();

    apply(d, "rollout-policy.ncl");
    let (code, text) = run_check(d);
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
    let (_, text) = run_check(d);
    assert_eq!(
        verdicts(&text),
        ["PASS", "PASS", "PASS", "PASS", "FAIL", "FAIL"],
        "{text}"
    );

    apply(d, "rollouts.ncl");
    let (code, text) = run_check(d);
    assert_eq!(code, Some(0));
    assert_eq!(text, EXPECTED);
}

#[test]
fn a_query_that_takes_the_last_line_calls_v4_live() {
    let dir = student_copy();
    let d = dir.path();
    for file in ["rollout-policy.ncl", "policy.ncl", "rollouts.ncl"] {
        apply(d, file);
    }
    let query = std::fs::read_to_string(d.join("rollouts.ncl"))
        .unwrap()
        .replace(
            "(std.array.last promotions).version",
            "(std.array.last records).version",
        );
    std::fs::write(d.join("rollouts.ncl"), query).unwrap();
    let (code, text) = run_check(d);
    assert_eq!(code, Some(1));
    assert!(text.contains("\"live\":\"v4\"}\nungated.log"), "{text}");
    assert_eq!(verdicts(&text)[4..], ["FAIL", "PASS"]);
}

#[test]
fn the_solution_prints_the_lessons_expected_result() {
    let (code, text) = run_check(&repo().join("lab/solution"));
    assert_eq!(code, Some(0));
    assert_eq!(text, EXPECTED);
}

#[test]
fn the_projects_own_check_passes() {
    let out = std::process::Command::new("sh")
        .arg(repo().join("check.sh"))
        .env("ROLLGATE", assert_cmd::cargo::cargo_bin("rollgate"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), EXPECTED);
}

#[test]
fn the_demo_tells_the_story_and_leaves_nothing_running() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("demo");
    let out = rollgate()
        .arg("demo")
        .arg("--root")
        .arg(&root)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
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
    assert!(text.contains(r#"{"releases":4,"promoted":2,"rolled_back":2,"reasons":[{"version":"v3","reason":"not ready after 1500 ms"},{"version":"v4","reason":"candidate exited with exit status: 78 before ready"}],"live":"v2"}"#), "{text}");
    assert!(
        text.contains("Live release: v2 (answering on /readyz)"),
        "{text}"
    );
    assert!(text.contains(&root.join("deploy.log").display().to_string()));
    let root = std::fs::canonicalize(&root).unwrap();
    let survivors: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|c| c.starts_with(&root))
                && !is_zombie(*pid)
        })
        .collect();
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
