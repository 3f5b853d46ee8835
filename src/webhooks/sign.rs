//! The Standard Webhooks signature: HMAC-SHA256 (RustCrypto's `hmac` and `sha2`) of
//! `id.timestamp.body` under the endpoint's secret (`whsec_` and its key in base64), sent in
//! base64 as `webhook-signature: v1,<signature>`.

use base64::Engine;
use hmac::{Hmac, Mac};

/// An endpoint's signing key.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// A webhook secret that is not one, by what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotASecret {
    #[error("secret must be whsec_ and a base64 key (as Standard Webhooks writes it)")]
    Form,
    #[error("secret's key is not base64 ({0})")]
    Base64(String),
    #[error("secret's key is {0} bytes; use at least 24 (openssl rand -base64 32)")]
    Short(usize),
}

impl Secret {
    /// `whsec_` and base64, as the spec writes a secret (at least 24 bytes of key).
    pub fn parse(text: &str) -> Result<Secret, NotASecret> {
        let encoded = text.strip_prefix("whsec_").ok_or(NotASecret::Form)?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| NotASecret::Base64(e.to_string()))?;
        if key.len() < 24 {
            return Err(NotASecret::Short(key.len()));
        }
        Ok(Secret(key))
    }
}

/// The base64 signature of one message.
pub fn sign(secret: &Secret, id: &str, timestamp: &str, body: &str) -> String {
    let mut mac = Hmac::<sha2_010::Sha256>::new_from_slice(&secret.0)
        .expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_as_the_specs_reference_libraries_do() {
        // The example of the Standard Webhooks reference libraries' tests.
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = r#"{"test": 2432232314}"#;
        assert_eq!(
            sign(&secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", body),
            "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn a_secret_is_whsec_and_enough_base64() {
        assert!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(Secret::parse("whsec_!!").is_err());
        assert!(Secret::parse("whsec_c2hvcnQ=").is_err());
    }
}
