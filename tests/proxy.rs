//! `rollgate proxy`: traffic through a sequence of deploys with zero failed requests, the
//! drain handshake, graceful shutdown, and hostile clients.

mod common;
use common::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running proxy, stopped (SIGTERM) on drop.
struct Proxy {
    child: std::process::Child,
    port: u16,
}

impl Proxy {
    fn start(site: &Site, extra: &[&str]) -> Proxy {
        let port = free_port();
        let child = std::process::Command::new(assert_cmd::cargo::cargo_bin("rollgate"))
            .args(["proxy", "--listen", &format!("127.0.0.1:{port}"), "--root"])
            .arg(site.root())
            .args(extra)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            wait_for(10, || TcpStream::connect(("127.0.0.1", port)).is_ok()),
            "proxy listening"
        );
        assert!(wait_for(10, || site.root().join("proxy.sock").exists()));
        Proxy { child, port }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        send_signal(self.child.id() as i32, 15);
        let _ = self.child.wait();
    }
}

/// A keep-alive HTTP/1.1 client, just enough for these tests.
struct Conn {
    reader: BufReader<TcpStream>,
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Conn {
    fn open(port: u16) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(Conn {
            reader: BufReader::new(stream),
        })
    }

    fn get(&mut self, path: &str, extra: &str) -> std::io::Result<Answer> {
        write!(
            self.reader.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: app.example\r\n{extra}\r\n"
        )?;
        self.read_answer()
    }

    fn read_answer(&mut self) -> std::io::Result<Answer> {
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(bad("closed before a status line"));
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(&line))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').ok_or_else(|| bad(l))?;
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        let answer = Answer {
            status,
            headers,
            body: String::new(),
        };
        let mut body = Vec::new();
        if let Some(len) = answer.header("content-length") {
            body.resize(len.parse().map_err(|_| bad("length"))?, 0);
            self.reader.read_exact(&mut body)?;
        } else if answer
            .header("transfer-encoding")
            .is_some_and(|t| t.contains("chunked"))
        {
            loop {
                line.clear();
                self.reader.read_line(&mut line)?;
                let size = usize::from_str_radix(line.trim(), 16).map_err(|_| bad("chunk"))?;
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        }
        Ok(Answer {
            body: String::from_utf8_lossy(&body).trim().to_string(),
            ..answer
        })
    }
}

/// A listener standing in for a release, named live in `current` (pid 1 is never signalled:
/// nothing deploys over it).
fn stand_in_release(site: &Site, version: &str) -> std::net::TcpListener {
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = upstream.local_addr().unwrap().port();
    write(
        site.root(),
        "current",
        &format!(
            r#"{{"service":"edge-svc","version":"{version}","port":{port},"pid":1,"start_time":0,"promoted_at":0}}"#
        ),
    );
    upstream
}

/// Reads a request head up to its blank line, lowercased.
fn read_head(reader: &mut impl BufRead) -> String {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            return head;
        }
        head.push_str(&line.to_lowercase());
    }
}

#[test]
fn no_live_release_is_a_503_with_a_reason() {
    let site = Site::new();
    let proxy = Proxy::start(&site, &[]);
    let answer = Conn::open(proxy.port).unwrap().get("/", "").unwrap();
    assert_eq!(answer.status, 503);
    assert!(
        answer.body.starts_with("no live release"),
        "{}",
        answer.body
    );
}

#[test]
fn forwards_with_proxy_headers_and_names_the_version_when_asked() {
    let site = Site::new();
    site.release("v1", "");
    let port = free_port();
    assert_eq!(site.deploy(port, "v1", &[]).status.code(), Some(0));
    let proxy = Proxy::start(&site, &["--version-header", "x-release"]);
    let mut conn = Conn::open(proxy.port).unwrap();
    let answer = conn.get("/", "").unwrap();
    assert_eq!((answer.status, answer.body.as_str()), (200, "v1"));
    assert_eq!(answer.header("x-release"), Some("v1"));
    // Keep-alive: the same connection serves again.
    assert_eq!(conn.get("/readyz", "").unwrap().status, 200);

    // A release that stopped answering: 502 naming it.
    send_signal(site.live_pid().unwrap(), 9);
    assert!(wait_for(5, || !alive(site.live_pid().unwrap())));
    let answer = Conn::open(proxy.port).unwrap().get("/", "").unwrap();
    assert_eq!(answer.status, 502);
    assert!(answer.body.contains("v1 on 127.0.0.1:"), "{}", answer.body);
}

#[test]
fn headers_reach_the_release() {
    // The sample service does not echo headers, so stand a tiny listener in for the release.
    let site = Site::new();
    let upstream = stand_in_release(&site, "echo");
    let proxy = Proxy::start(&site, &[]);
    let seen = std::thread::spawn(move || {
        let (mut stream, _) = upstream.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let head = read_head(&mut reader);
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            .unwrap();
        head
    });
    let answer = Conn::open(proxy.port)
        .unwrap()
        .get(
            "/path?q=1",
            "X-Forwarded-For: 203.0.113.9\r\nConnection: keep-alive, x-hop\r\nx-hop: 1\r\n",
        )
        .unwrap();
    assert_eq!(answer.status, 200);
    let head = seen.join().unwrap();
    assert!(head.starts_with("get /path?q=1 http/1.1\r\n"), "{head}");
    assert!(head.contains("host: app.example\r\n"), "{head}");
    assert!(
        head.contains("x-forwarded-for: 203.0.113.9, 127.0.0.1\r\n"),
        "{head}"
    );
    assert!(head.contains("x-forwarded-proto: http\r\n"), "{head}");
    assert!(
        !head.contains("x-hop"),
        "hop-by-hop header forwarded: {head}"
    );
}

#[test]
fn continuous_traffic_through_a_sequence_of_deploys_sees_no_error() {
    let site = Site::new();
    site.release("v1", "");
    site.release("v2", "--ready-after-ms 300");
    site.release("v3", "--ready-after-ms 60000");
    site.release("v4", "--exit-after-ms 0 --exit-code 78");
    site.release("v5", "--ignore-sigterm");
    site.release("v6", "--ready-after-ms 200");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let proxy = Proxy::start(&site, &[]);

    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<(u16, String)>>> = Arc::default();
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (stop, seen, port) = (stop.clone(), seen.clone(), proxy.port);
            std::thread::spawn(move || {
                let mut conn = Conn::open(port).unwrap();
                let mut mine = Vec::new();
                let end = Instant::now() + Duration::from_secs(60);
                while !stop.load(Ordering::SeqCst) && Instant::now() < end && mine.len() < 20_000 {
                    // Half the clients reconnect every time, half keep their connection.
                    if i % 2 == 0 {
                        conn = Conn::open(port).unwrap();
                    }
                    match conn.get("/", "") {
                        Ok(a) => mine.push((a.status, a.body)),
                        Err(e) => mine.push((0, e.to_string())),
                    }
                }
                seen.lock().unwrap().extend(mine);
            })
        })
        .collect();

    let sequence: [(&str, &[&str], i32); 5] = [
        ("v2", &[], 0),
        ("v3", &["700"], 1),
        ("v4", &[], 1),
        ("v5", &[], 0),
        ("v6", &["--grace-ms", "300"], 0),
    ];
    for (version, extra, code) in sequence {
        std::thread::sleep(Duration::from_millis(150));
        let out = site.deploy(free_port(), version, extra);
        assert_eq!(out.status.code(), Some(code), "{version}: {}", stderr(&out));
    }
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    assert!(seen.len() > 100, "only {} requests", seen.len());
    eprintln!("{} requests through 5 deploys", seen.len());
    let failures: Vec<_> = seen.iter().filter(|(status, _)| *status != 200).collect();
    assert!(
        failures.is_empty(),
        "{} of {} failed, e.g. {:?}",
        failures.len(),
        seen.len(),
        &failures[..failures.len().min(5)]
    );
    for (_, body) in seen.iter() {
        assert!(
            ["v1", "v2", "v5", "v6"].contains(&body.as_str()),
            "served by {body}"
        );
    }
    assert!(seen.iter().any(|(_, b)| b == "v6"));
    // Each promotion waited for the proxy.
    let promoted: Vec<String> = site
        .log_lines()
        .iter()
        .filter(|l| l["event"] == "promoted" && l["version"] != "v1")
        .map(|l| l["detail"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(promoted.len(), 3);
    assert!(
        promoted.iter().all(|d| d.contains("proxy drained it in")),
        "{promoted:?}"
    );
    assert!(
        promoted[2].contains("old release v5 killed"),
        "{}",
        promoted[2]
    );
}

#[test]
fn a_slow_request_to_the_old_release_finishes_before_it_is_stopped() {
    let site = Site::new();
    site.release("v1", "--response-delay-ms 1500");
    site.release("v2", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let proxy = Proxy::start(&site, &[]);
    let port = proxy.port;
    let slow = std::thread::spawn(move || {
        Conn::open(port)
            .unwrap()
            .get("/", "")
            .map(|a| (a.status, a.body))
    });
    std::thread::sleep(Duration::from_millis(300));
    let out = site.deploy(free_port(), "v2", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(slow.join().unwrap().unwrap(), (200, "v1".to_string()));
    let detail = site.last_detail();
    let waited: u64 = detail
        .split("proxy drained it in ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(waited >= 500, "{detail}");
    assert_eq!(Conn::open(port).unwrap().get("/", "").unwrap().body, "v2");
}

#[test]
fn sigterm_finishes_in_flight_requests_then_exits_zero() {
    let site = Site::new();
    site.release("v1", "--response-delay-ms 1000");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let mut proxy = Proxy::start(&site, &[]);
    let port = proxy.port;
    let slow = std::thread::spawn(move || Conn::open(port).unwrap().get("/", "").map(|a| a.status));
    std::thread::sleep(Duration::from_millis(300));
    send_signal(proxy.child.id() as i32, 15);
    assert_eq!(slow.join().unwrap().unwrap(), 200);
    assert_eq!(proxy.child.wait().unwrap().code(), Some(0));
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "still accepting"
    );
    assert!(!site.root().join("proxy.sock").exists());
}

#[test]
fn hostile_clients_get_errors_and_the_proxy_keeps_serving() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let proxy = Proxy::start(
        &site,
        &[
            "--header-read-timeout-ms",
            "1000",
            "--max-header-bytes",
            "8192",
        ],
    );

    // Oversized headers.
    let big = format!("X-Big: {}\r\n", "a".repeat(20_000));
    let answer = Conn::open(proxy.port).unwrap().get("/", &big);
    assert!(
        matches!(&answer, Ok(a) if a.status == 431) || answer.is_err(),
        "oversized headers accepted"
    );

    // Garbage bytes.
    let mut garbage = Conn::open(proxy.port).unwrap();
    garbage
        .reader
        .get_mut()
        .write_all(b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03 not http\r\n\r\n")
        .unwrap();
    let answer = garbage.read_answer();
    assert!(matches!(&answer, Ok(a) if a.status == 400) || answer.is_err());

    // Headers one byte a second (slowloris): cut off at the header-read timeout.
    let mut slow = TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let started = Instant::now();
    let mut closed = false;
    for byte in b"GET / HTTP/1.1\r\nHost: x\r\n".iter() {
        if slow.write_all(&[*byte]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
        if started.elapsed() > Duration::from_secs(4) {
            break;
        }
    }
    if !closed {
        let mut rest = Vec::new();
        let _ = slow.read_to_end(&mut rest);
    }
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "slow client held the connection"
    );

    // Half-closed: the request is sent, then the write side shut.
    let mut half = Conn::open(proxy.port).unwrap();
    write!(half.reader.get_mut(), "GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    half.reader
        .get_mut()
        .shutdown(std::net::Shutdown::Write)
        .unwrap();
    let _ = half.read_answer();

    // Still serving.
    let answer = Conn::open(proxy.port).unwrap().get("/", "").unwrap();
    assert_eq!((answer.status, answer.body.as_str()), (200, "v1"));
}

#[test]
fn an_upgrade_is_passed_through_as_a_tunnel() {
    // A stand-in release that accepts an Upgrade and then echoes bytes back, uppercased.
    let site = Site::new();
    let upstream = stand_in_release(&site, "ws");
    let proxy = Proxy::start(&site, &[]);
    let release = std::thread::spawn(move || {
        let (mut stream, _) = upstream.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let head = read_head(&mut reader);
        stream
            .write_all(
                b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n",
            )
            .unwrap();
        let mut buf = [0u8; 5];
        reader.read_exact(&mut buf).unwrap();
        stream.write_all(&buf.to_ascii_uppercase()).unwrap();
        head
    });
    let mut conn = Conn::open(proxy.port).unwrap();
    write!(
        conn.reader.get_mut(),
        "GET /tunnel HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
    )
    .unwrap();
    let answer = read_head(&mut conn.reader);
    assert!(answer.starts_with("http/1.1 101"), "{answer}");
    conn.reader.get_mut().write_all(b"hello").unwrap();
    let mut echoed = [0u8; 5];
    conn.reader.read_exact(&mut echoed).unwrap();
    assert_eq!(&echoed, b"HELLO");
    let head = release.join().unwrap();
    assert!(
        head.contains("upgrade: echo\r\n") && head.contains("connection: upgrade\r\n"),
        "{head}"
    );
}

/// The knobs `bench/proxy_bench.sh` uses to stand in for a real application behind the proxy.
#[test]
fn the_sample_service_can_spend_cpu_per_request_on_several_threads() {
    let site = Site::new();
    site.release("busy", "--threads 3 --work-us 30000");
    let port = free_port();
    let out = site.deploy(port, "busy", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pid = site.live_pid().unwrap();
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count();
    assert!(threads >= 3, "{threads} thread(s)");
    for _ in 0..4 {
        let mut conn = Conn::open(port).unwrap();
        let started = Instant::now();
        let answer = conn.get("/", "").unwrap();
        assert_eq!((answer.status, answer.body.as_str()), (200, "busy"));
        assert!(started.elapsed() >= Duration::from_millis(30));
    }

    let refused = rollgate()
        .args(["sample-service", "--threads", "0", "--port", "1"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
}

#[test]
fn the_proxy_serves_on_as_many_threads_as_asked() {
    let site = Site::new();
    site.release("v1", "");
    let port = free_port();
    assert_eq!(site.deploy(port, "v1", &[]).status.code(), Some(0));
    let proxy = Proxy::start(&site, &["--threads", "3"]);
    let threads = std::fs::read_dir(format!("/proc/{}/task", proxy.child.id()))
        .unwrap()
        .count();
    assert!(threads >= 3, "{threads} thread(s)");
    // Each thread has its own listener on the port; every connection gets an answer.
    for _ in 0..12 {
        let answer = Conn::open(proxy.port).unwrap().get("/", "").unwrap();
        assert_eq!((answer.status, answer.body.as_str()), (200, "v1"));
    }

    let refused = rollgate()
        .args(["proxy", "--threads", "0", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
}
