//! Issue 59's acceptance: a hostile release, deployed through the ordinary gate with the
//! default settings beside a second service that has a secret, with a proxy in front, tries
//! twelve acts before it answers its readiness probe, and the kernel refuses every one. The
//! same release with `isolation.enabled = false` is allowed them, so the test can fail.

use crate::common::http::Proxy;
use crate::common::*;

/// The acts, each recorded in `$STATE_DIRECTORY/$ROLLGATE_VERSION-acts.json` as "allowed" or
/// "refused: why", then the release serves.
pub(crate) const HOSTILE: &str = r#"
import json, os, signal, socket, subprocess, sys
OTHER, MARKER = os.environ["HOSTILE_OTHER"], os.environ["HOSTILE_MARKER"]
OTHER_PID, PROXY_PID = int(os.environ["HOSTILE_OTHER_PID"]), int(os.environ["HOSTILE_PROXY_PID"])
results = {}
def act(name, attempt):
    try:
        attempt()
        results[name] = "allowed"
    except Exception as e:
        results[name] = "refused: %s %s" % (type(e).__name__, str(e)[:120])
def be_root():
    if os.getuid() != 0:
        raise PermissionError("runs as uid %d" % os.getuid())
def write_then_remove(path):
    with open(path, "w") as f:
        f.write("hostile")
    os.remove(path)
def stop_and_continue(pid):
    os.kill(pid, signal.SIGSTOP)
    os.kill(pid, signal.SIGCONT)
def touch_memory():
    run = subprocess.run([sys.executable, "-c", "b = b'x' * (2 << 30); print(len(b))"],
                         capture_output=True)
    if run.returncode != 0:
        raise MemoryError("the toucher ended with %d" % run.returncode)
FORKS = """
import os, signal, time
made = []
for _ in range(2000):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    made.append(pid)
print(len(made), flush=True)
for pid in made:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
"""
def fork_2000():
    run = subprocess.run([sys.executable, "-c", FORKS], capture_output=True, text=True)
    made = int(run.stdout.strip() or "0")
    if made < 2000:
        raise BlockingIOError("%d of 2000 processes" % made)
act("run as uid 0", be_root)
act("write in /etc", lambda: write_then_remove("/etc/rollgate-hostile-%d" % os.getpid()))
act("write in the other root", lambda: write_then_remove(OTHER + "/hostile"))
act("read the other's secret file", lambda: open(OTHER + "/secrets/db").read())
act("read the other's environ", lambda: open("/proc/%d/environ" % OTHER_PID, "rb").read())
act("signal the other service", lambda: stop_and_continue(OTHER_PID))
act("signal the proxy", lambda: stop_and_continue(PROXY_PID))
act("signal the deployer", lambda: stop_and_continue(int(os.environ["DEPLOYER"])))
act("read the other's memory", lambda: open("/proc/%d/mem" % OTHER_PID, "rb").close())
act("touch 2 GiB", touch_memory)
act("start 2000 processes", fork_2000)
act("bind port 81", lambda: socket.socket().bind(("127.0.0.1", 81)))
act("open a raw socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
act("list /root", lambda: os.listdir("/root"))
subprocess.Popen(["setsid", "sh", "-c", "sleep %s" % MARKER], stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
with open("%s/%s-acts.json" % (os.environ["STATE_DIRECTORY"], os.environ["ROLLGATE_VERSION"]), "w") as f:
    json.dump(results, f)
"#;

/// What the hostile script aims at, as its environment says it (`NAME=VALUE` lines).
pub(crate) fn targets(other: &Site, proxy_pid: u32, marker: &str) -> String {
    format!(
        "HOSTILE_OTHER={}\nHOSTILE_OTHER_PID={}\nHOSTILE_PROXY_PID={proxy_pid}\nHOSTILE_MARKER={marker}\n",
        other.root().display(),
        other.live_pid().unwrap()
    )
}

/// A hostile release `version` in `site`, aimed at `other` (its live pid), the proxy and the
/// deployer (its parent).
fn hostile(site: &Site, version: &str, other: &Site, proxy_pid: u32, marker: &str) {
    write(
        site.root(),
        &format!("releases/{version}/hostile.py"),
        HOSTILE,
    );
    let exported: String = targets(other, proxy_pid, marker)
        .lines()
        .map(|line| format!("export {line}\n"))
        .collect();
    site.script(
        version,
        &format!(
            "{exported}DEPLOYER=$PPID python3 ./hostile.py\nexec '{}' sample-service\n",
            crate::common::bin().display()
        ),
    );
}

/// The acts take seconds before the release serves (2 GiB, 2000 forks): a generous deadline.
fn policy(site: &Site, isolation: &str) -> String {
    isolation_policy(site, 120_000, isolation)
}

pub(crate) fn acts(site: &Site, version: &str) -> serde_json::Map<String, serde_json::Value> {
    let path = site.root().join(format!("data/{version}-acts.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match serde_json::from_str(&text).unwrap() {
        serde_json::Value::Object(map) => map,
        other => panic!("{other}"),
    }
}

#[test]
fn a_hostile_release_is_refused_all_twelve_acts_and_allowed_them_unconfined() {
    // The neighbour: a service with a secret, live.
    let other = Site::new();
    assert_eq!(set_secret(&other, "db", "hunter2").status.code(), Some(0));
    other.release("v1", "");
    write(other.root(), "releases/v1/secrets", "DB_PASSWORD=db\n");
    let out = other.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    // The hostile service behind its proxy, deployed through the gate with its limits.
    let site = Site::new();
    let proxy = Proxy::start(&site, &[]);
    let marker = format!(
        "{}.{}",
        4000 + std::process::id() % 1000,
        std::process::id()
    );
    hostile(&site, "v1", &other, proxy.child.id(), &marker);
    let limits = policy(&site, r#"{"memory_mb": 1024, "pids": 512}"#);
    let out = site.deploy(free_port(), "v1", &["--policy", &limits]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let confined = acts(&site, "v1");
    let refused = confined
        .iter()
        .filter(|(_, said)| said.as_str().is_some_and(|s| s.starts_with("refused")))
        .count();
    assert_eq!(refused, 14, "{confined:#?}");
    // Twelve acts (signals counted per target, environ beside the file): every one refused,
    // and the daemon it left must die with it once the next deploy retires it.
    assert!(
        wait_for(10, || a_process_mentions(&marker)),
        "the daemon started"
    );
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        wait_for(10, || !a_process_mentions(&marker)),
        "the daemon outlived its retired release"
    );
    // The neighbour, the proxy and their files are as they were.
    assert!(alive(other.live_pid().unwrap()));
    assert_eq!(
        std::fs::read_to_string(other.root().join("secrets/db")).unwrap(),
        "hunter2"
    );
    assert!(!other.root().join("hostile").exists());

    // Unconfined, with no limits: allowed (where the act is about privilege, not the tree).
    let marker = format!(
        "{}.{}",
        5000 + std::process::id() % 1000,
        std::process::id()
    );
    hostile(&site, "v3", &other, proxy.child.id(), &marker);
    let open = policy(&site, r#"{"enabled": false}"#);
    let out = site.deploy(free_port(), "v3", &["--policy", &open]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let unconfined = acts(&site, "v3");
    let allowed: Vec<&String> = unconfined
        .iter()
        .filter(|(_, said)| said == &"allowed")
        .map(|(act, _)| act)
        .collect();
    assert_eq!(allowed.len(), 14, "{unconfined:#?}");
    // The tree still holds the daemon: a retired unconfined release leaves nothing either.
    let out = site.deploy(free_port(), "v2", &["--watch-ms", "0"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(wait_for(10, || !a_process_mentions(&marker)));
}

/// Issue 59: the daemon of a release whose rollgate was killed (kill -9, mid-gate) dies when
/// recovery runs at the next deploy — found by its release's cgroup tree, though it left the
/// release's session and cleared its environment (no token for a scan of environments to find).
#[test]
fn a_daemon_left_by_a_release_whose_rollgate_was_killed_dies_when_recovery_runs() {
    let site = Site::new();
    let marker = format!(
        "{}.{}",
        6000 + std::process::id() % 1000,
        std::process::id()
    );
    site.script(
        "v1",
        &format!(
            "env -i setsid sh -c 'sleep {marker}' </dev/null >/dev/null 2>&1 &\nexec sleep 300\n"
        ),
    );
    let mut deployer = site.deploy_in_background("v1", "60000");
    assert!(
        wait_for(10, || a_process_mentions(&marker)),
        "the daemon started"
    );
    deployer.kill().unwrap();
    deployer.wait().unwrap();
    assert!(
        a_process_mentions(&marker),
        "the daemon outlives its rollgate until recovery"
    );
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        wait_for(10, || !a_process_mentions(&marker)),
        "the daemon outlived recovery"
    );
    let abandoned = site
        .log_lines()
        .into_iter()
        .find(|l| l["event"] == "rolled_back" && l["version"] == "v1")
        .expect("v1's deploy is settled as abandoned");
    assert!(
        abandoned["detail"]
            .as_str()
            .unwrap()
            .contains("died before an outcome"),
        "{abandoned}"
    );
}
