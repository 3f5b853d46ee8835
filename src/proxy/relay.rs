//! The release's side of a request rollgate serves itself (`front.rs`, issue 40): a kept
//! connection to a release ([`Wire`]), the request head written to it, the answer's head read
//! back and parsed with `httparse` (hyper's own parser), and the answer's framing as RFC 9112
//! §6.3 gives it to a client: no body after HEAD or a 1xx, 204 or 304 answer; a
//! `Transfer-Encoding` ending in chunked is chunked (and with a `Content-Length` beside it the
//! connection is not used again); differing `Content-Length`s are refused (a release's answer
//! is never guessed at); no length at all reads to the close. 1xx answers before the final one
//! are skipped. A connection goes back for the next request only when its answer was read to
//! the last byte, nothing came after it, and neither side asked to close.
//!
//! Why not hyper's client for these: it drives each connection to a release on a task of its
//! own, so every request crossed two tasks and three channels, and the profile (BENCHMARKS,
//! issue 40) put that among the costs nginx does not have. Requests with a body, and
//! upgrades, go through hyper's client (`upstream.rs`): streaming a body up while an early
//! answer may come down is its job.

use std::io::ErrorKind;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::failure::Failure;

/// The largest answer head read from a release (hyper's client allows about 400 KB; a release
/// that sends more than this is broken, not busy).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Headers in one answer head, as hyper's client.
pub const MAX_HEADERS: usize = 100;
/// A chunk-size line (with its extensions) or a trailer line longer than this is refused.
const MAX_LINE_BYTES: usize = 4096;
/// How much is read at once.
const READ_CHUNK: usize = 16 * 1024;

/// One connection to a release, used by one request at a time.
pub struct Wire {
    pub stream: TcpStream,
    /// Bytes read and not yet used (a partial head, or body bytes behind a head).
    pub buffer: BytesMut,
}

impl Wire {
    async fn connect(port: u16) -> Result<Wire, Failure> {
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let stream = TcpStream::connect(address)
            .await
            .map_err(Failure::Connect)?;
        // Small requests and answers: do not let Nagle hold them back.
        let _ = stream.set_nodelay(true);
        Ok(Wire {
            stream,
            buffer: BytesMut::with_capacity(READ_CHUNK),
        })
    }

    /// Whether the release has not closed this idle connection (nor sent anything unasked).
    /// Costs no system call while the socket has not been seen readable since the last read.
    pub fn still_open(&self) -> bool {
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == ErrorKind::WouldBlock)
    }

    /// Reads what the release sends next into the buffer; 0 means it closed the connection.
    /// Through tokio's `poll_read`, which marks the socket drained after a short read, so
    /// [`Wire::still_open`] then asks the kernel nothing.
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.buffer.capacity() - self.buffer.len() < 1024 {
            self.buffer.reserve(READ_CHUNK);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buffer)
    }

    pub async fn fill(&mut self) -> std::io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_fill(cx)).await
    }
}

/// How the answer's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Framing {
    /// This many bytes.
    Length(u64),
    Chunked,
    /// To the end of the connection.
    UntilClose,
}

/// What an answer head says about the body behind it (None: it has none), and whether the
/// connection can carry another request once the body is read. RFC 9112 §6.3.
pub fn framing_of(
    headers: &[httparse::Header<'_>],
    version: u8,
    status: u16,
    head_request: bool,
) -> Result<(Option<Framing>, bool), Failure> {
    let keep_alive = match version {
        0 => has_token(headers, "connection", "keep-alive"),
        _ => !has_token(headers, "connection", "close"),
    };
    if head_request || status == 204 || status == 304 {
        return Ok((None, keep_alive));
    }
    fn named<'h, 'a>(
        headers: &'h [httparse::Header<'a>],
        name: &'static str,
    ) -> impl Iterator<Item = &'h httparse::Header<'a>> {
        headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
    }
    if named(headers, "transfer-encoding").next().is_some() {
        let last = named(headers, "transfer-encoding")
            .flat_map(|h| h.value.split(|b| *b == b','))
            .map(|coding| coding.trim_ascii())
            .filter(|coding| !coding.is_empty())
            .last();
        return Ok(match last {
            // A length beside it is ignored, and the connection not trusted again.
            Some(coding) if coding.eq_ignore_ascii_case(b"chunked") => (
                Some(Framing::Chunked),
                keep_alive && named(headers, "content-length").next().is_none(),
            ),
            _ => (Some(Framing::UntilClose), false),
        });
    }
    let mut length: Option<u64> = None;
    for header in named(headers, "content-length") {
        for part in header.value.split(|b| *b == b',') {
            let text = part.trim_ascii();
            let parsed = (!text.is_empty() && text.iter().all(u8::is_ascii_digit))
                .then(|| std::str::from_utf8(text).ok()?.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| garbled("an invalid Content-Length"))?;
            if length.is_some_and(|l| l != parsed) {
                return Err(garbled("two different Content-Lengths"));
            }
            length = Some(parsed);
        }
    }
    Ok(match length {
        Some(0) => (None, keep_alive),
        Some(n) => (Some(Framing::Length(n)), keep_alive),
        None => (Some(Framing::UntilClose), false),
    })
}

/// Whether a header `name` lists `token` (comma-separated, any case).
pub fn has_token(headers: &[httparse::Header<'_>], name: &str, token: &str) -> bool {
    headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case(name))
        .flat_map(|h| h.value.split(|b| *b == b','))
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

pub fn garbled(what: &str) -> Failure {
    Failure::Garbled(what.to_string())
}

/// Sends `head` (a request without a body) to the release on `port` over `kept` if given,
/// else over a new connection, and reads until `parse` finds the answer's head whole at the
/// front of the connection's buffer (it returns None while it is not). A kept connection the
/// release closed before answering (its idle timeout crossed the request) is replaced by a new
/// one for a safe method; for another method that is a lost connection, since the request may
/// have been acted on.
pub async fn exchange<T>(
    kept: Option<Wire>,
    port: u16,
    head: &[u8],
    safe: bool,
    mut parse: impl FnMut(&mut BytesMut) -> Result<Option<T>, Failure>,
) -> Result<(Wire, T), Failure> {
    if let Some(wire) = kept {
        match exchange_on(wire, head, &mut parse).await {
            Err(Attempt::Unanswered(e)) if !safe => return Err(Failure::Broken(e)),
            Err(Attempt::Unanswered(_)) => {}
            Err(Attempt::Failed(failure)) => return Err(failure),
            Ok(answered) => return Ok(answered),
        }
    }
    let wire = Wire::connect(port).await?;
    match exchange_on(wire, head, &mut parse).await {
        Ok(answered) => Ok(answered),
        Err(Attempt::Unanswered(e)) => Err(Failure::Broken(e)),
        Err(Attempt::Failed(failure)) => Err(failure),
    }
}

/// How one try over one connection failed.
enum Attempt {
    /// The connection broke or closed before any byte of an answer.
    Unanswered(std::io::Error),
    Failed(Failure),
}

async fn exchange_on<T>(
    mut wire: Wire,
    head: &[u8],
    parse: &mut impl FnMut(&mut BytesMut) -> Result<Option<T>, Failure>,
) -> Result<(Wire, T), Attempt> {
    wire.stream
        .write_all(head)
        .await
        .map_err(Attempt::Unanswered)?;
    let mut answered = false;
    loop {
        if !wire.buffer.is_empty() {
            answered = true;
            if let Some(parsed) = parse(&mut wire.buffer).map_err(Attempt::Failed)? {
                return Ok((wire, parsed));
            }
            if wire.buffer.len() > MAX_HEAD_BYTES {
                return Err(Attempt::Failed(garbled(
                    "an answer head larger than 64 KiB",
                )));
            }
        }
        match wire.fill().await {
            Ok(0) if !answered => {
                return Err(Attempt::Unanswered(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the release closed the connection without answering",
                )))
            }
            Ok(0) => {
                return Err(Attempt::Failed(Failure::Broken(std::io::Error::new(
                    ErrorKind::UnexpectedEof,
                    "the release closed the connection in the middle of an answer head",
                ))))
            }
            Ok(_) => {}
            Err(e) if !answered => return Err(Attempt::Unanswered(e)),
            Err(e) => return Err(Attempt::Failed(Failure::Broken(e))),
        }
    }
}

/// Follows a chunked body as its bytes pass through unchanged, to find where it ends: chunk
/// sizes, extensions, data, the last chunk and its trailers (RFC 9112 §7.1), each line bounded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Chunks {
    /// In a chunk-size line: the size so far, and whether its extensions have begun.
    Size {
        size: u64,
        digits: u8,
        extension: bool,
        line: usize,
    },
    /// The LF ending a chunk-size line (`last`: the size was 0).
    SizeEnd {
        size: u64,
    },
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// The CR and LF after a chunk's data.
    DataCr,
    DataLf,
    /// Trailer lines after the last chunk (`line`: bytes of the current one), up to an empty one.
    Trailer {
        line: usize,
    },
    TrailerLf {
        empty: bool,
    },
    /// The body ended.
    Done,
}

impl Chunks {
    pub fn start() -> Chunks {
        Chunks::Size {
            size: 0,
            digits: 0,
            extension: false,
            line: 0,
        }
    }

    /// Takes `bytes` in order; returns how many of them belong to the body (all of them until
    /// the end: then the end's position).
    pub fn advance(&mut self, bytes: &[u8]) -> Result<usize, Failure> {
        let mut at = 0;
        while at < bytes.len() {
            let byte = bytes[at];
            *self = match *self {
                Chunks::Done => return Ok(at),
                Chunks::Data(left) => {
                    let take = ((bytes.len() - at) as u64).min(left) as usize;
                    at += take;
                    let left = left - take as u64;
                    *self = if left == 0 {
                        Chunks::DataCr
                    } else {
                        Chunks::Data(left)
                    };
                    continue;
                }
                Chunks::Size {
                    size,
                    digits,
                    extension,
                    line,
                } => {
                    if line > MAX_LINE_BYTES {
                        return Err(garbled("a chunk-size line too long"));
                    }
                    match byte {
                        b'\r' if digits > 0 => Chunks::SizeEnd { size },
                        _ if extension => Chunks::Size {
                            size,
                            digits,
                            extension,
                            line: line + 1,
                        },
                        b';' | b' ' | b'\t' if digits > 0 => Chunks::Size {
                            size,
                            digits,
                            extension: true,
                            line: line + 1,
                        },
                        _ => {
                            let digit = (byte as char)
                                .to_digit(16)
                                .ok_or_else(|| garbled("a bad chunk size"))?;
                            if digits >= 15 {
                                return Err(garbled("a chunk size too large"));
                            }
                            Chunks::Size {
                                size: size * 16 + u64::from(digit),
                                digits: digits + 1,
                                extension,
                                line: line + 1,
                            }
                        }
                    }
                }
                Chunks::SizeEnd { size } => match byte {
                    b'\n' if size == 0 => Chunks::Trailer { line: 0 },
                    b'\n' => Chunks::Data(size),
                    _ => return Err(garbled("a chunk-size line without its LF")),
                },
                Chunks::DataCr => match byte {
                    b'\r' => Chunks::DataLf,
                    _ => return Err(garbled("a chunk without its CRLF")),
                },
                Chunks::DataLf => match byte {
                    b'\n' => Chunks::start(),
                    _ => return Err(garbled("a chunk without its CRLF")),
                },
                Chunks::Trailer { line } => match byte {
                    b'\r' => Chunks::TrailerLf { empty: line == 0 },
                    _ if line >= MAX_LINE_BYTES => return Err(garbled("a trailer line too long")),
                    _ => Chunks::Trailer { line: line + 1 },
                },
                Chunks::TrailerLf { empty } => match byte {
                    b'\n' if empty => Chunks::Done,
                    b'\n' => Chunks::Trailer { line: 0 },
                    _ => return Err(garbled("a trailer line without its LF")),
                },
            };
            at += 1;
        }
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The framing of an answer head given as text (`head_request`: it answers a HEAD).
    fn framing(text: &str, head_request: bool) -> Result<(Option<Framing>, bool), Failure> {
        let mut slots = [httparse::EMPTY_HEADER; 16];
        let mut answer = httparse::Response::new(&mut slots);
        assert!(answer.parse(text.as_bytes()).unwrap().is_complete());
        framing_of(
            answer.headers,
            answer.version.unwrap(),
            answer.code.unwrap(),
            head_request,
        )
    }

    #[test]
    fn an_answer_head_is_framed_as_rfc_9112_says() {
        let of = |text: &str| framing(text, false).ok().unwrap();
        assert_eq!(
            of("HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n"),
            (Some(Framing::Length(12)), true)
        );
        assert_eq!(
            of("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n"),
            (Some(Framing::Chunked), true)
        );
        // Both: chunked wins and the connection is not used again.
        assert_eq!(
            of("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"),
            (Some(Framing::Chunked), false)
        );
        assert_eq!(
            of("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n"),
            (Some(Framing::UntilClose), false)
        );
        assert_eq!(
            of("HTTP/1.1 200 OK\r\n\r\n"),
            (Some(Framing::UntilClose), false)
        );
        assert!(!of("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\n").1);
        assert!(!of("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n").1);
        assert!(of("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 1\r\n\r\n").1);
        assert_eq!(
            of("HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n"),
            (None, true)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n", true)
                .ok()
                .unwrap(),
            (None, true)
        );
        assert_eq!(
            of("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"),
            (None, true)
        );
    }

    #[test]
    fn lengths_a_release_could_smuggle_with_are_refused() {
        for text in [
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0x5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
        ] {
            assert!(framing(text, false).is_err(), "{text}");
        }
        let same = framing("HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n", false);
        assert_eq!(same.ok().unwrap().0, Some(Framing::Length(5)));
    }

    #[test]
    fn a_chunked_body_ends_where_its_last_chunk_and_trailers_do() {
        let body = b"5;name=value\r\nhello\r\n6 \r\n world\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        let end = body.len() - 4;
        // Whole, and fed one byte at a time: the same end.
        let mut chunks = Chunks::start();
        assert_eq!(chunks.advance(body).ok(), Some(end));
        assert_eq!(chunks, Chunks::Done);
        let mut chunks = Chunks::start();
        let mut taken = 0;
        for byte in body.iter() {
            taken += chunks.advance(std::slice::from_ref(byte)).ok().unwrap();
        }
        assert_eq!(taken, end);
        // Without trailers.
        let mut chunks = Chunks::start();
        assert_eq!(
            chunks.advance(b"A\r\n0123456789\r\n0\r\n\r\n").ok(),
            Some(20)
        );
        // Split inside a chunk's data and its size.
        let mut chunks = Chunks::start();
        assert_eq!(chunks.advance(b"1").ok(), Some(1));
        assert_eq!(chunks.advance(b"0\r\nabcdefgh").ok(), Some(11));
        assert_eq!(chunks, Chunks::Data(8));
    }

    #[test]
    fn a_chunked_body_that_is_not_one_is_refused() {
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"5\r\nhelloXX",
            b"5\nhello\r\n",
            b"1000000000000000\r\n",
            b"0\r\nx-trailer: 1\rX",
        ] {
            assert!(Chunks::start().advance(bad).is_err(), "{bad:?}");
        }
        let long = format!("1;{}\r\n", "e".repeat(MAX_LINE_BYTES + 10));
        assert!(Chunks::start().advance(long.as_bytes()).is_err());
    }
}
