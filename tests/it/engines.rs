//! `policy export --format k8s|argo|nomad`, checked by each engine's own schema, offline and
//! strictly: the Deployment by `kubernetes-validate --strict` (PyPI, ships Kubernetes'
//! schemas), the Rollout by Argo Rollouts' CRD schema (from the npm package
//! @kubernetes-models/argo-rollouts 0.3.2) with unknown fields refused (tests/tools/argo_check.py).
//! A corrupted field name or type in each output must fail, so the checks can fail.

use crate::common::*;

use std::path::{Path, PathBuf};
use std::process::Output;

/// The npm package carrying Argo Rollouts' v1.5.0 CRD schema.
const ARGO_SCHEMA_PACKAGE: &str = "@kubernetes-models/argo-rollouts@0.3.2";

fn argo_schema() -> PathBuf {
    static FOUND: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| npm_package("argo-rollouts-schema", ARGO_SCHEMA_PACKAGE))
        .clone()
}

/// Policies that between them use every probe kind, both stall actions, waves, soaks,
/// classes, hooks and the watch.
const POLICIES: &[(&str, &str)] = &[
    (
        "plain.yaml",
        "edge_svc:\n  progress_deadline_ms: 1500\n  poll_ms: 100\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n",
    ),
    (
        "fleet.yaml",
        "api:\n  progress_deadline_ms: 30000\n  poll_ms: 1000\n  max_unavailable_pct: 10\n  max_surge_pct: 25\n  on_stall: rollback\n  replicas: 40\n  waves: [1, 10, 50, 100]\n  soak_ms: 2500\n  min_ready_ms: 2000\n  max_failure_ratio: 0.1\n  release_deadline_ms: 600000\n  classes:\n    \"0\": required\n  probe:\n    kind: http\n    path: /health\n    host: api.internal\n    status_min: 200\n    status_max: 399\n    timeout_ms: 2000\n    success_threshold: 2\n  watch_ms: 5000\n  hooks:\n    post_promote: [\"notify\", \"done\"]\n\
         worker:\n  progress_deadline_ms: 10000\n  poll_ms: 2000\n  max_unavailable_pct: 25\n  max_surge_pct: 0\n  on_stall: escalate\n  replicas: 7\n  probe:\n    kind: tcp\n",
    ),
    (
        "exec.yaml",
        "batch_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 1000\n  max_unavailable_pct: 0\n  max_surge_pct: 50\n  on_stall: rollback\n  replicas: 3\n  waves: [50]\n  probe:\n    kind: exec\n    command: [\"./ready\", \"--quick\"]\n",
    ),
    (
        "notify.yaml",
        "edge_svc:\n  progress_deadline_ms: 5000\n  poll_ms: 1000\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  probe:\n    kind: notify\n    confirm: http\n    path: /readyz\n  \nnotify_only:\n  progress_deadline_ms: 5000\n  poll_ms: 1000\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  probe:\n    kind: notify\n    watchdog_ms: 1000\n",
    ),
];

fn export_to(dir: &Path, policy: &Path, format: &str, extra: &[&str]) -> (PathBuf, Output) {
    let out = rollgate()
        .args(["policy", "export", "--format", format])
        .args(extra)
        .arg(policy)
        .output()
        .unwrap();
    let name = format!(
        "{}.{format}.yaml",
        policy.file_stem().unwrap().to_string_lossy()
    );
    let path = write(dir, &name, &stdout(&out));
    (path, out)
}

fn kubernetes_validate(file: &Path) -> Output {
    std::process::Command::new(python_tools().join("kubernetes-validate"))
        .args(["--strict", "--quiet"])
        .arg(file)
        .output()
        .unwrap()
}

fn argo_check(file: &Path) -> Output {
    std::process::Command::new(python_tools().join("python"))
        .arg(repo().join("tests/tools/argo_check.py"))
        .arg(argo_schema())
        .arg(file)
        .output()
        .unwrap()
}

/// Every policy, exported as `format` (with and without an image), passes `check`; each output
/// with one field name and then one field type corrupted fails it.
fn every_export_passes_and_a_corrupted_one_fails(format: &str, check: fn(&Path) -> Output) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in POLICIES {
        let policy = write(dir.path(), name, text);
        for extra in [
            &[][..],
            &["--image", "registry.example/svc:v2", "--port", "9000"],
        ] {
            let (file, out) = export_to(dir.path(), &policy, format, extra);
            assert_eq!(out.status.code(), Some(0), "{name}: {}", stderr(&out));
            let checked = check(&file);
            assert!(
                checked.status.success(),
                "{name} {extra:?} as {format}:\n{}\n{}{}",
                std::fs::read_to_string(&file).unwrap(),
                stdout(&checked),
                stderr(&checked)
            );
        }
        let (file, _) = export_to(dir.path(), &policy, format, &[]);
        let text = std::fs::read_to_string(&file).unwrap();
        for (from, to) in [
            ("periodSeconds:", "periodSecs:"),
            (
                "progressDeadlineSeconds: ",
                "progressDeadlineSeconds: \"s\" #",
            ),
        ] {
            assert!(text.contains(from), "{name}: no {from} in\n{text}");
            let broken = write(dir.path(), "broken.yaml", &text.replacen(from, to, 1));
            let checked = check(&broken);
            assert!(
                !checked.status.success(),
                "{name}: {from} -> {to} passed {format}'s check"
            );
        }
    }
}

#[test]
fn the_deployments_pass_kubernetes_validate_strict() {
    every_export_passes_and_a_corrupted_one_fails("k8s", kubernetes_validate);
}

#[test]
fn the_rollouts_pass_argos_crd_schema_with_unknown_fields_refused() {
    every_export_passes_and_a_corrupted_one_fails("argo", argo_check);
}

#[test]
fn each_probe_kind_becomes_the_engines_own() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = write(dir.path(), POLICIES[1].0, POLICIES[1].1);
    let (file, out) = export_to(dir.path(), &fleet, "k8s", &["--image", "api:v2"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let yaml = std::fs::read_to_string(file).unwrap();
    for line in [
        "          httpGet:\n            httpHeaders:\n            - name: \"Host\"\n              value: \"api.internal\"\n            path: \"/health\"\n",
        "          successThreshold: 2\n          timeoutSeconds: 2\n",
        "          tcpSocket:\n            port: \"http\"\n",
        "        image: \"api:v2\"\n",
        "  replicas: 40\n",
        "  minReadySeconds: 2\n",
    ] {
        assert!(yaml.contains(line), "missing {line:?} in\n{yaml}");
    }
    let exec = write(dir.path(), POLICIES[2].0, POLICIES[2].1);
    let (file, _) = export_to(dir.path(), &exec, "k8s", &[]);
    let yaml = std::fs::read_to_string(file).unwrap();
    assert!(
        yaml.contains("          exec:\n            command:\n            - \"./ready\"\n            - \"--quick\"\n"),
        "{yaml}"
    );
    // A notify probe: its confirmation stands in for it, and that is said.
    let notify = write(dir.path(), POLICIES[3].0, POLICIES[3].1);
    let (file, out) = export_to(dir.path(), &notify, "k8s", &[]);
    let yaml = std::fs::read_to_string(file).unwrap();
    assert!(yaml.contains("path: \"/readyz\""), "{yaml}");
    let said = stderr(&out);
    assert!(
        said.contains("not expressed in Kubernetes: edge_svc: probe kind 'notify")
            && said.contains("not expressed in Kubernetes: notify_only: probe kind 'notify"),
        "{said}"
    );
}

/// The canary steps of an exported Rollout, as (setWeight, pause seconds) pairs.
fn argo_steps(yaml: &str, entry_object: &str) -> Vec<(u64, Option<String>)> {
    let document = yaml
        .split("---\n")
        .find(|d| d.contains(&format!("\n  name: \"{entry_object}\"\n")))
        .unwrap_or_else(|| panic!("no Rollout {entry_object} in\n{yaml}"));
    let mut steps: Vec<(u64, Option<String>)> = Vec::new();
    for line in document.lines() {
        let line = line.trim();
        if let Some(weight) = line.strip_prefix("- setWeight: ") {
            steps.push((weight.parse().unwrap(), None));
        } else if let Some(duration) = line.strip_prefix("duration: ") {
            steps.last_mut().unwrap().1 = Some(duration.trim_matches('"').to_string());
        }
    }
    steps
}

#[test]
fn an_argo_rollout_moves_in_rollgates_waves_and_says_what_argo_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = write(dir.path(), POLICIES[1].0, POLICIES[1].1);
    let (file, out) = export_to(dir.path(), &fleet, "argo", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let yaml = std::fs::read_to_string(file).unwrap();
    // 40 replicas in waves of 1/10/50/100 %: 1, 4, 20 canaries, then all 40; Budgets: surge
    // 10 (25 % up), unavailable 4 (10 % down); each wave soaks 2500 ms (3 s, rounded up).
    let steps = argo_steps(&yaml, "api");
    assert_eq!(steps.len(), 3, "{steps:?}");
    for (weight, soak) in &steps {
        assert!((1..100).contains(weight), "{steps:?}");
        assert_eq!(soak.as_deref(), Some("3s"));
    }
    let counts: Vec<u32> = steps
        .iter()
        .map(|(w, _)| rollgate::fleet::argo::canary_replicas(40, *w as u32, 10))
        .collect();
    assert_eq!(counts, [1, 4, 20]);
    for line in [
        "      maxSurge: 10\n      maxUnavailable: 4\n",
        "  progressDeadlineAbort: true\n",
        "  progressDeadlineAbort: false\n",
        "  progressDeadlineSeconds: 30\n",
    ] {
        assert!(yaml.contains(line), "missing {line:?} in\n{yaml}");
    }
    let said = stderr(&out);
    for lost in [
        "not expressed in Argo Rollouts: api: max_failure_ratio",
        "not expressed in Argo Rollouts: api: classes",
        "not expressed in Argo Rollouts: api: release_deadline_ms",
        "not expressed in Argo Rollouts: api: watch_ms",
        "not expressed in Argo Rollouts: api: hooks (post_promote)",
    ] {
        assert!(said.contains(lost), "missing {lost:?} in\n{said}");
    }
    assert!(yaml.contains("rollgate.dev/unexpressed: \""), "{yaml}");
    // An escalating worker of 7, no soak: 1, 2 (10 % rounds up to 1; each wave adds one), 4,
    // then all.
    let worker = argo_steps(&yaml, "worker");
    let counts: Vec<u32> = worker
        .iter()
        .map(|(w, _)| rollgate::fleet::argo::canary_replicas(7, *w as u32, 0))
        .collect();
    assert_eq!(counts, [1, 2, 4], "{worker:?}");
    assert!(worker.iter().all(|(_, soak)| soak.is_none()));
}

#[test]
fn strict_refuses_what_an_engine_would_lose_and_passes_what_it_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = write(dir.path(), POLICIES[1].0, POLICIES[1].1);
    for format in ["k8s", "argo", "nomad"] {
        let (_, out) = export_to(dir.path(), &fleet, format, &["--strict"]);
        assert_eq!(out.status.code(), Some(1), "{format}");
        assert!(stdout(&out).is_empty(), "{format}: {}", stdout(&out));
        assert!(
            stderr(&out).contains("--strict:") && stderr(&out).contains("api: classes"),
            "{format}: {}",
            stderr(&out)
        );
    }
    // Everything a Rollout can say: waves reachable on 10 replicas, a soak, a 2xx-3xx probe
    // every second.
    let faithful = write(
        dir.path(),
        "faithful.yaml",
        "web:\n  progress_deadline_ms: 20000\n  poll_ms: 1000\n  max_unavailable_pct: 0\n  max_surge_pct: 20\n  on_stall: rollback\n  replicas: 10\n  waves: [10, 30, 60, 100]\n  soak_ms: 5000\n  probe:\n    kind: http\n    status_min: 200\n    status_max: 399\n",
    );
    let (file, out) = export_to(dir.path(), &faithful, "argo", &["--strict"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).is_empty(), "{}", stderr(&out));
    let counts: Vec<u32> = argo_steps(&std::fs::read_to_string(file).unwrap(), "web")
        .iter()
        .map(|(w, _)| rollgate::fleet::argo::canary_replicas(10, *w as u32, 2))
        .collect();
    assert_eq!(counts, [1, 3, 6]);
    // A wave Argo cannot reach: 500 replicas, 1 % then 1 % (5, then 6).
    let unreachable = write(
        dir.path(),
        "many.yaml",
        "many:\n  progress_deadline_ms: 20000\n  poll_ms: 1000\n  max_unavailable_pct: 0\n  max_surge_pct: 0\n  on_stall: escalate\n  replicas: 500\n  waves: [1, 1, 100]\n  probe:\n    kind: tcp\n",
    );
    let (_, out) = export_to(dir.path(), &unreachable, "argo", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("many: wave 1 (6 of 500 replicas): no Argo weight"),
        "{}",
        stderr(&out)
    );
    let (_, out) = export_to(dir.path(), &unreachable, "argo", &["--strict"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

/// `policy export --procfile`: the release phase as a Job, web and each other type as a
/// Deployment of its own (disjoint selectors, each type's count, stop rule and grace), all
/// passing `kubernetes-validate --strict`; Nomad keeps a task group per type and runs the release
/// phase as a prestart task; a policy that names a type the Procfile lacks is refused.
#[test]
fn a_release_of_several_process_types_exports_a_workload_per_type() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write(
        dir.path(),
        "app.yaml",
        "app:\n  progress_deadline_ms: 30000\n  poll_ms: 1000\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: escalate\n  processes:\n    worker:\n      replicas: 2\n      stop_grace_ms: 60000\n      ready:\n        kind: exec\n        command: [\"bin/worker-ok\"]\n      overlap: true\n    clock:\n      singleton: true\n",
    );
    let procfile = write(
        dir.path(),
        "Procfile",
        "web: gunicorn app.wsgi\nworker: python manage.py worker\nclock: python manage.py clock\nrelease: python manage.py migrate\n",
    );
    let with_procfile = [
        "--procfile",
        procfile.to_str().unwrap(),
        "--image",
        "reg.example/app:v4",
    ];
    let (file, out) = export_to(dir.path(), &policy, "k8s", &with_procfile);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let checked = kubernetes_validate(&file);
    assert!(
        checked.status.success(),
        "{}{}",
        stdout(&checked),
        stderr(&checked)
    );
    let documents = yaml_documents(&file);
    let kinds: Vec<(String, String)> = documents
        .iter()
        .map(|d| {
            (
                d["kind"].as_str().unwrap().into(),
                d["metadata"]["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    let expected = [
        ("Job", "app-release"),
        ("Deployment", "app"),
        ("Deployment", "app-worker"),
        ("Deployment", "app-clock"),
    ];
    assert_eq!(kinds, expected.map(|(k, n)| (k.to_string(), n.to_string())));
    let container = |d: &serde_json::Value| d["spec"]["template"]["spec"]["containers"][0].clone();
    assert_eq!(
        container(&documents[0])["command"],
        serde_json::json!(["/bin/sh", "-c", "python manage.py migrate"])
    );
    assert_eq!(documents[0]["spec"]["backoffLimit"], 0);
    assert_eq!(container(&documents[1])["command"][2], "gunicorn app.wsgi");
    // Each Deployment selects its own Pods only.
    let selectors: Vec<String> = documents[1..]
        .iter()
        .map(|d| {
            d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
                .as_str()
                .unwrap()
                .into()
        })
        .collect();
    assert_eq!(selectors, ["web", "worker", "clock"]);
    let worker = &documents[2]["spec"];
    assert_eq!(worker["replicas"], 2);
    assert_eq!(worker["strategy"]["rollingUpdate"]["maxUnavailable"], "0%");
    assert_eq!(
        worker["template"]["spec"]["terminationGracePeriodSeconds"],
        60
    );
    assert_eq!(
        container(&documents[2])["readinessProbe"]["exec"]["command"],
        serde_json::json!(["bin/worker-ok"])
    );
    assert!(
        container(&documents[2]).get("ports").is_none(),
        "a worker serves nothing"
    );
    let clock = &documents[3]["spec"];
    assert_eq!(clock["replicas"], 1);
    assert_eq!(clock["strategy"]["type"], "Recreate");
    assert_eq!(
        clock["minReadySeconds"], 1,
        "ready once it has stayed up the default 1000 ms"
    );
    assert!(
        stderr(&out).contains("processes.clock.singleton"),
        "{}",
        stderr(&out)
    );
    // The check can fail: a Job with a misspelt field does not pass.
    assert!(!validates_with(
        dir.path(),
        &file,
        "backoffLimit:",
        "backoffLimt:"
    ));

    let (file, out) = export_to(dir.path(), &policy, "nomad", &with_procfile);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let job: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let groups = job["Job"]["TaskGroups"].as_array().unwrap();
    let names: Vec<&str> = groups.iter().map(|g| g["Name"].as_str().unwrap()).collect();
    assert_eq!(names, ["app", "worker", "clock"]);
    assert_eq!(groups[0]["Tasks"][0]["Lifecycle"]["Hook"], "prestart");
    assert_eq!(
        groups[0]["Tasks"][0]["Config"]["args"][1],
        "python manage.py migrate"
    );
    assert_eq!(groups[1]["Count"], 2);
    assert_eq!(
        groups[1]["Update"]["Canary"], 2,
        "overlap: all new ones beside the old"
    );
    assert_eq!(groups[1]["Tasks"][0]["KillTimeout"], 60_000_000_000u64);
    assert_eq!(
        groups[2]["Update"]["Canary"], 0,
        "a singleton is never placed beside its old one"
    );
    assert_eq!(groups[2]["Update"]["MaxParallel"], 1);

    // A type the Procfile lacks, or types with no Procfile at all: refused, named.
    let lacking = write(
        dir.path(),
        "Procfile.short",
        "web: gunicorn app.wsgi\nworker: python manage.py worker\n",
    );
    let out = rollgate()
        .args(["policy", "export", "--format", "k8s", "--procfile"])
        .arg(&lacking)
        .arg(&policy)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("processes.clock: the Procfile given has no `clock:` line"),
        "{}",
        stderr(&out)
    );
    let out = rollgate()
        .args(["policy", "export", "--format", "nomad"])
        .arg(&policy)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("give the release's Procfile with --procfile"),
        "{}",
        stderr(&out)
    );
}

/// The contract holds the rules between a type's fields, naming the type.
#[test]
fn the_contract_refuses_a_singleton_of_two_and_a_formation_for_web() {
    let dir = tempfile::tempdir().unwrap();
    let head = "app:\n  progress_deadline_ms: 30000\n  poll_ms: 1000\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  processes:\n";
    for (body, said) in [
        (
            "    clock:\n      singleton: true\n      replicas: 2\n",
            "processes.clock: a singleton runs at most one process (replicas is 2)",
        ),
        (
            "    clock:\n      singleton: true\n      overlap: true\n",
            "processes.clock: a singleton never overlaps",
        ),
        (
            "    web:\n      replicas: 3\n",
            "processes.web: web's count and rules are the policy's own",
        ),
        (
            "    worker:\n      ready:\n        kind: exec\n",
            "processes.TYPE.ready.command is required for an exec check",
        ),
        (
            "    worker:\n      replicas: 1001\n",
            "processes.TYPE.replicas must be an integer from 0 to 1000",
        ),
        ("    worker:\n      stop_grace: 10\n", "stop_grace"),
    ] {
        let policy = write(dir.path(), "p.yaml", &format!("{head}{body}"));
        let out = rollgate()
            .args(["policy", "check"])
            .arg(&policy)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{body}");
        let said_all = format!("{}{}", stdout(&out), stderr(&out));
        assert!(said_all.contains(said), "{body}: {said_all}");
    }
}

/// Whether `file` with its first `from` replaced by `to` passes `kubernetes-validate --strict`.
fn validates_with(dir: &Path, file: &Path, from: &str, to: &str) -> bool {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(from), "no {from} in\n{text}");
    let broken = write(dir, "broken.yaml", &text.replacen(from, to, 1));
    kubernetes_validate(&broken).status.success()
}

/// Each YAML document of `file`, as JSON (read by the PyYAML that kubernetes-validate ships).
fn yaml_documents(file: &Path) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(python_tools().join("python"))
        .args(["-c", "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))"])
        .arg(file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// Issue 70's exports: each schedule a CronJob that passes `kubernetes-validate --strict`
/// (concurrency, zone, deadline), and a Nomad periodic job; `@every` the nearest expression, said.
/// A bad expression is refused by `policy check` with its line.
#[test]
fn schedules_export_as_cronjobs_and_periodic_jobs_and_a_bad_cron_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let policy = write(
        dir.path(),
        "app.yaml",
        "app:\n  progress_deadline_ms: 30000\n  poll_ms: 1000\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: escalate\n  schedules:\n    nightly:\n      cron: \"0 3 * * *\"\n      command: [\"bin/report\", \"--yesterday\"]\n      timeout_ms: 600000\n      concurrency: replace\n      zone: Europe/Paris\n    often:\n      cron: \"@every 2s\"\n      command: [\"bin/tick\"]\n      catch_up: last\n",
    );
    let (file, out) = export_to(
        dir.path(),
        &policy,
        "k8s",
        &["--image", "reg.example/app:v4"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let checked = kubernetes_validate(&file);
    assert!(
        checked.status.success(),
        "{}{}",
        stdout(&checked),
        stderr(&checked)
    );
    let documents = yaml_documents(&file);
    let jobs: Vec<&serde_json::Value> = documents
        .iter()
        .filter(|d| d["kind"] == "CronJob")
        .collect();
    assert_eq!(jobs.len(), 2);
    let nightly = jobs
        .iter()
        .find(|j| j["metadata"]["name"] == "app-nightly")
        .unwrap();
    assert_eq!(nightly["spec"]["schedule"], "0 3 * * *");
    assert_eq!(nightly["spec"]["concurrencyPolicy"], "Replace");
    assert_eq!(nightly["spec"]["timeZone"], "Europe/Paris");
    assert_eq!(nightly["spec"]["startingDeadlineSeconds"], 60);
    assert_eq!(
        nightly["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"],
        600
    );
    let often = jobs
        .iter()
        .find(|j| j["metadata"]["name"] == "app-often")
        .unwrap();
    assert_eq!(often["spec"]["schedule"], "* * * * *");
    assert!(
        often["spec"].get("startingDeadlineSeconds").is_none(),
        "catch_up 'last"
    );
    assert!(
        stderr(&out).contains("schedules.often: `@every 2s`"),
        "{}",
        stderr(&out)
    );
    assert!(!validates_with(
        dir.path(),
        &file,
        "concurrencyPolicy:",
        "concurrency:"
    ));

    let (file, out) = export_to(dir.path(), &policy, "nomad", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&file).unwrap();
    let jobs: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&text)
        .into_iter::<serde_json::Value>()
        .map(Result::unwrap)
        .collect();
    assert_eq!(jobs.len(), 3, "the service's job, then one per schedule");
    let nightly = jobs
        .iter()
        .find(|j| j["Job"]["ID"] == "app-nightly")
        .unwrap();
    assert_eq!(nightly["Job"]["Type"], "batch");
    assert_eq!(nightly["Job"]["Periodic"]["Spec"], "0 3 * * *");
    assert_eq!(nightly["Job"]["Periodic"]["ProhibitOverlap"], true);
    assert_eq!(
        nightly["Job"]["TaskGroups"][0]["Tasks"][0]["Config"]["args"][0],
        "--yesterday"
    );
    assert!(
        stderr(&out).contains("schedules.nightly.concurrency = 'replace"),
        "{}",
        stderr(&out)
    );

    let bad = write(
        dir.path(),
        "bad.yaml",
        "app:\n  progress_deadline_ms: 30000\n  poll_ms: 1000\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  schedules:\n    nightly:\n      cron: \"61 3 * * *\"\n      command: [\"bin/report\"]\n",
    );
    let out = rollgate()
        .args(["policy", "check"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        said.contains("its minute field `61` is not a value, range, step or list within 0-59"),
        "{said}"
    );
    assert!(
        said.contains("bad.yaml:9"),
        "the line of the expression: {said}"
    );
}
