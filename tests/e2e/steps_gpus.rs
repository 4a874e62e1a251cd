//! Concurrent steps that ask for GPUs (`srun --gres=gpu:1` in a sweep) each get one of the
//! job's to themselves, shown on fake GPUs; one that asks while all are held waits.

use std::time::Duration;

use crate::harness::*;

/// `key=value` words of the line of `text` that starts with `TASK {name} `.
fn task_line(text: &str, name: &str) -> std::collections::BTreeMap<String, String> {
    let line = (text.lines())
        .find(|l| l.starts_with(&format!("TASK {name} ")))
        .unwrap_or_else(|| panic!("no TASK {name} in:\n{text}"));
    (line.split_whitespace())
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn concurrent_gpu_steps_get_a_gpu_each_and_a_third_waits_for_one() {
    let test = "concurrent_gpu_steps_get_a_gpu_each_and_a_third_waits_for_one";
    if !can_run(test) {
        return;
    }
    // Markers, the tasks' script and the job's output where the step's tasks see them too.
    let dir = scratch("wharf-stepgpus-");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let h = dir.path().display();
    // GPU 2 is not there; the job is given 0 and 1 of 0, 1 and 3.
    let dev = crate::gpu::fake_dev_with(&[0, 1, 3]);
    let c = Cluster::start_with(&format!(
        "dev_root = \"{}\"\nmounts = [\"{h}\"]",
        dev.path().display()
    ));
    if !c.has_cpus(test, 2) {
        return;
    }
    let alice = user("wharf-alice");
    // Each task says what it sees, is up, and runs until told to end.
    let show = format!(
        "echo TASK $1 VISIBLE=$(ls /dev | grep '^nvidia[0-9]' | tr '\\n' ,) \
         CUDA=$CUDA_VISIBLE_DEVICES STEP=$SLURM_STEP_GPUS; \
         touch {h}/$1.up; while [ ! -e {h}/$1.go ]; do sleep 0.1; done"
    );
    std::fs::write(dir.path().join("show.sh"), &show).unwrap();
    let w = wharf_bin();
    let up = |names: &str| {
        format!("for f in {names}; do while [ ! -e {h}/$f.up ]; do sleep 0.1; done; done; ")
    };
    let script = format!(
        "cd {h}; {w} srun -Q -n1 --gres=gpu:1 sh {h}/show.sh A & \
         {w} srun -Q -n1 --gres=gpu:1 sh {h}/show.sh B & \
         {a_b}\
         {w} srun -n1 --gres=gpu:1 sh {h}/show.sh C 2> {h}/C.err & \
         for i in $(seq 100); do grep -q waiting {h}/C.err && break; sleep 0.1; done; \
         sleep 2; [ -e {h}/C.up ] && echo RESULT C_EARLY=1 || echo RESULT C_EARLY=0; \
         touch {h}/A.go; \
         {c_up}\
         touch {h}/B.go {h}/C.go; wait; echo RESULT DONE=1",
        a_b = up("A B"),
        c_up = up("C"),
    );
    let out = format!("{h}/out.txt");
    let id = submitted_id(&c.wharf_as(
        &alice,
        &[
            "submit", "--gpus", "2", "--cpus", "2", "--mem", "64M", "-t", "2m", "-o", &out,
            "--wrap", &script,
        ],
    ));
    let job = c.wait_done(id, Duration::from_secs(90));
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let waited = std::fs::read_to_string(dir.path().join("C.err")).unwrap_or_default();
    assert_eq!(job["state"], "COMPLETED", "{job}\n{text}\n{waited}");
    assert!(text.contains("RESULT DONE=1"), "{text}");
    // The third did not start while the first two held both of the job's GPUs, and said why.
    assert!(text.contains("RESULT C_EARLY=0"), "{text}");
    assert!(
        waited.contains("step waiting: GPUs held by steps") && waited.contains("job has 2 on"),
        "{waited}"
    );
    let (a, b, c3) = (
        task_line(&text, "A"),
        task_line(&text, "B"),
        task_line(&text, "C"),
    );
    for t in [&a, &b, &c3] {
        // Exactly one GPU device, its own id as the step's, device 0 for CUDA; never 2,
        // which the node does not have, nor 3, which the job was not given.
        let gpu = &t["STEP"];
        assert!(gpu == "0" || gpu == "1", "{t:?}");
        assert_eq!(t["VISIBLE"], format!("nvidia{gpu},"), "{t:?}");
        assert_eq!(t["CUDA"], "0", "{t:?}");
    }
    assert_ne!(
        a["STEP"], b["STEP"],
        "two concurrent steps share a GPU:\n{text}"
    );
    // The third got the one the first gave back.
    assert_eq!(c3["STEP"], a["STEP"], "{text}");
}
