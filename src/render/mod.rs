//! What every command prints with, apart from what it decides: the output formats, tables in
//! rollgate's style, CSV fields, and times and durations for a person. Knows nothing of deploys,
//! rollouts or logs.

pub mod confinement;
pub mod page;
pub mod page_model;
pub mod table;
pub mod time;

use comfy_table::{presets::UTF8_FULL_CONDENSED, ContentArrangement, Table};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Csv,
}

/// One CSV field, quoted only when it has to be (RFC 4180).
pub fn csv_field(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains([',', '"', '\n', '\r']) {
        std::borrow::Cow::Owned(format!("\"{}\"", text.replace('"', "\"\"")))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// A table in rollgate's style with these columns, arranged to fit the terminal it is printed
/// on (long cells wrap); printed to a file or a pipe it keeps every cell on one line.
pub fn fitted_table<T: ToString>(header: impl IntoIterator<Item = T>) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(
            header
                .into_iter()
                .map(|h| h.to_string())
                .collect::<Vec<_>>(),
        );
    table
}

/// A two-column table of named figures, for the summary and stats.
pub fn figures_table(rows: &[(String, String)]) -> String {
    let mut table = fitted_table(["figure", "value"]);
    for (name, value) in rows {
        table.add_row([name, value]);
    }
    format!("{table}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_fits_the_terminal_it_is_printed_on_and_keeps_full_lines_in_a_pipe() {
        let detail = "not ready after 1500 ms; old release v1 still answering; candidate stopped (SIGTERM); last probes: HTTP 503";
        let table = || {
            let mut t = fitted_table(["when", "outcome", "version", "detail"]);
            t.add_row(["2026-12-01T02:00:00Z", "rolled_back", "v3", detail]);
            t
        };
        // The tests' stdout is not a terminal: one line per row, however wide.
        let piped = table().to_string();
        assert!(piped.lines().any(|l| l.contains(detail)), "{piped}");
        // On an 80-column terminal, nothing is wider than 80.
        let mut on_80 = table();
        on_80.set_width(80);
        let text = on_80.to_string();
        assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
        assert!(text.contains("HTTP 503"), "nothing is cut: {text}");
    }
}
