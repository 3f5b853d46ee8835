//! `rollgate proxy`: an HTTP/1.1 reverse proxy in front of the live release, so a switch costs
//! users no failed request. It forwards each request to the release `current` names, follows a
//! switch at once, lets requests already sent to the old release finish, and tells the deployer
//! (over `ROOT/proxy.sock`, see `drain.rs`) when the old release has drained.

pub mod drain;
mod forward;
mod routes;
mod watch;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::HeaderName;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{Notify, Semaphore};

use crate::deploy::state::Root;
use forward::Shared;
use routes::Routes;

/// Limits and knobs, each with a documented default.
#[derive(Debug, Clone)]
pub struct Options {
    pub listen: SocketAddr,
    pub root: std::path::PathBuf,
    /// Response header naming the release that answered (off by default).
    pub version_header: Option<String>,
    /// Connections served at once; further clients wait in the kernel's accept queue.
    pub max_connections: usize,
    /// A client must send a request's headers within this (slowloris); it also closes a
    /// keep-alive connection that stays idle this long.
    pub header_read_timeout: Duration,
    /// Largest request head accepted; larger gets 431.
    pub max_header_bytes: usize,
    /// Idle pooled connections to releases are closed after this.
    pub upstream_idle: Duration,
}

pub fn run(options: Options) -> Result<(), String> {
    let version_header = options
        .version_header
        .as_deref()
        .map(|name| {
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("`{name}` is not a valid header name"))
        })
        .transpose()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    runtime.block_on(serve(options, version_header))
}

async fn serve(options: Options, version_header: Option<HeaderName>) -> Result<(), String> {
    let root = Root::new(options.root.clone());
    if !root.0.is_dir() {
        return Err(format!("root {} is not a folder", root.0.display()));
    }
    let listener = TcpListener::bind(options.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", options.listen))?;
    let drain_socket = drain::listen(&root.0).await?;

    let routes = Arc::new(Routes::default());
    watch::refresh(&root, &routes);
    let reread = Arc::new(Notify::new());
    tokio::spawn(watch::follow(root.clone(), routes.clone(), reread.clone()));
    tokio::spawn(drain::serve(
        drain_socket,
        root.clone(),
        routes.clone(),
        reread,
    ));

    let mut upstream = Client::builder(TokioExecutor::new());
    upstream
        .pool_idle_timeout(options.upstream_idle)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new());
    let shared = Arc::new(Shared {
        routes: routes.clone(),
        client: upstream.build({
            let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
            // Small requests and answers: do not let Nagle hold them back.
            connector.set_nodelay(true);
            connector
        }),
        version_header,
        root: root.0.display().to_string(),
    });
    eprintln!(
        "rollgate proxy: listening on {} for {} ({})",
        listener.local_addr().map_or(options.listen, |a| a),
        root.0.display(),
        match routes.current() {
            Some(t) => format!("live: {} on port {}", t.version, t.port),
            None => "nothing live yet".into(),
        }
    );

    let slots = Arc::new(Semaphore::new(options.max_connections));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("semaphore open"),
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(_) => continue,
            },
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let mut stop = stop_rx.clone();
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(options.header_read_timeout)
            .max_buf_size(options.max_header_bytes.max(8192))
            .keep_alive(true);
        connections.spawn(async move {
            let _permit = permit;
            let service = service_fn(move |request| forward::handle(request, peer, shared.clone()));
            let connection = builder
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stop.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
        // Reap finished connection tasks as we go.
        while connections.try_join_next().is_some() {}
    }
    eprintln!(
        "rollgate proxy: stopping; finishing {} connection(s)",
        connections.len()
    );
    drop(listener);
    let _ = stop_tx.send(true);
    while connections.join_next().await.is_some() {}
    let _ = std::fs::remove_file(drain::socket_path(&root.0));
    eprintln!("rollgate proxy: stopped");
    Ok(())
}
