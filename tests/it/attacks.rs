//! Issue 66: a hostile release attacks its confinement the way an attacker with the source in
//! hand would — each test performs one attack for real, through the ordinary deploy, and
//! fails on a rollgate that lets it through.

use crate::common::*;
use crate::hostile::acts;

use std::io::{Read, Write};

/// Python that records acts as `hostile.py` does: `$STATE_DIRECTORY/$ROLLGATE_VERSION-acts.json`,
/// each "allowed" or "refused: why".
const ACTS: &str = r#"
import ctypes, json, os, signal, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
results = {}
def act(name, attempt):
    try:
        attempt()
        results[name] = "allowed"
    except Exception as e:
        results[name] = "refused: %s %s" % (type(e).__name__, str(e)[:120])
def done():
    path = "%s/%s-acts.json" % (os.environ["STATE_DIRECTORY"], os.environ["ROLLGATE_VERSION"])
    with open(path, "w") as f:
        json.dump(results, f)
def failed(what):
    raise OSError(ctypes.get_errno(), "%s: %s" % (what, os.strerror(ctypes.get_errno())))
class Message(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 32)]
IPC_CREAT, IPC_NOWAIT, SHM_RDONLY = 0o1000, 0o4000, 0o10000
"#;

/// v1 leaves a shared memory segment and a message queue behind, each holding a secret.
const LEAVES_IPC: &str = r#"
KEY = int(os.environ["IPC_KEY"])
segment = libc.shmget(KEY, 4096, IPC_CREAT | 0o600)
if segment < 0: failed("shmget")
ctypes.memmove(libc.shmat(segment, None, 0), b"v1's secret", 11)
queue = libc.msgget(KEY + 1, IPC_CREAT | 0o600)
if queue < 0: failed("msgget")
libc.msgsnd(queue, ctypes.byref(Message(1, b"v1's queued secret")), 32, 0)
"#;

/// v2, a candidate of the same service (the same uid): its attacks on the live release, on
/// ports and on what v1 left.
const ATTACKS: &str = r#"
KEY = int(os.environ["IPC_KEY"])
def signal_live():
    pid = int(os.environ["LIVE_PID"])
    os.kill(pid, signal.SIGSTOP)
    os.kill(pid, signal.SIGCONT)
def bind_another_port():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(os.environ["OTHER_PORT"])))
def connect_abstract():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + os.environ["ABSTRACT_NAME"])
def read_segment():
    segment = libc.shmget(KEY, 0, 0)
    if segment < 0: failed("shmget")
    if ctypes.string_at(libc.shmat(segment, None, SHM_RDONLY), 11) != b"v1's secret":
        raise ValueError("not v1's segment")
def read_queue():
    queue = libc.msgget(KEY + 1, 0)
    if queue < 0: failed("msgget")
    message = Message()
    if libc.msgrcv(queue, ctypes.byref(message), 32, 0, IPC_NOWAIT) < 0: failed("msgrcv")
act("signal its own service's live release", signal_live)
act("bind a port that is not its own", bind_another_port)
act("connect to an abstract socket made outside it", connect_abstract)
act("read the shared memory its last release left", read_segment)
act("read the message queue its last release left", read_queue)
"#;

/// A release whose script runs `python` (written beside it), then serves.
fn python_then_serve(site: &Site, version: &str, env: &str, python: &str) {
    write(site.root(), &format!("releases/{version}/acts.py"), python);
    site.script(
        version,
        &format!(
            "{env}python3 ./acts.py\nexec '{}' sample-service\n",
            crate::common::bin().display()
        ),
    );
}

/// The System V objects owned by `uid` in the host's IPC namespace.
fn ipc_of(uid: u64) -> Vec<String> {
    ["shm", "msg"]
        .iter()
        .flat_map(|kind| {
            let text = std::fs::read_to_string(format!("/proc/sysvipc/{kind}")).unwrap_or_default();
            let header: Vec<String> = text
                .lines()
                .next()
                .unwrap_or("")
                .split_whitespace()
                .map(str::to_string)
                .collect();
            let at = header.iter().position(|h| h == "uid").unwrap_or(usize::MAX);
            text.lines()
                .skip(1)
                .filter(|l| l.split_whitespace().nth(at) == Some(uid.to_string().as_str()))
                .map(|l| format!("{kind}: {l}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The real uid process `pid` runs as.
fn uid_of(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
        .unwrap()
}

/// Attacks 3 and 6: a candidate signals the release it would be rolled back to (the same
/// uid), binds a port that is not its own (another service's next one), connects to an
/// abstract socket made outside it, and reads the IPC objects its service's last release left
/// — every one refused (Landlock's scopes and network rules, an IPC namespace per release);
/// and nothing of the service's is left in the host's IPC namespace.
#[test]
fn a_candidate_cannot_signal_its_live_release_take_a_port_or_read_what_its_last_release_left() {
    let site = Site::new();
    let key = 0x5247_0000 + (std::process::id() % 0xffff);
    python_then_serve(
        &site,
        "v1",
        &format!("export IPC_KEY={key}\n"),
        &format!("{ACTS}{LEAVES_IPC}"),
    );
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let uid = service_uid(&site);
    assert_eq!(
        ipc_of(uid),
        Vec::<String>::new(),
        "v1's objects are its own"
    );
    let live = site.live_pid().unwrap();

    use std::os::linux::net::SocketAddrExt;
    let abstract_name = format!("rollgate-test-outside-{}", std::process::id());
    let outside = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name.as_bytes())
        .and_then(|address| std::os::unix::net::UnixListener::bind_addr(&address))
        .unwrap();
    let other_port = free_port();
    python_then_serve(
        &site,
        "v2",
        &format!(
            "export IPC_KEY={key} LIVE_PID={live} OTHER_PORT={other_port} ABSTRACT_NAME={abstract_name}\n"
        ),
        &format!("{ACTS}{ATTACKS}done()\n"),
    );
    let out = site.deploy(free_port(), "v2", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = acts(&site, "v2");
    assert_eq!(said.len(), 5, "{said:#?}");
    for (act, result) in &said {
        assert!(
            result.as_str().is_some_and(|r| r.starts_with("refused")),
            "{act}: {result}"
        );
    }
    drop(outside);
    // v1 is retired: nothing of its service's is left in the host's IPC namespace.
    assert!(!alive(live));
    assert_eq!(ipc_of(uid), Vec::<String>::new());
}

/// Attack 2: another process takes the candidate's port (after rollgate found it free) and
/// answers its probes. The gate passes only when what listens there is the candidate's own:
/// the deploy is rolled back, naming the process that holds the port.
#[test]
fn a_port_taken_by_another_process_fails_the_gate_naming_who_holds_it() {
    let site = Site::new();
    // A candidate that never listens: whatever answers on its port is someone else.
    site.script("v1", "exec sleep 120\n");
    let port = free_port();
    let mut deploy = std::process::Command::new(crate::common::bin())
        .args([
            "deploy",
            "edge-svc",
            &port.to_string(),
            "v1",
            "20000",
            "--root",
        ])
        .arg(site.root())
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(20, || site
        .log_lines()
        .iter()
        .any(|l| l["event"] == "candidate_started")));
    let impostor = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    std::thread::spawn(move || {
        for stream in impostor.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = [0u8; 1024];
            let _ = stream.read(&mut head);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nimpostor",
            );
        }
    });
    let status = deploy.wait().unwrap();
    let mut said = String::new();
    deploy
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{said}");
    let detail = site.last_detail();
    assert!(
        detail.contains(&format!(
            "port {port} is held by process {}",
            std::process::id()
        )),
        "{detail}"
    );
    assert!(detail.contains("not by the candidate"), "{detail}");
    assert!(site.pointer().is_none(), "nothing went live");
}

/// Attack 1: while the service's user changes, its release swaps a folder of its state with
/// a link to a root-only folder, over and over (`renameat2(RENAME_EXCHANGE)`). rollgate never
/// hands the state over while a process of the old user runs (the deploy is refused, saying
/// which), and the root-only folder stays root's.
#[test]
fn a_release_swapping_its_state_for_a_link_never_makes_root_give_it_another_folder() {
    let _nobody = crate::common::as_nobody_alone();
    let victim = tempfile::tempdir().unwrap();
    for n in 0..300 {
        std::fs::write(victim.path().join(format!("file{n}")), "root's").unwrap();
    }
    let site = Site::new();
    // The swaps happen in a folder of its state that anyone may write, through a descriptor
    // it opened before: once the walk has given `data/` away, a swap by path would be refused,
    // but one relative to the held folder is not.
    let swapper = r#"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
data = os.environ["STATE_DIRECTORY"]
shared = os.path.join(data, "shared")
os.makedirs(os.path.join(shared, "inner"), exist_ok=True)
os.chmod(shared, 0o777)
for n in range(300):
    open(os.path.join(shared, "inner", "file%d" % n), "w").close()
if not os.path.lexists(os.path.join(shared, "link")):
    os.symlink(os.environ["VICTIM"], os.path.join(shared, "link"))
held = os.open(shared, os.O_RDONLY | os.O_DIRECTORY)
open(os.path.join(data, "swapping"), "w").close()
# A swap every few hundred microseconds (a walk of 600 names spans many), not a busy loop:
# the machine runs other tests meanwhile. The test ends it by writing `stop` beside them.
n = 0
while True:
    libc.renameat2(held, b"inner", held, b"link", 2)
    time.sleep(0.0002)
    n += 1
    if n % 500 == 0:
        try:
            os.stat("stop", dir_fd=held)
            break
        except FileNotFoundError:
            pass
"#;
    write(site.root(), "releases/v1/swapper.py", swapper);
    site.script(
        "v1",
        &format!(
            "export VICTIM={}\npython3 ./swapper.py &\nexec '{}' sample-service\n",
            victim.path().display(),
            crate::common::bin().display()
        ),
    );
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(wait_for(20, || site.root().join("data/swapping").exists()));
    let live = site.live_pid().unwrap();

    // The policy names another user: the state would change hands under the swapper.
    site.release("v2", "");
    let policy = isolation_policy(&site, 20_000, r#"{"user": "nobody"}"#);
    let out = site.deploy(free_port(), "v2", &["--policy", &policy]);
    let taken: Vec<String> = std::fs::read_dir(victim.path())
        .unwrap()
        .flatten()
        .filter(|e| std::os::unix::fs::MetadataExt::uid(&e.metadata().unwrap()) != 0)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        taken.is_empty(),
        "{} of the victim's files changed hands",
        taken.len()
    );
    // A user change stops the live release first, its whole tree — the swapper with it —
    // and only then hands the state over (issue 67, 2): nothing of the old user runs.
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v2");
    assert!(!alive(live));
    assert!(!a_process_mentions("swapper.py"));
}

/// One root, one uid: a root named through a link is the same service, so its second deploy
/// runs as the uid its first got (a second allocation would hand its state over).
#[test]
fn a_root_named_through_a_link_keeps_its_one_uid() {
    let site = Site::new();
    site.release("v1", "");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let uid = service_uid(&site);
    assert_eq!(uid_of(site.live_pid().unwrap()), uid);
    let links = tempfile::tempdir().unwrap();
    let alias = links.path().join("alias");
    std::os::unix::fs::symlink(site.root(), &alias).unwrap();
    site.release("v2", "");
    let out = rollgate()
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v2",
            "--root",
        ])
        .arg(&alias)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(service_uid(&site), uid);
    assert_eq!(uid_of(site.live_pid().unwrap()), uid);
}

/// Attack 8: a failing candidate's output carries escape sequences (a window title, a clear
/// screen, a bell). rollgate quotes its last words on its own stderr and in the log: escaped,
/// never raw.
#[test]
fn a_failing_candidates_escape_sequences_are_shown_escaped() {
    let site = Site::new();
    site.script(
        "v1",
        "printf 'boom \\033]0;pwned\\007\\033[2J\\n' >&2\nexit 3\n",
    );
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        !said.contains('\u{1b}') && !said.contains('\u{7}'),
        "{said:?}"
    );
    assert!(
        said.contains("boom \\u{1b}]0;pwned\\u{7}\\u{1b}[2J"),
        "{said}"
    );
    let detail = site.last_detail();
    assert!(!detail.contains('\u{1b}'), "{detail:?}");
}

/// Attack 4: a local process takes the names a proxy's control socket and address claim had
/// in the abstract namespace (anyone may bind one, and the config's path is in the proxy's
/// command line), answering "reloaded" to whoever asks. The proxy starts all the same, and
/// `proxy reload` asks the proxy, never the squatter.
#[test]
fn a_proxy_starts_and_reloads_though_its_old_abstract_names_were_taken_first() {
    use std::os::linux::net::SocketAddrExt;
    let site = Site::new();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = write(
        dir.path(),
        "proxy.toml",
        &format!(
            "listen = \"127.0.0.1:{port}\"\n[[route]]\nhost = \"app.test\"\nroot = \"{}\"\n",
            site.root().display()
        ),
    );
    let canonical = std::fs::canonicalize(&config).unwrap();
    let mut squatters = Vec::new();
    for name in [
        format!("rollgate-proxy-config {}", canonical.display()),
        format!("rollgate-proxy 127.0.0.1:{port}"),
    ] {
        let listener = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|address| std::os::unix::net::UnixListener::bind_addr(&address))
            .unwrap();
        squatters.push(std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let _ = stream.write_all(b"reloaded by the squatter\n");
            }
        }));
    }
    let proxy = crate::routes::RoutedProxy::start(&config, port, &[site.root()]);
    let out = rollgate()
        .args(["proxy", "reload", "--config"])
        .arg(&config)
        .timeout(std::time::Duration::from_secs(20))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!stdout(&out).contains("squatter"), "{}", stdout(&out));
    assert!(stdout(&out).contains("app.test"), "{}", stdout(&out));
    drop(proxy);
}

/// Issue 67, 2: changing `isolation.user` on purpose fails no request. The folders cannot
/// belong to two users at once, so the deploy stops the live release first (its whole tree),
/// holding users' requests at the proxy meanwhile (`traffic.json` paused by the run), then
/// hands the state over and starts the new release as the new user; a new release that fails
/// brings the old one back as its own user, the state handed back. Either way the pause is
/// lifted and the clients see every answer.
#[test]
fn a_user_change_stops_first_holding_requests_and_a_failed_one_brings_the_old_user_back() {
    let _nobody = crate::common::as_nobody_alone();
    use crate::common::http::{assert_none_failed, Load, Proxy};
    if !crate::hooks::nix_is_root() {
        return;
    }
    let site = Site::new();
    site.add_sample("v1", "");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let own_uid = service_uid(&site);
    let proxy = Proxy::start(&site, &[]);
    let data_owner = || {
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(site.root().join("data")).unwrap())
            as u64
    };
    let traffic_mode = || {
        std::fs::read_to_string(site.root().join("traffic.json"))
            .map(|t| serde_json::from_str::<serde_json::Value>(&t).unwrap()["mode"].clone())
            .unwrap_or_else(|_| serde_json::json!("serving"))
    };

    // To `nobody`: stopped first, 0 failed requests.
    let load = Load::start(proxy.port, 4, std::time::Duration::from_millis(5));
    std::thread::sleep(std::time::Duration::from_millis(300));
    site.add_sample("v2", "");
    let to_nobody = isolation_policy(&site, 20_000, r#"{"user": "nobody"}"#);
    let out = site.deploy(free_port(), "v2", &["--policy", &to_nobody]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let seen = load.finish();
    assert_none_failed(&seen, "the change to nobody");
    assert!(seen.iter().any(|(_, body, _)| body == "v2"));
    assert_eq!(uid_of(site.live_pid().unwrap()), 65534);
    assert_eq!(data_owner(), 65534);
    assert_eq!(site.pointer().unwrap()["user"], "nobody");
    assert_eq!(traffic_mode(), "serving");
    let traffic: Vec<String> = site
        .log_lines()
        .into_iter()
        .filter(|l| l["event"] == "traffic")
        .map(|l| l["detail"].as_str().unwrap().to_string())
        .collect();
    assert!(
        traffic.len() == 2 && traffic[0].starts_with("paused by rollgate deploy"),
        "{traffic:?}"
    );

    // Back to its own uid with a release that cannot start: v2 comes back as nobody.
    let v2_before = site.live_pid().unwrap();
    let load = Load::start(proxy.port, 4, std::time::Duration::from_millis(5));
    std::thread::sleep(std::time::Duration::from_millis(300));
    site.add_sample("v3", "--exit-after-ms 0 --exit-code 3");
    let own = isolation_policy(&site, 20_000, "{}");
    let out = site.deploy(free_port(), "v3", &["--policy", &own]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let seen = load.finish();
    assert_none_failed(&seen, "the failed change back");
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["version"], "v2");
    assert_eq!(pointer["user"], "nobody");
    // Stopped first, then brought back: another process, as its own user again.
    assert!(!alive(v2_before));
    assert_ne!(site.live_pid().unwrap(), v2_before);
    assert_eq!(uid_of(site.live_pid().unwrap()), 65534);
    assert_eq!(data_owner(), 65534);
    assert_eq!(traffic_mode(), "serving");
    assert_ne!(own_uid, 65534);
}

/// Issue 67, 2, after a crash: a user change killed with -9 while its new release is gated —
/// the old release already stopped, users' requests held — is finished by the next command:
/// the new release stopped, the old one brought back as its own user, the pause lifted.
#[test]
fn a_user_change_killed_mid_gate_is_undone_by_the_next_command_with_the_pause_lifted() {
    let _nobody = crate::common::as_nobody_alone();
    use crate::common::http::{Conn, Proxy};
    if !crate::hooks::nix_is_root() {
        return;
    }
    let site = Site::new();
    site.add_sample("v1", "");
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let own_uid = service_uid(&site);
    let v1 = site.live_pid().unwrap();
    let proxy = Proxy::start(&site, &[]);
    site.add_sample("v2", "--ready-after-ms 60000");
    let to_nobody = isolation_policy(&site, 60_000, r#"{"user": "nobody"}"#);
    let mut deployer = std::process::Command::new(crate::common::bin())
        .args([
            "deploy",
            "edge-svc",
            &free_port().to_string(),
            "v2",
            "--policy",
        ])
        .arg(&to_nobody)
        .arg("--root")
        .arg(site.root())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(20, || site.log_lines().iter().any(|l| l["event"]
        == "candidate_started"
        && l["version"] == "v2")));
    assert!(!alive(v1), "stopped before the new release started");
    send_signal(deployer.id() as i32, 9);
    let _ = deployer.wait();
    let paused = std::fs::read_to_string(site.root().join("traffic.json")).unwrap();
    assert!(paused.contains("\"paused\""), "{paused}");

    let out = rollgate()
        .args(["up", "--root"])
        .arg(site.root())
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{:#?}",
        stderr(&out),
        site.log_lines()
    );
    let pointer = site.pointer().unwrap();
    assert_eq!(pointer["version"], "v1", "{pointer}");
    let live = site.live_pid().unwrap();
    assert_eq!(uid_of(live), own_uid);
    assert!(!a_process_mentions("--ready-after-ms 60000"));
    let state = std::fs::read_to_string(site.root().join("traffic.json")).unwrap();
    assert!(state.contains("\"serving\""), "{state}");
    let answer = Conn::open(proxy.port).unwrap().get("/", "").unwrap();
    assert_eq!((answer.status, answer.body.as_str()), (200, "v1"));
    let back = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "rolled_back")
        .unwrap();
    assert_eq!(back["version"], "v2", "{back}");
}
