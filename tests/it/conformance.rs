//! Issue 79's conformance matrix: five servers users run behind the proxy (gunicorn's sync and
//! gthread workers, uvicorn, Node's http, Python's HTTP/1.0 http.server) × clients (HTTP/1.1 on
//! a kept connection, plain and over TLS; a new connection each request; HTTP/2 with httpx and
//! with curl) × requests (GET, HEAD, small and 1 MiB POSTs, a form whose body comes a moment
//! after its head, a chunked upload, `Expect: 100-continue`, 204, 304, a slow answer, a client
//! that leaves) × idle gaps on kept connections (0, 50, 300, 1000 ms). Every request answered
//! as its server meant, and accounted exactly: one access line per request sent, the right
//! fate on each, and `/metrics` agreeing with the log route by route.
//!
//! The clients are `tests/tools/conformance/client.py` (curl and httpx are real clients; the
//! HTTP/1.1 one writes bytes by hand so a body can lag its head); the servers' applications
//! are beside it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::access::access_lines;
use crate::common::http::Conn;
use crate::common::websocket::{live_at, Stopped};
use crate::common::*;
use crate::routes::RoutedProxy;
use crate::tls::{cert_arg, Ca};

fn tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/conformance")
}

/// The five servers, each on a port of its own: (host the routes give it, its command).
fn servers() -> Vec<(&'static str, Command, u16)> {
    let bin = python_tools();
    let dir = tools();
    let mut made = Vec::new();
    let gunicorn = |workers: &[&str], port: u16| {
        let mut command = Command::new(bin.join("gunicorn"));
        command
            .args(workers)
            .args(["--bind", &format!("127.0.0.1:{port}"), "--chdir"])
            .arg(&dir)
            .args(["--log-level", "warning", "wsgi:app"]);
        command
    };
    let port = free_port();
    made.push((
        "gunicorn-sync.test",
        gunicorn(&["--worker-class", "sync", "--workers", "4"], port),
        port,
    ));
    let port = free_port();
    made.push((
        "gunicorn-gthread.test",
        gunicorn(
            &[
                "--worker-class",
                "gthread",
                "--workers",
                "1",
                "--threads",
                "8",
            ],
            port,
        ),
        port,
    ));
    let port = free_port();
    let mut uvicorn = Command::new(bin.join("uvicorn"));
    uvicorn
        .arg("--app-dir")
        .arg(&dir)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--log-level", "warning", "asgi:app"]);
    made.push(("uvicorn.test", uvicorn, port));
    let port = free_port();
    let mut node = Command::new("node");
    node.arg(dir.join("server.js")).arg(port.to_string());
    made.push(("node.test", node, port));
    let port = free_port();
    let mut http10 = Command::new("python3");
    http10.arg(dir.join("http10.py")).arg(port.to_string());
    made.push(("http10.test", http10, port));
    made
}

/// `/metrics`' series `name` for route `route`, its samples added up.
pub(crate) fn summed(scraped: &str, name: &str, route: &str, and: &str) -> u64 {
    let opening = format!("{name}{{route=\"{route}\",");
    scraped
        .lines()
        .filter(|l| l.starts_with(&opening) && l.contains(and))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn five_servers_users_run_answer_every_request_of_the_matrix_and_each_is_counted_once() {
    let mut running = Vec::new();
    let mut hosts = Vec::new();
    for (host, mut command, port) in servers() {
        let child = command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        running.push(Stopped(child));
        hosts.push((host, port));
    }
    for (host, port) in &hosts {
        assert!(
            wait_for(30, || std::net::TcpStream::connect(("127.0.0.1", *port))
                .is_ok()),
            "{host} listening"
        );
    }
    // Each server live in two roots: one behind a plain proxy, one behind a TLS proxy (whose
    // plain listener redirects to https).
    let certs = tempfile::tempdir().unwrap();
    let ca = Ca::new(certs.path(), "ca");
    let plain_sites: Vec<Site> = hosts.iter().map(|_| Site::new()).collect();
    let tls_sites: Vec<Site> = hosts.iter().map(|_| Site::new()).collect();
    let (plain, tls, tls_plain) = (free_port(), free_port(), free_port());
    let (plain_metrics, tls_metrics) = (free_port(), free_port());
    let mut plain_config = format!(
        "listen = \"127.0.0.1:{plain}\"\nmetrics_listen = \"127.0.0.1:{plain_metrics}\"\n\
         access_log = true\n"
    );
    let mut tls_config = format!(
        "listen = \"127.0.0.1:{tls_plain}\"\ntls_listen = \"127.0.0.1:{tls}\"\n\
         metrics_listen = \"127.0.0.1:{tls_metrics}\"\naccess_log = true\ntls_cert = ["
    );
    for (at, (host, port)) in hosts.iter().enumerate() {
        live_at(&plain_sites[at], &format!("{host}-v1"), *port);
        live_at(&tls_sites[at], &format!("{host}-v1"), *port);
        let name = host.trim_end_matches(".test");
        tls_config.push_str(&format!("{:?},", cert_arg(host, &ca.leaf(host, name))));
    }
    tls_config.push_str("]\n");
    for (at, (host, _)) in hosts.iter().enumerate() {
        let route = |root: &Path| {
            format!(
                "[[route]]\nhost = \"{host}\"\nservice = \"{}\"\nroot = \"{}\"\n",
                host.trim_end_matches(".test"),
                root.display()
            )
        };
        plain_config.push_str(&route(plain_sites[at].root()));
        tls_config.push_str(&route(tls_sites[at].root()));
    }
    let plain_file = write(certs.path(), "plain.toml", &plain_config);
    let tls_file = write(certs.path(), "tls.toml", &tls_config);
    let plain_roots: Vec<&Path> = plain_sites.iter().map(Site::root).collect();
    let tls_roots: Vec<&Path> = tls_sites.iter().map(Site::root).collect();
    let plain_proxy = RoutedProxy::start(&plain_file, plain, &plain_roots);
    let tls_proxy = RoutedProxy::start(&tls_file, tls_plain, &tls_roots);
    assert!(wait_for(10, || std::net::TcpStream::connect((
        "127.0.0.1",
        tls
    ))
    .is_ok()));

    let asked = serde_json::json!({
        "plain": plain, "tls": tls, "tls_plain": tls_plain,
        "ca": ca.pem(), "gaps_ms": [0, 50, 300, 1000],
        "hosts": hosts.iter().map(|(h, _)| h).collect::<Vec<_>>(),
    });
    let out = Command::new(python_tools().join("python"))
        .arg(tools().join("client.py"))
        .arg(asked.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let tallies: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let failed: Vec<&serde_json::Value> = tallies
        .values()
        .flat_map(|t| t["failed"].as_array().unwrap())
        .collect();
    assert!(
        failed.is_empty(),
        "{} failed: {failed:#?}\nplain proxy: {}\nTLS proxy: {}",
        failed.len(),
        plain_proxy.said(),
        tls_proxy.said()
    );

    // Exact accounting, route by route, in each proxy's log and /metrics.
    for (at, (host, _)) in hosts.iter().enumerate() {
        let route = host.trim_end_matches(".test");
        for (site, kind, metrics) in [
            (&plain_sites[at], "plain", plain_metrics),
            (&tls_sites[at], "tls", tls_metrics),
        ] {
            let tally = &tallies[&format!("{host} {kind}")];
            let sent = tally["sent"].as_u64().unwrap() as usize;
            let left = tally["left"].as_u64().unwrap() as usize;
            let redirected = tally["redirected"].as_u64().unwrap() as usize;
            let fates_of = |lines: &[serde_json::Value]| {
                let mut fates: BTreeMap<String, usize> = BTreeMap::new();
                for line in lines {
                    let fate = line["fate"].as_str().unwrap_or("none");
                    let id = line["request_id"].as_str().unwrap_or("");
                    let id = if id.starts_with("leave") { id } else { "" };
                    *fates
                        .entry(format!("{fate} {} {id}", line["method"]))
                        .or_default() += 1;
                }
                fates
            };
            assert!(
                wait_for(20, || access_lines(site).len() >= sent),
                "{host} {kind}: {} lines for {sent} requests ({left} left, {redirected} \
                 redirected): {:?}",
                access_lines(site).len(),
                fates_of(&access_lines(site))
            );
            // One more flush's time for a line too many to show.
            std::thread::sleep(std::time::Duration::from_millis(400));
            let lines = access_lines(site);
            let mut fates: BTreeMap<String, usize> = BTreeMap::new();
            for line in &lines {
                let fate = line["fate"].as_str().unwrap_or("none").to_string();
                let named = !line["release"].is_null();
                let expected_named = fate == "answered";
                assert_eq!(named, expected_named, "{host} {kind}: {line}");
                *fates.entry(fate).or_default() += 1;
            }
            let mut expected = BTreeMap::from([("answered".to_string(), sent - left - redirected)]);
            if left > 0 {
                expected.insert("client_closed".into(), left);
            }
            if redirected > 0 {
                expected.insert("redirect".into(), redirected);
            }
            assert_eq!(fates, expected, "{host} {kind}: {} lines", lines.len());
            let scraped = Conn::open(metrics)
                .and_then(|mut c| c.get("/metrics", ""))
                .unwrap()
                .body;
            let released = summed(&scraped, "rollgate_proxy_answers_total", route, "")
                + summed(
                    &scraped,
                    "rollgate_proxy_upstream_failures_total",
                    route,
                    "",
                );
            assert_eq!(released as usize, sent - left - redirected, "{host} {kind}");
            let own = |reason: &str| {
                summed(
                    &scraped,
                    "rollgate_proxy_own_answers_total",
                    route,
                    &format!("reason=\"{reason}\""),
                ) as usize
            };
            assert_eq!(own("client_closed"), left, "{host} {kind}");
            assert_eq!(own("redirect"), redirected, "{host} {kind}");
            let cut = summed(&scraped, "rollgate_proxy_answers_cut_total", route, "");
            assert_eq!(cut, 0, "{host} {kind}");
        }
    }
    drop(running);
}
