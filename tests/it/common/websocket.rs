//! WebSockets at both ends of the proxy, from PyPI's `websockets` (tests/tools/websocket.py): a
//! release that answers each message uppercased (and a plain GET with 200), a client that sends
//! lines, and holders that keep a WebSocket open under a proxy's hand-overs.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use super::*;

/// Makes `site`'s `current` say release `name` listens on `port`.
pub fn live_at(site: &Site, name: &str, port: u16) {
    write(
        site.root(),
        "current",
        &format!(
            r#"{{"service":"edge-svc","version":"{name}","port":{port},"pid":1,"start_time":0,"promoted_at":0}}"#
        ),
    );
}

/// A child process stopped when dropped.
pub struct Stopped(pub std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A WebSocket server (PyPI's `websockets`, tests/tools/websocket.py) live in `site`: it
/// answers each message uppercased.
pub fn websocket_release(site: &Site) -> Stopped {
    let mut server = Command::new(python_tools().join("python"))
        .arg(repo().join("tests/tools/websocket.py"))
        .arg("serve")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let port: u16 = first.trim().parse().expect("the server prints its port");
    live_at(site, "ws", port);
    Stopped(server)
}

/// A WebSocket client through the proxy on `port` to `host`: each line sent is one message,
/// each answer one line back.
pub struct WebSocketClient {
    child: Stopped,
    answers: BufReader<std::process::ChildStdout>,
}

impl WebSocketClient {
    pub fn open(port: u16, host: &str) -> WebSocketClient {
        let mut child = Command::new(python_tools().join("python"))
            .arg(repo().join("tests/tools/websocket.py"))
            .args(["client", host, &port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let answers = BufReader::new(child.stdout.take().unwrap());
        let mut client = WebSocketClient {
            child: Stopped(child),
            answers,
        };
        assert_eq!(client.next_line(), "open");
        client
    }

    pub fn next_line(&mut self) -> String {
        let mut line = String::new();
        self.answers.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    }

    /// Sends `text` as one message; the server's answer.
    pub fn send(&mut self, text: &str) -> String {
        let stdin = self.child.0.stdin.as_mut().unwrap();
        writeln!(stdin, "{text}").unwrap();
        stdin.flush().unwrap();
        self.next_line()
    }
}

/// WebSockets held open through a proxy (`websocket.py hold`), each in a process of its own:
/// reopened whenever the server closes one cleanly. Each holder's lines come through a thread
/// of its own, so a test can wait for one with a deadline.
pub struct Holders {
    children: Vec<std::process::Child>,
    lines: Vec<std::sync::mpsc::Receiver<String>>,
    /// Each holder's lines read so far, past its first `open`.
    seen: Vec<Vec<String>>,
}

/// What one holder saw: how many WebSockets it opened, each clean close's code and Unix time,
/// and how it ended (`done N`, or `failed: WHY`).
#[derive(Debug)]
pub struct Held {
    pub opens: usize,
    pub closes: Vec<(u16, f64)>,
    pub end: String,
}

impl Holders {
    /// `count` WebSockets to `host` through 127.0.0.1:`port` (wss trusting `ca`, when given),
    /// each open before this returns.
    pub fn open(count: usize, port: u16, host: &str, ca: Option<&std::path::Path>) -> Holders {
        let mut holders = Holders {
            children: Vec::new(),
            lines: Vec::new(),
            seen: Vec::new(),
        };
        for _ in 0..count {
            let mut command = Command::new(python_tools().join("python"));
            command.arg(repo().join("tests/tools/websocket.py")).args([
                "hold",
                host,
                &port.to_string(),
            ]);
            if let Some(ca) = ca {
                command.arg(ca);
            }
            let mut child = command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let stdout = BufReader::new(child.stdout.take().unwrap());
            let (send, lines) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                for line in stdout.lines().map_while(Result::ok) {
                    if send.send(line).is_err() {
                        return;
                    }
                }
            });
            holders.children.push(child);
            holders.lines.push(lines);
            holders.seen.push(Vec::new());
        }
        for lines in &holders.lines {
            let first = lines
                .recv_timeout(std::time::Duration::from_secs(30))
                .unwrap_or_default();
            assert!(
                first.starts_with("open "),
                "a WebSocket did not open: {first:?}"
            );
        }
        holders
    }

    /// Waits (up to `seconds`) until every holder has had its WebSocket closed by the server
    /// and opened another; false if one did not.
    pub fn reopened(&mut self, seconds: u64) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
        for (lines, seen) in self.lines.iter().zip(&mut self.seen) {
            loop {
                let closed = seen.iter().any(|l| l.starts_with("closed "));
                if closed && seen.last().is_some_and(|l| l.starts_with("open ")) {
                    break;
                }
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                match lines.recv_timeout(left) {
                    Ok(line) => seen.push(line),
                    Err(_) => return false,
                }
            }
        }
        true
    }

    /// Each holder closes its WebSocket itself and says what it saw (the first open included).
    pub fn finish(mut self) -> Vec<Held> {
        let children = std::mem::take(&mut self.children);
        let lines = std::mem::take(&mut self.lines);
        let seen = std::mem::take(&mut self.seen);
        children
            .into_iter()
            .zip(lines)
            .zip(seen)
            .map(|((mut child, lines), seen)| {
                drop(child.stdin.take());
                let _ = child.wait();
                let mut held = Held {
                    opens: 1,
                    closes: Vec::new(),
                    end: String::new(),
                };
                // The thread ends at the holder's end of output: every line is in.
                for line in seen.into_iter().chain(lines.iter()) {
                    let words: Vec<&str> = line.split(' ').collect();
                    match words.as_slice() {
                        ["open", _] => held.opens += 1,
                        ["closed", code, at] => held
                            .closes
                            .push((code.parse().unwrap_or(0), at.parse().unwrap())),
                        _ => held.end = line.to_string(),
                    }
                }
                held
            })
            .collect()
    }
}

impl Drop for Holders {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
