//! `rollgate policy`: the lesson's contract, refusals with Nickel's own diagnostics, data files,
//! many files in one call, and input that must not crash it.

use crate::common::*;

const EXAMPLE_JSON: &str = r#"{
  "edge_svc": {
    "max_polls": 15,
    "max_surge_pct": 100,
    "max_unavailable_pct": 0,
    "on_stall": "rollback",
    "poll_ms": 100,
    "progress_deadline_ms": 1500
  }
}
"#;

/// A policy whose evaluation never ends.
const ENDLESS_POLICY: &str = "let rec f = fun x => f (x + 1) in f 0\n";

/// A policy in the lesson's `bad.ncl` shape with one field replaced.
fn policy_with(field: &str, value: &str) -> String {
    let mut fields = [
        ("progress_deadline_ms", "1500"),
        ("poll_ms", "100"),
        ("max_unavailable_pct", "0"),
        ("max_surge_pct", "100"),
        ("on_stall", "'rollback"),
    ];
    for f in fields.iter_mut() {
        if f.0 == field {
            f.1 = value;
        }
    }
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("{k} = {v}")).collect();
    format!(
        "let {{ RolloutPolicy, .. }} = import \"rollout-policy.ncl\" in\n{{ {} }} | RolloutPolicy\n",
        body.join(", ")
    )
}

#[test]
fn example_policy_exports_the_lessons_json() {
    let out = rollgate()
        .args(["policy", "export"])
        .arg(repo().join("contracts/policy.ncl"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), EXAMPLE_JSON);
}

#[test]
fn bundled_contract_is_found_from_any_folder() {
    let dir = tempfile::tempdir().unwrap();
    let policy = std::fs::read_to_string(repo().join("contracts/policy.ncl")).unwrap();
    let path = write(dir.path(), "policy.ncl", &policy);
    let out = export(&path, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), EXAMPLE_JSON);
}

#[test]
fn a_contract_beside_the_policy_wins_over_the_bundled_one() {
    let dir = tempfile::tempdir().unwrap();
    // A local contract that only accepts deadlines up to 1000 ms.
    let local = rollgate_contract().replace(
        "progress_deadline_ms = { low = 100, high = 600000 }",
        "progress_deadline_ms = { low = 100, high = 1000 }",
    );
    assert_ne!(local, rollgate_contract());
    write(dir.path(), "rollout-policy.ncl", &local);
    let path = write(
        dir.path(),
        "p.ncl",
        &policy_with("progress_deadline_ms", "1500"),
    );
    let out = export(&path, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("progress_deadline_ms must be an integer from 100 to 1000"));
}

#[test]
fn import_path_option_is_searched_before_the_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let lib = dir.path().join("lib");
    let local = rollgate_contract().replace(
        "poll_ms = { low = 50, high = 5000 }",
        "poll_ms = { low = 50, high = 60 }",
    );
    assert_ne!(local, rollgate_contract());
    write(&lib, "rollout-policy.ncl", &local);
    let path = write(dir.path(), "p.ncl", &policy_with("poll_ms", "100"));
    let out = rollgate()
        .args(["policy", "export", "--import-path"])
        .arg(&lib)
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("poll_ms must be an integer from 50 to 60"));
    // Without the option the bundled contract accepts it.
    let out = export(&path, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
}

fn rollgate_contract() -> String {
    let out = rollgate().args(["policy", "contract"]).output().unwrap();
    assert!(out.status.success());
    let text = stdout(&out);
    assert_eq!(
        text,
        std::fs::read_to_string(repo().join("contracts/rollout-policy.ncl")).unwrap()
    );
    text
}

#[test]
fn each_bound_is_refused_with_the_lessons_words() {
    let cases = [
        (
            "progress_deadline_ms",
            "900000",
            "progress_deadline_ms must be an integer from 100 to 600000",
        ),
        (
            "max_unavailable_pct",
            "50",
            "max_unavailable_pct must be an integer from 0 to 25",
        ),
        (
            "poll_ms",
            "49",
            "poll_ms must be an integer from 50 to 5000",
        ),
        (
            "max_surge_pct",
            "101",
            "max_surge_pct must be an integer from 0 to 100",
        ),
        (
            "progress_deadline_ms",
            "1500.5",
            "progress_deadline_ms must be an integer from 100 to 600000",
        ),
        (
            "progress_deadline_ms",
            "\"1500\"",
            "progress_deadline_ms must be an integer from 100 to 600000",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (field, value, message) in cases {
        let path = write(dir.path(), "bad.ncl", &policy_with(field, value));
        let out = export(&path, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{field}={value}: {err}");
        assert!(out.stdout.is_empty());
        let title = format!("error: contract broken by the value of `{field}`\n");
        assert!(err.starts_with(&title), "{field}={value}: {err}");
        assert!(
            err.contains(&format!("       {message}\n")),
            "{field}={value}: {err}"
        );
        // Both places: the contract's line and the offending value in bad.ncl.
        assert!(err.contains("rollout-policy.ncl:"), "{err}");
        assert!(err.contains("expected type"), "{err}");
        assert!(err.contains(&format!("{}:2:", path.display())), "{err}");
        assert!(err.contains("applied to this expression"), "{err}");
        assert!(!err.contains('\u{1b}'), "no colour off a terminal: {err}");
    }
}

#[test]
fn the_lessons_bad_policy_renders_like_nickel() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "bad.ncl",
        &policy_with("progress_deadline_ms", "900000"),
    );
    let out = export(&path, &[]);
    let err = stderr(&out);
    // Same layout as the lesson's `nickel export bad.ncl`: the contract's words, the contract's
    // line underlined as the expected type, then the offending value.
    assert!(
        err.starts_with("error: contract broken by the value of `progress_deadline_ms`\n       progress_deadline_ms must be an integer from 100 to 600000\n"),
        "{err}"
    );
    assert!(
        err.contains("54 │     progress_deadline_ms | Within \"progress_deadline_ms\",\n"),
        "{err}"
    );
    assert!(
        err.contains(
            "   │                            ----------------------------- expected type\n"
        ),
        "{err}"
    );
    assert!(
        err.contains(&format!("  ┌─ {}:2:26\n", path.display())),
        "{err}"
    );
}

#[test]
fn missing_deadline_extra_field_and_wrong_tag_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = write(
        dir.path(),
        "missing.ncl",
        "let { RolloutPolicy, .. } = import \"rollout-policy.ncl\" in\n{ max_unavailable_pct = 0, } | RolloutPolicy\n",
    );
    let out = export(&missing, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("error: missing definition for `progress_deadline_ms`\n"),
        "{}",
        stderr(&out)
    );

    let extra = policy_with("on_stall", "'rollback, retries = 3");
    let path = write(dir.path(), "extra.ncl", &extra);
    let out = export(&path, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("retries"), "{}", stderr(&out));

    let path = write(dir.path(), "tag.ncl", &policy_with("on_stall", "'retry"));
    let out = export(&path, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("contract broken by the value of `on_stall`"),
        "{}",
        stderr(&out)
    );
}

const GOOD_YAML: &str = "edge_svc:\n  progress_deadline_ms: 1500\n  poll_ms: 100\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n";

#[test]
fn data_files_get_the_contract_on_every_entry() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = write(dir.path(), "good.yaml", GOOD_YAML);
    let out = export(&yaml, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(value["edge_svc"]["on_stall"], "rollback");

    let bad_yaml = write(
        dir.path(),
        "bad.yaml",
        &GOOD_YAML.replace("max_unavailable_pct: 0", "max_unavailable_pct: 50"),
    );
    let json = write(
        dir.path(),
        "bad.json",
        r#"{"a": {"progress_deadline_ms": 1500, "poll_ms": 49, "max_unavailable_pct": 0, "max_surge_pct": 100, "on_stall": "rollback"}}"#,
    );
    let toml = write(
        dir.path(),
        "bad.toml",
        "[a]\nprogress_deadline_ms = 1500\npoll_ms = 100\nmax_unavailable_pct = 0\nmax_surge_pct = 100\non_stall = \"sideways\"\n",
    );
    for (path, expected, line) in [
        (
            &bad_yaml,
            "max_unavailable_pct must be an integer from 0 to 25",
            ":4:",
        ),
        (&json, "poll_ms must be an integer from 50 to 5000", ":1:"),
        (&toml, "contract broken by the value of `on_stall`", ":6:"),
    ] {
        let out = export(path, &[]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(expected), "{err}");
        assert!(err.contains(&format!("{}{line}", path.display())), "{err}");
    }
}

#[test]
fn exported_json_checks_again_as_a_data_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "policy.json", EXAMPLE_JSON);
    let out = rollgate()
        .args(["policy", "check"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stdout(&out));
}

#[test]
fn yaml_and_toml_export_formats() {
    let policy = repo().join("contracts/policy.ncl");
    let out = rollgate()
        .args(["policy", "export", "--format", "yaml"])
        .arg(&policy)
        .output()
        .unwrap();
    assert_eq!(
        stdout(&out),
        "edge_svc:\n  max_polls: 15\n  max_surge_pct: 100\n  max_unavailable_pct: 0\n  on_stall: rollback\n  poll_ms: 100\n  progress_deadline_ms: 1500\n"
    );
    let out = rollgate()
        .args(["policy", "export", "--format", "toml"])
        .arg(&policy)
        .output()
        .unwrap();
    assert_eq!(
        stdout(&out),
        "[edge_svc]\nmax_polls = 15\nmax_surge_pct = 100\nmax_unavailable_pct = 0\non_stall = \"rollback\"\npoll_ms = 100\nprogress_deadline_ms = 1500\n"
    );
}

#[test]
fn k8s_output_for_the_example_policy() {
    let out = rollgate()
        .args(["policy", "export", "--format", "k8s"])
        .arg(repo().join("contracts/policy.ncl"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let yaml = stdout(&out);
    for line in [
        "kind: \"Deployment\"\n",
        "  name: \"edge-svc\"\n",
        "    rollgate.dev/on-stall: \"rollback\"\n",
        "  minReadySeconds: 0\n",
        "  progressDeadlineSeconds: 2\n",
        "      maxUnavailable: \"0%\"\n",
        "      maxSurge: \"100%\"\n",
        "          periodSeconds: 1\n",
    ] {
        assert!(yaml.contains(line), "missing {line:?} in\n{yaml}");
    }
}

#[test]
fn k8s_refuses_a_policy_kubernetes_would_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "p.yaml",
        &GOOD_YAML.replace("max_surge_pct: 100", "max_surge_pct: 0"),
    );
    let out = rollgate()
        .args(["policy", "export", "--format", "k8s"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("both 0"), "{}", stderr(&out));
}

fn check_fixture() -> (tempfile::TempDir, Vec<std::path::PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let files = vec![
        write(dir.path(), "good.ncl", &policy_with("poll_ms", "100")),
        write(dir.path(), "good.yaml", GOOD_YAML),
        write(
            dir.path(),
            "wide.ncl",
            &policy_with("max_unavailable_pct", "50"),
        ),
        write(dir.path(), "broken.ncl", "{ a = , }\n"),
        dir.path().join("absent.ncl"),
    ];
    (dir, files)
}

#[test]
fn check_reports_one_line_per_file_and_a_total() {
    let (dir, files) = check_fixture();
    let out = rollgate()
        .current_dir(dir.path())
        .args(["policy", "check"])
        .args(&files)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert_eq!(lines[0], format!("{}: ok", files[0].display()));
    assert_eq!(lines[1], format!("{}: ok", files[1].display()));
    assert_eq!(
        lines[2],
        format!(
            "{0}: error at {0}:2:69: contract broken by the value of `max_unavailable_pct`: max_unavailable_pct must be an integer from 0 to 25",
            files[2].display()
        )
    );
    assert_eq!(
        lines[3],
        format!(
            "{0}: error at {0}:1:7: unexpected token",
            files[3].display()
        )
    );
    assert_eq!(
        lines[4],
        format!("{}: error: no such file", files[4].display())
    );
    assert_eq!(lines[5], "5 files checked: 2 ok, 3 failed");
}

#[test]
fn check_all_good_exits_zero() {
    let (_dir, files) = check_fixture();
    let out = rollgate()
        .args(["policy", "check"])
        .args(&files[..2])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(stdout(&out).ends_with("2 files checked: 2 ok, 0 failed\n"));
}

#[test]
fn check_json_format_is_one_object_per_file() {
    let (_dir, files) = check_fixture();
    let out = rollgate()
        .args(["policy", "check", "--format", "json"])
        .args(&files)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let objects: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(objects.len(), 5);
    assert_eq!(objects[0]["ok"], true);
    assert_eq!(objects[2]["ok"], false);
    assert_eq!(
        objects[2]["error"],
        "contract broken by the value of `max_unavailable_pct`"
    );
    assert_eq!(
        objects[2]["message"],
        "max_unavailable_pct must be an integer from 0 to 25"
    );
    assert_eq!(objects[2]["location"]["line"], 2);
    assert!(objects[2]["diagnostic"]
        .as_str()
        .unwrap()
        .contains("applied to this expression"));
    assert_eq!(objects[4]["error"], "no such file");
}

#[test]
fn check_github_format_annotates_failures() {
    let (_dir, files) = check_fixture();
    let out = rollgate()
        .args(["policy", "check", "--format", "github"])
        .args(&files)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    let wide = files[2]
        .display()
        .to_string()
        .replace(':', "%3A")
        .replace(',', "%2C");
    assert!(
        lines[0].starts_with(&format!("::error file={wide},line=2,col=69,title=")),
        "{}",
        lines[0]
    );
    assert!(lines[0].ends_with("::contract broken by the value of `max_unavailable_pct`: max_unavailable_pct must be an integer from 0 to 25"));
    assert!(lines[1].contains(",line=1,col=7,"));
    assert!(lines[2].contains(",line=1,col=1,") && lines[2].ends_with("::no such file"));
    assert_eq!(lines[3], "5 files checked: 2 ok, 3 failed");
}

#[test]
fn a_missing_definition_is_annotated_in_the_policy_not_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "missing.ncl",
        "let { RolloutPolicy, .. } = import \"rollout-policy.ncl\" in\n{ max_unavailable_pct = 0, } | RolloutPolicy\n",
    );
    let out = rollgate()
        .args(["policy", "check"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        stdout(&out).lines().next().unwrap(),
        format!(
            "{0}: error at {0}:2:1: missing definition for `progress_deadline_ms`",
            path.display()
        )
    );
}

#[test]
fn check_many_files_with_a_poisoned_batch_still_judges_each() {
    // A missing import in one file fails the shared program (a syntax error is kept out of
    // it); every other file must still get its own verdict.
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for i in 0..30 {
        let text = match i {
            7 => "import \"gone.ncl\"\n".to_string(),
            11 => "{ a = , }\n".to_string(),
            19 => policy_with("max_surge_pct", "101"),
            _ => policy_with("poll_ms", &(50 + i).to_string()),
        };
        files.push(write(dir.path(), &format!("p{i}.ncl"), &text));
    }
    let out = rollgate()
        .args(["policy", "check"])
        .args(&files)
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1));
    for (i, line) in text.lines().take(30).enumerate() {
        let ok = line.ends_with(": ok");
        assert_eq!(ok, ![7, 11, 19].contains(&i), "line {i}: {line}");
    }
    assert!(
        text.ends_with("30 files checked: 27 ok, 3 failed\n"),
        "{text}"
    );
}

#[test]
fn bad_input_is_refused_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("binary.ncl"), b"{ a = \"\xff\xfe\" }").unwrap();
    write(d, "cycle1.ncl", "import \"cycle2.ncl\"\n");
    write(d, "cycle2.ncl", "import \"cycle1.ncl\"\n");
    write(d, "noimport.ncl", "import \"not-here.ncl\"\n");
    write(
        d,
        "nested.ncl",
        &format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
    );
    write(d, "forever.ncl", ENDLESS_POLICY);
    let big = std::fs::File::create(d.join("big.ncl")).unwrap();
    big.set_len(50 << 20).unwrap();
    let cases: [(&str, &str); 9] = [
        ("absent.ncl", "absent.ncl: no such file"),
        (".", "is a directory"),
        (
            "binary.ncl",
            "binary.ncl: is not UTF-8 text (invalid byte at line 1",
        ),
        ("cycle1.ncl", "error: infinite recursion"),
        (
            "noimport.ncl",
            "error: import of not-here.ncl failed: could not find import",
        ),
        (
            "nested.ncl",
            "nested.ncl: the evaluator crashed, most likely nesting too deep",
        ),
        (
            "forever.ncl",
            "forever.ncl: evaluation did not finish within 1500 ms",
        ),
        (
            "big.ncl",
            "big.ncl: is 52428800 bytes, over the 10485760-byte limit",
        ),
        ("", "policy"),
    ];
    for (name, expected) in cases {
        let mut cmd = rollgate();
        cmd.current_dir(d).args(["policy", "export"]);
        // Nested brackets keep the default 10 s limit: they must crash well before it.
        if name == "forever.ncl" {
            cmd.args(["--timeout-ms", "1500"]);
        }
        if !name.is_empty() {
            cmd.arg(name);
        }
        let out = cmd.output().unwrap();
        let err = stderr(&out);
        let want_code = if name.is_empty() { 2 } else { 1 };
        assert_eq!(out.status.code(), Some(want_code), "{name}: {err}");
        assert!(
            err.contains(expected),
            "{name}: expected {expected:?} in {err}"
        );
        assert!(!err.contains("panicked"), "{name}: {err}");
        assert!(!err.contains("overflowed"), "{name}: {err}");
    }
}

#[test]
fn usage_errors_exit_2() {
    let out = rollgate()
        .args(["policy", "export", "--format", "xml", "p.ncl"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = rollgate().args(["policy", "check"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = rollgate().args(["no-such-command"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn help_and_version() {
    let out = rollgate().arg("--version").output().unwrap();
    assert_eq!(
        stdout(&out),
        format!("rollgate {}\n", env!("CARGO_PKG_VERSION"))
    );
    for args in [
        vec!["--help"],
        vec!["policy", "--help"],
        vec!["policy", "export", "--help"],
        vec!["policy", "check", "--help"],
    ] {
        let out = rollgate().args(&args).output().unwrap();
        assert!(out.status.success());
        assert!(stdout(&out).contains("Example"), "{args:?}");
    }
}

#[test]
fn export_matches_nickel_1_18_byte_for_byte() {
    let golden = repo().join("tests/golden");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&golden).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "ncl") {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let dir_text = std::fs::canonicalize(dir.path())
        .unwrap()
        .display()
        .to_string();
    let mut compared = 0;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let case = path.file_stem().unwrap().to_str().unwrap().to_string();
        if case == "rollout-policy" {
            continue;
        }
        for format in ["json", "yaml", "toml"] {
            let expect = |part: &str| {
                std::fs::read_to_string(golden.join(format!("{case}.{format}.{part}"))).unwrap()
            };
            let out = rollgate()
                .current_dir(dir.path())
                .args(["policy", "export", "--format", format])
                .arg(format!("{case}.ncl"))
                .output()
                .unwrap();
            assert_eq!(
                out.status.code().unwrap().to_string(),
                expect("code").trim(),
                "{case} {format}"
            );
            assert_eq!(stdout(&out), expect("stdout"), "{case} {format}");
            assert_eq!(
                stderr(&out).replace(&dir_text, "@DIR@"),
                expect("stderr"),
                "{case} {format}"
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 36);
}

#[test]
fn colour_only_on_a_terminal_and_never_with_no_color() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "bad.ncl", &policy_with("poll_ms", "49"));
    let bin = crate::common::bin();
    // `script` gives the command a terminal.
    let on_terminal = |no_color: bool| {
        let mut cmd = std::process::Command::new("script");
        cmd.args([
            "-qec",
            &format!("'{}' policy export '{}'", bin.display(), path.display()),
            "/dev/null",
        ]);
        cmd.env_remove("NO_COLOR");
        if no_color {
            cmd.env("NO_COLOR", "1");
        }
        String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned()
    };
    let coloured = on_terminal(false);
    assert!(
        coloured.contains("poll_ms must be an integer from 50 to 5000"),
        "{coloured}"
    );
    assert!(
        coloured.contains('\u{1b}'),
        "no colour on a terminal: {coloured}"
    );
    let plain = on_terminal(true);
    assert!(
        plain.contains("poll_ms must be an integer from 50 to 5000"),
        "{plain}"
    );
    assert!(
        !plain.contains("\u{1b}["),
        "colour despite NO_COLOR: {plain}"
    );
    // Off a terminal: plain.
    let out = export(&path, &[]);
    assert!(!stderr(&out).contains('\u{1b}'));
}

#[test]
fn a_runaway_file_in_a_batch_is_named_and_the_others_still_pass() {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        write(dir.path(), "a.ncl", &policy_with("poll_ms", "100")),
        write(dir.path(), "forever.ncl", ENDLESS_POLICY),
        write(dir.path(), "b.ncl", &policy_with("poll_ms", "200")),
    ];
    // 4 s: a good policy is judged in a fraction of that even on a loaded machine (1.5 s was
    // not enough for a debug build beside seven other tests on two cores).
    let started = std::time::Instant::now();
    let out = rollgate()
        .args(["policy", "check", "--timeout-ms", "4000"])
        .args(&files)
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text.contains("a.ncl: ok\n") && text.contains("b.ncl: ok\n"),
        "{text}"
    );
    assert!(
        text.contains("forever.ncl: error: evaluation did not finish within 4000 ms"),
        "{text}"
    );
    // One limit for the batch, one for the file alone: not one per file in the batch (that
    // would be 12 s and more).
    assert!(
        started.elapsed() < std::time::Duration::from_secs(11),
        "{:?}",
        started.elapsed()
    );
}

/// A CI job may run under `ulimit -v`: the evaluator must keep that limit rather than fail to
/// raise it, fit its stack under it, and still report deep nesting as a crash.
#[test]
fn checks_under_a_tight_address_space_limit() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::copy(repo().join("contracts/policy.ncl"), d.join("policy.ncl")).unwrap();
    write(
        d,
        "nested.ncl",
        &format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)),
    );
    let binary = crate::common::bin();
    let limited = |file: &str| {
        std::process::Command::new("sh")
            .env_remove("NICKEL_IMPORT_PATH")
            .current_dir(d)
            .arg("-c")
            .arg(r#"ulimit -v 1000000 && exec "$0" policy check --timeout-ms 120000 "$1""#)
            .arg(&binary)
            .arg(file)
            .output()
            .unwrap()
    };
    let out = limited("policy.ncl");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "policy.ncl: ok\n1 file checked: 1 ok, 0 failed\n"
    );
    let out = limited("nested.ncl");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out)
            .contains("nested.ncl: error: the evaluator crashed, most likely nesting too deep"),
        "{}",
        stdout(&out)
    );
}

/// The shared program is only a shortcut: whatever mix of good and broken files one call
/// checks, each file's line must be exactly the line it gets when checked alone. The mix puts
/// broken contracts (which the batch survives) next to files that do not parse (kept out of
/// it), a missing import (which forces a rebuild), data files, and policies that share a
/// helper module.
#[test]
fn one_call_over_a_mixed_corpus_judges_each_file_as_alone() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "helper.ncl",
        "{ deadline = fun ms => if ms > 1000 then ms else 1000 }\n",
    );
    let helper_policy = |ms: &str| {
        format!(
            "let {{ RolloutPolicy, .. }} = import \"rollout-policy.ncl\" in\nlet h = import \"helper.ncl\" in\n{{ progress_deadline_ms = h.deadline {ms}, poll_ms = 100, max_unavailable_pct = 0, max_surge_pct = 100, on_stall = 'escalate }} | RolloutPolicy\n"
        )
    };
    let good_yaml = "svc:\n  progress_deadline_ms: 1500\n  poll_ms: 100\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n";
    let good_toml = "[svc]\nprogress_deadline_ms = 1500\npoll_ms = 100\nmax_unavailable_pct = 0\nmax_surge_pct = 100\non_stall = \"rollback\"\n";
    let mut names = Vec::new();
    for i in 0..36 {
        let (name, text) = match i % 12 {
            1 => (format!("p{i}.ncl"), policy_with("progress_deadline_ms", "900000")),
            3 => (format!("p{i}.ncl"), policy_with("on_stall", "'retry")),
            4 => (format!("p{i}.yaml"), good_yaml.replace("poll_ms: 100", "poll_ms: 49")),
            5 => (format!("p{i}.ncl"), helper_policy("700000")),
            6 => (format!("p{i}.ncl"), helper_policy("10")),
            7 if i == 19 => (format!("p{i}.ncl"), "{ a = , }\n".to_string()),
            2 if i == 14 => (format!("p{i}.yaml"), "svc:\n  poll_ms: [100\n".to_string()),
            0 if i == 24 => (format!("p{i}.json"), r#"{"svc": {"poll_ms": 100}"#.to_string()),
            2 if i == 26 => (format!("p{i}.toml"), good_toml.to_string()),
            7 if i == 31 => (format!("p{i}.toml"), good_toml.replace("[svc]", "[svc")),
            8 => (format!("p{i}.yaml"), good_yaml.to_string()),
            9 if i == 33 => (format!("p{i}.ncl"), "import \"gone.ncl\"\n".to_string()),
            10 => (format!("p{i}.ncl"), policy_with("max_surge_pct", "\"100\"")),
            11 => (
                format!("p{i}.json"),
                r#"{"svc": {"progress_deadline_ms": 1500, "poll_ms": 100, "max_unavailable_pct": 50, "max_surge_pct": 100, "on_stall": "rollback"}}"#.to_string(),
            ),
            _ => (format!("p{i}.ncl"), policy_with("poll_ms", &(60 + i).to_string())),
        };
        write(d, &name, &text);
        names.push(name);
    }
    let together = rollgate()
        .current_dir(d)
        .args(["policy", "check"])
        .args(&names)
        .output()
        .unwrap();
    let lines: Vec<String> = stdout(&together).lines().map(String::from).collect();
    assert_eq!(lines.len(), names.len() + 1, "{}", stdout(&together));
    let mut failed = 0;
    for (name, line) in names.iter().zip(&lines) {
        let alone = rollgate()
            .current_dir(d)
            .args(["policy", "check", name])
            .output()
            .unwrap();
        let alone_line = stdout(&alone)
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        assert_eq!(line, &alone_line, "{name}");
        if !line.ends_with(": ok") {
            failed += 1;
        }
    }
    // Six of every twelve are broken in some way, plus the syntax and import errors and three
    // data files that do not parse.
    assert_eq!(failed, 3 * 6 + 2 + 3, "{}", stdout(&together));
    assert_eq!(
        lines[names.len()],
        format!("36 files checked: {} ok, {failed} failed", 36 - failed)
    );
}

/// The parent enforces the time limit; if it is killed, its evaluator must not spin on as an
/// orphan.
#[test]
fn an_evaluator_dies_with_its_rollgate() {
    let dir = tempfile::tempdir().unwrap();
    let forever = write(dir.path(), "forever.ncl", ENDLESS_POLICY);
    let mut parent = std::process::Command::new(crate::common::bin())
        .args(["policy", "export", "--timeout-ms", "600000"])
        .arg(&forever)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut evaluators = Vec::new();
    assert!(
        wait_for(20, || {
            evaluators = children_of(parent.id() as i32);
            !evaluators.is_empty()
        }),
        "no evaluator started"
    );
    send_signal(parent.id() as i32, 9);
    parent.wait().unwrap();
    assert!(
        wait_for(10, || evaluators.iter().all(|pid| !alive(*pid))),
        "evaluators {evaluators:?} outlived their parent"
    );
}

/// A data file cut off mid-list fails at its very end; the report must point there, in the
/// file itself, not at the import rollgate wraps it in.
#[test]
fn a_data_file_that_does_not_parse_is_located_in_itself() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "open.yaml", "svc:\n  poll_ms: [100\n");
    let out = rollgate()
        .current_dir(dir.path())
        .args(["policy", "check", "open.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let line = stdout(&out).lines().next().unwrap_or_default().to_string();
    assert!(
        line.starts_with("open.yaml: error at open.yaml:3:1: yaml parse error: "),
        "{line}"
    );
    let out = rollgate()
        .current_dir(dir.path())
        .args(["policy", "check", "--format", "github", "open.yaml"])
        .output()
        .unwrap();
    assert!(
        stdout(&out).starts_with("::error file=open.yaml,line=3,col=1,"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn defect_12_an_import_outside_the_policys_tree_is_refused_and_no_secret_is_printed() {
    let secret = "hunter2-do-not-print-7f3a";
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    write(
        outside.path(),
        "shared.ncl",
        "{ progress_deadline_ms = 1500, poll_ms = 100, max_unavailable_pct = 0, max_surge_pct = 100, on_stall = 'rollback }",
    );
    let leak = write(
        dir.path(),
        "leak.ncl",
        "{ edge_svc = { env = import \"/proc/self/environ\" as 'Text } }\n",
    );
    let sideways = write(
        dir.path(),
        "sideways.ncl",
        &format!(
            "let shared = import \"{}\" in {{ edge_svc = shared }}\n",
            outside.path().join("shared.ncl").display()
        ),
    );
    for args in [
        vec!["policy", "export"],
        vec!["policy", "check"],
        vec!["policy", "check", "--format", "json"],
        vec!["policy", "check", "--format", "github"],
    ] {
        let out = rollgate()
            .args(&args)
            .arg(&leak)
            .env("SECRET", secret)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert!(!all.contains(secret), "{args:?} printed the secret");
        assert!(all.contains("leak.ncl:1:22"), "{args:?}: {all}");
        assert!(all.contains("/proc/self/environ"), "{args:?}: {all}");
        assert!(all.contains("--allow-import-anywhere"), "{args:?}: {all}");
    }
    // A deploy reading such a policy refuses it before anything starts.
    let site = Site::new();
    site.release("v1", "");
    let out = site.deploy(free_port(), "v1", &["--policy", leak.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!stderr(&out).contains(secret));

    let out = rollgate()
        .args(["policy", "export"])
        .arg(&sideways)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("outside the policy's folder"),
        "{}",
        stderr(&out)
    );
    // The same import is fine from an --import-path folder, or when explicitly allowed.
    let out = rollgate()
        .args(["policy", "export", "--allow-import-anywhere"])
        .arg(&sideways)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = rollgate()
        .args(["policy", "export", "-I"])
        .arg(outside.path())
        .arg(&sideways)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn defect_12_an_import_over_the_size_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "big.ncl",
        &format!("{{ pad = \"{}\" }}", "x".repeat(5000)),
    );
    let policy = write(dir.path(), "p.ncl", "(import \"big.ncl\") & { a = 1 }\n");
    let out = rollgate()
        .args(["policy", "export", "--max-file-bytes", "1000"])
        .arg(&policy)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("over the 1000-byte limit"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn rollout_fields_are_optional_bounded_and_reach_kubernetes() {
    let dir = tempfile::tempdir().unwrap();
    let fields = "'rollback, replicas = 10, waves = [1, 10, 50, 100], soak_ms = 1000, \
                  min_ready_ms = 500, max_failure_ratio = 0.1, release_deadline_ms = 120000, \
                  classes = { \"0\" = 'required, \"9\" = 'left_behind }";
    let good = write(dir.path(), "good.ncl", &policy_with("on_stall", fields));
    let out = export(&good, &["--format", "k8s"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let yaml = stdout(&out);
    assert!(yaml.contains("\n  replicas: 10\n"), "{yaml}");
    assert!(yaml.contains("\n  minReadySeconds: 1\n"), "{yaml}");
    // The same fields from YAML, classes as strings.
    let data = write(
        dir.path(),
        "good.yaml",
        "edge_svc:\n  progress_deadline_ms: 1500\n  poll_ms: 100\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  replicas: 3\n  classes:\n    \"2\": left_behind\n",
    );
    assert_eq!(export(&data, &[]).status.code(), Some(0));
    for (bad, words) in [
        (
            "'rollback, replicas = 0",
            "replicas must be an integer from 1 to 1000",
        ),
        (
            "'rollback, waves = [0, 100]",
            "waves must be an integer from 1 to 100",
        ),
        (
            "'rollback, max_failure_ratio = 1.5",
            "max_failure_ratio must be a number from 0 to 1",
        ),
        (
            "'rollback, soak_ms = -1",
            "soak_ms must be an integer from 0 to 3600000",
        ),
        ("'rollback, classes = { \"1\" = 'vip }", "classes"),
    ] {
        let path = write(dir.path(), "bad.ncl", &policy_with("on_stall", bad));
        let out = export(&path, &[]);
        assert_eq!(out.status.code(), Some(1), "{bad}");
        assert!(stderr(&out).contains(words), "{bad}: {}", stderr(&out));
    }
    // Kubernetes wants minReadySeconds below progressDeadlineSeconds.
    let slow = write(
        dir.path(),
        "slow.ncl",
        &policy_with("on_stall", "'rollback, min_ready_ms = 1500"),
    );
    let out = export(&slow, &["--format", "k8s"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("minReadySeconds"), "{}", stderr(&out));
}

/// Issue 58: the record a user writes first, with no contract applied, used to pass
/// `policy check` and a deploy's preflight untouched (a 20 ms poll, a misspelt field ignored).
#[test]
fn a_nickel_record_that_applies_no_contract_is_held_to_it_in_check_and_before_a_deploy() {
    let dir = tempfile::tempdir().unwrap();
    let record = |fields: &str| {
        format!(
            "{{ edge_svc = {{ progress_deadline_ms = 1500, poll_ms = 100, max_unavailable_pct = 0,\n  max_surge_pct = 100, on_stall = \"rollback\"{fields} }} }}\n"
        )
    };
    let out_of_range = write(
        dir.path(),
        "wide.ncl",
        "{ edge_svc = { progress_deadline_ms = 1500, poll_ms = 100,\n  max_unavailable_pct = 90, max_surge_pct = 100, on_stall = \"rollback\" } }\n",
    );
    let misspelt = write(dir.path(), "misspelt.ncl", &record(", watch_msx = 5"));
    let good = write(dir.path(), "good.ncl", &record(""));
    let check = |files: &[&std::path::Path]| {
        rollgate()
            .args(["policy", "check"])
            .args(files)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let out = check(&[&out_of_range]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    // Pointed at the value in the user's file, in the contract's own words.
    assert!(
        stdout(&out).contains(&format!(
            "{}: error at {}:2:25: contract broken by the value of `max_unavailable_pct`: max_unavailable_pct must be an integer from 0 to 25",
            out_of_range.display(),
            out_of_range.display()
        )),
        "{}",
        stdout(&out)
    );
    let out = check(&[&misspelt]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("extra field `watch_msx`"),
        "{}",
        stdout(&out)
    );
    // The good plain record passes, alone and in a batch beside the bad ones.
    assert_eq!(check(&[&good]).status.code(), Some(0));
    let out = check(&[&good, &misspelt, &out_of_range]);
    assert!(
        stdout(&out).contains("3 files checked: 1 ok, 2 failed"),
        "{}",
        stdout(&out)
    );
    // `policy export` stays `nickel export` (the lesson's checks run on it): it prints the
    // file as written.
    let out = export(&misspelt, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("\"watch_msx\": 5"),
        "{}",
        stdout(&out)
    );
    // And a deploy is refused before anything is touched (exit 2), its dry run too.
    let site = Site::new();
    site.release("v1", "");
    for extra in [&["--dry-run"][..], &[][..]] {
        let policy = ["--policy", misspelt.to_str().unwrap()];
        let out = site.deploy(free_port(), "v1", &[&policy[..], extra].concat());
        let said = format!("{}{}", stdout(&out), stderr(&out));
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {said}");
        assert!(said.contains("extra field `watch_msx`"), "{said}");
    }
    assert!(site.pointer().is_none(), "nothing was deployed");
    assert!(!site.root().join("deploy.log").exists() || site.events().is_empty());
}

/// Issue 67, 8: the lesson's own pattern — its closed contract beside the file, the checked
/// record merged with `max_polls` afterwards — is what `nickel export` accepts, and
/// `policy check` used to refuse it ("extra field `max_polls`") by applying the contract a
/// second time. A file that imports the contract and never applies it is still held to it.
#[test]
fn the_lessons_closed_contract_and_a_field_merged_after_it_pass_as_nickel_has_them() {
    let dir = tempfile::tempdir().unwrap();
    for file in ["policy.ncl", "rollout-policy.ncl"] {
        std::fs::copy(
            repo().join("lab/solution").join(file),
            dir.path().join(file),
        )
        .unwrap();
    }
    let solution = dir.path().join("policy.ncl");
    let check = |files: &[&std::path::Path]| {
        rollgate()
            .args(["policy", "check"])
            .args(files)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    // Nickel's own reading: the entry exports with its merged field.
    let exported = export(&solution, &[]);
    assert_eq!(exported.status.code(), Some(0), "{}", stderr(&exported));
    assert!(stdout(&exported).contains("\"max_polls\": 15"));
    let out = check(&[&solution]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );

    // Imported but never applied: the closed contract still refuses the extra field and the
    // number out of range, alone and in a batch beside the lesson's file.
    let unapplied = write(
        dir.path(),
        "unapplied.ncl",
        "let { RolloutPolicy, .. } = import \"rollout-policy.ncl\" in\n{ edge_svc = { progress_deadline_ms = 1500, poll_ms = 100, max_unavailable_pct = 90,\n  max_surge_pct = 100, on_stall = 'rollback } }\n",
    );
    let out = check(&[&unapplied]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("max_unavailable_pct must be an integer from 0 to 25"),
        "{}",
        stdout(&out)
    );
    let out = check(&[&solution, &unapplied]);
    assert!(
        stdout(&out).contains("2 files checked: 1 ok, 1 failed"),
        "{}",
        stdout(&out)
    );
    // A deploy's preflight reads it as the check does.
    let site = Site::new();
    site.release("v1", "");
    let policy = ["--policy", solution.to_str().unwrap(), "--dry-run"];
    let out = site.deploy(free_port(), "v1", &policy);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}
