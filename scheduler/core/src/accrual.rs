//! What running jobs have used so far, added to past usage for fair share.
//!
//! A pass adds to each association's decayed past usage what its running jobs have used since
//! they started (billing rate × seconds, each second decayed from when it was used, see
//! [`crate::fairshare::accrued`]), what a job's end then charges. The rate of a running job
//! never changes while it runs, so it is worked out once per job: [`Accruals`] holds, in the
//! order of the running list, each job's association (an index), rate and start. A whole
//! state's are read from its running jobs each pass ([`Accruals::of`]); a [`crate::Live`]
//! scheduler keeps its own as jobs start and end, so that a pass reads no running job's
//! strings.

use std::collections::BTreeMap;

use crate::partition::Partitions;
use crate::state::{Assoc, RunningJob, Time};

/// The running jobs' associations, rates and starts, in running order.
#[derive(Debug, Clone, Default)]
pub(crate) struct Accruals {
    /// Associations, each once.
    pub assocs: Vec<Assoc>,
    /// By association.
    index: BTreeMap<Assoc, usize>,
    /// Per running job: its association's index, its billing rate per second, its start.
    pub jobs: Vec<(usize, f64, Time)>,
}

impl Accruals {
    /// Those of `running`, billed by their partitions' weights.
    pub fn of(running: &[RunningJob], parts: &Partitions) -> Accruals {
        let mut out = Accruals::default();
        for job in running {
            // Jobs started together run for one association: looked up once per run.
            let same = out
                .jobs
                .last()
                .filter(|&&(a, _, _)| out.assocs[a] == job.assoc)
                .map(|&(a, _, _)| a);
            let a = match same {
                Some(a) => a,
                None => out.intern(&job.assoc),
            };
            out.jobs.push((a, rate(job, parts), job.start));
        }
        out
    }

    /// `job` joined the end of the running list.
    pub fn push(&mut self, job: &RunningJob, parts: &Partitions) {
        let a = self.intern(&job.assoc);
        self.jobs.push((a, rate(job, parts), job.start));
    }

    fn intern(&mut self, assoc: &Assoc) -> usize {
        if let Some(&a) = self.index.get(assoc) {
            return a;
        }
        self.assocs.push(assoc.clone());
        self.index.insert(assoc.clone(), self.assocs.len() - 1);
        self.assocs.len() - 1
    }

    /// Decayed past usage plus what running jobs have used by `now`, decayed with
    /// `half_life` (ms).
    pub fn usage_now(
        &self,
        now: Time,
        half_life: Time,
        past: &BTreeMap<Assoc, f64>,
    ) -> BTreeMap<Assoc, f64> {
        let mut usage = past.clone();
        // Consecutive jobs of one association are summed before their entry is written, the
        // same additions in the same order as adding each job to its entry.
        let mut last: Option<(usize, f64)> = None;
        for &(a, rate, start) in &self.jobs {
            let used = crate::fairshare::accrued(rate, start, now, half_life);
            match &mut last {
                Some((at, sum)) if *at == a => *sum += used,
                _ => {
                    if let Some((at, sum)) = last.take() {
                        settle(&mut usage, &self.assocs[at], sum);
                    }
                    let sum = usage.get(&self.assocs[a]).copied();
                    last = Some((a, sum.map_or(used, |s| s + used)));
                    if sum.is_none() {
                        usage.insert(self.assocs[a].clone(), 0.0);
                    }
                }
            }
        }
        if let Some((at, sum)) = last {
            settle(&mut usage, &self.assocs[at], sum);
        }
        usage
    }
}

/// `job`'s billing rate: its partition's weights applied to what it holds.
fn rate(job: &RunningJob, parts: &Partitions) -> f64 {
    let (cpus, memory, gpus) = job.allocs.iter().fold((0u64, 0u64, 0u64), |acc, a| {
        (
            acc.0 + a.cpu_ids.len() as u64,
            acc.1 + a.memory,
            acc.2 + a.gpu_ids.len() as u64,
        )
    });
    parts
        .billing(job.partition.as_deref())
        .rate(cpus, memory, gpus)
}

/// Writes an association's running sum back.
fn settle(usage: &mut BTreeMap<Assoc, f64>, assoc: &Assoc, sum: f64) {
    if let Some(u) = usage.get_mut(assoc) {
        *u = sum;
    }
}
