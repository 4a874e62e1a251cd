//! What a replay is judged by.
//!
//! - **Utilization**: resource-seconds used (processors for SWF traces, GPUs for GPU workloads)
//!   over capacity × makespan (first submit to last end). Every policy runs the same work, so
//!   this differs only by how soon the last job ends; it is the figure the EASY literature uses.
//! - **Wait**: start − submit. Mean and max, seconds.
//! - **Bounded slowdown**: `max(1, (wait + run) / max(run, τ))`, τ = 10 s, so jobs of a few
//!   seconds do not dominate the mean (Feitelson et al., 1997).
//! - **Fairness**: Jain's index `(Σx)² / (n·Σx²)` over the accounts that ran jobs, of each
//!   account's **mean bounded slowdown**. Why this quantity: it is what a user feels (how much
//!   longer than its run a job takes), normalised for job length, and it does not depend on how
//!   much each account asks for. Share-normalised usage would score a scheduler down for an
//!   account that simply submitted less than its share, which no policy can fix; slowdown equal
//!   across accounts is what fair share is meant to buy when one account floods the queue.
//!   1.0 means every account sees the same slowdown; 1/n means one account takes all the delay.

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
    /// Mean wait, seconds.
    pub mean_wait_s: f64,
    /// Mean bounded slowdown (τ = 10 s).
    pub mean_bounded_slowdown: f64,
    /// Max wait, seconds.
    pub max_wait_s: f64,
    /// Jain's index of per-account mean bounded slowdown.
    pub jain_fairness: f64,
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
    Metrics {
        jobs: done.len(),
        utilization: if span > 0.0 { used / span } else { 0.0 },
        mean_wait_s: done.iter().map(Outcome::wait_s).sum::<f64>() / n,
        mean_bounded_slowdown: done.iter().map(Outcome::bounded_slowdown).sum::<f64>() / n,
        max_wait_s: done.iter().map(Outcome::wait_s).fold(0.0, f64::max),
        jain_fairness: jain(&xs),
        account_bounded_slowdown,
    }
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
