//! `rollgate config` and `rollgate secret` (issue 37.2, 37.3): a config change is a release,
//! gated like any; every start of a release gets exactly its env and secrets; a rollback brings
//! the old config back; a secret's value never lands in the root's files or rollgate's words.

use crate::common::http::*;
use crate::common::*;

use std::io::Write;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// The sample service, made not ready by `READY_AFTER_MS` in its env, and printing its TOKEN_
/// variables and exiting when told (`PRINT_ENV`), as a release that dumps its environment as it
/// fails would.
fn install_configurable(site: &Site, version: &str) {
    let bin = crate::common::bin();
    site.add_release(
        version,
        &format!(
            "[ -n \"$PRINT_ENV\" ] && {{ env | grep TOKEN_; exit 1; }}\nexec '{}' sample-service ${{READY_AFTER_MS:+--ready-after-ms $READY_AFTER_MS}}\n",
            bin.display()
        ),
    );
}

fn environ(pid: i32) -> Vec<String> {
    let bytes = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    bytes
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).to_string())
        .collect()
}

fn config(site: &Site, args: &[&str]) -> Output {
    rollgate()
        .arg("config")
        .args(args)
        .arg("--root")
        .arg(site.root())
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap()
}

#[test]
fn a_config_change_is_a_gated_release_and_a_rollback_brings_the_old_env_back_exactly() {
    let site = Site::new();
    install_configurable(&site, "v1");
    let first = first_of(40);
    let ports = format!("{first}-{}", first + 1);
    let out = rollgate()
        .args(["deploy", "edge-svc", "v1", "--ports", &ports, "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let before = environ(site.live_pid().unwrap());

    let out = config(
        &site,
        &[
            "set",
            "edge-svc",
            "LOG_LEVEL=debug",
            "GREETING=hello world",
            "--ports",
            &ports,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "v1+c1\n");
    assert_eq!(site.pointer().unwrap()["version"], "v1+c1");
    let env = environ(site.live_pid().unwrap());
    assert!(env.contains(&"LOG_LEVEL=debug".to_string()), "{env:?}");
    assert!(env.contains(&"GREETING=hello world".to_string()), "{env:?}");
    // The executable is shared by a hard link, not copied.
    use std::os::unix::fs::MetadataExt;
    let inode = |v: &str| {
        std::fs::metadata(site.root().join("releases").join(v).join("edge-svc"))
            .unwrap()
            .ino()
    };
    assert_eq!(inode("v1"), inode("v1+c1"));
    let shown = stdout(&config(&site, &["show", "edge-svc"]));
    assert!(
        shown.contains("LOG_LEVEL=debug\n") && shown.contains("GREETING=\"hello world\"\n"),
        "{shown}"
    );
    // A dry run says the config by names, never a value.
    let out = rollgate()
        .args(["deploy", "edge-svc", "1", "v1+c1", "--dry-run", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let dry = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        dry.contains("variables GREETING, LOG_LEVEL; secrets none"),
        "{dry}"
    );
    assert!(!dry.contains("hello world"), "{dry}");
    let diff = stdout(&config(&site, &["diff", "edge-svc", "v1", "v1+c1"]));
    assert_eq!(diff, "+ GREETING=\"hello world\"\n+ LOG_LEVEL=debug\n");
    // The log's records of v1+c1 carry its config's digest; `log history` shows it.
    let digest = shown
        .lines()
        .next()
        .unwrap()
        .split("config ")
        .nth(1)
        .unwrap()
        .trim_end_matches(')')
        .to_string();
    let started = site
        .log_lines()
        .into_iter()
        .find(|l| l["event"] == "candidate_started" && l["version"] == "v1+c1")
        .unwrap();
    assert_eq!(started["config"], digest.as_str());
    let out = rollgate()
        .args(["log", "history", "--format", "json"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    let rows: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let row = |v: &str| rows.iter().find(|r| r["version"] == v).unwrap().clone();
    assert_eq!(row("v1+c1")["config"], digest.as_str(), "{rows:?}");
    assert_eq!(row("v1")["config"], serde_json::Value::Null);
    // `release list` names each release's config by the same digest.
    let out = rollgate()
        .args(["release", "list", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let listed: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let listed = |v: &str| listed.iter().find(|r| r["version"] == v).unwrap()["config"].clone();
    assert_eq!(listed("v1+c1"), digest.as_str());
    assert_eq!(listed("v1"), serde_json::Value::Null);

    // A config that breaks readiness: rolled back on its own, the previous config serving.
    let out = config(
        &site,
        &["set", "edge-svc", "READY_AFTER_MS=60000", "--ports", &ports],
    );
    assert_eq!(out.status.code(), Some(1), "rolled back: {}", stderr(&out));
    assert_eq!(stdout(&out), "v1+c2\n");
    assert_eq!(site.pointer().unwrap()["version"], "v1+c1");
    assert!(environ(site.live_pid().unwrap()).contains(&"LOG_LEVEL=debug".to_string()));

    // `rollback` goes to the release before: v1, with exactly v1's environment.
    let out = rollgate()
        .args(["rollback", "edge-svc", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    let after = environ(site.live_pid().unwrap());
    let without = |env: &[String]| -> Vec<String> {
        env.iter()
            .filter(|v| !v.starts_with("PORT=") && !v.starts_with("ROLLGATE_DEPLOY_TOKEN="))
            .cloned()
            .collect()
    };
    assert_eq!(
        without(&after),
        without(&before),
        "v1's environment exactly"
    );
}

#[test]
fn an_env_file_that_cannot_be_parsed_refuses_the_deploy_naming_file_and_line() {
    let site = Site::new();
    install_configurable(&site, "v1");
    std::fs::write(site.root().join("releases/v1/env"), "A=1\nnot a line\n").unwrap();
    let out = site.deploy(free_port(), "v1", &[]);
    assert_ne!(out.status.code(), Some(0));
    let said = stderr(&out);
    assert!(said.contains("releases/v1/env:2: not KEY=VALUE"), "{said}");
    assert!(site.pointer().is_none());
}

#[test]
fn config_set_on_four_replicas_behind_the_proxy_reaches_every_replica_with_no_failed_request() {
    let site = Site::new();
    install_configurable(&site, "v1");
    site.replicas_of("v1", 4, 41);
    let proxy = Proxy::start(&site, &[]);
    let load = Load::start(proxy.port, 4, Duration::from_millis(2));
    let out = config(&site, &["set", "edge-svc", "FEATURE=on"]);
    let seen = load.finish();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_none_failed(&seen, "config set on 4 replicas");
    assert!(seen.len() > 100, "only {} requests", seen.len());
    let set: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("replicas.json")).unwrap())
            .unwrap();
    let replicas = set["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 4);
    for replica in replicas {
        assert_eq!(replica["version"], "v1+c1");
        let env = environ(replica["pid"].as_i64().unwrap() as i32);
        assert!(env.contains(&"FEATURE=on".to_string()), "{env:?}");
    }
}

/// Every file under `dir` (but `skip`), read as bytes.
fn files_under(dir: &Path, skip: &Path) -> Vec<(String, Vec<u8>)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path == skip {
            continue;
        }
        if path.is_dir() {
            found.extend(files_under(&path, skip));
        } else if let Ok(bytes) = std::fs::read(&path) {
            found.push((path.display().to_string(), bytes));
        }
    }
    found
}

#[test]
fn a_secret_of_64_kib_is_kept_and_one_byte_more_is_refused_keeping_nothing() {
    let site = Site::new();
    let most = "x".repeat(64 << 10);
    let out = set_secret(&site, "big", &most);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = set_secret(&site, "bigger", &format!("{most}y"));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the value is longer than 65536 bytes"),
        "{}",
        stderr(&out)
    );
    let secrets = site.root().join("secrets");
    let kept: Vec<String> = std::fs::read_dir(&secrets)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(kept, vec!["big".to_string()]);
    assert_eq!(std::fs::read(secrets.join("big")).unwrap().len(), 64 << 10);
}

#[test]
fn secrets_reach_only_the_process_and_never_the_roots_files_or_rollgates_words() {
    let site = Site::new();
    install_configurable(&site, "v1");
    let first = first_of(42);
    let ports = format!("{first}-{}", first + 1);
    let said = std::cell::RefCell::new(String::new());
    let run = |args: &[&str]| {
        let out = rollgate()
            .args(args)
            .arg("--root")
            .arg(site.root())
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap();
        said.borrow_mut().push_str(&stdout(&out));
        said.borrow_mut().push_str(&stderr(&out));
        out
    };
    assert_eq!(
        run(&["deploy", "edge-svc", "v1", "--ports", &ports])
            .status
            .code(),
        Some(0)
    );
    // Random high-entropy values, one per secret.
    let values: Vec<String> = (0..20)
        .map(|i| format!("s{i}-{:016x}{:016x}", rand_u64(), rand_u64()))
        .collect();
    for (i, value) in values.iter().enumerate() {
        let out = set_secret(&site, &format!("token-{i}"), value);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        said.borrow_mut().push_str(&stdout(&out));
    }
    let listed = stdout(&run(&["secret", "list"]));
    assert!(
        listed.contains("token-0") && listed.contains("token-19"),
        "{listed}"
    );
    let mut secret_args = vec!["config", "set", "edge-svc", "--ports", &ports];
    let pairs: Vec<String> = (0..20).map(|i| format!("TOKEN_{i}=token-{i}")).collect();
    for pair in &pairs {
        secret_args.push("--secret");
        secret_args.push(pair);
    }
    let out = run(&secret_args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let env = environ(site.live_pid().unwrap());
    for (i, value) in values.iter().enumerate() {
        assert!(
            env.contains(&format!("TOKEN_{i}={value}")),
            "TOKEN_{i} reaches the process"
        );
    }
    // A failing release that prints its environment: the rollback reason quotes its output.
    let out = run(&[
        "config",
        "set",
        "edge-svc",
        "PRINT_ENV=1",
        "--ports",
        &ports,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    run(&["status"]);
    run(&["status", "--format", "json"]);
    run(&["config", "show", "edge-svc"]);
    run(&["config", "diff", "edge-svc", "v1", "v1+c1"]);
    run(&["release", "list", "--format", "json"]);
    run(&["deploy", "edge-svc", "1", "v1+c1", "--dry-run"]);
    let out = rollgate()
        .args(["log", "history"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    said.borrow_mut().push_str(&stdout(&out));
    let mut said = said.into_inner();
    // The console's page, API and event stream, and webhook bodies, over the same root.
    said.push_str(&what_the_console_and_webhooks_say(&site));
    let history = std::fs::read_to_string(site.root().join("deploy.log")).unwrap();
    assert!(
        history.contains("[secret]"),
        "the printed env is quoted, redacted: {history}"
    );
    assert!(
        history.contains("\"secrets\":[\"TOKEN_0=token-0\""),
        "the secrets' names are logged: {history}"
    );

    let secrets = site.root().join("secrets");
    let files = files_under(site.root(), &secrets);
    // The output files of the release that printed them are the release's own (like a
    // process's stdout): every file rollgate writes is checked, outputs aside.
    let checked: Vec<&(String, Vec<u8>)> = files
        .iter()
        .filter(|(p, _)| !p.contains(".output"))
        .collect();
    assert!(checked.iter().any(|(p, _)| p.ends_with("deploy.log")));
    for value in &values {
        for (path, bytes) in &checked {
            assert!(
                !String::from_utf8_lossy(bytes).contains(value.as_str()),
                "a secret value is in {path}"
            );
        }
        assert!(
            !said.contains(value.as_str()),
            "a secret value in rollgate's words"
        );
    }

    // Refusals: a secrets folder others can read, a missing secret.
    std::fs::set_permissions(
        &secrets,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = config(
        &site,
        &["set", "edge-svc", "--secret", "X=token-0", "--no-deploy"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("readable beyond its owner"),
        "{}",
        stderr(&out)
    );
    std::fs::set_permissions(
        &secrets,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let before = site.release_folders();
    let out = config(
        &site,
        &["set", "edge-svc", "--secret", "X=never-set", "--no-deploy"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("never-set is not set"),
        "{}",
        stderr(&out)
    );
    let after = site.release_folders();
    assert_eq!(before.len(), after.len(), "nothing made");
    // A value is never taken from the command line.
    let out = rollgate()
        .args(["secret", "set", "x", "value", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// 64 random bits from the kernel.
fn rand_u64() -> u64 {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    u64::from_le_bytes(bytes)
}

/// One HTTP/1.1 GET on 127.0.0.1 (the whole answer; an event stream is read for a second).
fn http_get(console: &Console, path: &str) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", console.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {}\r\nConnection: close\r\n\r\n",
        console.bearer()
    )
    .unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).to_string()
}

/// Everything the console shows of the root and every webhook body a sender posts.
fn what_the_console_and_webhooks_say(site: &Site) -> String {
    use std::io::{BufRead, Read};
    let console = Console::start(&[site.root()], &[]);
    let mut seen = String::new();
    for path in [
        "/",
        "/api/v1/roots",
        "/api/v1/roots/edge-svc",
        "/api/v1/roots/edge-svc/history",
        "/api/v1/events?from=start",
    ] {
        let answer = http_get(&console, path);
        assert!(answer.starts_with("HTTP/1.1 200"), "{path}: {answer}");
        seen.push_str(&answer);
    }
    assert!(
        seen.contains("rolled_back"),
        "the console shows the failed config"
    );
    drop(console);
    // A receiver that keeps every body, then one sender pass from the log's beginning.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let bodies = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let kept = bodies.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = std::io::BufReader::new(stream);
            let mut length = 0;
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 && line.trim() != "" {
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            kept.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&body));
            let _ = reader
                .get_mut()
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
    std::fs::write(
        site.root().join("webhooks.json"),
        format!("{{\"endpoints\": [{{\"name\": \"hook\", \"url\": \"http://127.0.0.1:{port}/hook\", \"secret\": \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYo=\"}}]}}"),
    )
    .unwrap();
    // First seen now, the endpoint starts at the log's end: the state says it starts earlier.
    let run = || {
        rollgate()
            .args(["webhooks", "send", "--root"])
            .arg(site.root())
            .output()
            .unwrap()
    };
    run();
    std::fs::write(site.root().join("webhooks/state.json"), "{\"hook\": {\"cursor\": null, \"next_attempt_at\": 0, \"attempts\": 0, \"disabled\": false}}").unwrap();
    let out = run();
    seen.push_str(&stdout(&out));
    assert!(
        !stdout(&out).starts_with("0 delivered"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let delivered = bodies.lock().unwrap().clone();
    assert!(delivered.contains("rolled_back"), "{delivered}");
    seen.push_str(&delivered);
    seen
}

/// A release that cannot boot without its database password, as a real application.
fn install_needing_a_password(site: &Site, version: &str, own: &[(&str, &str)]) {
    let bin = crate::common::bin();
    let build = tempfile::tempdir().unwrap();
    let exe = write(
        build.path(),
        "edge-svc",
        &format!(
            "#!/bin/sh\n[ -n \"$DB_PASSWORD\" ] || {{ echo 'KeyError: DB_PASSWORD' >&2; exit 3; }}\nexec '{}' sample-service\n",
            bin.display()
        ),
    );
    make_executable(&exe);
    for (name, text) in own {
        write(build.path(), name, text);
    }
    let out = rollgate()
        .args(["release", "add", "edge-svc", version])
        .arg(build.path())
        .arg("--root")
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// Issue 58: `config set` made and deployed v1+c1, then `deploy v2` started v2 with no config
/// ("no config of its own"), and an application that needs its password failed its gate.
/// Config belongs to the service (Heroku's model): a new code release gets the live config
/// unless it carries its own; before the first deploy it can be staged.
#[test]
fn a_new_code_release_gets_the_live_config_unless_it_carries_its_own() {
    let site = Site::new();
    let first = first_of(47);
    let ports = format!("{first}-{}", first + 1);
    let secret = "s3cret-pw-0a9";
    assert!(set_secret(&site, "db", secret).status.success());
    // Nothing live: config set needs --no-deploy, and then stages it.
    let set = [
        "set",
        "edge-svc",
        "GREETING=hi",
        "--secret",
        "DB_PASSWORD=db",
    ];
    let out = config(&site, &set);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--no-deploy"), "{}", stderr(&out));
    let out = config(&site, &[&set[..], &["--no-deploy"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("staged"), "{}", stderr(&out));
    let shown = config(&site, &["show", "edge-svc"]);
    assert!(
        stdout(&shown).contains("GREETING=hi\nDB_PASSWORD=<secret db>"),
        "{}",
        stdout(&shown)
    );
    // Issue 81, 5: every line ends, the last one too.
    assert!(
        stdout(&shown).ends_with("<secret db>\n"),
        "{:?}",
        stdout(&shown)
    );

    let deploy = |version: &str, extra: &[&str]| {
        rollgate()
            .args(["deploy", "edge-svc", version, "--ports", &ports, "--root"])
            .arg(site.root())
            .args(extra)
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap()
    };
    install_needing_a_password(&site, "v1", &[]);
    let out = deploy("v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("v1 gets the service's staged config"),
        "{}",
        stderr(&out)
    );
    let env = environ(site.live_pid().unwrap());
    assert!(
        env.contains(&format!("DB_PASSWORD={secret}")) && env.contains(&"GREETING=hi".to_string())
    );

    // A config change, then a new code release: it gets the live config, said before it runs.
    let out = config(
        &site,
        &["set", "edge-svc", "GREETING=hello", "--ports", &ports],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "v1+c1\n");
    install_needing_a_password(&site, "v2", &[]);
    let dry = deploy("v2", &["--dry-run"]);
    assert!(
        stdout(&dry).contains("v2 gets the live release v1+c1's config")
            && stdout(&dry).contains("the same as live v1+c1's"),
        "{}",
        stdout(&dry)
    );
    let out = deploy("v2", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let env = environ(site.live_pid().unwrap());
    assert!(
        env.contains(&format!("DB_PASSWORD={secret}"))
            && env.contains(&"GREETING=hello".to_string()),
        "{env:?}"
    );
    // The log names the same config for both; the release's own digest did not change.
    let lines = site.log_lines();
    let config_of = |version: &str| {
        lines
            .iter()
            .rfind(|l| l["event"] == "promoted" && l["version"] == version)
            .map(|l| l["config"].clone())
            .unwrap()
    };
    assert_eq!(config_of("v2"), config_of("v1+c1"));
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(site.root().join("releases/v2/release.json")).unwrap(),
    )
    .unwrap();
    let listed = rollgate()
        .args(["release", "list", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let v2 = stdout(&listed)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["version"] == "v2")
        .unwrap();
    assert_eq!(v2["digest"], record["tree_sha256"]);

    // A release may not ship a secrets map: the root's secrets are the operator's to give
    // (issue 78: a shipped map once named the registry login for itself).
    let build = tempfile::tempdir().unwrap();
    let exe = write(build.path(), "edge-svc", "#!/bin/sh\nexit 0\n");
    make_executable(&exe);
    write(build.path(), "secrets", "DB_PASSWORD=db\n");
    let out = rollgate()
        .args(["release", "add", "edge-svc", "v3"])
        .arg(build.path())
        .arg("--root")
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("ships `secrets`"), "{}", stderr(&out));
    // A release that carries its own config (its env file) keeps it, and the deploy says how
    // it differs.
    install_needing_a_password(
        &site,
        "v3",
        &[("env", "GREETING=own\nDB_PASSWORD=its-own\n")],
    );
    let out = deploy("v3", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("v3 gets its own config")
            && stderr(&out).contains("against live v2's: ~ DB_PASSWORD, ~ GREETING"),
        "{}",
        stderr(&out)
    );
    assert!(environ(site.live_pid().unwrap()).contains(&"GREETING=own".to_string()));
    // A rollback brings v2 back as it was, with the config it was given.
    let out = rollgate()
        .args(["rollback", "edge-svc", "--ports", &ports, "--root"])
        .arg(site.root())
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stderr(&out).contains("v2 gets"), "{}", stderr(&out));
    assert!(environ(site.live_pid().unwrap()).contains(&"GREETING=hello".to_string()));
}

/// Issue 67, 1: `config set` and `up` given no `--policy` run under the policy kept in the
/// root — the probe's Host (a release that answers readiness only for its own host), the
/// hooks and the limits — not the defaults, which would have probed `Host: 127.0.0.1` for the
/// whole deadline.
#[test]
fn config_set_and_up_without_policy_keep_the_probe_host_the_hooks_and_the_limits() {
    let site = Site::new();
    site.release("v1", "--ready-host app.test");
    hook_recorder(&site);
    let policy = write(
        site.root(),
        "policy.json",
        r#"{"edge_svc": {"progress_deadline_ms": 4000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0,
            "probe": {"host": "app.test"}, "hooks": {"pre_deploy": ["./post.sh"]},
            "isolation": {"memory_mb": 300}}}"#,
    );
    let first = port_block(2);
    let ports = format!("{first}-{}", first + 1);
    let out = site.deploy(first, "v1", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let out = config(
        &site,
        &["set", "edge-svc", "GREETING=hello", "--ports", &ports],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no --policy: the service's policy, kept in the root"),
        "{}",
        stderr(&out)
    );
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["version"], "v1+c1", "{pointer}");
    assert_eq!(pointer["probe"]["target"]["host"], "app.test", "{pointer}");
    assert_eq!(pointer["limits"]["memory_mb"], 300, "{pointer}");
    let hooks = std::fs::read_to_string(hooks_out(&site)).unwrap();
    assert_eq!(
        hooks.lines().collect::<Vec<_>>(),
        ["pre_deploy v1", "pre_deploy v1+c1"]
    );

    // Killed, started again by `up` from what `current` records: the same probe and limits.
    let live = site.live_pid().unwrap();
    send_signal(live, 9);
    assert!(wait_for(10, || !alive(live)));
    let out = rollgate()
        .args(["up", "--root"])
        .arg(site.root())
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let pointer = site.pointer().unwrap();
    assert_ne!(pointer["pid"], live);
    assert_eq!(pointer["probe"]["target"]["host"], "app.test", "{pointer}");
    assert_eq!(pointer["limits"]["memory_mb"], 300, "{pointer}");
}

/// Issue 68, 5: `rollgate run` — a one-off command in the live release, as its processes run:
/// in its folder, with its config and secrets, as the service's user; its exit status is
/// rollgate's, what it left running ends with it, Ctrl-C reaches it, and a `run` line says it.
#[test]
fn run_executes_a_one_off_command_in_the_live_release_as_its_user_with_its_config() {
    let site = Site::new();
    site.add_sample("v1", "");
    let first = port_block(2);
    let ports = format!("{first}-{}", first + 1);
    assert_eq!(site.deploy(first, "v1", &[]).status.code(), Some(0));
    assert_eq!(set_secret(&site, "db", "hunter2").status.code(), Some(0));
    let out = config(
        &site,
        &[
            "set",
            "edge-svc",
            "GREETING=hello",
            "--secret",
            "DB_PASSWORD=db",
            "--ports",
            &ports,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let live = site.pointer().unwrap()["version"]
        .as_str()
        .unwrap()
        .to_string();
    let run = |args: &[&str]| {
        rollgate()
            .args(["run", "edge-svc", "--root"])
            .arg(site.root())
            .args(args)
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap()
    };
    let out = run(&[
        "--",
        "sh",
        "-c",
        "echo \"$GREETING $DB_PASSWORD $(id -u) $PWD $STATE_DIRECTORY\"; sleep 300 & echo $! > \"$STATE_DIRECTORY/child\"; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    // Issue 81, 2: a command that does not exist is said to be not found, not "Permission
    // denied" (what PATH's search left after a folder the confinement forbids). Run with a
    // PATH holding such a folder, as an operator's shell has.
    let missing = rollgate()
        .args(["run", "edge-svc", "--root"])
        .arg(site.root())
        .args(["--", "no-such-command-81"])
        .env(
            "PATH",
            format!("/root/.cargo/bin:{}", std::env::var("PATH").unwrap()),
        )
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_ne!(missing.status.code(), Some(0));
    assert!(
        stderr(&missing).contains("no-such-command-81: command not found in PATH"),
        "{}",
        stderr(&missing)
    );
    let said = stdout(&out);
    let uid = service_uid(&site);
    let expected = if crate::hooks::nix_is_root() {
        uid.to_string()
    } else {
        nix::unistd::getuid().to_string()
    };
    assert_eq!(
        said.trim(),
        format!(
            "hello hunter2 {expected} {} {}",
            site.root().join("releases").join(&live).display(),
            site.root().join("data").display()
        )
    );
    let child: i32 = std::fs::read_to_string(site.root().join("data/child"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        wait_for(5, || !alive(child)),
        "its background child ended with it"
    );
    let line = site.log_lines().pop().unwrap();
    assert_eq!(line["event"], "run", "{line}");
    let detail = line["detail"].as_str().unwrap();
    assert!(detail.contains("exit status 7"), "{detail}");
    assert!(!detail.contains("hunter2"), "{detail}");

    // Ctrl-C reaches the command; rollgate answers with its end.
    let mut child = std::process::Command::new(crate::common::bin())
        .args(["run", "edge-svc", "--root"])
        .arg(site.root())
        .args(["--", "sh", "-c", "sleep 300; echo rgrun-ctrl-c"])
        .spawn()
        .unwrap();
    // rollgate's own command line names it too: the command is running once two do.
    assert!(wait_for(10, || processes_mentioning("rgrun-ctrl-c") >= 2));
    send_signal(child.id() as i32, 2);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(wait_for(5, || !a_process_mentions("rgrun-ctrl-c")));

    // Refused: a release that is not installed, and nothing live.
    let out = run(&["--release", "v9", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("v9"), "{}", stderr(&out));
    let empty = Site::new();
    let out = rollgate()
        .args(["run", "edge-svc", "--root"])
        .arg(empty.root())
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("nothing of edge-svc is live"),
        "{}",
        stderr(&out)
    );
}
