//! `rollgate fleet playbook`, run for real: `ansible-playbook` (ansible-core from PyPI, in a
//! virtual environment `.ci/run` creates) rolls a version across an inventory of ten hosts that
//! are local roots (`ansible_connection=local`), each host its own root and ports, each running
//! the real `rollgate deploy`. What each root's `deploy.log` says is what is checked.

use crate::common::*;

use std::path::{Path, PathBuf};
use std::process::Output;

/// `ansible-playbook` from the tools' virtual environment (ansible-core from PyPI).
fn ansible_playbook() -> PathBuf {
    python_tools().join("ansible-playbook")
}

/// Ten hosts (roots) of edge-svc, each with v1 deployed and live and v2 installed.
struct Fleet {
    dir: tempfile::TempDir,
    hosts: usize,
}

impl Fleet {
    /// `bad_v2`: the hosts whose v2 exits at boot; `classes`: (host, class) pairs; `block`:
    /// this fleet's pair of port blocks (below the ephemeral range, where no outgoing
    /// connection can take a port between the pick and the deploy).
    fn new(bad_v2: &[usize], classes: &[(usize, &str)], block: u16) -> Fleet {
        let fleet = Fleet {
            dir: tempfile::tempdir().unwrap(),
            hosts: 10,
        };
        let bin = crate::common::bin();
        let first_port = |block: u16| -> u16 {
            let range = ten_ports(block);
            range
                .split('-')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap()
        };
        let (v1_ports, v2_ports) = (first_port(block), first_port(block + 1));
        let mut inventory = String::from("[edge]\n");
        for host in 0..fleet.hosts {
            let root = fleet.root(host);
            for version in ["v1", "v2"] {
                let knobs = if version == "v2" && bad_v2.contains(&host) {
                    " --exit-after-ms 0 --exit-code 3"
                } else {
                    ""
                };
                let path = write(
                    &root,
                    &format!("releases/{version}/edge-svc"),
                    &format!(
                        "#!/bin/sh\nexec '{}' sample-service{knobs}\n",
                        bin.display()
                    ),
                );
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            let out = rollgate()
                .args([
                    "deploy",
                    "edge-svc",
                    &(v1_ports + host as u16).to_string(),
                    "v1",
                    "--root",
                ])
                .arg(&root)
                .output()
                .unwrap();
            assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
            let class = classes
                .iter()
                .find(|(h, _)| *h == host)
                .map_or(String::new(), |(_, c)| format!(" rollgate_class={c}"));
            inventory.push_str(&format!(
                "host{host} rollgate_root={} rollgate_port={} ansible_connection=local{class}\n",
                root.display(),
                v2_ports + host as u16
            ));
        }
        inventory.push_str(&format!(
            "[all:vars]\nansible_python_interpreter={}\n",
            ansible_playbook().with_file_name("python").display()
        ));
        write(fleet.dir.path(), "inventory.ini", &inventory);
        fleet
    }

    fn root(&self, host: usize) -> PathBuf {
        self.dir.path().join(format!("h{host}"))
    }

    /// Writes the playbook for this policy and runs it.
    fn roll(&self, policy: &str, moving: usize) -> Output {
        self.roll_version(policy, moving, "v2")
    }

    /// Writes the playbook that rolls `version` out under this policy and runs it.
    fn roll_version(&self, policy: &str, moving: usize, version: &str) -> Output {
        let policy_path = write(self.dir.path(), "policy.json", policy);
        let out = rollgate()
            .args(["fleet", "playbook", "--policy"])
            .arg(&policy_path)
            .args([
                "--service",
                "edge-svc",
                "--version",
                version,
                "--group",
                "edge",
            ])
            .args(["--hosts", &moving.to_string(), "--rollgate"])
            .arg(crate::common::bin())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let playbook = write(self.dir.path(), "roll.yml", &stdout(&out));
        std::process::Command::new(ansible_playbook())
            .arg("-i")
            .arg(self.dir.path().join("inventory.ini"))
            .arg(&playbook)
            .env("ANSIBLE_NOCOLOR", "1")
            .output()
            .unwrap()
    }

    fn log(&self, host: usize) -> Vec<serde_json::Value> {
        log_of(&self.root(host))
    }

    /// The version `current` names on the host.
    fn live(&self, host: usize) -> String {
        let text = std::fs::read_to_string(self.root(host).join("current")).unwrap();
        let pointer: serde_json::Value = serde_json::from_str(&text).unwrap();
        pointer["version"].as_str().unwrap().to_string()
    }

    /// When v2 was promoted on the host, if it was.
    fn promoted_at(&self, host: usize) -> Option<f64> {
        self.log(host)
            .iter()
            .find(|l| l["event"] == "promoted" && l["version"] == "v2")
            .map(|l| l["ts"].as_f64().unwrap())
    }

    fn touched(&self, host: usize) -> bool {
        self.log(host).iter().any(|l| l["version"] == "v2")
    }

    /// `rollgate log summary` of the host's log: what it says is live.
    fn summary_live(&self, host: usize) -> String {
        let out = rollgate()
            .args(["log", "summary"])
            .arg(self.root(host).join("deploy.log"))
            .output()
            .unwrap();
        let summary: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        summary["live"].as_str().unwrap_or("").to_string()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for host in 0..self.hosts {
            let named = |file: &str| -> Vec<i64> {
                let Ok(text) = std::fs::read_to_string(self.root(host).join(file)) else {
                    return Vec::new();
                };
                let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                match value["replicas"]
                    .as_array()
                    .or(value["processes"].as_array())
                {
                    Some(replicas) => replicas.iter().filter_map(|r| r["pid"].as_i64()).collect(),
                    None => value["pid"].as_i64().into_iter().collect(),
                }
            };
            // Their keepers first, or they would start them again.
            kill_keepers_in(&self.root(host));
            let named_anywhere = ["current", "replicas.json", "formation.json"].map(named);
            for pid in named_anywhere.into_iter().flatten() {
                send_signal(-(pid as i32), 9);
            }
        }
    }
}

/// Three hosts, each with the sample service installed as `versions`, brought up by `start`
/// (given the host's root and its range of ports) and listed in the inventory with
/// `rollgate_ports` and no port of its own.
fn three_hosts(
    versions: &[&str],
    range_of: impl Fn(usize) -> String,
    start: impl Fn(&Path, &str) -> Output,
) -> Fleet {
    let fleet = Fleet {
        dir: tempfile::tempdir().unwrap(),
        hosts: 3,
    };
    let bin = crate::common::bin();
    let mut inventory = String::from("[edge]\n");
    for host in 0..fleet.hosts {
        let root = fleet.root(host);
        for version in versions {
            let path = write(
                &root,
                &format!("releases/{version}/edge-svc"),
                &format!("#!/bin/sh\nexec '{}' sample-service\n", bin.display()),
            );
            make_executable(&path);
        }
        let ports = range_of(host);
        let out = start(&root, &ports);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        inventory.push_str(&format!(
            "host{host} rollgate_root={} rollgate_ports={ports} ansible_connection=local\n",
            root.display()
        ));
    }
    inventory.push_str(&format!(
        "[all:vars]\nansible_python_interpreter={}\n",
        ansible_playbook().with_file_name("python").display()
    ));
    write(fleet.dir.path(), "inventory.ini", &inventory);
    fleet
}

/// Three hosts that each run two replicas of edge-svc v1 (`rollgate_ports`), v2 installed.
fn replica_hosts(block: u16) -> Fleet {
    three_hosts(
        &["v1", "v2"],
        |host| ten_ports(block + host as u16),
        |root, ports| {
            rollgate()
                .args([
                    "rollout",
                    "edge-svc",
                    "v1",
                    "--replicas",
                    "2",
                    "--ports",
                    ports,
                ])
                .arg("--root")
                .arg(root)
                .output()
                .unwrap()
        },
    )
}

/// Three hosts with edge-svc v1 live and v2, v3 and v4 installed, each given a range of two
/// ports in the inventory (`rollgate_ports`) and no port of its own.
fn range_hosts(block: u16) -> Fleet {
    let first = first_of(block);
    three_hosts(
        &["v1", "v2", "v3", "v4"],
        |host| {
            let low = first + 2 * host as u16;
            format!("{low}-{}", low + 1)
        },
        |root, ports| {
            rollgate()
                .args(["deploy", "edge-svc", "v1", "--ports", ports, "--root"])
                .arg(root)
                .output()
                .unwrap()
        },
    )
}

fn log_of(root: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(root.join("deploy.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn policy(max_failure_ratio: f64) -> String {
    policy_with(max_failure_ratio, "")
}

/// The policy, with `extra` fields (`, "soak_ms": 1000`).
fn policy_with(max_failure_ratio: f64, extra: &str) -> String {
    format!(
        r#"{{"edge_svc": {{"progress_deadline_ms": 3000, "poll_ms": 50, "max_unavailable_pct": 0, "max_surge_pct": 100, "on_stall": "rollback", "watch_ms": 0, "stop_grace_ms": 1000, "max_failure_ratio": {max_failure_ratio}{extra}}}}}"#
    )
}

fn said(out: &Output) -> String {
    format!("{}{}", stdout(out), stderr(out))
}

#[test]
fn hosts_move_in_rollgates_waves_in_order_and_every_log_tells_the_truth() {
    let fleet = Fleet::new(&[], &[], 60);
    // A soak after each batch, then the batch's hosts asked again (`rollgate status`).
    let out = fleet.roll(&policy_with(0.2, r#", "soak_ms": 300"#), 10);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let text = said(&out);
    assert_eq!(
        text.matches("TASK [the batch's hosts still answer their probe on v2]")
            .count(),
        4,
        "{text}"
    );
    // Waves 1, 10, 50, 100 % of ten hosts: batches of 1, 1, 3, 5, in inventory order.
    let batches: [&[usize]; 4] = [&[0], &[1], &[2, 3, 4], &[5, 6, 7, 8, 9]];
    let at: Vec<f64> = (0..10).map(|h| fleet.promoted_at(h).unwrap()).collect();
    for pair in batches.windows(2) {
        let last_of_earlier = pair[0].iter().map(|h| at[*h]).fold(f64::MIN, f64::max);
        let first_of_later = pair[1].iter().map(|h| at[*h]).fold(f64::MAX, f64::min);
        assert!(
            last_of_earlier < first_of_later,
            "batch {:?} before {:?}: {at:?}",
            pair[0],
            pair[1]
        );
    }
    for host in 0..10 {
        assert_eq!(fleet.live(host), "v2");
        assert_eq!(fleet.summary_live(host), "v2");
    }
}

#[test]
fn a_canary_that_fails_its_gate_stops_the_play_with_every_other_host_on_the_old_release() {
    let fleet = Fleet::new(&[0], &[], 62);
    // Even a policy that tolerates every failure stops at a failed canary.
    let out = fleet.roll(&policy(1.0), 10);
    assert_ne!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(fleet.live(0), "v1");
    assert_eq!(fleet.summary_live(0), "v1");
    let rolled_back = fleet.log(0);
    assert!(
        rolled_back
            .iter()
            .any(|l| l["event"] == "rolled_back" && l["version"] == "v2"),
        "{rolled_back:?}"
    );
    for host in 1..10 {
        assert!(!fleet.touched(host), "host {host} was touched");
        assert_eq!(fleet.live(host), "v1");
    }
}

#[test]
fn a_failing_required_host_aborts_the_play() {
    // Host 3 (in the third batch: hosts 2, 3, 4) is required and its v2 fails; one failure in
    // three is within the 0.5 ratio, so only its class stops the play.
    let fleet = Fleet::new(&[3], &[(3, "required")], 64);
    let out = fleet.roll(&policy(0.5), 10);
    assert_ne!(out.status.code(), Some(0), "{}", said(&out));
    assert!(said(&out).contains("required host host3"), "{}", said(&out));
    assert_eq!(fleet.live(3), "v1");
    for host in 5..10 {
        assert!(!fleet.touched(host), "host {host} was touched");
    }
}

#[test]
fn a_batch_over_the_failure_ratio_stops_the_play_and_one_within_it_does_not() {
    // One failure in the third batch of three: 33 % is more than 20 %.
    let strict = Fleet::new(&[3], &[], 66);
    let out = strict.roll(&policy(0.2), 10);
    assert_ne!(out.status.code(), Some(0), "{}", said(&out));
    for host in 5..10 {
        assert!(!strict.touched(host), "host {host} was touched");
    }
    assert_eq!(strict.live(2), "v2");
    assert_eq!(strict.live(3), "v1");

    // The same failure within a 0.5 ratio: the play goes on; host 3 keeps v1 and says so.
    let lenient = Fleet::new(&[3], &[], 68);
    let out = lenient.roll(&policy(0.5), 10);
    for host in (0..10).filter(|h| *h != 3) {
        assert_eq!(lenient.live(host), "v2", "{}", said(&out));
    }
    assert_eq!(lenient.live(3), "v1");
    assert_eq!(lenient.summary_live(3), "v1");
}

#[test]
fn left_behind_hosts_are_not_touched() {
    let fleet = Fleet::new(&[], &[(9, "left_behind")], 70);
    // The playbook is cut for the nine hosts that move; cut for ten it refuses to run.
    let out = fleet.roll(&policy(0.2), 10);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        said(&out).contains("write it again with that --hosts"),
        "{}",
        said(&out)
    );
    assert!(!fleet.touched(0));
    let out = fleet.roll(&policy(0.2), 9);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    for host in 0..9 {
        assert_eq!(fleet.live(host), "v2");
    }
    assert!(!fleet.touched(9));
    assert_eq!(fleet.live(9), "v1");
}

/// And the formation travels with the policy (issue 69, 6): v2 has a worker type, and every
/// host runs the policy's two workers of it beside its web replicas.
#[test]
fn hosts_that_run_replicas_are_moved_by_a_rollout_each_and_rechecked() {
    let fleet = replica_hosts(80);
    for host in 0..3 {
        let v2 = fleet.root(host).join("releases/v2");
        write(&v2, "Procfile", "worker: exec sleep 600\n");
    }
    let processes = r#", "processes": {"worker": {"replicas": 2, "min_ready_ms": 200}}"#;
    let out = fleet.roll(
        &policy_with(0.2, &format!(r#", "soak_ms": 200{processes}"#)),
        3,
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    for host in 0..3 {
        let workers: Vec<(String, String)> = typed_processes(&fleet.root(host))
            .iter()
            .filter(|p| alive(p["pid"].as_i64().unwrap() as i32))
            .map(|p| {
                (
                    format!("{}.{}", p["process_type"].as_str().unwrap(), p["index"]),
                    p["version"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let v2 = |name: &str| (name.to_string(), "v2".to_string());
        assert_eq!(workers, [v2("worker.0"), v2("worker.1")], "host {host}");
        let text = std::fs::read_to_string(fleet.root(host).join("replicas.json")).unwrap();
        let set: serde_json::Value = serde_json::from_str(&text).unwrap();
        let versions: Vec<&str> = set["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["version"].as_str().unwrap())
            .collect();
        assert_eq!(versions, ["v2", "v2"], "host {host}");
        assert!(
            fleet
                .log(host)
                .iter()
                .any(|l| l["event"] == "rollout_started" && l["version"] == "v2"),
            "host {host} ran a rollout"
        );
        assert_eq!(fleet.summary_live(host), "v2");
        // The host keeps the reviewed entry it was held to, as the playbook carried it.
        let kept =
            std::fs::read_to_string(fleet.root(host).join(".rollgate-fleet-policy.json")).unwrap();
        let kept: serde_json::Value = serde_json::from_str(&kept).unwrap();
        assert_eq!(kept["edge_svc"]["soak_ms"], 200, "host {host}: {kept}");
        assert_eq!(
            kept["edge_svc"]["max_failure_ratio"], 0.2,
            "host {host}: {kept}"
        );
    }
}

/// Issue 37.6: the same inventory, never edited, deploys release after release: rollgate picks
/// each host's port that is not live, so the canary of the second play is not refused.
#[test]
fn one_inventory_of_port_ranges_moves_every_host_on_each_of_three_plays() {
    let fleet = range_hosts(90);
    let inventory = std::fs::read(fleet.dir.path().join("inventory.ini")).unwrap();
    let port_of = |host: usize| -> u64 {
        let text = std::fs::read_to_string(fleet.root(host).join("current")).unwrap();
        let pointer: serde_json::Value = serde_json::from_str(&text).unwrap();
        pointer["port"].as_u64().unwrap()
    };
    let mut ports: Vec<Vec<u64>> = (0..3).map(|host| vec![port_of(host)]).collect();
    for version in ["v2", "v3", "v4"] {
        let out = fleet.roll_version(&policy(0.2), 3, version);
        assert_eq!(out.status.code(), Some(0), "{version}: {}", said(&out));
        for (host, seen) in ports.iter_mut().enumerate() {
            assert_eq!(fleet.live(host), version, "host {host}");
            assert_eq!(fleet.summary_live(host), version, "host {host}");
            assert!(
                fleet
                    .log(host)
                    .iter()
                    .any(|l| l["event"] == "promoted" && l["version"] == version),
                "host {host} promoted {version}"
            );
            seen.push(port_of(host));
        }
    }
    assert_eq!(
        std::fs::read(fleet.dir.path().join("inventory.ini")).unwrap(),
        inventory
    );
    // Each host alternates between the two ports of its range, from the lower one (v1's).
    for (host, seen) in ports.iter().enumerate() {
        let low = seen[0];
        assert_eq!(seen, &[low, low + 1, low, low + 1], "host {host}: {seen:?}");
    }
}

#[test]
fn a_policy_exports_as_a_nomad_update_block_and_says_what_nomad_cannot_express() {
    let out = rollgate()
        .args(["policy", "export", "--format", "nomad"])
        .arg(repo().join("contracts/policy.ncl"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.lines().count(), 1, "{text}");
    let job: serde_json::Value = serde_json::from_str(&text).unwrap();
    let group = &job["Job"]["TaskGroups"][0];
    let update = &group["Update"];
    // The example policy: 1500 ms to be ready, a rollback on a stall, one replica.
    assert_eq!(update["HealthyDeadline"], 1_500_000_000u64);
    assert_eq!(update["AutoRevert"], true);
    assert_eq!(update["MaxParallel"], 1);
    assert!(update["ProgressDeadline"].as_u64() > update["HealthyDeadline"].as_u64());
    assert_eq!(group["Services"][0]["Checks"][0]["Path"], "/readyz");
    // Its 100 ms poll is below Nomad's shortest check interval: said on stderr and in Meta.
    assert!(
        stderr(&out).contains("not expressed in Nomad: edge_svc: poll_ms 100"),
        "{}",
        stderr(&out)
    );
    assert!(job["Job"]["Meta"]["rollgate.unexpressed"]
        .as_str()
        .unwrap()
        .contains("poll_ms"));
}

/// `rollgate fleet move`, the play's one task a host: a policy on standard input that is not
/// JSON, or a single port for a root that runs replicas, is refused before anything is kept or
/// started; the root stays as it was.
#[test]
fn fleet_move_refuses_a_policy_that_is_not_json_and_a_port_for_replicas_touching_nothing() {
    let site = Site::new();
    site.release("v2", "");
    let move_with = |stdin: &str, extra: &[&str]| -> Output {
        rollgate()
            .args(["fleet", "move", "edge-svc", "v2", "--root"])
            .arg(site.root())
            .args(extra)
            .write_stdin(stdin.to_string())
            .output()
            .unwrap()
    };
    let kept = site.root().join(".rollgate-fleet-policy.json");

    let out = move_with(
        "{\"edge_svc\": {\"poll_ms\": 50,\n  oops}",
        &["--port", "1"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(stderr(&out).contains("line 2, column 3"), "{}", said(&out));
    let out = move_with("[1, 2]", &["--port", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(stderr(&out).contains("not a JSON object"), "{}", said(&out));

    std::fs::write(site.root().join("replicas.json"), "{}").unwrap();
    let out = move_with(&policy(0.2), &["--port", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(stderr(&out).contains("give --ports A-B"), "{}", said(&out));

    assert!(!kept.exists(), "nothing kept from a refused move");
    assert!(!site.root().join("deploy.log").exists(), "nothing started");
}
