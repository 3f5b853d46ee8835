//! The certificates the proxy serves (issue 47), chosen by the name a client asks for (SNI).
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
//! - Certificates ACME obtained (`acme.rs`) sit beside those from files, and the store counts
//!   handshakes and their failures for `/metrics` and `status`.
//!
//! The store and its resolver name nothing else of the proxy: ACME stands on them, and the
//! TLS front end (`tls.rs`) hands them to rustls.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

/// The name that serves clients no other certificate covers.
pub const DEFAULT_NAME: &str = "default";

/// The ALPN protocol of TLS-ALPN-01 (RFC 8737).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

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

    /// One handshake finished.
    pub fn count_handshake(&self) {
        self.handshakes.fetch_add(1, Ordering::Relaxed);
    }

    /// One handshake failed, for `reason` (one of [`HANDSHAKE_FAILURES`]).
    pub fn count_failure(&self, reason: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
