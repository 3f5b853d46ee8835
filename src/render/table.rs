//! Tables for a person on a terminal, and for a script in a pipe.
//!
//! kubectl's way: on a terminal a table shows the few columns a person reads first (`--wide`
//! shows the rest), leaves out columns that are empty in every row, writes times as
//! `HH:MM:SS` when they all fall on one day (the day goes in the header), and fits the
//! terminal's width without ever breaking a word inside (a column is at least as wide as its
//! longest word; `--wide` may then be wider than a narrow terminal). Column names read as
//! words there (`time to outcome`). Printed to a file or a pipe the table keeps every column, full RFC 3339
//! times and one line per row, so a script reads what it always read.

use std::io::IsTerminal;

use chrono::{DateTime, Utc};
use comfy_table::{ColumnConstraint, ContentArrangement, Table, Width};

use super::time::format_time;

/// Where a table is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// A file or a pipe: every column, every cell whole, rows never wrapped.
    #[default]
    Pipe,
    /// A terminal this many columns wide; `wide` shows every column, not only the first few.
    Terminal { width: u16, wide: bool },
}

impl Layout {
    /// Standard output's layout: a terminal's width when it is one (`--wide` asked or not).
    pub fn of_stdout(wide: bool) -> Layout {
        let out = std::io::stdout();
        if !out.is_terminal() {
            return Layout::Pipe;
        }
        let width = terminal_width().unwrap_or(80);
        Layout::Terminal { width, wide }
    }
}

/// The terminal's width from standard output (TIOCGWINSZ), if it says one.
fn terminal_width() -> Option<u16> {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into the struct it is given, and nothing else.
    let answer = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    (answer == 0 && size.ws_col > 0).then_some(size.ws_col)
}

/// Lines of prose wrapped between words to fit a terminal (continuations indented by two);
/// in a pipe they stay as they are.
pub fn wrap(text: &str, layout: Layout) -> String {
    let Layout::Terminal { width, .. } = layout else {
        return text.to_string();
    };
    let width = usize::from(width.max(20));
    let mut out = String::new();
    for line in text.lines() {
        let mut used = 0;
        for word in line.split(' ') {
            let len = word.chars().count();
            if used > 0 && used + 1 + len > width {
                out.push_str("\n  ");
                used = 2;
            } else if used > 0 {
                out.push(' ');
                used += 1;
            }
            out.push_str(word);
            used += len;
        }
        out.push('\n');
    }
    out
}

/// One cell: text as it is, or a time (Unix seconds) the layout decides how to write.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Text(String),
    Time(Option<f64>),
}

impl From<String> for Cell {
    fn from(text: String) -> Cell {
        Cell::Text(text)
    }
}

impl From<&str> for Cell {
    fn from(text: &str) -> Cell {
        Cell::Text(text.to_string())
    }
}

/// A table before it is laid out: its header, its rows, and the columns a person reads first.
#[derive(Debug, Clone, Default)]
pub struct Grid {
    pub header: Vec<String>,
    pub rows: Vec<Vec<Cell>>,
    /// Shown on a terminal without `--wide` (every column when empty), in header order.
    pub first: Vec<&'static str>,
}

impl Grid {
    pub fn new<T: ToString>(header: impl IntoIterator<Item = T>, first: &[&'static str]) -> Grid {
        Grid {
            header: header.into_iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            first: first.to_vec(),
        }
    }

    pub fn push(&mut self, row: Vec<Cell>) {
        self.rows.push(row);
    }

    /// The table as text, laid out for where it goes.
    pub fn render(&self, layout: Layout) -> String {
        let (width, wide) = match layout {
            Layout::Pipe => return self.render_whole(),
            Layout::Terminal { width, wide } => (width, wide),
        };
        let shown: Vec<usize> = (0..self.header.len())
            .filter(|&c| wide || self.first.is_empty() || self.first.contains(&&*self.header[c]))
            .filter(|&c| self.rows.is_empty() || !self.empty_column(c))
            .collect();
        let day = self.one_day();
        let header: Vec<String> = shown
            .iter()
            .map(|&c| match (&day, self.is_time_column(c)) {
                (Some(day), true) => format!("{} ({day} UTC)", person_name(&self.header[c])),
                _ => person_name(&self.header[c]),
            })
            .collect();
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|row| {
                shown
                    .iter()
                    .map(|&c| match row.get(c) {
                        Some(Cell::Time(t)) => time_text(*t, day.is_some()),
                        Some(Cell::Text(text)) => text.clone(),
                        None => String::new(),
                    })
                    .collect()
            })
            .collect();
        let mut table = Table::new();
        table
            .load_preset(comfy_table::presets::UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_width(width)
            .set_header(header.clone());
        for row in &rows {
            table.add_row(row.clone());
        }
        // Each column at least as wide as its longest word: narrowed to fit, it wraps between
        // words, never inside one.
        let constraints: Vec<ColumnConstraint> = (0..header.len())
            .map(|c| {
                let longest = std::iter::once(&header[c])
                    .chain(rows.iter().map(|r| &r[c]))
                    .flat_map(|text| text.split_whitespace())
                    .map(|word| word.chars().count())
                    .max()
                    .unwrap_or(1);
                // comfy-table's widths count the cell's padding (one space each side).
                ColumnConstraint::LowerBoundary(Width::Fixed(longest as u16 + 2))
            })
            .collect();
        table.set_constraints(constraints);
        format!("{table}\n")
    }

    /// Every column, full times, one line per row.
    fn render_whole(&self) -> String {
        let mut table = super::fitted_table(&self.header);
        for row in &self.rows {
            table.add_row(
                row.iter()
                    .map(|cell| match cell {
                        Cell::Time(t) => time_text(*t, false),
                        Cell::Text(text) => text.clone(),
                    })
                    .collect::<Vec<_>>(),
            );
        }
        format!("{table}\n")
    }

    /// Nothing in any row (a filler `-` is nothing too).
    fn empty_column(&self, c: usize) -> bool {
        self.rows.iter().all(|row| match row.get(c) {
            None | Some(Cell::Time(None)) => true,
            Some(Cell::Text(text)) => text.trim().is_empty() || text.trim() == "-",
            Some(Cell::Time(Some(_))) => false,
        })
    }

    fn is_time_column(&self, c: usize) -> bool {
        self.rows
            .iter()
            .any(|row| matches!(row.get(c), Some(Cell::Time(_))))
    }

    /// The UTC day every time of the table falls on, when they all fall on one.
    fn one_day(&self) -> Option<String> {
        let mut days = self.rows.iter().flatten().filter_map(|cell| match cell {
            Cell::Time(Some(t)) => day_of(*t),
            _ => None,
        });
        let first = days.next()?;
        days.all(|d| d == first).then_some(first)
    }
}

/// A column's name for a person: `time_to_outcome_s` reads "time to outcome" (its cells say
/// their unit), so a narrow column wraps between its words.
fn person_name(name: &str) -> String {
    name.strip_suffix("_s").unwrap_or(name).replace('_', " ")
}

fn day_of(seconds: f64) -> Option<String> {
    DateTime::<Utc>::from_timestamp(seconds.floor() as i64, 0)
        .map(|t| t.format("%Y-%m-%d").to_string())
}

/// A time as the layout writes it: the clock alone when the day is in the header.
fn time_text(seconds: Option<f64>, clock_only: bool) -> String {
    let Some(seconds) = seconds else {
        return String::new();
    };
    let full = format_time(seconds);
    match (clock_only, full.split_once('T')) {
        (true, Some((_, clock))) => clock.trim_end_matches('Z').to_string(),
        _ => full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history() -> Grid {
        let mut grid = Grid::new(
            ["version", "finished", "outcome", "reason", "live_for_s"],
            &["version", "finished", "outcome", "reason"],
        );
        let reason =
            "not ready after 1500 ms; old release v1 still answering; candidate stopped (SIGTERM)";
        grid.push(vec![
            "v1".into(),
            Cell::Time(Some(1_796_160_000.0)),
            "promoted".into(),
            "ready".into(),
            "".into(),
        ]);
        grid.push(vec![
            "v2".into(),
            Cell::Time(Some(1_796_160_060.5)),
            "rolled_back".into(),
            reason.into(),
            "".into(),
        ]);
        grid
    }

    #[test]
    fn on_a_terminal_the_first_columns_fit_no_word_breaks_and_one_day_is_said_once() {
        for width in [60u16, 80, 100, 200] {
            let text = history().render(Layout::Terminal { width, wide: false });
            assert!(
                text.lines().all(|l| l.chars().count() <= width as usize),
                "{width}: {text}"
            );
            assert!(text.contains("(2026-12-01"), "the day, once: {text}");
            assert!(!text.contains("2026-12-01T"), "{text}");
            assert!(text.contains("21:20:00"), "{text}");
            assert!(!text.contains("live for"), "empty everywhere: {text}");
            for word in [
                "rolled_back",
                "promoted",
                "(SIGTERM)",
                "answering;",
                "21:21:00.500",
            ] {
                assert!(
                    text.split(|c: char| c.is_whitespace() || c == '│')
                        .any(|w| w == word),
                    "{width}: {word} broken: {text}"
                );
            }
        }
    }

    #[test]
    fn in_a_pipe_every_column_and_every_cell_whole() {
        let text = history().render(Layout::Pipe);
        assert!(text.contains("live_for_s"), "{text}");
        assert!(text.contains("2026-12-01T21:21:00.500Z"), "{text}");
        assert_eq!(text.lines().count(), 6, "{text}");
    }

    #[test]
    fn wide_shows_the_other_columns_unless_they_are_empty() {
        let mut grid = history();
        grid.rows[0][4] = "12 s".into();
        let text = grid.render(Layout::Terminal {
            width: 200,
            wide: true,
        });
        assert!(text.contains("live for"), "{text}");
        let text = grid.render(Layout::Terminal {
            width: 200,
            wide: false,
        });
        assert!(!text.contains("live for"), "{text}");
    }
}
