//! Rendering frames for a person (table), a program (JSON lines) or a spreadsheet (CSV).

use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
use polars::prelude::*;

use super::time::{format_duration, format_time};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Csv,
}

/// How a column is shown in a table: times as RFC 3339, durations in human units. JSON and CSV
/// keep the raw numbers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Display<'a> {
    pub times: &'a [&'a str],
    pub durations: &'a [&'a str],
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

/// One CSV field, quoted only when it has to be (RFC 4180).
pub fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// Renders a whole frame.
pub fn render(df: &DataFrame, format: Format, display: Display) -> String {
    let columns = df.columns();
    let names: Vec<String> = columns.iter().map(|c| c.name().to_string()).collect();
    let value = |c: usize, row: usize| columns[c].get(row).unwrap_or(AnyValue::Null);
    let mut out = String::new();
    match format {
        Format::Table => {
            let mut table = Table::new();
            table.load_preset(UTF8_FULL_CONDENSED).set_header(&names);
            for row in 0..df.height() {
                table.add_row(
                    (0..columns.len())
                        .map(|c| cell_text(&value(c, row), &names[c], display))
                        .collect::<Vec<_>>(),
                );
            }
            out.push_str(&table.to_string());
            out.push('\n');
        }
        Format::Json => {
            for row in 0..df.height() {
                let fields: Vec<String> = (0..columns.len())
                    .map(|c| {
                        format!(
                            "{}:{}",
                            serde_json::Value::String(names[c].clone()),
                            json_value(&value(c, row))
                        )
                    })
                    .collect();
                out.push('{');
                out.push_str(&fields.join(","));
                out.push_str("}\n");
            }
        }
        Format::Csv => {
            out.push_str(
                &names
                    .iter()
                    .map(|n| csv_field(n))
                    .collect::<Vec<_>>()
                    .join(","),
            );
            out.push('\n');
            for row in 0..df.height() {
                let fields: Vec<String> = (0..columns.len())
                    .map(|c| match value(c, row) {
                        AnyValue::Null => String::new(),
                        AnyValue::Float64(f) => trim_float(f),
                        v => csv_field(&cell_text(&v, "", Display::default())),
                    })
                    .collect();
                out.push_str(&fields.join(","));
                out.push('\n');
            }
        }
    }
    out
}

/// A two-column table of named figures, for the summary and stats.
pub fn figures_table(rows: &[(String, String)]) -> String {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_header(["figure", "value"]);
    for (name, value) in rows {
        table.add_row([name, value]);
    }
    format!("{table}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_only_when_needed() {
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a, b"), "\"a, b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
