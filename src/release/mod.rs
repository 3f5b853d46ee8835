//! Signed releases. A release engineer signs a release folder offline (`keygen`, `sign`,
//! `cosign`); a root with a trust file (`ROOT/trust.json`: pins and a threshold) deploys only
//! releases whose `releases/<version>/manifest.json` a threshold of distinct pinned keys signed,
//! that have not expired, are for this service, whose files match their digests, and whose
//! sequence is above the root's release floor (`ROOT/release-floor`, raised when a signed
//! release is promoted). Undo a bad release by rolling forward: sign a fix with a higher
//! sequence.

pub mod install;
pub mod keys;
pub mod manifest;
pub mod procfile;
pub mod shebang;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::host::fault::Fault;
use crate::host::files::{read_config, read_json};
use manifest::{Artifact, Body, Published};

/// Why a release is refused: one word each, as logs and scripts match them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Malformed,
    NotCanonical,
    Threshold,
    Expired,
    Product,
    Digest,
    Rollback,
    Conflict,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Malformed => "malformed",
            Reason::NotCanonical => "not-canonical",
            Reason::Threshold => "threshold",
            Reason::Expired => "expired",
            Reason::Product => "product",
            Reason::Digest => "digest",
            Reason::Rollback => "rollback",
            Reason::Conflict => "conflict",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub reason: Reason,
    pub detail: String,
}

impl Refusal {
    pub fn new(reason: Reason, detail: impl Into<String>) -> Refusal {
        Refusal {
            reason,
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason.as_str(), self.detail)
    }
}

pub const MANIFEST_FILE: &str = "manifest.json";
pub const TRUST_FILE: &str = "trust.json";
/// What `trust.json` holds, for the error of a file that does not parse.
pub const TRUST_SHAPE: &str =
    r#"it holds {"pins": ["sha256/..."], "threshold": N} (docs/signed-releases.md)"#;
pub const FLOOR_FILE: &str = "release-floor";

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// RFC 3339, UTC, whole seconds: how the body writes times.
fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `30d`, `12h`, `90m`, `45s`.
pub fn parse_duration(text: &str) -> Result<Duration, Fault> {
    duration_in(text).map_err(|why| Fault::setting("--expires", why))
}

fn duration_in(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like 30d, 12h, 90m or 45s"))?;
    let seconds = match unit {
        "d" => n.checked_mul(86_400),
        "h" => n.checked_mul(3_600),
        "m" => n.checked_mul(60),
        "s" | "" => Some(n),
        _ => None,
    }
    .filter(|s| *s > 0 && *s <= 10 * 365 * 86_400)
    .ok_or_else(|| {
        format!("`{text}` is not a duration from 1s to 10 years (30d, 12h, 90m, 45s)")
    })?;
    Ok(Duration::from_secs(seconds))
}

/// `TIME` as `log` reads times: RFC 3339, a date, or Unix seconds.
pub fn parse_time(text: &str) -> Result<DateTime<Utc>, Fault> {
    let seconds =
        crate::render::time::parse_time(text).map_err(|e| Fault::setting("time", e.to_string()))?;
    DateTime::from_timestamp(seconds.floor() as i64, 0)
        .ok_or_else(|| Fault::setting("time", format!("`{text}` is out of range")))
}

/// SHA-256 and size of everything `reader` yields, written on to `copy` as it is read.
fn digest_of(
    mut reader: impl Read,
    mut copy: Option<&mut dyn std::io::Write>,
) -> std::io::Result<(String, u64)> {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
        if let Some(copy) = copy.as_mut() {
            copy.write_all(&buffer[..n])?;
        }
        size += n as u64;
    }
    Ok((hex(&hasher.finalize()), size))
}

/// Files of a release folder that are part of the release: regular files at its top, except
/// the manifest, hidden files, and the output rollgate writes beside a release it runs.
fn release_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if !is_file
            || name == MANIFEST_FILE
            || name.starts_with('.')
            || crate::host::output::is_output_file(&name)
        {
            continue;
        }
        files.push((name, entry.path()));
    }
    files.sort();
    Ok(files)
}

fn platform_of(path: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let executable = std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
    if executable {
        format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH)
    } else {
        "any".into()
    }
}

/// What `rollgate release sign` is asked.
pub struct SignRequest<'a> {
    pub dir: &'a Path,
    pub service: &'a str,
    pub version: &'a str,
    pub sequence: u64,
    pub expires_in: Duration,
    pub key: &'a Path,
    pub cosigners: &'a [PathBuf],
    pub now: DateTime<Utc>,
}

/// Writes `DIR/manifest.json` listing the folder's files, signed by `key`; the cosigners'
/// public keys are listed too, so that they can add their signatures with `cosign`.
pub fn sign(request: &SignRequest) -> Result<PathBuf, Error> {
    signed(request).map_err(Error::Invalid)
}

fn signed(request: &SignRequest) -> Result<PathBuf, String> {
    crate::host::names::check_name("service", request.service).map_err(|e| e.to_string())?;
    crate::host::names::check_name("version", request.version).map_err(|e| e.to_string())?;
    if request.sequence == 0 || request.sequence >= 1 << 53 {
        return Err("--sequence must be from 1 to 2^53 - 1".into());
    }
    let secret = keys::load_private(request.key).map_err(|e| e.to_string())?;
    let mut listed = vec![keys::listing(&secret.public_key())];
    for path in request.cosigners {
        let key = keys::listing(&keys::load_public(path).map_err(|e| e.to_string())?);
        if !listed.contains(&key) {
            listed.push(key);
        }
    }
    let mut artifacts = Vec::new();
    for (name, path) in release_files(request.dir)? {
        let file = std::fs::File::open(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let (sha256, size) =
            digest_of(file, None).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        artifacts.push(Artifact {
            platform: platform_of(&path),
            name,
            sha256,
            size,
        });
    }
    if artifacts.is_empty() {
        return Err(format!("{} holds no files to sign", request.dir.display()));
    }
    let expires =
        request.now + chrono::Duration::from_std(request.expires_in).map_err(|e| e.to_string())?;
    let body = Body {
        kind: manifest::TYPE.into(),
        spec: manifest::SPEC,
        service: request.service.into(),
        version: request.version.into(),
        sequence: request.sequence,
        issued_at: timestamp(request.now),
        expires_at: timestamp(expires),
        keys: listed,
        artifacts,
    };
    let canonical = manifest::encode(&body);
    let published = Published {
        manifest: manifest::base64_encode(&canonical),
        signatures: vec![manifest::Signature {
            kid: body.keys[0].kid.clone(),
            sig: keys::sign(&secret, &canonical),
        }],
    };
    let path = request.dir.join(MANIFEST_FILE);
    write_manifest(&path, &published)?;
    Ok(path)
}

fn write_manifest(path: &Path, published: &Published) -> Result<(), String> {
    crate::host::files::write_atomically(path, &published.to_file_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A published manifest, read beneath its folder (`host::beneath`): the manifest of an
/// installed release is a file of that release, and one shipped as a link or a FIFO is refused.
fn read_published(path: &Path) -> Result<Published, Refusal> {
    let cannot = |e: std::io::Error| {
        Refusal::new(
            Reason::Malformed,
            format!("cannot read {}: {e}", path.display()),
        )
    };
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| cannot(std::io::ErrorKind::NotFound.into()))?;
    let bytes = crate::host::beneath::read(folder, &name, crate::host::beneath::SMALL_FILE_CAP)
        .map_err(cannot)?
        .ok_or_else(|| cannot(std::io::ErrorKind::NotFound.into()))?;
    manifest::parse_published(&bytes)
}

/// Adds `key`'s signature to a manifest whose body lists it.
pub fn cosign(path: &Path, key: &Path) -> Result<String, Error> {
    cosigned(path, key).map_err(Error::Invalid)
}

fn cosigned(path: &Path, key: &Path) -> Result<String, String> {
    let secret = keys::load_private(key).map_err(|e| e.to_string())?;
    let mut published = read_published(path).map_err(|r| format!("{}: {r}", path.display()))?;
    let (body, canonical) =
        manifest::decode(&published).map_err(|r| format!("{}: {r}", path.display()))?;
    let mine = keys::listing(&secret.public_key());
    if !body.keys.contains(&mine) {
        return Err(format!(
            "{} does not list this key ({}); it must be named with --cosigners when the release is signed",
            path.display(),
            mine.kid
        ));
    }
    if published.signatures.iter().any(|s| s.kid == mine.kid) {
        return Err(format!(
            "{} is already signed by {}",
            path.display(),
            mine.kid
        ));
    }
    published.signatures.push(manifest::Signature {
        kid: mine.kid.clone(),
        sig: keys::sign(&secret, &canonical),
    });
    write_manifest(path, &published)?;
    Ok(mine.kid)
}

/// Which keys a verifier trusts, and how many of them must have signed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trust {
    pub pins: Vec<String>,
    pub threshold: usize,
}

impl Trust {
    pub fn check(&self) -> Result<(), Fault> {
        self.checked().map_err(|why| Fault::setting("trust", why))
    }

    fn checked(&self) -> Result<(), String> {
        if self.threshold == 0 || self.threshold > self.pins.len() {
            return Err(format!(
                "threshold {} must be from 1 to the number of pins ({})",
                self.threshold,
                self.pins.len()
            ));
        }
        match self.pins.iter().find(|p| !p.starts_with("sha256/")) {
            Some(bad) => Err(format!("`{bad}` is not a pin (sha256/<base64>)")),
            None => Ok(()),
        }
    }
}

/// A release that verified.
#[derive(Debug, Clone, PartialEq)]
pub struct Verified {
    pub body: Body,
    /// SHA-256 of the canonical body: names the release whatever signatures are added later.
    pub manifest_sha256: String,
}

/// Checks a published manifest: its form, the signatures of distinct pinned keys, the expiry,
/// the service (when given) and, with `dir`, every artifact's size and digest.
pub fn verify(
    path: &Path,
    trust: &Trust,
    now: DateTime<Utc>,
    service: Option<&str>,
    dir: Option<&Path>,
) -> Result<Verified, Refusal> {
    let published = read_published(path)?;
    let (body, canonical) = manifest::decode(&published)?;
    let mut signers: Vec<&str> = Vec::new();
    for signature in &published.signatures {
        let Some(listed) = body.keys.iter().find(|k| k.kid == signature.kid) else {
            continue;
        };
        let pinned = trust.pins.contains(&listed.kid);
        if pinned
            && !signers.contains(&listed.kid.as_str())
            && keys::verifies(listed, &canonical, &signature.sig)
        {
            signers.push(&listed.kid);
        }
    }
    if signers.len() < trust.threshold {
        return Err(Refusal::new(
            Reason::Threshold,
            format!(
                "{} valid signature(s) by distinct pinned keys, {} required",
                signers.len(),
                trust.threshold
            ),
        ));
    }
    let expires = parse_time(&body.expires_at)
        .map_err(|e| Refusal::new(Reason::Malformed, format!("expiresAt: {e}")))?;
    if now >= expires {
        return Err(Refusal::new(
            Reason::Expired,
            format!("expired at {}; sign it again", body.expires_at),
        ));
    }
    if let Some(service) = service {
        if body.service != service {
            return Err(Refusal::new(
                Reason::Product,
                format!("signed for service {}, not {service}", body.service),
            ));
        }
    }
    if let Some(dir) = dir {
        for artifact in &body.artifacts {
            check_artifact(dir, artifact, None)?;
        }
    }
    Ok(Verified {
        manifest_sha256: hex(&Sha256::digest(&canonical)),
        body,
    })
}

/// One artifact's size and digest, read from `dir` (and copied on to `copy` as it is read).
fn check_artifact(
    dir: &Path,
    artifact: &Artifact,
    copy: Option<&mut dyn std::io::Write>,
) -> Result<(), Refusal> {
    let path = dir.join(&artifact.name);
    let digest = |detail: String| Refusal::new(Reason::Digest, detail);
    if artifact.name.contains('/') || artifact.name.starts_with('.') {
        return Err(Refusal::new(
            Reason::Malformed,
            format!("artifact name `{}` is not a plain file name", artifact.name),
        ));
    }
    // Beneath the folder: an artifact that is a link is refused, never read through.
    let file = crate::host::beneath::open_file(dir, Path::new(&artifact.name))
        .and_then(|f| f.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound)))
        .map_err(|e| digest(format!("{}: {e}", path.display())))?;
    let (sha256, size) =
        digest_of(file, copy).map_err(|e| digest(format!("{}: {e}", path.display())))?;
    if sha256 != artifact.sha256 || size != artifact.size {
        return Err(digest(format!(
            "{} is {size} bytes with sha256 {sha256}; the manifest says {} bytes with sha256 {}",
            path.display(),
            artifact.size,
            artifact.sha256
        )));
    }
    Ok(())
}

pub use crate::host::state::{Floor, Signed};

/// `sequence` against the floor: above it, or the floor's own manifest again.
pub fn above_floor(verified: &Verified, floor: Option<&Floor>) -> Result<(), Refusal> {
    let Some(floor) = floor else {
        return Ok(());
    };
    let body = &verified.body;
    if body.version == floor.version && body.sequence != floor.sequence {
        return Err(Refusal::new(
            Reason::Conflict,
            format!(
                "version {} was promoted as sequence {}, this manifest says {}",
                floor.version, floor.sequence, body.sequence
            ),
        ));
    }
    if verified.manifest_sha256 == floor.manifest_sha256 || body.sequence > floor.sequence {
        return Ok(());
    }
    Err(Refusal::new(
        Reason::Rollback,
        format!(
            "sequence {} is not above the release floor {} ({}); undo a release by rolling forward: sign a fix with a higher sequence",
            body.sequence, floor.sequence, floor.version
        ),
    ))
}

pub fn read_floor(root: &Path) -> Result<Option<Floor>, Fault> {
    read_json(&root.join(FLOOR_FILE))
}

/// Raises the floor (atomically: a crash leaves the old floor or the new one).
pub fn write_floor(root: &Path, floor: &Floor) -> Result<(), Fault> {
    let mut bytes = serde_json::to_vec_pretty(floor).expect("a floor serializes");
    bytes.push(b'\n');
    let path = root.join(FLOOR_FILE);
    crate::host::files::write_atomically(&path, &bytes)
        .map_err(|e| Fault::unwritable(&path, format!("cannot write {}: {e}", path.display())))
}

/// A signed release the deployer may start, and the private copy of its executable to start:
/// the bytes that were hashed are the bytes that run, whatever happens to the release folder
/// afterwards.
#[derive(Debug, Clone)]
pub struct Admitted {
    pub signed: Signed,
    pub executable: PathBuf,
}

/// The deployer's check, under the root's lock and before anything starts. `Ok(None)`: the
/// root has no trust file, releases are unsigned.
pub fn admit(
    root: &Path,
    service: &str,
    version: &str,
    now: DateTime<Utc>,
) -> Result<Option<Admitted>, Error> {
    let Some(checked) =
        check_admission(root, service, version, now, false).map_err(Error::Refused)?
    else {
        return Ok(None);
    };
    let dir = root.join("releases").join(version);
    let refused =
        |r: Refusal| Error::Refused(format!("release {version} of {service} refused ({r})"));
    let copy = verified_copy(root, &dir, version, &checked.executable).map_err(refused)?;
    Ok(Some(Admitted {
        signed: checked.signed,
        executable: copy,
    }))
}

/// What [`admit`] would say, reading only (a dry run): every artifact, the executable too, is
/// hashed in place and nothing is copied.
pub fn would_admit(
    root: &Path,
    service: &str,
    version: &str,
    now: DateTime<Utc>,
) -> Result<Option<Signed>, Error> {
    Ok(check_admission(root, service, version, now, true)
        .map_err(Error::Refused)?
        .map(|c| c.signed))
}

struct Checked {
    signed: Signed,
    executable: Artifact,
}

fn check_admission(
    root: &Path,
    service: &str,
    version: &str,
    now: DateTime<Utc>,
    hash_executable: bool,
) -> Result<Option<Checked>, String> {
    let trust_path = root.join(TRUST_FILE);
    let Some(trust) = read_config::<Trust>(&trust_path, TRUST_SHAPE).map_err(|e| e.to_string())?
    else {
        return Ok(None);
    };
    trust
        .check()
        .map_err(|e| format!("{}: {e}", trust_path.display()))?;
    let dir = root.join("releases").join(version);
    let refused = |r: Refusal| format!("release {version} of {service} refused ({r})");
    let verified =
        verify(&dir.join(MANIFEST_FILE), &trust, now, Some(service), None).map_err(refused)?;
    if verified.body.version != version {
        return Err(refused(Refusal::new(
            Reason::Malformed,
            format!("the manifest is for version {}", verified.body.version),
        )));
    }
    above_floor(
        &verified,
        read_floor(root).map_err(|e| e.to_string())?.as_ref(),
    )
    .map_err(refused)?;
    let Some(executable) = verified.body.artifacts.iter().find(|a| a.name == service) else {
        return Err(refused(Refusal::new(
            Reason::Digest,
            format!("the executable {service} is not among the signed artifacts"),
        )));
    };
    for artifact in verified
        .body
        .artifacts
        .iter()
        .filter(|a| hash_executable || a.name != service)
    {
        check_artifact(&dir, artifact, None).map_err(refused)?;
    }
    Ok(Some(Checked {
        signed: Signed {
            sequence: verified.body.sequence,
            version: version.into(),
            manifest_sha256: verified.manifest_sha256.clone(),
        },
        executable: executable.clone(),
    }))
}

/// Copies the executable into `ROOT/.verified/<version>/` (rollgate's own; the start of a release
/// opens the folder to its service alone: `host::account`), read-only, hashing the
/// bytes as they are copied; the copy is kept only if they are the signed ones.
fn verified_copy(
    root: &Path,
    dir: &Path,
    version: &str,
    executable: &Artifact,
) -> Result<PathBuf, Refusal> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    let failed = |what: String| Refusal::new(Reason::Digest, what);
    let folder = root.join(".verified").join(version);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&folder)
        .map_err(|e| failed(format!("cannot create {}: {e}", folder.display())))?;
    let target = folder.join(&executable.name);
    let partial = folder.join(format!(
        ".{}.partial.{}",
        executable.name,
        std::process::id()
    ));
    let result = (|| {
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o700)
            .open(&partial)
            .map_err(|e| failed(format!("cannot create {}: {e}", partial.display())))?;
        check_artifact(dir, executable, Some(&mut out))?;
        out.sync_all()
            .map_err(|e| failed(format!("cannot write {}: {e}", partial.display())))?;
        drop(out);
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o555))
            .and_then(|()| std::fs::rename(&partial, &target))
            .map_err(|e| failed(format!("cannot place {}: {e}", target.display())))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result.map(|()| target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verified(version: &str, sequence: u64, digest: &str) -> Verified {
        Verified {
            body: Body {
                kind: manifest::TYPE.into(),
                spec: 1,
                service: "s".into(),
                version: version.into(),
                sequence,
                issued_at: String::new(),
                expires_at: String::new(),
                keys: vec![],
                artifacts: vec![],
            },
            manifest_sha256: digest.into(),
        }
    }

    #[test]
    fn the_floor_lets_only_newer_releases_or_its_own_manifest_through() {
        let floor = Floor {
            sequence: 14,
            version: "v14".into(),
            manifest_sha256: "aa".into(),
        };
        assert!(above_floor(&verified("v15", 15, "bb"), Some(&floor)).is_ok());
        assert!(above_floor(&verified("v14", 14, "aa"), Some(&floor)).is_ok());
        assert!(above_floor(&verified("v13", 13, "cc"), None).is_ok());
        let r = above_floor(&verified("v13", 13, "cc"), Some(&floor)).unwrap_err();
        assert_eq!(r.reason, Reason::Rollback);
        let r = above_floor(&verified("other", 14, "dd"), Some(&floor)).unwrap_err();
        assert_eq!(r.reason, Reason::Rollback);
        let r = above_floor(&verified("v14", 16, "ee"), Some(&floor)).unwrap_err();
        assert_eq!(r.reason, Reason::Conflict);
    }

    #[test]
    fn durations_and_times() {
        assert_eq!(
            parse_duration("30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
        assert_eq!(parse_duration("90m").unwrap(), Duration::from_secs(5_400));
        assert!(parse_duration("0d").is_err());
        assert!(parse_duration("3w").is_err());
        assert!(parse_duration("99999999999999999999d").is_err());
        assert_eq!(parse_time("0").unwrap().timestamp(), 0);
        assert_eq!(
            parse_time("2026-11-30T12:00:00Z").unwrap().timestamp(),
            1_796_040_000
        );
    }
}
