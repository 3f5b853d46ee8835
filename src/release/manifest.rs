//! The signed manifest: its body, the canonical encoding signatures are made over, and the
//! published form `{ "manifest": base64(body), "signatures": [{ "kid", "sig" }] }`.
//!
//! The canonical body is compact JSON with object keys sorted, holding only strings, integers
//! below 2^53, arrays and objects with ASCII keys: one value has exactly one encoding, so a
//! verifier can insist on it and a body re-encoded any other way (even validly signed) is
//! refused as `not-canonical`.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Reason, Refusal};

pub const TYPE: &str = "rollgate.release";
pub const SPEC: u64 = 1;
/// Integers a canonical body may hold: those every JSON reader represents exactly.
const MAX_INTEGER: u64 = (1 << 53) - 1;

pub fn base64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

pub fn base64_encode(bytes: &[u8]) -> String {
    base64().encode(bytes)
}

/// A signing key as the body lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Key {
    /// The key's pin, `sha256/<base64 of SHA-256 of the SPKI DER>`.
    pub kid: String,
    pub alg: String,
    /// The SubjectPublicKeyInfo, DER, base64.
    pub spki: String,
}

/// One file of the release.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    pub name: String,
    pub platform: String,
    /// Lowercase hex.
    pub sha256: String,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Body {
    #[serde(rename = "type")]
    pub kind: String,
    pub spec: u64,
    pub service: String,
    pub version: String,
    pub sequence: u64,
    /// RFC 3339, UTC, whole seconds.
    pub issued_at: String,
    pub expires_at: String,
    pub keys: Vec<Key>,
    pub artifacts: Vec<Artifact>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    pub kid: String,
    /// ES256: the 64-byte r‖s, base64 (as JWS encodes it, not DER).
    pub sig: String,
}

/// What `manifest.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Published {
    /// The canonical body, base64.
    pub manifest: String,
    pub signatures: Vec<Signature>,
}

impl Published {
    pub fn to_file_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a manifest serializes");
        bytes.push(b'\n');
        bytes
    }
}

/// The canonical encoding of a body rollgate builds.
pub fn encode(body: &Body) -> Vec<u8> {
    // serde_json's maps keep keys sorted (no `preserve_order`), and `to_vec` is compact.
    let value = serde_json::to_value(body).expect("a body serializes");
    serde_json::to_vec(&value).expect("a value serializes")
}

fn malformed(detail: impl Into<String>) -> Refusal {
    Refusal::new(Reason::Malformed, detail)
}

/// Reads a published manifest file's bytes.
pub fn parse_published(bytes: &[u8]) -> Result<Published, Refusal> {
    serde_json::from_slice(bytes).map_err(|e| {
        malformed(format!(
            "not a published manifest ({{ \"manifest\", \"signatures\" }}): {e}"
        ))
    })
}

/// Decodes and checks a published body: base64, JSON of the allowed kinds, canonical, and the
/// fields of a rollgate release. Returns the body and its canonical bytes (what was signed).
pub fn decode(published: &Published) -> Result<(Body, Vec<u8>), Refusal> {
    let bytes = base64()
        .decode(published.manifest.trim())
        .map_err(|e| malformed(format!("the manifest is not base64: {e}")))?;
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| malformed(format!("the manifest body is not JSON: {e}")))?;
    check_kinds(&value, "body")?;
    let canonical = serde_json::to_vec(&value).expect("a value serializes");
    if canonical != bytes {
        return Err(Refusal::new(
            Reason::NotCanonical,
            "the body is not in canonical form (compact JSON, keys sorted); it must be signed as rollgate encodes it",
        ));
    }
    let body: Body = serde_json::from_value(value)
        .map_err(|e| malformed(format!("the body is not a rollgate release: {e}")))?;
    if body.kind != TYPE || body.spec != SPEC {
        return Err(malformed(format!(
            "type {:?} spec {} is not {TYPE:?} spec {SPEC}",
            body.kind, body.spec
        )));
    }
    if !body.artifacts.windows(2).all(|w| w[0].name < w[1].name) {
        return Err(malformed(
            "the artifacts are not sorted by name (or repeat one)",
        ));
    }
    Ok((body, bytes))
}

/// Only strings, integers in [0, 2^53), arrays and objects with ASCII keys.
fn check_kinds(value: &Value, at: &str) -> Result<(), Refusal> {
    match value {
        Value::String(_) => Ok(()),
        Value::Number(n) => match n.as_u64() {
            Some(i) if i <= MAX_INTEGER => Ok(()),
            _ => Err(malformed(format!(
                "{at} is {n}: only integers from 0 to 2^53 - 1 are allowed"
            ))),
        },
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| check_kinds(item, &format!("{at}[{i}]"))),
        Value::Object(map) => map.iter().try_for_each(|(key, item)| {
            if !key.is_ascii() {
                return Err(malformed(format!("{at} has a key that is not ASCII")));
            }
            check_kinds(item, &format!("{at}.{key}"))
        }),
        Value::Null | Value::Bool(_) => Err(malformed(format!(
            "{at} is {value}: null and booleans are not allowed"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body() -> Body {
        Body {
            kind: TYPE.into(),
            spec: SPEC,
            service: "edge-svc".into(),
            version: "v2".into(),
            sequence: 14,
            issued_at: "2026-11-30T12:00:00Z".into(),
            expires_at: "2026-12-30T12:00:00Z".into(),
            keys: vec![],
            artifacts: vec![Artifact {
                name: "edge-svc".into(),
                platform: "linux-x86_64".into(),
                sha256: "00".repeat(32),
                size: 3,
            }],
        }
    }

    fn published(bytes: &[u8]) -> Published {
        Published {
            manifest: base64().encode(bytes),
            signatures: vec![],
        }
    }

    #[test]
    fn the_canonical_body_round_trips_and_sorts_its_keys() {
        let bytes = encode(&body());
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.starts_with(r#"{"artifacts":[{"name":"edge-svc","platform""#),
            "{text}"
        );
        assert!(!text.contains(' '));
        let (decoded, signed) = decode(&published(&bytes)).unwrap();
        assert_eq!(decoded, body());
        assert_eq!(signed, bytes);
    }

    #[test]
    fn other_encodings_and_kinds_are_refused_with_their_reason() {
        let bytes = encode(&body());
        let pretty =
            serde_json::to_vec_pretty(&serde_json::from_slice::<Value>(&bytes).unwrap()).unwrap();
        assert_eq!(
            decode(&published(&pretty)).unwrap_err().reason,
            Reason::NotCanonical
        );
        let text = String::from_utf8(bytes).unwrap();
        for bad in [
            text.replace("\"sequence\":14", "\"sequence\":14.5"),
            text.replace("\"sequence\":14", "\"sequence\":9007199254740993"),
            text.replace("\"sequence\":14", "\"sequence\":true"),
            text.replace(r#""type":"rollgate.release""#, r#""type":"other""#),
        ] {
            assert_eq!(
                decode(&published(bad.as_bytes())).unwrap_err().reason,
                Reason::Malformed,
                "{bad}"
            );
        }
        let bad_base64 = Published {
            manifest: "%%%".into(),
            signatures: vec![],
        };
        assert_eq!(decode(&bad_base64).unwrap_err().reason, Reason::Malformed);
    }
}
