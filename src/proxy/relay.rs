//! A request without a body, relayed to a release on the client connection's own task (issue
//! 40): its head is written straight to a connection to the release ([`Wire`]) and the answer
//! is read back from it, parsed with `httparse` (hyper's own parser), its body framed here.
//!
//! Why not hyper's client for these: it drives each connection to a release on a task of its
//! own, so every request crossed two tasks and three channels (the request, the answer's head,
//! the answer's body), and the profile (BENCHMARKS, issue 40) put that among the costs nginx
//! does not have. A request with a body, and an upgrade, still go through hyper's client
//! (`upstream.rs`): streaming a body up while an early answer may come down is its job.
//!
//! The rules are the ones RFC 9112 §6.3 gives a client: no body after HEAD or a 1xx, 204 or
//! 304 answer; a `Transfer-Encoding` ending in chunked is decoded (and with a `Content-Length`
//! beside it the connection is not used again); differing `Content-Length`s are refused (a
//! release's answer is never guessed at); no length at all reads to the close. 1xx answers
//! before the final one are skipped. A connection goes back for the next request only when its
//! answer was read to the last byte, nothing came after it, and neither side asked to close.

use std::io::ErrorKind;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use hyper::body::Frame;
use hyper::header::{HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use hyper::{HeaderMap, Method, Response, StatusCode, Version};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::idle::BoxError;
use super::upstream::{Failure, Reusable, Shelf};

/// The largest answer head read from a release (hyper's client allows about 400 KB; a release
/// that sends more than this is broken, not busy).
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Headers in one answer head, as hyper's client.
const MAX_HEADERS: usize = 100;
/// A chunk-size line (with its extensions) or a trailer line longer than this is refused.
const MAX_LINE_BYTES: usize = 4096;
/// How much is read at once.
const READ_CHUNK: usize = 16 * 1024;

/// One connection to a release, used by one request at a time.
pub struct Wire {
    stream: TcpStream,
    /// Bytes read and not yet used (a partial head, or body bytes behind a head).
    buffer: BytesMut,
    /// The request head as written last time: its allocation is kept for the next one.
    head: Vec<u8>,
}

impl Wire {
    async fn connect(port: u16) -> Result<Wire, Failure> {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(Failure::Connect)?;
        // Small requests and answers: do not let Nagle hold them back.
        let _ = stream.set_nodelay(true);
        Ok(Wire {
            stream,
            buffer: BytesMut::with_capacity(READ_CHUNK),
            head: Vec::with_capacity(512),
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

    async fn fill(&mut self) -> std::io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_fill(cx)).await
    }
}

impl Reusable for Wire {
    fn still_open(&self) -> bool {
        Wire::still_open(self)
    }
}

/// Where a connection goes once an answer has been read off it: the client connection's own
/// shelf, for its next request.
pub type Kept = Shelf<Wire>;

/// The request head as a release is sent it: origin form, HTTP/1.1, the headers as they are.
fn encode_head(into: &mut Vec<u8>, head: &hyper::http::request::Parts) {
    into.clear();
    into.extend_from_slice(head.method.as_str().as_bytes());
    into.push(b' ');
    let target = head
        .uri
        .path_and_query()
        .map_or_else(|| head.uri.path(), |p| p.as_str());
    into.extend_from_slice(if target.is_empty() { "/" } else { target }.as_bytes());
    into.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &head.headers {
        into.extend_from_slice(name.as_str().as_bytes());
        into.extend_from_slice(b": ");
        into.extend_from_slice(value.as_bytes());
        into.extend_from_slice(b"\r\n");
    }
    into.extend_from_slice(b"\r\n");
}

/// How the answer's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Framing {
    /// This many bytes are left.
    Length(u64),
    Chunked(Chunk),
    /// To the end of the connection.
    UntilClose,
}

/// Where a chunked body's decoder is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Chunk {
    /// Reading a chunk-size line.
    Size,
    /// Inside a chunk, this many bytes left.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines after the last chunk, up to an empty one.
    Trailers,
}

/// An answer's head, parsed: what hyper's response needs, and how to read the body.
struct Head {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    framing: Option<Framing>,
    /// The connection may carry another request once this answer is read.
    reusable: bool,
}

fn garbled(what: &str) -> Failure {
    Failure::Garbled(what.to_string())
}

/// Parses a final answer's head off the front of `buffer` (skipping 1xx answers before it);
/// None while it is incomplete.
fn parse_head(buffer: &mut BytesMut, method: &Method) -> Result<Option<Head>, Failure> {
    loop {
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut answer = httparse::Response::new(&mut slots);
        let length = match answer.parse(buffer) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) if buffer.len() > MAX_HEAD_BYTES => {
                return Err(garbled("an answer head larger than 64 KiB"))
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(Failure::Garbled(format!("an unreadable answer ({e})"))),
        };
        let code = answer.code.unwrap_or(0);
        if (100..200).contains(&code) && code != 101 {
            // An interim answer (100 Continue, 103 Early Hints): the final one follows.
            buffer.advance(length);
            continue;
        }
        let status = StatusCode::from_u16(code).map_err(|_| garbled("an invalid status"))?;
        if status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(garbled(
                "101 Switching Protocols to a request that asked for none",
            ));
        }
        let version = match answer.version {
            Some(0) => Version::HTTP_10,
            _ => Version::HTTP_11,
        };
        // Header values are slices of the head's one buffer, not copies.
        let base = buffer.as_ptr() as usize;
        let mut spans = Vec::with_capacity(answer.headers.len());
        for header in answer.headers.iter() {
            let name = HeaderName::from_bytes(header.name.as_bytes())
                .map_err(|_| garbled("an invalid header name"))?;
            let start = header.value.as_ptr() as usize - base;
            spans.push((name, start, start + header.value.len()));
        }
        let raw = buffer.split_to(length).freeze();
        let mut headers = HeaderMap::with_capacity(spans.len());
        for (name, start, end) in spans {
            let value = HeaderValue::from_maybe_shared(raw.slice(start..end))
                .map_err(|_| garbled("an invalid header value"))?;
            headers.append(name, value);
        }
        let (framing, framing_reusable) = framing_of(&headers, status, method)?;
        let keep_alive = match version {
            Version::HTTP_10 => has_token(&headers, "keep-alive"),
            _ => !has_token(&headers, "close"),
        };
        return Ok(Some(Head {
            status,
            version,
            headers,
            framing,
            reusable: framing_reusable && keep_alive,
        }));
    }
}

/// Whether `Connection` lists `token`.
fn has_token(headers: &HeaderMap, token: &str) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// RFC 9112 §6.3: how long the body is (None: it has none), and whether the connection can be
/// used again after it.
fn framing_of(
    headers: &HeaderMap,
    status: StatusCode,
    method: &Method,
) -> Result<(Option<Framing>, bool), Failure> {
    if method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return Ok((None, true));
    }
    if headers.contains_key(TRANSFER_ENCODING) {
        let last = headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .rfind(|c| !c.is_empty());
        return Ok(match last {
            // A length beside it is ignored, and the connection not trusted again.
            Some(c) if c.eq_ignore_ascii_case("chunked") => (
                Some(Framing::Chunked(Chunk::Size)),
                !headers.contains_key(CONTENT_LENGTH),
            ),
            _ => (Some(Framing::UntilClose), false),
        });
    }
    let mut length: Option<u64> = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        for part in value.as_bytes().split(|b| *b == b',') {
            let text = std::str::from_utf8(part).unwrap_or("").trim();
            let parsed = text
                .bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| text.parse::<u64>().ok())
                .flatten()
                .ok_or_else(|| garbled("an invalid Content-Length"))?;
            if length.is_some_and(|l| l != parsed) {
                return Err(garbled("two different Content-Lengths"));
            }
            length = Some(parsed);
        }
    }
    Ok(match length {
        Some(0) => (None, true),
        Some(n) => (Some(Framing::Length(n)), true),
        None => (Some(Framing::UntilClose), false),
    })
}

/// The answer's body, read off the wire as the client takes it. When it has been read to its
/// end on a connection that can be used again, the connection goes back to `home`.
pub struct Relayed {
    wire: Option<Wire>,
    framing: Option<Framing>,
    /// A body that was whole in the first read: given at once, nothing left to read.
    whole: Option<Bytes>,
    reusable: bool,
    home: Option<(Arc<Kept>, u16)>,
}

impl Relayed {
    /// The body has been read to its end: the connection goes home if it may.
    fn finish(&mut self) {
        self.framing = None;
        if let (Some(wire), Some((home, port))) = (self.wire.take(), self.home.take()) {
            // Bytes after the end of the answer: the release is not speaking HTTP as we are.
            if self.reusable && wire.buffer.is_empty() {
                home.put(port, wire);
            }
        }
    }

    /// The next frame of a chunked body; None at its end.
    fn poll_chunked(
        &mut self,
        cx: &mut Context<'_>,
        mut state: Chunk,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(wire) = self.wire.as_mut() else {
            return Poll::Ready(None);
        };
        let ended: Result<(), &str> = loop {
            let buffer = &mut wire.buffer;
            let step: Result<Option<Chunk>, &str> = match state {
                Chunk::Size => match line_end(buffer) {
                    Some(end) => {
                        let line = &buffer[..end];
                        let digits = line.split(|b| *b == b';').next().unwrap_or(b"");
                        let digits = std::str::from_utf8(digits).unwrap_or("").trim();
                        match u64::from_str_radix(digits, 16) {
                            Ok(_) if digits.starts_with('+') => Err("a bad chunk size"),
                            Ok(0) => {
                                buffer.advance(end + 2);
                                Ok(Some(Chunk::Trailers))
                            }
                            Ok(size) => {
                                buffer.advance(end + 2);
                                Ok(Some(Chunk::Data(size)))
                            }
                            Err(_) => Err("a bad chunk size"),
                        }
                    }
                    None if buffer.len() > MAX_LINE_BYTES => Err("a chunk-size line too long"),
                    None => Ok(None),
                },
                Chunk::Data(left) if !buffer.is_empty() => {
                    let take = (buffer.len() as u64).min(left) as usize;
                    let data = buffer.split_to(take).freeze();
                    let left = left - take as u64;
                    let next = if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    };
                    self.framing = Some(Framing::Chunked(next));
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Chunk::Data(_) => Ok(None),
                Chunk::DataEnd if buffer.len() >= 2 => {
                    if &buffer[..2] == b"\r\n" {
                        buffer.advance(2);
                        Ok(Some(Chunk::Size))
                    } else {
                        Err("a chunk without its CRLF")
                    }
                }
                Chunk::DataEnd => Ok(None),
                // Trailers are not passed on (hyper's server sends none unless asked): skipped.
                Chunk::Trailers => match line_end(buffer) {
                    Some(0) => {
                        buffer.advance(2);
                        break Ok(());
                    }
                    Some(end) => {
                        buffer.advance(end + 2);
                        Ok(Some(Chunk::Trailers))
                    }
                    None if buffer.len() > MAX_LINE_BYTES => Err("a trailer line too long"),
                    None => Ok(None),
                },
            };
            match step {
                Ok(Some(next)) => state = next,
                Ok(None) => {
                    self.framing = Some(Framing::Chunked(state));
                    if ready!(wire.poll_fill(cx))? == 0 {
                        break Err("a chunked answer cut short by the connection's close");
                    }
                }
                Err(what) => break Err(what),
            }
        };
        match ended {
            Ok(()) => {
                self.finish();
                Poll::Ready(None)
            }
            Err(what) => {
                self.wire = None;
                self.framing = None;
                Poll::Ready(Some(Err(format!("the release sent {what}").into())))
            }
        }
    }
}

/// Where the CRLF ending the first line of `buffer` is.
fn line_end(buffer: &[u8]) -> Option<usize> {
    buffer.windows(2).position(|w| w == b"\r\n")
}

impl hyper::body::Body for Relayed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(whole) = this.whole.take() {
            return Poll::Ready(Some(Ok(Frame::data(whole))));
        }
        let Some(framing) = this.framing else {
            return Poll::Ready(None);
        };
        match framing {
            Framing::Chunked(state) => this.poll_chunked(cx, state),
            Framing::Length(left) => {
                let Some(wire) = this.wire.as_mut() else {
                    return Poll::Ready(None);
                };
                if wire.buffer.is_empty() && ready!(wire.poll_fill(cx))? == 0 {
                    this.wire = None;
                    this.framing = None;
                    return Poll::Ready(Some(Err(format!(
                        "the release closed the connection with {left} byte(s) of the answer unsent"
                    )
                    .into())));
                }
                let take = (wire.buffer.len() as u64).min(left) as usize;
                let data = wire.buffer.split_to(take).freeze();
                let left = left - take as u64;
                if left == 0 {
                    this.finish();
                } else {
                    this.framing = Some(Framing::Length(left));
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Framing::UntilClose => {
                let Some(wire) = this.wire.as_mut() else {
                    return Poll::Ready(None);
                };
                if wire.buffer.is_empty() && ready!(wire.poll_fill(cx))? == 0 {
                    this.wire = None;
                    this.framing = None;
                    return Poll::Ready(None);
                }
                let data = wire.buffer.split().freeze();
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.whole.is_none() && self.framing.is_none()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match (&self.whole, self.framing) {
            (Some(whole), _) => hyper::body::SizeHint::with_exact(whole.len() as u64),
            (None, None) => hyper::body::SizeHint::with_exact(0),
            (None, Some(Framing::Length(left))) => hyper::body::SizeHint::with_exact(left),
            (None, Some(_)) => hyper::body::SizeHint::default(),
        }
    }
}

/// Sends `head` (a request without a body) to the release on `port` over `kept` if given, else
/// over a new connection, and reads the answer's head. A kept connection the release closed
/// before answering (its idle timeout crossed the request) is replaced by a new one for a safe
/// method; for another method that is a lost connection, since the request may have been
/// acted on.
pub async fn exchange(
    kept: Option<Wire>,
    port: u16,
    head: &hyper::http::request::Parts,
    home: &Arc<Kept>,
) -> Result<Response<Relayed>, Failure> {
    let safe = matches!(
        head.method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    );
    if let Some(wire) = kept {
        match exchange_on(wire, port, head, home).await {
            Err(Attempt::Unanswered(e)) if !safe => return Err(Failure::Broken(e)),
            Err(Attempt::Unanswered(_)) => {}
            Err(Attempt::Failed(failure)) => return Err(failure),
            Ok(response) => return Ok(response),
        }
    }
    let wire = Wire::connect(port).await?;
    match exchange_on(wire, port, head, home).await {
        Ok(response) => Ok(response),
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

async fn exchange_on(
    mut wire: Wire,
    port: u16,
    head: &hyper::http::request::Parts,
    home: &Arc<Kept>,
) -> Result<Response<Relayed>, Attempt> {
    encode_head(&mut wire.head, head);
    wire.stream
        .write_all(&wire.head)
        .await
        .map_err(Attempt::Unanswered)?;
    let mut answered = false;
    let parsed = loop {
        if !wire.buffer.is_empty() {
            answered = true;
            if let Some(parsed) =
                parse_head(&mut wire.buffer, &head.method).map_err(Attempt::Failed)?
            {
                break parsed;
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
    };
    let mut body = Relayed {
        wire: Some(wire),
        framing: parsed.framing,
        whole: None,
        reusable: parsed.reusable,
        home: Some((home.clone(), port)),
    };
    match parsed.framing {
        None => body.finish(),
        // The whole body came with the head (a small answer): no read is left to wait for.
        Some(Framing::Length(length)) => {
            if let Some(wire) = body.wire.as_mut() {
                if wire.buffer.len() as u64 >= length {
                    body.whole = Some(wire.buffer.split_to(length as usize).freeze());
                    body.finish();
                }
            }
        }
        Some(_) => {}
    }
    let mut response = Response::new(body);
    *response.status_mut() = parsed.status;
    *response.version_mut() = parsed.version;
    *response.headers_mut() = parsed.headers;
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, method: Method) -> Result<Option<Head>, Failure> {
        parse_head(&mut BytesMut::from(text.as_bytes()), &method)
    }

    #[test]
    fn an_answer_head_is_framed_as_rfc_9112_says() {
        let head = |text: &str| parse(text, Method::GET).ok().flatten();
        let length = head("HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n").unwrap();
        assert_eq!(length.framing, Some(Framing::Length(12)));
        assert!(length.reusable);
        let chunked = head("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n").unwrap();
        assert_eq!(chunked.framing, Some(Framing::Chunked(Chunk::Size)));
        assert!(chunked.reusable);
        // Both: chunked wins and the connection is not used again.
        let both =
            head("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n")
                .unwrap();
        assert_eq!(both.framing, Some(Framing::Chunked(Chunk::Size)));
        assert!(!both.reusable);
        let close = head("HTTP/1.1 200 OK\r\n\r\n").unwrap();
        assert_eq!(close.framing, Some(Framing::UntilClose));
        assert!(!close.reusable);
        let asked =
            head("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\n").unwrap();
        assert!(!asked.reusable);
        let old = head("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n").unwrap();
        assert!(!old.reusable);
        let none = head("HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n").unwrap();
        assert_eq!(none.framing, None);
        let after_head = parse("HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n", Method::HEAD)
            .ok()
            .flatten()
            .unwrap();
        assert_eq!(after_head.framing, None);
        // An interim answer is skipped.
        let interim = head("HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n").unwrap();
        assert_eq!(interim.status, StatusCode::CREATED);
        assert!(head("HTTP/1.1 200 OK\r\ncontent-le").is_none());
    }

    #[test]
    fn lengths_a_release_could_smuggle_with_are_refused() {
        for text in [
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0x5\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
        ] {
            assert!(parse(text, Method::GET).is_err(), "{text}");
        }
        let same = parse(
            "HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n",
            Method::GET,
        );
        assert_eq!(
            same.ok().flatten().unwrap().framing,
            Some(Framing::Length(5))
        );
    }

    #[test]
    fn a_request_head_is_written_in_origin_form_with_its_headers() {
        let request = hyper::Request::builder()
            .method("DELETE")
            .uri("/a/b?c=1")
            .header("host", "example")
            .header("x-two", "1")
            .header("x-two", "2")
            .body(())
            .unwrap();
        let (parts, ()) = request.into_parts();
        let mut out = Vec::new();
        encode_head(&mut out, &parts);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "DELETE /a/b?c=1 HTTP/1.1\r\nhost: example\r\nx-two: 1\r\nx-two: 2\r\n\r\n"
        );
    }
}
