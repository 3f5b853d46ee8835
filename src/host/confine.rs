//! What a service's process is started inside (issue 59): its user, its folders, its
//! filesystem rules and its cgroup, prepared in the parent and taken on by the child between
//! fork and exec. Everything rollgate starts for a service goes through here — a release
//! process ([`super::process::spawn`]) and a hook ([`super::hooks`]) alike — so that
//! confinement is never one command's option.

use std::path::{Path, PathBuf};

use landlock::RulesetCreated;

use super::account::{Folders, ServiceUser};
use super::cgroup::{Entry, Limits};

/// The PATH every process rollgate starts for a service has (systemd's default for a unit); a
/// release's env file may set its own.
pub const SERVICE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What rollgate itself reads from its environment, kept for the processes that are rollgate
/// (a container's supervisor): where the container engine is, where its runtime folder is, the
/// test suite's fault points, and how a panic is reported.
const ROLLGATES_OWN: [&str; 5] = [
    "DOCKER_HOST",
    "XDG_RUNTIME_DIR",
    "ROLLGATE_FAULT",
    "ROLLGATE_LOG_PARSER",
    "RUST_BACKTRACE",
];

/// How the service's releases are confined (the policy's `isolation`): its hooks, one-offs and
/// exec probes are so too.
#[derive(Debug, Clone, Copy)]
pub struct Isolation<'a> {
    /// False only where the policy says `isolation.enabled = false`.
    pub confined: bool,
    pub user: Option<&'a str>,
    pub writable: &'a [PathBuf],
    pub limits: &'a Limits,
}

/// How a release's process runs, decided once from its launch record (`LaunchRecord::runner`)
/// and read by every launcher, probe and report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runner {
    /// Its executable, or its Procfile line, on this host.
    Host,
    /// In a container of this image, through rollgate's supervisor (which keeps rollgate's uid
    /// to reach the engine, and hands the service's user and limits to the container).
    Image(String),
}

impl Runner {
    pub fn image(&self) -> Option<&str> {
        match self {
            Runner::Host => None,
            Runner::Image(image) => Some(image),
        }
    }
}

/// Where a process of a service stands: what it reads, what its cgroup is named after, what it
/// may bind. Its isolation (user, writable folders, limits) is its launch record's.
pub struct Placement<'a> {
    /// The service's root: where its user is recorded and its own folders are.
    pub root: &'a Path,
    /// Its release folders: made readable to its user, read and executed under Landlock.
    pub release: &'a [&'a Path],
    /// Folders it only reads and executes, left as they are (a hook's own folder).
    pub readable: &'a [&'a Path],
    /// What its cgroup is named after (the run's token): recovery finds it by this.
    pub label: &'a str,
    /// The TCP ports it may bind (a release's `$PORT`; none for a hook).
    pub ports: &'a [u16],
}

/// What a process of a service is to be confined by.
struct Rules<'a> {
    /// The service's root: where its user is recorded and its own folders are.
    pub root: &'a Path,
    /// False only where the policy says `isolation.enabled = false`.
    pub confined: bool,
    /// The existing user the policy names (`isolation.user`); none: the service's own uid.
    pub user: Option<&'a str>,
    /// Its release folders: made readable to its user, read and executed under Landlock.
    pub release: &'a [&'a Path],
    /// Folders it only reads and executes, left as they are (a hook's own folder).
    pub readable: &'a [&'a Path],
    /// Folders it may write besides its own (`isolation.writable`).
    pub writable: &'a [PathBuf],
    /// What it may use.
    pub limits: &'a Limits,
    /// What its cgroup is named after (the run's token): recovery finds it by this.
    pub label: &'a str,
    /// The TCP ports it may bind (a release's `$PORT`; none for a hook).
    pub ports: &'a [u16],
}

/// A confinement made ready for one child.
pub struct Confinement {
    /// Who it runs as; none where rollgate cannot switch user (it is not root) or the policy
    /// turned confinement off.
    pub user: Option<ServiceUser>,
    /// The service's own folders (`STATE_DIRECTORY`/`HOME`, `TMPDIR`).
    pub folders: Folders,
    confined: bool,
    /// The child becomes `user` (false: it keeps rollgate's uid and hands `user` on, as a
    /// container release's supervisor hands it to the engine).
    switch_user: bool,
    fence: Option<RulesetCreated>,
    entry: Option<Entry>,
}

/// The group whose limits the process shares (see `cgroup::group_of`): its service's, for the
/// release whose folder it runs in.
fn group_of(rules: &Rules) -> String {
    let version = rules
        .release
        .first()
        .and_then(|folder| folder.file_name())
        .map(|name| name.to_string_lossy().into_owned());
    super::cgroup::group_of(rules.root, version.as_deref())
}

impl Confinement {
    /// The one preparation of every process rollgate starts for a service — a release's process,
    /// a one-off, a hook (the release phase too), an exec probe, a standby: `isolation` as its
    /// launch record says, at `place`. One that runs an image is its container's supervisor: it
    /// keeps rollgate's uid and no limits of its own (the container holds them).
    pub fn for_process(
        isolation: Isolation,
        runner: &Runner,
        place: &Placement,
    ) -> std::io::Result<Confinement> {
        let in_container = runner.image().is_some();
        let no_limits = Limits::default();
        let mut confinement = Confinement::prepare(&Rules {
            root: place.root,
            confined: isolation.confined,
            user: isolation.user,
            release: place.release,
            readable: place.readable,
            writable: isolation.writable,
            limits: match in_container {
                true => &no_limits,
                false => isolation.limits,
            },
            label: place.label,
            ports: place.ports,
        })?;
        if in_container {
            confinement.switch_user = false;
        }
        Ok(confinement)
    }

    /// Allocates or finds the service's user, makes its folders, builds the filesystem rules and
    /// the way into a cgroup of its own. Nothing is started yet.
    fn prepare(rules: &Rules) -> std::io::Result<Confinement> {
        let user = match rules.confined && super::account::can_switch_user() {
            true => Some(super::account::for_service(rules.root, rules.user)?),
            false => None,
        };
        let folders = super::account::prepare(rules.root, rules.release, user.as_ref())?;
        let fence = match rules.confined {
            true => {
                let reach: Vec<&Path> = rules
                    .release
                    .iter()
                    .chain(rules.readable)
                    .copied()
                    .collect();
                Some(super::filesystem::ruleset(&super::filesystem::Reach {
                    release: &reach,
                    writable: &[&folders.data, &folders.tmp],
                    listed: rules.writable,
                    ports: rules.ports,
                })?)
            }
            false => None,
        };
        Ok(Confinement {
            user,
            folders,
            confined: rules.confined,
            switch_user: true,
            fence,
            entry: super::cgroup::entry(rules.limits, rules.label, Some(&group_of(rules))),
        })
    }

    /// The child's environment from nothing, as systemd gives a unit's (issue 80, 6): a fixed
    /// PATH, a UTF-8 locale, the service's folders (`STATE_DIRECTORY`/`HOME`, `TMPDIR`) and its
    /// user's name — nothing of the caller's shell, so a release started by a deploy from a
    /// terminal runs as the same release started by `up` from a unit. The launcher adds the
    /// release's configuration and rollgate's own variables after this.
    ///
    /// A container's supervisor is rollgate itself (it keeps rollgate's uid): it also keeps what
    /// rollgate reads from its environment (where the engine is, the test suite's fault points);
    /// the container's own environment is only what the supervisor is told to pass.
    pub fn give_environment(&self, command: &mut tokio::process::Command) {
        command
            .env_clear()
            .env("PATH", SERVICE_PATH)
            .env("LANG", "C.UTF-8")
            .env("STATE_DIRECTORY", &self.folders.data)
            .env("HOME", &self.folders.data)
            .env("TMPDIR", &self.folders.tmp);
        if let Some(name) = self.user.as_ref().and_then(|u| u.name.as_deref()) {
            command.env("USER", name).env("LOGNAME", name);
        }
        if !self.switch_user {
            for name in ROLLGATES_OWN {
                if let Some(value) = std::env::var_os(name) {
                    command.env(name, value);
                }
            }
        }
    }

    /// Makes the child take it on, between fork and exec: a session of its own, its cgroup,
    /// an IPC namespace of its own, no privileges, its user, its filesystem and network rules,
    /// then `also` (the last system calls before exec).
    pub fn install(
        mut self,
        command: &mut tokio::process::Command,
        also: impl Fn() -> std::io::Result<()> + Send + Sync + 'static,
    ) {
        let switch_to = self
            .user
            .as_ref()
            .filter(|_| self.switch_user)
            .map(|u| (u.uid, u.gid));
        let confined = self.confined;
        let entry = self.entry.take();
        let mut fence = self.fence.take();
        // The process that forks (this one, whose pid the closure keeps).
        let starter = std::process::id();
        // SAFETY: setsid, the cgroup entry's open, write and close, the credential calls and
        // Landlock's prctl and restrict_self are system calls that touch nothing of the parent
        // (the ruleset was built before the fork; its fd is closed after); `also` is held to
        // the same rule by its callers.
        unsafe {
            command.pre_exec(move || {
                // A release never holds its root's lock, not even until its exec.
                super::lock::close_held_in_child();
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                if let Some(entry) = &entry {
                    entry.enter();
                }
                // A starter killed before this child was in its tree (where the next pass looks
                // for what a dead starter began, by its token) would leave it found by nothing,
                // a second copy beside the one started next: it goes instead. Checked after the
                // entry, so a starter killed later leaves a child that is found.
                if nix::unistd::getppid().as_raw() as u32 != starter {
                    return Err(std::io::Error::other("the process starting it is gone"));
                }
                if confined {
                    // Before the privileges go: making a namespace needs them.
                    super::ipc::unshare_namespace();
                    drop_privileges();
                }
                if let Some((uid, gid)) = switch_to {
                    become_user(uid, gid)?;
                }
                if let Some(fence) = fence.take() {
                    super::filesystem::enforce(fence)?;
                }
                also()
            });
        }
    }

    /// A start refused for permission, said as the folder or file that stops its user from
    /// reaching `program` and the way out (the error as it was otherwise).
    pub fn explain(
        user: Option<&ServiceUser>,
        program: &Path,
        e: std::io::Error,
    ) -> std::io::Error {
        let bare = program.components().count() == 1;
        let searched = matches!(
            e.kind(),
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::NotFound
        );
        if bare && searched && !on_path(program) {
            // The search through the service's PATH found the command nowhere (where it met a
            // folder confinement forbids, the error the kernel left is that folder's
            // "Permission denied", but the command does not exist: issue 81).
            return std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{}: command not found in PATH", program.display()),
            );
        }
        match (user, e.kind()) {
            (Some(user), std::io::ErrorKind::PermissionDenied) => {
                match super::account::why_unreachable(program, user) {
                    Some(why) => std::io::Error::new(e.kind(), why),
                    None => e,
                }
            }
            _ => e,
        }
    }
}

/// Whether an executable file named `program` is in one of the folders of a service's PATH.
fn on_path(program: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(SERVICE_PATH).any(|folder| {
        std::fs::metadata(folder.join(program))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// In the child, after [`drop_privileges`]: the service's gid, then its uid, real, effective and
/// saved alike (so nothing can switch back; the kernel clears every capability as the uid
/// leaves 0). Raw system calls: only this thread exists in the child, and glibc's wrappers
/// would try to reach the parent's other threads.
fn become_user(uid: u32, gid: u32) -> std::io::Result<()> {
    // SAFETY: both take only integers.
    unsafe {
        if libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
            || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// In the child between fork and exec (issue 59's "no privileges"): no new privileges
/// (`PR_SET_NO_NEW_PRIVS`: a setuid binary inside the release gains nothing), every capability
/// dropped from the bounding set (so the exec, even as root, grants none: no port below 1024,
/// no raw socket, no ptrace of another user's process, no capability-guarded call) and the
/// ambient set cleared, and supplementary groups cleared. Best effort where rollgate itself is
/// unprivileged: it cannot drop what it does not hold, and no-new-privileges always holds.
///
/// Only raw system calls: `setgroups` through `syscall(2)`, not glibc's wrapper, which would
/// try to reach the parent's other threads.
fn drop_privileges() {
    // SAFETY: prctl and setgroups take only integers and a null pointer; no memory is touched.
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>());
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        // Every capability the kernel knows (CAP_LAST_CAP is 40 on 6.x; 63 bounds any future
        // one): a number past the last fails with EINVAL, which ends nothing.
        for capability in 0..64 {
            libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0);
        }
    }
}

/// A script of the release whose `#!` interpreter is outside it and outside the system's
/// folders (as `release add` found them): (the script relative to the release, the
/// interpreter).
pub type Stranded<'a> = (&'a Path, &'a Path);

/// Why a confined release that failed may have failed, when its own words say the kernel
/// refused it something: the rule that did and the policy line that allows it (a release
/// that relied on being root otherwise shows a bare EACCES). None when its words say nothing
/// of the kind.
///
/// Read from the first line that tells of a refusal (lines split at newlines or at the ` | `
/// an output quote joins them with): a path is taken from that line alone, so a file's refusal
/// never gets a port's hint; what was being done (`bind`, `listen`) may be said on the two
/// lines before it (a traceback's last frames), never further up (a server's earlier
/// `Listening at: http://…`).
pub fn hint(said: &str, root: &Path, release: &Path, stranded: &[Stranded]) -> Option<String> {
    let data = root.join(super::account::DATA_DIR);
    let lines: Vec<&str> = said.lines().flat_map(|l| l.split(" | ")).collect();
    let at = lines.iter().position(|line| tells_of_a_refusal(line))?;
    let line = lines[at];
    let lower = line.to_ascii_lowercase();
    let doing = lines[at.saturating_sub(2)..=at]
        .join("\n")
        .to_ascii_lowercase();
    if let Some((script, interpreter)) = stranded.iter().find(|(script, _)| {
        lower.contains("bad interpreter")
            || script
                .file_name()
                .is_some_and(|name| line.contains(&*name.to_string_lossy()))
    }) {
        return Some(format!(
            "confined: {} starts {} (its #! line), outside the release, which a confined release cannot run; run it through an interpreter inside the release (exec venv/bin/python -m gunicorn …, not venv/bin/gunicorn) or the system's, or build the environment at the path the release is installed at ({})",
            script.display(),
            interpreter.display(),
            release.display()
        ));
    }
    if SQLITE_CANNOT_WRITE
        .iter()
        .any(|words| lower.contains(words))
    {
        return Some(format!(
            "confined: a database beside the code cannot be opened for writing (the release folder is read-only to its user, and SQLite writes a journal beside its file: Django's default db.sqlite3 is there); keep it in $STATE_DIRECTORY ({}), e.g. os.environ[\"STATE_DIRECTORY\"] + \"/db.sqlite3\"",
            data.display()
        ));
    }
    let path = refused_path(line);
    let about_a_port = path.is_none()
        && (["bind", "listen", "eaddr", "address"]
            .iter()
            .any(|w| doing.contains(w))
            || privileged_port(line).is_some());
    if about_a_port {
        return Some(match (privileged_port(line), named_port(line)) {
            (Some(port), _) => format!(
                "confined: a release has no privileges, so port {port} is refused; listen on $PORT (rollgate's proxy serves 80 and 443), or set isolation.enabled = false in the policy to run it with rollgate's own"
            ),
            (None, Some(port)) => format!(
                "confined: a release may bind only its own port, $PORT, so port {port} is refused (another service's release may be given it); listen on $PORT"
            ),
            (None, None) => "confined: a release has no privileges, so a port below 1024 is refused, and it may bind only its own port, $PORT; listen on $PORT (rollgate's proxy serves 80 and 443), or set isolation.enabled = false in the policy to run it with rollgate's own".to_string(),
        });
    }
    match path {
        Some(path) if path.starts_with(release) || path.starts_with(root.join("releases")) => Some(format!(
            "confined: {} is in the release folder, which its user only reads; write into $STATE_DIRECTORY ({}) or $TMPDIR, or list the folder in the policy's isolation.writable",
            path.display(),
            data.display()
        )),
        Some(path) => Some(format!(
            "confined: Landlock lets a release read only the system's folders and its release, and write only $STATE_DIRECTORY, $TMPDIR and the policy's isolation.writable; {} is none of them. If the release reads it, ship it inside the release; if it writes there, add its folder to isolation.writable (\"isolation\": {{\"writable\": [\"{}\"]}}), or set isolation.enabled = false",
            path.display(),
            path.parent().unwrap_or(&path).display()
        )),
        None => Some(format!(
            "confined: it runs as its service's own user with no privileges, reading only the system and its release and writing only $STATE_DIRECTORY ({}), $TMPDIR and the policy's isolation.writable; see docs/isolation.md",
            data.display()
        )),
    }
}

/// What SQLite says when it cannot write where its file is (no `EACCES` in its words).
const SQLITE_CANNOT_WRITE: [&str; 2] = [
    "unable to open database file",
    "attempt to write a readonly database",
];

/// Whether a line of a release's output tells of something the kernel refused it.
fn tells_of_a_refusal(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    [
        "permission denied",
        "eacces",
        "operation not permitted",
        "eperm",
        "read-only file system",
        "erofs",
        "bad interpreter",
    ]
    .iter()
    .chain(SQLITE_CANNOT_WRITE.iter())
    .any(|words| lower.contains(words))
}

/// The path a refusal line names (quoted or bare, trimmed of the punctuation around it): the
/// first after the refusal's words (`Permission denied: '/srv/x'`, `EACCES: …, open '/x'`),
/// else the last before them (a shell's `exec: /opt/x: Permission denied`).
fn refused_path(said: &str) -> Option<PathBuf> {
    let lower = said.to_ascii_lowercase();
    let at = [
        "denied",
        "not permitted",
        "read-only",
        "eacces",
        "eperm",
        "erofs",
    ]
    .iter()
    .filter_map(|words| lower.find(words))
    .min()
    .unwrap_or(0);
    let paths = |text: &str| -> Vec<PathBuf> {
        text.split(|c: char| c.is_whitespace() || "'\"`,()[]".contains(c))
            .map(|word| word.trim_end_matches([':', '.', ';']))
            .filter(|word| word.len() > 1 && word.starts_with('/') && !word.starts_with("//"))
            .map(PathBuf::from)
            .collect()
    };
    let (before, after) = said.split_at(at.min(said.len()));
    paths(after)
        .into_iter()
        .next()
        .or_else(|| paths(before).pop())
}

/// A port below 1024 named in `said` (see [`ports_named`]).
fn privileged_port(said: &str) -> Option<u16> {
    ports_named(said).find(|port| (1..1024).contains(port))
}

/// The first port named in `said` (see [`ports_named`]).
fn named_port(said: &str) -> Option<u16> {
    ports_named(said).find(|port| *port > 0)
}

/// The ports named as `HOST:N` (an address: `0.0.0.0:80`, `[::]:443`, `:80`) or `port N` in
/// `said`; a time of day (`10:30:15`) is no port.
fn ports_named(said: &str) -> impl Iterator<Item = u16> + '_ {
    let addresses = said
        .split(|c: char| c.is_whitespace() || "'\"`,()[]".contains(c))
        .filter_map(|word| word.rsplit_once(':'))
        .filter(|(host, _)| {
            host.is_empty() || host.contains('.') || *host == "localhost" || host.ends_with(':')
        })
        .filter_map(|(_, port)| port.trim_end_matches(['.', ';']).parse::<u16>().ok());
    let named = said.split("port ").skip(1).filter_map(|text| {
        let digits: String = text.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u16>().ok()
    });
    addresses.chain(named)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_in_a_releases_words_is_explained_by_the_rule_that_made_it() {
        let root = Path::new("/srv/app");
        let release = Path::new("/srv/app/releases/v2");
        // Python writing beside its code.
        let said = "PermissionError: [Errno 13] Permission denied: '/srv/app/releases/v2/cache.db'";
        let why = hint(said, root, release, &[]).unwrap();
        assert!(
            why.contains("release folder") && why.contains("$STATE_DIRECTORY (/srv/app/data)"),
            "{why}"
        );
        // Node writing into /var/log.
        let said = "Error: EACCES: permission denied, open '/var/log/app.log'";
        let why = hint(said, root, release, &[]).unwrap();
        assert!(why.contains("\"writable\": [\"/var/log\"]"), "{why}");
        // A port below 1024, in both shapes.
        let said = "Error: listen EACCES: permission denied 0.0.0.0:80";
        assert!(hint(said, root, release, &[])
            .unwrap()
            .contains("port 80 is refused"));
        let said = "[ERROR] Can't connect to ('', 443) | PermissionError: [Errno 13] Permission denied (bind)";
        assert!(hint(said, root, release, &[])
            .unwrap()
            .contains("a port below 1024"));
        // Nothing refused: nothing to add.
        assert_eq!(
            hint(
                "ModuleNotFoundError: No module named 'flask'",
                root,
                release,
                &[]
            ),
            None
        );
        assert_eq!(privileged_port("at 10:30:15 on :8080"), None);
        // Issue 66: a port of its own choosing, refused by Landlock's bind rule.
        let said = "OSError: [Errno 13] Permission denied: bind to 127.0.0.1:8080";
        let why = hint(said, root, release, &[]).unwrap();
        assert!(
            why.contains("may bind only its own port, $PORT, so port 8080 is refused"),
            "{why}"
        );
    }

    /// Issue 67, 3: the hints that misled a Django operator.
    #[test]
    fn a_database_a_file_read_outside_and_a_stranded_interpreter_each_get_their_own_hint() {
        let root = Path::new("/srv/app");
        let release = Path::new("/srv/app/releases/v2");
        // Django's default sqlite file beside the code: no EACCES in SQLite's words.
        let said = "  File \"django/db/backends/sqlite3/base.py\", line 206, in get_new_connection\ndjango.db.utils.OperationalError: unable to open database file";
        let why = hint(said, root, release, &[]).unwrap();
        assert!(why.contains("$STATE_DIRECTORY (/srv/app/data)"), "{why}");
        assert!(why.contains("db.sqlite3"), "{why}");
        // A file outside refused while a server's earlier line spoke of listening: the
        // file's hint (read or write), never a port's.
        let said = "[INFO] Listening at: http://127.0.0.1:8080 (12)\nPermissionError: [Errno 13] Permission denied: '/opt/shared/settings.json'";
        let why = hint(said, root, release, &[]).unwrap();
        assert!(!why.contains("port"), "{why}");
        assert!(
            why.contains("/opt/shared/settings.json is none of them")
                && why.contains("ship it inside the release"),
            "{why}"
        );
        // A venv's console script whose #! names the build folder: the interpreter, not the
        // build folder made writable.
        let (script, interpreter) = (
            Path::new("venv/bin/gunicorn"),
            Path::new("/build/app/venv/bin/python3"),
        );
        // A shell naming the file it could not run, after the script's own name.
        let said = "/srv/app/releases/v2/edge-svc: 2: exec: /opt/tools/run: Permission denied";
        let why = hint(said, root, release, &[]).unwrap();
        assert!(why.contains("/opt/tools/run is none of them"), "{why}");
        let said = "./edge-svc: 2: exec: venv/bin/gunicorn: Permission denied";
        let why = hint(said, root, release, &[(script, interpreter)]).unwrap();
        assert!(
            why.contains("venv/bin/gunicorn starts /build/app/venv/bin/python3")
                && why.contains("venv/bin/python -m gunicorn")
                && !why.contains("writable"),
            "{why}"
        );
    }
}
