//! The one place the simulator meets `wharf-core`: builds the core's view of the cluster from
//! the simulator's state, calls the core, and turns its decisions into [`Start`]s. No policy is
//! decided here; FCFS, EASY and Wharf's policy are the core's own configurations.

use std::fmt;

use wharf_core::{schedule, ClusterView, Decision, NodeView, PendingJob};

use crate::engine::{Placement, SimError, Snapshot, Start};
use crate::workload::{SimJob, Workload};

/// A scheduling policy, as a configuration of the core.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// First come, first served: priority by submit time, head-of-line blocking, no backfill.
    Fcfs,
    /// EASY backfill: submit-time order, one reservation for the head job.
    Easy,
    /// Wharf's configured policy.
    Wharf,
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Fcfs => "fcfs",
            Policy::Easy => "easy",
            Policy::Wharf => "wharf",
        })
    }
}

/// Drives the core for one replay.
#[derive(Debug)]
pub struct Driver {
    policy: Policy,
}

impl Driver {
    /// A driver for `policy` on `workload`.
    pub fn new(policy: Policy, workload: &Workload) -> Result<Driver, SimError> {
        if policy != Policy::Fcfs {
            return Err(SimError::Unsupported {
                policy,
                what: "this core has no backfill or priority factors".into(),
            });
        }
        if workload.jobs.iter().any(|j| j.nodes > 1) {
            return Err(SimError::Unsupported {
                policy,
                what: "this core places jobs on one node only".into(),
            });
        }
        Ok(Driver { policy })
    }

    /// Tells the core's accounting that a job ended (fair-share usage).
    pub fn job_ended(&mut self, _job: &SimJob, _start: u64, _end: u64) {}

    /// One scheduling pass at `now`.
    pub fn pass(&mut self, snap: &Snapshot<'_>, now: u64) -> Result<Vec<Start>, SimError> {
        let _ = self.policy;
        let nodes: Vec<NodeView> = snap
            .nodes
            .iter()
            .map(|n| {
                let mut v = NodeView::new(&n.spec.name, n.spec.capacity);
                v.used_cpus = n.used_cpus.clone();
                v.used_gpus = n.used_gpus.clone();
                v.used_memory = n.used_memory;
                v
            })
            .collect();
        let pending = snap
            .pending
            .values()
            .map(|&i| {
                let j = &snap.workload.jobs[i];
                PendingJob {
                    id: j.id,
                    resources: j.per_node,
                    submit_time: j.submit,
                    priority: 0,
                }
            })
            .collect();
        let view = ClusterView { nodes, pending };
        let by_name: std::collections::BTreeMap<&str, usize> = snap
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.spec.name.as_str(), i))
            .collect();
        let mut starts = Vec::new();
        for d in schedule(&view, now) {
            if let Decision::Start {
                job,
                node,
                cpu_ids,
                gpu_ids,
            } = d
            {
                let Some(&node) = by_name.get(node.as_str()) else {
                    return Err(SimError::BadPlan {
                        now,
                        what: format!("job {job} placed on unknown node {node}"),
                    });
                };
                starts.push(Start {
                    job,
                    placements: vec![Placement {
                        node,
                        cpu_ids,
                        gpu_ids,
                    }],
                });
            }
        }
        Ok(starts)
    }
}
