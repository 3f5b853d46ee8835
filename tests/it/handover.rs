//! Issue 71: the proxy handed over to a new process — the same binary or another — under load:
//! the new one takes the listening sockets, serves, and only then the old one stops accepting
//! and finishes what it has. No request fails, no connection is refused; a take-over that
//! cannot start leaves the old proxy serving.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::http::{assert_none_failed, Load};
use crate::common::*;

/// `BINARY proxy --listen 127.0.0.1:PORT --root ROOT EXTRA…`, its stderr in `said`.
fn proxy(binary: &Path, site: &Site, port: u16, extra: &[&str], said: &Path) -> Child {
    Command::new(binary)
        .args(["proxy", "--listen", &format!("127.0.0.1:{port}"), "--root"])
        .arg(site.root())
        .args(extra)
        .stderr(std::fs::File::create(said).unwrap())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits (up to `seconds`) for `child` to exit; its status.
fn exited(child: &mut Child, seconds: u64) -> Option<std::process::ExitStatus> {
    let mut status = None;
    wait_for(seconds, || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    status
}

#[test]
fn the_proxy_is_handed_over_under_load_with_no_failed_request() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let port = free_port();
    let logs = tempfile::tempdir().unwrap();
    // Another binary: a copy of this one under another name (an upgrade's new file).
    let other = logs.path().join("rollgate-new");
    std::fs::copy(bin(), &other).unwrap();
    let said = |n: usize| logs.path().join(format!("proxy-{n}.err"));
    let mut running = proxy(&bin(), &site, port, &["--access-log"], &said(0));
    // Listening (a connection without a request is in no access log).
    assert!(wait_for(10, || std::net::TcpStream::connect((
        "127.0.0.1",
        port
    ))
    .is_ok()));

    let load = Load::start(port, 6, Duration::from_millis(5));
    std::thread::sleep(Duration::from_millis(300));
    for n in 1..=6 {
        let binary = if n % 2 == 1 { other.clone() } else { bin() };
        let mut next = proxy(
            &binary,
            &site,
            port,
            &["--access-log", "--take-over"],
            &said(n),
        );
        // The old one stops once the new one serves, and finishes cleanly.
        let status = exited(&mut running, 30);
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "hand-over {n}: {}\n{}",
            std::fs::read_to_string(said(n - 1)).unwrap_or_default(),
            std::fs::read_to_string(said(n)).unwrap_or_default()
        );
        assert!(next.try_wait().unwrap().is_none(), "the new one serves");
        std::thread::sleep(Duration::from_millis(300));
        running = next;
    }
    // A take-over that cannot start (a certificate it cannot read) leaves the running proxy
    // serving, and says why.
    let bad = Command::new(bin())
        .args(["proxy", "--listen", &format!("127.0.0.1:{port}"), "--root"])
        .arg(site.root())
        .args([
            "--take-over",
            "--tls-listen",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .args([
            "--tls-cert",
            "app.example=/nonexistent/cert.pem,/nonexistent/key.pem",
        ])
        .output()
        .unwrap();
    assert_ne!(bad.status.code(), Some(0));
    assert!(
        stderr(&bad).contains("/nonexistent/cert.pem"),
        "{}",
        stderr(&bad)
    );
    // Nor does one asked for other addresses than the running one serves.
    let other_tls = Command::new(bin())
        .args(["proxy", "--listen", &format!("127.0.0.1:{port}"), "--root"])
        .arg(site.root())
        .args([
            "--take-over",
            "--tls-listen",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .output()
        .unwrap();
    assert_ne!(other_tls.status.code(), Some(0));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        running.try_wait().unwrap().is_none(),
        "the running proxy goes on"
    );
    assert_eq!(version_on(port).as_deref(), Some("v1"));
    // No take-over without a running proxy: said, and nothing else starts.
    let nobody = Command::new(bin())
        .args([
            "proxy",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--root",
        ])
        .arg(site.root())
        .arg("--take-over")
        .output()
        .unwrap();
    assert_ne!(nobody.status.code(), Some(0));
    assert!(
        stderr(&nobody).contains("no running proxy"),
        "{}",
        stderr(&nobody)
    );

    let seen = load.finish();
    assert_none_failed(&seen, "six hand-overs, three to another binary");
    assert!(seen.len() > 300, "{} requests", seen.len());
    // The access log has every request once, whichever proxy served it.
    send_signal(running.id() as i32, 15);
    assert_eq!(exited(&mut running, 30).and_then(|s| s.code()), Some(0));
    let logged: usize = std::fs::read_dir(site.root())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("access.log")
        })
        .map(|p| std::fs::read_to_string(p).unwrap().lines().count())
        .sum();
    // The one request the test sent itself: after the bad take-overs.
    let version_probes = 1;
    assert_eq!(logged, seen.len() + version_probes, "access log lines");
    running = proxy(&bin(), &site, port, &[], &said(9));
    assert!(wait_for(10, || version_on(port).as_deref() == Some("v1")));
    // The proxy.sock answers (the deployer's drains go to the proxy serving now).
    let out = site.deploy(free_port(), "v1", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    send_signal(running.id() as i32, 15);
    assert_eq!(exited(&mut running, 30).and_then(|s| s.code()), Some(0));
    // Stopped without a hand-over: nothing is left to take over.
    let after = Command::new(bin())
        .args(["proxy", "--listen", &format!("127.0.0.1:{port}"), "--root"])
        .arg(site.root())
        .arg("--take-over")
        .output()
        .unwrap();
    assert!(
        stderr(&after).contains("no running proxy"),
        "{}",
        stderr(&after)
    );
}

/// Issue 71, 2: what a systemd unit's `ExecReload=` runs — `--take-over --background` — returns
/// once the new proxy serves, and the new proxy tells the supervisor it is the unit's main
/// process now (`MAINPID=`, `READY=1` on `$NOTIFY_SOCKET`, as `Type=notify` with
/// `NotifyAccess=all` reads it); the first one said `READY=1` when it started.
#[test]
fn a_reload_by_the_unit_hands_over_and_names_the_new_main_process() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let port = free_port();
    let logs = tempfile::tempdir().unwrap();
    let notify_path = logs.path().join("notify");
    let systemd = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    systemd
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let heard = || {
        let mut buffer = [0u8; 512];
        let n = systemd.recv(&mut buffer).unwrap();
        String::from_utf8_lossy(&buffer[..n]).to_string()
    };
    let args = |extra: &[&str]| {
        let mut command = Command::new(bin());
        command
            .args(["proxy", "--listen", &format!("127.0.0.1:{port}"), "--root"])
            .arg(site.root())
            .args(extra)
            .env("NOTIFY_SOCKET", &notify_path)
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(logs.path().join(format!("{}.err", extra.len()))).unwrap(),
            );
        command
    };
    let mut first = args(&[]).spawn().unwrap();
    assert_eq!(heard(), "READY=1");
    let load = Load::start(port, 4, Duration::from_millis(5));
    std::thread::sleep(Duration::from_millis(300));
    // The reload: returns once the new one serves, the new one going on.
    let reload = args(&["--take-over", "--background"]).status().unwrap();
    assert_eq!(reload.code(), Some(0));
    let said = heard();
    let pid: i32 = said
        .strip_prefix("MAINPID=")
        .and_then(|rest| rest.strip_suffix("\nREADY=1"))
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("{said:?}"));
    assert!(alive(pid) && pid != first.id() as i32);
    assert_eq!(exited(&mut first, 30).and_then(|s| s.code()), Some(0));
    std::thread::sleep(Duration::from_millis(300));
    let seen = load.finish();
    assert_none_failed(&seen, "a reload by the unit");
    assert!(seen.len() > 50, "{} requests", seen.len());
    // A reload whose new proxy cannot start fails, and the running one goes on.
    let bad = args(&["--take-over", "--background", "--tls-listen", "127.0.0.1:1"])
        .status()
        .unwrap();
    assert_ne!(bad.code(), Some(0));
    assert!(alive(pid));
    assert_eq!(version_on(port).as_deref(), Some("v1"));
    send_signal(pid, 15);
    assert!(wait_for(30, || !alive(pid)));
}
