//! Why a request got no answer from a release, in the terms both ways of sending one share
//! (hyper's client and `relay.rs`'s bytes): whether another replica may take it, and how the
//! counts file it.

use std::io::ErrorKind;

use super::counts::Miss;

/// Why a request did not get an answer from a release.
#[derive(Debug)]
pub enum Failure {
    /// No connection could be made (ConnectionRefused: nothing listens; nothing was sent).
    Connect(std::io::Error),
    /// The connection broke or closed before an answer came: the request may have been read.
    Lost(hyper::Error),
    /// Anything else the exchange failed on.
    Other(hyper::Error),
    /// The connection broke or closed before the answer was whole (`relay`).
    Broken(std::io::Error),
    /// The release's answer was not HTTP as RFC 9112 allows it (`relay`).
    Garbled(String),
    /// A request whose body went with an earlier try was asked to go again (never: the pass
    /// sends such a request once; said rather than assumed).
    Spent,
    /// The client left while its request's body was being sent (issue 79): no failure of the
    /// release's, never counted against it.
    ClientLeft,
}

impl Failure {
    /// The release refused the connection: nothing was sent, any request may go elsewhere.
    pub fn is_refused(&self) -> bool {
        matches!(self, Failure::Connect(e) if e.kind() == ErrorKind::ConnectionRefused)
    }

    /// How the counts file it (`counts.rs`).
    pub fn miss(&self) -> Miss {
        match self {
            _ if self.is_refused() => Miss::Refused,
            Failure::Connect(_) | Failure::Lost(_) | Failure::Broken(_) => Miss::Reset,
            Failure::Other(_) | Failure::Garbled(_) | Failure::Spent | Failure::ClientLeft => {
                Miss::Other
            }
        }
    }

    /// No answer came because the connection could not be made or broke: a safe method may be
    /// sent again to another release.
    pub fn is_lost_connection(&self) -> bool {
        matches!(
            self,
            Failure::Connect(_) | Failure::Lost(_) | Failure::Broken(_)
        )
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Connect(e) => write!(f, "connect: {e}"),
            Failure::Lost(e) | Failure::Other(e) => write!(f, "{e}"),
            Failure::Broken(e) => write!(f, "{e}"),
            Failure::Garbled(what) => write!(f, "the release sent {what}"),
            Failure::Spent => f.write_str("the request's body went with an earlier try"),
            Failure::ClientLeft => f.write_str("the client left before its request was whole"),
        }
    }
}

pub fn classify(e: hyper::Error) -> Failure {
    let lost = e.is_incomplete_message() || e.is_closed() || e.is_canceled() || {
        let mut source = std::error::Error::source(&e);
        let mut broken = false;
        while let Some(cause) = source {
            if let Some(io) = cause.downcast_ref::<std::io::Error>() {
                broken |= matches!(
                    io.kind(),
                    ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::BrokenPipe
                );
            }
            source = cause.source();
        }
        broken
    };
    if lost {
        Failure::Lost(e)
    } else {
        Failure::Other(e)
    }
}
