//! The environment that lets a job's ranks find each other whatever its image: PyTorch's
//! (`MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE`, `RANK`, `LOCAL_RANK`, ...) and Slurm's
//! (`SLURM_JOB_NODELIST` in compressed form, `SLURM_NNODES`, `SLURM_PROCID`, ...), from the
//! controller's rendezvous, and the job's hostfile. One task per node.

use wharf_api::wire::Rendezvous;

/// The rendezvous variables for the task on node `r.node_rank`, given `cpus` per task. Empty
/// when the order carries no nodes (sent by an older controller).
pub fn rendezvous(r: &Rendezvous, cpus: u32) -> Vec<(String, String)> {
    let Some(first) = r.nodes.first() else {
        return vec![];
    };
    let nnodes = r.nodes.len().to_string();
    let names: Vec<&str> = r.nodes.iter().map(|p| p.name.as_str()).collect();
    let nodelist = wharf_api::hostlist::compress(&names);
    let rank = r.node_rank.to_string();
    let tasks_per_node = if r.nodes.len() > 1 {
        format!("1(x{})", r.nodes.len())
    } else {
        "1".into()
    };
    let mut env: Vec<(&str, String)> = vec![
        ("MASTER_ADDR", first.address.clone()),
        ("WORLD_SIZE", nnodes.clone()),
        ("NODE_RANK", rank.clone()),
        ("GROUP_RANK", rank.clone()),
        ("RANK", rank.clone()),
        ("LOCAL_RANK", "0".into()),
        ("LOCAL_WORLD_SIZE", "1".into()),
        ("WHARF_NODELIST", nodelist.clone()),
        ("WHARF_NODE_RANK", rank.clone()),
        ("SLURM_JOB_NODELIST", nodelist.clone()),
        ("SLURM_NODELIST", nodelist),
        ("SLURM_NNODES", nnodes.clone()),
        ("SLURM_JOB_NUM_NODES", nnodes.clone()),
        ("SLURM_NODEID", rank.clone()),
        ("SLURM_PROCID", rank),
        ("SLURM_LOCALID", "0".into()),
        ("SLURM_NTASKS", nnodes),
        ("SLURM_NTASKS_PER_NODE", "1".into()),
        ("SLURM_TASKS_PER_NODE", tasks_per_node),
        ("SLURM_CPUS_PER_TASK", cpus.to_string()),
    ];
    if let Some(port) = r.port {
        env.push(("MASTER_PORT", port.to_string()));
    }
    env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The job's hostfile, in the form MPI launchers (`mpirun --hostfile`) and DeepSpeed
/// (`--hostfile`) read: one line per node in rank order, `ADDRESS slots=N` with N the tasks per
/// node (1). The address comes first, not the name: it is the node's address on the fabric
/// interface, which the other ranks reach, where a node's name may not resolve inside an
/// image. `None` when the order carries no nodes.
pub fn hostfile(r: &Rendezvous) -> Option<String> {
    if r.nodes.is_empty() {
        return None;
    }
    Some(
        r.nodes
            .iter()
            .map(|p| format!("{} slots=1\n", p.address))
            .collect(),
    )
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
        };
        let env: BTreeMap<String, String> = rendezvous(&r, 8).into_iter().collect();
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
        };
        let env: BTreeMap<String, String> = rendezvous(&r, 1).into_iter().collect();
        assert_eq!(env["WORLD_SIZE"], "1");
        assert_eq!(env["SLURM_TASKS_PER_NODE"], "1");
        assert!(!env.contains_key("MASTER_PORT"), "no port, no MASTER_PORT");
        assert!(rendezvous(&Rendezvous::default(), 1).is_empty());
    }

    #[test]
    fn the_hostfile_lists_every_nodes_address_in_rank_order_whichever_rank_reads_it() {
        let mut r = Rendezvous {
            nodes: peers(&["gpu03", "gpu01"]),
            node_rank: 1,
            port: Some(29501),
        };
        let want = "10.0.0.03 slots=1\n10.0.0.01 slots=1\n";
        assert_eq!(hostfile(&r).as_deref(), Some(want));
        r.node_rank = 0;
        assert_eq!(hostfile(&r).as_deref(), Some(want));
        // A single-node job gets one line; an order without nodes none.
        r.nodes.truncate(1);
        assert_eq!(hostfile(&r).as_deref(), Some("10.0.0.03 slots=1\n"));
        assert_eq!(hostfile(&Rendezvous::default()), None);
    }
}
