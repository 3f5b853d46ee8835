//! The proxy's rules (issue 71), each written once, as the filters of one chain that both front
//! ends run for every request — the HTTP/1.1 fast path (`front.rs`, bytes) and hyper's
//! (`forward.rs`: bodies, upgrades, HTTP/2) — as pingora's `ProxyHttp` phases are one trait for
//! its proxies, and kamal-proxy's handlers one middleware chain.
//!
//! A front end reads a request's [`Facts`] (borrowed from its buffer or hyper's map, never
//! copied) and [`run`]s the chain over them. Each filter decides one thing and lets the
//! request on, or answers it with rollgate's own words ([`Own`]), which the front end writes in
//! its own form. In order:
//!
//! 1. [`route`]: which service takes the request — none is a 404, a host another TLS name
//!    covers a 421 — and its access log line begun when the route logs (a 421 is logged too);
//! 2. [`body_limit`]: a route's `max_request_body` — a body declared larger is answered 413
//!    before any of it goes anywhere; one of unknown length is held to it as it is read;
//! 3. [`strip_prefix`]: a route's prefix cut off the path its release is sent;
//! 4. [`retry_safety`]: whether the request may go to another replica after a failed try.
//!
//! The gate (maintenance, a pause) follows in the pass (`pass.rs`): a pause waits, so it is the
//! pass's one asynchronous step; its refusal is an [`Own`] as well. The head the release is
//! sent is rewritten by [`rewrite_head`] through the [`Head`] each front end supplies: the
//! hop-by-hop headers out (and whatever `Connection` names), the client's `X-Forwarded-*`
//! replaced (or `X-Forwarded-For` appended to, behind a trusted proxy), a Host when none. The
//! answer loses its hop-by-hop headers by the same rule ([`is_hop_by_hop`]).

use std::net::IpAddr;
use std::sync::Arc;

use hyper::header::{HeaderName, CONNECTION, UPGRADE};
use hyper::StatusCode;

use super::access::{self, Begun};
use super::counts::Reason;
use super::router::{Picked, Route, Router};
use super::service::Service;
use super::traffic::Refusal;
use super::wire::{self, push_ip};

/// What a front end read of a request, for the chain.
pub struct Facts<'a> {
    pub method: &'a str,
    /// Origin form: `/path?query`.
    pub target: &'a str,
    pub host: Option<&'a [u8]>,
    /// The client's `X-Request-Id`, which the access log keeps if it is one.
    pub request_id: Option<&'a [u8]>,
    pub body: Body,
    /// It asks for a protocol upgrade (a WebSocket).
    pub upgrade: bool,
    /// The name the connection's TLS asked for (None over plain TCP).
    pub sni: Option<&'a str>,
}

/// A request's body, as its head declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    Length(u64),
    /// Chunked, or an HTTP/2 stream without `content-length`.
    Unknown,
}

/// rollgate's own answer to a request (no release's): a status and a body of text, JSON or a
/// page. Each front end writes it in its form.
#[derive(Debug, Clone, PartialEq)]
pub struct Own {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub retry_after: Option<u64>,
    pub body: String,
    /// Why rollgate answered itself, as its route counts it (`fate.rs`).
    pub reason: Reason,
}

/// The content type of rollgate's words.
pub const TEXT: &str = "text/plain; charset=utf-8";

impl Own {
    /// A line of rollgate's words.
    pub fn text(status: StatusCode, words: String) -> Own {
        Own {
            status,
            content_type: TEXT,
            retry_after: None,
            body: words + "\n",
            reason: super::fate::reason_of(status.as_u16()),
        }
    }
}

impl Own {
    /// The 413 of [`body_limit`]: the front end reads what the client is still sending
    /// before it answers (over HTTP/2 it would otherwise reset the stream under the answer).
    pub fn refuses_the_body(&self) -> bool {
        self.status == StatusCode::PAYLOAD_TOO_LARGE
    }
}

impl From<Refusal> for Own {
    /// The gate's 503: maintenance, or a pause that ran out, as the gate worded it.
    fn from(refusal: Refusal) -> Own {
        Own {
            status: StatusCode::SERVICE_UNAVAILABLE,
            content_type: refusal.content_type,
            retry_after: refusal.retry_after,
            body: refusal.body,
            reason: Reason::Maintenance,
        }
    }
}

/// Whether a request may go to another replica after a failed try ([`retry_safety`]).
#[derive(Clone, Copy)]
pub struct Replay {
    /// GET, HEAD, OPTIONS or TRACE: may be sent again even when the connection broke after
    /// it was sent (the replica died under it), not only when it was refused.
    pub safe: bool,
    /// It can be sent again at all: it has no body (a body cannot be replayed) and is no
    /// upgrade.
    pub again: bool,
}

/// What the chain decided for a request that goes on to a release.
pub struct Passage {
    pub service: Arc<Service>,
    /// The path the release is sent, when it is not the one asked (a prefix stripped).
    pub target: Option<String>,
    pub replay: Replay,
    /// A body of unknown length may be read up to this many bytes (then 413).
    pub body_limit: Option<u64>,
}

/// The chain's verdict, and what it began whatever the verdict: the service a route gave (a
/// 421 has one) and the access log line.
pub struct Decided {
    pub service: Option<Arc<Service>>,
    pub begun: Option<Box<Begun>>,
    pub verdict: Result<Passage, Own>,
}

/// One filter's word on a request.
pub enum Flow {
    Next,
    Answer(Own),
}

/// What the filters know of a request as it goes down the chain.
pub struct State<'r, 'a> {
    facts: &'a Facts<'a>,
    router: &'r Router,
    thread: usize,
    /// A buffer for the access log line (the front end's, reused from its last request).
    line: &'a mut Vec<u8>,
    route: Option<&'r Route>,
    target: Option<String>,
    begun: Option<Box<Begun>>,
    replay: Replay,
    body_limit: Option<u64>,
}

/// A filter of the chain.
pub type Filter = for<'r, 'a> fn(&mut State<'r, 'a>) -> Flow;

/// The chain, in order (see the module's comment).
pub const CHAIN: [(&str, Filter); 4] = [
    ("route", route),
    ("body_limit", body_limit),
    ("strip_prefix", strip_prefix),
    ("retry_safety", retry_safety),
];

/// Runs every filter of the chain over `facts`, in order, until one answers.
pub fn run(router: &Router, facts: &Facts<'_>, thread: usize, line: &mut Vec<u8>) -> Decided {
    let mut state = State {
        facts,
        router,
        thread,
        line,
        route: None,
        target: None,
        begun: None,
        replay: Replay {
            safe: false,
            again: false,
        },
        body_limit: None,
    };
    let mut answer = None;
    for (_, filter) in CHAIN {
        if let Flow::Answer(own) = filter(&mut state) {
            answer = Some(own);
            break;
        }
    }
    let service = state.route.map(|route| route.service.clone());
    let verdict = match (answer, &service) {
        (Some(own), _) => Err(own),
        (None, Some(service)) => Ok(Passage {
            service: service.clone(),
            target: state.target,
            replay: state.replay,
            body_limit: state.body_limit,
        }),
        // Every request is routed or answered by `route`.
        (None, None) => Err(Own::text(
            StatusCode::NOT_FOUND,
            wire::no_route(&wire::host_name(facts.host.unwrap_or(b""))),
        )),
    };
    Decided {
        service,
        begun: state.begun,
        verdict,
    }
}

/// Which service takes the request, by host and path; its access log line begun.
pub fn route(state: &mut State<'_, '_>) -> Flow {
    let facts = state.facts;
    let host = facts.host.unwrap_or(b"");
    let route = match state.router.pick(host, facts.target.as_bytes()) {
        Picked::Route(route) => route,
        Picked::NoRoute => {
            let words = wire::no_route(&wire::host_name(host));
            return Flow::Answer(Own::text(StatusCode::NOT_FOUND, words));
        }
    };
    state.route = Some(route);
    let service = &route.service;
    if let Some(log) = service.access.as_ref().filter(|l| l.samples(state.thread)) {
        state.begun = Some(Box::new(Begun::new(
            log,
            std::mem::take(state.line),
            &service.name,
            host,
            facts.method,
            facts.target,
            facts.request_id.and_then(access::given_request_id),
        )));
    }
    if state.router.misdirected(host, facts.sni) {
        let words = "this connection's TLS name is not the request's host: connect again for \
                     that host";
        return Flow::Answer(Own::text(StatusCode::MISDIRECTED_REQUEST, words.into()));
    }
    Flow::Next
}

/// The route's `max_request_body`: a larger declared body is refused before it is read.
pub fn body_limit(state: &mut State<'_, '_>) -> Flow {
    let Some(limit) = state.route.and_then(|r| r.max_request_body) else {
        return Flow::Next;
    };
    match state.facts.body {
        Body::Length(length) if length > limit => Flow::Answer(too_large(limit)),
        Body::Unknown => {
            state.body_limit = Some(limit);
            Flow::Next
        }
        _ => Flow::Next,
    }
}

/// The 413 of a body past a route's `max_request_body`.
pub fn too_large(limit: u64) -> Own {
    Own::text(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "request body too large: this route takes at most {limit} bytes (max_request_body)"
        ),
    )
}

/// The route's `strip_prefix`: the path the release is sent.
pub fn strip_prefix(state: &mut State<'_, '_>) -> Flow {
    if let Some(route) = state.route {
        let forwarded = route.forwarded(state.facts.target);
        if forwarded != state.facts.target {
            state.target = Some(forwarded.into_owned());
        }
    }
    Flow::Next
}

/// A request without a body can be sent again: if a replica refuses the connection (it is
/// stopping, or gone before the state said so), the next least busy one gets it; a safe method
/// (GET, HEAD, OPTIONS, TRACE) also when the connection broke before any answer (the replica
/// died under it). A body cannot be replayed, nor an upgrade.
pub fn retry_safety(state: &mut State<'_, '_>) -> Flow {
    let facts = state.facts;
    state.replay = Replay {
        safe: matches!(facts.method, "GET" | "HEAD" | "OPTIONS" | "TRACE"),
        again: facts.body == Body::None && !facts.upgrade,
    };
    Flow::Next
}

/// The client's `X-Forwarded-For`, a fact the front ends read for [`rewrite_head`].
pub const FORWARDED_FOR: &str = "x-forwarded-for";

/// Hop-by-hop headers (RFC 9110 §7.6.1): meaningful for one connection only, never passed on
/// (on `front`'s path the framing of an answer is written anew). Made once, not parsed from
/// text on each request.
pub const HOP_BY_HOP: [HeaderName; 8] = [
    CONNECTION,
    HeaderName::from_static("keep-alive"),
    hyper::header::PROXY_AUTHENTICATE,
    hyper::header::PROXY_AUTHORIZATION,
    hyper::header::TE,
    hyper::header::TRAILER,
    hyper::header::TRANSFER_ENCODING,
    UPGRADE,
];

/// How a front end writes the head a release is sent (or an answer's, for the client).
pub trait Head {
    /// Leaves out each of the message's headers `dropped` says, by name.
    fn drop_where(&mut self, dropped: impl Fn(&[u8]) -> bool);
    /// Adds a header, its value written by `value`.
    fn add(&mut self, name: &'static str, value: impl FnOnce(&mut Vec<u8>));
}

/// What the forwarding rules need to know of the client and its request.
pub struct Client<'a> {
    pub peer: IpAddr,
    pub tls: bool,
    /// The client's own `X-Forwarded-For` (its first), and whether to trust it.
    pub forwarded_for: Option<&'a [u8]>,
    pub trust_forwarded: bool,
    pub has_host: bool,
    /// The headers the client's `Connection` names (hop-by-hop for this connection only).
    pub named: &'a [&'a [u8]],
    /// An upgrade's protocol (`Upgrade:`), passed on with `Connection: upgrade`.
    pub upgrade: Option<&'a [u8]>,
}

/// The head a release is sent: hop-by-hop headers out, a Host when none, `X-Forwarded-For`
/// (the client's own replaced, anyone could claim any address — unless it comes through a
/// proxy the operator trusts: then the address is appended) and `X-Forwarded-Proto`, and an
/// upgrade's two headers back in.
pub fn rewrite_head(head: &mut impl Head, client: &Client<'_>) {
    head.drop_where(|name| {
        is_hop_by_hop(name, client.named)
            || name.eq_ignore_ascii_case(FORWARDED_FOR.as_bytes())
            || name.eq_ignore_ascii_case(b"x-forwarded-proto")
    });
    if !client.has_host {
        head.add("host", |value| value.extend_from_slice(b"localhost"));
    }
    head.add(FORWARDED_FOR, |value| {
        if let Some(earlier) = client.forwarded_for.filter(|_| client.trust_forwarded) {
            value.extend_from_slice(earlier);
            value.extend_from_slice(b", ");
        }
        push_ip(value, client.peer);
    });
    let proto: &[u8] = if client.tls { b"https" } else { b"http" };
    head.add("x-forwarded-proto", |value| value.extend_from_slice(proto));
    if let Some(upgrade) = client.upgrade {
        head.add("connection", |value| value.extend_from_slice(b"upgrade"));
        head.add("upgrade", |value| value.extend_from_slice(upgrade));
    }
}

/// Whether a header is hop-by-hop (RFC 9110 §7.6.1): meaningful for one connection only,
/// never passed on — one of the standard ones, or one its message's `Connection` names.
pub fn is_hop_by_hop(name: &[u8], named: &[&[u8]]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n.as_str().as_bytes()))
        || named.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// The headers a message's `Connection` values name (not `close`, `keep-alive` or `upgrade`,
/// which say how the connection goes on).
pub fn connection_named<'h>(values: impl Iterator<Item = &'h [u8]>) -> Vec<&'h [u8]> {
    values
        .flat_map(|v| v.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| {
            !t.is_empty()
                && !t.eq_ignore_ascii_case(b"close")
                && !t.eq_ignore_ascii_case(b"keep-alive")
                && !t.eq_ignore_ascii_case(b"upgrade")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head written as bytes, as `front.rs` writes one.
    struct Written<'h> {
        headers: &'h [(&'h str, &'h str)],
        out: Vec<u8>,
    }

    impl Head for Written<'_> {
        fn drop_where(&mut self, dropped: impl Fn(&[u8]) -> bool) {
            for (name, value) in self.headers {
                if !dropped(name.as_bytes()) {
                    self.out
                        .extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
                }
            }
        }

        fn add(&mut self, name: &'static str, value: impl FnOnce(&mut Vec<u8>)) {
            self.out.extend_from_slice(name.as_bytes());
            self.out.extend_from_slice(b": ");
            value(&mut self.out);
            self.out.extend_from_slice(b"\r\n");
        }
    }

    #[test]
    fn the_release_is_sent_no_hop_by_hop_header_and_the_forwarding_ones_anew() {
        let headers = [
            ("Host", "a.test"),
            ("Connection", "keep-alive, X-Secret"),
            ("X-Secret", "1"),
            ("Keep-Alive", "timeout=5"),
            ("X-Forwarded-For", "6.6.6.6"),
            ("X-Forwarded-Proto", "https"),
            ("Accept", "*/*"),
        ];
        let named = connection_named(["keep-alive, X-Secret".as_bytes()].into_iter());
        assert_eq!(named, [b"X-Secret".as_slice()]);
        for (trust, forwarded) in [(false, "10.0.0.9"), (true, "6.6.6.6, 10.0.0.9")] {
            let mut head = Written {
                headers: &headers,
                out: Vec::new(),
            };
            rewrite_head(
                &mut head,
                &Client {
                    peer: "10.0.0.9".parse().unwrap(),
                    tls: false,
                    forwarded_for: Some(b"6.6.6.6"),
                    trust_forwarded: trust,
                    has_host: true,
                    named: &named,
                    upgrade: None,
                },
            );
            assert_eq!(
                String::from_utf8(head.out).unwrap(),
                format!(
                    "Host: a.test\r\nAccept: */*\r\nx-forwarded-for: {forwarded}\r\n\
                     x-forwarded-proto: http\r\n"
                )
            );
        }
    }
}
