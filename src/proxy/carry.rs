//! The counts a proxy hands to the one taking over from it (issue 71), so that a canary being
//! judged keeps its numbers: the new proxy answers `counts` as the old one's continuation — the
//! same start (`started_ms`, `pid`: the judge subtracts two readings only of one proxy) and,
//! for each root and release, what the old one counted underneath what it counts itself.
//!
//! Said twice: at the hand-over (the new one serves from then on) and once more when the old
//! one has finished its last requests and exits; the last word replaces the first, so the
//! counts only grow.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::control::{release_counts, ReleaseCounts};
use super::counts::{bucket_of, Snapshot, Started, CLASSES, CUTS, MISSES};
use super::service::Service;

/// What one proxy counted, by root.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Carried {
    pub started_ms: u64,
    pub pid: u32,
    pub roots: Vec<CarriedRoot>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CarriedRoot {
    pub root: PathBuf,
    pub releases: Vec<ReleaseCounts>,
}

impl Carried {
    /// The proxy identity the counts go on under.
    pub fn started(&self) -> Started {
        Started {
            at_ms: self.started_ms,
            pid: self.pid,
        }
    }
}

/// Everything `services` counted, as of now.
pub fn carried(services: &[Arc<Service>], started: Started) -> Carried {
    Carried {
        started_ms: started.at_ms,
        pid: started.pid,
        roots: services
            .iter()
            .map(|service| CarriedRoot {
                root: service.root.0.clone(),
                releases: service
                    .routes
                    .counted()
                    .into_iter()
                    .map(|(release, slot, seen)| release_counts(release, slot, &seen))
                    .collect(),
            })
            .collect(),
    }
}

/// Puts what the proxy before counted under each of `services`' counts (a root it served that
/// this one does not is left: nobody reads it here).
pub fn carry(services: &[Arc<Service>], carried: &Carried) {
    for service in services {
        let Some(before) = carried.roots.iter().find(|r| r.root == service.root.0) else {
            continue;
        };
        for release in &before.releases {
            service
                .routes
                .carry(&release.release, release.slot, snapshot_of(release));
        }
    }
}

/// A counts line's release back as a snapshot (its histogram buckets by their floors).
fn snapshot_of(counted: &ReleaseCounts) -> Snapshot {
    let by_name =
        |names: &[&str], counts: &std::collections::BTreeMap<String, u64>, into: &mut [u64]| {
            for (name, slot) in names.iter().zip(into.iter_mut()) {
                *slot = counts.get(*name).copied().unwrap_or(0);
            }
        };
    let mut snapshot = Snapshot::default();
    by_name(&CLASSES, &counted.answers, &mut snapshot.answers);
    by_name(&MISSES, &counted.misses, &mut snapshot.misses);
    by_name(&CUTS, &counted.cut, &mut snapshot.cut);
    snapshot.retried = counted.retried;
    snapshot.latency_sum_us = counted.latency_sum_us;
    for [floor, _, count] in &counted.latency_us {
        if let Some(bucket) = snapshot.latency.get_mut(bucket_of(*floor)) {
            *bucket += count;
        }
    }
    snapshot
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_release_s_counts_come_back_from_their_line_exactly() {
        let counts = super::super::counts::Counts::new(2);
        counts.answered(0, 200, Duration::from_micros(3));
        counts.answered(1, 200, Duration::from_micros(900));
        counts.answered(1, 503, Duration::from_millis(61));
        counts.answered(0, 101, Duration::from_secs(500));
        counts.missed(1, super::super::counts::Miss::Reset);
        counts.retried(0);
        counts.cut(1, super::super::counts::Cut::UpstreamTimeout);
        let seen = counts.snapshot();
        let line = release_counts("v2".into(), 3, &seen);
        assert_eq!(snapshot_of(&line), seen);
        // Carried under a new proxy's own counts, they add up.
        let next = super::super::counts::Counts::new(1);
        next.carry(snapshot_of(&line));
        next.answered(0, 200, Duration::from_micros(900));
        let both = next.snapshot();
        assert_eq!(both.answers, [1, 3, 0, 0, 1]);
        assert_eq!(both.latency[bucket_of(900)], 2);
        assert_eq!(both.misses, seen.misses);
    }
}
