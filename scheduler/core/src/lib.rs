//! The scheduler's policy, as pure functions: no IO, no clock, no hash order.
//!
//! The controller builds a [`ClusterView`] from its state and calls [`schedule`] with the time;
//! it gets back one [`Decision`] per pending job and carries them out.
//!
//! ```
//! use wharf_api::Resources;
//! use wharf_core::{schedule, ClusterView, Decision, NodeView, PendingJob};
//!
//! let node = NodeView::new("n1", Resources { cpus: 4, memory: 8 << 30, gpus: 0 });
//! let job = PendingJob { id: 1, resources: Resources { cpus: 2, memory: 1 << 30, gpus: 0 }, submit_time: 0, priority: 0 };
//! let view = ClusterView { nodes: vec![node], pending: vec![job] };
//! let decisions = schedule(&view, 1_000);
//! assert!(matches!(&decisions[0], Decision::Start { node, .. } if node == "n1"));
//! ```

mod placement;
mod reason;

pub use placement::NodeView;
pub use reason::PendingReason;

use wharf_api::{JobId, Resources};

/// A job waiting to be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingJob {
    /// Job id.
    pub id: JobId,
    /// What it needs on its node.
    pub resources: Resources,
    /// Submit time, ms.
    pub submit_time: u64,
    /// Higher runs first.
    pub priority: i64,
}

/// The cluster as the scheduler sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// Nodes, with what is allocated on them.
    pub nodes: Vec<NodeView>,
    /// Jobs waiting.
    pub pending: Vec<PendingJob>,
}

/// What to do with one pending job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Start it now on `node` with these CPUs and GPUs.
    Start {
        /// Job id.
        job: JobId,
        /// Node name.
        node: String,
        /// CPU indices.
        cpu_ids: Vec<u32>,
        /// GPU indices.
        gpu_ids: Vec<u32>,
    },
    /// Leave it pending, for this reason.
    Wait {
        /// Job id.
        job: JobId,
        /// Why.
        reason: PendingReason,
    },
}

/// One scheduling pass: jobs in priority order (priority, then submit time, then id) start on
/// the best-fitting node. The first job that must wait for resources blocks the jobs behind it
/// (no backfill yet), so a large job is never starved by a stream of small ones. Jobs that no
/// node could ever hold do not block anyone.
pub fn schedule(view: &ClusterView, _now: u64) -> Vec<Decision> {
    let mut nodes = view.nodes.clone();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let mut order: Vec<&PendingJob> = view.pending.iter().collect();
    order.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(a.submit_time.cmp(&b.submit_time))
            .then(a.id.cmp(&b.id))
    });
    let mut blocked_by: Option<JobId> = None;
    let mut out = Vec::with_capacity(order.len());
    for job in order {
        if let Some(reason) = never_fits(&nodes, &job.resources) {
            out.push(Decision::Wait {
                job: job.id,
                reason,
            });
            continue;
        }
        if let Some(first) = blocked_by {
            out.push(Decision::Wait {
                job: job.id,
                reason: PendingReason::Priority { behind: first },
            });
            continue;
        }
        match placement::best_fit(&nodes, &job.resources) {
            Some(i) => {
                let (cpu_ids, gpu_ids) = nodes[i].allocate(&job.resources);
                out.push(Decision::Start {
                    job: job.id,
                    node: nodes[i].name.clone(),
                    cpu_ids,
                    gpu_ids,
                });
            }
            None => {
                blocked_by = Some(job.id);
                out.push(Decision::Wait {
                    job: job.id,
                    reason: PendingReason::Resources,
                });
            }
        }
    }
    out
}

/// `Some(reason)` when no up node, even empty, could hold `need`.
fn never_fits(nodes: &[NodeView], need: &Resources) -> Option<PendingReason> {
    let up: Vec<&NodeView> = nodes.iter().filter(|n| n.up).collect();
    if up.is_empty() {
        return Some(PendingReason::NoNodes);
    }
    if up.iter().any(|n| need.fits_in(&n.capacity)) {
        return None;
    }
    let largest = Resources {
        cpus: up.iter().map(|n| n.capacity.cpus).max().unwrap_or(0),
        memory: up.iter().map(|n| n.capacity.memory).max().unwrap_or(0),
        gpus: up.iter().map(|n| n.capacity.gpus).max().unwrap_or(0),
    };
    Some(PendingReason::TooLarge {
        need: *need,
        largest,
    })
}

#[cfg(test)]
mod tests;
