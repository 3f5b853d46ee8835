//! The readiness probe: `GET /readyz` on 127.0.0.1 with hyper, bounded by a timeout so a probe
//! that hangs never stretches the deadline.

use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::plan::Probe;

pub async fn readyz(port: u16, timeout: Duration) -> Probe {
    match tokio::time::timeout(timeout, request(port)).await {
        Ok(result) => result,
        Err(_) => Probe::TimedOut(timeout),
    }
}

async fn request(port: u16) -> Probe {
    let stream = match TcpStream::connect(("127.0.0.1", port)).await {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Probe::Refused,
        Err(e) => return Probe::Failed(format!("connect: {e}")),
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
            Ok(pair) => pair,
            Err(e) => return Probe::Failed(format!("handshake: {e}")),
        };
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get("/readyz")
        .header(hyper::header::HOST, format!("127.0.0.1:{port}"))
        .header(hyper::header::USER_AGENT, "rollgate")
        .body(Empty::<Bytes>::new())
        .expect("static request");
    let result = match sender.send_request(request).await {
        Ok(response) => Probe::Status(response.status().as_u16()),
        Err(e) => Probe::Failed(format!("request: {e}")),
    };
    driver.abort();
    result
}
