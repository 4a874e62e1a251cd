//! Several tasks of a job on one node (`--ntasks-per-node`), each in its own sandbox: ranks
//! numbered node by node, a real all-reduce between them, the node's CPUs split among them,
//! one GPU each with `--gpus-per-task`, and a failing task stopping the others.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::harness::*;

/// The file task rank `rank` of job `id` wrote in `dir`: the job's for rank 0, `.rankR` for
/// the others.
fn rank_file(dir: &std::path::Path, id: u64, rank: u64) -> std::path::PathBuf {
    match rank {
        0 => dir.join(format!("wharf-{id}.out")),
        r => dir.join(format!("wharf-{id}.out.rank{r}")),
    }
}

/// Copies `examples/NAME` into `dir`, readable by everyone; returns its path. Jobs have a
/// private /tmp: `dir` must lie elsewhere ([`scratch`] is under /var/tmp).
fn example_in(dir: &std::path::Path, name: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let from = format!("{}/examples/{name}", env!("CARGO_MANIFEST_DIR"));
    let to = dir.join(name);
    std::fs::copy(&from, &to).expect("copy the example program for the job");
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o644)).unwrap();
    to.display().to_string()
}

#[test]
fn two_tasks_on_one_node_all_reduce_each_in_its_own_sandbox() {
    let test = "two_tasks_on_one_node_all_reduce_each_in_its_own_sandbox";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start_with("");
    if !c.has_cpus(test, 2) {
        return;
    }
    let alice = user("wharf-alice");
    let home = c.home(&alice);
    let programs = scratch("wharf-tasks-");
    let program = example_in(programs.path(), "allreduce.py");
    let script = format!(
        "for v in RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK SLURM_PROCID \
         SLURM_LOCALID SLURM_NTASKS SLURM_NTASKS_PER_NODE SLURM_TASKS_PER_NODE MASTER_ADDR \
         MASTER_PORT SLURM_CPUS_PER_TASK; do eval echo $v=\\$$v; done; \
         echo CPUS=$(grep Cpus_allowed_list /proc/self/status | tr -d ' \\t' | cut -d: -f2); \
         echo HOSTFILE=$(cat \"$WHARF_HOSTFILE\"); echo PID1=$(cat /proc/1/comm); \
         sleep 3; \
         exec python3 {program} --length 1000 --timeout 60"
    );
    let id = submitted_id(&c.wharf_as(
        &alice,
        &[
            "submit",
            "--ntasks-per-node",
            "2",
            "--cpus-per-task",
            "1",
            "--mem",
            "64M",
            "-t",
            "2m",
            "--wrap",
            &script,
        ],
    ));
    // Each task has a cgroup of its own, with half the node's 64M, under the job's cgroup,
    // which has all of it.
    c.wait_running(id);
    let limit = |path: &str| {
        let dirs = wharf_runtime::cgroup_dirs(path);
        dirs.iter()
            .find_map(|d| {
                std::fs::read_to_string(d.join("memory.max"))
                    .or_else(|_| std::fs::read_to_string(d.join("memory.limit_in_bytes")))
                    .ok()
            })
            .unwrap_or_else(|| panic!("no memory limit for {path} in {dirs:?}"))
    };
    let job_cgroup = format!("/{}/wharf-{id}", c.cgroup_parent);
    assert_eq!(limit(&job_cgroup).trim(), (64u64 << 20).to_string());
    for name in [format!("wharf-{id}"), format!("wharf-{id}.1")] {
        let dirs = wharf_runtime::cgroup_dirs(&format!("{job_cgroup}/{name}"));
        let max = dirs
            .iter()
            .find_map(|d| {
                std::fs::read_to_string(d.join("memory.max"))
                    .or_else(|_| std::fs::read_to_string(d.join("memory.limit_in_bytes")))
                    .ok()
            })
            .unwrap_or_else(|| panic!("no memory limit for {name} in {dirs:?}"));
        assert_eq!(max.trim(), (32u64 << 20).to_string(), "{name}");
    }
    let done = c.wait_done(id, Duration::from_secs(90));
    let text = |rank: u64| std::fs::read_to_string(rank_file(&home, id, rank)).unwrap_or_default();
    assert_eq!(
        done["state"],
        "COMPLETED",
        "{done}\nrank 0:\n{}\nrank 1:\n{}",
        text(0),
        text(1)
    );
    assert_eq!(done["allocs"].as_array().map(Vec::len), Some(1), "{done}");
    let node = done["allocs"][0]["node"].as_str().unwrap().to_string();
    let ranks: Vec<BTreeMap<String, String>> =
        (0..2).map(|r| vars(&rank_file(&home, id, r))).collect();
    // Element i of the all-reduced vector is (i+1)·W(W+1)/2 + (W-1)W(2W-1)/6, W = 2.
    let want_sum: u64 = (1..=1000u64).map(|i| i * 3 + 1).sum();
    for (rank, v) in ranks.iter().enumerate() {
        let r = rank.to_string();
        assert_eq!(v["RANK"], r, "{v:?}");
        assert_eq!(v["SLURM_PROCID"], r, "{v:?}");
        assert_eq!(v["LOCAL_RANK"], r, "{v:?}");
        assert_eq!(v["SLURM_LOCALID"], r, "{v:?}");
        assert_eq!(v["NODE_RANK"], "0", "{v:?}");
        assert_eq!(v["WORLD_SIZE"], "2", "{v:?}");
        assert_eq!(v["LOCAL_WORLD_SIZE"], "2", "{v:?}");
        assert_eq!(v["SLURM_NTASKS"], "2", "{v:?}");
        assert_eq!(v["SLURM_NTASKS_PER_NODE"], "2", "{v:?}");
        assert_eq!(v["SLURM_TASKS_PER_NODE"], "2", "{v:?}");
        assert_eq!(v["SLURM_CPUS_PER_TASK"], "1", "{v:?}");
        assert!(v["HOSTFILE"].ends_with(" slots=2"), "{v:?}");
        // A sandbox of its own: its own PID namespace, whose first process is its init.
        assert_ne!(v["PID1"], "", "{v:?}");
        let out = text(rank as u64);
        assert!(
            out.contains(&format!("allreduce ok rank={rank} world=2 sum={want_sum} ")),
            "rank {rank} did not all-reduce right:\n{out}"
        );
    }
    assert_eq!(ranks[0]["MASTER_ADDR"], ranks[1]["MASTER_ADDR"]);
    assert_eq!(ranks[0]["MASTER_PORT"], ranks[1]["MASTER_PORT"]);
    // The node's two CPUs are split: one each, not the same one.
    assert_ne!(ranks[0]["CPUS"], ranks[1]["CPUS"], "{ranks:?}");
    assert!(!ranks[0]["CPUS"].contains(['-', ',']), "{ranks:?}");
    // `show` names the job's tasks and the node's task ranks.
    let shown = stdout(&c.wharf(&["show", &id.to_string()]));
    assert!(shown.contains("Tasks: 2 (2 per node)"), "{shown}");
    assert!(
        shown.contains(&format!("0 on {node} (task ranks 0-1): exited 0")),
        "{shown}"
    );
    // The job counts as one node in accounting, with its 2 CPUs once.
    let acct = stdout(&c.wharf_as(
        &alice,
        &[
            "acct",
            "-j",
            &id.to_string(),
            "-o",
            "JobID,NNodes,AllocCPUS",
            "-n",
            "-p",
        ],
    ));
    assert!(acct.contains(&format!("{id}|1|2")), "{acct}");
}

#[test]
fn a_failing_task_stops_its_sibling_and_the_job_names_its_rank() {
    let test = "a_failing_task_stops_its_sibling_and_the_job_names_its_rank";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start_with("");
    if !c.has_cpus(test, 2) {
        return;
    }
    let alice = user("wharf-alice");
    let id = submitted_id(&c.wharf_as(
        &alice,
        &[
            "submit",
            "-n",
            "2",
            "--mem",
            "32M",
            "-t",
            "10m",
            "--wrap",
            "if [ \"$RANK\" = 1 ]; then sleep 1; exit 5; fi; sleep 300",
        ],
    ));
    let done = c.wait_done(id, Duration::from_secs(60));
    assert_eq!(done["state"], "FAILED", "{done}");
    assert_eq!(done["exit"]["code"], 5, "the failing task's code: {done}");
    let node = done["allocs"][0]["node"].as_str().unwrap();
    let reason = done["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&format!("rank 1 on node {node}")),
        "{reason}"
    );
    let elapsed = done["end_time"].as_u64().unwrap() - done["start_time"].as_u64().unwrap();
    assert!(elapsed < 60_000, "task 0 was not stopped: {done}");
    // Nothing of either task is left running, nor the job's cgroup they were in.
    let job_cgroup = format!("/{}/wharf-{id}", c.cgroup_parent);
    let leaves = [format!("wharf-{id}"), format!("wharf-{id}.1")];
    for cgroup in leaves
        .iter()
        .map(|name| format!("{job_cgroup}/{name}"))
        .chain([job_cgroup.clone()])
    {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !wharf_runtime::cgroup_dirs(&cgroup).is_empty() {
            assert!(std::time::Instant::now() < deadline, "{cgroup} is left");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn tasks_with_a_gpu_each_see_only_their_own() {
    if !can_run("tasks_with_a_gpu_each_see_only_their_own") {
        return;
    }
    let (_dev, c) = crate::gpu::gpu_cluster(&[0, 1, 2, 3]);
    let alice = user("wharf-alice");
    let home = c.home(&alice);
    let script = "echo RANK=$RANK; echo VISIBLE=$(ls /dev | grep '^nvidia[0-9]' | tr '\\n' ' '); \
                  echo CUDA=$CUDA_VISIBLE_DEVICES; echo SLURM_JOB_GPUS=$SLURM_JOB_GPUS; \
                  for i in 0 1 2 3; do head -c1 /dev/nvidia$i 2>&1 | grep -q 'No such device or address' && echo OPENS$i=yes; done; true";
    let submit = |gpus: &[&str]| {
        let args = [
            &[
                "submit",
                "--ntasks-per-node",
                "2",
                "--mem",
                "32M",
                "-t",
                "2m",
            ][..],
            gpus,
            &["--wrap", script],
        ]
        .concat();
        let id = submitted_id(&c.wharf_as(&alice, &args));
        let done = c.wait_done(id, Duration::from_secs(60));
        assert_eq!(done["state"], "COMPLETED", "{done}");
        let node_gpus: Vec<u64> = done["allocs"][0]["gpu_ids"]
            .as_array()
            .unwrap_or_else(|| panic!("no gpu_ids in {done}"))
            .iter()
            .map(|g| g.as_u64().unwrap())
            .collect();
        let ranks: Vec<_> = (0..2).map(|r| vars(&rank_file(&home, id, r))).collect();
        (node_gpus, ranks)
    };
    // One GPU per task: each sees, and can open, exactly its own, numbered 0 for CUDA.
    let (node_gpus, ranks) = submit(&["--gpus-per-task", "1"]);
    assert_eq!(node_gpus.len(), 2, "the node gives 2 tasks x 1 GPU");
    for (rank, v) in ranks.iter().enumerate() {
        let mine = node_gpus[rank];
        assert_eq!(v["RANK"], rank.to_string(), "{v:?}");
        assert_eq!(v["VISIBLE"].trim(), format!("nvidia{mine}"), "{v:?}");
        assert_eq!(v["CUDA"], "0", "{v:?}");
        assert_eq!(v["SLURM_JOB_GPUS"], mine.to_string(), "{v:?}");
        let opens: Vec<&String> = v.keys().filter(|k| k.starts_with("OPENS")).collect();
        assert_eq!(opens, [&format!("OPENS{mine}")], "{v:?}");
    }
    assert_ne!(ranks[0]["VISIBLE"], ranks[1]["VISIBLE"], "{ranks:?}");
    // Without --gpus-per-task every task sees all the node's GPUs of the job, as in Slurm.
    let (node_gpus, ranks) = submit(&["--gpus", "2"]);
    let all: Vec<String> = node_gpus.iter().map(|g| format!("nvidia{g}")).collect();
    for v in &ranks {
        assert_eq!(v["VISIBLE"].trim(), all.join(" "), "{v:?}");
        assert_eq!(v["CUDA"], "0,1", "{v:?}");
    }
    // More GPUs per node than the node has: refused at submit, naming the count.
    let out = c.wharf_as(
        &alice,
        &[
            "submit",
            "--ntasks-per-node",
            "2",
            "--gpus-per-task",
            "3",
            "--wrap",
            "true",
        ],
    );
    assert!(
        !out.status.success(),
        "6 GPUs on a 4-GPU node were accepted"
    );
    assert!(
        stderr(&out).contains("6 GPUs (the largest node has 4)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn inconsistent_task_counts_are_refused_at_submit() {
    if !can_run("inconsistent_task_counts_are_refused_at_submit") {
        return;
    }
    let c = Cluster::start_with("");
    let alice = user("wharf-alice");
    for (args, says) in [
        (
            &["--ntasks", "3", "--nodes", "2", "--ntasks-per-node", "2"][..],
            "`ntasks` = 3 but the job has 2 nodes with 2 tasks per node, which makes 4",
        ),
        (
            &["--ntasks-per-node", "0"][..],
            "`ntasks_per_node` must be at least 1",
        ),
        (
            &[
                "--ntasks-per-node",
                "2",
                "--gpus-per-task",
                "1",
                "--gpus",
                "3",
            ][..],
            "`gpus` = 3 per node but `gpus_per_task` = 1 with 2 tasks per node makes 2",
        ),
    ] {
        let all = [&["submit"][..], args, &["--wrap", "true"]].concat();
        let out = c.wharf_as(&alice, &all);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}
