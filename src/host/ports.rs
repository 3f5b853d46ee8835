//! Who listens on a port (issue 66): a release's probes count only when what answers them is
//! the release's own. A port is only a number, and binding one proves nothing about who will
//! listen on it: another local process could bind the candidate's port first (with
//! `SO_REUSEADDR` a bind-only socket does not stop rollgate's free-port check) and listen once
//! the candidate starts; the gate would then probe it and promote the wrong program. So when
//! a gate passes, every socket listening where its probe connects (`127.0.0.1:PORT`: bound to
//! that address, to any IPv4 address, or to IPv6's any) must be held by a process of the
//! candidate's own tree — read from `/proc/net/tcp{,6}` (the socket's inode) and the
//! processes' descriptors (`socket:[INODE]`).

use super::identity::Identity;

/// TCP's LISTEN state in `/proc/net/tcp`.
const LISTEN: &str = "0A";

/// A socket listening where a probe of `127.0.0.1:port` could land, by its inode and owner.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listening {
    inode: u64,
    uid: u32,
}

/// Why what answers on `port` is not the release `who`'s: the first listening socket there that
/// none of its processes holds, said as the process holding it. None when every one is the
/// release's (or nothing listens: the probe then failed on its own).
pub fn held_by_another(port: u16, who: &Identity) -> Option<String> {
    let listening = listening_on(port);
    if listening.is_empty() {
        return None;
    }
    let own = socket_inodes(&super::cgroup::members_of(who));
    // A socket no process holds is one being closed (a release exiting as it is asked):
    // nothing to say of it; the gate and the hold see the exit.
    listening
        .iter()
        .filter(|l| !own.contains(&l.inode))
        .find_map(|foreign| {
            let (pid, name) = holder_of(foreign.inode)?;
            Some(format!(
                "port {port} is held by process {pid} ({name}), uid {}, not by the candidate: its probes reached another program",
                foreign.uid
            ))
        })
}

fn listening_on(port: u16) -> Vec<Listening> {
    [("/proc/net/tcp", false), ("/proc/net/tcp6", true)]
        .iter()
        .flat_map(|(file, v6)| {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            parse(&text, *v6, port)
        })
        .collect()
}

/// The listening sockets of a `/proc/net/tcp` (or `tcp6`) listing on `port` that a connection
/// to 127.0.0.1 could reach.
fn parse(text: &str, v6: bool, port: u16) -> Vec<Listening> {
    let reaches_loopback: &[&str] = match v6 {
        false => &["0100007F", "00000000"],
        true => &[
            "00000000000000000000000000000000",
            "0000000000000000FFFF00000100007F",
        ],
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (address, hex_port) = fields.get(1)?.split_once(':')?;
            let listening = fields.get(3) == Some(&LISTEN)
                && u16::from_str_radix(hex_port, 16).ok() == Some(port)
                && reaches_loopback.contains(&address);
            listening.then_some(())?;
            Some(Listening {
                uid: fields.get(7)?.parse().ok()?,
                inode: fields.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// The socket inodes the processes `pids` hold open.
fn socket_inodes(pids: &[i32]) -> Vec<u64> {
    pids.iter().flat_map(|pid| sockets_of(*pid)).collect()
}

fn sockets_of(pid: i32) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let target = std::fs::read_link(entry.path()).ok()?;
            let target = target.to_str()?;
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// The process holding socket `inode`, with its command name (made printable).
fn holder_of(inode: u64) -> Option<(i32, String)> {
    let entries = std::fs::read_dir("/proc").ok()?;
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| sockets_of(*pid).contains(&inode))
        .map(|pid| {
            let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            (pid, super::output::printable(name.trim()))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sockets_listening_where_a_loopback_probe_lands_are_read() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1 0 100 0 0 10 0\n\
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000 70001        0 222 1 0 100 0 0 10 0\n\
   2: 0200000A:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 333 1 0 100 0 0 10 0\n\
   3: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 444 1 0 100 0 0 10 0\n\
   4: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1 0 100 0 0 10 0\n";
        assert_eq!(
            parse(tcp, false, 8080),
            vec![
                Listening { inode: 111, uid: 0 },
                Listening {
                    inode: 222,
                    uid: 70001
                }
            ]
        );
        let tcp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 666 1 0 100 0 0 10 0\n";
        assert_eq!(
            parse(tcp6, true, 8080),
            vec![Listening {
                inode: 666,
                uid: 1000
            }]
        );
    }

    #[test]
    fn a_listener_of_this_process_is_told_from_one_of_another() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = Identity::of(std::process::id() as i32).unwrap();
        let mine = socket_inodes(&[std::process::id() as i32]);
        assert!(listening_on(port).iter().all(|l| mine.contains(&l.inode)));
        // Another process (pid 1 holds none of ours) is not its holder.
        let init = Identity::of(1).unwrap();
        let said = held_by_another(port, &init).expect("not pid 1's");
        assert!(
            said.contains(&format!(
                "port {port} is held by process {}",
                std::process::id()
            )),
            "{said}"
        );
        let _ = me;
    }
}
