//! What a replay is judged by.
//!
//! - **Utilization**: resource-seconds used (processors for SWF traces, GPUs for GPU workloads)
//!   over capacity × makespan (first submit to last end). Every policy runs the same work, so
//!   this differs only by how soon the last job ends; it is the figure the EASY literature uses.
//!   Beside it, utilization over the **arrival span** (first to last submit): how well the
//!   machine is packed while work keeps coming, without the drain at the end, where one
//!   starved job can stretch the makespan alone.
//! - **Wait**: start − submit. Mean and max, seconds.
//! - **Bounded slowdown**: `max(1, (wait + run) / max(run, τ))`, τ = 10 s, so jobs of a few
//!   seconds do not dominate the mean (Feitelson et al., 1997).
//! - **Fairness** is Jain's index `(Σx)² / (n·Σx²)` over the accounts that ran jobs (1.0: all
//!   equal; 1/n: one account takes everything), of two quantities:
//!   - **usage over entitlement** (the one the goal is judged by): in each hour, every account
//!     is entitled to its max-min fair share of the cluster — capacity divided by shares, but
//!     never more than it asked for (the resource-time of its jobs pending or running in that
//!     hour), what it leaves over going to the others by shares. `x` is the account's
//!     resource-time used over its resource-time entitled, summed over the hours. This is the
//!     quantity fair share controls: an account that floods the queue is entitled to no more
//!     than its share while others wait, and one that asks little is not counted as wronged.
//!     Plain share-normalised usage would instead score a policy down for an account that
//!     submitted less than its share, which no scheduler can fix.
//!   - **per-account mean bounded slowdown**: what users feel. Reported beside it, but it is not
//!     a fairness target for fair share: fair share is meant to make the account that uses more
//!     than its share wait longer, which lowers this index by design.

use serde::Serialize;

use crate::workload::{Measure, Workload, MS};

/// Bounded-slowdown threshold τ, seconds.
pub const TAU_S: f64 = 10.0;

/// One finished job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Job id.
    pub id: u64,
    /// Account index.
    pub account: u32,
    /// Submit, start, end, ms.
    pub submit: u64,
    /// Start, ms.
    pub start: u64,
    /// End, ms.
    pub end: u64,
    /// Resource units it held (processors or GPUs, over all its nodes).
    pub units: u64,
}

impl Outcome {
    /// Wait, seconds.
    pub fn wait_s(&self) -> f64 {
        (self.start - self.submit) as f64 / MS as f64
    }

    /// Bounded slowdown with τ = [`TAU_S`].
    pub fn bounded_slowdown(&self) -> f64 {
        let run = (self.end - self.start) as f64 / MS as f64;
        ((self.wait_s() + run) / run.max(TAU_S)).max(1.0)
    }
}

/// The figures for one replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metrics {
    /// Jobs finished.
    pub jobs: usize,
    /// Utilization, 0–1.
    pub utilization: f64,
    /// Utilization from the first to the last submit, 0–1.
    pub utilization_arrivals: f64,
    /// Mean wait, seconds.
    pub mean_wait_s: f64,
    /// Mean bounded slowdown (τ = 10 s).
    pub mean_bounded_slowdown: f64,
    /// Max wait, seconds.
    pub max_wait_s: f64,
    /// Jain's index of per-account usage over max-min fair entitlement (hourly).
    pub jain_fairness: f64,
    /// Jain's index of per-account mean bounded slowdown.
    pub jain_bounded_slowdown: f64,
    /// Per-account usage over entitlement.
    pub account_usage_ratio: Vec<(String, f64)>,
    /// Per-account mean bounded slowdown, by account index (accounts without jobs omitted).
    pub account_bounded_slowdown: Vec<(String, f64)>,
}

/// Jain's fairness index of `xs`; 1.0 for an empty or all-zero list.
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sq == 0.0 {
        1.0
    } else {
        sum * sum / (xs.len() as f64 * sq)
    }
}

/// Computes the metrics of finished jobs on `workload`'s cluster.
pub fn compute(workload: &Workload, done: &[Outcome]) -> Metrics {
    let capacity: u64 = workload
        .nodes
        .iter()
        .map(|n| match workload.measure {
            Measure::Cpus => n.capacity.cpus as u64,
            Measure::Gpus => n.capacity.gpus as u64,
        })
        .sum();
    let first = done.iter().map(|o| o.submit).min().unwrap_or(0);
    let last = done.iter().map(|o| o.end).max().unwrap_or(0);
    let used: f64 = done
        .iter()
        .map(|o| o.units as f64 * (o.end - o.start) as f64)
        .sum();
    let span = (last - first) as f64 * capacity as f64;
    let last_submit = done.iter().map(|o| o.submit).max().unwrap_or(0);
    let used_arrivals: f64 = done
        .iter()
        .map(|o| {
            let (a, b) = (o.start.max(first), o.end.min(last_submit));
            o.units as f64 * b.saturating_sub(a) as f64
        })
        .sum();
    let span_arrivals = (last_submit - first) as f64 * capacity as f64;
    let n = done.len().max(1) as f64;
    let mut per_account: Vec<(f64, usize)> = vec![(0.0, 0); workload.accounts.len()];
    for o in done {
        if let Some(a) = per_account.get_mut(o.account as usize) {
            a.0 += o.bounded_slowdown();
            a.1 += 1;
        }
    }
    let account_bounded_slowdown: Vec<(String, f64)> = per_account
        .iter()
        .zip(&workload.accounts)
        .filter(|((_, k), _)| *k > 0)
        .map(|((s, k), a)| (a.name.clone(), s / *k as f64))
        .collect();
    let xs: Vec<f64> = account_bounded_slowdown.iter().map(|(_, x)| *x).collect();
    let account_usage_ratio = usage_over_entitlement(workload, done, capacity);
    let ratios: Vec<f64> = account_usage_ratio.iter().map(|(_, x)| *x).collect();
    Metrics {
        jobs: done.len(),
        utilization: if span > 0.0 { used / span } else { 0.0 },
        utilization_arrivals: if span_arrivals > 0.0 {
            used_arrivals / span_arrivals
        } else {
            0.0
        },
        mean_wait_s: done.iter().map(Outcome::wait_s).sum::<f64>() / n,
        mean_bounded_slowdown: done.iter().map(Outcome::bounded_slowdown).sum::<f64>() / n,
        max_wait_s: done.iter().map(Outcome::wait_s).fold(0.0, f64::max),
        jain_fairness: jain(&ratios),
        jain_bounded_slowdown: jain(&xs),
        account_bounded_slowdown,
        account_usage_ratio,
    }
}

/// Window of the entitlement computation, ms.
pub const FAIR_WINDOW_MS: u64 = 3_600_000;

/// Each account's resource-time used over its max-min fair entitlement, window by window.
fn usage_over_entitlement(
    workload: &Workload,
    done: &[Outcome],
    capacity: u64,
) -> Vec<(String, f64)> {
    let n = workload.accounts.len();
    let (Some(t0), Some(t1)) = (
        done.iter().map(|o| o.submit).min(),
        done.iter().map(|o| o.end).max(),
    ) else {
        return Vec::new();
    };
    let windows = ((t1 - t0) / FAIR_WINDOW_MS + 1) as usize;
    let mut demand = vec![vec![0.0f64; n]; windows];
    let mut used = vec![vec![0.0f64; n]; windows];
    let spread = |grid: &mut Vec<Vec<f64>>, a: usize, from: u64, to: u64, units: u64| {
        let mut t = from;
        while t < to {
            let w = ((t - t0) / FAIR_WINDOW_MS) as usize;
            let w_end = t0 + (w as u64 + 1) * FAIR_WINDOW_MS;
            let upto = to.min(w_end);
            grid[w][a] += units as f64 * (upto - t) as f64;
            t = upto;
        }
    };
    for o in done {
        let a = o.account as usize;
        if a < n {
            spread(&mut demand, a, o.submit, o.end, o.units);
            spread(&mut used, a, o.start, o.end, o.units);
        }
    }
    let shares: Vec<f64> = workload
        .accounts
        .iter()
        .map(|a| a.shares.max(1) as f64)
        .collect();
    let mut total_used = vec![0.0; n];
    let mut total_entitled = vec![0.0; n];
    for w in 0..windows {
        let e = water_fill(capacity as f64 * FAIR_WINDOW_MS as f64, &shares, &demand[w]);
        for a in 0..n {
            total_used[a] += used[w][a];
            total_entitled[a] += e[a];
        }
    }
    (0..n)
        .filter(|&a| total_entitled[a] > 0.0)
        .map(|a| {
            (
                workload.accounts[a].name.clone(),
                total_used[a] / total_entitled[a],
            )
        })
        .collect()
}

/// Max-min fair division of `capacity` by `shares`, no one getting more than its `demand`.
pub fn water_fill(capacity: f64, shares: &[f64], demand: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..shares.len()).collect();
    // Fill the accounts that ask least per share first; what they leave goes to the rest.
    order.sort_by(|&a, &b| (demand[a] / shares[a]).total_cmp(&(demand[b] / shares[b])));
    let mut out = vec![0.0; shares.len()];
    let mut left = capacity;
    let mut shares_left: f64 = shares.iter().sum();
    for a in order {
        let fair = left * shares[a] / shares_left;
        out[a] = demand[a].min(fair);
        left -= out[a];
        shares_left -= shares[a];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_bounds() {
        assert_eq!(jain(&[2.0, 2.0, 2.0]), 1.0);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn water_fill_is_max_min() {
        let e = water_fill(12.0, &[1.0, 1.0, 1.0], &[1.0, 100.0, 100.0]);
        assert_eq!(e, vec![1.0, 5.5, 5.5]);
        let e = water_fill(12.0, &[2.0, 1.0], &[100.0, 100.0]);
        assert_eq!(e, vec![8.0, 4.0]);
        let e = water_fill(12.0, &[1.0, 1.0], &[0.0, 3.0]);
        assert_eq!(e, vec![0.0, 3.0]);
    }

    #[test]
    fn bounded_slowdown_uses_tau() {
        let o = |wait: u64, run: u64| Outcome {
            id: 1,
            account: 0,
            submit: 0,
            start: wait * MS,
            end: (wait + run) * MS,
            units: 1,
        };
        assert_eq!(o(0, 1).bounded_slowdown(), 1.0);
        assert_eq!(o(99, 1).bounded_slowdown(), 10.0); // (99 + 1) / 10
        assert_eq!(o(100, 100).bounded_slowdown(), 2.0);
    }
}
