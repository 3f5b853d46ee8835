//! A service's listening socket, held for it by rollgate and handed to each release the way
//! systemd's socket activation hands one: as fd 3, with `LISTEN_FDS=1`, `LISTEN_PID` (the
//! release's own pid) and `LISTEN_FDNAMES`. The live release and a candidate accept on the
//! *same* socket, so while either accepts no connection is refused: the kernel queues them in
//! the backlog.
//!
//! Between deploys a small holder process (`rollgate hold`, one per root) keeps the socket and
//! passes a copy of it to whoever connects to `ROOT/listen.sock` (SCM_RIGHTS); it never
//! accepts. When no holder answers, the next command starts one: it binds the address, or,
//! when a live release still has the socket (its holder was killed), takes a copy of that
//! release's socket with `pidfd_getfd(2)` rather than binding a second one.
//!
//! `LISTEN_PID` must be the release's pid, known only once it is forked; the environment is
//! fixed before the fork, so the release is started through a trampoline, `rollgate
//! listen-exec`, which sets the variables for its own pid and execs the release (same pid).

use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    bind, recvmsg, sendmsg, setsockopt, socket, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType, SockaddrStorage,
};

use super::fault::Fault;

/// The fd a release finds its socket on (`SD_LISTEN_FDS_START`).
pub const FIRST_FD: RawFd = 3;
/// In a child between fork and exec: the held socket `fd` put at [`FIRST_FD`] and left open
/// across the exec. Whatever was at fd 3 was close-on-exec (rollgate opens everything so), so
/// putting the socket there loses nothing; only fcntl and dup2, which a child may call there.
pub fn place_in_child(fd: RawFd) -> std::io::Result<()> {
    if fd == FIRST_FD {
        let flags = nix::fcntl::FdFlag::empty();
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(flags))
            .map_err(std::io::Error::from)?;
    // SAFETY: dup2 takes two integers.
    } else if unsafe { libc::dup2(fd, FIRST_FD) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The socket's name in `LISTEN_FDNAMES`.
pub const FD_NAME: &str = "http";
/// Where the root's holder answers.
pub const HOLDER_SOCKET: &str = "listen.sock";
/// What the holder records of itself (pid, start time, address), for `status` and recovery.
pub const HOLDER_FILE: &str = "listen.json";

/// The socket a policy's `listen` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Spec {
    pub address: SocketAddr,
    pub backlog: u32,
}

/// The holder's record of itself.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Holder {
    pub pid: i32,
    pub start_time: u64,
    pub address: SocketAddr,
    pub backlog: u32,
    /// How it came by the socket: `bound`, or `taken from pid N`.
    pub origin: String,
}

impl Spec {
    /// `ADDRESS` as a policy writes it (`127.0.0.1:8080`, `[::1]:8080`).
    pub fn parse(address: &str, backlog: u32) -> Result<Spec, Fault> {
        let address = address.parse::<SocketAddr>().map_err(|_| {
            Fault::setting(
                "listen.address",
                format!("listen.address `{address}` is not an address and port (127.0.0.1:8080)"),
            )
        })?;
        if address.port() == 0 {
            return Err(Fault::setting(
                "listen.address",
                "listen.address needs a port above 0: releases are reached on it",
            ));
        }
        if !(1..=65535).contains(&backlog) {
            return Err(Fault::setting(
                "listen.backlog",
                format!("listen.backlog is {backlog}; it must be from 1 to 65535"),
            ));
        }
        Ok(Spec { address, backlog })
    }
}

/// Binds `spec` (SO_REUSEADDR, so an address whose last connections linger in TIME_WAIT binds
/// again) and listens with its backlog. Close-on-exec: only a release gets it, as fd 3.
pub fn bind_listener(spec: &Spec) -> std::io::Result<OwnedFd> {
    let family = match spec.address {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(fd.as_raw_fd(), &SockaddrStorage::from(spec.address))?;
    // listen(2) itself, not nix's `Backlog` (which refuses Linux's own default, somaxconn):
    // the kernel caps the backlog at net.core.somaxconn.
    let backlog = spec.backlog.min(i32::MAX as u32) as i32;
    // SAFETY: a plain syscall on a socket this function owns.
    if unsafe { libc::listen(fd.as_raw_fd(), backlog) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Sends one fd over a Unix stream (SCM_RIGHTS), with one byte of data to carry it.
pub fn send_fd(stream: &UnixStream, fd: RawFd) -> std::io::Result<()> {
    let fds = [fd];
    let message = [ControlMessage::ScmRights(&fds)];
    sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(b"F")],
        &message,
        MsgFlags::empty(),
        None,
    )?;
    Ok(())
}

/// Receives one fd sent by [`send_fd`] (close-on-exec in this process).
pub fn recv_fd(stream: &UnixStream) -> std::io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut data = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let message = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut data,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    for control in message.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = control {
            if let Some(fd) = fds.first() {
                // SAFETY: the kernel just installed this fd in this process for us alone.
                return Ok(unsafe { OwnedFd::from_raw_fd(*fd) });
            }
        }
    }
    Err(std::io::Error::other(
        "the holder answered without a socket",
    ))
}

/// The holder's Unix socket under `root`.
pub fn holder_socket(root: &Path) -> PathBuf {
    root.join(HOLDER_SOCKET)
}

/// The holder's record under `root`, if one was written.
pub fn holder_record(root: &Path) -> Option<Holder> {
    super::files::read_json(&root.join(HOLDER_FILE))
        .ok()
        .flatten()
}

/// A copy of the socket from the root's holder, if one answers.
pub fn fetch(root: &Path) -> std::io::Result<OwnedFd> {
    let stream = UnixStream::connect(holder_socket(root))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    recv_fd(&stream)
}

/// The listening sockets systemd's socket activation passed to this process (`LISTEN_PID` is
/// this pid; `LISTEN_FDS` of them from fd 3), each with the address it is bound to. Taken
/// once: the variables are cleared and the descriptors made close-on-exec, so nothing this
/// process starts inherits them. A descriptor that is no internet socket is left alone.
pub fn activated() -> Vec<(SocketAddr, OwnedFd)> {
    let ours = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|pid| pid.parse::<u32>().ok())
        == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<RawFd>().ok())
        .unwrap_or(0);
    for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(name);
    }
    if !ours || !(1..=64).contains(&count) {
        return Vec::new();
    }
    let mut sockets = Vec::new();
    for fd in FIRST_FD..FIRST_FD + count {
        let is_socket =
            nix::sys::stat::fstat(fd).is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFSOCK);
        if !is_socket {
            continue;
        }
        // SAFETY: systemd passed the descriptor to this process for it to own; nothing else
        // here opened or owns it (it was set before this process started).
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let _ = nix::fcntl::fcntl(
            fd.as_raw_fd(),
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
        match local_address(&fd) {
            Ok(address) => sockets.push((address, fd)),
            Err(_) => std::mem::forget(fd),
        }
    }
    sockets
}

/// The address a listening socket is bound to.
pub fn local_address(fd: &OwnedFd) -> std::io::Result<SocketAddr> {
    let address: SockaddrStorage = nix::sys::socket::getsockname(fd.as_raw_fd())?;
    if let Some(v4) = address.as_sockaddr_in() {
        return Ok(SocketAddr::V4((*v4).into()));
    }
    if let Some(v6) = address.as_sockaddr_in6() {
        return Ok(SocketAddr::V6((*v6).into()));
    }
    Err(std::io::Error::other("not an internet socket"))
}

/// The root's socket for `spec`: from its holder, else from a holder started now (`hold` is
/// the command that starts one: `rollgate hold --root ROOT ...`). Refused when the holder
/// serves another address (the policy changed its `listen`: a new address needs the old
/// holder stopped first, which this never does behind a person's back).
fn obtain(
    root: &Path,
    spec: &Spec,
    hold: &mut dyn FnMut() -> std::io::Result<()>,
) -> Result<OwnedFd, Fault> {
    let busy = |why: String| Fault::unwritable(&holder_socket(root), why);
    let fd = match fetch(root) {
        Ok(fd) => fd,
        Err(_) => {
            hold().map_err(|e| busy(format!("cannot start the socket's holder: {e}")))?;
            let waited = Instant::now();
            loop {
                // A holder that could not start says why in its log, and exits.
                let gave_up = std::fs::metadata(root.join(HOLDER_LOG)).is_ok_and(|m| m.len() > 0);
                match fetch(root) {
                    Ok(fd) => break fd,
                    Err(_) if !gave_up && waited.elapsed() < Duration::from_secs(10) => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) => {
                        let said =
                            std::fs::read_to_string(root.join(HOLDER_LOG)).unwrap_or_default();
                        return Err(busy(format!(
                            "the socket's holder did not answer on {} within 10 s ({e}){}",
                            holder_socket(root).display(),
                            match said.trim() {
                                "" => String::new(),
                                said => format!("; it said: {said}"),
                            }
                        )));
                    }
                }
            }
        }
    };
    let held = local_address(&fd)
        .map_err(|e| busy(format!("cannot read the held socket's address: {e}")))?;
    if held != spec.address {
        return Err(Fault::setting(
            "listen.address",
            format!(
                "the root's socket is held on {held}, not {}: stop its holder (pid in {}) to move the service to another address",
                spec.address,
                root.join(HOLDER_FILE).display()
            ),
        ));
    }
    Ok(fd)
}

/// Starts the root's holder (`rollgate hold`), detached in a session of its own so it outlives
/// the command, its words in `ROOT/listen.log`; then the root's socket from it.
pub fn obtain_or_hold(root: &Path, spec: &Spec) -> Result<OwnedFd, Fault> {
    obtain(root, spec, &mut || start_holder(root, spec))
}

fn start_holder(root: &Path, spec: &Spec) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    let log = std::fs::File::create(root.join(HOLDER_LOG))?;
    let mut command = std::process::Command::new("/proc/self/exe");
    command
        .arg("hold")
        .arg("--root")
        .arg(root)
        .arg("--listen")
        .arg(spec.address.to_string())
        .arg("--backlog")
        .arg(spec.backlog.to_string())
        // In the root, as the releases are: whatever finds a root's processes finds it too.
        .current_dir(root)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: close and setsid are async-signal-safe and touch nothing of the parent.
    unsafe {
        command.pre_exec(|| {
            super::lock::close_held_in_child();
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    // Reaped here if it ends while this process lives (it should not: it holds the socket).
    std::thread::spawn(move || child.wait());
    Ok(())
}

/// Where a holder started by a command says why it could not start.
pub const HOLDER_LOG: &str = "listen.log";

/// The holder: takes the socket (binds it, or takes a live release's copy of it), records
/// itself, and hands a copy to every connection on `ROOT/listen.sock` until it is stopped.
/// It never accepts on the socket itself.
pub fn hold(root: &Path, spec: &Spec, live_pids: &[i32]) -> Result<(), Fault> {
    let (fd, origin) = match bind_listener(spec) {
        Ok(fd) => (fd, "bound".to_string()),
        Err(bind_error) => match take_from(live_pids, spec) {
            Some((fd, pid)) => (fd, format!("taken from pid {pid}")),
            None => {
                return Err(Fault::unwritable(
                    &holder_socket(root),
                    format!("cannot listen on {}: {bind_error}", spec.address),
                ))
            }
        },
    };
    let path = holder_socket(root);
    // A holder that died left its socket file: a live one answers, and is never displaced.
    if UnixStream::connect(&path).is_ok() {
        return Err(Fault::unwritable(
            &path,
            format!("another holder answers on {}", path.display()),
        ));
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(|e| {
        Fault::unwritable(&path, format!("cannot listen on {}: {e}", path.display()))
    })?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    }
    let me = std::process::id() as i32;
    let record = Holder {
        pid: me,
        start_time: super::identity::Identity::of(me).map_or(0, |i| i.start_time),
        address: spec.address,
        backlog: spec.backlog,
        origin,
    };
    let mut bytes = serde_json::to_vec_pretty(&record).expect("a holder record serializes");
    bytes.push(b'\n');
    let record_path = root.join(HOLDER_FILE);
    super::files::write_atomically(&record_path, &bytes).map_err(|e| {
        Fault::unwritable(
            &record_path,
            format!("cannot write {}: {e}", record_path.display()),
        )
    })?;
    // A peer that goes away mid-answer costs nothing: the next one is served.
    for stream in listener.incoming().flatten() {
        let _ = send_fd(&stream, fd.as_raw_fd());
    }
    Ok(())
}

/// A copy of the listening socket on `spec.address` that one of `pids` holds, taken with
/// `pidfd_getfd(2)` (Linux 5.6; the caller needs ptrace rights over the pid: the same user
/// with Yama's ptrace_scope 0, or root).
fn take_from(pids: &[i32], spec: &Spec) -> Option<(OwnedFd, i32)> {
    let inode = listening_inode(spec.address)?;
    for &pid in pids {
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            if target.to_string_lossy() != format!("socket:[{inode}]") {
                continue;
            }
            let Some(number) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            if let Some(fd) = pidfd_getfd(pid, number) {
                return Some((fd, pid));
            }
        }
    }
    None
}

/// The inode of the socket listening on `address` (from `/proc/net/tcp` or `tcp6`).
fn listening_inode(address: SocketAddr) -> Option<u64> {
    const LISTEN: &str = "0A";
    let (table, local) = match address {
        SocketAddr::V4(v4) => (
            "/proc/net/tcp",
            format!(
                "{:08X}:{:04X}",
                u32::from_le_bytes(v4.ip().octets()),
                v4.port()
            ),
        ),
        SocketAddr::V6(v6) => {
            let octets = v6.ip().octets();
            let words: String = octets
                .chunks(4)
                .map(|w| format!("{:08X}", u32::from_le_bytes([w[0], w[1], w[2], w[3]])))
                .collect();
            ("/proc/net/tcp6", format!("{words}:{:04X}", v6.port()))
        }
    };
    let text = std::fs::read_to_string(table).ok()?;
    text.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&LISTEN))
            .then(|| fields.get(9)?.parse().ok())
            .flatten()
    })
}

/// `pidfd_getfd(pidfd_open(pid), fd)`: a copy of another process's fd (close-on-exec here).
fn pidfd_getfd(pid: i32, fd: i32) -> Option<OwnedFd> {
    // SAFETY: plain syscalls with integer arguments; each returned fd is owned here alone.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return None;
        }
        let pidfd = OwnedFd::from_raw_fd(pidfd as RawFd);
        let copy = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        (copy >= 0).then(|| OwnedFd::from_raw_fd(copy as RawFd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_passed_over_a_unix_stream_is_the_same_listening_socket() {
        let spec = Spec::parse("127.0.0.1:0", 16).err();
        assert!(spec.is_some(), "port 0 is refused");
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = probe.local_addr().unwrap();
        drop(probe);
        // The default backlog, Linux's somaxconn (4096), is taken as it is.
        let spec = Spec::parse(&address.to_string(), crate::defaults::LISTEN_BACKLOG).unwrap();
        let held = bind_listener(&spec).unwrap();
        let (left, right) = UnixStream::pair().unwrap();
        send_fd(&left, held.as_raw_fd()).unwrap();
        let copy = recv_fd(&right).unwrap();
        assert_ne!(copy.as_raw_fd(), held.as_raw_fd());
        assert_eq!(local_address(&copy).unwrap(), address);
        // A connection made now is accepted from the copy: one socket, two fds.
        let client = std::net::TcpStream::connect(address).unwrap();
        let listener = std::net::TcpListener::from(copy);
        let (accepted, _) = listener.accept().unwrap();
        assert_eq!(accepted.peer_addr().unwrap(), client.local_addr().unwrap());
        assert!(listening_inode(address).is_some());
    }

    #[test]
    fn a_listen_address_is_checked() {
        assert!(Spec::parse("localhost:80", 10).is_err());
        assert!(Spec::parse("127.0.0.1:8080", 0).is_err());
        assert_eq!(
            Spec::parse("[::1]:8080", 511).unwrap().address.to_string(),
            "[::1]:8080"
        );
    }
}
