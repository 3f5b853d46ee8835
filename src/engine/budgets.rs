//! The numbers a rollout of N replicas moves by.
//!
//! Budgets follow Kubernetes' rounding, so `policy export --format k8s` says what rollgate
//! does: the surge rounds up, the unavailable budget rounds down, and when both come to 0 one
//! replica may be unavailable (Kubernetes refuses that pair; rollgate would otherwise never
//! move). At every moment a rollout keeps at least `N - unavailable` ready replicas in the pool
//! and runs at most `N + surge` replica processes.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// Replica processes allowed above N.
    pub surge: usize,
    /// Replicas allowed out of the pool below N.
    pub unavailable: usize,
}

impl Budgets {
    pub fn of(replicas: usize, max_surge_pct: u64, max_unavailable_pct: u64) -> Budgets {
        let share = |pct: u64| replicas as u128 * u128::from(pct.min(100));
        let surge = share(max_surge_pct).div_ceil(100) as usize;
        let unavailable = (share(max_unavailable_pct) / 100) as usize;
        Budgets {
            surge,
            unavailable: if surge == 0 && unavailable == 0 {
                1
            } else {
                unavailable
            },
        }
    }

    /// Replicas that may be changing at once: each either starts beside its old process (a
    /// surge place) or, with no surge place left, leaves the pool first (an unavailable place).
    pub fn in_flight(&self) -> usize {
        (self.surge + self.unavailable).max(1)
    }

    /// The fewest ready replicas the pool may hold.
    pub fn min_ready(&self, replicas: usize) -> usize {
        replicas.saturating_sub(self.unavailable)
    }

    /// The most replica processes that may run.
    pub fn max_processes(&self, replicas: usize) -> usize {
        replicas + self.surge
    }
}

/// Cumulative wave sizes for `replicas` replicas: wave k holds
/// `min(N, max(previous + 1, ceil(N * pct_k / 100)))`, so each wave adds at least one replica,
/// and the last wave always reaches N (a list that stops short of 100 % gets a final wave).
/// 10 replicas at 1/10/50/100: 1, 2, 5, 10; 20 at 10/50/100: 2, 10, 20.
pub fn wave_sizes(replicas: usize, percents: &[u64]) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut previous = 0;
    for pct in percents {
        if previous == replicas {
            break;
        }
        let wanted = (replicas as u128 * u128::from((*pct).min(100))).div_ceil(100) as usize;
        let size = wanted.max(previous + 1).min(replicas);
        sizes.push(size);
        previous = size;
    }
    if previous < replicas {
        sizes.push(replicas);
    }
    sizes
}

/// The slots each wave moves, in the order given (a stable order: the first wave is the
/// canary). `slots` are the replicas the rollout moves; left-behind ones are not among them.
pub fn assign_waves(slots: &[usize], percents: &[u64]) -> Vec<Vec<usize>> {
    let mut start = 0;
    wave_sizes(slots.len(), percents)
        .into_iter()
        .map(|end| {
            let wave = slots[start..end].to_vec();
            start = end;
            wave
        })
        .collect()
}

/// Whether a wave's failures pause the rollout: more than `max_failure_ratio` of the wave.
pub fn too_many_failures(failed: usize, wave_size: usize, max_failure_ratio: f64) -> bool {
    failed as f64 > max_failure_ratio * wave_size as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defaults;
    use proptest::prelude::*;

    #[test]
    fn the_documented_sizes() {
        assert_eq!(wave_sizes(10, &defaults::WAVES), [1, 2, 5, 10]);
        assert_eq!(wave_sizes(20, &[10, 50, 100]), [2, 10, 20]);
        assert_eq!(wave_sizes(1, &defaults::WAVES), [1]);
        assert_eq!(wave_sizes(3, &[50]), [2, 3]);
        assert_eq!(wave_sizes(0, &defaults::WAVES), Vec::<usize>::new());
        assert_eq!(
            Budgets::of(3, 25, 25),
            Budgets {
                surge: 1,
                unavailable: 0
            }
        );
        assert_eq!(
            Budgets::of(10, 0, 0),
            Budgets {
                surge: 0,
                unavailable: 1
            }
        );
        assert_eq!(
            Budgets::of(10, 25, 25),
            Budgets {
                surge: 3,
                unavailable: 2
            }
        );
        assert_eq!(
            Budgets::of(1, 100, 0),
            Budgets {
                surge: 1,
                unavailable: 0
            }
        );
    }

    #[test]
    fn waves_get_their_slots_in_order() {
        assert_eq!(
            assign_waves(&[4, 0, 1, 2, 3, 5, 6, 7, 8, 9], &defaults::WAVES),
            vec![vec![4], vec![0], vec![1, 2, 3], vec![5, 6, 7, 8, 9]]
        );
    }

    #[test]
    fn failures_pause_only_above_the_ratio() {
        assert!(!too_many_failures(0, 1, 0.05));
        assert!(too_many_failures(1, 1, 0.05));
        assert!(!too_many_failures(1, 20, 0.05));
        assert!(too_many_failures(2, 20, 0.05));
    }

    proptest! {
        #[test]
        fn waves_strictly_increase_and_end_at_n(
            n in 1usize..=200,
            percents in proptest::collection::vec(0u64..=100, 1..6),
        ) {
            let sizes = wave_sizes(n, &percents);
            prop_assert_eq!(*sizes.last().unwrap(), n);
            prop_assert!(sizes.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(sizes[0] >= 1);
            let waves = assign_waves(&(0..n).collect::<Vec<_>>(), &percents);
            let all: Vec<usize> = waves.concat();
            prop_assert_eq!(all, (0..n).collect::<Vec<_>>());
        }

        #[test]
        fn budgets_round_as_kubernetes_does(
            n in 1usize..=200,
            surge in 0u64..=100,
            unavailable in 0u64..=100,
        ) {
            let b = Budgets::of(n, surge, unavailable);
            prop_assert_eq!(b.surge, (n as u64 * surge).div_ceil(100) as usize);
            if surge == 0 && unavailable == 0 || b.surge == 0 && (n as u64 * unavailable) / 100 == 0 {
                prop_assert_eq!(b.unavailable, 1);
            } else {
                prop_assert_eq!(b.unavailable, ((n as u64 * unavailable) / 100) as usize);
            }
            prop_assert!(b.in_flight() >= 1);
            prop_assert!(b.min_ready(n) < n || b.surge >= 1);
            prop_assert!(b.max_processes(n) >= n);
        }
    }
}
