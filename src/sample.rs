//! `rollgate sample-service`: a small HTTP service with knobs, used by the tests, the demo and
//! the lab to stand in for a real release. Hidden from `--help`.
//!
//! It listens on `127.0.0.1:$PORT`, answers `GET /` with its version (`$ROLLGATE_VERSION`) and
//! `GET /readyz` with 200 once ready (503 before), and can be told to misbehave. A request's
//! body is read before the answer, whose `x-request-body-bytes` says how long it was.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use clap::Args;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

#[derive(Debug, Clone, Args)]
pub struct SampleArgs {
    /// Answer /readyz with 503 until this long after start, then 200.
    #[arg(long, default_value_t = 0)]
    pub ready_after_ms: u64,
    /// Exit this long after start (with --exit-code). 0 = at boot.
    #[arg(long)]
    pub exit_after_ms: Option<u64>,
    #[arg(long, default_value_t = 1)]
    pub exit_code: i32,
    /// Count --exit-after-ms from when this file exists (looked for every 50 ms), not from
    /// start, and answer --unready-probes only once it does: a test arms a crash or a hiccup at
    /// a moment of its run, however long the gate before it took.
    #[arg(long)]
    pub armed_by: Option<std::path::PathBuf>,
    /// With --armed-by: once armed, answer this many readiness probes 503, then ready again (a
    /// hiccup a judge should tolerate).
    #[arg(long, default_value_t = 0)]
    pub unready_probes: u64,
    /// Answer /readyz with 503 from this long after start (ready, then no longer ready).
    #[arg(long)]
    pub unready_after_ms: Option<u64>,
    /// Answer /readyz with this status always (overrides --ready-after-ms).
    #[arg(long)]
    pub readyz_status: Option<u16>,
    /// Accept /readyz requests and never answer them.
    #[arg(long)]
    pub hang_readyz: bool,
    /// Ignore SIGTERM (only SIGKILL stops it).
    #[arg(long)]
    pub ignore_sigterm: bool,
    /// Answer `GET /` only after this long (a slow request, for drain tests).
    #[arg(long, default_value_t = 0)]
    pub response_delay_ms: u64,
    /// Spend this much CPU time on every `GET /`, as a real handler would (for benchmarks).
    #[arg(long, default_value_t = 0)]
    pub work_us: u64,
    /// Serve on this many threads, each with its own listener on the port (SO_REUSEPORT).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub threads: u16,
    /// Answer readiness on this path instead of /readyz (for probe tests).
    #[arg(long, default_value = "/readyz")]
    pub ready_path: String,
    /// Answer readiness only to requests with this Host header (404 to others).
    #[arg(long)]
    pub ready_host: Option<String>,
    /// Port to listen on (default: $PORT).
    #[arg(long)]
    pub port: Option<u16>,
    /// Speak systemd's notify protocol on $NOTIFY_SOCKET: STATUS=starting at boot, READY=1
    /// with --notify-status at --ready-after-ms, WATCHDOG=1 every half $WATCHDOG_USEC.
    #[arg(long)]
    pub notify: bool,
    /// With --notify: the STATUS= text sent with READY=1.
    #[arg(long, default_value = "serving")]
    pub notify_status: String,
    /// With --notify: send ERRNO=N at --ready-after-ms instead of READY=1.
    #[arg(long)]
    pub notify_errno: Option<i32>,
    /// With --notify: stop sending WATCHDOG=1 this long after start (a hang).
    #[arg(long)]
    pub watchdog_stops_after_ms: Option<u64>,
    /// With --notify: ask for this much more start-up time at boot (EXTEND_TIMEOUT_USEC=).
    #[arg(long)]
    pub extend_timeout_ms: Option<u64>,
    /// With --notify: send STOPPING=1 before exiting (on SIGTERM or at --exit-after-ms).
    #[arg(long)]
    pub notify_stopping: bool,
    /// Serve users on the socket handed over as fd 3 (LISTEN_FDS=1 and LISTEN_PID naming this
    /// process, as systemd's socket activation sets them), accepting on it only once ready;
    /// /readyz stays on PORT if given. On SIGTERM it stops accepting, lets the requests in
    /// hand finish (closing kept-alive connections after their answer), then exits.
    #[arg(long)]
    pub listen_fds: bool,
    /// Answer this share of user requests (not readiness) with 500, spread evenly (0.03: 3
    /// in every 100), to show a canary stopped by its numbers (tests, the demo, benchmarks).
    #[arg(long, default_value_t = 0.0, value_parser = share)]
    pub error_rate: f64,
    /// Answer every user request (not readiness) this much later.
    #[arg(long, default_value_t = 0)]
    pub added_latency_ms: u64,
    /// With --added-latency-ms: only for this long from the first user request (a cold start).
    #[arg(long)]
    pub slow_for_ms: Option<u64>,
}

fn share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{text} is not a share from 0 to 1")),
    }
}

/// Readiness probes still to be answered 503 once armed (--unready-probes).
static UNREADY_PROBES_LEFT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether this readiness probe is one of --unready-probes' hiccup.
fn a_hiccup(args: &SampleArgs) -> bool {
    use std::sync::atomic::Ordering;
    args.armed_by.as_ref().is_some_and(|file| file.exists())
        && UNREADY_PROBES_LEFT
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok()
}

/// User requests answered so far (every thread's): where the --error-rate errors fall.
static USER_REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Whether the `n`th user request (from 0) is one of `rate`'s errors: exactly
/// `floor(n * rate)` of the first `n` are.
fn is_an_error(n: u64, rate: f64) -> bool {
    rate > 0.0 && ((n + 1) as f64 * rate).floor() > (n as f64 * rate).floor()
}

pub fn run(args: SampleArgs) -> u8 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(serve(args))
}

async fn serve(args: SampleArgs) -> u8 {
    let started = Instant::now();
    UNREADY_PROBES_LEFT.store(args.unready_probes, std::sync::atomic::Ordering::SeqCst);
    if args.exit_after_ms == Some(0) {
        eprintln!(
            "sample-service: exiting at boot with status {}",
            args.exit_code
        );
        return args.exit_code as u8;
    }
    let held = match args.listen_fds {
        true => match held_socket() {
            Ok(held) => Some(held),
            Err(e) => {
                eprintln!("sample-service: --listen-fds: {e}");
                return 2;
            }
        },
        false => None,
    };
    let (port, mut listeners) = match bind(&args) {
        Ok(bound) => bound,
        Err(code) => return code,
    };
    let version = std::env::var("ROLLGATE_VERSION").unwrap_or_else(|_| "unknown".into());
    let Some(Ok(listener)) = listeners.next().map(TcpListener::from_std) else {
        eprintln!("sample-service: cannot use the listener on 127.0.0.1:{port}");
        return 3;
    };
    // Extra threads only serve; this one also watches for SIGTERM and the exit timer, and the
    // process ends when it returns.
    for extra in listeners {
        serve_on_a_thread(extra, args.clone(), version.clone(), started);
    }
    eprintln!("sample-service {version}: listening on 127.0.0.1:{port}");
    if args.readyz_status.is_none() && !args.hang_readyz {
        // For benchmarks: when /readyz starts answering 200, in Unix seconds.
        eprintln!(
            "sample-service: ready from {:.6}",
            unix_now() + args.ready_after_ms as f64 / 1000.0
        );
    }

    if args.notify {
        tokio::spawn(notify(args.clone(), started));
    }
    let stopping = || {
        if args.notify && args.notify_stopping {
            send_notification("STOPPING=1");
        }
    };
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    let exit = exit_due(&args, started);
    tokio::pin!(exit);
    // Users reach it on the held socket once it is ready (a real server accepts once it can
    // serve); the connections its answers are owed to, counted, for an orderly stop.
    let ready_at =
        tokio::time::Instant::from_std(started + Duration::from_millis(args.ready_after_ms));
    let mut held = held;
    let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (shutdown, shutting_down) = tokio::sync::watch::channel(false);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                serve_connection(stream, &args, &version, started);
            }
            accepted = async {
                match &held {
                    Some(held) => {
                        tokio::time::sleep_until(ready_at).await;
                        held.accept().await
                    }
                    None => std::future::pending().await,
                }
            } => {
                let Ok((stream, _)) = accepted else { continue };
                serve_held(stream, &args, &version, started, &open, shutting_down.clone());
            }
            _ = sigterm.recv() => {
                if args.ignore_sigterm {
                    eprintln!("sample-service: ignoring SIGTERM");
                } else if held.is_some() {
                    // Accepting stops (this process's copy of the socket closes; the socket
                    // lives on in its holder and the next release), the answers owed are given.
                    drop(held.take());
                    let _ = shutdown.send(true);
                    answer_what_is_owed(&open).await;
                    stopping();
                    return 0;
                } else {
                    eprintln!("sample-service: SIGTERM, exiting");
                    stopping();
                    return 0;
                }
            }
            _ = &mut exit => {
                if held.is_some() {
                    // A crash: what it had accepted and not answered is dropped.
                    eprintln!(
                        "sample-service: dropping {} accepted connection(s) unanswered",
                        open.load(std::sync::atomic::Ordering::SeqCst)
                    );
                }
                eprintln!("sample-service: exiting with status {} at {:.6}", args.exit_code, unix_now());
                stopping();
                return args.exit_code as u8;
            }
        }
    }
}

/// Resolves when `--exit-after-ms` has passed: since start, or since `--armed-by`'s file
/// appeared; never without `--exit-after-ms`.
async fn exit_due(args: &SampleArgs, started: Instant) {
    let Some(after) = args.exit_after_ms.map(Duration::from_millis) else {
        return std::future::pending().await;
    };
    let armed = match &args.armed_by {
        None => started,
        Some(file) => {
            while !file.exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Instant::now()
        }
    };
    tokio::time::sleep_until(tokio::time::Instant::from_std(armed + after)).await
}

/// Its port (`--port`, else `PORT`) and its listeners on 127.0.0.1 (one per thread with
/// `--threads`), or the exit code that says why not.
fn bind(args: &SampleArgs) -> Result<(u16, std::vec::IntoIter<std::net::TcpListener>), u8> {
    let port = args
        .port
        .or_else(|| std::env::var("PORT").ok().and_then(|p| p.parse().ok()));
    let Some(port) = port else {
        eprintln!("sample-service: set PORT or --port");
        return Err(2);
    };
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let bound = if args.threads > 1 {
        crate::proxy::reuseport_listeners(address, usize::from(args.threads))
    } else {
        std::net::TcpListener::bind(address)
            .and_then(|l| l.set_nonblocking(true).map(|()| vec![l]))
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {address}: {e}")))
    };
    match bound {
        Ok(listeners) => Ok((port, listeners.into_iter())),
        Err(e) => {
            eprintln!("sample-service: {e}");
            Err(3)
        }
    }
}

/// Serves `listener` on a thread of its own, for as long as the process lives.
fn serve_on_a_thread(
    listener: std::net::TcpListener,
    args: SampleArgs,
    version: String,
    started: Instant,
) {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        runtime.block_on(async move {
            let Ok(listener) = TcpListener::from_std(listener) else {
                return;
            };
            loop {
                if let Ok((stream, _)) = listener.accept().await {
                    serve_connection(stream, &args, &version, started);
                }
            }
        });
    });
}

/// Waits (up to 30 s) for the connections it accepted to be answered, and says how many were
/// left open.
async fn answer_what_is_owed(open: &std::sync::atomic::AtomicUsize) {
    let waited = Instant::now();
    while open.load(std::sync::atomic::Ordering::SeqCst) > 0
        && waited.elapsed() < Duration::from_secs(30)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!(
        "sample-service: SIGTERM, stopped accepting; exiting with {} connection(s) still open",
        open.load(std::sync::atomic::Ordering::SeqCst)
    );
}

/// The notify side of the service, as a `Type=notify` unit's service would speak it.
async fn notify(args: SampleArgs, started: Instant) {
    send_notification("STATUS=starting");
    if let Some(ms) = args.extend_timeout_ms {
        send_notification(&format!("EXTEND_TIMEOUT_USEC={}", ms * 1000));
    }
    tokio::time::sleep_until((started + Duration::from_millis(args.ready_after_ms)).into()).await;
    match args.notify_errno {
        Some(errno) => {
            send_notification(&format!("STATUS=failed to start\nERRNO={errno}"));
            eprintln!("sample-service: ERRNO={errno} sent at {:.6}", unix_now());
            return;
        }
        None => {
            send_notification(&format!("READY=1\nSTATUS={}", args.notify_status));
            // For benchmarks: when READY=1 was sent, in Unix seconds.
            eprintln!("sample-service: READY=1 sent at {:.6}", unix_now());
        }
    }
    let watchdog = std::env::var("WATCHDOG_USEC")
        .ok()
        .and_then(|us| us.parse::<u64>().ok())
        .filter(|us| *us > 0);
    let Some(watchdog) = watchdog else { return };
    let stops = args
        .watchdog_stops_after_ms
        .map(|ms| started + Duration::from_millis(ms));
    loop {
        tokio::time::sleep(Duration::from_micros(watchdog / 2)).await;
        if stops.is_some_and(|t| Instant::now() >= t) {
            eprintln!("sample-service: no more WATCHDOG=1 from {:.6}", unix_now());
            return;
        }
        send_notification("WATCHDOG=1");
    }
}

/// One datagram to $NOTIFY_SOCKET (`host::notify::tell_systemd`).
fn send_notification(message: &str) {
    if let Err(e) = crate::host::notify::tell_systemd(message) {
        eprintln!("sample-service: cannot notify: {e}");
    }
}

fn serve_connection(
    stream: tokio::net::TcpStream,
    args: &SampleArgs,
    version: &str,
    started: Instant,
) {
    let (args, version) = (args.clone(), version.to_string());
    tokio::spawn(async move {
        let service = service_fn(move |req| answer(req, args.clone(), version.clone(), started));
        let _ = http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .await;
    });
}

/// The socket handed over as fd 3, if the environment says it is meant for this process.
fn held_socket() -> Result<TcpListener, String> {
    let fds = std::env::var("LISTEN_FDS").unwrap_or_default();
    let pid = std::env::var("LISTEN_PID").unwrap_or_default();
    if fds != "1" {
        return Err(format!("LISTEN_FDS is {fds:?}, not 1"));
    }
    if pid != std::process::id().to_string() {
        return Err(format!(
            "LISTEN_PID is {pid:?}, not this process ({})",
            std::process::id()
        ));
    }
    use std::os::fd::FromRawFd;
    // SAFETY: LISTEN_FDS and LISTEN_PID say fd 3 was handed to this process for it to own.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(3) };
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("fd 3: {e}"))?;
    TcpListener::from_std(listener).map_err(|e| format!("fd 3: {e}"))
}

/// A connection from the held socket: counted while open, and closed after its answer once
/// the service stops (hyper's graceful shutdown), so no answer owed is lost. A connection that
/// has not had its first request read yet is not idle: its request may be in its socket
/// already (Go's `Shutdown` waits for such new connections too), so it is closed only after
/// its first answer, or once it has sent nothing for 5 s.
fn serve_held(
    stream: tokio::net::TcpStream,
    args: &SampleArgs,
    version: &str,
    started: Instant,
    open: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (args, version) = (args.clone(), version.to_string());
    let open = open.clone();
    open.fetch_add(1, Ordering::SeqCst);
    let answered = std::sync::Arc::new(AtomicBool::new(false));
    tokio::spawn(async move {
        let said = answered.clone();
        let service = service_fn(move |req| {
            let (args, version, said) = (args.clone(), version.clone(), said.clone());
            async move {
                let response = answer(req, args, version, started).await;
                said.store(true, Ordering::SeqCst);
                response
            }
        });
        let connection = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
        tokio::pin!(connection);
        let mut asked: Option<Instant> = None;
        let mut shut = false;
        loop {
            tokio::select! {
                _ = connection.as_mut() => break,
                changed = stopping.changed(), if asked.is_none() => {
                    if changed.is_err() || *stopping.borrow() {
                        asked = Some(Instant::now());
                    }
                }
                _ = tokio::time::sleep(Duration::from_millis(5)), if asked.is_some() && !shut => {
                    let waited = asked.map_or(Duration::ZERO, |t| t.elapsed());
                    if answered.load(Ordering::SeqCst) || waited > Duration::from_secs(5) {
                        connection.as_mut().graceful_shutdown();
                        shut = true;
                    }
                }
            }
        }
        open.fetch_sub(1, Ordering::SeqCst);
    });
}

/// Unix seconds at full precision: `journal::now` rounds to the millisecond, too coarse for the
/// deploy benchmark's ready -> rename figures.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    args: SampleArgs,
    version: String,
    started: Instant,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, body: String| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response
    };
    let wrong_host = args.ready_host.as_ref().is_some_and(|want| {
        req.headers()
            .get(hyper::header::HOST)
            .and_then(|h| h.to_str().ok())
            != Some(want.as_str())
    });
    let readiness = req.uri().path() == args.ready_path;
    Ok(match req {
        _ if readiness && wrong_host => reply(StatusCode::NOT_FOUND, "not this host\n".into()),
        _ if readiness => {
            if args.hang_readyz {
                std::future::pending::<()>().await;
            }
            let status = match args.readyz_status {
                Some(code) => {
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
                }
                None if a_hiccup(&args) => StatusCode::SERVICE_UNAVAILABLE,
                None if args
                    .unready_after_ms
                    .is_some_and(|ms| started.elapsed() >= Duration::from_millis(ms)) =>
                {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                None if started.elapsed() >= Duration::from_millis(args.ready_after_ms) => {
                    StatusCode::OK
                }
                None => StatusCode::SERVICE_UNAVAILABLE,
            };
            reply(status, format!("{}\n", status.as_u16()))
        }
        req => {
            // A real service reads the request body before it answers: one that answers first
            // and closes (as hyper does when the body has not arrived yet) makes its client's
            // body write fail. How many bytes came is said back, for tests of what reached it.
            let body_bytes = match body_length(req.into_body()).await {
                Ok(n) => n,
                Err(e) => {
                    return Ok(reply(
                        StatusCode::BAD_REQUEST,
                        format!("{version} could not read the request body: {e}\n"),
                    ))
                }
            };
            if args.work_us > 0 {
                let until = Instant::now() + Duration::from_micros(args.work_us);
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
            let cold = args.slow_for_ms.is_none_or(|ms| {
                FIRST_USER_REQUEST.get_or_init(Instant::now).elapsed() < Duration::from_millis(ms)
            });
            let delay = args.response_delay_ms + if cold { args.added_latency_ms } else { 0 };
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let n = USER_REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut response = if is_an_error(n, args.error_rate) {
                reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("{version} failed (--error-rate)\n"),
                )
            } else {
                reply(StatusCode::OK, format!("{version}\n"))
            };
            if body_bytes > 0 {
                response
                    .headers_mut()
                    .insert(REQUEST_BODY_BYTES, body_bytes.into());
            }
            response
        }
    })
}

/// When the first user request came (`--slow-for-ms` counts from it).
static FIRST_USER_REQUEST: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Said on an answer to a request that had a body: how many bytes of it the service read.
pub const REQUEST_BODY_BYTES: &str = "x-request-body-bytes";

/// Reads a request body to its end, keeping only its length.
async fn body_length(mut body: hyper::body::Incoming) -> Result<u64, hyper::Error> {
    use http_body_util::BodyExt;
    let mut length = 0u64;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            length += data.len() as u64;
        }
    }
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_rate_spreads_exactly_that_many_errors() {
        let errors = |rate: f64, n: u64| (0..n).filter(|i| is_an_error(*i, rate)).count();
        assert_eq!(errors(0.03, 100), 3);
        assert_eq!(errors(0.03, 1000), 30);
        assert_eq!(errors(0.0, 1000), 0);
        assert_eq!(errors(1.0, 10), 10);
        // Spread, not bunched: never two in a row at 3 %.
        assert!(!(0..1000).any(|i| is_an_error(i, 0.03) && is_an_error(i + 1, 0.03)));
    }
}
