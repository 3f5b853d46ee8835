//! The proxy's access log (issue 48): one line per request, counted as the clients counted
//! them, rotated within its bound, and joined to the deploy log by one SQL query.

use crate::common::http::*;
use crate::common::*;

use std::collections::BTreeMap;
use std::time::Duration;

pub(crate) fn access_lines(site: &Site) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    for name in ["access.log.2", "access.log.1", "access.log"] {
        if let Ok(text) = std::fs::read_to_string(site.root().join(name)) {
            lines.extend(text.lines().map(|l| serde_json::from_str(l).unwrap()));
        }
    }
    lines
}

fn by_class(statuses: impl Iterator<Item = u64>) -> BTreeMap<String, usize> {
    let mut classes = BTreeMap::new();
    for status in statuses {
        *classes.entry(format!("{}xx", status / 100)).or_default() += 1;
    }
    classes
}

#[test]
fn the_access_log_counts_what_clients_got_and_one_query_finds_the_failures_of_a_switch_rolled_back()
{
    let site = Site::new();
    site.release("v6", "");
    assert_eq!(site.deploy(free_port(), "v6", &[]).status.code(), Some(0));
    let proxy = Proxy::start(&site, &["--access-log"]);
    let load = Load::kept(proxy.port, 3, Duration::from_millis(3));
    std::thread::sleep(Duration::from_millis(300));
    // v7 passes its gate, then fails one request in three and turns unready in its watch:
    // switched back to v6.
    site.release("v7", "--unready-after-ms 700 --error-rate 0.34");
    let policy = write(
        site.root(),
        "watch.yaml",
        "edge_svc:\n  progress_deadline_ms: 3000\n  poll_ms: 50\n  max_unavailable_pct: 0\n  max_surge_pct: 100\n  on_stall: rollback\n  watch_ms: 5000\n  watch_failures: 3\n",
    );
    let out = site.deploy(free_port(), "v7", &["--policy", policy.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    std::thread::sleep(Duration::from_millis(300));
    let answers = load.finish();
    assert!(
        answers.iter().all(|(status, _, _)| *status != 0),
        "a request failed at the socket"
    );
    // Every request the clients sent is a line, and the classes agree.
    assert!(wait_for(5, || access_lines(&site).len() == answers.len()));
    let lines = access_lines(&site);
    assert_eq!(
        by_class(lines.iter().map(|l| l["status"].as_u64().unwrap())),
        by_class(answers.iter().map(|(s, _, _)| u64::from(*s)))
    );
    let first = &lines[0];
    assert_eq!(first["method"], "GET");
    assert_eq!(first["path"], "/");
    assert_eq!(first["host"], "app.example");
    assert_eq!(first["client"], "127.0.0.1");
    assert_eq!(
        first["route"],
        site.root().file_name().unwrap().to_str().unwrap()
    );
    let ids: std::collections::HashSet<&str> = lines
        .iter()
        .map(|l| l["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), lines.len(), "request ids are unique");
    let failed_by_v7 = lines
        .iter()
        .filter(|l| l["release"] == "v7" && l["status"].as_u64().unwrap() >= 500)
        .count();
    assert!(failed_by_v7 > 0, "v7 failed some requests");

    // log summary sums it up on a line after the deploy log's summary.
    let out = rollgate()
        .args(["log", "summary"])
        .arg(site.root().join("deploy.log"))
        .arg("--access")
        .arg(site.root().join("access.log"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let said: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(said.len(), 2, "{text}");
    assert_eq!(said[0]["live"], "v6");
    assert_eq!(
        said[1]["access"]["requests"].as_u64().unwrap() as usize,
        answers.len()
    );
    assert_eq!(
        said[1]["access"]["by_release"]["v7"]["5xx"]
            .as_u64()
            .unwrap() as usize,
        failed_by_v7
    );

    // The incident question as one query: requests that failed between v7's switch and its
    // rollback (docs/log-analysis.md has it).
    let sql = "SELECT a.release, count(*) AS failed FROM access a \
               CROSS JOIN (SELECT max(ts) AS t FROM log WHERE event = 'switched' AND version = 'v7') s \
               CROSS JOIN (SELECT max(ts) AS t FROM log WHERE event = 'rolled_back' AND version = 'v7') r \
               WHERE a.ts >= s.t AND a.ts <= r.t AND a.status >= 500 GROUP BY a.release";
    let out = rollgate()
        .args(["log", "query"])
        .arg(site.root().join("deploy.log"))
        .arg("--access")
        .arg(site.root().join("access.log"))
        .args(["--sql", sql, "--format", "json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let rows: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // What the test counts itself from the two files.
    let at = |event: &str| {
        site.log_lines()
            .iter()
            .filter(|l| l["event"] == event && l["version"] == "v7")
            .map(|l| l["ts"].as_f64().unwrap())
            .fold(f64::MIN, f64::max)
    };
    let (switched, rolled_back) = (at("switched"), at("rolled_back"));
    assert!(switched > 0.0 && rolled_back > switched);
    let expected = lines
        .iter()
        .filter(|l| {
            let ts = l["ts"].as_f64().unwrap();
            ts >= switched && ts <= rolled_back && l["status"].as_u64().unwrap() >= 500
        })
        .count();
    assert!(expected > 0);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["release"], "v7");
    assert_eq!(rows[0]["failed"].as_u64().unwrap() as usize, expected);
}

#[test]
fn the_access_log_rotates_within_its_bound_and_drops_the_query_string() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let proxy = Proxy::start(
        &site,
        &[
            "--access-log",
            "--access-log-max-bytes",
            "65536",
            "--access-log-keep",
            "2",
        ],
    );
    let mut conn = Conn::open(proxy.port).unwrap();
    // The request goes in several writes: no Nagle wait between them.
    conn.reader.get_ref().set_nodelay(true).unwrap();
    for n in 0..1500 {
        let answer = conn
            .get(&format!("/item?token=secret{n}"), "X-Request-Id: req-7\r\n")
            .unwrap();
        assert_eq!(answer.status, 200);
    }
    assert!(wait_for(5, || std::fs::metadata(
        site.root().join("access.log.1")
    )
    .is_ok()));
    std::thread::sleep(Duration::from_millis(500));
    for name in ["access.log", "access.log.1"] {
        let size = std::fs::metadata(site.root().join(name)).unwrap().len();
        assert!(size <= 65536, "{name} is {size} bytes");
    }
    assert!(!site.root().join("access.log.2").exists());
    let lines = access_lines(&site);
    assert!(lines.len() < 1500, "the oldest rotated away");
    assert!(lines
        .iter()
        .all(|l| l["path"] == "/item" && l["request_id"] == "req-7"));
    // A bound outside the release output's range is refused at start.
    let out = rollgate()
        .args([
            "proxy",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--root",
        ])
        .arg(site.root())
        .args(["--access-log", "--access-log-keep", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--access-log-keep is 0"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_reload_turns_a_routes_access_log_on_and_off() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let file = |logs: bool| {
        write(
            dir.path(),
            "proxy.toml",
            &format!(
                "listen = \"127.0.0.1:{port}\"\n[[route]]\nhost = \"*\"\nroot = \"{}\"\naccess_log = {logs}\n",
                site.root().display()
            ),
        )
    };
    let config = file(false);
    let mut proxy = ReleaseProcess(
        std::process::Command::new(crate::common::bin())
            .args(["proxy", "--config"])
            .arg(&config)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(10, || Conn::open(port).is_ok()));
    let reload = || {
        let out = rollgate()
            .args(["proxy", "reload", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    };
    let ask = |n: usize| {
        let mut conn = Conn::open(port).unwrap();
        for _ in 0..n {
            assert_eq!(conn.get("/", "").unwrap().status, 200);
        }
    };
    ask(3);
    file(true);
    reload();
    ask(4);
    assert!(wait_for(5, || access_lines(&site).len() == 4));
    file(false);
    reload();
    ask(5);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        access_lines(&site).len(),
        4,
        "logged only while the route said so"
    );
    let _ = proxy.0.kill();
}

#[test]
fn a_sampled_access_log_keeps_one_request_in_n() {
    let site = Site::new();
    site.release("v1", "");
    assert_eq!(site.deploy(free_port(), "v1", &[]).status.code(), Some(0));
    let proxy = Proxy::start(
        &site,
        &[
            "--access-log",
            "--access-log-sample",
            "10",
            "--threads",
            "1",
        ],
    );
    let mut conn = Conn::open(proxy.port).unwrap();
    conn.reader.get_ref().set_nodelay(true).unwrap();
    for n in 0..100 {
        assert_eq!(conn.get(&format!("/n{n}"), "").unwrap().status, 200);
    }
    assert!(wait_for(5, || access_lines(&site).len() == 10));
    std::thread::sleep(Duration::from_millis(400));
    let paths: Vec<String> = access_lines(&site)
        .iter()
        .map(|l| l["path"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        paths,
        (0..10).map(|k| format!("/n{}", k * 10)).collect::<Vec<_>>()
    );
    let out = rollgate()
        .args([
            "proxy",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--root",
        ])
        .arg(site.root())
        .args(["--access-log-sample", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
