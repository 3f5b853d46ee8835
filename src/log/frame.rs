//! Columns to polars frames: the records as table `log`, the attempts as table `attempts`.

use polars::prelude::*;
use serde_json::Value;

use super::history::Attempt;
use super::read::Log;

fn column<T>(name: &str, values: T) -> Column
where
    Series: NamedFrom<T, [Option<f64>]>,
{
    Series::new(name.into(), values).into_column()
}

fn text_column(name: &str, values: &[Option<String>]) -> Column {
    Series::new(name.into(), values).into_column()
}

/// The records with their line numbers, and every extra field as a column typed by what it
/// holds (all integers: Int64; all numbers: Float64; all booleans: Boolean; else text).
pub fn records(log: &Log) -> PolarsResult<DataFrame> {
    let mut columns = vec![
        Series::new("line".into(), &log.line).into_column(),
        column("ts", &log.ts),
        text_column(
            "event",
            &log.event
                .iter()
                .map(|e| e.as_deref().map(String::from))
                .collect::<Vec<_>>(),
        ),
        text_column("version", &log.version),
        text_column("detail", &log.detail),
    ];
    for (name, values) in &log.extra {
        if columns.iter().any(|c| c.name().as_str() == name) {
            continue;
        }
        columns.push(extra_column(name, values));
    }
    DataFrame::new(log.len(), columns)
}

fn extra_column(name: &str, values: &[Option<Value>]) -> Column {
    let present = || values.iter().flatten();
    if present().all(|v| v.is_i64()) {
        let ints: Vec<Option<i64>> = values
            .iter()
            .map(|v| v.as_ref().and_then(Value::as_i64))
            .collect();
        return Series::new(name.into(), ints).into_column();
    }
    if present().all(Value::is_number) {
        let floats: Vec<Option<f64>> = values
            .iter()
            .map(|v| v.as_ref().and_then(Value::as_f64))
            .collect();
        return Series::new(name.into(), floats).into_column();
    }
    if present().all(Value::is_boolean) {
        let bools: Vec<Option<bool>> = values
            .iter()
            .map(|v| v.as_ref().and_then(Value::as_bool))
            .collect();
        return Series::new(name.into(), bools).into_column();
    }
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
}

/// One row per attempt. Times are Unix seconds, durations seconds.
pub fn attempts(attempts: &[Attempt]) -> PolarsResult<DataFrame> {
    let pick = |f: fn(&Attempt) -> Option<f64>| attempts.iter().map(f).collect::<Vec<_>>();
    let versions: Vec<Option<String>> = attempts.iter().map(|a| a.version.clone()).collect();
    let outcomes: Vec<&str> = attempts.iter().map(|a| a.outcome.as_str()).collect();
    let reasons: Vec<Option<String>> = attempts.iter().map(|a| a.reason.clone()).collect();
    let live_now: Vec<bool> = attempts.iter().map(|a| a.live_now).collect();
    DataFrame::new(
        attempts.len(),
        vec![
            text_column("version", &versions),
            column("started", pick(|a| a.started)),
            column("finished", pick(|a| a.finished)),
            Series::new("outcome".into(), outcomes).into_column(),
            column("time_to_outcome_s", pick(Attempt::time_to_outcome)),
            text_column("reason", &reasons),
            column("live_for_s", pick(Attempt::live_for)),
            Series::new("live_now".into(), live_now).into_column(),
            column("rolled_back_at", pick(|a| a.rolled_back_at)),
            column("exposure_s", pick(Attempt::exposure)),
        ],
    )
}
