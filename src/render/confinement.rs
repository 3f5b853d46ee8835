//! How a running release is held, in words, for `status` and the console alike.

use serde::Deserialize;

/// What a release may use, as the status JSON has it (the policy's `isolation`).
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub struct Limits {
    pub memory_mb: Option<u64>,
    pub pids: Option<u64>,
    pub cpu_pct: Option<u64>,
    pub nofile: Option<u64>,
}

/// What is known of how a release is held.
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    /// False: `isolation.enabled = false`.
    pub confined: bool,
    /// The uid it runs as, read from the kernel while it runs.
    pub uid: Option<u32>,
    /// Its uid is rollgate's own: rollgate was not root and could not switch users.
    pub own_user: bool,
    /// Its process tree (cgroup path), where the host gives one.
    pub tree: Option<&'a str>,
    pub limits: Limits,
}

/// `yes (uid 70001; no privileges; tree /sys/fs/...; limits memory 512 MiB)`, or `NO: ...`.
pub fn words(held: &Held) -> String {
    if !held.confined {
        return format!(
            "NO: isolation.enabled = false, rollgate's own privileges{}",
            held.uid
                .map(|uid| format!(" (uid {uid})"))
                .unwrap_or_default()
        );
    }
    let l = &held.limits;
    let limits: Vec<String> = [
        l.memory_mb.map(|mb| format!("memory {mb} MiB")),
        l.pids.map(|n| format!("{n} processes")),
        l.cpu_pct.map(|pct| format!("{pct} % of a core")),
        l.nofile.map(|n| format!("{n} open files")),
    ]
    .into_iter()
    .flatten()
    .collect();
    let uid = held.uid.map(|uid| match held.own_user {
        true => format!(
            "uid {uid}, rollgate's own: NOT a user of its own, only root can switch users; "
        ),
        false => format!("uid {uid}; "),
    });
    format!(
        "yes ({}no privileges; tree {}; limits {})",
        uid.unwrap_or_default(),
        held.tree.unwrap_or("none: its process group"),
        match limits.is_empty() {
            true => "none".to_string(),
            false => limits.join(", "),
        }
    )
}
