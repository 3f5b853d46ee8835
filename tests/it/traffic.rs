//! `rollgate traffic` (issue 48): maintenance answers every request 503 with Retry-After and a
//! page or JSON; a pause holds requests until resume; the state outlives the proxy and is in
//! the deploy log; a deploy goes on meanwhile.

use crate::common::http::*;
use crate::common::*;

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

fn traffic(site: &Site, args: &[&str]) -> std::process::Output {
    rollgate()
        .arg("traffic")
        .args(&args[..1])
        .arg("edge-svc")
        .arg("--root")
        .arg(site.root())
        .args(&args[1..])
        .timeout(Duration::from_secs(20))
        .output()
        .unwrap()
}

/// What the proxy serving `site` applies now (`traffic` on its proxy.sock).
fn applied(site: &Site) -> String {
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(site.root().join("proxy.sock"))
    else {
        return String::new();
    };
    let _ = stream.write_all(b"traffic\n");
    let mut line = String::new();
    let _ = std::io::BufReader::new(stream).read_line(&mut line);
    line.trim().to_string()
}

fn get_with(port: u16, headers: &str) -> Answer {
    Conn::open(port).unwrap().get("/", headers).unwrap()
}

fn live_site(version: &str) -> Site {
    let site = Site::new();
    site.release(version, "");
    let out = site.deploy(free_port(), version, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    site
}

#[test]
fn maintenance_is_a_503_page_or_json_outlives_a_killed_proxy_and_a_deploy_goes_on() {
    let site = live_site("v1");
    let page = write(site.root(), "page.html", "<h1>Our own page</h1>\n");
    let mut proxy = Proxy::start(&site, &[]);
    assert_eq!(get_with(proxy.port, "").body, "v1");
    // The root's own service only.
    let out = rollgate()
        .args(["traffic", "maintenance", "other-svc", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("serves edge-svc, not other-svc"),
        "{}",
        stderr(&out)
    );

    let out = traffic(
        &site,
        &[
            "maintenance",
            "--message",
            "Back at 14:00 <sharp>",
            "--retry-after",
            "120",
            "--reason",
            "db migration",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("edge-svc: maintenance (503, Retry-After 120 s"),
        "{}",
        stdout(&out)
    );
    assert!(wait_for(5, || applied(&site) == "maintenance"));
    let browser = get_with(
        proxy.port,
        "Accept: text/html,application/xhtml+xml,*/*;q=0.8\r\n",
    );
    assert_eq!(browser.status, 503);
    assert_eq!(browser.header("retry-after"), Some("120"));
    assert!(browser
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(
        browser.body.contains("Back at 14:00 &lt;sharp&gt;"),
        "{}",
        browser.body
    );
    let api = get_with(proxy.port, "Accept: application/json\r\n");
    assert_eq!(api.status, 503);
    let said: serde_json::Value = serde_json::from_str(&api.body).unwrap();
    assert_eq!(said["error"], "maintenance");
    assert_eq!(said["message"], "Back at 14:00 <sharp>");
    assert_eq!(said["retry_after_s"], 120);
    // hyper's path too (a request with a body).
    let posted = Conn::open(proxy.port)
        .unwrap()
        .post_empty("/orders")
        .unwrap();
    assert_eq!(
        (posted.status, posted.header("retry-after")),
        (503, Some("120"))
    );

    // Logged with who and why; in status.
    let line = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "traffic")
        .expect("a traffic line");
    assert_eq!(line["traffic"]["mode"], "maintenance");
    assert_eq!(line["traffic"]["why"], "db migration");
    assert!(!line["traffic"]["by"].as_str().unwrap().is_empty());
    assert_eq!(line["version"], "v1");
    let status = rollgate()
        .args(["status", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    assert!(
        stdout(&status).contains("MAINTENANCE since"),
        "{}",
        stdout(&status)
    );
    let listed = rollgate()
        .args(["traffic", "status", "--format", "json", "--root"])
        .arg(site.root())
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_str(&stdout(&listed)).unwrap();
    assert_eq!(listed[0]["mode"], "maintenance");

    // A deploy goes on (its gate talks to the release): users still get the page.
    site.release("v2", "");
    let out = site.deploy(free_port(), "v2", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(site.pointer().unwrap()["version"], "v2");
    assert_eq!(get_with(proxy.port, "").status, 503);

    // kill -9 and a new proxy: still in maintenance, from the file.
    send_signal(proxy.child.id() as i32, 9);
    let _ = proxy.child.wait();
    let _ = std::fs::remove_file(site.root().join("proxy.sock"));
    let port = proxy.port;
    std::mem::forget(proxy);
    let proxy = Proxy::start_on(&site, port, &[]);
    assert_eq!(applied(&site), "maintenance");
    assert_eq!(get_with(proxy.port, "").status, 503);

    // The operator's own page.
    let out = traffic(&site, &["maintenance", "--page", page.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(wait_for(5, || get_with(proxy.port, "").body
        == "<h1>Our own page</h1>"));

    let out = traffic(&site, &["resume", "--reason", "done"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(wait_for(5, || applied(&site) == "serving"));
    assert_eq!(get_with(proxy.port, "").body, "v2");
}

#[test]
fn a_pause_holds_a_hundred_requests_until_resume_and_sheds_past_its_bound() {
    let site = live_site("v1");
    let proxy = Proxy::start(&site, &[]);
    let long = "x".repeat(501);
    let out = traffic(&site, &["pause", "--reason", &long]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("the reason is 501 characters; at most 500"),
        "{}",
        stderr(&out)
    );
    assert!(!site.root().join("traffic.json").exists());
    let out = traffic(&site, &["pause", "--max-pause-ms", "20000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(wait_for(5, || applied(&site) == "paused"));
    let paused_at = Instant::now();
    // A hundred clients, one after another, each on its own connection.
    let clients: Vec<_> = (0..100)
        .map(|_| {
            let port = proxy.port;
            let client = std::thread::spawn(move || {
                let answer = Conn::open(port).unwrap().get("/", "");
                (answer.map(|a| (a.status, a.body)).ok(), Instant::now())
            });
            std::thread::sleep(Duration::from_millis(5));
            client
        })
        .collect();
    // Held for two seconds: nothing answered meanwhile.
    std::thread::sleep(Duration::from_secs(2).saturating_sub(paused_at.elapsed()));
    assert!(
        clients.iter().all(|c| !c.is_finished()),
        "a request passed the pause"
    );
    let resumed_at = Instant::now();
    let out = traffic(&site, &["resume"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    for client in clients {
        let (answer, at) = client.join().unwrap();
        assert_eq!(answer, Some((200, "v1".to_string())));
        assert!(at >= resumed_at);
    }
    // A pause longer than its bound: the request waits the bound, then 503.
    let out = traffic(&site, &["pause", "--max-pause-ms", "400"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(wait_for(5, || applied(&site) == "paused"));
    let asked = Instant::now();
    let shed = get_with(proxy.port, "");
    assert_eq!(shed.status, 503, "{}", shed.body);
    assert!(asked.elapsed() >= Duration::from_millis(400));
    assert!(shed.body.contains("waited 400 ms"), "{}", shed.body);
    let line = site
        .log_lines()
        .into_iter()
        .rfind(|l| l["event"] == "traffic")
        .unwrap();
    assert_eq!(line["traffic"]["max_pause_ms"], 400);
}
