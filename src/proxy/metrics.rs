//! What the proxy tells about its counts (issue 38): `/metrics` in Prometheus' text format
//! (version 0.0.4) on `--metrics-listen`, for someone who already runs a Prometheus; and one
//! JSON line on `ROOT/proxy.sock` (`counts`), for the engine judging a canary.
//!
//! Series (labels `release` and `slot` on each but the last two; with `--config`, each also
//! has `route`, the service's name):
//! - `rollgate_proxy_answers_total{class}`: answers by status class (1xx is an upgrade's 101);
//! - `rollgate_proxy_upstream_failures_total{reason}`: requests no release answered
//!   (`refused`, `reset`: the connection broke or closed first, `other`: an unreadable answer);
//! - `rollgate_proxy_answers_cut_total{reason}`: answers among `answers_total` that did not
//!   reach the client whole (`client_closed`, `upstream_reset`, `upstream_timeout`);
//! - `rollgate_proxy_own_answers_total{reason}` (route only): requests rollgate answered itself
//!   or whose client left before any answer (`counts::REASONS`). With the two above, every
//!   request a route took is counted once: the access log's lines of a route and release
//!   equal its answers and failures, its lines without a release its own answers (`fate.rs`);
//! - `rollgate_proxy_answer_seconds`: time from sending the request to the answer's head, a
//!   histogram whose `le` bounds are powers of two microseconds (16 µs to 134 s): the proxy's
//!   finer buckets (`counts.rs`) summed at those edges;
//! - `rollgate_proxy_in_flight{port, state}`: requests a release is serving now (`serving`, or
//!   `draining` once retired by a switch);
//! - `rollgate_proxy_draining`: retired releases with requests still in flight;
//! - `rollgate_proxy_start_time_seconds`: when the proxy started (counters start at zero then);
//! - with `--tls-listen`: `rollgate_proxy_tls_handshakes_total`,
//!   `rollgate_proxy_tls_handshake_failures_total{reason}` and
//!   `rollgate_proxy_tls_certificate_expiry_days{name, source}`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::counts::{bucket_ceiling, Snapshot, Started, BUCKETS, CLASSES, CUTS, MISSES, REASONS};
use super::service::Service;

/// A label value as the text format wants it: backslash, double quote and newline escaped.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A series' HELP and TYPE lines.
fn series(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The `le` edges of the exported histogram: powers of two microseconds, each a bucket floor.
fn exported_edges() -> impl Iterator<Item = u64> {
    (4..=27).map(|power| 1u64 << power)
}

/// `/metrics`, as of now, for these services (labelled by route when `by_route`).
pub fn render(services: &[Arc<Service>], by_route: bool, started: Started) -> String {
    // Each service's releases, with the labels that open each of their series.
    let counted: Vec<(String, String, u16, Snapshot)> = services
        .iter()
        .flat_map(|service| {
            let route = route_label(service, by_route);
            service
                .routes
                .counted()
                .into_iter()
                .map(move |(version, slot, seen)| (route.clone(), version, slot, seen))
        })
        .collect();
    let mut out = String::with_capacity(4096);
    series(
        &mut out,
        "rollgate_proxy_answers_total",
        "counter",
        "Answers releases gave through the proxy, by status class.",
    );
    for (route, version, slot, seen) in &counted {
        for (class, count) in CLASSES.iter().zip(seen.answers) {
            let _ = writeln!(
                out,
                "rollgate_proxy_answers_total{{{route}release=\"{}\",slot=\"{slot}\",class=\"{class}\"}} {count}",
                label(version)
            );
        }
    }
    series(
        &mut out,
        "rollgate_proxy_upstream_failures_total",
        "counter",
        "Requests a release gave no answer to, by reason.",
    );
    for (route, version, slot, seen) in &counted {
        for (reason, count) in MISSES.iter().zip(seen.misses) {
            let _ = writeln!(
                out,
                "rollgate_proxy_upstream_failures_total{{{route}release=\"{}\",slot=\"{slot}\",reason=\"{reason}\"}} {count}",
                label(version)
            );
        }
    }
    render_ends(&mut out, services, by_route, &counted);
    series(
        &mut out,
        "rollgate_proxy_upstream_retries_total",
        "counter",
        "Tries a release gave no answer to that went on to another replica (not failures).",
    );
    for (route, version, slot, seen) in &counted {
        let _ = writeln!(
            out,
            "rollgate_proxy_upstream_retries_total{{{route}release=\"{}\",slot=\"{slot}\"}} {}",
            label(version),
            seen.retried
        );
    }
    series(
        &mut out,
        "rollgate_proxy_answer_seconds",
        "histogram",
        "Time from sending a request to a release to its answer's head.",
    );
    for (route, version, slot, seen) in &counted {
        let labels = format!("{route}release=\"{}\",slot=\"{slot}\"", label(version));
        let mut below = 0u64;
        let mut index = 0;
        for edge in exported_edges() {
            while index < BUCKETS - 1 && bucket_ceiling(index) <= edge {
                below += seen.latency[index];
                index += 1;
            }
            let _ = writeln!(
                out,
                "rollgate_proxy_answer_seconds_bucket{{{labels},le=\"{}\"}} {below}",
                edge as f64 / 1e6
            );
        }
        let total: u64 = seen.latency.iter().sum();
        let _ = writeln!(
            out,
            "rollgate_proxy_answer_seconds_bucket{{{labels},le=\"+Inf\"}} {total}"
        );
        let _ = writeln!(
            out,
            "rollgate_proxy_answer_seconds_sum{{{labels}}} {}",
            seen.latency_sum_us as f64 / 1e6
        );
        let _ = writeln!(
            out,
            "rollgate_proxy_answer_seconds_count{{{labels}}} {total}"
        );
    }
    series(
        &mut out,
        "rollgate_proxy_in_flight",
        "gauge",
        "Requests a release is serving now, its answer still streaming included.",
    );
    let targets: Vec<_> = services
        .iter()
        .flat_map(|service| {
            let route = route_label(service, by_route);
            service
                .routes
                .targets()
                .into_iter()
                .map(move |(target, retired)| (route.clone(), target, retired))
        })
        .collect();
    for (route, target, retired) in &targets {
        let _ = writeln!(
            out,
            "rollgate_proxy_in_flight{{{route}release=\"{}\",slot=\"{}\",port=\"{}\",state=\"{}\"}} {}",
            label(&target.version),
            target.slot,
            target.port,
            if *retired { "draining" } else { "serving" },
            target.in_flight()
        );
    }
    series(
        &mut out,
        "rollgate_proxy_draining",
        "gauge",
        "Releases retired by a switch that still have requests in flight.",
    );
    let draining = targets
        .iter()
        .filter(|(_, t, retired)| *retired && t.in_flight() > 0)
        .count();
    let _ = writeln!(out, "rollgate_proxy_draining {draining}");
    series(
        &mut out,
        "rollgate_proxy_start_time_seconds",
        "gauge",
        "When the proxy started: its counters started at zero then.",
    );
    let _ = writeln!(
        out,
        "rollgate_proxy_start_time_seconds {}",
        started.at_ms as f64 / 1e3
    );
    out
}

/// How the requests ended that `answers_total` and `upstream_failures_total` do not tell: the
/// answers cut short (per release) and rollgate's own answers (per route).
fn render_ends(
    out: &mut String,
    services: &[Arc<Service>],
    by_route: bool,
    counted: &[(String, String, u16, Snapshot)],
) {
    let out = &mut *out;
    series(
        out,
        "rollgate_proxy_answers_cut_total",
        "counter",
        "Answers (among answers_total) that did not reach the client whole, by why.",
    );
    for (route, version, slot, seen) in counted {
        for (reason, count) in CUTS.iter().zip(seen.cut) {
            let _ = writeln!(
                out,
                "rollgate_proxy_answers_cut_total{{{route}release=\"{}\",slot=\"{slot}\",reason=\"{reason}\"}} {count}",
                label(version)
            );
        }
    }
    series(
        out,
        "rollgate_proxy_own_answers_total",
        "counter",
        "Requests rollgate answered itself, or whose client left before any answer, by why.",
    );
    for service in services {
        let route = route_label(service, by_route);
        let route = route.trim_end_matches(',');
        let own = service.own_answers.snapshot();
        for (reason, count) in REASONS.iter().zip(own) {
            let labels = match route.is_empty() {
                true => format!("reason=\"{reason}\""),
                false => format!("{route},reason=\"{reason}\""),
            };
            let _ = writeln!(out, "rollgate_proxy_own_answers_total{{{labels}}} {count}");
        }
    }
}

/// The `route="NAME",` that opens a service's labels (nothing for `--root`'s one service).
fn route_label(service: &Service, by_route: bool) -> String {
    if by_route {
        format!("route=\"{}\",", label(&service.name))
    } else {
        String::new()
    }
}

/// The TLS series: handshakes, failed handshakes by reason, and each certificate's days left.
pub fn render_tls(tls: &super::certs::TlsLine) -> String {
    let mut out = String::new();
    series(
        &mut out,
        "rollgate_proxy_tls_handshakes_total",
        "counter",
        "TLS handshakes that finished.",
    );
    let _ = writeln!(
        out,
        "rollgate_proxy_tls_handshakes_total {}",
        tls.handshakes
    );
    series(
        &mut out,
        "rollgate_proxy_tls_handshake_failures_total",
        "counter",
        "TLS handshakes that did not finish, by why: timeout, unknown_name, protocol, client_alert, closed.",
    );
    for (reason, count) in &tls.handshake_failures {
        let _ = writeln!(
            out,
            "rollgate_proxy_tls_handshake_failures_total{{reason=\"{}\"}} {count}",
            label(reason)
        );
    }
    series(
        &mut out,
        "rollgate_proxy_tls_certificate_expiry_days",
        "gauge",
        "Days until each served certificate expires (negative once it has).",
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    for cert in &tls.certificates {
        let _ = writeln!(
            out,
            "rollgate_proxy_tls_certificate_expiry_days{{name=\"{}\",source=\"{}\"}} {:.3}",
            label(&cert.name),
            label(&cert.source),
            (cert.not_after as f64 - now) / 86_400.0
        );
    }
    out
}

/// Serves `/metrics` on `listener` until `stop` is said; then stops accepting and returns once
/// every connection it accepted has had its answer (a scrape accepted just before a hand-over
/// is answered by this proxy, never dropped with its runtime: issue 79's rule, one fate each).
pub async fn serve(
    listener: TcpListener,
    router: Arc<super::router::Current>,
    started: Started,
    tls: Option<Arc<super::certs::Resolver>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => break,
        };
        while connections.try_join_next().is_some() {}
        let Ok((stream, _)) = accepted else {
            // Out of descriptors, most likely: do not spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let (router, tls, mut stop) = (router.clone(), tls.clone(), stop.clone());
        connections.spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<_>| {
                let (router, tls) = (router.clone(), tls.clone());
                async move {
                    let (status, body) = match (request.method(), request.uri().path()) {
                        (&Method::GET, "/metrics") => {
                            let router = router.get();
                            let mut page = render(&router.services(), router.by_host, started);
                            if let Some(tls) = &tls {
                                page.push_str(&render_tls(&tls.line()));
                            }
                            (StatusCode::OK, page)
                        }
                        _ => (
                            StatusCode::NOT_FOUND,
                            "rollgate proxy: only GET /metrics here\n".to_string(),
                        ),
                    };
                    let mut response = Response::new(Full::new(Bytes::from(body)));
                    *response.status_mut() = status;
                    response.headers_mut().insert(
                        CONTENT_TYPE,
                        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                    );
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            serve_until_stopped!(connection, stop);
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}
