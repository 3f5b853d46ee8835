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
/// Only the columns `named` says a query may read are built (`line` always, so a frame has a
/// height); None builds them all.
pub fn records(log: &Log, named: Option<&crate::log::Columns>) -> PolarsResult<DataFrame> {
    let wants = |name: &str| named.is_none_or(|c| c.names(name));
    let mut columns = vec![Series::new("line".into(), &log.line).into_column()];
    if wants("ts") {
        columns.push(column("ts", &log.ts));
    }
    if wants("event") {
        // Borrowed straight into the Arrow column: no string, nor any list, per record.
        let events: StringChunked = log.event.iter().map(|e| e.as_deref()).collect();
        columns.push(events.with_name("event".into()).into_series().into_column());
    }
    if wants("version") {
        columns.push(text_column("version", &log.version));
    }
    if named.is_none_or(|c| c.detail) {
        columns.push(text_column("detail", &log.detail));
    }
    for (name, values) in &log.extra {
        if columns.iter().any(|c| c.name().as_str() == name) {
            continue;
        }
        columns.push(extra_column(name, values));
    }
    DataFrame::new(log.len(), columns)
}

fn extra_column(name: &str, values: &[Option<Value>]) -> Column {
    typed_column(name, values, Value::as_i64)
        .or_else(|| typed_column(name, values, Value::as_f64))
        .or_else(|| typed_column(name, values, Value::as_bool))
        .unwrap_or_else(|| {
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
    if attempts.iter().any(|a| a.sequence.is_some()) {
        let sequences: Vec<Option<u64>> = attempts.iter().map(|a| a.sequence).collect();
        let digests: Vec<Option<&str>> = attempts
            .iter()
            .map(|a| a.manifest_sha256.as_deref())
            .collect();
        columns.push(Series::new("sequence".into(), sequences).into_column());
        columns.push(Series::new("manifest_sha256".into(), digests).into_column());
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

    fn typed(values: &[Option<Value>]) -> DataType {
        extra_column("x", values).dtype().clone()
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
