//! The traffic judge (issue 38): the new release's replicas against the old release's replicas
//! serving in the same window, on what users got through `rollgate proxy` (its counts, read
//! over `ROOT/proxy.sock`). Pure: numbers in, a verdict out; `tasks::analyse` reads the counts
//! and sends the verdicts, the executor logs them and pauses or rolls back on a failure.
//!
//! - Errors (5xx answers and requests no release answered): Fisher's exact test, one-sided
//!   (is the canary's rate higher?), conditional on the window's total errors: exact for the
//!   small counts canaries see. It fails only when the increase is significant *and* larger
//!   than `max_error_increase_pct` points.
//! - Latency: Mann–Whitney U over the two histograms (ties within a bucket, tie-corrected
//!   variance), one-sided, with the ratio of the `latency_quantile` quantiles: it fails only
//!   when the canary is significantly slower *and* the ratio exceeds `max_latency_ratio`.
//! - Fewer than `min_requests` on either side: inconclusive, never a failure.
//! - Looking again and again: each look tests at `(1 - confidence) / (2 × looks)` (Bonferroni
//!   over the looks the soak allows and the two tests), so the chance that an identical canary
//!   is stopped by any look of a soak is at most `1 - confidence` (docs/analysis.md).

use serde::{Deserialize, Serialize};
use statrs::distribution::{ContinuousCDF, DiscreteCDF, Hypergeometric, Normal};

use crate::defaults;
use crate::host::fault::Fault;
use crate::policy::AnalysisPolicy;
use crate::proxy::control::{CountsLine, ReleaseCounts};

/// What a failed analysis does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFail {
    Pause,
    Rollback,
}

/// What an analysis still inconclusive at the end of the soak does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnInconclusive {
    /// The soak's probes judged: the rollout goes on (the default).
    Pass,
    /// A person decides (`rollgate rollout resume` or `abort`).
    Pause,
}

/// The policy's `analysis` record, defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    pub min_requests: u64,
    pub max_error_increase_pct: f64,
    pub max_latency_ratio: f64,
    pub latency_quantile: f64,
    pub confidence: f64,
    pub interval_ms: u64,
    pub on_fail: OnFail,
    #[serde(default = "pass")]
    pub on_inconclusive: OnInconclusive,
    /// How much longer the judge keeps looking when the soak ends inconclusive (too little
    /// traffic), before `on_inconclusive` applies; a conclusive look ends the wait.
    #[serde(default = "wait")]
    pub inconclusive_wait_ms: u64,
    /// How long after each soak starts the judge begins counting: a canary's first requests
    /// (new connections, a cold process) are not what it will serve, and against a warm
    /// baseline they make an identical release look slower. Both sides' counts start after it.
    #[serde(default)]
    pub warmup_ms: u64,
}

fn pass() -> OnInconclusive {
    OnInconclusive::Pass
}

fn wait() -> u64 {
    defaults::ANALYSIS_INCONCLUSIVE_WAIT_MS
}

impl Default for Analysis {
    fn default() -> Self {
        Analysis {
            min_requests: defaults::ANALYSIS_MIN_REQUESTS,
            max_error_increase_pct: defaults::ANALYSIS_MAX_ERROR_INCREASE_PCT,
            max_latency_ratio: defaults::ANALYSIS_MAX_LATENCY_RATIO,
            latency_quantile: defaults::ANALYSIS_LATENCY_QUANTILE,
            confidence: defaults::ANALYSIS_CONFIDENCE,
            interval_ms: defaults::ANALYSIS_INTERVAL_MS,
            on_fail: OnFail::Pause,
            on_inconclusive: OnInconclusive::Pass,
            inconclusive_wait_ms: defaults::ANALYSIS_INCONCLUSIVE_WAIT_MS,
            warmup_ms: defaults::ANALYSIS_WARMUP_MS,
        }
    }
}

impl Analysis {
    /// The policy's `analysis`, defaults filled in; a value out of its range (a policy that
    /// skipped the contract) is refused naming the field.
    pub fn from_policy(asked: &AnalysisPolicy) -> Result<Analysis, Fault> {
        let d = Analysis::default();
        let number = |field: &str, value: Option<f64>, default: f64, low: f64, high: f64| {
            let value = value.unwrap_or(default);
            if value.is_finite() && (low..=high).contains(&value) {
                Ok(value)
            } else {
                Err(Fault::setting(
                    &format!("analysis.{field}"),
                    format!(
                        "analysis.{field} is {value}; it must be a number from {low} to {high}"
                    ),
                ))
            }
        };
        let whole = |field: &str, value: Option<u64>, default: u64, low: u64, high: u64| {
            let value = value.unwrap_or(default);
            if (low..=high).contains(&value) {
                Ok(value)
            } else {
                Err(Fault::setting(
                    &format!("analysis.{field}"),
                    format!(
                        "analysis.{field} is {value}; it must be an integer from {low} to {high}"
                    ),
                ))
            }
        };
        let on_fail = match asked.on_fail.as_deref() {
            None => d.on_fail,
            Some("pause") => OnFail::Pause,
            Some("rollback") => OnFail::Rollback,
            Some(other) => {
                return Err(Fault::setting(
                    "analysis.on_fail",
                    format!("analysis.on_fail is {other:?}; it must be 'pause or 'rollback"),
                ))
            }
        };
        let on_inconclusive = match asked.on_inconclusive.as_deref() {
            None => d.on_inconclusive,
            Some("pass") => OnInconclusive::Pass,
            Some("pause") => OnInconclusive::Pause,
            Some(other) => {
                return Err(Fault::setting(
                    "analysis.on_inconclusive",
                    format!("analysis.on_inconclusive is {other:?}; it must be 'pass or 'pause"),
                ))
            }
        };
        Ok(Analysis {
            min_requests: whole(
                "min_requests",
                asked.min_requests,
                d.min_requests,
                1,
                10_000_000,
            )?,
            max_error_increase_pct: number(
                "max_error_increase_pct",
                asked.max_error_increase_pct,
                d.max_error_increase_pct,
                0.0,
                100.0,
            )?,
            max_latency_ratio: number(
                "max_latency_ratio",
                asked.max_latency_ratio,
                d.max_latency_ratio,
                1.0,
                100.0,
            )?,
            latency_quantile: number(
                "latency_quantile",
                asked.latency_quantile,
                d.latency_quantile,
                0.5,
                0.999,
            )?,
            confidence: number("confidence", asked.confidence, d.confidence, 0.5, 0.999_999)?,
            interval_ms: whole(
                "interval_ms",
                asked.interval_ms,
                d.interval_ms,
                500,
                600_000,
            )?,
            on_fail,
            on_inconclusive,
            inconclusive_wait_ms: whole(
                "inconclusive_wait_ms",
                asked.inconclusive_wait_ms,
                d.inconclusive_wait_ms,
                0,
                3_600_000,
            )?,
            warmup_ms: whole("warmup_ms", asked.warmup_ms, d.warmup_ms, 0, 3_600_000)?,
        })
    }

    /// The significance each look's test is held to, for a soak of `window_ms` (the looks of
    /// the wait after an inconclusive end count too; the warm-up's do not: nothing is judged).
    pub fn alpha_per_test(&self, window_ms: u64) -> f64 {
        (1.0 - self.confidence) / (2.0 * self.looks(window_ms) as f64)
    }

    /// How many looks a soak of `window_ms` gets: one per interval after the warm-up, and
    /// those of the wait after an inconclusive end.
    fn looks(&self, window_ms: u64) -> u64 {
        looks(
            window_ms.saturating_sub(self.warmup_ms) + self.inconclusive_wait_ms,
            self.interval_ms,
        )
    }

    /// One line for `--dry-run` and the rollout's plan.
    pub fn describe(&self, window_ms: u64) -> String {
        format!(
            "analysis every {} ms{} against the old release serving at the same time: at least {} requests a side; fails on 5xx + failures up more than {} point(s), or p{} latency over {}x, each significant at {} confidence ({} looks, {:.1e} per test); on failure {}; inconclusive at the end: looking {} ms more, then {}",
            self.interval_ms,
            match self.warmup_ms {
                0 => String::new(),
                ms => format!(" after a {ms} ms warm-up"),
            },
            self.min_requests,
            self.max_error_increase_pct,
            (self.latency_quantile * 100.0).round(),
            self.max_latency_ratio,
            self.confidence,
            self.looks(window_ms),
            self.alpha_per_test(window_ms),
            match self.on_fail {
                OnFail::Pause => "pause",
                OnFail::Rollback => "roll back",
            },
            self.inconclusive_wait_ms,
            match self.on_inconclusive {
                OnInconclusive::Pass => "pass",
                OnInconclusive::Pause => "pause",
            }
        )
    }
}

/// How many looks a window of `window_ms` allows at one per `interval_ms` (at least one).
pub fn looks(window_ms: u64, interval_ms: u64) -> u64 {
    window_ms.div_ceil(interval_ms.max(1)).max(1)
}

/// One side's numbers over a window: requests, errors (5xx and no answer), and the latency
/// histogram as (floor µs, ceiling µs, count), sorted by floor. A try the proxy retried on
/// another replica counts among the requests and errors (the release failed it) and in
/// `retried` (the user did not: see [`Side::users_had`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub requests: u64,
    pub errors: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retried: u64,
    pub latency: Vec<(u64, u64, u64)>,
}

impl Side {
    /// What `version`'s replicas did between two reads of the proxy's counts (`since` None:
    /// since the proxy started).
    pub fn between(since: Option<&CountsLine>, now: &CountsLine, version: &str) -> Side {
        let mut side = Side::default();
        for release in now.releases.iter().filter(|r| r.release == version) {
            let before = since.and_then(|s| {
                s.releases
                    .iter()
                    .find(|r| r.release == release.release && r.slot == release.slot)
            });
            side.add(release, before);
        }
        side.latency.sort_unstable();
        side
    }

    fn add(&mut self, now: &ReleaseCounts, before: Option<&ReleaseCounts>) {
        // A release is judged on every try it failed, the ones the proxy then retried on
        // another replica included: it failed them all the same.
        let answered = |r: &ReleaseCounts| r.answers.values().sum::<u64>();
        let missed = |r: &ReleaseCounts| r.misses.values().sum::<u64>() + r.retried;
        // An answer whose body the release broke off (or let stall) failed its user too.
        let broke = |r: &ReleaseCounts| {
            let cut = |why: &str| r.cut.get(why).copied().unwrap_or(0);
            cut("upstream_reset") + cut("upstream_timeout")
        };
        let failed =
            |r: &ReleaseCounts| r.answers.get("5xx").copied().unwrap_or(0) + missed(r) + broke(r);
        let (answered_before, failed_before, missed_before, retried_before) = before
            .map_or((0, 0, 0, 0), |b| {
                (answered(b), failed(b), missed(b), b.retried)
            });
        self.requests +=
            (answered(now) + missed(now)).saturating_sub(answered_before + missed_before);
        self.errors += failed(now).saturating_sub(failed_before);
        self.retried += now.retried.saturating_sub(retried_before);
        for &[floor, ceiling, count] in &now.latency_us {
            let earlier = before
                .and_then(|b| b.latency_us.iter().find(|l| l[0] == floor))
                .map_or(0, |l| l[2]);
            let count = count.saturating_sub(earlier);
            if count == 0 {
                continue;
            }
            match self.latency.iter_mut().find(|l| l.0 == floor) {
                Some(bucket) => bucket.2 += count,
                None => self.latency.push((floor, ceiling, count)),
            }
        }
    }

    /// What users got from it: (requests it ended, of them failed) — the tries retried on
    /// another replica were answered there, so they are neither here.
    pub fn users_had(&self) -> (u64, u64) {
        (
            self.requests.saturating_sub(self.retried),
            self.errors.saturating_sub(self.retried),
        )
    }

    /// The error rate, in percent.
    pub fn error_pct(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.errors as f64 * 100.0 / self.requests as f64
        }
    }

    /// The `q` quantile of the latency in milliseconds, interpolated within its bucket.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total: u64 = self.latency.iter().map(|l| l.2).sum();
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut below = 0u64;
        for &(floor, ceiling, count) in &self.latency {
            if (below + count) as f64 >= rank {
                let within = ((rank - below as f64) / count as f64).clamp(0.0, 1.0);
                let ceiling = ceiling.min(floor.saturating_mul(2).max(floor + 1));
                return Some((floor as f64 + within * (ceiling - floor) as f64) / 1000.0);
            }
            below += count;
        }
        self.latency.last().map(|l| l.1 as f64 / 1000.0)
    }
}

/// What one look concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    Pass,
    Fail,
    Inconclusive,
}

/// One look's numbers and verdict (the `analysis` log record, status, the console).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub verdict: Finding,
    pub canary: String,
    pub baseline: String,
    pub canary_requests: u64,
    pub canary_errors: u64,
    pub baseline_requests: u64,
    pub baseline_errors: u64,
    pub canary_error_pct: f64,
    pub baseline_error_pct: f64,
    pub error_p: Option<f64>,
    pub canary_latency_ms: Option<f64>,
    pub baseline_latency_ms: Option<f64>,
    pub latency_ratio: Option<f64>,
    pub latency_p: Option<f64>,
    /// The significance each test was held to.
    pub alpha: f64,
    /// The verdict in words (a failure's is the pause or rollback reason).
    pub words: String,
}

/// Judges `canary` against `baseline` over the same window.
pub fn judge(
    settings: &Analysis,
    window_ms: u64,
    canary_version: &str,
    baseline_version: &str,
    canary: &Side,
    baseline: &Side,
) -> Verdict {
    let alpha = settings.alpha_per_test(window_ms);
    let q = settings.latency_quantile;
    let canary_latency = canary.quantile_ms(q);
    let baseline_latency = baseline.quantile_ms(q);
    let ratio = match (canary_latency, baseline_latency) {
        (Some(c), Some(b)) if b > 0.0 => Some(c / b),
        _ => None,
    };
    let mut verdict = Verdict {
        verdict: Finding::Inconclusive,
        canary: canary_version.to_string(),
        baseline: baseline_version.to_string(),
        canary_requests: canary.requests,
        canary_errors: canary.errors,
        baseline_requests: baseline.requests,
        baseline_errors: baseline.errors,
        canary_error_pct: canary.error_pct(),
        baseline_error_pct: baseline.error_pct(),
        error_p: None,
        canary_latency_ms: canary_latency,
        baseline_latency_ms: baseline_latency,
        latency_ratio: ratio,
        latency_p: None,
        alpha,
        words: String::new(),
    };
    if canary.requests < settings.min_requests || baseline.requests < settings.min_requests {
        verdict.words = format!(
            "inconclusive: {} request(s) to the canary and {} to the baseline; {} a side are needed",
            canary.requests, baseline.requests, settings.min_requests
        );
        return verdict;
    }
    let error_p = fisher_greater(
        canary.errors,
        canary.requests,
        baseline.errors,
        baseline.requests,
    );
    let latency_p = mann_whitney_greater(&canary.latency, &baseline.latency);
    verdict.error_p = Some(error_p);
    verdict.latency_p = latency_p;
    let increase = verdict.canary_error_pct - verdict.baseline_error_pct;
    let errors_fail = error_p < alpha && increase > settings.max_error_increase_pct;
    let latency_fail = latency_p.is_some_and(|p| p < alpha)
        && ratio.is_some_and(|r| r > settings.max_latency_ratio);
    let quantile = format!("p{}", (q * 100.0).round());
    let mut reasons = Vec::new();
    if errors_fail {
        reasons.push(format!(
            "canary 5xx {:.1} % ({}/{}) vs baseline {:.1} % ({}/{}), p = {:.1e} < {:.1e}, up {:.1} points > {}",
            verdict.canary_error_pct,
            canary.errors,
            canary.requests,
            verdict.baseline_error_pct,
            baseline.errors,
            baseline.requests,
            error_p,
            alpha,
            increase,
            settings.max_error_increase_pct
        ));
    }
    if latency_fail {
        reasons.push(format!(
            "canary {quantile} {:.2} ms vs baseline {:.2} ms ({:.2}x > {}x), p = {:.1e} < {:.1e}",
            canary_latency.unwrap_or(0.0),
            baseline_latency.unwrap_or(0.0),
            ratio.unwrap_or(0.0),
            settings.max_latency_ratio,
            latency_p.unwrap_or(1.0),
            alpha
        ));
    }
    if reasons.is_empty() {
        verdict.verdict = Finding::Pass;
        verdict.words = format!(
            "pass: 5xx {:.2} % ({}/{}) vs {:.2} % ({}/{}), p = {:.2}; {quantile} {} vs {} ms",
            verdict.canary_error_pct,
            canary.errors,
            canary.requests,
            verdict.baseline_error_pct,
            baseline.errors,
            baseline.requests,
            error_p,
            canary_latency.map_or("-".into(), |v| format!("{v:.2}")),
            baseline_latency.map_or("-".into(), |v| format!("{v:.2}")),
        );
    } else {
        verdict.verdict = Finding::Fail;
        verdict.words = reasons.join("; ");
    }
    verdict
}

/// Fisher's exact test, one-sided: the chance of the canary having at least its errors if
/// both sides had the same rate, given the window's total errors (hypergeometric tail).
pub fn fisher_greater(
    canary_errors: u64,
    canary_requests: u64,
    baseline_errors: u64,
    baseline_requests: u64,
) -> f64 {
    if canary_errors == 0 {
        return 1.0;
    }
    let population = canary_requests + baseline_requests;
    let errors = (canary_errors + baseline_errors).min(population);
    match Hypergeometric::new(population, errors, canary_requests) {
        // sf(x) = P(X > x): at least `canary_errors` is more than `canary_errors - 1`.
        Ok(law) => law.sf(canary_errors - 1).clamp(0.0, 1.0),
        Err(_) => 1.0,
    }
}

/// Mann–Whitney U, one-sided (is the canary slower?), from two histograms with the same
/// bucket edges: values in one bucket are ties. Normal approximation with the tie-corrected
/// variance and a continuity correction; None when either side is empty or all tie.
pub fn mann_whitney_greater(
    canary: &[(u64, u64, u64)],
    baseline: &[(u64, u64, u64)],
) -> Option<f64> {
    let n1: u64 = canary.iter().map(|b| b.2).sum();
    let n2: u64 = baseline.iter().map(|b| b.2).sum();
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let mut floors: Vec<u64> = canary.iter().chain(baseline).map(|b| b.0).collect();
    floors.sort_unstable();
    floors.dedup();
    let count = |side: &[(u64, u64, u64)], floor: u64| {
        side.iter().find(|b| b.0 == floor).map_or(0, |b| b.2) as f64
    };
    // U for the canary: pairs where the canary is slower, ties counting a half.
    let (mut u, mut below, mut ties) = (0.0f64, 0.0f64, 0.0f64);
    for floor in floors {
        let (c, b) = (count(canary, floor), count(baseline, floor));
        u += c * (below + b / 2.0);
        below += b;
        let t = c + b;
        ties += t * t * t - t;
    }
    let (n1, n2) = (n1 as f64, n2 as f64);
    let n = n1 + n2;
    let variance = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    if variance <= 0.0 {
        return None;
    }
    let z = (u - n1 * n2 / 2.0 - 0.5) / variance.sqrt();
    Some(Normal::standard().sf(z))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(requests: u64, errors: u64, latency: &[(u64, u64)]) -> Side {
        Side {
            requests,
            errors,
            retried: 0,
            latency: latency
                .iter()
                .map(|&(floor, count)| (floor, floor + floor / 8 + 1, count))
                .collect(),
        }
    }

    #[test]
    fn an_answer_the_release_broke_off_is_its_failure_and_one_the_client_left_is_not() {
        let counted = |cut: &[(&str, u64)]| crate::proxy::control::ReleaseCounts {
            release: "v2".into(),
            slot: 0,
            answers: [("2xx".to_string(), 10)].into(),
            misses: Default::default(),
            cut: cut.iter().map(|(why, n)| (why.to_string(), *n)).collect(),
            retried: 0,
            latency_sum_us: 0,
            latency_us: Vec::new(),
        };
        let line = |cut: &[(&str, u64)]| CountsLine {
            started_ms: 1,
            pid: 1,
            releases: vec![counted(cut)],
        };
        let before = line(&[]);
        let now = line(&[
            ("upstream_reset", 2),
            ("upstream_timeout", 1),
            ("client_closed", 4),
        ]);
        let side = Side::between(Some(&before), &now, "v2");
        // Its ten answers were counted at their heads; three of them it did not finish.
        assert_eq!((side.requests, side.errors), (0, 3));
        let side = Side::between(None, &now, "v2");
        assert_eq!(side.users_had(), (10, 3));
    }

    #[test]
    fn fisher_matches_a_hand_computed_tail() {
        // 3 errors, all in the canary's 10 of 20 requests: C(10,3)/C(20,3) = 120/1140.
        let p = fisher_greater(3, 10, 0, 10);
        assert!((p - 120.0 / 1140.0).abs() < 1e-9, "{p}");
        assert_eq!(fisher_greater(0, 10, 5, 10), 1.0);
    }

    #[test]
    fn mann_whitney_sees_a_slower_canary_and_not_a_twin() {
        let fast: Vec<(u64, u64)> = (0..20).map(|i| (400 + i * 50, 30)).collect();
        let slow: Vec<(u64, u64)> = (0..20).map(|i| (60_400 + i * 50, 30)).collect();
        let p =
            mann_whitney_greater(&side(0, 0, &slow).latency, &side(0, 0, &fast).latency).unwrap();
        assert!(p < 1e-12, "{p}");
        let twin =
            mann_whitney_greater(&side(0, 0, &fast).latency, &side(0, 0, &fast).latency).unwrap();
        assert!(twin > 0.4, "{twin}");
    }

    #[test]
    fn a_small_sample_is_inconclusive_never_a_failure() {
        let settings = Analysis::default();
        // One 5xx in twenty requests reads as 5 %: not enough to say anything.
        let verdict = judge(
            &settings,
            60_000,
            "v2",
            "v1",
            &side(20, 1, &[(500, 20)]),
            &side(20_000, 0, &[(500, 20_000)]),
        );
        assert_eq!(verdict.verdict, Finding::Inconclusive, "{}", verdict.words);
        assert!(verdict.words.contains("200 a side"), "{}", verdict.words);
    }

    #[test]
    fn three_percent_more_errors_fail_and_the_reason_has_the_numbers() {
        let settings = Analysis::default();
        let verdict = judge(
            &settings,
            60_000,
            "v2",
            "v1",
            &side(1320, 41, &[(500, 1320)]),
            &side(1511, 3, &[(500, 1511)]),
        );
        assert_eq!(verdict.verdict, Finding::Fail, "{}", verdict.words);
        assert!(
            verdict
                .words
                .starts_with("canary 5xx 3.1 % (41/1320) vs baseline 0.2 % (3/1511), p = "),
            "{}",
            verdict.words
        );
        // Significant but under the tolerance: not a failure.
        let small = judge(
            &settings,
            60_000,
            "v2",
            "v1",
            &side(100_000, 600, &[(500, 100_000)]),
            &side(100_000, 300, &[(500, 100_000)]),
        );
        assert_eq!(small.verdict, Finding::Pass, "{}", small.words);
    }

    #[test]
    fn sixty_ms_slower_fails_on_latency_and_a_twin_passes() {
        let settings = Analysis::default();
        let base: Vec<(u64, u64)> = (0..10).map(|i| (300 + i * 40, 100)).collect();
        let slow: Vec<(u64, u64)> = (0..10).map(|i| (60_300 + i * 400, 30)).collect();
        let verdict = judge(
            &settings,
            60_000,
            "v2",
            "v1",
            &side(300, 0, &slow),
            &side(1000, 0, &base),
        );
        assert_eq!(verdict.verdict, Finding::Fail, "{}", verdict.words);
        assert!(
            verdict.words.starts_with("canary p99 "),
            "{}",
            verdict.words
        );
        let twin = judge(
            &settings,
            60_000,
            "v2",
            "v1",
            &side(1000, 0, &base),
            &side(1000, 0, &base),
        );
        assert_eq!(twin.verdict, Finding::Pass, "{}", twin.words);
    }

    #[test]
    fn each_look_is_held_to_its_share_of_the_error_budget() {
        let settings = Analysis::default();
        assert_eq!(looks(60_000, 5000), 12);
        // 60 s of soak and 10 s of wait: 14 looks, 2 tests each.
        assert!((settings.alpha_per_test(60_000) - 0.01 / 28.0).abs() < 1e-12);
        assert_eq!(looks(1, 5000), 1);
        // A 20 s warm-up is not looked at: 40 s of soak and the wait, 10 looks.
        let warmed = Analysis {
            warmup_ms: 20_000,
            ..Analysis::default()
        };
        assert!((warmed.alpha_per_test(60_000) - 0.01 / 20.0).abs() < 1e-12);
        assert!(warmed
            .describe(60_000)
            .starts_with("analysis every 5000 ms after a 20000 ms warm-up against"));
        assert!(warmed.describe(60_000).contains("(10 looks, "));
        // A warm-up as long as the soak leaves the wait's looks.
        let whole = Analysis {
            warmup_ms: 90_000,
            ..Analysis::default()
        };
        assert!((whole.alpha_per_test(60_000) - 0.01 / 4.0).abs() < 1e-12);
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
