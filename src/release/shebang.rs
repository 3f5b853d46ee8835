//! Scripts that start an interpreter a confined release cannot reach (issue 67, 3). A Python
//! virtual environment's console scripts (`venv/bin/gunicorn`) begin with the absolute path of
//! the environment's interpreter where it was *built* (`#!/build/app/venv/bin/python3`): once
//! installed under the root, that path is outside the release folder, and Landlock lets a
//! release read only the system's folders and its own. `release add` says which scripts do,
//! and the way out, rather than leaving the first deploy to fail.

use std::io::Read;
use std::path::{Path, PathBuf};

/// One script whose interpreter is out of a confined release's reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stranded {
    /// The script, relative to the release's top.
    pub script: PathBuf,
    /// The interpreter its first line names.
    pub interpreter: PathBuf,
}

/// The executable scripts under `tree` (the release being installed; it will live at
/// `installed_at`) whose `#!` interpreter is neither in the release nor in a folder of the
/// system a confined release reads. At most `limit` are listed.
pub fn stranded(tree: &Path, installed_at: &Path, limit: usize) -> Vec<Stranded> {
    let mut found = Vec::new();
    let mut waiting = vec![tree.to_path_buf()];
    while let Some(folder) = waiting.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() {
                waiting.push(path);
                continue;
            }
            if !kind.is_file() || !executable(&path) {
                continue;
            }
            let inside = path.strip_prefix(tree).unwrap_or(&path);
            let Some(interpreter) = interpreter_of(tree, inside) else {
                continue;
            };
            if reachable(&interpreter, installed_at) {
                continue;
            }
            found.push(Stranded {
                script: path.strip_prefix(tree).unwrap_or(&path).to_path_buf(),
                interpreter,
            });
            if found.len() >= limit {
                return found;
            }
        }
    }
    found.sort_by(|a, b| a.script.cmp(&b.script));
    found
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

/// The absolute interpreter the first line of the script `inside` of `tree` names (`#!/path
/// args`), if it has one; read beneath the tree (`host::beneath`), never through a link.
fn interpreter_of(tree: &Path, inside: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let n = crate::host::beneath::open_file(tree, inside)
        .ok()??
        .read(&mut head)
        .ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = &line[..line.iter().position(|b| *b == b'\n').unwrap_or(line.len())];
    let text = std::str::from_utf8(line).ok()?;
    let interpreter = text.split_whitespace().next()?;
    interpreter
        .starts_with('/')
        .then(|| PathBuf::from(interpreter))
}

/// Whether a confined release of the folder `installed_at` can run `interpreter`: it is in
/// the release, or in a folder of the system.
fn reachable(interpreter: &Path, installed_at: &Path) -> bool {
    interpreter.starts_with(installed_at)
        || crate::host::filesystem::SYSTEM
            .iter()
            .any(|system| interpreter.starts_with(system))
}

/// The words `release add` says of them, with the way out.
pub fn words(version: &str, stranded: &[Stranded]) -> String {
    let named: Vec<String> = stranded
        .iter()
        .map(|s| format!("{} (#!{})", s.script.display(), s.interpreter.display()))
        .collect();
    format!(
        "rollgate: {} script{} of {version} start{} an interpreter outside the release, which a confined release cannot reach: {}. Run them through an interpreter inside the release or the system's (exec venv/bin/python -m gunicorn …, not venv/bin/gunicorn), or build the virtual environment at the path the release is installed at",
        stranded.len(),
        if stranded.len() == 1 { "" } else { "s" },
        if stranded.len() == 1 { "s" } else { "" },
        named.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_naming_its_build_folders_interpreter_is_found_and_the_systems_is_not() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = |name: &str, text: &str, mode: u32| {
            let path = dir.path().join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        script(
            "venv/bin/gunicorn",
            "#!/build/app/venv/bin/python3\nimport sys\n",
            0o755,
        );
        script("run.sh", "#!/bin/sh\nexec true\n", 0o755);
        script("env.py", "#!/usr/bin/env python3\n", 0o755);
        script(
            "inside",
            "#!/srv/edge/releases/v2/venv/bin/python3 -u\n",
            0o755,
        );
        script("notes.txt", "#!/build/app/venv/bin/python3\n", 0o644);
        let found = stranded(dir.path(), Path::new("/srv/edge/releases/v2"), 10);
        assert_eq!(
            found,
            vec![Stranded {
                script: PathBuf::from("venv/bin/gunicorn"),
                interpreter: PathBuf::from("/build/app/venv/bin/python3"),
            }]
        );
        let said = words("v2", &found);
        assert!(
            said.contains("1 script of v2 starts an interpreter outside the release"),
            "{said}"
        );
        assert!(
            said.contains("venv/bin/gunicorn (#!/build/app/venv/bin/python3)"),
            "{said}"
        );
        assert!(said.contains("-m gunicorn"), "{said}");
    }
}
