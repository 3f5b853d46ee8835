//! Issue 39: a socket rollgate holds for the service and hands to each release (fd 3,
//! `LISTEN_FDS`), so a deploy refuses no connection without a proxy: real deploys of real
//! processes under a steady load of connections to the one address.

use crate::common::*;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A policy with `listen` on `address` (and a short watch).
fn policy(site: &Site, address: &str, watch_ms: u64) -> std::path::PathBuf {
    write(
        site.root(),
        "policy.yaml",
        &format!(
            "edge_svc:\n  progress_deadline_ms: 3000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  stop_grace_ms: 5000\n  watch_ms: {watch_ms}\n  listen:\n    address: \"{address}\"\n    backlog: 1024\n"
        ),
    )
}

fn deploy(site: &Site, version: &str, policy: &std::path::Path) -> std::process::Output {
    rollgate()
        .args(["deploy", "edge-svc", version, "--root"])
        .arg(site.root())
        .arg("--policy")
        .arg(policy)
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap()
}

/// What the load saw: answers by version, connections refused, requests that failed.
#[derive(Debug, Default)]
struct Seen {
    versions: std::collections::BTreeMap<String, u64>,
    refused: u64,
    failed: Vec<String>,
}

/// One request on a new connection; the version that answered.
fn one_request(port: u16) -> Result<String, (bool, String)> {
    let mut stream =
        TcpStream::connect(("127.0.0.1", port)).map_err(|e| (true, format!("connect: {e}")))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| (false, e.to_string()))?;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .map_err(|e| (false, format!("write: {e}")))?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| (false, format!("read: {e}")))?;
    match answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200") {
        true => Ok(answer
            .rsplit("\r\n\r\n")
            .next()
            .unwrap_or("")
            .trim()
            .to_string()),
        false => Err((false, format!("answer: {answer:?}"))),
    }
}

/// A steady load on `port` until stopped: a request on a new connection every millisecond
/// (not `common::http::Load`, whose kept-alive half counts a connection closed by a stopping
/// release as a failure: a client retries those; a refused or dropped connection it cannot).
struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    thread: std::thread::JoinHandle<()>,
}

impl Load {
    fn start(port: u16) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (stopping, seeing) = (stop.clone(), seen.clone());
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                let result = one_request(port);
                let mut seen = seeing.lock().unwrap();
                match result {
                    Ok(version) => *seen.versions.entry(version).or_default() += 1,
                    Err((true, _)) => seen.refused += 1,
                    Err((false, why)) => seen.failed.push(why),
                }
                drop(seen);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Load { stop, seen, thread }
    }

    fn finish(self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap();
        Arc::try_unwrap(self.seen).unwrap().into_inner().unwrap()
    }
}

#[test]
fn deploys_on_a_held_socket_refuse_no_connection_and_bad_candidates_never_answer_users() {
    let site = Site::new();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let policy = policy(&site, &address, 500);
    for (version, args) in [
        ("v1", "--listen-fds"),
        ("v2", "--listen-fds --response-delay-ms 3"),
        ("v3", "--listen-fds --exit-after-ms 0"),
        ("v4", "--listen-fds --ready-after-ms 600000"),
        ("v5", "--listen-fds"),
        ("v6", "--listen-fds --ready-after-ms 300"),
    ] {
        site.add_sample(version, args);
    }
    let out = deploy(&site, "v1", &policy);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // The holder holds the socket and says so; the release got it as fd 3 for its own pid.
    let holder: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("listen.json")).unwrap())
            .unwrap();
    assert_eq!(holder["address"], address.as_str());
    assert_eq!(holder["origin"], "bound");
    let live = site.live_pid().unwrap();
    let environ = std::fs::read(format!("/proc/{live}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        environ.contains(&format!("LISTEN_PID={live}\0")),
        "{environ}"
    );
    assert!(environ.contains("LISTEN_FDS=1\0") && environ.contains("LISTEN_FDNAMES=http\0"));

    let load = Load::start(port);
    std::thread::sleep(Duration::from_millis(300));
    for (version, code) in [("v2", 0), ("v3", 1), ("v4", 1), ("v5", 0), ("v6", 0)] {
        let out = deploy(&site, version, &policy);
        assert_eq!(out.status.code(), Some(code), "{version}: {}", stderr(&out));
        std::thread::sleep(Duration::from_millis(200));
    }
    let seen = load.finish();
    assert_eq!(seen.refused, 0, "{seen:?}");
    assert!(seen.failed.is_empty(), "{seen:?}");
    for good in ["v1", "v2", "v5", "v6"] {
        assert!(
            seen.versions.get(good).is_some_and(|n| *n > 0),
            "{good}: {seen:?}"
        );
    }
    for bad in ["v3", "v4"] {
        assert!(!seen.versions.contains_key(bad), "{bad}: {seen:?}");
    }
    assert_eq!(site.pointer().unwrap()["version"], "v6");
    // Every old release stopped once replaced: only v6 and the holder run in the root.
    assert_eq!(site.processes().len(), 2, "{:?}", site.processes());
}

#[test]
fn a_python_server_takes_the_socket_by_fd_and_a_deploy_moves_it_to_the_next_one() {
    let site = Site::new();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let policy = policy(&site, &address, 0);
    // A third-party server on the handed socket (Python's own http.server, socket(fileno=3)),
    // its readiness on PORT.
    let server = r#"
import http.server, os, socket, sys, threading
assert os.environ["LISTEN_PID"] == str(os.getpid()), "LISTEN_PID is not mine"
assert os.environ["LISTEN_FDS"] == "1"
version = os.environ["ROLLGATE_VERSION"].encode()
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"ok\n" if self.path == "/readyz" else version + b"\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
users = http.server.HTTPServer(("127.0.0.1", 0), Answer, bind_and_activate=False)
users.socket.close()
users.socket = socket.socket(fileno=3)
probe = http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Answer)
threading.Thread(target=probe.serve_forever, daemon=True).start()
users.serve_forever()
"#;
    for version in ["p1", "p2"] {
        site.add_release(version, &format!("exec python3 -c '{server}'\n"));
    }
    let out = deploy(&site, "p1", &policy);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(one_request(port).map_err(|e| e.1).as_deref(), Ok("p1"));
    let out = deploy(&site, "p2", &policy);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(one_request(port).map_err(|e| e.1).as_deref(), Ok("p2"));
}

/// A `kill -9` of the holder: the live release keeps accepting (nothing refused), and the
/// next deploy's new holder takes the release's own socket (not a second one) and hands it
/// on. `status` and `--dry-run` say who holds it.
#[test]
fn a_killed_holder_is_replaced_by_one_that_takes_the_live_releases_socket() {
    let site = Site::new();
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let policy = policy(&site, &address, 0);
    for version in ["v1", "v2"] {
        site.add_sample(version, "--listen-fds");
    }
    let out = deploy(&site, "v1", &policy);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let status = |site: &Site| -> serde_json::Value {
        let out = rollgate()
            .args(["status", "--format", "json", "--root"])
            .arg(site.root())
            .output()
            .unwrap();
        serde_json::from_str(&stdout(&out)).unwrap()
    };
    let first = status(&site);
    assert_eq!(first["socket"]["address"], address.as_str(), "{first}");
    assert_eq!(first["socket"]["holder_running"], true, "{first}");
    let holder = first["socket"]["pid"].as_i64().unwrap() as i32;

    let load = Load::start(port);
    std::thread::sleep(Duration::from_millis(200));
    send_signal(holder, 9);
    assert!(wait_for(10, || !alive(holder) || is_zombie(holder)));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(status(&site)["socket"]["holder_running"], false);
    let dry = rollgate()
        .args(["deploy", "edge-svc", "v2", "--dry-run", "--root"])
        .arg(site.root())
        .arg("--policy")
        .arg(&policy)
        .output()
        .unwrap();
    let text = stdout(&dry);
    assert!(
        text.contains(&format!("{address} (backlog 1024)")),
        "{text}"
    );
    assert!(
        text.contains("no holder runs: one would be started"),
        "{text}"
    );
    let live = site.live_pid().unwrap();
    let out = deploy(&site, "v2", &policy);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    std::thread::sleep(Duration::from_millis(200));
    let seen = load.finish();
    assert_eq!(seen.refused, 0, "{seen:?}");
    assert!(seen.failed.is_empty(), "{seen:?}");
    assert!(seen.versions.get("v2").is_some_and(|n| *n > 0), "{seen:?}");
    let second = status(&site);
    assert_eq!(second["socket"]["holder_running"], true, "{second}");
    assert_eq!(
        second["socket"]["origin"],
        format!("taken from pid {live}").as_str(),
        "{second}"
    );
    // One listening socket on the address, not two (a second bind would need SO_REUSEPORT).
    let listening = std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(3) == Some(&"0A")
                && f.get(1)
                    .is_some_and(|a| a.ends_with(&format!(":{port:04X}")))
        })
        .count();
    assert_eq!(listening, 1);
}

/// After a reboot (every process of the root gone), `rollgate up` starts the live release
/// again with its socket: a new holder binds the address and the release gets it as fd 3.
#[test]
fn up_after_a_reboot_binds_the_socket_again_and_hands_it_to_the_live_release() {
    let site = Site::new();
    let port = free_port();
    let policy = policy(&site, &format!("127.0.0.1:{port}"), 0);
    site.add_sample("v1", "--listen-fds");
    let out = deploy(&site, "v1", &policy);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(one_request(port).map_err(|e| e.1).as_deref(), Ok("v1"));
    site.reboot();
    assert!(wait_for(10, || site.processes().is_empty()));
    assert!(one_request(port).is_err_and(|(refused, _)| refused));
    let out = rollgate()
        .args(["up", "--root"])
        .arg(site.root())
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(one_request(port).map_err(|e| e.1).as_deref(), Ok("v1"));
    let holder: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("listen.json")).unwrap())
            .unwrap();
    assert_eq!(holder["origin"], "bound");
}

/// A rollout of three replicas shares the one socket (each replica gets it as fd 3; their
/// PORTs are only for the probe): rolled to v2 under load, nothing refused or failed, and
/// both versions answered on the one address along the way.
#[test]
fn a_rollout_of_replicas_shares_the_one_socket_and_refuses_nothing() {
    let site = Site::new();
    let port = free_port();
    let policy = policy(&site, &format!("127.0.0.1:{port}"), 0);
    for version in ["v1", "v2"] {
        site.add_sample(version, "--listen-fds");
    }
    let ports = ten_ports(60);
    let rollout = |version: &str| {
        rollgate()
            .args([
                "rollout",
                "edge-svc",
                version,
                "--replicas",
                "3",
                "--ports",
                &ports,
            ])
            .args(["--soak", "300ms", "--root"])
            .arg(site.root())
            .arg("--policy")
            .arg(&policy)
            .timeout(Duration::from_secs(120))
            .output()
            .unwrap()
    };
    let out = rollout("v1");
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let load = Load::start(port);
    std::thread::sleep(Duration::from_millis(300));
    let out = rollout("v2");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    std::thread::sleep(Duration::from_millis(300));
    let seen = load.finish();
    assert_eq!(seen.refused, 0, "{seen:?}");
    assert!(seen.failed.is_empty(), "{seen:?}");
    assert!(seen.versions.get("v1").is_some_and(|n| *n > 0), "{seen:?}");
    assert!(seen.versions.get("v2").is_some_and(|n| *n > 0), "{seen:?}");
    assert_eq!(replica_versions(&site), ["v2", "v2", "v2"]);
}

/// The output pump keeps nothing of its starter's but its three standard descriptors: it
/// inherited the held socket (fd 3, placed for the release) and kept the service's port
/// listening after the release and its holder were gone (found as `up` after a reboot seeing
/// its port still accept before anything was started).
#[test]
fn the_output_pump_holds_no_socket_of_the_release() {
    let site = Site::new();
    let port = free_port();
    let policy = policy(&site, &format!("127.0.0.1:{port}"), 0);
    site.add_sample("v1", "--listen-fds");
    let out = deploy(&site, "v1", &policy);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let output = site.root().join("output/v1/edge-svc.output");
    let pumps: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("output-pump") && c.contains(output.to_str().unwrap())
            })
        })
        .collect();
    assert_eq!(pumps.len(), 1, "{pumps:?}");
    let sockets: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", pumps[0]))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .map(|target| target.display().to_string())
        .filter(|target| target.starts_with("socket:"))
        .collect();
    assert!(sockets.is_empty(), "the pump holds {sockets:?}");
    site.stop_service();
}
