//! `rollgate release add` (issue 37): a file, a folder and an archive installed whole, with
//! their record; hostile archives refused with `releases/` unchanged byte for byte; a `kill -9`
//! at any moment of an install never leaves a version that a deploy could see half-made.

use crate::common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::Value;

fn add(root: &Path, version: &str, source: &Path, extra: &[&str]) -> Output {
    rollgate()
        .args(["release", "add", "edge-svc", version])
        .arg(source)
        .arg("--root")
        .arg(root)
        .args(extra)
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap()
}

/// Every path under `dir` with its kind and content: a byte-for-byte picture.
fn picture(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut seen = BTreeMap::new();
    fn walk(top: &Path, dir: &Path, seen: &mut BTreeMap<String, Vec<u8>>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = path.strip_prefix(top).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                seen.insert(format!("{name}/"), Vec::new());
                walk(top, &path, seen);
            } else if meta.file_type().is_symlink() {
                seen.insert(
                    name,
                    std::fs::read_link(&path)
                        .unwrap()
                        .display()
                        .to_string()
                        .into_bytes(),
                );
            } else {
                seen.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    walk(dir, dir, &mut seen);
    seen
}

/// A folder holding the sample service as `edge-svc`, a config file and a nested folder.
fn release_folder(dir: &Path) -> PathBuf {
    let folder = dir.join("app");
    std::fs::create_dir_all(folder.join("conf/deep")).unwrap();
    let bin = crate::common::bin();
    write(
        &folder,
        "edge-svc",
        &format!("#!/bin/sh\nexec '{}' sample-service\n", bin.display()),
    );
    make_executable(&folder.join("edge-svc"));
    write(&folder, "conf/app.toml", "greeting = \"hello\"\n");
    write(&folder, "conf/deep/data.txt", "some data\n");
    std::os::unix::fs::symlink("conf/app.toml", folder.join("app.toml")).unwrap();
    folder
}

fn record(root: &Path, version: &str) -> Value {
    let text =
        std::fs::read_to_string(root.join("releases").join(version).join("release.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn sha256_of(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn a_file_a_folder_and_an_archive_are_each_installed_whole_with_their_record() {
    let site = Site::new();
    let work = tempfile::tempdir().unwrap();
    let folder = release_folder(work.path());
    let root = site.root();

    // A file: it becomes releases/v1/edge-svc, executable.
    let out = add(root, "v1", &folder.join("edge-svc"), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("installed: edge-svc v1 (1 file,"),
        "{}",
        stdout(&out)
    );
    let r = record(root, "v1");
    // Issue 67, 6: the tree's digest too, the one a manifest pins.
    assert!(
        stdout(&out).contains(&format!(
            "; tree sha256 {})",
            r["tree_sha256"].as_str().unwrap()
        )),
        "{}",
        stdout(&out)
    );
    assert_eq!(r["kind"], "file");
    assert_eq!(r["sha256"], sha256_of(&folder.join("edge-svc")));
    assert_eq!(r["source"], folder.join("edge-svc").display().to_string());
    assert!(r["installed_at"].as_f64().unwrap() > 1.7e9);

    // A folder: copied whole, its symlink kept.
    let out = add(root, "v2", &folder, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let installed = picture(&root.join("releases/v2"));
    let mut source = picture(&folder);
    source.insert(
        "release.json".into(),
        std::fs::read(root.join("releases/v2/release.json")).unwrap(),
    );
    assert_eq!(installed, source);
    let r = record(root, "v2");
    assert_eq!(
        (r["kind"].as_str(), r["files"].as_u64()),
        (Some("folder"), Some(3))
    );

    // An archive of the folder (`tar czf app.tgz app`): the same tree, the same tree digest.
    let archive = work.path().join("app.tgz");
    let out = std::process::Command::new("tar")
        .args(["czf"])
        .arg(&archive)
        .arg("-C")
        .arg(work.path())
        .arg("app")
        .output()
        .unwrap();
    assert!(out.status.success());
    let out = add(root, "v3", &archive, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let mut unpacked = picture(&root.join("releases/v3"));
    unpacked.remove("release.json");
    let mut from_folder = picture(&root.join("releases/v2"));
    from_folder.remove("release.json");
    assert_eq!(unpacked, from_folder);
    assert_eq!(
        record(root, "v3")["tree_sha256"],
        record(root, "v2")["tree_sha256"]
    );
    assert_eq!(record(root, "v3")["kind"], "archive");

    // The same bytes again: already installed (exit 0); other bytes under that name: refused.
    let out = add(root, "v3", &folder, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("already installed: edge-svc v3"),
        "{}",
        stdout(&out)
    );
    let before = picture(root);
    let out = add(root, "v3", &folder.join("edge-svc"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("already installed") && stderr(&out).contains("other content"),
        "{}",
        stderr(&out)
    );
    assert_eq!(picture(root), before);

    // An installed release deploys like any other.
    let out = site.deploy(free_port(), "v3", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Nothing staged is left behind.
    assert!(std::fs::read_dir(root.join("releases"))
        .unwrap()
        .flatten()
        .all(|e| !e.file_name().to_string_lossy().starts_with('.')));
}

/// Writes hostile archives with Python's tarfile (each one case) and returns them by name.
fn hostile_archives(dir: &Path, root: &Path) -> Vec<(String, PathBuf)> {
    let out = std::process::Command::new("python3")
        .arg(repo().join("tests/tools/hostile_archives.py"))
        .arg(dir)
        .arg(root)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut archives: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name()
                    .to_string_lossy()
                    .trim_end_matches(".tgz")
                    .to_string(),
                e.path(),
            )
        })
        .collect();
    archives.sort();
    archives
}

#[test]
fn hostile_archives_are_refused_and_leave_releases_byte_for_byte_unchanged() {
    let site = Site::new();
    let work = tempfile::tempdir().unwrap();
    let root = site.root();
    // A release already there, so that "unchanged" has something to keep.
    let folder = release_folder(work.path());
    assert_eq!(add(root, "v1", &folder, &[]).status.code(), Some(0));
    let archives_dir = work.path().join("hostile");
    std::fs::create_dir(&archives_dir).unwrap();
    let archives = hostile_archives(&archives_dir, root);
    assert!(archives.len() >= 24, "{archives:?}");
    let outside = std::fs::read_dir(work.path()).unwrap().count();
    for (case, archive) in &archives {
        let before = picture(&root.join("releases"));
        let out = add(
            root,
            "v9",
            archive,
            &["--max-bytes", "1000", "--max-entries", "10"],
        );
        assert_eq!(
            out.status.code(),
            Some(2),
            "{case}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        assert!(
            stderr(&out).contains(&archive.display().to_string()),
            "{case} names the file: {}",
            stderr(&out)
        );
        assert!(
            !stderr(&out).contains("panicked"),
            "{case}: {}",
            stderr(&out)
        );
        assert_eq!(
            picture(&root.join("releases")),
            before,
            "{case} changed releases/"
        );
        assert!(!root.join("releases/v9").exists());
        assert!(!Path::new("/tmp/evil").exists() && !work.path().join("evil").exists());
    }
    assert_eq!(
        std::fs::read_dir(work.path()).unwrap().count(),
        outside,
        "nothing written beside"
    );
    // Each refusal says what was wrong.
    let said = |case: &str| {
        let archive = &archives.iter().find(|(c, _)| c == case).unwrap().1;
        stderr(&add(
            root,
            "v9",
            archive,
            &["--max-bytes", "1000", "--max-entries", "10"],
        ))
    };
    assert!(said("absolute").contains("is absolute"));
    assert!(said("dotdot").contains("climbs out"));
    assert!(said("symlink-up").contains("leads outside"));
    assert!(said("symlink-absolute").contains("not a folder of the system"));
    assert!(said("symlink-into-release").contains("climbs with `..`"));
    // A link to /tmp is refused as a link now, before anything is written through it.
    assert!(said("write-through-absolute-symlink").contains("not a folder of the system"));
    assert!(said("hardlink-absolute").contains("absolute"));
    assert!(said("fifo").contains("fifo"));
    assert!(said("char-device").contains("device"));
    assert!(said("replaces-record").contains("release.json"));
    assert!(said("too-big").contains("--max-bytes"));
    assert!(said("claims-3-gib").contains("--max-bytes"));
    assert!(said("too-many").contains("--max-entries"));
    let unlimited = |case: &str| {
        let archive = &archives.iter().find(|(c, _)| c == case).unwrap().1;
        stderr(&add(root, "v9", archive, &[]))
    };
    assert!(
        unlimited("truncated").contains("truncated or corrupt"),
        "{}",
        unlimited("truncated")
    );
    assert!(
        unlimited("garbage").contains("corrupt"),
        "{}",
        unlimited("garbage")
    );
    assert!(said("no-executable").contains("no executable"));
}

#[test]
fn a_release_add_killed_at_any_moment_leaves_no_version_half_made() {
    let site = Site::new();
    let work = tempfile::tempdir().unwrap();
    let root = site.root();
    let folder = release_folder(work.path());
    // Enough files that a kill lands in the middle of the copy.
    for i in 0..400 {
        write(
            &folder,
            &format!("conf/deep/f{i}.txt"),
            &"data ".repeat(200),
        );
    }
    let expected = picture(&folder);
    let started = std::time::Instant::now();
    assert_eq!(add(root, "timed", &folder, &[]).status.code(), Some(0));
    let whole = started.elapsed();
    std::fs::remove_dir_all(root.join("releases/timed")).unwrap();
    let mut seen_whole = 0;
    for round in 0..20u64 {
        let version = format!("k{round}");
        let mut child = std::process::Command::new(crate::common::bin())
            .args(["release", "add", "edge-svc", &version])
            .arg(&folder)
            .arg("--root")
            .arg(root)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // How long a whole install takes, measured once, sets where the kills land: from
        // right at the start to well past its end (up to four times it: on a loaded machine
        // a later install can take twice as long as the one measured).
        std::thread::sleep(whole.mul_f64(round as f64 / 5.0));
        send_signal(child.id() as i32, 9);
        let _ = child.wait();
        let dir = root.join("releases").join(&version);
        if dir.exists() {
            // Renamed in: whole, with its record.
            let mut got = picture(&dir);
            assert!(
                got.remove("release.json").is_some(),
                "{version} has its record"
            );
            assert_eq!(got, expected, "{version} is whole");
            seen_whole += 1;
        }
        // No other version appears, whole or not.
        let Ok(entries) = std::fs::read_dir(root.join("releases")) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            assert!(
                name.starts_with('.') || name.starts_with('k'),
                "unexpected {name}"
            );
        }
    }
    // The next install clears what the dead ones staged, and deploys see only whole versions.
    let out = add(root, "after", &folder, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let hidden: Vec<String> = std::fs::read_dir(root.join("releases"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(hidden.is_empty(), "{hidden:?}");
    eprintln!("{seen_whole} of 20 killed installs had renamed in (a whole install: {whole:?})");
    assert!(
        seen_whole > 0 && seen_whole < 20,
        "the kills landed on both sides of the rename"
    );
}

/// A Python application as its developers ship it: `python3 -m venv` (whose interpreter is an
/// absolute link to the system's) beside the code, and a Node-style `node_modules/.bin` link.
fn python_app(dir: &Path, greeting: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let app = dir.join(format!("app-{greeting}"));
    std::fs::create_dir_all(&app).unwrap();
    // The system's interpreter, which every user may run: the release runs as its service's
    // own uid, and a venv links to the interpreter that made it (not one under /root).
    let python = ["/usr/bin/python3", "python3"]
        .into_iter()
        .find(|p| !p.starts_with('/') || Path::new(p).exists())
        .unwrap();
    let venv = std::process::Command::new(python)
        .args(["-m", "venv", "--without-pip", "venv"])
        .current_dir(&app)
        .output()
        .unwrap();
    assert!(venv.status.success(), "{}", stderr(&venv));
    let interpreter = std::fs::read_link(app.join("venv/bin/python3"))
        .or_else(|_| std::fs::read_link(app.join("venv/bin/python")))
        .unwrap();
    assert!(interpreter.is_absolute(), "{interpreter:?}");
    write(
        &app,
        "app.py",
        &format!(
            "import http.server, os\n\
             class Answer(http.server.BaseHTTPRequestHandler):\n\
             \x20   def do_GET(self):\n\
             \x20       body = b'{greeting}\\n'\n\
             \x20       self.send_response(200)\n\
             \x20       self.send_header('content-length', str(len(body)))\n\
             \x20       self.end_headers()\n\
             \x20       self.wfile.write(body)\n\
             \x20   def log_message(self, *args):\n\
             \x20       pass\n\
             http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), Answer).serve_forever()\n"
        ),
    );
    write(&app, "node_modules/tool/cli.js", "// a package's command\n");
    std::fs::create_dir_all(app.join("node_modules/.bin")).unwrap();
    std::os::unix::fs::symlink("../tool/cli.js", app.join("node_modules/.bin/tool")).unwrap();
    let launcher = write(
        &app,
        "edge-svc",
        "#!/bin/sh\nexec venv/bin/python3 app.py\n",
    );
    std::fs::set_permissions(&launcher, std::fs::Permissions::from_mode(0o755)).unwrap();
    app
}

/// Issue 58: a virtual environment was refused (`venv/bin/python3: a symlink to /usr/...
/// leads outside the release`), and `release list` showed the launcher's digest, the same for
/// every release of an application whose launcher never changes.
#[test]
fn a_python_virtual_environment_installs_and_runs_and_each_release_has_its_own_digest() {
    let site = Site::new();
    let work = tempfile::tempdir().unwrap();
    for (version, greeting) in [("v1", "hello"), ("v2", "bonjour")] {
        let out = add(
            site.root(),
            version,
            &python_app(work.path(), greeting),
            &[],
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let link = site
            .root()
            .join(format!("releases/{version}/node_modules/.bin/tool"));
        assert_eq!(
            std::fs::read_link(link).unwrap(),
            PathBuf::from("../tool/cli.js")
        );
    }
    let port = free_port();
    let out = site.deploy(port, "v2", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(version_on(port).as_deref(), Some("bonjour"));
    let listed = rollgate()
        .args(["release", "list", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let rows: Vec<serde_json::Value> = stdout(&listed)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2);
    // The same launcher, bytes for bytes; the releases differ in app.py, and say so.
    assert_eq!(rows[0]["sha256"], rows[1]["sha256"]);
    assert_ne!(rows[0]["digest"], rows[1]["digest"]);
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(site.root().join("releases/v2/release.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rows[1]["digest"], record["tree_sha256"]);
    let table = rollgate()
        .args(["release", "list", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let short = &record["tree_sha256"].as_str().unwrap()[..12];
    assert!(stdout(&table).contains(short), "{}", stdout(&table));
}

/// Issue 58: with no `keep_releases` in the policy every release was kept for ever (30 MB each
/// for a Python application); the default keeps five and whatever the root still needs.
#[test]
fn the_default_retention_keeps_five_releases() {
    let site = Site::new();
    let port = port_block(2);
    // Installed first and never deployed: waiting its turn, so never pruned.
    site.add_sample("queued", "");
    for n in 1..=7 {
        site.add_sample(&format!("v{n}"), "");
        let out = site.deploy(port + (n % 2), &format!("v{n}"), &[]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    // Pruned ones are renamed away at once (their files deleted in the background).
    assert_eq!(
        site.release_folders(),
        ["queued", "v3", "v4", "v5", "v6", "v7"]
    );
    // 0 keeps them all.
    let elsewhere = tempfile::tempdir().unwrap();
    let policy = write(
        elsewhere.path(),
        "keep-all.json",
        r#"{"edge_svc": {"progress_deadline_ms": 5000, "poll_ms": 100, "max_unavailable_pct": 0, "max_surge_pct": 100, "on_stall": "rollback", "keep_releases": 0}}"#,
    );
    for n in 8..=9 {
        site.add_sample(&format!("v{n}"), "");
        let out = site.deploy(
            port + (n % 2),
            &format!("v{n}"),
            &["--policy", policy.to_str().unwrap()],
        );
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    assert_eq!(site.release_folders().len(), 8);
}

/// Issue 67, 3: a folder built as Python builds it — its virtual environment's console
/// scripts start the interpreter by its absolute path in the build folder, out of a confined
/// release's reach. `release add` installs it and says which scripts do, and the way out;
/// scripts whose interpreter is the system's or the release's own are not named.
#[test]
fn release_add_names_scripts_whose_interpreter_is_outside_the_release() {
    let site = Site::new();
    let build = tempfile::tempdir().unwrap();
    let script = |name: &str, text: &str| {
        let path = write(build.path(), name, text);
        make_executable(&path);
    };
    script(
        "edge-svc",
        "#!/bin/sh\nexec venv/bin/python -m gunicorn app\n",
    );
    let interpreter = format!("{}/venv/bin/python3", build.path().display());
    script(
        "venv/bin/gunicorn",
        &format!("#!{interpreter}\nimport sys\n"),
    );
    script("venv/bin/flask", &format!("#!{interpreter}\nimport sys\n"));
    script("tools/check", "#!/usr/bin/env python3\n");
    let out = add(site.root(), "v1", build.path(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("2 scripts of v1 start an interpreter outside the release"),
        "{said}"
    );
    assert!(
        said.contains(&format!("venv/bin/gunicorn (#!{interpreter})")),
        "{said}"
    );
    assert!(said.contains("-m gunicorn"), "{said}");
    assert!(
        !said.contains("tools/check") && !said.contains("edge-svc ("),
        "{said}"
    );
}

/// Issue 81, 1 and 2: a Django project's package folder named like the service (`shop/` for
/// service `shop`) beside a Procfile's `web:` line was refused as "both an executable and a
/// `web:` line" (a folder is not an executable); a virtual environment made by pyenv's Python
/// links its interpreter outside the system's folders: refused at once with the way out (it
/// failed at the first deploy with a bare "Permission denied").
#[test]
fn a_django_package_named_like_the_service_installs_and_a_pyenv_venv_is_told_the_way_out() {
    let site = Site::new();
    let build = tempfile::tempdir().unwrap();
    write(build.path(), "shop/settings.py", "DEBUG = False\n");
    write(build.path(), "shop/__init__.py", "");
    write(
        build.path(),
        "Procfile",
        "web: python3 -m http.server $PORT\n",
    );
    let out = rollgate()
        .args(["release", "add", "shop", "v1"])
        .arg(build.path())
        .arg("--root")
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(site.root().join("releases/v1/shop/settings.py").is_file());
    // pyenv's interpreter, linked from the venv.
    std::fs::create_dir_all(build.path().join("venv/bin")).unwrap();
    std::os::unix::fs::symlink(
        "/root/.pyenv/versions/3.11.7/bin/python3",
        build.path().join("venv/bin/python3"),
    )
    .unwrap();
    let out = rollgate()
        .args(["release", "add", "shop", "v2"])
        .arg(build.path())
        .arg("--root")
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("venv/bin/python3"), "{said}");
    assert!(said.contains("/usr/bin/python3 -m venv"), "{said}");
    assert!(!site.root().join("releases/v2").exists());
}
