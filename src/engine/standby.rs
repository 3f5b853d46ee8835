//! A crash-looping release's standby, as the engine meets it (issue 68). A keeper whose release
//! exits within its crash-loop window starts the release live before it beside it
//! (`supervision::standby`) and records it as `current`'s fallback, marked `standby`: the proxy
//! sends it what the crashing release refuses. Here is its retirement, the one way it ends
//! without being made live: at the window's end, when a run begins (a run plans its own
//! fallback), when the service is stopped, or when its keeper is gone.

use std::time::Duration;

use crate::error::Error;
use crate::host::journal::{self, LogEvent};
use crate::host::process;
use crate::host::state::Root;

/// How long a retired standby gets between SIGTERM and SIGKILL: it serves nobody by then.
const GRACE: Duration = Duration::from_secs(5);

/// Retires the standby `current` names, if any: stopped whole, then taken out of `current`,
/// then logged (`standby`, `why` in the detail) — in that order, so that a retirement cut short
/// at any point is finished by the next one (`current` names it until it is gone; a request
/// the proxy sends it meanwhile fails as it would with no fallback). What was done, in words;
/// None when there was none. The caller holds the lock.
pub async fn retire_standby(root: &Root, why: &str) -> Result<Option<String>, Error> {
    let Some(mut pointer) = root.read_pointer()? else {
        return Ok(None);
    };
    let Some(standby) = pointer.fallback.take_if(|f| f.standby) else {
        return Ok(None);
    };
    let stopped = process::stop_group(standby.identity(), GRACE).await;
    super::fault::point();
    super::formation::write_pointer(root, &pointer).map_err(|e| {
        Error::Failed(format!(
            "cannot retire the standby {}: {e}",
            standby.version
        ))
    })?;
    super::fault::point();
    let detail = format!(
        "standby {} (port {}, pid {}) retired: {why}; it {stopped}",
        standby.version, standby.port, standby.pid
    );
    let entry = journal::Entry {
        port: Some(standby.port),
        pid: Some(standby.pid),
        ..journal::Entry::new(
            LogEvent::Standby,
            &standby.version,
            &pointer.service,
            detail.clone(),
        )
    };
    super::record::append(root, &entry)?;
    Ok(Some(detail))
}
