//! One request's pass through the proxy, the same for both front ends (the HTTP/1.1 fast path
//! in `front.rs` and hyper's in `forward.rs`), as pingora's `ProxyHttp` is for its proxies —
//! once the chain of rules (`rules.rs`: route, body limit, prefix, retry safety) let it on:
//! **gate** (a service in maintenance or paused answers itself), **lease** (the least busy release of the service's pool), **send**, and
//! **retry** on another replica when the one tried refused the connection — or, for a safe
//! method, lost it before any answer — and the request can be sent again. What differs
//! between the two front ends is how a request is sent and which connections they keep: that
//! is a [`Sender`]; the decisions are here, once.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::header::HeaderName;
use hyper::StatusCode;

use super::counts::Miss;
use super::failure::Failure;
use super::leases::Lease;
use super::router;
use super::rules::{Own, Replay};
use super::service::Service;
use super::traffic::{Passage, Refusal};
use super::upstream;
use super::wire::{no_release_took_it, release_failed};

/// What every request needs to know: one serving thread's share of the proxy.
pub struct Shared {
    /// This serving thread's copy of the routes in force: which service takes a request.
    pub router: router::Local,
    /// This serving thread's turn among equally busy replicas.
    pub turns: AtomicUsize,
    /// This serving thread's idle connections to releases.
    pub idle: Arc<upstream::Idle>,
    /// Response header naming the release that answered, if enabled.
    pub version_header: Option<HeaderName>,
    /// A request or response body with no data for this long is cut.
    pub body_idle: Duration,
    /// An upgraded tunnel with no byte either way for this long is closed.
    pub tunnel_idle: Duration,
    /// This serving thread's open tunnels, kept until the drain timeout when the proxy stops.
    pub tunnels: Arc<super::tunnel::Tunnels>,
    /// Keep the client's `X-Forwarded-For` and append to it (behind another proxy); otherwise
    /// it is replaced, so a client cannot forge where it comes from.
    pub trust_forwarded: bool,
    /// This serving thread's number: its shard of every release's counts.
    pub thread: usize,
    /// Whether answers are counted (`counts.rs`); off only to measure what counting costs.
    pub counting: bool,
    /// A request head must arrive within this (slowloris); also the longest idle time between
    /// two requests of a connection.
    pub header_read_timeout: Duration,
    /// Largest request head accepted; a larger one is hyper's to refuse (431).
    pub max_header_bytes: usize,
}

/// Step two: the traffic gate of a service that is not serving (maintenance, or a pause that
/// ran out) refuses the request with this; None lets it go on. `wants_json` is asked only
/// then (the client's `Accept`).
pub async fn gate(service: &Service, wants_json: impl FnOnce() -> bool) -> Option<Refusal> {
    if service.gate.serving() {
        return None;
    }
    match service.gate.pass(wants_json()).await {
        Passage::Refused(refusal) => Some(refusal),
        Passage::Go => None,
    }
}

/// How a front end sends a request to a release, and keeps its connections to releases.
pub trait Sender {
    /// What a release answered (its head, and how to read the rest).
    type Answer;

    /// A lease on the least busy release of `service` not in `tried` (ports), through this
    /// connection's view of the service's table; and the pool's size.
    fn lease(
        &mut self,
        service: &Service,
        tried: &[u16],
        turns: &AtomicUsize,
    ) -> (Option<Lease>, usize);

    /// Sends the request to the release `lease` names.
    async fn send(&mut self, lease: &Lease) -> Result<Self::Answer, Failure>;

    /// The answer's status, for the counts.
    fn status(answer: &Self::Answer) -> u16;
}

/// How the pass ended.
pub enum Outcome<A> {
    /// A release answered; the lease lasts as long as its answer is being sent.
    Answered(Lease, A),
    /// No release did: rollgate's own answer (503 nothing live, 502 every replica tried
    /// refused or the one tried failed), in its words; and the release whose failure it tells
    /// (counted on it), if one.
    Own(Own, Option<Failed>),
}

/// The release a request failed on, and how (`counts::Miss`).
pub struct Failed {
    pub version: String,
    pub slot: u16,
    pub miss: Miss,
}

/// Steps three to five: lease a release of `service`, send, count what came back, and try
/// another replica while `replay` allows and the pool has one not tried yet.
pub async fn to_a_release<S: Sender>(
    ctx: &Shared,
    service: &Service,
    sender: &mut S,
    replay: Replay,
) -> Outcome<S::Answer> {
    let mut tried: Vec<u16> = Vec::new();
    let mut refusals: Vec<String> = Vec::new();
    loop {
        let (lease, pool_size) = sender.lease(service, &tried, &ctx.turns);
        let Some(lease) = lease else {
            let status = match refusals.is_empty() {
                true => StatusCode::SERVICE_UNAVAILABLE,
                false => StatusCode::BAD_GATEWAY,
            };
            let words = no_release_took_it(&service.root_text, &refusals, pool_size);
            return Outcome::Own(Own::text(status, words), None);
        };
        let sent = ctx.counting.then(Instant::now);
        let result = sender.send(&lease).await;
        let counts = ctx.counting.then_some(&lease.target.counts);
        let failure = match result {
            Ok(answer) => {
                if let (Some(counts), Some(sent)) = (counts, sent) {
                    counts.answered(ctx.thread, S::status(&answer), sent.elapsed());
                }
                return Outcome::Answered(lease, answer);
            }
            Err(failure) => failure,
        };
        // The client's leaving is no failure of the release's: not counted, not retried; its
        // line says 499 (`forward::CLIENT_CLOSED`).
        if matches!(failure, Failure::ClientLeft) {
            let status = StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST);
            return Outcome::Own(Own::text(status, failure.to_string()), None);
        }
        let target = &lease.target;
        let refused = failure.is_refused();
        let lost = replay.safe && failure.is_lost_connection();
        // Another replica may take it (the last one's failure is told as it is). Counted as a
        // retry, not a failure: what the user got is counted where the request ends.
        if (refused || lost) && replay.again && pool_size > tried.len() + 1 {
            if let Some(counts) = counts {
                counts.retried(ctx.thread);
            }
            tried.push(target.port);
            refusals.push(format!("{} on 127.0.0.1:{}", target.version, target.port));
            continue;
        }
        let miss = failure.miss();
        if let Some(counts) = counts {
            counts.missed(ctx.thread, miss);
        }
        let words = release_failed(&target.version, target.port, refused, pool_size);
        let failed = Failed {
            version: target.version.clone(),
            slot: target.slot,
            miss,
        };
        return Outcome::Own(Own::text(StatusCode::BAD_GATEWAY, words), Some(failed));
    }
}
