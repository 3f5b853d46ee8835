//! A real headless Chromium for the page tests, driven through ChromeDriver's WebDriver
//! protocol (JSON over HTTP on 127.0.0.1) by a client just big enough for them: open a page,
//! find, click and type, run a line of script, and take a screenshot (saved under the target
//! folder for a person to look at).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use super::{free_port, wait_for};

/// Chromium and its driver, from Debian's packages (`.ci/run` installs them when missing).
pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// Where the page tests' screenshots go: `target/screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| super::repo().join("target"));
    let dir = target.join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Browser {
    pub fn start() -> Browser {
        assert!(
            std::path::Path::new(CHROMEDRIVER).is_file(),
            "{CHROMEDRIVER} is missing: apt-get install chromium chromium-driver (.ci/run does)"
        );
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            wait_for(20, || TcpStream::connect(("127.0.0.1", port)).is_ok()),
            "chromedriver did not listen"
        );
        let profile = tempfile::tempdir().unwrap();
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            _profile: profile,
        };
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,1600",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain([format!(
            "--user-data-dir={}",
            browser._profile.path().display()
        )])
        .collect::<Vec<_>>();
        let answer = browser
            .call(
                "POST",
                "/session",
                Some(json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
                }}})),
            )
            .expect("a browser session");
        browser.session = answer["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        browser
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| e.to_string())?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            self.port,
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .map_err(|e| e.to_string())?;
        // The driver may keep the connection open: read the head, then its Content-Length.
        let mut reader = std::io::BufReader::new(stream);
        let mut length = None;
        let mut chunked = false;
        loop {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut reader, &mut line).map_err(|e| e.to_string())?;
            let lower = line.trim().to_ascii_lowercase();
            if lower.is_empty() {
                break;
            }
            if let Some(n) = lower.strip_prefix("content-length:") {
                length = n.trim().parse::<usize>().ok();
            }
            chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
        }
        let mut rest = Vec::new();
        let body = match length {
            Some(n) => {
                rest.resize(n, 0);
                reader.read_exact(&mut rest).map_err(|e| e.to_string())?;
                String::from_utf8_lossy(&rest).into_owned()
            }
            None => {
                let _ = reader.read_to_end(&mut rest);
                let text = String::from_utf8_lossy(&rest).into_owned();
                if chunked {
                    unchunk(&text)
                } else {
                    text
                }
            }
        };
        let value: Value = serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        if value["value"]["error"].is_string() {
            return Err(value["value"]["message"].to_string());
        }
        Ok(value["value"].clone())
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    pub fn open(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })))
            .expect("the page opens");
    }

    /// Forgets every cookie of the current page's site (WebDriver's Delete All Cookies).
    pub fn clear_cookies(&self) {
        self.session_call("DELETE", "/cookie", None)
            .expect("the cookies are deleted");
    }

    /// The element `css` selects, once it is there (up to 20 s).
    pub fn find(&self, css: &str) -> String {
        let mut found = None;
        wait_for(20, || {
            found = self
                .session_call(
                    "POST",
                    "/element",
                    Some(json!({ "using": "css selector", "value": css })),
                )
                .ok()
                .and_then(|v| {
                    v.as_object()
                        .and_then(|o| o.values().next())
                        .and_then(Value::as_str)
                        .map(str::to_string)
                });
            found.is_some()
        });
        found.unwrap_or_else(|| panic!("no element {css} in\n{}", self.text()))
    }

    pub fn has(&self, css: &str) -> bool {
        self.session_call(
            "POST",
            "/elements",
            Some(json!({ "using": "css selector", "value": css })),
        )
        .ok()
        .and_then(|v| v.as_array().map(|a| !a.is_empty()))
        .unwrap_or(false)
    }

    pub fn click(&self, css: &str) {
        self.on_element(css, "click", json!({}));
    }

    pub fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, "value", json!({ "text": text }));
    }

    /// `action` on the element `css` finds. The page replaces its sections when a record
    /// comes (the event stream), so an element found a moment ago may be gone (or not yet
    /// laid out): it is found again, up to five times.
    fn on_element(&self, css: &str, action: &str, body: Value) {
        let mut last = String::new();
        for _ in 0..5 {
            let element = self.find(css);
            match self.session_call(
                "POST",
                &format!("/element/{element}/{action}"),
                Some(body.clone()),
            ) {
                Ok(_) => return,
                // Replaced under the call, or found while the page was laying it out anew
                // (CI once saw "element not interactable" as a record came).
                Err(e) if e.contains("stale element") || e.contains("not interactable") => {
                    last = e;
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
                Err(e) => panic!("{action} on {css}: {e}"),
            }
        }
        panic!("{action} on {css}: the element went stale five times: {last}");
    }

    /// The page's text as a person reads it.
    pub fn text(&self) -> String {
        self.script("return document.body ? document.body.innerText : ''")
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    pub fn script(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .unwrap_or(Value::Null)
    }

    /// A PNG of the window, saved as `target/screenshots/NAME.png`.
    pub fn screenshot(&self, name: &str) -> PathBuf {
        use base64::Engine;
        let data = self
            .session_call("GET", "/screenshot", None)
            .expect("a screenshot");
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().unwrap_or(""))
            .expect("base64");
        let path = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

fn unchunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}
