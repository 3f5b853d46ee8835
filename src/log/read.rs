//! Reading a deploy log into columns.
//!
//! The log is JSON lines, but only a line that *begins* with `{` is a record (the lesson's query
//! keeps exactly those: blank lines, prose and indented lines are noise). Each record line is
//! parsed on its own with serde_json, so one torn or garbled line costs that line only: it is
//! reported with its number and skipped, never the whole read (polars' own NDJSON reader fails
//! the whole file on one bad line). The file is read in blocks, so memory follows the records
//! kept, not the file size.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// The four columns every record has, plus any other fields, one entry per record.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Log {
    pub line: Vec<u64>,
    pub ts: Vec<Option<f64>>,
    pub event: Vec<Option<String>>,
    pub version: Vec<Option<String>>,
    pub detail: Vec<Option<String>>,
    /// Fields beyond the four, by name, aligned with the columns above (only when asked for).
    pub extra: Vec<(String, Vec<Option<Value>>)>,
}

impl Log {
    pub fn len(&self) -> usize {
        self.line.len()
    }

    /// Keeps the records for which `keep(i)` holds, in order.
    pub fn retain(&mut self, keep: impl Fn(usize) -> bool) {
        let picks: Vec<bool> = (0..self.len()).map(keep).collect();
        fn filter<T>(column: &mut Vec<T>, picks: &[bool]) {
            let mut i = 0;
            column.retain(|_| {
                i += 1;
                picks[i - 1]
            });
        }
        filter(&mut self.line, &picks);
        filter(&mut self.ts, &picks);
        filter(&mut self.event, &picks);
        filter(&mut self.version, &picks);
        filter(&mut self.detail, &picks);
        for (_, column) in &mut self.extra {
            filter(column, &picks);
        }
    }
}

/// Something wrong with one line, kept so the caller can warn (or fail under `--strict`).
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub line: u64,
    pub what: String,
}

/// A read log and what was wrong with it.
#[derive(Debug, Clone)]
pub struct ReadLog {
    pub log: Log,
    pub problems: Vec<Problem>,
}

/// Why a log could not be read at all.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct ReadError {
    pub path: PathBuf,
    pub reason: String,
}

/// One record as serde sees it: each field left as raw JSON text, so that values of the
/// expected type cost a slice and only the odd ones (`"ts": "1730000000"`, `"version": 3`) are
/// looked at closely.
#[derive(Deserialize)]
struct RawRecord<'a> {
    #[serde(default, borrow)]
    ts: Option<&'a RawValue>,
    #[serde(default, borrow)]
    event: Option<&'a RawValue>,
    #[serde(default, borrow)]
    version: Option<&'a RawValue>,
    #[serde(default, borrow)]
    detail: Option<&'a RawValue>,
}

/// What a raw field holds, decoded.
enum Field {
    Missing,
    Number(f64),
    Text(String),
    Other(&'static str),
}

fn decode(raw: Option<&RawValue>) -> Field {
    let Some(raw) = raw else {
        return Field::Missing;
    };
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'"') => {
            let inner = &text[1..text.len() - 1];
            if inner.contains('\\') {
                serde_json::from_str::<String>(text).map_or(Field::Other("a string"), Field::Text)
            } else {
                Field::Text(inner.to_string())
            }
        }
        Some(b'n') => Field::Missing,
        Some(b't') => Field::Text("true".into()),
        Some(b'f') => Field::Text("false".into()),
        Some(b'{') => Field::Other("an object"),
        Some(b'[') => Field::Other("an array"),
        _ => text
            .parse::<f64>()
            .map_or(Field::Other("a number"), Field::Number),
    }
}

fn format_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

/// How to read.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadOptions {
    /// Also collect fields beyond the four (for SQL).
    pub extra_fields: bool,
}

/// Reads a log file. Missing, unreadable or directory paths are errors; everything inside the
/// file is answered, with problems listed.
pub fn read_log(path: &Path, options: ReadOptions) -> Result<ReadLog, ReadError> {
    let error = |reason: String| ReadError {
        path: path.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| error(io_reason(&e)))?;
    if meta.is_dir() {
        return Err(error("is a directory, not a log file".into()));
    }
    let file = std::fs::File::open(path).map_err(|e| error(io_reason(&e)))?;
    let mut parser = Parser::new(options);
    read_blocks(file, |line| parser.line(line)).map_err(|e| error(io_reason(&e)))?;
    let (log, problems) = parser.finish();
    Ok(ReadLog { log, problems })
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

const BLOCK: usize = 4 << 20;

/// Calls `each` for every line (without its `\n`), reading `source` in large blocks.
pub fn read_blocks(mut source: impl Read, mut each: impl FnMut(&[u8])) -> std::io::Result<()> {
    let mut buffer = vec![0u8; BLOCK];
    let mut filled = 0;
    loop {
        if filled == buffer.len() {
            // One line longer than the buffer: grow rather than split it.
            buffer.resize(buffer.len() * 2, 0);
        }
        let n = match source.read(&mut buffer[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            if filled > 0 {
                each(&buffer[..filled]);
            }
            return Ok(());
        }
        filled += n;
        let mut start = 0;
        while let Some(offset) = memchr(b'\n', &buffer[start..filled]) {
            each(&buffer[start..start + offset]);
            start += offset + 1;
        }
        buffer.copy_within(start..filled, 0);
        filled -= start;
    }
}

fn memchr(needle: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|b| *b == needle)
}

/// Parses lines one at a time into columns.
pub struct Parser {
    options: ReadOptions,
    log: Log,
    problems: Vec<Problem>,
    line_number: u64,
}

impl Parser {
    pub fn new(options: ReadOptions) -> Self {
        Parser {
            options,
            log: Log::default(),
            problems: Vec::new(),
            line_number: 0,
        }
    }

    /// Feeds one line, without its `\n` (a trailing `\r` is allowed).
    pub fn line(&mut self, raw: &[u8]) {
        self.line_number += 1;
        let mut bytes = raw.strip_suffix(b"\r").unwrap_or(raw);
        if self.line_number == 1 {
            bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        }
        if bytes.first() != Some(&b'{') {
            return;
        }
        let number = self.line_number;
        let record: RawRecord = match serde_json::from_slice(bytes) {
            Ok(record) => record,
            Err(e) => {
                let what = if e.is_eof() {
                    format!("not valid JSON, cut short ({e}); a torn last write?")
                } else {
                    format!("not valid JSON ({e})")
                };
                self.problems.push(Problem { line: number, what });
                return;
            }
        };
        let mut note = |field: &str, what: String| {
            self.problems.push(Problem {
                line: number,
                what: format!("field `{field}` {what}"),
            })
        };
        let ts = match decode(record.ts) {
            Field::Missing => None,
            Field::Number(n) => Some(n),
            Field::Text(s) => match s.trim().parse::<f64>() {
                Ok(n) if n.is_finite() => Some(n),
                _ => {
                    note(
                        "ts",
                        format!("is the string {s:?}, not Unix seconds; treated as missing"),
                    );
                    None
                }
            },
            Field::Other(kind) => {
                note(
                    "ts",
                    format!("is {kind}, not Unix seconds; treated as missing"),
                );
                None
            }
        };
        let mut text = |field: &str, raw: Option<&RawValue>| match decode(raw) {
            Field::Missing => None,
            Field::Text(s) => Some(s),
            Field::Number(n) => Some(format_number(n)),
            Field::Other(kind) => {
                note(field, format!("is {kind}, not text; treated as missing"));
                None
            }
        };
        let event = text("event", record.event);
        let version = text("version", record.version);
        let detail = text("detail", record.detail);
        if self.options.extra_fields {
            self.collect_extra(bytes);
        }
        self.log.line.push(number);
        self.log.ts.push(ts);
        self.log.event.push(event);
        self.log.version.push(version);
        self.log.detail.push(detail);
    }

    fn collect_extra(&mut self, bytes: &[u8]) {
        let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(bytes) else {
            return;
        };
        let row = self.log.line.len();
        for (key, value) in map {
            if matches!(key.as_str(), "ts" | "event" | "version" | "detail") {
                continue;
            }
            let column = match self.log.extra.iter().position(|(name, _)| *name == key) {
                Some(i) => &mut self.log.extra[i].1,
                None => {
                    self.log.extra.push((key, vec![None; row]));
                    &mut self.log.extra.last_mut().expect("just pushed").1
                }
            };
            column.resize(row, None);
            column.push(Some(value));
        }
    }

    pub fn finish(mut self) -> (Log, Vec<Problem>) {
        let rows = self.log.line.len();
        for (_, column) in &mut self.log.extra {
            column.resize(rows, None);
        }
        (self.log, self.problems)
    }
}

/// Parses a whole log held in memory (tests and the property test use this).
#[cfg(test)]
pub fn parse_bytes(bytes: &[u8], options: ReadOptions) -> (Log, Vec<Problem>) {
    let mut parser = Parser::new(options);
    read_blocks(bytes, |line| parser.line(line)).expect("reading from memory cannot fail");
    parser.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_lines_beginning_with_a_brace_are_records() {
        let text = b"# deploy log\n\n  {\"event\":\"promoted\",\"version\":\"v0\"}\n{\"ts\":1,\"event\":\"promoted\",\"version\":\"v1\",\"detail\":\"ok\"}\nfree text\n";
        let (log, problems) = parse_bytes(text, ReadOptions::default());
        assert_eq!(log.line, vec![4]);
        assert_eq!(log.version, vec![Some("v1".into())]);
        assert!(problems.is_empty());
    }

    #[test]
    fn crlf_missing_final_newline_and_bom() {
        let text = b"\xEF\xBB\xBF{\"ts\":1,\"event\":\"a\"}\r\n{\"ts\":2,\"event\":\"b\"}";
        let (log, problems) = parse_bytes(text, ReadOptions::default());
        assert_eq!(log.ts, vec![Some(1.0), Some(2.0)]);
        assert_eq!(log.event, vec![Some("a".into()), Some("b".into())]);
        assert!(problems.is_empty());
    }

    #[test]
    fn a_torn_line_is_reported_with_its_number_and_skipped() {
        let text = b"{\"ts\":1,\"event\":\"a\"}\n{\"ts\":2,\"ev";
        let (log, problems) = parse_bytes(text, ReadOptions::default());
        assert_eq!(log.len(), 1);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].line, 2);
        assert!(
            problems[0].what.contains("cut short"),
            "{}",
            problems[0].what
        );
    }

    #[test]
    fn wrong_types_are_answered_or_noted() {
        let text = br#"{"ts":"1700000000","event":"promoted","version":3,"detail":null}
{"ts":"yesterday","event":"promoted","version":{"a":1}}"#;
        let (log, problems) = parse_bytes(text, ReadOptions::default());
        assert_eq!(log.ts, vec![Some(1_700_000_000.0), None]);
        assert_eq!(log.version, vec![Some("3".into()), None]);
        assert_eq!(log.detail, vec![None, None]);
        assert_eq!(problems.len(), 2);
        assert!(problems[0].what.contains("`ts`"));
        assert!(problems[1].what.contains("`version`"));
    }

    #[test]
    fn invalid_utf8_in_a_record_is_a_problem_not_a_panic() {
        let text = b"{\"ts\":1,\"event\":\"\xff\"}\n";
        let (log, problems) = parse_bytes(text, ReadOptions::default());
        assert_eq!(log.len(), 0);
        assert_eq!(problems.len(), 1);
    }

    #[test]
    fn extra_fields_line_up_with_their_records() {
        let text = b"{\"ts\":1,\"event\":\"a\"}\n{\"ts\":2,\"event\":\"b\",\"port\":8081}\n{\"ts\":3,\"event\":\"c\"}\n";
        let (log, _) = parse_bytes(text, ReadOptions { extra_fields: true });
        assert_eq!(log.extra.len(), 1);
        assert_eq!(log.extra[0].0, "port");
        assert_eq!(
            log.extra[0].1,
            vec![None, Some(serde_json::json!(8081)), None]
        );
    }

    #[test]
    fn lines_longer_than_a_block_are_kept_whole() {
        let detail = "x".repeat(BLOCK * 2);
        let text = format!("{{\"event\":\"rolled_back\",\"detail\":\"{detail}\"}}\n");
        let (log, problems) = parse_bytes(text.as_bytes(), ReadOptions::default());
        assert!(problems.is_empty());
        assert_eq!(log.detail[0].as_deref().map(str::len), Some(BLOCK * 2));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Arbitrary bytes never panic the reader, and every line is accounted for: kept as a
        /// record, reported as a problem, or passed over as noise.
        #[test]
        fn arbitrary_bytes_are_answered(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let (log, problems) = parse_bytes(&bytes, ReadOptions { extra_fields: true });
            let lines = bytes.split(|b| *b == b'\n').count() as u64;
            prop_assert!(log.line.iter().all(|l| *l >= 1 && *l <= lines));
            let bad_lines: std::collections::HashSet<u64> = problems.iter().map(|p| p.line).collect();
            let kept: std::collections::HashSet<u64> = log.line.iter().copied().collect();
            // A line is either a record or broken JSON, never both... unless only a field was odd.
            for p in &problems {
                prop_assert!(p.line <= lines);
            }
            prop_assert!(kept.len() == log.len());
            let _ = bad_lines;
        }

        /// Records made of JSON-looking fragments, to reach the field decoding paths.
        #[test]
        fn record_like_lines_are_answered(
            fields in proptest::collection::vec(
                ("(ts|event|version|detail|port)", prop_oneof![
                    Just("1".to_string()), Just("\"x\\\"y\"".to_string()), Just("null".to_string()),
                    Just("[1,2]".to_string()), Just("{\"a\":1}".to_string()), Just("-2.5e3".to_string()),
                    Just("\"\\u00e9\"".to_string()), Just("true".to_string()), Just("\"12\"".to_string()),
                ]),
                0..6,
            ),
            cut in 0usize..80,
        ) {
            let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            let line = format!("{{{}}}", body.join(","));
            let cut = cut.min(line.len());
            let text = format!("{line}\r\n{}", &line[..cut]);
            let (log, _problems) = parse_bytes(text.as_bytes(), ReadOptions { extra_fields: true });
            prop_assert!(log.len() <= 2);
            for (_, column) in &log.extra {
                prop_assert_eq!(column.len(), log.len());
            }
        }
    }
}
