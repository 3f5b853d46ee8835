//! A release's own configuration: `releases/VERSION/env` (its variables) and
//! `releases/VERSION/secrets` (`KEY=NAME`: the variable KEY gets the value of the root's secret
//! NAME, `ROOT/secrets/NAME`). Both belong to the release, so every start of it gets exactly
//! them, and a rollback brings the old configuration back because it *is* the old release.
//!
//! The env file has systemd's `EnvironmentFile=` syntax: one `KEY=VALUE` a line; blank lines and
//! lines starting with `#` or `;` are comments; a value may be in double quotes (with `\"`,
//! `\\`, `\n`, `\t` escapes) or single quotes (taken as written); an unquoted value is trimmed; a
//! line ending in `\` goes on on the next line. Nothing is expanded (`$HOME` stays `$HOME`).
//! Anything else is refused, naming the file and the line.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::fault::Fault;

/// An env file's variables: name to value.
pub type Variables = BTreeMap<String, String>;

/// A secrets file's map: variable name to the secret's name under `ROOT/secrets/`.
pub type SecretMap = BTreeMap<String, String>;

/// The file of a release's variables, and the file mapping its variables to secrets.
pub const ENV_FILE: &str = "env";
pub const SECRETS_FILE: &str = "secrets";
/// The root's folder of secret values, one file each, mode 0600 in a 0700 folder.
pub const SECRETS_DIR: &str = "secrets";
/// In a release folder: its `env` and `secrets` are the service's config it was given at a
/// deploy (the file names the release it came from), not config it carries itself. A later
/// deploy of it gives it the service's config again; a rollback and `up` keep what it has.
pub const ADOPTED_FILE: &str = "config.from";
/// The root's folder holding the service's config before any release is live
/// (`config set --no-deploy` on a new root): the first release deployed gets it.
pub const STAGED_DIR: &str = "config";

/// Where a release's configuration comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Neither file: the release has no config.
    None,
    /// The release carries its own (`config set` made it, or it was installed with them).
    Own,
    /// Given at a deploy from the service's config (the release it names, or `staged`).
    Adopted(String),
}

impl Origin {
    /// A release folder's.
    pub fn of_release(dir: &Path) -> Origin {
        if let Ok(Some(from)) = read_optional(dir, ADOPTED_FILE) {
            return Origin::Adopted(from.trim().to_string());
        }
        let has =
            |name: &str| super::beneath::Beneath::open(dir).is_ok_and(|b| b.has(Path::new(name)));
        match has(ENV_FILE) || has(SECRETS_FILE) {
            true => Origin::Own,
            false => Origin::None,
        }
    }
}

/// Variables rollgate sets itself: a release's env may not set them.
const RESERVED: &[&str] = &[
    "PORT",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
];

/// Why a release's configuration cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// A release's configuration as a process gets it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config {
    /// From the env file, by name (a later line for the same name wins).
    pub variables: BTreeMap<String, String>,
    /// KEY -> secret NAME, from the secrets file.
    pub secrets: BTreeMap<String, String>,
}

impl Config {
    /// The release folder's configuration (empty when it has neither file).
    pub fn of_release(dir: &Path) -> Result<Config, ConfigError> {
        let variables = match read_optional(dir, ENV_FILE)? {
            Some(text) => parse_env(&dir.join(ENV_FILE), &text)?,
            None => BTreeMap::new(),
        };
        let secrets = match read_optional(dir, SECRETS_FILE)? {
            Some(text) => parse_secret_map(&dir.join(SECRETS_FILE), &text)?,
            None => BTreeMap::new(),
        };
        Ok(Config { variables, secrets })
    }

    /// Every variable with its value, the secrets' read from `secrets_dir` (refused when one is
    /// missing or the folder or file is readable by group or others).
    pub fn resolve(&self, secrets_dir: &Path) -> Result<Vec<(String, String)>, ConfigError> {
        let mut all: Vec<(String, String)> = self
            .variables
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !self.secrets.is_empty() {
            check_private(secrets_dir, 0o077, "folder")?;
        }
        for (key, name) in &self.secrets {
            check_givable(name)?;
            all.push((key.clone(), read_secret(secrets_dir, name)?));
        }
        Ok(all)
    }

    /// The files that hold this config: the env file's text (comments naming where it came
    /// from) and the secrets map's; an empty config is no files.
    pub fn files(&self, written_by: &str) -> (String, String) {
        let mut env = format!("# written by {written_by}\n");
        for (key, value) in &self.variables {
            env.push_str(&format!("{key}={}\n", env_quoted(value)));
        }
        let secrets: String = self
            .secrets
            .iter()
            .map(|(k, n)| format!("{k}={n}\n"))
            .collect();
        (env, secrets)
    }

    /// What differs from `before` to this config, a change a word (`+ KEY`, `- KEY`, `~ KEY`;
    /// secrets by name only, values never): empty when they are the same.
    pub fn changes_from(&self, before: &Config) -> Vec<String> {
        let view = |c: &Config| -> BTreeMap<String, String> {
            c.variables
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .chain(
                    c.secrets
                        .iter()
                        .map(|(k, n)| (k.clone(), format!("<secret {n}>"))),
                )
                .collect()
        };
        let (from, to) = (view(before), view(self));
        let mut out = Vec::new();
        for (key, old) in &from {
            match to.get(key) {
                None => out.push(format!("- {key}")),
                Some(new) if new != old => out.push(format!("~ {key}")),
                Some(_) => {}
            }
        }
        for key in to.keys().filter(|k| !from.contains_key(*k)) {
            out.push(format!("+ {key}"));
        }
        out
    }

    /// A digest of the configuration: the env file's variables and the secrets' *names*, never
    /// their values (what `log history` shows, so two releases' configs can be told apart).
    pub fn digest(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        for (key, value) in &self.variables {
            hasher.update(format!("{key}={value}\n").as_bytes());
        }
        for (key, name) in &self.secrets {
            hasher.update(format!("{key}=secret:{name}\n").as_bytes());
        }
        hasher
            .finalize()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// The release's file `name`, through [`super::beneath`]: never through a link (a release may
/// hold links out of itself, and an `env` linked to a file of the host must not become its
/// environment), a regular file only, at most a MiB.
fn read_optional(dir: &Path, name: &str) -> Result<Option<String>, ConfigError> {
    super::beneath::read_text(dir, name, super::beneath::SMALL_FILE_CAP)
        .map_err(|e| ConfigError(format!("cannot read a release's configuration: {e}")))
}

/// A value as an env file holds it: bare when plain, else in double quotes with escapes.
pub fn env_quoted(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:,@%+=".contains(c));
    if plain {
        return value.to_string();
    }
    let escaped = value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .replace('\t', "\\t");
    format!("\"{escaped}\"")
}

/// A variable's name as a shell and systemd accept it.
pub fn check_key(key: &str) -> Result<(), Fault> {
    let refused = |why: String| {
        Err(Fault::Name {
            kind: "variable".into(),
            name: key.to_string(),
            why,
        })
    };
    let mut chars = key.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return refused(format!(
            "`{}` is not a variable name (a letter or `_`, then letters, digits, `_`)",
            key.escape_debug()
        ));
    }
    if RESERVED.contains(&key) || key.starts_with("ROLLGATE_") {
        return refused(format!("{key} is set by rollgate itself"));
    }
    Ok(())
}

/// Parses an env file's text (see the module's comment).
pub fn parse_env(path: &Path, text: &str) -> Result<Variables, ConfigError> {
    let mut variables = BTreeMap::new();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((index, line)) = lines.next() {
        let number = index + 1;
        let at = |why: String| ConfigError(format!("{}:{number}: {why}", path.display()));
        let mut line = line.to_string();
        // A trailing backslash joins the next line (outside quotes, as systemd does).
        while line.ends_with('\\') && !line.trim_start().starts_with(['#', ';']) {
            line.pop();
            match lines.next() {
                Some((_, next)) => line.push_str(next),
                None => break,
            }
        }
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        let (key, value) = trimmed
            .split_once('=')
            .ok_or_else(|| at("not KEY=VALUE".into()))?;
        let key = key.trim();
        check_key(key).map_err(|e| at(e.to_string()))?;
        variables.insert(
            key.to_string(),
            parse_value(value.trim_start()).map_err(at)?,
        );
    }
    Ok(variables)
}

fn parse_value(value: &str) -> Result<String, String> {
    let Some(quote) = value.chars().next().filter(|c| *c == '"' || *c == '\'') else {
        if value.contains('\0') {
            return Err("a value may not hold a NUL byte".into());
        }
        return Ok(value.trim_end().to_string());
    };
    let mut out = String::new();
    let mut chars = value[1..].chars();
    loop {
        match chars.next() {
            None => return Err(format!("the value's {quote} is never closed")),
            Some(c) if c == quote => break,
            Some('\\') if quote == '"' => match chars.next() {
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(c @ ('"' | '\\' | '$' | '`')) => out.push(c),
                Some(c) => {
                    out.push('\\');
                    out.push(c);
                }
                None => return Err("the value ends inside an escape".into()),
            },
            Some(c) => out.push(c),
        }
    }
    let rest = chars.as_str().trim();
    if !rest.is_empty() && !rest.starts_with('#') {
        return Err(format!("`{rest}` after the closing quote"));
    }
    Ok(out)
}

/// Parses a release's secrets file: `KEY=NAME` lines (comments as in the env file).
pub fn parse_secret_map(path: &Path, text: &str) -> Result<SecretMap, ConfigError> {
    let mut map = BTreeMap::new();
    for (index, line) in text.lines().enumerate() {
        let at = |why: String| ConfigError(format!("{}:{}: {why}", path.display(), index + 1));
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        let (key, name) = trimmed
            .split_once('=')
            .ok_or_else(|| at("not KEY=SECRET_NAME".into()))?;
        check_key(key.trim()).map_err(|e| at(e.to_string()))?;
        check_secret_name(name.trim()).map_err(|e| at(e.to_string()))?;
        check_givable(name.trim()).map_err(|e| at(e.0))?;
        map.insert(key.trim().to_string(), name.trim().to_string());
    }
    Ok(map)
}

/// Whether a secret may be given to a process at all: the registry's login
/// (`registry-auth`) is the engine's alone, for pulling images, and reaches no process's
/// environment, whoever names it.
pub fn check_givable(name: &str) -> Result<(), ConfigError> {
    match name == super::container::REGISTRY_SECRET {
        true => Err(ConfigError(format!(
            "the secret {name} is the registry login rollgate pulls images with; no process is given it"
        ))),
        false => Ok(()),
    }
}

/// A secret's name becomes a file name under `ROOT/secrets/`.
pub fn check_secret_name(name: &str) -> Result<(), Fault> {
    crate::host::names::check_name("secret", name)
}

/// Refuses a secrets folder or file that group or others can read or write.
fn check_private(path: &Path, forbidden: u32, what: &str) -> Result<(), ConfigError> {
    let meta = std::fs::metadata(path).map_err(|e| {
        ConfigError(format!(
            "the secrets {what} {} cannot be read: {e} (set one with `rollgate secret set`)",
            path.display()
        ))
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & forbidden != 0 {
        return Err(ConfigError(format!(
            "the secrets {what} {} is mode {mode:o}: readable beyond its owner; chmod go-rwx it",
            path.display()
        )));
    }
    Ok(())
}

/// A secret's value (refused when missing or not private).
pub fn read_secret(secrets_dir: &Path, name: &str) -> Result<String, ConfigError> {
    check_secret_name(name).map_err(|e| ConfigError(e.to_string()))?;
    let path = secrets_dir.join(name);
    if !path.is_file() {
        return Err(ConfigError(format!(
            "the secret {name} is not set ({} is missing; `rollgate secret set {name}`)",
            path.display()
        )));
    }
    check_private(&path, 0o077, "file")?;
    let bytes = std::fs::read(&path)
        .map_err(|e| ConfigError(format!("cannot read the secret {name}: {e}")))?;
    String::from_utf8(bytes)
        .map_err(|_| ConfigError(format!("the secret {name} is not UTF-8 text")))
}

/// Every secret value of the root (for redacting them from quoted output), longest first.
pub fn known_values(secrets_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(secrets_dir) else {
        return Vec::new();
    };
    let mut values: Vec<String> = entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter(|v| v.len() >= 4)
        .collect();
    values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    values
}

/// `text` with every known secret value replaced by `[secret]`.
pub fn redact(text: &str, values: &[String]) -> String {
    let mut out = text.to_string();
    for value in values {
        if out.contains(value.as_str()) {
            out = out.replace(value.as_str(), "[secret]");
        }
    }
    out
}

/// Where a root's secrets are.
pub fn secrets_dir(root: &Path) -> PathBuf {
    root.join(SECRETS_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BTreeMap<String, String>, ConfigError> {
        parse_env(Path::new("env"), text)
    }

    #[test]
    fn systemd_environment_file_syntax() {
        let got = parse(
            "# a comment\n; another\n\nA=1\n  B = two words  \nC=\"quoted \\\"x\\\" \\n$HOME\"\nD='single $HOME'\nE=long\\\nline\nF=\n",
        )
        .unwrap();
        assert_eq!(got["A"], "1");
        assert_eq!(got["B"], "two words");
        assert_eq!(got["C"], "quoted \"x\" \n$HOME");
        assert_eq!(got["D"], "single $HOME");
        assert_eq!(got["E"], "longline");
        assert_eq!(got["F"], "");
    }

    #[test]
    fn what_cannot_be_parsed_is_refused_naming_file_and_line() {
        for (text, line, why) in [
            ("A=1\njust words\n", 2, "not KEY=VALUE"),
            ("1A=x\n", 1, "not a variable name"),
            ("A=\"open\n", 1, "never closed"),
            ("A=\"x\" y\n", 1, "after the closing quote"),
            ("PORT=80\n", 1, "set by rollgate"),
            ("ROLLGATE_VERSION=x\n", 1, "set by rollgate"),
        ] {
            let e = parse(text).unwrap_err().0;
            assert!(e.starts_with(&format!("env:{line}: ")), "{text:?}: {e}");
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn redaction_replaces_every_known_value() {
        let values = vec!["s3cr3t-value".to_string()];
        assert_eq!(
            redact("env: TOKEN=s3cr3t-value; again s3cr3t-value", &values),
            "env: TOKEN=[secret]; again [secret]"
        );
    }
}
