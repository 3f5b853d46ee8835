//! The policy a service is held to, kept in its root (issue 67): the evaluated entry a deploy,
//! rollout, rollback or `config set` ran under, with its source file's path and SHA-256, in
//! `ROOT/policies/VERSION.json` beside the release it was used for. The live release's record
//! is the service's policy: every command on the root that is not given `--policy` runs under
//! it (its probe, hooks, user, limits, ports...), instead of falling back to the defaults —
//! a rollback without `--policy` keeps the user the live release runs as. A different
//! `--policy` takes effect only through the deploy it is given to: its record is that
//! release's, and becomes the service's when the release goes live.
//!
//! The record is the evaluated value (JSON), so a later command never evaluates Nickel again
//! nor needs the file; hooks are still found beside the source file, where they were.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fault::Fault;
use super::state::Root;
use crate::policy::RolloutSettings;

/// The folder of a root that holds one record per release.
pub const FOLDER: &str = "policies";

/// One release's policy, as it was evaluated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeptPolicy {
    /// The policy file, absolute.
    pub source: PathBuf,
    /// Its SHA-256 when it was evaluated (hex).
    pub sha256: String,
    /// The entry of the file that is this service's.
    pub entry: String,
    /// The entry as evaluated (what `nickel export` gives for it).
    pub value: serde_json::Value,
}

impl KeptPolicy {
    /// The record of entry `entry` of the policy file `source`, evaluated to `value`.
    pub fn of_file(source: &Path, entry: &str, value: serde_json::Value) -> KeptPolicy {
        use sha2::Digest;
        let bytes = std::fs::read(source).unwrap_or_default();
        let source = std::fs::canonicalize(source).unwrap_or_else(|_| source.to_path_buf());
        KeptPolicy {
            source,
            sha256: sha2::Sha256::digest(&bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            entry: entry.to_string(),
            value,
        }
    }

    /// The settings the record holds; a record that is not a rollout policy is refused by
    /// its path.
    pub fn settings(&self, path: &Path) -> Result<RolloutSettings, Fault> {
        serde_json::from_value(self.value.clone()).map_err(|e| {
            Fault::unreadable(
                path,
                format!(
                    "{}: the kept policy is not a rollout policy ({e}); deploy with --policy to replace it",
                    path.display()
                ),
            )
        })
    }

    /// Where `version`'s record is.
    pub fn path(root: &Root, version: &str) -> PathBuf {
        root.0.join(FOLDER).join(format!("{version}.json"))
    }

    /// `version`'s record, if it has one.
    pub fn of_release(root: &Root, version: &str) -> Result<Option<KeptPolicy>, Fault> {
        super::files::read_json(&KeptPolicy::path(root, version))
    }

    /// The service's policy: the live release's record (none before a first release, or for
    /// a release deployed without a policy).
    pub fn of_live(root: &Root) -> Result<Option<(String, KeptPolicy)>, Fault> {
        let Some(pointer) = root.read_pointer()? else {
            return Ok(None);
        };
        Ok(KeptPolicy::of_release(root, &pointer.version)?.map(|kept| (pointer.version, kept)))
    }

    /// Keeps this record as `version`'s, atomically (the folder made if missing).
    pub fn keep(&self, root: &Root, version: &str) -> Result<(), Fault> {
        let path = KeptPolicy::path(root, version);
        let fail = |why: String| Fault::unwritable(&path, why);
        let folder = root.0.join(FOLDER);
        match std::fs::create_dir(&folder) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(fail(format!("cannot make {}: {e}", folder.display()))),
        }
        let mut bytes = serde_json::to_vec_pretty(self).map_err(|e| fail(e.to_string()))?;
        bytes.push(b'\n');
        super::files::write_atomically(&path, &bytes)
            .map_err(|e| fail(format!("cannot write {}: {e}", path.display())))
    }

    /// `version` runs under no policy file (the defaults): a record an earlier attempt left
    /// for it goes, so that it never becomes the service's policy by mistake.
    pub fn forget(root: &Root, version: &str) -> Result<(), Fault> {
        super::files::remove_if_there(&KeptPolicy::path(root, version))
    }

    /// The SHA-256 of the policy file `version` of the root at `root` runs under, when it has
    /// a record: what its log lines name (`policy`).
    pub fn digest_of(root: &Path, version: &str) -> Option<String> {
        #[derive(Deserialize)]
        struct Digest {
            sha256: String,
        }
        let path = root.join(FOLDER).join(format!("{version}.json"));
        let text = std::fs::read(path).ok()?;
        serde_json::from_slice::<Digest>(&text)
            .ok()
            .map(|d| d.sha256)
            .filter(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()))
    }

    /// What would change, field by field, if `other` replaced this policy: `field: old → new`
    /// (nested fields dotted, `(unset)` for a field one of them leaves out), in field order.
    pub fn changes_to(&self, other: &KeptPolicy) -> Vec<String> {
        let (mut before, mut after) = (Default::default(), Default::default());
        flatten(&self.value, "", &mut before);
        flatten(&other.value, "", &mut after);
        let fields: std::collections::BTreeSet<&String> =
            before.keys().chain(after.keys()).collect();
        let unset = "(unset)".to_string();
        fields
            .into_iter()
            .filter_map(|field| {
                let (old, new) = (before.get(field), after.get(field));
                (old != new).then(|| {
                    format!(
                        "{field}: {} → {}",
                        old.unwrap_or(&unset),
                        new.unwrap_or(&unset)
                    )
                })
            })
            .collect()
    }

    /// The digest in words (its first 12 hex digits), for a line that names the policy.
    pub fn short_digest(&self) -> &str {
        &self.sha256[..self.sha256.len().min(12)]
    }
}

/// `value`'s leaves by dotted path (an object's fields recursed into; anything else, arrays
/// included, as its JSON text).
fn flatten(
    value: &serde_json::Value,
    prefix: &str,
    into: &mut std::collections::BTreeMap<String, String>,
) {
    match value {
        serde_json::Value::Object(fields) if !fields.is_empty() => {
            for (name, inner) in fields {
                let path = match prefix {
                    "" => name.clone(),
                    _ => format!("{prefix}.{name}"),
                };
                flatten(inner, &path, into);
            }
        }
        leaf => {
            into.insert(prefix.to_string(), leaf.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_names_its_source_by_digest() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("policy.json");
        std::fs::write(&source, "{}").unwrap();
        let value = serde_json::json!({"progress_deadline_ms": 5000, "poll_ms": 100,
            "max_unavailable_pct": 0, "max_surge_pct": 100, "on_stall": "rollback"});
        let kept = KeptPolicy::of_file(&source, "edge_svc", value);
        // SHA-256 of "{}".
        assert!(
            kept.sha256.starts_with("44136fa355b3678a"),
            "{}",
            kept.sha256
        );
        let root = Root(dir.path().to_path_buf());
        kept.keep(&root, "v1").unwrap();
        let read = KeptPolicy::of_release(&root, "v1").unwrap().unwrap();
        assert_eq!(read, kept);
        let settings = read.settings(&KeptPolicy::path(&root, "v1")).unwrap();
        assert_eq!(settings.progress_deadline_ms, 5000);
        assert_eq!(KeptPolicy::of_release(&root, "v2").unwrap(), None);
        assert_eq!(
            KeptPolicy::digest_of(dir.path(), "v1").as_deref(),
            Some(kept.sha256.as_str())
        );
        assert_eq!(KeptPolicy::digest_of(dir.path(), "v2"), None);
    }

    #[test]
    fn changes_are_said_field_by_field_nested_fields_dotted() {
        let kept = |value| KeptPolicy {
            source: PathBuf::from("/p.json"),
            sha256: String::new(),
            entry: "edge_svc".into(),
            value,
        };
        let before = kept(serde_json::json!({"poll_ms": 100, "watch_ms": 2000,
            "isolation": {"user": "www", "memory_mb": 256}}));
        let after = kept(
            serde_json::json!({"poll_ms": 100, "probe": {"host": "example.com"},
            "isolation": {"user": "app", "memory_mb": 256}}),
        );
        assert_eq!(
            before.changes_to(&after),
            [
                "isolation.user: \"www\" → \"app\"",
                "probe.host: (unset) → \"example.com\"",
                "watch_ms: 2000 → (unset)",
            ]
        );
        assert!(before.changes_to(&before).is_empty());
    }
}
