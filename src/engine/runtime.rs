//! The single-threaded runtime every command that drives the engine runs on.

use crate::error::{refused, Error};

/// The single-threaded runtime every command that drives the engine runs on.
pub fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| refused(format!("cannot start the async runtime: {e}")))
}
