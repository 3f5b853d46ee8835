//! The contract shipped inside the binary.
//!
//! Nickel resolves `import "rollout-policy.ncl"` against real directories only (the importing
//! file's folder, then the import path), and `Program` gives no way to register an in-memory
//! file after it is built. So the bundled contract is written once to a per-user cache folder
//! whose name carries a hash of its content, and that folder goes last on the import path: a
//! `rollout-policy.ncl` beside the policy or on `--import-path` still wins.
//!
//! The cache folder must be the user's own: created 0700, owned by the user, not
//! writable by others, and never a symlink. Without `$XDG_CACHE_HOME` and `$HOME` it lies under
//! the shared temporary folder, where another user could otherwise plant a weaker contract (or
//! a symlink to one) before rollgate first runs.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The contract as committed in `contracts/rollout-policy.ncl`.
pub const ROLLOUT_POLICY_NCL: &str = include_str!("../../contracts/rollout-policy.ncl");
/// The file name policies import.
pub const CONTRACT_FILE: &str = "rollout-policy.ncl";

/// FNV-1a: stable across Rust versions (unlike `DefaultHasher`), so the folder name of a given
/// contract never changes between builds.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("rollgate");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".cache").join("rollgate");
    }
    std::env::temp_dir().join(format!("rollgate-{}", nix::unistd::getuid()))
}

/// Returns the folder holding the bundled `rollout-policy.ncl`, writing it there first if it is
/// missing or differs. The write goes through a temporary file and a rename, so concurrent runs
/// never see a torn contract.
pub fn contracts_dir() -> std::io::Result<PathBuf> {
    let root = cache_root();
    let dir = root.join(format!(
        "contracts-{:016x}",
        fnv1a(ROLLOUT_POLICY_NCL.as_bytes())
    ));
    if let Some(parent) = root.parent() {
        fs::create_dir_all(parent)?;
    }
    private_dir(&root)?;
    private_dir(&dir)?;
    let target = dir.join(CONTRACT_FILE);
    if fs::read(&target).is_ok_and(|bytes| bytes == ROLLOUT_POLICY_NCL.as_bytes()) {
        return Ok(dir);
    }
    write_atomically(&target, ROLLOUT_POLICY_NCL.as_bytes())?;
    Ok(dir)
}

/// Creates `path` as a 0700 folder if it is missing, then makes sure it is a real folder (not
/// a symlink), owned by this user and writable by nobody else.
fn private_dir(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let unsafe_folder = |why: String| {
        std::io::Error::other(format!(
            "{} {why}; rollgate keeps the bundled contract only in a private folder of yours (remove it, or set XDG_CACHE_HOME)",
            path.display()
        ))
    };
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Err(unsafe_folder("is a symlink".into()));
    }
    if !meta.is_dir() {
        return Err(unsafe_folder("is not a folder".into()));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(unsafe_folder(format!(
            "belongs to uid {}, not {me}",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_folder(format!(
            "is writable by others (mode {:o})",
            meta.mode() & 0o777
        )));
    }
    Ok(())
}

fn write_atomically(target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = target.with_extension(format!("tmp.{}", std::process::id()));
    let mut file = fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(&tmp, target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_folder_is_private_and_never_a_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("fresh");
        private_dir(&fresh).unwrap();
        let mode = fs::metadata(&fresh).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let planted = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(planted.path(), &link).unwrap();
        let err = private_dir(&link).unwrap_err().to_string();
        assert!(err.contains("is a symlink"), "{err}");
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let err = private_dir(&open).unwrap_err().to_string();
        assert!(err.contains("writable by others"), "{err}");
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
