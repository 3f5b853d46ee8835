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
            config::check_givable(name).map_err(|e| refused(e.0))?;
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
    let staged = root.0.join(config::STAGED_DIR);
    let (version, config) = match version {
        Some(v) => (v.to_string(), release_config(&root, v)?),
        None => match live_version(&root) {
            Ok(live) => {
                let config = release_config(&root, &live)?;
                (live, config)
            }
            // Before the first deploy: the staged config, if there is one.
            Err(nothing_live) if !staged.is_dir() => return Err(nothing_live),
            Err(_) => (
                "staged, for the first release deployed".to_string(),
                Config::of_release(&staged).map_err(|e| refused(e.0))?,
            ),
        },
    };
    let mut out = format!("# {version} (config {})\n", config.digest());
    for (key, value) in &config.variables {
        out.push_str(&format!("{key}={}\n", config::env_quoted(value)));
    }
    for (key, name) in &config.secrets {
        out.push_str(&format!("{key}=<secret {name}>\n"));
    }
    Ok(out)
}

/// `config diff A B`: what changed from A to B (secrets by name).
pub fn diff(root: &Path, a: &str, b: &str) -> Result<String, Error> {
    let root = Root::existing(root.to_path_buf())?;
    let (from, to) = (release_config(&root, a)?, release_config(&root, b)?);
    let view = |c: &Config| -> BTreeMap<String, String> {
        c.variables
            .iter()
            .map(|(k, v)| (k.clone(), config::env_quoted(v)))
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
    let (env, secrets) = config.files("rollgate config set");
    // The new release carries its config: it is its own, not the live one's adopted.
    crate::release::install::derive(
        &root.0,
        service,
        &live,
        &version,
        &[
            (config::ENV_FILE, env),
            (config::SECRETS_FILE, secrets),
            (config::ADOPTED_FILE, String::new()),
        ],
        now,
    )?;
    Ok((live, version))
}

/// `config set --no-deploy` on a root where nothing is live yet: the change is made to the
/// service's staged config (`ROOT/config/`), which the first release deployed gets. Refused
/// (nothing written) when a secret it names is not set.
pub fn stage(root: &Path, service: &str, change: &Change) -> Result<String, Error> {
    crate::host::names::check_name("service", service)?;
    let root = Root::existing(root.to_path_buf())?;
    let folder = root.0.join(config::STAGED_DIR);
    let config = change.apply(Config::of_release(&folder).map_err(|e| refused(e.0))?);
    config
        .resolve(&config::secrets_dir(&root.0))
        .map_err(|e| refused(e.0))?;
    let (env, secrets) = config.files("rollgate config set --no-deploy");
    let written = |e: crate::host::files::WriteError| Error::Failed(e.to_string());
    std::fs::create_dir_all(&folder)
        .map_err(|e| Error::Failed(format!("cannot make {}: {e}", folder.display())))?;
    crate::host::files::write_atomically(&folder.join(config::ENV_FILE), env.as_bytes())
        .map_err(written)?;
    crate::host::files::write_atomically(&folder.join(config::SECRETS_FILE), secrets.as_bytes())
        .map_err(written)?;
    Ok(format!(
        "nothing of {service} is live yet: the config is staged (config {}) in {}; the first release deployed gets it",
        config.digest(),
        folder.display()
    ))
}

/// The config a candidate starts with, and the live release's beside it.
#[derive(Debug, Clone, PartialEq)]
pub struct CandidateConfig {
    pub version: String,
    /// Where it comes from: the release's own, or given from the service's (the live
    /// release's, or the staged one before any release is live).
    pub origin: config::Origin,
    pub config: Config,
    /// The live release and its config (none before the first deploy).
    pub live: Option<(String, Config)>,
}

/// Heroku's rule: config belongs to the service, and a release is code plus the service's
/// config at its deploy. A release that carries its own config keeps it; one that carries none
/// (or carries what an earlier deploy gave it) gets the live release's, else the staged one.
pub fn for_candidate(root: &Root, version: &str) -> Result<CandidateConfig, Error> {
    let dir = root.release_dir(version);
    // A live release whose folder is gone (put in by hand, or a crash recovery has yet to
    // settle) gives nothing.
    let live = match live_version(root) {
        Ok(live) if root.release_dir(&live).is_dir() => {
            Some((live.clone(), release_config(root, &live)?))
        }
        Ok(_) | Err(_) => None,
    };
    let live_missing = live.is_none() && live_version(root).is_ok();
    let own = config::Origin::of_release(&dir);
    let (origin, config) = match (&own, &live) {
        (config::Origin::Own, _) => (own.clone(), release_config(root, version)?),
        (_, Some((live_version, live_config))) if live_version != version => (
            config::Origin::Adopted(live_version.clone()),
            live_config.clone(),
        ),
        // Deployed again while live: it keeps what it has.
        (_, Some(_)) => (own.clone(), release_config(root, version)?),
        (_, None) if live_missing => (own.clone(), release_config(root, version)?),
        (_, None) => {
            let staged =
                Config::of_release(&root.0.join(config::STAGED_DIR)).map_err(|e| refused(e.0))?;
            match staged == Config::default() {
                true => (config::Origin::None, staged),
                false => (config::Origin::Adopted("staged".into()), staged),
            }
        }
    };
    Ok(CandidateConfig {
        version: version.to_string(),
        origin,
        config,
        live,
    })
}

impl CandidateConfig {
    /// Writes what the candidate gets into its folder, when it is given the service's: the
    /// mark first, then each file whole (a crash between them leaves a release marked as given
    /// config, which the next deploy gives again). A release that carries its own is not
    /// touched.
    pub fn give(&self, root: &Root) -> Result<(), Error> {
        let config::Origin::Adopted(from) = &self.origin else {
            return Ok(());
        };
        let dir = root.release_dir(&self.version);
        if self.config == Config::default() {
            // Nothing to give: a release with no files has no config (what an earlier deploy
            // gave it goes, its mark last).
            for name in [config::ENV_FILE, config::SECRETS_FILE, config::ADOPTED_FILE] {
                if dir.join(config::ADOPTED_FILE).exists() {
                    match std::fs::remove_file(dir.join(name)) {
                        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                            return Err(Error::Failed(format!(
                                "cannot remove {}: {e}",
                                dir.join(name).display()
                            )))
                        }
                        _ => {}
                    }
                }
            }
            return Ok(());
        }
        let write = |name: &str, text: &str| {
            crate::host::files::write_atomically(&dir.join(name), text.as_bytes())
                .map_err(|e| Error::Failed(e.to_string()))
        };
        let (env, secrets) = self.config.files(&format!(
            "rollgate deploy: the service's config, from {from}"
        ));
        write(config::ADOPTED_FILE, &format!("{from}\n"))?;
        write(config::ENV_FILE, &env)?;
        write(config::SECRETS_FILE, &secrets)
    }

    /// Whether there is any config to speak of: the candidate's or the live one's.
    pub fn is_empty(&self) -> bool {
        self.config == Config::default()
            && self
                .live
                .as_ref()
                .is_none_or(|(_, c)| *c == Config::default())
    }

    /// One line: which config the candidate gets and how it differs from the live one.
    pub fn said(&self) -> String {
        let which = match &self.origin {
            config::Origin::None => return format!("{} starts with no config", self.version),
            config::Origin::Adopted(from) if self.config == Config::default() => {
                return format!("{} starts with no config ({from} has none)", self.version)
            }
            config::Origin::Own => format!("its own config (config {})", self.config.digest()),
            config::Origin::Adopted(from) if from == "staged" => format!(
                "the service's staged config (config {}, from config set --no-deploy)",
                self.config.digest()
            ),
            config::Origin::Adopted(from) => format!(
                "the live release {from}'s config (config {}), as a new code release does",
                self.config.digest()
            ),
        };
        let against = match &self.live {
            None => String::new(),
            Some((live, live_config)) => match self.config.changes_from(live_config) {
                changes if changes.is_empty() => format!("; the same as live {live}'s"),
                changes => format!("; against live {live}'s: {}", changes.join(", ")),
            },
        };
        format!("{} gets {which}{against}", self.version)
    }
}
