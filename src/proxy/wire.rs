//! The wire underneath both front ends: the bytes rollgate writes itself (decimals, addresses,
//! the HSTS line), how a Host header names a host,
//! and the words of rollgate's own answers (no route, no live release, a release that failed).
//! It names nothing else of the proxy: every other file may stand on it.

use std::net::IpAddr;

/// The smallest `--max-header-bytes` hyper can work with (its read buffer's floor).
pub const MIN_HEADER_BYTES: usize = 8192;

/// `Strict-Transport-Security` with `--hsts`: a year, as the HSTS preload list asks.
pub const HSTS: &str = "max-age=31536000";

/// The same as a header line, as `front.rs` writes it into an answer's head.
pub const HSTS_LINE: &[u8] = b"strict-transport-security: max-age=31536000\r\n";

pub fn push_decimal(out: &mut Vec<u8>, n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

pub fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                push_decimal(out, u64::from(octet));
            }
        }
        IpAddr::V6(v6) => out.extend_from_slice(v6.to_string().as_bytes()),
    }
}

/// A Host header's name as bytes, as they came: without spaces, a port, or the trailing dot of
/// a full name (`[::1]:80` is `::1`).
pub fn host_name_bytes(host: &[u8]) -> &[u8] {
    let host = host.trim_ascii();
    let name = match host.strip_prefix(b"[") {
        Some(v6) => v6.split(|b| *b == b']').next().unwrap_or(b""),
        None => match host.iter().rposition(|b| *b == b':') {
            Some(at) if host[at + 1..].iter().all(u8::is_ascii_digit) => &host[..at],
            _ => host,
        },
    };
    name.strip_suffix(b".").unwrap_or(name)
}

/// A Host header's name: lowercase, without a port or the trailing dot of a full name.
pub fn host_name(host: &[u8]) -> String {
    String::from_utf8_lossy(host_name_bytes(host)).to_ascii_lowercase()
}

/// The 404's words: no route of the proxy's config takes this host (or this path of it).
pub fn no_route(host: &str) -> String {
    if host.is_empty() {
        "no service here: the request names no host, and no route takes every host".into()
    } else {
        format!("no service here answers for {host} (no route of this proxy takes it)")
    }
}

/// Why no release answered: nothing is live (503), or every replica tried refused (502).
pub fn no_release_took_it(root: &str, refusals: &[String], pool_size: usize) -> String {
    if refusals.is_empty() {
        format!("no live release: nothing under {root} is live yet")
    } else {
        // The pool's size tells a refusal by every replica from a pool of one.
        format!(
            "release {} refused the connection ({} of {} in the pool tried)",
            refusals.join(", "),
            refusals.len(),
            pool_size
        )
    }
}

/// The 502's words when the release a request went to failed it.
pub fn release_failed(version: &str, port: u16, refused: bool, pool_size: usize) -> String {
    let what = if refused {
        "refused the connection"
    } else {
        "failed"
    };
    format!("release {version} on 127.0.0.1:{port} {what} (pool of {pool_size})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_paths_say_the_same_hsts() {
        assert_eq!(
            HSTS_LINE,
            format!("{}: {HSTS}\r\n", hyper::header::STRICT_TRANSPORT_SECURITY).as_bytes()
        );
    }

    #[test]
    fn a_host_header_names_its_host_without_port_or_trailing_dot() {
        assert_eq!(host_name(b"App.Example.COM:443"), "app.example.com");
        assert_eq!(host_name(b"app.example.com."), "app.example.com");
        assert_eq!(host_name(b"[::1]:8080"), "::1");
    }
}
