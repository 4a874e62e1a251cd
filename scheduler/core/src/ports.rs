//! Rendezvous ports: each starting job gets the lowest port of the configured range that no
//! running job holds on any of its nodes, so jobs sharing a node never collide on
//! `MASTER_PORT`, and the same state always gives the same ports.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;

use crate::plan::Start;
use crate::state::RunningJob;

/// Gives each start a port from `range`, none when every port is held on one of its nodes.
pub(crate) fn assign(range: &RangeInclusive<u16>, running: &[RunningJob], starts: &mut [Start]) {
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
    for start in starts.iter_mut() {
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
    }
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
        let running = vec![RunningJob {
            id: 1,
            assoc: Assoc::new("a", "u"),
            partition: None,
            qos: None,
            start: 0,
            time_limit: 0,
            allocs: vec![alloc("n1")],
            port: Some(29500),
        }];
        let mut starts = vec![
            start(2, &["n1"]),
            start(3, &["n2"]),
            start(4, &["n1", "n2"]),
        ];
        assign(&(29500..=29503), &running, &mut starts);
        let ports: Vec<Option<u16>> = starts.iter().map(|s| s.port).collect();
        // n1 holds 29500; 2 takes 29501 on n1; 3 is alone on n2; 4 spans both.
        assert_eq!(ports, [Some(29501), Some(29500), Some(29502)]);
        let mut full = vec![start(5, &["n1"]), start(6, &["n1"]), start(7, &["n1"])];
        assign(&(29500..=29502), &running, &mut full);
        let ports: Vec<Option<u16>> = full.iter().map(|s| s.port).collect();
        assert_eq!(ports, [Some(29501), Some(29502), None], "the range ran out");
    }
}
