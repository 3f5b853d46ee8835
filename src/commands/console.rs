//! `rollgate console`: one page and a JSON API over one or more roots, an event stream of
//! their logs, and the CLI's own pause, resume, abort, promote and abort-escalated behind a
//! token. What it shows is read from the roots' files (`status`'s view of each); what it does
//! goes through exactly the functions the CLI calls, so a refusal reads as the CLI words it.
//!
//! Security: loopback by default; every route needs the token (`ROOT/console.token`, made
//! 0600 at the first start, printed once as a link that sets it as a cookie, or sent as
//! `Authorization: Bearer`) — reads too, `--read-only` included (issue 66: a confined release
//! may reach 127.0.0.1, and the console shows every root's history and output tails that its
//! files keep from it); without it, 401 and nothing is shown. A state change also needs a
//! same-origin request (`Origin` / `Sec-Fetch-Site`); without both, 403 and nothing changes.
//! `--read-only` has no buttons and no state-changing endpoints. Binding beyond loopback needs
//! the token file to exist already.
//!
//! While it runs (and is not read-only) it also sends the roots' webhooks (`crate::webhooks`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};

use crate::engine::{self, Ask};
use crate::error::{self, Error};
use crate::host::journal;
use crate::host::state::Root;
use crate::log::follow::{Cursor, Follower, Start};
use crate::render::page;

/// `rollgate console` options.
#[derive(Debug, Clone)]
pub struct Options {
    pub roots: Vec<PathBuf>,
    pub listen: SocketAddr,
    pub read_only: bool,
}

/// The token file, in the first root.
pub const TOKEN_FILE: &str = "console.token";
const COOKIE: &str = "rollgate_console";
/// Connections served at once; more wait in the accept queue.
const MAX_CONNECTIONS: usize = 256;
/// A client must send its request head within this; also a keep-alive connection's idle limit.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_HEADER_BYTES: usize = 16_384;
/// The largest request body read (a reason is at most 500 characters).
const MAX_BODY_BYTES: usize = 8_192;
/// A comment on an idle event stream this often keeps proxies from closing it.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
const STREAM_POLL: Duration = Duration::from_millis(100);
/// Outcomes the history shows by default, and at most.
const HISTORY: usize = 50;
const MAX_HISTORY: usize = 10_000;

type Body = BoxBody<Bytes, Infallible>;

struct Console {
    roots: Vec<Root>,
    token: String,
    read_only: bool,
}

/// Runs the console until rollgate is stopped.
pub fn run(options: Options) -> Result<(), Error> {
    if options.roots.is_empty() {
        return Err(error::refused("give at least one --root"));
    }
    let roots = options
        .roots
        .iter()
        .map(|r| Root::existing(r.clone()).map_err(Error::from))
        .collect::<Result<Vec<_>, _>>()?;
    let token_path = roots[0].0.join(TOKEN_FILE);
    let loopback = options.listen.ip().is_loopback();
    if !loopback && !token_path.exists() {
        return Err(error::refused(format!(
            "{} is not a loopback address and {} does not exist: start the console once on 127.0.0.1 to make its token, then bind beyond loopback",
            options.listen,
            token_path.display()
        )));
    }
    // Read-only or not, what it shows is behind the token.
    let (token, made) = token(&token_path)?;
    let listener = std::net::TcpListener::bind(options.listen)
        .map_err(|e| error::refused(format!("cannot listen on {}: {e}", options.listen)))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::Failed(e.to_string()))?;
    let address = listener
        .local_addr()
        .map_err(|e| Error::Failed(e.to_string()))?;
    let read_only = match options.read_only {
        true => " (read-only)",
        false => "",
    };
    if made {
        eprintln!("rollgate console: http://{address}/?token={token}{read_only} (this link sets the token; it is in {})", token_path.display());
    } else {
        eprintln!(
            "rollgate console: http://{address}/{read_only} (its token is in {})",
            token_path.display()
        );
    }
    if !options.read_only {
        // The roots' webhooks are sent from here while the console runs (one sender at a
        // time per root: `up --supervise` or a cron pass may hold the lock instead).
        let roots = roots.clone();
        std::thread::spawn(move || crate::webhooks::keep_sending(roots, || true));
    }
    let console = Arc::new(Console {
        roots,
        token,
        read_only: options.read_only,
    });
    crate::engine::runtime()?.block_on(serve(listener, console))
}

/// The console's token: read from its file, or made now (0600) if there is none.
fn token(path: &std::path::Path) -> Result<(String, bool), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(text) = std::fs::read_to_string(path) {
        let token = text.trim().to_string();
        if token.len() < 32 || !token.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(Error::Invalid(format!(
                "{}: not a console token (64 hexadecimal digits); remove it to make a new one",
                path.display()
            )));
        }
        return Ok((token, false));
    }
    let mut bytes = [0u8; 32];
    rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut bytes);
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::Failed(format!("cannot create {}: {e}", path.display())))?;
    file.write_all(format!("{token}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| Error::Failed(format!("cannot write {}: {e}", path.display())))?;
    Ok((token, true))
}

async fn serve(listener: std::net::TcpListener, console: Arc<Console>) -> Result<(), Error> {
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(|e| Error::Failed(e.to_string()))?;
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut stop = Box::pin(tokio::signal::ctrl_c());
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => return Ok(()),
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return Ok(());
        };
        let console = console.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_HEADER_BYTES);
            let service = service_fn(move |request| {
                let console = console.clone();
                async move { Ok::<_, Infallible>(handle(request, console).await) }
            });
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    if let Ok(value) = HeaderValue::from_str(content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    full(status, "application/json", format!("{value}\n"))
}

/// An error as JSON, with the CLI's class and exit code.
fn error_response(error: &Error) -> Response<Body> {
    let (status, class) = match error {
        Error::Refused(_) => (StatusCode::CONFLICT, "refused"),
        Error::Failed(_) => (StatusCode::INTERNAL_SERVER_ERROR, "failed"),
        Error::Invalid(_) | Error::Diagnostic(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
        Error::Host(_) if error.is_refused() => (StatusCode::CONFLICT, "refused"),
        Error::Host(_) => (StatusCode::INTERNAL_SERVER_ERROR, "failed"),
    };
    json_response(
        status,
        &json!({ "error": error.to_string(), "class": class, "exit_code": error.code() }),
    )
}

fn not_found(what: &str) -> Response<Body> {
    json_response(
        StatusCode::NOT_FOUND,
        &json!({ "error": format!("no {what}"), "class": "refused", "exit_code": error::REFUSED }),
    )
}

async fn handle(request: Request<Incoming>, console: Arc<Console>) -> Response<Body> {
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or("").to_string();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let token_link = request.method() == Method::GET
        && parts.as_slice() == [""]
        && query_value(&query, "token").is_some();
    if !token_link && !authorized(&console, &request) {
        return unauthorized(parts.first() == Some(&"api"));
    }
    match (request.method().clone(), parts.as_slice()) {
        (Method::GET, [""]) => page_response(&console, &query).await,
        (Method::GET, ["api", "v1", "roots"]) => {
            let mut states = Vec::new();
            for index in 0..console.roots.len() {
                states.push(state_of(&console, index).await);
            }
            json_response(StatusCode::OK, &Value::Array(states))
        }
        (Method::GET, ["api", "v1", "roots", service]) => match find(&console, service).await {
            Some(index) => json_response(StatusCode::OK, &state_of(&console, index).await),
            None => not_found(&format!("root of service {service}")),
        },
        (Method::GET, ["api", "v1", "roots", service, "history"]) => {
            let limit = query_value(&query, "limit")
                .and_then(|l| l.parse::<usize>().ok())
                .unwrap_or(HISTORY)
                .min(MAX_HISTORY);
            match find(&console, service).await {
                Some(index) => {
                    let root = console.roots[index].clone();
                    let outcomes = tokio::task::spawn_blocking(move || history(&root, limit))
                        .await
                        .unwrap_or_default();
                    json_response(StatusCode::OK, &Value::Array(outcomes))
                }
                None => not_found(&format!("root of service {service}")),
            }
        }
        (Method::GET, ["api", "v1", "events"]) => events(&console, &query, &request),
        (Method::POST, ["api", "v1", "roots", service, rest @ ..]) if !console.read_only => {
            let action = rest.join("/");
            act(&console, service, &action, request).await
        }
        (Method::POST, _) if console.read_only => json_response(
            StatusCode::NOT_FOUND,
            &json!({ "error": "the console is read-only", "class": "refused", "exit_code": error::REFUSED }),
        ),
        _ => not_found(&format!("page {path}")),
    }
}

/// 401: no token, nothing shown (the API answers in JSON, the page in words).
fn unauthorized(api: bool) -> Response<Body> {
    let why = "this console needs its token: open the link `rollgate console` printed when it made it, or send `Authorization: Bearer TOKEN` (the token is in ROOT/console.token)";
    let mut response = match api {
        true => json_response(
            StatusCode::UNAUTHORIZED,
            &json!({ "error": why, "class": "refused", "exit_code": error::REFUSED }),
        ),
        false => full(
            StatusCode::UNAUTHORIZED,
            "text/plain; charset=utf-8",
            format!("{why}\n"),
        ),
    };
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

fn query_value(query: &str, name: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
}

/// The root serving `service`, found without reading any root's whole state.
async fn find(console: &Console, service: &str) -> Option<usize> {
    let roots = console.roots.clone();
    let service = service.to_string();
    tokio::task::spawn_blocking(move || roots.iter().position(|r| engine::service_of(r) == service))
        .await
        .ok()
        .flatten()
}

/// One root as `rollgate status --format json` shows it: the same model, serialized once.
async fn state_of(console: &Console, index: usize) -> Value {
    let root = console.roots[index].clone();
    tokio::task::spawn_blocking(move || {
        engine::RootStatus::of(&root, journal::now())
            .ok()
            .and_then(|status| serde_json::to_value(status).ok())
            .unwrap_or_else(|| json!({}))
    })
    .await
    .unwrap_or_else(|_| json!({}))
}

/// The root's outcomes, oldest first, the last `limit` of them: when, what, which version,
/// how long it took, and why (a reason is the detail up to its first "; ").
fn history(root: &Root, limit: usize) -> Vec<Value> {
    journal::last_outcomes(&root.log_path(), limit)
        .unwrap_or_default()
        .into_iter()
        .map(|outcome| {
            json!({
                "ts": outcome.ts,
                "when": crate::render::time::format_time(outcome.ts),
                "event": outcome.event,
                "version": outcome.version,
                "elapsed_ms": outcome.elapsed_ms,
                "reason": outcome.reason(),
                "detail": outcome.detail,
                "users_had_it": outcome.exposure.as_ref().map(|e| e.words()),
                "exposure": outcome.exposure,
            })
        })
        .collect()
}

async fn page_response(console: &Console, query: &str) -> Response<Body> {
    // The printed link: the token becomes a cookie, and the address bar loses it.
    if let Some(given) = query_value(query, "token") {
        if same_token(&given, &console.token) {
            let mut response = full(StatusCode::SEE_OTHER, "text/plain", "");
            let cookie = format!("{COOKIE}={given}; Path=/; HttpOnly; SameSite=Strict");
            if let Ok(value) = HeaderValue::from_str(&cookie) {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            response
                .headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static("/"));
            return response;
        }
        return full(
            StatusCode::FORBIDDEN,
            "text/plain",
            "that is not this console's token\n",
        );
    }
    let mut states = Vec::new();
    let mut histories = Vec::new();
    for index in 0..console.roots.len() {
        states.push(state_of(console, index).await);
        let root = console.roots[index].clone();
        histories.push(
            tokio::task::spawn_blocking(move || history(&root, HISTORY))
                .await
                .unwrap_or_default(),
        );
    }
    let sections: Vec<page::Section> = states
        .iter()
        .zip(&histories)
        .map(|(state, history)| page::Section::read(state, history))
        .collect();
    // Only an authorized request reaches the page (see `handle`).
    let actions = !console.read_only;
    let said = query_value(query, "said");
    full(
        StatusCode::OK,
        "text/html; charset=utf-8",
        page::page(
            &sections,
            console.read_only,
            actions,
            journal::now(),
            said.as_deref(),
        ),
    )
}

fn same_token(given: &str, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    !token.is_empty()
        && given.len() == token.len()
        && bool::from(given.as_bytes().ct_eq(token.as_bytes()))
}

/// The request carries the console's token (its cookie, or `Authorization: Bearer`).
fn authorized<B>(console: &Console, request: &Request<B>) -> bool {
    let headers = request.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().strip_prefix(&format!("{COOKIE}=")))
        .next();
    [bearer, cookie]
        .into_iter()
        .flatten()
        .any(|given| same_token(given.trim(), &console.token))
}

/// The request comes from this console's own page, or from no page at all (a script with the
/// bearer token): a browser sends `Origin` and `Sec-Fetch-Site` on a cross-site request.
fn same_origin<B>(request: &Request<B>) -> bool {
    let headers = request.headers();
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if !matches!(site, "same-origin" | "none") {
            return false;
        }
    }
    match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(origin) => {
            let host = headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            origin == format!("http://{host}")
        }
    }
}

/// A state change, through the CLI's own functions.
async fn act(
    console: &Console,
    service: &str,
    action: &str,
    request: Request<Incoming>,
) -> Response<Body> {
    if !authorized(console, &request) || !same_origin(&request) {
        return json_response(
            StatusCode::FORBIDDEN,
            &json!({ "error": "a state change needs the console's token and a same-origin request", "class": "refused", "exit_code": error::REFUSED }),
        );
    }
    let form = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
    let Some(index) = find(console, service).await else {
        return not_found(&format!("root of service {service}"));
    };
    let body = match http_body_util::Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return error_response(&error::refused(format!(
                "the request's body is over {MAX_BODY_BYTES} bytes"
            )))
        }
    };
    let fields: Value = if form {
        let map: serde_json::Map<String, Value> = form_urlencoded::parse(&body)
            .map(|(k, v)| {
                let value = match (k.as_ref(), v.as_ref()) {
                    ("rollback", "true" | "on") => json!(true),
                    (_, v) => json!(v),
                };
                (k.into_owned(), value)
            })
            .collect();
        Value::Object(map)
    } else if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(value @ Value::Object(_)) => value,
            _ => return error_response(&error::refused("the request's body is not a JSON object")),
        }
    };
    let reason = fields["reason"]
        .as_str()
        .filter(|r| !r.trim().is_empty())
        .map(str::to_string);
    let rollback = fields["rollback"].as_bool().unwrap_or(false);
    let root = console.roots[index].0.clone();
    let service = service.to_string();
    let action = action.to_string();
    let text = |key: &str| {
        fields[key]
            .as_str()
            .filter(|t| !t.trim().is_empty())
            .map(str::to_string)
    };
    // A number as JSON writes it, or as a form sends it (text).
    let number = |key: &str| {
        fields[key]
            .as_u64()
            .or_else(|| fields[key].as_str().and_then(|t| t.trim().parse().ok()))
    };
    let traffic_change = match action.as_str() {
        "traffic/maintenance" => Some(super::traffic::Change::Maintenance {
            message: text("message"),
            retry_after_s: number("retry_after"),
            page: None,
        }),
        "traffic/pause" => Some(super::traffic::Change::Pause {
            max_pause_ms: number("max_pause_ms"),
        }),
        "traffic/resume" => Some(super::traffic::Change::Resume),
        _ => None,
    };
    let result = tokio::task::spawn_blocking(move || -> Result<(String, u8), Error> {
        if let Some(change) = traffic_change {
            // What users get through the proxy: the traffic command's own function.
            return super::traffic::set(&root, &service, change, reason)
                .map(|said| (said.trim_end().to_string(), error::SUCCESS));
        }
        let ask = match action.as_str() {
            "rollout/pause" => Ask::Pause { reason },
            "rollout/resume" => Ask::Resume,
            "rollout/abort" => Ask::Abort { reason, rollback },
            "promote" => Ask::Accept,
            "abort" => Ask::Reject,
            other => return Err(error::refused(format!("no action {other}"))),
        };
        engine::ask(root, &service, ask).map(|o| (o.words.clone(), o.exit_code()))
    })
    .await
    .unwrap_or_else(|e| Err(Error::Failed(format!("the action did not finish: {e}"))));
    let said = match &result {
        Ok((said, _)) => said.clone(),
        Err(e) => e.to_string(),
    };
    if form {
        // A page without JavaScript: back to it, saying what happened.
        let location: String = form_urlencoded::Serializer::new(String::from("/?"))
            .append_pair("said", &said)
            .finish();
        let mut response = full(StatusCode::SEE_OTHER, "text/plain", "");
        if let Ok(value) = HeaderValue::from_str(&location) {
            response.headers_mut().insert(header::LOCATION, value);
        }
        return response;
    }
    match result {
        Ok((said, code)) => {
            json_response(StatusCode::OK, &json!({ "said": said, "exit_code": code }))
        }
        Err(error) => error_response(&error),
    }
}

/// `GET /api/v1/events`: Server-Sent Events, one per new log record of any root. Each event's
/// id holds every root's position (`/`-separated), so `Last-Event-ID` resumes with no gap and
/// no duplicate, through rotation; `?from=start` replays every record first.
fn events(console: &Console, query: &str, request: &Request<Incoming>) -> Response<Body> {
    let resume: Option<Vec<Option<Cursor>>> = request
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|id| {
            id.split('/')
                .map(|part| part.parse::<Cursor>().ok())
                .collect::<Vec<_>>()
        })
        .filter(|parts| parts.len() == console.roots.len());
    let from_start = query_value(query, "from").as_deref() == Some("start");
    let mut followers: Vec<Follower> = console
        .roots
        .iter()
        .enumerate()
        .map(|(i, root)| {
            let start = match resume.as_ref().map(|r| r[i]) {
                Some(Some(cursor)) => Start::After(cursor),
                Some(None) => Start::Beginning,
                None if from_start => Start::Beginning,
                None => Start::End,
            };
            Follower::new(&root.log_path(), start)
        })
        .collect();
    let services: Vec<String> = console
        .roots
        .iter()
        .map(|r| r.0.display().to_string())
        .collect();
    let (sender, receiver) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut positions: Vec<Option<Cursor>> = vec![None; followers.len()];
        let mut quiet = tokio::time::Instant::now();
        if sender
            .send(Bytes::from_static(b"retry: 1000\n\n"))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let mut sent = false;
            for (i, follower) in followers.iter_mut().enumerate() {
                let Ok(lines) = follower.poll() else {
                    continue;
                };
                if positions[i].is_none() {
                    positions[i] = follower.cursor();
                }
                for line in lines {
                    positions[i] = Some(line.after);
                    let id: Vec<String> = positions
                        .iter()
                        .map(|p| p.map_or("-".into(), |c| c.to_string()))
                        .collect();
                    let record: Value =
                        serde_json::from_str(&line.text).unwrap_or(Value::String(line.text));
                    let data = json!({ "root": services[i], "record": record });
                    let event = format!("id: {}\nevent: record\ndata: {data}\n\n", id.join("/"));
                    if sender.send(Bytes::from(event)).await.is_err() {
                        return;
                    }
                    sent = true;
                }
            }
            if sent {
                quiet = tokio::time::Instant::now();
            } else if quiet.elapsed() >= KEEP_ALIVE {
                if sender
                    .send(Bytes::from_static(b": keep-alive\n\n"))
                    .await
                    .is_err()
                {
                    return;
                }
                quiet = tokio::time::Instant::now();
            }
            tokio::time::sleep(STREAM_POLL).await;
        }
    });
    let body = Stream { receiver }.boxed();
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A body made of what a task sends, ended when the task stops.
struct Stream {
    receiver: mpsc::Receiver<Bytes>,
}

impl hyper::body::Body for Stream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.receiver
            .poll_recv(cx)
            .map(|chunk| chunk.map(|bytes| Ok(Frame::data(bytes))))
    }
}
