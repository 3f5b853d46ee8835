//! `rollgate secret set|list|rm`: the root's secret values, one file each in `ROOT/secrets/`
//! (the folder 0700, each file 0600, replaced atomically). A value is read from standard input,
//! never from the command line (where `ps` and shell history would show it), and is only ever
//! given to a release's process in its environment.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::error::{refused, Error};
use crate::host::config::{check_secret_name, secrets_dir};
use crate::host::files::read_at_most;

/// The most a secret value may hold.
const MAX_SECRET_BYTES: usize = 64 << 10;

fn folder(root: &Path) -> Result<std::path::PathBuf, Error> {
    let dir = secrets_dir(root);
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Error::Failed(format!("cannot create {}: {e}", dir.display())))?;
    }
    let mode = std::fs::metadata(&dir)
        .map_err(|e| Error::Failed(format!("cannot read {}: {e}", dir.display())))?
        .permissions()
        .mode()
        & 0o777;
    if mode & 0o077 != 0 {
        return Err(refused(format!(
            "{} is mode {mode:o}: readable beyond its owner; chmod 700 it",
            dir.display()
        )));
    }
    Ok(dir)
}

/// `secret set NAME`: the value from `input` (one trailing newline dropped, so `echo` works).
pub fn set(root: &Path, name: &str, input: &mut impl Read) -> Result<String, Error> {
    check_secret_name(name)?;
    let mut value = read_at_most(input, MAX_SECRET_BYTES as u64)
        .map_err(|e| refused(format!("cannot read the value from standard input: {e}")))?
        .ok_or_else(|| refused(format!("the value is longer than {MAX_SECRET_BYTES} bytes")))?;
    if value.ends_with(b"\n") {
        value.pop();
    }
    if value.is_empty() {
        return Err(refused("no value on standard input (pipe it in: `printf %s \"$TOKEN\" | rollgate secret set NAME`)"));
    }
    if String::from_utf8(value.clone()).is_err() || value.contains(&0) {
        return Err(refused("the value is not UTF-8 text without NUL bytes"));
    }
    let dir = folder(root)?;
    let path = dir.join(name);
    let partial = dir.join(format!(".{name}.{}.partial", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&partial)?;
        file.write_all(&value)?;
        file.sync_all()?;
        std::fs::rename(&partial, &path)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(Error::Failed(format!(
            "cannot write {}: {e}",
            path.display()
        )));
    }
    Ok(format!("secret {name} set ({} bytes)\n", value.len()))
}

/// `secret list`: names and when each was set; never a value.
pub fn list(root: &Path) -> Result<String, Error> {
    let dir = secrets_dir(root);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok("no secrets\n".into());
    };
    let mut rows: Vec<(String, f64)> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| {
            let set = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0.0, |d| d.as_secs_f64());
            (e.file_name().to_string_lossy().to_string(), set)
        })
        .collect();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    if rows.is_empty() {
        return Ok("no secrets\n".into());
    }
    Ok(rows
        .iter()
        .map(|(name, set)| {
            format!(
                "{name}\tset {}\n",
                crate::render::time::format_time(set.floor())
            )
        })
        .collect())
}

/// `secret rm NAME`.
pub fn remove(root: &Path, name: &str) -> Result<String, Error> {
    check_secret_name(name)?;
    let path = secrets_dir(root).join(name);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(format!("secret {name} removed\n")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(refused(format!(
            "no secret {name} ({} is missing)",
            path.display()
        ))),
        Err(e) => Err(Error::Failed(format!(
            "cannot remove {}: {e}",
            path.display()
        ))),
    }
}
