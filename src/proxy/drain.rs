//! The drain handshake between the deployer and a proxy serving the same root.
//!
//! The proxy listens on the Unix socket `ROOT/proxy.sock`. After switching `current`, the
//! deployer connects and sends one line, `drain <old-port>\n`. The proxy re-reads the pointer
//! (so it has switched too), waits until no request is in flight to the release it retired on
//! that port, and answers `drained <old-port> <waited-ms>\n`. Only then does the deployer send
//! SIGTERM to the old release. No socket (or nobody listening) means no proxy: nothing to wait
//! for. The deployer gives up after its drain timeout and stops the old release anyway.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;

use super::routes::Routes;
use super::watch::refresh;
use crate::deploy::state::Root;

pub const SOCKET_FILE: &str = "proxy.sock";

pub fn socket_path(root: &Path) -> PathBuf {
    root.join(SOCKET_FILE)
}

/// What the deployer learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drain {
    NoProxy,
    Drained(Duration),
    TimedOut(Duration),
    Failed(String),
}

impl std::fmt::Display for Drain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Drain::NoProxy => write!(f, "no proxy"),
            Drain::Drained(d) => write!(f, "proxy drained it in {} ms", d.as_millis()),
            Drain::TimedOut(d) => write!(
                f,
                "proxy still draining after {} ms (drain timeout)",
                d.as_millis()
            ),
            Drain::Failed(why) => write!(f, "proxy drain failed ({why})"),
        }
    }
}

/// Deployer side: asks the proxy (if any) to drain `port`, waiting at most `timeout`.
pub async fn request(root: &Path, port: u16, timeout: Duration) -> Drain {
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
        write
            .write_all(format!("drain {port}\n").as_bytes())
            .await?;
        let mut line = String::new();
        BufReader::new(read).read_line(&mut line).await?;
        Ok::<String, std::io::Error>(line)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Drain::TimedOut(timeout),
        Ok(Err(e)) => Drain::Failed(e.to_string()),
        Ok(Ok(line)) => match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["drained", _, ms] => Drain::Drained(Duration::from_millis(ms.parse().unwrap_or(0))),
            _ => Drain::Failed(format!("unexpected answer {:?}", line.trim())),
        },
    }
}

/// Proxy side: binds the socket, refusing if another proxy already answers on it.
pub async fn listen(root: &Path) -> Result<UnixListener, String> {
    let path = socket_path(root);
    if UnixStream::connect(&path).await.is_ok() {
        return Err(format!(
            "another proxy already serves this root ({} answers)",
            path.display()
        ));
    }
    let _ = std::fs::remove_file(&path);
    UnixListener::bind(&path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))
}

/// Proxy side: answers drain requests until the listener is dropped.
pub async fn serve(listener: UnixListener, root: Root, routes: Arc<Routes>, switched: Arc<Notify>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (root, routes, switched) = (root.clone(), routes.clone(), switched.clone());
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            if BufReader::new(read).read_line(&mut line).await.is_err() {
                return;
            }
            let answer = match line.split_whitespace().collect::<Vec<_>>()[..] {
                ["drain", port] => match port.parse::<u16>() {
                    Ok(port) => {
                        refresh(&root, &routes);
                        switched.notify_one();
                        let started = Instant::now();
                        for target in routes.retired_on(port) {
                            target.drained().await;
                        }
                        format!("drained {port} {}\n", started.elapsed().as_millis())
                    }
                    Err(_) => "error bad port\n".to_string(),
                },
                _ => "error expected `drain <port>`\n".to_string(),
            };
            let _ = write.write_all(answer.as_bytes()).await;
        });
    }
}
