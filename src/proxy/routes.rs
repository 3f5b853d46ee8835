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

#[derive(Debug, Default)]
struct Table {
    current: Option<Arc<Target>>,
    retired: Vec<Arc<Target>>,
}

/// What a [`Routes::switch`] did.
#[derive(Debug)]
pub enum Switched {
    /// The pointer names the release already served.
    Unchanged,
    /// New requests go elsewhere now; `replaced` is retired and drains.
    Changed { replaced: Option<Arc<Target>> },
}

/// The routing table, shared by every connection.
#[derive(Debug, Default)]
pub struct Routes {
    table: Mutex<Table>,
}

impl Routes {
    /// A lease on the current target, or `None` when nothing is live. Taken under the same
    /// lock as a switch, so a request counts against exactly the target it is sent to.
    pub fn lease(&self) -> Option<Lease> {
        let table = self.table.lock().expect("routes lock");
        let target = table.current.clone()?;
        target.in_flight.fetch_add(1, Ordering::SeqCst);
        Some(Lease { target })
    }

    /// Points new requests at this release (or at nothing).
    pub fn switch(&self, next: Option<(&str, u16, i32)>) -> Switched {
        let mut table = self.table.lock().expect("routes lock");
        let unchanged = match (&table.current, next) {
            (Some(current), Some((version, port, pid))) => current.same_release(version, port, pid),
            (None, None) => true,
            _ => false,
        };
        if unchanged {
            return Switched::Unchanged;
        }
        let replaced = std::mem::replace(
            &mut table.current,
            next.map(|(version, port, pid)| Target::new(version, port, pid)),
        );
        table.retired.retain(|t| t.in_flight() > 0);
        if let Some(old) = &replaced {
            table.retired.push(old.clone());
        }
        Switched::Changed { replaced }
    }

    pub fn current(&self) -> Option<Arc<Target>> {
        self.table.lock().expect("routes lock").current.clone()
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
            routes.switch(Some(("v1", 8001, 11))),
            Switched::Changed { replaced: None }
        ));
        let first = routes.lease().unwrap();
        assert_eq!(first.target.version, "v1");
        let Switched::Changed {
            replaced: Some(old),
        } = routes.switch(Some(("v2", 8002, 12)))
        else {
            panic!("v1 was replaced")
        };
        assert_eq!(old.version, "v1");
        assert_eq!(routes.lease().unwrap().target.version, "v2");
        // The same pointer read again is no switch.
        assert!(matches!(
            routes.switch(Some(("v2", 8002, 12))),
            Switched::Unchanged
        ));
        assert_eq!(routes.retired_on(8001).len(), 1);
        assert_eq!(old.in_flight(), 1);
    }

    #[tokio::test]
    async fn a_retired_target_drains_when_its_last_lease_ends() {
        let routes = Routes::default();
        routes.switch(Some(("v1", 8001, 11)));
        let lease = routes.lease().unwrap();
        let Switched::Changed {
            replaced: Some(old),
        } = routes.switch(Some(("v2", 8002, 12)))
        else {
            panic!("v1 was replaced")
        };
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
