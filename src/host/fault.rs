//! What can go wrong on the host, said by what failed: each variant names the name, file,
//! field or hook, and knows whether it refuses a command (nothing changed: a bad name, a busy
//! root, a setting out of bounds) or fails one (an effect the host would not make). The
//! command's error (`error.rs`) takes its class and exit code from [`Fault::refuses`].

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Fault {
    /// A name that becomes a path or a variable and is not one (a service, a version, a
    /// secret, an environment variable).
    #[error("{why}")]
    Name {
        kind: String,
        name: String,
        why: String,
    },
    /// Another rollgate holds the root's lock.
    #[error(
        "another deploy is running on this root (pid {holder}, holding {}); wait for it to finish",
        path.display()
    )]
    Busy { path: PathBuf, holder: String },
    /// The root's lock that cannot be opened or taken (nothing was started).
    #[error("{why}")]
    Unlockable { path: PathBuf, why: String },
    /// A root that is not a folder (a typo must not read as "nothing promoted yet").
    #[error("root {} is not a folder", path.display())]
    NotARoot { path: PathBuf },
    /// A setting (a policy's or the command line's) outside what rollgate runs with.
    #[error("{why}")]
    Setting { field: String, why: String },
    /// A file that cannot be read, or that rollgate did not write as it is.
    #[error("{why}")]
    Unreadable { path: PathBuf, why: String },
    /// A file, folder or lock the host would not write, remove or take.
    #[error("{why}")]
    Unwritable { path: PathBuf, why: String },
    /// The signals a run must own cannot be taken.
    #[error("cannot handle {signal}: {source}; nothing was started")]
    Signals {
        signal: &'static str,
        source: std::io::Error,
    },
    /// A hook that could not run, failed or timed out.
    #[error("{why}")]
    Hook { hook: &'static str, why: String },
}

impl Fault {
    /// Whether the command it stops is refused (nothing changed) rather than failed.
    pub fn refuses(&self) -> bool {
        !matches!(self, Fault::Unwritable { .. })
    }

    /// A setting out of bounds: `field` and what is wrong with it.
    pub fn setting(field: &str, why: impl Into<String>) -> Fault {
        Fault::Setting {
            field: field.to_string(),
            why: why.into(),
        }
    }

    /// A file that could not be written or removed, with the words saying so.
    pub fn unwritable(path: &std::path::Path, why: impl Into<String>) -> Fault {
        Fault::Unwritable {
            path: path.to_path_buf(),
            why: why.into(),
        }
    }

    /// A file that could not be read, with the words saying so.
    pub fn unreadable(path: &std::path::Path, why: impl Into<String>) -> Fault {
        Fault::Unreadable {
            path: path.to_path_buf(),
            why: why.into(),
        }
    }
}
