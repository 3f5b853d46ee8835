//! A fast path for the record lines rollgate itself writes: one pass over the bytes that
//! validates the line and finds the four fields, several times quicker than serde_json's
//! general parser.
//!
//! It never rejects a line. It answers only for lines it is certain serde_json accepts, with
//! the very raw values serde_json would give, and defers everything else (`None`) to
//! serde_json, which then decides and words any error: `\u` escapes (surrogate rules), a known
//! field twice (serde's "duplicate field"), escaped keys, deep nesting, invalid UTF-8, control
//! characters, and anything that is not well-formed. The differential property test in
//! `read.rs` holds it to that.

/// The raw JSON text of each of the four fields, as `RawValue::get` would give it.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Fields<'a> {
    pub ts: Option<&'a str>,
    pub event: Option<&'a str>,
    pub version: Option<&'a str>,
    pub detail: Option<&'a str>,
    /// Whether a top-level key beyond the four is one the caller wants (see [`scan_for`]);
    /// None when nobody asked, or the line was read by serde_json.
    pub wanted_key: Option<bool>,
}

/// Nesting the fast path handles; serde_json's own limit is 128.
const MAX_DEPTH: usize = 64;

/// `line` must start with `{` and hold no newline.
pub fn scan(line: &[u8]) -> Option<Fields<'_>> {
    scan_with(line, None).map(|(fields, _)| fields)
}

/// [`scan`], also telling whether any other top-level key is one `wanted` accepts: the keys
/// are tokenized anyway, so a query's extra fields need no second search of the line.
pub fn scan_for<'a>(line: &'a [u8], wanted: KeyFilter<'_>) -> Option<Fields<'a>> {
    scan_with(line, Some(wanted)).map(|(fields, _)| fields)
}

/// The record that starts `bytes` and the length of its line (up to its newline or the end
/// of `bytes`): the line's end is found by tokenizing it, not by a newline search before.
/// A newline is never whitespace here, so the scan cannot run into the next line: the line
/// is then exactly what a newline search gives, and the answer the same as [`scan_for`]'s.
pub fn scan_line<'a>(
    bytes: &'a [u8],
    wanted: Option<KeyFilter<'_>>,
) -> Option<(Fields<'a>, usize)> {
    scan_with(bytes, wanted)
}

/// Which keys beyond the four a caller wants.
pub type KeyFilter<'f> = &'f dyn Fn(&[u8]) -> bool;

/// Where each of the four fields' raw text is in the line.
#[derive(Default)]
struct Spans {
    ts: Option<(usize, usize)>,
    event: Option<(usize, usize)>,
    version: Option<(usize, usize)>,
    detail: Option<(usize, usize)>,
}

fn scan_with<'a>(bytes: &'a [u8], wanted: Option<KeyFilter<'_>>) -> Option<(Fields<'a>, usize)> {
    let mut s = Scanner { bytes, at: 0 };
    let mut spans = Spans::default();
    let mut wanted_key = wanted.map(|_| false);
    s.expect(b'{')?;
    s.skip_ws();
    if s.peek() == Some(b'}') {
        s.at += 1;
    } else {
        loop {
            s.skip_ws();
            let key = s.key()?;
            s.skip_ws();
            s.expect(b':')?;
            s.skip_ws();
            let start = s.at;
            s.value(1)?;
            let name = &bytes[key.0..key.1];
            let slot = match name {
                b"ts" => Some(&mut spans.ts),
                b"event" => Some(&mut spans.event),
                b"version" => Some(&mut spans.version),
                b"detail" => Some(&mut spans.detail),
                _ => {
                    if let (Some(wanted), Some(false)) = (wanted, wanted_key) {
                        wanted_key = Some(wanted(name));
                    }
                    None
                }
            };
            if let Some(slot) = slot {
                // serde rejects a known field given twice: let it say so.
                if slot.replace((start, s.at)).is_some() {
                    return None;
                }
            }
            s.skip_ws();
            match s.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
    }
    s.skip_ws();
    if !matches!(s.peek(), None | Some(b'\n')) {
        return None;
    }
    // Checked once for the whole line, so every slice below is valid text.
    let text = std::str::from_utf8(&bytes[..s.at]).ok()?;
    let raw = |span: Option<(usize, usize)>| span.map(|(start, end)| &text[start..end]);
    let fields = Fields {
        ts: raw(spans.ts),
        event: raw(spans.event),
        version: raw(spans.version),
        detail: raw(spans.detail),
        wanted_key,
    };
    Some((fields, s.at))
}

/// Where a string's text stops: the first `"`, `\\` or control character (below 0x20) in
/// `bytes`. Eight bytes a step (SWAR): most strings of a log line are short keys and versions,
/// where a `memchr2` call plus a second pass for control characters cost more than the search.
fn string_stop(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let mut at = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        // A byte's high bit is set where it is zero (the XORs) or below 0x20. A borrow can
        // only mark bytes above a true mark, so the lowest mark is exact.
        let marks = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (word.wrapping_sub(ONES * 0x20) & !word);
        let marks = marks & HIGHS;
        if marks != 0 {
            return Some(at + marks.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    bytes[at..]
        .iter()
        .position(|b| matches!(b, b'"' | b'\\' | 0..=0x1f))
        .map(|i| at + i)
}

struct Scanner<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Scanner<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn expect(&mut self, wanted: u8) -> Option<()> {
        (self.next()? == wanted).then_some(())
    }

    /// JSON's whitespace but the newline, which ends a log line (see [`scan_line`]).
    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\r')) {
            self.at += 1;
        }
    }

    /// A key: a string without escapes (serde compares keys unescaped, so an escaped key is
    /// deferred). Returns its span inside the quotes.
    fn key(&mut self) -> Option<(usize, usize)> {
        self.expect(b'"')?;
        let start = self.at;
        let rest = &self.bytes[start..];
        let stop = string_stop(rest)?;
        if rest[stop] != b'"' {
            return None;
        }
        self.at += stop + 1;
        Some((start, start + stop))
    }

    /// Skips one value, validating it (bytes only: the line's UTF-8 is checked once at its end).
    fn value(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.any_string(),
            b'{' => {
                self.at += 1;
                self.skip_ws();
                if self.peek() == Some(b'}') {
                    self.at += 1;
                    return Some(());
                }
                loop {
                    self.skip_ws();
                    self.any_string()?;
                    self.skip_ws();
                    self.expect(b':')?;
                    self.skip_ws();
                    self.value(depth + 1)?;
                    self.skip_ws();
                    match self.next()? {
                        b',' => continue,
                        b'}' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b'[' => {
                self.at += 1;
                self.skip_ws();
                if self.peek() == Some(b']') {
                    self.at += 1;
                    return Some(());
                }
                loop {
                    self.skip_ws();
                    self.value(depth + 1)?;
                    self.skip_ws();
                    match self.next()? {
                        b',' => continue,
                        b']' => return Some(()),
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number(),
        }
    }

    /// A string value: the simple escapes are allowed, `\\u` and anything else is deferred.
    fn any_string(&mut self) -> Option<()> {
        self.expect(b'"')?;
        loop {
            self.at += string_stop(&self.bytes[self.at..])?;
            match self.next()? {
                b'"' => return Some(()),
                b'\\' => match self.next()? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                    _ => return None,
                },
                // A control character: serde_json refuses it, and words why.
                _ => return None,
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
    fn number(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.some_digits()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.some_digits()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::string_stop;
    use proptest::strategy::Strategy;

    fn naive(bytes: &[u8]) -> Option<usize> {
        bytes
            .iter()
            .position(|b| *b == b'"' || *b == b'\\' || *b < 0x20)
    }

    #[test]
    fn the_stop_is_the_first_quote_backslash_or_control_byte() {
        assert_eq!(string_stop(b"edge-svc\""), Some(8));
        assert_eq!(string_stop(b"a\\\"b\""), Some(1));
        assert_eq!(string_stop("caf\u{e9} \u{1f600}\"".as_bytes()), Some(10));
        assert_eq!(string_stop(b"tab\there\""), Some(3));
        assert_eq!(string_stop(b"no end"), None);
        // A control byte just below a quote, and bytes one above the marks (borrow cases).
        assert_eq!(string_stop(b"\x1f\x20\x21\x22\x23\x5b\x5c\x5d"), Some(0));
        assert_eq!(
            string_stop(b"\x20\x21\x23\x5b\x5d\x7f\x80\xff\x22"),
            Some(8)
        );
    }

    proptest::proptest! {
        #[test]
        fn the_word_at_a_time_search_finds_what_a_byte_search_finds(
            // Mostly text (the marks are then found in later words), sometimes any byte.
            bytes in proptest::collection::vec(
                proptest::prop_oneof![
                    20 => (0x20u8..=0xff).prop_filter("text", |b| *b != b'"' && *b != b'\\'),
                    1 => proptest::prelude::any::<u8>(),
                ],
                0..200,
            ),
            from in 0usize..8,
        ) {
            let bytes = &bytes[from.min(bytes.len())..];
            proptest::prop_assert_eq!(string_stop(bytes), naive(bytes));
        }
    }
}
