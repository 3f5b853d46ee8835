//! `policy check`: many files in one process, one verdict per file.

use std::path::PathBuf;

use super::diagnostic::Location;
use super::eval::{check_input, evaluate_batch, evaluate_each_checked, EvalOptions, Purpose};
use super::{Diagnostic, PolicyError};
use nickel_lang_core::serialize::ExportFormat;

/// The verdict on one file.
#[derive(Debug)]
pub struct Outcome {
    pub path: PathBuf,
    pub result: Result<(), PolicyError>,
}

/// Checks every file. The good files are proven in one shared Nickel program (the standard
/// library and contract load once); every file that fails there is evaluated again on its own,
/// because one broken file can fail the shared program for all, and because its diagnostic must
/// read exactly as `policy export` would print it. Those lone evaluations run on every core.
pub fn check_files(paths: &[PathBuf], opts: &EvalOptions) -> Vec<Outcome> {
    let mut results: Vec<Option<Result<(), PolicyError>>> = paths
        .iter()
        .map(|p| check_input(p, opts).err().map(Err))
        .collect();
    let pending: Vec<usize> = (0..paths.len()).filter(|i| results[*i].is_none()).collect();
    let batch_paths: Vec<PathBuf> = pending.iter().map(|i| paths[*i].clone()).collect();
    // One file gains nothing from a shared program: it is evaluated as `export` would.
    let batch = if batch_paths.len() < 2 {
        vec![None; batch_paths.len()]
    } else {
        evaluate_batch(&batch_paths, opts)
    };
    let mut alone = Vec::new();
    for (index, verdict) in pending.into_iter().zip(batch) {
        match verdict {
            Some(Ok(())) => results[index] = Some(Ok(())),
            _ => alone.push(index),
        }
    }
    let alone_paths: Vec<PathBuf> = alone.iter().map(|i| paths[*i].clone()).collect();
    let verdicts = evaluate_each_checked(&alone_paths, ExportFormat::Json, Purpose::Use, opts);
    for (index, verdict) in alone.into_iter().zip(verdicts) {
        results[index] = Some(verdict.map(|_| ()));
    }
    paths
        .iter()
        .zip(results)
        .map(|(path, result)| Outcome {
            path: path.clone(),
            result: result.expect("every file has a verdict"),
        })
        .collect()
}

/// How `policy check` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckFormat {
    /// One line per file and a total.
    Text,
    /// One JSON object per file, one per line.
    Json,
    /// GitHub Actions `::error` annotations for the failures, then the total.
    Github,
}

/// A place as the user should read it: the path they typed when it is the checked file itself
/// (GitHub resolves annotation paths against the repository, not `/`).
fn shown_file(place: &Location, checked: &std::path::Path) -> String {
    let checked_abs = std::path::absolute(checked).unwrap_or_else(|_| checked.to_path_buf());
    if std::path::Path::new(&place.file) == checked_abs {
        checked.display().to_string()
    } else {
        place.file.clone()
    }
}

fn diagnostic(error: &PolicyError) -> Option<&Diagnostic> {
    match error {
        PolicyError::Nickel(d) => Some(d),
        _ => None,
    }
}

/// The one-line message for a failure: Nickel's title and the contract's words, or the input
/// problem.
fn message(error: &PolicyError) -> String {
    match error {
        PolicyError::Nickel(d) => d.one_line(),
        PolicyError::Input { reason, .. } => reason.clone(),
        PolicyError::Crashed { how, .. } => how.clone(),
        PolicyError::Timeout { limit, .. } => {
            format!("evaluation did not finish within {} ms", limit.as_millis())
        }
        other => other.to_string(),
    }
}

/// Renders the report. Returns the text and whether every file passed.
pub fn render(outcomes: &[Outcome], format: CheckFormat) -> (String, bool) {
    let mut out = String::new();
    let failed = outcomes.iter().filter(|o| o.result.is_err()).count();
    for o in outcomes {
        let path = o.path.display().to_string();
        match format {
            CheckFormat::Text => match &o.result {
                Ok(()) => out.push_str(&format!("{path}: ok\n")),
                Err(e) => match diagnostic(e).and_then(|d| d.location_in(&o.path)) {
                    Some(at) => out.push_str(&format!(
                        "{path}: error at {}:{}:{}: {}\n",
                        shown_file(at, &o.path),
                        at.line,
                        at.column,
                        message(e)
                    )),
                    None => out.push_str(&format!("{path}: error: {}\n", message(e))),
                },
            },
            CheckFormat::Json => {
                let object = match &o.result {
                    Ok(()) => serde_json::json!({"file": path, "ok": true}),
                    Err(e) => {
                        let d = diagnostic(e);
                        serde_json::json!({
                            "file": path,
                            "ok": false,
                            "error": d.map(|d| d.title.clone()).unwrap_or_else(|| message(e)),
                            "message": d.map(|d| d.detail.join("\n")),
                            "location": d.and_then(|d| d.location_in(&o.path)).map(|l| serde_json::json!({
                                "file": shown_file(l, &o.path), "line": l.line, "column": l.column,
                            })),
                            "diagnostic": d.map(|d| d.rendered.clone()),
                        })
                    }
                };
                out.push_str(&object.to_string());
                out.push('\n');
            }
            CheckFormat::Github => {
                if let Err(e) = &o.result {
                    // Annotate the offending value in this file when Nickel names one.
                    let at = diagnostic(e).and_then(|d| d.location_in(&o.path));
                    let (file, line, col) = match at {
                        Some(l) => (shown_file(l, &o.path), l.line, l.column),
                        None => (path.clone(), 1, 1),
                    };
                    out.push_str(&format!(
                        "::error file={},line={line},col={col},title={}::{}\n",
                        escape_property(&file),
                        escape_property(&format!("rollgate policy check: {path}")),
                        escape_data(&message(e)),
                    ));
                }
            }
        }
    }
    if format != CheckFormat::Json {
        out.push_str(&format!(
            "{} file{} checked: {} ok, {failed} failed\n",
            outcomes.len(),
            if outcomes.len() == 1 { "" } else { "s" },
            outcomes.len() - failed
        ));
    }
    (out, failed == 0)
}

/// GitHub's workflow-command escaping for the message part.
fn escape_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// GitHub's escaping for `key=value` properties, which also reserve `:` and `,`.
fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn github_escaping() {
        assert_eq!(escape_data("50%\nnext"), "50%25%0Anext");
        assert_eq!(escape_property("a:b,c"), "a%3Ab%2Cc");
    }
}
