//! Webhooks: every log record whose event an endpoint asks for, POSTed to it as JSON and signed
//! the Standard Webhooks way, driven from the log with a position saved per endpoint.
//!
//! - `ROOT/webhooks.json` lists the endpoints: `{"endpoints": [{"name", "url", "secret",
//!   "events"?}]}` (`secret` is `whsec_` and base64, as the spec writes it; `events` a list of
//!   log events, all of them without it). Only `http://` URLs: put a TLS-terminating proxy in
//!   front of an `https://` receiver.
//! - `ROOT/webhooks/state.json` holds, per endpoint, its position in the log (a [`Cursor`]),
//!   when the next attempt is due and how many attempts the record at the position has had, and
//!   whether the endpoint was disabled (it answered 410). The position moves past a record only
//!   after the receiver answered 2xx, and is saved (fsync, rename) before the next record: a
//!   sender killed at any moment sends that record again (at least once), never skips one. A
//!   message's id is its record's place in the log, the same on every attempt, so a receiver
//!   drops duplicates by it.
//! - A failed attempt is tried again after a backoff that doubles from 1 s up to 1 h with
//!   jitter, or after the receiver's `Retry-After`; records behind it wait (in order).
//! - `ROOT/webhooks/deliveries.log` records every attempt (`rollgate webhooks deliveries`).
//! - One sender at a time (`ROOT/webhooks/sender.lock`): the console and `up --supervise` run
//!   a pass every second; `rollgate webhooks send` runs one (for cron). A deploy never sends,
//!   so a slow or dead receiver never slows or fails one.

mod sign;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::Error;
use crate::host::files::{read_config, read_json, write_atomically};
use crate::host::journal;
use crate::host::state::Root;
use crate::log::follow::{Cursor, Follower, Start};

pub use sign::{sign, Secret};

pub const CONFIG_FILE: &str = "webhooks.json";
/// What `webhooks.json` holds, for the error of a file that does not parse.
const SHAPE: &str = r#"it holds {"endpoints": [{"name": ..., "url": "http://...", "secret": "whsec_...", "events": [...]}]} (events optional; docs/webhooks.md)"#;
const FOLDER: &str = "webhooks";
/// One attempt may take this long.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
const FIRST_BACKOFF_S: f64 = 1.0;
const MAX_BACKOFF_S: f64 = 3600.0;
/// Where an endpoint's pass starts reading. A new endpoint starts at the log's end *as it was
/// when the endpoint was first seen*: an endpoint first seen on a root with no log yet is saved
/// with no cursor, and then everything the log came to hold since is for it (from the
/// beginning), not only what is appended after some later pass found the log. A cursor that
/// cannot be read (edited by hand) starts at the end, sending no history twice.
fn start_of(cursor: Option<&str>, seen_before: bool) -> Start {
    match cursor {
        Some(text) => text.parse::<Cursor>().map_or(Start::End, Start::After),
        None if seen_before => Start::Beginning,
        None => Start::End,
    }
}

/// Records sent to one endpoint in one pass at most (the rest in the next pass).
const PER_PASS: usize = 1000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub endpoints: Vec<Endpoint>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub name: String,
    pub url: String,
    pub secret: String,
    #[serde(default)]
    pub events: Option<Vec<String>>,
}

/// What the sender knows of one endpoint, saved after every change.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Progress {
    /// Just past the last record delivered or skipped (None: first seen when the root had no
    /// log yet, so it starts at the beginning of the log that appears; see [`start_of`]).
    pub cursor: Option<String>,
    /// When the next attempt at the record after the cursor is due (Unix seconds).
    pub next_attempt_at: f64,
    /// Attempts the record after the cursor has had.
    pub attempts: u32,
    /// Answered 410 Gone: nothing more is sent.
    pub disabled: bool,
}

pub type State = std::collections::BTreeMap<String, Progress>;

fn folder(root: &Root) -> PathBuf {
    root.0.join(FOLDER)
}

/// The endpoints of a root, or None without a `webhooks.json`.
pub fn config(root: &Root) -> Result<Option<Config>, Error> {
    let path = root.0.join(CONFIG_FILE);
    let config: Option<Config> =
        read_config(&path, SHAPE).map_err(|e| Error::Invalid(e.to_string()))?;
    if let Some(config) = &config {
        for endpoint in &config.endpoints {
            crate::host::names::check_name("endpoint name", &endpoint.name)
                .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
            if !endpoint.url.starts_with("http://") {
                return Err(Error::Invalid(format!(
                    "{}: endpoint {}: url {:?} must be http:// (put a TLS-terminating proxy in front of an https receiver)",
                    path.display(),
                    endpoint.name,
                    endpoint.url
                )));
            }
            Secret::parse(&endpoint.secret).map_err(|e| {
                Error::Invalid(format!(
                    "{}: endpoint {}: {e}",
                    path.display(),
                    endpoint.name
                ))
            })?;
        }
    }
    Ok(config)
}

fn load_state(root: &Root) -> Result<State, Error> {
    Ok(read_json(&folder(root).join("state.json"))
        .map_err(|e| Error::Invalid(e.to_string()))?
        .unwrap_or_default())
}

fn save_state(root: &Root, state: &State) -> Result<(), Error> {
    let text = serde_json::to_vec_pretty(state).map_err(|e| Error::Failed(e.to_string()))?;
    write_atomically(&folder(root).join("state.json"), &text)
        .map_err(|e| Error::Failed(format!("cannot save the webhooks' state: {e}")))
}

/// One delivery attempt, as `deliveries.log` keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Attempt {
    pub ts: f64,
    pub endpoint: String,
    pub id: String,
    pub event: String,
    pub attempt: u32,
    /// The receiver's status, or None when it did not answer.
    pub status: Option<u16>,
    pub ok: bool,
    pub error: Option<String>,
    pub next_attempt_at: Option<f64>,
}

fn record_attempt(root: &Root, attempt: &Attempt) {
    use std::io::Write;
    let path = folder(root).join("deliveries.log");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let _ = writeln!(file, "{}", json!(attempt));
    }
}

/// Every attempt so far, oldest first.
pub fn deliveries(root: &Root) -> Vec<Attempt> {
    std::fs::read_to_string(folder(root).join("deliveries.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// `rollgate webhooks deliveries`: a table of the attempts, or a JSON line each.
pub fn render_deliveries(attempts: &[Attempt], format: crate::render::Format) -> String {
    use crate::render::{csv_field, fitted_table, time::format_time, Format};
    match format {
        Format::Json => return attempts.iter().map(|a| format!("{}\n", json!(a))).collect(),
        Format::Csv => {
            let mut out =
                String::from("ts,endpoint,id,event,attempt,status,ok,error,next_attempt_at\n");
            for a in attempts {
                out.push_str(&format!(
                    "{},{},{},{},{},{},{},{},{}\n",
                    a.ts,
                    csv_field(&a.endpoint),
                    a.id,
                    csv_field(&a.event),
                    a.attempt,
                    a.status.map_or(String::new(), |s| s.to_string()),
                    a.ok,
                    csv_field(a.error.as_deref().unwrap_or("")),
                    a.next_attempt_at.map_or(String::new(), |t| t.to_string()),
                ));
            }
            return out;
        }
        Format::Table => {}
    }
    let mut table = fitted_table([
        "when",
        "endpoint",
        "id",
        "event",
        "attempt",
        "answer",
        "next attempt",
    ]);
    for a in attempts {
        let answer = match (a.status, &a.error) {
            (Some(status), _) if a.ok => status.to_string(),
            (_, Some(error)) => error.clone(),
            (Some(status), None) => status.to_string(),
            (None, None) => "-".into(),
        };
        table.add_row(vec![
            format_time(a.ts),
            a.endpoint.clone(),
            a.id.clone(),
            a.event.clone(),
            a.attempt.to_string(),
            answer,
            a.next_attempt_at.map_or(String::new(), format_time),
        ]);
    }
    format!("{table}\n")
}

/// A message's id: its record's place in the log (stable across attempts).
pub fn message_id(after: &Cursor) -> String {
    format!("msg_{}_{}_{}", after.dev, after.inode, after.offset)
}

/// The JSON a record is sent as: its event as the type, its subject, and the record itself.
pub fn payload(record: &Value) -> Value {
    let event = record["event"].as_str().unwrap_or("");
    let of_a_rollout = event.starts_with("rollout_")
        || event.starts_with("replica_")
        || event.starts_with("wave_")
        || record.get("wave").is_some_and(|w| !w.is_null());
    // A replica's line carries its process's token, `ROLLOUT-SLOT-PID.N`: the rollout's id
    // is what comes before the first `-` (a rollout id has none).
    let service = record["service"].as_str().unwrap_or("");
    let subject = match (
        of_a_rollout,
        record["token"].as_str(),
        record["schedule"].as_str(),
    ) {
        (_, _, Some(schedule)) => format!("schedule/{service}/{schedule}"),
        (true, Some(token), _) => {
            format!("rollout/{}", token.split('-').next().unwrap_or(token))
        }
        _ => format!("deploy/{service}"),
    };
    let timestamp = record["ts"]
        .as_f64()
        .map(crate::render::time::format_time)
        .unwrap_or_default();
    json!({
        "type": format!("rollgate.{event}"),
        "timestamp": timestamp,
        "subject": subject,
        "data": record,
    })
}

/// What one pass did.
#[derive(Debug, Default, PartialEq)]
pub struct Pass {
    pub delivered: usize,
    pub failed: usize,
    /// Another sender held the lock: this pass did nothing.
    pub skipped: bool,
}

/// One pass over a root's endpoints: every due record sent, in order, until one fails.
pub fn send_pass(root: &Root) -> Result<Pass, Error> {
    let Some(config) = config(root)? else {
        return Ok(Pass::default());
    };
    std::fs::create_dir_all(folder(root))
        .map_err(|e| Error::Failed(format!("cannot create {}: {e}", folder(root).display())))?;
    let Ok(_lock) = crate::host::lock::acquire(&folder(root).join("sender.lock")) else {
        return Ok(Pass {
            skipped: true,
            ..Pass::default()
        });
    };
    let runtime = crate::engine::runtime()?;
    let mut state = load_state(root)?;
    let mut pass = Pass::default();
    for endpoint in &config.endpoints {
        let seen_before = state.contains_key(&endpoint.name);
        let mut progress = state.get(&endpoint.name).cloned().unwrap_or_default();
        if progress.disabled || progress.next_attempt_at > journal::now() {
            continue;
        }
        let secret = Secret::parse(&endpoint.secret).map_err(|e| Error::Invalid(e.to_string()))?;
        let start = start_of(progress.cursor.as_deref(), seen_before);
        let mut follower = Follower::new(&root.log_path(), start);
        let lines = follower.poll().unwrap_or_default();
        if progress.cursor.is_none() {
            progress.cursor = follower.cursor().map(|c| c.to_string());
        }
        for line in lines.into_iter().take(PER_PASS) {
            let record = serde_json::from_str::<Value>(&line.text).ok();
            let event = record
                .as_ref()
                .and_then(|r| r["event"].as_str())
                .unwrap_or("")
                .to_string();
            let wanted = endpoint
                .events
                .as_ref()
                .is_none_or(|events| events.contains(&event));
            let Some(record) = record.filter(|_| wanted) else {
                // Not a record, or not one this endpoint asked for: passed over.
                progress.cursor = Some(line.after.to_string());
                continue;
            };
            let id = message_id(&line.after);
            let body = payload(&record).to_string();
            progress.attempts += 1;
            let answer = runtime.block_on(post(&endpoint.url, &secret, &id, &body));
            let now = journal::now();
            let ok = answer.status.is_some_and(|s| (200..300).contains(&s));
            let mut attempt = Attempt {
                ts: now,
                endpoint: endpoint.name.clone(),
                id,
                event,
                attempt: progress.attempts,
                status: answer.status,
                ok,
                error: answer.error.clone(),
                next_attempt_at: None,
            };
            if ok {
                progress.cursor = Some(line.after.to_string());
                progress.attempts = 0;
                progress.next_attempt_at = 0.0;
                pass.delivered += 1;
                record_attempt(root, &attempt);
                // Saved before the next record: a sender killed now sends nothing twice but
                // this one, and skips nothing.
                state.insert(endpoint.name.clone(), progress.clone());
                save_state(root, &state)?;
                continue;
            }
            pass.failed += 1;
            if answer.status == Some(410) {
                progress.disabled = true;
            } else {
                let wait = answer
                    .retry_after
                    .unwrap_or_else(|| backoff(progress.attempts));
                progress.next_attempt_at = now + wait;
                attempt.next_attempt_at = Some(progress.next_attempt_at);
            }
            record_attempt(root, &attempt);
            break;
        }
        state.insert(endpoint.name.clone(), progress);
        save_state(root, &state)?;
    }
    Ok(pass)
}

/// The wait before attempt `attempts + 1`: doubling from a second up to an hour, with up to a
/// quarter of it added at random so that senders do not retry in step.
fn backoff(attempts: u32) -> f64 {
    let base =
        (FIRST_BACKOFF_S * 2f64.powi(attempts.saturating_sub(1).min(20) as i32)).min(MAX_BACKOFF_S);
    let mut byte = [0u8; 1];
    rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut byte);
    base * (1.0 + f64::from(byte[0]) / 255.0 / 4.0)
}

/// What a receiver answered.
struct Answer {
    status: Option<u16>,
    error: Option<String>,
    /// Its `Retry-After`, in seconds.
    retry_after: Option<f64>,
}

/// POSTs one signed message.
async fn post(url: &str, secret: &Secret, id: &str, body: &str) -> Answer {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let timestamp = (journal::now() as u64).to_string();
    let signature = sign(secret, id, &timestamp, body);
    let request = hyper::Request::post(url)
        .header("content-type", "application/json")
        .header(
            "user-agent",
            concat!("rollgate/", env!("CARGO_PKG_VERSION")),
        )
        .header("webhook-id", id)
        .header("webhook-timestamp", &timestamp)
        .header("webhook-signature", format!("v1,{signature}"))
        .body(Full::new(bytes::Bytes::from(body.to_string())));
    let request = match request {
        Ok(request) => request,
        Err(e) => {
            return Answer {
                status: None,
                error: Some(format!("not a request: {e}")),
                retry_after: None,
            }
        }
    };
    let client: Client<_, Full<bytes::Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    match tokio::time::timeout(ATTEMPT_TIMEOUT, client.request(request)).await {
        Err(_) => Answer {
            status: None,
            error: Some(format!("no answer within {} s", ATTEMPT_TIMEOUT.as_secs())),
            retry_after: None,
        },
        Ok(Err(e)) => Answer {
            status: None,
            error: Some(e.to_string()),
            retry_after: None,
        },
        Ok(Ok(response)) => {
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| s.min(MAX_BACKOFF_S * 24.0));
            // Read (and drop) the body, bounded in time, so the connection ends cleanly.
            let _ =
                tokio::time::timeout(Duration::from_secs(1), response.into_body().collect()).await;
            Answer {
                status: Some(status),
                error: (!(200..300).contains(&status)).then(|| format!("answered {status}")),
                retry_after,
            }
        }
    }
}

/// `rollgate webhooks redeliver ID`: the record of message `id` sent again, now, to every
/// endpoint that asks for its event; the attempts are recorded. The positions do not move.
pub fn redeliver(root: &Root, id: &str) -> Result<Vec<Attempt>, Error> {
    let Some(config) = config(root)? else {
        return Err(Error::Refused(format!(
            "{} has no {CONFIG_FILE}",
            root.0.display()
        )));
    };
    let parts: Vec<&str> = id.strip_prefix("msg_").unwrap_or("").split('_').collect();
    let cursor: Cursor = parts.join(".").parse().map_err(|_| {
        Error::Refused(format!(
            "{id:?} is not a delivery id (msg_DEV_INODE_OFFSET)"
        ))
    })?;
    // The record that ends at the id's position.
    let mut follower = Follower::new(&root.log_path(), Start::Beginning);
    let line = std::iter::from_fn(|| {
        let lines = follower.poll().ok()?;
        (!lines.is_empty()).then_some(lines)
    })
    .take(64)
    .flatten()
    .find(|line| line.after == cursor)
    .ok_or_else(|| {
        Error::Refused(format!(
            "no record of {id} in {}",
            root.log_path().display()
        ))
    })?;
    let record: Value = serde_json::from_str(&line.text)
        .map_err(|e| Error::Invalid(format!("the record of {id} is not JSON: {e}")))?;
    let event = record["event"].as_str().unwrap_or("").to_string();
    let body = payload(&record).to_string();
    let runtime = crate::engine::runtime()?;
    let mut attempts = Vec::new();
    for endpoint in &config.endpoints {
        if !endpoint
            .events
            .as_ref()
            .is_none_or(|events| events.contains(&event))
        {
            continue;
        }
        let secret = Secret::parse(&endpoint.secret).map_err(|e| Error::Invalid(e.to_string()))?;
        let answer = runtime.block_on(post(&endpoint.url, &secret, id, &body));
        let attempt = Attempt {
            ts: journal::now(),
            endpoint: endpoint.name.clone(),
            id: id.to_string(),
            event: event.clone(),
            attempt: 0,
            status: answer.status,
            ok: answer.status.is_some_and(|s| (200..300).contains(&s)),
            error: answer.error,
            next_attempt_at: None,
        };
        std::fs::create_dir_all(folder(root)).map_err(|e| Error::Failed(e.to_string()))?;
        record_attempt(root, &attempt);
        attempts.push(attempt);
    }
    Ok(attempts)
}

/// Sends passes over `roots` every second until `keep_going` says stop (the console, `up
/// --supervise`). Errors are said on stderr once each and do not stop it.
pub fn keep_sending(roots: Vec<Root>, keep_going: impl Fn() -> bool) {
    let mut said: Option<String> = None;
    while keep_going() {
        for root in &roots {
            match send_pass(root) {
                Ok(_) => {}
                Err(e) => {
                    let text = format!("rollgate: webhooks of {}: {e}", root.0.display());
                    if said.as_deref() != Some(&text) {
                        eprintln!("{text}");
                        said = Some(text);
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_an_hour_with_a_little_jitter() {
        for (attempts, base) in [(1, 1.0), (2, 2.0), (5, 16.0), (40, 3600.0)] {
            let wait = backoff(attempts);
            assert!(wait >= base && wait <= base * 1.25, "{attempts}: {wait}");
        }
    }

    #[test]
    fn a_rollouts_record_is_about_the_rollout_a_deploys_about_the_service() {
        let rollout = json!({"ts": 1.0, "event": "replica_ready", "service": "edge-svc", "token": "r1.2", "wave": 0});
        assert_eq!(payload(&rollout)["subject"], "rollout/r1.2");
        let started =
            json!({"ts": 1.0, "event": "replica_started", "token": "r1.2-3-40.5", "wave": 0});
        assert_eq!(payload(&started)["subject"], "rollout/r1.2");
        assert_eq!(payload(&rollout)["type"], "rollgate.replica_ready");
        let deploy =
            json!({"ts": 1.0, "event": "promoted", "service": "edge-svc", "token": "123-4"});
        assert_eq!(payload(&deploy)["subject"], "deploy/edge-svc");
        assert_eq!(payload(&deploy)["data"], deploy);
    }

    #[test]
    fn a_message_id_is_its_records_place() {
        let cursor = Cursor {
            dev: 1,
            inode: 2,
            offset: 3,
        };
        assert_eq!(message_id(&cursor), "msg_1_2_3");
    }
}
