//! The proxy config file (`rollgate proxy --config FILE`, TOML): the proxy's own settings under
//! the names of its flags (`tls_listen` for `--tls-listen`: one table in docs/proxy.md for
//! both) and one `[[route]]` per service:
//!
//! ```toml
//! listen = "0.0.0.0:80"
//!
//! [[route]]
//! host = ["example.com", "www.example.com"]   # or one name, "*.example.com", "*"
//! root = "/srv/app"                           # relative: to this file's folder
//!
//! [[route]]
//! host = "example.com"
//! path_prefix = "/api"                        # longest prefix wins; default "/"
//! strip_prefix = true                         # the release is sent /users, not /api/users
//! max_request_body = 1048576                  # bytes; a larger body is answered 413
//! root = "/srv/api"
//! service = "api"                             # default: the root folder's name
//! ```
//!
//! Everything is checked before anything is served: a key nobody reads, a host that is no
//! host, a root that is not a folder, two routes of one root (one route takes several hosts),
//! two routes for the same host and prefix — each refused at its line and column.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::certs::CertSpec;
use super::router::HostPattern;
use crate::host::state::Root;

/// A config file that cannot be served, where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the fault is the whole file (unreadable).
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file.display(),
                self.line,
                self.column,
                self.message
            )
        }
    }
}

impl std::error::Error for ConfigError {}

/// The file as written (before checking).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Written {
    listen: Option<Spanned<String>>,
    metrics_listen: Option<Spanned<String>>,
    tls_listen: Option<Spanned<String>>,
    #[serde(default)]
    tls_cert: Vec<Spanned<String>>,
    #[serde(default)]
    hsts: bool,
    acme_directory: Option<String>,
    #[serde(default)]
    acme_contact: Vec<String>,
    acme_ca_file: Option<PathBuf>,
    acme_state: Option<PathBuf>,
    #[serde(default)]
    acme_name: Vec<String>,
    acme_challenge: Option<Spanned<String>>,
    #[serde(default)]
    access_log: bool,
    access_log_max_bytes: Option<Spanned<u64>>,
    access_log_keep: Option<Spanned<u64>>,
    #[serde(default)]
    access_log_query: bool,
    access_log_sample: Option<Spanned<u64>>,
    #[serde(default)]
    route: Vec<Spanned<WrittenRoute>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WrittenRoute {
    host: Spanned<Hosts>,
    path_prefix: Option<Spanned<String>>,
    #[serde(default)]
    strip_prefix: bool,
    max_request_body: Option<Spanned<i64>>,
    root: Spanned<PathBuf>,
    service: Option<Spanned<String>>,
    access_log: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Hosts {
    One(String),
    Several(Vec<String>),
}

/// The proxy's settings a file may give (each also a flag; a flag given wins).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    pub listen: Option<std::net::SocketAddr>,
    pub metrics_listen: Option<std::net::SocketAddr>,
    pub tls_listen: Option<std::net::SocketAddr>,
    pub tls_certs: Vec<CertSpec>,
    pub hsts: bool,
    pub acme_directory: Option<String>,
    pub acme_contact: Vec<String>,
    pub acme_ca_file: Option<PathBuf>,
    pub acme_state: Option<PathBuf>,
    pub acme_names: Vec<String>,
    /// `http-01` or `tls-alpn-01`.
    pub acme_challenge: Option<String>,
    /// Every route logs its requests (a route's `access_log` says otherwise for it).
    pub access_log: bool,
    pub access_log_max_bytes: Option<u64>,
    pub access_log_keep: Option<u64>,
    pub access_log_query: bool,
    pub access_log_sample: Option<u64>,
}

/// The largest `max_request_body` a route may give: 16 GiB (a body of unknown length is held
/// in memory up to it, so a route with uploads that large should leave it unset).
pub const MAX_REQUEST_BODY_LIMIT: u64 = 16 << 30;

/// One route, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSpec {
    pub service: String,
    pub hosts: Vec<HostPattern>,
    pub prefix: String,
    pub strip_prefix: bool,
    /// The largest request body the route takes, in bytes (none: any).
    pub max_request_body: Option<u64>,
    /// Absolute and canonical: two spellings of one folder are one root.
    pub root: PathBuf,
    /// This route's `access_log` (none: the proxy's).
    pub access_log: Option<bool>,
}

/// A config file, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    pub file: PathBuf,
    pub settings: Settings,
    pub routes: Vec<RouteSpec>,
}

/// Reads and checks `file`.
pub fn read(file: &Path) -> Result<ProxyConfig, ConfigError> {
    let text = std::fs::read_to_string(file).map_err(|e| ConfigError {
        file: file.to_path_buf(),
        line: 0,
        column: 0,
        message: format!("cannot read the proxy config: {e}"),
    })?;
    parse(file, &text)
}

/// Where the config's values were written: an error names the file, line and column.
struct Source<'a> {
    file: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    /// The error `message` about the value written at `span`.
    fn at(&self, span: std::ops::Range<usize>, message: String) -> ConfigError {
        let (line, column) = line_and_column(self.text, span.start);
        ConfigError {
            file: self.file.to_path_buf(),
            line,
            column,
            message,
        }
    }
}

/// Checks `text`, the contents of `file` (relative roots are taken from the file's folder).
pub fn parse(file: &Path, text: &str) -> Result<ProxyConfig, ConfigError> {
    let source = Source { file, text };
    let written: Written = toml::from_str(text).map_err(|e| {
        // toml's message opens with its own "TOML parse error at line…" and a snippet; the
        // position is said once, in the file:line:column form, with toml's last words.
        let message = e.message().trim().to_string();
        source.at(e.span().unwrap_or(0..0), message)
    })?;
    let settings = settings(&source, &written)?;
    let routes = routes(&source, &written.route)?;
    Ok(ProxyConfig {
        file: file.to_path_buf(),
        settings,
        routes,
    })
}

/// The proxy's own settings, each checked where it was written.
fn settings(source: &Source<'_>, written: &Written) -> Result<Settings, ConfigError> {
    let file = source.file;
    let address = |value: &Option<Spanned<String>>, key: &str| {
        value
            .as_ref()
            .map(|v| {
                v.get_ref().parse::<std::net::SocketAddr>().map_err(|_| {
                    source.at(
                        v.span(),
                        format!(
                            "{key} = {:?} is not an address: expected IP:PORT, such as 0.0.0.0:443",
                            v.get_ref()
                        ),
                    )
                })
            })
            .transpose()
    };
    let mut settings = Settings {
        listen: address(&written.listen, "listen")?,
        metrics_listen: address(&written.metrics_listen, "metrics_listen")?,
        tls_listen: address(&written.tls_listen, "tls_listen")?,
        hsts: written.hsts,
        acme_directory: written.acme_directory.clone(),
        acme_contact: written.acme_contact.clone(),
        acme_ca_file: written.acme_ca_file.as_ref().map(|p| beside(file, p)),
        acme_state: written.acme_state.as_ref().map(|p| beside(file, p)),
        access_log: written.access_log,
        access_log_max_bytes: written.access_log_max_bytes.as_ref().map(|v| *v.get_ref()),
        access_log_keep: written.access_log_keep.as_ref().map(|v| *v.get_ref()),
        access_log_query: written.access_log_query,
        access_log_sample: written.access_log_sample.as_ref().map(|v| *v.get_ref()),
        acme_names: written
            .acme_name
            .iter()
            .map(|n| n.to_ascii_lowercase())
            .collect(),
        ..Settings::default()
    };
    // The rotation's bounds are the release output's (`output_max_bytes`, `output_keep`).
    if let Err(e) = crate::host::output::Rotation::from_policy(
        settings.access_log_max_bytes,
        settings.access_log_keep,
    ) {
        let keep = e.to_string().contains("output_keep");
        let span = match keep {
            true => written.access_log_keep.as_ref().map(|v| v.span()),
            false => written.access_log_max_bytes.as_ref().map(|v| v.span()),
        };
        return Err(source.at(
            span.unwrap_or(0..0),
            e.to_string()
                .replace("output_max_bytes", "access_log_max_bytes")
                .replace("output_keep", "access_log_keep"),
        ));
    }
    if let Some(sample) = written
        .access_log_sample
        .as_ref()
        .filter(|v| *v.get_ref() == 0)
    {
        return Err(source.at(
            sample.span(),
            "access_log_sample = 0: log one request in N, N at least 1 (1: every request)".into(),
        ));
    }
    if let Some(challenge) = &written.acme_challenge {
        match challenge.get_ref().as_str() {
            "http-01" | "tls-alpn-01" => {
                settings.acme_challenge = Some(challenge.get_ref().clone())
            }
            other => {
                return Err(source.at(
                    challenge.span(),
                    format!("acme_challenge = {other:?}: expected \"http-01\" or \"tls-alpn-01\""),
                ))
            }
        }
    }
    for cert in &written.tls_cert {
        let spec: CertSpec = cert
            .get_ref()
            .parse()
            .map_err(|e: super::certs::TlsError| {
                source.at(cert.span(), format!("tls_cert: {e}"))
            })?;
        settings.tls_certs.push(spec.relative_to(file));
    }
    Ok(settings)
}

/// The routes, each checked, and none taking what an earlier one takes (a root, a service
/// name, a host at the same path prefix).
fn routes(
    source: &Source<'_>,
    written: &[Spanned<WrittenRoute>],
) -> Result<Vec<RouteSpec>, ConfigError> {
    if written.is_empty() {
        return Err(ConfigError {
            file: source.file.to_path_buf(),
            line: 0,
            column: 0,
            message: "no [[route]]: a proxy config names at least one route (host and root)".into(),
        });
    }
    let mut routes: Vec<(RouteSpec, std::ops::Range<usize>)> = Vec::new();
    for written_route in written {
        let route = written_route.get_ref();
        let spec = route_spec(source, route)?;
        let span = written_route.span();
        no_clash(source, &routes, &spec, route, span.clone())?;
        routes.push((spec, span));
    }
    Ok(routes.into_iter().map(|(spec, _)| spec).collect())
}

/// One `[[route]]`, checked: its hosts, path prefix, root and service name.
fn route_spec(source: &Source<'_>, route: &WrittenRoute) -> Result<RouteSpec, ConfigError> {
    let hosts: Vec<String> = match route.host.get_ref() {
        Hosts::One(host) => vec![host.clone()],
        Hosts::Several(hosts) => hosts.clone(),
    };
    if hosts.is_empty() {
        return Err(source.at(
            route.host.span(),
            "host = []: name at least one host".into(),
        ));
    }
    let hosts = hosts
        .iter()
        .map(|h| HostPattern::parse(h))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| source.at(route.host.span(), format!("host: {e}")))?;
    let prefix = match &route.path_prefix {
        None => "/".to_string(),
        Some(prefix) => path_prefix(prefix.get_ref())
            .map_err(|e| source.at(prefix.span(), format!("path_prefix: {e}")))?,
    };
    let max_request_body = match &route.max_request_body {
        None => None,
        Some(limit) => match u64::try_from(*limit.get_ref()) {
            Ok(bytes) if bytes <= MAX_REQUEST_BODY_LIMIT => Some(bytes),
            _ => {
                return Err(source.at(
                    limit.span(),
                    format!(
                        "max_request_body: {} is no size in bytes; it must be 0 to {MAX_REQUEST_BODY_LIMIT}",
                        limit.get_ref()
                    ),
                ))
            }
        },
    };
    let written_root = route.root.get_ref();
    let root = Root::existing(beside(source.file, written_root))
        .and_then(|r| {
            std::fs::canonicalize(&r.0)
                .map_err(|_| crate::host::fault::Fault::NotARoot { path: r.0.clone() })
        })
        .map_err(|e| source.at(route.root.span(), format!("root: {e}")))?;
    let service = match &route.service {
        Some(name) => {
            let text = name.get_ref();
            crate::host::names::check_name("service", text)
                .map_err(|e| source.at(name.span(), e.to_string()))?;
            text.clone()
        }
        None => default_service_name(&root),
    };
    Ok(RouteSpec {
        service,
        hosts,
        prefix,
        strip_prefix: route.strip_prefix,
        max_request_body,
        root,
        access_log: route.access_log,
    })
}

/// Err when `spec` takes what a route written before it takes.
fn no_clash(
    source: &Source<'_>,
    earlier_routes: &[(RouteSpec, std::ops::Range<usize>)],
    spec: &RouteSpec,
    route: &WrittenRoute,
    span: std::ops::Range<usize>,
) -> Result<(), ConfigError> {
    for (earlier, earlier_span) in earlier_routes {
        let (line, _) = line_and_column(source.text, earlier_span.start);
        if earlier.root == spec.root {
            return Err(source.at(
                route.root.span(),
                format!(
                    "root {} is already served by the route at line {line}; one root is one route (a route takes several hosts: host = [\"a\", \"b\"])",
                    spec.root.display()
                ),
            ));
        }
        if earlier.service == spec.service {
            return Err(source.at(
                span,
                format!(
                    "service {:?} is already the route's at line {line}; give this one another `service` name",
                    spec.service
                ),
            ));
        }
        if let Some(host) = spec
            .hosts
            .iter()
            .find(|h| earlier.prefix == spec.prefix && earlier.hosts.contains(h))
        {
            return Err(source.at(
                route.host.span(),
                format!(
                    "host {host} with path_prefix {:?} is already the route's at line {line}",
                    spec.prefix
                ),
            ));
        }
    }
    Ok(())
}

/// A route's service name when it gives none (and `--root`'s): the root folder's name.
pub fn default_service_name(root: &Path) -> String {
    root.file_name()
        .map_or_else(|| "root".to_string(), |n| n.to_string_lossy().into_owned())
}

/// A path prefix as the router compares it: from `/`, without a trailing `/` (but `/`).
fn path_prefix(text: &str) -> Result<String, String> {
    if !text.starts_with('/') || text.contains(['?', '#', ' ']) || text.contains("//") {
        return Err(format!(
            "{text:?} is not a path prefix: expected a path from its `/`, such as /api, with no query"
        ));
    }
    let trimmed = text.trim_end_matches('/');
    Ok(if trimmed.is_empty() {
        "/".into()
    } else {
        trimmed.into()
    })
}

/// `path` as written in `file`: a relative one is taken from the file's folder.
fn beside(file: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        return path.to_path_buf();
    }
    match file.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder.join(path),
        _ => path.to_path_buf(),
    }
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
fn line_and_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for name in ["app", "api", "admin"] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
        }
        dir
    }

    fn parsed(dir: &Path, text: &str) -> Result<ProxyConfig, ConfigError> {
        parse(&dir.join("proxy.toml"), text)
    }

    #[test]
    fn a_route_s_max_request_body_is_a_size_in_bytes_refused_at_its_line_otherwise() {
        let dir = folder();
        let route = |limit: &str| {
            parsed(
                dir.path(),
                &format!(
                    "[[route]]\nhost = \"a.test\"\nroot = \"app\"\nmax_request_body = {limit}\n"
                ),
            )
        };
        assert_eq!(
            route("1048576").unwrap().routes[0].max_request_body,
            Some(1 << 20)
        );
        assert_eq!(route("0").unwrap().routes[0].max_request_body, Some(0));
        for bad in ["-1", "17179869185"] {
            let e = route(bad).unwrap_err();
            assert_eq!(e.line, 4, "{bad}: {e:?}");
            assert!(e.message.starts_with("max_request_body: "), "{bad}: {e:?}");
            assert!(e.message.contains("0 to 17179869184"), "{bad}: {e:?}");
        }
        let e = route("\"1M\"").unwrap_err();
        assert_eq!(e.line, 4, "{e:?}");
    }

    #[test]
    fn routes_with_their_defaults_and_relative_roots() {
        let dir = folder();
        let config = parsed(
            dir.path(),
            r#"
listen = "127.0.0.1:8080"
[[route]]
host = ["example.com", "*.example.com"]
root = "app"
[[route]]
host = "example.com"
path_prefix = "/api/"
strip_prefix = true
root = "api"
service = "the-api"
"#,
        )
        .unwrap();
        assert_eq!(
            config.settings.listen,
            Some("127.0.0.1:8080".parse().unwrap())
        );
        let [app, api] = &config.routes[..] else {
            panic!("two routes")
        };
        assert_eq!(app.service, "app");
        assert_eq!(app.prefix, "/");
        assert_eq!(app.hosts.len(), 2);
        assert_eq!(
            app.root,
            std::fs::canonicalize(dir.path().join("app")).unwrap()
        );
        assert_eq!(
            (api.service.as_str(), api.prefix.as_str()),
            ("the-api", "/api")
        );
        assert!(api.strip_prefix);
    }

    #[test]
    fn each_fault_is_said_at_its_line_and_column() {
        let dir = folder();
        let fault = |text: &str| {
            let e = parsed(dir.path(), text).unwrap_err();
            (e.line, e.column, e.message)
        };
        let (line, column, message) = fault("[[route]]\nhost = \"a\"\nroot = \"missing\"\n");
        assert_eq!((line, column), (3, 8), "{message}");
        assert!(
            message.contains("not a folder") || message.contains("missing"),
            "{message}"
        );

        let (line, _, message) = fault("[[route]]\nhost = \"a b\"\nroot = \"app\"\n");
        assert_eq!(line, 2, "{message}");
        assert!(message.contains("not a host name"), "{message}");

        let (line, column, message) = fault("[[route]]\nhost = \"a\"\nroot = \"app\"\nport = 8\n");
        assert_eq!((line, column), (4, 1), "{message}");
        assert!(message.contains("unknown field `port`"), "{message}");

        let (line, _, message) = fault("[[route]\nhost = \"a\"\n");
        assert_eq!(line, 1, "{message}");

        let (line, _, message) = fault(
            "[[route]]\nhost = \"a\"\nroot = \"app\"\n[[route]]\nhost = \"b\"\nroot = \"./app/\"\n",
        );
        assert_eq!(line, 6, "{message}");
        assert!(
            message.contains("already served by the route at line 1"),
            "{message}"
        );

        let (line, _, message) = fault(
            "[[route]]\nhost = \"a\"\nroot = \"app\"\n[[route]]\nhost = [\"b\", \"A\"]\nroot = \"api\"\n",
        );
        assert_eq!(line, 5, "{message}");
        assert!(
            message.contains("host a with path_prefix \"/\""),
            "{message}"
        );

        let (_, _, message) =
            fault("[[route]]\nhost = \"a\"\nroot = \"app\"\npath_prefix = \"api\"\n");
        assert!(message.contains("not a path prefix"), "{message}");

        let (line, _, message) = fault("listen = \"localhost\"\n");
        assert_eq!(line, 1);
        assert!(message.contains("not an address"), "{message}");

        let e = parsed(dir.path(), "hsts = true\n").unwrap_err();
        assert!(e.message.contains("no [[route]]"), "{}", e.message);
    }

    #[test]
    fn a_position_is_counted_in_characters_from_one() {
        assert_eq!(line_and_column("ab\ncé d", 7), (2, 4));
        assert_eq!(line_and_column("x", 0), (1, 1));
    }
}
