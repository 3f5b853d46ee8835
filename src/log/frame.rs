//! Columns to polars frames: the records as table `log`, the attempts as table `attempts`.

use polars::prelude::*;
use serde_json::Value;

use super::history::Attempt;
use super::read::{Log, ReadOptions, Record, Sink};

fn column<T>(name: &str, values: T) -> Column
where
    Series: NamedFrom<T, [Option<f64>]>,
{
    Series::new(name.into(), values).into_column()
}

fn text_column(name: &str, values: &[Option<String>]) -> Column {
    Series::new(name.into(), values).into_column()
}

/// One block of a log with its standard columns (`ts`, `event`, `version`, `detail`, those
/// its read options kept) already built; the block's own copies of them are dropped.
#[derive(Debug)]
pub struct Chunk {
    log: Log,
    built: Vec<Column>,
}

impl Chunk {
    pub fn of(mut log: Log) -> Chunk {
        let options = log.options();
        // A query reads everything (`only_extras` None) or the names it holds, as written and
        // lowercased; `all_details` says whether it names `detail`.
        let wants = |name: &str| {
            options
                .only_extras
                .as_ref()
                .is_none_or(|n| n.contains(name))
        };
        let mut built = Vec::new();
        if wants("ts") {
            built.push(column("ts", &log.ts));
        }
        if wants("event") {
            // Borrowed straight into the Arrow column: no string, nor any list, per record.
            let events: StringChunked = log.event.iter().map(|e| e.as_deref()).collect();
            built.push(events.with_name("event".into()).into_series().into_column());
        }
        if wants("version") {
            built.push(text_column("version", &log.version));
        }
        if options.all_details {
            built.push(text_column("detail", &log.detail));
        }
        log.ts = Vec::new();
        log.event = Vec::new();
        log.version = Vec::new();
        log.detail = Vec::new();
        Chunk { log, built }
    }
}

/// A query's sink: each block becomes a [`Chunk`] in the thread that parsed it, so building
/// the frame's columns runs in parallel with the parse instead of after it.
#[derive(Debug)]
pub struct Chunks {
    block: Log,
    /// The blocks in file order, line numbers counted from the start of the file.
    pub chunks: Vec<Chunk>,
}

impl Sink for Chunks {
    fn new(options: ReadOptions) -> Self {
        Chunks {
            block: Log::new(options),
            chunks: Vec::new(),
        }
    }

    fn record(&mut self, line: u64, record: Record<'_>) {
        self.block.record(line, record);
    }

    fn reserve(&mut self, lines: usize) {
        self.block.reserve(lines);
    }

    fn finish(&mut self) {
        let block = std::mem::take(&mut self.block);
        if !block.is_empty() {
            self.chunks.push(Chunk::of(block));
        }
    }

    fn absorb(&mut self, later: Self, line_offset: u64) {
        for mut chunk in later.chunks {
            for line in &mut chunk.log.line {
                *line += line_offset;
            }
            self.chunks.push(chunk);
        }
    }
}

/// The records with their line numbers, and every extra field as a column typed by what it
/// holds (all integers: Int64; all numbers: Float64; all booleans: Boolean; else text).
/// Only the columns `named` says a query may read are built (`line` too when no other is, so
/// a frame has a height); None builds them all. `chunks` are consecutive pieces of one log
/// (the blocks it was read in): each becomes a chunk of the frame, none is copied into another.
/// With no chunk, the frame is empty with the columns `options` would have kept.
pub fn records(
    chunks: &[Chunk],
    options: &ReadOptions,
    named: Option<&crate::log::Columns>,
) -> PolarsResult<DataFrame> {
    let wants = |name: &str| named.is_none_or(|c| c.names(name));
    // An extra field's type is decided over the whole log, so that every chunk agrees.
    let mut extras: Vec<(&str, Kind)> = Vec::new();
    for chunk in chunks {
        for (name, values) in &chunk.log.extra {
            let kind = Kind::of(values);
            match extras.iter_mut().find(|(n, _)| n == name) {
                Some((_, known)) => *known = known.widest(kind),
                None => extras.push((name, kind)),
            }
        }
    }
    let empty = chunks
        .is_empty()
        .then(|| Chunk::of(Log::new(options.clone())));
    let mut frame: Option<DataFrame> = None;
    for Chunk { log, built } in chunks.iter().chain(empty.as_ref()) {
        let mut columns = built.clone();
        for (name, kind) in &extras {
            if ["line", "ts", "event", "version", "detail"].contains(name) {
                continue;
            }
            let values = log.extra.iter().find(|(n, _)| n == name);
            columns.push(match values {
                Some((_, values)) => kind.column(name, values),
                None => Column::full_null((*name).into(), log.len(), &kind.dtype()),
            });
        }
        if wants("line") || columns.is_empty() {
            columns.insert(0, Series::new("line".into(), &log.line).into_column());
        }
        let chunk = DataFrame::new(log.len(), columns)?;
        match frame.as_mut() {
            None => frame = Some(chunk),
            Some(frame) => {
                frame.vstack_mut(&chunk)?;
            }
        }
    }
    Ok(frame.expect("at least one chunk"))
}

/// The type an extra field's column takes: the narrowest every present value converts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// No value present (yet): as a whole column, Int64 of nulls.
    Empty,
    Int,
    Float,
    Bool,
    Text,
}

impl Kind {
    fn of(values: &[Option<Value>]) -> Kind {
        let all = |convert: fn(&Value) -> bool| values.iter().flatten().all(convert);
        if values.iter().all(Option::is_none) {
            Kind::Empty
        } else if all(|v| v.as_i64().is_some()) {
            Kind::Int
        } else if all(|v| v.as_f64().is_some()) {
            Kind::Float
        } else if all(|v| v.as_bool().is_some()) {
            Kind::Bool
        } else {
            Kind::Text
        }
    }

    /// The kind two pieces of one column share, as if typed whole: a piece with no values
    /// takes the other's kind, integers widen to numbers, anything else mixed is text.
    fn widest(self, other: Kind) -> Kind {
        match (self, other) {
            (a, b) if a == b => a,
            (Kind::Empty, kind) | (kind, Kind::Empty) => kind,
            (Kind::Int, Kind::Float) | (Kind::Float, Kind::Int) => Kind::Float,
            _ => Kind::Text,
        }
    }

    fn dtype(self) -> DataType {
        match self {
            Kind::Empty | Kind::Int => DataType::Int64,
            Kind::Float => DataType::Float64,
            Kind::Bool => DataType::Boolean,
            Kind::Text => DataType::String,
        }
    }

    fn column(self, name: &str, values: &[Option<Value>]) -> Column {
        let converted = match self {
            Kind::Empty | Kind::Int => typed_column(name, values, Value::as_i64),
            Kind::Float => typed_column(name, values, Value::as_f64),
            Kind::Bool => typed_column(name, values, Value::as_bool),
            Kind::Text => None,
        };
        converted.unwrap_or_else(|| {
            let texts: Vec<Option<String>> = values
                .iter()
                .map(|v| {
                    v.as_ref().map(|v| match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    })
                })
                .collect();
            Series::new(name.into(), texts).into_column()
        })
    }
}

/// The column as `T` if every value present converts to one (missing values stay null).
fn typed_column<T>(
    name: &str,
    values: &[Option<Value>],
    convert: fn(&Value) -> Option<T>,
) -> Option<Column>
where
    Series: NamedFrom<Vec<Option<T>>, [Option<T>]>,
{
    let converted = values
        .iter()
        .map(|v| v.as_ref().map_or(Some(None), |v| convert(v).map(Some)))
        .collect::<Option<Vec<Option<T>>>>()?;
    Some(Series::new(name.into(), converted).into_column())
}

/// Builds the column of that name.
type ColumnOf<'a> = dyn Fn(&str) -> Column + 'a;

/// One row per attempt. Times are Unix seconds, durations seconds.
pub fn attempts(attempts: &[Attempt]) -> PolarsResult<DataFrame> {
    attempts_with(attempts, None)
}

/// [`attempts`] with only the columns `only` names (None: every column): `log stats` reads
/// five of them, and a million attempts make each column worth leaving out.
pub fn attempts_with(attempts: &[Attempt], only: Option<&[&str]>) -> PolarsResult<DataFrame> {
    let pick = |name: &str, f: fn(&Attempt) -> Option<f64>| {
        column(name, attempts.iter().map(f).collect::<Vec<_>>())
    };
    // Borrowed: a million attempts need no second copy of their strings.
    let text = |name: &str, f: fn(&Attempt) -> Option<&str>| {
        Series::new(name.into(), attempts.iter().map(f).collect::<Vec<_>>()).into_column()
    };
    let builders: [(&str, &ColumnOf); 10] = [
        ("version", &|n| text(n, |a| a.version.as_deref())),
        ("started", &|n| pick(n, |a| a.started)),
        ("finished", &|n| pick(n, |a| a.finished)),
        ("outcome", &|n| {
            let outcomes: Vec<&str> = attempts.iter().map(|a| a.outcome.as_str()).collect();
            Series::new(n.into(), outcomes).into_column()
        }),
        ("time_to_outcome_s", &|n| pick(n, Attempt::time_to_outcome)),
        ("reason", &|n| text(n, |a| a.reason.as_deref())),
        ("live_for_s", &|n| pick(n, Attempt::live_for)),
        ("live_now", &|n| {
            let live_now: Vec<bool> = attempts.iter().map(|a| a.live_now).collect();
            Series::new(n.into(), live_now).into_column()
        }),
        ("rolled_back_at", &|n| pick(n, |a| a.rolled_back_at)),
        ("exposure_s", &|n| pick(n, Attempt::exposure)),
    ];
    let mut columns: Vec<Column> = builders
        .iter()
        .filter(|(name, _)| only.is_none_or(|only| only.contains(name)))
        .map(|(name, build)| build(name))
        .collect();
    if only.is_some() {
        return DataFrame::new(attempts.len(), columns);
    }
    // Signed releases' columns only where the log has any: unsigned histories read as before.
    if attempts.iter().any(|a| a.sequence().is_some()) {
        let sequences: Vec<Option<u64>> = attempts.iter().map(Attempt::sequence).collect();
        let digests: Vec<Option<&str>> = attempts.iter().map(Attempt::manifest_sha256).collect();
        columns.push(Series::new("sequence".into(), sequences).into_column());
        columns.push(Series::new("manifest_sha256".into(), digests).into_column());
    }
    // The releases' config digests likewise only where a release had a config.
    if attempts.iter().any(|a| a.config().is_some()) {
        let configs: Vec<Option<&str>> = attempts.iter().map(Attempt::config).collect();
        columns.push(Series::new("config".into(), configs).into_column());
    }
    // The policy each ran under, likewise only where a line names one.
    if attempts.iter().any(|a| a.policy().is_some()) {
        let policies: Vec<Option<&str>> = attempts.iter().map(Attempt::policy).collect();
        columns.push(Series::new("policy".into(), policies).into_column());
    }
    // What users had of the releases rolled back after they had them, likewise.
    if attempts.iter().any(|a| a.served().is_some()) {
        let requests: Vec<Option<u64>> = attempts
            .iter()
            .map(|a| a.served().and_then(|e| e.requests))
            .collect();
        let failed: Vec<Option<u64>> = attempts
            .iter()
            .map(|a| a.served().and_then(|e| e.failed))
            .collect();
        let ended_by: Vec<Option<&str>> = attempts
            .iter()
            .map(|a| a.served().map(|e| e.ended_by.as_str()))
            .collect();
        columns.push(Series::new("users_requests".into(), requests).into_column());
        columns.push(Series::new("users_failed".into(), failed).into_column());
        columns.push(Series::new("ended_by".into(), ended_by).into_column());
    }
    // The hooks that ran, likewise only where a policy had hooks.
    if attempts.iter().any(|a| a.hooks().is_some()) {
        let hooks: Vec<Option<&str>> = attempts.iter().map(Attempt::hooks).collect();
        columns.push(Series::new("hooks".into(), hooks).into_column());
    }
    // Rollouts' columns likewise only where the log has a rollout.
    if attempts.iter().any(|a| a.rollout.is_some()) {
        let facts = |f: fn(&super::history::RolloutFacts) -> String| {
            attempts
                .iter()
                .map(|a| a.rollout.as_deref().map(f))
                .collect::<Vec<_>>()
        };
        let waves: Vec<Option<u64>> = attempts
            .iter()
            .map(|a| a.rollout.as_ref().map(|r| r.waves_done as u64))
            .collect();
        let pauses: Vec<Option<u64>> = attempts
            .iter()
            .map(|a| a.rollout.as_ref().map(|r| r.pauses as u64))
            .collect();
        columns.push(text_column("rollout", &facts(|r| r.id.clone())));
        columns.push(Series::new("waves".into(), waves).into_column());
        columns.push(text_column(
            "wave_times_s",
            &facts(|r| {
                r.wave_times
                    .iter()
                    .map(|t| t.map_or("-".into(), |t| format!("{t:.2}")))
                    .collect::<Vec<_>>()
                    .join(", ")
            }),
        ));
        columns.push(text_column(
            "failures_per_wave",
            &facts(|r| {
                r.failures
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            }),
        ));
        columns.push(Series::new("pauses".into(), pauses).into_column());
    }
    DataFrame::new(attempts.len(), columns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn extra_column(name: &str, values: &[Option<Value>]) -> Column {
        Kind::of(values).column(name, values)
    }

    fn typed(values: &[Option<Value>]) -> DataType {
        extra_column("x", values).dtype().clone()
    }

    /// A log cut into pieces makes the frame the whole log makes, whatever its extra fields
    /// hold in each piece (a piece without them, with integers only, with text).
    #[test]
    fn a_frame_built_from_pieces_equals_the_one_built_whole() {
        use crate::log::read::{parse_bytes, ReadOptions};
        let text = r#"{"ts":1,"event":"candidate_started","version":"v1","detail":"d","port":80}
{"ts":2,"event":"promoted","version":"v1","detail":"d"}
{"ts":3,"event":"replica_ready","version":"v2","detail":"d","wave":1,"ok":true}
not a record
{"ts":4,"event":"rolled_back","version":"v2","detail":"x; y","port":"eighty","wave":2.5}
{"ts":5,"event":"promoted","version":"v3"}
"#;
        let options = ReadOptions {
            extra_fields: true,
            all_details: true,
            ..ReadOptions::default()
        };
        let whole = parse_bytes::<Log>(text.as_bytes(), options.clone()).0;
        let chunks = |logs: Vec<Log>| logs.into_iter().map(Chunk::of).collect::<Vec<_>>();
        let expected = records(&chunks(vec![whole.clone()]), &options, None).unwrap();
        let names: Vec<&str> = expected
            .get_column_names()
            .into_iter()
            .map(|n| n.as_str())
            .collect();
        assert_eq!(
            names,
            ["line", "ts", "event", "version", "detail", "port", "ok", "wave"]
        );
        for cuts in [vec![1], vec![2], vec![1, 3], vec![1, 2, 3, 4]] {
            let mut bounds = vec![0];
            bounds.extend(&cuts);
            bounds.push(whole.len());
            let pieces: Vec<Log> = bounds
                .windows(2)
                .map(|w| whole.reordered(&(w[0]..w[1]).collect::<Vec<_>>()))
                .collect();
            let chunked = records(&chunks(pieces), &options, None).unwrap();
            assert!(chunked.equals_missing(&expected), "{cuts:?}: {chunked}");
        }
        let empty = records(&[], &options, None).unwrap();
        assert_eq!((empty.height(), empty.width()), (0, 5), "{empty}");
    }

    #[test]
    fn extra_fields_get_the_narrowest_type_all_their_values_fit() {
        assert_eq!(typed(&[Some(json!(8081)), None]), DataType::Int64);
        assert_eq!(
            typed(&[Some(json!(1)), Some(json!(1.5))]),
            DataType::Float64
        );
        assert_eq!(typed(&[None, Some(json!(true))]), DataType::Boolean);
        let mixed = extra_column("x", &[Some(json!("a")), Some(json!(2)), None]);
        assert_eq!(mixed.dtype(), &DataType::String);
        let texts: Vec<Option<&str>> = mixed.str().unwrap().iter().collect();
        assert_eq!(texts, vec![Some("a"), Some("2"), None]);
    }
}
