//! `rollgate deploy SERVICE VERSION --ports A-B` (issue 37.6): rollgate picks the candidate's
//! port, so one unchanged command deploys release after release.

use crate::common::*;

use std::time::Duration;

fn deploy(site: &Site, version: &str, ports: &str) -> std::process::Output {
    deploy_words(site, &[version], ports)
}

/// `rollgate deploy edge-svc WORDS... --ports PORTS --root ROOT`, with a minute's limit.
fn deploy_words(site: &Site, words: &[&str], ports: &str) -> std::process::Output {
    rollgate()
        .args(["deploy", "edge-svc"])
        .args(words)
        .args(["--ports", ports, "--root"])
        .arg(site.root())
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap()
}

#[test]
fn the_same_deploy_command_ten_times_alternates_ports_and_promotes_each() {
    let site = Site::new();
    let first = first_of(20);
    let ports = format!("{first}-{}", first + 1);
    let mut used = Vec::new();
    for n in 1..=10 {
        let version = format!("v{n}");
        // Each release installed with `release add`, none by hand.
        site.add_sample(&version, "");
        let out = deploy(&site, &version, &ports);
        assert_eq!(out.status.code(), Some(0), "{version}: {}", stderr(&out));
        let pointer = site.pointer().unwrap();
        assert_eq!(pointer["version"], version.as_str());
        let port = pointer["port"].as_u64().unwrap() as u16;
        assert!(port == first || port == first + 1, "{port}");
        assert_eq!(version_on(port).as_deref(), Some(version.as_str()));
        used.push(port);
    }
    assert_eq!(count_events(&site, "promoted", "v10"), 1);
    for pair in used.windows(2) {
        assert_ne!(pair[0], pair[1], "alternates: {used:?}");
    }
    assert_eq!(used[0], first, "the lowest free port first");
}

#[test]
fn without_a_port_or_a_range_of_two_the_deploy_is_refused_and_says_how() {
    let site = Site::new();
    site.release("v1", "");
    let out = rollgate()
        .args(["deploy", "edge-svc", "v1", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--ports"), "{}", stderr(&out));
    let port = free_port();
    let out = deploy(&site, "v1", &format!("{port}-{port}"));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("at least two"), "{}", stderr(&out));
    assert!(site.pointer().is_none(), "nothing deployed");
    // A range whose every port is busy: refused, naming the range (ports away from the other
    // test's, which runs beside this one in the same process).
    let first = first_of(21);
    let _a = std::net::TcpListener::bind(("127.0.0.1", first)).unwrap();
    let _b = std::net::TcpListener::bind(("127.0.0.1", first + 1)).unwrap();
    let out = deploy(&site, "v1", &format!("{first}-{}", first + 1));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is free"), "{}", stderr(&out));
    // The positional form keeps working.
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_port_held_by_a_dead_deployers_candidate_is_taken_back_by_the_next_deploy() {
    // Two ports: the live release's and the one a killed deployer's candidate still holds.
    // The same command must go on working: the recovery stops that candidate, then the new
    // one takes its port.
    let site = Site::new();
    let first = first_of(23);
    let ports = format!("{first}-{}", first + 1);
    site.add_sample("v1", "");
    site.add_sample("v2", "--ready-after-ms 60000");
    site.add_sample("v3", "");
    assert_eq!(deploy(&site, "v1", &ports).status.code(), Some(0));
    let before = site.log_lines().len();
    let mut deployer = std::process::Command::new(crate::common::bin())
        .args(["deploy", "edge-svc", "v2", "--ports", &ports, "--root"])
        .arg(site.root())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(10, || site.log_lines().len() > before));
    send_signal(deployer.id() as i32, 9);
    deployer.wait().unwrap();
    let orphan = site.log_lines()[before]["pid"].as_i64().unwrap() as i32;
    assert!(alive(orphan));
    assert_eq!(site.pointer().unwrap()["port"], first);

    let out = deploy(&site, "v3", &ports);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        wait_for(5, || !alive(orphan)),
        "the dead deployer's candidate"
    );
    let pointer = site.pointer().unwrap();
    assert_eq!(
        (pointer["version"].as_str(), pointer["port"].as_u64()),
        (Some("v3"), Some(u64::from(first) + 1))
    );
    let abandoned = site
        .log_lines()
        .into_iter()
        .find(|l| l["event"] == "rolled_back" && l["version"] == "v2")
        .expect("the killed attempt's outcome");
    let detail = abandoned["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("abandoned: deployer pid")
            && detail.contains("old release v1 still answering; candidate stopped (SIGTERM)"),
        "{detail}"
    );
}

/// Issue 37.6: a policy that names its `ports` needs no port anywhere: `deploy`, `rollback`
/// and `config set` each pick the one that is not live; a bad range is refused by the contract.
#[test]
fn the_policy_ports_serve_deploy_rollback_and_config_set() {
    let site = Site::new();
    let first = first_of(22);
    let policy = write(
        site.root(),
        "policy.yaml",
        &format!(
            "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 0\n  ports: \"{first}-{}\"\n",
            first + 1
        ),
    );
    let with_policy = |args: &[&str]| {
        rollgate()
            .args(args)
            .args(["--root", site.root().to_str().unwrap()])
            .args(["--policy", policy.to_str().unwrap()])
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap()
    };
    let live_port = || site.pointer().unwrap()["port"].as_u64().unwrap() as u16;
    for version in ["v1", "v2"] {
        site.add_sample(version, "");
        let out = with_policy(&["deploy", "edge-svc", version]);
        assert_eq!(out.status.code(), Some(0), "{version}: {}", stderr(&out));
    }
    assert_eq!(live_port(), first + 1, "v1 took {first}, v2 the other");
    let out = with_policy(&["rollback", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    assert_eq!(live_port(), first);
    let out = with_policy(&["config", "set", "edge-svc", "LOG_LEVEL=debug"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v1+c1");
    assert_eq!(live_port(), first + 1);
    assert_eq!(version_on(first + 1).as_deref(), Some("v1+c1"));

    for (range, what) in [
        (format!("{first}-{first}"), "A below B"),
        ("9000-70000".to_string(), "from 1 to 65535"),
        ("ports".to_string(), "a range"),
    ] {
        let bad = write(
            site.root(),
            "bad.yaml",
            &format!("edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  ports: \"{range}\"\n"),
        );
        let out = rollgate()
            .args(["policy", "check"])
            .arg(&bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{range}");
        assert!(
            stdout(&out).contains("ports must be a range"),
            "{range}: {}",
            stdout(&out)
        );
        assert!(stdout(&out).contains(what), "{range}: {}", stdout(&out));
    }
}

#[test]
fn with_ports_the_deadline_is_given_by_flag_and_only_once() {
    let site = Site::new();
    let first = first_of(24);
    let ports = format!("{first}-{}", first + 1);
    site.add_sample("v1", "--ready-after-ms 60000");
    let deploy_with = |words: &[&str]| deploy_words(&site, words, &ports);
    // `VERSION DEADLINE_MS` reads as `PORT VERSION`: refused, saying where a deadline goes.
    let out = deploy_with(&["v1", "300"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--deadline-ms"), "{}", stderr(&out));
    let out = deploy_with(&["v1", "--deadline-ms", "300"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        site.last_detail().starts_with("not ready after 300 ms"),
        "{}",
        site.last_detail()
    );
    // Given twice: refused before anything starts.
    let before = site.log_lines().len();
    let port = free_port().to_string();
    let out = deploy_with(&[&port, "v1", "300", "--deadline-ms", "400"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("given twice"), "{}", stderr(&out));
    assert_eq!(site.log_lines().len(), before);
}
