//! Certificates from ACME (RFC 8555, issue 47): for the names the configuration lists, and only
//! those (a name a client's SNI brings is never ordered: that is how on-demand TLS is abused),
//! through instant-acme against the directory given (Let's Encrypt, its staging, ZeroSSL,
//! step-ca, pebble), trusting `--acme-ca-file` for the directory when given.
//!
//! - State under `--acme-state` (made 0700): `account.json` (the account's key and URL) and,
//!   per name, `NAME.pem` (the chain) and `NAME.key`, each file 0600 and replaced atomically
//!   like every state file rollgate writes. A restart reads them and orders nothing while the
//!   stored certificate is good.
//! - A certificate is renewed once two thirds of its lifetime have passed. A failed order (or
//!   renewal) keeps the certificate serving, is retried with a backoff (1 minute doubling to
//!   an hour) and is said in the proxy's log and in `status` (`acme`: the last attempt, its
//!   error, the next attempt).
//! - Challenges: HTTP-01, answered on the plain listener at `/.well-known/acme-challenge/`
//!   from [`Http01Answers`]; or TLS-ALPN-01 (RFC 8737), answered on the TLS listener to a
//!   hello that offers `acme-tls/1` alone, with a self-signed certificate carrying the key
//!   authorization's digest (for a host whose port 80 is closed or behind something else).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};

use super::certs::{unix_now, Pem, Resolver, TlsError};
use crate::host::files::{write_atomically_with_mode, PRIVATE_FILE_MODE};

/// The ACME settings (`--acme-*`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub directory: String,
    pub contacts: Vec<String>,
    pub ca_file: Option<PathBuf>,
    pub state: PathBuf,
    pub names: Vec<String>,
    pub challenge: Challenge,
}

/// How the ACME server checks a name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Challenge {
    /// `http://NAME/.well-known/acme-challenge/TOKEN`, on the plain listener.
    Http01,
    /// A TLS handshake to NAME offering ALPN `acme-tls/1`, on the TLS listener.
    TlsAlpn01,
}

/// The key authorizations the plain listener answers, by token, while a challenge is open.
pub type Http01Answers = Arc<Mutex<HashMap<String, String>>>;

/// The path prefix HTTP-01 is asked on.
pub const HTTP01_PREFIX: &str = "/.well-known/acme-challenge/";

const RETRY_FIRST: Duration = Duration::from_secs(60);
const RETRY_LONGEST: Duration = Duration::from_secs(3600);
/// The longest sleep between two looks at the certificates.
const LOOK_AT_MOST: Duration = Duration::from_secs(3600);

/// Checks the settings before anything starts: the state folder can be made (0700) and the CA
/// file read. The error names what is wrong.
pub fn prepare(settings: &Settings) -> Result<(), TlsError> {
    use std::os::unix::fs::PermissionsExt;
    let setup = TlsError::Setup;
    if settings.names.is_empty() {
        return Err(setup(
            "--acme-directory is given but no --acme-name: list the names to order".into(),
        ));
    }
    std::fs::create_dir_all(&settings.state)
        .and_then(|()| {
            std::fs::set_permissions(&settings.state, std::fs::Permissions::from_mode(0o700))
        })
        .map_err(|e| setup(format!("--acme-state {}: {e}", settings.state.display())))?;
    if let Some(ca) = &settings.ca_file {
        std::fs::read(ca).map_err(|e| setup(format!("--acme-ca-file {}: {e}", ca.display())))?;
    }
    Ok(())
}

fn cert_path(state: &Path, name: &str) -> PathBuf {
    state.join(format!("{name}.pem"))
}

fn key_path(state: &Path, name: &str) -> PathBuf {
    state.join(format!("{name}.key"))
}

/// Loads the stored certificate of `name` into the resolver if it is good now; whether it was.
fn load_stored(settings: &Settings, resolver: &Resolver, name: &str) -> bool {
    let (cert_file, key_file) = (
        cert_path(&settings.state, name),
        key_path(&settings.state, name),
    );
    let (Ok(cert), Ok(key)) = (std::fs::read(&cert_file), std::fs::read(&key_file)) else {
        return false;
    };
    let pem = Pem {
        name,
        source: "acme",
        cert_path: &cert_file,
        cert: &cert,
        key_path: &key_file,
        key: &key,
    };
    match pem.certified(unix_now()) {
        Ok((certified, info)) => {
            resolver.install_acme(name, certified, info);
            true
        }
        Err(e) => {
            eprintln!("rollgate proxy: ACME: the stored certificate of {name} is not used: {e}");
            false
        }
    }
}

/// When the certificate valid from `not_before` to `not_after` is renewed: at two thirds of
/// its lifetime.
pub fn renew_at(not_before: i64, not_after: i64) -> i64 {
    not_before + (not_after - not_before) * 2 / 3
}

/// Keeps a good certificate for every name, for as long as the proxy runs.
pub async fn keep(settings: Settings, resolver: Arc<Resolver>, answers: Http01Answers) {
    let mut account: Option<Account> = None;
    let mut backoff: HashMap<String, Duration> = HashMap::new();
    let mut next: HashMap<String, i64> = HashMap::new();
    for name in &settings.names {
        if load_stored(&settings, &resolver, name) {
            eprintln!("rollgate proxy: ACME: {name}: the stored certificate serves (no new order)");
        }
    }
    loop {
        let now = unix_now();
        for name in &settings.names {
            let due = match resolver.acme_validity(name) {
                Some((not_before, not_after)) => renew_at(not_before, not_after),
                None => now,
            };
            let due = due.max(next.get(name).copied().unwrap_or(i64::MIN));
            if due > now {
                continue;
            }
            let outcome = match account.clone() {
                Some(account) => Ok(account),
                None => account_of(&settings).await,
            };
            let outcome = match outcome {
                Ok(ready) => {
                    account = Some(ready.clone());
                    order(&settings, &ready, name, &answers, &resolver).await
                }
                Err(e) => Err(e),
            };
            match outcome.and_then(|(chain, key)| {
                store_and_install(&settings, &resolver, name, &chain, &key)
            }) {
                Ok((not_before, not_after)) => {
                    backoff.remove(name);
                    next.remove(name);
                    let renewal = renew_at(not_before, not_after);
                    resolver.record_acme(name, None, renewal);
                    eprintln!(
                        "rollgate proxy: ACME: {name}: certificate issued, renewed after {renewal}"
                    );
                }
                Err(e) => {
                    let wait = backoff
                        .get(name)
                        .map_or(RETRY_FIRST, |w| (*w * 2).min(RETRY_LONGEST));
                    backoff.insert(name.clone(), wait);
                    let again = unix_now() + wait.as_secs() as i64;
                    next.insert(name.clone(), again);
                    resolver.record_acme(name, Some(e.clone()), again);
                    eprintln!(
                        "rollgate proxy: ACME: {name}: {e}; the certificate serving (if any) goes on, next try in {} s",
                        wait.as_secs()
                    );
                }
            }
        }
        // Sleep until the soonest due moment, at most an hour.
        let soonest = settings
            .names
            .iter()
            .map(|name| {
                let renewal = resolver
                    .acme_validity(name)
                    .map_or(i64::MIN, |(b, a)| renew_at(b, a));
                renewal.max(next.get(name).copied().unwrap_or(i64::MIN))
            })
            .min()
            .unwrap_or(i64::MAX);
        let wait = (soonest - unix_now()).clamp(1, LOOK_AT_MOST.as_secs() as i64);
        tokio::time::sleep(Duration::from_secs(wait as u64)).await;
    }
}

/// The account: the stored one, or a new one (then stored, 0600).
async fn account_of(settings: &Settings) -> Result<Account, String> {
    let builder = match &settings.ca_file {
        Some(ca) => Account::builder_with_root(ca),
        None => Account::builder(),
    }
    .map_err(|e| format!("cannot make the ACME client: {e}"))?;
    let stored = settings.state.join("account.json");
    if let Ok(bytes) = std::fs::read(&stored) {
        let credentials: AccountCredentials = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{} is not an ACME account ({e})", stored.display()))?;
        return builder.from_credentials(credentials).await.map_err(|e| {
            format!(
                "the stored account is refused by {}: {e}",
                settings.directory
            )
        });
    }
    let contacts: Vec<&str> = settings.contacts.iter().map(String::as_str).collect();
    let (account, credentials) = builder
        .create(
            &NewAccount {
                contact: &contacts,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            settings.directory.clone(),
            None,
        )
        .await
        .map_err(|e| format!("cannot create an account at {}: {e}", settings.directory))?;
    let bytes = serde_json::to_vec(&credentials).map_err(|e| e.to_string())?;
    write_atomically_with_mode(&stored, &bytes, PRIVATE_FILE_MODE)
        .map_err(|e| format!("cannot write {}: {e}", stored.display()))?;
    Ok(account)
}

/// One order for `name` through HTTP-01: the chain and the key, in PEM.
async fn order(
    settings: &Settings,
    account: &Account,
    name: &str,
    answers: &Http01Answers,
    resolver: &Resolver,
) -> Result<(String, String), String> {
    let identifiers = [Identifier::Dns(name.to_string())];
    let mut order = account
        .new_order(&NewOrder::new(&identifiers))
        .await
        .map_err(|e| format!("the order was refused by {}: {e}", settings.directory))?;
    let mut tokens = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(authorization) = authorizations.next().await {
        let mut authorization =
            authorization.map_err(|e| format!("cannot read an authorization: {e}"))?;
        match authorization.status {
            AuthorizationStatus::Pending => {}
            AuthorizationStatus::Valid => continue,
            other => return Err(format!("the authorization of {name} is {other:?}")),
        }
        let (kind, said) = match settings.challenge {
            Challenge::Http01 => (ChallengeType::Http01, "http-01"),
            Challenge::TlsAlpn01 => (ChallengeType::TlsAlpn01, "tls-alpn-01"),
        };
        let mut challenge = authorization.challenge(kind).ok_or_else(|| {
            format!(
                "{} offers no {said} challenge for {name}",
                settings.directory
            )
        })?;
        let key_authorization = challenge.key_authorization();
        match settings.challenge {
            Challenge::Http01 => {
                let token = challenge.token.clone();
                if let Ok(mut open) = answers.lock() {
                    open.insert(token.clone(), key_authorization.as_str().to_string());
                }
                tokens.push(token);
            }
            Challenge::TlsAlpn01 => {
                let certified = super::certs::alpn_challenge_certificate(
                    name,
                    key_authorization.digest().as_ref(),
                )
                .map_err(|e| e.to_string())?;
                resolver.set_alpn_challenge(name, Some(certified));
            }
        }
        challenge
            .set_ready()
            .await
            .map_err(|e| format!("cannot answer the challenge: {e}"))?;
    }
    let ready = order.poll_ready(&RetryPolicy::default()).await;
    if let Ok(mut open) = answers.lock() {
        for token in &tokens {
            open.remove(token);
        }
    }
    resolver.set_alpn_challenge(name, None);
    match ready.map_err(|e| format!("the order did not get ready: {e}"))? {
        OrderStatus::Ready => {}
        other => {
            return Err(format!(
                "the order for {name} is {other:?}, not ready (the challenge failed)"
            ))
        }
    }
    let key = order
        .finalize()
        .await
        .map_err(|e| format!("cannot finalize the order: {e}"))?;
    let chain = order
        .poll_certificate(&RetryPolicy::default())
        .await
        .map_err(|e| format!("no certificate came: {e}"))?;
    Ok((chain, key))
}

/// Checks the new certificate as a file would be, stores it (0600, atomically) and serves it.
fn store_and_install(
    settings: &Settings,
    resolver: &Resolver,
    name: &str,
    chain: &str,
    key: &str,
) -> Result<(i64, i64), String> {
    let (cert_file, key_file) = (
        cert_path(&settings.state, name),
        key_path(&settings.state, name),
    );
    let pem = Pem {
        name,
        source: "acme",
        cert_path: &cert_file,
        cert: chain.as_bytes(),
        key_path: &key_file,
        key: key.as_bytes(),
    };
    let (certified, info) = pem.certified(unix_now()).map_err(|e| e.to_string())?;
    // The key first: a chain is never on disk without the key that goes with it.
    write_atomically_with_mode(&key_file, key.as_bytes(), PRIVATE_FILE_MODE)
        .and_then(|()| write_atomically_with_mode(&cert_file, chain.as_bytes(), PRIVATE_FILE_MODE))
        .map_err(|e| {
            format!(
                "cannot store the certificate under {}: {e}",
                settings.state.display()
            )
        })?;
    let validity = (info.not_before, info.not_after);
    resolver.install_acme(name, certified, info);
    Ok(validity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_is_renewed_at_two_thirds_of_its_lifetime() {
        assert_eq!(renew_at(0, 90 * 86_400), 60 * 86_400);
        assert_eq!(renew_at(1_000, 1_300), 1_200);
    }
}
