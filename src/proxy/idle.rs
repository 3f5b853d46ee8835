//! Idle timeouts for what the header timeout does not cover: a request body that stops
//! arriving, a response body that stops streaming, an upgraded tunnel where nothing moves. Each
//! holds a connection slot, so without a timeout a few slow clients (or a stuck release) could
//! fill `--max-connections`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Bytes, Frame};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The error a stalled body ends with.
#[derive(Debug)]
pub struct IdleTimeout {
    what: &'static str,
    after: Duration,
}

impl std::fmt::Display for IdleTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} idle for {} ms", self.what, self.after.as_millis())
    }
}

impl std::error::Error for IdleTimeout {}

pin_project_lite::pin_project! {
    /// A body that fails once no frame has arrived for `after`. The timer is boxed so the
    /// body stays `Unpin` (the upstream client needs that), and made only the first time the
    /// body has nothing to give: a small answer that is there at once costs no timer.
    pub struct IdleBody<B> {
        #[pin]
        inner: B,
        timer: Option<Pin<Box<Sleep>>>,
        after: Duration,
        what: &'static str,
    }
}

impl<B> IdleBody<B> {
    pub fn new(inner: B, after: Duration, what: &'static str) -> Self {
        IdleBody {
            inner,
            timer: None,
            after,
            what,
        }
    }

    /// The body underneath, its timer gone.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some(timer) = this.timer.as_mut() {
                    timer.as_mut().reset(Instant::now() + *this.after);
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(*this.after)))
                .as_mut()
                .poll(cx)
            {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(IdleTimeout {
                    what: this.what,
                    after: *this.after,
                })))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// When anything last moved through a tunnel, in milliseconds since `base`.
#[derive(Debug)]
pub struct Activity {
    base: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            base: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        let ms = self.base.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Resolves once nothing has moved for `after`.
    pub async fn idle_for(&self, after: Duration) {
        loop {
            let last = self.base + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            if last.elapsed() >= after {
                return;
            }
            tokio::time::sleep_until(last + after).await;
        }
    }
}

pin_project_lite::pin_project! {
    /// One end of a tunnel, noting every byte read or written in the shared [`Activity`].
    pub struct Watched<T> {
        #[pin]
        io: T,
        activity: Arc<Activity>,
    }
}

impl<T> Watched<T> {
    pub fn new(io: T, activity: Arc<Activity>) -> Self {
        Watched { io, activity }
    }
}

impl<T: AsyncRead> AsyncRead for Watched<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.io.poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.touch();
        }
        polled
    }
}

impl<T: AsyncWrite> AsyncWrite for Watched<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let polled = this.io.poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// One frame, then nothing ever again.
    struct OneThenStall(Option<Bytes>);

    impl Body for OneThenStall {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            match self.0.take() {
                Some(data) => Poll::Ready(Some(Ok(Frame::data(data)))),
                None => Poll::Pending,
            }
        }
    }

    #[tokio::test]
    async fn a_body_that_stops_arriving_fails_after_the_idle_time() {
        let stalled = OneThenStall(Some(Bytes::from_static(b"a")));
        let mut idle = IdleBody::new(stalled, Duration::from_millis(50), "request body");
        let first = idle.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "a");
        let started = std::time::Instant::now();
        let err = idle.frame().await.unwrap().unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(45));
        assert_eq!(err.to_string(), "request body idle for 50 ms");
    }
}
