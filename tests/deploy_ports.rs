//! `rollgate deploy SERVICE VERSION --ports A-B` (issue 37.6): rollgate picks the candidate's
//! port, so one unchanged command deploys release after release.

mod common;
use common::*;

use std::time::Duration;

fn deploy(site: &Site, version: &str, ports: &str) -> std::process::Output {
    rollgate()
        .args(["deploy", "edge-svc", version, "--ports", ports, "--root"])
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
