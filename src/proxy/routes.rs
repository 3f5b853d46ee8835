//! Which release gets the next request, and how many requests each release still has in
//! flight. A request takes a [`Lease`] on the current target; the lease ends when the response
//! body has been sent. A target replaced by a switch is *retired*: it gets no new requests and
//! is drained once its last lease ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// One release the proxy forwards to.
#[derive(Debug)]
pub struct Target {
    pub version: String,
    pub port: u16,
    pub pid: i32,
    in_flight: AtomicUsize,
    idle: Notify,
}

impl Target {
    pub fn new(version: &str, port: u16, pid: i32) -> Arc<Target> {
        Arc::new(Target {
            version: version.to_string(),
            port,
            pid,
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
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

    fn same_release(&self, version: &str, port: u16, pid: i32) -> bool {
        self.version == version && self.port == port && self.pid == pid
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

/// A release the proxy may route to: version, port and pid name it.
pub type Member<'a> = (&'a str, u16, i32);

#[derive(Debug, Default)]
struct Table {
    /// The replicas new requests go to (one for a single-release root).
    pool: Vec<Arc<Target>>,
    /// Replaced targets still finishing requests.
    retired: Vec<Arc<Target>>,
    /// The previous release during a watch after a switch: tried only when every replica of
    /// the pool refused a request (the new release fell over before the switch back).
    fallback: Option<Arc<Target>>,
    /// Breaks ties between equally busy replicas, so they take turns.
    turn: usize,
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
}

impl Routes {
    /// A lease on the least busy replica not in `skip` (ties taken in turn), or `None` when
    /// none is left. Taken under the same lock as a change of the pool, so a request counts
    /// against exactly the target it is sent to.
    pub fn lease_except(&self, skip: &[u16]) -> Option<Lease> {
        let mut table = self.table.lock().expect("routes lock");
        let count = table.pool.len();
        let turn = table.turn;
        let target = (0..count)
            .map(|i| &table.pool[(turn + i) % count])
            .filter(|t| !skip.contains(&t.port))
            .min_by_key(|t| t.in_flight())
            .or_else(|| table.fallback.as_ref().filter(|t| !skip.contains(&t.port)))?
            .clone();
        table.turn = turn.wrapping_add(1);
        target.in_flight.fetch_add(1, Ordering::SeqCst);
        Some(Lease { target })
    }

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
                .all(|(t, (version, port, pid))| t.same_release(version, *port, *pid));
        if same {
            return Switched::Unchanged;
        }
        let mut kept = Vec::with_capacity(members.len());
        for (version, port, pid) in members {
            let existing = table
                .pool
                .iter()
                .find(|t| t.same_release(version, *port, *pid))
                .cloned();
            kept.push(existing.unwrap_or_else(|| Target::new(version, *port, *pid)));
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
        Switched::Changed { replaced }
    }

    /// Sets or clears the fallback. The same release keeps its target (and its count); one
    /// no longer the fallback is retired, so a drain of its port waits for what it took.
    pub fn set_fallback(&self, member: Option<Member<'_>>) {
        let mut table = self.table.lock().expect("routes lock");
        let unchanged = match (&table.fallback, member) {
            (Some(t), Some((version, port, pid))) => t.same_release(version, port, pid),
            (None, None) => true,
            _ => false,
        };
        if unchanged {
            return;
        }
        let target = member.map(|(version, port, pid)| {
            table
                .retired
                .iter()
                .chain(table.pool.iter())
                .find(|t| t.same_release(version, port, pid))
                .cloned()
                .unwrap_or_else(|| Target::new(version, port, pid))
        });
        if let Some(old) = std::mem::replace(&mut table.fallback, target) {
            if !table.retired.iter().any(|t| Arc::ptr_eq(t, &old)) {
                table.retired.push(old);
            }
        }
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
            routes.set_pool(&[("v1", 8001, 11)]),
            Switched::Changed { replaced } if replaced.is_empty()
        ));
        let first = routes.lease().unwrap();
        assert_eq!(first.target.version, "v1");
        let Switched::Changed { replaced } = routes.set_pool(&[("v2", 8002, 12)]) else {
            panic!("v1 was replaced")
        };
        let old = replaced[0].clone();
        assert_eq!(old.version, "v1");
        assert_eq!(routes.lease().unwrap().target.version, "v2");
        // The same pointer read again is no switch.
        assert!(matches!(
            routes.set_pool(&[("v2", 8002, 12)]),
            Switched::Unchanged
        ));
        assert_eq!(routes.retired_on(8001).len(), 1);
        assert_eq!(old.in_flight(), 1);
    }

    #[test]
    fn the_least_busy_replica_gets_the_next_request_and_a_kept_one_keeps_its_count() {
        let routes = Routes::default();
        routes.set_pool(&[("v1", 8001, 11), ("v1", 8002, 12), ("v1", 8003, 13)]);
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
        let Switched::Changed { replaced } =
            routes.set_pool(&[("v1", 8001, 11), ("v2", 8004, 14), ("v1", 8003, 13)])
        else {
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
        routes.set_pool(&[("v1", 8001, 11)]);
        let held = routes.lease().unwrap();
        routes.set_pool(&[("v2", 8002, 12)]);
        routes.set_fallback(Some(("v1", 8001, 11)));
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

    #[tokio::test]
    async fn a_retired_target_drains_when_its_last_lease_ends() {
        let routes = Routes::default();
        routes.set_pool(&[("v1", 8001, 11)]);
        let lease = routes.lease().unwrap();
        let Switched::Changed { replaced } = routes.set_pool(&[("v2", 8002, 12)]) else {
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
