//! Issue 79: the front door answers every request it accepts and counts every one. A real
//! server users run (gunicorn's sync worker, which answers `Connection: close` with a chunked
//! body) behind `rollgate proxy`, and a client that keeps its connection and posts forms.

use std::io::Write;
use std::time::Duration;

use crate::access::access_lines;
use crate::common::http::{Conn, Proxy};
use crate::common::*;

/// A WSGI application: every request answered 200 after a moment's work with a body of unknown
/// length (a generator, so gunicorn sends it chunked), a POST's form read whole first, as
/// Django reads it — but at `/early`, where it is never read.
const WSGI_APP: &str = r#"
import time
def app(environ, start_response):
    # `/early` answers without reading the body (a redirect, a 403 from middleware), as an
    # application may; gunicorn's sync worker then closes its connection with it unread.
    early = environ.get("PATH_INFO") == "/early"
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length and not early else b""
    # A moment's work, as Django's answer takes; `/form-slow` a slower app's, `/slow` two
    # seconds.
    work = {"/slow": 2, "/form-slow": 0.1}.get(environ.get("PATH_INFO"), 0.02)
    time.sleep(work)
    start_response("200 OK", [("Content-Type", "text/plain")])
    def answer():
        yield b"got " + str(len(body)).encode() + b" bytes\n"
    return answer()
"#;

/// `v1` live: gunicorn's sync worker (one worker) serving [`WSGI_APP`] on `$PORT`, from the
/// tests' Python tools (outside the release, so unconfined: these tests are about the proxy).
fn gunicorn_live(site: &Site) {
    gunicorn_live_with(site, 1)
}

/// [`gunicorn_live`] with `workers` sync workers.
fn gunicorn_live_with(site: &Site, workers: usize) {
    let gunicorn = python_tools().join("gunicorn");
    write(&site.root().join("releases/v1"), "app.py", WSGI_APP);
    site.script(
        "v1",
        &format!(
            "exec '{}' --worker-class sync --workers {workers} --bind 127.0.0.1:$PORT --access-logfile - app:app\n",
            gunicorn.display()
        ),
    );
    let policy = write(
        site.root(),
        "policy.json",
        r#"{"edge_svc": {"progress_deadline_ms": 20000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0,
            "probe": {"path": "/"}, "isolation": {"enabled": false}}}"#,
    );
    let out = site.deploy(free_port(), "v1", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// Posts `a=1` to `path` on `conn`, its body `gap` after its head; the answer, or why there
/// was none.
fn post_form(
    conn: &mut Conn,
    path: &str,
    gap: Duration,
) -> std::io::Result<crate::common::http::Answer> {
    let stream = conn.reader.get_mut();
    stream.write_all(
        format!(
            "POST {path} HTTP/1.1\r\nHost: app.example\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 3\r\n\r\n"
        )
        .as_bytes(),
    )?;
    stream.flush()?;
    if !gap.is_zero() {
        std::thread::sleep(gap);
    }
    stream.write_all(b"a=1")?;
    conn.read_answer()
}

/// The issue's reproduction: gunicorn's sync worker closes its connection after each answer;
/// a POST whose body came a moment after its head, answered before the body's last bytes had
/// gone on (`/early` answers without reading it), made hyper's client drop the body, and the
/// proxy then closed the client's kept connection under it without saying `Connection: close`
/// — the next request met EOF (200, 200, EOF), never answered, never logged. Every POST of a
/// kept connection is answered, whatever its body's gap and whether the release read it.
#[test]
fn a_form_post_to_gunicorn_on_a_kept_connection_never_loses_the_next_request() {
    let site = Site::new();
    gunicorn_live(&site);
    let proxy = Proxy::start(&site, &[]);
    let mut lost = Vec::new();
    let mut answered = 0;
    let mut conn = Conn::open(proxy.port).unwrap();
    for n in 0..40 {
        // A body right behind its head, and one a moment after it (a browser's form on a
        // slower path; the issue's "always" case); the client pauses between requests.
        let gap = Duration::from_millis(if n % 4 == 0 { 0 } else { 15 });
        let (path, said) = match n % 2 {
            0 => ("/form", "got 3 bytes"),
            _ => ("/early", "got 0 bytes"),
        };
        std::thread::sleep(Duration::from_millis(30));
        match post_form(&mut conn, path, gap) {
            Ok(answer) if answer.status == 200 && answer.body == said => answered += 1,
            Ok(answer) => lost.push(format!("{n}: {} {}", answer.status, answer.body)),
            Err(e) => {
                lost.push(format!("{n}: {e}"));
                conn = Conn::open(proxy.port).unwrap();
            }
        }
    }
    assert!(lost.is_empty(), "{} of 40 lost: {lost:?}", lost.len());
    assert_eq!(answered, 40);
}

/// The acceptance's reproduction as the issue's reporter ran it: Python's `http.client`
/// posting a form on kept TLS connections to gunicorn's sync worker, its body right behind its
/// head or 15 ms after it, to a path that reads it, one that answers without reading it, and a
/// slower app's (100 ms). 1 000 POSTs from 4 clients at once: every one answered (the proxy
/// before the fix lost them as `200, 200, EOF`).
#[test]
fn a_thousand_form_posts_over_kept_tls_connections_to_gunicorn_lose_none() {
    let site = Site::new();
    gunicorn_live_with(&site, 4);
    let certs = tempfile::tempdir().unwrap();
    let ca = crate::tls::Ca::new(certs.path(), "ca");
    let cert = crate::tls::cert_arg("app.example", &ca.leaf("app.example", "app"));
    let tls = free_port();
    let tls_listen = format!("127.0.0.1:{tls}");
    let _proxy = Proxy::start(&site, &["--tls-listen", &tls_listen, "--tls-cert", &cert]);
    assert!(wait_for(10, || std::net::TcpStream::connect((
        "127.0.0.1",
        tls
    ))
    .is_ok()));
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/tools/conformance/form_posts.py");
    let out = std::process::Command::new(python_tools().join("python"))
        .arg(script)
        .arg(tls.to_string())
        .arg(ca.pem())
        .args(["app.example", "1000", "4"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lost = said["lost"].as_array().unwrap();
    assert!(lost.is_empty(), "{} of 1000 lost: {lost:#?}", lost.len());
    assert_eq!(said["answered"], 1000);
}

/// rollgate's own answers to a request with a body no release reads (a 503 in maintenance)
/// keep the connection too: the body is read and thrown away, so the next request on it is
/// answered, whenever the body came.
#[test]
fn an_own_answer_to_a_post_keeps_the_connection_for_the_next_request() {
    let site = Site::new();
    site.release("v1", "");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let proxy = Proxy::start(&site, &[]);
    let out = site.run(&["traffic", "maintenance", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut conn = Conn::open(proxy.port).unwrap();
    assert!(wait_for(10, || conn
        .get("/", "")
        .is_ok_and(|a| a.status == 503)));
    for n in 0..10 {
        let gap = Duration::from_millis(if n % 2 == 0 { 0 } else { 15 });
        let answer = post_form(&mut conn, "/form", gap).unwrap();
        assert_eq!(answer.status, 503, "{n}");
        let closes = answer
            .header("connection")
            .is_some_and(|c| c.eq_ignore_ascii_case("close"));
        assert!(!closes, "{n}: the connection was given up");
        let next = conn.get("/", "").unwrap();
        assert_eq!(next.status, 503, "{n}");
    }
}

/// A request whose client leaves before the answer still has its line: hyper dropped the
/// request's future and the line with it (the issue's matrix: 10 of 20 abandoned requests
/// were never logged), and rollgate's own HTTP/1.1 path wrote the release's late answer into
/// the closed connection and logged it 200, given. Its line says 499, `client_closed`, with no
/// release named, and the route counts it so.
#[test]
fn a_request_whose_client_leaves_before_the_answer_is_logged_499() {
    let site = Site::new();
    gunicorn_live(&site);
    let metrics = free_port();
    let metrics_listen = format!("127.0.0.1:{metrics}");
    let proxy = Proxy::start(
        &site,
        &["--access-log", "--metrics-listen", &metrics_listen],
    );
    // A POST (hyper's path) and a GET (rollgate's own), each on a connection its client
    // closes while the release works on it.
    let heads = [
        "POST /slow?post HTTP/1.1\r\nHost: app.example\r\nContent-Length: 3\r\n\r\na=1",
        "GET /slow?get HTTP/1.1\r\nHost: app.example\r\n\r\n",
    ];
    for head in heads {
        let mut conn = Conn::open(proxy.port).unwrap();
        conn.reader.get_mut().write_all(head.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        drop(conn);
    }
    // Both lines are in (the GET's once the release's late answer came, 2 s on).
    assert!(wait_for(20, || access_lines(&site)
        .iter()
        .filter(|l| l["path"] == "/slow")
        .count()
        == 2));
    for line in access_lines(&site) {
        assert_eq!(line["status"], 499, "{line}");
        assert_eq!(line["fate"], "client_closed", "{line}");
        assert_eq!(line["release"], serde_json::Value::Null, "{line}");
    }
    let scraped = Conn::open(metrics)
        .and_then(|mut c| c.get("/metrics", ""))
        .unwrap()
        .body;
    assert!(
        scraped
            .lines()
            .any(|l| l == "rollgate_proxy_own_answers_total{reason=\"client_closed\"} 2"),
        "{scraped}"
    );
}

/// A release that speaks HTTP/1.0 (Python's `http.server`, a body that runs to the close):
/// its answer goes out in the proxy's own version, HTTP/1.1 (RFC 9110 §6.2), and the client's
/// connection is kept for its next request.
#[test]
fn an_http_1_0_releases_answer_goes_out_as_http_1_1_on_a_kept_connection() {
    use std::io::BufRead;
    let site = Site::new();
    write(
        &site.root().join("releases/v1"),
        "serve.py",
        "import http.server, os\n\
         class H(http.server.BaseHTTPRequestHandler):\n\
         \x20   def do_GET(self):\n\
         \x20       self.answer()\n\
         \x20   def do_POST(self):\n\
         \x20       self.rfile.read(int(self.headers.get('content-length') or 0))\n\
         \x20       self.answer()\n\
         \x20   def answer(self):\n\
         \x20       self.send_response(200)\n\
         \x20       self.send_header('content-type', 'text/plain')\n\
         \x20       self.end_headers()\n\
         \x20       self.wfile.write(b'old school\\n')\n\
         \x20   def log_message(self, *args):\n\
         \x20       pass\n\
         http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n",
    );
    site.script("v1", "exec /usr/bin/python3 serve.py\n");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let proxy = Proxy::start(&site, &[]);
    let mut conn = Conn::open(proxy.port).unwrap();
    for n in 0..3 {
        conn.reader
            .get_mut()
            .write_all(b"POST /form HTTP/1.1\r\nHost: app.example\r\nContent-Length: 3\r\n\r\na=1")
            .unwrap();
        let mut status = String::new();
        conn.reader.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{n}: {status:?}");
        // The rest of the answer, its body framed for HTTP/1.1.
        let mut rest = Vec::new();
        loop {
            let mut line = String::new();
            conn.reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            rest.push(line.to_ascii_lowercase());
        }
        assert!(
            rest.iter()
                .any(|h| h.starts_with("transfer-encoding: chunked")),
            "{n}: {rest:?}"
        );
        let mut body = String::new();
        loop {
            let mut line = String::new();
            conn.reader.read_line(&mut line).unwrap();
            let size = usize::from_str_radix(line.trim(), 16).unwrap();
            let mut chunk = vec![0; size + 2];
            std::io::Read::read_exact(&mut conn.reader, &mut chunk).unwrap();
            if size == 0 {
                break;
            }
            body.push_str(&String::from_utf8_lossy(&chunk[..size]));
        }
        assert_eq!(body, "old school\n", "{n}");
    }
}

/// An upload its client abandons mid-body was logged 502 and counted against the release as an
/// upstream reset, so the canary's judge blamed the release for a client's leaving. It is the
/// client's: its line says 499, and the release's failures stay at none.
#[test]
fn an_upload_abandoned_mid_body_is_the_clients_not_a_failure_of_the_release() {
    let site = Site::new();
    gunicorn_live(&site);
    let metrics = free_port();
    let metrics_listen = format!("127.0.0.1:{metrics}");
    let proxy = Proxy::start(
        &site,
        &["--access-log", "--metrics-listen", &metrics_listen],
    );
    let mut conn = Conn::open(proxy.port).unwrap();
    let stream = conn.reader.get_mut();
    stream
        .write_all(b"POST /upload HTTP/1.1\r\nHost: app.example\r\nContent-Length: 100000\r\n\r\n")
        .unwrap();
    stream.write_all(&[b'x'; 1000]).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    drop(conn);
    let line = logged(&site, "/upload");
    assert_eq!(line["status"], 499, "{line}");
    let scraped = Conn::open(metrics)
        .and_then(|mut c| c.get("/metrics", ""))
        .unwrap()
        .body;
    let failures: Vec<&str> = scraped
        .lines()
        .filter(|l| l.starts_with("rollgate_proxy_upstream_failures_total{"))
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    assert!(failures.is_empty(), "{failures:?}");
}

/// The access line of the request to `path`, once the proxy has written it (within 10 s).
fn logged(site: &Site, path: &str) -> serde_json::Value {
    let line = || access_lines(site).into_iter().find(|l| l["path"] == path);
    assert!(
        wait_for(10, || line().is_some()),
        "{:?}",
        access_lines(site)
    );
    line().unwrap()
}

/// A release stand-in on a port of its own: `ok` to any request, but `/cut`, whose answer
/// promises 100 bytes and breaks off after 10.
fn cutting_release() -> u16 {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
                let Ok(mut writer) = stream.try_clone() else {
                    return;
                };
                let mut reader = BufReader::new(stream);
                loop {
                    let mut first = String::new();
                    if reader.read_line(&mut first).unwrap_or(0) == 0 {
                        return;
                    }
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                        line.clear();
                    }
                    if first.contains(" /cut ") {
                        let _ = writer
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789");
                        return;
                    }
                    if writer
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok\n")
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// Conservation with rollgate's own answers: every request a route takes has one access line
/// and one count, whoever ended it — a release's answer (whole, or cut by the release), a
/// release's failure (502, naming it), or rollgate's own answer: 308 to https, 413, 421, 503
/// with nothing live, 503 in maintenance. The log's lines of each route and release equal
/// `/metrics`' counts of them.
#[test]
fn every_request_a_route_takes_has_one_line_and_one_count_own_answers_included() {
    use std::process::Command;
    let (a, b, c) = (Site::new(), Site::new(), Site::new());
    crate::common::websocket::live_at(&a, "a-v1", cutting_release());
    // b's release listens nowhere (refused); c has nothing live.
    crate::common::websocket::live_at(&b, "b-v1", free_port());
    let certs = tempfile::tempdir().unwrap();
    let ca = crate::tls::Ca::new(certs.path(), "ca");
    let (plain, tls, metrics) = (free_port(), free_port(), free_port());
    let mut certs_line = String::new();
    for host in ["a.test", "b.test", "c.test"] {
        let cert = crate::tls::cert_arg(host, &ca.leaf(host, &host[..1]));
        certs_line.push_str(&format!("{cert:?},"));
    }
    let config = write(
        certs.path(),
        "proxy.toml",
        &format!(
            "listen = \"127.0.0.1:{plain}\"\ntls_listen = \"127.0.0.1:{tls}\"\n\
             metrics_listen = \"127.0.0.1:{metrics}\"\naccess_log = true\n\
             tls_cert = [{certs_line}]\n\
             [[route]]\nhost = \"a.test\"\nservice = \"a\"\nmax_request_body = 100\nroot = \"{}\"\n\
             [[route]]\nhost = \"b.test\"\nservice = \"b\"\nroot = \"{}\"\n\
             [[route]]\nhost = \"c.test\"\nservice = \"c\"\nroot = \"{}\"\n",
            a.root().display(),
            b.root().display(),
            c.root().display()
        ),
    );
    let proxy = crate::routes::RoutedProxy::start(&config, plain, &[a.root(), b.root()]);
    assert!(wait_for(10, || std::net::TcpStream::connect((
        "127.0.0.1",
        tls
    ))
    .is_ok()));
    let curl = |sni: &str, host: &str, path: &str, extra: &[&str]| -> String {
        let out = Command::new("curl")
            .args(["-sS", "--http1.1", "--max-time", "10", "--cacert"])
            .arg(ca.pem())
            .args(["--resolve", &format!("{sni}:{tls}:127.0.0.1")])
            .args([
                "-H",
                &format!("Host: {host}"),
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .args(extra)
            .arg(format!("https://{sni}:{tls}{path}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let body = "x".repeat(200);
    assert_eq!(curl("a.test", "a.test", "/", &[]), "200");
    assert_eq!(curl("a.test", "a.test", "/up", &["-d", &body]), "413");
    // The release breaks its answer off: the client saw 200 and 10 bytes of 100.
    assert_eq!(curl("a.test", "a.test", "/cut", &[]), "200");
    assert_eq!(curl("b.test", "b.test", "/", &[]), "502");
    assert_eq!(curl("c.test", "c.test", "/", &[]), "503");
    assert_eq!(curl("a.test", "b.test", "/", &[]), "421");
    let redirected = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "Host: a.test",
        ])
        .arg(format!("http://127.0.0.1:{plain}/"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&redirected.stdout), "308");
    let out = a.run(&["traffic", "maintenance", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(wait_for(10, || curl("a.test", "a.test", "/", &[]) == "503"));

    // What each route's lines say, and what /metrics says of the same route.
    // Each route's fates, and whether each names a release.
    type Fates<'a> = &'a [(&'a str, bool)];
    let expected: [(&Site, &str, Fates); 3] = [
        (
            &a,
            "a",
            &[
                ("answered", true),
                ("refused_body", false),
                ("upstream_reset", true),
                ("redirect", false),
                ("maintenance", false),
            ],
        ),
        (
            &b,
            "b",
            &[("upstream_refused", true), ("misdirected", false)],
        ),
        (&c, "c", &[("no_release", false)]),
    ];
    for (site, route, fates) in expected {
        assert!(
            wait_for(10, || access_lines(site).len() >= fates.len()),
            "{route}: {:?}\n{}",
            access_lines(site),
            proxy.said()
        );
        std::thread::sleep(Duration::from_millis(400));
        let lines = access_lines(site);
        let mut seen: Vec<(String, bool)> = lines
            .iter()
            .map(|l| {
                (
                    l["fate"].as_str().unwrap().to_string(),
                    !l["release"].is_null(),
                )
            })
            .collect();
        let mut wanted: Vec<(String, bool)> =
            fates.iter().map(|(f, r)| (f.to_string(), *r)).collect();
        // Maintenance may take a moment to close the gate: each kind once in the list.
        seen.sort();
        seen.dedup();
        wanted.sort();
        assert_eq!(seen, wanted, "{route}: {lines:?}");
        let scraped = Conn::open(metrics)
            .and_then(|mut c| c.get("/metrics", ""))
            .unwrap()
            .body;
        let sum = |name: &str, and: &str| crate::conformance::summed(&scraped, name, route, and);
        let named = lines.iter().filter(|l| !l["release"].is_null()).count() as u64;
        assert_eq!(
            sum("rollgate_proxy_answers_total", "")
                + sum("rollgate_proxy_upstream_failures_total", ""),
            named,
            "{route}: {scraped}"
        );
        for line in lines.iter().filter(|l| l["release"].is_null()) {
            let reason = line["fate"].as_str().unwrap();
            let logged = lines.iter().filter(|l| l["fate"] == reason).count() as u64;
            assert_eq!(
                sum(
                    "rollgate_proxy_own_answers_total",
                    &format!("reason=\"{reason}\"")
                ),
                logged,
                "{route} {reason}"
            );
        }
        let cut = lines
            .iter()
            .filter(|l| l["fate"] == "upstream_reset" && l["status"] == 200);
        assert_eq!(
            sum(
                "rollgate_proxy_answers_cut_total",
                "reason=\"upstream_reset\""
            ),
            cut.count() as u64,
            "{route}"
        );
    }
}
