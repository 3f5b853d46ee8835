//! Reading a deploy log.
//!
//! The log is JSON lines, but only a line that *begins* with `{` is a record (the lesson's query
//! keeps exactly those: blank lines, prose and indented lines are noise). Each record line is
//! parsed on its own with serde_json, so one torn or garbled line costs that line only: it is
//! reported with its number and skipped, never the whole read (polars' own NDJSON reader fails
//! the whole file on one bad line).
//!
//! The file is read in blocks of whole lines; worker threads parse blocks into a [`Sink`] each,
//! and the sinks are merged in file order. Memory follows what the sink keeps (the summary keeps
//! almost nothing), not the file size.

use std::borrow::Cow;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::host::journal::LogEvent;

/// The four columns every record has, plus any other fields, one entry per record. A column
/// the options skip (`skip_versions`, `skip_details`) is empty rather than all `None`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Log {
    pub line: Vec<u64>,
    pub ts: Vec<Option<f64>>,
    pub event: Vec<Option<Cow<'static, str>>>,
    pub version: Vec<Option<String>>,
    pub detail: Vec<Option<String>>,
    /// Fields beyond the four, by name, aligned with the columns above (only when asked for).
    pub extra: Vec<(String, Vec<Option<Value>>)>,
    options: ReadOptions,
}

impl Log {
    pub fn len(&self) -> usize {
        self.line.len()
    }

    pub fn is_empty(&self) -> bool {
        self.line.is_empty()
    }

    /// How the records were read: which columns were kept.
    pub fn options(&self) -> &ReadOptions {
        &self.options
    }

    /// Appends another log's records (used to merge several files).
    pub fn append(&mut self, other: Log) {
        self.absorb(other, 0);
    }

    /// The records in the given order.
    pub fn reordered(&self, order: &[usize]) -> Log {
        fn pick<T: Clone>(column: &[T], order: &[usize]) -> Vec<T> {
            if column.is_empty() {
                return Vec::new(); // skipped by the options
            }
            order.iter().map(|i| column[*i].clone()).collect()
        }
        Log {
            line: pick(&self.line, order),
            ts: pick(&self.ts, order),
            event: pick(&self.event, order),
            version: pick(&self.version, order),
            detail: pick(&self.detail, order),
            extra: self
                .extra
                .iter()
                .map(|(n, c)| (n.clone(), pick(c, order)))
                .collect(),
            options: self.options.clone(),
        }
    }

    /// Record `row`'s value of an extra field, if it was collected and is there.
    pub fn extra_value(&self, name: &str, row: usize) -> Option<&Value> {
        let (_, column) = self.extra.iter().find(|(n, _)| n == name)?;
        column.get(row)?.as_ref()
    }

    fn extra_column(&mut self, name: &str) -> &mut Vec<Option<Value>> {
        let rows = self.line.len();
        let index = match self.extra.iter().position(|(n, _)| n == name) {
            Some(i) => i,
            None => {
                self.extra.push((name.to_string(), vec![None; rows]));
                self.extra.len() - 1
            }
        };
        &mut self.extra[index].1
    }

    fn pad_extras(&mut self) {
        let rows = self.line.len();
        for (_, column) in &mut self.extra {
            column.resize(rows, None);
        }
    }
}

/// A substring searcher built once, on first use: `memmem::find` builds one per call, which
/// for history's two searches a record was a twentieth of its time.
struct Needle {
    text: &'static [u8],
    finder: std::sync::OnceLock<memchr::memmem::Finder<'static>>,
}

impl Needle {
    const fn new(text: &'static [u8]) -> Needle {
        Needle {
            text,
            finder: std::sync::OnceLock::new(),
        }
    }

    fn is_in(&self, haystack: &[u8]) -> bool {
        self.finder
            .get_or_init(|| memchr::memmem::Finder::new(self.text))
            .find(haystack)
            .is_some()
    }
}

static MANIFEST_KEY: Needle = Needle::new(b"\"manifest_sha256\"");
static CONFIG_KEY: Needle = Needle::new(b"\"config\"");
static POLICY_KEY: Needle = Needle::new(b"\"policy\"");
static EXPOSURE_KEY: Needle = Needle::new(b"\"exposure\"");
static WAVE_KEY: Needle = Needle::new(b"\"wave\"");
static ESCAPED_UNICODE: Needle = Needle::new(b"\\u");

/// One record's fields, decoded, borrowed from its line where no escape forced a copy.
#[derive(Debug, Clone, PartialEq)]
pub struct Record<'a> {
    pub ts: Option<f64>,
    pub event: Option<Cow<'a, str>>,
    pub version: Option<Cow<'a, str>>,
    pub detail: Option<Cow<'a, str>>,
    /// The whole line, for fields beyond the four.
    pub raw: &'a [u8],
    /// Whether the line has a field beyond the four that the reader wants, when the fast path
    /// could tell (None: look in `raw`).
    pub wanted_key: Option<bool>,
}

/// Where parsed records go. Each block of the file fills its own sink; the sinks are then
/// merged in file order with [`Sink::absorb`].
pub trait Sink: Send + Sized {
    fn new(options: ReadOptions) -> Self;
    fn record(&mut self, line: u64, record: Record<'_>);
    /// Appends the results of the block that follows; its line numbers start after
    /// `line_offset`.
    fn absorb(&mut self, later: Self, line_offset: u64);
    /// A block of about this many lines is about to be recorded.
    fn reserve(&mut self, _lines: usize) {}
    /// The block is recorded; called in the thread that parsed it, before [`Sink::absorb`]
    /// hands it to the reader's thread, so work done here runs in parallel.
    fn finish(&mut self) {}
}

/// A sink that keeps each block's records as they were parsed, in file order, instead of
/// copying them into one set of columns: a query that reads `attempts` pairs them, then builds
/// its frame chunk by chunk from them.
#[derive(Debug)]
pub struct Blocks {
    /// The block being recorded (a parser's sink).
    block: Log,
    /// The merged blocks, line numbers counted from the start of the file.
    pub logs: Vec<Log>,
}

impl Sink for Blocks {
    fn new(options: ReadOptions) -> Self {
        Blocks {
            block: Log::new(options),
            logs: Vec::new(),
        }
    }

    fn record(&mut self, line: u64, record: Record<'_>) {
        self.block.record(line, record);
    }

    fn absorb(&mut self, later: Self, line_offset: u64) {
        let mut block = later.block;
        if block.is_empty() {
            return;
        }
        for line in &mut block.line {
            *line += line_offset;
        }
        self.logs.push(block);
    }

    fn reserve(&mut self, lines: usize) {
        self.block.reserve(lines);
    }
}

impl Sink for Log {
    fn new(options: ReadOptions) -> Self {
        Log {
            options,
            ..Log::default()
        }
    }

    fn record(&mut self, line: u64, record: Record<'_>) {
        if let Some(selection) = &self.options.selection {
            if !selection.admits(record.ts, record.version.as_deref()) {
                return;
            }
        }
        let event = record
            .event
            // LogEvent names the deployer writes are kept without an allocation per record.
            .map(|e| match LogEvent::from_name(&e) {
                Some(known) => Cow::Borrowed(known.as_str()),
                None => Cow::Owned(e.into_owned()),
            });
        // Details of starts and promotions are long and never asked for, except by SQL.
        let keep_detail = !self.options.skip_details
            && (self.options.all_details
                || !matches!(event.as_deref(), Some("candidate_started" | "promoted")));
        let release_fields = self.options.release_fields
            && (MANIFEST_KEY.is_in(record.raw)
                || CONFIG_KEY.is_in(record.raw)
                || POLICY_KEY.is_in(record.raw));
        // What users had of a release rolled back after they had it: history and stats both.
        let exposure_field = (self.options.release_fields || self.options.rollout_fields)
            && EXPOSURE_KEY.is_in(record.raw);
        let rollout_fields = self.options.rollout_fields
            && (WAVE_KEY.is_in(record.raw)
                || event.as_deref() == Some(LogEvent::RolloutStarted.as_str()));
        let extra_fields = self.options.extra_fields
            && record.wanted_key.unwrap_or_else(|| {
                self.options
                    .only_extras
                    .as_ref()
                    .is_none_or(|only| only.may_be_in(record.raw))
            });
        if extra_fields || release_fields || rollout_fields || exposure_field {
            if let Ok(Value::Object(map)) = serde_json::from_slice::<Value>(record.raw) {
                for (key, value) in map {
                    let wanted = if self.options.extra_fields {
                        !matches!(key.as_str(), "ts" | "event" | "version" | "detail")
                            && self
                                .options
                                .only_extras
                                .as_ref()
                                .is_none_or(|only| only.contains(&key))
                    } else {
                        (release_fields && RELEASE_FIELDS.contains(&key.as_str()))
                            || (rollout_fields && ROLLOUT_FIELDS.contains(&key.as_str()))
                            || (exposure_field && key == "exposure")
                    };
                    if wanted {
                        let rows = self.line.len();
                        let column = self.extra_column(&key);
                        column.resize(rows, None);
                        column.push(Some(value));
                    }
                }
            }
        }
        self.line.push(line);
        if !self.options.skip_ts {
            self.ts.push(record.ts);
        }
        self.event.push(event);
        // A skipped column stays empty: 48 bytes a record less to write and clear.
        if !self.options.skip_versions {
            self.version.push(record.version.map(Cow::into_owned));
        }
        if !self.options.skip_details {
            self.detail
                .push(record.detail.filter(|_| keep_detail).map(Cow::into_owned));
        }
        if !self.extra.is_empty() {
            self.pad_extras();
        }
    }

    fn reserve(&mut self, lines: usize) {
        // Capacity never written costs no memory: only the pages a record lands on are.
        self.line.reserve(lines);
        if !self.options.skip_ts {
            self.ts.reserve(lines);
        }
        self.event.reserve(lines);
        if !self.options.skip_versions {
            self.version.reserve(lines);
        }
        if !self.options.skip_details {
            self.detail.reserve(lines);
        }
    }

    fn absorb(&mut self, later: Self, line_offset: u64) {
        let rows = self.line.len();
        self.line.extend(later.line.iter().map(|l| l + line_offset));
        self.ts.extend(later.ts);
        self.event.extend(later.event);
        self.version.extend(later.version);
        self.detail.extend(later.detail);
        for (name, values) in later.extra {
            let column = self.extra_column(&name);
            column.resize(rows, None);
            column.extend(values);
        }
        self.pad_extras();
    }
}

/// Something wrong with one line, kept so the caller can warn (or fail under `--strict`).
#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub line: u64,
    pub what: String,
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
enum Field<'a> {
    Missing,
    Number(f64),
    Text(Cow<'a, str>),
    Other(&'static str),
}

fn decode(raw: Option<&str>) -> Field<'_> {
    let Some(text) = raw else {
        return Field::Missing;
    };
    match text.as_bytes().first() {
        Some(b'"') => {
            let inner = &text[1..text.len() - 1];
            if inner.contains('\\') {
                serde_json::from_str::<String>(text)
                    .map_or(Field::Other("a string"), |s| Field::Text(Cow::Owned(s)))
            } else {
                Field::Text(Cow::Borrowed(inner))
            }
        }
        Some(b'n') => Field::Missing,
        Some(b't') => Field::Text(Cow::Borrowed("true")),
        Some(b'f') => Field::Text(Cow::Borrowed("false")),
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

/// Which parser reads record lines: the fast path with serde_json behind it, or serde_json
/// alone (kept to hold the fast path to the same answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parser {
    Fast,
    SerdeOnly,
}

impl Parser {
    /// `ROLLGATE_LOG_PARSER=serde` reads with serde_json alone: for benchmarks that compare
    /// the two in one run, and as a way out should the fast path ever be doubted.
    fn chosen() -> Parser {
        static CHOSEN: std::sync::OnceLock<Parser> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| match std::env::var("ROLLGATE_LOG_PARSER").as_deref() {
            Ok("serde") => Parser::SerdeOnly,
            _ => Parser::Fast,
        })
    }
}

/// Parses one line. `None` for noise and for broken records (which are noted in `problems`).
fn parse_line<'a>(
    bytes: &'a [u8],
    number: u64,
    problems: &mut Vec<Problem>,
    extras: Option<&Wanted>,
) -> Option<Record<'a>> {
    parse_line_with(Parser::chosen(), bytes, number, problems, extras)
}

/// Which extra fields a reader wants: all of them, or those named.
#[derive(Clone, Copy)]
enum Wanted<'o> {
    All,
    Named(&'o ExtraNames),
}

impl Wanted<'_> {
    fn of(options: &ReadOptions) -> Option<Wanted<'_>> {
        if !options.extra_fields {
            return None;
        }
        Some(match &options.only_extras {
            Some(names) => Wanted::Named(names),
            None => Wanted::All,
        })
    }

    fn accepts(&self, key: &[u8]) -> bool {
        match self {
            Wanted::All => true,
            Wanted::Named(names) => names.contains_bytes(key),
        }
    }
}

fn parse_line_with<'a>(
    parser: Parser,
    bytes: &'a [u8],
    number: u64,
    problems: &mut Vec<Problem>,
    extras: Option<&Wanted>,
) -> Option<Record<'a>> {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    if bytes.first() != Some(&b'{') {
        return None;
    }
    let fast = match (parser, extras) {
        (Parser::Fast, None) => super::fast::scan(bytes),
        (Parser::Fast, Some(wanted)) => super::fast::scan_for(bytes, &|key| wanted.accepts(key)),
        (Parser::SerdeOnly, _) => None,
    };
    let fields = match fast {
        Some(fields) => fields,
        None => match serde_json::from_slice::<RawRecord>(bytes) {
            Ok(record) => super::fast::Fields {
                ts: record.ts.map(RawValue::get),
                event: record.event.map(RawValue::get),
                version: record.version.map(RawValue::get),
                detail: record.detail.map(RawValue::get),
                wanted_key: None,
            },
            Err(e) => {
                let what = if e.is_eof() {
                    format!("not valid JSON, cut short ({e}); a torn last write?")
                } else {
                    format!("not valid JSON ({e})")
                };
                problems.push(Problem { line: number, what });
                return None;
            }
        },
    };
    Some(decode_record(fields, bytes, number, problems))
}

/// A record from its fields' raw text: numbers and strings where the other is expected are
/// converted or noted in `problems`. `line` is the record's line, without its `\r`.
fn decode_record<'a>(
    record: super::fast::Fields<'a>,
    line: &'a [u8],
    number: u64,
    problems: &mut Vec<Problem>,
) -> Record<'a> {
    let mut note = |field: &str, what: String| {
        problems.push(Problem {
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
    let mut text = |field: &str, raw: Option<&'a str>| match decode(raw) {
        Field::Missing => None,
        Field::Text(s) => Some(s),
        Field::Number(n) => Some(Cow::Owned(format_number(n))),
        Field::Other(kind) => {
            note(field, format!("is {kind}, not text; treated as missing"));
            None
        }
    };
    Record {
        ts,
        event: text("event", record.event),
        version: text("version", record.version),
        detail: text("detail", record.detail),
        raw: line,
        wanted_key: record.wanted_key,
    }
}

/// How to read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadOptions {
    /// Also collect fields beyond the four (for SQL).
    pub extra_fields: bool,
    /// With `extra_fields`: only these (the fields a query names); None: all of them.
    pub only_extras: Option<Arc<ExtraNames>>,
    /// Keep the detail of every record, not only of rollbacks and escalations (for SQL).
    pub all_details: bool,
    /// Collect a signed release's `sequence` and `manifest_sha256` (for history), looked for
    /// only in lines that name a manifest, so unsigned logs cost nothing more.
    pub release_fields: bool,
    /// Collect a rollout's `token`, `slot` and `wave` (for history and stats), looked for only
    /// in lines that name a wave or start a rollout.
    pub rollout_fields: bool,
    /// Leave every `ts` out (a query that names none and selects no time). A number's text is
    /// then not even converted: a well-formed JSON number is never a problem, while a string
    /// still is and is still reported, so `--strict` answers as before.
    pub skip_ts: bool,
    /// Leave every version out (a query that names none): one allocation less per record.
    pub skip_versions: bool,
    /// Leave every detail out, rollbacks' too (a query that names none).
    pub skip_details: bool,
    /// Keep only the records a question is asked of (`--since`, `--until`, `--version`),
    /// decided on each record as it is read, so the others cost no memory.
    pub selection: Option<Arc<super::Selection>>,
    /// `history --at`: the moment asked about; what happens after it is not kept.
    pub at: Option<f64>,
    /// With `at`: older files are read too, so an end that matches nothing in this one is
    /// kept for them (one file alone: dropped).
    pub at_older_files: bool,
}

/// The extra fields a query may read, and a quick test of whether a line can hold any: most
/// lines of a log have none of them, and skip the second, general parse that finds them.
pub struct ExtraNames {
    names: std::collections::BTreeSet<String>,
    needles: Vec<memchr::memmem::Finder<'static>>,
    /// The names by their length, for the fast path's question about every key of every
    /// line: most keys have a length no wanted name has (a BTreeSet lookup per key was a
    /// tenth of a GROUP BY).
    by_length: Vec<Vec<Box<[u8]>>>,
}

impl ExtraNames {
    pub fn new(names: std::collections::BTreeSet<String>) -> ExtraNames {
        let needles = names
            .iter()
            .filter(|n| !matches!(n.as_str(), "ts" | "event" | "version" | "detail"))
            .map(|n| memchr::memmem::Finder::new(format!("\"{n}\"").as_bytes()).into_owned())
            .collect();
        let mut by_length: Vec<Vec<Box<[u8]>>> = Vec::new();
        for name in &names {
            let length = name.len();
            if by_length.len() <= length {
                by_length.resize(length + 1, Vec::new());
            }
            by_length[length].push(name.as_bytes().into());
        }
        ExtraNames {
            names,
            needles,
            by_length,
        }
    }

    /// False only when no wanted name can be a key of the line (an escaped key, `\u`, may
    /// spell any name, so such a line is always looked at). Only for lines the fast path
    /// deferred: it tells the others from the keys it tokenized.
    fn may_be_in(&self, raw: &[u8]) -> bool {
        self.needles.iter().any(|n| n.find(raw).is_some()) || ESCAPED_UNICODE.is_in(raw)
    }

    pub(crate) fn contains(&self, key: &str) -> bool {
        self.names.contains(key)
    }

    /// [`ExtraNames::contains`] for a key as the line spells it (unescaped: the fast path
    /// defers escaped keys).
    fn contains_bytes(&self, key: &[u8]) -> bool {
        self.by_length
            .get(key.len())
            .is_some_and(|same| same.iter().any(|name| **name == *key))
    }
}

impl std::fmt::Debug for ExtraNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(&self.names).finish()
    }
}

impl PartialEq for ExtraNames {
    fn eq(&self, other: &ExtraNames) -> bool {
        self.names == other.names
    }
}

/// The fields a release's attempt adds to its lines: a signed release's, its config's and its
/// policy's digests.
pub const RELEASE_FIELDS: [&str; 4] = ["sequence", "manifest_sha256", "config", "policy"];
/// The fields a rollout adds to its lines.
pub const ROLLOUT_FIELDS: [&str; 3] = ["token", "slot", "wave"];

/// A block's results, line numbers relative to the block.
struct Parsed<S> {
    sink: S,
    problems: Vec<Problem>,
    lines: u64,
}

/// Parses a block of whole lines (the last may lack its newline).
fn parse_block<S: Sink>(block: &[u8], first: bool, options: ReadOptions) -> Parsed<S> {
    parse_block_with(Parser::chosen(), block, first, options)
}

fn parse_block_with<S: Sink>(
    parser: Parser,
    block: &[u8],
    first: bool,
    options: ReadOptions,
) -> Parsed<S> {
    let wanted = Wanted::of(&options);
    let wanted = wanted.as_ref();
    let mut sink = S::new(options.clone());
    if block.is_empty() {
        // A block inside a line longer than a block: the block before holds the line.
        return Parsed {
            sink,
            problems: Vec::new(),
            lines: 0,
        };
    }
    // Log lines are rarely shorter than this: one allocation per column and block, not a
    // doubling and a copy every few hundred records.
    sink.reserve(block.len() / 96);
    let mut problems = Vec::new();
    let mut lines = 0;
    let accepts = |key: &[u8]| wanted.is_some_and(|w| w.accepts(key));
    let filter: Option<super::fast::KeyFilter> = wanted.map(|_| &accepts as _);
    let mut start = 0;
    while start < block.len() {
        let rest = &block[start..];
        lines += 1;
        let bom = first && lines == 1 && rest.starts_with(b"\xEF\xBB\xBF");
        // Most lines are records the fast path reads whole, finding where the line ends as
        // it goes; the rest are cut at their newline and read as before (a separate newline
        // search per line was a sixth of a GROUP BY).
        let fused = match parser {
            Parser::Fast if !bom => super::fast::scan_line(rest, filter),
            _ => None,
        };
        let end = match fused {
            Some((mut fields, end)) => {
                let number = |ts: &str| ts.starts_with(|c: char| c == '-' || c.is_ascii_digit());
                if options.skip_ts && fields.ts.is_some_and(number) {
                    // Never a problem and not kept: not converted. Any other `ts` is decoded,
                    // so that what is wrong with it is still reported.
                    fields.ts = None;
                }
                let line = &rest[..end];
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                sink.record(lines, decode_record(fields, line, lines, &mut problems));
                end
            }
            None => {
                let end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
                let raw = &rest[..end];
                let bytes = if bom { &raw[3..] } else { raw };
                if let Some(record) = parse_line(bytes, lines, &mut problems, wanted) {
                    sink.record(lines, record);
                }
                end
            }
        };
        start += end + 1;
    }
    sink.finish();
    Parsed {
        sink,
        problems,
        lines,
    }
}

/// Merges block results in order.
struct Merged<S> {
    sink: S,
    problems: Vec<Problem>,
    lines: u64,
}

impl<S: Sink> Merged<S> {
    fn new(options: ReadOptions) -> Self {
        Merged {
            sink: S::new(options),
            problems: Vec::new(),
            lines: 0,
        }
    }

    fn push(&mut self, block: Parsed<S>) {
        let offset = self.lines;
        self.sink.absorb(block.sink, offset);
        self.problems
            .extend(block.problems.into_iter().map(|p| Problem {
                line: p.line + offset,
                ..p
            }));
        self.lines += block.lines;
    }
}

const BLOCK: usize = 4 << 20;

/// Splits `source` into blocks of whole lines of about [`BLOCK`] bytes and calls `each` with
/// each block, in order.
pub fn read_blocks(mut source: impl Read, mut each: impl FnMut(Vec<u8>)) -> std::io::Result<()> {
    let mut buffer = vec![0u8; BLOCK];
    let mut filled = 0;
    loop {
        if filled == buffer.len() {
            // No newline in a whole buffer: one long line; grow rather than split it.
            buffer.resize(buffer.len() * 2, 0);
        }
        let n = match source.read(&mut buffer[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            if filled > 0 {
                buffer.truncate(filled);
                each(buffer);
            }
            return Ok(());
        }
        filled += n;
        // A pipe gives 64 KiB a read: cutting a block at each read made a 4 MiB buffer per
        // 64 KiB of log (4 s of page clearing for 382 MB). Blocks are cut only once full.
        if filled < buffer.len() {
            continue;
        }
        if let Some(last) = memchr::memrchr(b'\n', &buffer[..filled]) {
            let rest = buffer[last + 1..filled].to_vec();
            buffer.truncate(last + 1);
            each(std::mem::replace(
                &mut buffer,
                vec![0u8; BLOCK.max(rest.len() * 2)],
            ));
            buffer[..rest.len()].copy_from_slice(&rest);
            filled = rest.len();
        }
    }
}

/// Reads a log file into a sink. Missing, unreadable or directory paths are errors; everything
/// inside the file is answered, with problems listed by line.
pub fn read_with<S: Sink>(
    path: &Path,
    options: ReadOptions,
) -> Result<(S, Vec<Problem>), ReadError> {
    let error = |reason: String| ReadError {
        path: path.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| error(io_reason(&e)))?;
    if meta.is_dir() {
        return Err(error("is a directory, not a log file".into()));
    }
    let file = std::fs::File::open(path).map_err(|e| error(io_reason(&e)))?;
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    if meta.is_file() {
        if meta.len() == 0 {
            return Ok((S::new(options), Vec::new()));
        }
        // SAFETY: the map is only read. A log is appended to while it is read, which a map
        // taken at this length does not see; another program truncating the file meanwhile
        // would fault the read, the risk every mmap reader (ripgrep, DuckDB) takes.
        if let Ok(map) = unsafe { memmap2::Mmap::map(&file) } {
            let _ = map.advise(memmap2::Advice::Sequential);
            let base = map.as_ptr() as usize;
            // A parsed block's pages leave this process (they stay in the page cache), so
            // the resident size follows what the sink keeps, not the file's size. Only whole
            // pages inside the block: its neighbours may still be read.
            // SAFETY: sysconf has no preconditions.
            let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
                .unwrap_or(4096)
                .max(1);
            let release = |block: &[u8]| {
                let start = (block.as_ptr() as usize - base).div_ceil(page) * page;
                let end = (block.as_ptr() as usize - base + block.len()) / page * page;
                if end > start {
                    // SAFETY: nothing borrows a parsed block (sinks own what they keep), and a
                    // read-only file map faults its pages in again, unchanged, if touched.
                    let _ = unsafe {
                        map.unchecked_advise_range(
                            memmap2::UncheckedAdvice::DontNeed,
                            start,
                            end - start,
                        )
                    };
                }
            };
            let _truncation = super::truncation::Guard::install(&map, path);
            return Ok(parse_in_place(&map, workers, options, &release));
        }
    }
    let (block_tx, block_rx) = mpsc::sync_channel::<(usize, Vec<u8>)>(workers * 2);
    let block_rx = Arc::new(Mutex::new(block_rx));
    let (done_tx, done_rx) = mpsc::channel::<(usize, Parsed<S>)>();
    let mut merged = Merged::new(options.clone());
    let window = super::ordered::Window::new(workers);
    let read = std::thread::scope(|scope| {
        for _ in 0..workers {
            let (block_rx, done_tx, window) = (block_rx.clone(), done_tx.clone(), &window);
            let options = options.clone();
            scope.spawn(move || loop {
                let next = block_rx.lock().expect("block queue").recv();
                let Ok((index, block)) = next else { break };
                window.enter(index);
                let _ = done_tx.send((index, parse_block(&block, index == 0, options.clone())));
            });
        }
        drop(done_tx);
        let reader = scope.spawn(move || {
            let mut index = 0;
            read_blocks(file, |block| {
                let _ = block_tx.send((index, block));
                index += 1;
            })
        });
        merge_in_order(&mut merged, done_rx, &window);
        reader.join().expect("reader thread")
    });
    read.map_err(|e| error(io_reason(&e)))?;
    Ok((merged.sink, merged.problems))
}

/// Blocks finish out of order; they are merged in order.
fn merge_in_order<S: Sink>(
    merged: &mut Merged<S>,
    done: mpsc::Receiver<(usize, Parsed<S>)>,
    window: &super::ordered::Window,
) {
    super::ordered::in_order(done, window, |parsed| merged.push(parsed));
}

/// Block `index` of `bytes`: from the first line that starts at or after `index × BLOCK` to
/// the first that starts at or after the next block's offset. Each worker finds its own
/// bounds, so no thread walks the file to cut it before the parse starts (the first touch of
/// every block's end was a serial tenth of a GROUP BY). A line longer than a block leaves the
/// blocks it covers empty.
fn block_bounds(bytes: &[u8], index: usize) -> std::ops::Range<usize> {
    let line_start_from = |at: usize| match at {
        0 => 0,
        at if at >= bytes.len() => bytes.len(),
        at => memchr::memchr(b'\n', &bytes[at - 1..]).map_or(bytes.len(), |i| at + i),
    };
    line_start_from(index.saturating_mul(BLOCK))..line_start_from((index + 1).saturating_mul(BLOCK))
}

/// Parses a whole log held in memory (a mapped file), its blocks shared among `workers`;
/// `release` is told of each block once it is parsed.
fn parse_in_place<S: Sink>(
    bytes: &[u8],
    workers: usize,
    options: ReadOptions,
    release: &(dyn Fn(&[u8]) + Sync),
) -> (S, Vec<Problem>) {
    let blocks = bytes.len().div_ceil(BLOCK);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (done_tx, done_rx) = mpsc::channel::<(usize, Parsed<S>)>();
    let mut merged = Merged::new(options.clone());
    let window = super::ordered::Window::new(workers);
    std::thread::scope(|scope| {
        for _ in 0..workers.min(blocks) {
            let (done_tx, options, next, window) =
                (done_tx.clone(), options.clone(), &next, &window);
            scope.spawn(move || loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if index >= blocks {
                    break;
                }
                window.enter(index);
                let block = &bytes[block_bounds(bytes, index)];
                let parsed = parse_block(block, index == 0, options.clone());
                release(block);
                let _ = done_tx.send((index, parsed));
            });
        }
        drop(done_tx);
        merge_in_order(&mut merged, done_rx, &window);
    });
    (merged.sink, merged.problems)
}

/// Reads a log into columns.
pub fn read_log(path: &Path, options: ReadOptions) -> Result<(Log, Vec<Problem>), ReadError> {
    read_with(path, options)
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

/// Parses a whole log held in memory, block by block like a file (tests use this).
#[cfg(test)]
pub fn parse_bytes<S: Sink>(bytes: &[u8], options: ReadOptions) -> (S, Vec<Problem>) {
    let mut merged = Merged::new(options.clone());
    let mut index = 0;
    read_blocks(bytes, |block| {
        merged.push(parse_block(&block, index == 0, options.clone()));
        index += 1;
    })
    .expect("reading from memory cannot fail");
    (merged.sink, merged.problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_wanted_only_when_named_exactly() {
        let names = ExtraNames::new(
            ["port", "n", "wave"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
        );
        assert!(names.contains_bytes(b"port"));
        assert!(names.contains_bytes(b"n"));
        for other in [&b"pid"[..], b"portx", b"Port", b"", b"wav"] {
            assert!(!names.contains_bytes(other), "{other:?}");
        }
    }

    #[test]
    fn only_lines_beginning_with_a_brace_are_records() {
        let text = b"# deploy log\n\n  {\"event\":\"promoted\",\"version\":\"v0\"}\n{\"ts\":1,\"event\":\"promoted\",\"version\":\"v1\",\"detail\":\"ok\"}\nfree text\n";
        let (log, problems) = parse_bytes::<Log>(text, ReadOptions::default());
        assert_eq!(log.line, vec![4]);
        assert_eq!(log.version, vec![Some("v1".into())]);
        assert!(problems.is_empty());
    }

    #[test]
    fn crlf_missing_final_newline_and_bom() {
        let text = b"\xEF\xBB\xBF{\"ts\":1,\"event\":\"a\"}\r\n{\"ts\":2,\"event\":\"b\"}";
        let (log, problems) = parse_bytes::<Log>(text, ReadOptions::default());
        assert_eq!(log.ts, vec![Some(1.0), Some(2.0)]);
        assert_eq!(log.event, vec![Some(Cow::from("a")), Some(Cow::from("b"))]);
        assert!(problems.is_empty());
    }

    #[test]
    fn a_torn_line_is_reported_with_its_number_and_skipped() {
        let text = b"{\"ts\":1,\"event\":\"a\"}\n{\"ts\":2,\"ev";
        let (log, problems) = parse_bytes::<Log>(text, ReadOptions::default());
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
        let (log, problems) = parse_bytes::<Log>(text, ReadOptions::default());
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
        let (log, problems) = parse_bytes::<Log>(text, ReadOptions::default());
        assert_eq!(log.len(), 0);
        assert_eq!(problems.len(), 1);
    }

    #[test]
    fn extra_fields_line_up_with_their_records() {
        let text = b"{\"ts\":1,\"event\":\"a\"}\n{\"ts\":2,\"event\":\"b\",\"port\":8081}\n{\"ts\":3,\"event\":\"c\"}\n";
        let (log, _) = parse_bytes::<Log>(
            text,
            ReadOptions {
                extra_fields: true,
                all_details: true,
                ..ReadOptions::default()
            },
        );
        assert_eq!(log.extra.len(), 1);
        assert_eq!(log.extra[0].0, "port");
        assert_eq!(
            log.extra[0].1,
            vec![None, Some(serde_json::json!(8081)), None]
        );
    }

    #[test]
    fn blocks_found_by_each_worker_tile_the_bytes_at_line_starts() {
        let line = |n: usize| format!("{}\n", "x".repeat(n));
        let texts = [
            String::new(),
            line(10),
            line(BLOCK - 1) + &line(5),
            line(BLOCK) + &line(3),
            line(3 * BLOCK) + &line(BLOCK / 2) + "tail without newline",
            "\n".repeat(BLOCK + 1),
        ];
        for text in &texts {
            let bytes = text.as_bytes();
            let count = bytes.len().div_ceil(BLOCK);
            let mut at = 0;
            for index in 0..count {
                let bounds = block_bounds(bytes, index);
                assert_eq!(
                    bounds.start, at,
                    "block {index} starts where the last ended"
                );
                assert!(bounds.start == 0 || bytes[bounds.start - 1] == b'\n');
                assert!(bounds.end >= bounds.start);
                at = bounds.end;
            }
            assert_eq!(at, bytes.len(), "the blocks cover every byte");
            let streamed = parse_bytes::<Log>(bytes, ReadOptions::default());
            let mapped = parse_in_place::<Log>(bytes, 3, ReadOptions::default(), &|_| {});
            assert_eq!(mapped, streamed);
        }
    }

    #[test]
    fn lines_longer_than_a_block_are_kept_whole() {
        let detail = "x".repeat(BLOCK * 2);
        let text = format!("{{\"event\":\"rolled_back\",\"detail\":\"{detail}\"}}\n");
        let (log, problems) = parse_bytes::<Log>(text.as_bytes(), ReadOptions::default());
        assert!(problems.is_empty());
        assert_eq!(log.detail[0].as_deref().map(str::len), Some(BLOCK * 2));
    }

    #[test]
    fn a_query_reads_the_extra_fields_it_names_however_they_are_spelled() {
        let text = concat!(
            "{\"ts\":1,\"event\":\"a\",\"port\":1,\"pid\":9}\n",
            "{\"ts\":2,\"event\":\"b\",\"p\\u006frt\":2}\n",
            "{\"ts\":3,\"event\":\"c\",\"pid\":7}\n",
        );
        let names = ["port".to_string()].into_iter().collect();
        let options = ReadOptions {
            extra_fields: true,
            only_extras: Some(Arc::new(ExtraNames::new(names))),
            ..ReadOptions::default()
        };
        let (log, problems) = parse_bytes::<Log>(text.as_bytes(), options);
        assert!(problems.is_empty());
        assert_eq!(log.extra.len(), 1, "pid is not named");
        assert_eq!(log.extra[0].0, "port");
        let ports: Vec<Option<i64>> = log.extra[0]
            .1
            .iter()
            .map(|v| v.as_ref().and_then(Value::as_i64))
            .collect();
        assert_eq!(ports, [Some(1), Some(2), None]);
    }

    /// A source that gives a little at a time, as a pipe does.
    struct Trickle<'a>(&'a [u8]);

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = out.len().min(self.0.len()).min(64 << 10);
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_stream_read_in_small_pieces_is_cut_into_whole_blocks() {
        let line = "{\"ts\":1,\"event\":\"promoted\",\"version\":\"v1\",\"detail\":\"ready\"}\n";
        let text = line.repeat((3 * BLOCK) / line.len());
        let mut blocks = Vec::new();
        read_blocks(Trickle(text.as_bytes()), |block| blocks.push(block)).unwrap();
        assert_eq!(blocks.concat(), text.as_bytes());
        assert!(blocks.iter().all(|b| b.ends_with(b"\n")));
        // Once per 4 MiB, not once per 64 KiB read (which was 150 blocks here).
        assert!(blocks.len() <= 4, "{} blocks", blocks.len());
    }

    #[test]
    fn a_mapped_file_reads_as_a_stream_does() {
        // Several blocks, a line longer than a block, a BOM, CRLF, a torn last line.
        let mut text =
            String::from("\u{feff}{\"ts\":1,\"event\":\"promoted\",\"version\":\"v1\"}\r\n");
        for i in 0..120_000 {
            text.push_str(&format!(
                "{{\"ts\":{i},\"event\":\"rolled_back\",\"version\":\"v{i}\",\"detail\":\"d{i}; x\"}}\n"
            ));
            if i == 70_000 {
                text.push_str(&format!(
                    "{{\"event\":\"rolled_back\",\"detail\":\"{}\"}}\n",
                    "y".repeat(BLOCK + 7)
                ));
            }
        }
        text.push_str("{\"ts\":5,\"event\":\"prom");
        assert!(text.len() > 2 * BLOCK);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deploy.log");
        std::fs::write(&path, &text).unwrap();
        let options = ReadOptions {
            all_details: true,
            ..ReadOptions::default()
        };
        let mapped = read_log(&path, options.clone()).unwrap();
        let streamed = parse_bytes::<Log>(text.as_bytes(), options);
        assert_eq!(mapped.0, streamed.0);
        assert_eq!(mapped.1, streamed.1);
        assert_eq!(mapped.0.len(), 120_002);
        assert_eq!(mapped.1.len(), 1, "the torn last line");
        // An empty file is an empty log.
        std::fs::write(&path, "").unwrap();
        assert!(read_log(&path, ReadOptions::default())
            .unwrap()
            .0
            .is_empty());
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Damage {
        None,
        Cut(usize),
        Byte(usize, u8),
        Crlf,
        TrailingComma,
        Trailing,
    }

    /// Keys: the four fields (plain and escaped), others, and odd ones.
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("\"ts\"".to_string()),
            Just("\"event\"".to_string()),
            Just("\"version\"".to_string()),
            Just("\"detail\"".to_string()),
            Just("\"t\\u0073\"".to_string()),
            Just("\"port\"".to_string()),
            Just("\"\"".to_string()),
            Just("\"d\\\"x\"".to_string()),
            "\"[a-z\u{e9}\u{1F600}]{0,6}\"",
        ]
    }

    /// Values: numbers (as versions too), strings with escapes and unicode, nesting, literals,
    /// and near misses.
    fn value() -> impl Strategy<Value = String> {
        let valid = prop_oneof![
            Just("1790000214.585".to_string()),
            Just("-0".to_string()),
            Just("2e-3".to_string()),
            Just("1e999".to_string()),
            Just("3".to_string()),
            Just("true".to_string()),
            Just("null".to_string()),
            Just("\"v2\"".to_string()),
            Just("\"a\\\"b\\\\c\\/d\\n\\t\"".to_string()),
            "\"[ -~\u{e9}\u{4e2d}\u{1F600}]{0,12}\"",
            "-?[0-9]{1,4}(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?",
        ];
        // Near misses and what the fast path must leave to serde_json.
        let odd = prop_oneof![
            Just("01".to_string()),
            Just("1.".to_string()),
            Just("-".to_string()),
            Just("nul".to_string()),
            Just("\"\\u00e9\\ud83d\\ude00\"".to_string()),
            Just("\"\\ud800\"".to_string()),
            Just("\"\\x\"".to_string()),
            Just("\"tab\there\"".to_string()),
            Just("\"unterminated".to_string()),
        ];
        let leaf = prop_oneof![8 => valid, 2 => odd];
        leaf.prop_recursive(3, 12, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                proptest::collection::vec(("\"[a-z]{0,3}\"", inner), 0..3).prop_map(|v| {
                    let body: Vec<String> =
                        v.into_iter().map(|(k, v)| format!("{k}:{v}")).collect();
                    format!("{{{}}}", body.join(","))
                }),
            ]
        })
    }

    /// A line built from record-like pieces and then maybe damaged (cut short, a byte
    /// changed, CRLF, a trailing comma or text).
    fn damaged_line() -> impl Strategy<Value = Vec<u8>> {
        let damage = prop_oneof![
            6 => Just(Damage::None),
            1 => (0usize..200).prop_map(Damage::Cut),
            1 => (0usize..200, any::<u8>()).prop_map(|(at, b)| Damage::Byte(at, b)),
            1 => Just(Damage::Crlf),
            1 => Just(Damage::TrailingComma),
            1 => Just(Damage::Trailing),
        ];
        let spacing = prop_oneof![Just(""), Just(" "), Just("\t"), Just(" \r ")];
        (
            proptest::collection::vec((key(), value()), 0..7),
            spacing,
            damage,
        )
            .prop_map(|(fields, spacing, damage)| {
                let body: Vec<String> = fields
                    .iter()
                    .map(|(k, v)| format!("{spacing}{k}{spacing}:{spacing}{v}{spacing}"))
                    .collect();
                let mut line = format!("{{{}}}", body.join(",")).into_bytes();
                match damage {
                    Damage::None => {}
                    Damage::Cut(at) => line.truncate(at.min(line.len()).max(1)),
                    Damage::Byte(at, b) => {
                        let at = at % line.len();
                        if at > 0 && b != b'\n' {
                            line[at] = b;
                        }
                    }
                    Damage::Crlf => line.extend_from_slice(b"\r"),
                    Damage::TrailingComma => {
                        line.pop();
                        line.extend_from_slice(b",}");
                    }
                    Damage::Trailing => line.extend_from_slice(b" x"),
                }
                line
            })
    }

    #[test]
    fn the_fast_path_defers_what_it_cannot_vouch_for() {
        let deferred: [&[u8]; 9] = [
            br#"{"ts":1,"ts":2}"#,
            br#"{"t\u0073":1}"#,
            br#"{"detail":"\u00e9"}"#,
            br#"{"detail":"a"} x"#,
            br#"{"detail":"a",}"#,
            b"{\"detail\":\"\xff\"}",
            b"{\"detail\":\"a\tb\"}",
            br#"{"version":01}"#,
            br#"{"x":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}"#,
        ];
        for line in deferred {
            assert_eq!(
                super::super::fast::scan(line),
                None,
                "{}",
                String::from_utf8_lossy(line)
            );
        }
        let fields = super::super::fast::scan(
            br#"{ "ts" : 1.5 , "event":"promoted","version":3,"detail":"a\"b","x":{"y":[true,null]}}"#,
        )
        .unwrap();
        assert_eq!(fields.ts, Some("1.5"));
        assert_eq!(fields.version, Some("3"));
        assert_eq!(fields.detail, Some(r#""a\"b""#));
    }

    proptest! {
        /// Arbitrary bytes never panic the reader, and every line is accounted for: kept as a
        /// record, reported as a problem, or passed over as noise.
        #[test]
        fn arbitrary_bytes_are_answered(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let (log, problems) = parse_bytes::<Log>(&bytes, ReadOptions { extra_fields: true, all_details: true, ..ReadOptions::default() });
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

        /// The fast path answers exactly as serde_json alone: the same record (fields, raw
        /// line) and the same problems, line by line, on lines built from record-like pieces
        /// and then damaged (cut short, a byte changed, CRLF, noise around them).
        #[test]
        fn the_fast_path_answers_as_serde_json_does(line in damaged_line()) {
            let (mut fast_problems, mut serde_problems) = (Vec::new(), Vec::new());
            let fast = parse_line_with(Parser::Fast, &line, 1, &mut fast_problems, None);
            let serde = parse_line_with(Parser::SerdeOnly, &line, 1, &mut serde_problems, None);
            prop_assert_eq!(&fast, &serde, "line {:?}", String::from_utf8_lossy(&line));
            prop_assert_eq!(fast_problems, serde_problems);
            // What the fast path says of other keys is what serde_json's object holds.
            let told = parse_line_with(Parser::Fast, &line, 1, &mut Vec::new(), Some(&Wanted::All))
                .and_then(|r| r.wanted_key);
            if let Some(told) = told {
                let others = serde_json::from_slice::<Value>(&line).ok().and_then(|v| {
                    v.as_object().map(|o| {
                        o.keys().any(|k| !matches!(k.as_str(), "ts" | "event" | "version" | "detail"))
                    })
                });
                // (A line serde_json cannot make a Value of yields no extra fields either way.)
                if let Some(others) = others {
                    prop_assert_eq!(told, others, "line {:?}", String::from_utf8_lossy(&line));
                }
            }
        }

        /// A block read with the line ends found by the fast scan answers as one cut at each
        /// newline and read by serde_json alone: records, line numbers, problems.
        #[test]
        fn a_block_read_fast_answers_as_serde_json_does(
            lines in proptest::collection::vec(
                prop_oneof![
                    8 => damaged_line(),
                    1 => Just(Vec::new()),
                    1 => Just(b"noise {\"ts\":1}".to_vec()),
                    1 => Just(b"\xEF\xBB\xBF{\"event\":\"promoted\"}".to_vec()),
                ],
                0..12,
            ),
            final_newline in any::<bool>(),
        ) {
            let mut block = lines.join(&b'\n');
            if final_newline {
                block.push(b'\n');
            }
            for (extras, skip_ts) in [(false, false), (true, false), (true, true)] {
                let options = ReadOptions { extra_fields: extras, all_details: true, skip_ts, ..ReadOptions::default() };
                let fast = parse_block_with::<Log>(Parser::Fast, &block, true, options.clone());
                let serde = parse_block_with::<Log>(Parser::SerdeOnly, &block, true, options);
                prop_assert_eq!(&fast.sink, &serde.sink, "block {:?}", String::from_utf8_lossy(&block));
                prop_assert_eq!(&fast.problems, &serde.problems);
                prop_assert_eq!(fast.lines, serde.lines);
            }
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
            let (log, _problems) = parse_bytes::<Log>(text.as_bytes(), ReadOptions { extra_fields: true, all_details: true, ..ReadOptions::default() });
            prop_assert!(log.len() <= 2);
            for (_, column) in &log.extra {
                prop_assert_eq!(column.len(), log.len());
            }
        }
    }
}
