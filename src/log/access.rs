//! The proxy's access logs (`ROOT/access.log`, issue 48) as table `access` of `log query`, so
//! one SQL query joins what users got to what the deployer did: `ts` is Unix seconds in both.
//! A line that is not an access line is skipped and counted (said on stderr), as a bad deploy
//! log line is.

use std::path::{Path, PathBuf};

use polars::prelude::*;
use serde::Deserialize;

use super::LogError;

/// One line as the proxy writes it (`proxy::access::Line`).
#[derive(Deserialize)]
struct Line {
    ts: f64,
    route: String,
    host: String,
    method: String,
    path: String,
    status: u16,
    /// How the request ended (`proxy::fate`); absent from an older proxy's lines.
    #[serde(default)]
    fate: Option<String>,
    bytes: u64,
    duration_ms: f64,
    release: Option<String>,
    slot: Option<u16>,
    client: String,
    request_id: String,
}

/// Every line of `paths` (a log and its rotated files, in any order), as one frame sorted by
/// `ts`; `file` says which file each came from.
pub fn frame(paths: &[PathBuf]) -> Result<DataFrame, LogError> {
    let mut lines: Vec<(Line, usize)> = Vec::new();
    for (index, path) in paths.iter().enumerate() {
        read_into(path, index, &mut lines)?;
    }
    lines.sort_by(|a, b| a.0.ts.total_cmp(&b.0.ts));
    let text =
        |f: &dyn Fn(&Line) -> &str| -> Vec<&str> { lines.iter().map(|(l, _)| f(l)).collect() };
    let columns = vec![
        Series::new(
            "ts".into(),
            lines.iter().map(|(l, _)| l.ts).collect::<Vec<_>>(),
        )
        .into_column(),
        Series::new("route".into(), text(&|l| &l.route)).into_column(),
        Series::new("host".into(), text(&|l| &l.host)).into_column(),
        Series::new("method".into(), text(&|l| &l.method)).into_column(),
        Series::new("path".into(), text(&|l| &l.path)).into_column(),
        Series::new(
            "status".into(),
            lines
                .iter()
                .map(|(l, _)| i64::from(l.status))
                .collect::<Vec<_>>(),
        )
        .into_column(),
        Series::new(
            "fate".into(),
            lines
                .iter()
                .map(|(l, _)| l.fate.as_deref())
                .collect::<Vec<_>>(),
        )
        .into_column(),
        Series::new(
            "bytes".into(),
            lines
                .iter()
                .map(|(l, _)| l.bytes as i64)
                .collect::<Vec<_>>(),
        )
        .into_column(),
        Series::new(
            "duration_ms".into(),
            lines.iter().map(|(l, _)| l.duration_ms).collect::<Vec<_>>(),
        )
        .into_column(),
        Series::new(
            "release".into(),
            lines
                .iter()
                .map(|(l, _)| l.release.as_deref())
                .collect::<Vec<_>>(),
        )
        .into_column(),
        Series::new(
            "slot".into(),
            lines
                .iter()
                .map(|(l, _)| l.slot.map(i64::from))
                .collect::<Vec<_>>(),
        )
        .into_column(),
        Series::new("client".into(), text(&|l| &l.client)).into_column(),
        Series::new("request_id".into(), text(&|l| &l.request_id)).into_column(),
        Series::new(
            "file".into(),
            lines
                .iter()
                .map(|(_, i)| paths[*i].display().to_string())
                .collect::<Vec<_>>(),
        )
        .into_column(),
    ];
    DataFrame::new(lines.len(), columns).map_err(|e| LogError::Query(e.to_string()))
}

fn read_into(path: &Path, index: usize, lines: &mut Vec<(Line, usize)>) -> Result<(), LogError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        LogError::Usage(format!("--access {}: cannot read it: {e}", path.display()))
    })?;
    let mut bad = 0usize;
    let mut first_bad = None;
    for (number, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Line>(line) {
            Ok(parsed) => lines.push((parsed, index)),
            Err(e) => {
                bad += 1;
                first_bad.get_or_insert((number + 1, e.to_string()));
            }
        }
    }
    if let Some((line, why)) = first_bad {
        eprintln!(
            "rollgate: {}: {bad} line(s) that are not access log lines skipped (first at line {line}: {why})",
            path.display()
        );
    }
    Ok(())
}

/// `log summary --access`: how many requests the access logs hold, by status class, and by
/// release and class (`-`: rollgate answered itself), as one JSON line or one text line.
pub fn summary(paths: &[PathBuf], format: crate::render::Format) -> Result<String, LogError> {
    use std::collections::BTreeMap;
    let mut lines: Vec<(Line, usize)> = Vec::new();
    for (index, path) in paths.iter().enumerate() {
        read_into(path, index, &mut lines)?;
    }
    let class = |status: u16| format!("{}xx", status / 100);
    let mut by_class: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_release: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for (line, _) in &lines {
        *by_class.entry(class(line.status)).or_default() += 1;
        *by_release
            .entry(line.release.clone().unwrap_or_else(|| "-".into()))
            .or_default()
            .entry(class(line.status))
            .or_default() += 1;
    }
    if format == crate::render::Format::Json {
        let value = serde_json::json!({
            "access": { "requests": lines.len(), "by_class": by_class, "by_release": by_release }
        });
        return Ok(format!("{value}\n"));
    }
    let counts = |classes: &BTreeMap<String, u64>| {
        classes
            .iter()
            .map(|(class, n)| format!("{class} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let releases: Vec<String> = by_release
        .iter()
        .map(|(release, classes)| format!("{release}: {}", counts(classes)))
        .collect();
    Ok(format!(
        "access: {} requests ({}); {}\n",
        lines.len(),
        counts(&by_class),
        releases.join("; ")
    ))
}
