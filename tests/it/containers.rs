//! Container releases (issue 60) through the real Docker Engine: an image from a `docker save`
//! archive is installed pinned by its digest and deployed through the same gate as a process
//! release, confined by the engine, and gone when it is retired.

use crate::common::engine::{containers_of, docker, docker_host, inspect, sample_image};
use crate::common::*;

/// `rollgate ARGS --root ROOT` with the test engine as `DOCKER_HOST`.
fn run(site: &Site, args: &[&str]) -> std::process::Output {
    rollgate()
        .args(args)
        .arg("--root")
        .arg(site.root())
        .env("DOCKER_HOST", docker_host())
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .unwrap()
}

fn add_image(site: &Site, version: &str, archive: &std::path::Path) -> std::process::Output {
    let source = format!("docker-archive:{}", archive.display());
    run(site, &["release", "add", "edge-svc", version, &source])
}

/// A release's `image.json`.
fn pinned(site: &Site, version: &str) -> serde_json::Value {
    let path = site.root().join(format!("releases/{version}/image.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// What the live release answers to `GET /` on its own port.
fn live_answer(site: &Site) -> (u16, String) {
    let port = site.pointer().unwrap()["port"].as_u64().unwrap() as u16;
    let answer = crate::common::http::Conn::open(port)
        .unwrap()
        .get("/", "")
        .unwrap();
    (answer.status, answer.body)
}

/// Waits (up to 20 s) until the root's containers are `count` containers, all of `version`.
fn only_containers_of(site: &Site, version: &str, count: usize) -> bool {
    let label = format!("dev.rollgate.version={version}");
    wait_for(20, || {
        let left = containers_of(site.root());
        left.len() == count
            && left
                .iter()
                .all(|c| c["Labels"].as_str().unwrap_or("").contains(&label))
    })
}

fn deploy(site: &Site, version: &str) -> std::process::Output {
    let port = free_port().to_string();
    run(
        site,
        &[
            "deploy",
            "edge-svc",
            &port,
            version,
            "--deadline-ms",
            "30000",
        ],
    )
}

#[test]
fn a_docker_archive_is_a_release_pinned_by_digest_gated_confined_and_retired() {
    let site = Site::new();
    let archive = sample_image(&[]);
    let out = add_image(&site, "v1", &archive);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Pinned by the engine's image ID, in the record and in the launcher a manifest signs.
    let release = site.root().join("releases/v1");
    let image = pinned(&site, "v1");
    let id = image["image"].as_str().unwrap().to_string();
    assert!(id.starts_with("sha256:") && id.len() == 71, "{image}");
    // Issue 67, 6: `release add` says the image it pinned.
    assert!(
        stdout(&out).contains(&format!("; image {id})")),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        image["source"],
        format!("docker-archive:{}", archive.display())
    );
    let launcher = std::fs::read_to_string(release.join("edge-svc")).unwrap();
    assert!(launcher.contains(&format!("--image {id}")), "{launcher}");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(release.join("release.json")).unwrap())
            .unwrap();
    assert_eq!(record["kind"], "image");
    // The same archive again: the same release, nothing changed.
    let again = add_image(&site, "v1", &archive);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));

    // Deployed through the gate: live, answering as v1 (its version reached the container).
    let out = deploy(&site, "v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(live_answer(&site), (200, "v1".to_string()));
    // One container, labelled with the run, confined by the engine as the service's user.
    let running = containers_of(site.root());
    assert_eq!(running.len(), 1, "{running:?}");
    let container = inspect(running[0]["ID"].as_str().unwrap());
    let labels = &container["Config"]["Labels"];
    assert_eq!(labels["dev.rollgate.service"], "edge-svc");
    assert_eq!(labels["dev.rollgate.version"], "v1");
    assert_eq!(container["Image"], id.as_str());
    let uid = std::fs::read_to_string(site.root().join("service-user.json"))
        .map(|t| serde_json::from_str::<serde_json::Value>(&t).unwrap()["uid"].clone())
        .unwrap();
    assert_eq!(container["Config"]["User"], format!("{uid}:{uid}"));
    let host = &container["HostConfig"];
    assert_eq!(host["NetworkMode"], "host");
    assert_eq!(host["ReadonlyRootfs"], true);
    assert_eq!(host["CapDrop"], serde_json::json!(["ALL"]));
    assert_eq!(
        host["SecurityOpt"],
        serde_json::json!(["no-new-privileges"])
    );
    // Its processes are in its supervisor's tree: stopping the tree ends them.
    let mut v1_tree = String::new();
    if !crate::deploy::cgroup_base().is_empty() {
        let unified = |pid: i64| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_string))
                .unwrap_or_default()
        };
        let supervisor = unified(site.live_pid().unwrap() as i64);
        let inside = unified(container["State"]["Pid"].as_i64().unwrap());
        assert!(supervisor.starts_with("/rollgate/"), "{supervisor}");
        assert!(
            inside.starts_with(&format!("{supervisor}/")),
            "{inside} is not under {supervisor}"
        );
        v1_tree = supervisor;
    }
    // Issue 67, 6: `status` and `release list` say the container's uid (not its supervisor's
    // root) and the image the release is pinned to.
    let status = run(&site, &["status", "--format", "json"]);
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    let status: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
    assert_eq!(status["live"]["uid"], uid, "{status}");
    assert_eq!(status["live"]["image"], id.as_str(), "{status}");
    let listed = run(&site, &["release", "list", "--format", "json"]);
    let v1 = stdout(&listed)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["version"] == "v1")
        .unwrap();
    assert_eq!(
        v1["runs_as"],
        serde_json::json!([format!("uid {uid}, confined")]),
        "{v1}"
    );
    assert_eq!(v1["image"], id.as_str(), "{v1}");
    // Issue 68's launch record: decided once when the run was planned, kept in `current`.
    assert_eq!(site.pointer().unwrap()["image"], id.as_str());

    // A release that exits at boot is rolled back with a process release's words, and its
    // container is gone.
    let out = add_image(
        &site,
        "v2",
        &sample_image(&["--exit-after-ms", "0", "--exit-code", "3"]),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy(&site, "v2");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let rolled_back = site.log_lines().last().cloned().unwrap();
    assert_eq!(rolled_back["event"], "rolled_back");
    assert!(
        rolled_back["detail"]
            .as_str()
            .unwrap()
            .contains("exit status: 3"),
        "{rolled_back}"
    );
    assert!(wait_for(20, || containers_of(site.root()).len() == 1));

    // A good v3 replaces v1, whose container is removed once it is retired.
    let out = add_image(&site, "v3", &sample_image(&["--ready-after-ms", "200"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy(&site, "v3");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        only_containers_of(&site, "v3", 1),
        "{:?}",
        containers_of(site.root())
    );
    // Nothing of v1's tree is left in any cgroup hierarchy: the engine made the container's
    // parent in each v1 one (blkio, cpuset, freezer…), and those go with the tree.
    if !v1_tree.is_empty() {
        let left = || {
            std::fs::read_dir("/sys/fs/cgroup")
                .unwrap()
                .map(|h| h.unwrap().path().join(v1_tree.trim_start_matches('/')))
                .filter(|p| p.exists())
                .collect::<Vec<_>>()
        };
        assert!(wait_for(20, || left().is_empty()), "{:?}", left());
    }
    // Stopped at the end: nothing of the test left in the engine.
    site.stop_service();
    assert!(wait_for(30, || containers_of(site.root()).is_empty()));
    let _ = docker(&["image", "ls"]);
}

/// A container whose supervisor was killed (SIGKILL: it could not stop and remove it) is an
/// orphan: the next container started for the root removes it, and says so.
#[test]
fn a_container_whose_supervisor_was_killed_is_removed_by_the_next_start() {
    let site = Site::new();
    let out = add_image(&site, "v1", &sample_image(&[]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy(&site, "v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // Its keeper first: nothing starts the supervisor again.
    site.kill_keepers();
    send_signal(site.live_pid().unwrap(), 9);
    // The container runs on with nobody to stop it.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let orphans = containers_of(site.root());
    assert_eq!(orphans.len(), 1, "{orphans:?}");
    assert!(orphans[0]["State"] == "running", "{orphans:?}");

    let out = add_image(&site, "v2", &sample_image(&["--ready-after-ms", "200"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy(&site, "v2");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let left = containers_of(site.root());
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left[0]["Labels"]
            .as_str()
            .unwrap()
            .contains("dev.rollgate.version=v2"),
        "{left:?}"
    );
    let said = std::fs::read_to_string(site.root().join("output/v2/edge-svc.output")).unwrap();
    assert!(
        said.contains("(edge-svc v1): its supervisor is gone"),
        "{said}"
    );
    site.stop_service();
    assert!(wait_for(30, || containers_of(site.root()).is_empty()));
}

/// Container releases v1 and v2 (sample-service) in `site`, copied from releases installed
/// once per test run (each install loads the whole archive into the engine).
pub(crate) fn installed_images(site: &Site) {
    static TEMPLATE: std::sync::OnceLock<Site> = std::sync::OnceLock::new();
    let template = TEMPLATE.get_or_init(|| {
        let template = Site::new();
        for (version, args) in [("v1", vec![]), ("v2", vec!["--ready-after-ms", "100"])] {
            let out = add_image(&template, version, &sample_image(&args));
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        }
        template
    });
    std::fs::create_dir_all(site.root().join("releases")).unwrap();
    for version in ["v1", "v2"] {
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(template.root().join("releases").join(version))
            .arg(site.root().join("releases"))
            .status()
            .unwrap();
        assert!(copied.success());
    }
}

/// An image pulled from a registry by reference is pinned by digest: a tag moved on the
/// registry after `release add` changes nothing of what deploys.
#[test]
fn an_image_pulled_by_reference_is_pinned_and_a_moved_tag_changes_nothing() {
    use crate::common::engine::{image_id, loaded_tag, registry};
    let site = Site::new();
    let good = loaded_tag(&sample_image(&[]));
    let bad = loaded_tag(&sample_image(&["--readyz-status", "503"]));
    let repository = format!("{}/rollgate-it/app-{}", registry(), std::process::id());
    let reference = format!("{repository}:1");
    let push = |image: &str| {
        assert!(docker(&["tag", image, &reference]).status.success());
        let pushed = docker(&["push", &reference]);
        assert!(pushed.status.success(), "docker push: {pushed:?}");
    };
    push(&good);
    let out = run(&site, &["release", "add", "edge-svc", "v1", &reference]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v1 = pinned(&site, "v1");
    assert_eq!(v1["image"], image_id(&good).as_str());
    assert_eq!(v1["source"], reference.as_str());
    let digest = v1["repo_digest"].as_str().unwrap().to_string();
    assert!(
        digest.starts_with(&format!("{repository}@sha256:")),
        "{digest}"
    );

    // The tag moves to an image that is never ready; v1 still deploys what it pinned.
    push(&bad);
    let out = deploy(&site, "v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let running = containers_of(site.root());
    assert_eq!(
        inspect(running[0]["ID"].as_str().unwrap())["Image"],
        image_id(&good).as_str()
    );
    // A new install of the tag gets the moved image; one by digest gets the first.
    let out = run(&site, &["release", "add", "edge-svc", "v2", &reference]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(pinned(&site, "v2")["image"], image_id(&bad).as_str());
    let out = run(&site, &["release", "add", "edge-svc", "v3", &digest]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(pinned(&site, "v3")["image"], image_id(&good).as_str());
    // A reference the registry does not have is refused, nothing installed.
    let missing = format!("{repository}:no-such-tag");
    let out = run(&site, &["release", "add", "edge-svc", "v4", &missing]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("could not pull"), "{}", stderr(&out));
    assert!(!site.root().join("releases/v4").exists());
}

/// A container release replaces another behind the proxy under load: users get no failed
/// request, and the new release answers once it is live.
#[test]
fn a_container_release_goes_live_behind_the_proxy_with_no_failed_request() {
    let site = Site::new();
    installed_images(&site);
    let out = deploy(&site, "v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let proxy = crate::common::http::Proxy::start(&site, &[]);
    let load = crate::common::http::Load::kept(proxy.port, 4, std::time::Duration::from_millis(2));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = deploy(&site, "v2");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let seen = load.finish();
    let failed = seen.iter().filter(|(status, _, _)| *status != 200).count();
    assert_eq!(failed, 0, "{} of {} failed", failed, seen.len());
    assert!(seen.len() > 100, "only {} requests", seen.len());
    assert!(seen.iter().any(|(_, body, _)| body == "v1"));
    assert_eq!(seen.last().map(|(_, body, _)| body.as_str()), Some("v2"));
}

/// Four container replicas behind the proxy; a canary container serving 10 % 500s is judged
/// by users' traffic and rolled back by its numbers, as a process release is.
#[test]
fn a_container_canary_serving_500s_is_rolled_back_by_the_traffic_judge() {
    let site = Site::new();
    installed_images(&site);
    let out = add_image(&site, "v3", &sample_image(&["--error-rate", "0.1"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ports = ten_ports(43);
    let out = run(
        &site,
        &[
            "rollout",
            "edge-svc",
            "v1",
            "--replicas",
            "4",
            "--ports",
            &ports,
            "--deadline-ms",
            "30000",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(containers_of(site.root()).len(), 4);
    let proxy = crate::common::http::Proxy::start(&site, &[]);
    let load = crate::common::http::Load::kept(proxy.port, 4, std::time::Duration::from_millis(2));
    let policy = write(
        site.root(),
        "policy.json",
        r#"{"edge_svc": {"progress_deadline_ms": 30000, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback", "replicas": 4, "waves": [25, 100],
            "soak_ms": 30000, "analysis": {"min_requests": 100, "interval_ms": 1000, "on_fail": "rollback"}}}"#,
    );
    let out = run(
        &site,
        &[
            "rollout",
            "edge-svc",
            "v3",
            "--policy",
            policy.to_str().unwrap(),
        ],
    );
    drop(load.finish());
    drop(proxy);
    assert_eq!(out.status.code(), Some(1), "rolled back: {}", stderr(&out));
    let failed = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "analysis")
        .expect("an analysis line");
    assert_eq!(failed["analysis"]["verdict"], "fail", "{failed}");
    assert!(
        failed["detail"]
            .as_str()
            .unwrap()
            .starts_with("canary 5xx "),
        "{failed}"
    );
    // The canary's container is gone; v1's four serve on.
    assert!(only_containers_of(&site, "v1", 4));
}

/// A container release never ready is rolled back at its deadline with a process release's
/// words, and its container is stopped and removed.
#[test]
fn a_container_never_ready_is_rolled_back_at_its_deadline() {
    let site = Site::new();
    installed_images(&site);
    let out = deploy(&site, "v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = add_image(&site, "v3", &sample_image(&["--readyz-status", "503"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let port = free_port().to_string();
    let out = run(
        &site,
        &["deploy", "edge-svc", &port, "v3", "--deadline-ms", "1500"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let rolled_back = site.log_lines().last().cloned().unwrap();
    assert_eq!(rolled_back["event"], "rolled_back");
    assert!(
        rolled_back["detail"]
            .as_str()
            .unwrap()
            .starts_with("not ready after 1500 ms"),
        "{rolled_back}"
    );
    assert_eq!(site.pointer().unwrap()["version"], "v1");
    assert!(wait_for(20, || containers_of(site.root()).len() == 1));
}

/// An OCI image layout archive (written by skopeo, its layers compressed) installs as the same
/// image and deploys; a file that is no layout is refused with nothing installed.
#[test]
fn an_oci_archive_installs_and_deploys() {
    use crate::common::engine::oci_archive;
    let site = Site::new();
    let archive = sample_image(&[]);
    let oci = oci_archive(&archive);
    let out = run(
        &site,
        &[
            "release",
            "add",
            "edge-svc",
            "v1",
            &format!("oci-archive:{}", oci.display()),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let image = pinned(&site, "v1");
    assert_eq!(image["source"], format!("oci-archive:{}", oci.display()));
    let out = deploy(&site, "v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(live_answer(&site), (200, "v1".to_string()));
    // A docker-archive given as an OCI one: refused, named, nothing installed.
    let out = run(
        &site,
        &[
            "release",
            "add",
            "edge-svc",
            "v2",
            &format!("oci-archive:{}", archive.display()),
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is not an OCI image layout archive: no index.json"),
        "{}",
        stderr(&out)
    );
    assert!(!site.root().join("releases/v2").exists());
}

/// A signed manifest pins the image: it signs the release's `image.json` and launcher, so a
/// manifest made for one image refuses another, with nothing installed.
#[test]
fn a_manifest_pinning_another_image_is_refused() {
    let site = Site::new();
    let key = site.root().join("signer.pem");
    let out = rollgate()
        .args(["release", "keygen", "--out"])
        .arg(&key)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pin = stdout(&out).lines().next().unwrap().to_string();
    write(
        site.root(),
        "trust.json",
        &serde_json::json!({"pins": [pin], "threshold": 1}).to_string(),
    );
    let good = sample_image(&[]);
    // The folder rollgate makes for the good image, signed as the publisher would sign it.
    let scratch = Site::new();
    let out = add_image(&scratch, "v1", &good);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let signed = scratch.root().join("signed");
    std::fs::create_dir(&signed).unwrap();
    for file in ["image.json", "edge-svc"] {
        std::fs::copy(
            scratch.root().join("releases/v1").join(file),
            signed.join(file),
        )
        .unwrap();
    }
    let sign = |version: &str, sequence: &str| {
        let out = rollgate()
            .args(["release", "sign"])
            .arg(&signed)
            .args([
                "--service",
                "edge-svc",
                "--version",
                version,
                "--sequence",
                sequence,
            ])
            .arg("--key")
            .arg(&key)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        signed.join("manifest.json")
    };
    let install = |version: &str, archive: &std::path::Path, manifest: &std::path::Path| {
        let source = format!("docker-archive:{}", archive.display());
        run(
            &site,
            &[
                "release",
                "add",
                "edge-svc",
                version,
                &source,
                "--manifest",
                manifest.to_str().unwrap(),
            ],
        )
    };
    let out = install("v1", &good, &sign("v1", "1"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let record: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(site.root().join("releases/v1/release.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(record["signed"], true);
    // The same signature over another image: refused.
    let other = sample_image(&["--ready-after-ms", "100"]);
    let out = install("v2", &other, &sign("v2", "2"));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing was installed")
            && stderr(&out).contains("the manifest says"),
        "{}",
        stderr(&out)
    );
    assert!(!site.root().join("releases/v2").exists());
}

/// Retention removes from the engine the images rollgate installed once no root holds a
/// release of them, and never an image the engine had before (someone else's).
#[test]
fn retention_removes_only_images_rollgate_installed_and_no_root_keeps() {
    use crate::common::engine::{image_id, loaded_tag};
    let (first, second) = (Site::new(), Site::new());
    // Images of this test alone: two rollgate installs, one the engine had already.
    let archive = |n: &str| sample_image(&["--work-us", n]);
    let (a, b, theirs) = (archive("7"), archive("8"), archive("9"));
    let (a_tag, b_tag) = (loaded_tag(&a), loaded_tag(&b));
    let theirs_id = image_id(&loaded_tag(&theirs));
    let (a_id, b_id) = (image_id(&a_tag), image_id(&b_tag));
    for tag in [&a_tag, &b_tag] {
        let removed = docker(&["rmi", tag]);
        assert!(removed.status.success(), "{removed:?}");
    }
    for (site, version, archive) in [
        (&first, "v1", &a),
        (&first, "v2", &b),
        (&first, "v3", &theirs),
        (&second, "w1", &a),
    ] {
        let out = add_image(site, version, archive);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    let present = |id: &str| docker(&["image", "inspect", id]).status.success();
    assert!(present(&a_id) && present(&b_id) && present(&theirs_id));

    let out = run(&first, &["release", "prune", "--keep", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!("image {b_id} removed")),
        "{}",
        stdout(&out)
    );
    assert!(!present(&b_id), "b: installed by rollgate, held by no root");
    assert!(present(&a_id), "a: the second root still holds it");
    assert!(
        present(&theirs_id),
        "the engine had it before rollgate: never removed"
    );

    let out = run(&second, &["release", "prune", "--keep", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!present(&a_id), "{}", stdout(&out));
    assert!(present(&theirs_id));
}

/// Issue 60's acceptance: the confinement issue's hostile release, built into an image and
/// deployed with the default settings (plus its limits) beside a live service with a secret and
/// behind a proxy, is refused every act by the engine's confinement. Inside the container no
/// process outside it can be seen, so the deployer is stood for by this test's own process
/// (another root-owned process of the host).
#[test]
fn a_hostile_container_release_is_refused_all_twelve_acts() {
    use crate::common::engine::python_image;
    let other = Site::new();
    assert_eq!(set_secret(&other, "db", "hunter2").status.code(), Some(0));
    other.release("v1", "");
    write(other.root(), "releases/v1/secrets", "DB_PASSWORD=db\n");
    // The neighbour is the scene, not the subject: its deploy may take its time on a loaded
    // machine (a run beside two busy loops found it unready at the default 1.5 s).
    let out = other.deploy(free_port(), "v1", &["--deadline-ms", "20000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let site = Site::new();
    let proxy = crate::common::http::Proxy::start(&site, &[]);
    let out = add_image(&site, "v1", &python_image(crate::hostile::HOSTILE));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let marker = format!(
        "{}.{}",
        7000 + std::process::id() % 1000,
        std::process::id()
    );
    let env = crate::hostile::targets(&other, proxy.child.id(), &marker)
        + &format!("DEPLOYER={}\n", std::process::id());
    write(site.root(), "releases/v1/env", &env);
    let limits = isolation_policy(&site, 120_000, r#"{"memory_mb": 1024, "pids": 512}"#);
    let port = free_port().to_string();
    let out = run(
        &site,
        &["deploy", "edge-svc", &port, "v1", "--policy", &limits],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let confined = crate::hostile::acts(&site, "v1");
    let refused: Vec<&String> = confined
        .iter()
        .filter(|(_, said)| said.as_str().is_some_and(|s| s.starts_with("refused")))
        .map(|(act, _)| act)
        .collect();
    assert_eq!(refused.len(), 14, "{confined:#?}");
    // The daemon it left dies with its container when the next deploy retires it.
    assert!(
        wait_for(10, || a_process_mentions(&marker)),
        "the daemon started"
    );
    let out = add_image(&site, "v2", &sample_image(&[]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy(&site, "v2");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        wait_for(20, || !a_process_mentions(&marker)),
        "the daemon outlived its retired container"
    );
    assert!(alive(other.live_pid().unwrap()));
    assert_eq!(
        std::fs::read_to_string(other.root().join("secrets/db")).unwrap(),
        "hunter2"
    );
}

/// `isolation.enabled = false` gives a container the engine's defaults — the image's user,
/// Docker's default capabilities, a writable root — and the deploy says it is not confined.
#[test]
fn a_container_with_isolation_off_gets_the_engines_defaults() {
    let site = Site::new();
    installed_images(&site);
    let open = isolation_policy(&site, 30_000, r#"{"enabled": false}"#);
    let port = free_port().to_string();
    let out = run(
        &site,
        &["deploy", "edge-svc", &port, "v1", "--policy", &open],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("runs NOT confined"),
        "{}",
        stderr(&out)
    );
    let running = containers_of(site.root());
    let container = inspect(running[0]["ID"].as_str().unwrap());
    assert_eq!(container["Config"]["User"], "");
    assert_eq!(container["HostConfig"]["ReadonlyRootfs"], false);
    assert!(
        container["HostConfig"]["CapDrop"].is_null(),
        "{}",
        container["HostConfig"]
    );
}

/// A container that touches more memory than `isolation.memory_mb` is killed by the kernel, and
/// the rollback says so in a process release's words (not "exit status: 137").
#[test]
fn a_container_killed_for_its_memory_limit_is_rolled_back_saying_so() {
    use crate::common::engine::python_image;
    let site = Site::new();
    let hog = "b = bytearray(256 << 20)\nimport time\ntime.sleep(60)\n";
    let out = add_image(&site, "v1", &python_image(hog));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let limits = isolation_policy(&site, 30_000, r#"{"memory_mb": 64}"#);
    let port = free_port().to_string();
    let out = run(
        &site,
        &["deploy", "edge-svc", &port, "v1", "--policy", &limits],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        site.last_detail()
            .starts_with("candidate killed: out of memory at its 64 MiB limit before ready"),
        "{}",
        site.last_detail()
    );
    assert!(wait_for(20, || containers_of(site.root()).is_empty()));
}

/// An exec probe of a container release runs inside its container — as its user, with `PORT`
/// set, seeing the image's files — and one that fails keeps it from going live; one that
/// hangs is killed at its timeout.
#[test]
fn an_exec_probe_runs_inside_the_container() {
    use crate::common::engine::python_image;
    let site = Site::new();
    let out = add_image(&site, "v1", &python_image("print('booted')\n"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let probe_policy = |version: &str, command: serde_json::Value, deadline_ms: u64| {
        let policy = serde_json::json!({"edge_svc": {
            "progress_deadline_ms": deadline_ms, "poll_ms": 100, "max_unavailable_pct": 0,
            "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0,
            "probe": {"kind": "exec", "command": command, "timeout_ms": 1000}}});
        write(
            site.root(),
            &format!("exec-{version}.json"),
            &policy.to_string(),
        )
        .display()
        .to_string()
    };
    // Only inside the container is there a /script.py; the probe says what it saw in its exit.
    let inside = serde_json::json!(["/usr/bin/python3", "-c",
        "import os, sys; sys.exit(0 if os.path.exists('/script.py') and os.getuid() != 0 and os.environ['PORT'] == sys.argv[1] else 4)"]);
    let port = free_port();
    let mut command = inside.clone();
    command
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!(port.to_string()));
    let policy = probe_policy("v1", command, 30_000);
    let out = run(
        &site,
        &[
            "deploy",
            "edge-svc",
            &port.to_string(),
            "v1",
            "--policy",
            &policy,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!std::path::Path::new("/script.py").exists());

    // A probe that fails inside: never ready, rolled back with its exit status.
    let out = add_image(&site, "v2", &python_image("print('booted again')\n"));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let failing = serde_json::json!(["/bin/sh", "-c", "exit 3"]);
    let policy = probe_policy("v2", failing, 4_000);
    let out = run(
        &site,
        &[
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v2",
            "--policy",
            &policy,
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        site.last_detail().contains("exit status 3"),
        "{}",
        site.last_detail()
    );
    // One that hangs is killed at its timeout (the engine cannot stop an exec): probes every
    // 100 ms for 4 s never pile up inside the container.
    let marker = format!("41.{}", std::process::id());
    let hanging = serde_json::json!(["/usr/bin/sleep", marker]);
    let policy = probe_policy("v2", hanging, 4_000);
    let deploying = std::sync::atomic::AtomicBool::new(true);
    let (out, most) = std::thread::scope(|scope| {
        let counter = scope.spawn(|| {
            let mut most = 0;
            while deploying.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(processes_mentioning(&marker));
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            most
        });
        let port = free_port().to_string();
        let out = run(
            &site,
            &["deploy", "edge-svc", &port, "v2", "--policy", &policy],
        );
        deploying.store(false, std::sync::atomic::Ordering::Relaxed);
        (out, counter.join().unwrap())
    });
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        site.last_detail().contains("1000 ms"),
        "{}",
        site.last_detail()
    );
    assert!((1..=2).contains(&most), "{most} hung probes at once");
    assert_eq!(live_answer(&site), (200, "v1".to_string()));
}

/// A container that ignores SIGTERM outlives the grace its supervisor was given: rollgate kills
/// the tree (the container's processes with it), and the container, which its supervisor could
/// no longer remove, is removed then — not left for the next start to sweep.
#[test]
fn a_container_killed_past_its_grace_is_removed_with_its_supervisor() {
    let site = Site::new();
    installed_images(&site);
    let out = add_image(&site, "v3", &sample_image(&["--ignore-sigterm"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy(&site, "v3");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let port = free_port().to_string();
    let out = run(
        &site,
        &[
            "deploy",
            "edge-svc",
            &port,
            "v1",
            "--grace-ms",
            "1000",
            // A container's start under a loaded suite can take more than the default 1.5 s.
            "--deadline-ms",
            "20000",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = format!("{:?}", site.log_lines());
    assert!(
        said.contains("old release v3 killed (ignored SIGTERM for the grace period)"),
        "{said}"
    );
    assert!(
        only_containers_of(&site, "v1", 1),
        "{:?}",
        containers_of(site.root())
    );
}

/// A registry that asks for a password: the pull presents the credentials in the root's secret
/// `registry-auth` (what `docker login` writes), and they never show in an output, the log or
/// the release; without them, or with a wrong password, the install is refused saying where
/// credentials go.
#[test]
fn a_private_registry_is_pulled_from_with_the_roots_credentials() {
    use crate::common::engine::{image_id, loaded_tag, AuthRegistry};
    let registry = AuthRegistry::start();
    let site = Site::new();
    let good = loaded_tag(&sample_image(&[]));
    let reference = format!("{}/rollgate-it/private:1", registry.address);
    assert!(registry
        .docker(&["tag", &good, &reference])
        .status
        .success());
    let pushed = registry.docker(&["push", &reference]);
    assert!(pushed.status.success(), "docker push: {pushed:?}");
    // Only the registry has the tag now.
    assert!(registry.docker(&["rmi", &reference]).status.success());

    let add = |version: &str| run(&site, &["release", "add", "edge-svc", version, &reference]);
    let out = add("v1");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let hint = format!(
        "no credentials for {} in the root's secret registry-auth",
        registry.address
    );
    assert!(stderr(&out).contains(&hint), "{}", stderr(&out));
    assert!(!site.root().join("releases/v1").exists());

    // A wrong password: refused, and the wrong one is not said either.
    let wrong = registry.login_file().replace(
        &registry_auth(&registry.user, &registry.password),
        &registry_auth(&registry.user, "not-it"),
    );
    assert_ne!(wrong, registry.login_file());
    assert_eq!(
        set_secret(&site, "registry-auth", &wrong).status.code(),
        Some(0)
    );
    let out = add("v1");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!stderr(&out).contains("not-it"), "{}", stderr(&out));
    assert!(!site.root().join("releases/v1").exists());

    let login = registry.login_file();
    assert_eq!(
        set_secret(&site, "registry-auth", &login).status.code(),
        Some(0)
    );
    let out = add("v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(pinned(&site, "v1")["image"], image_id(&good).as_str());
    let out = deploy(&site, "v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(live_answer(&site), (200, "v1".to_string()));
    // Nowhere but in the secret.
    let listed = run(&site, &["release", "list", "edge-svc"]);
    for (what, text) in [
        (
            "the deploy's output",
            format!("{}{}", stdout(&out), stderr(&out)),
        ),
        ("release list", stdout(&listed)),
        (
            "the log",
            std::fs::read_to_string(site.root().join("deploy.log")).unwrap(),
        ),
        (
            "the release",
            std::fs::read_to_string(site.root().join("releases/v1/image.json")).unwrap(),
        ),
    ] {
        assert!(!text.contains(&registry.password), "{what}: {text}");
    }
}

/// What `docker login` keeps for a user and password (`auth`: base64 of `USER:PASSWORD`).
fn registry_auth(user: &str, password: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// Issue 66: an image that declares `VOLUME /vol` — an anonymous volume would take writes past
/// the read-only root and outlive the container. The release writes 200 MiB there: a confined
/// one gets a tmpfs of 64 MiB instead, and once it is retired no volume of it is left.
#[test]
fn an_images_volume_is_a_bounded_tmpfs_and_nothing_of_it_outlives_the_release() {
    use crate::common::engine::python_image_with;
    let writer = r#"
import json, os
written = 0
try:
    with open("/vol/fill", "wb") as f:
        for _ in range(200):
            f.write(b"x" * (1 << 20))
            f.flush()
            written += 1
except OSError as e:
    pass
kind = [l.split()[2] for l in open("/proc/self/mounts") if l.split()[1] == "/vol"]
with open(os.path.join(os.environ["STATE_DIRECTORY"], "vol.json"), "w") as f:
    json.dump({"written_mib": written, "mounted_as": kind}, f)
"#;
    let volumes = || {
        let out = docker(&["volume", "ls", "-q"]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect::<std::collections::BTreeSet<String>>()
    };
    let before = volumes();
    let site = Site::new();
    let out = add_image(&site, "v1", &python_image_with(writer, &["VOLUME /vol"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy(&site, "v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(site.root().join("data/vol.json")).unwrap())
            .unwrap();
    assert_eq!(said["mounted_as"], serde_json::json!(["tmpfs"]), "{said}");
    let written = said["written_mib"].as_u64().unwrap();
    assert!((1..=64).contains(&written), "{said}");
    // Retired: its container goes, and no volume of it stays.
    let out = add_image(&site, "v2", &sample_image(&[]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy(&site, "v2");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(only_containers_of(&site, "v2", 1));
    let made: Vec<String> = volumes().difference(&before).cloned().collect();
    assert_eq!(made, Vec::<String>::new(), "volumes left behind");
}

/// Issue 68, 3 and 4, for an image release: `stop` ends its container (and `up` leaves it
/// stopped), `start` brings a container back gated, `restart` replaces it with a fresh one.
#[test]
fn an_image_release_is_stopped_started_and_restarted_like_a_process_release() {
    let site = Site::new();
    let out = add_image(&site, "v1", &sample_image(&[]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy(&site, "v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(only_containers_of(&site, "v1", 1));
    let first = containers_of(site.root())[0]["ID"].clone();

    let out = run(&site, &["stop", "edge-svc"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(wait_for(20, || containers_of(site.root()).is_empty()));
    let out = run(&site, &["up"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(containers_of(site.root()).is_empty());

    let out = run(&site, &["start", "edge-svc"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(live_answer(&site), (200, "v1".to_string()));
    assert!(only_containers_of(&site, "v1", 1));
    let started = containers_of(site.root())[0]["ID"].clone();
    assert_ne!(started, first);

    let port = free_port().to_string();
    // A generous deadline: a container's start is slow on a loaded machine (the policy's
    // 1.5 s once ran out while the engine started it).
    let out = run(
        &site,
        &[
            "restart",
            "edge-svc",
            "--port",
            &port,
            "--watch-ms",
            "0",
            "--deadline-ms",
            "20000",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(live_answer(&site), (200, "v1".to_string()));
    assert!(wait_for(20, || {
        let now = containers_of(site.root());
        now.len() == 1 && now[0]["ID"] != started
    }));
    // Stopped at the end: nothing of the test left in the engine.
    site.stop_service();
    assert!(wait_for(30, || containers_of(site.root()).is_empty()));
}

/// Issue 68, 1, for an image release: its container killed through the engine ends its
/// supervisor as it ended, and the supervisor's keeper starts it again: a new container answers,
/// and the restart is logged with how the one before ended.
#[test]
fn an_image_release_whose_container_dies_is_started_again_by_its_keeper() {
    let site = Site::new();
    let out = add_image(&site, "v1", &sample_image(&[]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy(&site, "v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(only_containers_of(&site, "v1", 1));
    let first = containers_of(site.root())[0]["ID"]
        .as_str()
        .unwrap()
        .to_string();
    let killed = docker(&["kill", &first]);
    assert!(killed.status.success(), "{}", stderr(&killed));
    assert!(
        wait_for(60, || {
            let now = containers_of(site.root());
            now.len() == 1 && now[0]["ID"] != first.as_str()
        }),
        "{:?}",
        site.events()
    );
    let port = site.pointer().unwrap()["port"].as_u64().unwrap() as u16;
    assert!(wait_for(30, || version_on(port).as_deref() == Some("v1")));
    assert_eq!(
        count_events(&site, "restarted", "v1"),
        1,
        "{:?}",
        site.events()
    );
    site.stop_service();
    assert!(wait_for(30, || containers_of(site.root()).is_empty()));
}

/// Issue 68, 5, for an image release: `run` runs the command in a container of the image, as
/// the service's user with its state folder, its output on rollgate's, its exit status
/// rollgate's, and no container left behind.
#[test]
fn run_runs_a_one_off_command_in_a_container_of_the_image() {
    let site = Site::new();
    let image = crate::common::engine::python_image("");
    let out = add_image(&site, "v1", &image);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = deploy(&site, "v1");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // `--root` before `--`: what follows is the command's.
    let out = rollgate()
        .args(["run", "edge-svc", "--root"])
        .arg(site.root())
        .args([
            "--",
            "/usr/bin/python3",
            "-c",
            "import os; print(os.getuid(), os.environ['STATE_DIRECTORY']); raise SystemExit(5)",
        ])
        .env("DOCKER_HOST", docker_host())
        .timeout(std::time::Duration::from_secs(120))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let uid = service_uid(&site);
    assert_eq!(
        stdout(&out).trim(),
        format!("{uid} {}", site.root().join("data").display())
    );
    // What is piped in reaches the command inside (and its end ends the command's stdin).
    let mut child = std::process::Command::new(crate::common::bin())
        .args(["run", "edge-svc", "--root"])
        .arg(site.root())
        .args([
            "--",
            "/usr/bin/python3",
            "-c",
            "import sys; print(sys.stdin.read().upper(), end='')",
        ])
        .env("DOCKER_HOST", docker_host())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"typed in\nand more\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), "TYPED IN\nAND MORE\n");
    // On a terminal (util-linux `script`, 97 columns): the command gets a terminal of its own,
    // of the same size.
    let quoted: Vec<String> = [
        crate::common::bin().display().to_string(),
        "run".into(),
        "edge-svc".into(),
        "--root".into(),
        site.root().display().to_string(),
        "--".into(),
        "/usr/bin/python3".into(),
        "-c".into(),
        // (An engine before API 1.42 sizes it just after the start: given a moment.)
        "import os, time\nfor _ in range(100):\n    if os.get_terminal_size().columns: break\n    time.sleep(0.02)\nprint('tty', os.isatty(0), os.get_terminal_size().columns)".into(),
    ]
    .iter()
    .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
    .collect();
    let out = std::process::Command::new("script")
        .args([
            "-qec",
            &format!("stty cols 97 rows 40; {}", quoted.join(" ")),
            "/dev/null",
        ])
        .env("DOCKER_HOST", docker_host())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("tty True 97"), "{:?}", stdout(&out));
    // Only the release's own container is left.
    assert!(only_containers_of(&site, "v1", 1));
    site.stop_service();
    assert!(wait_for(30, || containers_of(site.root()).is_empty()));
}

/// Issue 70, 2, for an image release: a schedule's run is a one-off in a container of the live
/// image, its output kept for `logs --schedule`, its exit status recorded, no container left.
#[test]
fn a_schedule_of_an_image_release_runs_in_a_container_of_its_image() {
    let site = Site::new();
    let image = crate::common::engine::python_image("");
    let out = add_image(&site, "v1", &image);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let policy = write(
        site.root(),
        "policy.yaml",
        "edge_svc:\n  progress_deadline_ms: 30000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  schedules:\n    report:\n      cron: \"@daily\"\n      command: [\"/usr/bin/python3\", \"-c\", \"import os; print('report by', os.getuid()); raise SystemExit(4)\"]\n",
    );
    let port = free_port().to_string();
    let out = run(
        &site,
        &[
            "deploy",
            "edge-svc",
            &port,
            "v1",
            "--policy",
            policy.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = run(&site, &["schedules", "run", "edge-svc", "report"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let out = run(&site, &["logs", "edge-svc", "--schedule", "report"]);
    assert_eq!(
        untimed(&stdout(&out)),
        format!("report by {}\n", service_uid(&site)),
        "{}",
        stderr(&out)
    );
    // Only the live release's container is left.
    assert!(
        wait_for(20, || containers_of(site.root()).len() == 1),
        "{:?}",
        containers_of(site.root())
    );
    site.stop_service();
    assert!(wait_for(30, || containers_of(site.root()).is_empty()));
}
