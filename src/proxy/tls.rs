//! TLS on the proxy's front (issue 47): the connections that come in over `--tls-listen`, and
//! the plain-HTTP listener beside it that sends every request to https.
//!
//! - TLS 1.3 and 1.2 only (rustls offers nothing older), certificates by SNI from the store
//!   (`certs.rs`), the protocol by ALPN: `h2` is served by hyper's HTTP/2 server with bounded
//!   streams, headers and resets (CVE-2023-44487), `http/1.1` (or no ALPN) by the HTTP/1.1
//!   front end (`front.rs`), which hands what it does not serve itself to hyper. Either way each
//!   request goes to the releases as every request does: HTTP/1.1 over kept connections,
//!   counted per release.
//! - A handshake must finish within the header read timeout (a client that opens a connection
//!   and never finishes its hello holds a slot no longer than one that never sends a head).

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::header::{HeaderValue, HOST, LOCATION};
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio_rustls::rustls;

use super::certs::{Resolver, TlsError, ACME_TLS_ALPN};
use super::fate::{reason_of, Fate};
use super::forward;
use super::front;
use super::pass::Shared;
use super::rules;

pub const DEFAULT_NAME: &str = "default";

/// Most streams one HTTP/2 client may have open at once (nginx's `http2_max_concurrent_streams`
/// default).
const H2_MAX_STREAMS: u32 = 128;
/// Streams a client may reset before the server has accepted them, at once (hyper's default,
/// set here so it is a decision: the rapid-reset flood of CVE-2023-44487 ends in a GOAWAY).
const H2_MAX_PENDING_RESETS: usize = 20;
/// Resets the server itself may send on one connection before it closes it.
const H2_MAX_LOCAL_RESETS: usize = 1024;

/// rustls' server settings: TLS 1.3 and 1.2, certificates by SNI, ALPN h2 then http/1.1.
pub fn server_config(resolver: Arc<Resolver>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    // acme-tls/1 last: only a hello that offers it alone gets it (TLS-ALPN-01).
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec(), ACME_TLS_ALPN.to_vec()];
    Ok(Arc::new(config))
}

/// One TLS client connection: the handshake (bounded by the header read timeout), then HTTP/2
/// or HTTP/1.1 by what ALPN chose, until the client or the proxy ends it.
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    slot: OwnedSemaphorePermit,
    ctx: Arc<Shared>,
    acceptor: tokio_rustls::TlsAcceptor,
    resolver: Arc<Resolver>,
    hsts: bool,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let handshake = tokio::time::timeout(ctx.header_read_timeout, acceptor.accept(stream));
    // A proxy that handed its sockets over still finishes a handshake it began: the client
    // then gets its answer (and `Connection: close`) rather than a connection cut under it.
    let stopping = async {
        loop {
            if stop.changed().await.is_err() {
                return std::future::pending().await;
            }
            if !super::handover::successor_serves() {
                return;
            }
        }
    };
    let tls = tokio::select! {
        done = handshake => match done {
            Ok(Ok(tls)) => {
                resolver.count_handshake();
                tls
            }
            // A hello that never finished, an unknown name, a protocol below 1.2: nothing to
            // serve, and nothing to say over a connection that has no TLS; counted by why.
            Ok(Err(e)) => {
                resolver.count_failure(failure_reason(&e));
                return;
            }
            Err(_) => {
                resolver.count_failure("timeout");
                return;
            }
        },
        _ = stopping => return,
    };
    let alpn = tls.get_ref().1.alpn_protocol();
    if alpn == Some(ACME_TLS_ALPN) {
        // The validation is the handshake itself: nothing is served after it.
        return;
    }
    let h2 = alpn == Some(b"h2".as_slice());
    let sni = tls.get_ref().1.server_name().map(str::to_string);
    if !h2 {
        // HTTP/1.1: the path plain connections take (`front.rs`), hyper for what it does not
        // serve itself.
        let over = front::Over::Tls {
            sni: sni.map(|name| name.to_ascii_lowercase()),
            hsts,
        };
        return front::serve_over(tls, over, peer, slot, ctx, stop).await;
    }
    let client =
        Arc::new(forward::Client::new(peer, Arc::new(slot), &ctx).over_tls(sni.as_deref()));
    let service_ctx = ctx.clone();
    let service = service_fn(move |request| {
        forward::with_hsts(
            forward::handle(request, service_ctx.clone(), client.clone()),
            hsts,
        )
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(u32::try_from(ctx.max_header_bytes).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS)
        .max_local_error_reset_streams(H2_MAX_LOCAL_RESETS)
        .keep_alive_interval(None);
    let connection = builder.serve_connection(TokioIo::new(tls), service);
    serve_until_stopped!(connection, stop);
}

/// Why a handshake failed, in the words of [`HANDSHAKE_FAILURES`].
fn failure_reason(error: &std::io::Error) -> &'static str {
    match error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        // What rustls says when the resolver found no certificate for the name asked.
        Some(rustls::Error::General(why)) if why.contains("no server certificate") => {
            "unknown_name"
        }
        Some(rustls::Error::AlertReceived(_)) => "client_alert",
        Some(_) => "protocol",
        None => "closed",
    }
}

/// What the plain-HTTP side needs to send a request to https.
pub struct ToHttps {
    pub tls_port: u16,
    pub http01: super::acme::Http01Answers,
    /// The names https has a certificate for (or ACME will get one for).
    pub resolver: Arc<Resolver>,
    /// The serving thread's routes: where routes go by host, a host none takes is no site.
    pub shared: Arc<Shared>,
}

/// Where a plain-HTTP request goes: to https, or nowhere and why.
#[derive(Debug, PartialEq, Eq)]
enum Plain {
    /// 308 to this location.
    Https(String),
    /// 400: the Host header is no host (RFC 9112 §3.2).
    BadHost,
    /// 421: https would refuse this host (no certificate or route covers it).
    NotServed(String),
}

impl ToHttps {
    /// The answer to a request for `host` (its Host header, or the request target's
    /// authority) and `path`.
    fn answer(&self, host: Option<&[u8]>, path: &str) -> Plain {
        let Some(host) = host.filter(|h| is_host_header(h)) else {
            return Plain::BadHost;
        };
        let name = super::wire::host_name(host);
        let routed = self.shared.router.with(|r| r.has_host(name.as_bytes()));
        if !routed || !self.resolver.serves_name(&name) {
            return Plain::NotServed(name);
        }
        let shown = String::from_utf8_lossy(host);
        Plain::Https(https_location(
            host_without_port(&shown),
            self.tls_port,
            path,
        ))
    }
}

/// Whether a Host header is `uri-host [ ":" port ]` (RFC 9112 §3.2, RFC 3986 §3.2.2): a name of
/// unreserved, percent-encoded and sub-delimiter characters, or an IP literal in brackets, and
/// digits after a colon. Nothing else (no `/`, no `@`, not empty) is a host to redirect to.
fn is_host_header(host: &[u8]) -> bool {
    let (name, port) = match host.strip_prefix(b"[") {
        Some(v6) => match v6.iter().position(|b| *b == b']') {
            Some(end) => {
                let literal = &v6[..end];
                let ok = !literal.is_empty()
                    && literal
                        .iter()
                        .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
                if !ok {
                    return false;
                }
                (&b"x"[..], &v6[end + 1..])
            }
            None => return false,
        },
        None => match host.iter().position(|b| *b == b':') {
            Some(at) => (&host[..at], &host[at..]),
            None => (host, &b""[..]),
        },
    };
    let port_ok = port.is_empty()
        || (port[0] == b':' && port.len() <= 6 && port[1..].iter().all(u8::is_ascii_digit));
    let name_ok = !name.is_empty()
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(b));
    name_ok && port_ok
}

/// The plain listener's answer to `request` (its body is left for the caller to read away),
/// logged and counted on the request's route.
fn plain_answer(
    request: &hyper::Request<hyper::body::Incoming>,
    to_https: &ToHttps,
    http01: &super::acme::Http01Answers,
    peer: SocketAddr,
) -> Response<http_body_util::Full<bytes::Bytes>> {
    // ACME's HTTP-01: the key authorization of an open challenge, and nothing else.
    if let Some(token) = request
        .uri()
        .path()
        .strip_prefix(super::acme::HTTP01_PREFIX)
    {
        let answer = http01.lock().ok().and_then(|open| open.get(token).cloned());
        let response =
            match answer {
                Some(key_authorization) => Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/octet-stream")
                    .body(http_body_util::Full::new(bytes::Bytes::from(
                        key_authorization,
                    ))),
                None => Response::builder().status(StatusCode::NOT_FOUND).body(
                    http_body_util::Full::new(bytes::Bytes::from_static(b"no such challenge\n")),
                ),
            };
        return response
            .unwrap_or_else(|_| Response::new(http_body_util::Full::new(bytes::Bytes::new())));
    }
    let host = match request.headers().get(HOST) {
        Some(header) => Some(header.as_bytes()),
        None => request.uri().authority().map(|a| a.as_str().as_bytes()),
    };
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let plain_text = |status: StatusCode, text: String| {
        Response::builder()
            .status(status)
            .header("content-type", "text/plain; charset=utf-8")
            .body(http_body_util::Full::new(bytes::Bytes::from(text)))
    };
    let bad_host = || {
        plain_text(
            StatusCode::BAD_REQUEST,
            "bad request: the Host header is not a host name\n".into(),
        )
    };
    // The request's route (by host and path) logs and counts it as https's would: its line
    // is begun by the same rules (`rules::run`).
    let routed = host.and_then(|host| {
        let shared = &to_https.shared;
        let facts = rules::Facts {
            method: request.method().as_str(),
            target: &path,
            host: Some(host),
            request_id: request.headers().get("x-request-id").map(|v| v.as_bytes()),
            body: rules::Body::None,
            upgrade: false,
            sni: None,
        };
        let decided = shared
            .router
            .with(|router| rules::run(router, &facts, shared.thread, &mut Vec::new()));
        Some((decided.service?, decided.begun))
    });
    let response = match to_https.answer(host, &path) {
        Plain::Https(location) => match HeaderValue::from_str(&location) {
            Ok(value) => Response::builder()
                .status(StatusCode::PERMANENT_REDIRECT)
                .header(LOCATION, value)
                .header("content-type", "text/plain; charset=utf-8")
                .body(http_body_util::Full::new(bytes::Bytes::from(format!(
                    "this site is served over https: {location}\n"
                )))),
            Err(_) => bad_host(),
        },
        Plain::BadHost => bad_host(),
        Plain::NotServed(name) => plain_text(
            StatusCode::MISDIRECTED_REQUEST,
            format!("no site here for {name}: no certificate or route covers it, so it is not sent to https\n"),
        ),
    };
    let response =
        response.unwrap_or_else(|_| Response::new(http_body_util::Full::new(bytes::Bytes::new())));
    if let Some((service, begun)) = routed {
        let shared = &to_https.shared;
        let status = response.status().as_u16();
        let fate = Fate::Own(reason_of(status));
        if shared.counting {
            fate.count_on(&service.own_answers, shared.thread);
        }
        if let (Some(log), Some(begun)) = (&service.access, begun) {
            let bytes = hyper::body::Body::size_hint(response.body())
                .exact()
                .unwrap_or(0);
            begun.finish(log, shared.thread, (status, fate), bytes, None, peer.ip());
        }
    }
    response
}

/// A plain HTTP connection while TLS is on: every request for a host https serves is sent to
/// the same host and path over https with 308 (the method and body kept), on `tls_port` unless
/// it is 443; a Host that is no host gets 400, one https would refuse 421.
pub async fn redirect(
    stream: TcpStream,
    peer: SocketAddr,
    to_https: ToHttps,
    mut stop: watch::Receiver<bool>,
) {
    let header_read_timeout = to_https.shared.header_read_timeout;
    let http01 = to_https.http01.clone();
    let to_https = Arc::new(to_https);
    let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let (to_https, http01) = (to_https.clone(), http01.clone());
        async move {
            let response = plain_answer(&request, &to_https, &http01, peer);
            let (parts, full) = response.into_parts();
            let answer = Response::from_parts(parts, forward::Body::Plain(full));
            // A body no one reads is read away first (`drain.rs`): the connection is kept.
            let body = request.into_body();
            let answer = forward::leaving_the_body(answer, body, &to_https.shared, true).await;
            Ok::<_, std::convert::Infallible>(answer)
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    serve_until_stopped!(connection, stop);
}

/// `example.com:8080` -> `example.com`; `[::1]:80` -> `[::1]`.
fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..h.len() + 1]);
    }
    host.split(':').next().unwrap_or(host)
}

fn https_location(host: &str, tls_port: u16, path: &str) -> String {
    if tls_port == 443 {
        format!("https://{host}{path}")
    } else {
        format!("https://{host}:{tls_port}{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redirect_keeps_the_host_and_path_and_names_a_port_other_than_443() {
        assert_eq!(host_without_port("example.com:8080"), "example.com");
        assert_eq!(host_without_port("[::1]:80"), "[::1]");
        assert_eq!(host_without_port("example.com"), "example.com");
        assert_eq!(
            https_location("example.com", 443, "/a?b=1"),
            "https://example.com/a?b=1"
        );
        assert_eq!(
            https_location("example.com", 8443, "/"),
            "https://example.com:8443/"
        );
    }
}
