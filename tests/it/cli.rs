//! What rollgate generates from its own argument definition: shell completions that the shell
//! loads, and a man page that `man` renders.

use crate::common::*;

use std::io::Write;

#[test]
fn the_bash_completion_script_parses_and_completes_the_subcommands() {
    let out = rollgate().args(["completions", "bash"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let script = stdout(&out);
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "rollgate.bash", &script);
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    // Loaded into a shell, it completes `rollgate ro` to rollout (and rollback).
    let probe = format!(
        "source '{}'; COMP_WORDS=(rollgate ro); COMP_CWORD=1; _rollgate rollgate ro rollgate; echo \"${{COMPREPLY[@]}}\"",
        path.display()
    );
    let run = std::process::Command::new("bash")
        .args(["-c", &probe])
        .output()
        .unwrap();
    let words = String::from_utf8_lossy(&run.stdout);
    assert!(
        words.contains("rollout") && words.contains("rollback"),
        "{words}"
    );
    for shell in ["zsh", "fish"] {
        let out = rollgate().args(["completions", shell]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}");
        assert!(stdout(&out).contains("rollout"), "{shell}");
    }
    let out = rollgate().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );
}

#[test]
fn the_man_page_renders_with_man() {
    let out = rollgate().arg("man").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let roff = stdout(&out);
    assert!(roff.starts_with(".ie"), "{}", &roff[..roff.len().min(200)]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rollgate.1");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(roff.as_bytes())
        .unwrap();
    let man = std::process::Command::new("man")
        .arg("-l")
        .arg(&path)
        .env("MANPAGER", "cat")
        .env("MANWIDTH", "100")
        .output()
        .unwrap();
    assert!(
        man.status.success(),
        "{}",
        String::from_utf8_lossy(&man.stderr)
    );
    let page = String::from_utf8_lossy(&man.stdout);
    for section in ["NAME", "SYNOPSIS", "rollout", "deploy"] {
        assert!(page.contains(section), "{section} missing from:\n{page}");
    }
}

/// The defaults the help texts state are the ones the code runs by (`src/defaults.rs`).
#[test]
fn the_help_states_the_defaults_the_code_has() {
    use rollgate::defaults;
    let help = |command: &str| {
        let out = rollgate().args([command, "--help"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let waves = defaults::WAVES.map(|w| w.to_string()).join(",");
    for (command, stated) in [
        (
            "deploy",
            format!("stop_grace_ms, else {})", defaults::GRACE.as_millis()),
        ),
        (
            "deploy",
            format!("drain_timeout_ms, else {})", defaults::DRAIN.as_millis()),
        ),
        (
            "deploy",
            format!("watch_ms, else {};", defaults::WATCH.as_millis()),
        ),
        (
            "rollout",
            format!("stop_grace_ms, else {})", defaults::GRACE.as_millis()),
        ),
        (
            "rollout",
            format!("drain_timeout_ms, else {})", defaults::DRAIN.as_millis()),
        ),
        (
            "rollout",
            format!("watch_ms, else {};", defaults::WATCH.as_millis()),
        ),
        ("rollout", format!("else {waves})")),
        (
            "up",
            format!("[default: {}]", defaults::UP_READY.as_millis()),
        ),
        ("proxy", format!("[default: {}]", defaults::PROXY_LISTEN)),
    ] {
        let text = help(command);
        assert!(
            text.contains(&stated),
            "`rollgate {command} --help` does not say {stated:?}:\n{text}"
        );
    }
}

/// Issue 49's papercuts: the help told of "four" demo releases (the demo deploys five, then
/// rolls out three) and taught the positional port where the README teaches `--ports`.
#[test]
fn the_help_tells_the_demo_as_it_runs_and_deploys_with_ports() {
    let help = |args: &[&str]| {
        let out = rollgate().args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let top = help(&["--help"]);
    let demo = help(&["demo", "--help"]);
    for text in [&top, &demo] {
        assert!(!text.contains("four"), "{text}");
        assert!(text.contains("five sample releases"), "{text}");
    }
    assert!(demo.contains("The live release is v5."), "{demo}");
    assert!(
        top.contains("rollgate deploy edge-svc v2 --root /srv/edge --ports 8081-8082"),
        "{top}"
    );
    let deploy = help(&["deploy", "--help"]);
    let first_example = deploy
        .split("Examples: ")
        .nth(1)
        .and_then(|rest| rest.split(" rollgate ").next())
        .unwrap_or("");
    assert!(first_example.contains("--ports"), "{deploy}");
}
