//! `log stats`: rates and durations, each named for what it measures.
//!
//! - *candidate rejection rate* = rolled back before users saw them / (promoted + rolled_back):
//!   candidates the gate stopped before users saw them (a release switched back in its watch
//!   was seen by users: it is counted among the releases users had, not here). Not DORA's change failure rate: those failures never
//!   reached production.
//! - *time to promotion* = candidate_started → promoted, the gate and any watch or soaks
//!   included (a deploy's gate alone is its `promoted` line's `elapsed_ms`); *time to
//!   rollback* = candidate_started → rolled_back. Not lead time for changes: the log has no
//!   commit times.
//! - *exposure* = promoted → rolled_back for a release rolled back after it went live, and
//!   switched → rolled_back for one switched back in its watch: how long users were exposed to
//!   a production failure, with what it answered them where the line says (the proxy's counts).
//! - *promotions per day / week* over the log's span (first to last timestamp).

use polars::prelude::*;
use serde::Serialize;

use super::frame;
use super::history::Attempt;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    pub count: u64,
    pub median_s: Option<f64>,
    pub p90_s: Option<f64>,
    pub max_s: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Count {
    pub key: Option<String>,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Exposure {
    pub version: Option<String>,
    pub promoted_at: Option<f64>,
    pub rolled_back_at: Option<f64>,
    pub exposure_s: Option<f64>,
}

/// A release users had and that was rolled back: after its promotion, or in its watch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UsersHadIt {
    pub version: Option<String>,
    /// `after promotion`, `in its watch` (a deploy) or `as a canary of its rollout`.
    pub how: &'static str,
    /// When users began to have it (its promotion, or its switch).
    pub live_from: Option<f64>,
    pub rolled_back_at: Option<f64>,
    pub exposure_s: Option<f64>,
    /// What it answered users through the proxy, where its rollback's line says.
    pub requests: Option<u64>,
    pub failed: Option<u64>,
    pub ended_by: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Stats {
    pub records: u64,
    pub attempts: u64,
    pub promoted: u64,
    pub rolled_back: u64,
    pub escalated: u64,
    pub unfinished: u64,
    /// Refused before anything started (a `pre_deploy` hook or the release phase failed):
    /// attempts too, so every attempt has its row (issue 81, 4: 11 attempts, 8 + 2 said).
    pub refused: u64,
    pub candidate_rejection_rate: Option<f64>,
    pub span_s: Option<f64>,
    pub promotions_per_day: Option<f64>,
    pub promotions_per_week: Option<f64>,
    pub days_with_a_promotion: u64,
    pub time_to_promotion: Spread,
    pub time_to_rollback: Spread,
    pub rollbacks_by_reason: Vec<Count>,
    pub rollbacks_by_version: Vec<Count>,
    pub rolled_back_after_promotion: Vec<Exposure>,
    /// Rolled back by the gate before any user reached them (the rate's numerator).
    pub rolled_back_before_users: u64,
    /// Every release users had and that was rolled back: in its watch or after promotion.
    pub rolled_back_after_users_had_them: Vec<UsersHadIt>,
    /// Rollouts of several replicas (None when the log has none).
    pub rollouts: Option<RolloutStats>,
}

/// What the log says of its rollouts: outcomes, waves, failures and pauses.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RolloutStats {
    pub rollouts: u64,
    pub completed: u64,
    pub aborted: u64,
    pub waves_completed: u64,
    /// Time per wave, first replica started to wave completed (soak excluded).
    pub wave_time: Spread,
    pub replica_failures: u64,
    pub pauses: u64,
}

fn rollout_stats(attempts: &[Attempt]) -> Option<RolloutStats> {
    use super::history::Outcome;
    let rollouts: Vec<(&Attempt, &super::history::RolloutFacts)> = attempts
        .iter()
        .filter_map(|a| Some((a, a.rollout.as_deref()?)))
        .collect();
    if rollouts.is_empty() {
        return None;
    }
    let mut times: Vec<f64> = rollouts
        .iter()
        .flat_map(|(_, r)| r.wave_times.iter().flatten().copied())
        .filter(|t| t.is_finite())
        .collect();
    times.sort_by(f64::total_cmp);
    // Linear interpolation between closest ranks, as polars' `Linear` quantile does.
    let quantile = |q: f64| -> Option<f64> {
        let last = times.len().checked_sub(1)?;
        let rank = q * last as f64;
        let (low, high) = (rank.floor() as usize, rank.ceil() as usize);
        Some(times[low] + (times[high] - times[low]) * (rank - low as f64))
    };
    let count_outcome = |o: Outcome| rollouts.iter().filter(|(a, _)| a.outcome == o).count() as u64;
    Some(RolloutStats {
        rollouts: rollouts.len() as u64,
        completed: count_outcome(Outcome::Promoted),
        aborted: count_outcome(Outcome::RolledBack),
        waves_completed: rollouts.iter().map(|(_, r)| r.waves_done as u64).sum(),
        wave_time: Spread {
            count: times.len() as u64,
            median_s: quantile(0.5),
            p90_s: quantile(0.9),
            max_s: times.last().copied(),
        },
        replica_failures: rollouts
            .iter()
            .map(|(_, r)| r.failures.iter().sum::<usize>() as u64)
            .sum(),
        pauses: rollouts.iter().map(|(_, r)| r.pauses as u64).sum(),
    })
}

fn outcome_is(name: &str) -> Expr {
    col("outcome").eq(lit(name))
}

fn count_where(df: &DataFrame, predicate: Expr) -> PolarsResult<u64> {
    let out = df
        .clone()
        .lazy()
        .filter(predicate)
        .select([len()])
        .collect()?;
    Ok(out.columns()[0].get(0)?.extract::<u64>().unwrap_or(0))
}

fn f64_at(df: &DataFrame, name: &str) -> PolarsResult<Option<f64>> {
    Ok(df.column(name)?.get(0)?.extract::<f64>())
}

fn spread(df: &DataFrame, outcome: &str) -> PolarsResult<Spread> {
    let d = col("time_to_outcome_s");
    let out = df
        .clone()
        .lazy()
        .filter(outcome_is(outcome).and(d.clone().is_not_null()))
        .select([
            d.clone().count().alias("count"),
            d.clone().median().alias("median"),
            d.clone()
                .quantile(lit(0.9), QuantileMethod::Linear)
                .alias("p90"),
            d.max().alias("max"),
        ])
        .collect()?;
    Ok(Spread {
        count: out.column("count")?.get(0)?.extract::<u64>().unwrap_or(0),
        median_s: f64_at(&out, "median")?,
        p90_s: f64_at(&out, "p90")?,
        max_s: f64_at(&out, "max")?,
    })
}

fn rollbacks_by(df: &DataFrame, key: &str) -> PolarsResult<Vec<Count>> {
    let out = df
        .clone()
        .lazy()
        .filter(outcome_is("rolled_back"))
        .group_by([col(key)])
        .agg([len().alias("count")])
        .sort_by_exprs(
            [col("count"), col(key)],
            SortMultipleOptions::default()
                .with_order_descending_multi([true, false])
                .with_nulls_last(true),
        )
        .collect()?;
    let keys = out.column(key)?;
    let counts = out.column("count")?;
    (0..out.height())
        .map(|i| {
            Ok(Count {
                key: keys.get(i)?.get_str().map(String::from),
                count: counts.get(i)?.extract::<u64>().unwrap_or(0),
            })
        })
        .collect()
}

/// The figures of `records` records whose times run from `span.0` to `span.1`, paired into
/// `attempts`.
pub fn stats(records: u64, span: Option<(f64, f64)>, attempts: &[Attempt]) -> PolarsResult<Stats> {
    let df = frame::attempts_with(
        attempts,
        Some(&[
            "version",
            "finished",
            "outcome",
            "time_to_outcome_s",
            "reason",
        ]),
    )?;
    let promoted = count_where(&df, outcome_is("promoted"))?;
    let rolled_back = count_where(&df, outcome_is("rolled_back"))?;
    let decided = promoted + rolled_back;
    // Switched back in their watch: users had them, so they are no rejected candidates.
    let in_watch = attempts
        .iter()
        .filter(|a| a.outcome == super::history::Outcome::RolledBack && a.exposure().is_some())
        .count() as u64;
    let before_users = rolled_back.saturating_sub(in_watch);

    let span_s = span.map(|(first, last)| last - first);
    let per = |seconds: f64| {
        span_s
            .filter(|s| *s > 0.0)
            .map(|s| promoted as f64 / (s / seconds))
    };
    let promotion_days = df
        .clone()
        .lazy()
        .filter(outcome_is("promoted").and(col("finished").is_not_null()))
        .select([(col("finished") / lit(86_400.0))
            .cast(DataType::Int64)
            .n_unique()
            .alias("days")])
        .collect()?;

    let exposures = attempts
        .iter()
        .filter(|a| a.rolled_back_at.is_some())
        .map(|a| Exposure {
            version: a.version.as_deref().map(String::from),
            promoted_at: a.finished,
            rolled_back_at: a.rolled_back_at,
            exposure_s: a.exposure(),
        })
        .collect();

    let users_had_them = attempts
        .iter()
        .filter(|a| a.exposure().is_some())
        .map(|a| {
            let in_watch = a.outcome == super::history::Outcome::RolledBack;
            UsersHadIt {
                version: a.version.as_deref().map(String::from),
                how: match (in_watch, a.rollout.is_some()) {
                    (true, true) => "as a canary of its rollout",
                    (true, false) => "in its watch",
                    (false, _) => "after promotion",
                },
                // Users had it from its switch: its exposure's start, however it ended.
                live_from: match in_watch {
                    true => a.finished.zip(a.exposure()).map(|(end, s)| end - s),
                    false => a.rolled_back_at.zip(a.exposure()).map(|(end, s)| end - s),
                },
                rolled_back_at: if in_watch {
                    a.finished
                } else {
                    a.rolled_back_at
                },
                exposure_s: a.exposure(),
                requests: a.served().and_then(|e| e.requests),
                failed: a.served().and_then(|e| e.failed),
                ended_by: a.served().map(|e| e.ended_by.clone()),
            }
        })
        .collect();

    Ok(Stats {
        records,
        attempts: attempts.len() as u64,
        promoted,
        rolled_back,
        escalated: count_where(&df, outcome_is("escalated"))?,
        unfinished: count_where(&df, outcome_is("unfinished"))?,
        refused: count_where(&df, outcome_is("refused"))?,
        candidate_rejection_rate: (decided > 0).then(|| before_users as f64 / decided as f64),
        span_s,
        promotions_per_day: per(86_400.0),
        promotions_per_week: per(7.0 * 86_400.0),
        days_with_a_promotion: promotion_days
            .column("days")?
            .get(0)?
            .extract::<u64>()
            .unwrap_or(0),
        time_to_promotion: spread(&df, "promoted")?,
        time_to_rollback: spread(&df, "rolled_back")?,
        rollbacks_by_reason: rollbacks_by(&df, "reason")?,
        rollbacks_by_version: rollbacks_by(&df, "version")?,
        rolled_back_after_promotion: exposures,
        rolled_back_before_users: before_users,
        rolled_back_after_users_had_them: users_had_them,
        rollouts: rollout_stats(attempts),
    })
}
