//! `rollgate run SVC [--release V] -- COMMAND ARGS...`: a one-off command in the service's live
//! release (or release V), started as its processes are — its launch record (`current`): its
//! user, confinement, limits and writable folders; for an image release, in a container of its
//! image — with the release's configuration and secrets, the terminal attached, its exit
//! status rollgate's. Logged as a `run` line (who, what,
//! how it ended, how long; never its environment). The root's lock is not taken: a deploy may
//! go on meanwhile, and the command is not the deploy's to stop.

use std::path::PathBuf;

use crate::error::{refused, Error};
use crate::host::journal::{self, Entry, LogEvent};
use crate::host::state::Root;

/// What `rollgate run` was asked.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub service: String,
    pub root: PathBuf,
    /// Another installed release than the live one.
    pub release: Option<String>,
    pub command: Vec<String>,
}

/// Runs the command; returns its exit status (0-255) for rollgate's own.
pub fn run(request: &RunRequest) -> Result<u8, Error> {
    crate::host::names::check_name("service", &request.service)?;
    let root = Root::existing(request.root.clone())?;
    let live = root
        .read_pointer()?
        .filter(|p| p.service == request.service);
    // Whatever release it runs in, it runs as the service's processes do now: the service's
    // folders belong to the user the live release runs as.
    let Some(live) = live else {
        return Err(refused(format!(
            "nothing of {} is live under {}: a one-off command runs as the live release's processes run; deploy it first",
            request.service,
            root.0.display()
        )));
    };
    let version = request
        .release
        .clone()
        .unwrap_or_else(|| live.version.clone());
    crate::host::names::check_name("version", &version)?;
    let folder = root.release_dir(&version);
    if !folder.is_dir() {
        return Err(refused(format!(
            "release {version} of {} is not installed ({} is not there)",
            request.service,
            folder.display()
        )));
    }
    // The live release's record (its user, confinement, limits); another release's own image.
    let mut record = live.launch.clone();
    if version != live.version {
        record.image = None;
    }
    let one_off = crate::host::one_off::OneOff {
        root: &root.0,
        service: &request.service,
        version: &version,
        command: &request.command,
        record: &record,
    };
    let ended = crate::engine::runtime()?
        .block_on(crate::host::one_off::run(&one_off))
        .map_err(|e| {
            refused(format!(
                "cannot run {} in {version}: {e}",
                crate::host::output::printable(&request.command.join(" "))
            ))
        })?;
    let detail = format!(
        "{} ran `{}` in {version}: {} after {} ms",
        crate::host::traffic::who(),
        crate::host::output::printable(&request.command.join(" ")),
        ended.words(),
        ended.took.as_millis()
    );
    let entry = Entry {
        elapsed_ms: Some(ended.took.as_millis() as u64),
        ..Entry::new(LogEvent::Run, &version, &request.service, detail)
    };
    if let Err(e) = journal::append(&root.log_path(), &entry) {
        eprintln!(
            "rollgate: the run is not in {}: {e}",
            root.log_path().display()
        );
    }
    Ok(u8::try_from(ended.code).unwrap_or(u8::MAX))
}
