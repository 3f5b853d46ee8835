//! The connections to the releases, kept per client connection: a client's requests go over
//! the same connection to the same release for as long as both stay open, with no shared pool
//! to look up (no lock, no key to build) and no connection task of a pool between the two. A
//! client connection holds at most one connection per release it has sent to. When it ends,
//! they go to its serving thread's idle set ([`Idle`], at most [`IDLE_PER_THREAD`]), where the
//! next client connection finds them: a client that opens a connection per request still
//! reuses the connection to the release, as nginx's `keepalive` does per worker.

use http_body_util::Either;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use std::sync::Arc;

use super::failure::{classify, Failure};
use super::relay::Wire;

/// A request body on its way to the release, failing if the client stops sending it; or none.
pub type UpstreamBody = Either<super::drain::Drained, http_body_util::Full<Bytes>>;

/// Idle connections to releases kept by one serving thread, of each kind (see [`Idle`]). Clients
/// that connect per request keep about as many connections to the release busy as they have
/// in flight; with nginx's `keepalive 64` a burst of 128 per thread closed and reopened an
/// eighth of them (strace, issue 40). Idle connections cost a release a descriptor each.
pub const IDLE_PER_THREAD: usize = 256;

/// A connection that can tell whether the release has closed it.
pub trait Reusable {
    fn still_open(&self) -> bool;
}

impl Reusable for SendRequest<UpstreamBody> {
    fn still_open(&self) -> bool {
        !self.is_closed()
    }
}

impl Reusable for Wire {
    fn still_open(&self) -> bool {
        Wire::still_open(self)
    }
}

/// Connections to releases by port, newest last. One client connection's (a handful at most:
/// one per replica it has sent to) or one serving thread's: only its own task or thread uses
/// it, so its lock is never contended.
pub struct Shelf<C> {
    kept: std::sync::Mutex<Vec<(u16, C)>>,
}

impl<C> Default for Shelf<C> {
    fn default() -> Self {
        Shelf {
            kept: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl<C: Reusable> Shelf<C> {
    /// A connection to `port` still open (the newest), taken out while it is used. Looks from
    /// the newest back, dropping closed ones on the way: the first usually serves.
    pub fn take(&self, port: u16) -> Option<C> {
        let mut kept = self.kept.lock().ok()?;
        let mut at = kept.len();
        while at > 0 {
            at -= 1;
            if kept[at].0 != port {
                continue;
            }
            let (_, connection) = kept.remove(at);
            if connection.still_open() {
                return Some(connection);
            }
        }
        None
    }

    pub fn put(&self, port: u16, connection: C) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.push((port, connection));
        }
    }

    /// Everything on the shelf, taken off it.
    fn take_all(&self) -> Vec<(u16, C)> {
        self.kept
            .lock()
            .map(|mut kept| std::mem::take(&mut *kept))
            .unwrap_or_default()
    }

    /// Takes `connections` in, keeping at most `bound` (the oldest go first: a release closes
    /// long-idle ones anyway).
    fn give(&self, connections: Vec<(u16, C)>, bound: usize) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        kept.extend(connections.into_iter().filter(|(_, c)| c.still_open()));
        let over = kept.len().saturating_sub(bound);
        kept.drain(..over);
    }

    /// Forgets connections to ports no release of `live` is on.
    pub fn keep_only(&self, live: impl Fn(u16) -> bool) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.retain(|(port, _)| live(*port));
        }
    }
}

/// One serving thread's idle connections to releases: hyper's (for requests with a body and
/// upgrades) and `relay`'s (for the requests `front` serves).
#[derive(Default)]
pub struct Idle {
    senders: Shelf<SendRequest<UpstreamBody>>,
    wires: Shelf<Wire>,
}

impl Idle {
    /// An idle relay connection to `port` still open, taken out while it is used.
    pub fn take_wire(&self, port: u16) -> Option<Wire> {
        self.wires.take(port)
    }

    /// Takes back a client connection's relay connections as it ends.
    pub fn give_wires(&self, wires: Vec<(u16, Wire)>) {
        self.wires.give(wires, IDLE_PER_THREAD);
    }
}

/// One client connection's hyper connections to releases (a connection hyper serves, see
/// `front.rs`). Dropped with the client connection: they go to the thread's idle set.
pub struct Upstreams {
    senders: Shelf<SendRequest<UpstreamBody>>,
    idle: Arc<Idle>,
}

impl Drop for Upstreams {
    fn drop(&mut self) {
        self.idle
            .senders
            .give(self.senders.take_all(), IDLE_PER_THREAD);
    }
}

impl Upstreams {
    pub fn new(idle: Arc<Idle>) -> Upstreams {
        Upstreams {
            senders: Shelf::default(),
            idle,
        }
    }

    /// A hyper connection to `port` that is still open (this client's, else an idle one of
    /// the thread's), taken out while it is used.
    pub fn take(&mut self, port: u16) -> Option<SendRequest<UpstreamBody>> {
        self.senders
            .take(port)
            .or_else(|| self.idle.senders.take(port))
    }

    /// Gives a connection back for the client's next request.
    pub fn put(&mut self, port: u16, sender: SendRequest<UpstreamBody>) {
        if !sender.is_closed() {
            self.senders.put(port, sender);
        }
    }

    /// Forgets connections to ports no release of `live` is on.
    pub fn keep_only(&mut self, live: impl Fn(u16) -> bool) {
        self.senders.keep_only(&live);
    }
}

/// A new connection to the release on 127.0.0.1:`port`, its driver running on this thread.
pub async fn connect(port: u16) -> Result<SendRequest<UpstreamBody>, Failure> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(Failure::Connect)?;
    // Small requests and answers: do not let Nagle hold them back.
    let _ = stream.set_nodelay(true);
    let (sender, connection) = http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(classify)?;
    tokio::spawn(async move {
        // Ends when the release closes it or every sender is gone; an upgrade takes it over.
        let _ = connection.with_upgrades().await;
    });
    Ok(sender)
}

/// Sends `request` over `kept` (a connection this client used before) when it is still good,
/// else over a new one; a request a kept connection could not even send (the release closed
/// it meanwhile) goes over a new connection, whatever its method. Returns the answer and the
/// connection it came over, for the next request.
pub async fn send(
    kept: Option<SendRequest<UpstreamBody>>,
    port: u16,
    request: Request<UpstreamBody>,
) -> Result<(Response<Incoming>, SendRequest<UpstreamBody>), Failure> {
    let mut request = request;
    if let Some(mut sender) = kept {
        if sender.ready().await.is_ok() {
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, sender)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(classify(e.into_error())),
                },
            }
        }
    }
    let mut sender = connect(port).await?;
    sender.ready().await.map_err(classify)?;
    let response = sender.send_request(request).await.map_err(classify)?;
    Ok((response, sender))
}
