//! Which ids a job gets on a node whose agent says where its GPUs and CPUs sit: GPUs close
//! together (behind one PCIe switch, else on one NUMA node, else on as few NUMA nodes as can
//! hold them) and CPUs on the NUMA nodes of those GPUs, as Slurm's `--gpu-bind=closest`.
//! Counts never change here, only which of the free ids are taken.

use std::collections::{BTreeMap, BTreeSet};

use crate::state::Node;

/// Where a node's GPUs and CPUs sit.
#[derive(Debug, Clone, Default)]
pub(crate) struct Topology {
    /// GPU id → (NUMA node, PCIe switch).
    gpus: BTreeMap<u32, (Option<u32>, Option<u32>)>,
    /// CPU id → NUMA node.
    cpus: BTreeMap<u32, u32>,
}

impl Topology {
    /// The node's topology; `None` when its agent reported no place for anything.
    pub fn of(node: &Node) -> Option<Box<Topology>> {
        let gpus: BTreeMap<u32, (Option<u32>, Option<u32>)> = node
            .gpus
            .iter()
            .filter(|g| g.numa.is_some() || g.switch.is_some())
            .map(|g| (g.id, (g.numa, g.switch)))
            .collect();
        let cpus: BTreeMap<u32, u32> = if node.cpu_numa.len() == node.cpu_ids.len() {
            node.cpu_ids
                .iter()
                .copied()
                .zip(node.cpu_numa.iter().copied())
                .collect()
        } else {
            BTreeMap::new()
        };
        (!gpus.is_empty() || !cpus.is_empty()).then(|| Box::new(Topology { gpus, cpus }))
    }

    /// Takes `count` ids from `free` (ascending, stays ascending): the smallest PCIe switch
    /// group that holds them all, else the smallest NUMA group, else the largest NUMA groups
    /// first. Returns them ascending.
    pub fn take_gpus(&self, free: &mut Vec<u32>, count: usize) -> Vec<u32> {
        let place = |id: &u32| self.gpus.get(id).copied().unwrap_or((None, None));
        let chosen = best_group(free, count, |id| place(id).1)
            .or_else(|| best_group(free, count, |id| place(id).0))
            .unwrap_or_else(|| fewest_groups(free, count, |id| place(id).0));
        take(free, chosen)
    }

    /// NUMA nodes of these GPUs.
    pub fn numa_of_gpus(&self, ids: &[u32]) -> BTreeSet<u32> {
        ids.iter()
            .filter_map(|id| self.gpus.get(id).and_then(|p| p.0))
            .collect()
    }

    /// Takes `count` ids from `free`: first those on the NUMA nodes in `near` (the job's
    /// GPUs'), then, when `near` is empty, the smallest NUMA node that holds them all, else
    /// the largest nodes first. Returns them ascending.
    pub fn take_cpus(&self, free: &mut Vec<u32>, count: usize, near: &BTreeSet<u32>) -> Vec<u32> {
        let numa = |id: &u32| self.cpus.get(id).copied();
        let chosen = if near.is_empty() {
            best_group(free, count, numa).unwrap_or_else(|| fewest_groups(free, count, numa))
        } else {
            let mut order: Vec<u32> = free.clone();
            order.sort_by_key(|id| (!numa(id).is_some_and(|n| near.contains(&n)), *id));
            order.truncate(count);
            order
        };
        take(free, chosen)
    }
}

/// The ids of the smallest group (by `group_of`, ungrouped ids excluded) with at least
/// `count` free; the lowest ids of it. `None` when no group is big enough.
fn best_group(
    free: &[u32],
    count: usize,
    group_of: impl Fn(&u32) -> Option<u32>,
) -> Option<Vec<u32>> {
    let groups = group(free, group_of);
    let (_, ids) = groups
        .into_iter()
        .filter(|(_, ids)| ids.len() >= count)
        .min_by_key(|(g, ids)| (ids.len(), *g))?;
    Some(ids.into_iter().take(count).collect())
}

/// `count` ids taken from the largest groups first (ungrouped ids last), so that they span
/// as few groups as possible.
fn fewest_groups(free: &[u32], count: usize, group_of: impl Fn(&u32) -> Option<u32>) -> Vec<u32> {
    let mut groups: Vec<(Option<u32>, Vec<u32>)> = group(free, &group_of)
        .into_iter()
        .map(|(g, ids)| (Some(g), ids))
        .collect();
    groups.sort_by_key(|(g, ids)| (std::cmp::Reverse(ids.len()), *g));
    groups.push((
        None,
        free.iter()
            .copied()
            .filter(|id| group_of(id).is_none())
            .collect(),
    ));
    groups
        .into_iter()
        .flat_map(|(_, ids)| ids)
        .take(count)
        .collect()
}

fn group(free: &[u32], group_of: impl Fn(&u32) -> Option<u32>) -> BTreeMap<u32, Vec<u32>> {
    let mut groups: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for id in free {
        if let Some(g) = group_of(id) {
            groups.entry(g).or_default().push(*id);
        }
    }
    groups
}

/// Removes `chosen` from `free`; returns them ascending.
fn take(free: &mut Vec<u32>, mut chosen: Vec<u32>) -> Vec<u32> {
    chosen.sort_unstable();
    free.retain(|id| chosen.binary_search(id).is_err());
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tres::Gpu;

    /// Eight GPUs: 0–3 on NUMA 0 (0,1 behind switch 10; 2,3 behind switch 11), 4–7 on NUMA 1
    /// (4,5 behind 12; 6,7 behind 13). CPUs 0–7 on NUMA 0, 8–15 on NUMA 1.
    fn dgx_like() -> Topology {
        let gpus = (0..8)
            .map(|id| Gpu::new(id, "h100").at(Some(id / 4), Some(10 + id / 2)))
            .collect();
        let mut node = Node::new("n", 16, 1 << 40, gpus);
        node.cpu_numa = (0..16).map(|c| c / 8).collect();
        *Topology::of(&node).unwrap()
    }

    #[test]
    fn gpus_come_from_one_switch_then_one_numa_node() {
        let t = dgx_like();
        // 1 and 4 taken: two GPUs fit behind switch 11 (2,3) or 13 (6,7), not 10 or 12.
        let mut free = vec![0, 2, 3, 5, 6, 7];
        assert_eq!(t.take_gpus(&mut free, 2), [2, 3]);
        assert_eq!(free, [0, 5, 6, 7]);
        // Three: NUMA 1 holds 5,6,7; NUMA 0 only 0.
        assert_eq!(t.take_gpus(&mut free, 3), [5, 6, 7]);
        assert_eq!(free, [0]);
    }

    #[test]
    fn a_job_larger_than_any_numa_node_spans_as_few_as_possible() {
        let t = dgx_like();
        let mut free = vec![0, 4, 5, 6, 7];
        // Five: all four of NUMA 1 before the one on NUMA 0.
        assert_eq!(t.take_gpus(&mut free, 5), [0, 4, 5, 6, 7]);
        let mut free = vec![0, 1, 4, 5, 6];
        assert_eq!(t.take_gpus(&mut free, 4), [0, 4, 5, 6]);
    }

    #[test]
    fn a_single_gpu_goes_where_it_breaks_up_the_least() {
        let t = dgx_like();
        // Switch 10 has one free (1), switch 12 two: the lone one is taken.
        let mut free = vec![1, 4, 5];
        assert_eq!(t.take_gpus(&mut free, 1), [1]);
    }

    #[test]
    fn cpus_follow_the_gpus_numa_node() {
        let t = dgx_like();
        let mut free: Vec<u32> = (0..16).collect();
        let near = t.numa_of_gpus(&[6, 7]);
        assert_eq!(t.take_cpus(&mut free, 4, &near), [8, 9, 10, 11]);
        // More than NUMA 1 has left: the rest from NUMA 0.
        assert_eq!(t.take_cpus(&mut free, 6, &near), [0, 1, 12, 13, 14, 15]);
    }

    #[test]
    fn a_cpu_only_job_stays_on_one_numa_node_when_it_fits() {
        let t = dgx_like();
        let mut free: Vec<u32> = vec![0, 1, 2, 8, 9, 10, 11, 12];
        // Three fit on NUMA 0 (3 free) and NUMA 1 (5 free): the tighter one.
        assert_eq!(t.take_cpus(&mut free, 3, &BTreeSet::new()), [0, 1, 2]);
        // Six fit nowhere: NUMA 1's five, then one more.
        let mut free: Vec<u32> = vec![0, 1, 2, 8, 9, 10, 11, 12];
        assert_eq!(
            t.take_cpus(&mut free, 6, &BTreeSet::new()),
            [0, 8, 9, 10, 11, 12]
        );
    }

    #[test]
    fn no_topology_without_places() {
        let node = Node::new("n", 4, 1 << 30, Node::numbered_gpus(2, "a100"));
        assert!(Topology::of(&node).is_none());
    }
}
