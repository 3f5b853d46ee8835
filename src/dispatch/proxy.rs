//! `proxy` and `traffic`: the host's front door, and what it lets through to a service.

use std::time::Duration;

use rollgate::error::{self, Error};
use rollgate::proxy;

use super::printed;
use crate::cli::{ProxyAction, ProxyArgs, TrafficAction};

/// `rollgate proxy`: serves until SIGTERM or SIGINT (exit 0); `proxy reload` asks a running
/// one to read its config again and prints what it said.
pub fn run_proxy(args: ProxyArgs) -> Result<u8, Error> {
    let ProxyArgs {
        action,
        listen,
        root,
        config,
        version_header,
        max_connections,
        header_read_timeout_ms,
        max_header_bytes,
        threads,
        body_idle_timeout_ms,
        tunnel_idle_timeout_ms,
        drain_timeout_ms,
        trust_forwarded,
        metrics_listen,
        no_counting,
        user,
        tls_listen,
        tls_certs,
        hsts,
        acme_directory,
        acme_contact,
        acme_ca_file,
        acme_state,
        acme_name,
        acme_challenge,
        access_log,
        access_log_max_bytes,
        access_log_keep,
        access_log_query,
        access_log_sample,
        take_over,
        background,
    } = args;
    if background {
        return proxy::handover::in_background()
            .map_err(|e| Error::Failed(format!("cannot start the proxy in the background: {e}")));
    }
    if let Some(ProxyAction::Reload { config }) = action {
        let said = proxy::reload::ask(&config, Duration::from_secs(30))?;
        return printed(format!("{said}\n"));
    }
    let acme = match (acme_directory, acme_state) {
        (Some(directory), Some(state)) => Some(proxy::acme::Settings {
            directory,
            contacts: acme_contact,
            ca_file: acme_ca_file,
            state,
            names: acme_name.iter().map(|n| n.to_ascii_lowercase()).collect(),
            challenge: if acme_challenge == "tls-alpn-01" {
                proxy::acme::Challenge::TlsAlpn01
            } else {
                proxy::acme::Challenge::Http01
            },
        }),
        _ => None,
    };
    proxy::run(proxy::Options {
        listen,
        root: match (&root, &config) {
            (None, None) => Some(".".into()),
            _ => root,
        },
        config,
        version_header,
        max_connections: max_connections as usize,
        header_read_timeout: Duration::from_millis(header_read_timeout_ms),
        max_header_bytes: max_header_bytes as usize,
        threads: threads.map(usize::from),
        body_idle: Duration::from_millis(body_idle_timeout_ms),
        tunnel_idle: Duration::from_millis(tunnel_idle_timeout_ms),
        drain: Duration::from_millis(drain_timeout_ms),
        trust_forwarded,
        metrics_listen,
        counting: !no_counting,
        user,
        tls_listen,
        tls_certs,
        hsts,
        acme,
        access_log,
        access_max_bytes: access_log_max_bytes,
        access_keep: access_log_keep,
        access_query: access_log_query,
        access_sample: access_log_sample,
        take_over,
    })?;
    Ok(error::SUCCESS)
}

/// `rollgate traffic ...`: maintenance, a pause, serving again, or what each root's gate says.
pub fn run_traffic(action: TrafficAction) -> Result<u8, Error> {
    use rollgate::commands::traffic::{self, Change};
    let said = match action {
        TrafficAction::Maintenance {
            service,
            target,
            message,
            retry_after,
            page,
            reason,
        } => traffic::set(
            &target.root,
            &service,
            Change::Maintenance {
                message,
                retry_after_s: retry_after,
                page,
            },
            reason,
        )?,
        TrafficAction::Pause {
            service,
            target,
            max_pause_ms,
            reason,
        } => traffic::set(
            &target.root,
            &service,
            Change::Pause {
                max_pause_ms: Some(max_pause_ms),
            },
            reason,
        )?,
        TrafficAction::Resume {
            service,
            target,
            reason,
        } => traffic::set(&target.root, &service, Change::Resume, reason)?,
        TrafficAction::Status { roots, format } => {
            let roots = if roots.is_empty() {
                vec![".".into()]
            } else {
                roots
            };
            traffic::status(&roots, format)?
        }
    };
    printed(said)
}
