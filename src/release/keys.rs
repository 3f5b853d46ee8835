//! Release keys: P-256 (ES256). Private keys are PKCS#8 PEM files of mode 0600 (SEC1 PEM, as
//! `openssl ecparam -genkey` writes, is read too); public keys are SPKI PEM. A key is known to
//! a verifier only by its pin, `sha256/<base64 of SHA-256 of the SPKI DER>`.

use std::path::Path;

use base64::Engine;
use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::pkcs8::{
    DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, LineEnding,
};
use p256::{PublicKey, SecretKey};
use sha2::{Digest, Sha256};

use super::manifest::{base64, Key};

pub const ALG: &str = "ES256";

/// A key file that cannot be used, said by what is wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot create {}: {source}", path.display())]
    Uncreatable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Unwritable {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{} exists; not overwriting it", path.display())]
    Exists { path: std::path::PathBuf },
    #[error(
        "{} is readable by others (mode {mode:o}); a private key must be 0600: chmod 600 {}",
        path.display(),
        path.display()
    )]
    Exposed { path: std::path::PathBuf, mode: u32 },
    #[error("{} is not a P-256 {what}", path.display())]
    NotAKey {
        path: std::path::PathBuf,
        what: &'static str,
    },
    #[error("cannot encode the {what}: {why}")]
    Encoding { what: &'static str, why: String },
}

/// A key that cannot be used is input rollgate cannot use (exit 1).
impl From<KeyError> for crate::error::Error {
    fn from(error: KeyError) -> crate::error::Error {
        crate::error::Error::Invalid(error.to_string())
    }
}

/// The pin of a public key.
pub fn pin(spki_der: &[u8]) -> String {
    format!("sha256/{}", base64().encode(Sha256::digest(spki_der)))
}

fn spki_der(public: &PublicKey) -> Vec<u8> {
    public
        .to_public_key_der()
        .expect("a P-256 key encodes")
        .as_bytes()
        .to_vec()
}

/// The body's entry for a public key.
pub fn listing(public: &PublicKey) -> Key {
    let der = spki_der(public);
    Key {
        kid: pin(&der),
        alg: ALG.into(),
        spki: base64().encode(&der),
    }
}

/// Writes a new key pair: `out` (PKCS#8 PEM, 0600) and `out` with `.pub.pem` (SPKI PEM).
/// Returns the pin. Never overwrites a file.
pub fn generate(out: &Path) -> Result<(String, std::path::PathBuf), KeyError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let secret = SecretKey::random(&mut rand_core::OsRng);
    let public = secret.public_key();
    let public_path = public_path_for(out);
    let write_new = |path: &Path, mode: u32, text: &str| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .map_err(|source| KeyError::Uncreatable {
                path: path.to_path_buf(),
                source,
            })?;
        // The mode given to open(2) passes through the umask; set it outright.
        file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))
            .and_then(|()| file.write_all(text.as_bytes()))
            .and_then(|()| file.sync_all())
            .map_err(|source| KeyError::Unwritable {
                path: path.to_path_buf(),
                source,
            })
    };
    let private_pem = secret
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| KeyError::Encoding {
            what: "key",
            why: e.to_string(),
        })?;
    let public_pem = public
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| KeyError::Encoding {
            what: "public key",
            why: e.to_string(),
        })?;
    if public_path.exists() {
        return Err(KeyError::Exists { path: public_path });
    }
    write_new(out, 0o600, &private_pem)?;
    write_new(&public_path, 0o644, &public_pem)?;
    Ok((pin(&spki_der(&public)), public_path))
}

/// `KEY.pem` → `KEY.pub.pem`.
pub fn public_path_for(private: &Path) -> std::path::PathBuf {
    let name = private
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".pem").unwrap_or(&name);
    private.with_file_name(format!("{stem}.pub.pem"))
}

/// Loads a private key, refusing one that group or others can read (as ssh does).
pub fn load_private(path: &Path) -> Result<SecretKey, KeyError> {
    use std::os::unix::fs::PermissionsExt;
    let unreadable = |source| KeyError::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::Exposed {
            path: path.to_path_buf(),
            mode,
        });
    }
    let text = std::fs::read_to_string(path).map_err(unreadable)?;
    SecretKey::from_pkcs8_pem(&text)
        .or_else(|_| SecretKey::from_sec1_pem(&text))
        .map_err(|_| KeyError::NotAKey {
            path: path.to_path_buf(),
            what: "private key in PEM (PKCS#8 or SEC1)",
        })
}

pub fn load_public(path: &Path) -> Result<PublicKey, KeyError> {
    let text = std::fs::read_to_string(path).map_err(|source| KeyError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    PublicKey::from_public_key_pem(&text).map_err(|_| KeyError::NotAKey {
        path: path.to_path_buf(),
        what: "public key in SPKI PEM",
    })
}

/// ES256 over `message`: the 64-byte r‖s, base64.
pub fn sign(secret: &SecretKey, message: &[u8]) -> String {
    let signature: Signature = SigningKey::from(secret).sign(message);
    base64().encode(signature.to_bytes())
}

/// Whether `sig` (base64 r‖s) is `listed`'s ES256 signature of `message`. A listing whose kid
/// is not its key's pin never verifies.
pub fn verifies(listed: &Key, message: &[u8], sig: &str) -> bool {
    let Ok(der) = base64().decode(&listed.spki) else {
        return false;
    };
    if listed.alg != ALG || pin(&der) != listed.kid {
        return false;
    }
    let (Ok(key), Ok(raw)) = (
        VerifyingKey::from_public_key_der(&der),
        base64().decode(sig),
    ) else {
        return false;
    };
    Signature::from_slice(&raw).is_ok_and(|signature| key.verify(message, &signature).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_under_its_key_only() {
        let alice = SecretKey::random(&mut rand_core::OsRng);
        let bob = SecretKey::random(&mut rand_core::OsRng);
        let sig = sign(&alice, b"body");
        assert!(verifies(&listing(&alice.public_key()), b"body", &sig));
        assert!(!verifies(&listing(&alice.public_key()), b"bodY", &sig));
        assert!(!verifies(&listing(&bob.public_key()), b"body", &sig));
        // A listing that claims another key's pin is refused.
        let mut lying = listing(&alice.public_key());
        lying.kid = listing(&bob.public_key()).kid;
        assert!(!verifies(&lying, b"body", &sig));
    }
}
