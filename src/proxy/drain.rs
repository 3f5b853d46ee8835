//! A client's request body read to its end whatever the release does with it (issue 79).
//!
//! hyper's server keeps a client's connection for its next request only once the request's
//! body has been read to its end. A release that answers and closes before the proxy has
//! forwarded the body's last bytes (gunicorn's sync worker, a form whose body came a moment
//! after its head) made hyper's client drop the body; hyper's server then read what was already
//! there and, finding the body unfinished, closed the connection after the answer — whose head
//! had already gone without `Connection: close`. The client's next request met EOF: never
//! answered, never logged, never counted.
//!
//! [`Drained`] wraps the body the release is sent. Dropped before its end, it hands the rest to
//! a task that reads it and throws it away — at most [`DRAINED_AT_MOST`] bytes, each read held
//! to the body's idle time (the inner body's) — so the connection stays whole, as nginx's
//! discarding of an unread body does. [`Settled`] tells the request pass, when the answer is
//! ready, whether the connection can be kept: the body ended or is still being sent to a
//! release that reads while it answers; else, once a short wait for the drain is over, the
//! answer says `Connection: close`, so a client is never left with a connection closed under
//! it without being told.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use tokio::sync::watch;

use super::idle::{BoxError, IdleBody};

/// The most of a body's rest that is read and thrown away after the release stopped reading.
pub const DRAINED_AT_MOST: u64 = 1 << 20;

/// The most of an HTTP/2 request's body that is read and thrown away beside rollgate's answer
/// refusing it ([`discard`]); past it, the stream is reset.
pub const DISCARDED_AT_MOST: u64 = 64 << 20;

/// How long an answer waits for a drain under way before it goes with `Connection: close`.
pub const DRAIN_WAIT: Duration = Duration::from_secs(1);

/// Where a request body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Being sent to the release.
    Streaming,
    /// Read to its end (by the release's connection or the drain).
    Ended,
    /// The release stopped reading it; its rest is being read and thrown away.
    Draining,
    /// Its rest was more than the drain reads, or broke off while drained: the connection
    /// cannot be kept.
    Unfinished,
    /// It broke off while being sent to the release: the client left (closed its connection,
    /// reset its stream) or stopped sending. Its request's failure is the client's.
    ClientLeft,
}

/// The client's body as a release is sent it, read to its end whatever happens to it (see the
/// module).
pub struct Drained {
    inner: Option<IdleBody<Incoming>>,
    stage: Arc<watch::Sender<Stage>>,
}

/// What the request pass asks of a [`Drained`] body once the answer is ready.
#[derive(Clone)]
pub struct Settled(watch::Receiver<Stage>);

impl Drained {
    pub fn new(inner: IdleBody<Incoming>) -> (Drained, Settled) {
        let (stage, seen) = watch::channel(Stage::Streaming);
        let drained = Drained {
            inner: Some(inner),
            stage: Arc::new(stage),
        };
        (drained, Settled(seen))
    }
}

impl Settled {
    /// Whether the client's connection can be kept after this answer: its body ended, or is
    /// still being sent to the release (which may read while it answers); a drain under way is
    /// waited for up to `within`.
    pub async fn keeps_the_connection(mut self, within: Duration) -> bool {
        let stage = *self.0.borrow();
        match stage {
            Stage::Streaming | Stage::Ended => true,
            Stage::Unfinished | Stage::ClientLeft => false,
            Stage::Draining => {
                let settled = self.0.wait_for(|s| *s != Stage::Draining);
                matches!(
                    tokio::time::timeout(within, settled).await,
                    Ok(Ok(stage)) if *stage == Stage::Ended
                )
            }
        }
    }
}

impl Settled {
    /// Whether the body broke off on the client's side while the release was being sent it: a
    /// failure of that request is the client's leaving, not the release's.
    pub fn client_left(&self) -> bool {
        *self.0.borrow() == Stage::ClientLeft
    }
}

impl Body for Drained {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                self.stage.send_replace(Stage::Ended);
            }
            Poll::Ready(Some(Err(_))) => {
                self.stage.send_replace(Stage::ClientLeft);
            }
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(SizeHint::default, Body::size_hint)
    }
}

impl Drop for Drained {
    fn drop(&mut self) {
        // Only a body the release stopped reading part-way has a rest to read.
        if *self.stage.borrow() != Stage::Streaming {
            return;
        }
        if let Some(inner) = self.inner.take() {
            drain_rest(inner, self.stage.clone());
        }
    }
}

/// Reads the rest of `body` in a task of its own (see the module); `stage` says how it ended.
fn drain_rest(mut body: IdleBody<Incoming>, stage: Arc<watch::Sender<Stage>>) {
    if body.is_end_stream() {
        stage.send_replace(Stage::Ended);
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        stage.send_replace(Stage::Unfinished);
        return;
    };
    stage.send_replace(Stage::Draining);
    runtime.spawn(async move {
        use http_body_util::BodyExt;
        let mut read = 0u64;
        let finished = loop {
            match body.frame().await {
                None => break true,
                Some(Err(_)) => break false,
                Some(Ok(frame)) => {
                    read += frame.data_ref().map_or(0, |d| d.len() as u64);
                    if read > DRAINED_AT_MOST {
                        break false;
                    }
                }
            }
        };
        stage.send_replace(match finished {
            true => Stage::Ended,
            false => Stage::Unfinished,
        });
    });
}

/// Reads `body` to its end in a task of its own and throws it away (at most
/// [`DISCARDED_AT_MOST`], each read held to the body's idle time): an HTTP/2 request rollgate
/// answers without reading (a 413) has its stream end cleanly after the answer, as nginx
/// discards such a body. Its stream reset under the answer instead, clients that were still
/// sending (curl 7.88) reported a stream error and never showed the answer.
pub fn discard(mut body: IdleBody<Incoming>) {
    if body.is_end_stream() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        use http_body_util::BodyExt;
        let mut read = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            read += frame.data_ref().map_or(0, |d| d.len() as u64);
            if read > DISCARDED_AT_MOST {
                return;
            }
        }
    });
}
