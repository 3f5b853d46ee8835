//! `rollgate proxy`: the host's front door — a reverse proxy for HTTP/1.1 and HTTP/2, with TLS
//! (certificates by file or ACME, chosen by SNI), routes by host and path, and maintenance —
//! in front of each service's live release, so a switch costs users no failed request. It
//! forwards each request to the release `current` names, follows a switch at once, lets
//! requests already sent to the old release finish, and tells the deployer (over
//! `ROOT/proxy.sock`, see `control.rs`) when the old release has drained.
//!
//! The files stand in layers; each names only files of the layers below it (held by
//! `tests/it/layers.rs`), so a reader can start at the bottom and never meet a name from above:
//!
//! 0. the wire (`wire.rs`: bytes rollgate writes, hop-by-hop headers, host names, the words of
//!    its own answers), `counts.rs`, `idle.rs`, `traffic.rs` (the gate), `certs.rs` (the
//!    certificate store and SNI resolver), `failure.rs` (why no answer came), `handover.rs`
//!    (the sockets passed to a new proxy, and whether they were);
//! 1. `acme.rs`, `relay.rs` (HTTP/1.1 bytes to a release), `upstream.rs` (kept connections);
//! 2. `leases.rs` (which release gets a request), `watch.rs`, `access.rs`, `service.rs`,
//!    `router.rs` (which service, by host and path);
//! 3. `pass.rs` (one request's pass: route, gate, lease, send, retry — written once), then the
//!    front ends on it: `forward.rs` (hyper's) and `front.rs` (the HTTP/1.1 fast path);
//! 4. `tls.rs` (TLS accept, ALPN, the redirect to https);
//! 5. `config.rs`, `metrics.rs`, `control.rs` (`ROOT/proxy.sock`), `reload.rs`, and this file:
//!    the options and the server loop.

/// Drives a hyper server connection (`connection`, any of hyper's: HTTP/1, upgradeable,
/// HTTP/2) until it ends, or until `stop` (a `watch::Receiver<bool>`) changes: then it is shut
/// down gracefully, finishing the request in flight. A macro: hyper's connection types share
/// no trait with `graceful_shutdown`.
macro_rules! serve_until_stopped {
    ($connection:ident, $stop:ident) => {
        tokio::pin!($connection);
        tokio::select! {
            _ = $connection.as_mut() => {}
            _ = $stop.changed() => {
                // When another proxy serves these sockets now, the connection is served a
                // while longer first: one just handed to hyper with its request still unread
                // looks idle, and a graceful shutdown would close it under that request
                // (seen at a hand-over: a WebSocket's reconnect got no answer).
                let kept = $crate::proxy::handover::IDLE_KEPT;
                let ended = $crate::proxy::handover::successor_serves()
                    && tokio::time::timeout(kept, $connection.as_mut()).await.is_ok();
                if !ended {
                    $connection.as_mut().graceful_shutdown();
                    let _ = $connection.await;
                }
            }
        }
    };
}

pub mod access;
pub mod acme;
mod carry;
pub mod certs;
pub mod config;
pub mod control;
mod counts;
mod drain;
mod failure;
mod fate;
mod forward;
mod front;
pub mod handover;
mod idle;
mod leases;
mod metrics;
mod pass;
mod relay;
pub mod reload;
mod router;
mod rules;
mod service;
pub mod tls;
mod traffic;
mod tunnel;
mod upstream;
mod watch;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::HeaderName;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Semaphore;

use crate::error::Error;
use crate::host::state::Root;
use pass::Shared;

/// Limits and knobs, each with a documented default.
#[derive(Debug, Clone)]
pub struct Options {
    /// Plain HTTP (`--listen`); None: the config file's, else the default.
    pub listen: Option<SocketAddr>,
    /// The one root served (`--root`), or none with `config`.
    pub root: Option<std::path::PathBuf>,
    /// The routes and settings file (`--config`), reloaded on SIGHUP and `proxy reload`.
    pub config: Option<std::path::PathBuf>,
    /// Response header naming the release that answered (off by default).
    pub version_header: Option<String>,
    /// Connections served at once; further clients wait in the kernel's accept queue.
    pub max_connections: usize,
    /// A client must send a request's headers within this (slowloris); it also closes a
    /// keep-alive connection that stays idle this long.
    pub header_read_timeout: Duration,
    /// Largest request head accepted; larger gets 431.
    pub max_header_bytes: usize,
    /// Serving threads; `None`: one per core.
    pub threads: Option<usize>,
    /// A request or response body that sends nothing for this long is cut.
    pub body_idle: Duration,
    /// An upgraded tunnel where nothing moves for this long is closed.
    pub tunnel_idle: Duration,
    /// Once the proxy stops accepting (a signal, a hand-over), how long its tunnels are kept
    /// before a WebSocket is closed with 1001 and any other tunnel shut.
    pub drain: Duration,
    /// Append to the client's `X-Forwarded-For` instead of replacing it.
    pub trust_forwarded: bool,
    /// Where to serve `/metrics` (none: not served; the counts are kept either way).
    pub metrics_listen: Option<SocketAddr>,
    /// Count what each release answers (off only to measure what counting costs).
    pub counting: bool,
    /// Serve as this user once everything is bound (`--user`).
    pub user: Option<String>,
    /// Where to serve TLS (none: plain HTTP only). With it, `listen` redirects to https.
    pub tls_listen: Option<SocketAddr>,
    /// The certificates TLS serves, by name (`--tls-cert NAME=CERT,KEY`).
    pub tls_certs: Vec<certs::CertSpec>,
    /// Answers over TLS carry `Strict-Transport-Security`.
    pub hsts: bool,
    /// Certificates from ACME for these names (`--acme-*`).
    pub acme: Option<acme::Settings>,
    /// Every route writes `ROOT/access.log` (`--access-log`; a config's route may say
    /// otherwise for itself).
    pub access_log: bool,
    /// Its rotation (`--access-log-max-bytes`, `--access-log-keep`; None: the file's, else the
    /// release output's defaults) and whether paths keep their query (`--access-log-query`).
    pub access_max_bytes: Option<u64>,
    pub access_keep: Option<u64>,
    pub access_query: bool,
    /// Log one request in N (`--access-log-sample`; None: the file's, else every one).
    pub access_sample: Option<u64>,
    /// Take the running proxy's sockets (`--take-over`; see `handover.rs`).
    pub take_over: bool,
}

/// What the proxy serves: one root, or a config's routes.
enum Serves {
    Root(Root),
    Config(Box<config::ProxyConfig>),
}

impl Options {
    /// The options with a config file's settings in: a flag given on the command line wins
    /// over the file; a setting in neither keeps its default.
    fn with_file(mut self, settings: &config::Settings) -> Options {
        self.listen = self.listen.or(settings.listen);
        self.metrics_listen = self.metrics_listen.or(settings.metrics_listen);
        self.tls_listen = self.tls_listen.or(settings.tls_listen);
        if self.tls_certs.is_empty() {
            self.tls_certs = settings.tls_certs.clone();
        }
        self.hsts |= settings.hsts;
        // The file's `access_log` is read by the services at each reload (`reload.rs`).
        self.access_query |= settings.access_log_query;
        self.access_max_bytes = self.access_max_bytes.or(settings.access_log_max_bytes);
        self.access_keep = self.access_keep.or(settings.access_log_keep);
        self.access_sample = self.access_sample.or(settings.access_log_sample);
        if self.acme.is_none() {
            if let (Some(directory), Some(state)) = (&settings.acme_directory, &settings.acme_state)
            {
                self.acme = Some(acme::Settings {
                    directory: directory.clone(),
                    contacts: settings.acme_contact.clone(),
                    ca_file: settings.acme_ca_file.clone(),
                    state: state.clone(),
                    names: settings.acme_names.clone(),
                    challenge: match settings.acme_challenge.as_deref() {
                        Some("tls-alpn-01") => acme::Challenge::TlsAlpn01,
                        _ => acme::Challenge::Http01,
                    },
                });
            }
        }
        self
    }
}

/// Serves until SIGTERM or SIGINT; anything that keeps it from starting fails the command
/// (exit 1), with what went wrong.
pub fn run(options: Options) -> Result<(), Error> {
    let (options, serves) = match (&options.config, &options.root) {
        (Some(file), None) => {
            let config = config::read(file).map_err(|e| Error::Refused(e.to_string()))?;
            let options = options.clone().with_file(&config.settings);
            (options, Serves::Config(Box::new(config)))
        }
        (None, Some(root)) => {
            let root = Root::existing(root.clone()).map_err(|e| Error::Refused(e.to_string()))?;
            (options, Serves::Root(root))
        }
        _ => {
            return Err(Error::Refused(
                "say what to serve: --root DIR (one service) or --config FILE (routes), not both"
                    .into(),
            ))
        }
    };
    // A certificate that cannot be served refuses the start (exit 2), naming the file.
    let refused = |e: certs::TlsError| Error::Refused(e.to_string());
    if let Some(acme) = &options.acme {
        if options.tls_listen.is_none() {
            return Err(Error::Refused(
                "--acme-directory is given without --tls-listen: say where to serve the certificates".into(),
            ));
        }
        acme::prepare(acme).map_err(refused)?;
    }
    let acme_names = options
        .acme
        .as_ref()
        .map_or(&[][..], |a| a.names.as_slice());
    let resolver = match options.tls_listen {
        Some(_) => Some(Arc::new(
            certs::Resolver::new(options.tls_certs.clone(), acme_names).map_err(refused)?,
        )),
        None if !options.tls_certs.is_empty() => {
            return Err(Error::Refused(
                "--tls-cert is given without --tls-listen: say where to serve TLS".into(),
            ))
        }
        None => None,
    };
    let served = serve(options, serves, resolver);
    if served.is_err() {
        // A take-over that failed before it placed its names leaves no staging socket behind.
        handover::remove_unplaced();
    }
    served
}

/// Binds the hand-over channel as the user that started the proxy (see `handover::Channel`),
/// then, everything privileged done (listeners, the control socket, the certificates, the
/// channel), becomes `--user`. What may still fail (the user unknown, its ACME folder not
/// given to it) fails before the proxy's socket names are placed: a take-over that fails here
/// leaves the running proxy's in place (`handover::place_names`).
fn leave_root(options: &Options, listen: SocketAddr) -> Result<handover::Channel, Error> {
    let channel = handover::bind(listen).map_err(|e| Error::Failed(e.to_string()))?;
    let user = match &options.user {
        Some(name) => Some(prepare_user(
            name,
            options.acme.as_ref().map(|a| a.state.as_path()),
        )?),
        None => None,
    };
    handover::place_names().map_err(|e| Error::Failed(e.to_string()))?;
    if let Some(user) = user {
        become_user(&user)?;
    }
    Ok(channel)
}

/// `--user NAME` looked up, recorded (no service is given this user) and handed the ACME state
/// folder it renews certificates into; all of it while the proxy is still root.
fn prepare_user(
    name: &str,
    acme_state: Option<&std::path::Path>,
) -> Result<nix::unistd::User, Error> {
    let refused = |why: String| Error::Refused(format!("--user {name}: {why}"));
    let user = nix::unistd::User::from_name(name)
        .map_err(|e| refused(format!("cannot read the user database: {e}")))?
        .ok_or_else(|| refused("no such user on this host (see /etc/passwd)".into()))?;
    crate::host::account::record_proxy_user(user.uid.as_raw())
        .map_err(|e| Error::Failed(format!("cannot record the proxy's user {name}: {e}")))?;
    if let Some(state) = acme_state {
        crate::host::account::hand_over(state, user.uid.as_raw(), user.gid.as_raw())
            .map_err(|e| refused(format!("cannot hand {} to it: {e}", state.display())))?;
    }
    Ok(user)
}

/// The proxy leaves root for `user` (its primary group, no supplementary one; real, effective
/// and saved ids alike, so it cannot come back). Every thread at once: glibc's wrappers.
fn become_user(user: &nix::unistd::User) -> Result<(), Error> {
    use nix::unistd::{setgroups, setresgid, setresuid};
    setgroups(&[])
        .and_then(|()| setresgid(user.gid, user.gid, user.gid))
        .and_then(|()| setresuid(user.uid, user.uid, user.uid))
        .map_err(|e| {
            Error::Refused(format!(
                "--user {}: cannot switch to it: {e} (only root can)",
                user.name
            ))
        })
}

/// The proxy's life once its options are read: bind, start the services, leave root, serve on
/// every core until SIGTERM or SIGINT, then finish the requests in flight.
fn serve(
    options: Options,
    serves: Serves,
    resolver: Option<Arc<certs::Resolver>>,
) -> Result<(), Error> {
    let version_header = version_header(&options)?;
    // One single-threaded runtime per serving thread (one per core unless --threads), each with
    // its own listener on the same port (SO_REUSEPORT: the kernel spreads connections) and its
    // own upstream pool: a request never crosses threads. Only the routing tables are shared.
    let threads = options.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, 16)
    });
    raise_open_file_limit();
    // Taking over: the running proxy's sockets, before anything of this one is bound.
    let mut handed = match options.take_over {
        true => Some(
            handover::take(listen_address(&options)).map_err(|e| Error::Refused(e.to_string()))?,
        ),
        false => None,
    };
    // Its serving threads are the ones its listeners were made for.
    let threads = handed.as_ref().map_or(threads, |h| h.plain.len());
    let fronts = Fronts::bind(&options, resolver.as_ref(), threads, handed.as_mut())?;
    let control = match &serves {
        Serves::Config(config) => Some(reload::listen(
            &config.file,
            handed.as_mut().and_then(|h| h.claim("config")),
        )?),
        Serves::Root(_) => None,
    };
    let metrics_listener = metrics_listener(&options, handed.as_mut())?;
    let offer = fronts.offer(control.as_ref(), metrics_listener.as_ref())?;
    // Taking over, the counts go on from the old proxy's (`carry.rs`).
    let carried: Option<carry::Carried> = handed.as_ref().and_then(handover::Handed::counts);
    let started = carried
        .as_ref()
        .map_or_else(counts::Started::now, carry::Carried::started);
    // The main thread's runtime: it follows every service's pointer, answers its proxy.sock
    // and the reloads, and serves connections like the other threads.
    let runtime = current_thread().map_err(Error::Failed)?;
    let (services, router, config) = start_services(
        &runtime,
        &options,
        serves,
        resolver.clone(),
        started,
        threads,
    )?;
    if let Some(carried) = &carried {
        carry::carry(&router.services(), carried);
    }
    let channel = leave_root(&options, fronts.listen)?;
    let said = match &config {
        Some(_) => reload::describe(&router, resolver.as_deref()),
        None => router.routes[0].service.root_text.clone(),
    };
    let current = Arc::new(router::Current::new(router));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let http01: acme::Http01Answers = Default::default();
    let making = Making {
        options: &options,
        version_header,
        current: current.clone(),
        resolver: resolver.clone(),
        tls: fronts
            .tls
            .as_ref()
            .map(|tls| (tls.acceptor.clone(), tls.bound.port())),
        slots: Arc::new(Semaphore::new(options.max_connections)),
        stop: stop_rx,
        http01: http01.clone(),
    };
    let (listen, tls_bound) = (fronts.listen, fronts.tls.as_ref().map(|tls| tls.bound));
    let (mut cores, claims) = fronts.into_cores(&making);
    let first = cores.remove(0);
    // Offered to the next proxy (a hand-over stops this one as SIGTERM does); then, taking
    // over, the old proxy is told this one serves.
    let stop_tx = Arc::new(stop_tx);
    let counted = counted_by(&current, started);
    hand_over(
        channel,
        offer,
        handed,
        &current,
        counted.clone(),
        stop_tx.clone(),
    )?;

    let result = std::thread::scope(|scope| {
        for other in cores {
            scope.spawn(move || match current_thread() {
                Ok(runtime) => runtime.block_on(other.serve()),
                Err(e) => eprintln!("rollgate proxy: a core did not start: {e}"),
            });
        }
        runtime.block_on(async {
            let metrics_served = metrics_listener
                .map(|listener| serve_metrics(listener, &current, started, &resolver, &stop_tx))
                .transpose()?;
            if let (Some(settings), Some(resolver)) = (options.acme.clone(), resolver.clone()) {
                tokio::spawn(acme::keep(settings, resolver, http01.clone()));
            }
            follow_reloads(services, config, control, &current, resolver.clone())?;
            if let Some(bound) = tls_bound {
                eprintln!(
                    "rollgate proxy: TLS on {bound} (plain HTTP on {listen} redirects to it)"
                );
            }
            eprintln!(
                "rollgate proxy: listening on {listen} for {said} ({}; {threads} thread(s))",
                what_is_live(&current.get())
            );
            handover::say_serving();
            stop_on_a_signal(stop_tx)?;
            first.serve().await;
            if let Some(served) = metrics_served {
                // Scrapes accepted before the stop are answered (bounded: a scraper that
                // never reads does not hold the proxy).
                let _ = tokio::time::timeout(METRICS_LAST_ANSWERS, served).await;
            }
            Ok::<(), String>(())
        })
    });
    // The services' followers and proxy.sock files go with the runtime's tasks.
    drop(runtime);
    if handover::handed_over() {
        // Every request this one served is counted by now: the new proxy goes on from here.
        if let Ok(counts) = counted() {
            handover::say_last(counts);
        }
    } else {
        handover::withdraw();
    }
    // Closed, never unlocked (`run_dir::Claim`): a claim handed over is the new proxy's too.
    drop(claims);
    result.map_err(Error::Failed)?;
    eprintln!("rollgate proxy: stopped");
    Ok(())
}

/// Serves `/metrics` on `listener` (within the runtime) until the proxy stops.
fn serve_metrics(
    listener: std::net::TcpListener,
    current: &Arc<router::Current>,
    started: counts::Started,
    resolver: &Option<Arc<certs::Resolver>>,
    stop_tx: &tokio::sync::watch::Sender<bool>,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let listener = TcpListener::from_std(listener).map_err(|e| e.to_string())?;
    if let Ok(address) = listener.local_addr() {
        eprintln!("rollgate proxy: /metrics on http://{address}/metrics");
    }
    Ok(tokio::spawn(metrics::serve(
        listener,
        current.clone(),
        started,
        resolver.clone(),
        stop_tx.subscribe(),
    )))
}

/// What the proxy counted, as of the moment it is asked (for the next proxy: `carry.rs`).
/// Held weakly, as the other threads hold the routes: the services and their access logs must
/// go when the proxy ends, which flushes the logs.
fn counted_by(
    current: &Arc<router::Current>,
    started: counts::Started,
) -> impl Fn() -> serde_json::Result<serde_json::Value> + Clone + Send + 'static {
    let current = Arc::downgrade(current);
    move || {
        let services = current.upgrade().map(|c| c.get().services());
        serde_json::to_value(carry::carried(&services.unwrap_or_default(), started))
    }
}

/// Offers this proxy's sockets to the next one (a hand-over stops this one as SIGTERM does);
/// then, taking over, tells the old proxy this one serves, and puts what it counts last under
/// this one's counts.
fn hand_over(
    channel: handover::Channel,
    offer: handover::Offer,
    handed: Option<handover::Handed>,
    current: &Arc<router::Current>,
    counted: impl Fn() -> serde_json::Result<serde_json::Value> + Send + 'static,
    stop_tx: Arc<tokio::sync::watch::Sender<bool>>,
) -> Result<(), Error> {
    let offered: handover::Counted = Box::new(move || counted().unwrap_or_default());
    handover::offer(channel, offer, offered, stop_tx).map_err(|e| Error::Failed(e.to_string()))?;
    let Some(handed) = handed else {
        return Ok(());
    };
    let current = Arc::downgrade(current);
    let last = move |counts| {
        let carried = serde_json::from_value::<carry::Carried>(counts);
        if let (Ok(carried), Some(current)) = (carried, current.upgrade()) {
            carry::carry(&current.get().services(), &carried);
        }
    };
    handed
        .serving(last)
        .map_err(|e| Error::Failed(format!("cannot tell the running proxy to stop: {e}")))
}

/// `--version-header NAME`, checked to be a header name.
fn version_header(options: &Options) -> Result<Option<HeaderName>, Error> {
    options
        .version_header
        .as_deref()
        .map(|name| {
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| Error::Failed(format!("`{name}` is not a valid header name")))
        })
        .transpose()
}

/// `--metrics-listen`'s socket, bound now (before leaving root).
fn metrics_listener(
    options: &Options,
    handed: Option<&mut handover::Handed>,
) -> Result<Option<std::net::TcpListener>, Error> {
    let Some(address) = options.metrics_listen else {
        return Ok(None);
    };
    // Taking over: the running proxy's own listener (its address is still bound by it).
    if let Some(listener) = handed.and_then(|h| h.metrics(address)) {
        return Ok(Some(listener));
    }
    std::net::TcpListener::bind(address)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map(Some)
        .map_err(|e| Error::Failed(format!("cannot serve /metrics on {address}: {e}")))
}

/// The services of `serves` (one root, or a config's routes), started on the main runtime: the
/// services, the router over them, and the config they came from.
fn start_services(
    runtime: &tokio::runtime::Runtime,
    options: &Options,
    serves: Serves,
    resolver: Option<Arc<certs::Resolver>>,
    started: counts::Started,
    threads: usize,
) -> Result<
    (
        reload::Services,
        router::Router,
        Option<Box<config::ProxyConfig>>,
    ),
    Error,
> {
    let rotation =
        crate::host::output::Rotation::from_policy(options.access_max_bytes, options.access_keep)
            .map_err(|e| {
            Error::Refused(
                e.to_string()
                    .replace("output_max_bytes", "--access-log-max-bytes")
                    .replace("output_keep", "--access-log-keep"),
            )
        })?;
    let mut services = reload::Services::new(
        threads,
        started,
        resolver,
        access::Settings {
            rotation,
            query: options.access_query,
            sample: options.access_sample.unwrap_or(1),
        },
        options.access_log,
    );
    let (router, config) = runtime
        .block_on(async {
            match serves {
                Serves::Root(root) => services.single(root).await.map(|r| (r, None)),
                Serves::Config(config) => {
                    services.log_by_default(config.settings.access_log);
                    services
                        .apply(&config.routes)
                        .await
                        .map(|r| (r, Some(config)))
                }
            }
        })
        .map_err(|e| Error::Refused(e.to_string()))?;
    Ok((services, router, config))
}

/// With a config, SIGHUP and `proxy reload` read the file (and the certificate files) again;
/// the services belong to the reloading task from now on. With one root, SIGHUP reads the
/// certificate files again.
fn follow_reloads(
    services: reload::Services,
    config: Option<Box<config::ProxyConfig>>,
    control: Option<reload::Control>,
    current: &Arc<router::Current>,
    resolver: Option<Arc<certs::Resolver>>,
) -> Result<(), String> {
    let mut sighup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
    if let (Some(config), Some(control)) = (config, control) {
        let (asks, asked) = tokio::sync::mpsc::channel(16);
        tokio::spawn(reload::serve(control, asks.clone()));
        tokio::spawn(reload::keep(
            services,
            config.file.clone(),
            *config,
            current.clone(),
            asked,
        ));
        tokio::spawn(async move {
            while sighup.recv().await.is_some() {
                let _ = asks.send(reload::Ask { reply: None }).await;
            }
        });
        return Ok(());
    }
    tokio::spawn(async move {
        let _services = services;
        while sighup.recv().await.is_some() {
            let Some(resolver) = &resolver else { continue };
            match resolver.reload() {
                Ok(()) => eprintln!("rollgate proxy: SIGHUP: certificates read again"),
                Err(e) => eprintln!(
                    "rollgate proxy: SIGHUP: certificates not reloaded, the ones in force go on: {e}"
                ),
            }
        }
    });
    Ok(())
}

/// What each service has live, for the line the proxy says when it starts.
fn what_is_live(router: &router::Router) -> String {
    let live = |service: &service::Service| match service.routes.pool().as_slice() {
        [] => "nothing live yet".into(),
        pool => format!(
            "live: {}",
            pool.iter()
                .map(|t| format!("{} on port {}", t.version, t.port))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let lives: Vec<String> = router
        .services()
        .iter()
        .map(|s| match router.by_host {
            true => format!("{}: {}", s.name, live(s)),
            false => live(s),
        })
        .collect();
    lives.join("; ")
}

/// The plain address asked for (`--listen`, the config's, or the default).
fn listen_address(options: &Options) -> SocketAddr {
    options.listen.unwrap_or_else(|| {
        crate::defaults::PROXY_LISTEN
            .parse()
            .expect("the default address")
    })
}

/// SIGTERM or SIGINT tells every core to stop: they finish the requests in flight.
fn stop_on_a_signal(stop: Arc<tokio::sync::watch::Sender<bool>>) -> Result<(), String> {
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = sigint.recv() => {}
        }
        eprintln!("rollgate proxy: stopping; finishing in-flight requests");
        let _ = stop.send(true);
    });
    Ok(())
}

/// The sockets a unit's socket activation passed, by address.
struct Activated(Vec<(SocketAddr, std::os::fd::OwnedFd)>);

impl Activated {
    /// The socket for `address` (one bound to the same port on every address serves it too),
    /// as a listener for each of `threads` (copies of the one socket: they share its queue).
    /// Taking one says so to the hand-over's rules: the socket outlives this process.
    fn take(
        &mut self,
        address: SocketAddr,
        threads: usize,
    ) -> std::io::Result<Option<Vec<std::net::TcpListener>>> {
        let Some(at) = self.0.iter().position(|(bound, _)| {
            *bound == address || (bound.port() == address.port() && bound.ip().is_unspecified())
        }) else {
            return Ok(None);
        };
        let listener = std::net::TcpListener::from(self.0.remove(at).1);
        listener.set_nonblocking(true)?;
        let mut listeners = Vec::with_capacity(threads);
        for _ in 1..threads.max(1) {
            listeners.push(listener.try_clone()?);
        }
        listeners.push(listener);
        handover::kept_by_systemd();
        Ok(Some(listeners))
    }
}

/// The proxy's listening sockets, claimed (no second proxy on the same address) and bound
/// before it leaves root: plain HTTP, one per serving thread, and TLS's beside them.
struct Fronts {
    plain: Vec<std::net::TcpListener>,
    /// The plain address bound (its port, when 0 was asked for).
    listen: SocketAddr,
    plain_claim: Option<crate::host::run_dir::Claim>,
    tls: Option<TlsFront>,
}

struct TlsFront {
    listeners: Vec<std::net::TcpListener>,
    bound: SocketAddr,
    claim: Option<crate::host::run_dir::Claim>,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl Fronts {
    /// Binds the listeners (and claims their addresses), or takes those `handed` over.
    fn bind(
        options: &Options,
        resolver: Option<&Arc<certs::Resolver>>,
        threads: usize,
        mut handed: Option<&mut handover::Handed>,
    ) -> Result<Fronts, Error> {
        let failed = |e: std::io::Error| Error::Failed(e.to_string());
        let listen_at = listen_address(options);
        // A unit's sockets (systemd's socket activation), else sockets of its own.
        let mut activated = Activated(crate::host::listen::activated());
        let mut own = |address: SocketAddr| -> Result<_, Error> {
            // Held for the proxy's life: a second rollgate proxy on this address fails here.
            // (A socket of the unit's is bound already: nobody else's, so not looked for.)
            Ok(match activated.take(address, threads).map_err(failed)? {
                Some(listeners) => (
                    claim_address(address, false).map_err(Error::Failed)?,
                    listeners,
                ),
                None => (
                    claim_address(address, true).map_err(Error::Failed)?,
                    reuseport_listeners(address, threads).map_err(failed)?,
                ),
            })
        };
        let (plain_claim, plain) = match handed.as_deref_mut() {
            Some(handed) => (handed.claim("listen"), std::mem::take(&mut handed.plain)),
            None => own(listen_at)?,
        };
        let listen = plain[0].local_addr().map_err(failed)?;
        if let Some(handed) = handed.as_deref() {
            // The addresses move as they are: TLS where it was, or nowhere.
            if handed.layout.tls_address != options.tls_listen {
                return Err(Error::Refused(format!(
                    "the running proxy serves TLS on {}, and this one is asked {}: a take-over keeps the addresses (give the same --tls-listen)",
                    handed.layout.tls_address.map_or("nothing".into(), |a| a.to_string()),
                    options.tls_listen.map_or("none".into(), |a| a.to_string()),
                )));
            }
        }
        // TLS: its own listeners, one per thread like the plain ones, claimed the same way.
        let tls = match (options.tls_listen, resolver) {
            (Some(address), Some(resolver)) => {
                let (claim, listeners) = match handed.as_deref_mut() {
                    Some(handed) => (handed.claim("tls"), std::mem::take(&mut handed.tls)),
                    None => own(address)?,
                };
                let bound = listeners[0].local_addr().map_err(failed)?;
                let config = tls::server_config(resolver.clone())
                    .map_err(|e| Error::Failed(e.to_string()))?;
                Some(TlsFront {
                    listeners,
                    bound,
                    claim,
                    acceptor: tokio_rustls::TlsAcceptor::from(config),
                })
            }
            _ => None,
        };
        Ok(Fronts {
            plain,
            listen,
            plain_claim,
            tls,
        })
    }

    /// What a hand-over passes to the next proxy: copies of every listener and claim (the
    /// config's control claim too), in [`handover::Layout`]'s order.
    fn offer(
        &self,
        control: Option<&reload::Control>,
        metrics: Option<&std::net::TcpListener>,
    ) -> Result<handover::Offer, Error> {
        let copy = |fd: std::os::fd::BorrowedFd<'_>| {
            fd.try_clone_to_owned()
                .map_err(|e| Error::Failed(format!("cannot keep a copy for a hand-over: {e}")))
        };
        use std::os::fd::AsFd;
        let mut layout = handover::Layout {
            plain: self.plain.len(),
            ..Default::default()
        };
        let mut fds = Vec::new();
        for listener in &self.plain {
            fds.push(copy(listener.as_fd())?);
        }
        if let Some(tls) = &self.tls {
            layout.tls = tls.listeners.len();
            layout.tls_address = Some(tls.bound);
            for listener in &tls.listeners {
                fds.push(copy(listener.as_fd())?);
            }
        }
        let claims = [
            ("listen", self.plain_claim.as_ref()),
            ("tls", self.tls.as_ref().and_then(|t| t.claim.as_ref())),
            ("config", control.and_then(reload::Control::claim)),
        ];
        for (what, claim) in claims {
            if let Some(claim) = claim {
                layout.claims.push(what.to_string());
                fds.push(copy(claim.as_fd())?);
            }
        }
        // The `/metrics` listener too: the next proxy serves it on (issue 79: it could not
        // bind the address the old one held, and exited).
        if let Some(metrics) = metrics {
            layout.claims.push(handover::METRICS.to_string());
            fds.push(copy(metrics.as_fd())?);
        }
        Ok(handover::Offer { layout, fds })
    }

    /// One serving thread's listeners each (the first is the main thread's), and the claims
    /// on the addresses, to hold while they serve.
    fn into_cores(self, making: &Making<'_>) -> (Vec<Cores>, Vec<crate::host::run_dir::Claim>) {
        let mut claims: Vec<crate::host::run_dir::Claim> = self.plain_claim.into_iter().collect();
        let mut tls_listeners = match self.tls {
            Some(tls) => {
                claims.extend(tls.claim);
                tls.listeners.into_iter().map(Some).collect()
            }
            None => Vec::new(),
        }
        .into_iter();
        let cores = self
            .plain
            .into_iter()
            .enumerate()
            .map(|(thread, plain)| making.core(thread, plain, tls_listeners.next().flatten()))
            .collect();
        (cores, claims)
    }
}

/// What every serving thread is made from.
struct Making<'a> {
    options: &'a Options,
    version_header: Option<HeaderName>,
    current: Arc<router::Current>,
    resolver: Option<Arc<certs::Resolver>>,
    /// With TLS on: its acceptor and the port https is served on.
    tls: Option<(tokio_rustls::TlsAcceptor, u16)>,
    slots: Arc<Semaphore>,
    stop: tokio::sync::watch::Receiver<bool>,
    http01: acme::Http01Answers,
}

impl Making<'_> {
    /// Serving thread number `thread`: its share of the proxy, its plain listener (which
    /// redirects to https while TLS is on) and its TLS listener.
    fn core(
        &self,
        thread: usize,
        plain: std::net::TcpListener,
        tls: Option<std::net::TcpListener>,
    ) -> Cores {
        let options = self.options;
        let shared = Arc::new(Shared {
            router: router::Local::new(self.current.clone()),
            turns: Default::default(),
            idle: Default::default(),
            version_header: self.version_header.clone(),
            body_idle: options.body_idle,
            tunnel_idle: options.tunnel_idle,
            tunnels: tunnel::Tunnels::new(self.stop.clone(), options.drain),
            trust_forwarded: options.trust_forwarded,
            thread,
            counting: options.counting,
            header_read_timeout: options.header_read_timeout,
            max_header_bytes: options.max_header_bytes,
        });
        let listening = |listener, kind| Core {
            listener,
            shared: shared.clone(),
            slots: self.slots.clone(),
            stop: self.stop.clone(),
            kind,
        };
        match (&self.tls, &self.resolver) {
            (Some((acceptor, tls_port)), Some(resolver)) => Cores {
                plain: listening(
                    plain,
                    Kind::Redirect {
                        tls_port: *tls_port,
                        http01: self.http01.clone(),
                        resolver: resolver.clone(),
                    },
                ),
                tls: tls.map(|listener| {
                    listening(
                        listener,
                        Kind::Tls {
                            acceptor: acceptor.clone(),
                            resolver: resolver.clone(),
                            hsts: options.hsts,
                        },
                    )
                }),
            },
            _ => Cores {
                plain: listening(plain, Kind::Plain),
                tls: None,
            },
        }
    }
}

fn current_thread() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// Every client connection is a descriptor: start with the soft limit at the hard one, as
/// servers do, so the default 1024 does not cap `--max-connections`.
fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// Makes sure nothing else serves `listen`. The serving sockets use `SO_REUSEPORT` (one per
/// thread), which would also let a second proxy of the same user bind the address and take half
/// of the traffic. So first: a plain bind without it, which fails if anyone listens there; and
/// a claim on the address in rollgate's run folder (an exclusive lock no other user can take
/// first, which two proxies starting at the same moment cannot both hold). The returned claim
/// is held for the proxy's life. `look_for_others` false: the address is this proxy's socket
/// already (socket activation), so only the claim is taken.
fn claim_address(
    listen: SocketAddr,
    look_for_others: bool,
) -> Result<Option<crate::host::run_dir::Claim>, String> {
    use crate::host::run_dir;
    use nix::sys::socket::{
        bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrStorage,
    };
    use std::os::fd::AsRawFd;
    if listen.port() == 0 {
        // The kernel picks a free port: nobody else can be on it.
        return Ok(None);
    }
    let taken = |how: String| {
        format!(
            "{listen} is already served ({how}); a second proxy there would split its traffic. Stop the other one or pick another --listen address"
        )
    };
    let folder = run_dir::folder("proxy", run_dir::Reach::Private).map_err(|e| e.to_string())?;
    let name = run_dir::short_name(listen.to_string().as_bytes());
    let claim = run_dir::claim(&folder.join(format!("listen-{name}.lock")))
        .map_err(|e| e.to_string())?
        .ok_or_else(|| taken("by another rollgate proxy".into()))?;
    if !look_for_others {
        return Ok(Some(claim));
    }
    let family = if listen.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let probe = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| format!("cannot check {listen}: {e}"))?;
    // Connections in TIME_WAIT from an earlier run are no one serving the address.
    setsockopt(&probe, sockopt::ReuseAddr, &true)
        .map_err(|e| format!("cannot check {listen}: {e}"))?;
    match bind(probe.as_raw_fd(), &SockaddrStorage::from(listen)) {
        Ok(()) => Ok(Some(claim)),
        Err(nix::Error::EADDRINUSE) => Err(taken("another process listens there".into())),
        Err(e) => Err(format!("cannot listen on {listen}: {e}")),
    }
}

/// `count` listening sockets on the same address (the first one's port, if it asked for 0).
pub(crate) fn reuseport_listeners(
    listen: SocketAddr,
    count: usize,
) -> std::io::Result<Vec<std::net::TcpListener>> {
    use nix::sys::socket::{
        bind, listen as listen_on, setsockopt, socket, sockopt, AddressFamily, Backlog, SockFlag,
        SockType, SockaddrStorage,
    };
    let mut address = listen;
    let mut listeners = Vec::with_capacity(count);
    for _ in 0..count {
        let family = if address.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        let fail = |what: &str, e: nix::Error| {
            std::io::Error::new(
                std::io::Error::from(e).kind(),
                format!("cannot listen on {address}: {what}: {e}"),
            )
        };
        let fd = socket(
            family,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(|e| fail("socket", e))?;
        setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(|e| fail("SO_REUSEADDR", e))?;
        setsockopt(&fd, sockopt::ReusePort, &true).map_err(|e| fail("SO_REUSEPORT", e))?;
        use std::os::fd::AsRawFd;
        bind(fd.as_raw_fd(), &SockaddrStorage::from(address)).map_err(|e| fail("bind", e))?;
        listen_on(&fd, Backlog::new(1024).unwrap_or(Backlog::MAXCONN))
            .map_err(|e| fail("listen", e))?;
        let listener = std::net::TcpListener::from(fd);
        address = listener.local_addr()?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// First and longest wait after a failed accept.
/// How long a stopping proxy waits for the `/metrics` answers it owes.
const METRICS_LAST_ANSWERS: Duration = Duration::from_secs(5);
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_millis(500);

/// One serving thread's listeners: the plain one, and TLS's when it is on.
struct Cores {
    plain: Core,
    tls: Option<Core>,
}

impl Cores {
    async fn serve(self) {
        match self.tls {
            Some(tls) => {
                tokio::join!(self.plain.serve(), tls.serve());
            }
            None => self.plain.serve().await,
        }
    }
}

/// What a listener's connections are served as.
#[derive(Clone)]
enum Kind {
    /// Plain HTTP to the releases.
    Plain,
    /// Plain HTTP while TLS is on: redirected to https on this port, but for ACME's HTTP-01
    /// challenges.
    Redirect {
        tls_port: u16,
        http01: acme::Http01Answers,
        /// Which names https serves: a host it does not is not sent there.
        resolver: Arc<certs::Resolver>,
    },
    /// TLS, then HTTP/2 or HTTP/1.1 to the releases.
    Tls {
        acceptor: tokio_rustls::TlsAcceptor,
        resolver: Arc<certs::Resolver>,
        hsts: bool,
    },
}

/// One core's share of the work: its listener, its upstream pool, and the shared limits.
struct Core {
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    slots: Arc<Semaphore>,
    stop: tokio::sync::watch::Receiver<bool>,
    kind: Kind,
}

impl Core {
    /// Accepts and serves until told to stop, then finishes its connections' requests.
    async fn serve(self) {
        let Ok(listener) = TcpListener::from_std(self.listener) else {
            return;
        };
        let mut stop = self.stop.clone();
        // This core's connections wait on a channel of its own: waiting on the proxy's one
        // would take a lock shared by every thread on each request.
        let (core_stop, core_stop_rx) = tokio::sync::watch::channel(false);
        let mut connections = tokio::task::JoinSet::new();
        let mut backoff = ACCEPT_BACKOFF_MIN;
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(pair) => {
                        backoff = ACCEPT_BACKOFF_MIN;
                        pair
                    }
                    Err(e) => {
                        // Out of descriptors (EMFILE, ENFILE) or memory: the connection waits
                        // in the kernel's queue. Retrying at once would spin at 100 % CPU.
                        if backoff == ACCEPT_BACKOFF_MIN {
                            eprintln!("rollgate proxy: accept failed ({e}); backing off");
                        }
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = stop.changed() => break,
                        }
                        backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                        continue;
                    }
                },
                _ = stop.changed() => break,
            };
            // A slot is taken after the accept, not held while waiting for one: every thread
            // has its own listener, and a slot held by an idle thread would starve a
            // connection the kernel gave to another. So each thread holds at most one accepted
            // connection waiting for a slot; the rest wait in the kernel's queue.
            // Accepted is served, stopping or not: a connection dropped here would be reset
            // under a request the client already sent (seen at a hand-over). Slots free up
            // as the connections in flight finish.
            let Ok(permit) = self.slots.clone().acquire_owned().await else {
                break;
            };
            match &self.kind {
                Kind::Plain => {
                    connections.spawn(front::serve(
                        stream,
                        peer,
                        permit,
                        self.shared.clone(),
                        core_stop_rx.clone(),
                    ));
                }
                Kind::Redirect {
                    tls_port,
                    http01,
                    resolver,
                } => {
                    let to_https = tls::ToHttps {
                        tls_port: *tls_port,
                        http01: http01.clone(),
                        resolver: resolver.clone(),
                        shared: self.shared.clone(),
                    };
                    let stop = core_stop_rx.clone();
                    connections.spawn(async move {
                        let _slot = permit;
                        tls::redirect(stream, peer, to_https, stop).await;
                    });
                }
                Kind::Tls {
                    acceptor,
                    resolver,
                    hsts,
                } => {
                    connections.spawn(tls::serve(
                        stream,
                        peer,
                        permit,
                        self.shared.clone(),
                        acceptor.clone(),
                        resolver.clone(),
                        *hsts,
                        core_stop_rx.clone(),
                    ));
                }
            }
            // Reap finished connection tasks as we go.
            while connections.try_join_next().is_some() {}
        }
        drop(listener);
        let _ = core_stop.send(true);
        while connections.join_next().await.is_some() {}
        // Upgraded connections live in tasks of their own, until the drain timeout at most.
        self.shared.tunnels.all_closed().await;
    }
}
