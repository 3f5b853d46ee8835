//! Signed releases: keys and pins, sign and cosign, every refusal reason, interoperability with
//! openssl, and a root that deploys only what its pinned keys signed, never older than its floor.

use crate::common::*;

use base64::Engine;
use sha2::Digest;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// `rollgate release keygen`: the key's path and the pin it printed.
fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(format!("{name}.pem"));
    let out = rollgate()
        .args(["release", "keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pin = stdout(&out).lines().next().unwrap().to_string();
    assert!(pin.starts_with("sha256/"), "{pin}");
    (key, pin)
}

fn release(args: &[&str]) -> std::process::Output {
    rollgate().arg("release").args(args).output().unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Signs `dir` as `version` with sequence `sequence` by `key`, listing `cosigners`.
fn sign(dir: &Path, version: &str, sequence: u64, key: &Path, cosigners: &[&Path]) {
    let mut args = vec![
        "sign".to_string(),
        path(dir).into(),
        "--service".into(),
        "edge-svc".into(),
        "--version".into(),
        version.into(),
        "--sequence".into(),
        sequence.to_string(),
        "--key".into(),
        path(key).into(),
    ];
    if !cosigners.is_empty() {
        args.push("--cosigners".into());
        args.push(
            cosigners
                .iter()
                .map(|p| path(p).to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = release(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

fn cosign(manifest: &Path, key: &Path) -> std::process::Output {
    release(&["cosign", path(manifest), "--key", path(key)])
}

/// `release verify`: Ok on exit 0, else the reason word.
fn verify(manifest: &Path, pins: &[&str], threshold: usize, extra: &[&str]) -> Result<(), String> {
    let pins = pins.join(",");
    let threshold = threshold.to_string();
    let mut args = vec![
        "verify",
        path(manifest),
        "--pins",
        &pins,
        "--threshold",
        &threshold,
    ];
    args.extend_from_slice(extra);
    let out = release(&args);
    match out.status.code() {
        Some(0) => Ok(()),
        Some(1) => {
            let err = stderr(&out);
            let reason = err
                .strip_prefix("error: refused: ")
                .and_then(|r| r.split(':').next())
                .unwrap_or(&err)
                .to_string();
            Err(reason)
        }
        other => panic!("verify exited {other:?}: {}", stderr(&out)),
    }
}

/// A release folder: the sample service's executable and a config file.
fn release_dir(dir: &Path) -> PathBuf {
    let folder = dir.join("dist");
    std::fs::create_dir_all(&folder).unwrap();
    let bin = crate::common::bin();
    write(
        &folder,
        "edge-svc",
        &format!("#!/bin/sh\nexec '{}' sample-service\n", bin.display()),
    );
    make_executable(&folder.join("edge-svc"));
    write(&folder, "edge.conf", "workers = 2\n");
    folder
}

#[test]
fn keygen_writes_a_private_key_and_prints_the_pin_verify_computes() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (key, pin) = keygen(dir.path(), "alice");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let public = dir.path().join("alice.pub.pem");
    assert!(std::fs::read_to_string(&public)
        .unwrap()
        .starts_with("-----BEGIN PUBLIC KEY-----"));
    // The pin is SHA-256 of the SPKI DER, as openssl computes it.
    let der = std::process::Command::new("openssl")
        .args(["pkey", "-pubin", "-outform", "DER", "-in"])
        .arg(&public)
        .output()
        .unwrap();
    assert!(der.status.success());
    assert_eq!(
        pin,
        format!("sha256/{}", b64().encode(sha2::Sha256::digest(&der.stdout)))
    );
    // And a manifest signed by the key verifies under exactly that pin.
    let folder = release_dir(dir.path());
    sign(&folder, "v1", 1, &key, &[]);
    assert_eq!(
        verify(&folder.join("manifest.json"), &[&pin], 1, &[]),
        Ok(())
    );
    // No key is ever printed, and an existing key is never overwritten.
    let again = release(&["keygen", "--out", path(&key)]);
    assert_eq!(again.status.code(), Some(1));
    assert!(!stdout(&again).contains("PRIVATE"));
}

#[test]
fn a_threshold_counts_distinct_pinned_signers_only() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, alice_pin) = keygen(dir.path(), "alice");
    let (bob, bob_pin) = keygen(dir.path(), "bob");
    let (_, carol_pin) = keygen(dir.path(), "carol");
    let folder = release_dir(dir.path());
    sign(
        &folder,
        "v1",
        14,
        &alice,
        &[&dir.path().join("bob.pub.pem")],
    );
    let manifest = folder.join("manifest.json");
    assert_eq!(
        verify(&manifest, &[&alice_pin, &bob_pin], 2, &[]),
        Err("threshold".into())
    );
    let out = cosign(&manifest, &bob);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        verify(
            &manifest,
            &[&alice_pin, &bob_pin],
            2,
            &["--dir", path(&folder)]
        ),
        Ok(())
    );
    // Bob is not pinned: his signature does not count.
    assert_eq!(
        verify(&manifest, &[&alice_pin, &carol_pin], 2, &[]),
        Err("threshold".into())
    );
    // One key that signed twice counts once.
    let mut published: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let first = published["signatures"][0].clone();
    published["signatures"] = serde_json::json!([first.clone(), first]);
    let twice = folder.join("twice.json");
    std::fs::write(&twice, published.to_string()).unwrap();
    assert_eq!(
        verify(&twice, &[&alice_pin, &bob_pin], 2, &[]),
        Err("threshold".into())
    );
    // Cosigning again with the same key is refused outright.
    assert_eq!(cosign(&manifest, &bob).status.code(), Some(1));
}

#[test]
fn digest_expiry_product_and_malformed_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, pin) = keygen(dir.path(), "alice");
    let folder = release_dir(dir.path());
    sign(&folder, "v1", 3, &alice, &[]);
    let manifest = folder.join("manifest.json");
    assert_eq!(
        verify(&manifest, &[&pin], 1, &["--dir", path(&folder)]),
        Ok(())
    );
    assert_eq!(
        verify(&manifest, &[&pin], 1, &["--service", "other-svc"]),
        Err("product".into())
    );
    // The signature is good for 30 days: a clock 31 days on says expired.
    let later = (chrono::Utc::now() + chrono::Duration::days(31))
        .timestamp()
        .to_string();
    assert_eq!(
        verify(&manifest, &[&pin], 1, &["--at", &later]),
        Err("expired".into())
    );
    // One flipped byte in an artifact.
    let conf = folder.join("edge.conf");
    let mut bytes = std::fs::read(&conf).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&conf, bytes).unwrap();
    assert_eq!(
        verify(&manifest, &[&pin], 1, &["--dir", path(&folder)]),
        Err("digest".into())
    );
    let garbage = folder.join("garbage.json");
    std::fs::write(
        &garbage,
        "{\"manifest\": \"not base64 %%\", \"signatures\": []}",
    )
    .unwrap();
    assert_eq!(verify(&garbage, &[&pin], 1, &[]), Err("malformed".into()));
}

#[test]
fn a_private_key_readable_by_others_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (alice, _) = keygen(dir.path(), "alice");
    std::fs::set_permissions(&alice, std::fs::Permissions::from_mode(0o640)).unwrap();
    let folder = release_dir(dir.path());
    let out = release(&[
        "sign",
        path(&folder),
        "--service",
        "edge-svc",
        "--version",
        "v1",
        "--sequence",
        "1",
        "--key",
        path(&alice),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("chmod 600"), "{}", stderr(&out));
    assert!(!folder.join("manifest.json").exists());
}

fn openssl(args: &[&str]) -> std::process::Output {
    let out = std::process::Command::new("openssl")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "openssl {args:?}: {}", stderr(&out));
    out
}

/// A body as its signer wrote it, and the published manifest with openssl's signature.
fn signed_by_openssl(dir: &Path, folder: &Path, body_text: &str) -> PathBuf {
    let key = dir.join("ossl.pem");
    let body = dir.join("body.json");
    std::fs::write(&body, body_text).unwrap();
    let sig = dir.join("sig.der");
    openssl(&[
        "dgst",
        "-sha256",
        "-sign",
        path(&key),
        "-out",
        path(&sig),
        path(&body),
    ]);
    let der = std::fs::read(&sig).unwrap();
    let raw = p256::ecdsa::Signature::from_der(&der).unwrap().to_bytes();
    let kid = openssl_pin(dir);
    let published = serde_json::json!({
        "manifest": b64().encode(body_text),
        "signatures": [{"kid": kid, "sig": b64().encode(raw)}],
    });
    let manifest = folder.join("manifest.json");
    std::fs::write(&manifest, published.to_string()).unwrap();
    manifest
}

fn openssl_key(dir: &Path) {
    let key = dir.join("ossl.pem");
    openssl(&[
        "ecparam",
        "-name",
        "prime256v1",
        "-genkey",
        "-noout",
        "-out",
        path(&key),
    ]);
}

fn openssl_spki(dir: &Path) -> Vec<u8> {
    openssl(&[
        "ec",
        "-in",
        path(&dir.join("ossl.pem")),
        "-pubout",
        "-outform",
        "DER",
    ])
    .stdout
}

fn openssl_pin(dir: &Path) -> String {
    format!(
        "sha256/{}",
        b64().encode(sha2::Sha256::digest(openssl_spki(dir)))
    )
}

/// The canonical body (serde_json sorts keys and writes compact JSON) for `folder`'s files.
fn body_for(dir: &Path, folder: &Path) -> serde_json::Value {
    let artifact = |name: &str, platform: &str| {
        let bytes = std::fs::read(folder.join(name)).unwrap();
        let digest: String = sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        serde_json::json!({"name": name, "platform": platform, "sha256": digest, "size": bytes.len()})
    };
    serde_json::json!({
        "type": "rollgate.release", "spec": 1, "service": "edge-svc", "version": "v1",
        "sequence": 7, "issuedAt": "2026-01-01T00:00:00Z", "expiresAt": "2099-01-01T00:00:00Z",
        "keys": [{"kid": openssl_pin(dir), "alg": "ES256", "spki": b64().encode(openssl_spki(dir))}],
        "artifacts": [artifact("edge-svc", "linux-x86_64"), artifact("edge.conf", "any")],
    })
}

#[test]
fn a_manifest_signed_with_openssl_verifies_and_a_reordered_body_is_not_canonical() {
    let dir = tempfile::tempdir().unwrap();
    let folder = release_dir(dir.path());
    openssl_key(dir.path());
    let pin = openssl_pin(dir.path());
    let body = body_for(dir.path(), &folder);
    let manifest = signed_by_openssl(dir.path(), &folder, &body.to_string());
    assert_eq!(
        verify(&manifest, &[&pin], 1, &["--dir", path(&folder)]),
        Ok(())
    );
    // The same content with its keys in another order, validly signed: refused.
    let text = body.to_string();
    let reordered = format!(
        "{{\"version\":\"v1\",{}",
        text.trim_start_matches('{')
            .replace(",\"version\":\"v1\"", "")
    );
    assert_ne!(reordered, text);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&reordered).unwrap(),
        body
    );
    let manifest = signed_by_openssl(dir.path(), &folder, &reordered);
    assert_eq!(
        verify(&manifest, &[&pin], 1, &[]),
        Err("not-canonical".into())
    );
}

#[test]
fn a_manifest_signed_by_rollgate_verifies_with_openssl() {
    let dir = tempfile::tempdir().unwrap();
    let (alice, _) = keygen(dir.path(), "alice");
    let folder = release_dir(dir.path());
    sign(&folder, "v1", 1, &alice, &[]);
    let published: serde_json::Value =
        serde_json::from_slice(&std::fs::read(folder.join("manifest.json")).unwrap()).unwrap();
    let body = dir.path().join("body.bin");
    std::fs::write(
        &body,
        b64()
            .decode(published["manifest"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let raw = b64()
        .decode(published["signatures"][0]["sig"].as_str().unwrap())
        .unwrap();
    assert_eq!(raw.len(), 64, "r‖s, not DER");
    let der = p256::ecdsa::Signature::from_slice(&raw).unwrap().to_der();
    let sig = dir.path().join("sig.der");
    std::fs::write(&sig, der.as_bytes()).unwrap();
    let public = dir.path().join("alice.pub.pem");
    let out = openssl(&[
        "dgst",
        "-sha256",
        "-verify",
        path(&public),
        "-signature",
        path(&sig),
        path(&body),
    ]);
    assert_eq!(stdout(&out).trim(), "Verified OK");
}

/// A root that trusts one key; `releases/<version>/` signed with `sequence`.
struct SignedSite {
    site: Site,
    keys: tempfile::TempDir,
    key: PathBuf,
}

impl SignedSite {
    fn new() -> SignedSite {
        let site = Site::new();
        let keys = tempfile::tempdir().unwrap();
        let (key, pin) = keygen(keys.path(), "alice");
        write(
            site.root(),
            "trust.json",
            &serde_json::json!({"pins": [pin], "threshold": 1}).to_string(),
        );
        SignedSite { site, keys, key }
    }

    fn signed_release(&self, version: &str, sequence: u64, args: &str) {
        self.site.release(version, args);
        let folder = self.site.root().join("releases").join(version);
        sign(&folder, version, sequence, &self.key, &[]);
        let _ = &self.keys;
    }

    fn floor(&self) -> Option<serde_json::Value> {
        std::fs::read(self.site.root().join("release-floor"))
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }
}

#[test]
fn a_root_with_a_trust_file_runs_only_signed_releases_never_below_its_floor() {
    let s = SignedSite::new();
    let site = &s.site;
    site.release("unsigned", "");
    let out = site.deploy(free_port(), "unsigned", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("(malformed"), "{}", stderr(&out));
    assert!(site.log_lines().is_empty() && site.processes().is_empty());

    s.signed_release("v14", 14, "");
    let port = free_port();
    let out = site.deploy(port, "v14", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(s.floor().unwrap()["sequence"], 14);
    assert_eq!(version_on(port).as_deref(), Some("v14"));
    // What ran is rollgate's own read-only copy of the bytes it verified.
    let copy = site.root().join(".verified/v14/edge-svc");
    assert_eq!(
        std::fs::read(&copy).unwrap(),
        std::fs::read(site.root().join("releases/v14/edge-svc")).unwrap()
    );
    {
        // Read-only, in a folder only its service's group (and rollgate) may enter.
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let mode = std::fs::metadata(&copy).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o555);
        let folder = std::fs::metadata(copy.parent().unwrap()).unwrap();
        assert_eq!(folder.permissions().mode() & 0o777, 0o750);
        let user: serde_json::Value =
            serde_json::from_slice(&std::fs::read(site.root().join("service-user.json")).unwrap())
                .unwrap();
        assert_eq!(u64::from(folder.gid()), user["gid"].as_u64().unwrap());
    }
    let promoted = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "promoted")
        .unwrap();
    assert_eq!(promoted["sequence"], 14);
    assert_eq!(
        promoted["manifest_sha256"],
        s.floor().unwrap()["manifest_sha256"]
    );

    // Older: refused before anything starts, floor unchanged.
    s.signed_release("v13", 13, "");
    let before = site.log_lines().len();
    let out = site.deploy(free_port(), "v13", &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("refused (rollback"),
        "{}",
        stderr(&out)
    );
    assert_eq!(site.log_lines().len(), before);
    assert_eq!(s.floor().unwrap()["sequence"], 14);

    // Re-deploying the floor's own manifest is allowed; rolling forward to 15 too.
    let out = site.deploy(free_port(), "v14", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    s.signed_release("v15", 15, "");
    let out = site.deploy(free_port(), "v15", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(s.floor().unwrap()["sequence"], 15);

    // The history shows each signed attempt's sequence and manifest digest.
    let out = rollgate()
        .args(["log", "history", "--format", "csv"])
        .arg(site.root().join("deploy.log"))
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(
        text.lines()
            .next()
            .unwrap()
            .ends_with(",sequence,manifest_sha256"),
        "{text}"
    );
    let digest = s.floor().unwrap()["manifest_sha256"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(text.contains(&format!(",15,{digest}")), "{text}");
}

#[test]
fn a_deployer_killed_between_verify_and_the_switch_leaves_the_floor() {
    let s = SignedSite::new();
    let site = &s.site;
    s.signed_release("v14", 14, "");
    assert_eq!(site.deploy(free_port(), "v14", &[]).status.code(), Some(0));
    let floor = s.floor().unwrap();
    s.signed_release("v15", 15, "--ready-after-ms 60000");
    let mut deploy = site.deploy_in_background("v15", "30000");
    std::thread::sleep(Duration::from_millis(300));
    send_signal(deploy.id() as i32, 9);
    deploy.wait().unwrap();
    assert_eq!(s.floor().unwrap(), floor);
    // The next deploy cleans up; the floor still says 14.
    s.signed_release("v16", 16, "");
    assert_eq!(site.deploy(free_port(), "v16", &[]).status.code(), Some(0));
    assert_eq!(s.floor().unwrap()["sequence"], 16);
    assert_eq!(count_events(site, "rolled_back", "v15"), 1);
}

#[test]
fn a_release_file_swapped_during_deploys_never_runs_the_replacement() {
    let s = SignedSite::new();
    let site = &s.site;
    s.signed_release("v1", 1, "");
    let folder = site.root().join("releases/v1");
    let marker = site.root().join("evil-ran");
    // Two prepared files swapped in by rename, over and over: the signed one and another.
    let good = std::fs::read(folder.join("edge-svc")).unwrap();
    let evil = format!("#!/bin/sh\ntouch '{}'\nexec sleep 1000\n", marker.display());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (folder, stop) = (folder.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut flip = false;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let tmp = folder.join(".swap");
                std::fs::write(&tmp, if flip { evil.as_bytes() } else { &good[..] }).unwrap();
                make_executable(&tmp);
                std::fs::rename(&tmp, folder.join("edge-svc")).unwrap();
                flip = !flip;
                std::thread::sleep(Duration::from_micros(300));
            }
        })
    };
    // At least eight deploys, and on until one has read the signed file: each one finds either
    // file, so eight refusals in a row happen about once in 256 runs (seen once under load).
    let mut outcomes = Vec::new();
    while outcomes.len() < 8
        || (outcomes.len() < 40 && !outcomes.iter().any(|(code, _)| *code == Some(0)))
    {
        let out = site.deploy(free_port(), "v1", &[]);
        outcomes.push((out.status.code(), stderr(&out)));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    for (code, err) in &outcomes {
        assert!(
            *code == Some(0) || (*code == Some(2) && err.contains("(digest")),
            "{code:?} {err}"
        );
    }
    assert!(
        outcomes.iter().any(|(code, _)| *code == Some(0)),
        "{outcomes:?}"
    );
    assert!(!marker.exists(), "the replacement ran");
}

/// A free block of `count` ports, as `--ports` takes it (common's `port_block`: never handed
/// to two tests of one run).
fn port_range(count: u16) -> String {
    let first = port_block(count);
    format!("{first}-{}", first + count - 1)
}

#[test]
fn a_signed_rollout_raises_the_floor_even_when_a_resume_finishes_it() {
    let s = SignedSite::new();
    let site = &s.site;
    let rollout = |version: &str, extra: &[&str]| {
        rollgate()
            .args(["rollout", "edge-svc", version, "--root"])
            .arg(site.root())
            .args(extra)
            .timeout(Duration::from_secs(60))
            .output()
            .unwrap()
    };
    s.signed_release("v14", 14, "");
    let out = rollout(
        "v14",
        &[
            "--replicas",
            "2",
            "--ports",
            &port_range(8),
            "--deadline-ms",
            "20000",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(s.floor().unwrap()["sequence"], 14);
    // Unsigned and older releases are refused before anything starts.
    s.signed_release("v13", 13, "");
    let out = rollout("v13", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("refused (rollback"),
        "{}",
        stderr(&out)
    );

    // v15's rollgate is killed in its soak; the resume that finishes it raises the floor.
    s.signed_release("v15", 15, "");
    let mut running = std::process::Command::new(crate::common::bin())
        .args(["rollout", "edge-svc", "v15", "--soak", "2s", "--root"])
        .arg(site.root())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(30, || count_events(site, "wave_completed", "v15") >= 1));
    send_signal(running.id() as i32, 9);
    running.wait().unwrap();
    assert_eq!(s.floor().unwrap()["sequence"], 14);
    let out = rollgate()
        .args(["rollout", "resume", "edge-svc", "--root"])
        .arg(site.root())
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(s.floor().unwrap()["sequence"], 15);
}

/// `release add --manifest` (issue 37): a signed release is verified against the root's trust
/// file and the staged files before it is renamed in, and deploys; a manifest for another
/// version, files changed after signing, or a root without a trust file refuse the install.
#[test]
fn release_add_with_a_manifest_installs_only_what_verifies() {
    let signed = SignedSite::new();
    let root = signed.site.root();
    let work = tempfile::tempdir().unwrap();
    let dist = release_dir(work.path());
    sign(&dist, "v1", 1, &signed.key, &[]);
    let manifest = dist.join("manifest.json");
    let add = |version: &str, root: &Path| {
        rollgate()
            .args(["release", "add", "edge-svc", version])
            .arg(&dist)
            .arg("--root")
            .arg(root)
            .arg("--manifest")
            .arg(&manifest)
            .output()
            .unwrap()
    };
    let out = add("v1", root);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("releases/v1/release.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(record["signed"], true);
    assert_eq!(
        std::fs::read(root.join("releases/v1/manifest.json")).unwrap(),
        std::fs::read(&manifest).unwrap()
    );
    let out = signed.site.deploy(free_port(), "v1", &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "admitted and promoted: {}",
        stderr(&out)
    );

    // The manifest names v1: not good for v2.
    let out = add("v2", root);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("for version v1"), "{}", stderr(&out));
    // A file changed after signing: the digest refuses it, and nothing is installed.
    write(&dist, "edge.conf", "workers = 64\n");
    let out = add("v1b", root);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("digest"), "{}", stderr(&out));
    assert!(!root.join("releases/v1b").exists());
    // A root with no trust file has nothing to verify against.
    let bare = Site::new();
    let out = add("v1", bare.root());
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("trust.json"), "{}", stderr(&out));
    assert!(!bare.root().join("releases/v1").exists());
}
