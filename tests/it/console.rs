//! `rollgate console`, run for real over roots with real rollouts of real processes: its API
//! answers what the state files say, its buttons' endpoints go through the CLI's own code and
//! refuse what the CLI refuses, a request without the token changes nothing, `--read-only` has
//! neither buttons nor endpoints, and the event stream resumes with no gap and no duplicate.

use crate::common::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

struct Answer {
    status: u16,
    head: String,
    body: String,
}

fn request(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut text = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    stream.write_all(text.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Answer {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

fn get_json(console: &Console, path: &str) -> Value {
    let answer = request(
        console.port,
        "GET",
        path,
        &[("Authorization", &console.bearer())],
        "",
    );
    assert_eq!(answer.status, 200, "{path}: {}", answer.body);
    serde_json::from_str(&answer.body).unwrap()
}

fn post(console: &Console, path: &str, body: &str, extra: &[(&str, &str)]) -> Answer {
    let bearer = format!("Bearer {}", console.token.as_deref().unwrap_or(""));
    let mut headers = vec![
        ("Authorization", bearer.as_str()),
        ("Content-Type", "application/json"),
    ];
    headers.extend_from_slice(extra);
    request(console.port, "POST", path, &headers, body)
}

/// The cookie the console's token link sets.
fn cookie_of(console: &Console, token: &str) -> String {
    let link = request(console.port, "GET", &format!("/?token={token}"), &[], "");
    assert_eq!(link.status, 303);
    link.head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .expect("the link sets a cookie")
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

fn rollout_state(site: &Site) -> String {
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("rollout.json")).unwrap())
            .unwrap();
    state["phase"].as_str().unwrap_or("").to_string()
}

fn four_of_v1(block: u16) -> Site {
    let site = Site::new();
    four_replicas_of_v1(&site, block);
    site
}

#[test]
fn the_buttons_endpoints_pause_resume_and_abort_a_real_rollout_through_the_clis_code() {
    let site = four_of_v1(100);
    let mut running = std::process::Command::new(crate::common::bin())
        .args(["rollout", "edge-svc", "v2", "--root"])
        .arg(site.root())
        .args(["--soak", "4s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let console = Console::start(&[site.root()], &[]);
    let token = console
        .token
        .clone()
        .expect("the first start prints the token's link");
    let token_file = site.root().join("console.token");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert!(wait_for(30, || get_json(
        &console,
        "/api/v1/roots/edge-svc"
    )["rollout"]["state"]
        == "running"));
    let state = get_json(&console, "/api/v1/roots");
    assert_eq!(state[0]["service"], "edge-svc");
    assert_eq!(state[0]["rollout"]["version"], "v2");
    assert_eq!(state[0]["replicas"].as_array().map(Vec::len), Some(4));

    // Issue 66: without the token nothing is shown, the page nor the API (a confined release
    // reaches 127.0.0.1); the link's cookie brings the page and its buttons.
    for path in [
        "/",
        "/api/v1/roots",
        "/api/v1/roots/edge-svc/history",
        "/api/v1/events",
    ] {
        let unread = request(console.port, "GET", path, &[], "");
        assert_eq!(unread.status, 401, "{path}: {}", unread.body);
        assert!(!unread.body.contains("edge-svc"), "{path}: {}", unread.body);
    }
    let wrong = request(
        console.port,
        "GET",
        "/api/v1/roots",
        &[("Authorization", "Bearer 00")],
        "",
    );
    assert_eq!(wrong.status, 401);
    let page = request(
        console.port,
        "GET",
        "/",
        &[("Authorization", &console.bearer())],
        "",
    );
    assert!(page.body.contains("Rollout v1 → v2"), "{}", page.body);
    // The page read the API's state of a real rollout (replicas, slots, waves) and its history
    // into its typed view with nothing left over.
    assert!(!page.body.contains("could not be read"), "{}", page.body);
    assert_eq!(
        page.body.matches("<tr class=\"wave").count(),
        state[0]["rollout"]["waves"].as_array().map_or(0, Vec::len),
        "{}",
        page.body
    );
    let cookie = cookie_of(&console, &token);
    let page = request(console.port, "GET", "/", &[("Cookie", &cookie)], "");
    assert!(page.body.contains(">Pause</button>"), "{}", page.body);

    // Without the token (401), or from another site (403): the rollout goes on.
    let refused = request(
        console.port,
        "POST",
        "/api/v1/roots/edge-svc/rollout/pause",
        &[("Content-Type", "application/json")],
        "{}",
    );
    assert_eq!(refused.status, 401, "{}", refused.body);
    let cross_site = post(
        &console,
        "/api/v1/roots/edge-svc/rollout/pause",
        "{}",
        &[
            ("Origin", "http://evil.example"),
            ("Sec-Fetch-Site", "cross-site"),
        ],
    );
    assert_eq!(cross_site.status, 403);
    assert_eq!(rollout_state(&site), "running");

    // A refusal in the CLI's words: resume of a running rollout.
    let out = rollgate()
        .args(["rollout", "resume", "edge-svc", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let refused = post(&console, "/api/v1/roots/edge-svc/rollout/resume", "", &[]);
    assert_eq!(refused.status, 409, "{}", refused.body);
    let answer: Value = serde_json::from_str(&refused.body).unwrap();
    assert_eq!(answer["exit_code"], 2);
    assert_eq!(
        format!("error: {}\n", answer["error"].as_str().unwrap()),
        stderr(&out),
        "the console words a refusal as the CLI does"
    );

    let paused = post(
        &console,
        "/api/v1/roots/edge-svc/rollout/pause",
        r#"{"reason":"checking dashboards"}"#,
        &[],
    );
    assert_eq!(paused.status, 200, "{}", paused.body);
    assert!(wait_for(30, || rollout_state(&site) == "paused"));
    let status = get_json(&console, "/api/v1/roots/edge-svc");
    assert_eq!(status["rollout"]["pause_reason"], "checking dashboards");
    assert_eq!(
        running.wait().unwrap().code(),
        Some(3),
        "its rollgate exits paused"
    );

    // Resumed (by the console's own rollgate), then aborted with rollback.
    let resumed = std::thread::spawn({
        let port = console.port;
        let bearer = format!("Bearer {token}");
        move || {
            request(
                port,
                "POST",
                "/api/v1/roots/edge-svc/rollout/resume",
                &[("Authorization", &bearer)],
                "",
            )
        }
    });
    assert!(wait_for(30, || rollout_state(&site) == "running"));
    let aborted = post(
        &console,
        "/api/v1/roots/edge-svc/rollout/abort",
        r#"{"reason":"bad numbers","rollback":true}"#,
        &[],
    );
    assert_eq!(aborted.status, 200, "{}", aborted.body);
    let resumed = resumed.join().unwrap();
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    assert!(wait_for(60, || {
        get_json(&console, "/api/v1/roots/edge-svc/history?limit=5")
            .as_array()
            .is_some_and(|h| h.last().is_some_and(|o| o["event"] == "rolled_back"))
    }));
    let history = get_json(&console, "/api/v1/roots/edge-svc/history?limit=5");
    assert_eq!(history.as_array().unwrap().len(), 2, "{history}");
    assert!(
        history[1]["reason"]
            .as_str()
            .unwrap()
            .contains("bad numbers"),
        "{history}"
    );
    let page = request(console.port, "GET", "/", &[("Cookie", &cookie)], "");
    assert!(page.body.contains("<svg class=\"timeline\""));
    assert!(page.body.contains("class=\"rolled_back\""));
    assert!(!page.body.contains("could not be read"), "{}", page.body);
}

#[test]
fn read_only_has_no_button_and_no_endpoint_and_beyond_loopback_needs_a_token_file() {
    let site = Site::new();
    std::fs::write(site.root().join("deploy.log"), "").unwrap();
    // Two roots: one page, a section each.
    let second = Site::new();
    let console = Console::start(&[site.root(), second.root()], &["--read-only"]);
    // Issue 66: read-only shows nothing without the token either; it makes one (0600) and
    // prints the link that sets it.
    let unread = request(console.port, "GET", "/api/v1/roots", &[], "");
    assert_eq!(unread.status, 401, "{}", unread.body);
    assert_eq!(request(console.port, "GET", "/", &[], "").status, 401);
    assert!(console.token.is_some(), "{}", console.link);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(site.root().join("console.token"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let roots = get_json(&console, "/api/v1/roots");
    assert_eq!(roots.as_array().map(Vec::len), Some(2), "{roots}");
    assert_ne!(roots[0]["service"], roots[1]["service"]);
    let page = request(
        console.port,
        "GET",
        "/",
        &[("Authorization", &console.bearer())],
        "",
    );
    assert_eq!(page.status, 200);
    assert_eq!(page.body.matches("<section id=\"root-").count(), 2);
    assert!(!page.body.contains("<button"));
    for action in [
        "rollout/pause",
        "rollout/resume",
        "rollout/abort",
        "promote",
        "abort",
    ] {
        let answer = request(
            console.port,
            "POST",
            &format!("/api/v1/roots/{}/{action}", "x"),
            &[("Authorization", &console.bearer())],
            "",
        );
        assert_eq!(answer.status, 404, "{action}");
        assert!(answer.body.contains("read-only"));
    }
    drop(console);
    let other = Site::new();
    let out = rollgate()
        .args(["console", "--listen", "0.0.0.0:0", "--root"])
        .arg(other.root())
        .timeout(Duration::from_secs(10))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("not a loopback address"),
        "{}",
        stderr(&out)
    );
    assert!(!other.root().join("console.token").exists());
}

/// Reads SSE events from `stream` until `count` records came (or a minute passed): their ids
/// and their records' `n`.
fn read_events(reader: &mut BufReader<TcpStream>, count: usize) -> Vec<(String, u64)> {
    let mut events = Vec::new();
    let mut id = String::new();
    let mut line = String::new();
    while events.len() < count {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if let Some(value) = line.strip_prefix("id: ") {
            id = value.trim().to_string();
        } else if let Some(data) = line.strip_prefix("data: ") {
            let data: Value = serde_json::from_str(data.trim()).unwrap();
            events.push((id.clone(), data["record"]["n"].as_u64().unwrap()));
        }
    }
    events
}

fn open_stream(console: &Console, path: &str, last_id: Option<&str>) -> BufReader<TcpStream> {
    let port = console.port;
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut text = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\nAuthorization: {}\r\n",
        console.bearer()
    );
    if let Some(id) = last_id {
        text.push_str(&format!("Last-Event-ID: {id}\r\n"));
    }
    text.push_str("\r\n");
    stream.write_all(text.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.contains("200"), "{line}");
    reader
}

fn records(log: &std::path::Path, range: std::ops::Range<u64>) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut text = String::new();
    for n in range {
        text.push_str(&format!(
            "{{\"ts\":{},\"event\":\"replica_ready\",\"service\":\"edge-svc\",\"version\":\"v2\",\"n\":{n},\"detail\":\"record {n}\"}}\n",
            1_793_613_600 + n
        ));
    }
    file.write_all(text.as_bytes()).unwrap();
}

#[test]
fn the_event_stream_delivers_ten_thousand_records_in_order_and_resumes_through_rotation() {
    let site = Site::new();
    let log = site.root().join("deploy.log");
    records(&log, 0..10_000);
    let console = Console::start(&[site.root()], &["--read-only"]);
    let mut stream = open_stream(&console, "/api/v1/events?from=start", None);
    let first = read_events(&mut stream, 6_000);
    assert_eq!(
        first.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
        (0..6_000).collect::<Vec<_>>()
    );
    // Disconnected after record 5999 was seen; meanwhile the log is rotated and grows.
    drop(stream);
    let last_id = first.last().unwrap().0.clone();
    std::fs::rename(&log, site.root().join("deploy.log.1")).unwrap();
    records(&log, 10_000..10_500);
    let mut resumed = open_stream(&console, "/api/v1/events", Some(&last_id));
    let rest = read_events(&mut resumed, 4_500);
    assert_eq!(
        rest.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
        (6_000..10_500).collect::<Vec<_>>(),
        "no gap and no duplicate across the disconnect and the rotation"
    );
    // New records keep coming on the open stream.
    records(&log, 10_500..10_501);
    assert_eq!(read_events(&mut resumed, 1)[0].1, 10_500);
}

/// The fields of a status that move with the clock: compared by closeness, not equality.
const COUNTDOWNS: &[&str] = &[
    "live_for_s",
    "waiting_s",
    "left_s",
    "up_for_s",
    "release_deadline_left_ms",
    "soak_left_ms",
];

/// Every field of `cli` is in `api` with the same value (countdowns within `slack` of each
/// other), and `api` has no field `cli` lacks; returns the paths that differ.
fn differences(cli: &Value, api: &Value, path: &str, slack: f64, out: &mut Vec<String>) {
    match (cli, api) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let here = format!("{path}.{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) if COUNTDOWNS.contains(&key.as_str()) => {
                        let close = match (x.as_f64(), y.as_f64()) {
                            (Some(x), Some(y)) => (x - y).abs() <= slack,
                            _ => x == y,
                        };
                        if !close {
                            out.push(format!("{here}: {x} vs {y}"));
                        }
                    }
                    (Some(x), Some(y)) => differences(x, y, &here, slack, out),
                    (x, y) => out.push(format!("{here}: {x:?} vs {y:?}")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (n, (x, y)) in a.iter().zip(b).enumerate() {
                differences(x, y, &format!("{path}[{n}]"), slack, out);
            }
        }
        (x, y) if x != y => out.push(format!("{path}: {x} vs {y}")),
        _ => {}
    }
}

/// Issue 35: `rollgate status --format json` and the console's `/api/v1/roots/SVC` are one
/// model: on a rollout in its soak and on the same rollout paused, every field of one is in
/// the other with the same value (the countdowns within the seconds between the two reads).
#[test]
fn status_json_and_the_console_api_are_the_same_model_field_for_field() {
    let site = four_of_v1(110);
    let mut running = std::process::Command::new(crate::common::bin())
        .args(["rollout", "edge-svc", "v2", "--root"])
        .arg(site.root())
        .args(["--soak", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let console = Console::start(&[site.root()], &["--read-only"]);
    let status = || -> Value {
        let out = rollgate()
            .args(["status", "--format", "json", "--root"])
            .arg(site.root())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_str(&stdout(&out)).unwrap()
    };
    // In the canary's soak: a slot moved, the others pending, a soak counting down. The
    // planner saves the soak with the canary's swap and the pool (the live pointer) is written
    // just after, so both are waited for: between the two, two reads may rightly differ.
    assert!(wait_for(60, || {
        let api = get_json(&console, "/api/v1/roots/edge-svc");
        api["rollout"]["soak_left_ms"].is_u64() && api["live"]["version"] == "v2"
    }));
    for phase in ["soaking", "paused"] {
        let cli = status();
        let api = get_json(&console, "/api/v1/roots/edge-svc");
        let mut found = Vec::new();
        differences(&cli, &api, "", 5_000.0, &mut found);
        assert_eq!(found, Vec::<String>::new(), "{phase}: {cli}\n{api}");
        // A model with content: a live pool, a rollout with its slots, the service named.
        assert_eq!(cli["service"], "edge-svc", "{cli}");
        assert_eq!(cli["replicas"].as_array().map(Vec::len), Some(4), "{cli}");
        assert_eq!(
            cli["rollout"]["slots"].as_array().map(Vec::len),
            Some(4),
            "{cli}"
        );
        assert!(
            cli["rollout"]["counts"]["succeeded"].as_u64() >= Some(1),
            "{cli}"
        );
        if phase == "soaking" {
            assert_eq!(cli["rollout"]["state"], "running", "{cli}");
            let out = rollgate()
                .args(["rollout", "pause", "edge-svc", "--root"])
                .arg(site.root())
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", stderr(&out));
            assert_eq!(running.wait().unwrap().code(), Some(3));
        } else {
            assert_eq!(cli["rollout"]["state"], "paused", "{cli}");
            assert!(cli["rollout"]["pause_reason"].is_string(), "{cli}");
        }
    }
    let out = rollgate()
        .args(["rollout", "abort", "edge-svc", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let _ = running.kill();
    let _ = running.wait();
}

#[test]
fn the_traffic_buttons_put_a_service_in_maintenance_and_back_behind_the_token() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let console = Console::start(&[site.root()], &[]);
    let token = console
        .token
        .clone()
        .expect("the first start prints the token's link");
    let cookie = cookie_of(&console, &token);
    let page = request(console.port, "GET", "/", &[("Cookie", &cookie)], "");
    assert!(
        page.body
            .contains("<p class=\"traffic serving\">serving</p>"),
        "{}",
        page.body
    );
    assert!(page.body.contains(">Maintenance</button>"), "{}", page.body);
    assert_eq!(request(console.port, "GET", "/", &[], "").status, 401);

    // Without the token: refused, nothing changed.
    let refused = request(
        console.port,
        "POST",
        "/api/v1/roots/edge-svc/traffic/maintenance",
        &[("Content-Type", "application/json")],
        "{}",
    );
    assert_eq!(refused.status, 401);
    assert!(!site.root().join("traffic.json").exists());

    let done = post(
        &console,
        "/api/v1/roots/edge-svc/traffic/maintenance",
        r#"{"message": "Back <soon>", "retry_after": 90, "reason": "from the console"}"#,
        &[],
    );
    assert_eq!(done.status, 200, "{}", done.body);
    let said: Value = serde_json::from_str(&done.body).unwrap();
    assert!(said["said"]
        .as_str()
        .unwrap()
        .starts_with("edge-svc: maintenance (503, Retry-After 90 s"));
    let state = get_json(&console, "/api/v1/roots/edge-svc");
    assert_eq!(state["traffic"]["mode"], "maintenance");
    assert_eq!(state["traffic"]["why"], "from the console");
    let page = request(console.port, "GET", "/", &[("Cookie", &cookie)], "");
    assert!(
        page.body
            .contains("<b>maintenance</b> (\u{201c}Back &lt;soon&gt;\u{201d})"),
        "{}",
        page.body
    );
    assert!(page.body.contains(">Resume traffic</button>"));
    assert!(!page.body.contains("could not be read"), "{}", page.body);
    let line = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "traffic")
        .unwrap();
    assert_eq!(line["traffic"]["mode"], "maintenance");

    let resumed = post(&console, "/api/v1/roots/edge-svc/traffic/resume", "{}", &[]);
    assert_eq!(resumed.status, 200, "{}", resumed.body);
    assert_eq!(
        get_json(&console, "/api/v1/roots/edge-svc")["traffic"]["mode"],
        "serving"
    );
}

/// Issue 58: the console's history shows what users had of a release rolled back after they
/// had it (how long, what it answered them, what ended it), and calls its time column what it
/// is: the gate's.
#[test]
fn the_history_says_what_users_had_of_a_release_switched_back_in_its_watch() {
    let site = Site::new();
    write(
        site.root(),
        "deploy.log",
        concat!(
            r#"{"ts":100,"event":"candidate_started","version":"v1","detail":"","service":"edge-svc","token":"d1"}"#,
            "\n",
            r#"{"ts":101,"event":"promoted","version":"v1","detail":"ready","elapsed_ms":80,"service":"edge-svc","token":"d1"}"#,
            "\n",
            r#"{"ts":200,"event":"candidate_started","version":"v2","detail":"","service":"edge-svc","token":"d2"}"#,
            "\n",
            r#"{"ts":201,"event":"switched","version":"v2","detail":"","service":"edge-svc","token":"d2"}"#,
            "\n",
            r#"{"ts":204.2,"event":"rolled_back","version":"v2","detail":"analysis failed: canary 5xx; switched back to v1","elapsed_ms":90,"service":"edge-svc","token":"d2","phase":"watch","exposure":{"live_s":3.2,"requests":612,"failed":612,"ended_by":"the traffic judge"}}"#,
            "\n",
        ),
    );
    write(
        site.root(),
        "current",
        r#"{"service":"edge-svc","version":"v1","port":1,"pid":0,"start_time":0,"promoted_at":101}"#,
    );
    let console = Console::start(&[site.root()], &["--read-only"]);
    let history = get_json(&console, "/api/v1/roots/edge-svc/history?limit=5");
    let words = "users had it for 3.2 s (612 requests through the proxy, 612 failed); ended by the traffic judge";
    assert_eq!(history[1]["users_had_it"], words, "{history}");
    assert_eq!(history[1]["exposure"]["requests"], 612, "{history}");
    assert!(history[0]["users_had_it"].is_null(), "{history}");
    let page = request(
        console.port,
        "GET",
        "/",
        &[("Authorization", &console.bearer())],
        "",
    );
    assert!(page.body.contains(words), "{}", page.body);
    assert!(page.body.contains("<th>gate took</th>"), "{}", page.body);
}

/// Issue 70: the event stream carries a schedule's runs, as it carries every log record.
#[test]
fn the_event_stream_carries_a_schedule_s_runs() {
    let site = Site::new();
    site.release("v1", "");
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  schedules:\n    report:\n      cron: \"@daily\"\n      command: [\"sh\", \"-c\", \"echo done\"]\n",
    );
    let out = site.deploy(free_port(), "v1", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let console = Console::start(&[site.root()], &["--read-only"]);
    let mut stream = open_stream(&console, "/api/v1/events", None);
    let out = site.run(&["schedules", "run", "edge-svc", "report"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut seen = Vec::new();
    let mut line = String::new();
    while !seen.contains(&"schedule_finished".to_string()) {
        line.clear();
        if stream.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        if let Some(data) = line.strip_prefix("data: ") {
            let data: Value = serde_json::from_str(data.trim()).unwrap();
            if data["record"]["schedule"] == "report" {
                seen.push(data["record"]["event"].as_str().unwrap().to_string());
            }
        }
    }
    assert_eq!(seen, ["schedule_started", "schedule_finished"]);
    site.stop_service();
}
