//! A service's control socket, `ROOT/proxy.sock`: how the deployer, the canary's judge and
//! `status` talk to the proxy serving that root, one request line and one answer line each —
//! `drain <port>` (below), `counts` (what each release answered, as one JSON line), `tls` (the
//! certificates and handshakes), `traffic` (the gate's mode) and `routes` (the config's routes
//! in force). Both sides are here: the proxy's answers and the callers' requests.
//!
//! The drain handshake: after switching `current`, the
//! deployer connects and sends one line, `drain <old-port>\n`. The proxy re-reads the pointer
//! (so it has switched too), waits until no request is in flight to the release it retired on
//! that port, and answers `drained <old-port> <waited-ms>\n`. Only then does the deployer send
//! SIGTERM to the old release. If the proxy could not re-read the pointer, or still routes new
//! requests to that port, it answers `error <why>\n` instead, and the deployer keeps the old
//! release for its whole drain timeout. No socket (or nobody listening) means no proxy: nothing
//! to wait for. `drain <old-port> go` sends the release's open tunnels away first (a
//! WebSocket's Close, 1001): a release retired after a watch, whose tunnels had the watch.
//!
//! `switch <old-port>`: the same re-read and check, answered at once (`switched <old-port>`):
//! a watched deploy's switch, whose old release runs on as the fallback with its requests and
//! tunnels (waiting for them there held the switch, and its `switched` line, up to the drain
//! timeout).
//!
//! The socket is the deployer's alone: mode 0600, a peer of another uid (root excepted) is
//! refused, and a request line is at most [`MAX_LINE`] bytes and must arrive within
//! [`LINE_TIMEOUT`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;

use super::counts::{bucket_ceiling, bucket_floor, Snapshot, Started, CLASSES, CUTS, MISSES};
use super::leases::Routes;
use super::watch::refresh;
use crate::host::fault::Fault;
use crate::host::state::Root;

pub const SOCKET_FILE: &str = "proxy.sock";
/// The longest request line (`drain 65535` is 11 bytes).
pub const MAX_LINE: u64 = 64;
/// How long a peer has to send its request line.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(5);

pub fn socket_path(root: &Path) -> PathBuf {
    root.join(SOCKET_FILE)
}

/// What the deployer learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drain {
    NoProxy,
    Drained(Duration),
    /// The proxy confirmed new requests go elsewhere (`switch <port>`).
    Switched,
    TimedOut(Duration),
    /// The proxy answered `error ...`: it did not switch, or could not tell.
    Refused(String),
    Failed(String),
}

impl std::fmt::Display for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Drain::NoProxy => write!(f, "no proxy"),
            Drain::Drained(d) => write!(f, "proxy drained it in {} ms", d.as_millis()),
            Drain::Switched => write!(f, "proxy switched (its requests go on)"),
            Drain::TimedOut(d) => write!(
                f,
                "proxy still draining after {} ms (drain timeout)",
                d.as_millis()
            ),
            Drain::Refused(why) => write!(f, "proxy refused to confirm the drain ({why})"),
            Drain::Failed(why) => write!(f, "proxy drain failed ({why})"),
        }
    }
}

/// The answer to `counts`: what each release (version and slot) answered since the proxy
/// started. Counts only grow while one proxy lives; another start (`started_ms`, `pid`) starts
/// them from zero again.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CountsLine {
    /// Unix time in milliseconds the proxy started at.
    pub started_ms: u64,
    pub pid: u32,
    pub releases: Vec<ReleaseCounts>,
}

impl CountsLine {
    /// Whether `other` was read from the same proxy (so its counts can be subtracted).
    pub fn same_proxy(&self, other: &CountsLine) -> bool {
        self.started_ms == other.started_ms && self.pid == other.pid
    }
}

/// One release's counts: answers by status class, requests it gave no answer to by reason, and
/// its latency histogram (`[floor µs, ceiling µs, count]` for each bucket counted in).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReleaseCounts {
    pub release: String,
    pub slot: u16,
    pub answers: std::collections::BTreeMap<String, u64>,
    pub misses: std::collections::BTreeMap<String, u64>,
    /// Answers begun (among `answers`) that did not reach the client whole, by why (`CUTS`).
    /// Absent from an older proxy's line.
    #[serde(default)]
    pub cut: std::collections::BTreeMap<String, u64>,
    /// Tries it gave no answer to that went on to another replica (not among `misses`: the
    /// user's request did not fail with them). Absent from an older proxy's line.
    #[serde(default)]
    pub retried: u64,
    pub latency_sum_us: u64,
    pub latency_us: Vec<[u64; 3]>,
}

/// The counts as one JSON line, for the engine (`counts` on `ROOT/proxy.sock`). The histogram
/// is sparse: `[bucket floor in µs, bucket ceiling in µs, count]` for each bucket counted in.
pub fn counts_line(routes: &Routes, started: Started) -> String {
    let line = CountsLine {
        started_ms: started.at_ms,
        pid: started.pid,
        releases: routes
            .counted()
            .into_iter()
            .map(|(release, slot, seen)| release_counts(release, slot, &seen))
            .collect(),
    };
    match serde_json::to_string(&line) {
        Ok(text) => text + "\n",
        Err(e) => format!("error cannot write the counts: {e}\n"),
    }
}

pub(super) fn release_counts(release: String, slot: u16, seen: &Snapshot) -> ReleaseCounts {
    let by_name = |names: &[&str], counts: &[u64]| {
        names
            .iter()
            .zip(counts)
            .map(|(name, count)| (name.to_string(), *count))
            .collect()
    };
    ReleaseCounts {
        release,
        slot,
        answers: by_name(&CLASSES, &seen.answers),
        misses: by_name(&MISSES, &seen.misses),
        cut: by_name(&CUTS, &seen.cut),
        retried: seen.retried,
        latency_sum_us: seen.latency_sum_us,
        latency_us: seen
            .latency
            .iter()
            .enumerate()
            .filter(|(_, count)| **count > 0)
            .map(|(index, count)| [bucket_floor(index), bucket_ceiling(index), *count])
            .collect(),
    }
}

/// Why a proxy gave no counts: nobody serves the root, or the exchange failed (refused, timed
/// out, unreadable). Shown as the sentence a refusal quotes.
#[derive(Debug, Clone, PartialEq)]
pub enum NoCounts {
    /// No proxy listens on the root's socket.
    NoProxy(String),
    /// A proxy is there, but its counts could not be had.
    Exchange(String),
}

impl std::fmt::Display for NoCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoCounts::NoProxy(why) | NoCounts::Exchange(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for NoCounts {}

/// Reads the counts of the proxy serving `root`; Err says why there are none (no proxy, or an
/// answer that could not be read).
pub async fn counts(root: &Path, timeout: Duration) -> Result<CountsLine, NoCounts> {
    let path = socket_path(root);
    let exchange = async {
        let stream = UnixStream::connect(&path)
            .await
            .map_err(|e| unreachable(root, &path, &e))?;
        let (read, mut write) = stream.into_split();
        write
            .write_all(b"counts\n")
            .await
            .map_err(|e| NoCounts::Exchange(format!("cannot ask the proxy for its counts: {e}")))?;
        let mut line = String::new();
        BufReader::new(read)
            .read_line(&mut line)
            .await
            .map_err(|e| NoCounts::Exchange(format!("cannot read the proxy's counts: {e}")))?;
        parse_counts(&line)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(NoCounts::Exchange(format!(
            "the proxy at {} did not give its counts within {} ms",
            path.display(),
            timeout.as_millis()
        ))),
    }
}

/// [`counts`] from a caller outside the async runtime (a run's admission).
pub fn counts_now(root: &Path, timeout: Duration) -> Result<CountsLine, NoCounts> {
    use std::io::{BufRead, Write};
    let path = socket_path(root);
    let mut stream =
        std::os::unix::net::UnixStream::connect(&path).map_err(|e| unreachable(root, &path, &e))?;
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    stream
        .write_all(b"counts\n")
        .map_err(|e| NoCounts::Exchange(format!("cannot ask the proxy for its counts: {e}")))?;
    let mut line = String::new();
    std::io::BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| NoCounts::Exchange(format!("cannot read the proxy's counts: {e}")))?;
    parse_counts(&line)
}

/// Why the proxy's socket at `path` gave no counts: nobody serves the root, or another error.
fn unreachable(root: &Path, path: &Path, e: &std::io::Error) -> NoCounts {
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            NoCounts::NoProxy(format!(
                "no rollgate proxy serves {} ({} does not answer)",
                root.display(),
                path.display()
            ))
        }
        _ => NoCounts::Exchange(format!("cannot reach the proxy at {}: {e}", path.display())),
    }
}

fn parse_counts(line: &str) -> Result<CountsLine, NoCounts> {
    if let Some(why) = line.strip_prefix("error ") {
        return Err(NoCounts::Exchange(format!(
            "the proxy refused to give its counts: {}",
            why.trim()
        )));
    }
    serde_json::from_str::<CountsLine>(line).map_err(|e| {
        NoCounts::Exchange(format!(
            "the proxy's counts are not readable ({e}); is it an older rollgate?"
        ))
    })
}

/// Deployer side: asks the proxy (if any) to drain `port` (or confirm the switch away from it),
/// waiting at most `timeout`.
pub async fn request(root: &Path, port: u16, ask: Ask, timeout: Duration) -> Drain {
    let stream = match UnixStream::connect(socket_path(root)).await {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Drain::NoProxy
        }
        Err(e) => return Drain::Failed(e.to_string()),
    };
    let exchange = async {
        let (read, mut write) = stream.into_split();
        let line = match ask {
            Ask::Drain(Tunnels::Wait) => format!("drain {port}\n"),
            Ask::Drain(Tunnels::SendAway) => format!("drain {port} go\n"),
            Ask::Switch => format!("switch {port}\n"),
        };
        write.write_all(line.as_bytes()).await?;
        let mut line = String::new();
        BufReader::new(read).read_line(&mut line).await?;
        Ok::<String, std::io::Error>(line)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Drain::TimedOut(timeout),
        Ok(Err(e)) => Drain::Failed(e.to_string()),
        Ok(Ok(line)) => match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["drained", answered, ms] if answered == port.to_string() => {
                Drain::Drained(Duration::from_millis(ms.parse().unwrap_or(0)))
            }
            ["switched", answered] if answered == port.to_string() => Drain::Switched,
            ["error", ..] => Drain::Refused(line.trim().trim_start_matches("error ").to_string()),
            _ => Drain::Failed(format!("unexpected answer {:?}", line.trim())),
        },
    }
}

/// Proxy side: binds the socket (mode 0600), refusing if another proxy already answers on it
/// — unless this proxy took that one's sockets over: then the name is this one's.
pub async fn listen(root: &Path) -> Result<UnixListener, Fault> {
    use std::os::unix::fs::PermissionsExt;
    let path = socket_path(root);
    if !super::handover::took_over() && UnixStream::connect(&path).await.is_ok() {
        return Err(Fault::unwritable(
            &path,
            format!(
                "another proxy already serves this root ({} answers)",
                path.display()
            ),
        ));
    }
    // Bound under a private name, restricted, then renamed into place: the socket never
    // appears at its real path with the umask's mode (a peer is still checked by uid in `serve`).
    let staging = root.join(format!(".{SOCKET_FILE}.{}", std::process::id()));
    let _ = std::fs::remove_file(&staging);
    let listener = UnixListener::bind(&staging).map_err(|e| {
        Fault::unwritable(&path, format!("cannot listen on {}: {e}", path.display()))
    })?;
    let placed = std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {} to its owner: {e}", path.display()))
        .and_then(|()| {
            // Taking over, placed once this proxy is sure to serve (`handover::place_names`).
            super::handover::place_name(staging.clone(), path.clone())
                .map_err(|e| format!("cannot place {}: {e}", path.display()))
        });
    if let Err(why) = placed {
        let _ = std::fs::remove_file(&staging);
        return Err(Fault::unwritable(&path, why));
    }
    Ok(listener)
}

/// Whether a peer may ask for drains: the proxy's own user, or root.
fn trusted(stream: &UnixStream) -> bool {
    let me = nix::unistd::geteuid().as_raw();
    stream
        .peer_cred()
        .is_ok_and(|cred| cred.uid() == me || cred.uid() == 0)
}

/// What a peer asks for.
enum Asked {
    /// `drain <port>`: confirm that the release on that port has finished its requests;
    /// `drain <port> go`: and tell its tunnels to go away first (it is being stopped after a
    /// watch: they have had their time).
    Drain(u16, Tunnels),
    /// `switch <port>`: confirm that new requests no longer go to the release on that port
    /// (the deployer's switch, the release kept as the fallback: nothing to wait for).
    Switch(u16),
    /// `counts`: what each release answered (`metrics::counts_line`).
    Counts,
    /// `tls`: the certificates served and the handshakes counted (`certs::TlsLine`).
    Tls,
    /// `traffic`: what the proxy lets through to this root's releases now (`serving`,
    /// `maintenance`, `paused`): what it took from `traffic.json`.
    Traffic,
    /// `routes`: the routes of the proxy's config in force, one JSON list of lines
    /// (`app.example.com/api → api`); `[]` for a proxy of one `--root`.
    Routes,
}

/// The routes a proxy serves, in words, shared by every root it serves (a reload replaces
/// them).
pub type RoutesInForce = Arc<std::sync::RwLock<Vec<String>>>;

/// Proxy side: answers drain and counts requests until the listener is dropped.
pub async fn serve(
    listener: UnixListener,
    root: Root,
    routes: Arc<Routes>,
    switched: Arc<Notify>,
    started: Started,
    tls: Option<Arc<super::certs::Resolver>>,
    gate: Arc<super::traffic::Gate>,
    in_force: RoutesInForce,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors, most likely: do not spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (root, routes, switched, tls, gate, in_force) = (
            root.clone(),
            routes.clone(),
            switched.clone(),
            tls.clone(),
            gate.clone(),
            in_force.clone(),
        );
        tokio::spawn(async move {
            if !trusted(&stream) {
                return;
            }
            let (read, mut write) = stream.into_split();
            let answer = match read_request(read).await {
                Ok(Asked::Drain(port, tunnels)) => {
                    let ask = Ask::Drain(tunnels);
                    answer(port, ask, &root, &routes, &switched, &gate).await
                }
                Ok(Asked::Switch(port)) => {
                    answer(port, Ask::Switch, &root, &routes, &switched, &gate).await
                }
                Ok(Asked::Counts) => counts_line(&routes, started),
                Ok(Asked::Tls) => tls_line(tls.as_deref()),
                Ok(Asked::Traffic) => format!("{}\n", gate.mode().as_str()),
                Ok(Asked::Routes) => {
                    let lines = in_force.read().map(|l| l.clone()).unwrap_or_default();
                    serde_json::to_string(&lines).unwrap_or_else(|_| "[]".into()) + "\n"
                }
                Err(why) => format!("error {why}\n"),
            };
            let _ = write.write_all(answer.as_bytes()).await;
        });
    }
}

/// The proxy's TLS as one JSON line (`tls` on the socket); `off` without `--tls-listen`.
fn tls_line(tls: Option<&super::certs::Resolver>) -> String {
    match tls.map(|resolver| serde_json::to_string(&resolver.line())) {
        None => "off\n".into(),
        Some(Ok(line)) => line + "\n",
        Some(Err(e)) => format!("error cannot write the TLS state: {e}\n"),
    }
}

/// What a proxy serving `root` says of its TLS: None when it serves none (or no proxy serves
/// the root, or it is an older rollgate); for `status`, which shows it beside the live release.
pub fn tls_now(root: &Path, timeout: Duration) -> Option<super::certs::TlsLine> {
    json_answer(root, "tls", timeout)
}

/// The routes of the proxy serving `root`, in words: None when no proxy serves it (or it is
/// an older rollgate), empty for a proxy of one `--root`.
pub fn routes_now(root: &Path, timeout: Duration) -> Option<Vec<String>> {
    json_answer(root, "routes", timeout)
}

/// The proxy's one-line JSON answer to `asked`, read within `timeout`; None when nobody
/// answers or the line is not what the caller reads.
fn json_answer<T: serde::de::DeserializeOwned>(
    root: &Path,
    asked: &str,
    timeout: Duration,
) -> Option<T> {
    serde_json::from_str(&line_answer(root, asked, timeout)?).ok()
}

/// The proxy's one-line answer to `asked`, read within `timeout`; None when nobody answers.
fn line_answer(root: &Path, asked: &str, timeout: Duration) -> Option<String> {
    use std::io::{BufRead, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket_path(root)).ok()?;
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    stream.write_all(format!("{asked}\n").as_bytes()).ok()?;
    let mut line = String::new();
    std::io::BufReader::new(stream).read_line(&mut line).ok()?;
    Some(line)
}

/// What the proxy serving `root` lets through now (`serving`, `maintenance`, `paused`), as it
/// took it from `traffic.json`; None when no proxy answers.
pub fn traffic_now(root: &Path, timeout: Duration) -> Option<String> {
    line_answer(root, "traffic", timeout).map(|line| line.trim().to_string())
}

/// Reads `drain <port>\n`, `counts\n`, `tls\n`, `traffic\n` or `routes\n`, bounded in length
/// and time.
async fn read_request(read: tokio::net::unix::OwnedReadHalf) -> Result<Asked, &'static str> {
    use tokio::io::AsyncReadExt;
    let mut line = String::new();
    let mut limited = BufReader::new(read.take(MAX_LINE));
    match tokio::time::timeout(LINE_TIMEOUT, limited.read_line(&mut line)).await {
        Err(_) => return Err("no request line within 5 s"),
        Ok(Err(_)) => return Err("the request line is not text"),
        Ok(Ok(_)) if !line.ends_with('\n') => {
            return Err("expected one line `drain <port>` of at most 64 bytes")
        }
        Ok(Ok(_)) => {}
    }
    let port = |port: &str| port.parse::<u16>().map_err(|_| "bad port");
    match line.split_whitespace().collect::<Vec<_>>()[..] {
        ["drain", at] => Ok(Asked::Drain(port(at)?, Tunnels::Wait)),
        ["drain", at, "go"] => Ok(Asked::Drain(port(at)?, Tunnels::SendAway)),
        ["switch", at] => Ok(Asked::Switch(port(at)?)),
        ["counts"] => Ok(Asked::Counts),
        ["tls"] => Ok(Asked::Tls),
        ["traffic"] => Ok(Asked::Traffic),
        ["routes"] => Ok(Asked::Routes),
        _ => Err("expected `drain <port> [go]`, `switch <port>` or `counts`"),
    }
}

/// What the deployer asks of the release on a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Its requests finished (its tunnels as they may, within the deployer's drain timeout).
    Drain(Tunnels),
    /// New requests going elsewhere; the ones it has go on.
    Switch,
}

/// What a drain does with the release's open tunnels (WebSockets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tunnels {
    /// Waited for, as any request.
    Wait,
    /// Told to go away now (a WebSocket's Close, 1001), then waited for.
    SendAway,
}

/// Confirms a drain (or a switch) only once the pointer was re-read and new requests go
/// elsewhere.
async fn answer(
    port: u16,
    ask: Ask,
    root: &Root,
    routes: &Routes,
    switched: &Notify,
    gate: &super::traffic::Gate,
) -> String {
    if let Err(e) = refresh(root, routes) {
        return format!(
            "error cannot re-read the pointer: {}\n",
            one_line(&e.to_string())
        );
    }
    switched.notify_one();
    let started = Instant::now();
    let serving: Vec<Arc<super::leases::Target>> = routes
        .pool()
        .into_iter()
        .filter(|t| t.port == port)
        .collect();
    if ask == Ask::Switch {
        return match serving.is_empty() {
            true => format!("switched {port}\n"),
            false => {
                format!("error the pointer still names port {port}; new requests still go there\n")
            }
        };
    }
    if !serving.is_empty() {
        // Still in the pool: drained only while the service is paused (a stop-first deploy)
        // or in maintenance (`rollgate stop`), when no new request reaches it. A request that
        // passed the gate just before has a moment to take its lease first.
        if gate.mode() == crate::host::traffic::Mode::Serving {
            return format!(
                "error the pointer still names port {port}; new requests still go there\n"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        for target in serving {
            target.drained().await;
        }
    }
    for target in routes.retired_on(port) {
        if ask == Ask::Drain(Tunnels::SendAway) {
            target.send_tunnels_away();
        }
        target.drained().await;
    }
    format!("drained {port} {}\n", started.elapsed().as_millis())
}

fn one_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}
