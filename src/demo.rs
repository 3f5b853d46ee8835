//! `rollgate demo`: the lesson's story, deployed for real. Four releases of a sample service
//! (v1 good; v2 good; v3 ready only after 60 s; v4 exits 78 at boot) go through the real
//! deployer under the example policy; then the log tells what happened.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::log::output::Format;

const EXAMPLE_POLICY: &str = include_str!("../contracts/policy.ncl");

/// The story: version, what it does, the sample-service knobs that make it do that.
const RELEASES: [(&str, &str, &str); 4] = [
    ("v1", "ready after 200 ms", "--ready-after-ms 200"),
    ("v2", "ready after 300 ms", "--ready-after-ms 300"),
    ("v3", "ready only after 60 s", "--ready-after-ms 60000"),
    ("v4", "exits 78 at boot", "--exit-after-ms 0 --exit-code 78"),
];

pub fn run(root: Option<PathBuf>) -> Result<(), String> {
    let started = Instant::now();
    let root = match root {
        Some(root) => {
            std::fs::create_dir_all(&root)
                .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
            if root.join("current").exists() || root.join("deploy.log").exists() {
                return Err(format!(
                    "{} already holds a deploy (current or deploy.log); give the demo an empty folder",
                    root.display()
                ));
            }
            std::path::absolute(&root).unwrap_or(root)
        }
        None => tempfile::Builder::new()
            .prefix("rollgate-demo-")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary folder: {e}"))?
            .keep(),
    };
    let me = std::env::current_exe().map_err(|e| format!("cannot find rollgate itself: {e}"))?;
    write_releases(&root, &me)?;
    let policy = root.join("policy.ncl");
    std::fs::write(&policy, EXAMPLE_POLICY)
        .map_err(|e| format!("cannot write {}: {e}", policy.display()))?;

    println!(
        "rollgate demo: four releases of edge-svc, deployed in order under {}",
        root.display()
    );
    println!(
        "policy: policy.ncl (1500 ms to become ready, polled every 100 ms, roll back on a stall)\n"
    );
    for (version, behaviour, _) in RELEASES {
        let port = free_port()?;
        let out = Command::new(&me)
            .args(["deploy", "edge-svc", &port.to_string(), version, "--policy"])
            .arg(&policy)
            .arg("--root")
            .arg(&root)
            .env("NO_COLOR", "1")
            .output()
            .map_err(|e| format!("cannot run the deployer: {e}"))?;
        let outcome = match out.status.code() {
            Some(0) => "promoted".to_string(),
            Some(1) => format!("rolled back: {}", last_reason(&root)),
            _ => format!("refused: {}", String::from_utf8_lossy(&out.stderr).trim()),
        };
        println!("  {version}  {behaviour:<22} -> {outcome}");
    }

    let log = root.join("deploy.log");
    let reading = crate::log::Reading::default();
    let summary = crate::log::summary(
        std::slice::from_ref(&log),
        false,
        Format::Json,
        &reading,
        None,
    )
    .map_err(|e| e.to_string())?;
    let history = crate::log::history(std::slice::from_ref(&log), Format::Table, &reading)
        .map_err(|e| e.to_string())?;
    println!("\nWhat the log says (rollgate log summary deploy.log):\n{summary}");
    println!("Each attempt (rollgate log history deploy.log):\n{history}");

    let stopped = stop_live(&root, &me);
    println!("{stopped}");
    println!(
        "Files: {0}/deploy.log, {0}/current, {0}/releases/ (took {1:.1} s). Look again with:\n  rollgate log stats {0}/deploy.log\n  rollgate status --root {0}",
        root.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn write_releases(root: &Path, me: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    for (version, _, knobs) in RELEASES {
        let dir = root.join("releases").join(version);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let path = dir.join("edge-svc");
        let script = format!(
            "#!/bin/sh\nexec '{}' sample-service {knobs}\n",
            me.display()
        );
        std::fs::write(&path, script)
            .and_then(|_| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port on 127.0.0.1: {e}"))
}

fn last_reason(root: &Path) -> String {
    let Ok((log, _)) = crate::log::read::read_log(&root.join("deploy.log"), Default::default())
    else {
        return "(no log)".into();
    };
    log.detail
        .last()
        .cloned()
        .flatten()
        .map(|d| crate::log::summary::reason_of(&d).to_string())
        .unwrap_or_default()
}

/// A demo leaves nothing running: the live release is stopped at the end (a real deploy
/// leaves it serving, of course).
fn stop_live(root: &Path, me: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(root.join("current")) else {
        return "Nothing is live.".into();
    };
    let Ok(pointer) = serde_json::from_str::<serde_json::Value>(&text) else {
        return "current is unreadable; nothing stopped.".into();
    };
    let version = pointer["version"].as_str().unwrap_or("?").to_string();
    let pid = pointer["pid"].as_i64().unwrap_or(0) as i32;
    let start = pointer["start_time"].as_u64().unwrap_or(0);
    let answering = Command::new(me)
        .args(["status", "--format", "json", "--root"])
        .arg(root)
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
        .and_then(|v| v["live"]["answering"].as_bool())
        .unwrap_or(false);
    crate::deploy::stop_release(pid, start);
    format!(
        "Live release: {version} ({}). The demo stopped it so nothing is left running.",
        if answering {
            "answering on /readyz"
        } else {
            "NOT answering"
        }
    )
}
