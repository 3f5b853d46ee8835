//! Readiness by notification: the subset of systemd's notify protocol (`sd_notify(3)`) that a
//! release may speak to rollgate instead of being polled.
//!
//! Each release started with a `'notify` probe gets a datagram socket of its own in rollgate's
//! run folder, `NOTIFY_SOCKET=/run/rollgate/notify/<token>` (see `run_dir`: only rollgate may
//! make a name there, so no other process can bind the release's socket first, as anyone could
//! an abstract name; and a release under Landlock's scoping cannot reach an abstract socket made
//! outside it). Whoever gates or watches the release binds that address, holding the claim
//! `<token>.lock` while it reads: the deployer during the gate, the executor or a detached
//! watcher during the watch, `up --supervise` afterwards; after a crash the next one binds it
//! again. A release started by an earlier rollgate with an abstract address (`@rollgate/…`)
//! is still read there.
//!
//! Only datagrams whose sender (its credentials, `SO_PASSCRED`) belongs to the release's own
//! process group count; anything else is ignored and counted. A sender that has already exited
//! and been reaped cannot be checked and is ignored too: send from the service itself (every
//! library does), not from a helper that exits at once.
//!
//! Understood: `READY=1`, `STATUS=…`, `ERRNO=…`, `WATCHDOG=1`, `WATCHDOG=trigger`,
//! `STOPPING=1`, `EXTEND_TIMEOUT_USEC=…`. Other assignments are accepted and ignored, as
//! systemd ignores what it does not know.

use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use nix::sys::socket::{
    bind, recvmsg, setsockopt, socket, sockopt, AddressFamily, ControlMessageOwned, MsgFlags,
    SockFlag, SockType, UnixAddr,
};
use tokio::io::Interest;
use tokio::net::UnixDatagram;
use tokio::sync::watch;
use tokio::time::Instant;

use super::identity::group_of;

/// The variable a release finds its socket in, as systemd names it.
pub const SOCKET_VARIABLE: &str = "NOTIFY_SOCKET";
/// The watchdog interval in microseconds, as systemd names it.
pub const WATCHDOG_VARIABLE: &str = "WATCHDOG_USEC";

/// One datagram to `$NOTIFY_SOCKET` (`@name`: the abstract namespace), as sd_notify(3) sends
/// it: rollgate's own word to a supervisor that speaks the protocol (the proxy's `READY=1`).
/// Nothing without the variable.
pub fn tell_systemd(message: &str) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let Ok(address) = std::env::var(SOCKET_VARIABLE) else {
        return Ok(());
    };
    let target = match address.strip_prefix('@') {
        Some(name) => std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?,
        None => std::os::unix::net::SocketAddr::from_pathname(&address)?,
    };
    std::os::unix::net::UnixDatagram::unbound()?
        .send_to_addr(message.as_bytes(), &target)
        .map(drop)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{address}: {e}")))
}

/// The longest datagram read; systemd reads at most this much too. Longer ones are ignored.
const DATAGRAM_MAX: usize = 4096;
/// The longest `STATUS=` text kept (longer text is cut at a character boundary).
const STATUS_MAX: usize = 200;
/// How long binding waits for a previous holder of the address to let go of it (a deployer
/// that is exiting while the detached watcher starts, say).
pub const BIND_PATIENCE: Duration = Duration::from_millis(1000);

/// The folder of rollgate's run folder the notification sockets are in.
const FOLDER: &str = "notify";

/// The `NOTIFY_SOCKET` value for a release started with `token`: a name in the run folder (the
/// token itself where it is short and plain, else a digest of it).
pub fn address_for(token: &str) -> std::io::Result<String> {
    let folder = super::run_dir::folder(FOLDER, super::run_dir::Reach::Searchable)?;
    let plain = token.len() <= 48
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        && !token.starts_with('.');
    let name = match plain {
        true => token.to_string(),
        false => super::run_dir::short_name(token.as_bytes()),
    };
    Ok(folder.join(name).display().to_string())
}

/// The `NOTIFY_SOCKET` a running process was started with, if any.
pub fn address_of(pid: i32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0).find_map(|var| {
        let value = var.strip_prefix(b"NOTIFY_SOCKET=")?;
        Some(String::from_utf8_lossy(value).into_owned())
    })
}

/// What a release has said so far.
#[derive(Debug, Clone)]
pub struct Notices {
    /// When `READY=1` arrived (or, for a release already live when watching began, then).
    pub ready_at: Option<Instant>,
    /// The last `WATCHDOG=1` (or `READY=1`, or the start of watching a live release).
    pub last_ping: Option<Instant>,
    pub status: Option<String>,
    pub errno: Option<i32>,
    /// `WATCHDOG=trigger`: the release asks to be treated as hung.
    pub watchdog_triggered: bool,
    pub stopping: bool,
    /// The latest `EXTEND_TIMEOUT_USEC=` asks for more time until then.
    pub extend_until: Option<Instant>,
    /// Datagrams counted and dropped: from outside the release's group, unreadable, too long.
    pub ignored: u32,
}

impl Notices {
    fn new(live: bool) -> Notices {
        let now = Instant::now();
        Notices {
            ready_at: live.then_some(now),
            last_ping: live.then_some(now),
            status: None,
            errno: None,
            watchdog_triggered: false,
            stopping: false,
            extend_until: None,
            ignored: 0,
        }
    }

    /// How long since the last ping, when that is longer than `watchdog` (only once ready:
    /// the watchdog starts with readiness, as systemd's does).
    pub fn watchdog_missed(&self, watchdog: Duration) -> Option<Duration> {
        let since = self.last_ping?.elapsed();
        (since > watchdog).then_some(since)
    }

    /// Applies one datagram's assignments (one per line), as of `now`.
    fn apply(&mut self, datagram: &[u8], now: Instant) {
        for line in datagram.split(|b| *b == b'\n') {
            let Some(eq) = line.iter().position(|b| *b == b'=') else {
                continue;
            };
            let (key, value) = (&line[..eq], &line[eq + 1..]);
            match (key, value) {
                (b"READY", b"1") => {
                    self.ready_at.get_or_insert(now);
                    self.last_ping = Some(now);
                }
                (b"STATUS", text) => self.status = Some(printable(text)),
                (b"ERRNO", number) => {
                    if let Some(n) = parse::<i32>(number).filter(|n| *n >= 0) {
                        self.errno = Some(n);
                    }
                }
                (b"WATCHDOG", b"1") => self.last_ping = Some(now),
                (b"WATCHDOG", b"trigger") => self.watchdog_triggered = true,
                (b"STOPPING", b"1") => self.stopping = true,
                (b"EXTEND_TIMEOUT_USEC", number) => {
                    if let Some(us) = parse::<u64>(number) {
                        self.extend_until = Some(now + Duration::from_micros(us));
                    }
                }
                _ => {}
            }
        }
    }
}

fn parse<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// Text fit for a progress line and the log: control characters dropped, bounded.
fn printable(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .filter(|c| !c.is_control())
        .take(STATUS_MAX)
        .collect()
}

/// A bound notification socket whose reader has not started yet: bind it before the release
/// starts (so that nothing it says early is lost: the kernel queues datagrams, and stamps each
/// with its sender when it is sent), then [`Socket::listen`] once its process group is known.
pub struct Socket {
    socket: UnixDatagram,
    address: String,
    held: Option<Held>,
}

/// A socket's name in the run folder, and the claim on it: the name is removed before the
/// claim is let go, so the next holder always binds a name of its own making.
struct Held {
    path: std::path::PathBuf,
    _claim: super::run_dir::Claim,
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Socket {
    /// Binds the socket of the release started with `token`.
    pub fn for_token(token: &str) -> std::io::Result<Socket> {
        Socket::bind(&address_for(token)?)
    }

    /// Binds `address` (as `NOTIFY_SOCKET` gives it), waiting a moment for a previous holder to
    /// let go. Inside the runtime.
    pub fn bind(address: &str) -> std::io::Result<Socket> {
        Socket::bind_within(address, BIND_PATIENCE)
    }

    /// Binds `address`, waiting at most `patience` for a previous holder to let go. Only
    /// rollgate's addresses: a name in its run folder (or an earlier rollgate's abstract one).
    pub fn bind_within(address: &str, patience: Duration) -> std::io::Result<Socket> {
        let not_ours = || {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{address:?} is not a rollgate notification address"),
            )
        };
        let (unix, held) = match address.strip_prefix('@') {
            Some(name) if name.starts_with("rollgate/") => {
                (UnixAddr::new_abstract(name.as_bytes())?, None)
            }
            Some(_) => return Err(not_ours()),
            None => {
                let path = std::path::PathBuf::from(address);
                let folder = super::run_dir::folder(FOLDER, super::run_dir::Reach::Searchable)?;
                let in_folder = path.parent() == Some(folder.as_path())
                    && path
                        .file_name()
                        .is_some_and(|n| !n.as_encoded_bytes().starts_with(b"."));
                if !in_folder {
                    return Err(not_ours());
                }
                let held = claim_within(&path, address, patience)?;
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                (UnixAddr::new(&path)?, Some(held))
            }
        };
        let waited = std::time::Instant::now();
        loop {
            let fd = socket(
                AddressFamily::Unix,
                SockType::Datagram,
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
                None,
            )?;
            setsockopt(&fd, sockopt::PassCred, &true)?;
            match bind(fd.as_raw_fd(), &unix) {
                Ok(()) => {
                    if let Some(held) = &held {
                        // The release runs as its service's user: it may send, and only
                        // datagrams from its own process group count (see `read`).
                        use std::os::unix::fs::PermissionsExt;
                        std::fs::set_permissions(
                            &held.path,
                            std::fs::Permissions::from_mode(0o666),
                        )?;
                    }
                    let socket = std::os::unix::net::UnixDatagram::from(fd);
                    return Ok(Socket {
                        socket: UnixDatagram::from_std(socket)?,
                        address: address.to_string(),
                        held,
                    });
                }
                Err(nix::errno::Errno::EADDRINUSE) if waited.elapsed() < patience => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => {
                    return Err(std::io::Error::new(
                        std::io::Error::from(e).kind(),
                        format!("cannot bind the notification socket {address}: {e}"),
                    ))
                }
            }
        }
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// Starts reading: datagrams from process group `group` update the notices. `live`: the
    /// release proved readiness before this watcher began (its watchdog counts from now).
    pub fn listen(self, group: i32, live: bool) -> Notifier {
        let (sender, notices) = watch::channel(Notices::new(live));
        let reader = tokio::spawn(read(self.socket, group, sender));
        Notifier {
            notices,
            reader,
            _held: self.held,
        }
    }
}

/// The claim on the socket at `path`, waiting at most `patience` for its holder to let go.
fn claim_within(
    path: &std::path::Path,
    address: &str,
    patience: Duration,
) -> std::io::Result<Held> {
    let mut lock = path.as_os_str().to_owned();
    lock.push(".lock");
    let waited = std::time::Instant::now();
    loop {
        match super::run_dir::claim(std::path::Path::new(&lock))? {
            Some(claim) => {
                return Ok(Held {
                    path: path.to_path_buf(),
                    _claim: claim,
                })
            }
            None if waited.elapsed() < patience => std::thread::sleep(Duration::from_millis(10)),
            None => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!(
                        "cannot bind the notification socket {address}: another reader holds it"
                    ),
                ))
            }
        }
    }
}

/// A release's notifications being read; dropping it closes the socket.
pub struct Notifier {
    notices: watch::Receiver<Notices>,
    reader: tokio::task::JoinHandle<()>,
    /// Dropped after the reader is stopped: the name goes, then the claim.
    _held: Option<Held>,
}

impl Notifier {
    pub fn notices(&self) -> watch::Receiver<Notices> {
        self.notices.clone()
    }

    /// The last `STATUS=` text, if any.
    pub fn status(&self) -> Option<String> {
        self.notices.borrow().status.clone()
    }

    /// Binds the address the running process `pid` was started with and reads it (for a
    /// release that proved readiness earlier: a watch taken over, a supervised release).
    /// None when it has no such address or another holder keeps it past `patience`.
    pub fn watch_live(pid: i32, patience: Duration) -> Option<Notifier> {
        let address = address_of(pid)?;
        Some(
            Socket::bind_within(&address, patience)
                .ok()?
                .listen(pid, true),
        )
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

async fn read(socket: UnixDatagram, group: i32, sender: watch::Sender<Notices>) {
    let mut buffer = vec![0u8; DATAGRAM_MAX + 1];
    let fd = socket.as_raw_fd();
    loop {
        if socket.readable().await.is_err() {
            return;
        }
        let received = socket.try_io(Interest::READABLE, || {
            receive(fd, &mut buffer).map_err(std::io::Error::from)
        });
        let received = match received {
            Ok(received) => received,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            // Anything else about one datagram (it was dropped): counted, reading goes on.
            Err(_) => (0, None),
        };
        let now = Instant::now();
        sender.send_modify(|notices| match received {
            (len, Some(pid)) if len <= DATAGRAM_MAX && in_group(pid, group) => {
                notices.apply(&buffer[..len], now)
            }
            _ => notices.ignored = notices.ignored.saturating_add(1),
        });
    }
}

/// One datagram: its length (above `DATAGRAM_MAX` when it was cut) and its sender's pid.
fn receive(fd: RawFd, buffer: &mut [u8]) -> nix::Result<(usize, Option<i32>)> {
    let mut control = nix::cmsg_space!(nix::sys::socket::UnixCredentials);
    let mut iov = [IoSliceMut::new(buffer)];
    let message = recvmsg::<()>(
        fd,
        &mut iov,
        Some(&mut control),
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut len = message.bytes;
    if message.flags.contains(MsgFlags::MSG_TRUNC) {
        len = DATAGRAM_MAX + 1;
    }
    let sender = message.cmsgs().ok().and_then(|mut cmsgs| {
        cmsgs.find_map(|cmsg| match cmsg {
            ControlMessageOwned::ScmCredentials(credentials) => Some(credentials.pid()),
            _ => None,
        })
    });
    Ok((len, sender))
}

/// The sender counts when it is in the release's process group: the release itself (it leads
/// the group; known by its pid even when it exits right after sending, as a `STOPPING=1`
/// before an exit does) or a member still there to be asked.
fn in_group(pid: i32, group: i32) -> bool {
    group > 1 && (pid == group || (pid > 0 && group_of(pid) == Some(group)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_assignment_lands_where_it_belongs() {
        let now = Instant::now();
        let mut notices = Notices::new(false);
        notices.apply(b"STATUS=warming the cache\x07\nX-OTHER=1", now);
        assert_eq!(notices.status.as_deref(), Some("warming the cache"));
        assert!(notices.ready_at.is_none());
        assert!(notices.watchdog_missed(Duration::ZERO).is_none());
        notices.apply(b"READY=1\nSTATUS=serving", now);
        assert_eq!(notices.ready_at, Some(now));
        assert_eq!(notices.status.as_deref(), Some("serving"));
        notices.apply(b"ERRNO=nope\nEXTEND_TIMEOUT_USEC=2500000", now);
        assert_eq!(notices.errno, None);
        assert_eq!(
            notices.extend_until,
            Some(now + Duration::from_millis(2500))
        );
        notices.apply(b"ERRNO=2\nSTOPPING=1\nWATCHDOG=trigger", now);
        assert_eq!(notices.errno, Some(2));
        assert!(notices.stopping && notices.watchdog_triggered);
        // READY=0 and READY=yes are not READY=1.
        let mut other = Notices::new(false);
        other.apply(b"READY=0\nREADY=yes", now);
        assert!(other.ready_at.is_none());
    }

    #[test]
    fn a_status_is_bounded() {
        let mut notices = Notices::new(false);
        notices.apply(
            format!("STATUS={}", "é".repeat(500)).as_bytes(),
            Instant::now(),
        );
        assert_eq!(notices.status.map(|s| s.chars().count()), Some(STATUS_MAX));
    }

    #[test]
    fn addresses_are_names_in_the_run_folder_and_only_rollgates_are_bound() {
        let address = address_for("r1-0-7.1").unwrap();
        assert!(address.ends_with("/notify/r1-0-7.1"), "{address}");
        let long = address_for(&"x".repeat(200)).unwrap();
        assert!(long.len() < 108, "{long}");
        assert!(Socket::bind("/tmp/not-in-the-run-folder").is_err());
        assert!(Socket::bind("@somebody-else").is_err());
    }
}
