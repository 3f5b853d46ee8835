//! A filesystem a release cannot escape (issue 59), with Landlock: the kernel's own access
//! control that any process may put on itself and its children, stacked on the uid's.
//!
//! A confined release may read and execute the system (`/usr`, `/bin`, `/sbin`, the `/lib`s,
//! `/etc`, `/opt`, `/run`, `/proc`, `/sys`) and its own release folder (and rollgate's own
//! binary: a release started through `rollgate listen-exec` runs it); read and write the
//! devices under `/dev`; and write only its service's state folder (`STATE_DIRECTORY`), its
//! private temporary folder (`TMPDIR`) and the folders the policy lists in
//! `isolation.writable`. Everything else — other roots, rollgate's state, `/root`, `/home`,
//! `/tmp`, `/srv`, `/var` — it can neither read nor write, whatever their modes say.
//!
//! The ruleset is built in rollgate, before the fork (it opens files and allocates); the child
//! only enforces it, between fork and exec. Best effort: on a kernel with an older Landlock ABI
//! the rights it does not know are not restricted (ABI 1, Linux 5.13: reading, writing,
//! executing, making and removing files; 2, 5.19: moving a file into another folder; 3, 6.2:
//! truncating; 5, 6.10: device ioctls), and without Landlock at all nothing is — `status` and
//! `--dry-run` say which ABI the host has.

use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};

/// The newest ABI whose rights rollgate asks for. Later ABIs add rights rollgate does not
/// grant anywhere yet (resolving Unix sockets by path, ABI 9), which would cut a release off
/// a database's socket under /run.
const TARGET: ABI = ABI::V5;

/// What the system gives every release to read and execute.
pub const SYSTEM: [&str; 13] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/run",
    "/proc", "/sys", "/nix",
];

/// Where a release may go.
pub struct Reach<'a> {
    /// Its release folders (where it runs, where its executable is).
    pub release: &'a [&'a Path],
    /// Its service's state and temporary folders.
    pub writable: &'a [&'a Path],
    /// The policy's `isolation.writable`.
    pub listed: &'a [PathBuf],
    /// The TCP ports it may bind (its `$PORT`; none for a hook): every other is refused, so
    /// it cannot take a port another service's next release was given (ABI 4).
    pub ports: &'a [u16],
}

/// The Landlock ruleset for `reach`, ready for the child to enforce with [`enforce`].
pub fn ruleset(reach: &Reach) -> std::io::Result<RulesetCreated> {
    let fail = |e: landlock::RulesetError| std::io::Error::other(format!("landlock: {e}"));
    let read = AccessFs::from_read(TARGET);
    let all = AccessFs::from_all(TARGET);
    let devices = read | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
    let me: BitFlags<AccessFs> = AccessFs::Execute | AccessFs::ReadFile;
    let mut rules: Vec<(PathBuf, BitFlags<AccessFs>)> = Vec::new();
    rules.extend(SYSTEM.iter().map(|p| (PathBuf::from(p), read)));
    rules.push((PathBuf::from("/dev"), devices));
    rules.extend(reach.release.iter().map(|p| (p.to_path_buf(), read)));
    rules.extend(reach.writable.iter().map(|p| (p.to_path_buf(), all)));
    rules.extend(reach.listed.iter().map(|p| (p.clone(), all)));
    if let Ok(exe) = std::env::current_exe() {
        rules.push((exe, me));
    }
    // Beyond the files (best effort, as above): binding a TCP port (ABI 4, Linux 6.7;
    // connecting stays open), and the scopes (ABI 6, 6.12): no signal to a process outside
    // this release's own domain — its own service's other release included, since each
    // release process makes a domain of its own — and no connection to an abstract Unix
    // socket made outside it.
    let mut created = Ruleset::default()
        .handle_access(all)
        .and_then(|ruleset| ruleset.handle_access(AccessNet::BindTcp))
        .and_then(|ruleset| ruleset.scope(Scope::from_all(ABI::V6)))
        .and_then(Ruleset::create)
        .map_err(fail)?;
    for port in reach.ports {
        created = created
            .add_rule(NetPort::new(*port, AccessNet::BindTcp))
            .map_err(fail)?;
    }
    for (path, access) in rules {
        // A system folder this host does not have is nothing to grant.
        let Ok(fd) = PathFd::new(&path) else {
            continue;
        };
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(fail)?;
    }
    Ok(created)
}

/// In the child between fork and exec, after no-new-privileges: the ruleset on this process
/// and everything it starts, for good. Only system calls (the ruleset's fd, `prctl`).
pub fn enforce(ruleset: RulesetCreated) -> std::io::Result<()> {
    ruleset
        .restrict_self()
        .map(|_| ())
        .map_err(|_| std::io::Error::last_os_error())
}

/// The Landlock ABI this kernel has (0: none).
pub fn abi() -> u32 {
    // SAFETY: with a null attribute, size 0 and the version flag, the call only returns a
    // number.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    u32::try_from(version).unwrap_or(0)
}

/// The words for `status` and `--dry-run`.
pub fn describe() -> String {
    match abi() {
        0 => "NO filesystem rules: this kernel has no Landlock".into(),
        n => {
            let missing = weaker_than_wanted(n);
            format!(
                "Landlock ABI {n}: reads the system and its release, writes only its state and tmp{}{}",
                if n >= 4 { ", binds only its own port" } else { "" },
                if missing.is_empty() {
                    String::new()
                } else {
                    format!(" (NOT restricted on this kernel: {})", missing.join("; "))
                }
            )
        }
    }
}

/// What this kernel cannot hold a release to, in words (None: everything rollgate asks for).
pub fn weaker_here() -> Option<String> {
    let abi = abi();
    let missing = weaker_than_wanted(abi);
    match (abi, missing.is_empty()) {
        (_, true) => None,
        (0, _) => Some("this kernel has no Landlock: NO filesystem or network rules, no scoping (see docs/isolation.md)".into()),
        (n, false) => Some(format!(
            "this kernel's Landlock is ABI {n}; NOT restricted: {} (see docs/isolation.md)",
            missing.join("; ")
        )),
    }
}

/// What a release is not held to on a kernel with Landlock ABI `abi`, said in words: empty
/// where the kernel has everything rollgate asks for.
pub fn weaker_than_wanted(abi: u32) -> Vec<&'static str> {
    let rules: [(u32, &str); 5] = [
        (1, "reading and writing files outside its folders (ABI 1)"),
        (3, "truncation (ABI 3)"),
        (4, "binding another service's TCP port (ABI 4)"),
        (5, "device ioctls (ABI 5)"),
        (
            6,
            "signals to its own service's other release and abstract Unix sockets (ABI 6)",
        ),
    ];
    rules
        .iter()
        .filter(|(needs, _)| abi < *needs)
        .map(|(_, what)| *what)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_missing_abi_is_said_and_a_full_one_says_nothing() {
        assert_eq!(weaker_than_wanted(7), Vec::<&str>::new());
        assert_eq!(weaker_than_wanted(6), Vec::<&str>::new());
        let five = weaker_than_wanted(5);
        assert_eq!(five.len(), 1);
        assert!(five[0].contains("signals to its own service's other release"));
        let three = weaker_than_wanted(3);
        assert!(
            three
                .iter()
                .any(|w| w.contains("another service's TCP port")),
            "{three:?}"
        );
        assert!(!three.iter().any(|w| w.contains("truncation")), "{three:?}");
        assert_eq!(weaker_than_wanted(0).len(), 5);
    }
}
