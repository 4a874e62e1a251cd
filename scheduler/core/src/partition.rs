//! Partitions: which nodes a job may use, its time limit after defaults, and the limits that
//! keep it pending whatever other jobs do.

use std::collections::BTreeMap;

use crate::config::{Billing, Config, PartitionState, PreemptMode};
use crate::state::{Node, NodeState, PendingJob, Time};
use crate::PendingReason;

/// Name of the partition made when none is configured.
pub const DEFAULT_PARTITION: &str = "default";

/// A partition resolved against the nodes of this pass.
#[derive(Debug, Clone)]
pub(crate) struct PartView {
    pub name: String,
    pub nodes: Vec<usize>,
    pub state: PartitionState,
    pub tier: u32,
    pub max_time: Option<Time>,
    pub default_time: Option<Time>,
    pub max_nodes: Option<u32>,
    pub billing: Billing,
    pub preempt_mode: PreemptMode,
    /// Total CPUs and GPUs of its nodes, for the job size factor.
    pub cpus: u64,
    pub gpus: u64,
}

/// All partitions of a pass.
#[derive(Debug, Clone)]
pub(crate) struct Partitions {
    pub parts: Vec<PartView>,
    by_name: BTreeMap<String, usize>,
    default: usize,
    pub max_tier: u32,
}

impl Partitions {
    /// Resolves the configured partitions (or one `default` partition over every node).
    pub fn resolve(config: &Config, nodes: &[Node]) -> Partitions {
        let index: BTreeMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        let mut parts = Vec::new();
        for p in config.partitions_or_default().iter() {
            let members: Vec<usize> = if p.nodes.is_empty() {
                (0..nodes.len()).collect()
            } else {
                let mut m: Vec<usize> = p
                    .nodes
                    .iter()
                    .filter_map(|n| index.get(n.as_str()).copied())
                    .collect();
                m.sort_unstable();
                m.dedup();
                m
            };
            parts.push(view(&p.name, members, nodes, p));
        }
        let by_name: BTreeMap<String, usize> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        let default = by_name
            .get(config.default_partition_name())
            .copied()
            .unwrap_or(0);
        let max_tier = parts.iter().map(|p| p.tier).max().unwrap_or(0);
        Partitions {
            parts,
            by_name,
            default,
            max_tier,
        }
    }

    /// The partition `job` runs in, and its time limit after defaults; or why it cannot start
    /// for reasons of its partition alone.
    pub fn admit(&self, job: &PendingJob, config: &Config) -> Result<(usize, Time), PendingReason> {
        let Some(idx) = self.of(job) else {
            return Err(PendingReason::InvalidPartition {
                partition: job.partition.clone().unwrap_or_default(),
            });
        };
        let p = &self.parts[idx];
        match p.state {
            PartitionState::Down => {
                return Err(PendingReason::PartitionDown {
                    partition: p.name.clone(),
                })
            }
            PartitionState::Inactive => {
                return Err(PendingReason::PartitionInactive {
                    partition: p.name.clone(),
                })
            }
            PartitionState::Up | PartitionState::Drain => {}
        }
        // A job that gives none gets the partition's default, never over its maximum.
        let limit = match job.time_limit {
            Some(t) => t.max(1),
            None => default_limit(p.default_time, p.max_time, config.default_time),
        };
        if let Some(max) = p.max_time {
            if limit > max {
                return Err(PendingReason::PartitionTimeLimit { limit, max });
            }
        }
        // The partition's size is checked against node shapes later (backfill::never_fits).
        if let Some(max) = p.max_nodes {
            if job.request.node_count() > max {
                return Err(PendingReason::PartitionNodeLimit {
                    nodes: job.request.node_count(),
                    max,
                });
            }
        }
        Ok((idx, limit))
    }

    /// The partition `job` asks for (the default one when it names none), if it exists.
    pub fn of(&self, job: &PendingJob) -> Option<usize> {
        self.index(job.partition.as_deref())
    }

    /// Index of the partition named `name` (the default one for `None`); `None` for a name
    /// no partition has (one removed from the config since the job was submitted).
    fn index(&self, name: Option<&str>) -> Option<usize> {
        match name {
            None => Some(self.default),
            Some(name) => self.by_name.get(name).copied(),
        }
    }

    /// Billing weights of the partition named `name` (the default one for `None`; the
    /// default weights for a partition that no longer exists).
    pub fn billing(&self, name: Option<&str>) -> Billing {
        self.named(name).map(|p| p.billing).unwrap_or_default()
    }

    /// The partition named `name` (the default one for `None`), if it exists.
    pub fn named(&self, name: Option<&str>) -> Option<&PartView> {
        self.index(name).and_then(|i| self.parts.get(i))
    }
}

fn view(name: &str, members: Vec<usize>, nodes: &[Node], p: &crate::config::Partition) -> PartView {
    let cpus = members.iter().map(|&i| nodes[i].cpu_ids.len() as u64).sum();
    let gpus = members.iter().map(|&i| nodes[i].gpus.len() as u64).sum();
    PartView {
        name: name.into(),
        nodes: members,
        state: p.state,
        tier: p.priority_tier,
        max_time: p.max_time,
        default_time: p.default_time,
        max_nodes: p.max_nodes,
        billing: p.billing,
        preempt_mode: p.preempt_mode,
        cpus,
        gpus,
    }
}

impl Billing {
    /// Billing units per second for holding this much.
    pub fn rate(&self, cpus: u64, memory: u64, gpus: u64) -> f64 {
        self.cpu * cpus as f64
            + self.memory_gib * memory as f64 / (1u64 << 30) as f64
            + self.gpu * gpus as f64
    }
}

/// True when `state` lets a node take new work.
pub(crate) fn takes_work(state: NodeState) -> bool {
    state == NodeState::Up
}

/// The time limit of a job that gives none: its partition's `default_time`, else `site`, never
/// over the partition's `max_time`, at least 1 ms.
pub(crate) fn default_limit(
    default_time: Option<Time>,
    max_time: Option<Time>,
    site: Time,
) -> Time {
    let limit = default_time.unwrap_or(site);
    max_time.map_or(limit, |max| limit.min(max)).max(1)
}
