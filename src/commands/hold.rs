//! `rollgate hold` (hidden): the root's holder of a service's listening socket, started by the
//! engine when a run's policy has `listen` and none answers (see `host::listen`). It takes
//! the socket (binds it, or takes a live release's copy of it when that release has it and its
//! holder is gone), then hands a copy to each release's start until it is stopped.

use std::path::Path;

use crate::error::{self, Error};
use crate::host::listen::{self, Spec};
use crate::host::state::Root;

pub fn run(root: &Path, address: std::net::SocketAddr, backlog: u32) -> Result<u8, Error> {
    let root = Root::existing(root.to_path_buf())?;
    let spec = Spec::parse(&address.to_string(), backlog)?;
    // The processes that may hold the socket when its holder died: what `current` and the
    // replica set name.
    let mut live: Vec<i32> = Vec::new();
    if let Ok(Some(pointer)) = root.read_pointer() {
        live.push(pointer.pid);
        live.extend(pointer.fallback.map(|f| f.pid));
    }
    if let Ok(Some(set)) = root.read_replicas() {
        live.extend(set.replicas.iter().map(|r| r.pid));
    }
    listen::hold(&root.0, &spec, &live)?;
    Ok(error::SUCCESS)
}
