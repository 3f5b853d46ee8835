//! System V IPC objects (shared memory, message queues, semaphore sets), as the kernel lists
//! them in `/proc/sysvipc/`. They outlive the process that made them; a confined release makes
//! them in an IPC namespace of its own (see `confine`), so what it leaves dies with it. This
//! reads what is left in rollgate's own namespace: a uid still owning something there is not
//! handed to another service (`account`).

/// One IPC object: its kind, its id and the uid that owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub kind: &'static str,
    pub id: u64,
    pub uid: u32,
}

impl std::fmt::Display for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "System V {} {} (uid {})", self.kind, self.id, self.uid)
    }
}

/// The kinds, by the file that lists them and the column that holds each one's id.
const KINDS: [(&str, &str, &str); 3] = [
    ("shm", "shared memory segment", "shmid"),
    ("msg", "message queue", "msqid"),
    ("sem", "semaphore set", "semid"),
];

/// Every object in this IPC namespace, once under each uid that owns (or made) it.
pub fn all() -> Vec<Object> {
    KINDS
        .iter()
        .flat_map(|(file, kind, id_column)| {
            let text = std::fs::read_to_string(format!("/proc/sysvipc/{file}")).unwrap_or_default();
            parse(&text, kind, id_column)
        })
        .collect()
}

/// The objects a `/proc/sysvipc/*` listing names, each with its owner (the `uid` column; an
/// object whose creator `cuid` is another is listed under each).
fn parse(text: &str, kind: &'static str, id_column: &str) -> Vec<Object> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let column = |name: &str| header.split_whitespace().position(|h| h == name);
    let (Some(id_at), Some(uid_at)) = (column(id_column), column("uid")) else {
        return Vec::new();
    };
    let cuid_at = column("cuid");
    lines
        .flat_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let id = fields.get(id_at).and_then(|f| f.parse().ok());
            let owners = [Some(uid_at), cuid_at]
                .into_iter()
                .flatten()
                .filter_map(|at| fields.get(at)?.parse::<u32>().ok())
                .collect::<std::collections::BTreeSet<u32>>();
            owners
                .into_iter()
                .filter_map(move |uid| Some(Object { kind, id: id?, uid }))
        })
        .collect()
}

/// In a child between fork and exec, while it is still root: an IPC namespace of its own, so
/// the System V objects and POSIX message queues it makes are its own and end with the last
/// of its processes (systemd's `PrivateIPC=`). False where the kernel refused (not root, or no
/// IPC namespaces): the objects then live in the host's namespace.
pub fn unshare_namespace() -> bool {
    // SAFETY: unshare takes an integer.
    unsafe { libc::unshare(libc::CLONE_NEWIPC) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_names_each_object_with_its_owner_and_creator() {
        let shm = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid      atime      dtime      ctime                   rss                  swap\n\
                   4660         3   600                  1024   100   100      0 70001 70001 70001 70001          0          0 1700000000                     0                     0\n\
                   4661         7   600                  1024   100   100      0     0     0 70002 70002          0          0 1700000000                     0                     0\n";
        let objects = parse(shm, "shared memory segment", "shmid");
        assert_eq!(
            objects,
            vec![
                Object {
                    kind: "shared memory segment",
                    id: 3,
                    uid: 70001
                },
                Object {
                    kind: "shared memory segment",
                    id: 7,
                    uid: 0
                },
                Object {
                    kind: "shared memory segment",
                    id: 7,
                    uid: 70002
                },
            ]
        );
        assert_eq!(parse("", "message queue", "msqid"), Vec::new());
        assert_eq!(
            objects[0].to_string(),
            "System V shared memory segment 3 (uid 70001)"
        );
    }
}
