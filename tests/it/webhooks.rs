//! Webhooks sent for real to receivers on 127.0.0.1, checked by a verifier written here from
//! the Standard Webhooks spec: every event exactly once by id, a receiver that was down gets
//! everything once it is back, a sender killed with SIGKILL mid-delivery loses nothing,
//! `Retry-After` is honoured and 410 disables the endpoint.

use crate::common::*;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::Value;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYo=";

/// The spec's check: `v1,` signatures (space-separated) of `id.timestamp.body` under the
/// base64 key after `whsec_`, and a timestamp within five minutes.
fn verify(id: &str, timestamp: &str, signatures: &str, body: &[u8]) -> bool {
    let key = base64::engine::general_purpose::STANDARD
        .decode(SECRET.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<sha2_010::Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let fresh = timestamp
        .parse::<i64>()
        .is_ok_and(|t| (now - t).abs() <= 300);
    fresh
        && signatures
            .split(' ')
            .filter_map(|s| s.strip_prefix("v1,"))
            .any(|s| s == expected)
}

#[derive(Clone, Debug)]
struct Received {
    id: String,
    body: Value,
    valid: bool,
}

/// How the receiver answers each request.
#[derive(Clone, Copy, PartialEq)]
enum Answer {
    Ok,
    Slowly(Duration),
    Status(u16, Option<u32>),
}

struct Receiver {
    port: u16,
    got: Arc<Mutex<Vec<Received>>>,
    answer: Arc<Mutex<Answer>>,
}

impl Receiver {
    /// Listening now on `port` (0: any), answering as `answer` says.
    fn start(port: u16, answer: Answer) -> Receiver {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(Mutex::new(answer));
        let (seen, how) = (got.clone(), answer.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (seen, how) = (seen.clone(), how.clone());
                std::thread::spawn(move || serve(stream, &seen, &how));
            }
        });
        Receiver { port, got, answer }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    fn received(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
}

fn serve(stream: TcpStream, seen: &Mutex<Vec<Received>>, how: &Mutex<Answer>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut headers = BTreeMap::new();
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let length: usize = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let header = |name: &str| headers.get(name).cloned().unwrap_or_default();
    let answer = *how.lock().unwrap();
    if let Answer::Slowly(delay) = answer {
        std::thread::sleep(delay);
    }
    let (status, retry_after) = match answer {
        Answer::Status(status, retry) => (status, retry),
        _ => (200, None),
    };
    if (200..300).contains(&status) {
        seen.lock().unwrap().push(Received {
            id: header("webhook-id"),
            valid: verify(
                &header("webhook-id"),
                &header("webhook-timestamp"),
                &header("webhook-signature"),
                &body,
            ),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        });
    }
    let retry = retry_after.map_or(String::new(), |s| format!("Retry-After: {s}\r\n"));
    let mut stream = stream;
    let _ = write!(
        stream,
        "HTTP/1.1 {status} X\r\n{retry}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
}

fn configure(site: &Site, url: &str, events: Option<&[&str]>) {
    let events = events.map_or(String::new(), |e| {
        format!(", \"events\": {}", serde_json::json!(e))
    });
    std::fs::write(
        site.root().join("webhooks.json"),
        format!("{{\"endpoints\": [{{\"name\": \"hook\", \"url\": \"{url}\", \"secret\": \"{SECRET}\"{events}}}]}}"),
    )
    .unwrap();
}

fn send(site: &Site) -> String {
    let out = rollgate()
        .args(["webhooks", "send", "--root"])
        .arg(site.root())
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    stdout(&out)
}

fn roll(site: &Site, version: &str) {
    let out = rollgate()
        .args(["rollout", "edge-svc", version, "--root"])
        .arg(site.root())
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// The log's records after the first `skip`.
fn records_after(site: &Site, skip: usize) -> Vec<Value> {
    site.log_lines().into_iter().skip(skip).collect()
}

#[test]
fn every_event_of_a_rollout_arrives_once_by_id_signed_and_a_redelivery_keeps_its_id() {
    let site = Site::new();
    four_replicas_of_v1(&site, 110);
    let receiver = Receiver::start(0, Answer::Ok);
    configure(&site, &receiver.url(), None);
    // First seen now: the endpoint starts at the log's end, not with its history.
    assert_eq!(send(&site), "0 delivered, 0 failed\n");
    let before = site.log_lines().len();
    roll(&site, "v2");
    let logged = records_after(&site, before);
    assert!(logged.len() >= 8, "{logged:?}");
    assert_eq!(
        send(&site),
        format!("{} delivered, 0 failed\n", logged.len())
    );
    let got = receiver.received();
    assert!(got.iter().all(|r| r.valid), "every signature verifies");
    let data: Vec<&Value> = got.iter().map(|r| &r.body["data"]).collect();
    assert_eq!(
        data,
        logged.iter().collect::<Vec<_>>(),
        "every record, in order"
    );
    let mut ids: Vec<&str> = got.iter().map(|r| r.id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), got.len(), "each id once");
    let rollout_id = logged.last().unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(got
        .iter()
        .all(|r| r.body["subject"] == format!("rollout/{rollout_id}")));
    assert_eq!(got.last().unwrap().body["type"], "rollgate.promoted");
    // Nothing new: nothing sent.
    assert_eq!(send(&site), "0 delivered, 0 failed\n");
    // A redelivery is the same message, with the same id.
    let id = got[2].id.clone();
    let out = rollgate()
        .args(["webhooks", "redeliver", &id, "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let again = receiver.received();
    assert_eq!(again.len(), got.len() + 1);
    assert_eq!(again.last().unwrap().id, id);
    assert_eq!(again.last().unwrap().body, got[2].body);
    let out = rollgate()
        .args(["webhooks", "deliveries", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(stdout(&out).lines().count(), got.len() + 1);
}

#[test]
fn a_receiver_down_for_ten_seconds_gets_everything_once_it_is_back() {
    let site = Site::new();
    four_replicas_of_v1(&site, 111);
    // A port nobody listens on yet.
    let port = free_port();
    configure(
        &site,
        &format!("http://127.0.0.1:{port}/hook"),
        Some(&["promoted", "replica_ready"]),
    );
    let console_port = free_port();
    let mut sender = std::process::Command::new(crate::common::bin())
        .args([
            "console",
            "--listen",
            &format!("127.0.0.1:{console_port}"),
            "--root",
        ])
        .arg(site.root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The console's sender sees the endpoint first: it starts at the log's end.
    assert!(wait_for(10, || site
        .root()
        .join("webhooks/state.json")
        .exists()));
    let before = site.log_lines().len();
    roll(&site, "v2");
    let wanted: Vec<Value> = records_after(&site, before)
        .into_iter()
        .filter(|r| r["event"] == "promoted" || r["event"] == "replica_ready")
        .collect();
    assert_eq!(wanted.len(), 5, "{wanted:?}");
    std::thread::sleep(Duration::from_secs(10));
    let failures = rollgate()
        .args(["webhooks", "deliveries", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert!(
        stdout(&failures).lines().count() >= 2,
        "it kept trying: {}",
        stdout(&failures)
    );
    let receiver = Receiver::start(port, Answer::Ok);
    // The backoff after 10 s of failures is at most 16 s (with its jitter, 20 s).
    assert!(
        wait_for(60, || receiver.received().len() >= wanted.len()),
        "{} of {}",
        receiver.received().len(),
        wanted.len()
    );
    std::thread::sleep(Duration::from_secs(2));
    let _ = sender.kill();
    let _ = sender.wait();
    let got = receiver.received();
    assert_eq!(
        got.iter().map(|r| &r.body["data"]).collect::<Vec<_>>(),
        wanted.iter().collect::<Vec<_>>(),
        "all of them, once, in order"
    );
    assert!(got.iter().all(|r| r.valid));
}

#[test]
fn a_sender_killed_mid_delivery_loses_nothing() {
    let site = Site::new();
    four_replicas_of_v1(&site, 112);
    let receiver = Receiver::start(0, Answer::Slowly(Duration::from_millis(400)));
    configure(&site, &receiver.url(), None);
    send(&site);
    let before = site.log_lines().len();
    roll(&site, "v2");
    let logged = records_after(&site, before);
    // Killed while a slow receiver holds its third or fourth request.
    let mut sender = std::process::Command::new(crate::common::bin())
        .args(["webhooks", "send", "--root"])
        .arg(site.root())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1_300));
    send_signal(sender.id() as i32, 9);
    let _ = sender.wait();
    let early = receiver.received().len();
    assert!(early > 0 && early < logged.len(), "killed mid-way: {early}");
    *receiver.answer.lock().unwrap() = Answer::Ok;
    send(&site);
    let got = receiver.received();
    let mut unique: Vec<&str> = got.iter().map(|r| r.id.as_str()).collect();
    unique.dedup();
    // The log as the second send found it: on a loaded machine the rollout's last records
    // (a retired replica's) may land after `roll` returned, and they are sent too.
    let logged = records_after(&site, before);
    assert_eq!(unique.len(), logged.len(), "every record arrived");
    assert!(
        got.len() <= logged.len() + 1,
        "at most the one in flight twice"
    );
}

#[test]
fn retry_after_is_honoured_and_gone_disables_the_endpoint() {
    let site = Site::new();
    four_replicas_of_v1(&site, 113);
    let receiver = Receiver::start(0, Answer::Status(503, Some(30)));
    configure(&site, &receiver.url(), None);
    send(&site);
    roll(&site, "v2");
    assert_eq!(send(&site), "0 delivered, 1 failed\n");
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(site.root().join("webhooks/state.json")).unwrap(),
    )
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let due = state["hook"]["next_attempt_at"].as_f64().unwrap();
    assert!(
        due > now + 25.0 && due < now + 31.0,
        "Retry-After: 30 -> {}",
        due - now
    );
    // Not due yet: nothing is tried.
    assert_eq!(send(&site), "0 delivered, 0 failed\n");
    // Due, and gone: the endpoint is disabled for good.
    let mut state = state;
    state["hook"]["next_attempt_at"] = serde_json::json!(0.0);
    std::fs::write(site.root().join("webhooks/state.json"), state.to_string()).unwrap();
    *receiver.answer.lock().unwrap() = Answer::Status(410, None);
    assert_eq!(send(&site), "0 delivered, 1 failed\n");
    *receiver.answer.lock().unwrap() = Answer::Ok;
    assert_eq!(send(&site), "0 delivered, 0 failed\n");
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(site.root().join("webhooks/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["hook"]["disabled"], true);
    assert!(receiver.received().is_empty());
}

/// Issue 36: an endpoint first seen on a new root (no `deploy.log` yet) used to keep no
/// position, then take the log's end at the first pass that found a log: the first deploy's
/// records, written between the two passes, were never sent. The end "when first seen" of a log
/// that did not exist is its beginning.
#[test]
fn an_endpoint_first_seen_before_the_root_has_a_log_gets_the_first_deploy() {
    let site = Site::new();
    site.release("v1", "");
    let receiver = Receiver::start(0, Answer::Ok);
    configure(&site, &receiver.url(), None);
    assert!(!site.root().join("deploy.log").exists());
    assert_eq!(send(&site), "0 delivered, 0 failed\n");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let logged = site.log_lines();
    assert!(logged.len() >= 2, "{logged:?}");
    assert_eq!(
        send(&site),
        format!("{} delivered, 0 failed\n", logged.len())
    );
    let data: Vec<Value> = receiver
        .received()
        .into_iter()
        .map(|r| r.body["data"].clone())
        .collect();
    assert_eq!(data, logged, "the first deploy's records, in order");
    assert_eq!(
        receiver.received().last().unwrap().body["type"],
        "rollgate.promoted"
    );
    // And nothing twice.
    assert_eq!(send(&site), "0 delivered, 0 failed\n");
}

#[test]
fn a_mistyped_webhooks_json_is_refused_at_its_line_with_what_it_holds() {
    let site = Site::new();
    std::fs::write(
        site.root().join("webhooks.json"),
        "{\"endpoints\": [\n  {\"name\": \"chat\", \"url\": \"http://127.0.0.1:9/\", \"secret_file\": \"s\"}\n]}\n",
    )
    .unwrap();
    let out = rollgate()
        .args(["webhooks", "send", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("webhooks.json:2:")
            && err.contains("unknown field `secret_file`, expected one of `name`, `url`, `secret`, `events`; it holds {\"endpoints\"")
            && !err.contains("state file"),
        "{err}"
    );
}

/// Issue 70: a scheduled run that fails is a webhook — `schedule_finished` with `ok: false`, its
/// exit status in the detail, the subject naming the schedule — and a run within its time is
/// none of the endpoint's business when it asks for failures only by `ok`.
#[test]
fn a_failing_scheduled_run_is_a_webhook_naming_its_schedule() {
    let site = Site::new();
    site.release("v1", "");
    let receiver = Receiver::start(0, Answer::Ok);
    configure(&site, &receiver.url(), Some(&["schedule_finished"]));
    assert_eq!(send(&site), "0 delivered, 0 failed\n");
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 0\n  schedules:\n    sync:\n      cron: \"@every 1s\"\n      command: [\"sh\", \"-c\", \"echo no database >&2; exit 3\"]\n",
    );
    let out = site.deploy(free_port(), "v1", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(wait_for(15, || site
        .log_lines()
        .iter()
        .any(|l| l["event"] == "schedule_finished")));
    site.stop_service();
    send(&site);
    let got = receiver.received();
    assert!(!got.is_empty() && got.iter().all(|r| r.valid));
    let first = &got[0].body;
    assert_eq!(first["type"], "rollgate.schedule_finished", "{first}");
    assert_eq!(first["subject"], "schedule/edge-svc/sync", "{first}");
    assert_eq!(first["data"]["ok"], false, "{first}");
    assert_eq!(first["data"]["schedule"], "sync", "{first}");
    let detail = first["data"]["detail"].as_str().unwrap();
    assert!(detail.starts_with("sync: exit status 3 after"), "{detail}");
}
