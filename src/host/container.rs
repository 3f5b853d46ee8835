//! Container releases (issue 60): an OCI image is a release, run by the Docker Engine through
//! its API (bollard), never by shelling out to `docker`.
//!
//! A container release is a release folder like any other: `image.json` pins the image by the
//! engine's image ID (`sha256:…`, the digest of its config: a tag moved later changes nothing),
//! and the launcher `SERVICE` names the same digest, so the release's digests and a signed
//! manifest pin the image. What rollgate starts for it, through the one seam every release
//! takes (`process::spawn`), is `rollgate container-run`: a small supervisor that creates the
//! container (labelled with service, version, root and the run's token), starts it, copies its
//! output to the release's output file, waits for it, and stops it (SIGTERM, the grace, then
//! kill) when it is itself asked to stop. So a container release is gated, watched, stopped and
//! recovered as a process release is: its supervisor is the process rollgate knows.
//!
//! The engine is found at `DOCKER_HOST` (`unix://PATH`), else `/var/run/docker.sock`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

/// In a container release's folder: the image it runs.
pub const IMAGE_FILE: &str = "image.json";
/// The labels every container rollgate starts carries (`dev.rollgate.service`, ...).
pub const LABEL_PREFIX: &str = "dev.rollgate.";
/// Where the engine is when `DOCKER_HOST` does not say.
const DEFAULT_SOCKET: &str = "/var/run/docker.sock";
/// How long one call to the engine may take (loading a large archive included).
const ENGINE_TIMEOUT_S: u64 = 600;

/// `releases/VERSION/image.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRelease {
    /// The engine's image ID (`sha256:` and the digest of the image's config).
    pub image: String,
    /// Where it came from, as given (`docker-archive:/abs/app.tar`, `registry/app:1.4`).
    pub source: String,
    /// Pulled from a registry: the manifest's digest there (`registry/app@sha256:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_digest: Option<String>,
}

impl ImageRelease {
    /// The image release in `dir`, if it is one.
    pub fn of_release(dir: &Path) -> std::io::Result<Option<ImageRelease>> {
        let path = dir.join(IMAGE_FILE);
        // Beneath the folder: an `image.json` the release shipped as a link or a FIFO is
        // refused, never followed or waited on.
        let Some(text) =
            super::beneath::read_text(dir, IMAGE_FILE, super::beneath::SMALL_FILE_CAP)?
        else {
            return Ok(None);
        };
        serde_json::from_str(&text).map(Some).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })
    }
}

/// The kinds of image source `release add` takes, as `KIND:WHERE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// What `docker save` writes.
    DockerArchive(PathBuf),
    /// A tar of an OCI image layout (`skopeo copy … oci-archive:`, `buildah push`, BuildKit's
    /// `--output type=oci`).
    OciArchive(PathBuf),
    /// A reference pulled through the engine: `registry/app:1.4` or `registry/app@sha256:…`.
    Registry { repository: String, tag: String },
}

impl ImageSource {
    /// `docker-archive:FILE.tar`, or a registry reference with a tag or a digest
    /// (`registry.example.com/app:1.4`, `…/app@sha256:…`) that names no file here; None when
    /// `given` is no image source (a file or folder).
    pub fn parse(given: &str) -> Option<ImageSource> {
        let absolute =
            |file: &str| std::path::absolute(file).unwrap_or_else(|_| PathBuf::from(file));
        if let Some(file) = given.strip_prefix("docker-archive:") {
            return Some(ImageSource::DockerArchive(absolute(file)));
        }
        if let Some(file) = given.strip_prefix("oci-archive:") {
            return Some(ImageSource::OciArchive(absolute(file)));
        }
        if Path::new(given).exists() || !is_reference(given) {
            return None;
        }
        let (repository, tag) = match given.split_once('@') {
            Some((repository, digest)) => (repository, digest),
            None => {
                // The tag is after the last `:` of the last path part (a registry's port is
                // before a `/`).
                let last = given.rfind('/').map_or(0, |at| at + 1);
                match given[last..].rfind(':') {
                    Some(at) => (&given[..last + at], &given[last + at + 1..]),
                    None => (given, "latest"),
                }
            }
        };
        Some(ImageSource::Registry {
            repository: repository.to_string(),
            tag: tag.to_string(),
        })
    }

    /// As the record keeps it (an absolute path, or the reference).
    pub fn describe(&self) -> String {
        match self {
            ImageSource::DockerArchive(file) => format!("docker-archive:{}", file.display()),
            ImageSource::OciArchive(file) => format!("oci-archive:{}", file.display()),
            ImageSource::Registry { repository, tag } if tag.starts_with("sha256:") => {
                format!("{repository}@{tag}")
            }
            ImageSource::Registry { repository, tag } => format!("{repository}:{tag}"),
        }
    }
}

/// The root's secret that holds registry credentials: what `docker login` writes
/// (`~/.docker/config.json`, its `auths`), set with `rollgate secret set registry-auth`.
pub const REGISTRY_SECRET: &str = "registry-auth";

/// The registry a repository is pulled from: its first part where that names a host (a `.`,
/// a `:` port, or `localhost`), else Docker Hub.
fn registry_host(repository: &str) -> &str {
    match repository.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            first
        }
        _ => "docker.io",
    }
}

/// The credentials for pulling `repository`, from the root's [`REGISTRY_SECRET`] (none when
/// the secret is not set or names no credentials for that registry). They go to the engine in
/// its request's header, never on a command line or in a log; a secret that cannot be read is
/// an error naming it and what it should hold, never quoting it.
pub fn registry_credentials(
    secrets: &Path,
    repository: &str,
) -> Result<Option<bollard::auth::DockerCredentials>, String> {
    if !secrets.join(REGISTRY_SECRET).is_file() {
        return Ok(None);
    }
    let text = super::config::read_secret(secrets, REGISTRY_SECRET).map_err(|e| e.to_string())?;
    let host = registry_host(repository);
    let wanted = |key: &str| {
        let bare = key
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let bare = bare.split('/').next().unwrap_or(bare);
        bare == host || (host == "docker.io" && bare == "index.docker.io")
    };
    let malformed = |why: &str| {
        format!(
            "the secret {REGISTRY_SECRET} {why}: it holds what `docker login` writes, {{\"auths\": {{\"HOST\": {{\"auth\": base64 of USER:PASSWORD}}}}}} (or \"username\" and \"password\")"
        )
    };
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|_| malformed("is not JSON"))?;
    let auths = config
        .get("auths")
        .and_then(|a| a.as_object())
        .ok_or_else(|| malformed("has no \"auths\""))?;
    let Some(entry) = auths.iter().find(|(key, _)| wanted(key)).map(|(_, e)| e) else {
        return Ok(None);
    };
    let field = |name: &str| entry.get(name).and_then(|v| v.as_str()).map(String::from);
    let (username, password) = match (field("username"), field("password"), field("auth")) {
        (Some(username), Some(password), _) => (username, password),
        (_, _, Some(auth)) => {
            use base64::Engine;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .ok_or_else(|| {
                    malformed(&format!(
                        "has an \"auth\" for {host} that is not base64 text"
                    ))
                })?;
            let (username, password) = decoded.split_once(':').ok_or_else(|| {
                malformed(&format!("has an \"auth\" for {host} without USER:PASSWORD"))
            })?;
            (username.to_string(), password.to_string())
        }
        _ => {
            return Err(malformed(&format!(
                "has an entry for {host} with no credentials"
            )))
        }
    };
    Ok(Some(bollard::auth::DockerCredentials {
        username: Some(username),
        password: Some(password),
        serveraddress: Some(host.to_string()),
        ..Default::default()
    }))
}

/// Whether `given` reads as an image reference with a tag or digest: lower-case names,
/// digits, `.`, `-`, `_`, `/`, one `:tag` or `@sha256:…`, a registry host first.
fn is_reference(given: &str) -> bool {
    let allowed = given
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/:@".contains(c));
    allowed && given.contains('/') && (given.contains(':') || given.contains('@'))
}

/// The engine, at `DOCKER_HOST` or the default socket, speaking the newest API version both
/// know (Debian's Engine 20.10 speaks 1.41).
pub async fn engine() -> std::io::Result<Docker> {
    let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| format!("unix://{DEFAULT_SOCKET}"));
    let Some(path) = host.strip_prefix("unix://") else {
        return Err(std::io::Error::other(format!(
            "DOCKER_HOST={host}: rollgate reaches the engine on its Unix socket only (unix://PATH)"
        )));
    };
    let unreachable = |e: bollard::errors::Error| {
        std::io::Error::other(format!("the Docker Engine at {path} does not answer: {e} (is dockerd running? DOCKER_HOST names another socket)"))
    };
    Docker::connect_with_socket(path, ENGINE_TIMEOUT_S, bollard::API_DEFAULT_VERSION)
        .map_err(unreachable)?
        .negotiate_version()
        .await
        .map_err(unreachable)
}

/// Whether the release in `dir` is a container release (it has an `image.json`).
pub fn is_image_release(dir: &Path) -> bool {
    dir.join(IMAGE_FILE).is_file()
}

/// What `install` put in the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The image ID.
    pub image: String,
    /// Pulled from a registry: the manifest digest there.
    pub repo_digest: Option<String>,
    /// The engine did not have the image before: rollgate installed it (and retention may
    /// remove it once no root keeps it). An image that was there already is never removed.
    pub fresh: bool,
}

/// Loads or pulls the image `source` names into the engine and says what it is; a pull
/// presents `credentials` (see [`registry_credentials`]).
pub async fn install(
    source: &ImageSource,
    credentials: Option<bollard::auth::DockerCredentials>,
) -> std::io::Result<Installed> {
    let docker = engine().await?;
    let had = |id: String| {
        let docker = &docker;
        async move { docker.inspect_image(&id).await.is_ok() }
    };
    match source {
        ImageSource::DockerArchive(file) => {
            let before = match super::oci::docker_archive_config(file)? {
                Some(id) => had(id).await,
                None => false,
            };
            let image = load(&docker, file).await?;
            Ok(Installed {
                image,
                repo_digest: None,
                fresh: !before,
            })
        }
        ImageSource::OciArchive(file) => {
            // The engine (20.10) loads `docker save` archives: the layout's manifest is said
            // as one, with the same blobs, in a temporary file.
            let converted = super::oci::as_docker_archive(file)?;
            let before = match super::oci::docker_archive_config(converted.path())? {
                Some(id) => had(id).await,
                None => false,
            };
            let image = load(&docker, converted.path()).await?;
            Ok(Installed {
                image,
                repo_digest: None,
                fresh: !before,
            })
        }
        ImageSource::Registry { repository, tag } => {
            let reference = source.describe();
            let before = docker
                .inspect_image(&reference)
                .await
                .ok()
                .and_then(|i| i.id);
            let (image, repo_digest) = pull(&docker, repository, tag, credentials).await?;
            let fresh = before.as_deref() != Some(image.as_str());
            Ok(Installed {
                image,
                repo_digest,
                fresh,
            })
        }
    }
}

/// Where rollgate keeps, host-wide, which roots hold a release of each image it installed
/// (`IMAGES/HEX/roots/…`) and whether it installed it (`IMAGES/HEX/installed`).
const IMAGES: &str = "/var/lib/rollgate/images";

fn image_folder(image: &str) -> Option<PathBuf> {
    let hex = image.strip_prefix("sha256:")?;
    hex.chars()
        .all(|c| c.is_ascii_hexdigit())
        .then(|| Path::new(IMAGES).join(hex))
}

fn claim_file(folder: &Path, root: &Path) -> PathBuf {
    use sha2::Digest;
    let root = std::path::absolute(root).unwrap_or_else(|_| root.to_path_buf());
    let digest = sha2::Sha256::digest(root.as_os_str().as_encoded_bytes());
    let name: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    folder.join("roots").join(name)
}

/// Records that `root` holds a release of `image` (and, `fresh`, that rollgate installed it).
/// Best effort: without the record, retention only keeps an image it would have removed.
pub fn claim(image: &str, root: &Path, fresh: bool) {
    let Some(folder) = image_folder(image) else {
        return;
    };
    let file = claim_file(&folder, root);
    if let Some(roots) = file.parent() {
        let _ = std::fs::create_dir_all(roots);
    }
    if fresh && !folder.join("installed").exists() {
        let _ = std::fs::write(folder.join("installed"), image);
    }
    let _ = std::fs::write(file, root.as_os_str().as_encoded_bytes());
}

/// `root` no longer holds a release of `image`: its claim goes, and when no root claims the
/// image and rollgate installed it, the engine removes it (refused while a container uses it:
/// then the next prune tries again). Says what was removed.
pub fn forget(image: &str, root: &Path) -> Option<String> {
    let folder = image_folder(image)?;
    let _ = std::fs::remove_file(claim_file(&folder, root));
    // A claim holds while its root still has a release of the image (a root removed by hand
    // leaves a claim that holds nothing).
    let holds = |claimant: &Path| {
        std::fs::read_dir(claimant.join("releases"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| ImageRelease::of_release(&e.path()).ok().flatten())
            .any(|release| release.image == image)
    };
    let mut claimed = false;
    for entry in std::fs::read_dir(folder.join("roots"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let claimant = std::fs::read(entry.path())
            .map(|bytes| PathBuf::from(String::from_utf8_lossy(&bytes).into_owned()))
            .ok();
        match claimant.is_some_and(|root| holds(&root)) {
            true => claimed = true,
            false => {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    if claimed || !folder.join("installed").is_file() {
        return None;
    }
    let image = image.to_string();
    // A runtime of its own on a thread of its own: callers may be inside one already.
    let removed = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        runtime.block_on(async {
            let docker = engine().await.ok()?;
            docker
                .remove_image(
                    &image,
                    None::<bollard::query_parameters::RemoveImageOptions>,
                    None,
                )
                .await
                .ok()
                .map(|_| image)
        })
    })
    .join()
    .ok()
    .flatten()?;
    let _ = std::fs::remove_dir_all(&folder);
    Some(format!("image {removed} removed from the engine"))
}

/// Pulls `repository:tag` (or `@digest`) and pins it: the image ID, and the digest the
/// registry gave for this repository.
async fn pull(
    docker: &Docker,
    repository: &str,
    tag: &str,
    credentials: Option<bollard::auth::DockerCredentials>,
) -> std::io::Result<(String, Option<String>)> {
    let had_credentials = credentials.is_some();
    let reference = match tag.starts_with("sha256:") {
        true => format!("{repository}@{tag}"),
        false => format!("{repository}:{tag}"),
    };
    let mut said = docker.create_image(
        Some(bollard::query_parameters::CreateImageOptions {
            from_image: Some(repository.to_string()),
            tag: Some(tag.to_string()),
            ..Default::default()
        }),
        None,
        credentials,
    );
    while let Some(step) = said.next().await {
        step.map_err(|e| {
            let hint = match had_credentials {
                true => String::new(),
                false => format!(
                    " (no credentials for {} in the root's secret {REGISTRY_SECRET})",
                    registry_host(repository)
                ),
            };
            std::io::Error::other(format!("the engine could not pull {reference}: {e}{hint}"))
        })?;
    }
    let inspected = docker.inspect_image(&reference).await.map_err(|e| {
        std::io::Error::other(format!(
            "the engine pulled {reference} but cannot say what it is: {e}"
        ))
    })?;
    let id = inspected
        .id
        .filter(|id| id.starts_with("sha256:"))
        .ok_or_else(|| {
            std::io::Error::other(format!("the engine gave {reference} no sha256 image ID"))
        })?;
    let digest = inspected
        .repo_digests
        .unwrap_or_default()
        .into_iter()
        .find(|d| {
            d.split_once('@')
                .is_some_and(|(repo, _)| repo == repository)
        });
    Ok((id, digest))
}

/// Loads a `docker save` archive (exactly one image) and says its image ID.
async fn load(docker: &Docker, file: &Path) -> std::io::Result<String> {
    let opened = tokio::fs::File::open(file).await.map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot read {}: {e}", file.display()))
    })?;
    let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(opened));
    let mut said = docker.import_image(
        bollard::query_parameters::ImportImageOptions {
            quiet: true,
            ..Default::default()
        },
        body,
        None,
    );
    let mut loaded = Vec::new();
    while let Some(info) = said.next().await {
        let info = info.map_err(|e| {
            std::io::Error::other(format!(
                "the engine refused {} as a `docker save` archive: {e}",
                file.display()
            ))
        })?;
        let line = info.stream.unwrap_or_default();
        for line in line.lines() {
            if let Some(id) = line.trim().strip_prefix("Loaded image ID: ") {
                loaded.push(id.to_string());
            } else if let Some(name) = line.trim().strip_prefix("Loaded image: ") {
                loaded.push(name.to_string());
            }
        }
    }
    let [one] = loaded.as_slice() else {
        return Err(std::io::Error::other(format!(
            "{} holds {} images ({}); a release is one image: `docker save` one",
            file.display(),
            loaded.len(),
            loaded.join(", ")
        )));
    };
    let inspected = docker.inspect_image(one).await.map_err(|e| {
        std::io::Error::other(format!(
            "the engine loaded {one} but cannot say what it is: {e}"
        ))
    })?;
    inspected
        .id
        .filter(|id| id.starts_with("sha256:"))
        .ok_or_else(|| std::io::Error::other(format!("the engine gave {one} no sha256 image ID")))
}

/// The launcher a container release holds as its executable: it names the image's digest (so
/// the release's digest and a signed manifest pin the image) and runs it as rollgate does.
pub fn launcher(image: &str) -> String {
    format!(
        "#!/bin/sh\n\
         # A container release: the image {image}, run by rollgate through the Docker Engine.\n\
         # rollgate starts it itself (`rollgate container-run`); this file pins the image.\n\
         exec rollgate container-run --image {image} \"$@\"\n"
    )
}

/// How `container-run` runs one container.
#[derive(Debug, Clone, Default)]
pub struct RunSpec {
    pub image: String,
    /// The container's name: unique per run.
    pub name: String,
    /// `service`, `version`, `root`, `token`, `release` (its folder), `port` (prefixed with
    /// [`LABEL_PREFIX`]).
    pub labels: Vec<(String, String)>,
    /// Names of this process's environment variables the container gets (values are read
    /// here, never put on a command line).
    pub pass: Vec<String>,
    /// `UID:GID`; none: the image's own user.
    pub user: Option<String>,
    pub memory_mb: Option<u64>,
    pub pids: Option<u64>,
    pub cpu_pct: Option<u64>,
    pub nofile: Option<u64>,
    /// Folders mounted read-write at the same path (its state folder, `isolation.writable`).
    pub binds: Vec<PathBuf>,
    /// How long a stop waits for the container after SIGTERM before it is killed.
    pub grace: Duration,
    /// The cgroup the container's own goes under (set by `run`, see [`cgroup_parent`]).
    pub cgroup_parent: Option<String>,
    /// `isolation.enabled = false`: the engine's defaults (the image's user, Docker's default
    /// capabilities, a writable root) instead of rollgate's confinement.
    pub unconfined: bool,
    /// Where an OOM kill is recorded for rollgate to read (see `cgroup::verdict_file`).
    pub verdict: Option<std::sync::Arc<std::fs::File>>,
    /// The folders the image declares as `VOLUME` (set by `run`): each gets a bounded tmpfs
    /// instead of an anonymous volume (see [`container_body`]).
    pub volumes: Vec<String>,
    /// A command run instead of the image's own entrypoint and command (`rollgate run`):
    /// the program, then its arguments. Empty: the image's.
    pub command: Vec<String>,
}

/// How big each of a container's own writable folders may grow (its `/tmp`, and a tmpfs over
/// each `VOLUME` its image declares), in MiB. Memory: it counts toward the container's limit.
pub const TMPFS_MB: u64 = 64;

/// The folders an image declares as `VOLUME` (none where the engine cannot say).
async fn declared_volumes(docker: &Docker, image: &str) -> Vec<String> {
    let Ok(inspected) = docker.inspect_image(image).await else {
        return Vec::new();
    };
    let mut volumes: Vec<String> = inspected
        .config
        .and_then(|config| config.volumes)
        .unwrap_or_default();
    volumes.sort();
    volumes
}

/// `rollgate container-run`: runs the container to its end and says how it ended (its exit
/// code). Its output goes to this process's stdout and stderr (the release's output file).
pub async fn run(spec: &RunSpec) -> std::io::Result<i32> {
    let docker = engine().await?;
    let root = spec
        .labels
        .iter()
        .find(|(k, _)| k == "root")
        .map(|(_, v)| v.clone());
    if let Some(root) = &root {
        sweep(&docker, root).await;
    }
    // Its supervisor, named on it: a container whose supervisor is gone is an orphan.
    let me = super::identity::Identity::of(std::process::id() as i32)
        .as_ref()
        .map(supervisor_label)
        .unwrap_or_default();
    let mut spec = spec.clone();
    spec.labels.push((SUPERVISOR_LABEL.into(), me));
    spec.cgroup_parent = cgroup_parent(&docker).await;
    if !spec.unconfined {
        spec.volumes = declared_volumes(&docker, &spec.image).await;
    }
    let spec = &spec;
    let created = docker
        .create_container(
            Some(bollard::query_parameters::CreateContainerOptions {
                name: Some(spec.name.clone()),
                ..Default::default()
            }),
            container_body(spec),
        )
        .await
        .map_err(|e| {
            std::io::Error::other(format!("the engine refused to create {}: {e}", spec.name))
        })?;
    let id = created.id;
    let ended = supervise(&docker, &id, spec).await;
    // Gone whatever happened: a container rollgate no longer runs is not left behind.
    let _ = remove(&docker, &id).await;
    ended
}

/// Removes a container, running or not.
async fn remove(docker: &Docker, id: &str) -> Result<(), bollard::errors::Error> {
    docker
        .remove_container(
            id,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                // Its anonymous volumes with it (none are made for a confined release: its
                // image's VOLUMEs are tmpfs; an unconfined one's go here).
                v: true,
                ..Default::default()
            }),
        )
        .await
}

/// The supervisor's own tree (`/rollgate/TOKEN~PID-STARTTIME`), as the container's cgroup
/// parent, where the engine manages cgroups by their paths (`cgroupfs`): runc then makes the
/// container's cgroup inside it, on the v2 hierarchy as on the v1 controllers, so the
/// container's processes are in the tree rollgate stops — `cgroup.kill` of a supervisor that
/// outlived its grace ends its container's processes too. With systemd managing the engine's
/// cgroups (slices, not paths) the engine's own place is kept.
async fn cgroup_parent(docker: &Docker) -> Option<String> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let tree = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim()
        .to_string();
    if !tree.starts_with("/rollgate/") {
        return None;
    }
    let info = docker.info().await.ok()?;
    matches!(
        info.cgroup_driver,
        Some(bollard::models::SystemInfoCgroupDriverEnum::CGROUPFS)
    )
    .then_some(tree)
}

/// Removes the containers the supervisor `who` ran (after it was killed, so it could not).
/// Best effort, as the sweep: what the engine refuses now the next start of the root removes.
pub async fn remove_supervised_by(who: &super::identity::Identity) {
    let Ok(docker) = engine().await else {
        return;
    };
    let label = format!("{SUPERVISOR_LABEL}={}", supervisor_label(who));
    let found = labelled(&docker, &[label], false).await.unwrap_or_default();
    for id in found.into_iter().filter_map(|c| c.id) {
        let _ = remove(&docker, &id).await;
    }
}

/// The label naming the supervisor (`PID-STARTTIME`) that runs a container.
const SUPERVISOR_LABEL: &str = "supervisor";

/// A supervisor as its label names it.
fn supervisor_label(who: &super::identity::Identity) -> String {
    format!("{}-{}", who.pid, who.start_time)
}

/// The containers carrying every label in `labels` (`KEY=VALUE`, [`LABEL_PREFIX`] added
/// here): stopped ones too, unless `running_only`.
async fn labelled(
    docker: &Docker,
    labels: &[String],
    running_only: bool,
) -> Result<Vec<bollard::models::ContainerSummary>, bollard::errors::Error> {
    let mut filters = HashMap::from([(
        "label".to_string(),
        labels
            .iter()
            .map(|l| format!("{LABEL_PREFIX}{l}"))
            .collect(),
    )]);
    if running_only {
        filters.insert("status".to_string(), vec!["running".to_string()]);
    }
    docker
        .list_containers(Some(bollard::query_parameters::ListContainersOptions {
            all: !running_only,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
}

/// Removes the containers of `root` whose supervisor is gone: it was killed (SIGKILL after
/// its grace, a reboot) before it could stop and remove its container. Each is said on stderr
/// (the new release's output file). Best effort: the engine's refusal leaves it for the next.
pub async fn sweep(docker: &Docker, root: &str) {
    let Ok(found) = labelled(docker, &[format!("root={root}")], false).await else {
        return;
    };
    for container in found {
        let labels = container.labels.unwrap_or_default();
        let supervisor = labels
            .get(&format!("{LABEL_PREFIX}{SUPERVISOR_LABEL}"))
            .and_then(|s| s.split_once('-'))
            .and_then(|(pid, start)| {
                Some(super::identity::Identity {
                    pid: pid.parse().ok()?,
                    start_time: start.parse().ok()?,
                })
            });
        if supervisor.is_some_and(|who| who.is_running()) {
            continue;
        }
        let Some(id) = container.id else { continue };
        if remove(docker, &id).await.is_ok() {
            eprintln!(
                "rollgate container-run: removed container {} ({} {}): its supervisor is gone",
                container
                    .names
                    .and_then(|n| n.first().cloned())
                    .unwrap_or(id),
                labels
                    .get(&format!("{LABEL_PREFIX}service"))
                    .map_or("", String::as_str),
                labels
                    .get(&format!("{LABEL_PREFIX}version"))
                    .map_or("", String::as_str),
            );
        }
    }
}

fn container_body(spec: &RunSpec) -> bollard::models::ContainerCreateBody {
    use bollard::models::{HostConfig, ResourcesUlimits};
    let env: Vec<String> = spec
        .pass
        .iter()
        .filter_map(|name| Some(format!("{name}={}", std::env::var(name).ok()?)))
        .collect();
    let labels: HashMap<String, String> = spec
        .labels
        .iter()
        .map(|(k, v)| (format!("{LABEL_PREFIX}{k}"), v.clone()))
        .collect();
    let as_i64 = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let memory = spec.memory_mb.map(|mb| as_i64(mb << 20));
    let confined = !spec.unconfined;
    let host = HostConfig {
        network_mode: Some("host".into()),
        readonly_rootfs: Some(confined),
        // Its own writable folders are memory of a bounded size: /tmp, and each VOLUME its
        // image declares (with a mount there, the engine makes no anonymous volume, which
        // would take writes past the read-only root and outlive the container).
        tmpfs: Some(
            std::iter::once("/tmp".to_string())
                .chain(spec.volumes.iter().cloned())
                .map(|folder| (folder, format!("rw,nosuid,nodev,size={TMPFS_MB}m")))
                .collect(),
        ),
        binds: Some(
            spec.binds
                .iter()
                .map(|p| format!("{0}:{0}:rw", p.display()))
                .collect(),
        ),
        cap_drop: confined.then(|| vec!["ALL".into()]),
        security_opt: confined.then(|| vec!["no-new-privileges".into()]),
        memory,
        memory_swap: memory,
        pids_limit: spec.pids.map(as_i64),
        nano_cpus: spec.cpu_pct.map(|pct| as_i64(pct) * 10_000_000),
        ulimits: spec.nofile.map(|n| {
            vec![ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(as_i64(n)),
                hard: Some(as_i64(n)),
            }]
        }),
        init: Some(true),
        cgroup_parent: spec.cgroup_parent.clone(),
        // A one-off's terminal the size of this one from its start (engines from API 1.42;
        // older ones get it by the resize right after the start).
        console_size: (!spec.command.is_empty() && super::attach::stdin_is_a_terminal())
            .then(super::attach::size)
            .flatten()
            .map(|(rows, columns)| vec![usize::from(rows), usize::from(columns)]),
        ..Default::default()
    };
    let (entrypoint, cmd) = match spec.command.split_first() {
        Some((program, args)) => (Some(vec![program.clone()]), Some(args.to_vec())),
        None => (None, None),
    };
    // A one-off command (`rollgate run`) reads what is typed, in a terminal when there is one.
    let one_off = !spec.command.is_empty();
    bollard::models::ContainerCreateBody {
        image: Some(spec.image.clone()),
        entrypoint,
        cmd,
        user: spec.user.clone(),
        env: Some(env),
        labels: Some(labels),
        host_config: Some(host),
        open_stdin: one_off.then_some(true),
        attach_stdin: one_off.then_some(true),
        stdin_once: one_off.then_some(true),
        tty: (one_off && super::attach::stdin_is_a_terminal()).then_some(true),
        ..Default::default()
    }
}

/// Starts the container, copies its output, and waits for its end; asked to stop (SIGTERM or
/// SIGINT to this process), stops it with the grace.
async fn supervise(docker: &Docker, id: &str, spec: &RunSpec) -> std::io::Result<i32> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let one_off = !spec.command.is_empty();
    // A one-off is attached before it starts (nothing it says or reads first is lost), its
    // stdin fed from this one, this terminal raw while it runs (restored when this returns).
    let mut _raw = None;
    let mut output = match one_off {
        true => {
            let attached = docker
                .attach_container(
                    id,
                    Some(bollard::query_parameters::AttachContainerOptions {
                        stdin: true,
                        stdout: true,
                        stderr: true,
                        stream: true,
                        ..Default::default()
                    }),
                )
                .await
                .map_err(|e| {
                    std::io::Error::other(format!("cannot attach to {}: {e}", spec.name))
                })?;
            super::attach::feed(attached.input);
            attached.output
        }
        false => Box::pin(docker.logs(
            id,
            Some(bollard::query_parameters::LogsOptions {
                follow: true,
                stdout: true,
                stderr: true,
                ..Default::default()
            }),
        )),
    };
    // From a moment before its start: the engine's `oom` events are asked for from here.
    let started_at = unix_now() - 1.0;
    docker.start_container(id, None).await.map_err(|e| {
        std::io::Error::other(format!("the engine could not start {}: {e}", spec.name))
    })?;
    if one_off && super::attach::stdin_is_a_terminal() {
        _raw = Some(super::attach::RawTerminal::when_a_terminal());
        if let Some((rows, columns)) = super::attach::size() {
            let _ = docker
                .resize_container_tty(
                    id,
                    bollard::query_parameters::ResizeContainerTTYOptions {
                        h: i32::from(rows),
                        w: i32::from(columns),
                    },
                )
                .await;
        }
    }
    // Written as it comes (blocking writes to the output file's pump: this process does
    // nothing else meanwhile).
    let copy = async {
        use std::io::Write;
        while let Some(Ok(piece)) = output.next().await {
            let _ = match piece {
                bollard::container::LogOutput::StdErr { message } => {
                    std::io::stderr().write_all(&message)
                }
                other => std::io::stdout().write_all(&other.into_bytes()),
            };
        }
        let _ = std::io::stdout().flush();
    };
    let mut waited = docker.wait_container(id, None);
    let wait = async {
        match waited.next().await {
            Some(Ok(ended)) => ended.status_code,
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
            Some(Err(_)) | None => 255,
        }
    };
    tokio::pin!(copy, wait);
    let mut copying = true;
    let mut asked_to_stop = false;
    let code = loop {
        tokio::select! {
            code = &mut wait => break code,
            () = &mut copy, if copying => copying = false,
            _ = term.recv() => { asked_to_stop = true; stop(docker, id, spec.grace).await }
            _ = interrupt.recv() => { asked_to_stop = true; stop(docker, id, spec.grace).await }
        }
    };
    // What it wrote last is still on its way: a moment for it.
    if copying {
        let _ = tokio::time::timeout(Duration::from_millis(500), copy).await;
    }
    // A SIGKILL nobody here asked for, under a memory limit: most likely the OOM killer.
    let may_be_late = code == 137 && spec.memory_mb.is_some() && !asked_to_stop;
    if oom_killed(docker, id, may_be_late, started_at).await {
        let limit_mb = spec.memory_mb.unwrap_or(0);
        eprintln!("rollgate container-run: killed: out of memory at its {limit_mb} MiB limit");
        if let Some(verdict) = &spec.verdict {
            use std::io::Write;
            let _ = (&**verdict).write_all(format!("{limit_mb}\n").as_bytes());
        }
    }
    Ok(i32::try_from(code).unwrap_or(255))
}

/// Whether the engine says the kernel's OOM killer ended the container: its `OOMKilled` flag,
/// or an `oom` event of the container since its start. The engine sets the flag from an OOM
/// event of its own, which can land after the exit it reported (more than a second later on a
/// loaded machine, seen in CI; once more than five), and its exit handling can set the flag
/// back to the exit's own word (the rollback then said `exited 137`, twice in CI under load):
/// the event, kept in the engine's event log, is asked too. A container SIGKILLed (137) under
/// a memory limit, not by a stop of ours, is asked again for up to fifteen seconds — its
/// candidate is dead either way, only the reason waits.
async fn oom_killed(docker: &Docker, id: &str, may_be_late: bool, since: f64) -> bool {
    let tries = if may_be_late { 150 } else { 1 };
    for attempt in 1..=tries {
        let said = docker
            .inspect_container(id, None)
            .await
            .ok()
            .and_then(|inspected| inspected.state?.oom_killed);
        if said == Some(true) || (may_be_late && oom_event_since(docker, id, since).await) {
            return true;
        }
        if attempt < tries {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    false
}

/// Whether the engine's event log has an `oom` event of container `id` from `since` (Unix
/// seconds) to now; the stream ends at now, and a silent engine within a second is a no.
async fn oom_event_since(docker: &Docker, id: &str, since: f64) -> bool {
    let filters = HashMap::from([
        ("container".to_string(), vec![id.to_string()]),
        ("event".to_string(), vec!["oom".to_string()]),
    ]);
    let mut events = docker.events(Some(bollard::query_parameters::EventsOptions {
        since: Some(format!("{since:.9}")),
        until: Some(format!("{:.9}", unix_now())),
        filters: Some(filters),
    }));
    let found = async {
        while let Some(event) = events.next().await {
            if event.is_ok() {
                return true;
            }
        }
        false
    };
    tokio::time::timeout(Duration::from_secs(1), found)
        .await
        .unwrap_or(false)
}

/// Unix seconds now (the engine's event log is asked by them).
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// How an exec probe run inside a container ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEnd {
    /// Its exit code (none: it was killed).
    Exited(Option<i64>),
    /// Still running at its timeout: killed then.
    TimedOut,
    /// It could not be run: why.
    Failed(String),
}

/// Runs an exec probe's `command` inside the running container of the release in `release`
/// that serves `port` (the engine's exec: as the container's user, in its working directory,
/// with `PORT` set), for at most `timeout`. The engine cannot stop an exec, so one that
/// outlives its timeout is killed by its pid on the host.
pub async fn exec_inside(
    release: &Path,
    port: u16,
    command: &[String],
    timeout: Duration,
) -> ExecEnd {
    let failed = |what: &str, e: &dyn std::fmt::Display| ExecEnd::Failed(format!("{what}: {e}"));
    let docker = match engine().await {
        Ok(docker) => docker,
        Err(e) => return failed("the engine", &e),
    };
    let labels = [
        format!("release={}", release.display()),
        format!("port={port}"),
    ];
    let found = labelled(&docker, &labels, true).await;
    let id = match found.map(|list| list.into_iter().find_map(|c| c.id)) {
        Ok(Some(id)) => id,
        Ok(None) => return ExecEnd::Failed("its container is not running yet".into()),
        Err(e) => return failed("listing its container", &e),
    };
    let created = docker
        .create_exec(
            &id,
            bollard::exec::CreateExecOptions::<String> {
                cmd: Some(command.to_vec()),
                env: Some(vec![format!("PORT={port}")]),
                attach_stdout: Some(false),
                attach_stderr: Some(false),
                ..Default::default()
            },
        )
        .await;
    let exec = match created {
        Ok(created) => created.id,
        Err(e) => return failed("the engine's exec", &e),
    };
    let started = docker
        .start_exec(
            &exec,
            Some(bollard::exec::StartExecOptions {
                detach: true,
                ..Default::default()
            }),
        )
        .await;
    if let Err(e) = started {
        return failed("the engine's exec", &e);
    }
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let inspected = match docker.inspect_exec(&exec).await {
            Ok(inspected) => inspected,
            Err(e) => return failed("the engine's exec", &e),
        };
        if inspected.running != Some(true) {
            return ExecEnd::Exited(inspected.exit_code);
        }
        if tokio::time::Instant::now() >= deadline {
            if let Some(pid) = inspected.pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            return ExecEnd::TimedOut;
        }
        tokio::time::sleep(EXEC_POLL).await;
    }
}

/// How often a running exec is asked whether it ended (the engine has no wait for an exec).
const EXEC_POLL: Duration = Duration::from_millis(20);

/// SIGTERM to the container, and SIGKILL after `grace` (the engine's stop).
async fn stop(docker: &Docker, id: &str, grace: Duration) {
    let seconds = i32::try_from(grace.as_secs().max(1)).unwrap_or(i32::MAX);
    let _ = docker
        .stop_container(
            id,
            Some(bollard::query_parameters::StopContainerOptions {
                t: Some(seconds),
                ..Default::default()
            }),
        )
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_credentials_are_found_by_the_references_registry() {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(registry_host("127.0.0.1:5000/app"), "127.0.0.1:5000");
        assert_eq!(registry_host("localhost/app"), "localhost");
        assert_eq!(registry_host("team/app"), "docker.io");
        let secrets = std::env::temp_dir().join(format!("rollgate-creds-{}", std::process::id()));
        std::fs::create_dir_all(&secrets).unwrap();
        std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(registry_credentials(&secrets, "reg.example/app"), Ok(None));
        let file = secrets.join(REGISTRY_SECRET);
        let set = |text: &str| {
            std::fs::write(&file, text).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        };
        // base64("ann:s3cret:x"): a password may hold a colon.
        set(
            r#"{"auths": {"https://reg.example/v2/": {"auth": "YW5uOnMzY3JldDp4"},
            "https://index.docker.io/v1/": {"username": "bob", "password": "pw"}}}"#,
        );
        let found = registry_credentials(&secrets, "reg.example/app")
            .unwrap()
            .unwrap();
        assert_eq!(found.username.as_deref(), Some("ann"));
        assert_eq!(found.password.as_deref(), Some("s3cret:x"));
        assert_eq!(found.serveraddress.as_deref(), Some("reg.example"));
        let hub = registry_credentials(&secrets, "team/app").unwrap().unwrap();
        assert_eq!(hub.username.as_deref(), Some("bob"));
        assert_eq!(
            registry_credentials(&secrets, "other.example/app"),
            Ok(None)
        );
        set(r#"{"auths": {"reg.example": {"auth": "not base64!"}}}"#);
        let said = registry_credentials(&secrets, "reg.example/app").unwrap_err();
        assert!(
            said.contains("not base64") && !said.contains("not base64!"),
            "{said}"
        );
        set("hunter2");
        let said = registry_credentials(&secrets, "reg.example/app").unwrap_err();
        assert!(
            said.contains("is not JSON") && !said.contains("hunter2"),
            "{said}"
        );
        std::fs::remove_dir_all(&secrets).unwrap();
    }

    #[test]
    fn an_image_source_is_named_by_its_kind() {
        assert_eq!(
            ImageSource::parse("docker-archive:/srv/app.tar"),
            Some(ImageSource::DockerArchive(PathBuf::from("/srv/app.tar")))
        );
        assert_eq!(ImageSource::parse("/srv/app.tar"), None);
        assert_eq!(ImageSource::parse("app.tar"), None);
        let pulled = |repository: &str, tag: &str| {
            Some(ImageSource::Registry {
                repository: repository.into(),
                tag: tag.into(),
            })
        };
        assert_eq!(
            ImageSource::parse("127.0.0.1:5000/app:1.4"),
            pulled("127.0.0.1:5000/app", "1.4")
        );
        assert_eq!(
            ImageSource::parse("registry.example.com/team/app@sha256:ab12"),
            pulled("registry.example.com/team/app", "sha256:ab12")
        );
        assert_eq!(
            ImageSource::parse("127.0.0.1:5000/app@sha256:ab12")
                .unwrap()
                .describe(),
            "127.0.0.1:5000/app@sha256:ab12"
        );
        let launcher = launcher("sha256:abc");
        assert!(launcher.contains("--image sha256:abc"));
    }
}
