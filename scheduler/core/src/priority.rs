//! Multifactor priority, as Slurm's `priority/multifactor`: each factor is normalised to [0, 1]
//! and weighted by an integer; nice is subtracted.
//!
//! - age: time since submit (or begin time, when later), capped at `max_age`;
//! - fair share: the Fair Tree factor of the job's association ([`crate::fairshare`]);
//! - job size: the larger of its share of the partition's CPUs and of its GPUs (or one minus
//!   that with `favor_small`);
//! - width: the cube of that share, whatever `favor_small` says: near 0 for jobs of a quarter
//!   of the partition or less (at most 1/64), 1/8 at half, 1 for all of it. A job that needs
//!   most of a partition costs a drain of it, and this term lets such jobs go ahead of the
//!   small jobs that would otherwise fill the partition between two drains, so that one wide
//!   job starts on the nodes the last one left (docs/scheduling.md, "Wide jobs back to
//!   back");
//! - partition: its partition's tier against the highest tier;
//! - QoS: its QoS priority against the highest QoS priority.
//!
//! A priority an admin fixed ([`crate::PendingJob::priority`]) replaces the sum; the factors
//! are still worked out, for `wharf show`.

use std::collections::BTreeMap;

use crate::config::Config;
use crate::partition::PartView;
use crate::plan::Priority;
use crate::state::{Assoc, PendingJob, Time};

/// What the factors are normalised against, computed once per pass.
pub(crate) struct Scale<'a> {
    pub config: &'a Config,
    pub fairshare: &'a BTreeMap<Assoc, f64>,
    pub max_tier: u32,
    pub max_qos: u32,
}

impl Scale<'_> {
    /// The priority of `job` in partition `part` at `now`.
    pub fn priority(&self, job: &PendingJob, part: Option<&PartView>, now: Time) -> Priority {
        let c = self.config;
        let since = job.begin.unwrap_or(0).max(job.submit);
        let age = if c.max_age == 0 {
            1.0
        } else {
            (now.saturating_sub(since).min(c.max_age)) as f64 / c.max_age as f64
        };
        let fairshare = self.fairshare.get(&job.assoc).copied().unwrap_or(1.0);
        let share = part.map_or(0.0, |p| share(job, p));
        let job_size = if c.favor_small { 1.0 - share } else { share };
        let width = share.powi(3);
        let partition = match (part, self.max_tier) {
            (Some(p), t) if t > 0 => p.tier as f64 / t as f64,
            _ => 0.0,
        };
        let qos_prio = job
            .qos
            .as_deref()
            .and_then(|q| c.qos.iter().find(|d| d.name == q))
            .map_or(0, |d| d.priority);
        let qos = if self.max_qos > 0 {
            qos_prio as f64 / self.max_qos as f64
        } else {
            0.0
        };
        let w = &c.weights;
        let sum = w.age as f64 * age
            + w.fairshare as f64 * fairshare
            + w.job_size as f64 * job_size
            + w.width as f64 * width
            + w.partition as f64 * partition
            + w.qos as f64 * qos;
        let computed = (sum.round() as i64).saturating_sub(job.nice as i64).max(0) as u64;
        Priority {
            value: job.priority.unwrap_or(computed),
            fixed: job.priority.is_some(),
            age,
            fairshare,
            job_size,
            width,
            partition,
            qos,
            nice: job.nice,
        }
    }
}

/// The job's share of partition `p`: the larger of its share of the CPUs and of the GPUs.
fn share(job: &PendingJob, p: &PartView) -> f64 {
    let n = job.request.node_count() as f64;
    let cpu = if p.cpus > 0 {
        n * job.request.cpus as f64 / p.cpus as f64
    } else {
        0.0
    };
    let gpu = if p.gpus > 0 {
        n * job.request.gpus as f64 / p.gpus as f64
    } else {
        0.0
    };
    cpu.max(gpu).clamp(0.0, 1.0)
}
