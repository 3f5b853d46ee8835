//! The contract shipped inside the binary.
//!
//! Nickel resolves `import "rollout-policy.ncl"` against real directories only (the importing
//! file's folder, then the import path), and `Program` gives no way to register an in-memory
//! file after it is built. So the bundled contract is written once to a per-user cache folder
//! whose name carries a hash of its content, and that folder goes last on the import path: a
//! `rollout-policy.ncl` beside the policy or on `--import-path` still wins.

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
    let dir = cache_root().join(format!(
        "contracts-{:016x}",
        fnv1a(ROLLOUT_POLICY_NCL.as_bytes())
    ));
    let target = dir.join(CONTRACT_FILE);
    if fs::read(&target).is_ok_and(|bytes| bytes == ROLLOUT_POLICY_NCL.as_bytes()) {
        return Ok(dir);
    }
    fs::create_dir_all(&dir)?;
    write_atomically(&target, ROLLOUT_POLICY_NCL.as_bytes())?;
    Ok(dir)
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
    fn fnv_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
