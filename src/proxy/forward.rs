//! One request on a connection hyper serves (one `front.rs` handed over: a request with a body,
//! an upgrade, HTTP/1.0, a head hyper refuses): lease the live release, forward with the usual
//! proxy headers through hyper's client, stream the answer back, and keep the lease until the
//! last byte of the body has gone. The rules (`rules.rs`: route, body limit, prefix, retry
//! safety, the forwarding headers, rollgate's own answers) are the same as on `front`'s path.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::{Either, Full};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::header::{
    HeaderName, HeaderValue, CONNECTION, HOST, STRICT_TRANSPORT_SECURITY, UPGRADE,
};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use super::access::{self, AccessLog};
use super::counts::{Cut, Reason};
use super::drain::{Drained, Settled, DRAIN_WAIT};
use super::failure::Failure;
use super::fate::Fate;
use super::idle::{BoxError, IdleBody, IdleTimeout};
use super::leases::{Lease, View};
use super::pass::{self, Outcome, Shared};
use super::rules;
use super::service::Service;
use super::upstream::{self, UpstreamBody, Upstreams};
use super::wire::HSTS;

/// One client connection: where it comes from, its share of `--max-connections`, and what
/// its requests reuse (its view of the routing table, its connections to releases).
pub struct Client {
    peer: SocketAddr,
    /// An upgraded tunnel keeps it, so tunnels count against the limit while they are open.
    slot: Arc<tokio::sync::OwnedSemaphorePermit>,
    reused: std::sync::Mutex<Reused>,
    /// How long a write to the client may take nothing (ms): the body idle time, the tunnel's
    /// once upgraded (read by the connection's IO, `front::Prefixed`).
    pub write_idle: Arc<std::sync::atomic::AtomicU64>,
    /// The client came over TLS: the release is told `X-Forwarded-Proto: https`.
    tls: bool,
    /// The name the client's TLS hello asked for (SNI): with routes by host, a request for
    /// another host on this connection is misdirected (421).
    sni: Option<String>,
}

struct Reused {
    /// A view of each service's table this connection sent to, by service id.
    views: Vec<(u64, View)>,
    upstreams: Upstreams,
}

impl Client {
    pub fn new(
        peer: SocketAddr,
        slot: Arc<tokio::sync::OwnedSemaphorePermit>,
        shared: &Shared,
    ) -> Client {
        Client {
            peer,
            slot,
            reused: std::sync::Mutex::new(Reused {
                views: Vec::new(),
                upstreams: Upstreams::new(shared.idle.clone()),
            }),
            write_idle: Arc::new(std::sync::atomic::AtomicU64::new(millis(shared.body_idle))),
            tls: false,
            sni: None,
        }
    }

    /// The same client, over TLS with the name its hello asked for.
    pub fn over_tls(mut self, sni: Option<&str>) -> Client {
        self.tls = true;
        self.sni = sni.map(str::to_ascii_lowercase);
        self
    }
}

/// The answer's body: rollgate's own words, nothing, or a release's answer under its lease.
pub enum Body {
    Plain(Full<Bytes>),
    Empty,
    Leased(Leased),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Every variant is Unpin (the idle timer is boxed).
        match self.get_mut() {
            Body::Plain(full) => Pin::new(full)
                .poll_frame(cx)
                .map_err(|never| match never {}),
            Body::Empty => Poll::Ready(None),
            Body::Leased(leased) => {
                let polled = Pin::new(&mut leased.body).poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let (Some(line), Some(data)) = (&mut leased.line, frame.data_ref()) {
                            line.bytes += data.len() as u64;
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        leased.broke = Some(match e.is::<IdleTimeout>() {
                            true => Cut::UpstreamTimeout,
                            false => Cut::UpstreamReset,
                        });
                    }
                    Poll::Ready(None) => leased.ended = true,
                    Poll::Pending => {}
                }
                polled
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Plain(full) => full.is_end_stream(),
            Body::Empty => true,
            Body::Leased(leased) => leased.body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Body::Plain(full) => full.size_hint(),
            Body::Empty => hyper::body::SizeHint::with_exact(0),
            Body::Leased(leased) => leased.body.size_hint(),
        }
    }
}

/// An answer's hop-by-hop headers out, by the rule requests follow (`rules::is_hop_by_hop`).
fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    let named = named_in_connection(headers);
    let named: Vec<&[u8]> = named.iter().map(|n| n.as_str().as_bytes()).collect();
    rules::Head::drop_where(&mut InMap(headers), |name| {
        rules::is_hop_by_hop(name, &named)
    });
}

fn is_upgrade(headers: &hyper::HeaderMap) -> bool {
    headers.contains_key(UPGRADE)
        && headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// Serves one request of `client`'s connection.
// Long on purpose: the one request path every user request takes, read top to bottom in the
// order it happens (origin form, limits, route, headers, forward, fallback, answer); the
// profile (BENCHMARKS, issue 40) is read against it, and each step is a few lines.
pub async fn handle(
    request: Request<Incoming>,
    ctx: Arc<Shared>,
    client: Arc<Client>,
) -> Result<Response<Body>, Infallible> {
    let mut abandoned = Abandoned {
        routed: None,
        thread: ctx.thread,
        counting: ctx.counting,
        client: client.peer.ip(),
    };
    let (response, ended) = answer(request, &ctx, &client, &mut abandoned.routed).await;
    let Some((service, begun)) = abandoned.routed.take() else {
        return Ok(response);
    };
    // A release's answer is counted on it as its body ends (`Leased`); the others now.
    let status = response.status().as_u16();
    let (parts, body) = response.into_parts();
    let body = match body {
        Body::Leased(mut leased) => {
            if let (Some(log), Some(begun)) = (service.access.clone(), begun) {
                leased.line = Some(Box::new(Pending {
                    log,
                    begun,
                    status,
                    client: client.peer.ip(),
                    bytes: 0,
                }));
            }
            Body::Leased(leased)
        }
        other => {
            if ctx.counting {
                ended.fate.count_on(&service.own_answers, ctx.thread);
            }
            if let (Some(log), Some(begun)) = (&service.access, begun) {
                let bytes = hyper::body::Body::size_hint(&other).exact().unwrap_or(0);
                let release = ended.release.as_ref().map(|(v, s)| (v.as_bytes(), *s));
                begun.finish(
                    log,
                    ctx.thread,
                    (status, ended.fate),
                    bytes,
                    release,
                    client.peer.ip(),
                );
            }
            other
        }
    };
    Ok(Response::from_parts(parts, body))
}

/// How [`answer`] ended a request whose answer is not a release's body (`Leased` decides its
/// own): its fate, and the release its line names.
struct Ended {
    fate: Fate,
    release: Option<(String, u16)>,
}

impl Ended {
    fn own(own: &rules::Own) -> Ended {
        Ended {
            fate: Fate::Own(own.reason),
            release: None,
        }
    }
}

/// Own answers, and the fate each ends its request with.
fn own_ended(own: rules::Own) -> (Response<Body>, Ended) {
    let ended = Ended::own(&own);
    (own_answer(own), ended)
}

/// The status a request's line says when its client left before the answer's head (nginx's
/// 499, "client closed request"): the client's doing, not the release's.
pub const CLIENT_CLOSED: u16 = 499;

/// A request being answered, whose line is written even if its client leaves first: hyper drops
/// the request's future when an HTTP/1 client closes its connection or an HTTP/2 client resets
/// its stream, and the line that [`handle`] would have written after the answer was lost with
/// it. Dropped with its line still here, it writes it, status [`CLIENT_CLOSED`].
struct Abandoned {
    /// The request's service and its line's start (when its route logs), once routed.
    routed: Option<Routed>,
    thread: usize,
    counting: bool,
    client: std::net::IpAddr,
}

type Routed = (Arc<Service>, Option<Box<access::Begun>>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some((service, begun)) = self.routed.take() else {
            return;
        };
        let fate = Fate::Own(Reason::ClientClosed);
        if self.counting {
            fate.count_on(&service.own_answers, self.thread);
        }
        if let (Some(log), Some(begun)) = (&service.access, begun) {
            begun.finish(
                log,
                self.thread,
                (CLIENT_CLOSED, fate),
                0,
                None,
                self.client,
            );
        }
    }
}

/// A request's access log line, waiting for the end of its answer's body.
pub struct Pending {
    log: Arc<AccessLog>,
    begun: Box<access::Begun>,
    status: u16,
    client: std::net::IpAddr,
    bytes: u64,
}

/// [`handle`] but for the access log line and the count of how it ended; `routed` gets the
/// service and the line's start (when the route logs) once a route takes the request.
async fn answer(
    request: Request<Incoming>,
    ctx: &Arc<Shared>,
    client: &Arc<Client>,
    routed: &mut Option<Routed>,
) -> (Response<Body>, Ended) {
    let mut request = request;
    let upgrade = is_upgrade(request.headers());
    let upgrade_value = request.headers().get(UPGRADE).cloned();
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut request));
    // Asked before the request is put in the release's form (HTTP/1.1, whatever it came in).
    let http1 = request.version() < hyper::Version::HTTP_2;
    if let Err(refused) = in_the_releases_form(&mut request) {
        return own_ended(refused);
    }
    // The rules (`rules.rs`): route, body limit, prefix, retry safety.
    let decided = decide(&request, ctx, client, upgrade);
    if let Some(service) = decided.service {
        *routed = Some((service, decided.begun));
    }
    let passage = match decided.verdict {
        Ok(passage) => passage,
        Err(own) => {
            let ended = Ended::own(&own);
            if own.refuses_the_body() {
                if !http1 {
                    return (refusing(own, request.into_body(), ctx), ended);
                }
                // Read (and thrown away) first: see `read_whole`.
                let _ = read_whole(request.into_body(), 0, ctx.body_idle, true).await;
                return (own_answer(own), ended);
            }
            let answer = leaving_the_body(own_answer(own), request.into_body(), ctx, http1).await;
            return (answer, ended);
        }
    };
    if let Some(path) = passage.target.and_then(|p| p.parse::<hyper::Uri>().ok()) {
        *request.uri_mut() = path;
    }
    let wants_json = || {
        request
            .headers()
            .get_all(hyper::header::ACCEPT)
            .iter()
            .any(|v| super::traffic::wants_json(v.as_bytes()))
    };
    if let Some(refusal) = pass::gate(&passage.service, wants_json).await {
        let (answer, ended) = own_ended(refusal.into());
        return (
            leaving_the_body(answer, request.into_body(), ctx, http1).await,
            ended,
        );
    }
    for_the_release(request.headers_mut(), ctx, client, upgrade_value);
    let (parts, body) = request.into_parts();
    let mut settled = None;
    let body = match passage.body_limit {
        None => {
            let (body, watch) = Drained::new(IdleBody::new(body, ctx.body_idle, "request body"));
            settled = Some(watch);
            Either::Left(body)
        }
        Some(limit) => match read_whole(body, limit, ctx.body_idle, http1).await {
            Ok(whole) => Either::Right(Full::new(whole)),
            Err(Refused::TooLarge(Some(rest))) => {
                let own = rules::too_large(limit);
                let ended = Ended::own(&own);
                return (refusing(own, rest, ctx), ended);
            }
            Err(Refused::TooLarge(None)) => return own_ended(rules::too_large(limit)),
            Err(Refused::Broken) => {
                let words = "bad request: the body did not arrive whole".to_string();
                return own_ended(rules::Own::text(StatusCode::BAD_REQUEST, words));
            }
        },
    };
    let (service, replay) = (passage.service, passage.replay);
    let mut sender = Forwarding {
        client,
        kept: None,
        head: Some(parts),
        body: Some(body),
        again: replay.again,
        settled: settled.clone(),
    };
    let (lease, response) = match pass::to_a_release(ctx, &service, &mut sender, replay).await {
        Outcome::Answered(lease, response) => (lease, response),
        Outcome::Own(own, failed) => {
            let ended = match failed {
                Some(failed) => Ended {
                    fate: Fate::Unanswered(failed.miss),
                    release: Some((failed.version, failed.slot)),
                },
                None => Ended::own(&own),
            };
            return (told_if_unkept(own_answer(own), settled, http1).await, ended);
        }
    };
    // A tunnel's line is written as it opens (its release answered 101).
    let ended = Ended {
        fate: Fate::Answered,
        release: Some((lease.target.version.clone(), lease.target.slot)),
    };
    match client_upgrade {
        Some(client_upgrade) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
            (tunnel(response, client_upgrade, lease, ctx, client), ended)
        }
        _ => {
            let answer = leased(response, lease, ctx);
            (told_if_unkept(answer, settled, http1).await, ended)
        }
    }
}

/// rollgate's own `answer` to a request whose body no release reads (a redirect to HTTPS, a 503
/// in maintenance): the body is read to its end and thrown away meanwhile, as a release's
/// unread rest is (`drain.rs`), so the connection is kept — or said to close.
pub(super) async fn leaving_the_body(
    answer: Response<Body>,
    body: Incoming,
    ctx: &Shared,
    http1: bool,
) -> Response<Body> {
    let (body, settled) = Drained::new(IdleBody::new(body, ctx.body_idle, "request body"));
    drop(body);
    told_if_unkept(answer, Some(settled), http1).await
}

/// `answer`, saying `Connection: close` when its request's body was not read to its end (see
/// `drain.rs`): a kept HTTP/1 connection is never closed under a client that was not told.
async fn told_if_unkept(
    mut answer: Response<Body>,
    settled: Option<Settled>,
    http1: bool,
) -> Response<Body> {
    if let Some(settled) = settled.filter(|_| http1) {
        if !settled.keeps_the_connection(DRAIN_WAIT).await {
            answer
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
    }
    answer
}

/// The request as the release is spoken to: HTTP/1.1, where Host names the host (an HTTP/2
/// request names it in `:authority`), and the origin form (`/path?query`) of the target (a
/// client's absolute form, `GET http://host/path`, is cut down to it). Err: the 400 to answer.
fn in_the_releases_form(request: &mut Request<Incoming>) -> Result<(), rules::Own> {
    if request.version() == hyper::Version::HTTP_2 {
        *request.version_mut() = hyper::Version::HTTP_11;
        let authority = request
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok());
        if let Some(authority) = authority {
            request.headers_mut().entry(HOST).or_insert(authority);
        }
    }
    if request.uri().scheme().is_some() || request.uri().authority().is_some() {
        let origin = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse::<hyper::Uri>();
        match origin {
            Ok(origin) => *request.uri_mut() = origin,
            Err(_) => {
                let words = "bad request target".to_string();
                return Err(rules::Own::text(StatusCode::BAD_REQUEST, words));
            }
        }
    }
    Ok(())
}

/// The chain's verdict on this request (`rules.rs`), from its facts.
fn decide(
    request: &Request<Incoming>,
    ctx: &Shared,
    client: &Client,
    upgrade: bool,
) -> rules::Decided {
    let headers = request.headers();
    let body = match hyper::body::Body::size_hint(request.body()).exact() {
        Some(0) => rules::Body::None,
        Some(length) => rules::Body::Length(length),
        None => rules::Body::Unknown,
    };
    let facts = rules::Facts {
        method: request.method().as_str(),
        target: request.uri().path_and_query().map_or("/", |p| p.as_str()),
        host: headers.get(HOST).map(HeaderValue::as_bytes),
        request_id: headers.get("x-request-id").map(HeaderValue::as_bytes),
        body,
        upgrade,
        sni: client.sni.as_deref(),
    };
    ctx.router
        .with(|router| rules::run(router, &facts, ctx.thread, &mut Vec::with_capacity(256)))
}

/// How much of a refused body is read and thrown away before the 413 is sent: an HTTP/2
/// client still sending would otherwise see its stream reset instead of the answer (curl:
/// "Stream error in the HTTP/2 framing layer"); past this, the answer goes anyway.
const DISCARDED_AT_MOST: u64 = 1 << 20;

/// Why [`read_whole`] gave no body.
enum Refused {
    /// Past the limit; over HTTP/2, the rest of the stream (answered at once, read away beside
    /// the answer: [`refusing`]), over HTTP/1 read on and thrown away first.
    TooLarge(Option<Incoming>),
    /// It broke off or stalled.
    Broken,
}

/// A request body read whole if it is at most `limit` bytes — for one of unknown length
/// (chunked, an HTTP/2 stream without `content-length`) held to the route's limit before any
/// of it goes on. Past the limit, over HTTP/1 (`http1`) the rest is read on and thrown away, up
/// to [`DISCARDED_AT_MOST`], so the client reads the 413 rather than a write error.
async fn read_whole(
    body: Incoming,
    limit: u64,
    idle: Duration,
    http1: bool,
) -> Result<Bytes, Refused> {
    use http_body_util::BodyExt;
    let mut body = IdleBody::new(body, idle, "request body");
    let mut whole = bytes::BytesMut::new();
    let mut read = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| Refused::Broken)?.into_data() else {
            continue;
        };
        read += data.len() as u64;
        if read <= limit {
            whole.extend_from_slice(&data);
        } else if !http1 {
            return Err(Refused::TooLarge(Some(body.into_inner())));
        } else if read > limit + DISCARDED_AT_MOST {
            return Err(Refused::TooLarge(None));
        }
    }
    match read <= limit {
        true => Ok(whole.freeze()),
        false => Err(Refused::TooLarge(None)),
    }
}

/// rollgate's `own` answer to an HTTP/2 request whose `body` it will not read: sent at once,
/// while the rest of the body is read and thrown away beside it (`drain::discard`), so the
/// stream ends cleanly. Dropped unread, the body reset the stream under the answer (curl:
/// "Stream error in the HTTP/2 framing layer", no 413).
fn refusing(own: rules::Own, body: Incoming, ctx: &Shared) -> Response<Body> {
    super::drain::discard(IdleBody::new(body, ctx.body_idle, "request body"));
    own_answer(own)
}

/// rollgate's own answer, as hyper sends it.
fn own_answer(own: rules::Own) -> Response<Body> {
    let mut response = Response::new(Body::Plain(Full::new(Bytes::from(own.body))));
    *response.status_mut() = own.status;
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(own.content_type),
    );
    if let Some(seconds) = own.retry_after {
        headers.insert(hyper::header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// The head the release is sent, by the forwarding rules (`rules::rewrite_head`).
fn for_the_release(
    headers: &mut hyper::HeaderMap,
    ctx: &Shared,
    client: &Client,
    upgrade: Option<HeaderValue>,
) {
    let forwarded_for = headers.get(rules::FORWARDED_FOR).cloned();
    let named = named_in_connection(headers);
    let named: Vec<&[u8]> = named.iter().map(|n| n.as_str().as_bytes()).collect();
    let facts = rules::Client {
        peer: client.peer.ip(),
        tls: client.tls,
        forwarded_for: forwarded_for.as_ref().map(HeaderValue::as_bytes),
        trust_forwarded: ctx.trust_forwarded,
        has_host: headers.contains_key(HOST),
        named: &named,
        upgrade: upgrade.as_ref().map(HeaderValue::as_bytes),
    };
    rules::rewrite_head(&mut InMap(headers), &facts);
}

/// The headers a message's `Connection` names, as names.
fn named_in_connection(headers: &hyper::HeaderMap) -> Vec<HeaderName> {
    let values = headers
        .get_all(CONNECTION)
        .iter()
        .map(HeaderValue::as_bytes);
    rules::connection_named(values)
        .into_iter()
        .filter_map(|name| HeaderName::from_bytes(name).ok())
        .collect()
}

/// A head in hyper's map, rewritten in place.
struct InMap<'m>(&'m mut hyper::HeaderMap);

impl rules::Head for InMap<'_> {
    fn drop_where(&mut self, dropped: impl Fn(&[u8]) -> bool) {
        // Most messages carry none of them: one look before any allocation.
        if !self.0.keys().any(|n| dropped(n.as_str().as_bytes())) {
            return;
        }
        let names: Vec<HeaderName> = self
            .0
            .keys()
            .filter(|n| dropped(n.as_str().as_bytes()))
            .cloned()
            .collect();
        for name in names {
            self.0.remove(name);
        }
    }

    fn add(&mut self, name: &'static str, value: impl FnOnce(&mut Vec<u8>)) {
        let mut bytes = Vec::with_capacity(40);
        value(&mut bytes);
        if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(bytes)) {
            self.0.append(HeaderName::from_static(name), value);
        }
    }
}

/// A release's 101 to an upgrade: the client is told it, and the two upgraded connections are
/// joined in a task of their own (`tunnel.rs`), which holds the lease and the connection's slot
/// as long as the tunnel is open.
fn tunnel(
    mut response: Response<Incoming>,
    client_upgrade: hyper::upgrade::OnUpgrade,
    lease: Lease,
    ctx: &Shared,
    client: &Client,
) -> Response<Body> {
    let upstream_upgrade = hyper::upgrade::on(&mut response);
    let idle = ctx.tunnel_idle;
    // A tunnel is idle only when nothing moves either way (`tunnel_idle`), not when one write
    // waits for the body idle time.
    client
        .write_idle
        .store(millis(idle), std::sync::atomic::Ordering::Relaxed);
    let slot = client.slot.clone();
    let websocket = response
        .headers()
        .get(UPGRADE)
        .is_some_and(|u| u.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let tunnels = ctx.tunnels.clone();
    let target = lease.target.clone();
    tokio::spawn(async move {
        // The lease and the connection slot live as long as the tunnel.
        let _lease = lease;
        let _slot = slot;
        if let (Ok(client), Ok(upstream)) = (client_upgrade.await, upstream_upgrade.await) {
            let (client, upstream) = (TokioIo::new(client), TokioIo::new(upstream));
            let sent_away = target.tunnels_sent_away();
            super::tunnel::join(client, upstream, websocket, idle, tunnels, sent_away).await;
        }
    });
    let (parts, _) = response.into_parts();
    Response::from_parts(parts, Body::Empty)
}

/// The release's answer for the client: hop-by-hop headers out (a 101 keeps its own), the
/// version header in, and a body that holds the lease until it has been sent.
fn leased(response: Response<Incoming>, lease: Lease, ctx: &Shared) -> Response<Body> {
    let keep_upgrade = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    let (mut parts, body) = response.into_parts();
    if !keep_upgrade {
        strip_hop_by_hop(&mut parts.headers);
    }
    // A proxy answers in its own version (RFC 9110 §6.2), not the release's: an HTTP/1.0
    // release's answer goes out as HTTP/1.1 (hyper frames its body for the client).
    if parts.version < hyper::Version::HTTP_11 {
        parts.version = hyper::Version::HTTP_11;
    }
    if let (Some(name), Some(value)) = (&ctx.version_header, &lease.target.header_value) {
        parts.headers.insert(name.clone(), value.clone());
    }
    Response::from_parts(
        parts,
        Body::Leased(Leased {
            body: IdleBody::new(body, ctx.body_idle, "response body"),
            lease,
            ended: false,
            broke: None,
            thread: ctx.thread,
            counting: ctx.counting,
            line: None,
        }),
    )
}

/// Sends a request over hyper's client for the request pass (`pass.rs`), over the
/// connection to the release this client connection keeps, if any.
struct Forwarding<'a> {
    client: &'a Client,
    /// The kept connection to the release the last lease named, taken with the lease.
    kept: Option<hyper::client::conn::http1::SendRequest<UpstreamBody>>,
    /// The request's head: copied for each try when it can be sent again, else moved once.
    head: Option<hyper::http::request::Parts>,
    body: Option<UpstreamBody>,
    again: bool,
    /// How the client's body fared, to tell a client that left from a release that failed.
    settled: Option<Settled>,
}

impl pass::Sender for Forwarding<'_> {
    type Answer = Response<Incoming>;

    fn lease(
        &mut self,
        service: &Service,
        tried: &[u16],
        turns: &std::sync::atomic::AtomicUsize,
    ) -> (Option<Lease>, usize) {
        let mut reused = self.client.reused.lock().expect("connection state");
        let Reused { views, upstreams } = &mut *reused;
        let at = match views.iter().position(|(id, _)| *id == service.id) {
            Some(at) => at,
            None => {
                views.push((service.id, View::default()));
                views.len() - 1
            }
        };
        let seen = views[at].1.generation();
        let lease = service.routes.lease_in(&mut views[at].1, tried, turns);
        if views[at].1.generation() != seen {
            // Connections to releases no service of this connection still has go.
            upstreams.keep_only(|port| views.iter().any(|(_, v)| v.has_port(port)));
        }
        self.kept = lease.as_ref().and_then(|l| upstreams.take(l.target.port));
        (lease, views[at].1.pool_size())
    }

    async fn send(&mut self, lease: &Lease) -> Result<Response<Incoming>, Failure> {
        let request = match (self.again, self.head.as_ref()) {
            (true, Some(head)) => copy_without_body(head),
            _ => {
                let head = self.head.take().ok_or(Failure::Spent)?;
                let body = self.body.take().unwrap_or_else(no_body);
                Request::from_parts(head, body)
            }
        };
        let sent = through_hyper(self.client, self.kept.take(), lease.target.port, request).await;
        match sent {
            Err(_) if self.settled.as_ref().is_some_and(Settled::client_left) => {
                Err(Failure::ClientLeft)
            }
            other => other,
        }
    }

    fn status(answer: &Response<Incoming>) -> u16 {
        answer.status().as_u16()
    }
}

/// Sends a request with a body, or an upgrade, over hyper's client (`upstream`); the
/// connection goes back to the client's set for its next request unless a tunnel took it.
async fn through_hyper(
    client: &Client,
    kept: Option<hyper::client::conn::http1::SendRequest<UpstreamBody>>,
    port: u16,
    request: Request<UpstreamBody>,
) -> Result<Response<Incoming>, Failure> {
    let (response, sender) = upstream::send(kept, port, request).await?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let mut reused = client.reused.lock().expect("connection state");
        reused.upstreams.put(port, sender);
    }
    Ok(response)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn no_body() -> UpstreamBody {
    Either::Right(Full::new(Bytes::new()))
}

/// A request without a body, made again from its head for one more try.
fn copy_without_body(head: &hyper::http::request::Parts) -> Request<UpstreamBody> {
    let mut request = Request::new(no_body());
    *request.method_mut() = head.method.clone();
    *request.uri_mut() = head.uri.clone();
    *request.version_mut() = head.version;
    *request.headers_mut() = head.headers.clone();
    request
}

/// A response body that holds its request's lease until it is finished or dropped, so a
/// release counts as busy while its answer is still streaming.
pub struct Leased {
    body: IdleBody<Incoming>,
    lease: Lease,
    /// The body's end was read: the client was given all of it.
    ended: bool,
    /// The release's side failed it (broke off, or stalled past the body idle time).
    broke: Option<Cut>,
    thread: usize,
    counting: bool,
    /// Its access log line, written when the body ends (or is dropped).
    line: Option<Box<Pending>>,
}

impl Drop for Leased {
    /// The answer is done with: whole, or cut (its head was counted on the release; a cut is
    /// counted there too, and its line says why).
    fn drop(&mut self) {
        let target = &self.lease.target;
        let fate = match self.ended || hyper::body::Body::is_end_stream(&self.body) {
            true => Fate::Answered,
            false => Fate::Cut(self.broke.unwrap_or(Cut::ClientClosed)),
        };
        if let (Fate::Cut(cut), true) = (fate, self.counting) {
            target.counts.cut(self.thread, cut);
        }
        if let Some(line) = self.line.take() {
            let Pending {
                log,
                begun,
                status,
                client,
                bytes,
            } = *line;
            begun.finish(
                &log,
                self.thread,
                (status, fate),
                bytes,
                Some((target.version.as_bytes(), target.slot)),
                client,
            );
        }
    }
}

/// `answer` with `Strict-Transport-Security` set when `hsts` (hyper's side of a TLS
/// connection; `front.rs` writes [`HSTS_LINE`] itself).
pub(super) async fn with_hsts<E>(
    answer: impl std::future::Future<Output = Result<Response<Body>, E>>,
    hsts: bool,
) -> Result<Response<Body>, E> {
    let mut response = answer.await?;
    if hsts {
        response
            .headers_mut()
            .insert(STRICT_TRANSPORT_SECURITY, HeaderValue::from_static(HSTS));
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_named_in_connection_are_dropped() {
        let mut headers = hyper::HeaderMap::new();
        headers.insert(CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert("x-kept", HeaderValue::from_static("1"));
        headers.insert(HOST, HeaderValue::from_static("example"));
        strip_hop_by_hop(&mut headers);
        let names: Vec<&str> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), 2);
        assert!(headers.contains_key("x-kept") && headers.contains_key(HOST));
    }

    #[test]
    fn upgrade_needs_both_headers() {
        let mut headers = hyper::HeaderMap::new();
        headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
        assert!(!is_upgrade(&headers));
        headers.insert(CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        assert!(is_upgrade(&headers));
    }
}
