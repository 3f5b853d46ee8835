//! `rollgate traffic maintenance|pause|resume|status` (issue 48): what the proxy lets through
//! to a service's releases. The state is `ROOT/traffic.json` (written atomically; every proxy
//! serving the root watches it), so it survives a proxy restart and a reboot; each change is
//! a `traffic` line in `deploy.log` with who and why. The root's deploy lock is not taken: a
//! deploy or rollout goes on while the service is in maintenance (its gate talks to the
//! release, never through the proxy).

use std::path::{Path, PathBuf};

use crate::error::{refused, Error};
use crate::host::journal::{self, Entry, LogEvent};
use crate::host::state::Root;
use crate::host::traffic::{self, Mode, Traffic, MAX_PAGE_BYTES};
use crate::render::Format;

/// The longest `--reason` (as a rollout's) and `--message`: both are kept in the state file
/// and the log, and the message is on every answer during maintenance.
const MAX_REASON_CHARS: usize = 500;
const MAX_MESSAGE_CHARS: usize = 1000;

/// What a change asks for.
#[derive(Debug, Clone)]
pub enum Change {
    Maintenance {
        message: Option<String>,
        retry_after_s: Option<u64>,
        page: Option<PathBuf>,
    },
    Pause {
        max_pause_ms: Option<u64>,
    },
    Resume,
}

/// Sets `service`'s traffic under `root`; the line said back names the new state.
pub fn set(
    root: &Path,
    service: &str,
    change: Change,
    why: Option<String>,
) -> Result<String, Error> {
    let root = Root::existing(root.to_path_buf())?;
    crate::host::names::check_name("service", service)?;
    let too_long = |what: &str, text: &Option<String>, most: usize| match text {
        Some(text) if text.chars().count() > most => Err(refused(format!(
            "the {what} is {} characters; at most {most}",
            text.chars().count()
        ))),
        _ => Ok(()),
    };
    too_long("reason", &why, MAX_REASON_CHARS)?;
    if let Change::Maintenance { message, .. } = &change {
        too_long("message", message, MAX_MESSAGE_CHARS)?;
    }
    let live = live_of(&root)?;
    if let Some((served, _)) = &live {
        if served != service {
            return Err(refused(format!(
                "{} serves {served}, not {service}: name the root's own service",
                root.0.display()
            )));
        }
    }
    let mut state = Traffic {
        service: service.to_string(),
        since: journal::now(),
        by: traffic::who(),
        why,
        ..Traffic::default()
    };
    match change {
        Change::Maintenance {
            message,
            retry_after_s,
            page,
        } => {
            state.mode = Mode::Maintenance;
            state.message = message;
            state.retry_after_s = retry_after_s;
            state.page = page.map(|p| checked_page(&p)).transpose()?;
        }
        Change::Pause { max_pause_ms } => {
            state.mode = Mode::Paused;
            state.max_pause_ms = max_pause_ms;
        }
        Change::Resume => state.mode = Mode::Serving,
    }
    traffic::write(&root.0, &state)?;
    let said = line(&state);
    let version = live.map(|(_, version)| version).unwrap_or_default();
    let entry = Entry {
        traffic: serde_json::to_value(&state).ok(),
        ..Entry::new(LogEvent::Traffic, &version, service, said.clone())
    };
    journal::append(&root.log_path(), &entry).map_err(|e| {
        Error::Failed(format!(
            "{said}, but it is not in {}: {e}",
            root.log_path().display()
        ))
    })?;
    Ok(format!("{said}\n"))
}

/// `traffic status`: each root's state, a line each (or JSON).
pub fn status(roots: &[PathBuf], format: Format) -> Result<String, Error> {
    let mut states = Vec::new();
    for root in roots {
        let root = Root::existing(root.clone())?;
        let state = traffic::read(&root.0)?;
        let service = match (&state, live_of(&root)?) {
            (Some(state), _) => state.service.clone(),
            (None, Some((service, _))) => service,
            (None, None) => "-".into(),
        };
        states.push((root, service, state));
    }
    if format == Format::Json {
        let list: Vec<serde_json::Value> = states
            .iter()
            .map(|(root, service, state)| {
                serde_json::json!({
                    "root": root.0,
                    "service": service,
                    "mode": state.as_ref().map_or(Mode::Serving, |s| s.mode),
                    "state": state,
                })
            })
            .collect();
        let text = serde_json::to_string(&list).expect("traffic states serialize");
        return Ok(format!("{text}\n"));
    }
    Ok(states
        .iter()
        .map(|(root, service, state)| match state {
            Some(state) => format!("{}  {}\n", root.0.display(), line(state)),
            None => format!("{}  {service}: serving\n", root.0.display()),
        })
        .collect())
}

/// The service and version live under `root`, if any (the pointer, else the replica set).
fn live_of(root: &Root) -> Result<Option<(String, String)>, Error> {
    if let Some(set) = root.read_replicas()? {
        let version = set
            .replicas
            .first()
            .map(|r| r.version.clone())
            .unwrap_or_default();
        return Ok(Some((set.service, version)));
    }
    Ok(root.read_pointer()?.map(|p| (p.service, p.version)))
}

/// A custom maintenance page must be there, UTF-8 and at most 1 MiB: kept by its absolute path.
fn checked_page(page: &Path) -> Result<PathBuf, Error> {
    let absolute = std::fs::canonicalize(page)
        .map_err(|e| refused(format!("--page {}: {e}", page.display())))?;
    let length = std::fs::metadata(&absolute)
        .map_err(|e| refused(format!("--page {}: {e}", page.display())))?
        .len();
    if length > MAX_PAGE_BYTES {
        return Err(refused(format!(
            "--page {} is {length} bytes; a maintenance page is at most {MAX_PAGE_BYTES}",
            page.display()
        )));
    }
    let bytes =
        std::fs::read(&absolute).map_err(|e| refused(format!("--page {}: {e}", page.display())))?;
    if String::from_utf8(bytes).is_err() {
        return Err(refused(format!(
            "--page {} is not UTF-8 text",
            page.display()
        )));
    }
    Ok(absolute)
}

/// The state in words: `edge-svc: maintenance (503, Retry-After 60 s) by ops: migration`.
fn line(state: &Traffic) -> String {
    let what = match state.mode {
        Mode::Serving => "serving".to_string(),
        Mode::Maintenance => format!(
            "maintenance (503{}{})",
            state
                .retry_after_s
                .map_or(String::new(), |s| format!(", Retry-After {s} s")),
            state
                .message
                .as_deref()
                .map_or(String::new(), |m| format!(", \"{m}\""))
        ),
        Mode::Paused => format!(
            "paused (requests wait up to {} ms)",
            state.max_pause_ms.unwrap_or(traffic::DEFAULT_MAX_PAUSE_MS)
        ),
    };
    let why = state
        .why
        .as_deref()
        .map_or(String::new(), |w| format!(": {w}"));
    format!("{}: {what} by {}{why}", state.service, state.by)
}
