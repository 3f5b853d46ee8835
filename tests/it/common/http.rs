//! HTTP through `rollgate proxy` for the integration tests: the proxy as a process, a
//! keep-alive client just big enough for them, and a steady client load that records every
//! answer.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{free_port, send_signal, wait_for, Site};

/// A running proxy, stopped (SIGTERM) on drop.
pub struct Proxy {
    pub child: std::process::Child,
    pub port: u16,
}

impl Proxy {
    pub fn start(site: &Site, extra: &[&str]) -> Proxy {
        Proxy::start_on(site, free_port(), extra)
    }

    /// A proxy on `port` (one that replaces a proxy killed there).
    pub fn start_on(site: &Site, port: u16, extra: &[&str]) -> Proxy {
        let child = std::process::Command::new(crate::common::bin())
            .args(["proxy", "--listen", &format!("127.0.0.1:{port}"), "--root"])
            .arg(site.root())
            .args(extra)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        assert!(
            wait_for(10, || TcpStream::connect(("127.0.0.1", port)).is_ok()),
            "proxy listening"
        );
        // Listening, not only there: the socket's file exists a moment before it accepts.
        let control = site.root().join("proxy.sock");
        assert!(wait_for(10, || std::os::unix::net::UnixStream::connect(
            &control
        )
        .is_ok()));
        Proxy { child, port }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        send_signal(self.child.id() as i32, 15);
        let _ = self.child.wait();
    }
}

/// A keep-alive HTTP/1.1 client, just enough for these tests.
pub struct Conn {
    pub reader: BufReader<TcpStream>,
}

pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Conn {
    pub fn open(port: u16) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(Conn {
            reader: BufReader::new(stream),
        })
    }

    pub fn get(&mut self, path: &str, extra: &str) -> std::io::Result<Answer> {
        write!(
            self.reader.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: app.example\r\n{extra}\r\n"
        )?;
        self.read_answer()
    }

    /// `POST` with an empty body (`Content-Length: 0`).
    pub fn post_empty(&mut self, path: &str) -> std::io::Result<Answer> {
        write!(
            self.reader.get_mut(),
            "POST {path} HTTP/1.1\r\nHost: app.example\r\nContent-Length: 0\r\n\r\n"
        )?;
        self.read_answer()
    }

    pub fn read_answer(&mut self) -> std::io::Result<Answer> {
        let bad =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(bad("closed before a status line"));
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad(&line))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').ok_or_else(|| bad(l))?;
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
        let answer = Answer {
            status,
            headers,
            body: String::new(),
        };
        let mut body = Vec::new();
        if let Some(len) = answer.header("content-length") {
            body.resize(len.parse().map_err(|_| bad("length"))?, 0);
            self.reader.read_exact(&mut body)?;
        } else if answer
            .header("transfer-encoding")
            .is_some_and(|t| t.contains("chunked"))
        {
            loop {
                line.clear();
                self.reader.read_line(&mut line)?;
                // A chunk size may carry extensions (`5;name=value`); the last chunk may be
                // followed by trailer lines, up to an empty one.
                let digits = line.split(';').next().unwrap_or("").trim();
                let size = usize::from_str_radix(digits, 16).map_err(|_| bad("chunk"))?;
                if size == 0 {
                    loop {
                        line.clear();
                        if self.reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
                            break;
                        }
                    }
                    break;
                }
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk)?;
                body.extend_from_slice(&chunk[..size]);
            }
        }
        Ok(Answer {
            body: String::from_utf8_lossy(&body).trim().to_string(),
            ..answer
        })
    }
}

/// Clients sending `GET /` through the proxy until stopped: half reconnect for every request,
/// half keep their connection. Every answer is kept (status 0: the request failed at the
/// socket), with the time it finished.
pub struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<(u16, String, Instant)>>>,
    clients: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    pub fn start(port: u16, clients: usize, pause: Duration) -> Load {
        Load::with(port, clients, pause, true)
    }

    /// Clients that all keep their connection (a long steady load leaves no flood of closed
    /// connections waiting out TIME_WAIT on the ephemeral ports).
    pub fn kept(port: u16, clients: usize, pause: Duration) -> Load {
        Load::with(port, clients, pause, false)
    }

    fn with(port: u16, clients: usize, pause: Duration, reconnect: bool) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<Mutex<Vec<(u16, String, Instant)>>> = Arc::default();
        let clients = (0..clients)
            .map(|i| {
                let (stop, seen) = (stop.clone(), seen.clone());
                std::thread::spawn(move || {
                    let mut conn = Conn::open(port).ok();
                    let mut mine = Vec::new();
                    while !stop.load(Ordering::SeqCst) {
                        if (reconnect && i % 2 == 0) || conn.is_none() {
                            conn = Conn::open(port).ok();
                        }
                        let answer = match conn.as_mut() {
                            Some(c) => c.get("/", ""),
                            None => Err(std::io::Error::other("connect failed")),
                        };
                        match answer {
                            Ok(a) => {
                                // The server said it closes: the next request goes on a new
                                // connection, as any HTTP/1.1 client's does.
                                if a.header("connection")
                                    .is_some_and(|c| c.eq_ignore_ascii_case("close"))
                                {
                                    conn = None;
                                }
                                mine.push((a.status, a.body, Instant::now()))
                            }
                            Err(e) => {
                                mine.push((0, e.to_string(), Instant::now()));
                                conn = None;
                            }
                        }
                        std::thread::sleep(pause);
                    }
                    seen.lock().unwrap().extend(mine);
                })
            })
            .collect();
        Load {
            stop,
            seen,
            clients,
        }
    }

    /// Stops the clients and returns every answer.
    pub fn finish(self) -> Vec<(u16, String, Instant)> {
        self.stop.store(true, Ordering::SeqCst);
        for c in self.clients {
            c.join().unwrap();
        }
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

/// Fails with examples unless every answer was a 200.
pub fn assert_none_failed(seen: &[(u16, String, Instant)], during: &str) {
    let failures: Vec<_> = seen.iter().filter(|(s, _, _)| *s != 200).collect();
    assert!(
        failures.is_empty(),
        "{during}: {} of {} requests failed, e.g. {:?}",
        failures.len(),
        seen.len(),
        failures
            .iter()
            .take(5)
            .map(|(s, b, _)| (s, b))
            .collect::<Vec<_>>()
    );
}
