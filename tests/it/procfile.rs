//! Issue 69, its first steps: a release's Procfile. `release add` checks it line by line (a
//! wrong line, a type twice, a type this rollgate does not run yet: refused, naming the line,
//! nothing installed); its `web:` line is what the release runs (no executable at its top
//! needed); its `release:` line is the release phase — run once per deploy of a new version, in
//! the new release, confined as the release is, before anything of it starts; its failure
//! refuses the deploy with nothing changed, as a failing `pre_deploy` hook does.

use crate::common::*;

/// A release folder outside the root: the sample service as `edge-svc`, and this Procfile.
fn built(procfile: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let build = tempfile::tempdir().unwrap();
    let exe = write(
        build.path(),
        "edge-svc",
        &format!(
            "#!/bin/sh\nexec '{}' sample-service\n",
            crate::common::bin().display()
        ),
    );
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    write(build.path(), "Procfile", procfile);
    build
}

/// `rollgate release add edge-svc VERSION` of the folder `build`.
fn add(site: &Site, version: &str, build: &tempfile::TempDir) -> std::process::Output {
    site.run(&[
        "release",
        "add",
        "edge-svc",
        version,
        build.path().to_str().unwrap(),
    ])
}

#[test]
fn release_add_refuses_a_procfile_it_cannot_run_naming_the_line() {
    let site = Site::new();
    for (procfile, said) in [
        (
            "release: true\nworker python work.py\n",
            "Procfile:2: expected `TYPE: command`",
        ),
        (
            "release: a\n\nrelease: b\n",
            "Procfile:3: type `release` again (first on line 1)",
        ),
        (
            "web: gunicorn app\n",
            "both an executable `edge-svc` at its top and a `web:` line",
        ),
    ] {
        let build = built(procfile);
        let out = add(&site, "v1", &build);
        assert_eq!(out.status.code(), Some(2), "{procfile}: {}", stderr(&out));
        assert!(stderr(&out).contains(said), "{procfile}: {}", stderr(&out));
        assert!(!site.root().join("releases/v1").exists());
    }
    let build = built("# migrations first\nrelease: sh migrate.sh\n");
    let out = add(&site, "v1", &build);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// The release phase runs once per new version, in its release, as the service's user, with the
/// release's config, before its process starts; not again for a restart of the live version. A
/// failing one refuses the deploy (exit 2) with the release before it live and untouched.
#[test]
fn the_release_phase_runs_once_per_new_version_before_it_starts_and_its_failure_changes_nothing() {
    let site = Site::new();
    // What it did, where a release may write: its state folder.
    let migrate = "release: echo \"$ROLLGATE_VERSION $GREETING $(id -u)\" >> \"$STATE_DIRECTORY/migrations\"\n";
    for version in ["v1", "v2"] {
        let build = built(migrate);
        write(build.path(), "env", "GREETING=hello\n");
        let out = add(&site, version, &build);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let migrations =
        || std::fs::read_to_string(site.root().join("data/migrations")).unwrap_or_default();
    let out = site.deploy(free_port(), "v1", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let uid = service_uid(&site);
    assert_eq!(migrations(), format!("v1 hello {uid}\n"));
    let ran = site
        .log_lines()
        .into_iter()
        .find(|l| l["event"] == "hook_ran")
        .unwrap();
    assert!(
        ran["detail"]
            .as_str()
            .unwrap()
            .starts_with("the release phase (`echo "),
        "{ran}"
    );
    // Before the candidate: its line comes first.
    let events = site.events();
    let phase = events.iter().position(|e| e.0 == "hook_ran").unwrap();
    let started = events
        .iter()
        .position(|e| e.0 == "candidate_started")
        .unwrap();
    assert!(phase < started, "{events:?}");

    // A restart of the live version: no release phase.
    let out = site.run(&["restart", "edge-svc", "--port", &free_port().to_string()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(migrations().lines().count(), 1);

    let out = site.deploy(free_port(), "v2", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        migrations().lines().last().unwrap(),
        format!("v2 hello {uid}")
    );

    // v3's release phase fails: refused, v2 live as it was, nothing of v3 started.
    let build = built("release: echo 'no such table: jobs' >&2; exit 3\n");
    let out = add(&site, "v3", &build);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let live = site.pointer().unwrap();
    let out = site.deploy(free_port(), "v3", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("the release phase (`echo 'no such table: jobs' >&2; exit 3`) failed with exit status: 3")
            && said.contains("no such table: jobs")
            && said.contains("nothing was started"),
        "{said}"
    );
    assert_eq!(site.pointer().unwrap(), live);
    assert_eq!(
        version_on(live["port"].as_u64().unwrap() as u16).as_deref(),
        Some("v2")
    );
    assert!(!site
        .events()
        .iter()
        .any(|e| e.0 == "candidate_started" && e.1 == "v3"));
    // On the record as a refused attempt.
    let out = rollgate()
        .args(["log", "history", "--format", "json"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let refused = stdout(&out)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|a| {
            a["version"] == "v3"
                && a["outcome"] == "refused"
                && a["reason"].as_str().is_some_and(|r| {
                    r.starts_with("the release phase (`echo 'no such table: jobs' >&2; exit 3`) failed with exit status: 3")
                })
        });
    assert!(refused, "{}", stdout(&out));
}

/// A release whose Procfile's `web:` line is what it runs — no executable at its top — is
/// installed, gated, served and kept running as any other; its command is on the launch record,
/// so its keeper starts it again the same way.
#[test]
fn a_procfile_web_line_is_what_the_release_runs() {
    let site = Site::new();
    let build = tempfile::tempdir().unwrap();
    write(
        build.path(),
        "Procfile",
        &format!(
            "web: exec '{}' sample-service --ready-after-ms 20\nrelease: true\n",
            crate::common::bin().display()
        ),
    );
    let out = add(&site, "v1", &build);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!site.root().join("releases/v1/edge-svc").exists());
    let port = free_port();
    // A dry run says what it would run, and the release phase.
    let out = site.run(&["deploy", "edge-svc", &port.to_string(), "v1", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        said.contains("the release runs its Procfile's web: `exec '")
            && said.contains("`true` (line 2), before anything starts"),
        "{said}"
    );
    let out = site.deploy(port, "v1", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(version_on(port).as_deref(), Some("v1"));
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["command"][0], "/bin/sh", "{pointer}");
    let status = stdout(&site.run(&["status"]));
    assert!(status.contains("its Procfile's web: `exec '"), "{status}");
    // Killed: started again by its keeper, from the same line.
    let live = site.live_pid().unwrap();
    send_signal(live, 9);
    assert!(
        wait_for(10, || site.live_pid().is_some_and(|pid| pid != live)
            && version_on(port).as_deref() == Some("v1")),
        "{:?}",
        site.events()
    );
    // Neither an executable nor a web line: refused, naming both.
    let empty = tempfile::tempdir().unwrap();
    write(empty.path(), "Procfile", "release: true\n");
    let out = add(&site, "v2", &empty);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("no executable `edge-svc` at its top, nor a Procfile with a `web:` line"),
        "{}",
        stderr(&out)
    );
}

/// Issue 80: the release phase outlived a deployer killed while it ran (its tree carried no
/// root of its own), and the next deploy's release phase ran beside it — two migrations at
/// once. The next command under the root's lock ends it first.
#[test]
fn a_release_phase_left_by_a_killed_deploy_is_ended_before_the_next_deploy() {
    let site = Site::new();
    let marker = format!("1000.{}", std::process::id());
    let build = built(&format!(
        "release: echo migrating > \"$STATE_DIRECTORY/phase\"; exec sleep {marker}\n"
    ));
    let out = add(&site, "v1", &build);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut deploy = std::process::Command::new(bin())
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v1",
            "--root",
        ])
        .arg(site.root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(20, || site.root().join("data/phase").exists()
        && a_process_mentions(&marker)));
    deploy.kill().unwrap();
    deploy.wait().unwrap();
    assert!(
        a_process_mentions(&marker),
        "the release phase runs on at first"
    );

    let build = built("release: true\n");
    let out = add(&site, "v2", &build);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = site.deploy(free_port(), "v2", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("hook release (pid "),
        "{}",
        stderr(&out)
    );
    assert!(
        !a_process_mentions(&marker),
        "v1's release phase still runs"
    );
}
