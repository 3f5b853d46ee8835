//! Which release gets the next request, and how many requests each release still has in
//! flight. A request takes a [`Lease`] on the current target; the lease ends when the response
//! body has been sent. A target replaced by a switch is *retired*: it gets no new requests and
//! is drained once its last lease ends.
//!
//! The table changes a few times a deploy and is read on every request. So each client
//! connection keeps a [`View`] of it, valid while the table's generation has not moved: a
//! request then chooses its target without the lock (one atomic load, one increment of the
//! target's count, one load again). Its lease holds the target's `Arc`, whose count sits
//! beside the request count the increment has just brought to this core.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::counts::{Counts, Snapshot};

/// One release the proxy forwards to.
pub struct Target {
    pub version: String,
    pub port: u16,
    pub pid: i32,
    /// Its replica slot (0 for a single release).
    pub slot: u16,
    /// What it answered (shared by every target of the same version and slot).
    pub counts: Arc<Counts>,
    /// The version as a header value (`--version-header`), made once.
    pub header_value: Option<hyper::header::HeaderValue>,
    in_flight: AtomicUsize,
    idle: Notify,
    /// True once the deployer retiring it asked its tunnels to go (`drain <port> go`).
    going: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Target({} on port {}, pid {}, slot {}, {} in flight)",
            self.version,
            self.port,
            self.pid,
            self.slot,
            self.in_flight()
        )
    }
}

impl Target {
    fn new(member: Member<'_>, counts: Arc<Counts>) -> Arc<Target> {
        let (version, port, pid, slot) = member;
        Arc::new(Target {
            version: version.to_string(),
            port,
            pid,
            slot,
            counts,
            header_value: hyper::header::HeaderValue::from_str(version).ok(),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
            going: tokio::sync::watch::channel(false).0,
        })
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Resolves once no request is in flight to this target.
    pub async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Tells the tunnels open to this release to go away now (a WebSocket gets its Close,
    /// 1001, at a frame boundary): it is being stopped.
    pub fn send_tunnels_away(&self) {
        self.going.send_replace(true);
    }

    /// Resolves once [`Target::send_tunnels_away`] was called.
    pub async fn tunnels_sent_away(&self) {
        let mut going = self.going.subscribe();
        let _ = going.wait_for(|going| *going).await;
    }

    fn same_release(&self, (version, port, pid, slot): Member<'_>) -> bool {
        self.version == version && self.port == port && self.pid == pid && self.slot == slot
    }
}

/// Held for the life of one proxied request, response body included.
#[derive(Debug)]
pub struct Lease {
    pub target: Arc<Target>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.target.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.target.idle.notify_waiters();
        }
    }
}

/// A release the proxy may route to: version, port, pid and replica slot name it.
pub type Member<'a> = (&'a str, u16, i32, u16);

#[derive(Debug, Default)]
struct Table {
    /// The replicas new requests go to (one for a single-release root).
    pool: Vec<Arc<Target>>,
    /// Replaced targets still finishing requests.
    retired: Vec<Arc<Target>>,
    /// The previous release during a watch after a switch: tried only when every replica of
    /// the pool refused a request (the new release fell over before the switch back).
    fallback: Option<Arc<Target>>,
}

/// What a [`Routes::set_pool`] did.
#[derive(Debug)]
pub enum Switched {
    /// The state names the releases already served.
    Unchanged,
    /// New requests go elsewhere now; `replaced` are retired and drain.
    Changed { replaced: Vec<Arc<Target>> },
}

/// The routing table, shared by every connection.
#[derive(Debug, Default)]
pub struct Routes {
    table: Mutex<Table>,
    /// Moves on every change of the pool or the fallback (under the table's lock).
    generation: AtomicU64,
    /// Every release (version and slot) served since the proxy started, and what it answered:
    /// kept when it leaves the pool, so its counts never go back (Prometheus counters).
    counted: Mutex<Vec<Counted>>,
    /// Serving threads: each release's counts have a shard per thread.
    threads: usize,
}

/// One release's counts, by version and slot.
pub struct Counted {
    pub version: String,
    pub slot: u16,
    pub counts: Arc<Counts>,
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Counted({} slot {})", self.version, self.slot)
    }
}

/// One connection's copy of the table: the pool and the fallback as of `generation`.
#[derive(Debug, Default)]
pub struct View {
    /// None until the first request: no generation is ever valid for it.
    generation: Option<u64>,
    pool: Vec<Arc<Target>>,
    fallback: Option<Arc<Target>>,
}

impl View {
    /// The table's generation this view was taken at (None: never taken).
    pub fn generation(&self) -> Option<u64> {
        self.generation
    }

    /// Whether a release of the view (the pool or the fallback) is on `port`.
    pub fn has_port(&self, port: u16) -> bool {
        self.pool
            .iter()
            .chain(&self.fallback)
            .any(|t| t.port == port)
    }

    /// How many releases a request may be tried on: the pool, and the fallback if any.
    pub fn pool_size(&self) -> usize {
        self.pool.len() + usize::from(self.fallback.is_some())
    }
}

impl Routes {
    /// A table for `threads` serving threads.
    pub fn new(threads: usize) -> Routes {
        Routes {
            threads,
            ..Routes::default()
        }
    }

    /// The counts of `version` in `slot`, made the first time it is served.
    fn counts_for(&self, version: &str, slot: u16) -> Arc<Counts> {
        let Ok(mut counted) = self.counted.lock() else {
            return Arc::new(Counts::new(self.threads));
        };
        if let Some(seen) = counted
            .iter()
            .find(|c| c.version == version && c.slot == slot)
        {
            return seen.counts.clone();
        }
        let counts = Arc::new(Counts::new(self.threads));
        counted.push(Counted {
            version: version.to_string(),
            slot,
            counts: counts.clone(),
        });
        counts
    }

    /// What the proxy this one took over from counted for `version` in `slot`.
    pub fn carry(&self, version: &str, slot: u16, before: Snapshot) {
        self.counts_for(version, slot).carry(before);
    }

    /// Each release served since the proxy started, with its counts as of now.
    pub fn counted(&self) -> Vec<(String, u16, Snapshot)> {
        self.counted
            .lock()
            .map(|counted| {
                counted
                    .iter()
                    .map(|c| (c.version.clone(), c.slot, c.counts.snapshot()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every target still known (pool, fallback, retired), for the in-flight gauges.
    pub fn targets(&self) -> Vec<(Arc<Target>, bool)> {
        let table = self.table.lock().expect("routes lock");
        let serving = table
            .pool
            .iter()
            .chain(&table.fallback)
            .map(|t| (t.clone(), false));
        let retired = table
            .retired
            .iter()
            .filter(|t| {
                !table
                    .pool
                    .iter()
                    .chain(&table.fallback)
                    .any(|k| Arc::ptr_eq(k, t))
            })
            .map(|t| (t.clone(), true));
        serving.chain(retired).collect()
    }

    /// [`Routes::lease_except`] through a connection's `view`: the table's lock is taken only
    /// when the table changed since the view was taken. Invariant (the drain relies on it): a
    /// lease counts against its target before the generation is checked again, so a switch
    /// either sees the count (and its drain waits for it) or the request sees the switch and
    /// chooses again from the new table. Every step is `SeqCst` for that total order.
    ///
    /// `turns` breaks ties between equally busy replicas, so they take turns: a serving thread
    /// keeps its own (no cache line shared between threads).
    pub fn lease_in(&self, view: &mut View, skip: &[u16], turns: &AtomicUsize) -> Option<Lease> {
        loop {
            let generation = self.generation.load(Ordering::SeqCst);
            if view.generation != Some(generation) {
                let table = self.table.lock().expect("routes lock");
                view.pool.clone_from(&table.pool);
                view.fallback.clone_from(&table.fallback);
                view.generation = Some(self.generation.load(Ordering::SeqCst));
                continue;
            }
            let count = view.pool.len();
            let turn = turns.load(Ordering::Relaxed);
            let target = (0..count)
                .map(|i| &view.pool[(turn + i) % count])
                .filter(|t| !skip.contains(&t.port))
                .min_by_key(|t| t.in_flight())
                .or_else(|| view.fallback.as_ref().filter(|t| !skip.contains(&t.port)))?;
            target.in_flight.fetch_add(1, Ordering::SeqCst);
            let lease = Lease {
                target: target.clone(),
            };
            if self.generation.load(Ordering::SeqCst) == generation {
                turns.store(turn.wrapping_add(1), Ordering::Relaxed);
                return Some(lease);
            }
            // The table moved meanwhile: this count is undone (a drain it held up is told),
            // and the request chooses again.
            drop(lease);
        }
    }

    /// The tests' lease: the least busy replica not in `skip`, through a fresh view and turn.
    #[cfg(test)]
    pub fn lease_except(&self, skip: &[u16]) -> Option<Lease> {
        self.lease_in(&mut View::default(), skip, &AtomicUsize::new(0))
    }

    #[cfg(test)]
    pub fn lease(&self) -> Option<Lease> {
        self.lease_except(&[])
    }

    /// Points new requests at these releases (none: nothing is live). Targets that stay keep
    /// their counts; the others are retired and drain.
    pub fn set_pool(&self, members: &[Member<'_>]) -> Switched {
        let mut table = self.table.lock().expect("routes lock");
        let same = table.pool.len() == members.len()
            && table
                .pool
                .iter()
                .zip(members)
                .all(|(t, member)| t.same_release(*member));
        if same {
            return Switched::Unchanged;
        }
        let mut kept = Vec::with_capacity(members.len());
        for member in members {
            let existing = table.pool.iter().find(|t| t.same_release(*member)).cloned();
            kept.push(
                existing
                    .unwrap_or_else(|| Target::new(*member, self.counts_for(member.0, member.3))),
            );
        }
        let old = std::mem::replace(&mut table.pool, kept);
        let replaced: Vec<Arc<Target>> = old
            .into_iter()
            .filter(|t| !table.pool.iter().any(|k| Arc::ptr_eq(k, t)))
            .collect();
        let fallback = table.fallback.clone();
        table
            .retired
            .retain(|t| t.in_flight() > 0 || fallback.as_ref().is_some_and(|f| Arc::ptr_eq(f, t)));
        table.retired.extend(replaced.iter().cloned());
        self.generation.fetch_add(1, Ordering::SeqCst);
        Switched::Changed { replaced }
    }

    /// Sets or clears the fallback. The same release keeps its target (and its count); one
    /// no longer the fallback is retired, so a drain of its port waits for what it took.
    pub fn set_fallback(&self, member: Option<Member<'_>>) {
        let mut table = self.table.lock().expect("routes lock");
        let unchanged = match (&table.fallback, member) {
            (Some(t), Some(member)) => t.same_release(member),
            (None, None) => true,
            _ => false,
        };
        if unchanged {
            return;
        }
        let target = member.map(|member| {
            table
                .retired
                .iter()
                .chain(table.pool.iter())
                .find(|t| t.same_release(member))
                .cloned()
                .unwrap_or_else(|| Target::new(member, self.counts_for(member.0, member.3)))
        });
        if let Some(old) = std::mem::replace(&mut table.fallback, target) {
            if !table.retired.iter().any(|t| Arc::ptr_eq(t, &old)) {
                table.retired.push(old);
            }
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// How many releases a request may be tried on: the pool, and the fallback if any.
    pub fn pool_size(&self) -> usize {
        let table = self.table.lock().expect("routes lock");
        table.pool.len() + usize::from(table.fallback.is_some())
    }

    /// The releases new requests go to.
    pub fn pool(&self) -> Vec<Arc<Target>> {
        self.table.lock().expect("routes lock").pool.clone()
    }

    /// Retired targets on `port` (a release the deployer is about to stop).
    pub fn retired_on(&self, port: u16) -> Vec<Arc<Target>> {
        let table = self.table.lock().expect("routes lock");
        table
            .retired
            .iter()
            .filter(|t| t.port == port)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn no_live_release_no_lease() {
        assert!(Routes::default().lease().is_none());
    }

    #[test]
    fn a_switch_sends_new_requests_to_the_new_release() {
        let routes = Routes::default();
        assert!(matches!(
            routes.set_pool(&[("v1", 8001, 11, 0)]),
            Switched::Changed { replaced } if replaced.is_empty()
        ));
        let first = routes.lease().unwrap();
        assert_eq!(first.target.version, "v1");
        let Switched::Changed { replaced } = routes.set_pool(&[("v2", 8002, 12, 0)]) else {
            panic!("v1 was replaced")
        };
        let old = replaced[0].clone();
        assert_eq!(old.version, "v1");
        assert_eq!(routes.lease().unwrap().target.version, "v2");
        // The same pointer read again is no switch.
        assert!(matches!(
            routes.set_pool(&[("v2", 8002, 12, 0)]),
            Switched::Unchanged
        ));
        assert_eq!(routes.retired_on(8001).len(), 1);
        assert_eq!(old.in_flight(), 1);
    }

    #[test]
    fn the_least_busy_replica_gets_the_next_request_and_a_kept_one_keeps_its_count() {
        let routes = Routes::default();
        routes.set_pool(&[
            ("v1", 8001, 11, 0),
            ("v1", 8002, 12, 1),
            ("v1", 8003, 13, 2),
        ]);
        let a = routes.lease().unwrap();
        let b = routes.lease().unwrap();
        let c = routes.lease().unwrap();
        let mut ports = vec![a.target.port, b.target.port, c.target.port];
        ports.sort();
        assert_eq!(ports, [8001, 8002, 8003], "one each while equally busy");
        drop(b);
        let freed = routes.lease().unwrap();
        assert_eq!(freed.target.port, ports_of(&[&a, &c], &[8001, 8002, 8003]));
        assert!(routes.lease_except(&[8001, 8002, 8003]).is_none());
        // Replacing one replica retires it alone; the others keep their leases' counts.
        let Switched::Changed { replaced } = routes.set_pool(&[
            ("v1", 8001, 11, 0),
            ("v2", 8004, 14, 1),
            ("v1", 8003, 13, 2),
        ]) else {
            panic!("changed")
        };
        assert_eq!(replaced.len(), 1);
        assert_eq!(replaced[0].port, 8002);
        let kept = routes.pool();
        assert_eq!(
            kept[0].in_flight(),
            1 + usize::from(freed.target.port == 8001)
        );
    }

    /// The port in `all` that no lease in `held` is on.
    fn ports_of(held: &[&Lease], all: &[u16]) -> u16 {
        *all.iter()
            .find(|p| !held.iter().any(|l| l.target.port == **p))
            .unwrap()
    }

    #[test]
    fn the_fallback_takes_a_request_only_after_the_pool_refused_it() {
        let routes = Routes::default();
        routes.set_pool(&[("v1", 8001, 11, 0)]);
        let held = routes.lease().unwrap();
        routes.set_pool(&[("v2", 8002, 12, 0)]);
        routes.set_fallback(Some(("v1", 8001, 11, 0)));
        assert_eq!(routes.pool_size(), 2);
        assert_eq!(routes.lease().unwrap().target.version, "v2");
        let retried = routes.lease_except(&[8002]).unwrap();
        assert_eq!(retried.target.version, "v1");
        // The fallback is the retired target itself: one count for both.
        assert_eq!(retried.target.in_flight(), 2);
        assert!(routes.lease_except(&[8002, 8001]).is_none());
        drop((held, retried));
        // Cleared: retired, so a drain of its port still finds it.
        routes.set_fallback(None);
        assert_eq!(routes.pool_size(), 1);
        assert_eq!(routes.retired_on(8001).len(), 1);
        assert!(routes.lease_except(&[8002]).is_none());
    }

    #[test]
    fn a_view_follows_every_change_of_the_table_and_counts_against_the_new_target() {
        let routes = Routes::default();
        let mut view = View::default();
        let turns = AtomicUsize::new(0);
        assert!(routes.lease_in(&mut view, &[], &turns).is_none());
        routes.set_pool(&[("v1", 8001, 11, 0)]);
        let first = routes.lease_in(&mut view, &[], &turns).unwrap();
        assert_eq!(first.target.version, "v1");
        let taken_at = view.generation();
        drop(first);
        // Unchanged table: the same view serves, its generation does not move.
        let again = routes.lease_in(&mut view, &[], &turns).unwrap();
        assert_eq!(view.generation(), taken_at);
        drop(again);
        // A switch after the view was taken: the stale view is not used, the old target's
        // count stays at zero (its drain is not held up), the new one gets the request.
        let Switched::Changed { replaced } = routes.set_pool(&[("v2", 8002, 12, 0)]) else {
            panic!("v1 was replaced")
        };
        let lease = routes.lease_in(&mut view, &[], &turns).unwrap();
        assert_eq!(lease.target.version, "v2");
        assert_eq!(replaced[0].in_flight(), 0);
        assert_ne!(view.generation(), taken_at);
        assert!(view.has_port(8002) && !view.has_port(8001));
        // A fallback set afterwards is seen too.
        routes.set_fallback(Some(("v1", 8001, 11, 0)));
        assert_eq!(
            routes
                .lease_in(&mut view, &[8002], &turns)
                .unwrap()
                .target
                .port,
            8001
        );
        assert_eq!(view.pool_size(), 2);
    }

    #[tokio::test]
    async fn a_retired_target_drains_when_its_last_lease_ends() {
        let routes = Routes::default();
        routes.set_pool(&[("v1", 8001, 11, 0)]);
        let lease = routes.lease().unwrap();
        let Switched::Changed { replaced } = routes.set_pool(&[("v2", 8002, 12, 0)]) else {
            panic!("v1 was replaced")
        };
        let old = replaced[0].clone();
        let waiter = tokio::spawn(async move { old.drained().await });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(
            !waiter.is_finished(),
            "drained while a request was in flight"
        );
        drop(lease);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
    }
}
