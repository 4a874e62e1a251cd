//! A step shares its job's memory on a node: the job's cgroup holds the limit, and the batch
//! command's cgroup and each step task's are leaves under it. `srun --mem` gives a step a
//! ceiling of its own within it.

use std::time::Duration;

use crate::harness::*;

#[test]
fn a_step_gets_only_the_memory_its_job_has_left_on_the_node() {
    let test = "a_step_gets_only_the_memory_its_job_has_left_on_the_node";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let w = wharf_bin();
    // The batch command holds 80 MiB of its 128 MiB (a file in its private /tmp, a tmpfs whose
    // pages are charged to its cgroup) while two steps each touch a buffer of their own: 20
    // MiB fits in what is left, 80 MiB does not. Each step task's own limit is the whole
    // 128 MiB: only the job's limit can stop the second.
    let script = format!(
        "dd if=/dev/zero of=/tmp/held bs=1M count=80 2>/dev/null; echo HELD $?; \
         {w} step -- dd if=/dev/zero of=/dev/null bs=20M count=1; echo RESULT SMALL=$?; \
         {w} step -- dd if=/dev/zero of=/dev/null bs=80M count=1; echo RESULT BIG=$?; \
         rm /tmp/held; \
         {w} step -- dd if=/dev/zero of=/dev/null bs=80M count=1; echo RESULT FREED=$?"
    );
    let flags = ["--mem", "128M", "-t", "2m"];
    let (job, text) = c.completed(&alice, &flags, &script, Duration::from_secs(90));
    assert!(text.contains("HELD 0"), "{text}");
    assert!(text.contains("RESULT SMALL=0"), "{text}\n{job}");
    // Killed by the OOM killer in the job's cgroup (137: 128 + SIGKILL).
    assert!(text.contains("RESULT BIG=137"), "{text}\n{job}");
    let big = &job["steps"][1]["exit"];
    assert!(big["oom"] == true || big["signal"] == 9, "{job}");
    // Once the batch command lets go, the same step fits.
    assert!(text.contains("RESULT FREED=0"), "{text}\n{job}");
}

/// `srun --mem` inside a job: the step's tasks on the node get that much between them, each
/// its part as its own cgroup's limit, within the job's; asking for more than the job has is
/// refused with why.
#[test]
fn srun_mem_gives_a_step_its_own_ceiling_within_the_jobs_memory() {
    let test = "srun_mem_gives_a_step_its_own_ceiling_within_the_jobs_memory";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let w = wharf_bin();
    // The job has 2 CPUs and 256 MiB; a step of two tasks limited to 64 MiB gives each 32
    // MiB: 20 MiB fits in a task, 48 MiB does not, though the job has room for it.
    let dd = "dd if=/dev/zero of=/dev/null count=1";
    let script = format!(
        "{w} srun --mem 64M -n 2 -l sh -c 'echo MEM=$SLURM_MEM_PER_NODE'; \
         {w} srun --mem 64M -n 2 {dd} bs=20M; echo RESULT SMALL=$?; \
         {w} srun --mem 64M -n 2 {dd} bs=48M; echo RESULT BIG=$?; \
         {w} srun -n 2 {dd} bs=48M; echo RESULT JOBS=$?; \
         {w} srun --mem 1G true; echo RESULT OVER=$?"
    );
    let flags = ["-c", "2", "--mem", "256M", "-t", "2m"];
    let (job, out) = c.completed(&alice, &flags, &script, Duration::from_secs(90));
    // Each task is told the step's memory on the node, MiB, as Slurm's steps are.
    assert!(
        out.contains("0: MEM=64") && out.contains("1: MEM=64"),
        "{out}"
    );
    assert!(out.contains("RESULT SMALL=0"), "{out}\n{job}");
    // Killed by the OOM killer in its own cgroup (137: 128 + SIGKILL).
    assert!(out.contains("RESULT BIG=137"), "{out}\n{job}");
    // Without --mem, the same two tasks have half the job's memory each (128 MiB).
    assert!(out.contains("RESULT JOBS=0"), "{out}\n{job}");
    // More than the job's: refused, with why, and no step recorded for it.
    assert!(out.contains("RESULT OVER=1"), "{out}\n{job}");
    assert!(out.contains("more than job"), "{out}");
    assert_eq!(job["steps"].as_array().map(Vec::len), Some(4), "{job}");
    assert_eq!(job["steps"][1]["nodes"][0]["memory"], 64u64 << 20, "{job}");
}
