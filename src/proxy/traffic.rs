//! A service's traffic gate (issue 48): what `ROOT/traffic.json` says users get. Serving: the
//! request goes on (one atomic load). Maintenance: 503 with `Retry-After` and a page, or JSON
//! for a client that asks for it. Paused: the request waits, in arrival order, until the
//! service is resumed (then the waiting go on in that order) or until `max_pause_ms` (then 503).
//!
//! The order: every request of one pause waits on one fair (FIFO) semaphore with no permit; a
//! resume adds one, and each request passes it on to the next as it goes, so they leave in the
//! order they came.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::host::traffic::{self, Mode, Traffic, DEFAULT_MAX_PAUSE_MS, MAX_PAGE_BYTES};

/// A request's answer from the gate: go on to the release, or this.
pub enum Passage {
    Go,
    Refused(Refusal),
}

/// rollgate's own 503 for a service that is not serving.
pub struct Refusal {
    pub content_type: &'static str,
    pub retry_after: Option<u64>,
    pub body: String,
}

/// What the gate holds of the state file, made once per change.
struct Held {
    /// The maintenance page, whole.
    page: String,
    json: String,
    retry_after: Option<u64>,
    max_pause: Duration,
    /// This pause's waiting line.
    line: Arc<Semaphore>,
}

pub struct Gate {
    mode: AtomicU8,
    held: RwLock<Arc<Held>>,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            mode: AtomicU8::new(mode_number(Mode::Serving)),
            held: RwLock::new(Arc::new(Held {
                page: String::new(),
                json: String::new(),
                retry_after: None,
                max_pause: Duration::from_millis(DEFAULT_MAX_PAUSE_MS),
                line: Arc::new(Semaphore::new(0)),
            })),
        }
    }
}

fn mode_number(mode: Mode) -> u8 {
    match mode {
        Mode::Serving => 0,
        Mode::Maintenance => 1,
        Mode::Paused => 2,
    }
}

impl Gate {
    /// Reads `ROOT/traffic.json` again; a file that cannot be read keeps the state in force
    /// (said once on stderr).
    pub fn refresh(&self, root: &std::path::Path) {
        match traffic::read(root) {
            Ok(state) => self.set(&state.unwrap_or_default()),
            Err(e) => eprintln!("rollgate proxy: keeping the traffic state in force: {e}"),
        }
    }

    /// Puts `state` in force.
    pub fn set(&self, state: &Traffic) {
        let was = self.mode.load(Ordering::SeqCst);
        let now = mode_number(state.mode);
        let mut held = self.held.write().unwrap_or_else(|p| p.into_inner());
        if was == now && now != mode_number(Mode::Maintenance) && held.max_pause == max_pause(state)
        {
            return;
        }
        let ended = held.line.clone();
        let same_pause = was == mode_number(Mode::Paused) && now == mode_number(Mode::Paused);
        *held = Arc::new(Held {
            page: page(state),
            json: json(state),
            retry_after: state.retry_after_s,
            max_pause: max_pause(state),
            line: if same_pause {
                ended.clone()
            } else {
                Arc::new(Semaphore::new(0))
            },
        });
        // The new mode first, then the line of a pause that ended moves (first come, first
        // served): a request let go sees the mode it was let go into.
        self.mode.store(now, Ordering::SeqCst);
        drop(held);
        if !same_pause {
            ended.add_permits(1);
        }
        if was != now {
            eprintln!(
                "rollgate proxy: {}: traffic {} (by {})",
                state.service,
                state.mode.as_str(),
                state.by
            );
        }
    }

    /// The mode in force.
    pub fn mode(&self) -> Mode {
        match self.mode.load(Ordering::SeqCst) {
            0 => Mode::Serving,
            1 => Mode::Maintenance,
            _ => Mode::Paused,
        }
    }

    /// Whether a request may go on now (the fast path: serving).
    pub fn serving(&self) -> bool {
        self.mode.load(Ordering::SeqCst) == 0
    }

    /// Lets a request through, holds it while paused, or refuses it. `json`: the client asked
    /// for `application/json`.
    pub async fn pass(&self, json: bool) -> Passage {
        loop {
            let held = self.held.read().unwrap_or_else(|p| p.into_inner()).clone();
            match self.mode.load(Ordering::SeqCst) {
                0 => return Passage::Go,
                1 => return Passage::Refused(maintenance(&held, json)),
                _ => {}
            }
            match tokio::time::timeout(held.max_pause, held.line.clone().acquire_owned()).await {
                // Passed on to the next in line as this one goes; then the mode in force now
                // decides (serving, or maintenance if the pause ended in one).
                Ok(Ok(_permit)) => {
                    if self.mode.load(Ordering::SeqCst) == 2 {
                        // Paused again at once: wait in the new line.
                        continue;
                    }
                    let held = self.held.read().unwrap_or_else(|p| p.into_inner()).clone();
                    return match self.mode.load(Ordering::SeqCst) {
                        1 => Passage::Refused(maintenance(&held, json)),
                        _ => Passage::Go,
                    };
                }
                Ok(Err(_)) => return Passage::Go,
                Err(_) => {
                    return Passage::Refused(Refusal {
                        content_type: if json {
                            "application/json"
                        } else {
                            "text/plain; charset=utf-8"
                        },
                        retry_after: Some(1),
                        body: if json {
                            format!(
                                "{{\"error\":\"paused\",\"message\":\"the service is paused; this request waited {} ms\"}}\n",
                                held.max_pause.as_millis()
                            )
                        } else {
                            format!(
                                "the service is paused; this request waited {} ms, the longest it may\n",
                                held.max_pause.as_millis()
                            )
                        },
                    })
                }
            }
        }
    }
}

fn maintenance(held: &Held, json: bool) -> Refusal {
    Refusal {
        content_type: if json {
            "application/json"
        } else {
            "text/html; charset=utf-8"
        },
        retry_after: held.retry_after,
        body: if json {
            held.json.clone()
        } else {
            held.page.clone()
        },
    }
}

fn max_pause(state: &Traffic) -> Duration {
    Duration::from_millis(state.max_pause_ms.unwrap_or(DEFAULT_MAX_PAUSE_MS))
}

const DEFAULT_MESSAGE: &str = "This service is down for maintenance and will be back soon.";

/// The maintenance page: the operator's file, else rollgate's own with the message.
fn page(state: &Traffic) -> String {
    if let Some(file) = &state.page {
        match std::fs::File::open(file).and_then(|f| {
            use std::io::Read;
            let mut text = String::new();
            f.take(MAX_PAGE_BYTES).read_to_string(&mut text).map(|_| text)
        }) {
            Ok(text) => return text,
            Err(e) => eprintln!(
                "rollgate proxy: the maintenance page {} cannot be read ({e}); serving rollgate's own",
                file.display()
            ),
        }
    }
    let message = escape_html(state.message.as_deref().unwrap_or(DEFAULT_MESSAGE));
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
         <title>Down for maintenance</title></head>\n<body style=\"font-family:system-ui,sans-serif;max-width:36em;margin:4em auto;padding:0 1em\">\
         <h1>Down for maintenance</h1>\n<p>{message}</p></body></html>\n"
    )
}

fn json(state: &Traffic) -> String {
    let value = serde_json::json!({
        "error": "maintenance",
        "message": state.message.as_deref().unwrap_or(DEFAULT_MESSAGE),
        "retry_after_s": state.retry_after_s,
    });
    value.to_string() + "\n"
}

fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Whether an `Accept` header asks for JSON (before HTML).
pub fn wants_json(accept: &[u8]) -> bool {
    let text = String::from_utf8_lossy(accept).to_ascii_lowercase();
    text.contains("application/json") && !text.contains("text/html")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(mode: Mode) -> Traffic {
        Traffic {
            service: "svc".into(),
            mode,
            message: Some("Back <soon>".into()),
            retry_after_s: Some(60),
            max_pause_ms: Some(5_000),
            ..Traffic::default()
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_resumed_pause_lets_its_requests_go_in_the_order_they_came() {
        let gate = Arc::new(Gate::default());
        gate.set(&state(Mode::Paused));
        let passed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for n in 0..100 {
            let (gate, passed) = (gate.clone(), passed.clone());
            waiting.push(tokio::spawn(async move {
                if let Passage::Go = gate.pass(false).await {
                    passed.lock().unwrap().push(n);
                }
            }));
            // Each has come to the line before the next.
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(passed.lock().unwrap().is_empty(), "nothing passes a pause");
        gate.set(&state(Mode::Serving));
        for task in waiting {
            task.await.unwrap();
        }
        assert_eq!(*passed.lock().unwrap(), (0..100).collect::<Vec<_>>());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn maintenance_refuses_with_the_page_or_json_and_a_long_pause_sheds() {
        let gate = Gate::default();
        gate.set(&state(Mode::Maintenance));
        let Passage::Refused(page) = gate.pass(false).await else {
            panic!("maintenance lets nothing through")
        };
        assert_eq!(page.retry_after, Some(60));
        assert!(
            page.body.contains("<p>Back &lt;soon&gt;</p>"),
            "{}",
            page.body
        );
        let Passage::Refused(json) = gate.pass(true).await else {
            panic!()
        };
        let value: serde_json::Value = serde_json::from_str(&json.body).unwrap();
        assert_eq!(value["message"], "Back <soon>");
        assert_eq!(value["retry_after_s"], 60);
        gate.set(&Traffic {
            max_pause_ms: Some(30),
            ..state(Mode::Paused)
        });
        let started = std::time::Instant::now();
        let Passage::Refused(shed) = gate.pass(false).await else {
            panic!("a pause longer than its bound sheds")
        };
        assert!(started.elapsed() >= Duration::from_millis(30));
        assert!(shed.body.contains("waited 30 ms"), "{}", shed.body);
        // A maintenance that ends in serving: requests go again.
        gate.set(&state(Mode::Serving));
        assert!(matches!(gate.pass(false).await, Passage::Go));
        assert!(wants_json(b"application/json"));
        assert!(!wants_json(
            b"text/html,application/xhtml+xml,application/json;q=0.9"
        ));
    }
}
