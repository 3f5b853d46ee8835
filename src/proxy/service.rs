//! One service the proxy serves: a root (its releases, `current`, `replicas.json`,
//! `deploy.log`), the table of which of its releases gets the next request (`leases.rs`), and
//! one view of that table per serving thread. A proxy with `--root` serves one; with
//! `--config` one per `[[route]]` (`router.rs` chooses between them by host and path).
//!
//! A service's followers (the watch on its pointer, the answers on its `proxy.sock`) run on the
//! proxy's main runtime while the service is configured (`Running`, in `reload.rs`); requests
//! hold the service by `Arc`, so a service a reload removed finishes what it has in flight.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use super::access::{self, AccessLog};
use super::counts::RouteCounts;
use super::leases::{Routes, View};
use super::traffic::Gate;
use super::watch;
use crate::host::state::Root;

/// One root served, as requests see it.
pub struct Service {
    /// Unique in the proxy's life (a service re-added by a reload is a new one).
    pub id: u64,
    /// The service's name: the route's `service`, else the root folder's name.
    pub name: String,
    pub root: Root,
    /// The root as text, for rollgate's own answers ("nothing under ROOT is live yet").
    pub root_text: String,
    pub routes: Arc<Routes>,
    /// What `ROOT/traffic.json` lets through: serving, maintenance, or a pause.
    pub gate: Arc<Gate>,
    /// `ROOT/access.log`, when the route logs.
    pub access: Option<Arc<AccessLog>>,
    /// Its requests rollgate answered itself, by why (`fate.rs`): with the releases' counts
    /// in `routes`, one count per request.
    pub own_answers: Arc<RouteCounts>,
    /// One view of `routes` per serving thread (each thread locks only its own: never
    /// contended), so a request chooses a release without the table's lock.
    views: Box<[Mutex<View>]>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Service {
    /// A service for `root`, its routing table read once (nothing live is no error).
    pub fn new(
        name: String,
        root: Root,
        threads: usize,
        access: Option<(access::Settings, u64)>,
    ) -> Service {
        let routes = Arc::new(Routes::new(threads));
        let _ = watch::refresh(&root, &routes);
        let gate = Arc::new(Gate::default());
        gate.refresh(&root.0);
        Service {
            gate,
            own_answers: Arc::new(RouteCounts::new(threads)),
            access: access.map(|(settings, started_ms)| {
                Arc::new(AccessLog::new(&root.0, settings, threads, started_ms))
            }),
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            name,
            root_text: root.0.display().to_string(),
            root,
            routes,
            views: (0..threads.max(1))
                .map(|_| Mutex::new(View::default()))
                .collect(),
        }
    }

    /// The same root under another name or another access log (a reload changed its route):
    /// the same table, counts and gate; fresh views. `access`: None keeps the log as it is.
    pub fn changed(
        &self,
        name: String,
        access: Option<Option<(access::Settings, u64)>>,
    ) -> Service {
        let threads = self.views.len();
        Service {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            name,
            root: self.root.clone(),
            root_text: self.root_text.clone(),
            routes: self.routes.clone(),
            gate: self.gate.clone(),
            own_answers: self.own_answers.clone(),
            access: match access {
                None => self.access.clone(),
                Some(logs) => logs.map(|(settings, started_ms)| {
                    Arc::new(AccessLog::new(&self.root.0, settings, threads, started_ms))
                }),
            },
            views: (0..self.views.len())
                .map(|_| Mutex::new(View::default()))
                .collect(),
        }
    }

    /// Serving thread `thread`'s view of the table.
    pub fn view(&self, thread: usize) -> std::sync::MutexGuard<'_, View> {
        // A thread that panicked while holding its view leaves a view that is only stale.
        let view = &self.views[thread % self.views.len()];
        view.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
