//! Nickel's errors, kept both as the text Nickel itself prints and as parts a one-line report or
//! a GitHub annotation can use.

use nickel_lang_core::error::{report::report_as_str, Error, IntoDiagnostics, LabelStyle};
use nickel_lang_core::eval::cache::CacheImpl;
use nickel_lang_core::files::{FileId, Files};
use nickel_lang_core::program::Program;

/// A place in a source file, 1-based like editors and GitHub show it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Location {
    pub file: String,
    pub line: usize,
    pub column: usize,
}

/// One refusal from Nickel.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Diagnostic {
    /// The first line of Nickel's message, e.g. ``contract broken by the value of `poll_ms` ``.
    pub title: String,
    /// The rest of the message: for a broken contract, the contract's own words.
    pub detail: Vec<String>,
    /// Where the offending value is (Nickel's primary label), or the first place it names.
    pub location: Option<Location>,
    /// Every place the diagnostic names, primary first.
    pub places: Vec<Location>,
    /// The whole diagnostic exactly as `nickel export` renders it.
    pub rendered: String,
}

/// 1-based line and column of a byte in a file. Nickel's own lookup refuses the very end of
/// the file, which is where a parse error about an unfinished file points (a YAML list left
/// open), so that place is computed here, as Nickel's renderer shows it.
fn locate(files: &Files, file: FileId, byte: usize) -> Option<(usize, usize)> {
    if let Ok(place) = files.location(file, byte as u32) {
        return Some((place.line.to_usize() + 1, place.column.to_usize() + 1));
    }
    let source = files.source(file);
    if byte != source.len() {
        return None;
    }
    let line = source.matches('\n').count() + 1;
    let column = source.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    Some((line, column))
}

impl Diagnostic {
    pub fn from_nickel(program: &Program<CacheImpl>, error: Error, color: bool) -> Self {
        let mut files = program.files();
        let diagnostics = error.clone().into_diagnostics(&mut files);
        let color_choice = if color {
            nickel_lang_core::error::report::ColorOpt::Always
        } else {
            nickel_lang_core::error::report::ColorOpt::Never
        };
        let rendered = report_as_str(&mut files, error, color_choice);

        let first = diagnostics.first();
        let mut lines = first
            .map(|d| d.message.lines().map(str::trim).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter();
        let title = lines.next().unwrap_or("evaluation failed").to_string();
        let detail = lines.filter(|l| !l.is_empty()).map(String::from).collect();

        let mut labels: Vec<_> = first.map(|d| d.labels.iter().collect()).unwrap_or_default();
        labels.sort_by_key(|l| l.style != LabelStyle::Primary);
        let places: Vec<Location> = labels
            .into_iter()
            .filter_map(|label| {
                let (line, column) = locate(&files, label.file_id, label.range.start)?;
                Some(Location {
                    file: files.name(label.file_id).to_string_lossy().into_owned(),
                    line,
                    column,
                })
            })
            .collect();
        Diagnostic {
            title,
            detail,
            location: places.first().cloned(),
            places,
            rendered,
        }
    }

    /// The place to show for `file`: the first place inside it (a missing field is reported at
    /// the contract, with the policy's record as a second place), else the primary place.
    pub fn location_in(&self, file: &std::path::Path) -> Option<&Location> {
        let wanted = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
        self.places
            .iter()
            .find(|l| std::path::Path::new(&l.file) == wanted)
            .or(self.location.as_ref())
    }

    /// `title: detail` on one line, the form `policy check` prints per file.
    pub fn one_line(&self) -> String {
        if self.detail.is_empty() {
            self.title.clone()
        } else {
            format!("{}: {}", self.title, self.detail.join(" "))
        }
    }
}
