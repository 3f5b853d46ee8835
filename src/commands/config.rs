//! `rollgate config show|diff|set`: a release's configuration (its `env` file and `secrets`
//! map, see `host::config`). A config change is a release: `config set` makes a new release
//! from the live one (every file hard-linked, not copied; a new `env` and `secrets`), named
//! after it (`v2` -> `v2+c1` -> `v2+c2`), installed whole the way `release add` installs, and
//! then deployed through the gate like any release.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{refused, Error};
use crate::host::config::{self, Config};
use crate::host::state::Root;

/// What `config set` changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Change {
    /// `KEY=VALUE`: set in the env file.
    pub sets: Vec<(String, String)>,
    /// Removed from the env file and the secrets map.
    pub unsets: Vec<String>,
    /// `KEY=NAME`: KEY gets the secret NAME's value.
    pub secrets: Vec<(String, String)>,
}

impl Change {
    /// From the command line's words: `KEY=VALUE`, `--unset KEY`, `--secret KEY=NAME`.
    pub fn parse(sets: &[String], unsets: &[String], secrets: &[String]) -> Result<Change, Error> {
        let pair = |word: &String, what: &str| {
            word.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| refused(format!("`{word}` is not {what}")))
        };
        let change = Change {
            sets: sets
                .iter()
                .map(|w| pair(w, "KEY=VALUE"))
                .collect::<Result<_, _>>()?,
            unsets: unsets.to_vec(),
            secrets: secrets
                .iter()
                .map(|w| pair(w, "KEY=SECRET_NAME"))
                .collect::<Result<_, _>>()?,
        };
        for key in change
            .sets
            .iter()
            .map(|(k, _)| k)
            .chain(&change.unsets)
            .chain(change.secrets.iter().map(|(k, _)| k))
        {
            config::check_key(key)?;
        }
        for (_, name) in &change.secrets {
            config::check_secret_name(name)?;
        }
        if change.sets.is_empty() && change.unsets.is_empty() && change.secrets.is_empty() {
            return Err(refused(
                "nothing to change: give KEY=VALUE, --unset KEY or --secret KEY=NAME",
            ));
        }
        Ok(change)
    }

    fn apply(&self, mut config: Config) -> Config {
        for key in &self.unsets {
            config.variables.remove(key);
            config.secrets.remove(key);
        }
        for (key, value) in &self.sets {
            config.secrets.remove(key);
            config.variables.insert(key.clone(), value.clone());
        }
        for (key, name) in &self.secrets {
            config.variables.remove(key);
            config.secrets.insert(key.clone(), name.clone());
        }
        config
    }
}

/// The live release's version (the replicas' when the root is served by replicas).
pub fn live_version(root: &Root) -> Result<String, Error> {
    if let Some(set) = root.read_replicas()? {
        if let Some(first) = set.replicas.first() {
            return Ok(first.version.clone());
        }
    }
    root.read_pointer()?.map(|p| p.version).ok_or_else(|| {
        refused(format!(
            "nothing is live under {}: deploy a release first",
            root.0.display()
        ))
    })
}

fn release_config(root: &Root, version: &str) -> Result<Config, Error> {
    crate::host::names::check_name("version", version)?;
    let dir = root.release_dir(version);
    if !dir.is_dir() {
        return Err(refused(format!(
            "release {version} is not installed ({} is missing)",
            dir.display()
        )));
    }
    Config::of_release(&dir).map_err(|e| refused(e.0))
}

/// `config show`: the release's variables, secrets by name only.
pub fn show(root: &Path, version: Option<&str>) -> Result<String, Error> {
    let root = Root::existing(root.to_path_buf())?;
    let version = match version {
        Some(v) => v.to_string(),
        None => live_version(&root)?,
    };
    let config = release_config(&root, &version)?;
    let mut out = format!("# {version} (config {})\n", config.digest());
    for (key, value) in &config.variables {
        out.push_str(&format!("{key}={}\n", quoted(value)));
    }
    for (key, name) in &config.secrets {
        out.push_str(&format!("{key}=<secret {name}>\n"));
    }
    Ok(out)
}

/// A value as an env file would hold it.
fn quoted(value: &str) -> String {
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

/// `config diff A B`: what changed from A to B (secrets by name).
pub fn diff(root: &Path, a: &str, b: &str) -> Result<String, Error> {
    let root = Root::existing(root.to_path_buf())?;
    let (from, to) = (release_config(&root, a)?, release_config(&root, b)?);
    let view = |c: &Config| -> BTreeMap<String, String> {
        c.variables
            .iter()
            .map(|(k, v)| (k.clone(), quoted(v)))
            .chain(
                c.secrets
                    .iter()
                    .map(|(k, n)| (k.clone(), format!("<secret {n}>"))),
            )
            .collect()
    };
    let (from, to) = (view(&from), view(&to));
    let mut out = String::new();
    for (key, old) in &from {
        match to.get(key) {
            None => out.push_str(&format!("- {key}={old}\n")),
            Some(new) if new != old => out.push_str(&format!("~ {key}: {old} -> {new}\n")),
            Some(_) => {}
        }
    }
    for (key, new) in &to {
        if !from.contains_key(key) {
            out.push_str(&format!("+ {key}={new}\n"));
        }
    }
    if out.is_empty() {
        out.push_str(&format!("{a} and {b} have the same config\n"));
    }
    Ok(out)
}

/// The next config-change name of `live`: `v2` -> `v2+c1`, `v2+c1` -> `v2+c2` (past any
/// already installed).
fn next_version(root: &Root, live: &str) -> String {
    let base = match live.rsplit_once("+c") {
        Some((base, n)) if n.parse::<u64>().is_ok() => base,
        _ => live,
    };
    let mut n = 1;
    while root.release_dir(&format!("{base}+c{n}")).exists() {
        n += 1;
    }
    format!("{base}+c{n}")
}

/// `config set`'s first half: the new release, installed whole (staged, hard-linked, renamed
/// in). Returns (the live version it was made from, the new version). Refused (nothing made)
/// when a secret it names is not set.
pub fn make_release(
    root: &Path,
    service: &str,
    change: &Change,
    now: f64,
) -> Result<(String, String), Error> {
    crate::host::names::check_name("service", service)?;
    let root = Root::existing(root.to_path_buf())?;
    let live = live_version(&root)?;
    let config = change.apply(release_config(&root, &live)?);
    // Every secret it names must be there (and private) before anything is made.
    config
        .resolve(&config::secrets_dir(&root.0))
        .map_err(|e| refused(e.0))?;
    let version = next_version(&root, &live);
    let env = render_env(&config);
    let secrets: String = config
        .secrets
        .iter()
        .map(|(k, n)| format!("{k}={n}\n"))
        .collect();
    crate::release::install::derive(
        &root.0,
        service,
        &live,
        &version,
        &[(config::ENV_FILE, env), (config::SECRETS_FILE, secrets)],
        now,
    )?;
    Ok((live, version))
}

fn render_env(config: &Config) -> String {
    let mut out = String::from("# written by rollgate config set\n");
    for (key, value) in &config.variables {
        out.push_str(&format!("{key}={}\n", quoted(value)));
    }
    out
}
