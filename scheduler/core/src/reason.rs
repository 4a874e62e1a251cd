//! Why a job is pending, in words a user can act on.

use std::fmt;

use wharf_api::resources::format_memory;
use wharf_api::{JobId, Resources};

/// Why a job has not started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PendingReason {
    /// No node is up.
    NoNodes,
    /// Nodes exist that could hold it, but not enough is free now.
    Resources,
    /// A job ahead of it in the queue is waiting for resources.
    Priority {
        /// The job at the head of the queue.
        behind: JobId,
    },
    /// No up node could ever hold it.
    TooLarge {
        /// What it asks for.
        need: Resources,
        /// The largest of each resource on any node.
        largest: Resources,
    },
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingReason::NoNodes => {
                write!(f, "NoNodes: no node is up; is `wharf agent` running?")
            }
            PendingReason::Resources => {
                write!(f, "Resources: waiting for CPUs, memory or GPUs to free up")
            }
            PendingReason::Priority { behind } => {
                write!(
                    f,
                    "Priority: queued behind job {behind}, which is waiting for resources"
                )
            }
            PendingReason::TooLarge { need, largest } => {
                let mut parts = Vec::new();
                if need.cpus > largest.cpus {
                    parts.push(format!(
                        "{} CPUs (largest node has {})",
                        need.cpus, largest.cpus
                    ));
                }
                if need.memory > largest.memory {
                    parts.push(format!(
                        "{} memory (largest node has {})",
                        format_memory(need.memory),
                        format_memory(largest.memory)
                    ));
                }
                if need.gpus > largest.gpus {
                    parts.push(format!(
                        "{} GPUs (largest node has {})",
                        need.gpus, largest.gpus
                    ));
                }
                if parts.is_empty() {
                    parts.push("more than any single node has".into());
                }
                write!(
                    f,
                    "TooLarge: no node can hold {}; ask for less or wait for bigger nodes",
                    parts.join(", ")
                )
            }
        }
    }
}
