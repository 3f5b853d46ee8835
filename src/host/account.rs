//! A user per service (issue 59): the uid and gid a service's releases run as, and the folders
//! that belong to it.
//!
//! A service (one root) runs as the user its policy names (`isolation.user = "edge"`, an
//! existing user of the host, never root) or else as a uid of its own that rollgate allocates
//! from [`FIRST_UID`]..=[`LAST_UID`] — above systemd's `DynamicUser=` range (61184–65519) and
//! `nobody` (65534), below the ranges `/etc/subuid` hands out (from 100000) — skipping every
//! uid or gid the host's user database knows. The allocation is recorded twice, so it is stable
//! across deploys and reboots and two services never share a uid:
//!
//! - in the root, `ROOT/service-user.json` (`{"uid": 70001, "gid": 70001}`);
//! - host-wide, one file per uid under [`REGISTRY`] naming the root that holds it, claimed
//!   under a lock. A claim whose root is gone, or no longer records that uid, is reclaimed.
//!
//! What belongs to the service's user: its state folder (`ROOT/data`, given as
//! `STATE_DIRECTORY` and `HOME`) and its private temporary folder (`ROOT/tmp`, `TMPDIR`), both
//! mode 0700. Its release folders are rollgate's (root) with the service's group, mode 0750:
//! readable by the service, not writable by it, closed to every other service. The root's
//! secrets and rollgate's own state stay rollgate's.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The first and last uid rollgate allocates to a service (the same number as its gid).
pub const FIRST_UID: u32 = 70_000;
pub const LAST_UID: u32 = 79_999;
/// The host-wide record of which root holds which allocated uid.
pub const REGISTRY: &str = "/var/lib/rollgate/uids";
/// In a root: the user its releases run as.
pub const RECORD_FILE: &str = "service-user.json";
/// In a root: the service's own writable state, kept across releases.
pub const DATA_DIR: &str = "data";
/// In a root: the service's private temporary folder.
pub const TMP_DIR: &str = "tmp";

/// Who a service's releases run as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceUser {
    pub uid: u32,
    pub gid: u32,
    /// The existing user the policy named; none for an allocated uid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl std::fmt::Display for ServiceUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.name {
            Some(name) => write!(f, "user {name} (uid {}, gid {})", self.uid, self.gid),
            None => write!(f, "uid {} (its own, allocated)", self.uid),
        }
    }
}

/// Whether rollgate can run a release as another user at all (it is root).
pub fn can_switch_user() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The user `root`'s releases run as: the one `named` (the policy's `isolation.user`), else the
/// uid the root records, else a new one from the range, recorded.
pub fn for_service(root: &Path, named: Option<&str>) -> std::io::Result<ServiceUser> {
    // One root, one uid, however it is named (through a link, with `..`): the registry
    // records the root's one canonical path.
    let root = std::fs::canonicalize(root)?;
    let found = match named {
        Some(name) => existing_user(name),
        None => own_uid(&root),
    };
    found.map_err(std::io::Error::other)
}

/// Whether two paths name the same folder (an older claim may name a root another way).
fn same_folder(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => a == b,
    }
}

/// The uid `root` records and still holds, else a new one.
fn own_uid(root: &Path) -> Result<ServiceUser, String> {
    if let Some(user) = read_record(&root.join(RECORD_FILE))? {
        if user.name.is_none() && holds(root, user.uid)? {
            return Ok(user);
        }
    }
    allocate(root)
}

/// An existing user of this host, by name; never root.
fn existing_user(name: &str) -> Result<ServiceUser, String> {
    let user = nix::unistd::User::from_name(name)
        .map_err(|e| format!("isolation.user = \"{name}\": cannot read the user database: {e}"))?
        .ok_or_else(|| {
            format!("isolation.user = \"{name}\": no such user on this host (see /etc/passwd)")
        })?;
    if user.uid.is_root() {
        return Err(format!(
            "isolation.user = \"{name}\" is root: a release runs as root only with isolation.enabled = false"
        ));
    }
    if let Some(proxy) = proxy_of_user(user.uid.as_raw()) {
        return Err(format!(
            "isolation.user = \"{name}\" is the user `rollgate proxy` (pid {proxy}) runs as: a release of that user could signal it or reach what it holds; give the service a user of its own (leave isolation.user out) or run the proxy as another"
        ));
    }
    Ok(ServiceUser {
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
        name: Some(name.to_string()),
    })
}

/// Where each `rollgate proxy --user` records the uid it becomes, before it leaves root:
/// `RUN/proxy/user-PID` (root's run folder, mode 0700), so that no service is given that user.
fn proxy_user_file(pid: u32) -> std::io::Result<PathBuf> {
    let folder = super::run_dir::folder("proxy", super::run_dir::Reach::Private)?;
    Ok(folder.join(format!("user-{pid}")))
}

/// Records that this proxy (this process) is about to become `uid`.
pub fn record_proxy_user(uid: u32) -> std::io::Result<()> {
    let path = proxy_user_file(std::process::id())?;
    super::files::write_atomically(&path, format!("{uid}\n").as_bytes())
        .map_err(|e| std::io::Error::other(e.to_string()))
}

/// The pid of a running proxy that runs as `uid` (its record, and its process's real uid now),
/// if there is one; records of proxies gone are removed on the way.
fn proxy_of_user(uid: u32) -> Option<u32> {
    let folder = super::run_dir::folder("proxy", super::run_dir::Reach::Private).ok()?;
    for entry in std::fs::read_dir(folder).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("user-")
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let recorded = std::fs::read_to_string(entry.path()).ok();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
        let Some(status) = status else {
            let _ = std::fs::remove_file(entry.path());
            continue;
        };
        let runs_as = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().next())
            .and_then(|id| id.parse::<u32>().ok());
        let said = recorded.and_then(|t| t.trim().parse::<u32>().ok());
        if said == Some(uid) && runs_as == Some(uid) {
            return Some(pid);
        }
    }
    None
}

/// Why a named user cannot be a service's (not on this host, root, or the user a running
/// `rollgate proxy` runs as: see [`existing_user`]); None: it can.
pub fn why_not_named_user(name: &str) -> Option<String> {
    existing_user(name).err()
}

fn read_record(path: &Path) -> Result<Option<ServiceUser>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Whether the registry's claim on `uid` is `root`'s (claimed now if nobody holds it).
fn holds(root: &Path, uid: u32) -> Result<bool, String> {
    let _lock = lock_registry()?;
    match claim_holder(uid) {
        Some(holder) if same_folder(&holder, root) => Ok(true),
        Some(holder) if !is_stale(&holder, uid, &Leftovers::now()) => Ok(false),
        _ => write_claim(uid, root).map(|()| true),
    }
}

/// A new uid for `root`: the first in the range that no user or group of the host has and no
/// live root holds; recorded in the registry, then in the root.
fn allocate(root: &Path) -> Result<ServiceUser, String> {
    let _lock = lock_registry()?;
    // One look at what every uid has left, not one per claim: the registry stays locked
    // meanwhile, and every release start of the host waits for it.
    let leftovers = Leftovers::now();
    for uid in FIRST_UID..=LAST_UID {
        if host_knows(uid) {
            continue;
        }
        if let Some(holder) = claim_holder(uid) {
            if same_folder(&holder, root) || !is_stale(&holder, uid, &leftovers) {
                continue;
            }
        }
        write_claim(uid, root)?;
        let user = ServiceUser {
            uid,
            gid: uid,
            name: None,
        };
        let mut bytes = serde_json::to_vec(&user).map_err(|e| e.to_string())?;
        bytes.push(b'\n');
        let record = root.join(RECORD_FILE);
        super::files::write_atomically(&record, &bytes)
            .map_err(|e| format!("cannot write {}: {e}", record.display()))?;
        return Ok(user);
    }
    Err(format!(
        "no free uid left in {FIRST_UID}-{LAST_UID} (every one is held by a root listed in {REGISTRY}, or is a user or group of this host)"
    ))
}

/// Whether the host's user or group database has this number.
fn host_knows(id: u32) -> bool {
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(id));
    let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(id));
    !matches!((user, group), (Ok(None), Ok(None)))
}

/// The root that claims `uid`, if any.
fn claim_holder(uid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(Path::new(REGISTRY).join(uid.to_string())).ok()?;
    Some(PathBuf::from(text.trim_end_matches('\n')))
}

/// A claim nobody needs any more: its root is gone, or records another user — and nothing of
/// the uid is left (issue 66: a process, a System V IPC object, a file in the old root's own
/// folders), so the next service given it inherits nothing.
fn is_stale(holder: &Path, uid: u32, leftovers: &Leftovers) -> bool {
    let unneeded = match read_record(&holder.join(RECORD_FILE)) {
        Ok(Some(user)) => user.uid != uid || user.name.is_some(),
        Ok(None) => true,
        // Unreadable but there: keep it rather than hand the uid out twice.
        Err(_) => !holder.exists(),
    };
    unneeded && leftovers.of(holder, uid).is_none()
}

/// What the host's uids have left, read once and only when first asked (a claim whose root
/// still needs its uid asks nothing): a process of each, and its System V IPC objects in
/// rollgate's namespace.
struct Leftovers {
    read: std::cell::OnceCell<(
        std::collections::HashMap<u32, (i32, String)>,
        Vec<super::ipc::Object>,
    )>,
}

impl Leftovers {
    fn now() -> Leftovers {
        Leftovers {
            read: std::cell::OnceCell::new(),
        }
    }

    /// Something of `uid` still on the host, said: a process running as it, an IPC object it
    /// owns, a file it owns in `root`'s state or temporary folder.
    fn of(&self, root: &Path, uid: u32) -> Option<String> {
        let (processes, ipc) = self
            .read
            .get_or_init(|| (processes_by_uid(), super::ipc::all()));
        if let Some((pid, name)) = processes.get(&uid) {
            return Some(format!("process {pid} ({name})"));
        }
        if let Some(object) = ipc.iter().find(|o| o.uid == uid) {
            return Some(object.to_string());
        }
        [DATA_DIR, TMP_DIR]
            .iter()
            .find_map(|folder| owned_file(&root.join(folder), uid, 10_000))
            .map(|path| format!("file {}", path.display()))
    }
}

/// A file under `dir` (not following links) owned by `uid`, among at most `budget` entries.
fn owned_file(dir: &Path, uid: u32, budget: usize) -> Option<PathBuf> {
    let mut waiting = vec![dir.to_path_buf()];
    let mut seen = 0;
    while let Some(folder) = waiting.pop() {
        for entry in std::fs::read_dir(&folder).ok()?.flatten() {
            seen += 1;
            if seen > budget {
                return None;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.uid() == uid {
                return Some(entry.path());
            }
            if meta.is_dir() {
                waiting.push(entry.path());
            }
        }
    }
    None
}

fn write_claim(uid: u32, root: &Path) -> Result<(), String> {
    let path = Path::new(REGISTRY).join(uid.to_string());
    let mut text = root.as_os_str().as_encoded_bytes().to_vec();
    text.push(b'\n');
    super::files::write_atomically(&path, &text)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The registry's lock, held while a uid is looked at and claimed.
fn lock_registry() -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    std::fs::create_dir_all(REGISTRY).map_err(|e| format!("cannot create {REGISTRY}: {e}"))?;
    let path = Path::new(REGISTRY).join(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("cannot lock {}: {e}", path.display()))
}

/// The folders a service's release is given, made (or handed over) for its user.
#[derive(Debug, Clone)]
pub struct Folders {
    /// `STATE_DIRECTORY` and `HOME`: kept across releases.
    pub data: PathBuf,
    /// `TMPDIR`.
    pub tmp: PathBuf,
}

/// The service's own folders under `root`, and its release folders (where it runs, where its
/// executable is: a signed release runs from its verified copy) readable by it: made for
/// `user` (or left rollgate's own where there is none: an unconfined release). The root itself
/// and `releases/` get search permission for others (never listing) so that a release can
/// reach its folder.
pub fn prepare(
    root: &Path,
    release_dirs: &[&Path],
    user: Option<&ServiceUser>,
) -> std::io::Result<Folders> {
    let folders = Folders {
        data: root.join(DATA_DIR),
        tmp: root.join(TMP_DIR),
    };
    let prepared = [&folders.data, &folders.tmp]
        .into_iter()
        .try_for_each(|dir| make_private(dir, user))
        .and_then(|()| match user {
            Some(user) => release_dirs
                .iter()
                .try_for_each(|dir| open_the_way(root, dir, user.gid)),
            None => Ok(()),
        });
    prepared.map(|()| folders).map_err(std::io::Error::other)
}

/// Every folder from the root down to the release's (`releases/`, or a verified copy's
/// `.verified/`) searchable by others, never listable; the release folder the service's.
fn open_the_way(root: &Path, release_dir: &Path, gid: u32) -> Result<(), String> {
    let inside = release_dir.parent().into_iter().flat_map(Path::ancestors);
    for dir in inside.take_while(|dir| dir.starts_with(root)) {
        add_mode(dir, 0o001)?;
    }
    give_group(release_dir, gid)
}

/// `dir`, made if missing, mode 0700, owned by `user` (the whole tree handed over when it
/// belonged to someone else: the service's user changed, and nothing of the old one runs).
fn make_private(dir: &Path, user: Option<&ServiceUser>) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot prepare {}: {e}", dir.display());
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(fail(e)),
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(fail)?;
    // No user of its own: confinement is off (the release runs as root, which reaches the
    // folder whoever owns it, so nothing changes hands and the service's user keeps its state
    // for when confinement is on again), or rollgate is not root (it made the folder itself).
    let Some(ServiceUser { uid, gid, .. }) = user.cloned() else {
        return Ok(());
    };
    let meta = std::fs::symlink_metadata(dir).map_err(fail)?;
    if meta.uid() != uid || meta.gid() != gid {
        never_under_a_running_process(dir, meta.uid(), uid)?;
        hand_over(dir, uid, gid).map_err(fail)?;
    }
    Ok(())
}

/// A service's folder changes hands only when nothing runs as its owner (issue 66): a process
/// of the old user could swap what the walk is about to change, and would lose its files
/// under it. Root's own folders (an unconfined release's) and rollgate's are exempt: nothing
/// that runs as them is confined anyway.
fn never_under_a_running_process(dir: &Path, owner: u32, new_owner: u32) -> Result<(), String> {
    if owner == 0 || owner == new_owner || owner == nix::unistd::geteuid().as_raw() {
        return Ok(());
    }
    match process_running_as(owner) {
        Some((pid, name)) => Err(format!(
            "{} belongs to uid {owner}, and process {pid} ({name}) still runs as it: a service's folders never change hands under a running process. Keep isolation.user as the live release runs, or stop what runs as uid {owner} first",
            dir.display()
        )),
        None => Ok(()),
    }
}

/// Gives `path` and everything under it to `uid`:`gid` (links themselves, never what they
/// point at), walking by descriptor: `path` is opened once with `O_NOFOLLOW`, and every entry
/// below is opened relative to its folder's descriptor with `O_PATH|O_NOFOLLOW` and changed
/// through that descriptor (`fchownat(fd, "", AT_EMPTY_PATH)`). No path is ever resolved
/// twice, so a folder swapped for a link while the walk runs (`renameat2(RENAME_EXCHANGE)`)
/// leads nowhere outside: what is changed is what was opened. A file with more than one name
/// that was not the tree's old owner's is left as it is (a hard link may name a file outside
/// the tree).
pub fn hand_over(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    use nix::fcntl::OFlag;
    let top = open_at(None, path, OFlag::O_PATH | OFlag::O_NOFOLLOW)?;
    let old_owner = nix::sys::stat::fstat(top.as_raw_fd())?.st_uid;
    let mut folders: Vec<OwnedFd> = Vec::new();
    if let Some(folder) = give(&top, old_owner, uid, gid)? {
        folders.push(folder);
    }
    // Depth first; each folder is read whole before the next is opened, so the descriptors
    // held are the folders waiting, never one per file.
    while let Some(folder) = folders.pop() {
        let names: Vec<std::ffi::CString> = {
            let dup = nix::unistd::dup(folder.as_raw_fd())?;
            let mut dir = nix::dir::Dir::from_fd(dup)?;
            dir.iter()
                .filter_map(Result::ok)
                .map(|entry| entry.file_name().to_owned())
                .filter(|name| name.as_bytes() != b"." && name.as_bytes() != b"..")
                .collect()
        };
        for name in names {
            let entry = match open_at(
                Some(&folder),
                name.as_c_str(),
                OFlag::O_PATH | OFlag::O_NOFOLLOW,
            ) {
                Ok(entry) => entry,
                // Gone since the folder was read: nothing to give.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            if let Some(inner) = give(&entry, old_owner, uid, gid)? {
                folders.push(inner);
            }
        }
    }
    Ok(())
}

/// Gives what `held` (an `O_PATH` descriptor) names to `uid`:`gid`; a folder comes back opened
/// for reading (relative to the descriptor, so the same folder) to be walked.
fn give(held: &OwnedFd, old_owner: u32, uid: u32, gid: u32) -> std::io::Result<Option<OwnedFd>> {
    use nix::fcntl::OFlag;
    let meta = nix::sys::stat::fstat(held.as_raw_fd())?;
    let kind = meta.st_mode & libc::S_IFMT;
    if kind != libc::S_IFDIR && meta.st_nlink > 1 && meta.st_uid != old_owner {
        return Ok(None);
    }
    // SAFETY: an open descriptor, an empty NUL-terminated path and integers.
    let changed = unsafe {
        libc::fchownat(
            held.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH,
        )
    };
    if changed != 0 {
        return Err(std::io::Error::last_os_error());
    }
    match kind == libc::S_IFDIR {
        true => open_at(Some(held), c".", OFlag::O_RDONLY | OFlag::O_DIRECTORY).map(Some),
        false => Ok(None),
    }
}

/// `openat(2)` relative to `folder` (or the working folder), close-on-exec, owned.
fn open_at<P: ?Sized + nix::NixPath>(
    folder: Option<&OwnedFd>,
    path: &P,
    flags: nix::fcntl::OFlag,
) -> std::io::Result<OwnedFd> {
    let fd = nix::fcntl::openat(
        folder.map(AsRawFd::as_raw_fd),
        path,
        flags | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    // SAFETY: openat just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A live process that runs as `uid`, with its command name: what stops the service's folders
/// from changing hands under it.
fn process_running_as(uid: u32) -> Option<(i32, String)> {
    processes_by_uid().remove(&uid)
}

/// A live process of every uid that has one (as its real, effective, saved or filesystem id),
/// with its command name, from one pass over `/proc`.
fn processes_by_uid() -> std::collections::HashMap<u32, (i32, String)> {
    let mut found = std::collections::HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    let pids = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok());
    for pid in pids {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name));
        if field("State:").is_some_and(|s| s.trim_start().starts_with(['Z', 'X'])) {
            continue;
        }
        let name = crate::host::output::printable(field("Name:").unwrap_or("?").trim());
        let ids = field("Uid:").unwrap_or("");
        for uid in ids
            .split_whitespace()
            .filter_map(|id| id.parse::<u32>().ok())
        {
            found.entry(uid).or_insert_with(|| (pid, name.clone()));
        }
    }
    found
}

fn add_mode(dir: &Path, bits: u32) -> Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & bits != bits {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | bits))
            .map_err(|e| format!("cannot change the mode of {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// The release folder: rollgate's, with the service's group, mode 0750.
fn give_group(release_dir: &Path, gid: u32) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("cannot prepare {}: {e}", release_dir.display());
    let meta = std::fs::metadata(release_dir).map_err(fail)?;
    if meta.gid() != gid {
        std::os::unix::fs::chown(release_dir, None, Some(gid)).map_err(fail)?;
    }
    if meta.permissions().mode() & 0o7777 != 0o750 {
        std::fs::set_permissions(release_dir, std::fs::Permissions::from_mode(0o750))
            .map_err(fail)?;
    }
    Ok(())
}

/// Why `user` cannot execute `file`, said as the folder or file that stops it and the way out;
/// None when nothing in its path does.
pub fn why_unreachable(file: &Path, user: &ServiceUser) -> Option<String> {
    let mut path = PathBuf::from("/");
    let components: Vec<_> = file.components().skip(1).collect();
    for (n, component) in components.iter().enumerate() {
        let meta = std::fs::metadata(&path).ok()?;
        if !allows(&meta, user, 0o1) {
            return Some(format!(
                "{user} cannot enter {} (mode {:04o}, owner uid {}): give others search permission (chmod o+x {}), or name a user who can in isolation.user",
                path.display(),
                meta.permissions().mode() & 0o7777,
                meta.uid(),
                path.display()
            ));
        }
        path.push(component);
        if n + 1 == components.len() {
            let meta = std::fs::metadata(&path).ok()?;
            if !allows(&meta, user, 0o5) {
                return Some(format!(
                    "{user} cannot read and execute {} (mode {:04o}, owner uid {}): chmod o+rx it",
                    path.display(),
                    meta.permissions().mode() & 0o7777,
                    meta.uid()
                ));
            }
        }
    }
    None
}

/// Whether `meta`'s mode gives `user` every bit of `wanted` (rwx as 4, 2, 1).
fn allows(meta: &std::fs::Metadata, user: &ServiceUser, wanted: u32) -> bool {
    let mode = meta.permissions().mode();
    let bits = if meta.uid() == user.uid {
        mode >> 6
    } else if meta.gid() == user.gid {
        mode >> 3
    } else {
        mode
    };
    bits & wanted == wanted
}

/// Who a service's releases would run as, said without allocating or writing anything (for a
/// dry run).
pub fn planned(root: &Path, named: Option<&str>) -> String {
    if !can_switch_user() {
        return format!(
            "rollgate's own user (uid {}): only root can run a release as another user",
            nix::unistd::geteuid()
        );
    }
    if let Some(name) = named {
        return match existing_user(name) {
            Ok(user) => user.to_string(),
            Err(e) => format!("REFUSED: {e}"),
        };
    }
    match read_record(&root.join(RECORD_FILE)) {
        Ok(Some(user)) if user.name.is_none() => {
            format!("uid {} (its own, recorded in {RECORD_FILE})", user.uid)
        }
        _ => format!("a uid of its own from {FIRST_UID}-{LAST_UID}, allocated at its first start"),
    }
}

/// The real uid process `pid` runs as (`/proc/PID/status`), if it exists.
pub fn uid_of(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// How a running process is held, as the kernel says it (`/proc/PID/status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HeldAs {
    pub uid: u32,
    /// `NoNewPrivs: 1` and no effective capability: confined as rollgate starts a release.
    pub confined: bool,
}

impl std::fmt::Display for HeldAs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.confined {
            true => write!(f, "uid {}, confined", self.uid),
            false => write!(f, "uid {}, NOT confined", self.uid),
        }
    }
}

/// How the processes doing a release's work are held, each different way once: a container
/// release's are the container's (in the cgroups the engine made inside its supervisor's tree;
/// the supervisor, `container-run`, is rollgate's own and runs as root); any other release's is
/// the process rollgate started. Empty when none of it runs.
pub fn work_held_as(who: &super::identity::Identity) -> Vec<HeldAs> {
    let mut workers = vec![who.pid];
    if let Some(tree) = super::cgroup::of(who).filter(|tree| tree.has_inner()) {
        let own = tree.members();
        let inner: Vec<i32> = tree
            .all_members()
            .into_iter()
            .filter(|pid| !own.contains(pid))
            .collect();
        if !inner.is_empty() {
            workers = inner;
        }
    }
    let mut said: Vec<HeldAs> = Vec::new();
    for held in workers.into_iter().filter_map(held_as) {
        if !said.contains(&held) {
            said.push(held);
        }
    }
    said
}

/// How process `pid` is held, if it runs.
pub fn held_as(pid: i32) -> Option<HeldAs> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string)
    };
    let uid = field("Uid:")?.parse().ok()?;
    let no_new_privs = field("NoNewPrivs:").as_deref() == Some("1");
    let no_capability = field("CapEff:").is_some_and(|caps| caps.chars().all(|c| c == '0'));
    Some(HeldAs {
        uid,
        confined: no_new_privs && no_capability,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 66's first attack, on the walk alone: while the state tree is handed over, a
    /// folder in it is swapped again and again with a link to a root-only folder whose files
    /// have the same names (`renameat2(RENAME_EXCHANGE)`). A walk by path follows the link
    /// between one name and the next; the walk by descriptor never leaves the tree.
    #[test]
    fn a_hand_over_never_follows_a_folder_swapped_for_a_link_while_it_walks() {
        if !can_switch_user() {
            return; // Giving files to another uid needs root (CI runs as root).
        }
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        let data = dir.path().join("data");
        let inner = data.join("inner");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::create_dir_all(&inner).unwrap();
        for n in 0..300 {
            std::fs::write(outside.join(format!("file{n}")), "root's").unwrap();
            std::fs::write(inner.join(format!("file{n}")), "the service's").unwrap();
        }
        std::os::unix::fs::symlink(&outside, data.join("link")).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let (stop, data) = (stop.clone(), data.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = nix::fcntl::renameat2(
                        None,
                        &data.join("inner"),
                        None,
                        &data.join("link"),
                        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                    );
                }
            })
        };
        for round in 0..40u32 {
            let owner = 70_500 + round % 2;
            hand_over(&data, owner, owner).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().unwrap();
        let taken: Vec<String> = std::fs::read_dir(&outside)
            .unwrap()
            .flatten()
            .filter(|e| e.metadata().unwrap().uid() != 0)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            taken.is_empty(),
            "{} files outside the tree changed hands: {taken:?}",
            taken.len()
        );
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), 0);
        // The tree itself was handed over: every file in it is the last owner's.
        let owners: std::collections::BTreeSet<u32> = ["inner", "link"]
            .iter()
            .map(|name| data.join(name))
            .filter(|p| std::fs::symlink_metadata(p).unwrap().is_dir())
            .flat_map(|p| std::fs::read_dir(p).unwrap().flatten())
            .map(|e| e.metadata().unwrap().uid())
            .collect();
        assert_eq!(owners, [70_501].into_iter().collect());
    }

    #[test]
    fn a_uid_with_a_process_left_is_not_handed_to_another_service() {
        if !can_switch_user() {
            return;
        }
        let gone = tempfile::tempdir().unwrap().path().join("gone-root");
        let uid = 70_777;
        assert!(Leftovers::now().of(&gone, uid).is_none());
        assert!(
            is_stale(&gone, uid, &Leftovers::now()),
            "a root that is gone with nothing left"
        );
        let mut sleeper = std::process::Command::new("sleep");
        std::os::unix::process::CommandExt::uid(&mut sleeper, uid);
        let mut sleeper = sleeper.arg("30").spawn().unwrap();
        assert!(!is_stale(&gone, uid, &Leftovers::now()));
        let left = Leftovers::now().of(&gone, uid);
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        let left = left.expect("a process of the uid is left");
        assert!(
            left.starts_with(&format!("process {} (sleep)", sleeper.id())),
            "{left}"
        );
    }
}
