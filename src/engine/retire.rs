//! What retiring a release asks of the proxy first: that it finish the old release's requests.

use std::time::{Duration, Instant};

use super::judge;
use crate::host::state::Root;
use crate::proxy::control::{self, Ask, Tunnels};

/// Asks a proxy serving the root to finish the old release's requests. Unless it confirms (or
/// there is no proxy), it may still be routing to the old release, so the old release is kept
/// for the whole drain timeout before it is stopped.
///
/// `tunnels`: the old release's open tunnels (WebSockets) are waited for as any request, within
/// the drain timeout ([`Tunnels::Wait`]), or — a release retired after a watch, whose tunnels
/// had the watch to end — told to go away first ([`Tunnels::SendAway`]: a Close with 1001).
pub(crate) async fn drain_before_stop(
    root: &Root,
    port: u16,
    drain_ms: u64,
    tunnels: Tunnels,
) -> String {
    let limit = Duration::from_millis(drain_ms).min(crate::host::MAX_WAIT);
    let asked = Instant::now();
    let answer = control::request(&root.0, port, Ask::Drain(tunnels), limit).await;
    if judge::drain_confirmed(&answer) {
        return format!("{answer}; ");
    }
    tokio::time::sleep(limit.saturating_sub(asked.elapsed())).await;
    format!(
        "{answer}; the proxy did not confirm, so the old release was kept for the {} ms drain timeout; ",
        limit.as_millis()
    )
}

/// Asks a proxy serving the root to confirm that new requests no longer go to the release on
/// `port` — the switch to a watched release, whose previous one runs on as the fallback: its
/// requests and tunnels go on, so nothing is waited for (a WebSocket held the switch, and its
/// `switched` line, for the whole drain timeout). Says what the proxy answered.
pub(crate) async fn confirm_switch(root: &Root, port: u16) -> String {
    let answer = control::request(&root.0, port, Ask::Switch, SWITCH_WAIT).await;
    format!("{answer}; ")
}

/// How long the proxy has to confirm a switch (it re-reads the pointer, nothing more).
const SWITCH_WAIT: Duration = Duration::from_secs(5);
