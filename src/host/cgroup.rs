//! A release's whole process tree, held in a cgroup of its own, so that stopping it ends every
//! process it started: a worker that called `setsid` and double-forked away from the release's
//! process group stays in its cgroup, and `cgroup.kill` ends the tree at once, racing forks
//! included (issue 59's "a process tree that dies whole").
//!
//! Only the cgroup v2 hierarchy is used here, for tracking and killing (no controller, no
//! limit): `/sys/fs/cgroup` on a pure v2 host, `/sys/fs/cgroup/unified` on a hybrid one. The
//! trees live under `rollgate/` there, each named after the run that started it and its
//! release process's identity (`TOKEN~PID-STARTTIME`), so any later rollgate finds a release's
//! tree from the pid and start time the root's records keep (the next deploy, `up`), and
//! recovery after a kill -9 finds every tree a run started from its token alone — even one
//! whose pid was never recorded, whose leader is gone, or whose daemon cleared its environment.
//!
//! The child makes its tree and enters it itself, between fork and exec, named after its own
//! pid and start time (a v2 cgroup cannot be renamed once made, so it is born with its name).
//! Where there is no writable v2 hierarchy (a container without one, an unprivileged user
//! without a delegated subtree), nothing is made, and a stop ends the process group as before.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::identity::Identity;

/// The folder under the v2 hierarchy that holds every release's tree.
const FOLDER: &str = "rollgate";

/// Where release trees are made, if this host lets rollgate make them.
pub fn base() -> Option<&'static Path> {
    static BASE: OnceLock<Option<PathBuf>> = OnceLock::new();
    BASE.get_or_init(|| {
        let mount = [
            Path::new("/sys/fs/cgroup"),
            Path::new("/sys/fs/cgroup/unified"),
        ]
        .into_iter()
        .find(|m| m.join("cgroup.procs").is_file() && m.join("cgroup.subtree_control").is_file())?;
        let base = mount.join(FOLDER);
        match std::fs::create_dir(&base) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(_) => return None,
        }
        // A tree must be makeable and enterable (`cgroup.kill` is what ends one, Linux 5.14):
        // the folder there may be root's while rollgate runs as another user.
        let writable = nix::unistd::access(&base, nix::unistd::AccessFlags::W_OK).is_ok();
        (writable && base.join("cgroup.procs").is_file()).then_some(base)
    })
    .as_deref()
}

/// What a release may use (the policy's `isolation`): none set, no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    /// 100 is one core.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_pct: Option<u64>,
    /// Open files (`RLIMIT_NOFILE`, set in the child, not a cgroup's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nofile: Option<u64>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        *self == Limits::default()
    }

    /// Each limit as the files of one cgroup folder take it: the v2 files in the tree itself
    /// where its controllers are on (a pure v2 host), else the v1 controllers' own folders (a
    /// hybrid host, as the machines these tests run on). A limit nothing can hold is left out
    /// and said by [`Limits::unheld`].
    fn knobs(&self, base: &Path, group: Option<&str>) -> Vec<Knob> {
        let mut knobs = Vec::new();
        let on_v2 =
            std::fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
        // A v1 controller's folder for the trees: `rollgate/GROUP` when the process belongs to
        // a group (a release's formation), whose own files hold the same limits — the kernel
        // charges every tree below to it, so the limits bound the group's processes together.
        let v1 = |controller: &str, files: &[(&str, String)]| {
            let folder = Path::new("/sys/fs/cgroup").join(controller);
            if !folder.join("cgroup.procs").is_file() {
                return None;
            }
            let ours = folder.join(FOLDER);
            let made = |dir: &Path| std::fs::create_dir(dir).is_ok() || dir.is_dir();
            if !made(&ours) {
                return None;
            }
            let Some(group) = group else {
                return Some(ours);
            };
            let grouped = ours.join(group);
            if !made(&grouped) {
                return Some(ours);
            }
            // Twice: a limit and its swap limit must stay ordered (memsw >= mem) whichever
            // way they change, so one of the two may be refused on the first pass.
            for (name, value) in files.iter().chain(files) {
                let _ = std::fs::write(grouped.join(name), value);
            }
            Some(grouped)
        };
        let mut v2_files: Vec<(&str, String)> = Vec::new();
        if let Some(mb) = self.memory_mb {
            let bytes = (mb << 20).to_string();
            if on_v2.contains("memory") {
                v2_files.push(("memory.max", bytes));
                v2_files.push(("memory.swap.max", "0".into()));
            } else {
                let mut files = vec![("memory.limit_in_bytes", bytes.clone())];
                let memsw = Path::new("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes");
                if memsw.is_file() {
                    files.push(("memory.memsw.limit_in_bytes", bytes));
                }
                if let Some(folder) = v1("memory", &files) {
                    knobs.push(Knob::of(&folder, &files));
                }
            }
        }
        if let Some(pids) = self.pids {
            if on_v2.contains("pids") {
                v2_files.push(("pids.max", pids.to_string()));
            } else {
                let files = [("pids.max", pids.to_string())];
                if let Some(folder) = v1("pids", &files) {
                    knobs.push(Knob::of(&folder, &files));
                }
            }
        }
        if let Some(pct) = self.cpu_pct {
            let quota = (pct * CPU_PERIOD_US / 100).max(1000);
            if on_v2.contains("cpu") {
                v2_files.push(("cpu.max", format!("{quota} {CPU_PERIOD_US}")));
            } else {
                let files = [
                    ("cpu.cfs_period_us", CPU_PERIOD_US.to_string()),
                    ("cpu.cfs_quota_us", quota.to_string()),
                ];
                if let Some(folder) = v1("cpu", &files) {
                    knobs.push(Knob::of(&folder, &files));
                }
            }
        }
        if !v2_files.is_empty() {
            knobs.push(Knob::of(base, &v2_files));
        }
        knobs
    }
}

/// The period a CPU share is counted over (`cpu.max`'s second number), microseconds.
const CPU_PERIOD_US: u64 = 100_000;

/// One cgroup folder a release enters with the limits written in it: `BASE/PID-STARTTIME`,
/// each file written before the release enters.
#[derive(Debug, Clone)]
struct Knob {
    base: Vec<u8>,
    files: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Knob {
    fn of(base: &Path, files: &[(&str, String)]) -> Knob {
        Knob {
            base: base.as_os_str().as_bytes().to_vec(),
            files: files
                .iter()
                .map(|(name, value)| (name.as_bytes().to_vec(), value.as_bytes().to_vec()))
                .collect(),
        }
    }
}

/// The way into a tree of its own, for a release process to take between fork and exec: it
/// makes `BASE/LABEL~PID-STARTTIME` (its run's label and its own identity, read from `/proc/self/stat`), writes its
/// limits there, and writes itself into it (and into each v1 controller's folder of the same
/// name, on a hybrid host). Everything it needs is made before the fork; in the child it makes
/// only async-signal-safe system calls and writes into buffers on its stack.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The limits' folders first (a v1 controller's, or the tree itself with its files), then
    /// the tree, entered last.
    knobs: Vec<Knob>,
    nofile: Option<u64>,
    /// `LABEL~`, the start of the tree's name.
    label: Vec<u8>,
}

/// The way into a tree for the next release process, with these limits, where the host gives
/// one. Trees whose processes all exited on their own (nobody stopped them) are removed on
/// the way.
pub fn entry(limits: &Limits, label: &str, group: Option<&str>) -> Option<Entry> {
    let base = base()?;
    sweep(base);
    let group = group.map(label_of);
    let mut knobs = limits.knobs(base, group.as_deref());
    if !knobs.iter().any(|k| k.base == base.as_os_str().as_bytes()) {
        knobs.push(Knob::of(base, &[]));
    }
    Some(Entry {
        knobs,
        nofile: limits.nofile,
        label: format!("{}{LABEL_END}", label_of(label)).into_bytes(),
    })
}

/// Begins the name of a group of trees whose limits are shared (see [`group_of`]).
const GROUP_PREFIX: &str = "svc-";

/// The group a service's processes of release `version` share their limits in, on a host
/// whose limits live in v1 controllers: `svc-ROOTHASH-VERSION`. Every process of one release
/// of one service — web, each type's, one-offs, hooks, the release phase, scheduled runs — is
/// charged to it, so the policy's `memory_mb`, `pids` and `cpu_pct` bound them together, not
/// each (a Procfile of ten types no longer gets ten times the memory). A release beside it in a
/// deploy (the live one and its candidate) has a group of its own.
pub fn group_of(root: &Path, version: Option<&str>) -> String {
    use sha2::Digest;
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let digest = sha2::Sha256::digest(root.as_os_str().as_bytes());
    let short: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    match version {
        Some(version) => format!("{GROUP_PREFIX}{short}-{version}"),
        None => format!("{GROUP_PREFIX}{short}"),
    }
}

/// Ends the label in a tree's name (`TOKEN~PID-STARTTIME`).
const LABEL_END: char = '~';

/// `label` as a tree's name (or a container's) can hold it: letters, digits, `.`, `-` and `_`;
/// anything else `_`.
pub fn label_of(label: &str) -> String {
    label
        .chars()
        .take(128)
        .map(|c| match c.is_ascii_alphanumeric() || ".-_".contains(c) {
            true => c,
            false => '_',
        })
        .collect()
}

/// How old an empty tree must be before a sweep removes it: a child may be between making its
/// tree and entering it.
const SWEEP_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Removes the empty trees under `base` older than [`SWEEP_AFTER`] (a populated one cannot be
/// removed: `rmdir` refuses it), the verdicts of runs with no tree, and the v1 folders of trees
/// already gone (left by a rollgate
/// killed between the two removals, or by one older than this rule).
fn sweep(base: &Path) {
    let aged = |entry: &std::fs::DirEntry| {
        entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|made| made.elapsed().ok())
            .is_some_and(|age| age > SWEEP_AFTER)
    };
    let old_enough = |entry: &std::fs::DirEntry| entry.path().is_dir() && aged(entry);
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten().filter(|e| old_enough(e)) {
        let tree = Tree { dir: entry.path() };
        if !tree.is_populated() {
            tree.remove();
        }
    }
    // The trees are listed only when a verdict is old enough to be a stray's (most sweeps
    // find none).
    let mut labels: Option<std::collections::HashSet<String>> = None;
    for entry in std::fs::read_dir(VERDICTS).into_iter().flatten().flatten() {
        if !aged(&entry) {
            continue;
        }
        let labels =
            labels.get_or_insert_with(|| trees(|_, _| true).iter().map(Tree::label).collect());
        let label = entry.file_name().to_string_lossy().into_owned();
        if !labels.contains(&label) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for hierarchy in hierarchies.flatten() {
        let ours = hierarchy.path().join(FOLDER);
        if ours == base {
            continue;
        }
        for entry in std::fs::read_dir(&ours).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let a_tree = name.to_string_lossy().contains(LABEL_END);
            if a_tree && old_enough(&entry) && !base.join(&name).exists() {
                let _ = std::fs::remove_dir(entry.path());
            }
            // A group's folder: its gone trees, then the group itself once empty (rmdir
            // refuses one that still holds a tree).
            if !a_tree && name.to_string_lossy().starts_with(GROUP_PREFIX) && entry.path().is_dir()
            {
                for tree in std::fs::read_dir(entry.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let name = tree.file_name();
                    let gone = !base.join(&name).exists();
                    if name.to_string_lossy().contains(LABEL_END) && old_enough(&tree) && gone {
                        let _ = std::fs::remove_dir(tree.path());
                    }
                }
                if old_enough(&entry) {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
    }
}

impl Limits {
    /// The limits this host can hold, and those it cannot (named), for a release's words.
    pub fn unheld(&self) -> Vec<&'static str> {
        let Some(base) = base() else {
            return self.named();
        };
        let on_v2 =
            std::fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
        let held = |v2: &str, v1: &str| {
            on_v2.contains(v2)
                || Path::new("/sys/fs/cgroup")
                    .join(v1)
                    .join("cgroup.procs")
                    .is_file()
        };
        let mut unheld = Vec::new();
        if self.memory_mb.is_some() && !held("memory", "memory") {
            unheld.push("memory_mb");
        }
        if self.pids.is_some() && !held("pids", "pids") {
            unheld.push("pids");
        }
        if self.cpu_pct.is_some() && !held("cpu", "cpu") {
            unheld.push("cpu_pct");
        }
        unheld
    }

    fn named(&self) -> Vec<&'static str> {
        [
            (self.memory_mb.is_some(), "memory_mb"),
            (self.pids.is_some(), "pids"),
            (self.cpu_pct.is_some(), "cpu_pct"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect()
    }
}

impl Entry {
    /// In the child, between fork and exec: makes its tree and moves into it. Best effort: a
    /// process that could not enter one runs as before, its process group what ends it.
    ///
    /// # Safety
    /// Call only in a forked child before exec: it allocates nothing and makes only
    /// async-signal-safe calls (`getpid`, `open`, `read`, `mkdir`, `write`, `close`).
    pub unsafe fn enter(&self) {
        if let Some(files) = self.nofile {
            let limit = libc::rlimit {
                rlim_cur: files,
                rlim_max: files,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
        let Some(start) = own_start_time() else {
            return;
        };
        let mut digits = [0u8; 20];
        let pid = decimal(libc::getpid() as u64, &mut digits);
        let mut more = [0u8; 20];
        let start = decimal(start, &mut more);
        for knob in &self.knobs {
            let mut path = StackPath::default();
            // A group's folder another rollgate's sweep removed (empty) since the parent made
            // it: made again, so the tree still has a place (its own limits hold either way).
            if path.push(&knob.base) {
                let _ = libc::mkdir(path.as_c(), 0o755);
            }
            path.len = 0;
            let named = path.push(&knob.base)
                && path.push(b"/")
                && path.push(&self.label)
                && path.push(pid)
                && path.push(b"-")
                && path.push(start);
            if !named {
                continue;
            }
            // An existing folder of that name can only be this process's (a pid and a start
            // time).
            let _ = libc::mkdir(path.as_c(), 0o755);
            let folder = path.len;
            for (name, value) in &knob.files {
                path.len = folder;
                if path.push(b"/") && path.push(name) {
                    write_file(path.as_c(), value);
                }
            }
            path.len = folder;
            if path.push(b"/cgroup.procs") {
                write_file(path.as_c(), b"0");
            }
        }
    }
}

/// Writes `value` to the file at `path` (a cgroup file), ignoring what fails.
unsafe fn write_file(path: *const libc::c_char, value: &[u8]) {
    let fd = libc::open(path, libc::O_WRONLY | libc::O_CLOEXEC);
    if fd >= 0 {
        let _ = libc::write(fd, value.as_ptr().cast(), value.len());
        libc::close(fd);
    }
}

/// A path built on the stack, always with room for its terminating NUL.
struct StackPath {
    bytes: [u8; 512],
    len: usize,
}

impl Default for StackPath {
    fn default() -> Self {
        StackPath {
            bytes: [0; 512],
            len: 0,
        }
    }
}

impl StackPath {
    fn push(&mut self, more: &[u8]) -> bool {
        if self.len + more.len() >= self.bytes.len() {
            return false;
        }
        self.bytes[self.len..self.len + more.len()].copy_from_slice(more);
        self.len += more.len();
        true
    }

    /// The path as C reads it (NUL-terminated where it ends now).
    fn as_c(&mut self) -> *const libc::c_char {
        self.bytes[self.len] = 0;
        self.bytes.as_ptr().cast()
    }
}

/// This process's start time (`/proc/self/stat`'s 22nd field), read without allocating.
unsafe fn own_start_time() -> Option<u64> {
    let mut buffer = [0u8; 1024];
    let fd = libc::open(
        c"/proc/self/stat".as_ptr(),
        libc::O_RDONLY | libc::O_CLOEXEC,
    );
    if fd < 0 {
        return None;
    }
    let read = libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len());
    libc::close(fd);
    let text = buffer.get(..usize::try_from(read).ok()?)?;
    start_time_of_stat(text)
}

/// Field 22 of a `/proc/PID/stat` line: counted after the command's closing parenthesis
/// (field 2, which may hold spaces and parentheses of its own).
fn start_time_of_stat(text: &[u8]) -> Option<u64> {
    let after = text.iter().rposition(|b| *b == b')')? + 1;
    // Field 3 is the first after the command: the start time is the 20th from there.
    let field = text[after..]
        .split(|b| *b == b' ')
        .filter(|f| !f.is_empty())
        .nth(19)?;
    let mut value: u64 = 0;
    for b in field {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(value)
}

/// `n` in decimal, in `buffer`'s tail.
fn decimal(mut n: u64, buffer: &mut [u8; 20]) -> &[u8] {
    let mut at = buffer.len();
    loop {
        at -= 1;
        buffer[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buffer[at..]
}

/// The end of the name of `who`'s tree.
fn identity_part(who: &Identity) -> String {
    format!("{}-{}", who.pid, who.start_time)
}

/// The trees under the base whose name passes `wanted` (label, identity).
fn trees(wanted: impl Fn(&str, &str) -> bool) -> Vec<Tree> {
    let Some(Ok(entries)) = base().map(std::fs::read_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            // A tree made by a rollgate before labels: its identity alone.
            let (label, identity) = name.rsplit_once(LABEL_END).unwrap_or(("", &name));
            wanted(label, identity)
        })
        .map(|e| Tree { dir: e.path() })
        .filter(|t| t.dir.is_dir())
        .collect()
}

/// The tree of a release process rollgate started (None: started without one).
pub fn of(who: &Identity) -> Option<Tree> {
    let identity = identity_part(who);
    trees(|_, id| id == identity).into_iter().next()
}

/// The trees a run labelled `label` started (its token), each with its leader's identity as
/// its name says (the leader may be gone; the tree is still its).
pub fn started_by(label: &str) -> Vec<(Tree, Identity)> {
    let label = label_of(label);
    labelled(|l| l == label)
}

/// Removes the empty trees the run labelled `label` made: a start the kernel refused leaves
/// one (the child made its tree between fork and exec, then its exec failed). The label must
/// be one run's alone (a release process's token), so no other start is between making its
/// tree and entering it.
pub fn remove_empty(label: &str) {
    let _populated = started_by(label);
}

/// The trees of every run whose label starts with `prefix` (a rollout's replicas), with each
/// one's label.
pub fn started_by_prefix(prefix: &str) -> Vec<(Tree, Identity, String)> {
    let prefix = label_of(prefix);
    let found = labelled(|l| l.starts_with(&prefix));
    found
        .into_iter()
        .map(|(tree, who)| {
            let label = tree.label();
            (tree, who, label)
        })
        .collect()
}

/// The populated trees whose label passes `wanted`; the empty ones are removed on the way
/// (they are asked for by a run's recovery, under its root's lock: nothing of that run is
/// still starting).
fn labelled(wanted: impl Fn(&str) -> bool) -> Vec<(Tree, Identity)> {
    trees(|label, _| wanted(label))
        .into_iter()
        .filter(|tree| tree.is_populated() || !tree.remove())
        .filter_map(|tree| Some((tree.clone(), tree.leader()?)))
        .collect()
}

/// Every process of the release `who` started: its tree's, a container's inside it included;
/// where it has no tree, the processes of its session (every release leads one).
pub fn members_of(who: &Identity) -> Vec<i32> {
    if let Some(tree) = of(who) {
        return tree.all_members();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| Identity::of(*pid).and_then(|p| p.session()) == Some(who.pid))
        .collect()
}

/// A release's tree: every process it started, wherever they went.
#[derive(Debug, Clone)]
pub struct Tree {
    dir: PathBuf,
}

impl Tree {
    /// The identity its name says its leader had.
    pub fn leader(&self) -> Option<Identity> {
        let name = self.dir.file_name()?.to_str()?;
        let identity = name.rsplit_once(LABEL_END).map_or(name, |(_, id)| id);
        let (pid, start) = identity.split_once('-')?;
        Some(Identity {
            pid: pid.parse().ok()?,
            start_time: start.parse().ok()?,
        })
    }

    /// The label its name starts with (the run's token, as a name holds it).
    pub fn label(&self) -> String {
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        name.and_then(|n| n.rsplit_once(LABEL_END).map(|(label, _)| label.to_string()))
            .unwrap_or_default()
    }

    /// Where it is in the cgroup filesystem.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The processes in it now.
    pub fn members(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// The processes in it and in every cgroup under it (a container's).
    pub fn all_members(&self) -> Vec<i32> {
        let mut folders = vec![self.dir.clone()];
        let mut members = Vec::new();
        while let Some(folder) = folders.pop() {
            if let Ok(text) = std::fs::read_to_string(folder.join("cgroup.procs")) {
                members.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            let inner = std::fs::read_dir(&folder).into_iter().flatten().flatten();
            folders.extend(inner.map(|e| e.path()).filter(|p| p.is_dir()));
        }
        members
    }

    /// Whether any process is left in it or in a cgroup under it (a container's, which the
    /// engine makes inside its supervisor's tree): `cgroup.events` says so for the whole
    /// subtree; its own members where the file is not there.
    pub fn is_populated(&self) -> bool {
        match std::fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(events) => events.lines().any(|l| l.trim() == "populated 1"),
            Err(_) => !self.members().is_empty(),
        }
    }

    /// Whether a cgroup was made inside it (a container's, by the engine).
    pub fn has_inner(&self) -> bool {
        std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| entry.path().is_dir())
    }

    /// Sends `signal` to every process in it.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        for pid in self.members().into_iter().filter(|p| *p > 1) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }

    /// Ends every process in it at once (`cgroup.kill`; SIGKILL to each where the kernel has
    /// no `cgroup.kill`).
    pub fn kill(&self) {
        if std::fs::write(self.dir.join("cgroup.kill"), b"1").is_err() {
            self.signal(nix::sys::signal::Signal::SIGKILL);
        }
    }

    /// Ends whatever is left in it (a one-off's, a hook's or a probe's leftovers, once its
    /// leader exited or was killed) and removes it: nothing it started outlives it, and no
    /// empty tree is left behind.
    pub async fn end(&self) {
        self.kill();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.is_populated() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        self.remove();
    }

    /// Removes the tree once it is empty (a populated one stays, and says so by failing), and
    /// the v1 controllers' folders of the same name with it.
    pub fn remove(&self) -> bool {
        if let Some(name) = self.dir.file_name() {
            for folder in v1_folders(name) {
                let _ = std::fs::remove_dir(folder);
            }
        }
        let removed = std::fs::remove_dir(&self.dir).is_ok();
        if removed {
            let _ = std::fs::remove_file(Path::new(VERDICTS).join(self.label()));
        }
        removed
    }
}

/// The v1 hierarchies' folders named `name`: those rollgate made for a release's limits on a
/// hybrid host (memory, pids, cpu), and those the container engine made in every hierarchy it
/// mounts (blkio, cpuset, devices, freezer, `name=systemd`…) for a container whose cgroup
/// parent is the tree. Empty once the tree is: removed with it.
fn v1_folders(name: &std::ffi::OsStr) -> Vec<PathBuf> {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    hierarchies
        .flatten()
        .filter_map(|h| v1_folder_in(&h.path(), name))
        .filter(|p| !p.starts_with(base().unwrap_or(Path::new("/"))))
        .collect()
}

/// The folder of the tree `name` in the v1 hierarchy `hierarchy`: `rollgate/NAME`, or inside
/// its group, `rollgate/svc-…/NAME`.
fn v1_folder_in(hierarchy: &Path, name: &std::ffi::OsStr) -> Option<PathBuf> {
    let ours = hierarchy.join(FOLDER);
    let flat = ours.join(name);
    if flat.is_dir() {
        return Some(flat);
    }
    std::fs::read_dir(&ours)
        .ok()?
        .flatten()
        .filter(|g| g.file_name().to_string_lossy().starts_with(GROUP_PREFIX))
        .map(|g| g.path().join(name))
        .find(|p| p.is_dir())
}

/// When the kernel killed a process of `who`'s tree for reaching its memory limit: that limit,
/// in MiB (`memory.events`'s `oom_kill` on v2, `memory.oom_control`'s on v1; a container
/// supervisor's verdict where the count went with the container's own cgroup).
pub fn out_of_memory(who: &Identity) -> Option<u64> {
    let tree = of(who)?;
    let v2 = &tree.dir;
    let name = v2.file_name()?.to_os_string();
    let killed = |text: &str| {
        text.lines()
            .filter_map(|l| l.strip_prefix("oom_kill "))
            .any(|n| n.trim().parse::<u64>().is_ok_and(|n| n > 0))
    };
    let limit_mb = |path: PathBuf| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .map(|bytes| bytes >> 20)
    };
    if std::fs::read_to_string(v2.join("memory.events")).is_ok_and(|t| killed(&t)) {
        return limit_mb(v2.join("memory.max"));
    }
    if let Some(v1) = v1_folder_in(Path::new("/sys/fs/cgroup/memory"), &name) {
        if std::fs::read_to_string(v1.join("memory.oom_control")).is_ok_and(|t| killed(&t)) {
            // The limit reached: its own, or its group's (shared by the release's processes).
            let group = v1.parent().map(|g| g.join("memory.limit_in_bytes"));
            let own = limit_mb(v1.join("memory.limit_in_bytes"));
            return match group.and_then(limit_mb) {
                Some(group) => Some(own.map_or(group, |own| own.min(group))),
                None => own,
            };
        }
    }
    std::fs::read_to_string(Path::new(VERDICTS).join(tree.label()))
        .ok()
        .and_then(|said| said.trim().parse().ok())
}

/// Where a container's supervisor says its container was killed for its memory limit. The
/// kernel counts an OOM kill on the victim's own cgroup — on v1, there only — and the engine
/// removes a container's cgroup as it ends, so by the time rollgate reads the tree the count is
/// gone; the supervisor learned it from the engine. One file per run label, root's, on tmpfs
/// (gone at a reboot, as the trees are); removed with its tree.
const VERDICTS: &str = "/run/rollgate/verdicts";

/// The file a supervisor of a run labelled `label` writes its verdict in, made empty and opened
/// for it by rollgate (it cannot open files under /run itself: its filesystem rules say so).
/// None where this host keeps no trees (nothing would read it).
pub fn verdict_file(label: &str) -> Option<std::fs::File> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    base()?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(VERDICTS)
        .ok()?;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(Path::new(VERDICTS).join(label_of(label)))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_read_past_a_command_with_spaces_and_parentheses() {
        let stat = b"4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10\n";
        assert_eq!(start_time_of_stat(stat), Some(987654));
        assert_eq!(start_time_of_stat(b"4242 (x) S 1"), None);
        let own = std::fs::read("/proc/self/stat").unwrap();
        let expected = Identity::of(std::process::id() as i32).unwrap().start_time;
        assert_eq!(start_time_of_stat(&own), Some(expected));
        assert_eq!(unsafe { own_start_time() }, Some(expected));
        let mut buffer = [0u8; 20];
        assert_eq!(decimal(0, &mut buffer), b"0");
        assert_eq!(decimal(u64::MAX, &mut buffer), b"18446744073709551615");
    }

    #[test]
    fn a_tree_is_named_after_its_run_and_its_process_identity() {
        let tree = Tree {
            dir: PathBuf::from("/x/rollgate/r17.42-0-7.1~4242-987654"),
        };
        let leader = tree.leader().unwrap();
        assert_eq!((leader.pid, leader.start_time), (4242, 987654));
        assert_eq!(tree.label(), "r17.42-0-7.1");
        let old = Tree {
            dir: PathBuf::from("/x/rollgate/4242-987654"),
        };
        assert_eq!(old.leader().unwrap().pid, 4242);
        assert_eq!(old.label(), "");
        assert_eq!(label_of("up-12-3"), "up-12-3");
        assert_eq!(label_of("a/b~c"), "a_b_c");
    }
}
