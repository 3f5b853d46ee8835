//! One client connection (issue 40). rollgate serves the requests nearly every client sends —
//! HTTP/1.1, origin form, no body, no upgrade — itself: their head is read and checked with
//! `httparse` (hyper's own parser, with hyper's limits), rewritten for the release as bytes
//! (hop-by-hop headers out, `X-Forwarded-*` in), sent over a kept connection (`relay.rs`), and
//! the answer's head rewritten the same way on its way back while its body passes through
//! unchanged (chunked stays chunked; a body that runs to the close is chunked for the client).
//! No `Request`, no header map, no task or channel between the client and the release.
//!
//! Anything else — a body, an upgrade, HTTP/1.0, `Expect`, a head hyper would refuse (400,
//! 414, 431) — hands the connection to hyper's server for the rest of its life, with the bytes
//! read so far (`forward.rs`). So the hardening hyper gives (smuggling, limits, bodies,
//! tunnels) still covers every request rollgate does not serve itself, and the ones it does
//! serve are the ones hyper would have accepted unchanged.
//!
//! The same path serves HTTP/1.1 over TLS (`tls.rs` hands it the connection after the
//! handshake when ALPN chose `http/1.1` or nothing): the release is told `X-Forwarded-Proto:
//! https`, every answer carries `Strict-Transport-Security` under `--hsts`, and a request whose
//! Host is not the name the client's TLS asked for (routes by host) goes to hyper, which
//! answers 421 as it does over HTTP/2.
//!
//! Limits kept here too: a head must arrive within `--header-read-timeout-ms` (also the
//! longest idle time between requests: the connection is closed, as hyper does); a head larger
//! than `--max-header-bytes` goes to hyper, which answers 431; a body from the release that
//! stops arriving is cut after the body idle time; a stopping proxy closes idle connections
//! and finishes the request in progress.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::StatusCode;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::Instant;

use super::access;
use super::counts::Cut;
use super::failure::Failure;
use super::fate::Fate;
use super::forward;
use super::leases::Lease;
use super::pass::{self, Outcome, Shared};
use super::relay::{self, Chunks, Framing, Wire, MAX_HEADERS};
use super::rules::{self, Replay};
use super::service::Service;
use super::upstream::Idle;
use super::wire::{self, push_decimal, HSTS_LINE, MIN_HEADER_BYTES};

/// The longest request target served here; hyper answers a longer one 414 (its own limit).
const MAX_TARGET_BYTES: usize = u16::MAX as usize - 1;
/// The client's bytes are read this much at a time at first.
const READ_CHUNK: usize = 4096;

/// A client connection as this path reads and writes it: a TCP socket, or TLS over one.
pub(super) trait ClientStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// A write may leave bytes inside the stream (TLS records its socket did not take yet):
    /// each answer is flushed. Plain TCP holds nothing back.
    const HOLDS_WRITES: bool;

    /// Turns Nagle off on the socket underneath.
    fn no_delay(&self);
}

impl ClientStream for TcpStream {
    const HOLDS_WRITES: bool = false;

    fn no_delay(&self) {
        let _ = self.set_nodelay(true);
    }
}

impl ClientStream for tokio_rustls::server::TlsStream<TcpStream> {
    const HOLDS_WRITES: bool = true;

    fn no_delay(&self) {
        let _ = self.get_ref().0.set_nodelay(true);
    }
}

/// How the client reached the proxy.
pub(super) enum Over {
    Plain,
    /// TLS: the name its handshake asked for (lowercase), and whether answers say HSTS.
    Tls {
        sni: Option<String>,
        hsts: bool,
    },
}

impl Over {
    /// Every answer on this connection carries `Strict-Transport-Security`.
    fn hsts(&self) -> bool {
        matches!(self, Over::Tls { hsts: true, .. })
    }
}

/// Serves `stream` until the client or the proxy ends it.
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    slot: OwnedSemaphorePermit,
    ctx: Arc<Shared>,
    stop: watch::Receiver<bool>,
) {
    serve_over(stream, Over::Plain, peer, slot, ctx, stop).await
}

/// Serves `stream`, reached `over` plain TCP or TLS, until the client or the proxy ends it.
pub(super) async fn serve_over<S: ClientStream>(
    stream: S,
    over: Over,
    peer: SocketAddr,
    slot: OwnedSemaphorePermit,
    ctx: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let mut front = Front {
        stream,
        over,
        input: BytesMut::with_capacity(READ_CHUNK),
        output: Vec::with_capacity(512),
        upstream_head: Vec::with_capacity(512),
        peer,
        kept: Kept {
            wires: Vec::new(),
            idle: ctx.idle.clone(),
        },
        seen: None,
        service: None,
        sent: (0, 0),
        fate: Fate::Answered,
        released: None,
        line: Vec::new(),
        nodelay: false,
        served: 0,
        ctx,
    };
    loop {
        match front.next_request(&mut stop).await {
            Next::Serve(asked) => {
                if front.served > 0 {
                    // A connection that carries several requests: as nginx, no Nagle on it.
                    front.no_delay();
                }
                front.served += 1;
                let going_on = front.answer(asked, &stop).await;
                if !going_on || *stop.borrow() {
                    return;
                }
            }
            Next::Hyper => return front.hand_to_hyper(slot, stop).await,
            Next::Close => return,
        }
    }
}

/// What the fast path reads of a request's headers in one pass.
struct Read<'h> {
    close: bool,
    host: Option<&'h [u8]>,
    forwarded_for: Option<&'h [u8]>,
    request_id: Option<&'h [u8]>,
    accept: Option<&'h [u8]>,
    /// Headers `Connection` names (hop-by-hop too); rare, so only then collected.
    named: Vec<&'h [u8]>,
}

impl<'h> Read<'h> {
    /// None: a request this path does not serve (a body, an upgrade, `Expect`): hyper's.
    fn of(headers: &'h [httparse::Header<'h>]) -> Option<Read<'h>> {
        let mut read = Read {
            close: false,
            host: None,
            forwarded_for: None,
            request_id: None,
            accept: None,
            named: Vec::new(),
        };
        for header in headers {
            let (name, value) = (header.name, header.value);
            let is = |n: &str| name.eq_ignore_ascii_case(n);
            if is("content-length") || is("transfer-encoding") || is("upgrade") || is("expect") {
                return None;
            }
            if is("connection") {
                for token in value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                    if token.eq_ignore_ascii_case(b"close") {
                        read.close = true;
                    } else if token.eq_ignore_ascii_case(b"upgrade") {
                        return None;
                    }
                }
                read.named
                    .extend(rules::connection_named(std::iter::once(value)));
            } else if is("host") && read.host.is_none() {
                read.host = Some(value);
            } else if is(rules::FORWARDED_FOR) && read.forwarded_for.is_none() {
                read.forwarded_for = Some(value);
            } else if is("x-request-id") && read.request_id.is_none() {
                read.request_id = Some(value);
            } else if is("accept") && read.accept.is_none() {
                read.accept = Some(value);
            }
        }
        Some(read)
    }
}

/// A request head for the release, written as bytes from the client's headers.
struct InBytes<'o, 'h> {
    out: &'o mut Vec<u8>,
    headers: &'h [httparse::Header<'h>],
}

impl rules::Head for InBytes<'_, '_> {
    fn drop_where(&mut self, dropped: impl Fn(&[u8]) -> bool) {
        for header in self.headers {
            if !dropped(header.name.as_bytes()) {
                push_header(self.out, header.name.as_bytes(), header.value);
            }
        }
    }

    fn add(&mut self, name: &'static str, value: impl FnOnce(&mut Vec<u8>)) {
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b": ");
        value(self.out);
        self.out.extend_from_slice(b"\r\n");
    }
}

/// The 404 of a request no route took (the chain says so itself; this is its fallback).
fn no_service() -> rules::Own {
    rules::Own::text(StatusCode::NOT_FOUND, wire::no_route(""))
}

/// What the next bytes of a connection are.
enum Next {
    /// A request served here, its head read off the input and rewritten for the release.
    Serve(Asked),
    /// Something for hyper: the connection is handed over with what was read of it.
    Hyper,
    /// The client closed, timed out, or the proxy is stopping.
    Close,
}

/// What the answer to a request depends on.
struct Asked {
    /// A HEAD: its answer has no body whatever its headers say.
    head: bool,
    /// GET, HEAD, OPTIONS or TRACE: may be sent again if the connection broke unanswered.
    safe: bool,
    /// The client asked to close after this answer.
    close: bool,
    /// The chain's own answer to it (404 no route, 421, 413), or none: the connection's
    /// `service` took it.
    own: Option<rules::Own>,
    /// The client asked for JSON (`Accept`); read only when its service is not serving.
    json: bool,
    /// Its access log line's start, when its route logs.
    begun: Option<Box<access::Begun>>,
    /// A route took it (`service` is its service): its fate is counted there.
    routed: bool,
}

/// A client connection's connections to releases, by port (one per release it sent to); they
/// go to the serving thread's idle set when it ends.
struct Kept {
    wires: Vec<(u16, Wire)>,
    idle: Arc<Idle>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.idle.give_wires(std::mem::take(&mut self.wires));
    }
}

struct Front<S> {
    stream: S,
    over: Over,
    /// What the client sent that is not served yet.
    input: BytesMut,
    /// What goes to the client next: an answer's head, with its body when it came whole.
    output: Vec<u8>,
    /// The request's head as the release is sent it (kept for a retry on another replica).
    upstream_head: Vec<u8>,
    peer: SocketAddr,
    kept: Kept,
    /// The service and its routing table's generation `kept` was last checked against.
    seen: Option<(u64, Option<u64>)>,
    /// The service this connection's last request was routed to (kept, so a keep-alive
    /// connection takes the service's `Arc` once, not once a request).
    service: Option<Arc<Service>>,
    /// The last answer's status and body bytes sent, for the access log.
    sent: (u16, u64),
    /// How the last request ended (`fate.rs`).
    fate: Fate,
    /// The release (version, slot) the last request went to, when its route logs (the
    /// version's bytes in a buffer the connection reuses).
    released: Option<(Vec<u8>, u16)>,
    /// The access log line's buffer, reused request after request.
    line: Vec<u8>,
    nodelay: bool,
    served: usize,
    ctx: Arc<Shared>,
}

impl<S: ClientStream> Front<S> {
    fn no_delay(&mut self) {
        if !self.nodelay {
            self.nodelay = true;
            self.stream.no_delay();
        }
    }

    /// Reads until a whole request head is in, within the header read timeout.
    async fn next_request(&mut self, stop: &mut watch::Receiver<bool>) -> Next {
        let deadline = Instant::now() + self.ctx.header_read_timeout;
        loop {
            if !self.input.is_empty() {
                match self.examine() {
                    Examined::Plain(asked, length) => {
                        self.input.advance(length);
                        return Next::Serve(asked);
                    }
                    Examined::Partial if self.input.len() < self.ctx.max_header_bytes => {}
                    _ => return Next::Hyper,
                }
            }
            if self.input.capacity() - self.input.len() < 1024 {
                self.input.reserve(READ_CHUNK);
            }
            let idle = self.input.is_empty();
            let read = tokio::time::timeout_at(
                deadline,
                std::future::poll_fn(|cx| {
                    tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.input)
                }),
            );
            let got = if idle {
                let handed_over = super::handover::successor_serves();
                let stopping = *stop.borrow();
                match stopping {
                    // Between requests: a stopping proxy closes the connection now ...
                    true if !handed_over => return Next::Close,
                    // ... but one whose sockets another serves answers the client's next
                    // request (with `Connection: close`: it reconnects, to the new proxy)
                    // rather than close under a request on its way; a connection that stays
                    // idle that long is closed. One that has sent nothing yet was opened to
                    // send a request: it has the usual time for its head (CI saw a WebSocket
                    // reconnect, slow under load, closed before it asked).
                    true if self.served == 0 => read.await,
                    true => match tokio::time::timeout(super::handover::IDLE_KEPT, read).await {
                        Ok(got) => got,
                        Err(_) => return Next::Close,
                    },
                    false => tokio::select! {
                        biased;
                        got = read => got,
                        changed = stop.changed() => match changed {
                            Ok(()) => continue,
                            // Nobody left to say stop: the proxy is going.
                            Err(_) => return Next::Close,
                        },
                    },
                }
            } else {
                read.await
            };
            match got {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return Next::Close,
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Whether the input starts with a request served here; if so, the chain's verdict on it
    /// (`rules.rs`), and, when it goes on, its head for the release in `upstream_head`.
    fn examine(&mut self) -> Examined {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut request = httparse::Request::new(&mut slots);
        let length = match request.parse(&self.input) {
            // A head over the limit that came whole in one read is hyper's to refuse too.
            Ok(httparse::Status::Complete(length)) if length <= self.ctx.max_header_bytes => length,
            Ok(httparse::Status::Partial) => return Examined::Partial,
            Ok(httparse::Status::Complete(_)) | Err(_) => return Examined::Other,
        };
        let (Some(method), Some(target), Some(1)) = (request.method, request.path, request.version)
        else {
            return Examined::Other;
        };
        if !target.starts_with('/') || target.len() > MAX_TARGET_BYTES {
            return Examined::Other;
        }
        let headers = &*request.headers;
        let Some(read) = Read::of(headers) else {
            return Examined::Other;
        };
        let facts = rules::Facts {
            method,
            target,
            host: read.host,
            request_id: read.request_id,
            body: rules::Body::None,
            upgrade: false,
            sni: match &self.over {
                Over::Tls { sni, .. } => sni.as_deref(),
                Over::Plain => None,
            },
        };
        let (thread, line) = (self.ctx.thread, &mut self.line);
        let decided = self
            .ctx
            .router
            .with(|router| rules::run(router, &facts, thread, line));
        let routed = decided.service.is_some();
        if let Some(service) = decided.service {
            if self.service.as_ref().map(|s| s.id) != Some(service.id) {
                self.service = Some(service);
            }
        }
        let mut asked = Asked {
            head: method == "HEAD",
            safe: false,
            close: read.close,
            own: None,
            json: false,
            routed,
            begun: decided.begun,
        };
        match decided.verdict {
            Err(own) => asked.own = Some(own),
            Ok(passage) => {
                asked.safe = passage.replay.safe;
                // The client's `Accept` matters only to a gate that refuses.
                asked.json = !passage.service.gate.serving()
                    && read.accept.is_some_and(super::traffic::wants_json);
                let target = passage.target.as_deref().unwrap_or(target);
                let client = rules::Client {
                    peer: self.peer.ip(),
                    tls: matches!(self.over, Over::Tls { .. }),
                    forwarded_for: read.forwarded_for,
                    trust_forwarded: self.ctx.trust_forwarded,
                    has_host: read.host.is_some(),
                    named: &read.named,
                    upgrade: None,
                };
                let out = &mut self.upstream_head;
                out.clear();
                out.extend_from_slice(method.as_bytes());
                out.push(b' ');
                out.extend_from_slice(target.as_bytes());
                out.extend_from_slice(b" HTTP/1.1\r\n");
                rules::rewrite_head(&mut InBytes { out, headers }, &client);
                out.extend_from_slice(b"\r\n");
            }
        }
        Examined::Plain(asked, length)
    }

    /// Answers one request: routes it, relays it (to another replica if one refuses it), and
    /// sends the answer back. False: the connection cannot go on (or the answer said it was
    /// the last: the client asked, or the proxy is stopping).
    async fn answer(&mut self, mut asked: Asked, stop: &watch::Receiver<bool>) -> bool {
        let begun = asked.begun.take();
        if let (Some(_), Some((version, _))) = (&begun, &mut self.released) {
            version.clear();
        }
        let going_on = self.respond(&asked, stop, begun.is_some()).await;
        let Some(service) = self.service.as_ref().filter(|_| asked.routed) else {
            return going_on;
        };
        if self.ctx.counting {
            self.fate.count_on(&service.own_answers, self.ctx.thread);
        }
        if let (Some(begun), Some(log)) = (begun, service.access.as_ref()) {
            let (status, bytes) = self.sent;
            let released = self
                .released
                .as_ref()
                .filter(|(version, _)| !version.is_empty() && self.fate.names_a_release())
                .map(|(version, slot)| (version.as_slice(), *slot));
            self.line = begun.finish(
                log,
                self.ctx.thread,
                (status, self.fate),
                bytes,
                released,
                self.peer.ip(),
            );
        }
        going_on
    }

    /// [`Front::answer`] but for its access log line.
    async fn respond(
        &mut self,
        asked: &Asked,
        stop: &watch::Receiver<bool>,
        logging: bool,
    ) -> bool {
        // Decided when the answer's head is written, so a proxy told to stop while the
        // release works tells the client too.
        let last = || asked.close || *stop.borrow();
        let ctx = self.ctx.clone();
        let service = match (&asked.own, &self.service) {
            (None, Some(service)) => service.clone(),
            // The chain answered it (no route, a misdirected host, a body too large).
            (own, _) => {
                let last = last();
                let answered = match own {
                    Some(own) => self.own(own, last).await,
                    None => self.own(&no_service(), last).await,
                };
                return answered && !last;
            }
        };
        if let Some(refusal) = pass::gate(&service, || asked.json).await {
            let last = last();
            return self.own(&refusal.into(), last).await && !last;
        }
        let replay = Replay {
            safe: asked.safe,
            again: true,
        };
        let mut sender = Relaying {
            front: self,
            asked,
            stop,
            logging,
        };
        match pass::to_a_release(&ctx, &service, &mut sender, replay).await {
            Outcome::Answered(lease, (wire, answer, said_last)) => {
                let reusable = self.pass_body(wire, lease.target.port, answer).await;
                if let (Fate::Cut(cut), true) = (self.fate, ctx.counting) {
                    lease.target.counts.cut(ctx.thread, cut);
                }
                drop(lease);
                reusable && !said_last
            }
            Outcome::Own(own, failed) => {
                let last = last();
                let going_on = self.own(&own, last).await && !last;
                if let Some(failed) = failed {
                    self.fate = Fate::Unanswered(failed.miss);
                }
                going_on
            }
        }
    }

    /// Sends the answer whose head is in `output` and whose body is behind it on `wire`; the
    /// wire is kept for the next request if the answer ended cleanly on it. False: the client
    /// connection cannot go on (the client went away, or the body broke off).
    async fn pass_body(&mut self, mut wire: Wire, port: u16, answer: Answer) -> bool {
        let body_idle = self.ctx.body_idle;
        // The head is all `output` holds yet: what is sent past it is the body.
        let head = self.output.len() as u64;
        let mut flushed = 0u64;
        self.sent = (answer.status, 0);
        let mut state = match answer.framing {
            None => Passing::Done,
            Some(Framing::Length(length)) => Passing::Length(length),
            Some(Framing::Chunked) => Passing::Chunked(Chunks::start()),
            Some(Framing::UntilClose) => Passing::UntilClose,
        };
        let mut writes = 0;
        loop {
            match state.take(&mut wire.buffer, &mut self.output) {
                Ok(()) => {}
                Err(_) => return self.cut(Cut::UpstreamReset),
            }
            if !self.output.is_empty() {
                if writes > 0 {
                    self.no_delay();
                }
                writes += 1;
                flushed += self.output.len() as u64;
                if !self.flush().await {
                    return self.cut(Cut::ClientClosed);
                }
                self.sent.1 = flushed.saturating_sub(head);
            }
            if matches!(state, Passing::Done) {
                break;
            }
            match tokio::time::timeout(body_idle, wire.fill()).await {
                Ok(Ok(0)) if matches!(state, Passing::UntilClose) => {
                    state = Passing::Closing;
                }
                // Cut short, broken, or idle too long: the client cannot be told but by a close.
                Ok(Ok(0)) | Ok(Err(_)) => return self.cut(Cut::UpstreamReset),
                Err(_) => return self.cut(Cut::UpstreamTimeout),
                Ok(Ok(_)) => {}
            }
        }
        self.fate = Fate::Answered;
        if answer.reusable
            && wire.buffer.is_empty()
            && !matches!(answer.framing, Some(Framing::UntilClose))
        {
            self.kept.wires.push((port, wire));
        }
        true
    }

    /// The answer being passed did not reach the client whole (`why`): the connection ends.
    fn cut(&mut self, why: Cut) -> bool {
        self.fate = Fate::Cut(why);
        false
    }

    /// Writes `output` to the client; false if the client went away or read nothing of it for
    /// the body idle time (a client that stops reading must not hold its slot forever).
    async fn flush(&mut self) -> bool {
        let idle = self.ctx.body_idle;
        let mut written = 0;
        while written < self.output.len() {
            match tokio::time::timeout(idle, self.stream.write(&self.output[written..])).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return false,
                Ok(Ok(n)) => written += n,
            }
        }
        self.output.clear();
        !S::HOLDS_WRITES
            || matches!(
                tokio::time::timeout(idle, self.stream.flush()).await,
                Ok(Ok(()))
            )
    }

    /// Answers with rollgate's own words (a maintenance page, JSON, a line of text).
    async fn own(&mut self, own: &rules::Own, close: bool) -> bool {
        let rules::Own {
            status,
            content_type,
            retry_after,
            body,
            reason,
        } = own;
        self.sent = (status.as_u16(), body.len() as u64);
        self.fate = Fate::Own(*reason);
        let out = &mut self.output;
        out.clear();
        push_status_line(out, status.as_u16(), b"");
        out.extend_from_slice(b"content-type: ");
        out.extend_from_slice(content_type.as_bytes());
        out.extend_from_slice(b"\r\ncontent-length: ");
        push_decimal(out, body.len() as u64);
        out.extend_from_slice(b"\r\n");
        if let Some(seconds) = *retry_after {
            out.extend_from_slice(b"retry-after: ");
            push_decimal(out, seconds);
            out.extend_from_slice(b"\r\n");
        }
        push_date(out);
        if self.over.hsts() {
            out.extend_from_slice(HSTS_LINE);
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body.as_bytes());
        self.flush().await
    }

    /// Lets hyper serve the rest of the connection, starting with the bytes read so far.
    async fn hand_to_hyper(self, slot: OwnedSemaphorePermit, mut stop: watch::Receiver<bool>) {
        let Front {
            stream,
            over,
            input,
            peer,
            ctx,
            ..
        } = self;
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(ctx.header_read_timeout)
            .max_buf_size(ctx.max_header_bytes.max(MIN_HEADER_BYTES))
            .keep_alive(true);
        let mut client = forward::Client::new(peer, Arc::new(slot), &ctx);
        let hsts = match &over {
            Over::Plain => false,
            Over::Tls { sni, hsts } => {
                client = client.over_tls(sni.as_deref());
                *hsts
            }
        };
        let client = Arc::new(client);
        let write_idle = client.write_idle.clone();
        let service = service_fn(move |request| {
            forward::with_hsts(forward::handle(request, ctx.clone(), client.clone()), hsts)
        });
        let io = Prefixed {
            prefix: input,
            stream,
            write_idle,
            stalled: None,
        };
        let connection = builder
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        serve_until_stopped!(connection, stop);
    }
}

enum Examined {
    /// A request served here, `length` bytes of head.
    Plain(Asked, usize),
    /// Not all of the head is in yet.
    Partial,
    /// For hyper.
    Other,
}

/// An answer's head as the client is sent it.
struct Answer {
    status: u16,
    framing: Option<Framing>,
    /// The connection to the release may carry another request after this answer.
    reusable: bool,
}

/// Where passing an answer's body is.
enum Passing {
    /// Bytes left of a body with a length.
    Length(u64),
    /// A chunked body, passed as it is.
    Chunked(Chunks),
    /// A body that runs to the close, chunked for the client.
    UntilClose,
    /// The release closed: the last chunk is written.
    Closing,
    Done,
}

impl Passing {
    /// Moves what belongs to the body from the release's `buffer` to `out`, framed as the
    /// client is sent it.
    fn take(&mut self, buffer: &mut BytesMut, out: &mut Vec<u8>) -> Result<(), Failure> {
        match self {
            Passing::Length(left) => {
                let take = (buffer.len() as u64).min(*left) as usize;
                out.extend_from_slice(&buffer[..take]);
                buffer.advance(take);
                *left -= take as u64;
                if *left == 0 {
                    *self = Passing::Done;
                }
            }
            Passing::Chunked(chunks) => {
                let take = chunks.advance(buffer)?;
                out.extend_from_slice(&buffer[..take]);
                buffer.advance(take);
                if *chunks == Chunks::Done {
                    *self = Passing::Done;
                }
            }
            Passing::UntilClose => {
                if !buffer.is_empty() {
                    out.extend_from_slice(format!("{:x}\r\n", buffer.len()).as_bytes());
                    out.extend_from_slice(buffer);
                    out.extend_from_slice(b"\r\n");
                    buffer.clear();
                }
            }
            Passing::Closing => {
                out.extend_from_slice(b"0\r\n\r\n");
                *self = Passing::Done;
            }
            Passing::Done => {}
        }
        Ok(())
    }
}

/// What an answer's head is written for, besides the release's own head.
struct Written<'a> {
    /// The request was a HEAD.
    head_request: bool,
    /// This answer is the connection's last.
    last: bool,
    /// The version header, when asked for.
    version_header: Option<(
        &'a hyper::header::HeaderName,
        &'a hyper::header::HeaderValue,
    )>,
    /// The answer says `Strict-Transport-Security` in rollgate's words (the release's own goes).
    hsts: bool,
}

/// Parses the release's final answer head off the front of `buffer` (skipping 1xx answers
/// before it) and writes it into `out` as the client is sent it: HTTP/1.1, hop-by-hop headers
/// out, the framing written anew, `Date` if the release sent none (RFC 9110 §6.6.1), the
/// version header if asked, `connection: close` if the client asked to close. None while the
/// head is not whole.
fn answer_head(
    buffer: &mut BytesMut,
    wrote: &Written<'_>,
    out: &mut Vec<u8>,
) -> Result<Option<Answer>, Failure> {
    let Written {
        head_request,
        last,
        version_header,
        hsts,
    } = *wrote;
    loop {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut answer = httparse::Response::new(&mut slots);
        let length = match answer.parse(buffer) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(Failure::Garbled(format!("an unreadable answer ({e})"))),
        };
        let status = answer.code.unwrap_or(0);
        if (100..200).contains(&status) && status != 101 {
            // An interim answer (100 Continue, 103 Early Hints): the final one follows.
            buffer.advance(length);
            continue;
        }
        if status == 101 {
            return Err(relay::garbled(
                "101 Switching Protocols to a request that asked for none",
            ));
        }
        if status < 100 {
            return Err(relay::garbled("an invalid status"));
        }
        let headers = &*answer.headers;
        let (framing, reusable) =
            relay::framing_of(headers, answer.version.unwrap_or(1), status, head_request)?;
        let named = rules::connection_named(
            headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("connection"))
                .map(|h| h.value),
        );
        out.clear();
        push_status_line(out, status, answer.reason.unwrap_or("").as_bytes());
        let mut dated = false;
        for header in headers {
            let name = header.name;
            let dropped = rules::is_hop_by_hop(name.as_bytes(), &named)
                // Ours is written below; a 204 has none (RFC 9110 §8.6).
                || ((framing.is_some() || status == 204)
                    && name.eq_ignore_ascii_case("content-length"))
                || version_header.is_some_and(|(n, _)| name.eq_ignore_ascii_case(n.as_str()))
                || (hsts && name.eq_ignore_ascii_case("strict-transport-security"));
            if !dropped {
                dated |= name.eq_ignore_ascii_case("date");
                push_header(out, name.as_bytes(), header.value);
            }
        }
        match framing {
            Some(Framing::Length(n)) => {
                out.extend_from_slice(b"content-length: ");
                push_decimal(out, n);
                out.extend_from_slice(b"\r\n");
            }
            Some(Framing::Chunked | Framing::UntilClose) => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n")
            }
            None => {}
        }
        if !dated {
            push_date(out);
        }
        if let Some((name, value)) = version_header {
            push_header(out, name.as_str().as_bytes(), value.as_bytes());
        }
        if hsts {
            out.extend_from_slice(HSTS_LINE);
        }
        if last {
            out.extend_from_slice(b"connection: close\r\n");
        }
        out.extend_from_slice(b"\r\n");
        buffer.advance(length);
        return Ok(Some(Answer {
            status,
            framing,
            reusable,
        }));
    }
}

/// Sends a request head over the kept HTTP/1.1 connections of a client connection, for the
/// request pass (`pass.rs`); the answer's head is rewritten into the client's `output` as it
/// comes.
struct Relaying<'a, S> {
    front: &'a mut Front<S>,
    asked: &'a Asked,
    stop: &'a watch::Receiver<bool>,
    /// The request's access log line is written: the release it went to is noted.
    logging: bool,
}

impl<S: ClientStream> pass::Sender for Relaying<'_, S> {
    /// The connection the answer's body is behind, the answer's head, and whether it told
    /// the client it is the last on the connection.
    type Answer = (Wire, Answer, bool);

    fn lease(
        &mut self,
        service: &Service,
        tried: &[u16],
        turns: &AtomicUsize,
    ) -> (Option<Lease>, usize) {
        let front = &mut *self.front;
        let mut view = service.view(front.ctx.thread);
        let lease = service.routes.lease_in(&mut view, tried, turns);
        let seen = Some((service.id, view.generation()));
        if seen != front.seen {
            // Another generation of the same service's table: connections to releases it no
            // longer has go (one kept for another service stays).
            if front.seen.map(|(id, _)| id) == Some(service.id) {
                front.kept.wires.retain(|(port, _)| view.has_port(*port));
            }
            front.seen = seen;
        }
        (lease, view.pool_size())
    }

    async fn send(&mut self, lease: &Lease) -> Result<Self::Answer, Failure> {
        let front = &mut *self.front;
        let target = &lease.target;
        let port = target.port;
        if self.logging {
            let (version, slot) = front.released.get_or_insert_with(|| (Vec::new(), 0));
            version.clear();
            version.extend_from_slice(target.version.as_bytes());
            *slot = target.slot;
        }
        let kept = match front.kept.wires.iter().position(|(p, _)| *p == port) {
            Some(at) => Some(front.kept.wires.swap_remove(at).1),
            None => front.ctx.idle.take_wire(port),
        };
        let version_header = front
            .ctx
            .version_header
            .as_ref()
            .zip(target.header_value.as_ref());
        let hsts = front.over.hsts();
        let max_header_bytes = front.ctx.max_header_bytes;
        let Front {
            stream,
            input,
            output,
            upstream_head,
            ..
        } = front;
        let (asked, stop) = (self.asked, self.stop);
        let mut said_last = false;
        let exchange = relay::exchange(kept, port, upstream_head, asked.safe, |buffer| {
            // Decided when the answer's head is written, so a proxy told to stop while the
            // release works tells the client too.
            said_last = asked.close || *stop.borrow();
            let wrote = Written {
                head_request: asked.head,
                last: said_last,
                version_header,
                hsts,
            };
            answer_head(buffer, &wrote, output)
        });
        // The client is watched while the release works: one that closes its side (or whose
        // connection breaks) has left, and its request ends there, as nginx's 499 — not as an
        // answer written into a closed connection and logged as given.
        let (wire, answer) = tokio::select! {
            biased;
            answered = exchange => answered?,
            () = client_leaves(stream, input, max_header_bytes) => {
                return Err(Failure::ClientLeft);
            }
        };
        Ok((wire, answer, said_last))
    }

    fn status(answer: &Self::Answer) -> u16 {
        answer.1.status
    }
}

/// Resolves when the client closes its side of the connection or it breaks. What it sends
/// meanwhile (a pipelined request) is kept in `input`, up to `limit` bytes: past that it is not
/// read until the answer has gone.
async fn client_leaves<S: ClientStream>(stream: &mut S, input: &mut BytesMut, limit: usize) {
    loop {
        if input.len() >= limit {
            return std::future::pending().await;
        }
        if input.capacity() - input.len() < 1024 {
            input.reserve(READ_CHUNK);
        }
        let read = std::future::poll_fn(|cx| {
            tokio_util::io::poll_read_buf(Pin::new(&mut *stream), cx, &mut *input)
        });
        match read.await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn push_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `HTTP/1.1 <status> <reason>`: the release's reason, or the standard one if it sent none.
fn push_status_line(out: &mut Vec<u8>, status: u16, reason: &[u8]) {
    out.extend_from_slice(b"HTTP/1.1 ");
    push_decimal(out, u64::from(status));
    out.push(b' ');
    if reason.is_empty() {
        let standard = StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("");
        out.extend_from_slice(standard.as_bytes());
    } else {
        out.extend_from_slice(reason);
    }
    out.extend_from_slice(b"\r\n");
}

/// `date: <now>\r\n`, the text made at most once a second per thread.
fn push_date(out: &mut Vec<u8>) {
    thread_local! {
        static DATE: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((0, String::new())) };
    }
    let now = std::time::SystemTime::now();
    let second = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with(|date| {
        let mut date = date.borrow_mut();
        if date.0 != second || date.1.is_empty() {
            *date = (second, httpdate::fmt_http_date(now));
        }
        push_header(out, b"date", date.1.as_bytes());
    });
}

/// The client connection as hyper is given it: the bytes already read first, then the socket.
/// A write the client takes nothing of for `write_idle` fails (a client that stops reading
/// must not hold its slot forever; an upgrade raises it to the tunnel's idle time).
struct Prefixed<S> {
    prefix: BytesMut,
    stream: S,
    write_idle: Arc<AtomicU64>,
    /// Armed while a write waits for the client.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S: ClientStream> Prefixed<S> {
    /// A pending write arms the idle timer; progress disarms it.
    fn watch_write(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<usize>>,
    ) -> Poll<std::io::Result<usize>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let idle = Duration::from_millis(self.write_idle.load(Ordering::Relaxed));
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the client read nothing for {} ms", idle.as_millis()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: ClientStream> AsyncRead for Prefixed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.prefix.is_empty() {
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        }
        let take = this.prefix.len().min(buf.remaining());
        buf.put_slice(&this.prefix[..take]);
        this.prefix.advance(take);
        Poll::Ready(Ok(()))
    }
}

impl<S: ClientStream> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.watch_write(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.watch_write(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(text: &str, head: bool, close: bool) -> (String, Option<Framing>, String) {
        rewritten_with(text, head, close, false)
    }

    fn rewritten_with(
        text: &str,
        head_request: bool,
        last: bool,
        hsts: bool,
    ) -> (String, Option<Framing>, String) {
        let mut buffer = BytesMut::from(text.as_bytes());
        let name = hyper::header::HeaderName::from_static("x-release");
        let value = hyper::header::HeaderValue::from_static("v2");
        let mut out = Vec::new();
        let wrote = Written {
            head_request,
            last,
            version_header: Some((&name, &value)),
            hsts,
        };
        let answer = answer_head(&mut buffer, &wrote, &mut out)
            .ok()
            .flatten()
            .unwrap();
        (
            String::from_utf8(out).unwrap(),
            answer.framing,
            String::from_utf8(buffer.to_vec()).unwrap(),
        )
    }

    #[test]
    fn over_tls_with_hsts_every_answer_says_it_once_in_rollgates_words() {
        let (head, _, _) = rewritten_with(
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nStrict-Transport-Security: max-age=5\r\ndate: x\r\n\r\n",
            false,
            false,
            true,
        );
        assert_eq!(
            head,
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\ndate: x\r\nx-release: v2\r\nstrict-transport-security: max-age=31536000\r\n\r\n"
        );
        // Without HSTS the release's own header passes as it is.
        let (head, _, _) = rewritten(
            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nStrict-Transport-Security: max-age=5\r\ndate: x\r\n\r\n",
            false,
            false,
        );
        assert!(
            head.contains("Strict-Transport-Security: max-age=5\r\n"),
            "{head}"
        );
    }

    #[test]
    fn an_answer_head_is_rewritten_for_the_client() {
        let (head, framing, rest) = rewritten(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive, x-hop\r\nx-hop: 1\r\nKeep-Alive: timeout=5\r\nDate: Tue, 01 Dec 2026 10:00:00 GMT\r\nx-release: forged\r\nX-Kept: yes\r\n\r\nhello",
            false,
            true,
        );
        assert_eq!(
            head,
            "HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 10:00:00 GMT\r\nX-Kept: yes\r\ncontent-length: 5\r\nx-release: v2\r\nconnection: close\r\n\r\n"
        );
        assert_eq!(
            (framing, rest.as_str()),
            (Some(Framing::Length(5)), "hello")
        );
        // Chunked stays chunked (its length dropped); no Date: one is added; a reason-less
        // status gets the standard reason.
        let (head, framing, _) = rewritten(
            "HTTP/1.1 201 \r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
            false,
            false,
        );
        assert!(
            head.starts_with("HTTP/1.1 201 Created\r\ntransfer-encoding: chunked\r\ndate: "),
            "{head}"
        );
        assert!(!head.contains("content-length"), "{head}");
        assert_eq!(framing, Some(Framing::Chunked));
        // A HEAD's answer keeps the length of what a GET would get.
        let (head, framing, _) = rewritten(
            "HTTP/1.1 200 OK\r\ncontent-length: 7\r\ndate: x\r\n\r\n",
            true,
            false,
        );
        assert_eq!(
            head,
            "HTTP/1.1 200 OK\r\ncontent-length: 7\r\ndate: x\r\nx-release: v2\r\n\r\n"
        );
        assert_eq!(framing, None);
        // An interim answer is skipped.
        let (head, _, _) = rewritten(
            "HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\ndate: x\r\n\r\n",
            false,
            false,
        );
        assert_eq!(
            head,
            "HTTP/1.1 204 No Content\r\ndate: x\r\nx-release: v2\r\n\r\n"
        );
        // A 204 carries no length (a release that sends one with a body is not believed).
        let (head, framing, rest) = rewritten(
            "HTTP/1.1 204 No Content\r\ncontent-length: 2\r\ndate: x\r\n\r\nok",
            false,
            false,
        );
        assert_eq!(
            head,
            "HTTP/1.1 204 No Content\r\ndate: x\r\nx-release: v2\r\n\r\n"
        );
        assert_eq!((framing, rest.as_str()), (None, "ok"));
    }

    #[test]
    fn a_body_to_the_close_is_chunked_for_the_client() {
        let mut passing = Passing::UntilClose;
        let mut buffer = BytesMut::from(&b"until the end"[..]);
        let mut out = Vec::new();
        passing.take(&mut buffer, &mut out).ok().unwrap();
        passing = Passing::Closing;
        passing.take(&mut buffer, &mut out).ok().unwrap();
        assert_eq!(out, b"d\r\nuntil the end\r\n0\r\n\r\n");
        assert!(matches!(passing, Passing::Done));
    }

    #[test]
    fn numbers_and_addresses_are_written_as_text() {
        use super::wire::push_ip;
        let mut out = Vec::new();
        push_decimal(&mut out, 0);
        out.push(b' ');
        push_decimal(&mut out, 18446744073709551615);
        out.push(b' ');
        push_ip(&mut out, "10.0.255.1".parse().unwrap());
        out.push(b' ');
        push_ip(&mut out, "::1".parse().unwrap());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "0 18446744073709551615 10.0.255.1 ::1"
        );
    }
}
