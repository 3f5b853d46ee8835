//! `rollgate logs SERVICE`: what the application itself printed. A release's stdout and stderr
//! go to `output/VERSION/SERVICE.output` (`SERVICE.SLOT.output` for a replica,
//! `SERVICE.TYPE.N.output` for another process type's, read with `--type TYPE`), rotated by
//! the output pump; this command reads them so nobody has to know where, and with `-f` follows
//! the live release across switches (a deploy, a rollback, `config set`) the way
//! `kamal app logs -f` and `journalctl -fu` do: when `current` names another release, the old
//! file is read to its end, a line on stderr says which release is live now, and its output is
//! read from its start (its boot, the gate included).
//!
//! Each line carries the time the output pump read it (`host::output::Stamp`), printed first
//! (`TIME [worker.1] words`; `--no-time` leaves it off). `--since T` takes every release live at
//! T or after it (from the deploy log's promotions), of each the output files last written at
//! or after T, and of those the lines said at or after T (a line without a time — split, or
//! written by an older rollgate — goes with its file).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{refused, Error};
use crate::host::journal::{self, LogEvent};
use crate::host::state::Root;
use crate::log::follow::{Follower, Start};

/// What `rollgate logs` was asked.
#[derive(Debug, Clone)]
pub struct Request {
    pub root: PathBuf,
    pub service: String,
    /// Go on printing what is written, across switches.
    pub follow: bool,
    /// This release's output instead of the live one's (never switches).
    pub release: Option<String>,
    /// Releases live since this time (Unix seconds), and their files written since.
    pub since: Option<f64>,
    /// Only the last N lines of what is there now.
    pub lines: Option<usize>,
    /// Another process type's output (`--type worker`: each of its processes'); none or `web`:
    /// web's.
    pub process_type: Option<String>,
    /// A schedule's runs' output (`ROOT/schedules/NAME.output`, the run before in `.1`).
    pub schedule: Option<String>,
    /// Each line's time printed before it (`--no-time`: false).
    pub times: bool,
}

/// How lines are shown: with their times or not, from when.
#[derive(Debug, Clone, Copy)]
struct Shown {
    times: bool,
    since: Option<f64>,
}

impl Shown {
    fn of(request: &Request) -> Shown {
        Shown {
            times: request.times,
            since: request.since,
        }
    }

    /// A line as printed (`TIME [label] words`), or None when it was said before `since`.
    fn line(&self, line: &str, label: Option<&str>) -> Option<String> {
        let (time, words) = match crate::host::output::stamp_of(line) {
            Some((time, words)) => (Some(time), words),
            None => (None, line),
        };
        if let (Some(since), Some(time)) = (self.since, time) {
            let said = chrono::DateTime::parse_from_rfc3339(time)
                .map(|t| t.timestamp_millis() as f64 / 1000.0);
            if said.is_ok_and(|said| said < since) {
                return None;
            }
        }
        let mut shown = String::with_capacity(line.len() + 16);
        if let Some(time) = time.filter(|_| self.times) {
            shown.push_str(time);
            shown.push(' ');
        }
        if let Some(label) = label {
            shown.push('[');
            shown.push_str(label);
            shown.push_str("] ");
        }
        shown.push_str(words);
        Some(shown)
    }
}

/// How often a follower looks for new output and for a switch.
const POLL: Duration = Duration::from_millis(200);

/// One release's output files being read: one per replica slot (one for a single release).
struct Reading {
    version: String,
    /// (the slot's label, when there are several; the follower of its current file)
    files: Vec<(Option<String>, Follower)>,
}

/// Runs `logs`: prints to `out`, says switches on `said`; returns when done (or, following,
/// when `out` is closed).
pub fn run(request: &Request, out: &mut dyn Write, said: &mut dyn Write) -> Result<(), Error> {
    crate::host::names::check_name("service", &request.service)?;
    if let Some(version) = &request.release {
        crate::host::names::check_name("version", version)?;
    }
    if let Some(process_type) = &request.process_type {
        crate::host::names::check_name("process type", process_type)?;
    }
    let root = Root::existing(request.root.clone())?;
    if let Some(name) = &request.schedule {
        return schedule_output(&root, name, request, out);
    }
    let live = live_release(&root)?;
    let kind = request.process_type.as_deref().filter(|t| *t != "web");
    let last = match (&request.release, &live) {
        (Some(version), _) => {
            if !root.release_dir(version).is_dir() {
                return Err(refused(format!(
                    "release {version} is not installed under {}",
                    root.0.display()
                )));
            }
            version.clone()
        }
        (None, Some(live)) => live.clone(),
        (None, None) => {
            return Err(refused(format!(
                "nothing is live under {}: name a release with --release V",
                root.0.display()
            )))
        }
    };
    let earlier = match (request.since, &request.release) {
        (Some(since), None) => live_since(&root, since, &last)?,
        _ => Vec::new(),
    };
    let written = |e: std::io::Error| Error::Failed(format!("cannot write the output: {e}"));
    let shown = Shown::of(request);
    for version in &earlier {
        for path in files_of(&root, version, &request.service, kind) {
            for generation in generations(&path, request.since) {
                copy_whole(&generation, shown, out).map_err(written)?;
            }
        }
    }
    // The live release is read as it runs now: its running processes' files only, not those a
    // scale left behind (issue 80, 7).
    let running = request.release.is_none();
    if let Some(kind) = kind {
        if files_of(&root, &last, &request.service, Some(kind)).is_empty() {
            return Err(refused(format!(
                "release {last} has run no `{kind}` process (no {}.{kind}.N.output in {})",
                request.service,
                root.output_dir(&last).display()
            )));
        }
    }
    let mut reading =
        open(&root, (&last, running), &request.service, kind, shown, out).map_err(written)?;
    let first = poll(&mut reading, request.lines, shown).map_err(written)?;
    if write_lines(out, &first).is_err() || !request.follow {
        return Ok(());
    }
    loop {
        std::thread::sleep(POLL);
        let lines = poll(&mut reading, None, shown).map_err(written)?;
        if write_lines(out, &lines).is_err() {
            return Ok(());
        }
        if request.release.is_some() {
            continue;
        }
        let now = live_release(&root).ok().flatten();
        match now {
            Some(now) if now != reading.version => {
                // The old release's last words first, then the new one from its start.
                let rest = poll(&mut reading, None, shown).map_err(written)?;
                if write_lines(out, &rest).is_err() {
                    return Ok(());
                }
                let _ = writeln!(
                    said,
                    "rollgate logs: {} is live now (was {}); its output follows",
                    now, reading.version
                );
                let from_start = Shown {
                    since: None,
                    ..shown
                };
                reading = open(&root, (&now, true), &request.service, kind, from_start, out)
                    .map_err(written)?;
            }
            _ => {}
        }
    }
}

/// A schedule's runs' output: each kept run's, oldest first (the last `-n` lines of them all),
/// then with `-f` what the newest run writes and each run after it.
fn schedule_output(
    root: &Root,
    name: &str,
    request: &Request,
    out: &mut dyn Write,
) -> Result<(), Error> {
    crate::host::names::check_name("schedule", name)?;
    let kept = crate::supervision::clock::outputs(root, name);
    if kept.is_empty() {
        return Err(refused(format!(
            "schedule {name} has not run under {} (nothing in {})",
            root.0.display(),
            crate::supervision::clock::outputs_dir(root, name).display()
        )));
    }
    let written = |e: std::io::Error| Error::Failed(format!("cannot write the output: {e}"));
    let shown = Shown::of(request);
    let since = |p: &Path| {
        request
            .since
            .is_none_or(|t| modified(p).is_some_and(|m| m >= t))
    };
    let mut lines = Vec::new();
    let (older, newest) = kept.split_at(kept.len() - 1);
    for path in older.iter().filter(|p| since(p)) {
        let text = std::fs::read(path).unwrap_or_default();
        lines.extend(
            String::from_utf8_lossy(&text)
                .lines()
                .filter_map(|l| shown.line(l, None)),
        );
    }
    let mut following = newest[0].clone();
    let mut follower = Follower::new(&following, Start::Beginning);
    if since(&following) {
        lines.extend(
            follower
                .poll()
                .map_err(written)?
                .into_iter()
                .filter_map(|l| shown.line(&l.text, None)),
        );
    } else {
        follower = Follower::new(&following, Start::End);
    }
    if let Some(keep) = request.lines {
        lines.drain(..lines.len().saturating_sub(keep));
    }
    if write_lines(out, &lines).is_err() || !request.follow {
        return Ok(());
    }
    loop {
        std::thread::sleep(POLL);
        let mut more: Vec<String> = follower
            .poll()
            .map_err(written)?
            .into_iter()
            .filter_map(|l| shown.line(&l.text, None))
            .collect();
        // A newer run: the rest of this one's, then the new one's from its start.
        if let Some(newer) = crate::supervision::clock::outputs(root, name)
            .into_iter()
            .rfind(|p| *p > following)
        {
            following = newer;
            follower = Follower::new(&following, Start::Beginning);
            more.extend(
                follower
                    .poll()
                    .map_err(written)?
                    .into_iter()
                    .filter_map(|l| shown.line(&l.text, None)),
            );
        }
        if write_lines(out, &more).is_err() {
            return Ok(());
        }
    }
}

/// The release live now: the formation's first web process's version.
fn live_release(root: &Root) -> Result<Option<String>, Error> {
    let formation = crate::engine::what_runs(root)?;
    Ok(formation.and_then(|f| {
        f.processes
            .into_iter()
            .find(|p| p.process_type == crate::host::state::WEB)
            .map(|p| p.version)
    }))
}

/// The releases live at `since` or promoted after it, oldest first, `last` (the live one) left
/// out: the deploy log's promotions (only `promoted` makes a release live).
fn live_since(root: &Root, since: f64, last: &str) -> Result<Vec<String>, Error> {
    let mut promoted = Vec::new();
    journal::outcomes_backwards(&root.log_path(), |outcome| {
        if outcome.event == LogEvent::Promoted {
            promoted.push(outcome.version);
            if outcome.ts <= since {
                // The release live at `since`: nothing older matters.
                return std::ops::ControlFlow::Break(());
            }
        }
        std::ops::ControlFlow::Continue(())
    })
    .map_err(|e| Error::Failed(format!("cannot read {}: {e}", root.log_path().display())))?;
    promoted.reverse();
    promoted.dedup();
    Ok(promoted.into_iter().filter(|v| v != last).collect())
}

/// A release's current output files: `SERVICE.output`, and each replica's
/// `SERVICE.SLOT.output`, slots in order; of another type `kind`, each of its processes'
/// `SERVICE.TYPE.N.output`.
fn files_of(root: &Root, version: &str, service: &str, kind: Option<&str>) -> Vec<PathBuf> {
    if let Some(kind) = kind {
        return numbered(root, version, &format!("{service}.{kind}."));
    }
    let slots = numbered(root, version, &format!("{service}."));
    let single = root.output_path(version, service);
    let mut files: Vec<PathBuf> = Vec::new();
    if single.exists() || slots.is_empty() {
        files.push(single);
    }
    files.extend(slots);
    files
}

/// The release's files `PREFIXN.output`, N in order.
fn numbered(root: &Root, version: &str, prefix: &str) -> Vec<PathBuf> {
    let mut found: Vec<(usize, PathBuf)> = std::fs::read_dir(root.output_dir(version))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let n = name
                        .strip_prefix(prefix)?
                        .strip_suffix(".output")?
                        .parse::<usize>()
                        .ok()?;
                    Some((n, entry.path()))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found.into_iter().map(|(_, path)| path).collect()
}

/// A file's rotated generations then the file itself, oldest first; with `since`, only those
/// last written at or after it.
fn generations(path: &Path, since: Option<f64>) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = (1..=crate::defaults::OUTPUT_KEEP_MAX)
        .map(|n| crate::host::output::generation(path, n))
        .take_while(|p| p.exists())
        .collect();
    found.reverse();
    found.push(path.to_path_buf());
    found
        .into_iter()
        .filter(|p| since.is_none_or(|since| modified(p).is_some_and(|m| m >= since)))
        .collect()
}

fn modified(path: &Path) -> Option<f64> {
    let time = std::fs::metadata(path).ok()?.modified().ok()?;
    Some(
        time.duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs_f64(),
    )
}

/// The files of the processes of `kind` (none: web) that run now as the formation names them:
/// each of the type's places, web's replicas or its single release; None where it names no
/// such processes of `version` (then every file there is read).
fn running_files(
    root: &Root,
    version: &str,
    service: &str,
    kind: Option<&str>,
) -> Option<Vec<PathBuf>> {
    let files: Vec<PathBuf> = crate::supervision::supervise::live_set(root)
        .ok()?
        .iter()
        .filter(|live| live.service == service && live.version == version)
        .filter(|live| live.process.as_ref().map(|(t, _)| t.as_str()) == kind)
        .map(|live| live.output(root))
        .collect();
    (!files.is_empty()).then_some(files)
}

/// Opens a release's files for reading (of the processes that run now, when `running`); with
/// `since`, its rotated generations written since are printed first (the current file is read
/// by its follower).
fn open(
    root: &Root,
    (version, running): (&str, bool),
    service: &str,
    kind: Option<&str>,
    shown: Shown,
    out: &mut dyn Write,
) -> std::io::Result<Reading> {
    let files = running
        .then(|| running_files(root, version, service, kind))
        .flatten()
        .unwrap_or_else(|| files_of(root, version, service, kind));
    // Another type's lines always say which of its processes printed them.
    let several = files.len() > 1 || kind.is_some();
    let mut reading = Reading {
        version: version.to_string(),
        files: Vec::new(),
    };
    for path in files {
        if let Some(since) = shown.since {
            for generation in generations(&path, Some(since)) {
                if generation != path {
                    copy_whole(&generation, shown, out)?;
                }
            }
        }
        let label = several.then(|| slot_label(&path, service));
        reading
            .files
            .push((label, Follower::new(&path, Start::Beginning)));
    }
    Ok(reading)
}

/// `slot 2` for `SERVICE.2.output`, `worker.1` for `SERVICE.worker.1.output`, `single` for
/// `SERVICE.output`.
fn slot_label(path: &Path, service: &str) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name
        .strip_prefix(&format!("{service}."))
        .and_then(|rest| rest.strip_suffix(".output"))
    {
        Some(slot) if slot.parse::<usize>().is_ok() => format!("slot {slot}"),
        Some(process) if process.contains('.') => process.to_string(),
        _ => "single".to_string(),
    }
}

/// What each file gained since the last poll, as lines (labelled when there are several); the
/// last `lines` of each file when asked — of each process, not of them all together, where
/// the last file's would hide every other's (issue 80, 7).
fn poll(reading: &mut Reading, lines: Option<usize>, shown: Shown) -> std::io::Result<Vec<String>> {
    let mut all = Vec::new();
    for (label, follower) in &mut reading.files {
        let mut gained: Vec<String> = follower
            .poll()?
            .into_iter()
            .filter_map(|line| shown.line(&line.text, label.as_deref()))
            .collect();
        if let Some(keep) = lines {
            gained.drain(..gained.len().saturating_sub(keep));
        }
        all.extend(gained);
    }
    Ok(all)
}

/// Writes lines; Err when the reader went away (`| head`), which ends the command quietly.
fn write_lines(out: &mut dyn Write, lines: &[String]) -> std::io::Result<()> {
    for line in lines {
        out.write_all(line.as_bytes())?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// A whole file (an earlier release's or an older generation's), its lines as `shown`.
fn copy_whole(path: &Path, shown: Shown, out: &mut dyn Write) -> std::io::Result<()> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let lines: Vec<String> = String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|line| shown.line(line, None))
        .collect();
    write_lines(out, &lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_file_is_labelled_by_its_slot() {
        assert_eq!(
            slot_label(Path::new("/r/releases/v1/api.3.output"), "api"),
            "slot 3"
        );
        assert_eq!(
            slot_label(Path::new("/r/releases/v1/api.output"), "api"),
            "single"
        );
        assert_eq!(
            slot_label(Path::new("/r/releases/v1/api.worker.1.output"), "api"),
            "worker.1"
        );
    }

    #[test]
    fn generations_are_oldest_first_and_since_keeps_the_recent_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.output");
        for n in [0, 1, 2] {
            std::fs::write(crate::host::output::generation(&path, n), format!("{n}\n")).unwrap();
        }
        let names: Vec<String> = generations(&path, None)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["api.output.2", "api.output.1", "api.output"]);
        let future = modified(&path).unwrap() + 3600.0;
        assert!(generations(&path, Some(future)).is_empty());
    }
}
