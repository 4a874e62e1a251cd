//! Gang jobs: one job's ranks on several nodes at once. Two agents on this machine, each a
//! node of its own (name, state directory, cgroup parent), joined over TCP to one controller.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;

/// A controller and agents `gang1` and `gang2`, both up.
fn two_nodes(prefix: &str) -> TcpCluster {
    two_nodes_with(prefix, ["", ""])
}

/// [`two_nodes`], each agent's configuration given these further lines.
fn two_nodes_with(prefix: &str, extra: [&str; 2]) -> TcpCluster {
    let mut c = TcpCluster::controller(prefix, "node_timeout = \"10s\"\n");
    let token = c.token();
    for (name, extra) in ["gang1", "gang2"].into_iter().zip(extra) {
        c.agent_with(name, &token, &format!("grace = \"2s\"\n{extra}"));
    }
    c.wait_nodes_up(2, 20);
    c
}

/// Each node's address as its peers reach it (the fabric address, else the agent's).
fn peer_addresses(c: &TcpCluster) -> BTreeMap<String, String> {
    let nodes: Value =
        serde_json::from_slice(&c.wharf(&["nodes", "--json"]).stdout).expect("nodes --json");
    nodes["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("no nodes in {nodes}"))
        .iter()
        .map(|n| {
            let info = &n["info"];
            let address = info["fabric_address"]
                .as_str()
                .or(info["address"].as_str())
                .unwrap_or_else(|| panic!("no address in {n}"));
            (info["name"].as_str().unwrap().to_string(), address.into())
        })
        .collect()
}

/// Waits until nothing of job `id` is left in either node's cgroups (the cluster removes the
/// nodes' cgroup parents when it is dropped: an agent's parent stays while the agent runs).
fn no_cgroups_left(c: &TcpCluster, id: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in ["gang1", "gang2"] {
        let cgroup = format!("/{}/wharf-{id}", c.cgroup_parent_of(name));
        while !wharf_runtime::cgroup_dirs(&cgroup).is_empty() {
            assert!(Instant::now() < deadline, "{cgroup} is still there");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_two_node_job_runs_a_rank_on_each_node_with_one_rendezvous() {
    if !can_run("a_two_node_job_runs_a_rank_on_each_node_with_one_rendezvous") {
        return;
    }
    let c = two_nodes("wharf-gang-run-");
    // A one-CPU job on gang2 leaves it the fuller node, which best fit picks first: rank 0
    // must still run on gang1, the first node of `gang[1-2]`.
    let blocker = submitted_id(&c.wharf(&[
        "submit",
        "-w",
        "gang2",
        "--mem",
        "16M",
        "-t",
        "2m",
        "--wrap",
        "sleep 120",
    ]));
    c.wait_running(blocker);
    let script = "for v in RANK WORLD_SIZE MASTER_ADDR MASTER_PORT SLURM_JOB_NODELIST \
                  SLURM_NNODES SLURM_PROCID WHARF_HOSTFILE SLURM_SUBMIT_DIR SLURMD_NODENAME \
                  SLURM_MEM_PER_NODE SLURM_JOB_CPUS_PER_NODE; do eval echo $v=\\$$v; done; \
                  echo HOST=$(hostname); n=0; while read -r l; do echo \"LINE$n=$l\"; \
                  n=$((n+1)); done < \"$WHARF_HOSTFILE\"; echo LINES=$n; \
                  if [ -w \"$WHARF_HOSTFILE\" ]; then echo WRITABLE=yes; else echo WRITABLE=no; fi";
    let id = submitted_id(&c.wharf(&[
        "submit", "-N", "2", "--mem", "16M", "-t", "2m", "--wrap", script,
    ]));
    let done = c.wait_done(id, Duration::from_secs(60));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let nodes = nodes_of(&done);
    assert_eq!(
        nodes,
        ["gang1", "gang2"],
        "ranks in node list order: {done}"
    );
    // Rank 0 writes the job's output file, rank 1 its own beside it.
    let dir = c.dir.path();
    let out = dir.join(format!("wharf-{id}.out"));
    let ranks = [vars(&out), vars(&dir.join(format!("wharf-{id}.out.rank1")))];
    for (rank, v) in ranks.iter().enumerate() {
        assert_eq!(v["RANK"], rank.to_string(), "{v:?}");
        assert_eq!(v["SLURM_PROCID"], rank.to_string(), "{v:?}");
        assert_eq!(v["WORLD_SIZE"], "2", "{v:?}");
        assert_eq!(v["SLURM_NNODES"], "2", "{v:?}");
        assert_eq!(v["SLURM_JOB_NODELIST"], "gang[1-2]", "{v:?}");
        // sbatch's: where it was submitted from, the node, MiB and CPUs per node.
        assert_eq!(v["SLURM_SUBMIT_DIR"], dir.to_str().unwrap(), "{v:?}");
        assert_eq!(v["SLURMD_NODENAME"], nodes[rank], "{v:?}");
        assert_eq!(v["SLURM_MEM_PER_NODE"], "16", "{v:?}");
        assert_eq!(v["SLURM_JOB_CPUS_PER_NODE"], "1", "{v:?}");
        assert_eq!(
            v["HOST"], nodes[rank],
            "rank {rank} ran on its own node: {v:?}"
        );
        assert!(!v["MASTER_ADDR"].is_empty(), "{v:?}");
        assert!(v["MASTER_PORT"].parse::<u16>().is_ok(), "{v:?}");
    }
    assert_eq!(ranks[0]["MASTER_ADDR"], ranks[1]["MASTER_ADDR"]);
    // Each rank reads the same hostfile, read-only: every node's address in rank order, the
    // first MASTER_ADDR.
    let addresses = peer_addresses(&c);
    for v in &ranks {
        assert_eq!(v["WHARF_HOSTFILE"], "/tmp/wharf/hostfile", "{v:?}");
        assert_eq!(v["LINES"], "2", "{v:?}");
        assert_eq!(v["LINE0"], format!("{} slots=1", v["MASTER_ADDR"]), "{v:?}");
        for (rank, node) in nodes.iter().enumerate() {
            let line = &v[&format!("LINE{rank}")];
            assert_eq!(*line, format!("{} slots=1", addresses[node]), "{v:?}");
        }
        assert_eq!(
            v["WRITABLE"], "no",
            "the job may not change its hostfile: {v:?}"
        );
    }
    assert_eq!(ranks[0]["MASTER_PORT"], ranks[1]["MASTER_PORT"]);
    // The queue and `show` name both nodes as one host list, `show` each rank.
    let queue = stdout(&c.wharf(&["queue", "--all"]));
    let row = queue
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&id.to_string()))
        .unwrap_or_else(|| panic!("job {id} not in the queue:\n{queue}"));
    assert!(row.contains("gang[1-2]"), "{queue}");
    let shown = stdout(&c.wharf(&["show", &id.to_string()]));
    assert!(shown.contains("gang[1-2]"), "{shown}");
    for (rank, node) in nodes.iter().enumerate() {
        assert!(
            shown.contains(&format!("{rank} on {node}: exited 0")),
            "{shown}"
        );
    }
    // Accounting lists both nodes as one host list.
    let acct = stdout(&c.wharf(&["acct", "-j", &id.to_string(), "-o", "JobID,NNodes,NodeList"]));
    assert!(acct.contains("gang[1-2]"), "{acct}");
    c.wharf(&["cancel", &blocker.to_string()]);
    c.wait_done(blocker, Duration::from_secs(30));
    no_cgroups_left(&c, blocker);
    no_cgroups_left(&c, id);
}

#[test]
fn a_rank_that_fails_stops_the_gang_and_the_job_names_it() {
    if !can_run("a_rank_that_fails_stops_the_gang_and_the_job_names_it") {
        return;
    }
    let c = two_nodes("wharf-gang-fail-");
    let script = "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 300";
    let id = submitted_id(&c.wharf(&[
        "submit",
        "--nodes=2",
        "--ntasks=2",
        "--mem",
        "16M",
        "-t",
        "10m",
        "--wrap",
        script,
    ]));
    // Rank 0 would sleep for 5 minutes: the job ends long before, when it is stopped.
    let done = c.wait_done(id, Duration::from_secs(90));
    assert_eq!(done["state"], "FAILED", "{done}");
    assert_eq!(done["exit"]["code"], 3, "the failing rank's code: {done}");
    let nodes = nodes_of(&done);
    let reason = done["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("rank 1 on node {}", nodes[1])),
        "{reason}"
    );
    let elapsed = done["end_time"].as_u64().unwrap() - done["start_time"].as_u64().unwrap();
    assert!(elapsed < 120_000, "rank 0 was not stopped: {done}");
    // Rank 0 was killed by the stop, not left to finish.
    assert_eq!(done["allocs"][0]["exit"]["cancelled"], true, "{done}");
    no_cgroups_left(&c, id);
}

/// What each rank of job `id` saw of its node's GPUs: `(node, VISIBLE, CUDA, SLURM_JOB_GPUS)`
/// against its alloc's GPU ids, in rank order.
fn gpus_seen(
    c: &TcpCluster,
    id: u64,
    done: &Value,
) -> Vec<(String, Vec<u64>, BTreeMap<String, String>)> {
    let dir = c.dir.path();
    let nodes = nodes_of(done);
    (0..nodes.len())
        .map(|rank| {
            let out = match rank {
                0 => dir.join(format!("wharf-{id}.out")),
                r => dir.join(format!("wharf-{id}.out.rank{r}")),
            };
            let ids: Vec<u64> = done["allocs"][rank]["gpu_ids"]
                .as_array()
                .unwrap_or_else(|| panic!("no gpu_ids in {done}"))
                .iter()
                .map(|g| g.as_u64().unwrap())
                .collect();
            (nodes[rank].clone(), ids, vars(&out))
        })
        .collect()
}

/// Checks that each rank saw exactly the GPU devices its node's alloc names, and no other.
fn sees_exactly_its_gpus(c: &TcpCluster, id: u64, done: &Value, per_node: usize) {
    for (rank, (node, ids, v)) in gpus_seen(c, id, done).into_iter().enumerate() {
        assert_eq!(ids.len(), per_node, "rank {rank} on {node}: {done}");
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        let want: Vec<String> = sorted.iter().map(|i| format!("nvidia{i}")).collect();
        let want_cuda: Vec<String> = (0..per_node).map(|i| i.to_string()).collect();
        let want_slurm: Vec<String> = sorted.iter().map(u64::to_string).collect();
        assert_eq!(v["RANK"], rank.to_string(), "{v:?}");
        assert_eq!(
            v["VISIBLE"].trim(),
            want.join(" "),
            "rank {rank} on {node}: {v:?}"
        );
        assert_eq!(
            v["CUDA"],
            want_cuda.join(","),
            "rank {rank} on {node}: {v:?}"
        );
        assert_eq!(
            v["SLURM_JOB_GPUS"],
            want_slurm.join(","),
            "rank {rank} on {node}: {v:?}"
        );
    }
}

/// Fake GPUs (mknod, as the GPU tests make them), each node its own: `gang1` has nvidia0..3,
/// `gang2` nvidia0, 1 and 3. A 2-node job with 2 GPUs per node sees on each node exactly the
/// devices its alloc there names; a 3-GPU-per-node job gets exactly nvidia0, 1 and 3 on
/// `gang2`, and never 2.
#[test]
fn a_gang_on_fake_gpus_sees_exactly_its_devices_on_each_node() {
    if !can_run("a_gang_on_fake_gpus_sees_exactly_its_devices_on_each_node") {
        return;
    }
    let devs = [
        crate::gpu::fake_dev_with(&[0, 1, 2, 3]),
        crate::gpu::fake_dev_with(&[0, 1, 3]),
    ];
    let roots: Vec<String> = devs
        .iter()
        .map(|d| format!("dev_root = \"{}\"", d.path().display()))
        .collect();
    let c = two_nodes_with("wharf-gang-gpu-", [&roots[0], &roots[1]]);
    let script = "echo RANK=$RANK; echo VISIBLE=$(ls /dev | grep '^nvidia[0-9]' | tr '\\n' ' '); \
                  echo CUDA=$CUDA_VISIBLE_DEVICES; echo SLURM_JOB_GPUS=$SLURM_JOB_GPUS";
    let submit = |per_node: &str| {
        submitted_id(&c.wharf(&[
            "submit",
            "-N",
            "2",
            "--gpus-per-node",
            per_node,
            "--mem",
            "16M",
            "-t",
            "2m",
            "--wrap",
            script,
        ]))
    };
    let two = submit("2");
    let done = c.wait_done(two, Duration::from_secs(60));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    sees_exactly_its_gpus(&c, two, &done, 2);
    no_cgroups_left(&c, two);

    let three = submit("3");
    let done = c.wait_done(three, Duration::from_secs(60));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    sees_exactly_its_gpus(&c, three, &done, 3);
    let seen = gpus_seen(&c, three, &done);
    let (_, ids, v) = seen
        .iter()
        .find(|(node, ..)| node == "gang2")
        .unwrap_or_else(|| panic!("no rank on gang2: {done}"));
    assert_eq!(*ids, [0, 1, 3], "{done}");
    assert_eq!(v["VISIBLE"].trim(), "nvidia0 nvidia1 nvidia3", "{v:?}");
    no_cgroups_left(&c, three);
}

/// A single-node job gets the hostfile too: one line, its node's, which the job can neither
/// change, remove nor replace.
#[test]
fn a_single_node_job_gets_a_one_line_hostfile_it_cannot_change() {
    if !can_run("a_single_node_job_gets_a_one_line_hostfile_it_cannot_change") {
        return;
    }
    let c = Cluster::start_with("");
    let alice = user("wharf-alice");
    let script = "f=$WHARF_HOSTFILE; echo path $f; cat \"$f\"; \
                  (echo x > \"$f\") 2>/dev/null && echo written; \
                  rm -f \"$f\" 2>/dev/null && echo removed; \
                  mv \"$f\" /tmp/moved 2>/dev/null && echo moved; \
                  echo nodes $(wc -l < \"$f\")";
    let out = c.run_sh(&alice, &[], script);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "path /tmp/wharf/hostfile", "{text}");
    let (address, slots) = lines[1].split_once(' ').unwrap_or_else(|| panic!("{text}"));
    assert!(!address.is_empty() && slots == "slots=1", "{text}");
    assert_eq!(lines[2..], ["nodes 1"], "{text}");
}
