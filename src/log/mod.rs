//! Deploy-log analysis: the lesson's summary, attempt history, "what was live at T", honest
//! rates, and SQL — over JSON-lines logs whose bad lines cost only themselves.

mod access;
pub use access::summary as access_summary;
mod fast;
pub mod follow;
mod frame;
pub mod history;
mod ordered;
pub mod output;
pub mod read;
pub mod schedules;
mod stats;
pub mod summary;
pub use crate::render::time;
mod truncation;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use polars::prelude::*;

pub use output::Answer;
use output::{csv_field, figures_table, Display, Format, Layout};
use read::{read_with, Log, ReadOptions, Sink};
use time::{format_duration, format_time};

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{0}")]
    Read(#[from] read::ReadError),
    #[error("{}: {count} bad line{} (--strict refuses a log with any)", path.display(), if *count == 1 { "" } else { "s" })]
    Strict { path: PathBuf, count: usize },
    #[error("{0}")]
    Usage(String),
    #[error("query failed: {0}")]
    Query(String),
    /// A Nickel query was refused; the text is Nickel's diagnostic.
    #[error("{0}")]
    Nickel(String),
}

impl From<LogError> for crate::error::Error {
    fn from(error: LogError) -> crate::error::Error {
        use crate::error::Error;
        match error {
            LogError::Usage(message) => Error::Refused(message),
            // Printed as Nickel wrote it, and a line after it.
            LogError::Nickel(diagnostic) => Error::Diagnostic(format!("{diagnostic}\n")),
            other => Error::Invalid(other.to_string()),
        }
    }
}

impl From<PolarsError> for LogError {
    fn from(e: PolarsError) -> Self {
        LogError::Query(e.to_string())
    }
}

/// Which records a question is asked of.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    pub since: Option<f64>,
    pub until: Option<f64>,
    pub version: Option<String>,
}

impl Selection {
    fn is_empty(&self) -> bool {
        self.since.is_none() && self.until.is_none() && self.version.is_none()
    }

    /// Whether a record with this time and version is one the question is asked of (one
    /// without a time only when no time bound is set).
    pub fn admits(&self, ts: Option<f64>, version: Option<&str>) -> bool {
        let in_time = match ts {
            Some(t) => self.since.is_none_or(|s| t >= s) && self.until.is_none_or(|u| t <= u),
            None => self.since.is_none() && self.until.is_none(),
        };
        in_time && self.version.as_deref().is_none_or(|v| version == Some(v))
    }
}

/// How logs are read for one command.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    pub strict: bool,
    pub selection: Selection,
    /// Extra fields and every detail (SQL needs them; other questions do not).
    pub everything: bool,
    /// A signed release's sequence and manifest digest (history shows them).
    pub release_fields: bool,
    /// A rollout's id, slots and waves (history and stats show them).
    pub rollout_fields: bool,
    /// With `everything`: only the columns a query names (None: all of them).
    pub columns: Option<Arc<Columns>>,
    /// The files' bad lines were reported by an earlier reading of them: not again.
    pub reported: bool,
}

/// The columns a SQL query may read, beyond those every record has.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Columns {
    pub extras: BTreeSet<String>,
    /// Every record's detail (otherwise only rollbacks' and escalations').
    pub detail: bool,
    /// The `attempts` table.
    pub attempts: bool,
}

impl Columns {
    /// Whether the query may read the column or field `name`.
    pub fn names(&self, name: &str) -> bool {
        self.extras.contains(name)
    }

    /// What `sql` may read: every word in it is taken for a column it might name (words in
    /// strings too, which only costs a column), and a `*` other than `count(*)` means every
    /// column. Conservative by design: a column read for nothing is only time.
    pub fn named_by(sql: &str) -> Option<Columns> {
        let bytes = sql.as_bytes();
        let star_select = bytes.iter().enumerate().any(|(i, b)| {
            *b == b'*'
                && bytes[..i]
                    .iter()
                    .rev()
                    .find(|c| !c.is_ascii_whitespace())
                    .is_none_or(|c| *c != b'(')
        });
        // As written and lowercased: a field named in either case is read.
        let words: BTreeSet<String> = sql
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty())
            .flat_map(|w| [w.to_string(), w.to_lowercase()])
            .collect();
        let columns = Columns {
            detail: words.contains("detail"),
            attempts: words.contains("attempts"),
            extras: words,
        };
        (!star_select).then_some(columns)
    }
}

impl Reading {
    fn options(&self) -> ReadOptions {
        let (extra_fields, all_details, only_extras) = match (&self.columns, self.everything) {
            (_, false) => (false, false, None),
            (None, true) => (true, true, None),
            (Some(c), true) => (
                true,
                c.detail,
                Some(Arc::new(read::ExtraNames::new(c.extras.clone()))),
            ),
        };
        ReadOptions {
            extra_fields,
            only_extras,
            all_details,
            release_fields: self.release_fields,
            rollout_fields: self.rollout_fields,
            skip_ts: self.everything
                && self.selection.is_empty()
                && self
                    .columns
                    .as_ref()
                    .is_some_and(|c| !c.attempts && !c.names("ts")),
            skip_versions: self.everything
                && self
                    .columns
                    .as_ref()
                    .is_some_and(|c| !c.attempts && !c.names("version")),
            skip_details: self.everything
                && self
                    .columns
                    .as_ref()
                    .is_some_and(|c| !c.attempts && !c.detail),
            selection: (!self.selection.is_empty()).then(|| Arc::new(self.selection.clone())),
            at: None,
            at_older_files: false,
        }
    }
}

const MAX_WARNINGS_PER_FILE: usize = 20;

/// Reads one log into a sink, printing its problems to stderr as `warning: FILE:LINE: ...`
/// (or failing under `--strict`).
fn load_into<S: Sink>(path: &Path, reading: &Reading) -> Result<S, LogError> {
    load_with::<S>(path, reading, reading.options())
}

fn load_with<S: Sink>(path: &Path, reading: &Reading, options: ReadOptions) -> Result<S, LogError> {
    let (sink, problems) = read_with::<S>(path, options)?;
    let label = if reading.strict { "error" } else { "warning" };
    let shown = if reading.reported {
        0
    } else {
        MAX_WARNINGS_PER_FILE
    };
    for problem in problems.iter().take(shown) {
        eprintln!(
            "{label}: {}:{}: {}",
            path.display(),
            problem.line,
            problem.what
        );
    }
    if problems.len() > MAX_WARNINGS_PER_FILE && !reading.reported {
        eprintln!(
            "{label}: {}: {} more problem lines not shown",
            path.display(),
            problems.len() - MAX_WARNINGS_PER_FILE
        );
    }
    if reading.strict && !problems.is_empty() {
        return Err(LogError::Strict {
            path: path.to_path_buf(),
            count: problems.len(),
        });
    }
    Ok(sink)
}

fn load_one(path: &Path, reading: &Reading) -> Result<Log, LogError> {
    load_into(path, reading)
}

/// Several logs as one history ordered by `ts` (stable: equal times keep file order; records
/// without `ts` cannot be placed and go first, in file order).
fn load_merged(paths: &[PathBuf], reading: &Reading) -> Result<Log, LogError> {
    let mut merged: Option<Log> = None;
    // Merged by time: every `ts` is needed, whatever a query names.
    let options = ReadOptions {
        skip_ts: false,
        ..reading.options()
    };
    for path in paths {
        let log = load_with::<Log>(path, reading, options.clone())?;
        match merged.as_mut() {
            None => merged = Some(log),
            Some(all) => all.append(log),
        }
    }
    let mut merged = merged.unwrap_or_default();
    if paths.len() > 1 {
        let mut order: Vec<usize> = (0..merged.len()).collect();
        order.sort_by(|a, b| {
            let key = |i: usize| merged.ts[i].unwrap_or(f64::NEG_INFINITY);
            key(*a).total_cmp(&key(*b))
        });
        merged = merged.reordered(&order);
    }
    Ok(merged)
}

/// The records as the array a Nickel query receives: `{ ts, event, version, detail }` each,
/// missing fields as null.
fn records_json(log: &Log) -> serde_json::Value {
    (0..log.len())
        .map(|i| {
            serde_json::json!({
                "ts": log.ts[i], "event": log.event[i], "version": log.version[i], "detail": log.detail[i],
            })
        })
        .collect()
}

/// Runs a summary query written in Nickel: a function from the records to a record of the
/// summary's shape, printed exactly as the built-in summary is.
fn summary_by_query(
    query: &Path,
    log: &Log,
    eval: &crate::policy::EvalOptions,
) -> Result<summary::Summary, LogError> {
    let value =
        crate::policy::evaluate_applied(query, &records_json(log), eval).map_err(|e| match e {
            crate::policy::PolicyError::Nickel(d) => {
                LogError::Nickel(d.rendered.trim_end().to_string())
            }
            other => LogError::Nickel(format!("error: {other}")),
        })?;
    serde_json::from_value(value.clone()).map_err(|e| {
        LogError::Nickel(format!(
            "error: {}: the query returned {value}, not a summary ({e}); it must return {{ releases, promoted, rolled_back, reasons = [{{ version, reason }}], live }}",
            query.display()
        ))
    })
}

/// `log summary`: one line per log, or one for all with `merge`; by the built-in query or a
/// Nickel one.
pub fn summary(
    paths: &[PathBuf],
    merge: bool,
    format: Format,
    reading: &Reading,
    query: Option<(&Path, &crate::policy::EvalOptions)>,
) -> Result<String, LogError> {
    // The built-in summary of a whole file streams; merging, filters and queries need the
    // records. Both give the same answer (a property test holds them to it).
    let streams = query.is_none() && reading.selection.is_empty();
    let of_log = |log: &Log| -> Result<summary::Summary, LogError> {
        match query {
            Some((query, eval)) => summary_by_query(query, log, eval),
            None => Ok(summary::summarize(log)),
        }
    };
    let one = |path: &Path| -> Result<summary::Summary, LogError> {
        if streams {
            return Ok(load_into::<summary::Streaming>(path, reading)?.0);
        }
        of_log(&load_one(path, reading)?)
    };
    let groups: Vec<(String, summary::Summary)> = if merge && paths.len() > 1 {
        vec![("merged".into(), of_log(&load_merged(paths, reading)?)?)]
    } else {
        paths
            .iter()
            .map(|p| Ok((p.display().to_string(), one(p)?)))
            .collect::<Result<_, LogError>>()?
    };
    let mut out = String::new();
    for (name, s) in groups {
        match format {
            Format::Json => {
                out.push_str(&s.to_json_line());
                out.push('\n');
            }
            Format::Table | Format::Csv => {
                let reasons: Vec<String> = s
                    .reasons
                    .iter()
                    .map(|r| {
                        format!(
                            "{}: {}",
                            r.version.as_deref().unwrap_or("?"),
                            r.reason.as_deref().unwrap_or("(no detail)")
                        )
                    })
                    .collect();
                let rows = vec![
                    ("log".to_string(), name),
                    ("releases".into(), s.releases.to_string()),
                    ("promoted".into(), s.promoted.to_string()),
                    ("rolled back".into(), s.rolled_back.to_string()),
                    ("reasons".into(), reasons.join("\n")),
                    (
                        "live".into(),
                        s.live.clone().unwrap_or_else(|| "(none)".into()),
                    ),
                ];
                if format == Format::Table {
                    out.push_str(&figures_table(&rows));
                } else {
                    if out.is_empty() {
                        out.push_str("log,releases,promoted,rolled_back,live\n");
                    }
                    out.push_str(&format!(
                        "{},{},{},{},{}\n",
                        csv_field(&rows[0].1),
                        s.releases,
                        s.promoted,
                        s.rolled_back,
                        csv_field(s.live.as_deref().unwrap_or("")),
                    ));
                }
            }
        }
    }
    Ok(out)
}

const TIME_COLUMNS: &[&str] = &["started", "finished", "rolled_back_at", "ts"];
const DURATION_COLUMNS: &[&str] = &["time_to_outcome_s", "live_for_s", "exposure_s"];

/// What `log history` shows a person on a terminal without `--wide`.
const HISTORY_FIRST: &[&str] = &[
    "version",
    "finished",
    "outcome",
    "time_to_outcome_s",
    "reason",
];

fn display(layout: Layout) -> Display<'static> {
    Display {
        times: TIME_COLUMNS,
        durations: DURATION_COLUMNS,
        layout,
        first: HISTORY_FIRST,
    }
}

/// Attempts, the count of records they came from, and the first and last time among these.
type Paired = (Vec<history::Attempt>, u64, Option<(f64, f64)>);

/// The logs' attempts, with how many records they hold and the first and last time among
/// them. One file is paired as it is read (its records are never all held); several are
/// merged by time first.
fn paired(paths: &[PathBuf], reading: &Reading) -> Result<Paired, LogError> {
    if let [path] = paths {
        let paired: history::Paired = load_into(path, reading)?;
        return Ok((paired.pairing.finish(), paired.records, paired.span));
    }
    let log = load_merged(paths, reading)?;
    let times = log.ts.iter().flatten().copied();
    let span = times.clone().reduce(f64::min).zip(times.reduce(f64::max));
    Ok((history::attempts(&log), log.len() as u64, span))
}

/// `log history`: one row per attempt.
pub fn history(
    paths: &[PathBuf],
    format: Format,
    layout: Layout,
    reading: &Reading,
) -> Result<Answer, LogError> {
    let reading = Reading {
        release_fields: true,
        rollout_fields: true,
        ..reading.clone()
    };
    let (attempts, _, _) = paired(paths, &reading)?;
    let df = frame::attempts(&attempts)?;
    drop(attempts);
    Ok(Answer::of(df, format, display(layout)))
}

/// `log history --at T`: which release was live then.
pub fn live_at(
    paths: &[PathBuf],
    at: f64,
    format: Format,
    reading: &Reading,
) -> Result<String, LogError> {
    // Only the promotions and the records that change who serves are kept while a file is
    // read; several files are merged by time.
    let mut promotions: Vec<(f64, Option<String>)> = Vec::new();
    let mut serving: Vec<history::Serving> = Vec::new();
    let options = ReadOptions {
        at: Some(at),
        at_older_files: paths.len() > 1,
        ..reading.options()
    };
    for path in paths {
        let mut file: history::Promotions = load_with(path, reading, options.clone())?;
        promotions.append(&mut file.list);
        serving.extend(file.serving());
    }
    if paths.len() > 1 {
        promotions.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    serving.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    let found = history::live_among(promotions.iter().map(|(ts, v)| (*ts, v.as_deref())), at);
    let version = found.as_ref().and_then(|f| f.version.clone());
    let since = found.as_ref().map(|f| f.since);
    let until = found.as_ref().and_then(|f| f.until);
    let also: Vec<history::AlsoServing> = history::serving_at(&serving, at)
        .into_iter()
        .filter(|a| Some(&a.version) != version.as_ref())
        .collect();
    let also_words = also
        .iter()
        .map(|a| match a.replicas {
            Some(n) => format!(
                "{} on {n} replica{} (a rollout in progress) since {}",
                a.version,
                if n == 1 { "" } else { "s" },
                format_time(a.since)
            ),
            None => format!("{} in its watch since {}", a.version, format_time(a.since)),
        })
        .collect::<Vec<_>>()
        .join("; ");
    Ok(match format {
        Format::Json => format!(
            "{}\n",
            serde_json::json!({"at": at, "live": version, "since": since, "until": until,
                "also_serving": also})
        ),
        Format::Csv => format!(
            "at,live,since,until,also_serving\n{at},{},{},{},{}\n",
            csv_field(version.as_deref().unwrap_or_default()),
            since.map(|s| s.to_string()).unwrap_or_default(),
            until.map(|u| u.to_string()).unwrap_or_default(),
            csv_field(&also_words)
        ),
        Format::Table => figures_table(
            &[
                ("at".into(), format_time(at)),
                (
                    "live".into(),
                    match (&found, version) {
                        (None, _) => "(nothing promoted yet)".into(),
                        (Some(_), v) => v.unwrap_or_else(|| "(no version)".into()),
                    },
                ),
                ("since".into(), since.map(format_time).unwrap_or_default()),
                (
                    "until".into(),
                    match (found.is_some(), until) {
                        (true, None) => "(still live at the end of the log)".into(),
                        (_, u) => u.map(format_time).unwrap_or_default(),
                    },
                ),
            ]
            .into_iter()
            .chain((!also.is_empty()).then(|| ("also serving".into(), also_words)))
            .collect::<Vec<_>>(),
        ),
    })
}

/// `log stats`.
// Long on purpose: one polars query per figure of `log stats`, in the order the report prints
// them; each is a few lines and none is used elsewhere.
/// `log schedules`: a row per schedule the logs name (merged by time), from its lines.
pub fn schedules(paths: &[PathBuf], format: Format, reading: &Reading) -> Result<String, LogError> {
    let reading = Reading {
        everything: true,
        columns: Some(Arc::new(Columns {
            extras: schedules::FIELDS.iter().map(|f| f.to_string()).collect(),
            detail: true,
            attempts: false,
        })),
        ..reading.clone()
    };
    let found = schedules::records(&load_merged(paths, &reading)?);
    let time = |t: Option<f64>| t.map_or("-".into(), crate::render::time::format_time);
    let pct = |r: Option<f64>| r.map_or("-".into(), |r| format!("{:.1} %", r * 100.0));
    Ok(match format {
        Format::Json => found
            .iter()
            .map(|r| serde_json::to_string(r).expect("a record serializes") + "\n")
            .collect(),
        Format::Csv => {
            let mut out = String::from("schedule,runs,succeeded,failed,success_rate,skipped,missed,last_success,last_failure,longest_ms,longest_version\n");
            for r in &found {
                out.push_str(&format!(
                    "{},{},{},{},{},{},{},{},{},{},{}\n",
                    r.schedule,
                    r.runs,
                    r.succeeded,
                    r.failed,
                    r.success_rate.map_or(String::new(), |x| format!("{x:.4}")),
                    r.skipped,
                    r.missed,
                    r.last_success.map_or(String::new(), |t| format!("{t:.3}")),
                    r.last_failure.map_or(String::new(), |t| format!("{t:.3}")),
                    r.longest_ms.map_or(String::new(), |x| x.to_string()),
                    r.longest_version.as_deref().unwrap_or(""),
                ));
            }
            out
        }
        Format::Table => {
            if found.is_empty() {
                return Ok("no schedule runs in the log\n".into());
            }
            let mut grid = crate::render::table::Grid::new(
                [
                    "schedule",
                    "runs",
                    "ok",
                    "failed",
                    "success",
                    "skipped",
                    "missed",
                    "last success",
                    "last failure",
                    "longest",
                ],
                &["schedule", "runs", "success", "last success", "longest"],
            );
            for r in &found {
                grid.push(vec![
                    r.schedule.as_str().into(),
                    r.runs.to_string().into(),
                    r.succeeded.to_string().into(),
                    r.failed.to_string().into(),
                    pct(r.success_rate).into(),
                    r.skipped.to_string().into(),
                    r.missed.to_string().into(),
                    time(r.last_success).into(),
                    time(r.last_failure).into(),
                    match (&r.longest_ms, &r.longest_version) {
                        (Some(ms), Some(v)) => format!("{ms} ms ({v})"),
                        (Some(ms), None) => format!("{ms} ms"),
                        _ => "-".into(),
                    }
                    .into(),
                ]);
            }
            grid.render(crate::render::table::Layout::of_stdout(true))
        }
    })
}

pub fn stats(paths: &[PathBuf], format: Format, reading: &Reading) -> Result<String, LogError> {
    let reading = Reading {
        rollout_fields: true,
        ..reading.clone()
    };
    let (attempts, records, span) = paired(paths, &reading)?;
    let s = stats::stats(records, span, &attempts)?;
    let pct = |r: Option<f64>| {
        r.map(|r| format!("{:.1} %", r * 100.0))
            .unwrap_or_else(|| "-".into())
    };
    let num = |r: Option<f64>| r.map(|r| format!("{r:.2}")).unwrap_or_else(|| "-".into());
    let dur = |r: Option<f64>| r.map(format_duration).unwrap_or_else(|| "-".into());
    let spread = |sp: &stats::Spread| {
        format!(
            "{} / {} / {} (n={})",
            dur(sp.median_s),
            dur(sp.p90_s),
            dur(sp.max_s),
            sp.count
        )
    };
    let rows: Vec<(String, String)> = vec![
        ("records".into(), s.records.to_string()),
        ("attempts".into(), s.attempts.to_string()),
        ("promoted".into(), s.promoted.to_string()),
        (
            "rolled back before users saw them".into(),
            s.rolled_back_before_users.to_string(),
        ),
        (
            "rolled back after users had them".into(),
            s.rolled_back_after_users_had_them.len().to_string(),
        ),
        (
            "escalated, awaiting a person".into(),
            s.escalated.to_string(),
        ),
        ("unfinished".into(), s.unfinished.to_string()),
        (
            "refused before anything started".into(),
            s.refused.to_string(),
        ),
        (
            "candidate rejection rate".into(),
            pct(s.candidate_rejection_rate),
        ),
        ("log span".into(), dur(s.span_s)),
        ("promotions per day".into(), num(s.promotions_per_day)),
        ("promotions per week".into(), num(s.promotions_per_week)),
        (
            "days with a promotion".into(),
            s.days_with_a_promotion.to_string(),
        ),
        (
            "time to promotion: median / p90 / max".into(),
            spread(&s.time_to_promotion),
        ),
        (
            "time to rollback: median / p90 / max".into(),
            spread(&s.time_to_rollback),
        ),
    ];
    let mut rows = rows;
    if let Some(r) = &s.rollouts {
        rows.extend([
            (
                "rollouts: completed / aborted / all".into(),
                format!("{} / {} / {}", r.completed, r.aborted, r.rollouts),
            ),
            (
                "rollout waves completed".into(),
                r.waves_completed.to_string(),
            ),
            (
                "time per wave: median / p90 / max".into(),
                spread(&r.wave_time),
            ),
            ("replica failures".into(), r.replica_failures.to_string()),
            ("rollout pauses".into(), r.pauses.to_string()),
        ]);
    }
    Ok(match format {
        Format::Json => format!("{}\n", serde_json::to_string(&s).expect("stats serialize")),
        Format::Csv => {
            let mut out = String::from("figure,value\n");
            for (name, value) in &rows {
                out.push_str(&format!("{},{}\n", csv_field(name), csv_field(value)));
            }
            out
        }
        Format::Table => {
            let mut out = figures_table(&rows);
            let counts = |title: &str, rows: &[stats::Count]| {
                let mut t = output::fitted_table([title, "rollbacks"]);
                for c in rows {
                    t.add_row([
                        c.key.clone().unwrap_or_else(|| "(none)".into()),
                        c.count.to_string(),
                    ]);
                }
                format!("{t}\n")
            };
            if !s.rollbacks_by_reason.is_empty() {
                out.push_str("\nRollbacks by reason\n");
                out.push_str(&counts("reason", &s.rollbacks_by_reason));
                out.push_str("\nRollbacks by version\n");
                out.push_str(&counts("version", &s.rollbacks_by_version));
            }
            if !s.rolled_back_after_users_had_them.is_empty() {
                out.push_str("\nRolled back after users had them (production failures)\n");
                let mut t = output::fitted_table([
                    "version",
                    "how",
                    "users had it from",
                    "rolled back",
                    "users exposed for",
                    "requests",
                    "failed",
                    "ended by",
                ]);
                let number = |n: Option<u64>| n.map_or("-".to_string(), |n| n.to_string());
                for e in &s.rolled_back_after_users_had_them {
                    t.add_row([
                        e.version.clone().unwrap_or_default(),
                        e.how.to_string(),
                        e.live_from.map(format_time).unwrap_or_default(),
                        e.rolled_back_at.map(format_time).unwrap_or_default(),
                        dur(e.exposure_s),
                        number(e.requests),
                        number(e.failed),
                        e.ended_by.clone().unwrap_or_else(|| "-".into()),
                    ]);
                }
                out.push_str(&format!("{t}\n"));
            }
            out
        }
    })
}

/// `log query --sql`: polars SQL over tables `log` (records, with any extra fields) and
/// `attempts` (as `log history` shows them).
pub fn query(
    paths: &[PathBuf],
    sql: &str,
    format: Format,
    reading: &Reading,
    access_logs: &[PathBuf],
) -> Result<Answer, LogError> {
    // Only what the query names is read: a GROUP BY over one column builds one column.
    let columns = Columns::named_by(sql);
    let pruned = columns.is_some();
    match run_query(paths, sql, format, reading, columns, access_logs) {
        // A query that fails on the columns it named is run once more on all of them, so its
        // error names every column there is (not only the ones read) — or it succeeds.
        Err(LogError::Query(_)) if pruned => {
            let again = Reading {
                reported: true,
                ..reading.clone()
            };
            run_query(paths, sql, format, &again, None, access_logs)
        }
        answer => answer,
    }
}

fn run_query(
    paths: &[PathBuf],
    sql: &str,
    format: Format,
    reading: &Reading,
    columns: Option<Columns>,
    access_logs: &[PathBuf],
) -> Result<Answer, LogError> {
    let attempts = columns.as_ref().is_none_or(|c| c.attempts);
    let reading = Reading {
        everything: true,
        columns: columns.map(Arc::new),
        ..reading.clone()
    };
    let mut ctx = polars::sql::SQLContext::new();
    // One file: its blocks as parsed, each a chunk of the frame. Several: merged by time.
    let chunks = match paths {
        // Without `attempts`, each block's columns are built by the thread that parsed it.
        [path] if !attempts => load_into::<frame::Chunks>(path, &reading)?.chunks,
        _ => {
            let logs = match paths {
                [path] => load_into::<read::Blocks>(path, &reading)?.logs,
                _ => vec![load_merged(paths, &reading)?],
            };
            if attempts {
                let mut pairing = history::Pairing::default();
                for log in &logs {
                    pairing.feed(log);
                }
                ctx.register("attempts", frame::attempts(&pairing.finish())?.lazy());
            }
            logs.into_iter().map(frame::Chunk::of).collect()
        }
    };
    let frame = frame::records(&chunks, &reading.options(), reading.columns.as_deref())?;
    ctx.register("log", frame.lazy());
    if !access_logs.is_empty() {
        ctx.register("access", access::frame(access_logs)?.lazy());
    }
    let df = ctx.execute(sql)?.collect()?;
    drop(ctx);
    Ok(Answer::of(df, format, Display::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_reads_the_columns_it_names() {
        let c =
            Columns::named_by("SELECT version, count(*) AS n FROM log GROUP BY version").unwrap();
        assert!(!c.detail && !c.attempts);
        assert!(c.extras.contains("version") && !c.extras.contains("port"));
        let c = Columns::named_by("select Port from LOG where DETAIL like '%x%'").unwrap();
        assert!(c.detail && c.extras.contains("Port") && c.extras.contains("port"));
        assert!(
            Columns::named_by("SELECT count( * ) FROM attempts")
                .unwrap()
                .attempts
        );
        assert_eq!(Columns::named_by("SELECT * FROM log"), None);
        assert_eq!(Columns::named_by("SELECT l.* FROM log l"), None);
        // A product reads everything: conservative, never wrong.
        assert_eq!(Columns::named_by("SELECT ts * 1000 FROM log"), None);
    }
}
