//! The environment that lets a job's ranks find each other whatever its image: PyTorch's
//! (`MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`, `RANK`, `LOCAL_RANK`, ...) and Slurm's
//! (`SLURM_JOB_NODELIST` in compressed form, `SLURM_NNODES`, `SLURM_PROCID`, ...), from the
//! controller's rendezvous, and the job's hostfile. A node runs `tasks_per_node` tasks of the
//! job, each in its own sandbox: the task with local index `l` on the node of rank `n` has
//! global rank `n * tasks_per_node + l`.

use wharf_api::wire::Rendezvous;

/// Which task of its node's a sandbox runs, and the shape of the tasks there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Task {
    /// Tasks on every node of the job (1 or more).
    pub per_node: u32,
    /// This task's index on its node, from 0.
    pub local: u32,
    /// CPUs it has.
    pub cpus: u32,
}

impl Task {
    /// The only task of its node, with `cpus`.
    pub fn single(cpus: u32) -> Task {
        Task {
            per_node: 1,
            local: 0,
            cpus,
        }
    }

    /// Its global rank on the node of rank `node_rank`.
    pub fn rank(&self, node_rank: u32) -> u64 {
        u64::from(node_rank) * u64::from(self.per_node.max(1)) + u64::from(self.local)
    }
}

/// Slurm's `SLURM_TASKS_PER_NODE`: `N` on one node, `N(xM)` on M nodes with N tasks each.
pub fn tasks_per_node(per_node: u32, nodes: usize) -> String {
    if nodes > 1 {
        format!("{per_node}(x{nodes})")
    } else {
        per_node.to_string()
    }
}

/// The rendezvous variables for `task` on node `r.node_rank` of a job that has been requeued
/// `restarts` times. Only the restart count when the order carries no nodes (sent by an older
/// controller).
///
/// In a step's order (`r.step`), `r.nodes` are the step's: as under Slurm's `srun`, the
/// ranks, `SLURM_NODELIST`, `SLURM_NNODES` and `SLURM_STEP_*` are the step's, while
/// `SLURM_JOB_NODELIST`, `SLURM_JOB_NUM_NODES` and `SLURM_RESTART_COUNT` stay the job's.
pub fn rendezvous(r: &Rendezvous, task: Task, restarts: u32) -> Vec<(String, String)> {
    let Some(first) = r.nodes.first() else {
        return restart_count(restarts);
    };
    let per_node = task.per_node.max(1);
    let nnodes = r.nodes.len().to_string();
    let ntasks = (r.nodes.len() as u64 * u64::from(per_node)).to_string();
    let ntasks_all = ntasks.clone();
    let names: Vec<&str> = r.nodes.iter().map(|p| p.name.as_str()).collect();
    let nodelist = wharf_api::hostlist::compress(&names);
    let node_rank = r.node_rank.to_string();
    let rank = task.rank(r.node_rank).to_string();
    let local = task.local.to_string();
    let mut env: Vec<(&str, String)> = vec![
        ("MASTER_ADDR", first.address.clone()),
        ("WORLD_SIZE", ntasks.clone()),
        ("NODE_RANK", node_rank.clone()),
        ("GROUP_RANK", node_rank.clone()),
        ("RANK", rank.clone()),
        ("LOCAL_RANK", local.clone()),
        ("LOCAL_WORLD_SIZE", per_node.to_string()),
        ("WHARF_NODELIST", nodelist.clone()),
        ("WHARF_NODE_RANK", node_rank.clone()),
        ("SLURM_NODELIST", nodelist.clone()),
        ("SLURM_NNODES", nnodes.clone()),
        ("SLURM_NODEID", node_rank),
        ("SLURM_PROCID", rank),
        ("SLURM_LOCALID", local),
        ("SLURM_NTASKS", ntasks.clone()),
        ("SLURM_NPROCS", ntasks),
        ("SLURM_NTASKS_PER_NODE", per_node.to_string()),
        (
            "SLURM_TASKS_PER_NODE",
            tasks_per_node(per_node, r.nodes.len()),
        ),
        ("SLURM_CPUS_PER_TASK", task.cpus.to_string()),
    ];
    if let Some(port) = r.port {
        env.push(("MASTER_PORT", port.to_string()));
    }
    let restarts = match &r.step {
        None => {
            env.push(("SLURM_JOB_NODELIST", nodelist));
            env.push(("SLURM_JOB_NUM_NODES", nnodes));
            restarts
        }
        Some(step) => {
            let id = step.id.to_string();
            env.extend([
                (
                    "SLURM_JOB_NODELIST",
                    wharf_api::hostlist::compress(&step.job_nodes),
                ),
                ("SLURM_JOB_NUM_NODES", step.job_nodes.len().to_string()),
                ("SLURM_STEP_ID", id.clone()),
                ("SLURM_STEPID", id.clone()),
                ("WHARF_STEP_ID", id),
                ("SLURM_STEP_NODELIST", nodelist),
                ("SLURM_STEP_NUM_NODES", nnodes),
                ("SLURM_STEP_NUM_TASKS", ntasks_all),
            ]);
            step.job_restarts
        }
    };
    let mut env: Vec<(String, String)> = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    env.extend(restart_count(restarts));
    env
}

/// `SLURM_RESTART_COUNT` (and Wharf's own name for it): the job's requeues so far.
fn restart_count(restarts: u32) -> Vec<(String, String)> {
    ["WHARF_RESTART_COUNT", "SLURM_RESTART_COUNT"]
        .map(|k| (k.to_string(), restarts.to_string()))
        .to_vec()
}

/// The job's hostfile, in the form MPI launchers (`mpirun --hostfile`) and DeepSpeed
/// (`--hostfile`) read: one line per node in rank order, `ADDRESS slots=N` with N the tasks per
/// node. The address comes first, not the name: it is the node's address on the fabric
/// interface, which the other ranks reach, where a node's name may not resolve inside an
/// image. `None` when the order carries no nodes.
pub fn hostfile(r: &Rendezvous, per_node: u32) -> Option<String> {
    if r.nodes.is_empty() {
        return None;
    }
    let slots = per_node.max(1);
    Some(
        r.nodes
            .iter()
            .map(|p| format!("{} slots={slots}\n", p.address))
            .collect(),
    )
}

/// The share of a node's `ids` (CPU or GPU ids, in order) that task `local` of `per_node` gets:
/// `each` ids in turn, when every task gets its own; all of them when `each` is `None`. A node
/// given fewer ids than its tasks need (an order from an older controller) shares them all.
pub fn share(ids: &[u32], per_node: u32, local: u32, each: Option<u32>) -> Vec<u32> {
    let Some(each) = each.filter(|&e| e > 0) else {
        return ids.to_vec();
    };
    let (each, local) = (each as usize, local as usize);
    if ids.len() < each * per_node.max(1) as usize {
        return ids.to_vec();
    }
    ids[local * each..(local + 1) * each].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use wharf_api::wire::Peer;

    fn peers(names: &[&str]) -> Vec<Peer> {
        names
            .iter()
            .map(|n| Peer {
                name: n.to_string(),
                address: format!("10.0.0.{}", &n[3..]),
            })
            .collect()
    }

    #[test]
    fn a_rank_learns_its_peers_its_place_and_the_first_nodes_address() {
        let r = Rendezvous {
            nodes: peers(&["gpu01", "gpu02", "gpu03", "gpu04"]),
            node_rank: 2,
            port: Some(29501),
            step: None,
        };
        let env: BTreeMap<String, String> =
            rendezvous(&r, Task::single(8), 0).into_iter().collect();
        assert_eq!(env["MASTER_ADDR"], "10.0.0.01");
        assert_eq!(env["MASTER_PORT"], "29501");
        assert_eq!(env["WORLD_SIZE"], "4");
        assert_eq!(env["RANK"], "2");
        assert_eq!(env["NODE_RANK"], "2");
        assert_eq!(env["LOCAL_RANK"], "0");
        assert_eq!(env["SLURM_JOB_NODELIST"], "gpu[01-04]");
        assert_eq!(env["SLURM_NNODES"], "4");
        assert_eq!(env["SLURM_NODEID"], "2");
        assert_eq!(env["SLURM_PROCID"], "2");
        assert_eq!(env["SLURM_TASKS_PER_NODE"], "1(x4)");
        assert_eq!(env["SLURM_CPUS_PER_TASK"], "8");
    }

    #[test]
    fn one_node_and_no_port_and_no_nodes() {
        let r = Rendezvous {
            nodes: peers(&["gpu07"]),
            node_rank: 0,
            port: None,
            step: None,
        };
        let env: BTreeMap<String, String> =
            rendezvous(&r, Task::single(1), 0).into_iter().collect();
        assert_eq!(env["WORLD_SIZE"], "1");
        assert_eq!(env["SLURM_TASKS_PER_NODE"], "1");
        assert!(!env.contains_key("MASTER_PORT"), "no port, no MASTER_PORT");
        let bare = rendezvous(&Rendezvous::default(), Task::single(1), 2);
        assert_eq!(bare, restart_count(2), "no nodes: only the restart count");
    }

    #[test]
    fn a_steps_tasks_are_ranked_in_the_step_but_keep_the_jobs_node_list_and_restarts() {
        // Step 3 of a job on gpu[01-04] (requeued twice) runs two tasks on gpu03 and gpu04.
        let r = Rendezvous {
            nodes: peers(&["gpu03", "gpu04"]),
            node_rank: 1,
            port: Some(29501),
            step: Some(wharf_api::wire::StepPlace {
                id: 3,
                job_nodes: ["gpu01", "gpu02", "gpu03", "gpu04"]
                    .map(String::from)
                    .to_vec(),
                job_restarts: 2,
            }),
        };
        let env: Vec<(String, String)> = rendezvous(&r, Task::single(1), 0);
        let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        let mut unique = keys.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "each variable once: {keys:?}");
        let env: BTreeMap<String, String> = env.into_iter().collect();
        // The job's.
        assert_eq!(env["SLURM_JOB_NODELIST"], "gpu[01-04]");
        assert_eq!(env["SLURM_JOB_NUM_NODES"], "4");
        assert_eq!(env["SLURM_RESTART_COUNT"], "2");
        assert_eq!(env["WHARF_RESTART_COUNT"], "2");
        // The step's.
        assert_eq!(env["SLURM_STEP_ID"], "3");
        assert_eq!(env["SLURM_STEPID"], "3");
        assert_eq!(env["WHARF_STEP_ID"], "3");
        assert_eq!(env["SLURM_STEP_NODELIST"], "gpu[03-04]");
        assert_eq!(env["SLURM_STEP_NUM_NODES"], "2");
        assert_eq!(env["SLURM_STEP_NUM_TASKS"], "2");
        assert_eq!(env["SLURM_NODELIST"], "gpu[03-04]");
        assert_eq!(env["SLURM_NNODES"], "2");
        assert_eq!(env["SLURM_NODEID"], "1");
        assert_eq!(env["RANK"], "1");
        assert_eq!(env["WORLD_SIZE"], "2");
        assert_eq!(env["MASTER_ADDR"], "10.0.0.03");
        // A job's own order names no step.
        let job = Rendezvous { step: None, ..r };
        let env: BTreeMap<String, String> =
            rendezvous(&job, Task::single(1), 5).into_iter().collect();
        assert_eq!(env["SLURM_JOB_NODELIST"], "gpu[03-04]");
        assert_eq!(env["SLURM_RESTART_COUNT"], "5");
        assert!(!env.contains_key("SLURM_STEP_ID"));
    }

    #[test]
    fn the_hostfile_lists_every_nodes_address_in_rank_order_whichever_rank_reads_it() {
        let mut r = Rendezvous {
            nodes: peers(&["gpu03", "gpu01"]),
            node_rank: 1,
            port: Some(29501),
            step: None,
        };
        let want = "10.0.0.03 slots=1\n10.0.0.01 slots=1\n";
        assert_eq!(hostfile(&r, 1).as_deref(), Some(want));
        r.node_rank = 0;
        assert_eq!(hostfile(&r, 1).as_deref(), Some(want));
        // A single-node job gets one line; an order without nodes none.
        r.nodes.truncate(1);
        assert_eq!(hostfile(&r, 1).as_deref(), Some("10.0.0.03 slots=1\n"));
        assert_eq!(hostfile(&Rendezvous::default(), 1), None);
    }

    #[test]
    fn several_tasks_per_node_number_their_ranks_node_by_node() {
        let mut r = Rendezvous {
            nodes: peers(&["gpu01", "gpu02", "gpu03"]),
            node_rank: 0,
            port: Some(29600),
            step: None,
        };
        let mut seen = Vec::new();
        for node_rank in 0..3 {
            r.node_rank = node_rank;
            for local in 0..4 {
                let task = Task {
                    per_node: 4,
                    local,
                    cpus: 2,
                };
                let env: BTreeMap<String, String> = rendezvous(&r, task, 0).into_iter().collect();
                let want_rank = node_rank * 4 + local;
                assert_eq!(env["RANK"], want_rank.to_string());
                assert_eq!(env["SLURM_PROCID"], want_rank.to_string());
                assert_eq!(env["LOCAL_RANK"], local.to_string());
                assert_eq!(env["SLURM_LOCALID"], local.to_string());
                assert_eq!(env["NODE_RANK"], node_rank.to_string());
                assert_eq!(env["SLURM_NODEID"], node_rank.to_string());
                assert_eq!(env["WORLD_SIZE"], "12");
                assert_eq!(env["SLURM_NTASKS"], "12");
                assert_eq!(env["LOCAL_WORLD_SIZE"], "4");
                assert_eq!(env["SLURM_NTASKS_PER_NODE"], "4");
                assert_eq!(env["SLURM_TASKS_PER_NODE"], "4(x3)");
                assert_eq!(env["SLURM_NNODES"], "3");
                assert_eq!(env["SLURM_CPUS_PER_TASK"], "2");
                // Every task of the job meets at the first node, on the job's port.
                assert_eq!(env["MASTER_ADDR"], "10.0.0.01");
                assert_eq!(env["MASTER_PORT"], "29600");
                seen.push(want_rank);
            }
        }
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 12, "every rank once");
        // One node with two tasks: no (xM).
        r.nodes.truncate(1);
        r.node_rank = 0;
        let task = Task {
            per_node: 2,
            local: 1,
            cpus: 1,
        };
        let env: BTreeMap<String, String> = rendezvous(&r, task, 0).into_iter().collect();
        assert_eq!(
            (
                env["RANK"].as_str(),
                env["WORLD_SIZE"].as_str(),
                env["SLURM_TASKS_PER_NODE"].as_str()
            ),
            ("1", "2", "2")
        );
        assert_eq!(tasks_per_node(8, 16), "8(x16)");
        assert_eq!(tasks_per_node(1, 2), "1(x2)");
    }

    #[test]
    fn the_hostfile_gives_each_node_its_tasks_as_slots() {
        let r = Rendezvous {
            nodes: peers(&["gpu01", "gpu02"]),
            node_rank: 1,
            port: None,
            step: None,
        };
        assert_eq!(
            hostfile(&r, 4).as_deref(),
            Some("10.0.0.01 slots=4\n10.0.0.02 slots=4\n")
        );
    }

    #[test]
    fn a_nodes_ids_are_shared_out_in_turn_or_seen_by_every_task() {
        let gpus = [3, 5, 6, 7];
        assert_eq!(share(&gpus, 4, 0, Some(1)), [3]);
        assert_eq!(share(&gpus, 4, 3, Some(1)), [7]);
        assert_eq!(share(&gpus, 2, 1, Some(2)), [6, 7]);
        assert_eq!(share(&gpus, 2, 1, None), gpus);
        let cpus: Vec<u32> = (0..8).collect();
        assert_eq!(share(&cpus, 4, 2, Some(2)), [4, 5]);
        // Fewer ids than the tasks need: all of them, shared.
        assert_eq!(share(&[1, 2], 4, 3, Some(1)), [1, 2]);
    }
}
