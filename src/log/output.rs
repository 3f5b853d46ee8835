//! Rendering frames for a person (table), a program (JSON lines) or a spreadsheet (CSV).

use polars::prelude::*;

pub use crate::render::table::Layout;
use crate::render::time::{format_duration, format_time};
pub use crate::render::{csv_field, figures_table, fitted_table, Format};

/// How a column is shown in a table: times as RFC 3339, durations in human units. JSON and CSV
/// keep the raw numbers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Display<'a> {
    pub times: &'a [&'a str],
    pub durations: &'a [&'a str],
    /// Where the table goes (a terminal gets the first columns, a pipe every one).
    pub layout: Layout,
    /// The columns a person reads first, shown on a terminal without `--wide`.
    pub first: &'a [&'static str],
}

fn cell_text(value: &AnyValue, name: &str, display: Display) -> String {
    match value {
        AnyValue::Null => String::new(),
        AnyValue::String(s) => s.to_string(),
        AnyValue::StringOwned(s) => s.to_string(),
        v => {
            let number = match v {
                AnyValue::Float64(f) => Some(*f),
                AnyValue::Float32(f) => Some(f64::from(*f)),
                _ => None,
            };
            match number {
                Some(n) if display.times.contains(&name) => format_time(n),
                Some(n) if display.durations.contains(&name) => format_duration(n),
                Some(n) => trim_float(n),
                None => v.to_string().trim_matches('"').to_string(),
            }
        }
    }
}

fn trim_float(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

fn json_value(value: &AnyValue) -> serde_json::Value {
    use serde_json::Value;
    match value {
        AnyValue::Null => Value::Null,
        AnyValue::Boolean(b) => Value::Bool(*b),
        AnyValue::String(s) => Value::String(s.to_string()),
        AnyValue::StringOwned(s) => Value::String(s.to_string()),
        AnyValue::Float64(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        AnyValue::Float32(f) => {
            serde_json::Number::from_f64(f64::from(*f)).map_or(Value::Null, Value::Number)
        }
        AnyValue::Int64(i) => Value::from(*i),
        AnyValue::Int32(i) => Value::from(*i),
        AnyValue::UInt64(i) => Value::from(*i),
        AnyValue::UInt32(i) => Value::from(*i),
        other => Value::String(other.to_string()),
    }
}

/// What a log command answers: text, or a frame's rows to be written as they are rendered
/// (CSV, JSON lines), so that a million rows are never held as one string (120 MB for a
/// history's CSV).
pub enum Answer {
    Text(String),
    Rows(DataFrame, Format),
}

impl Answer {
    /// A frame as a table (text: at most [`TABLE_ROWS`] rows are drawn) or as rows.
    pub fn of(df: DataFrame, format: Format, display: Display) -> Answer {
        match format {
            Format::Table => Answer::Text(render(&df, format, display)),
            rows => Answer::Rows(df, rows),
        }
    }

    /// Writes the answer; stops at the first failed write (a reader that went away).
    pub fn write_to(self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        match self {
            Answer::Text(text) => out.write_all(text.as_bytes()),
            Answer::Rows(df, format) => {
                let mut failed = None;
                write_rows(
                    &df,
                    format,
                    &mut |piece| match out.write_all(piece.as_bytes()) {
                        Ok(()) => true,
                        Err(e) => {
                            failed = Some(e);
                            false
                        }
                    },
                );
                failed.map_or(Ok(()), Err)
            }
        }
    }

    /// The whole answer as one string.
    pub fn into_text(self) -> String {
        match self {
            Answer::Text(text) => text,
            Answer::Rows(df, format) => render(&df, format, Display::default()),
        }
    }
}

/// Renders a whole frame.
pub fn render(df: &DataFrame, format: Format, display: Display) -> String {
    let columns = df.columns();
    let names: Vec<String> = columns.iter().map(|c| c.name().to_string()).collect();
    let value = |c: usize, row: usize| columns[c].get(row).unwrap_or(AnyValue::Null);
    let mut out = String::new();
    match format {
        Format::Table if display.layout != Layout::Pipe => {
            out.push_str(&terminal_table(df, display));
        }
        Format::Table => {
            let mut table = fitted_table(&names);
            let height = df.height();
            let shown = TableRows::of(height);
            for row in shown.head.clone().chain(shown.tail.clone()) {
                if row == shown.tail.start && shown.hidden > 0 {
                    table.add_row(vec!["…".to_string(); columns.len()]);
                }
                table.add_row(
                    (0..columns.len())
                        .map(|c| cell_text(&value(c, row), &names[c], display))
                        .collect::<Vec<_>>(),
                );
            }
            out.push_str(&table.to_string());
            out.push('\n');
            out.push_str(&shown.note(height));
        }
        rows => write_rows(df, rows, &mut |piece| {
            out.push_str(piece);
            true
        }),
    }
    out
}

/// A frame as a table for a person on a terminal (`render::table`): the first columns unless
/// `--wide`, times of one day as clock times, at most [`TABLE_ROWS`] rows drawn.
fn terminal_table(df: &DataFrame, display: Display) -> String {
    use crate::render::table::{Cell, Grid};
    let columns = df.columns();
    let names: Vec<&str> = columns.iter().map(|c| c.name().as_str()).collect();
    let mut grid = Grid::new(&names, display.first);
    let height = df.height();
    let shown = TableRows::of(height);
    for row in shown.head.clone().chain(shown.tail.clone()) {
        if row == shown.tail.start && shown.hidden > 0 {
            grid.push(vec![Cell::from("…"); columns.len()]);
        }
        let cells = columns
            .iter()
            .zip(&names)
            .map(|(column, name)| {
                let value = column.get(row).unwrap_or(AnyValue::Null);
                if display.times.contains(name) {
                    let seconds = match value {
                        AnyValue::Float64(f) => Some(f),
                        AnyValue::Float32(f) => Some(f64::from(f)),
                        _ => None,
                    };
                    return Cell::Time(seconds);
                }
                Cell::Text(cell_text(&value, name, display))
            })
            .collect();
        grid.push(cells);
    }
    let mut out = grid.render(display.layout);
    out.push_str(&shown.note(height));
    out
}

/// A frame as CSV (a header, then rows) or JSON lines, handed to `each` piece by piece in
/// order until it returns false.
fn write_rows(df: &DataFrame, format: Format, each: &mut dyn FnMut(&str) -> bool) {
    let names: Vec<String> = df.columns().iter().map(|c| c.name().to_string()).collect();
    let write = match format {
        Format::Csv => {
            let header = names.iter().map(|n| csv_field(n)).collect::<Vec<_>>();
            if !each(&format!("{}\n", header.join(","))) {
                return;
            }
            write_csv_rows
        }
        _ => write_json_lines,
    };
    rows_in_pieces(df, &names, write, PIECE_ROWS, each);
}

/// Rows a worker renders at a time.
const PIECE_ROWS: usize = 1 << 16;

/// Renders the frame's rows in pieces of `piece_rows` on every core and hands them to `each`
/// in order, until it returns false: the same text, about twice as fast on two cores (a
/// million attempts' CSV took 1.2 s on one, after the parse). Workers stay at most two pieces
/// each ahead of `each`, so only a few pieces are held at a time.
fn rows_in_pieces(
    df: &DataFrame,
    names: &[String],
    write: fn(&mut String, &[Column], &[String]),
    piece_rows: usize,
    each: &mut dyn FnMut(&str) -> bool,
) {
    let height = df.height();
    let pieces = height.div_ceil(piece_rows.max(1));
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8)
        .min(pieces);
    if workers <= 1 {
        let mut text = String::new();
        write(&mut text, df.columns(), names);
        each(&text);
        return;
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let window = super::ordered::Window::new(workers);
    let (done_tx, done_rx) = std::sync::mpsc::channel::<(usize, String)>();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let (done_tx, next, stop, window) = (done_tx.clone(), &next, &stop, &window);
            scope.spawn(move || loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if index >= pieces {
                    break;
                }
                window.enter(index);
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let piece = df.slice((index * piece_rows) as i64, piece_rows);
                let mut text = String::new();
                write(&mut text, piece.columns(), names);
                if done_tx.send((index, text)).is_err() {
                    break;
                }
            });
        }
        drop(done_tx);
        super::ordered::in_order(done_rx, &window, |text| {
            if !stop.load(std::sync::atomic::Ordering::Relaxed) && !each(&text) {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        });
    });
}

/// A table is for reading: past this many rows it shows the first and the last ones (a table
/// of a million attempts took 10 s and 3.6 GB to draw, for a screen that shows fifty).
pub const TABLE_ROWS: usize = 1000;

/// Which rows a table of `height` rows shows.
struct TableRows {
    head: std::ops::Range<usize>,
    tail: std::ops::Range<usize>,
    hidden: usize,
}

impl TableRows {
    /// The line under a table that left rows out (nothing when it drew them all).
    fn note(&self, height: usize) -> String {
        if self.hidden == 0 {
            return String::new();
        }
        format!(
            "{} of {height} rows shown (the first {} and the last {}); --format csv or json prints every row\n",
            height - self.hidden,
            self.head.len(),
            self.tail.len()
        )
    }

    fn of(height: usize) -> TableRows {
        if height <= TABLE_ROWS {
            return TableRows {
                head: 0..height,
                tail: height..height,
                hidden: 0,
            };
        }
        let half = TABLE_ROWS / 2;
        TableRows {
            head: 0..half,
            tail: height - half..height,
            hidden: height - TABLE_ROWS,
        }
    }
}

/// Each column's values in row order, read once front to back: a frame of a million rows is
/// written without a lookup and an allocation per cell.
fn column_iters(columns: &[Column]) -> Vec<Box<dyn Iterator<Item = AnyValue<'_>> + '_>> {
    columns
        .iter()
        .map(|c| Box::new(c.as_materialized_series().iter()) as Box<dyn Iterator<Item = _>>)
        .collect()
}

fn write_json_lines(out: &mut String, columns: &[Column], names: &[String]) {
    use std::fmt::Write;
    let keys: Vec<String> = names
        .iter()
        .map(|n| format!("{}:", serde_json::Value::String(n.clone())))
        .collect();
    let mut iters = column_iters(columns);
    let rows = columns.first().map_or(0, |c| c.len());
    for _ in 0..rows {
        out.push('{');
        for (c, iter) in iters.iter_mut().enumerate() {
            if c > 0 {
                out.push(',');
            }
            out.push_str(&keys[c]);
            match iter.next().unwrap_or(AnyValue::Null) {
                AnyValue::Null => out.push_str("null"),
                AnyValue::Boolean(b) => out.push_str(if b { "true" } else { "false" }),
                AnyValue::String(text) => json_string(out, text),
                AnyValue::StringOwned(text) => json_string(out, &text),
                AnyValue::Float64(f) => match serde_json::Number::from_f64(f) {
                    Some(n) => {
                        let _ = write!(out, "{n}");
                    }
                    None => out.push_str("null"),
                },
                other => out.push_str(&json_value(&other).to_string()),
            }
        }
        out.push_str("}\n");
    }
}

fn json_string(out: &mut String, text: &str) {
    out.push_str(&serde_json::Value::String(text.to_string()).to_string());
}

fn write_csv_rows(out: &mut String, columns: &[Column], _names: &[String]) {
    let mut iters = column_iters(columns);
    let rows = columns.first().map_or(0, |c| c.len());
    for _ in 0..rows {
        for (c, iter) in iters.iter_mut().enumerate() {
            if c > 0 {
                out.push(',');
            }
            match iter.next().unwrap_or(AnyValue::Null) {
                AnyValue::Null => {}
                AnyValue::Float64(f) => out.push_str(&trim_float(f)),
                AnyValue::String(text) => out.push_str(&csv_field(text)),
                v => out.push_str(&csv_field(&cell_text(&v, "", Display::default()))),
            }
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-cell renderer this module had before it read columns front to back: the
    /// reference the fast one must match byte for byte.
    fn reference(df: &DataFrame, format: Format) -> String {
        let columns = df.columns();
        let names: Vec<String> = columns.iter().map(|c| c.name().to_string()).collect();
        let value = |c: usize, row: usize| columns[c].get(row).unwrap_or(AnyValue::Null);
        let mut out = String::new();
        for row in 0..df.height() {
            match format {
                Format::Json => {
                    let fields: Vec<String> = (0..columns.len())
                        .map(|c| {
                            format!(
                                "{}:{}",
                                serde_json::Value::String(names[c].clone()),
                                json_value(&value(c, row))
                            )
                        })
                        .collect();
                    out.push_str(&format!("{{{}}}\n", fields.join(",")));
                }
                _ => {
                    let fields: Vec<String> = (0..columns.len())
                        .map(|c| match value(c, row) {
                            AnyValue::Null => String::new(),
                            AnyValue::Float64(f) => trim_float(f),
                            v => csv_field(&cell_text(&v, "", Display::default())).into_owned(),
                        })
                        .collect();
                    out.push_str(&fields.join(","));
                    out.push('\n');
                }
            }
        }
        out
    }

    #[test]
    fn a_long_table_shows_its_first_and_last_rows_and_says_so() {
        let rows = 2500i64;
        let df = DataFrame::new(
            rows as usize,
            vec![Series::new("n".into(), (0..rows).collect::<Vec<_>>()).into_column()],
        )
        .unwrap();
        let table = render(&df, Format::Table, Display::default());
        let numbers: Vec<i64> = table
            .lines()
            .filter_map(|l| l.trim_matches(|c: char| !c.is_ascii_digit()).parse().ok())
            .collect();
        let expected: Vec<i64> = (0..500).chain(2000..2500).collect();
        assert_eq!(numbers, expected);
        assert!(
            table.lines().any(|l| l.trim_matches(['│', ' ']) == "…"),
            "{table}"
        );
        assert!(
            table.ends_with("1000 of 2500 rows shown (the first 500 and the last 500); --format csv or json prints every row\n"),
            "{}",
            &table[table.len() - 200..]
        );
        // A short one is whole, with no note.
        let short = df.slice(0, TABLE_ROWS);
        let table = render(&short, Format::Table, Display::default());
        assert!(!table.contains("rows shown"));
        assert_eq!(table.lines().filter(|l| l.contains("│ 999 │")).count(), 1);
    }

    #[test]
    fn rendering_by_columns_matches_the_per_cell_reference() {
        let df = DataFrame::new(
            5,
            vec![
                Series::new(
                    "text".into(),
                    [
                        Some("plain"),
                        Some("a, \"b\"\nc"),
                        None,
                        Some("é 中 😀"),
                        Some(""),
                    ],
                )
                .into_column(),
                Series::new(
                    "f".into(),
                    [Some(1.0), Some(0.1), None, Some(f64::NAN), Some(1.5e300)],
                )
                .into_column(),
                Series::new(
                    "i".into(),
                    [Some(1i64), None, Some(-7), Some(0), Some(i64::MAX)],
                )
                .into_column(),
                Series::new(
                    "u".into(),
                    [Some(1u64), Some(2), None, Some(4), Some(u64::MAX)],
                )
                .into_column(),
                Series::new(
                    "b".into(),
                    [Some(true), None, Some(false), Some(true), None],
                )
                .into_column(),
            ],
        )
        .unwrap();
        for format in [Format::Json, Format::Csv] {
            let rendered = render(&df, format, Display::default());
            let body = match format {
                Format::Csv => rendered.split_once('\n').unwrap().1.to_string(),
                _ => rendered,
            };
            assert_eq!(body, reference(&df, format), "{format:?}");
        }
    }

    #[test]
    fn rows_rendered_in_pieces_read_as_rows_rendered_at_once() {
        let texts: Vec<Option<String>> = (0..100)
            .map(|i| (i % 7 != 3).then(|| format!("row {i}, \"quoted\"")))
            .collect();
        let numbers: Vec<Option<f64>> = (0..100)
            .map(|i| (i % 5 != 0).then_some(i as f64 / 4.0))
            .collect();
        let df = DataFrame::new(
            100,
            vec![
                Series::new("text".into(), texts).into_column(),
                Series::new("n".into(), numbers).into_column(),
            ],
        )
        .unwrap();
        let names = vec!["text".to_string(), "n".to_string()];
        for write in [write_csv_rows, write_json_lines] {
            let mut whole = String::new();
            write(&mut whole, df.columns(), &names);
            for piece_rows in [1, 7, 64, 100, 1000] {
                let mut pieces = String::new();
                rows_in_pieces(&df, &names, write, piece_rows, &mut |piece| {
                    pieces.push_str(piece);
                    true
                });
                assert_eq!(pieces, whole, "pieces of {piece_rows} rows");
            }
            // A reader that goes away after three pieces is handed no more.
            let mut taken = 0;
            rows_in_pieces(&df, &names, write, 7, &mut |_| {
                taken += 1;
                taken < 3
            });
            assert_eq!(taken, 3);
        }
    }

    #[test]
    fn csv_quotes_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a, b"), "\"a, b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
