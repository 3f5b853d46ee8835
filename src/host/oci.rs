//! An OCI image layout archive (`oci-archive:FILE.tar`) said as a `docker save` archive, which
//! is what the Docker Engine 20.10 loads: the same config and layer blobs (compressed layers
//! included: the engine decompresses what it loads), and a `manifest.json` naming them.
//!
//! The layout's `index.json` names a manifest, or an index of manifests per platform (then the
//! one for this machine's architecture on Linux, else the only one, is taken).

use std::io::Read;
use std::path::Path;

use serde::Deserialize;

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
    layers: Vec<Descriptor>,
}

/// The largest JSON document (index or manifest) read from a layout.
const MAX_JSON: u64 = 4 << 20;

fn invalid(file: &Path, what: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "{} is not an OCI image layout archive: {what}",
            file.display()
        ),
    )
}

/// The file at `name` in the tar `file`, if it is there (JSON: bounded).
fn member(file: &Path, name: &str) -> std::io::Result<Option<Vec<u8>>> {
    let mut archive = tar::Archive::new(std::fs::File::open(file)?);
    for entry in archive.entries()? {
        let entry = entry?;
        let path = entry
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        if path == name {
            let mut bytes = Vec::new();
            entry.take(MAX_JSON).read_to_end(&mut bytes)?;
            return Ok(Some(bytes));
        }
    }
    Ok(None)
}

/// The blob `digest` (`sha256:HEX`) as a path in the layout.
fn blob_path(file: &Path, digest: &str) -> std::io::Result<String> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()))
        .ok_or_else(|| invalid(file, format!("digest {digest} is not sha256:HEX")))?;
    Ok(format!("blobs/sha256/{hex}"))
}

fn json<T: for<'a> Deserialize<'a>>(file: &Path, name: &str) -> std::io::Result<T> {
    let bytes = member(file, name)?.ok_or_else(|| invalid(file, format!("no {name}")))?;
    serde_json::from_slice(&bytes).map_err(|e| invalid(file, format!("{name}: {e}")))
}

/// The manifest the layout's index names for this machine.
fn manifest(file: &Path) -> std::io::Result<Manifest> {
    let index: Index = json(file, "index.json")?;
    let mut chosen = pick(file, &index.manifests)?;
    // An index of manifests (several platforms): one level down.
    if chosen.media_type.ends_with("image.index.v1+json")
        || chosen.media_type.ends_with("manifest.list.v2+json")
    {
        let inner: Index = json(file, &blob_path(file, &chosen.digest)?)?;
        chosen = pick(file, &inner.manifests)?;
        return json(file, &blob_path(file, &chosen.digest)?);
    }
    json(file, &blob_path(file, &chosen.digest)?)
}

fn pick<'d>(file: &Path, manifests: &'d [Descriptor]) -> std::io::Result<&'d Descriptor> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    match manifests {
        [] => Err(invalid(file, "its index names no manifest")),
        [one] => Ok(one),
        several => several
            .iter()
            .find(|d| {
                d.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == arch)
            })
            .ok_or_else(|| {
                invalid(
                    file,
                    format!("no manifest for linux/{arch} among {}", several.len()),
                )
            }),
    }
}

/// A temporary `docker save` archive holding the layout's image (removed when dropped).
pub fn as_docker_archive(file: &Path) -> std::io::Result<tempfile::NamedTempFile> {
    let manifest = manifest(file)?;
    let config = blob_path(file, &manifest.config.digest)?;
    let layers = manifest
        .layers
        .iter()
        .map(|l| blob_path(file, &l.digest))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut wanted: std::collections::BTreeSet<String> = layers.iter().cloned().collect();
    wanted.insert(config.clone());
    let out = tempfile::NamedTempFile::new()?;
    let mut builder = tar::Builder::new(std::io::BufWriter::new(out.reopen()?));
    let mut archive = tar::Archive::new(std::fs::File::open(file)?);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry
            .path()?
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        if wanted.remove(&path) {
            let mut header = entry.header().clone();
            builder.append_data(&mut header, &path, &mut entry)?;
        }
    }
    if let Some(missing) = wanted.first() {
        return Err(invalid(file, format!("{missing} is missing")));
    }
    let said = serde_json::json!([{ "Config": config, "RepoTags": null, "Layers": layers }]);
    let text = said.to_string();
    let mut header = tar::Header::new_gnu();
    header.set_size(text.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append_data(&mut header, "manifest.json", text.as_bytes())?;
    builder
        .into_inner()?
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()?;
    Ok(out)
}

/// The image ID a `docker save` archive holds (its `manifest.json`'s one `Config`, named
/// `HEX.json` or `blobs/sha256/HEX`), read without loading it; None when it says none.
pub fn docker_archive_config(file: &Path) -> std::io::Result<Option<String>> {
    #[derive(Deserialize)]
    struct Entry {
        #[serde(rename = "Config")]
        config: String,
    }
    let Some(bytes) = member(file, "manifest.json")? else {
        return Ok(None);
    };
    let entries: Vec<Entry> = serde_json::from_slice(&bytes).unwrap_or_default();
    let [entry] = entries.as_slice() else {
        return Ok(None);
    };
    let name = entry.config.rsplit('/').next().unwrap_or("");
    let hex = name.strip_suffix(".json").unwrap_or(name);
    Ok(
        (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()))
            .then(|| format!("sha256:{hex}")),
    )
}
