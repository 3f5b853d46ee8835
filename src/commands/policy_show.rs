//! `rollgate policy show --root R [--release V]`: the policy a service is held to, as kept in
//! its root (see `host::kept_policy`), in JSON.

use std::path::Path;

use crate::error::{refused, Error};
use crate::host::kept_policy::KeptPolicy;
use crate::host::state::Root;

/// The kept policy of `release`, else of the live release, as one JSON document.
pub fn show(root: &Path, release: Option<&str>) -> Result<String, Error> {
    let root = Root::existing(root.to_path_buf())?;
    let version = match release {
        Some(version) => {
            crate::host::names::check_name("version", version)?;
            version.to_string()
        }
        None => root.read_pointer()?.map(|p| p.version).ok_or_else(|| {
            refused(format!(
                "nothing is live under {}: name a release with --release V",
                root.0.display()
            ))
        })?,
    };
    let kept = KeptPolicy::of_release(&root, &version)?;
    let document = serde_json::json!({ "version": version, "kept": kept });
    serde_json::to_string_pretty(&document)
        .map(|text| text + "\n")
        .map_err(|e| Error::Failed(e.to_string()))
}
