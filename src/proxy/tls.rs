//! TLS on the proxy's front (issue 47): the certificates it serves, chosen by the name a client
//! asks for (SNI), and the connections that come in over `--tls-listen`.
//!
//! - A certificate is given as `NAME=CERT,KEY` (PEM files: the chain, leaf first, and its
//!   private key). NAME is a host name, a wildcard `*.example.com` (one label deep, as browsers
//!   match it), or `default`: the one certificate served to a client that names no host or a
//!   host nothing else covers. Without a `default` such a client gets a TLS alert, so no
//!   certificate ever leaks a name the client did not ask for.
//! - Every file is read and checked at start (the key must match the certificate): a bad one
//!   refuses the start, naming the file and why. SIGHUP reads them all again; a set with any bad
//!   file is not taken (the one serving goes on, and the reason is logged), so replacing a
//!   certificate on disk and sending SIGHUP never drops a connection nor serves a broken file.
//! - TLS 1.3 and 1.2 only (rustls offers nothing older), the protocol by ALPN: `h2` is served by
//!   hyper's HTTP/2 server with bounded streams, headers and resets (CVE-2023-44487),
//!   `http/1.1` (or no ALPN) by its HTTP/1 server. Either way each request goes through
//!   `forward::handle` to the releases as every request does: HTTP/1.1 over kept connections,
//!   counted per release.
//! - A handshake must finish within the header read timeout (a client that opens a connection
//!   and never finishes its hello holds a slot no longer than one that never sends a head).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use hyper::header::{HeaderValue, HOST, LOCATION, STRICT_TRANSPORT_SECURITY};
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use super::forward::{self, Shared};
use super::front;

/// The name that serves clients no other certificate covers.
pub const DEFAULT_NAME: &str = "default";

/// The ALPN protocol of TLS-ALPN-01 (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// Most streams one HTTP/2 client may have open at once (nginx's `http2_max_concurrent_streams`
/// default).
const H2_MAX_STREAMS: u32 = 128;
/// Streams a client may reset before the server has accepted them, at once (hyper's default,
/// set here so it is a decision: the rapid-reset flood of CVE-2023-44487 ends in a GOAWAY).
const H2_MAX_PENDING_RESETS: usize = 20;
/// Resets the server itself may send on one connection before it closes it.
const H2_MAX_LOCAL_RESETS: usize = 1024;
/// `Strict-Transport-Security` with `--hsts`: a year, as the HSTS preload list asks.
const HSTS: &str = "max-age=31536000";
/// The same as a header line, as `front.rs` writes it into an answer's head.
pub(super) const HSTS_LINE: &[u8] = b"strict-transport-security: max-age=31536000\r\n";

/// `answer` with `Strict-Transport-Security` set when `hsts` (hyper's side of a TLS
/// connection; `front.rs` writes [`HSTS_LINE`] itself).
pub(super) async fn with_hsts<E>(
    answer: impl std::future::Future<Output = Result<Response<forward::Body>, E>>,
    hsts: bool,
) -> Result<Response<forward::Body>, E> {
    let mut response = answer.await?;
    if hsts {
        response
            .headers_mut()
            .insert(STRICT_TRANSPORT_SECURITY, HeaderValue::from_static(HSTS));
    }
    Ok(response)
}

/// `NAME=CERT,KEY` from the command line (or the config file).
#[derive(Debug, Clone, PartialEq)]
pub struct CertSpec {
    pub name: String,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What is wrong with a certificate setting or its files.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TlsError {
    #[error("--tls-cert {given:?}: {why}; give NAME=CERT,KEY (NAME a host name, *.domain or `default`; CERT and KEY PEM files)")]
    Spec { given: String, why: String },
    #[error("{}: {why}", path.display())]
    File { path: PathBuf, why: String },
    #[error("--tls-cert names {name} twice; give each name once")]
    Twice { name: String },
    #[error(
        "--tls-listen is given but no --tls-cert: a TLS listener needs at least one certificate"
    )]
    NoCertificate,
    #[error("cannot set up TLS: {0}")]
    Setup(String),
}

impl CertSpec {
    /// The same certificate with relative files taken from `file`'s folder (a config file's
    /// `tls_cert`).
    pub fn relative_to(self, file: &std::path::Path) -> CertSpec {
        let folder = file.parent().filter(|f| !f.as_os_str().is_empty());
        let beside = |path: PathBuf| match folder {
            Some(folder) if path.is_relative() => folder.join(path),
            _ => path,
        };
        CertSpec {
            name: self.name,
            cert: beside(self.cert),
            key: beside(self.key),
        }
    }
}

impl std::str::FromStr for CertSpec {
    type Err = TlsError;

    fn from_str(given: &str) -> Result<CertSpec, TlsError> {
        let spec = |why: &str| TlsError::Spec {
            given: given.to_string(),
            why: why.to_string(),
        };
        let (name, files) = given.split_once('=').ok_or_else(|| spec("no `=`"))?;
        let (cert, key) = files
            .split_once(',')
            .ok_or_else(|| spec("no `,` between CERT and KEY"))?;
        let name = name.trim().to_ascii_lowercase();
        let host = name.strip_prefix("*.").unwrap_or(&name);
        let valid_host = !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            });
        if !valid_host {
            return Err(spec(
                "NAME is not a host name, a wildcard *.domain or `default`",
            ));
        }
        if name.starts_with("*.") && !host.contains('.') {
            return Err(spec(
                "a wildcard covers one label under a domain of two or more (*.example.com)",
            ));
        }
        if cert.is_empty() || key.is_empty() {
            return Err(spec("CERT and KEY are both needed"));
        }
        Ok(CertSpec {
            name,
            cert: PathBuf::from(cert),
            key: PathBuf::from(key),
        })
    }
}

/// What is served for one configured name, as `status` and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CertInfo {
    /// The name it is served for (`--tls-cert NAME=...`).
    pub name: String,
    /// The leaf's subject and issuer (RFC 4514 strings).
    pub subject: String,
    pub issuer: String,
    /// Its validity, in Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    /// The DNS names it is for (its subjectAltName).
    #[serde(default)]
    pub dns_names: Vec<String>,
    /// Where it comes from: `file` (and the file).
    pub source: String,
    pub file: PathBuf,
}

/// The certificates served, by the name they are served for.
#[derive(Debug, Default)]
pub struct Certificates {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` kept as `example.com`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
    infos: Vec<CertInfo>,
}

impl Certificates {
    /// Reads and checks every file; the first bad one is the error. `now`: Unix seconds (a
    /// certificate outside its validity then is refused).
    pub fn load(specs: &[CertSpec], now: i64) -> Result<Certificates, TlsError> {
        let mut certificates = Certificates::default();
        for spec in specs {
            let (key, info) = certified_key(spec, now)?;
            let key = Arc::new(key);
            certificates.infos.push(info);
            let taken = if spec.name == DEFAULT_NAME {
                certificates.default.replace(key).is_some()
            } else if let Some(domain) = spec.name.strip_prefix("*.") {
                certificates
                    .wildcard
                    .insert(domain.to_string(), key)
                    .is_some()
            } else {
                certificates.exact.insert(spec.name.clone(), key).is_some()
            };
            if taken {
                return Err(TlsError::Twice {
                    name: spec.name.clone(),
                });
            }
        }
        Ok(certificates)
    }

    /// The certificate for `name` (what the client's SNI asks for): the exact name, else a
    /// wildcard one label up, else the default, else none (the handshake is refused).
    pub fn for_name(&self, name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let found = name.map(str::to_ascii_lowercase).and_then(|name| {
            self.exact.get(&name).cloned().or_else(|| {
                let (_, parent) = name.split_once('.')?;
                self.wildcard.get(parent).cloned()
            })
        });
        found.or_else(|| self.default.clone())
    }
}

/// TLS-ALPN-01's certificate for `name` (RFC 8737): self-signed, for that name alone, with
/// the critical acmeIdentifier extension holding the SHA-256 of the key authorization.
pub fn alpn_challenge_certificate(name: &str, digest: &[u8]) -> Result<CertifiedKey, TlsError> {
    let setup =
        |e: rcgen::Error| TlsError::Setup(format!("the TLS-ALPN-01 certificate for {name}: {e}"));
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).map_err(setup)?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let key = rcgen::KeyPair::generate().map_err(setup)?;
    let cert = params.self_signed(&key).map_err(setup)?;
    let private = PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(private)
        .map_err(|e| TlsError::Setup(format!("the TLS-ALPN-01 key for {name}: {e}")))?;
    Ok(CertifiedKey::new(vec![cert.der().clone()], signing))
}

/// A chain and its key from PEM files, the key checked against the leaf and the leaf's
/// validity against `now`.
fn certified_key(spec: &CertSpec, now: i64) -> Result<(CertifiedKey, CertInfo), TlsError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|e| TlsError::File {
            path: path.to_path_buf(),
            why: format!("cannot read it: {e}"),
        })
    };
    let pem = Pem {
        name: &spec.name,
        source: "file",
        cert_path: &spec.cert,
        cert: &read(&spec.cert)?,
        key_path: &spec.key,
        key: &read(&spec.key)?,
    };
    pem.certified(now)
}

/// A certificate chain and its key in PEM, and where they were read from (for the errors).
pub struct Pem<'a> {
    pub name: &'a str,
    pub source: &'a str,
    pub cert_path: &'a Path,
    pub cert: &'a [u8],
    pub key_path: &'a Path,
    pub key: &'a [u8],
}

impl Pem<'_> {
    /// The chain and key rustls serves, after the checks: the leaf within its validity at
    /// `now`, the key matching it.
    pub fn certified(&self, now: i64) -> Result<(CertifiedKey, CertInfo), TlsError> {
        let (cert, key) = (self.cert_path, self.key_path);
        let file = |path: &Path, why: String| TlsError::File {
            path: path.to_path_buf(),
            why,
        };
        let chain = CertificateDer::pem_slice_iter(self.cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| file(cert, format!("not a PEM certificate chain ({e})")))?;
        if chain.is_empty() {
            return Err(file(cert, "holds no CERTIFICATE block".into()));
        }
        // rustls sends the chain as it is and never reads past the leaf: an intermediate that is
        // base64 but no certificate would reach every client, and fail every handshake there.
        for (index, block) in chain.iter().enumerate().skip(1) {
            use x509_cert::der::Decode;
            x509_cert::Certificate::from_der(block.as_ref()).map_err(|e| {
                file(
                    cert,
                    format!(
                        "CERTIFICATE block {} of the chain is not an X.509 certificate ({e}); fix or remove it",
                        index + 1
                    ),
                )
            })?;
        }
        let private = PrivateKeyDer::from_pem_slice(self.key)
            .map_err(|e| file(key, format!("not a PEM private key ({e})")))?;
        let provider = rustls::crypto::ring::default_provider();
        let signing = provider
            .key_provider
            .load_private_key(private)
            .map_err(|e| {
                file(
                    key,
                    format!(
                        "not a key rustls can sign with ({e}); use ECDSA P-256/P-384, Ed25519 or RSA"
                    ),
                )
            })?;
        let info =
            leaf_info(self.name, self.source, cert, &chain[0]).map_err(|why| file(cert, why))?;
        if info.not_after <= now {
            return Err(file(
                cert,
                format!("expired on {} (UTC); renew it", date(info.not_after)),
            ));
        }
        if info.not_before > now {
            return Err(file(
                cert,
                format!(
                    "not valid before {} (UTC); is the clock right?",
                    date(info.not_before)
                ),
            ));
        }
        if self.name != DEFAULT_NAME && !covers(&info.dns_names, self.name) {
            return Err(file(
                cert,
                format!(
                    "is not for {} (it names {}); give the certificate for that name",
                    self.name,
                    if info.dns_names.is_empty() {
                        "no DNS name".to_string()
                    } else {
                        info.dns_names.join(", ")
                    }
                ),
            ));
        }
        let certified = CertifiedKey::new(chain, signing);
        certified.keys_match().map_err(|e| {
            file(
                key,
                format!("does not match the certificate in {} ({e})", cert.display()),
            )
        })?;
        Ok((certified, info))
    }
}

/// The leaf's names and validity, read with RustCrypto's X.509 types.
fn leaf_info(
    name: &str,
    source: &str,
    file: &Path,
    leaf: &CertificateDer<'_>,
) -> Result<CertInfo, String> {
    use x509_cert::der::Decode;
    let parsed = x509_cert::Certificate::from_der(leaf.as_ref())
        .map_err(|e| format!("its first certificate is not X.509 ({e})"))?;
    let tbs = &parsed.tbs_certificate;
    let seconds = |time: x509_cert::time::Time| {
        i64::try_from(time.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
    };
    let dns_names = match tbs.get::<x509_cert::ext::pkix::SubjectAltName>() {
        Ok(Some((_, names))) => names
            .0
            .iter()
            .filter_map(|name| match name {
                x509_cert::ext::pkix::name::GeneralName::DnsName(dns) => {
                    Some(dns.to_string().to_ascii_lowercase())
                }
                _ => None,
            })
            .collect(),
        Ok(None) => Vec::new(),
        Err(e) => return Err(format!("its subjectAltName does not read ({e})")),
    };
    Ok(CertInfo {
        name: name.to_string(),
        subject: tbs.subject.to_string(),
        issuer: tbs.issuer.to_string(),
        not_before: seconds(tbs.validity.not_before),
        not_after: seconds(tbs.validity.not_after),
        dns_names,
        source: source.to_string(),
        file: file.to_path_buf(),
    })
}

/// Whether a certificate for `dns_names` serves `name` (a host, or `*.domain`): the same name,
/// or a wildcard one label up (RFC 6125: `*.example.com` covers `a.example.com` only).
fn covers(dns_names: &[String], name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    dns_names.iter().any(|dns| {
        *dns == name
            || dns.strip_prefix("*.").is_some_and(|domain| {
                name.split_once('.')
                    .is_some_and(|(label, rest)| label != "*" && rest == domain)
            })
    })
}

/// `2026-12-03 06:13:30` for Unix seconds.
fn date(seconds: i64) -> String {
    chrono::DateTime::from_timestamp(seconds, 0).map_or(seconds.to_string(), |t| {
        t.format("%Y-%m-%d %H:%M:%S").to_string()
    })
}

pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Why a handshake did not finish, as `/metrics` counts it.
pub const HANDSHAKE_FAILURES: [&str; 5] = [
    "timeout",
    "unknown_name",
    "protocol",
    "client_alert",
    "closed",
];

/// The last reload (SIGHUP): when, and what came of it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Reload {
    pub at: i64,
    /// None: taken; else why the set in force was kept.
    pub refused: Option<String>,
}

/// Where ACME stands for one name the configuration lists.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AcmeStatus {
    pub name: String,
    /// The last order (or renewal): when it ended, and why it failed if it did.
    pub last_attempt: Option<i64>,
    pub last_error: Option<String>,
    /// When the next order is due (a renewal, or a retry after a failure).
    pub next_attempt: Option<i64>,
}

/// What the proxy says of its TLS (`tls` on `ROOT/proxy.sock`, read by `status`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TlsLine {
    pub certificates: Vec<CertInfo>,
    pub last_reload: Option<Reload>,
    pub handshakes: u64,
    pub handshake_failures: std::collections::BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acme: Vec<AcmeStatus>,
}

/// The certificates in force, replaced whole by a reload, and the handshakes counted.
#[derive(Debug)]
pub struct Resolver {
    specs: Vec<CertSpec>,
    current: RwLock<Arc<Certificates>>,
    /// Certificates from ACME, by name (kept across a SIGHUP, which reads only the files).
    acme: RwLock<HashMap<String, (Arc<CertifiedKey>, CertInfo)>>,
    /// TLS-ALPN-01's challenge certificates, by name, while a challenge is open: served only
    /// to a hello that asks for `acme-tls/1` alone.
    alpn_challenges: RwLock<HashMap<String, Arc<CertifiedKey>>>,
    acme_status: Mutex<Vec<AcmeStatus>>,
    last_reload: Mutex<Option<Reload>>,
    handshakes: AtomicU64,
    failures: [AtomicU64; HANDSHAKE_FAILURES.len()],
}

impl Resolver {
    /// The files' certificates, checked; `acme_names`: the names ACME will provide (the
    /// handshake for them is refused until it has).
    pub fn new(specs: Vec<CertSpec>, acme_names: &[String]) -> Result<Resolver, TlsError> {
        if specs.is_empty() && acme_names.is_empty() {
            return Err(TlsError::NoCertificate);
        }
        let certificates = Certificates::load(&specs, unix_now())?;
        Ok(Resolver {
            specs,
            current: RwLock::new(Arc::new(certificates)),
            acme: RwLock::new(HashMap::new()),
            alpn_challenges: RwLock::new(HashMap::new()),
            acme_status: Mutex::new(
                acme_names
                    .iter()
                    .map(|name| AcmeStatus {
                        name: name.clone(),
                        ..AcmeStatus::default()
                    })
                    .collect(),
            ),
            last_reload: Mutex::new(None),
            handshakes: AtomicU64::new(0),
            failures: Default::default(),
        })
    }

    /// Reads every file again and serves the new set, or keeps the old one and says why.
    pub fn reload(&self) -> Result<(), TlsError> {
        let now = unix_now();
        let loaded = Certificates::load(&self.specs, now);
        if let Ok(mut last) = self.last_reload.lock() {
            *last = Some(Reload {
                at: now,
                refused: loaded.as_ref().err().map(ToString::to_string),
            });
        }
        let certificates = loaded?;
        if let Ok(mut current) = self.current.write() {
            *current = Arc::new(certificates);
        }
        Ok(())
    }

    /// Serves `certified` for `name` from now on (ACME's order came through).
    pub fn install_acme(&self, name: &str, certified: CertifiedKey, info: CertInfo) {
        if let Ok(mut acme) = self.acme.write() {
            acme.insert(name.to_ascii_lowercase(), (Arc::new(certified), info));
        }
    }

    /// Serves `certified` to TLS-ALPN-01's validation of `name` (None: the challenge is over).
    pub fn set_alpn_challenge(&self, name: &str, certified: Option<CertifiedKey>) {
        if let Ok(mut open) = self.alpn_challenges.write() {
            match certified {
                Some(certified) => open.insert(name.to_ascii_lowercase(), Arc::new(certified)),
                None => open.remove(&name.to_ascii_lowercase()),
            };
        }
    }

    /// The ACME certificate served for `name`, if any: (not_before, not_after).
    pub fn acme_validity(&self, name: &str) -> Option<(i64, i64)> {
        let acme = self.acme.read().ok()?;
        acme.get(&name.to_ascii_lowercase())
            .map(|(_, info)| (info.not_before, info.not_after))
    }

    /// Records how ACME's last attempt for `name` went and when it tries next.
    pub fn record_acme(&self, name: &str, error: Option<String>, next_attempt: i64) {
        if let Ok(mut statuses) = self.acme_status.lock() {
            if let Some(status) = statuses.iter_mut().find(|s| s.name == name) {
                status.last_attempt = Some(unix_now());
                status.last_error = error;
                status.next_attempt = Some(next_attempt);
            }
        }
    }

    /// The certificates in force, what the last reload did, and the handshakes so far.
    pub fn line(&self) -> TlsLine {
        let mut certificates = self.certificates().infos.clone();
        if let Ok(acme) = self.acme.read() {
            let mut from_acme: Vec<CertInfo> =
                acme.values().map(|(_, info)| info.clone()).collect();
            from_acme.sort_by(|a, b| a.name.cmp(&b.name));
            certificates.extend(from_acme);
        }
        TlsLine {
            certificates,
            acme: self
                .acme_status
                .lock()
                .map(|s| s.clone())
                .unwrap_or_default(),
            last_reload: self.last_reload.lock().ok().and_then(|last| last.clone()),
            handshakes: self.handshakes.load(Ordering::Relaxed),
            handshake_failures: HANDSHAKE_FAILURES
                .iter()
                .zip(&self.failures)
                .map(|(reason, count)| (reason.to_string(), count.load(Ordering::Relaxed)))
                .collect(),
        }
    }

    fn count_failure(&self, reason: &str) {
        if let Some(at) = HANDSHAKE_FAILURES.iter().position(|r| *r == reason) {
            self.failures[at].fetch_add(1, Ordering::Relaxed);
        }
    }

    fn certificates(&self) -> Arc<Certificates> {
        match self.current.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl Resolver {
    /// Whether https has a certificate for `name` (lowercase, no port): a file's (exact,
    /// wildcard or default) or ACME's, issued or still on its way.
    pub fn serves_name(&self, name: &str) -> bool {
        let acme = self
            .acme_status
            .lock()
            .is_ok_and(|names| names.iter().any(|status| status.name == name));
        acme || self.certificates().for_name(Some(name)).is_some()
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name().map(str::to_ascii_lowercase);
        // An ACME server validating TLS-ALPN-01 offers `acme-tls/1` and nothing else; it gets
        // the challenge certificate, and no client of the site ever does.
        let mut offered = hello.alpn().into_iter().flatten();
        if offered.next() == Some(ACME_TLS_ALPN) && offered.next().is_none() {
            let open = self.alpn_challenges.read().ok()?;
            return open.get(name.as_deref()?).cloned();
        }
        let files = self.certificates();
        // A file for the exact name, then ACME's (an ACME name is exact), then the files'
        // wildcards and default.
        if let Some(found) = name.as_deref().and_then(|n| files.exact.get(n)) {
            return Some(found.clone());
        }
        if let Some(name) = &name {
            if let Some((found, _)) = self
                .acme
                .read()
                .ok()
                .as_ref()
                .and_then(|a| a.get(name).cloned())
            {
                return Some(found);
            }
        }
        files.for_name(name.as_deref())
    }
}

/// rustls' server settings: TLS 1.3 and 1.2, certificates by SNI, ALPN h2 then http/1.1.
pub fn server_config(resolver: Arc<Resolver>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    // acme-tls/1 last: only a hello that offers it alone gets it (TLS-ALPN-01).
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec(), ACME_TLS_ALPN.to_vec()];
    Ok(Arc::new(config))
}

/// One TLS client connection: the handshake (bounded by the header read timeout), then HTTP/2
/// or HTTP/1.1 by what ALPN chose, until the client or the proxy ends it.
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    slot: OwnedSemaphorePermit,
    ctx: Arc<Shared>,
    acceptor: tokio_rustls::TlsAcceptor,
    resolver: Arc<Resolver>,
    hsts: bool,
    mut stop: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    let handshake = tokio::time::timeout(ctx.header_read_timeout, acceptor.accept(stream));
    let tls = tokio::select! {
        done = handshake => match done {
            Ok(Ok(tls)) => {
                resolver.handshakes.fetch_add(1, Ordering::Relaxed);
                tls
            }
            // A hello that never finished, an unknown name, a protocol below 1.2: nothing to
            // serve, and nothing to say over a connection that has no TLS; counted by why.
            Ok(Err(e)) => {
                resolver.count_failure(failure_reason(&e));
                return;
            }
            Err(_) => {
                resolver.count_failure("timeout");
                return;
            }
        },
        _ = stop.changed() => return,
    };
    let alpn = tls.get_ref().1.alpn_protocol();
    if alpn == Some(ACME_TLS_ALPN) {
        // The validation is the handshake itself: nothing is served after it.
        return;
    }
    let h2 = alpn == Some(b"h2".as_slice());
    let sni = tls.get_ref().1.server_name().map(str::to_string);
    if !h2 {
        // HTTP/1.1: the path plain connections take (`front.rs`), hyper for what it does not
        // serve itself.
        let over = front::Over::Tls {
            sni: sni.map(|name| name.to_ascii_lowercase()),
            hsts,
        };
        return front::serve_over(tls, over, peer, slot, ctx, stop).await;
    }
    let client =
        Arc::new(forward::Client::new(peer, Arc::new(slot), &ctx).over_tls(sni.as_deref()));
    let service_ctx = ctx.clone();
    let service = service_fn(move |request| {
        with_hsts(
            forward::handle(request, service_ctx.clone(), client.clone()),
            hsts,
        )
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .max_header_list_size(u32::try_from(ctx.max_header_bytes).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS)
        .max_local_error_reset_streams(H2_MAX_LOCAL_RESETS)
        .keep_alive_interval(None);
    let connection = builder.serve_connection(TokioIo::new(tls), service);
    serve_until_stopped!(connection, stop);
}

/// Why a handshake failed, in the words of [`HANDSHAKE_FAILURES`].
fn failure_reason(error: &std::io::Error) -> &'static str {
    match error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        // What rustls says when the resolver found no certificate for the name asked.
        Some(rustls::Error::General(why)) if why.contains("no server certificate") => {
            "unknown_name"
        }
        Some(rustls::Error::AlertReceived(_)) => "client_alert",
        Some(_) => "protocol",
        None => "closed",
    }
}

/// What the plain-HTTP side needs to send a request to https.
pub struct ToHttps {
    pub tls_port: u16,
    pub http01: super::acme::Http01Answers,
    /// The names https has a certificate for (or ACME will get one for).
    pub resolver: Arc<Resolver>,
    /// The serving thread's routes: where routes go by host, a host none takes is no site.
    pub shared: Arc<super::forward::Shared>,
}

/// Where a plain-HTTP request goes: to https, or nowhere and why.
#[derive(Debug, PartialEq, Eq)]
enum Plain {
    /// 308 to this location.
    Https(String),
    /// 400: the Host header is no host (RFC 9112 §3.2).
    BadHost,
    /// 421: https would refuse this host (no certificate or route covers it).
    NotServed(String),
}

impl ToHttps {
    /// The answer to a request for `host` (its Host header, or the request target's
    /// authority) and `path`.
    fn answer(&self, host: Option<&[u8]>, path: &str) -> Plain {
        let Some(host) = host.filter(|h| is_host_header(h)) else {
            return Plain::BadHost;
        };
        let name = super::router::host_name(host);
        let routed = self.shared.router.with(|r| r.has_host(name.as_bytes()));
        if !routed || !self.resolver.serves_name(&name) {
            return Plain::NotServed(name);
        }
        let shown = String::from_utf8_lossy(host);
        Plain::Https(https_location(
            host_without_port(&shown),
            self.tls_port,
            path,
        ))
    }
}

/// Whether a Host header is `uri-host [ ":" port ]` (RFC 9112 §3.2, RFC 3986 §3.2.2): a name of
/// unreserved, percent-encoded and sub-delimiter characters, or an IP literal in brackets, and
/// digits after a colon. Nothing else (no `/`, no `@`, not empty) is a host to redirect to.
fn is_host_header(host: &[u8]) -> bool {
    let (name, port) = match host.strip_prefix(b"[") {
        Some(v6) => match v6.iter().position(|b| *b == b']') {
            Some(end) => {
                let literal = &v6[..end];
                let ok = !literal.is_empty()
                    && literal
                        .iter()
                        .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'));
                if !ok {
                    return false;
                }
                (&b"x"[..], &v6[end + 1..])
            }
            None => return false,
        },
        None => match host.iter().position(|b| *b == b':') {
            Some(at) => (&host[..at], &host[at..]),
            None => (host, &b""[..]),
        },
    };
    let port_ok = port.is_empty()
        || (port[0] == b':' && port.len() <= 6 && port[1..].iter().all(u8::is_ascii_digit));
    let name_ok = !name.is_empty()
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~%!$&'()*+,;=".contains(b));
    name_ok && port_ok
}

/// A plain HTTP connection while TLS is on: every request for a host https serves is sent to
/// the same host and path over https with 308 (the method and body kept), on `tls_port` unless
/// it is 443; a Host that is no host gets 400, one https would refuse 421.
pub async fn redirect(stream: TcpStream, to_https: ToHttps, mut stop: watch::Receiver<bool>) {
    let header_read_timeout = to_https.shared.header_read_timeout;
    let http01 = to_https.http01.clone();
    let to_https = Arc::new(to_https);
    let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        // ACME's HTTP-01: the key authorization of an open challenge, and nothing else.
        if let Some(token) = request
            .uri()
            .path()
            .strip_prefix(super::acme::HTTP01_PREFIX)
        {
            let answer = http01.lock().ok().and_then(|open| open.get(token).cloned());
            let response = match answer {
                Some(key_authorization) => Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/octet-stream")
                    .body(http_body_util::Full::new(bytes::Bytes::from(
                        key_authorization,
                    ))),
                None => Response::builder().status(StatusCode::NOT_FOUND).body(
                    http_body_util::Full::new(bytes::Bytes::from_static(b"no such challenge\n")),
                ),
            };
            let response = response
                .unwrap_or_else(|_| Response::new(http_body_util::Full::new(bytes::Bytes::new())));
            return std::future::ready(Ok::<_, std::convert::Infallible>(response));
        }
        let host = match request.headers().get(HOST) {
            Some(header) => Some(header.as_bytes()),
            None => request.uri().authority().map(|a| a.as_str().as_bytes()),
        };
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let plain_text = |status: StatusCode, text: String| {
            Response::builder()
                .status(status)
                .header("content-type", "text/plain; charset=utf-8")
                .body(http_body_util::Full::new(bytes::Bytes::from(text)))
        };
        let bad_host = || {
            plain_text(
                StatusCode::BAD_REQUEST,
                "bad request: the Host header is not a host name\n".into(),
            )
        };
        let response = match to_https.answer(host, &path) {
            Plain::Https(location) => match HeaderValue::from_str(&location) {
                Ok(value) => Response::builder()
                    .status(StatusCode::PERMANENT_REDIRECT)
                    .header(LOCATION, value)
                    .header("content-type", "text/plain; charset=utf-8")
                    .body(http_body_util::Full::new(bytes::Bytes::from(format!(
                        "this site is served over https: {location}\n"
                    )))),
                Err(_) => bad_host(),
            },
            Plain::BadHost => bad_host(),
            Plain::NotServed(name) => plain_text(
                StatusCode::MISDIRECTED_REQUEST,
                format!("no site here for {name}: no certificate or route covers it, so it is not sent to https\n"),
            ),
        };
        std::future::ready(Ok::<_, std::convert::Infallible>(response.unwrap_or_else(
            |_| Response::new(http_body_util::Full::new(bytes::Bytes::new())),
        )))
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    serve_until_stopped!(connection, stop);
}

/// `example.com:8080` -> `example.com`; `[::1]:80` -> `[::1]`.
fn host_without_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..h.len() + 1]);
    }
    host.split(':').next().unwrap_or(host)
}

fn https_location(host: &str, tls_port: u16, path: &str) -> String {
    if tls_port == 443 {
        format!("https://{host}{path}")
    } else {
        format!("https://{host}:{tls_port}{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_paths_say_the_same_hsts() {
        assert_eq!(
            HSTS_LINE,
            format!("{STRICT_TRANSPORT_SECURITY}: {HSTS}\r\n").as_bytes()
        );
    }

    #[test]
    fn a_cert_setting_is_read_and_a_bad_one_says_what_is_allowed() {
        let spec: CertSpec = "Edge.Example.com=/c.pem,/k.pem".parse().unwrap();
        assert_eq!(spec.name, "edge.example.com");
        assert_eq!(spec.cert, PathBuf::from("/c.pem"));
        assert_eq!(spec.key, PathBuf::from("/k.pem"));
        assert!("*.example.com=a,b".parse::<CertSpec>().is_ok());
        assert!("default=a,b".parse::<CertSpec>().is_ok());
        for bad in [
            "example.com",
            "example.com=a",
            "=a,b",
            "*.com=a,b",
            "ex ample.com=a,b",
            "a..b=a,b",
            "-a.b=a,b",
            "x=a,",
        ] {
            let err = bad.parse::<CertSpec>().unwrap_err().to_string();
            assert!(err.contains("give NAME=CERT,KEY"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_certificate_covers_its_names_and_a_wildcard_one_label_below() {
        let names = ["a.test".to_string(), "*.apps.test".to_string()];
        assert!(covers(&names, "a.test") && covers(&names, "A.Test"));
        assert!(covers(&names, "x.apps.test") && covers(&names, "*.apps.test"));
        assert!(!covers(&names, "b.test") && !covers(&names, "y.x.apps.test"));
        assert!(!covers(&names, "apps.test"));
    }

    #[test]
    fn a_redirect_keeps_the_host_and_path_and_names_a_port_other_than_443() {
        assert_eq!(host_without_port("example.com:8080"), "example.com");
        assert_eq!(host_without_port("[::1]:80"), "[::1]");
        assert_eq!(host_without_port("example.com"), "example.com");
        assert_eq!(
            https_location("example.com", 443, "/a?b=1"),
            "https://example.com/a?b=1"
        );
        assert_eq!(
            https_location("example.com", 8443, "/"),
            "https://example.com:8443/"
        );
    }
}
