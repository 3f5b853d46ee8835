//! `rollgate sample-service`: a small HTTP service with knobs, used by the tests, the demo and
//! the lab to stand in for a real release. Hidden from `--help`.
//!
//! It listens on `127.0.0.1:$PORT`, answers `GET /` with its version (`$ROLLGATE_VERSION`) and
//! `GET /readyz` with 200 once ready (503 before), and can be told to misbehave.

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
    /// Port to listen on (default: $PORT).
    #[arg(long)]
    pub port: Option<u16>,
}

pub fn run(args: SampleArgs) -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(serve(args))
}

async fn serve(args: SampleArgs) -> std::process::ExitCode {
    let started = Instant::now();
    if args.exit_after_ms == Some(0) {
        eprintln!(
            "sample-service: exiting at boot with status {}",
            args.exit_code
        );
        return std::process::ExitCode::from(args.exit_code as u8);
    }
    let port = args
        .port
        .or_else(|| std::env::var("PORT").ok().and_then(|p| p.parse().ok()));
    let Some(port) = port else {
        eprintln!("sample-service: set PORT or --port");
        return std::process::ExitCode::from(2);
    };
    let version = std::env::var("ROLLGATE_VERSION").unwrap_or_else(|_| "unknown".into());
    let listener = match TcpListener::bind(("127.0.0.1", port)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sample-service: cannot listen on 127.0.0.1:{port}: {e}");
            return std::process::ExitCode::from(3);
        }
    };
    eprintln!("sample-service {version}: listening on 127.0.0.1:{port}");
    if args.readyz_status.is_none() && !args.hang_readyz {
        // For benchmarks: when /readyz starts answering 200, in Unix seconds.
        eprintln!(
            "sample-service: ready from {:.6}",
            unix_now() + args.ready_after_ms as f64 / 1000.0
        );
    }

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    let exit_at = args
        .exit_after_ms
        .map(|ms| tokio::time::Instant::from_std(started + Duration::from_millis(ms)));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let args = args.clone();
                let version = version.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| answer(req, args.clone(), version.clone(), started));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
            _ = sigterm.recv() => {
                if args.ignore_sigterm {
                    eprintln!("sample-service: ignoring SIGTERM");
                } else {
                    eprintln!("sample-service: SIGTERM, exiting");
                    return std::process::ExitCode::SUCCESS;
                }
            }
            _ = async { match exit_at { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {
                eprintln!("sample-service: exiting with status {} at {:.6}", args.exit_code, unix_now());
                return std::process::ExitCode::from(args.exit_code as u8);
            }
        }
    }
}

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
    Ok(match req.uri().path() {
        "/readyz" => {
            if args.hang_readyz {
                std::future::pending::<()>().await;
            }
            let status = match args.readyz_status {
                Some(code) => {
                    StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
                }
                None if started.elapsed() >= Duration::from_millis(args.ready_after_ms) => {
                    StatusCode::OK
                }
                None => StatusCode::SERVICE_UNAVAILABLE,
            };
            reply(status, format!("{}\n", status.as_u16()))
        }
        _ => {
            if args.response_delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(args.response_delay_ms)).await;
            }
            reply(StatusCode::OK, format!("{version}\n"))
        }
    })
}
