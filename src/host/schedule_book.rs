//! `ROOT/schedules.json`: what has been taken of each schedule (issue 70) — the latest due time
//! taken (started, skipped or said missed: never taken again, whoever keeps the clock next),
//! the runs still going (each one's process, found again by its token after a crash), and how
//! the last run ended. Read and changed only under [`Book::change`]'s lock, so the clock's
//! keeper and `rollgate schedules run` never take one due time twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::fault::Fault;
use super::files::{read_json, write_atomically};
use super::identity::Identity;

pub const BOOK_FILE: &str = "schedules.json";
const BOOK_LOCK: &str = ".schedules.lock";

/// The root's book of schedules.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Book {
    pub schedules: BTreeMap<String, Taken>,
}

/// What has been taken of one schedule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Taken {
    /// The latest due time taken (Unix seconds).
    pub last_due: Option<f64>,
    pub running: Vec<Running>,
    pub last: Option<Ended>,
}

/// A run still going.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Running {
    /// The due time it is for (`None`: run by a person, `schedules run`).
    pub due: Option<f64>,
    pub version: String,
    /// Its cgroup label and `ROLLGATE_DEPLOY_TOKEN`: how it is found when its pid is not known
    /// (its starter died between the record and the spawn).
    pub token: String,
    /// 0 until it is spawned.
    pub pid: i32,
    pub start_time: u64,
    pub started_at: f64,
    /// When it is stopped if it still runs (its `timeout_ms`).
    pub deadline: f64,
    /// The pid of the rollgate that waits on it.
    pub waiter: i32,
}

impl Running {
    pub fn identity(&self) -> Identity {
        Identity {
            pid: self.pid,
            start_time: self.start_time,
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ended {
    pub due: Option<f64>,
    pub version: String,
    pub ok: bool,
    /// `exit status 0`, `stopped at its time limit (600000 ms)`.
    pub words: String,
    pub finished_at: f64,
    pub took_ms: u64,
}

pub fn path(root: &Path) -> PathBuf {
    root.join(BOOK_FILE)
}

/// `ROOT/.keepers/clock.lock`: held by the root's clock keeper for its life.
pub fn keeper_lock(root: &Path) -> PathBuf {
    root.join(super::keeper::KEEPERS_DIR).join("clock.lock")
}

impl Book {
    /// The book as it is (empty without the file); names are checked, as they reach paths.
    pub fn read(root: &Path) -> Result<Book, Fault> {
        let path = path(root);
        let book: Book = read_json(&path)?.unwrap_or_default();
        for (name, taken) in &book.schedules {
            super::files::checked(&path, name, super::names::check_name("schedule", name))?;
            for run in &taken.running {
                super::files::checked(
                    &path,
                    name,
                    super::names::check_name("version", &run.version),
                )?;
            }
        }
        Ok(book)
    }

    /// Reads the book, lets `change` decide, writes it back (when `change` says so), all under
    /// the book's lock; returns what `change` returned.
    pub fn change<T>(root: &Path, change: impl FnOnce(&mut Book) -> (bool, T)) -> Result<T, Fault> {
        let lock_path = root.join(BOOK_LOCK);
        let unlockable = |why: String| Fault::Unlockable {
            path: lock_path.clone(),
            why,
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| unlockable(format!("cannot open {}: {e}", lock_path.display())))?;
        // Held for a read, a decision and a write: moments, so waiting is right.
        let _held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| unlockable(format!("cannot lock {}: {e}", lock_path.display())))?;
        let mut book = Book::read(root)?;
        let (write, answer) = change(&mut book);
        if write {
            let mut bytes = serde_json::to_vec_pretty(&book).expect("a book serializes");
            bytes.push(b'\n');
            write_atomically(&path(root), &bytes)
                .map_err(|e| unlockable(format!("cannot write {}: {e}", path(root).display())))?;
        }
        Ok(answer)
    }
}
