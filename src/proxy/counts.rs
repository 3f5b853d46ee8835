//! What each release answered through the proxy (issue 38): answers by status class, failures
//! to get an answer by kind, and the time to the answer's head in a fixed log-linear histogram.
//! The engine judges a canary on these, and `/metrics` exports them.
//!
//! Counting is on every request's path, so it is made cheap: a release's counts are sharded by
//! serving thread (each shard on cache lines of its own, so two threads never write the same
//! line), every count is one relaxed atomic add, and the histogram's bucket is found with one
//! leading-zeros instruction. Readers add the shards up; counts only grow while the proxy
//! lives (a new proxy starts from zero, which readers see by its start time).
//!
//! The histogram: values in microseconds; exact below 8 µs, then eight buckets per power of
//! two, so a bucket's width is at most 1/8 of its lower bound (12.5 % resolution) up to
//! 2^27 µs (134 s); anything longer falls in the last bucket.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Answers by status class: 1xx (an upgrade's 101), 2xx, 3xx, 4xx, 5xx.
pub const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Why a request got no answer from a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// The release refused the connection.
    Refused,
    /// The connection broke or closed before the answer.
    Reset,
    /// The release's answer was not readable HTTP, or anything else.
    Other,
}

/// Each [`Miss`]'s label.
pub const MISSES: [&str; 3] = ["refused", "reset", "other"];

/// Why an answer a release began (its head counted in `answers`) did not reach its client
/// whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The client left (closed, reset its stream, or read nothing for the body idle time).
    ClientClosed,
    /// The release's connection broke or closed before the body's end.
    UpstreamReset,
    /// The release sent nothing of its body for the body idle time.
    UpstreamTimeout,
}

/// Each [`Cut`]'s label.
pub const CUTS: [&str; 3] = ["client_closed", "upstream_reset", "upstream_timeout"];

impl Cut {
    /// The release's doing (the judge counts it a failure), not the client's.
    pub fn is_the_releases(self) -> bool {
        !matches!(self, Cut::ClientClosed)
    }
}

/// Why a request of a route ended without a release's answer or failure to count it on:
/// rollgate answered it itself, or its client left before any release's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// 308 to https (a plain listener while TLS is on).
    Redirect,
    /// 400: a head or body the proxy cannot pass on.
    BadRequest,
    /// 404: no route of the service's prefix takes the path.
    NotFound,
    /// 421: the connection's TLS name is not the request's host.
    Misdirected,
    /// 413: a body past the route's `max_request_body`.
    RefusedBody,
    /// 503 of the traffic gate: maintenance, or a pause that ran out.
    Maintenance,
    /// 503/502: no release took it (nothing live, or every one tried is gone).
    NoRelease,
    /// 499: the client left before any answer.
    ClientClosed,
}

/// Each [`Reason`]'s label.
pub const REASONS: [&str; 8] = [
    "redirect",
    "bad_request",
    "not_found",
    "misdirected",
    "refused_body",
    "maintenance",
    "no_release",
    "client_closed",
];

/// A route's own answers by [`Reason`], a shard per serving thread (as [`Counts`]).
pub struct RouteCounts {
    shards: Box<[RouteShard]>,
}

#[repr(align(128))]
#[derive(Default)]
struct RouteShard([AtomicU64; REASONS.len()]);

impl RouteCounts {
    pub fn new(threads: usize) -> RouteCounts {
        RouteCounts {
            shards: (0..threads.max(1)).map(|_| RouteShard::default()).collect(),
        }
    }

    pub fn ended(&self, thread: usize, why: Reason) {
        self.shards[thread % self.shards.len()].0[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The shards added up, by [`REASONS`].
    pub fn snapshot(&self) -> [u64; REASONS.len()] {
        let mut total = [0; REASONS.len()];
        for shard in self.shards.iter() {
            for (sum, count) in total.iter_mut().zip(&shard.0) {
                *sum += count.load(Ordering::Relaxed);
            }
        }
        total
    }
}

/// Buckets below the first power of two with eight sub-buckets.
const EXACT: usize = 8;
/// Sub-buckets per power of two.
const PER_OCTAVE: usize = 8;
/// The largest power of two with buckets of its own: 2^27 µs = 134 s.
const TOP_OCTAVE: u32 = 27;
/// Buckets in a histogram.
pub const BUCKETS: usize = EXACT + (TOP_OCTAVE as usize - 2) * PER_OCTAVE;

/// The bucket `micros` falls in.
pub fn bucket_of(micros: u64) -> usize {
    if micros < EXACT as u64 {
        return micros as usize;
    }
    let octave = 63 - micros.leading_zeros(); // >= 3
    if octave > TOP_OCTAVE {
        return BUCKETS - 1;
    }
    let sub = ((micros >> (octave - 3)) & 7) as usize;
    EXACT + (octave as usize - 3) * PER_OCTAVE + sub
}

/// The smallest value of bucket `index`, in microseconds.
pub fn bucket_floor(index: usize) -> u64 {
    if index < EXACT {
        return index as u64;
    }
    let octave = (index - EXACT) / PER_OCTAVE + 3;
    let sub = ((index - EXACT) % PER_OCTAVE) as u64;
    (8 + sub) << (octave - 3)
}

/// The first value past bucket `index`, in microseconds (the last bucket: past anything).
pub fn bucket_ceiling(index: usize) -> u64 {
    if index + 1 >= BUCKETS {
        u64::MAX
    } else {
        bucket_floor(index + 1)
    }
}

/// One serving thread's counts of one release, on cache lines of their own.
#[repr(align(128))]
struct Shard {
    answers: [AtomicU64; CLASSES.len()],
    misses: [AtomicU64; MISSES.len()],
    /// Answers begun (counted in `answers`) that did not reach the client whole.
    cut: [AtomicU64; CUTS.len()],
    /// Tries that got no answer and went on to another replica: the user's request was not
    /// lost with them (it is counted where it ended).
    retried: AtomicU64,
    /// Sum of the latencies counted, in microseconds.
    latency_sum: AtomicU64,
    latency: [AtomicU64; BUCKETS],
}

impl Default for Shard {
    fn default() -> Self {
        Shard {
            answers: Default::default(),
            misses: Default::default(),
            cut: Default::default(),
            retried: AtomicU64::new(0),
            latency_sum: AtomicU64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// One release's counts, a shard per serving thread, over what the proxy this one took over
/// from had counted (`carried`).
pub struct Counts {
    shards: Box<[Shard]>,
    carried: std::sync::Mutex<Option<Snapshot>>,
}

impl Counts {
    pub fn new(threads: usize) -> Counts {
        Counts {
            shards: (0..threads.max(1)).map(|_| Shard::default()).collect(),
            carried: Default::default(),
        }
    }

    /// What the proxy before this one counted for the release (its last word replaces what
    /// it said at the hand-over: counts only grow).
    pub fn carry(&self, before: Snapshot) {
        if let Ok(mut carried) = self.carried.lock() {
            *carried = Some(before);
        }
    }

    fn shard(&self, thread: usize) -> &Shard {
        &self.shards[thread % self.shards.len()]
    }

    /// An answer with `status` came `after` the request was sent on.
    pub fn answered(&self, thread: usize, status: u16, after: Duration) {
        let shard = self.shard(thread);
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        shard.answers[class].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(after.as_micros()).unwrap_or(u64::MAX);
        shard.latency[bucket_of(micros)].fetch_add(1, Ordering::Relaxed);
        shard.latency_sum.fetch_add(micros, Ordering::Relaxed);
    }

    /// A request got no answer, and none from another replica either: the user's failure.
    pub fn missed(&self, thread: usize, why: Miss) {
        self.shard(thread).misses[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// An answer counted by [`Counts::answered`] did not reach its client whole.
    pub fn cut(&self, thread: usize, why: Cut) {
        self.shard(thread).cut[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A try got no answer and the request went on to another replica.
    pub fn retried(&self, thread: usize) {
        self.shard(thread).retried.fetch_add(1, Ordering::Relaxed);
    }

    /// The shards added up, as of now, over what was carried.
    pub fn snapshot(&self) -> Snapshot {
        let mut total = self
            .carried
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .unwrap_or_default();
        for shard in self.shards.iter() {
            for (sum, count) in total.answers.iter_mut().zip(&shard.answers) {
                *sum += count.load(Ordering::Relaxed);
            }
            for (sum, count) in total.misses.iter_mut().zip(&shard.misses) {
                *sum += count.load(Ordering::Relaxed);
            }
            for (sum, count) in total.cut.iter_mut().zip(&shard.cut) {
                *sum += count.load(Ordering::Relaxed);
            }
            total.retried += shard.retried.load(Ordering::Relaxed);
            total.latency_sum_us += shard.latency_sum.load(Ordering::Relaxed);
            for (sum, count) in total.latency.iter_mut().zip(&shard.latency) {
                *sum += count.load(Ordering::Relaxed);
            }
        }
        total
    }
}

/// A release's counts at one moment (or over a window: the difference of two).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub answers: [u64; CLASSES.len()],
    pub misses: [u64; MISSES.len()],
    pub cut: [u64; CUTS.len()],
    pub retried: u64,
    pub latency_sum_us: u64,
    pub latency: Vec<u64>,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            answers: [0; CLASSES.len()],
            misses: [0; MISSES.len()],
            cut: [0; CUTS.len()],
            retried: 0,
            latency_sum_us: 0,
            latency: vec![0; BUCKETS],
        }
    }
}

/// What a proxy knows about itself that a reader of its counts needs.
#[derive(Debug, Clone, Copy)]
pub struct Started {
    /// Unix time in milliseconds: counts from another start are not comparable.
    pub at_ms: u64,
    pub pid: u32,
}

impl Started {
    pub fn now() -> Started {
        Started {
            at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            pid: std::process::id(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_in_order_within_an_eighth() {
        let mut last = 0;
        for micros in (0..5000u64).chain((1..60).map(|i| 1u64 << i)) {
            let bucket = bucket_of(micros);
            assert!(bucket >= last || micros < 5000, "{micros}");
            if micros < 5000 {
                last = bucket;
            }
            assert!(bucket < BUCKETS);
            if bucket + 1 < BUCKETS {
                assert!(
                    bucket_floor(bucket) <= micros && micros < bucket_ceiling(bucket),
                    "{micros} in {bucket}"
                );
                let width = bucket_ceiling(bucket) - bucket_floor(bucket);
                assert!(
                    width * 8 <= bucket_floor(bucket).max(8),
                    "{micros}: width {width}"
                );
            }
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_floor(BUCKETS - 1), 15 << 24);
    }

    #[test]
    fn shards_add_up_to_what_every_thread_counted() {
        let counts = Counts::new(2);
        counts.answered(0, 200, Duration::from_micros(900));
        counts.answered(1, 503, Duration::from_millis(61));
        counts.answered(3, 302, Duration::from_micros(5));
        counts.missed(1, Miss::Refused);
        counts.retried(0);
        counts.retried(1);
        let seen = counts.snapshot();
        assert_eq!(seen.answers, [0, 1, 1, 0, 1]);
        assert_eq!(seen.misses, [1, 0, 0]);
        assert_eq!(seen.retried, 2);
        assert_eq!(seen.latency_sum_us, 900 + 61_000 + 5);
        assert_eq!(seen.latency.iter().sum::<u64>(), 3);
        assert_eq!(seen.latency[bucket_of(61_000)], 1);
    }
}
