//! The hand-over (issue 71): a new `rollgate proxy … --take-over` — the same binary or a new one
//! — takes the running proxy's listening sockets, starts serving on them, and only then tells
//! the old one to stop accepting; the old one finishes what it has (its stop, as on SIGTERM)
//! and exits. The sockets are never closed, so no connection is refused and none is reset: the
//! kernel queues what arrives meanwhile, and whichever process accepts first serves it.
//!
//! Why SCM_RIGHTS over a socket of rollgate's own, not systemd's socket activation alone: the
//! proxy also runs outside systemd (the tests, a container, by hand), its TLS and plain
//! listeners are one per serving thread (SO_REUSEPORT), and the claims that keep a second proxy
//! off its addresses must move with them — a file descriptor passed keeps all of that. It is
//! HAProxy's `expose-fd listeners` + `-x`, without a second reload protocol.
//!
//! The channel: `RUN_DIR/proxy/handover-NAME.sock` (NAME from the plain address), in rollgate's
//! private run folder (only root reaches it), and the peer is checked by its credentials (root
//! or the proxy's own user). The taker says `take`; the old proxy answers one line of JSON (what
//! it passes, in order) with the descriptors attached; the taker says `serving` once it serves;
//! the old proxy then stops. A taker that fails before `serving` (a bad config, a certificate it
//! cannot read) just closes the connection: the old proxy never stopped.
//!
//! After a hand-over the old proxy must not undo what it passed: a claim is a `flock` on an
//! open file both processes now share, so the old one leaks its claims instead of unlocking
//! them, and leaves the socket names (proxy.sock, the config's control socket) to the new one
//! ([`handed_over`]).

use std::io::{BufRead, BufReader, IoSlice, IoSliceMut, Write};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Set once this proxy handed its sockets over: from then on nothing it drops may unlock a
/// claim or remove a socket name the new proxy holds.
static HANDED_OVER: AtomicBool = AtomicBool::new(false);

/// Set once this proxy took another's sockets: the names that one answers on (each root's
/// proxy.sock) are this one's to replace.
static TOOK_OVER: AtomicBool = AtomicBool::new(false);

/// Set when this proxy serves on sockets systemd holds for its unit (socket activation): they
/// outlive this process, and the unit's next start serves on them.
static KEPT_BY_SYSTEMD: AtomicBool = AtomicBool::new(false);

/// This proxy serves on a socket of its unit's (socket activation).
pub fn kept_by_systemd() {
    KEPT_BY_SYSTEMD.store(true, Ordering::SeqCst);
}

/// Whether another proxy serves this one's sockets once it stops: it handed them over, or
/// systemd keeps them for the unit's next start. A client's next request on a kept
/// connection then has somewhere to go, so the connection is not closed under it
/// ([`IDLE_KEPT`]).
pub fn successor_serves() -> bool {
    handed_over() || KEPT_BY_SYSTEMD.load(Ordering::SeqCst)
}

/// Whether this proxy handed its sockets to another one.
pub fn handed_over() -> bool {
    HANDED_OVER.load(Ordering::SeqCst)
}

/// Whether this proxy took over from another one.
pub fn took_over() -> bool {
    TOOK_OVER.load(Ordering::SeqCst)
}

/// After a hand-over, how long the old proxy waits for the next request on a kept connection
/// before it closes it (a client sending one meanwhile is answered, told to reconnect).
pub const IDLE_KEPT: Duration = Duration::from_secs(2);

/// The most descriptors one hand-over passes (listeners per thread, claims).
const MAX_FDS: usize = 96;
/// The longest layout line a taker reads (its counts are most of it).
const MAX_LAYOUT: usize = 64 << 20;
/// How long a taker waits for the running proxy's answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// Why a hand-over did not happen (nothing was stopped).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct NotHanded(pub String);

/// What is passed, in the order of the descriptors.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Layout {
    /// The plain listeners, one per serving thread.
    pub plain: usize,
    /// The TLS listeners, one per serving thread, and the address they serve.
    pub tls: usize,
    pub tls_address: Option<SocketAddr>,
    /// Claims on the addresses and the config's control socket (lock files' descriptors), by
    /// what they claim: `listen`, `tls`, `config`.
    pub claims: Vec<String>,
    /// What the proxy counted so far (`carry.rs`; opaque to the channel), as of the take.
    #[serde(default)]
    pub counts: Option<serde_json::Value>,
}

/// The name the `/metrics` listener is offered under, among the claims.
pub const METRICS: &str = "metrics";

/// What a taker received: the descriptors, by their place in the layout.
pub struct Handed {
    pub layout: Layout,
    pub plain: Vec<std::net::TcpListener>,
    pub tls: Vec<std::net::TcpListener>,
    pub claims: Vec<(String, OwnedFd)>,
    /// Said `serving` on, then dropped.
    channel: UnixStream,
}

impl Handed {
    /// Tells the old proxy this one serves: it stops accepting and finishes what it has. What
    /// it counted meanwhile comes once it exits, to `last` (on a thread of its own).
    pub fn serving(
        mut self,
        last: impl FnOnce(serde_json::Value) + Send + 'static,
    ) -> std::io::Result<()> {
        self.channel.write_all(b"serving\n")?;
        self.channel.flush()?;
        let channel = self.channel;
        channel.set_read_timeout(None)?;
        std::thread::Builder::new()
            .name("handover-last".into())
            .spawn(move || {
                let mut line = String::new();
                // Nothing (the old proxy died): the counts said at the take stand.
                if BufReader::new(channel).read_line(&mut line).is_ok() {
                    if let Ok(counts) = serde_json::from_str(&line) {
                        last(counts);
                    }
                }
            })
            .map(drop)
    }

    /// What the old proxy counted, as of the take (`carry.rs`), if it said.
    pub fn counts<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_value(self.layout.counts.clone()?).ok()
    }

    /// The claim on `what` (`listen`, `tls`, `config`), taken out of the hand-over.
    /// The running proxy's `/metrics` listener, if it offered one on `address` (a take-over
    /// serves it on without binding the address again, which the old proxy still holds).
    pub fn metrics(&mut self, address: SocketAddr) -> Option<std::net::TcpListener> {
        let at = self.claims.iter().position(|(name, _)| name == METRICS)?;
        let (_, fd) = self.claims.remove(at);
        let listener = std::net::TcpListener::from(fd);
        (listener.local_addr().ok() == Some(address)).then_some(listener)
    }

    pub fn claim(&mut self, what: &str) -> Option<crate::host::run_dir::Claim> {
        let at = self.claims.iter().position(|(name, _)| name == what)?;
        let (_, fd) = self.claims.remove(at);
        // The same open file the old proxy locked: locking it again is at once.
        crate::host::run_dir::Claim::lock(std::fs::File::from(fd))
            .ok()
            .flatten()
    }
}

/// The variable naming the descriptor a proxy started `--background` says `serving` on.
pub const READY_FD_VARIABLE: &str = "ROLLGATE_PROXY_READY_FD";

/// This proxy serves: said to whoever waits for it — the command that started it in the
/// background (`READY_FD_VARIABLE`), and systemd (`READY=1`; after a take-over also
/// `MAINPID=`: the unit's main process is this one now, the old one about to exit).
pub fn say_serving() {
    if let Some(fd) = std::env::var(READY_FD_VARIABLE)
        .ok()
        .and_then(|fd| fd.parse::<RawFd>().ok())
        .filter(|fd| *fd > 2)
    {
        // SAFETY: the descriptor was made for this word by the command that started this proxy,
        // and is owned by nothing else here; it is closed once said.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        let _ = file.write_all(b"serving\n");
    }
    let word = match took_over() {
        true => format!("MAINPID={}\nREADY=1", std::process::id()),
        false => "READY=1".to_string(),
    };
    if let Err(e) = crate::host::notify::tell_systemd(&word) {
        eprintln!("rollgate proxy: cannot tell systemd it is ready: {e}");
    }
}

/// `rollgate proxy … --background`: the same proxy started again without the flag, and this
/// command's end once it serves (exit 0, the proxy going on) or fails (its exit status; what it
/// said is on the same stderr). For `ExecReload=` of a unit: the reload is done when the new
/// proxy serves.
pub fn in_background() -> std::io::Result<u8> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let args: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--background")
        .collect();
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let write_fd = write.as_raw_fd();
    let mut command = std::process::Command::new("/proc/self/exe");
    command.args(&args).env(READY_FD_VARIABLE, "3");
    // SAFETY: dup2 is a system call; nothing of the parent is touched. The copy at 3 is not
    // close-on-exec, so the proxy finds it.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(write_fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn()?;
    drop(write);
    let mut said = String::new();
    let _ = std::fs::File::from(read).read_to_string(&mut said);
    if said.trim() == "serving" {
        return Ok(0);
    }
    let status = child.wait()?;
    Ok(status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .unwrap_or(1))
}

/// The hand-over channel of the proxy serving plain HTTP on `listen`.
fn channel_path(listen: SocketAddr) -> Result<PathBuf, String> {
    use crate::host::run_dir;
    let folder = run_dir::folder("proxy", run_dir::Reach::Private).map_err(|e| e.to_string())?;
    let name = run_dir::short_name(listen.to_string().as_bytes());
    Ok(folder.join(format!("handover-{name}.sock")))
}

/// What the running proxy offers: descriptors of its own (dups), in the layout's order.
pub struct Offer {
    pub layout: Layout,
    pub fds: Vec<OwnedFd>,
}

/// What a proxy counts, as of the moment it is asked (`carry.rs`).
pub type Counted = Box<dyn Fn() -> serde_json::Value + Send>;

/// The taker's channel, kept by the proxy that handed over to say its last counts on.
static TAKER: std::sync::Mutex<Option<UnixStream>> = std::sync::Mutex::new(None);

/// A proxy that handed over and finished its last requests says what it counted in all.
pub fn say_last(counts: serde_json::Value) {
    let Some(mut channel) = TAKER.lock().ok().and_then(|mut t| t.take()) else {
        return;
    };
    if let Ok(mut line) = serde_json::to_vec(&counts) {
        line.push(b'\n');
        let _ = channel.write_all(&line);
    }
}

/// The hand-over channel, bound while the proxy is still the user that started it (root, for
/// a `--user` proxy: in root's run folder, `/run/rollgate/proxy`, mode 0700): whoever takes it
/// must be that user or root. A proxy that left root binds nothing in a folder of the user it
/// became — a release running as that user could otherwise take the host's front door.
pub struct Channel {
    listener: UnixListener,
    /// The uid that bound it: the only one besides root that may take the sockets.
    owner: u32,
}

/// Where the bound channel is (for [`withdraw`], which may run after the proxy left root).
static BOUND: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// The socket names a proxy answers on (its hand-over channel, each root's `proxy.sock`, a
/// config's control socket) are bound under a staging name and renamed into place. A proxy that
/// takes over places them only at [`place_names`], once nothing but serving is left: placing
/// one replaces the running proxy's socket, which a taker that then failed could not give back
/// (the running proxy would serve on, unreachable for drains, reloads and the next take-over).
static NAMES: std::sync::Mutex<Names> = std::sync::Mutex::new(Names {
    placed: false,
    pending: Vec::new(),
});

struct Names {
    /// Set at [`place_names`]: from then on a name is placed as it is bound.
    placed: bool,
    /// (staging, name) of the sockets bound and not placed yet.
    pending: Vec<(PathBuf, PathBuf)>,
}

/// Places the socket bound at `staging` under `name` — at once, or, taking over, at
/// [`place_names`].
pub fn place_name(staging: PathBuf, name: PathBuf) -> std::io::Result<()> {
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if took_over() && !names.placed {
        names.pending.push((staging, name));
        return Ok(());
    }
    std::fs::rename(&staging, &name)
}

/// Places every name bound so far: from here the running proxy's sockets are replaced by this
/// one's. Called once everything that may still fail before serving has succeeded.
pub fn place_names() -> std::io::Result<()> {
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    names.placed = true;
    for (staging, name) in std::mem::take(&mut names.pending) {
        std::fs::rename(&staging, &name).map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot place {}: {e}", name.display()))
        })?;
    }
    Ok(())
}

/// A name this proxy no longer answers on: removed if this proxy placed it and did not hand
/// it over; if it never placed it (a take-over that failed), only its staging socket goes and
/// the running proxy's stays.
pub fn remove_name(name: &std::path::Path) {
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(at) = names.pending.iter().position(|(_, n)| n == name) {
        let (staging, _) = names.pending.remove(at);
        let _ = std::fs::remove_file(staging);
        return;
    }
    if !handed_over() && (names.placed || !took_over()) {
        let _ = std::fs::remove_file(name);
    }
}

/// Removes the staging sockets of names never placed (a take-over that failed).
pub fn remove_unplaced() {
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    for (staging, _) in std::mem::take(&mut names.pending) {
        let _ = std::fs::remove_file(staging);
    }
}

/// Binds the hand-over channel for `listen` (its name replaced — taking over, at
/// [`place_names`] — : a proxy that took over from the one there is the one to take from now).
/// Called before the proxy leaves root.
pub fn bind(listen: SocketAddr) -> Result<Channel, NotHanded> {
    bind_channel(listen).map_err(NotHanded)
}

fn bind_channel(listen: SocketAddr) -> Result<Channel, String> {
    let path = channel_path(listen)?;
    let staging = path.with_extension(format!("{}.staging", std::process::id()));
    let _ = std::fs::remove_file(&staging);
    let listener = UnixListener::bind(&staging)
        .map_err(|e| format!("cannot offer a hand-over at {}: {e}", path.display()))?;
    place_name(staging, path.clone())
        .map_err(|e| format!("cannot place {}: {e}", path.display()))?;
    if let Ok(mut bound) = BOUND.lock() {
        *bound = Some(path);
    }
    Ok(Channel {
        listener,
        owner: nix::unistd::geteuid().as_raw(),
    })
}

/// Answers takers on `channel` on a thread of its own until one says `serving`; then `stop`
/// is sent (as SIGTERM does) and the thread ends.
pub fn offer(
    channel: Channel,
    offer: Offer,
    counted: Counted,
    stop: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
) -> Result<(), NotHanded> {
    offer_on(channel, offer, counted, stop).map_err(NotHanded)
}

fn offer_on(
    channel: Channel,
    mut offer: Offer,
    counted: Counted,
    stop: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
) -> Result<(), String> {
    let Channel { listener, owner } = channel;
    std::thread::Builder::new()
        .name("handover".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if !trusted(&stream, owner) {
                    continue;
                }
                offer.layout.counts = Some(counted());
                if let Ok(taker) = answer(stream, &offer) {
                    if let Ok(mut kept) = TAKER.lock() {
                        *kept = Some(taker);
                    }
                    HANDED_OVER.store(true, Ordering::SeqCst);
                    eprintln!(
                        "rollgate proxy: handed over to a new proxy; finishing in-flight requests"
                    );
                    let _ = stop.send(true);
                    // The name is the new proxy's now.
                    return;
                }
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the hand-over thread: {e}"))
}

/// A proxy that stops without handing over takes its channel's name with it (one that handed
/// over leaves it: it is the new proxy's).
pub fn withdraw() {
    let bound = BOUND.lock().ok().and_then(|b| b.clone());
    if let Some(path) = bound {
        remove_name(&path);
    }
}

/// Root, or the user that bound the channel (a proxy started as root trusts root alone, even
/// after it became `--user`: that user's processes may be a release's).
fn trusted(stream: &UnixStream, owner: u32) -> bool {
    nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .is_ok_and(|cred| cred.uid() == owner || cred.uid() == 0)
}

/// One taker: `take` read, the layout and the descriptors sent, `serving` read back. Ok (the
/// channel, for the last counts) only when the taker serves.
fn answer(stream: UnixStream, offer: &Offer) -> std::io::Result<UnixStream> {
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if line.trim() != "take" {
        return Err(std::io::Error::other("not a hand-over request"));
    }
    let mut header = serde_json::to_vec(&offer.layout).map_err(std::io::Error::other)?;
    header.push(b'\n');
    let fds: Vec<RawFd> = offer.fds.iter().map(AsRawFd::as_raw_fd).collect();
    let control = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    nix::sys::socket::sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(&header)],
        &control,
        nix::sys::socket::MsgFlags::empty(),
        None,
    )?;
    line.clear();
    reader.read_line(&mut line)?;
    match line.trim() {
        "serving" => Ok(stream),
        _ => Err(std::io::Error::other("the taker did not start serving")),
    }
}

/// Takes the running proxy's sockets on `listen`: Err says why not (nothing runs there, it
/// is no proxy that hands over, the answer was not one).
pub fn take(listen: SocketAddr) -> Result<Handed, NotHanded> {
    take_from(listen).map_err(NotHanded)
}

fn take_from(listen: SocketAddr) -> Result<Handed, String> {
    let path = channel_path(listen)?;
    let channel = UnixStream::connect(&path).map_err(|e| {
        format!(
            "no running proxy on {listen} to take over ({}: {e}); start without --take-over",
            path.display()
        )
    })?;
    let said = |e: std::io::Error| format!("the running proxy on {listen} did not hand over: {e}");
    channel.set_read_timeout(Some(ANSWER_WAIT)).map_err(said)?;
    (&channel).write_all(b"take\n").map_err(said)?;
    let mut header = vec![0u8; 4096];
    let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
    let (read, fds) = {
        let mut slices = [IoSliceMut::new(&mut header)];
        let message = nix::sys::socket::recvmsg::<()>(
            channel.as_raw_fd(),
            &mut slices,
            Some(&mut space),
            nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| said(e.into()))?;
        let mut fds = Vec::new();
        for cmsg in message.cmsgs().map_err(|e| said(e.into()))? {
            if let nix::sys::socket::ControlMessageOwned::ScmRights(received) = cmsg {
                // SAFETY: each descriptor was just received and is owned by nothing else.
                fds.extend(
                    received
                        .into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        (message.bytes, fds)
    };
    // The layout line may go on past the first read (the counts): up to its end.
    header.truncate(read);
    while !header.ends_with(b"\n") {
        use std::io::Read;
        let mut more = [0u8; 64 << 10];
        let got = (&channel).read(&mut more).map_err(said)?;
        if got == 0 || header.len() > MAX_LAYOUT {
            return Err(format!(
                "the running proxy on {listen} answered no hand-over (its answer ended early or \
                 ran past {MAX_LAYOUT} bytes)"
            ));
        }
        header.extend_from_slice(&more[..got]);
    }
    let text = header.strip_suffix(b"\n").unwrap_or(&header);
    let layout: Layout = serde_json::from_slice(text)
        .map_err(|e| format!("the running proxy on {listen} answered no hand-over ({e})"))?;
    if fds.len() != layout.plain + layout.tls + layout.claims.len() {
        return Err(format!(
            "the running proxy on {listen} passed {} descriptors for {} listeners and {} claims",
            fds.len(),
            layout.plain + layout.tls,
            layout.claims.len()
        ));
    }
    let mut fds = fds.into_iter();
    let listeners = |count: usize, fds: &mut std::vec::IntoIter<OwnedFd>| {
        fds.by_ref()
            .take(count)
            .map(|fd| {
                let listener = std::net::TcpListener::from(fd);
                listener.set_nonblocking(true).map(|()| listener)
            })
            .collect::<std::io::Result<Vec<_>>>()
    };
    let plain = listeners(layout.plain, &mut fds).map_err(said)?;
    let tls = listeners(layout.tls, &mut fds).map_err(said)?;
    let claims = layout.claims.iter().cloned().zip(fds).collect();
    if plain.is_empty() {
        return Err(format!("the running proxy on {listen} passed no listener"));
    }
    TOOK_OVER.store(true, Ordering::SeqCst);
    Ok(Handed {
        layout,
        plain,
        tls,
        claims,
        channel,
    })
}
