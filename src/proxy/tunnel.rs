//! An upgraded connection (a WebSocket, or any other `Upgrade:` protocol) joined to the
//! release's: bytes both ways until either end closes or nothing moves for `tunnel_idle`.
//!
//! A stopping proxy (SIGTERM, or a hand-over to a new one) keeps its tunnels for the drain
//! timeout (`--drain-timeout-ms`): most end by themselves meanwhile. A WebSocket still open
//! then is closed as RFC 6455 has a server that goes away close it: a Close frame with status
//! 1001 ("going away"), sent at a frame boundary of what the release sends (a frame begun is
//! finished first, never cut), after which the release's frames stop; the client's own Close
//! is still passed on to the release, so both ends see a clean close. Any other tunnel is shut.
//! The serving thread waits for its tunnels before it ends ([`Tunnels::all_closed`]).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::idle::{Activity, Watched};

/// After the drain timeout, how long a frame the release has begun may take to finish, and
/// how long the client has to answer the Close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// The Close frame a going-away server sends: FIN + opcode 8, unmasked, status 1001 and a
/// reason.
const GOING_AWAY: &[u8] = b"\x88\x0f\x03\xe9proxy restart";

/// One serving thread's open tunnels, and when they are to go.
pub struct Tunnels {
    open: AtomicUsize,
    closed: tokio::sync::Notify,
    /// True once the proxy stops accepting (a signal, a hand-over).
    stop: tokio::sync::watch::Receiver<bool>,
    /// How long tunnels are kept after that.
    drain: Duration,
}

impl Tunnels {
    pub fn new(stop: tokio::sync::watch::Receiver<bool>, drain: Duration) -> Arc<Tunnels> {
        Arc::new(Tunnels {
            open: AtomicUsize::new(0),
            closed: tokio::sync::Notify::new(),
            stop,
            drain,
        })
    }

    /// Resolves once no tunnel of this thread is open.
    pub async fn all_closed(&self) {
        loop {
            let closed = self.closed.notified();
            if self.open.load(Ordering::SeqCst) == 0 {
                return;
            }
            closed.await;
        }
    }

    /// Resolves at the drain timeout after the proxy began to stop (never if it does not).
    async fn going_away(&self) {
        let mut stop = self.stop.clone();
        while !*stop.borrow_and_update() {
            if stop.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        tokio::time::sleep(self.drain).await;
    }
}

/// A tunnel counted open while it lives.
struct Open(Arc<Tunnels>);

impl Open {
    fn new(tunnels: Arc<Tunnels>) -> Open {
        tunnels.open.fetch_add(1, Ordering::SeqCst);
        Open(tunnels)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
        self.0.closed.notify_waiters();
    }
}

/// Joins the client's upgraded connection to the release's until both ends are done, nothing
/// moves either way for `idle`, or the proxy's drain timeout closes it — or `sent_away`
/// resolves: the release is being stopped (a WebSocket with 1001 either way).
pub async fn join<C, U>(
    client: C,
    upstream: U,
    websocket: bool,
    idle: Duration,
    tunnels: Arc<Tunnels>,
    sent_away: impl Future<Output = ()>,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let _open = Open::new(tunnels.clone());
    let activity = Activity::new();
    let (mut client_read, mut client_write) =
        tokio::io::split(Watched::new(client, activity.clone()));
    let (mut release_read, mut release_write) =
        tokio::io::split(Watched::new(upstream, activity.clone()));
    // The client's Close, once passed to the release, ends a tunnel that went away: the
    // server closes the connection after the closing handshake (RFC 6455, 7.1.1).
    let client_closed = tokio::sync::Notify::new();
    let to_release = to_release(
        &mut client_read,
        &mut release_write,
        websocket,
        &client_closed,
    );
    let going_away = async {
        tokio::select! {
            () = tunnels.going_away() => {}
            () = sent_away => {}
        }
    };
    let to_client = to_client(&mut release_read, &mut client_write, websocket, going_away);
    let relay = async {
        tokio::pin!(to_release, to_client);
        let (mut release_done, mut client_done) = (false, false);
        while !(release_done && client_done) {
            tokio::select! {
                copied = &mut to_release, if !release_done => {
                    release_done = true;
                    if copied.is_err() {
                        return;
                    }
                }
                ended = &mut to_client, if !client_done => {
                    client_done = true;
                    match ended {
                        Ok(Ended::Closed) => {}
                        // The client answers the Close (passed on to the release), or not.
                        Ok(Ended::WentAway) if !release_done => {
                            let answered = async {
                                tokio::select! {
                                    _ = &mut to_release => {}
                                    () = client_closed.notified() => {}
                                }
                            };
                            let _ = tokio::time::timeout(CLOSE_WAIT, answered).await;
                            return;
                        }
                        Ok(Ended::WentAway) | Err(_) => return,
                    }
                }
            }
        }
    };
    tokio::select! {
        _ = relay => {}
        _ = activity.idle_for(idle) => {}
    }
}

/// The client's bytes to the release until the client closes (then the release's write side is
/// shut); `client_closed` is told of each Close frame of a WebSocket's client passed on.
async fn to_release<R, W>(
    client: &mut R,
    release: &mut W,
    websocket: bool,
    client_closed: &tokio::sync::Notify,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut frames = websocket.then(Frames::default);
    let mut buffer = vec![0u8; 16 << 10];
    loop {
        let read = client.read(&mut buffer).await?;
        if read == 0 {
            return release.shutdown().await;
        }
        release.write_all(&buffer[..read]).await?;
        if let Some(frames) = &mut frames {
            let closes = frames.closes;
            frames.advance(&buffer[..read], false);
            if frames.closes > closes {
                client_closed.notify_one();
            }
        }
    }
}

/// How the release's side of a tunnel ended.
enum Ended {
    /// The release closed it; the client was told (its write side shut).
    Closed,
    /// The drain timeout: a WebSocket's client got a Close (1001).
    WentAway,
}

/// The release's bytes to the client, until the release closes or `going_away` resolves.
async fn to_client<R, W>(
    release: &mut R,
    client: &mut W,
    websocket: bool,
    going_away: impl Future<Output = ()>,
) -> std::io::Result<Ended>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut frames = websocket.then(Frames::default);
    let at_boundary = |frames: &Option<Frames>| frames.as_ref().is_none_or(Frames::at_boundary);
    let mut buffer = vec![0u8; 16 << 10];
    tokio::pin!(going_away);
    let mut leave_by = None;
    loop {
        let read = match leave_by {
            None => tokio::select! {
                read = release.read(&mut buffer) => read?,
                () = &mut going_away => {
                    leave_by = Some(tokio::time::Instant::now() + CLOSE_WAIT);
                    if at_boundary(&frames) {
                        break;
                    }
                    continue;
                }
            },
            // Going away in the middle of a frame: the rest of it first, for a while.
            Some(by) => match tokio::time::timeout_at(by, release.read(&mut buffer)).await {
                Ok(read) => read?,
                Err(_) => return Ok(Ended::WentAway),
            },
        };
        if read == 0 {
            client.shutdown().await?;
            return Ok(Ended::Closed);
        }
        let leaving = leave_by.is_some();
        let passed = match &mut frames {
            Some(frames) => frames.advance(&buffer[..read], leaving),
            None => read,
        };
        client.write_all(&buffer[..passed]).await?;
        if leaving && at_boundary(&frames) {
            break;
        }
    }
    if frames.is_some() {
        client.write_all(GOING_AWAY).await?;
        client.flush().await?;
    }
    Ok(Ended::WentAway)
}

/// Where a stream of WebSocket frames is: inside a frame's head (`have` bytes of it read) or
/// its payload (`payload_left` bytes to go); and how many Close frames went by whole.
#[derive(Debug, Default)]
struct Frames {
    head: [u8; 14],
    have: usize,
    payload_left: u64,
    /// The frame under way is a Close (opcode 8).
    in_close: bool,
    closes: u32,
}

impl Frames {
    fn at_boundary(&self) -> bool {
        self.have == 0 && self.payload_left == 0
    }

    /// Follows `bytes`; with `stop_at_boundary`, only up to the end of the frame under way.
    /// How many of them were followed.
    fn advance(&mut self, bytes: &[u8], stop_at_boundary: bool) -> usize {
        let mut at = 0;
        while at < bytes.len() {
            if self.payload_left > 0 {
                let taken = self.payload_left.min((bytes.len() - at) as u64);
                at += taken as usize;
                self.payload_left -= taken;
                if self.payload_left == 0 && self.in_close {
                    self.closes += 1;
                }
                continue;
            }
            if stop_at_boundary && self.have == 0 {
                break;
            }
            self.head[self.have] = bytes[at];
            self.have += 1;
            at += 1;
            if let Some((length, payload)) = head_of(&self.head[..self.have]) {
                if self.have == length {
                    self.have = 0;
                    self.payload_left = payload;
                    self.in_close = self.head[0] & 0x0f == 0x8;
                    if payload == 0 && self.in_close {
                        self.closes += 1;
                    }
                }
            }
        }
        at
    }
}

/// A frame head's length and its payload's, once enough of the head is known.
fn head_of(head: &[u8]) -> Option<(usize, u64)> {
    let second = *head.get(1)?;
    let short = u64::from(second & 0x7f);
    let extended = match short {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    let mask = if second & 0x80 != 0 { 4 } else { 0 };
    let length = 2 + extended + mask;
    if head.len() < 2 + extended {
        return None;
    }
    let payload = match extended {
        0 => short,
        n => head[2..2 + n]
            .iter()
            .fold(0u64, |sum, byte| (sum << 8) | u64::from(*byte)),
    };
    Some((length, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload_len: usize, masked: bool) -> Vec<u8> {
        let mut bytes = vec![0x81];
        let mask_bit = if masked { 0x80 } else { 0 };
        match payload_len {
            0..=125 => bytes.push(mask_bit | payload_len as u8),
            126..=65535 => {
                bytes.push(mask_bit | 126);
                bytes.extend((payload_len as u16).to_be_bytes());
            }
            _ => {
                bytes.push(mask_bit | 127);
                bytes.extend((payload_len as u64).to_be_bytes());
            }
        }
        if masked {
            bytes.extend([1, 2, 3, 4]);
        }
        bytes.extend(std::iter::repeat_n(b'x', payload_len));
        bytes
    }

    #[test]
    fn frames_of_every_length_form_are_followed_to_their_boundaries_byte_by_byte() {
        let stream: Vec<u8> = [
            frame(0, false),
            frame(5, false),
            frame(125, true),
            frame(126, false),
            frame(70_000, false),
        ]
        .concat();
        let ends: Vec<usize> = [0, 5, 125, 126, 70_000]
            .iter()
            .zip([false, false, true, false, false])
            .scan(0, |end, (len, masked)| {
                *end += frame(*len, masked).len();
                Some(*end)
            })
            .collect();
        let mut frames = Frames::default();
        for (at, byte) in stream.iter().enumerate() {
            assert_eq!(frames.advance(std::slice::from_ref(byte), false), 1);
            assert_eq!(frames.at_boundary(), ends.contains(&(at + 1)), "at {at}");
        }
    }

    #[test]
    fn going_away_mid_frame_passes_the_rest_of_that_frame_and_nothing_after() {
        let first = frame(300, false);
        let second = frame(10, false);
        let mut frames = Frames::default();
        // 100 bytes of the first frame already passed when the drain timeout came.
        assert_eq!(frames.advance(&first[..100], false), 100);
        let rest: Vec<u8> = [&first[100..], &second[..]].concat();
        assert_eq!(frames.advance(&rest, true), first.len() - 100);
        assert!(frames.at_boundary());
        assert_eq!(frames.advance(&second, true), 0, "a new frame is not begun");
        // Close frames are counted once whole, with or without a payload.
        let mut frames = Frames::default();
        let close = b"\x88\x82abcdXY";
        frames.advance(&close[..4], false);
        assert_eq!(frames.closes, 0);
        frames.advance(&close[4..], false);
        frames.advance(b"\x88\x00", false);
        assert_eq!(frames.closes, 2);
    }

    #[tokio::test]
    async fn a_websocket_open_past_the_drain_timeout_gets_a_close_with_1001_at_a_boundary() {
        let (client, mut client_end) = tokio::io::duplex(1 << 16);
        let (upstream, mut release_end) = tokio::io::duplex(1 << 16);
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let tunnels = Tunnels::new(stopping, Duration::from_millis(200));
        let joined = tokio::spawn(join(
            client,
            upstream,
            true,
            Duration::from_secs(60),
            tunnels.clone(),
            std::future::pending(),
        ));
        // Half a frame from the release, then the stop: the tunnel waits out the drain, then
        // for the rest of the frame.
        let message = frame(10, false);
        release_end.write_all(&message[..4]).await.unwrap();
        stop.send(true).unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        release_end.write_all(&message[4..]).await.unwrap();
        release_end.write_all(&frame(3, false)).await.unwrap();
        let mut seen = vec![0u8; message.len() + GOING_AWAY.len()];
        client_end.read_exact(&mut seen).await.unwrap();
        assert_eq!(&seen[..message.len()], &message[..]);
        assert_eq!(&seen[message.len()..message.len() + 4], b"\x88\x0f\x03\xe9");
        // The client's Close reaches the release; then the tunnel is done.
        client_end.write_all(b"\x88\x82abcdXY").await.unwrap();
        let mut passed = [0u8; 8];
        release_end.read_exact(&mut passed).await.unwrap();
        assert_eq!(&passed, b"\x88\x82abcdXY");
        // The server's part: the connection closed at once, not when the client gives up.
        tokio::time::timeout(Duration::from_millis(500), joined)
            .await
            .expect("the tunnel ended once the client's Close was passed on")
            .unwrap();
        let mut rest = Vec::new();
        client_end.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty(), "nothing of the release's after the Close");
        tokio::time::timeout(Duration::from_secs(1), tunnels.all_closed())
            .await
            .expect("no tunnel left open");
    }
}
