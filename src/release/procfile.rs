//! A release's `Procfile` (Heroku's format): `TYPE: command`, one per line, at the release's
//! top; blank lines and `#` comments are skipped. Each command is run by `/bin/sh -c` in the
//! release's folder, as Heroku and Dokku run them.
//!
//! What this rollgate runs of it (issue 69): `web:`, the process the gate probes and the proxy
//! serves, in place of an executable at the release's top (its command is put on the launch
//! record when a run is planned); `release:`, the release phase — once per deploy of a new
//! version, in the new release, before any of its processes starts (see `host::hooks`); and
//! every other type (workers, a clock), each a slot of the deploy (see `engine::types`).

use std::path::Path;

use crate::error::{refused, Error};

/// The file's name at the release's top.
pub const PROCFILE: &str = "Procfile";

/// The type that runs once per deploy, before the release's processes.
pub const RELEASE_PHASE: &str = "release";

/// The most types a Procfile may name (web and the release phase among them): each type is a
/// process tree with a keeper of its own, so their number is bounded as the processes are.
pub const MAX_TYPES: usize = 32;

/// The type the gate probes and the proxy serves.
pub const WEB: &str = "web";

/// A Procfile's lines, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Procfile {
    pub types: Vec<ProcessType>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessType {
    pub name: String,
    pub command: String,
    /// Its line in the file (from 1).
    pub line: usize,
}

impl Procfile {
    /// The Procfile at the top of release folder `dir`, if it has one; a Procfile that cannot
    /// be read or parsed, or names a type this rollgate does not run, is refused naming the
    /// file and line.
    pub fn of_release(dir: &Path) -> Result<Option<Procfile>, Error> {
        Procfile::of_release_shown_as(dir, &dir.join(PROCFILE))
    }

    /// [`Procfile::of_release`], its errors naming the file as `shown` (a release being
    /// installed is named by where it came from, not by its staging folder).
    pub fn of_release_shown_as(dir: &Path, shown: &Path) -> Result<Option<Procfile>, Error> {
        Procfile::of_tree_shown_as(dir, shown)
    }

    /// The Procfile at `path`, wherever it is (`policy export --procfile`), every type read;
    /// one that is missing, unreadable or wrong is refused naming the file (and line).
    pub fn read(path: &Path) -> Result<Procfile, Error> {
        Procfile::read_shown_as(path, path)?.ok_or_else(|| {
            refused(format!(
                "cannot read {}: no such file (the release's Procfile)",
                path.display()
            ))
        })
    }

    /// The Procfile at `path` (None: there is none), its errors naming it as `shown`.
    fn read_shown_as(path: &Path, shown: &Path) -> Result<Option<Procfile>, Error> {
        let text = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(refused(format!("cannot read {}: {e}", shown.display()))),
        };
        Procfile::parse_shown_as(text, shown).map(Some)
    }

    /// The Procfile of release folder `dir`, read beneath it (`host::beneath`): a Procfile
    /// that is a link, a FIFO or a device, or larger than a MiB, is refused, never followed.
    fn of_tree_shown_as(dir: &Path, shown: &Path) -> Result<Option<Procfile>, Error> {
        let text = crate::host::beneath::read(dir, PROCFILE, crate::host::beneath::SMALL_FILE_CAP)
            .map_err(|e| refused(format!("cannot read the release's Procfile: {e}")))?;
        match text {
            None => Ok(None),
            Some(text) => Procfile::parse_shown_as(text, shown).map(Some),
        }
    }

    fn parse_shown_as(text: Vec<u8>, shown: &Path) -> Result<Procfile, Error> {
        let shown = shown.display();
        let text =
            String::from_utf8(text).map_err(|_| refused(format!("{shown}: not UTF-8 text")))?;
        Procfile::parse(&text).map_err(|(line, why)| refused(format!("{shown}:{line}: {why}")))
    }

    /// The lines of `text`, or the first wrong line's number and what is wrong with it.
    pub fn parse(text: &str) -> Result<Procfile, (usize, String)> {
        let mut types: Vec<ProcessType> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let Some((name, command)) = trimmed.split_once(':') else {
                return Err((line, "expected `TYPE: command`".into()));
            };
            let name = name.trim();
            let named_well = !name.is_empty()
                && name.len() <= 63
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !named_well {
                return Err((
                    line,
                    format!(
                        "type `{}`: a type is 1 to 63 letters, digits, `_` or `-`",
                        crate::host::output::printable(name)
                    ),
                ));
            }
            let command = command.trim();
            if command.is_empty() {
                return Err((line, format!("type `{name}` has no command")));
            }
            if types.len() == MAX_TYPES {
                return Err((
                    line,
                    format!(
                        "type `{name}` is one more than the {MAX_TYPES} types a Procfile may have"
                    ),
                ));
            }
            if let Some(first) = types.iter().find(|t| t.name == name) {
                return Err((
                    line,
                    format!("type `{name}` again (first on line {})", first.line),
                ));
            }
            types.push(ProcessType {
                name: name.to_string(),
                command: command.to_string(),
                line,
            });
        }
        Ok(Procfile { types })
    }

    /// The release phase's command, as it is run: `/bin/sh -c COMMAND`.
    pub fn release_phase(&self) -> Option<Vec<String>> {
        self.command_of(RELEASE_PHASE)
    }

    /// The web process's command, as it is run: `/bin/sh -c COMMAND`.
    pub fn web(&self) -> Option<Vec<String>> {
        self.command_of(WEB)
    }

    /// Type `name`'s line, as it is run: `/bin/sh -c COMMAND`.
    fn command_of(&self, name: &str) -> Option<Vec<String>> {
        self.types
            .iter()
            .find(|t| t.name == name)
            .map(|t| vec!["/bin/sh".into(), "-c".into(), t.command.clone()])
    }

    /// Every type besides web and the release phase (workers, a clock), with its command, in
    /// the file's order.
    pub fn others(&self) -> Vec<(String, String)> {
        self.types
            .iter()
            .filter(|t| t.name != WEB && t.name != RELEASE_PHASE)
            .map(|t| (t.name.clone(), t.command.clone()))
            .collect()
    }

    /// The line of type `name`, if the file has it.
    pub fn line_of(&self, name: &str) -> Option<usize> {
        self.types.iter().find(|t| t.name == name).map(|t| t.line)
    }

    /// What release folder `dir`'s web process runs when its Procfile says (none: its
    /// executable at the top, or a Procfile that cannot be read — which `release add` refused).
    pub fn web_of_release(dir: &Path) -> Option<Vec<String>> {
        Procfile::of_release(dir)
            .ok()
            .flatten()
            .and_then(|p| p.web())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_commands_and_lines_are_read_and_comments_skipped() {
        let p = Procfile::parse(
            "# a comment\n\nweb: gunicorn app:wsgi\nrelease:  python manage.py migrate \n",
        )
        .unwrap();
        assert_eq!(
            p.types,
            vec![
                ProcessType {
                    name: "web".into(),
                    command: "gunicorn app:wsgi".into(),
                    line: 3
                },
                ProcessType {
                    name: "release".into(),
                    command: "python manage.py migrate".into(),
                    line: 4
                },
            ]
        );
        assert_eq!(
            p.release_phase(),
            Some(vec![
                "/bin/sh".into(),
                "-c".into(),
                "python manage.py migrate".into()
            ])
        );
    }

    #[test]
    fn a_wrong_line_is_named_with_what_is_wrong() {
        assert_eq!(
            Procfile::parse("web: a\nworker b\n").unwrap_err(),
            (2, "expected `TYPE: command`".into())
        );
        assert_eq!(
            Procfile::parse("web: a\n\nweb: b\n").unwrap_err(),
            (3, "type `web` again (first on line 1)".into())
        );
        assert_eq!(
            Procfile::parse("release:   \n").unwrap_err(),
            (1, "type `release` has no command".into())
        );
        assert!(Procfile::parse("bad type: x\n")
            .unwrap_err()
            .1
            .contains("a type is 1 to 63"));
    }
}
