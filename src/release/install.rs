//! `rollgate release add`: a release installed whole or not at all.
//!
//! The source (an executable file, a folder, or a `.tar.gz`/`.tgz` archive of a folder) is
//! copied into a staging folder inside `releases/` whose name starts with a dot, so no version
//! can name it and no deploy or listing ever sees it; every file and folder is synced, the
//! release's record (`release.json`) written, and then one `rename(2)` (with
//! `RENAME_NOREPLACE`, so two installs of one version cannot both win) makes the version appear
//! whole. A crash at any moment leaves either nothing or a whole release; a staging folder left
//! by a dead installer is removed by the next `release add`.
//!
//! An archive is read entry by entry and refused, with nothing installed, for any entry that is
//! absolute, climbs out with `..`, is a symlink or hard link leading outside the release, is a
//! device, fifo or socket, or would replace `release.json`; for a truncated or corrupt archive;
//! and beyond [`MAX_BYTES`] of content or [`MAX_ENTRIES`] entries.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::host::names::check_name;

/// The most content an installed release may hold (uncompressed): 2 GiB.
pub const MAX_BYTES: u64 = crate::defaults::RELEASE_MAX_BYTES;
/// The most entries (files, folders, links) an archive may hold.
pub const MAX_ENTRIES: usize = crate::defaults::RELEASE_MAX_ENTRIES;
/// Each release's record of itself.
pub const RECORD_FILE: &str = "release.json";
/// Staging folders' names begin with this (a dot: never a version).
const STAGING_PREFIX: &str = ".staging-";

/// `releases/VERSION/release.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub service: String,
    pub version: String,
    /// Unix seconds.
    pub installed_at: f64,
    /// Where it was installed from, as given (made absolute).
    pub source: String,
    /// `file`, `folder` or `archive`.
    pub kind: String,
    /// Bytes of content (regular files), and how many files.
    pub size: u64,
    pub files: u64,
    /// SHA-256 of the executable, hex.
    pub sha256: String,
    /// SHA-256 over every entry of the tree (path, kind, mode, content digest) but this
    /// record: two installs of the same bytes have the same tree digest.
    pub tree_sha256: String,
    /// Installed with `--manifest` and verified against the root's trust file.
    #[serde(default)]
    pub signed: bool,
}

/// What `release add` did.
#[derive(Debug, Clone, PartialEq)]
pub enum Installed {
    New(Record),
    /// The version was there already with exactly these bytes: nothing changed.
    Already(Record),
}

/// What to install.
pub struct Request<'a> {
    pub root: &'a Path,
    pub service: &'a str,
    pub version: &'a str,
    pub source: &'a Path,
    pub manifest: Option<&'a Path>,
    pub now: f64,
    /// The most content bytes and entries the release may hold ([`MAX_BYTES`],
    /// [`MAX_ENTRIES`] unless asked otherwise).
    pub max_bytes: u64,
    pub max_entries: usize,
}

fn refused(text: impl Into<String>) -> Error {
    Error::Refused(text.into())
}

fn failed(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Failed(format!("cannot {what} {}: {e}", path.display()))
}

/// Installs a release (see the module's comment). Refusals change nothing (exit 2).
pub fn add(request: &Request) -> Result<Installed, Error> {
    check_name("service", request.service)?;
    check_name("version", request.version)?;
    let releases = request.root.join("releases");
    fs::create_dir_all(&releases).map_err(|e| failed("create", &releases, e))?;
    in_staging(&releases, request.version, |staging| {
        stage_and_rename(request, &releases, staging)
    })
}

/// Runs `build` with a fresh staging folder for `version` inside `releases/` (a dead
/// installer's leftovers removed first), and removes the staging folder afterwards whatever
/// happened (after a rename it holds only leftovers).
fn in_staging<T>(
    releases: &Path,
    version: &str,
    build: impl FnOnce(&Path) -> Result<T, Error>,
) -> Result<T, Error> {
    remove_dead_stagings(releases);
    let staging = releases.join(format!("{STAGING_PREFIX}{version}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir(&staging).map_err(|e| failed("create", &staging, e))?;
    let result = build(&staging);
    let _ = fs::remove_dir_all(&staging);
    result
}

/// Writes the record into the staged `tree`, syncs the tree, and renames it in as
/// `releases/VERSION` in one `rename(2)` that never replaces anything. False when the version
/// appeared meanwhile (another install won).
fn seal(releases: &Path, tree: &Path, record: &Record) -> Result<bool, Error> {
    let text = serde_json::to_string_pretty(record).expect("a record serializes") + "\n";
    write_new(&tree.join(RECORD_FILE), text.as_bytes())?;
    sync_everything_under(tree)?;
    let target = releases.join(&record.version);
    match nix::fcntl::renameat2(
        None,
        tree,
        None,
        &target,
        nix::fcntl::RenameFlags::RENAME_NOREPLACE,
    ) {
        Ok(()) => {}
        Err(nix::errno::Errno::EEXIST) => return Ok(false),
        Err(e) => return Err(failed("rename into", &target, e.into())),
    }
    sync_dir(releases)?;
    Ok(true)
}

fn stage_and_rename(
    request: &Request,
    releases: &Path,
    staging: &Path,
) -> Result<Installed, Error> {
    let image = request
        .source
        .to_str()
        .and_then(crate::host::container::ImageSource::parse);
    let source = match &image {
        Some(image) => PathBuf::from(image.describe()),
        None => std::path::absolute(request.source).unwrap_or(request.source.to_path_buf()),
    };
    let content = staging.join("content");
    let kind = match &image {
        Some(image) => fill_image(image, &content, request.service, request.root)?,
        None => fill(
            &source,
            &content,
            request.service,
            request.root,
            &mut Budget::of(request),
        )?,
    };
    // An archive of a folder may hold the folder itself: its one top entry is the release.
    let tree = release_root(&content, request.service);
    refuse_operator_files(&tree, &source)?;
    // A Procfile is checked now, line by line, not at its first deploy.
    let procfile_path = source.join(super::procfile::PROCFILE);
    let procfile = super::procfile::Procfile::of_release_shown_as(&tree, &procfile_path)?;
    let web_line = procfile
        .as_ref()
        .and_then(|p| p.line_of(super::procfile::WEB));
    let executable = tree.join(request.service);
    // What the release runs: its executable at the top, or its Procfile's `web:` — not both. A
    // folder named like the service beside a `web:` line is the application's own (Django's
    // project package `shop/` for service `shop`), not an executable.
    let at_top = fs::symlink_metadata(&executable);
    let folder_at_top = at_top.as_ref().is_ok_and(|meta| meta.is_dir());
    let what_runs = match (at_top, web_line) {
        (_, Some(_)) if folder_at_top => tree.join(super::procfile::PROCFILE),
        (Err(_), Some(_)) => tree.join(super::procfile::PROCFILE),
        (Err(_), None) => {
            return Err(refused(format!(
                "{}: the release has no executable `{}` at its top, nor a Procfile with a `web:` line",
                source.display(),
                request.service
            )))
        }
        (Ok(_), Some(line)) => {
            return Err(refused(format!(
                "{}: the release has both an executable `{}` at its top and a `web:` line ({}:{line}); keep one",
                source.display(),
                request.service,
                procfile_path.display()
            )))
        }
        (Ok(meta), None) if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 => {
            return Err(refused(format!(
                "{}: `{}` in the release is not an executable file (chmod +x it)",
                source.display(),
                request.service
            )))
        }
        (Ok(_), None) => executable.clone(),
    };
    if web_line.is_some() && request.manifest.is_some() {
        return Err(refused(format!(
            "{}: a signed release runs the executable its manifest names; a Procfile `web:` line is not signed for",
            source.display()
        )));
    }
    let signed = match request.manifest {
        Some(manifest) => {
            verify_manifest(request, manifest, &tree)?;
            true
        }
        None => false,
    };
    // Said, not refused: a release that runs unconfined, or never runs those scripts, is fine.
    let installed_at = std::path::absolute(releases.join(request.version))
        .unwrap_or_else(|_| releases.join(request.version));
    let stranded = super::shebang::stranded(&tree, &installed_at, 5);
    if !stranded.is_empty() {
        eprintln!("{}", super::shebang::words(request.version, &stranded));
    }
    let (size, files, tree_sha256) = digest_tree(&tree)?;
    let record = Record {
        service: request.service.into(),
        version: request.version.into(),
        installed_at: request.now,
        source: source.display().to_string(),
        kind: kind.into(),
        size,
        files,
        sha256: file_sha256(&what_runs)?,
        tree_sha256,
        signed,
    };
    let target = releases.join(request.version);
    if target.exists() {
        return already(&target, &record);
    }
    if !seal(releases, &tree, &record)? {
        return already(&target, &record);
    }
    Ok(Installed::New(record))
}

/// Files of a release folder that only the operator gives (`config set`), refused in what a
/// release ships: its `secrets` map would let it name any secret of the root for itself (the
/// registry's login among them), and `config.from` would pass its own config off as the
/// service's. Its `env` file is read now as a deploy will read it (beneath the folder, never
/// through a link), so a wrong one is refused at its line before anything is installed.
fn refuse_operator_files(tree: &Path, source: &Path) -> Result<(), Error> {
    use crate::host::config::{Config, ADOPTED_FILE, SECRETS_FILE};
    for (name, why) in [
        (
            SECRETS_FILE,
            "a release's secrets are given by the operator (`rollgate config set --secret KEY=NAME`), never shipped",
        ),
        (
            ADOPTED_FILE,
            "it is rollgate's record of config given at a deploy, never shipped",
        ),
    ] {
        if fs::symlink_metadata(tree.join(name)).is_ok() {
            return Err(refused(format!(
                "{}: the release ships `{name}`: {why}; nothing was installed",
                source.display()
            )));
        }
    }
    Config::of_release(tree).map(|_| ()).map_err(|e| {
        refused(format!(
            "{}: {}; nothing was installed",
            source.display(),
            e.0
        ))
    })
}

/// A new release made from an installed one (`config set`): every file of `from` hard-linked
/// (the executable is shared, not copied), its folders made anew, `replace`d files written in
/// their place (an empty text: the file left out), its own record; staged and renamed in as
/// `add` does, so it too is absent or whole.
pub fn derive(
    root: &Path,
    service: &str,
    from: &str,
    version: &str,
    replace: &[(&str, String)],
    now: f64,
) -> Result<Record, Error> {
    check_name("version", version)?;
    let releases = root.join("releases");
    let source = releases.join(from);
    in_staging(&releases, version, |staging| {
        let tree = staging.join("content");
        fs::create_dir_all(&tree).map_err(|e| failed("create", &tree, e))?;
        let skipped: Vec<&str> = replace
            .iter()
            .map(|(name, _)| *name)
            .chain([RECORD_FILE])
            .collect();
        link_tree(&source, &source, &tree, &skipped)?;
        for (name, text) in replace.iter().filter(|(_, text)| !text.is_empty()) {
            write_new(&tree.join(name), text.as_bytes())?;
        }
        let executable = tree.join(service);
        let (size, files, tree_sha256) = digest_tree(&tree)?;
        let record = Record {
            service: service.into(),
            version: version.into(),
            installed_at: now,
            source: format!("config set from {from}"),
            kind: "config".into(),
            size,
            files,
            sha256: file_sha256(&executable)?,
            tree_sha256,
            signed: tree.join(super::MANIFEST_FILE).is_file(),
        };
        if !seal(&releases, &tree, &record)? {
            return Err(refused(format!(
                "release {version} appeared while it was being made; run config set again"
            )));
        }
        Ok(record)
    })
}

/// Hard-links every file of `from` into `to` (folders made, symlinks copied), leaving out the
/// top-level names in `skipped` and the release's `*.output` files.
fn link_tree(top: &Path, from: &Path, to: &Path, skipped: &[&str]) -> Result<(), Error> {
    for entry in fs::read_dir(from)
        .map_err(|e| failed("read", from, e))?
        .flatten()
    {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().to_string();
        if from == top
            && (skipped.contains(&name.as_str()) || crate::host::output::is_output_file(&name))
        {
            continue;
        }
        let target = to.join(&name);
        let meta = fs::symlink_metadata(&path).map_err(|e| failed("read", &path, e))?;
        if meta.is_dir() {
            fs::create_dir(&target).map_err(|e| failed("create", &target, e))?;
            fs::set_permissions(&target, meta.permissions())
                .map_err(|e| failed("chmod", &target, e))?;
            link_tree(top, &path, &target, skipped)?;
        } else if meta.file_type().is_symlink() {
            let link = fs::read_link(&path).map_err(|e| failed("read", &path, e))?;
            std::os::unix::fs::symlink(&link, &target).map_err(|e| failed("link", &target, e))?;
        } else if meta.is_file() {
            fs::hard_link(&path, &target).map_err(|e| failed("link", &target, e))?;
        }
    }
    Ok(())
}

/// An existing version: the same bytes are "already installed", other bytes are refused.
fn already(target: &Path, record: &Record) -> Result<Installed, Error> {
    let (_, _, existing) = digest_tree(target)?;
    if existing == record.tree_sha256 {
        let installed = read_record(target)?.unwrap_or_else(|| record.clone());
        return Ok(Installed::Already(installed));
    }
    Err(refused(format!(
        "release {} is already installed at {} with other content (tree sha256 {} against {}); pick another version name",
        record.version,
        target.display(),
        short(&existing),
        short(&record.tree_sha256)
    )))
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

/// A release's record, if it has one (a release put in by hand has none).
pub fn read_record(dir: &Path) -> Result<Option<Record>, Error> {
    crate::host::files::read_json(&dir.join(RECORD_FILE)).map_err(|e| Error::Invalid(e.to_string()))
}

/// Copies the source into `content`; says what kind of source it was.
fn fill(
    source: &Path,
    content: &Path,
    service: &str,
    root: &Path,
    budget: &mut Budget,
) -> Result<&'static str, Error> {
    let meta = fs::metadata(source)
        .map_err(|e| refused(format!("{}: cannot read it: {e}", source.display())))?;
    let name = source.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if meta.is_dir() {
        copy_folder(source, source, content, root, budget)?;
        return Ok("folder");
    }
    if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
        unpack(source, content, root, budget)?;
        return Ok("archive");
    }
    if !meta.is_file() {
        return Err(refused(format!(
            "{}: not a file, a folder or a .tar.gz/.tgz archive",
            source.display()
        )));
    }
    fs::create_dir(content).map_err(|e| failed("create", content, e))?;
    copy_file(source, &content.join(service), 0o755, budget)?;
    Ok("file")
}

/// A container release (issue 60): the image loaded into the Docker Engine, and a folder that
/// pins it — `image.json` (its image ID and source) and the launcher `SERVICE`, which names the
/// same digest (so a manifest signing the release pins the image).
fn fill_image(
    image: &crate::host::container::ImageSource,
    content: &Path,
    service: &str,
    root: &Path,
) -> Result<&'static str, Error> {
    use crate::host::container;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Failed(format!("cannot start the engine's client: {e}")))?;
    let credentials = match image {
        container::ImageSource::Registry { repository, .. } => {
            let secrets = crate::host::config::secrets_dir(root);
            container::registry_credentials(&secrets, repository).map_err(refused)?
        }
        _ => None,
    };
    let installed = runtime
        .block_on(container::install(image, credentials))
        .map_err(|e| refused(format!("{}: {e}", image.describe())))?;
    // Claimed for the root from now (retention keeps what a root holds; a claim whose
    // release never lands only keeps an image a little longer).
    container::claim(&installed.image, root, installed.fresh);
    let id = installed.image;
    let record = container::ImageRelease {
        image: id.clone(),
        source: image.describe(),
        repo_digest: installed.repo_digest,
    };
    fs::create_dir(content).map_err(|e| failed("create", content, e))?;
    let text = serde_json::to_string_pretty(&record).expect("an image record serializes") + "\n";
    write_new(&content.join(container::IMAGE_FILE), text.as_bytes())?;
    let launcher = content.join(service);
    write_new(&launcher, container::launcher(&id).as_bytes())?;
    fs::set_permissions(&launcher, fs::Permissions::from_mode(0o755))
        .map_err(|e| failed("make executable", &launcher, e))?;
    Ok("image")
}

/// The folder to rename in: `content` itself, or its one top folder when the executable is
/// inside that folder and not at the top (`tar czf app.tgz app/`).
fn release_root(content: &Path, service: &str) -> PathBuf {
    if content.join(service).exists() {
        return content.to_path_buf();
    }
    let entries: Vec<PathBuf> = fs::read_dir(content)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    match entries.as_slice() {
        [only] if only.is_dir() && only.join(service).exists() => only.clone(),
        _ => content.to_path_buf(),
    }
}

/// Counts what a source holds against the limits.
struct Budget {
    bytes: u64,
    entries: usize,
    max_bytes: u64,
    max_entries: usize,
}

impl Budget {
    /// A budget with the same limits and nothing counted yet.
    fn of_limits(other: &Budget) -> Budget {
        Budget {
            bytes: 0,
            entries: 0,
            max_bytes: other.max_bytes,
            max_entries: other.max_entries,
        }
    }

    fn of(request: &Request) -> Budget {
        Budget {
            bytes: 0,
            entries: 0,
            max_bytes: request.max_bytes,
            max_entries: request.max_entries,
        }
    }

    fn entry(&mut self, what: &Path) -> Result<(), Error> {
        self.entries += 1;
        if self.entries > self.max_entries {
            return Err(refused(format!(
                "{}: more than {} entries (--max-entries); nothing was installed",
                what.display(),
                self.max_entries
            )));
        }
        Ok(())
    }

    fn bytes(&mut self, n: u64, what: &Path) -> Result<(), Error> {
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes > self.max_bytes {
            return Err(refused(format!(
                "{}: more than {} bytes of content (--max-bytes); nothing was installed",
                what.display(),
                self.max_bytes
            )));
        }
        Ok(())
    }
}

/// Copies `from` to `to` (created with `mode`), counting its bytes. Not synced here: the
/// whole staged tree is, once, before it is renamed into place ([`seal`]).
fn copy_file(from: &Path, to: &Path, mode: u32, budget: &mut Budget) -> Result<(), Error> {
    let input = File::open(from).map_err(|e| refused(format!("{}: {e}", from.display())))?;
    let mut output = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(to)
        .map_err(|e| failed("create", to, e))?;
    // The kernel copies (copy_file_range, a reflink where the filesystem shares extents),
    // never more than the budget has left: a file that grows meanwhile is cut and refused.
    let left = budget.max_bytes.saturating_sub(budget.bytes);
    let copied = std::io::copy(&mut input.take(left.saturating_add(1)), &mut output)
        .map_err(|e| refused(format!("{}: cannot copy it: {e}", from.display())))?;
    budget.bytes(copied, from)?;
    // The umask may have taken bits the source had.
    fs::set_permissions(to, fs::Permissions::from_mode(mode)).map_err(|e| failed("chmod", to, e))
}

fn copy_counted(
    input: &mut impl Read,
    output: &mut impl Write,
    what: &Path,
    budget: &mut Budget,
) -> Result<(), Error> {
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = input
            .read(&mut buffer)
            .map_err(|e| refused(format!("{}: cannot read: {e}", what.display())))?;
        if n == 0 {
            return Ok(());
        }
        budget.bytes(n as u64, what)?;
        output.write_all(&buffer[..n]).map_err(|e| {
            Error::Failed(format!("cannot write a copy of {}: {e}", what.display()))
        })?;
    }
}

/// Copies a folder whole: files with their modes (set-id bits dropped), folders, and symlinks
/// that stay inside it.
fn copy_folder(
    top: &Path,
    from: &Path,
    to: &Path,
    root: &Path,
    budget: &mut Budget,
) -> Result<(), Error> {
    fs::create_dir(to).map_err(|e| failed("create", to, e))?;
    let read = |e: std::io::Error| refused(format!("{}: {e}", from.display()));
    let mut entries: Vec<fs::DirEntry> = fs::read_dir(from)
        .map_err(read)?
        .collect::<Result<_, _>>()
        .map_err(read)?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        budget.entry(&path)?;
        let target = to.join(entry.file_name());
        let meta =
            fs::symlink_metadata(&path).map_err(|e| refused(format!("{}: {e}", path.display())))?;
        let kind = meta.file_type();
        if kind.is_dir() {
            copy_folder(top, &path, &target, root, budget)?;
        } else if kind.is_file() {
            copy_file(&path, &target, meta.permissions().mode() & 0o777, budget)?;
        } else if kind.is_symlink() {
            let link =
                fs::read_link(&path).map_err(|e| refused(format!("{}: {e}", path.display())))?;
            let inside = path.strip_prefix(top).unwrap_or(&path);
            if let Err(why) = link_allowed(inside, &link, root) {
                return Err(refused(format!(
                    "{}: a symlink to {} {why}",
                    path.display(),
                    link.display()
                )));
            }
            std::os::unix::fs::symlink(&link, &target).map_err(|e| failed("link", &target, e))?;
        } else {
            return Err(refused(format!(
                "{}: a device, fifo or socket cannot be part of a release",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Where an archive entry's path lands inside the release, or why it may not.
fn entry_path(path: &Path) -> Result<PathBuf, String> {
    let mut clean = PathBuf::new();
    for part in path.components() {
        match part {
            Component::Normal(name) => clean.push(name),
            Component::CurDir => {}
            Component::ParentDir => return Err("climbs out with `..`".into()),
            Component::RootDir | Component::Prefix(_) => return Err("is absolute".into()),
        }
    }
    Ok(clean)
}

/// Whether a symlink at `at` (its path inside the release) to `target` may be installed, or
/// why not. Allowed: a relative link that stays inside the release (`venv/bin/python ->
/// python3`, `node_modules/.bin/x -> ../x/cli.js`), and an absolute link into a folder of the
/// system that every confined release reads and none writes ([`SYSTEM_FOLDERS`]:
/// `venv/bin/python3 -> /usr/bin/python3`, a virtual environment's interpreter). Refused: a
/// relative link that climbs out of the release (where it lands depends on where the release
/// sits: another release, the root's secrets), and an absolute link anywhere else — the root,
/// `/proc` (whose `self/root` reaches every path again), `/dev`, `/sys`, `/run`, `/tmp`,
/// `/var`, `/home`. A link grants nothing by itself (the release's process opens what it
/// points at with its own rights), and rollgate never follows one inside a release
/// (`host::beneath`); refusing the rest keeps a release from even naming them.
fn link_allowed(at: &Path, target: &Path, _root: &Path) -> Result<(), String> {
    if !target.is_absolute() {
        return match stays_inside(at, target) {
            true => Ok(()),
            false => Err("leads outside the release".into()),
        };
    }
    let mut clean = PathBuf::new();
    for part in target.components() {
        match part {
            Component::Normal(name) => clean.push(name),
            Component::RootDir => clean.push("/"),
            Component::CurDir => {}
            // `..` in an absolute link is refused outright: `/usr/../proc` is not /usr.
            Component::ParentDir | Component::Prefix(_) => {
                return Err(
                    "climbs with `..`; an absolute link must name its target plainly".into(),
                )
            }
        }
    }
    if SYSTEM_FOLDERS
        .iter()
        .any(|folder| clean.starts_with(folder))
    {
        return Ok(());
    }
    // A virtual environment's interpreter, made by a Python outside the system (pyenv, conda,
    // a home folder): a confined release could not run it, and its scripts would fail with a
    // bare "Permission denied" (126) at the first deploy (issue 81).
    let interpreter = at.parent().is_some_and(|bin| bin.ends_with("bin"))
        && at
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("python"));
    let way_out = match interpreter {
        true => {
            "a virtual environment's interpreter: make the environment with the system's \
                 Python (/usr/bin/python3 -m venv), or with --copies so the interpreter ships \
                 inside the release"
        }
        false => "ship the file inside the release or link to a relative path",
    };
    Err(format!(
        "leads out of the release to a place that is not a folder of the system ({}); {way_out}",
        SYSTEM_FOLDERS.join(", ")
    ))
}

/// Where an absolute link of a release may lead: the folders of the system a confined release
/// reads and executes (Landlock, `host::confine`) and that no release can write.
pub const SYSTEM_FOLDERS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

fn stays_inside(at: &Path, target: &Path) -> bool {
    if target.is_absolute() {
        return false;
    }
    let mut depth: i64 = at.parent().map_or(0, |p| p.components().count() as i64);
    for part in target.components() {
        match part {
            Component::Normal(_) => depth += 1,
            Component::ParentDir => depth -= 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return false,
        }
        if depth < 0 {
            return false;
        }
    }
    true
}

/// Unpacks a gzip-compressed tar archive into `content`, refusing any hostile entry.
// Long on purpose: one pass over a hostile archive, each entry checked (kind, path, size,
// count) before a byte of it is written; the checks stay beside the loop that streams it.
fn unpack(archive: &Path, content: &Path, root: &Path, budget: &mut Budget) -> Result<(), Error> {
    let file = File::open(archive).map_err(|e| refused(format!("{}: {e}", archive.display())))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    fs::create_dir(content).map_err(|e| failed("create", content, e))?;
    let bad = |what: String| {
        refused(format!(
            "{}: {what}; nothing was installed",
            archive.display()
        ))
    };
    let entries = tar
        .entries()
        .map_err(|e| bad(format!("not a readable .tar.gz archive ({e})")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("a truncated or corrupt archive ({e})")))?;
        let raw = entry
            .path()
            .map_err(|e| bad(format!("an entry's name cannot be read ({e})")))?
            .into_owned();
        budget.entry(archive)?;
        let name =
            entry_path(&raw).map_err(|why| bad(format!("entry `{}` {why}", raw.display())))?;
        if name.as_os_str().is_empty() {
            continue;
        }
        if name.file_name().is_some_and(|n| n == RECORD_FILE) && name.components().count() <= 2 {
            return Err(bad(format!(
                "entry `{}` would replace the release's own {RECORD_FILE}",
                raw.display()
            )));
        }
        let target = content.join(&name);
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            tar::EntryType::XGlobalHeader
                | tar::EntryType::XHeader
                | tar::EntryType::GNULongName
                | tar::EntryType::GNULongLink
        ) {
            continue;
        }
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(|e| failed("create", parent, e))?;
            refuse_link_in_path(content, parent, archive)?;
        }
        match kind {
            tar::EntryType::Directory => {
                fs::create_dir_all(&target).map_err(|e| failed("create", &target, e))?;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                // Set-id and sticky bits are dropped: a release runs as whoever deploys it.
                let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
                let mut output = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&target)
                    .map_err(|_| {
                        bad(format!(
                            "entry `{}` appears twice or replaces a folder",
                            raw.display()
                        ))
                    })?;
                // The header's size is counted before a byte is read: an entry that claims
                // more than the limit is refused at once.
                budget.bytes(entry.header().size().unwrap_or(u64::MAX), archive)?;
                let mut unlimited = Budget {
                    max_bytes: u64::MAX,
                    ..Budget::of_limits(budget)
                };
                copy_counted(&mut entry, &mut output, archive, &mut unlimited)
                    .map_err(|e| bad(format!("a truncated or corrupt archive ({e})")))?;
                fs::set_permissions(&target, fs::Permissions::from_mode(mode))
                    .map_err(|e| failed("chmod", &target, e))?;
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .ok_or_else(|| bad(format!("symlink `{}` has no target", raw.display())))?
                    .into_owned();
                if let Err(why) = link_allowed(&name, &link, root) {
                    return Err(bad(format!(
                        "symlink `{}` -> `{}` {why}",
                        raw.display(),
                        link.display()
                    )));
                }
                std::os::unix::fs::symlink(&link, &target)
                    .map_err(|_| bad(format!("entry `{}` appears twice", raw.display())))?;
            }
            tar::EntryType::Link => {
                let link = entry
                    .link_name()
                    .ok()
                    .flatten()
                    .ok_or_else(|| bad(format!("hard link `{}` has no target", raw.display())))?
                    .into_owned();
                let source = entry_path(&link).map_err(|why| {
                    bad(format!(
                        "hard link `{}` -> `{}` {why}",
                        raw.display(),
                        link.display()
                    ))
                })?;
                let source = content.join(source);
                let meta = fs::symlink_metadata(&source).ok().filter(|m| m.is_file());
                if meta.is_none() {
                    return Err(bad(format!(
                        "hard link `{}` -> `{}` names no file of the release",
                        raw.display(),
                        link.display()
                    )));
                }
                refuse_link_in_path(content, source.parent().unwrap_or(content), archive)?;
                fs::hard_link(&source, &target)
                    .map_err(|_| bad(format!("entry `{}` appears twice", raw.display())))?;
            }
            other => {
                return Err(bad(format!(
                    "entry `{}` is a {} (a device, fifo or socket cannot be part of a release)",
                    raw.display(),
                    kind_name(other)
                )))
            }
        }
    }
    Ok(())
}

/// Refuses to write through a symlinked folder: an entry `a/x` after a symlink `a -> ..`
/// would land outside the release.
fn refuse_link_in_path(content: &Path, folder: &Path, archive: &Path) -> Result<(), Error> {
    let mut at = folder.to_path_buf();
    while at.starts_with(content) && at != content {
        if fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(refused(format!(
                "{}: an entry is written through the symlink `{}`; nothing was installed",
                archive.display(),
                at.strip_prefix(content).unwrap_or(&at).display()
            )));
        }
        if !at.pop() {
            break;
        }
    }
    Ok(())
}

fn kind_name(kind: tar::EntryType) -> &'static str {
    match kind {
        tar::EntryType::Char => "character device",
        tar::EntryType::Block => "block device",
        tar::EntryType::Fifo => "fifo",
        _ => "special entry",
    }
}

/// Verifies a signed release's manifest against the root's trust file and the staged files,
/// then keeps the manifest with the release (as a deploy's admission reads it).
fn verify_manifest(request: &Request, manifest: &Path, tree: &Path) -> Result<(), Error> {
    let trust_path = request.root.join(super::TRUST_FILE);
    let trust: super::Trust = crate::host::files::read_config(&trust_path, super::TRUST_SHAPE)
        .map_err(|e| Error::Invalid(e.to_string()))?
        .ok_or_else(|| {
            refused(format!(
                "--manifest is verified against {}, which does not exist",
                trust_path.display()
            ))
        })?;
    trust
        .check()
        .map_err(|e| refused(format!("{}: {e}", trust_path.display())))?;
    let now = chrono::DateTime::from_timestamp(request.now as i64, 0).unwrap_or_default();
    let verified = super::verify(manifest, &trust, now, Some(request.service), Some(tree))
        .map_err(|r| {
            refused(format!(
                "{}: refused ({r}); nothing was installed",
                manifest.display()
            ))
        })?;
    if verified.body.version != request.version {
        return Err(refused(format!(
            "{}: the manifest is for version {}, not {}",
            manifest.display(),
            verified.body.version,
            request.version
        )));
    }
    let copy = tree.join(super::MANIFEST_FILE);
    if copy.exists() {
        let _ = fs::remove_file(&copy);
    }
    let bytes = fs::read(manifest).map_err(|e| refused(format!("{}: {e}", manifest.display())))?;
    write_new(&copy, &bytes)
}

/// Content bytes, regular files, and the tree digest of a release folder (its record aside).
/// Its files are hashed on every core at once (a venv has thousands).
pub fn digest_tree(dir: &Path) -> Result<(u64, u64, String), Error> {
    let mut lines = Vec::new();
    let mut files = Vec::new();
    let mut size = 0u64;
    walk(dir, dir, &mut lines, &mut files, &mut size)?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = files.len().div_ceil(threads).max(1);
    let hashed: Vec<Result<Vec<String>, Error>> = std::thread::scope(|scope| {
        let workers: Vec<_> = files
            .chunks(share)
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|(relative, mode, path)| {
                            Ok(format!("f {relative} {mode:o} {}", file_sha256(path)?))
                        })
                        .collect::<Result<Vec<String>, Error>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker
                    .join()
                    .unwrap_or_else(|_| Err(Error::Failed("a hashing thread panicked".into())))
            })
            .collect()
    });
    for chunk in hashed {
        lines.extend(chunk?);
    }
    lines.sort();
    let mut hasher = Sha256::new();
    for line in &lines {
        hasher.update(line.as_bytes());
        hasher.update(b"\n");
    }
    Ok((size, files.len() as u64, hex(&hasher.finalize())))
}

/// A regular file of a tree to hash: its path inside, its mode, where it is.
type ToHash = (String, u32, PathBuf);

fn walk(
    top: &Path,
    dir: &Path,
    lines: &mut Vec<String>,
    files: &mut Vec<ToHash>,
    size: &mut u64,
) -> Result<(), Error> {
    let entries =
        fs::read_dir(dir).map_err(|e| Error::Invalid(format!("{}: {e}", dir.display())))?;
    for entry in entries.flatten() {
        let path = entry.path();
        let relative = path
            .strip_prefix(top)
            .unwrap_or(&path)
            .display()
            .to_string();
        if dir == top
            && (relative == RECORD_FILE
                || crate::host::output::is_output_file(&relative)
                || given_config(top, &relative))
        {
            continue;
        }
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() {
            lines.push(format!("d {relative} {mode:o}"));
            walk(top, &path, lines, files, size)?;
        } else if meta.file_type().is_symlink() {
            let target = fs::read_link(&path)
                .map(|t| t.display().to_string())
                .unwrap_or_default();
            lines.push(format!("l {relative} {target}"));
        } else if meta.is_file() {
            *size += meta.len();
            files.push((relative, mode, path));
        }
    }
    Ok(())
}

/// Whether a top-level name of a release is config a deploy gave it (the service's, not the
/// release's own): its mark, and its `env` and `secrets` while marked. Not the release's
/// content, so its digest stays what it was installed with.
fn given_config(top: &Path, name: &str) -> bool {
    use crate::host::config::{ADOPTED_FILE, ENV_FILE, SECRETS_FILE};
    name == ADOPTED_FILE
        || ((name == ENV_FILE || name == SECRETS_FILE) && top.join(ADOPTED_FILE).exists())
}

pub fn file_sha256(path: &Path) -> Result<String, Error> {
    let mut file =
        File::open(path).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = file
            .read(&mut buffer)
            .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new file of a staged tree (synced with the tree, [`seal`]).
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .map_err(|e| failed("create", path, e))?;
    file.write_all(bytes).map_err(|e| failed("write", path, e))
}

/// Makes a staged tree durable before it is renamed into place: one `syncfs` of the filesystem
/// it is on (its files and folders among what it writes back), not one fsync per file and
/// folder — 9 412 of them for a Django venv, each waiting on a disk other work keeps busy
/// (issue 81: 24-29 s a release on a busy host, against 0.3 s for `cp -a` and one sync).
fn sync_everything_under(dir: &Path) -> Result<(), Error> {
    let folder = File::open(dir).map_err(|e| failed("open", dir, e))?;
    rustix::fs::syncfs(&folder).map_err(|e| failed("sync", dir, e.into()))
}

fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| failed("sync", dir, e))
}

/// Folders being removed begin with this (a dot: no longer a version the moment they are named so).
const REMOVING_PREFIX: &str = ".removing-";

/// Removes an installed release crash-safely, and out of the caller's time: it is renamed to
/// a hidden name (from that moment no deploy or listing sees it, and no one sees it
/// half-removed) and its files are deleted by a process of their own in the background
/// ([`sweep_removed`]) — a venv of thousands of files took 18 s to delete, 24 s of a deploy that
/// pruned one after its promotion (issue 81). A deletion cut short leaves only the hidden
/// folder, which the next `release add`, prune or sweep finishes.
pub fn remove(releases: &Path, version: &str) -> Result<(), Error> {
    check_name("version", version)?;
    let from = releases.join(version);
    let hidden = releases.join(format!("{REMOVING_PREFIX}{version}-{}", std::process::id()));
    fs::rename(&from, &hidden).map_err(|e| failed("rename out", &from, e))?;
    sync_dir(releases)?;
    // The policy it ran under goes with it (a record of a release that is gone).
    if let Some(root) = releases.parent() {
        let kept = root
            .join(crate::host::kept_policy::FOLDER)
            .join(format!("{version}.json"));
        let _ = fs::remove_file(kept);
        // And so does what its processes and hooks said (rollgate's own files of it).
        let _ = fs::remove_dir_all(root.join(crate::host::output::OUTPUT_DIR).join(version));
        sweep_in_the_background(root);
    }
    Ok(())
}

/// Starts `rollgate sweep-removed` for `root`, detached (a session of its own, no terminal,
/// nothing inherited to write to): it outlives this command. Not started, the hidden folders
/// wait for the next command that sweeps.
fn sweep_in_the_background(root: &Path) {
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new("/proc/self/exe");
    command
        .arg("sweep-removed")
        .arg("--root")
        .arg(root)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: setsid is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    if let Ok(mut child) = command.spawn() {
        // Reaped here while this command lives (a long one would gather zombies), by whoever
        // inherits it once it has exited.
        std::thread::spawn(move || child.wait());
    }
}

/// Deletes every release renamed out of `releases` for removal (`.removing-*`), whoever
/// renamed it: those are never read again.
///
/// The trees hold what a release shipped, links included, but no release can write them or
/// `releases/` itself (its folder is rollgate's, read-only to its user): the names removed are
/// rollgate's own renames. std's `remove_dir_all` walks each tree by descriptor (`openat` with
/// `O_NOFOLLOW`, `unlinkat`; Rust 1.58.1 and later), so a link inside is removed, never
/// followed — the same holds for [`remove_dead_stagings`].
pub fn sweep_removed(releases: &Path) {
    let Ok(entries) = fs::read_dir(releases) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with(REMOVING_PREFIX)
        {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Removes what a dead installer staged or a dead removal left (a `kill -9` mid-way).
pub fn remove_dead_stagings(releases: &Path) {
    let Ok(entries) = fs::read_dir(releases) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(rest) = name
            .strip_prefix(STAGING_PREFIX)
            .or_else(|| name.strip_prefix(REMOVING_PREFIX))
        else {
            continue;
        };
        let pid = rest.rsplit('-').next().and_then(|p| p.parse::<i32>().ok());
        let alive = pid.is_some_and(|pid| {
            pid == std::process::id() as i32 || Path::new(&format!("/proc/{pid}")).exists()
        });
        if !alive {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
