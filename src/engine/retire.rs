//! What retiring a release asks of the proxy first: that it finish the old release's requests.

use std::time::{Duration, Instant};

use super::judge;
use crate::host::state::Root;
use crate::proxy::control;

/// Asks a proxy serving the root to finish the old release's requests. Unless it confirms (or
/// there is no proxy), it may still be routing to the old release, so the old release is kept
/// for the whole drain timeout before it is stopped.
pub(crate) async fn drain_before_stop(root: &Root, port: u16, drain_ms: u64) -> String {
    let limit = Duration::from_millis(drain_ms).min(crate::host::MAX_WAIT);
    let asked = Instant::now();
    let answer = control::request(&root.0, port, limit).await;
    if judge::drain_confirmed(&answer) {
        return format!("{answer}; ");
    }
    tokio::time::sleep(limit.saturating_sub(asked.elapsed())).await;
    format!(
        "{answer}; the proxy did not confirm, so the old release was kept for the {} ms drain timeout; ",
        limit.as_millis()
    )
}
