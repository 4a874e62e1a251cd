//! Rendezvous ports: each starting job gets the lowest port of the configured range that no
//! running job holds on any of its nodes, so jobs sharing a node never collide on
//! `MASTER_PORT`, and the same state always gives the same ports. When none is free, a job on
//! one node still starts (without `MASTER_PORT`: a single-node run can pick its own), but a job
//! on several nodes cannot meet its peers without one: it stays pending, and the pass's table
//! is thrown away after the pass, so what it would have held is free again at the next.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

use crate::plan::{Start, Waiting};
use crate::state::RunningJob;
use crate::PendingReason;

/// Gives each start a port from `range`, none when every port is held on one of its nodes;
/// such a start on several nodes is taken out of `starts` and returned as waiting.
pub(crate) fn assign(
    range: &RangeInclusive<u16>,
    running: &[RunningJob],
    starts: &mut Vec<Start>,
) -> Vec<Waiting> {
    let mut held: BTreeMap<&str, BTreeSet<u16>> = BTreeMap::new();
    for job in running {
        if let Some(port) = job.port {
            for a in &job.allocs {
                held.entry(a.node.as_str()).or_default().insert(port);
            }
        }
    }
    let mut taken: BTreeMap<String, BTreeSet<u16>> = held
        .into_iter()
        .map(|(node, ports)| (node.to_string(), ports))
        .collect();
    let mut waiting = Vec::new();
    starts.retain_mut(|start| {
        let free = range.clone().find(|p| {
            start
                .allocs
                .iter()
                .all(|a| taken.get(&a.node).is_none_or(|ports| !ports.contains(p)))
        });
        if let Some(port) = free {
            for a in &start.allocs {
                taken.entry(a.node.clone()).or_default().insert(port);
            }
        }
        start.port = free;
        let stays = free.is_some() || start.allocs.len() <= 1;
        if !stays {
            waiting.push(Waiting {
                job: start.job,
                reason: PendingReason::RendezvousPorts {
                    first: *range.start(),
                    last: *range.end(),
                },
                estimated_start: None,
            });
        }
        stays
    });
    waiting
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Alloc, Assoc};

    fn alloc(node: &str) -> Alloc {
        Alloc {
            node: node.into(),
            cpu_ids: vec![],
            gpu_ids: vec![],
            memory: 0,
        }
    }

    /// Job 1, running on n1 with port 29500.
    fn holding_29500_on_n1() -> RunningJob {
        RunningJob {
            id: 1,
            assoc: Assoc::new("a", "u"),
            partition: None,
            qos: None,
            start: 0,
            time_limit: 0,
            allocs: vec![alloc("n1")],
            port: Some(29500),
        }
    }

    fn start(job: u64, nodes: &[&str]) -> Start {
        Start {
            job,
            allocs: nodes.iter().map(|n| alloc(n)).collect(),
            time_limit: 0,
            port: None,
        }
    }

    #[test]
    fn jobs_sharing_a_node_never_share_a_port() {
        let running = vec![holding_29500_on_n1()];
        let mut starts = vec![
            start(2, &["n1"]),
            start(3, &["n2"]),
            start(4, &["n1", "n2"]),
        ];
        assert!(assign(&(29500..=29503), &running, &mut starts).is_empty());
        let ports: Vec<Option<u16>> = starts.iter().map(|s| s.port).collect();
        // n1 holds 29500; 2 takes 29501 on n1; 3 is alone on n2; 4 spans both.
        assert_eq!(ports, [Some(29501), Some(29500), Some(29502)]);
        let mut full = vec![start(5, &["n1"]), start(6, &["n1"]), start(7, &["n1"])];
        assert!(assign(&(29500..=29502), &running, &mut full).is_empty());
        let ports: Vec<Option<u16>> = full.iter().map(|s| s.port).collect();
        assert_eq!(ports, [Some(29501), Some(29502), None], "the range ran out");
    }

    #[test]
    fn a_gang_without_a_free_port_waits_and_a_one_node_job_starts_without_one() {
        let running = vec![holding_29500_on_n1()];
        // 2 takes the last port on n1; the gang 3 finds none free on both n1 and n2 and
        // waits; 4, alone on n1, starts without a port; 5, a gang on n2 and n3, still gets
        // one (what 3 would have held was never taken).
        let mut starts = vec![
            start(2, &["n1"]),
            start(3, &["n1", "n2"]),
            start(4, &["n1"]),
            start(5, &["n2", "n3"]),
        ];
        let waiting = assign(&(29500..=29501), &running, &mut starts);
        let left: Vec<(u64, Option<u16>)> = starts.iter().map(|s| (s.job, s.port)).collect();
        assert_eq!(left, [(2, Some(29501)), (4, None), (5, Some(29500))]);
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].job, 3);
        assert_eq!(
            waiting[0].reason,
            PendingReason::RendezvousPorts {
                first: 29500,
                last: 29501
            }
        );
        let words = waiting[0].reason.to_string();
        assert!(
            words.starts_with("Resources: every rendezvous port (29500-29501")
                && words.contains("rendezvous_ports"),
            "{words}"
        );
    }
}
