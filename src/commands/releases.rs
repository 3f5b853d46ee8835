//! `rollgate release list`: every installed release of a root, what it is (its record: when,
//! size, digests, signed, config) and what it is to the root now (live, the watch's fallback, in
//! flight, the last good one a rollback would go to, the signed floor, running in a replica),
//! with the last outcome the log has for it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::error::Error;
use crate::host::config::Config;
use crate::host::journal::{self, LogEvent};
use crate::host::state::Root;
use crate::release::install::{file_sha256, read_record};
use crate::render::table::{Cell, Grid, Layout};
use crate::render::Format;

/// One installed release, as `release list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listed {
    pub version: String,
    /// Unix seconds: from its record, else the folder's modification time (put in by hand).
    pub installed_at: Option<f64>,
    pub size: Option<u64>,
    /// The launcher's SHA-256 (what a manifest signs).
    pub sha256: Option<String>,
    /// The whole release's digest: every file, folder and link of it (its record and output
    /// aside), so two releases that differ anywhere differ here.
    pub digest: Option<String>,
    pub signed: bool,
    /// Its configuration's digest (variables and secret names), as `config show` and the
    /// log's records name it; none when it has no config, `invalid` when its files are.
    pub config: Option<String>,
    /// The last `promoted` or `rolled_back` the log has for it.
    pub last_outcome: Option<String>,
    /// `live`, `fallback`, `in_flight`, `last_good`, `floor`, `replica`.
    pub marks: Vec<&'static str>,
    /// How its running processes are held, as the kernel says (`uid 70001, confined`); none
    /// when none of it runs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runs_as: Vec<String>,
    /// An image release: the engine's image ID it is pinned to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The process types its Procfile names, in its order (none without one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
}

/// The releases of the root, oldest install first.
pub fn releases(root: &Path) -> Result<Vec<Listed>, Error> {
    let root = Root::existing(root.to_path_buf())?;
    let folder = root.0.join("releases");
    let entries = match std::fs::read_dir(&folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::Failed(format!(
                "cannot read {}: {e}",
                folder.display()
            )))
        }
    };
    let pointer = root.read_pointer()?;
    let replicas = root.read_replicas()?;
    let service = pointer
        .as_ref()
        .map(|p| p.service.clone())
        .or_else(|| replicas.as_ref().map(|set| set.service.clone()));
    let marks = Marks::of(
        &root,
        pointer.as_ref(),
        replicas.as_ref(),
        service.as_deref(),
    )?;
    let outcomes = last_outcomes(&root)?;
    let mut listed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        // Staging folders and anything else that is no version are not releases.
        if crate::host::names::check_name("version", &name).is_err() || !entry.path().is_dir() {
            continue;
        }
        listed.push(describe(
            &entry.path(),
            &name,
            service.as_deref(),
            &marks,
            &outcomes,
        )?);
    }
    listed.sort_by(|a, b| {
        a.installed_at
            .partial_cmp(&b.installed_at)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.version.cmp(&b.version))
    });
    Ok(listed)
}

fn describe(
    dir: &Path,
    version: &str,
    service: Option<&str>,
    marks: &Marks,
    outcomes: &BTreeMap<String, String>,
) -> Result<Listed, Error> {
    let record = read_record(dir)?;
    let executable = record
        .as_ref()
        .map(|r| r.service.clone())
        .or_else(|| service.map(str::to_string))
        .map(|name| dir.join(name));
    let sha256 = match (&record, &executable) {
        (Some(record), _) => Some(record.sha256.clone()),
        (None, Some(path)) if path.is_file() => file_sha256(path).ok(),
        _ => None,
    };
    let digest = match &record {
        Some(record) => Some(record.tree_sha256.clone()),
        None => crate::release::install::digest_tree(dir)
            .ok()
            .map(|(_, _, digest)| digest),
    };
    let installed_at = record.as_ref().map(|r| r.installed_at).or_else(|| {
        let modified = std::fs::metadata(dir).and_then(|m| m.modified()).ok()?;
        Some(
            modified
                .duration_since(std::time::UNIX_EPOCH)
                .ok()?
                .as_secs_f64(),
        )
    });
    let config = match Config::of_release(dir) {
        Ok(config) if config == Config::default() => None,
        Ok(config) => Some(config.digest()),
        Err(_) => Some("invalid".to_string()),
    };
    Ok(Listed {
        version: version.to_string(),
        installed_at,
        size: record.as_ref().map(|r| r.size),
        sha256,
        digest,
        signed: dir.join(crate::release::MANIFEST_FILE).is_file(),
        config,
        last_outcome: outcomes.get(version).cloned(),
        marks: marks.of_version(version),
        runs_as: marks.held_as(version),
        image: crate::host::container::ImageRelease::of_release(dir)
            .ok()
            .flatten()
            .map(|image| image.image),
        types: crate::release::procfile::Procfile::of_release(dir)
            .ok()
            .flatten()
            .map(|p| p.types.into_iter().map(|t| t.name).collect())
            .unwrap_or_default(),
    })
}

/// What each version is to the root now.
struct Marks {
    live: Option<String>,
    fallback: Option<String>,
    in_flight: Option<String>,
    last_good: Option<String>,
    floor: Option<String>,
    replicas: Vec<String>,
    /// Every running process the root names, by version.
    running: Vec<(String, i32)>,
    /// A person stopped the service (`rollgate stop`).
    stopped: bool,
}

impl Marks {
    fn of(
        root: &Root,
        pointer: Option<&crate::host::state::Pointer>,
        replicas: Option<&crate::host::state::ReplicaSet>,
        service: Option<&str>,
    ) -> Result<Marks, Error> {
        let in_flight = match crate::engine::saved_run(root)? {
            Some(rollout) if !rollout.is_over() => Some(rollout.to),
            _ => root.read_candidate()?.map(|c| c.version),
        };
        let live = pointer.map(|p| p.version.clone());
        let last_good = match (service, &live) {
            (Some(service), Some(live)) => {
                crate::supervision::earlier::previous_release(root, service, live)
                    .ok()
                    .map(|e| e.version)
            }
            _ => None,
        };
        Ok(Marks {
            fallback: pointer
                .and_then(|p| p.fallback.as_ref())
                .map(|f| f.version.clone()),
            live,
            in_flight,
            last_good,
            floor: crate::release::read_floor(&root.0)?.map(|f| f.version),
            stopped: crate::host::stopped::read(&root.0)?.is_some(),
            replicas: replicas
                .map(|set| set.replicas.iter().map(|r| r.version.clone()).collect())
                .unwrap_or_default(),
            running: pointer
                .into_iter()
                .flat_map(|p| {
                    std::iter::once((p.version.clone(), p.pid))
                        .chain(p.fallback.iter().map(|f| (f.version.clone(), f.pid)))
                })
                .chain(
                    replicas
                        .into_iter()
                        .flat_map(|set| set.replicas.iter().map(|r| (r.version.clone(), r.pid))),
                )
                .collect(),
        })
    }

    /// How `version`'s running processes (a container's, for an image release) are held,
    /// each different way once.
    fn held_as(&self, version: &str) -> Vec<String> {
        let mut said: Vec<String> = Vec::new();
        for (_, pid) in self.running.iter().filter(|(v, _)| v == version) {
            let Some(who) = crate::host::identity::Identity::of(*pid) else {
                continue;
            };
            for held in crate::host::account::work_held_as(&who) {
                let words = held.to_string();
                if !said.contains(&words) {
                    said.push(words);
                }
            }
        }
        said
    }

    fn of_version(&self, version: &str) -> Vec<&'static str> {
        let is = |v: &Option<String>| v.as_deref() == Some(version);
        let mut marks = Vec::new();
        for (mark, yes) in [
            ("live", is(&self.live)),
            ("fallback", is(&self.fallback)),
            ("in_flight", is(&self.in_flight)),
            ("last_good", is(&self.last_good)),
            ("floor", is(&self.floor)),
            ("replica", self.replicas.iter().any(|v| v == version)),
            ("stopped", self.stopped && is(&self.live)),
        ] {
            if yes {
                marks.push(mark);
            }
        }
        marks
    }
}

/// The last outcome (`promoted`, `rolled_back`, or `refused` by its `pre_deploy` hook) of each
/// version in the root's log, read by the log's one outcomes reader from the end (the first
/// one seen of a version is its last).
fn last_outcomes(root: &Root) -> Result<BTreeMap<String, String>, Error> {
    let mut last = BTreeMap::new();
    let events = [
        LogEvent::Promoted,
        LogEvent::RolledBack,
        LogEvent::HookFailed,
    ];
    journal::events_backwards(&root.log_path(), &events, |outcome| {
        if outcome.event != LogEvent::HookFailed || outcome.is_refusal() {
            last.entry(outcome.version.clone())
                .or_insert_with(|| outcome.word().to_string());
        }
        std::ops::ControlFlow::Continue(())
    })
    .map_err(|e| Error::Failed(format!("cannot read {}: {e}", root.log_path().display())))?;
    Ok(last)
}

/// `rollgate release list`, rendered: a table (every column in a pipe) or JSON lines.
pub fn list(root: &Path, format: Format, layout: Layout) -> Result<String, Error> {
    let listed = releases(root)?;
    match format {
        Format::Json => Ok(listed
            .iter()
            .map(|l| serde_json::to_string(l).expect("a listing serializes") + "\n")
            .collect()),
        Format::Csv => {
            let mut out = String::from(
                "version,installed_at,size,digest,sha256,signed,config,last_outcome,marks,runs_as,image,types\n",
            );
            for l in &listed {
                out.push_str(&format!(
                    "{},{},{},{},{},{},{},{},{},\"{}\",{},{}\n",
                    l.version,
                    l.installed_at.map_or(String::new(), |t| format!("{t:.3}")),
                    l.size.map_or(String::new(), |s| s.to_string()),
                    l.digest.as_deref().unwrap_or(""),
                    l.sha256.as_deref().unwrap_or(""),
                    l.signed,
                    l.config.as_deref().unwrap_or(""),
                    l.last_outcome.as_deref().unwrap_or(""),
                    l.marks.join(" "),
                    l.runs_as.join("; "),
                    l.image.as_deref().unwrap_or(""),
                    l.types.join(" "),
                ));
            }
            Ok(out)
        }
        Format::Table => {
            if listed.is_empty() {
                return Ok("no releases installed\n".into());
            }
            let short = |d: &Option<String>| {
                d.as_deref()
                    .map_or("-".into(), |d| d[..d.len().min(12)].to_string())
            };
            let mut grid = Grid::new(
                [
                    "version",
                    "installed",
                    "size",
                    "digest",
                    "signed",
                    "config",
                    "last_outcome",
                    "marks",
                    "runs as",
                    "image",
                    "types",
                ],
                &[
                    "version",
                    "installed",
                    "digest",
                    "last_outcome",
                    "marks",
                    "runs as",
                ],
            );
            for l in &listed {
                grid.push(vec![
                    l.version.as_str().into(),
                    Cell::Time(l.installed_at),
                    l.size.map_or("-".into(), |s| s.to_string()).into(),
                    short(&l.digest).into(),
                    if l.signed { "yes" } else { "no" }.into(),
                    l.config.as_deref().unwrap_or("-").into(),
                    l.last_outcome.clone().unwrap_or_else(|| "-".into()).into(),
                    l.marks.join(", ").into(),
                    match l.runs_as.is_empty() {
                        true => "-".to_string(),
                        false => l.runs_as.join("; "),
                    }
                    .into(),
                    // `sha256:` and the first 12 digits, as `docker images` shows an ID.
                    l.image
                        .as_deref()
                        .map_or("-".into(), |id| id[..id.len().min(19)].to_string())
                        .into(),
                    match l.types.is_empty() {
                        true => "-".to_string(),
                        false => l.types.join(", "),
                    }
                    .into(),
                ]);
            }
            Ok(grid.render(layout))
        }
    }
}

/// What `release prune` removed (or, dry, would remove), and what it kept for a reason.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pruned {
    pub removed: Vec<String>,
    /// Older than the newest `keep`, kept all the same: (version, why).
    pub protected: Vec<(String, String)>,
    /// Images rollgate installed that no root keeps any more, removed from the engine.
    pub images: Vec<String>,
}

/// `rollgate release prune --keep N [--dry-run]`: keeps the newest `keep` releases and every
/// older one that is live, a fallback, in flight, running in a replica, the last good one or
/// the floor; removes the rest, oldest first, each crash-safely (renamed out of `releases/`
/// first). Under the root's lock, so no deploy picks a release while it goes.
pub fn prune(root: &Path, keep: usize, dry_run: bool) -> Result<Pruned, Error> {
    prune_releases(root, keep, dry_run, false)
}

/// `prune`; after a promotion (`spare_undeployed`) a release the log has never seen deployed
/// is kept too: one installed ahead of its turn (the demo's five, a queue of builds) is the
/// operator's plan, not history.
fn prune_releases(
    root: &Path,
    keep: usize,
    dry_run: bool,
    spare_undeployed: bool,
) -> Result<Pruned, Error> {
    let state = Root::existing(root.to_path_buf())?;
    let _lock = crate::host::lock::acquire(&state.lock_path())?;
    prune_locked(&state, keep, dry_run, spare_undeployed)
}

/// `prune_releases` with the root's lock held by the caller.
fn prune_locked(
    state: &Root,
    keep: usize,
    dry_run: bool,
    spare_undeployed: bool,
) -> Result<Pruned, Error> {
    let root = state.0.as_path();
    let folder = state.0.join("releases");
    if !dry_run {
        crate::release::install::remove_dead_stagings(&folder);
    }
    let listed = releases(root)?;
    let older = listed.len().saturating_sub(keep);
    let mut pruned = Pruned::default();
    for release in &listed[..older] {
        if spare_undeployed && release.last_outcome.is_none() {
            pruned
                .protected
                .push((release.version.clone(), "never deployed".into()));
        } else if release.marks.is_empty() {
            if !dry_run {
                pruned
                    .images
                    .extend(remove_installed(state, &release.version)?);
            }
            pruned.removed.push(release.version.clone());
        } else {
            pruned
                .protected
                .push((release.version.clone(), release.marks.join(", ")));
        }
    }
    Ok(pruned)
}

/// Removes one installed release crash-safely (renamed out of `releases/` first), and its
/// image from the engine when nothing else holds it (what was removed is returned, said).
/// The caller holds the root's lock and has found the release unmarked.
fn remove_installed(root: &Root, version: &str) -> Result<Option<String>, Error> {
    let folder = root.0.join("releases");
    let image = crate::host::container::ImageRelease::of_release(&folder.join(version))
        .ok()
        .flatten();
    crate::release::install::remove(&folder, version)?;
    Ok(image.and_then(|image| forget_unless_kept(&folder, &root.0, &image.image)))
}

/// `rollgate release rm VERSION [--dry-run]`: one release removed, whatever its age — a broken
/// build that never went live frees its version name — unless it is live, a fallback, in
/// flight, running in a replica, the last good one or the signed floor (refused, exit 2, with
/// the marks that keep it). Under the root's lock, as `prune`.
pub fn remove(root: &Path, version: &str, dry_run: bool) -> Result<Pruned, Error> {
    let state = Root::existing(root.to_path_buf())?;
    let _lock = crate::host::lock::acquire(&state.lock_path())?;
    let listed = releases(root)?;
    let Some(release) = listed.iter().find(|r| r.version == version) else {
        return Err(Error::Refused(format!(
            "no release {version} is installed in {}/releases; `rollgate release list` names them",
            root.display()
        )));
    };
    if !release.marks.is_empty() {
        return Err(Error::Refused(format!(
            "{version} is {}: not removed (roll back or deploy another release first)",
            release.marks.join(", ")
        )));
    }
    let mut pruned = Pruned::default();
    if !dry_run {
        pruned.images.extend(remove_installed(&state, version)?);
    }
    pruned.removed.push(version.to_string());
    Ok(pruned)
}

/// The root no longer holds `image` unless another of its releases runs it; then the engine
/// removes it if rollgate installed it and no other root holds it (`container::forget`).
fn forget_unless_kept(releases: &Path, root: &Path, image: &str) -> Option<String> {
    let still_held = std::fs::read_dir(releases)
        .into_iter()
        .flatten()
        .flatten()
        // A release renamed out for removal (`.removing-*`, its files deleted in the
        // background) or being staged holds nothing.
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            crate::host::container::ImageRelease::of_release(&e.path())
                .ok()
                .flatten()
        })
        .any(|other| other.image == image);
    match still_held {
        true => None,
        false => crate::host::container::forget(image, root),
    }
}

/// Starts a run through the engine's front door, handing it the run's tail: once its release
/// went live, the policy's `keep_releases` (a deploy and a rollout alike), then keepers for
/// whatever runs — done by the engine under the run's own lock.
pub(crate) fn start_then_prune(
    mut start: crate::engine::Start,
    policy: Option<&crate::policy::RolloutSettings>,
) -> Result<crate::engine::Outcome, Error> {
    let keep = policy
        .and_then(|p| p.keep_releases)
        .unwrap_or(crate::defaults::KEEP_RELEASES as u64);
    start.tail = Some(Box::new(AfterARun { keep }));
    crate::engine::start(start)
}

/// A run's tail, under the engine's lock: a promoted release's old ones pruned, then every
/// process the state names running and kept.
struct AfterARun {
    /// The policy's `keep_releases` (0: none pruned).
    keep: u64,
}

impl crate::engine::Tail for AfterARun {
    fn after<'a>(
        &'a self,
        root: &'a Root,
        outcome: &'a crate::engine::Outcome,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + 'a>> {
        Box::pin(async move {
            if outcome.went_live() {
                prune_after_promotion(root, self.keep);
            }
            crate::supervision::supervise::after_a_run(root).await;
        })
    }
}

/// The policy's `keep_releases` applied once a release is promoted (`defaults::KEEP_RELEASES`
/// when the policy does not say; nothing when it asks 0), the root's lock held by the caller.
/// What is removed is said on stderr; a prune that fails is said and left for the next
/// promotion: the promotion stands either way.
fn prune_after_promotion(root: &Root, keep: u64) {
    if keep == 0 {
        return;
    }
    match prune_locked(root, keep as usize, false, true) {
        Ok(pruned) if !pruned.removed.is_empty() => {
            eprintln!(
                "rollgate: keep_releases = {keep}: removed {}",
                pruned.removed.join(" ")
            );
            for image in &pruned.images {
                eprintln!("rollgate: keep_releases = {keep}: {image}");
            }
        }
        Ok(_) => {}
        Err(e) => eprintln!("rollgate: keep_releases = {keep}: not pruned now: {e}"),
    }
}

/// What `release prune` says.
pub fn said(pruned: &Pruned, dry_run: bool) -> String {
    let mut out = String::new();
    let verb = if dry_run { "would remove" } else { "removed" };
    match pruned.removed.as_slice() {
        [] => out.push_str("nothing to remove\n"),
        versions => out.push_str(&format!("{verb}: {}\n", versions.join(" "))),
    }
    for (version, why) in &pruned.protected {
        out.push_str(&format!("kept {version}: {why}\n"));
    }
    for image in &pruned.images {
        out.push_str(&format!("{image}\n"));
    }
    out
}
