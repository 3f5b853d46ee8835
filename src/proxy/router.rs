//! Which service a request is for: the proxy config's routes (`config.rs`) by host name and
//! path prefix, as kamal-proxy's router does it. A host is matched exactly first, then by the
//! wildcard `*.domain` (one label), then by `*` (any host); among the routes of that host the
//! longest path prefix wins. `--root` is one route for every host and path.
//!
//! The table changes only on a reload and is read on every request, so each serving thread
//! keeps its own copy ([`Local`]), checked against one generation number: a request reads one
//! atomic and takes no shared lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::service::Service;
use super::wire::host_name_bytes;

/// A route's host: an exact name (lowercase, no port), `*.domain`, or any host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    Exact(String),
    /// `*.example.com`: one label before `.example.com` (kept with its leading dot).
    Wildcard(String),
    Any,
}

/// A route's `host` that is no host name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{given}` is not a host name: expected a name such as app.example.com, a wildcard such as *.example.com, or * for any host (no port, no scheme)")]
pub struct NotAHost {
    pub given: String,
}

impl HostPattern {
    /// Reads a host as a config writes it; Err says what is allowed.
    pub fn parse(text: &str) -> Result<HostPattern, NotAHost> {
        let host = text.trim().to_ascii_lowercase();
        if host == "*" {
            return Ok(HostPattern::Any);
        }
        let (wild, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host.as_str()),
        };
        let label_ok = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
            return Err(NotAHost {
                given: text.to_string(),
            });
        }
        Ok(if wild {
            HostPattern::Wildcard(format!(".{name}"))
        } else {
            HostPattern::Exact(name.to_string())
        })
    }

    /// How well `host` (lowercase, no port) matches: exact 2, wildcard 1, any 0; None: not.
    /// Compared as bytes, in any case: no copy of the host is made per request.
    fn rank(&self, host: &[u8]) -> Option<u8> {
        match self {
            HostPattern::Exact(name) => host.eq_ignore_ascii_case(name.as_bytes()).then_some(2),
            HostPattern::Wildcard(suffix) => {
                let suffix = suffix.as_bytes();
                let cut = host.len().checked_sub(suffix.len())?;
                let label = &host[..cut];
                (host[cut..].eq_ignore_ascii_case(suffix)
                    && !label.is_empty()
                    && !label.contains(&b'.'))
                .then_some(1)
            }
            HostPattern::Any => Some(0),
        }
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPattern::Exact(name) => f.write_str(name),
            HostPattern::Wildcard(suffix) => write!(f, "*{suffix}"),
            HostPattern::Any => f.write_str("*"),
        }
    }
}

/// One route: the hosts and the path prefix it takes, and the service it goes to.
pub struct Route {
    pub hosts: Vec<HostPattern>,
    /// Starts with `/`; no trailing `/` but for `/` itself.
    pub prefix: String,
    /// The prefix is cut off the path the release is sent (`/api/users` → `/users`).
    pub strip_prefix: bool,
    /// The largest request body the route takes, in bytes (`max_request_body`; none: any).
    pub max_request_body: Option<u64>,
    pub service: Arc<Service>,
}

impl Route {
    /// Whether `path` (from its `/`, query included) is under this route's prefix: the prefix
    /// itself, or it followed by `/`, `?` (so `/api` takes `/api/x` and `/api?q`, never
    /// `/apix`).
    fn takes(&self, path: &[u8]) -> bool {
        let prefix = self.prefix.as_bytes();
        prefix == b"/"
            || (path.starts_with(prefix)
                && matches!(path.get(prefix.len()), None | Some(b'/') | Some(b'?')))
    }

    /// The path the release is sent: with the prefix cut off when the route says so.
    pub fn forwarded<'a>(&self, path: &'a str) -> std::borrow::Cow<'a, str> {
        if !self.strip_prefix || self.prefix == "/" {
            return path.into();
        }
        match path.get(self.prefix.len()..) {
            Some(rest) if rest.starts_with('/') => rest.into(),
            Some(rest) => format!("/{rest}").into(),
            None => path.into(),
        }
    }
}

/// What a request was routed to.
pub enum Picked<'a> {
    Route(&'a Route),
    /// No route takes this host (or this path of it): 404.
    NoRoute,
}

/// The routes of one configuration.
pub struct Router {
    pub routes: Vec<Route>,
    /// One route for everything (`--root`): nothing to match.
    single: bool,
    /// Host names are matched against the routes (a config); false for `--root`, where the
    /// TLS name and the Host header need not agree.
    pub by_host: bool,
}

impl Router {
    /// `--root`'s router: one service for every host and path.
    pub fn single(service: Arc<Service>) -> Router {
        Router {
            routes: vec![Route {
                hosts: vec![HostPattern::Any],
                prefix: "/".into(),
                strip_prefix: false,
                max_request_body: None,
                service,
            }],
            single: true,
            by_host: false,
        }
    }

    /// A config's router.
    pub fn of(routes: Vec<Route>) -> Router {
        Router {
            routes,
            single: false,
            by_host: true,
        }
    }

    /// The route for a request to `host` (its Host header or `:authority`, any case, port
    /// allowed) and `path`.
    pub fn pick(&self, host: &[u8], path: &[u8]) -> Picked<'_> {
        if self.single {
            return Picked::Route(&self.routes[0]);
        }
        let host = host_name_bytes(host);
        let mut best: Option<(u8, usize, &Route)> = None;
        for route in &self.routes {
            let Some(rank) = route.hosts.iter().filter_map(|h| h.rank(host)).max() else {
                continue;
            };
            if !route.takes(path) {
                continue;
            }
            let key = (rank, route.prefix.len());
            if best.is_none_or(|(r, l, _)| key > (r, l)) {
                best = Some((rank, route.prefix.len(), route));
            }
        }
        match best {
            Some((_, _, route)) => Picked::Route(route),
            None => Picked::NoRoute,
        }
    }

    /// Whether a request for `host` on a TLS connection set up for `sni` (lowercase) belongs on
    /// another connection (421, RFC 9110 §15.5.20): only where routes go by host name, since
    /// `--root` serves every name alike.
    pub fn misdirected(&self, host: &[u8], sni: Option<&str>) -> bool {
        self.by_host
            && sni.is_some_and(|sni| !host_name_bytes(host).eq_ignore_ascii_case(sni.as_bytes()))
    }

    /// Whether some route takes requests for `host` (lowercase, no port) at any path:
    /// always, for `--root`.
    pub fn has_host(&self, host: &[u8]) -> bool {
        !self.by_host
            || self
                .routes
                .iter()
                .any(|route| route.hosts.iter().any(|h| h.rank(host).is_some()))
    }

    /// Every service of this configuration, each once.
    pub fn services(&self) -> Vec<Arc<Service>> {
        let mut services: Vec<Arc<Service>> = Vec::new();
        for route in &self.routes {
            if !services.iter().any(|s| s.id == route.service.id) {
                services.push(route.service.clone());
            }
        }
        services
    }
}

/// The router in force, shared by every thread; replaced whole by a reload.
pub struct Current {
    router: RwLock<Arc<Router>>,
    generation: AtomicU64,
}

impl Current {
    pub fn new(router: Router) -> Current {
        Current {
            router: RwLock::new(Arc::new(router)),
            generation: AtomicU64::new(1),
        }
    }

    /// Puts `router` in force for new requests; requests already routed keep what they had.
    pub fn replace(&self, router: Router) {
        let mut slot = self.router.write().unwrap_or_else(|p| p.into_inner());
        *slot = Arc::new(router);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    pub fn get(&self) -> Arc<Router> {
        self.router
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A serving thread's copy of the router in force.
pub struct Local {
    current: Arc<Current>,
    copy: Mutex<(u64, Arc<Router>)>,
}

impl Local {
    pub fn new(current: Arc<Current>) -> Local {
        let copy = Mutex::new((current.generation.load(Ordering::SeqCst), current.get()));
        Local { current, copy }
    }

    /// Runs `f` on the router in force (this thread's copy, taken again when a reload moved
    /// it); no reference count shared with other threads moves.
    pub fn with<R>(&self, f: impl FnOnce(&Router) -> R) -> R {
        let mut copy = self.copy.lock().unwrap_or_else(|p| p.into_inner());
        let generation = self.current.generation.load(Ordering::SeqCst);
        if copy.0 != generation {
            *copy = (generation, self.current.get());
        }
        f(&copy.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str) -> Arc<Service> {
        let dir =
            std::env::temp_dir().join(format!("rollgate-router-{name}-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        Arc::new(Service::new(
            name.into(),
            crate::host::state::Root(dir),
            1,
            None,
        ))
    }

    fn route(hosts: &[&str], prefix: &str, strip: bool, name: &str) -> Route {
        Route {
            hosts: hosts
                .iter()
                .map(|h| HostPattern::parse(h).unwrap())
                .collect(),
            prefix: prefix.into(),
            strip_prefix: strip,
            max_request_body: None,
            service: service(name),
        }
    }

    fn picked(router: &Router, host: &str, path: &str) -> Option<String> {
        match router.pick(host.as_bytes(), path.as_bytes()) {
            Picked::Route(route) => Some(route.service.name.clone()),
            Picked::NoRoute => None,
        }
    }

    #[test]
    fn exact_host_beats_wildcard_beats_any_and_the_longest_prefix_wins() {
        let router = Router::of(vec![
            route(&["*"], "/", false, "fallback"),
            route(&["*.example.com"], "/", false, "wild"),
            route(&["app.example.com"], "/", false, "app"),
            route(&["app.example.com"], "/api", true, "api"),
            route(&["app.example.com"], "/api/admin", false, "admin"),
        ]);
        assert_eq!(
            picked(&router, "app.example.com", "/").as_deref(),
            Some("app")
        );
        assert_eq!(
            picked(&router, "APP.example.com:8443", "/x").as_deref(),
            Some("app")
        );
        assert_eq!(
            picked(&router, "app.example.com", "/api").as_deref(),
            Some("api")
        );
        assert_eq!(
            picked(&router, "app.example.com", "/api?x=1").as_deref(),
            Some("api")
        );
        assert_eq!(
            picked(&router, "app.example.com", "/api/v1").as_deref(),
            Some("api")
        );
        assert_eq!(
            picked(&router, "app.example.com", "/apix").as_deref(),
            Some("app")
        );
        assert_eq!(
            picked(&router, "app.example.com", "/api/admin/x").as_deref(),
            Some("admin")
        );
        assert_eq!(
            picked(&router, "other.example.com", "/api").as_deref(),
            Some("wild")
        );
        // One label only: a.b.example.com is not under *.example.com.
        assert_eq!(
            picked(&router, "a.b.example.com", "/").as_deref(),
            Some("fallback")
        );
        assert_eq!(
            picked(&router, "example.com", "/").as_deref(),
            Some("fallback")
        );
    }

    #[test]
    fn a_host_no_route_takes_is_no_route() {
        let router = Router::of(vec![route(&["app.example.com"], "/api", false, "api")]);
        assert!(picked(&router, "else.example.com", "/api").is_none());
        assert!(picked(&router, "app.example.com", "/").is_none());
        assert!(picked(&router, "", "/api").is_none());
    }

    #[test]
    fn a_stripped_prefix_leaves_a_path_from_its_slash() {
        let api = route(&["a"], "/api", true, "strip");
        assert_eq!(api.forwarded("/api/users?x=1"), "/users?x=1");
        assert_eq!(api.forwarded("/api"), "/");
        assert_eq!(api.forwarded("/api?x=1"), "/?x=1");
        let kept = route(&["a"], "/api", false, "kept");
        assert_eq!(kept.forwarded("/api/users"), "/api/users");
    }

    #[test]
    fn host_patterns_are_read_without_case_and_refuse_a_scheme_or_port() {
        assert!(HostPattern::parse("https://a.com").is_err());
        assert!(HostPattern::parse("a.com:80").is_err());
        assert!(HostPattern::parse("*.").is_err());
        assert_eq!(
            HostPattern::parse("*.Example.com").unwrap().to_string(),
            "*.example.com"
        );
    }
}
