//! The services a proxy serves and a reload of its config (issue 48): SIGHUP, or
//! `rollgate proxy reload --config FILE` over the config's control socket, reads the file
//! again and puts its routes in force for new requests. Requests in flight, keep-alive
//! connections and tunnels finish on what they had (they hold their service); a root that stays
//! keeps its service (its counts, its `proxy.sock`, its followers); listeners are never
//! rebound. A file that does not parse, names a missing root or changes a listener is refused
//! whole, and the config in force goes on serving.
//!
//! The control socket is a Unix socket in rollgate's run folder named after a digest of the
//! config's absolute path (`/run/rollgate/proxy/config-….sock`, a folder only rollgate's user
//! may enter, so no other process can take the name first), held with a claim beside it; only
//! the proxy's own user (or root) is answered, and `proxy reload` asks only a proxy that
//! listened as root or as its own user.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, Notify};

use super::access;
use super::certs;
use super::config::{self, ProxyConfig, RouteSpec};
use super::counts::Started;
use super::router::{Current, HostPattern, Route, Router};
use super::service::Service;
use super::{control, watch};
use crate::host::fault::Fault;
use crate::host::state::Root;

/// Every service the config in force names, with its followers.
pub struct Services {
    running: Vec<Running>,
    threads: usize,
    /// Whose counts these are (a proxy that took over goes on with the old one's).
    started: Started,
    /// When this process started: its access logs' request ids begin with it (never the
    /// counts' start, which a proxy that took over shares with the old one).
    log_started_ms: u64,
    tls: Option<Arc<certs::Resolver>>,
    /// How routes log (`--access-log-*`), and whether a route that does not say logs.
    access: access::Settings,
    /// `--access-log`: every route logs whatever the file says.
    access_flag: bool,
    /// The file's `access_log`: routes that do not say log.
    access_by_default: bool,
    /// The routes in force in words, for `routes` on every root's proxy.sock.
    in_force: super::control::RoutesInForce,
}

impl Services {
    pub fn new(
        threads: usize,
        started: Started,
        tls: Option<Arc<certs::Resolver>>,
        access: access::Settings,
        access_by_default: bool,
    ) -> Services {
        Services {
            running: Vec::new(),
            threads,
            started,
            log_started_ms: Started::now().at_ms,
            tls,
            access,
            access_flag: access_by_default,
            access_by_default,
            in_force: Default::default(),
        }
    }

    /// The access log a new service gets: its route's `access_log` over the proxy's setting.
    fn access_for(&self, route_says: Option<bool>) -> Option<(access::Settings, u64)> {
        (self.access_flag || route_says.unwrap_or(self.access_by_default))
            .then_some((self.access, self.log_started_ms))
    }

    /// `--root`'s one service, for every host and path.
    pub async fn single(&mut self, root: Root) -> Result<Router, Fault> {
        let name = config::default_service_name(&root.0);
        let access = self.access_for(None);
        let service = Arc::new(Service::new(name, root, self.threads, access));
        let running = Running::start(
            service.clone(),
            self.started,
            self.tls.clone(),
            self.in_force.clone(),
        )
        .await?;
        self.running.push(running);
        Ok(Router::single(service))
    }

    /// Serves `routes` from now on: a root already served keeps its service (renamed if the
    /// route renamed it); a new root is started; a root no route names any more is let go —
    /// only once every new one started, so a failure leaves the services as they were.
    /// The config file's own `access_log` (read again at each reload).
    pub fn log_by_default(&mut self, file_says: bool) {
        self.access_by_default = self.access_flag || file_says;
    }

    pub async fn apply(&mut self, routes: &[RouteSpec]) -> Result<Router, Fault> {
        let mut started: Vec<Running> = Vec::new();
        for spec in routes {
            if self.running.iter().any(|r| r.service.root.0 == spec.root) {
                continue;
            }
            let service = Arc::new(Service::new(
                spec.service.clone(),
                Root(spec.root.clone()),
                self.threads,
                self.access_for(spec.access_log),
            ));
            // On failure, what this pass started is dropped with `started`.
            let running = Running::start(
                service,
                self.started,
                self.tls.clone(),
                self.in_force.clone(),
            )
            .await?;
            started.push(running);
        }
        self.running
            .retain(|r| routes.iter().any(|spec| spec.root == r.service.root.0));
        let wanted: Vec<_> = self
            .running
            .iter()
            .map(|running| {
                routes
                    .iter()
                    .find(|s| s.root == running.service.root.0)
                    .map(|spec| (spec, self.access_for(spec.access_log)))
            })
            .collect();
        for (running, wanted) in self.running.iter_mut().zip(wanted) {
            if let Some((spec, access)) = wanted {
                let relog = access.is_some() != running.service.access.is_some();
                if spec.service != running.service.name || relog {
                    let service = running
                        .service
                        .changed(spec.service.clone(), relog.then_some(access));
                    running.replace(service);
                }
            }
        }
        self.running.extend(started);
        let table = routes
            .iter()
            .filter_map(|spec| {
                let running = self
                    .running
                    .iter()
                    .find(|r| r.service.root.0 == spec.root)?;
                Some(Route {
                    hosts: spec.hosts.clone(),
                    prefix: spec.prefix.clone(),
                    strip_prefix: spec.strip_prefix,
                    max_request_body: spec.max_request_body,
                    service: running.service.clone(),
                })
            })
            .collect();
        let router = Router::of(table);
        if let Ok(mut in_force) = self.in_force.write() {
            *in_force = route_lines(&router);
        }
        Ok(router)
    }
}

/// Why a reload was asked for: a reply is sent to the control socket's peer (SIGHUP's is only
/// logged).
pub struct Ask {
    pub reply: Option<oneshot::Sender<Result<String, String>>>,
}

/// Runs for the proxy's life: each ask reads `file` again and puts its routes in force.
/// `in_force` is the config the proxy started with (its settings may not change).
pub async fn keep(
    mut services: Services,
    file: PathBuf,
    mut in_force: ProxyConfig,
    current: Arc<Current>,
    mut asks: mpsc::Receiver<Ask>,
) {
    while let Some(ask) = asks.recv().await {
        let outcome = reload(&mut services, &file, &in_force, &current).await;
        match &outcome {
            Ok((said, config)) => {
                eprintln!("rollgate proxy: reloaded {}: {said}", file.display());
                in_force = config.clone();
            }
            Err(why) => eprintln!(
                "rollgate proxy: reload refused, the config in force goes on serving: {why}"
            ),
        }
        if let Some(reply) = ask.reply {
            let _ = reply.send(outcome.map(|(said, _)| said));
        }
    }
    drop(services);
}

async fn reload(
    services: &mut Services,
    file: &Path,
    in_force: &ProxyConfig,
    current: &Current,
) -> Result<(String, ProxyConfig), String> {
    let config = config::read(file).map_err(|e| e.to_string())?;
    // Whether routes log by default may change with a reload; every other setting may not.
    let same_but_logging = config::Settings {
        access_log: in_force.settings.access_log,
        ..config.settings.clone()
    };
    if same_but_logging != in_force.settings {
        return Err(format!(
            "{}: {} changed; a reload changes routes only (listeners, certificates and ACME settings stay as the proxy started): restart the proxy for that",
            file.display(),
            changed_settings(&in_force.settings, &config.settings).join(", ")
        ));
    }
    services.log_by_default(config.settings.access_log);
    let router = services
        .apply(&config.routes)
        .await
        .map_err(|e| e.to_string())?;
    let said = describe(&router, services.tls.as_deref());
    current.replace(router);
    if let Some(resolver) = &services.tls {
        resolver.reload().map_err(|e| {
            format!("routes reloaded ({said}), certificates not (the ones in force go on): {e}")
        })?;
    }
    Ok((said, config))
}

/// The keys that differ between two files' settings, by their names in the file.
fn changed_settings(was: &config::Settings, now: &config::Settings) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut check = |differs: bool, key: &'static str| {
        if differs {
            changed.push(key);
        }
    };
    check(was.listen != now.listen, "listen");
    check(was.metrics_listen != now.metrics_listen, "metrics_listen");
    check(was.tls_listen != now.tls_listen, "tls_listen");
    check(was.tls_certs != now.tls_certs, "tls_cert");
    check(was.hsts != now.hsts, "hsts");
    check(
        was.access_log_max_bytes != now.access_log_max_bytes
            || was.access_log_keep != now.access_log_keep
            || was.access_log_query != now.access_log_query
            || was.access_log_sample != now.access_log_sample,
        "access_log_*",
    );
    check(
        was.acme_directory != now.acme_directory
            || was.acme_contact != now.acme_contact
            || was.acme_ca_file != now.acme_ca_file
            || was.acme_state != now.acme_state
            || was.acme_names != now.acme_names
            || was.acme_challenge != now.acme_challenge,
        "acme_*",
    );
    changed
}

/// Each route in words: `app.example.com|www.app.example.com/api → api`.
fn route_lines(router: &Router) -> Vec<String> {
    router
        .routes
        .iter()
        .map(|route| {
            let hosts: Vec<String> = route.hosts.iter().map(HostPattern::to_string).collect();
            format!(
                "{}{}{} → {}",
                hosts.join("|"),
                route.prefix,
                if route.strip_prefix {
                    " (stripped)"
                } else {
                    ""
                },
                route.service.name
            )
        })
        .collect()
}

/// One line naming the routes in force: `3 routes: app.example.com/ → app, …`; with TLS on,
/// a warning naming the route hosts no certificate or ACME name covers (https refuses their
/// handshake, and plain HTTP answers them 421 rather than redirect). A warning, not a refusal:
/// a certificate may follow the route (a file renewed on the next reload, an ACME name added).
pub fn describe(router: &Router, tls: Option<&certs::Resolver>) -> String {
    let routes = route_lines(router);
    let mut said = format!(
        "{} route{}: {}",
        routes.len(),
        if routes.len() == 1 { "" } else { "s" },
        routes.join(", ")
    );
    let uncovered = tls
        .map(|resolver| uncovered_hosts(router, resolver))
        .unwrap_or_default();
    if !uncovered.is_empty() {
        said.push_str(&format!(
            "; warning: no certificate or ACME name covers {}: https refuses it and plain HTTP answers 421 (give a tls_cert or an acme name for it)",
            uncovered.join(", ")
        ));
    }
    said
}

/// The route hosts (exact names and wildcards; `*` takes whatever comes) that https has no
/// certificate for.
fn uncovered_hosts(router: &Router, resolver: &certs::Resolver) -> Vec<String> {
    let mut uncovered: Vec<String> = Vec::new();
    for pattern in router.routes.iter().flat_map(|route| &route.hosts) {
        let name = match pattern {
            HostPattern::Exact(name) => name.clone(),
            // A wildcard is covered when one of its names is: try a label below it.
            HostPattern::Wildcard(suffix) => format!("x{suffix}"),
            HostPattern::Any => continue,
        };
        let shown = pattern.to_string();
        if !resolver.serves_name(&name) && !uncovered.contains(&shown) {
            uncovered.push(shown);
        }
    }
    uncovered
}

/// The control socket's path for the config at `file`, and its claim's.
fn control_paths(file: &Path) -> Result<(PathBuf, PathBuf), String> {
    use crate::host::run_dir;
    let absolute = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let folder = run_dir::folder("proxy", run_dir::Reach::Private).map_err(|e| e.to_string())?;
    let name = run_dir::short_name(absolute.as_os_str().as_encoded_bytes());
    Ok((
        folder.join(format!("config-{name}.sock")),
        folder.join(format!("config-{name}.lock")),
    ))
}

/// The control socket of a config, held: its name goes when it is dropped, then its claim.
pub struct Control {
    listener: std::os::unix::net::UnixListener,
    path: PathBuf,
    /// Some until dropped.
    claim: Option<crate::host::run_dir::Claim>,
}

impl Control {
    /// The claim on the config's control socket (passed on at a hand-over).
    pub fn claim(&self) -> Option<&crate::host::run_dir::Claim> {
        self.claim.as_ref()
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        // Handed over, the name is the new proxy's (its claim, the same open file, is only
        // closed here: `run_dir::Claim`); never placed, it is still the running proxy's.
        super::handover::remove_name(&self.path);
    }
}

/// Binds the control socket of the config at `file`: refused if another proxy serves it —
/// unless its claim was `handed` over by the proxy this one takes over from.
pub fn listen(
    file: &Path,
    handed: Option<crate::host::run_dir::Claim>,
) -> Result<Control, crate::error::Error> {
    use crate::error::Error;
    use std::os::unix::fs::PermissionsExt;
    let failed = |e: String| {
        Error::Failed(format!(
            "cannot open the control socket for {}: {e}",
            file.display()
        ))
    };
    let (path, lock) = control_paths(file).map_err(failed)?;
    let claim = match handed {
        Some(claim) => Some(claim),
        None => crate::host::run_dir::claim(&lock).map_err(|e| failed(e.to_string()))?,
    };
    let claim = claim
        .ok_or_else(|| {
            Error::Refused(format!(
                "another rollgate proxy already serves {}; reload that one (rollgate proxy reload --config {})",
                file.display(),
                file.display()
            ))
        })?;
    // Bound under a staging name and renamed over the name (one left by a proxy that was
    // killed, or, taking over, the running proxy's once this one is sure to serve).
    let staging = path.with_extension(format!("{}.staging", std::process::id()));
    let _ = std::fs::remove_file(&staging);
    let listener = std::os::unix::net::UnixListener::bind(&staging)
        .and_then(|listener| listener.set_nonblocking(true).map(|()| listener))
        .and_then(|listener| {
            std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o600))
                .map(|()| listener)
        })
        .and_then(|listener| {
            super::handover::place_name(staging.clone(), path.clone()).map(|()| listener)
        })
        .map_err(|e| {
            let _ = std::fs::remove_file(&staging);
            failed(e.to_string())
        })?;
    Ok(Control {
        listener,
        path,
        claim: Some(claim),
    })
}

/// Whether a peer is rollgate's own user or root, by the credentials the kernel gives.
fn trusted(cred: Option<(u32, i32)>) -> bool {
    let me = nix::unistd::geteuid().as_raw();
    cred.is_some_and(|(uid, _)| uid == me || uid == 0)
}

/// Answers `reload` on the control socket until the runtime stops.
pub async fn serve(control: Control, asks: mpsc::Sender<Ask>) {
    let Ok(listener) = control.listener.try_clone() else {
        return;
    };
    let Ok(listener) = tokio::net::UnixListener::from_std(listener) else {
        return;
    };
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let asks = asks.clone();
        tokio::spawn(async move {
            let cred = stream
                .peer_cred()
                .ok()
                .map(|c| (c.uid(), c.pid().unwrap_or(0)));
            if !trusted(cred) {
                return;
            }
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            use tokio::io::AsyncReadExt;
            let mut reader = BufReader::new(read.take(64));
            let read = reader.read_line(&mut line);
            let answer = match tokio::time::timeout(std::time::Duration::from_secs(5), read).await {
                Ok(Ok(_)) if line.trim() == "reload" => {
                    let (reply, answered) = oneshot::channel();
                    let _ = asks.send(Ask { reply: Some(reply) }).await;
                    match answered.await {
                        Ok(Ok(said)) => format!("reloaded {said}\n"),
                        Ok(Err(why)) => format!("error {}\n", why.replace('\n', " ")),
                        Err(_) => "error the proxy is stopping\n".into(),
                    }
                }
                _ => "error expected `reload`\n".into(),
            };
            let _ = write.write_all(answer.as_bytes()).await;
        });
    }
}

/// `rollgate proxy reload --config FILE`: asks the proxy serving `file` to read it again. Ok:
/// what is in force now; Err: why not (no proxy serves it, or the file was refused).
pub fn ask(file: &Path, timeout: std::time::Duration) -> Result<String, crate::error::Error> {
    use std::io::{BufRead, Write};
    let failed = |why: String| crate::error::Error::Failed(why);
    let (path, _) = control_paths(file).map_err(failed)?;
    let mut stream = std::os::unix::net::UnixStream::connect(&path).map_err(|_| {
        failed(format!(
            "no rollgate proxy serves {} (start one with rollgate proxy --config {})",
            file.display(),
            file.display()
        ))
    })?;
    // The folder is rollgate's alone; the peer is checked all the same (it listened as root,
    // or as this user).
    let cred = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .ok()
        .map(|c| (c.uid(), c.pid()));
    if !trusted(cred) {
        return Err(failed(format!(
            "{} is held by uid {}, neither root nor this user: not asking it",
            path.display(),
            cred.map_or_else(|| "unknown".to_string(), |(uid, _)| uid.to_string())
        )));
    }
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    stream
        .write_all(b"reload\n")
        .map_err(|e| failed(format!("cannot ask the proxy to reload: {e}")))?;
    let mut line = String::new();
    std::io::BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| failed(format!("no answer from the proxy: {e}")))?;
    match line.trim_end().split_once(' ') {
        Some(("reloaded", said)) => Ok(said.to_string()),
        Some(("error", why)) => Err(crate::error::Error::Refused(why.to_string())),
        _ => Err(failed(format!("unexpected answer {:?}", line.trim()))),
    }
}

/// A service's followers while it is configured; dropping it stops them and takes its
/// `proxy.sock` away (the deployer then sees no proxy for that root).
pub struct Running {
    pub service: Arc<Service>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Running {
    /// Serves `service` (the same root, changed by a reload) from now on; a new access log
    /// gets its flusher (one a reload dropped is flushed a last time when its last request
    /// ends).
    pub fn replace(&mut self, service: Service) {
        let logs_now = match (&self.service.access, &service.access) {
            (Some(was), Some(now)) => !Arc::ptr_eq(was, now),
            (None, Some(_)) => true,
            _ => false,
        };
        if logs_now {
            if let Some(log) = &service.access {
                self.tasks.push(access::start(log));
            }
        }
        self.service = Arc::new(service);
    }
}

impl Running {
    /// Binds the service's `proxy.sock` (refused if another proxy answers there) and starts
    /// following its pointer. Must run on the proxy's main runtime.
    pub async fn start(
        service: Arc<Service>,
        started: Started,
        tls: Option<Arc<certs::Resolver>>,
        in_force: control::RoutesInForce,
    ) -> Result<Running, Fault> {
        let socket = control::listen(&service.root.0).await?;
        let reread = Arc::new(Notify::new());
        let follow = tokio::spawn(watch::follow(
            service.root.clone(),
            service.routes.clone(),
            service.gate.clone(),
            reread.clone(),
        ));
        let answer = tokio::spawn(control::serve(
            socket,
            service.root.clone(),
            service.routes.clone(),
            reread,
            started,
            tls,
            service.gate.clone(),
            in_force,
        ));
        let mut tasks = vec![follow.abort_handle(), answer.abort_handle()];
        if let Some(log) = &service.access {
            tasks.push(access::start(log));
        }
        Ok(Running { service, tasks })
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        // Handed over, the name is the new proxy's socket; never placed (a take-over that
        // failed), it is still the running proxy's.
        super::handover::remove_name(&control::socket_path(&self.service.root.0));
    }
}
