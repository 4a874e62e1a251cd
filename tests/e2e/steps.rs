//! Steps inside a job (`wharf step`): tasks with the step's ranks in the job's allocation,
//! the step's status, its record, and the refusals: outside any job, from another user's
//! process, for a job that is not running, beyond the allocation.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::harness::*;

/// `KEY=VALUE` words of the first line of `path` that starts with `tag`.
fn words(path: &Path, tag: &str) -> std::collections::BTreeMap<String, String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let line = text
        .lines()
        .find(|l| l.starts_with(tag))
        .unwrap_or_else(|| panic!("no {tag} line in {}:\n{text}", path.display()));
    line.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The CPUs of a `Cpus_allowed_list` such as `0-2,5`.
fn cpu_list(text: &str) -> Vec<u32> {
    let mut out = vec![];
    for part in text.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().unwrap()..=b.parse().unwrap()),
            None => out.push(part.parse().unwrap()),
        }
    }
    out
}

const SHOW: &str = "echo TASK STEP=$SLURM_STEP_ID PROCID=$SLURM_PROCID NTASKS=$SLURM_NTASKS \
    RANK=$RANK WORLD=$WORLD_SIZE LOCAL=$LOCAL_RANK NODE=$NODE_RANK JOB=$SLURM_JOB_ID \
    CPUS=$(grep Cpus_allowed_list /proc/self/status | tr -d \"[:blank:]\" | cut -d: -f2) \
    USER=$(id -u)";

#[test]
fn a_step_runs_ranked_tasks_in_the_jobs_allocation_and_ends_as_its_first_failing_task() {
    let test = "a_step_runs_ranked_tasks_in_the_jobs_allocation_and_ends_as_its_first_failing_task";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    if !c.has_cpus(test, 2) {
        return;
    }
    let alice = user("wharf-alice");
    let home = c.home(&alice);
    let w = wharf_bin();
    let script = format!(
        "echo BATCH CPUS=$(grep Cpus_allowed_list /proc/self/status | tr -d ' \\t' | cut -d: -f2); \
         {w} step -l --ntasks-per-node 2 -- sh -c '{SHOW}'; echo RESULT FIRST=$?; \
         t0=$(date +%s); {w} step -n 2 -- sh -c 'if [ $SLURM_PROCID = 1 ]; then exit 3; fi; sleep 60'; \
         echo RESULT SECOND=$? SECS=$(( $(date +%s) - t0 )); \
         {w} step --ntasks-per-node 3 -- true; echo RESULT THIRD=$?; \
         {w} step --jobid 999999 -- true; echo RESULT FOURTH=$?"
    );
    let id = submitted_id(&c.wharf_as(
        &alice,
        &[
            "submit",
            "--cpus-per-task",
            "2",
            "--mem",
            "128M",
            "-t",
            "2m",
            "--wrap",
            &script,
        ],
    ));
    let job = c.wait_done(id, Duration::from_secs(90));
    let out = home.join(format!("wharf-{id}.out"));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(job["state"], "COMPLETED", "{job}\n{text}\n{}", c.log());
    let result = words(&out, "RESULT FIRST");
    assert_eq!(result["FIRST"], "0", "{text}");
    // Task 1 exited 3: the step's status, and task 0's sleep was stopped at once.
    let second = words(&out, "RESULT SECOND");
    assert_eq!(second["SECOND"], "3", "{text}");
    assert!(second["SECS"].parse::<u64>().unwrap() < 30, "{text}");
    assert_eq!(words(&out, "RESULT THIRD")["THIRD"], "1", "{text}");
    assert!(
        text.contains("3 tasks per node is more than job") && text.contains("2 CPU(s)"),
        "{text}"
    );
    assert_eq!(words(&out, "RESULT FOURTH")["FOURTH"], "1", "{text}");
    assert!(
        text.contains(&format!("runs inside job {id}, not job 999999")),
        "{text}"
    );
    // Each task of step 0 wrote to the caller's output, labelled with its rank, with the
    // step's ranks, as alice, on CPUs of the job's own; no step file was written.
    assert!(!home.join(format!("wharf-{id}.out.step0")).exists());
    let batch = cpu_list(&words(&out, "BATCH")["CPUS"]);
    let mut seen = vec![];
    for rank in 0..2u32 {
        let t = words(&out, &format!("{rank}: TASK"));
        let r = rank.to_string();
        assert_eq!(
            (
                &*t["STEP"],
                &*t["PROCID"],
                &*t["RANK"],
                &*t["LOCAL"],
                &*t["NTASKS"]
            ),
            ("0", &*r, &*r, &*r, "2"),
            "{t:?}"
        );
        assert_eq!((&*t["WORLD"], &*t["NODE"]), ("2", "0"));
        assert_eq!(t["JOB"], id.to_string());
        assert_eq!(t["USER"], alice.uid.to_string());
        let cpus = cpu_list(&t["CPUS"]);
        assert_eq!(cpus.len(), 1, "one CPU each: {t:?}");
        assert!(
            cpus.iter().all(|c| batch.contains(c)),
            "{cpus:?} not in {batch:?}"
        );
        seen.extend(cpus);
    }
    seen.dedup();
    assert_eq!(seen.len(), 2, "the tasks' CPUs differ");
    // The job's record has its two steps (the refused ones were never recorded).
    let steps = job["steps"].as_array().expect("steps recorded");
    assert_eq!(steps.len(), 2, "{job}");
    assert_eq!(steps[0]["id"], 0);
    assert_eq!(steps[0]["exit"]["code"], 0);
    assert_eq!(steps[1]["exit"]["code"], 3);
    assert_eq!(steps[1]["tasks_per_node"], 2);
    assert!(steps[1]["exit"]["message"]
        .as_str()
        .unwrap()
        .starts_with("task 1 on node"));
    // `wharf show` lists them.
    let shown = stdout(&c.wharf_as(&alice, &["show", &id.to_string()]));
    assert!(
        shown.contains(&format!("Step: {id}.0 sh: 2 task(s) on "))
            && shown.contains("COMPLETED 0:0"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("Step: {id}.1 sh: 2 task(s) on ")),
        "{shown}"
    );
    assert!(shown.contains("FAILED 3:0 (task 1 on node"), "{shown}");
    // Accounting shows them as sacct does: JOBID.batch, then JOBID.STEP.
    let out = c.wharf_as(
        &alice,
        &[
            "acct",
            "-j",
            &id.to_string(),
            "--steps",
            "-p",
            "-n",
            "-o",
            "JobID,JobName,State,ExitCode,NNodes,NTasks",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: Vec<String> = stdout(&out).lines().skip(1).map(str::to_string).collect();
    assert_eq!(
        rows,
        [
            format!("{id}.batch|batch|COMPLETED|0:0|1|1|"),
            format!("{id}.0|sh|COMPLETED|0:0|1|2|"),
            format!("{id}.1|sh|FAILED|3:0|1|2|"),
        ],
        "{}",
        stdout(&out)
    );
}

/// The pids in job `id`'s cgroup (its tasks' and steps' leaves).
fn job_pids(c: &Cluster, id: u64) -> Vec<i32> {
    cgroup_procs(&format!("/{}/wharf-{id}", c.cgroup_parent))
}

/// Runs `wharf step -- true` as `user` (root when `None`), put by root into the cgroup
/// `cgroup` (made when missing, removed after) before it calls; its output.
fn step_from_cgroup(
    socket: &str,
    user: Option<&User>,
    cgroup: &str,
    made: bool,
) -> std::process::Output {
    let script = format!("read go; exec {} step -- true", wharf_bin());
    let mut cmd = match user {
        Some(u) => {
            let mut cmd = setpriv(u);
            cmd.arg("/bin/sh");
            cmd
        }
        None => std::process::Command::new("/bin/sh"),
    };
    let mut child = cmd
        .args(["-c", &script])
        .env("WHARF_STEP_SOCKET", socket)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (parent, name) = cgroup.rsplit_once('/').unwrap();
    // A cgroup made here only where the agent looks (v2, or v1's memory hierarchy): a
    // fresh v1 cpuset takes no process.
    let dirs: Vec<PathBuf> = wharf_runtime::cgroup_dirs(parent)
        .into_iter()
        .map(|d| d.join(name))
        .filter(|d| !made || d.is_dir() || !d.starts_with("/sys/fs/cgroup/cpuset"))
        .collect();
    for d in &dirs {
        if made {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(d.join("cgroup.procs"), child.id().to_string())
            .unwrap_or_else(|e| panic!("joining {}: {e}", d.display()));
    }
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    if made {
        for d in &dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
    out
}

#[test]
fn a_step_is_refused_outside_a_job_to_another_user_and_for_a_job_that_is_not_running() {
    let test = "a_step_is_refused_outside_a_job_to_another_user_and_for_a_job_that_is_not_running";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let bob = user("wharf-bob");
    let done = submitted_id(&c.wharf_as(&alice, &["submit", "--wrap", "true"]));
    c.wait_done(done, Duration::from_secs(30));
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "-t", "2m", "--wrap", "sleep 120"]));
    c.wait_running(id);
    // The socket name, from the job's own environment.
    let deadline = Instant::now() + Duration::from_secs(10);
    let socket = loop {
        let found = job_pids(&c, id).into_iter().find_map(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            env.split(|&b| b == 0)
                .find_map(|kv| kv.strip_prefix(b"WHARF_STEP_SOCKET="))
                .map(|v| String::from_utf8_lossy(v).into_owned())
        });
        if let Some(s) = found {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "no job process shows WHARF_STEP_SOCKET"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(socket.starts_with("@wharf-step-"), "{socket}");
    // No socket named: not in a job.
    let out = c.wharf_as(&bob, &["step", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("only inside a Wharf job"),
        "{}",
        stderr(&out)
    );
    // The socket named, but the caller is in no job's sandbox.
    let out = setpriv(&bob)
        .args([wharf_bin(), "step", "--", "true"])
        .env("WHARF_STEP_SOCKET", &socket)
        .current_dir("/")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("in no job's sandbox"),
        "{}",
        stderr(&out)
    );
    // Bob's process inside alice's job's batch task's cgroup (put there by root): not alice,
    // refused.
    let job_cgroup = format!("/{0}/wharf-{id}/wharf-{id}", c.cgroup_parent);
    let out = step_from_cgroup(&socket, Some(&bob), &job_cgroup, false);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        stderr(&out).contains("belongs to another user"),
        "{}\n{}",
        stderr(&out),
        c.log()
    );
    // A process in the sandbox cgroup of a job that ended, or never was.
    let ended = format!("/{}/wharf-{done}", c.cgroup_parent);
    let out = step_from_cgroup(&socket, None, &ended, true);
    assert!(
        stderr(&out).contains(&format!("job {done} is not running: it ended COMPLETED")),
        "{}",
        stderr(&out)
    );
    let none = format!("/{}/wharf-999999", c.cgroup_parent);
    let out = step_from_cgroup(&socket, None, &none, true);
    assert!(stderr(&out).contains("no job 999999"), "{}", stderr(&out));
    // None of these started a step.
    assert!(c.job(id)["steps"].as_array().is_none_or(|s| s.is_empty()));
    c.wharf(&["cancel", &id.to_string()]);
}

/// `text` as a script file readable by every user, in a directory jobs can see (theirs is a
/// private /tmp).
fn script_file(dir: &Path, name: &str, text: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path.display().to_string()
}

#[test]
fn step_tasks_see_only_the_jobs_gpus_one_each_when_asked() {
    let test = "step_tasks_see_only_the_jobs_gpus_one_each_when_asked";
    if !can_run(test) {
        return;
    }
    let (_dev, c) = crate::gpu::gpu_cluster(&[0, 1, 2, 3]);
    if !c.has_cpus(test, 2) {
        return;
    }
    let alice = user("wharf-alice");
    let home = c.home(&alice);
    let dir = scratch("wharf-steps-");
    let show = script_file(
        dir.path(),
        "gpus.sh",
        "echo TASK PROCID=$SLURM_PROCID VISIBLE=$(ls /dev | grep '^nvidia[0-9]' | tr '\\n' ,) \
         CUDA=$CUDA_VISIBLE_DEVICES GPUS=$WHARF_GPUS\n",
    );
    let w = wharf_bin();
    let h = home.display();
    let script = format!(
        "echo BATCH GPUS=$WHARF_GPUS; \
         {w} step -o {h}/wharf-%j.out.step%s --ntasks-per-node 2 --gpus-per-task 1 -- sh {show}; \
         echo RESULT ONE=$?; \
         {w} step -o {h}/wharf-%j.out.step%s --ntasks-per-node 2 -- sh {show}; echo RESULT ALL=$?; \
         {w} step --ntasks-per-node 2 --gpus-per-task 2 -- true; echo RESULT TOO_MANY=$?"
    );
    let id = submitted_id(&c.wharf_as(
        &alice,
        &[
            "submit", "--gpus", "2", "--cpus", "2", "--mem", "64M", "-t", "2m", "--wrap", &script,
        ],
    ));
    let job = c.wait_done(id, Duration::from_secs(60));
    let out = home.join(format!("wharf-{id}.out"));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(job["state"], "COMPLETED", "{job}\n{text}");
    let held: Vec<String> = words(&out, "BATCH")["GPUS"]
        .split(',')
        .map(str::to_string)
        .collect();
    assert_eq!(held.len(), 2, "{text}");
    assert_eq!(words(&out, "RESULT ONE")["ONE"], "0", "{text}");
    assert_eq!(words(&out, "RESULT ALL")["ALL"], "0", "{text}");
    assert_eq!(words(&out, "RESULT TOO_MANY")["TOO_MANY"], "1", "{text}");
    assert!(
        text.contains("asks for 4 GPU(s) on node") && text.contains("has 2 there"),
        "{text}"
    );
    // Each task's own file, as `--output` named it.
    let task = |step: u32, rank: u32| {
        let name = match rank {
            0 => format!("wharf-{id}.out.step{step}"),
            r => format!("wharf-{id}.out.step{step}.rank{r}"),
        };
        words(&home.join(name), "TASK")
    };
    // One each: its own of the job's two, as device 0 for CUDA.
    let mut seen = vec![];
    for rank in 0..2 {
        let t = task(0, rank);
        assert!(held.contains(&t["GPUS"]), "{t:?} outside {held:?}");
        assert_eq!(t["VISIBLE"], format!("nvidia{},", t["GPUS"]), "{t:?}");
        assert_eq!(t["CUDA"], "0", "{t:?}");
        seen.push(t["GPUS"].clone());
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 2, "each task its own GPU");
    // Without --gpus-per-task every task sees the job's two, and only those.
    for rank in 0..2 {
        let t = task(1, rank);
        let all: String = held.iter().map(|g| format!("nvidia{g},")).collect();
        assert_eq!(t["VISIBLE"], all, "{t:?}");
    }
}

/// Submits, as alice, a job whose step 0 (`sleep 300`, which reads nothing) is sent `bytes`
/// of input by a caller killed 3 s in; the job's script then runs `then`.
fn step_with_killed_caller(c: &Cluster, bytes: u64, then: &str) -> u64 {
    let alice = user("wharf-alice");
    let w = wharf_bin();
    let script =
        format!("head -c {bytes} /dev/zero | {w} step -- sleep 300 & sleep 3; kill -9 $!; {then}");
    submitted_id(&c.wharf_as(&alice, &["submit", "-t", "2m", "--wrap", &script]))
}

/// Whether step `step` of job `id` (one task on the node) has processes left.
fn step_busy(c: &Cluster, id: u64, step: u32) -> bool {
    let parent = &c.cgroup_parent;
    !cgroup_procs(&format!("/{parent}/wharf-{id}/wharf-{id}.s{step}.0")).is_empty()
}

/// Waits (20 s at most) until `done`, failing with `what`, job `id` and the log.
pub(crate) fn wait_for(c: &Cluster, id: u64, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what}: {}\n{}",
            c.job(id),
            c.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_step_stops_when_its_caller_is_killed_and_when_its_job_is_cancelled() {
    let test = "a_step_stops_when_its_caller_is_killed_and_when_its_job_is_cancelled";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    // Step 0's caller is killed after a while; step 1 runs until the job is cancelled. Step
    // 0's task reads none of the 2 MB its caller sent, all of it and its end taken by then
    // (on an idle machine): the caller's agent, still asking whether the task has it all,
    // sees the hang-up too.
    let w = wharf_bin();
    let id = step_with_killed_caller(&c, 2_000_000, &format!("{w} step -- sleep 300; echo never"));
    wait_for(&c, id, "step 1 runs", || step_busy(&c, id, 1));
    // Its caller gone, step 0 was stopped.
    wait_for(&c, id, "step 0 stopped", || !step_busy(&c, id, 0));
    // Its processes gone, its end still has to reach the controller.
    wait_for(&c, id, "step 0's end recorded", || {
        !c.job(id)["steps"][0]["exit"].is_null()
    });
    let steps = c.job(id)["steps"].clone();
    assert_eq!(steps[0]["exit"]["cancelled"], true, "{steps}");
    c.wharf(&["cancel", &id.to_string()]);
    let job = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(job["state"], "CANCELLED", "{job}");
    wait_for(&c, id, "step 1 stopped", || !step_busy(&c, id, 1));
    wait_for(&c, id, "both steps recorded as cancelled", || {
        let job = c.job(id);
        let steps = job["steps"].as_array().cloned().unwrap_or_default();
        steps.len() == 2 && steps.iter().all(|s| s["exit"]["cancelled"] == true)
    });
}

/// A caller killed while its step's tasks read none of its input, and more of it waits than
/// the controller holds for the step: its agent, pushing that input again and again, sees the
/// hang-up all the same, and the step is stopped. Before, the push went on until the job
/// ended, and so did the step.
#[test]
fn a_step_stops_when_its_caller_is_killed_with_input_its_tasks_never_read() {
    let test = "a_step_stops_when_its_caller_is_killed_with_input_its_tasks_never_read";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let id = step_with_killed_caller(&c, 16_000_000, "sleep 300");
    wait_for(&c, id, "the step never ran", || step_busy(&c, id, 0));
    wait_for(&c, id, "the step outlived its caller", || {
        !c.job(id)["steps"][0]["exit"].is_null()
    });
    let steps = c.job(id)["steps"].clone();
    assert_eq!(steps[0]["exit"]["cancelled"], true, "{steps}");
    assert!(!step_busy(&c, id, 0));
    c.wharf(&["cancel", &id.to_string()]);
}

#[test]
fn a_step_is_waited_for_through_a_restart_of_its_agent() {
    let test = "a_step_is_waited_for_through_a_restart_of_its_agent";
    if !can_run(test) {
        return;
    }
    let mut c = Cluster::start();
    let alice = user("wharf-alice");
    let home = c.home(&alice);
    let w = wharf_bin();
    // Output before the restart, and after: each line reaches the caller once.
    let script = format!(
        "{w} step -- sh -c 'echo BEFORE; sleep 8; echo AFTER; exit 7'; echo RESULT STATUS=$?"
    );
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "-t", "2m", "--wrap", &script]));
    wait_for(&c, id, "the step never ran", || step_busy(&c, id, 0));
    // Its first line has reached the caller: the restarted agent sends it again (it is
    // still in the task's file), and the caller writes it only once.
    let out = home.join(format!("wharf-{id}.out"));
    wait_for(&c, id, "no output came back", || {
        std::fs::read_to_string(&out).is_ok_and(|t| t.contains("BEFORE\n"))
    });
    // Controller and agent die together and come back; the job and its step run on.
    c.kill9();
    c.spawn();
    c.wait_node_up();
    let job = c.wait_done(id, Duration::from_secs(60));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(job["state"], "COMPLETED", "{job}\n{text}\n{}", c.log());
    assert_eq!(words(&out, "RESULT")["STATUS"], "7", "{text}");
    assert!(
        text.contains(&format!("waiting for step {id}.0 again")),
        "{text}"
    );
    for word in ["BEFORE", "AFTER"] {
        let n = text.lines().filter(|l| *l == word).count();
        assert_eq!(n, 1, "{word} should arrive once:\n{text}");
    }
    assert_eq!(job["steps"][0]["exit"]["code"], 7, "{job}");
}

#[test]
fn srun_outside_a_job_runs_the_command_as_a_job_or_says_which_flag_has_no_meaning_there() {
    let test =
        "srun_outside_a_job_runs_the_command_as_a_job_or_says_which_flag_has_no_meaning_there";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let out = c.wharf_as(
        &alice,
        &[
            "srun",
            "-n",
            "1",
            "-t",
            "1",
            "--mem",
            "64M",
            "sh",
            "-c",
            "echo srun-outside tasks=$SLURM_NTASKS; exit 3",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("srun-outside tasks=1"),
        "{}",
        stdout(&out)
    );
    let out = c.wharf_as(&alice, &["srun", "-l", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let why = stderr(&out);
    assert!(
        why.contains("runs the command as a new job (wharf run)") && why.contains("--label"),
        "{why}"
    );
}

/// The step socket is the agent's, shared by every job on the node: one job's processes
/// may hold at most `MAX_CALLS_PER_JOB` (64) calls open, and a call that sends no request is
/// closed after 10 s. Before, a job could open connections until the root agent ran out of
/// descriptors (and buffer a megabyte on each), stalling every job's launches on the node.
#[test]
fn one_job_cannot_hold_the_step_socket_open_without_bounds() {
    use std::os::unix::fs::PermissionsExt;
    let test = "one_job_cannot_hold_the_step_socket_open_without_bounds";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let dir = scratch("wharf-step-calls-");
    let program = script_file(
        dir.path(),
        "calls.py",
        r#"
import os, socket, time
name = "\0" + os.environ["WHARF_STEP_SOCKET"].lstrip("@")
def call():
    s = socket.socket(socket.AF_UNIX)
    s.connect(name)
    s.settimeout(30)
    return s
held = [call() for _ in range(64)]
time.sleep(1)
extra = call()
print("EXTRA", extra.recv(4096).decode().strip(), flush=True)
for s in held:
    s.close()
# The agent sees the closes as they come: asked again until it has room (10 s at most).
deadline = time.time() + 10
while True:
    again = call()
    again.sendall(b"not json\n")
    said = again.recv(4096).decode().strip()
    if "the limit is" not in said or time.time() > deadline:
        break
    time.sleep(0.1)
print("AGAIN", said, flush=True)
silent = call()
start = time.time()
got = silent.recv(4096).decode().strip()
print("SILENT", round(time.time() - start), got, flush=True)
"#,
    );
    // Alice's output goes beside the program.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out = dir.path().join("calls.out");
    let id = submitted_id(&c.wharf_as(
        &alice,
        &[
            "submit",
            "-t",
            "2m",
            "-o",
            &out.display().to_string(),
            "--wrap",
            &format!("python3 {program}"),
        ],
    ));
    c.wait_done(id, Duration::from_secs(90));
    let said = std::fs::read_to_string(&out).unwrap_or_default();
    let line = |tag: &str| {
        said.lines()
            .find(|l| l.starts_with(tag))
            .unwrap_or_else(|| panic!("no {tag} line in:\n{said}\n{}", c.log()))
            .to_string()
    };
    assert!(
        line("EXTRA").contains(&format!(
            "job {id} has 64 step calls open on this node; the limit is 64"
        )),
        "{said}"
    );
    // Calls closed give their room back.
    assert!(line("AGAIN").contains("bad step request"), "{said}");
    let silent = line("SILENT");
    assert!(silent.contains("no request within 10s"), "{said}");
    let secs: u64 = silent.split(' ').nth(1).unwrap().parse().unwrap();
    assert!((9..=20).contains(&secs), "{said}");
}

/// A step's time limit is what its job had left when it started: when an admin raises the
/// job's, the step's moves with it, so the step outlives the job's old end too.
#[test]
fn a_step_follows_its_jobs_time_limit_when_it_is_raised() {
    let test = "a_step_follows_its_jobs_time_limit_when_it_is_raised";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let home = c.home(&alice);
    let w = wharf_bin();
    let script = format!("{w} step -- sleep 9; echo STEP=$?");
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "-t", "5s", "--wrap", &script]));
    c.wait_running(id);
    // The step is under way before the limit changes.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c.job(id)["steps"].as_array().is_none_or(|s| s.is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "no step: {}",
            c.job(id)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = c.wharf(&["update", &id.to_string(), "--time", "1h"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = c.wait_done(id, Duration::from_secs(40));
    let text = std::fs::read_to_string(home.join(format!("wharf-{id}.out"))).unwrap();
    assert_eq!(job["state"], "COMPLETED", "{job}\n{text}");
    assert!(text.contains("STEP=0"), "{text}");
}

/// A step called from under the job's private /tmp is warned that its tasks, each a sandbox
/// with a /tmp of its own, cannot see that directory (they start in /), instead of silently.
#[test]
fn a_step_called_from_the_jobs_private_tmp_is_warned_its_tasks_cannot_see_it() {
    let test = "a_step_called_from_the_jobs_private_tmp_is_warned_its_tasks_cannot_see_it";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let w = wharf_bin();
    // And a quiet step still says why it failed (as srun -Q): an output it cannot open.
    let script = format!(
        "mkdir -p /tmp/d && cd /tmp/d && {w} step -- pwd; cd /; \
         {w} step -q -o /proc/no-such-file -- true; echo QUIET=$?"
    );
    let (_, text) = c.completed(&alice, &[], &script, Duration::from_secs(30));
    assert!(
        text.contains("the step's tasks cannot see /tmp/d") && text.contains("\n/\n"),
        "{text}"
    );
    assert!(
        text.contains("ended FAILED: ") && text.contains("no-such-file"),
        "{text}"
    );
    assert!(!text.contains("QUIET=0"), "{text}");
}

/// A job whose work runs in a step is measured with it: `wharf eff` and the job's `acct`
/// line count the step's CPU time, and the step's own line shows it (before, both said
/// nothing was used, and eff advised fewer CPUs).
#[test]
fn what_a_step_used_counts_in_its_jobs_efficiency_and_accounting() {
    let test = "what_a_step_used_counts_in_its_jobs_efficiency_and_accounting";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let w = wharf_bin();
    // About a second of CPU in the step, none in the batch command.
    let script = format!("{w} step -q -- sh -c 'end=$(($(date +%s) + 2)); while [ $(date +%s) -lt $end ]; do :; done'");
    let (job, _) = c.completed(&alice, &[], &script, Duration::from_secs(30));
    let id = job["id"].as_u64().unwrap();
    let eff: serde_json::Value = serde_json::from_slice(
        &c.wharf_as(&alice, &["eff", &id.to_string(), "--json"])
            .stdout,
    )
    .unwrap();
    let cpu_ms = eff["usage"]["cpu_time_ms"].as_u64().unwrap_or(0);
    assert!(cpu_ms >= 500, "the step's CPU time is the job's: {eff}");
    let out = c.wharf_as(
        &alice,
        &[
            "acct",
            "-j",
            &id.to_string(),
            "--steps",
            "-o",
            "JobID,TotalCPU",
            "--parsable",
        ],
    );
    let text = stdout(&out);
    let step_line = text
        .lines()
        .find(|l| l.starts_with(&format!("{id}.0|")))
        .unwrap_or_else(|| panic!("no step line: {text}{}", stderr(&out)));
    assert_ne!(step_line, format!("{id}.0||"), "{text}");
}

/// srun's options of Slurm scripts, inside a job: `-D` runs the tasks in another directory,
/// `--export=NONE,NAME=VALUE` gives them only the job's variables and those set (`ALL`
/// everything of the caller's), and `-u` writes a part of a line as it comes (a progress
/// bar's), where output otherwise goes out by whole lines.
#[test]
fn srun_in_a_job_takes_its_directory_environment_and_unbuffered_output() {
    let test = "srun_in_a_job_takes_its_directory_environment_and_unbuffered_output";
    if !can_run(test) {
        return;
    }
    let shared = scratch("wharf-srun-");
    let open = std::os::unix::fs::PermissionsExt::from_mode(0o777);
    std::fs::set_permissions(shared.path(), open).unwrap();
    let dir = shared.path().display().to_string();
    let c = Cluster::start_with(&format!("mounts = [\"{dir}\"]"));
    let alice = user("wharf-alice");
    let w = wharf_bin();
    // The job's script waits until the task's part of a line is in the job's output, then
    // says MID and lets the task finish its line: unbuffered, MID follows the part (line by
    // line, the script would give up waiting after 30 s and MID would come first).
    let script = format!(
        "cd {dir} && mkdir sub; export MINE=1; \
         {w} srun -Q -D sub -- pwd; \
         {w} srun -Q --export=NONE,SET=2 -- sh -c 'echo \"MINE=${{MINE:-unset}} SET=$SET JOB=$SLURM_JOB_ID\"'; \
         {w} srun -Q --export=ALL -- sh -c 'echo ALL_MINE=$MINE'; \
         {w} srun -Q -D nowhere -- pwd; echo NOWHERE=$?; \
         {w} srun -Q -t 0:02 -J short -- sleep 30; echo SHORT=$?; \
         {w} srun -Q -u -- sh -c 'printf part; while [ ! -e go ]; do sleep 0.1; done; echo rest' & \
         for i in $(seq 300); do grep -q part out.txt && break; sleep 0.1; done; \
         echo MID; touch go; wait"
    );
    let out = format!("{dir}/out.txt");
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "-o", &out, "--wrap", &script]));
    let job = c.wait_done(id, Duration::from_secs(60));
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    assert_eq!(job["state"], "COMPLETED", "{job}\n{text}");
    assert!(text.contains(&format!("{dir}/sub\n")), "{text}");
    assert!(
        text.contains(&format!("MINE=unset SET=2 JOB={id}\n")),
        "{text}"
    );
    assert!(text.contains("ALL_MINE=1\n"), "{text}");
    // A directory that is not there is said to be so (the tasks started in / before).
    assert!(
        text.contains("--chdir") && text.contains("/nowhere: no such directory"),
        "{text}"
    );
    assert!(text.contains("NOWHERE=1\n"), "{text}");
    assert!(text.contains("partMID\nrest\n"), "{text}");
    // Its own time limit (-t, as srun's) ends the step, not the job, which goes on.
    assert!(text.contains("SHORT=143\n"), "{text}");
    assert!(
        text.contains("CANCELLED AT") && text.contains("DUE TO TIME LIMIT"),
        "{text}"
    );
    let steps = job["steps"].as_array().unwrap();
    let short = steps
        .iter()
        .find(|s| s["name"] == "short")
        .expect("step named short");
    assert_eq!(short["time_limit"], 2, "{short}");
    let ran = short["end_time"].as_u64().unwrap() - short["start_time"].as_u64().unwrap();
    assert!(ran < 20_000, "it ran {ran} ms, not cut at its 2 s: {short}");
}

/// `wharf cancel JOB.STEP` (scancel's): the owner stops one step of a running job, whose
/// caller hears it was cancelled and by whom, and the job goes on; another user may not; a
/// step that is not there, or has ended, is refused saying so.
#[test]
fn one_step_of_a_running_job_is_cancelled_by_its_owner_and_the_job_goes_on() {
    let test = "one_step_of_a_running_job_is_cancelled_by_its_owner_and_the_job_goes_on";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let (alice, bob) = (user("wharf-alice"), user("wharf-bob"));
    let w = wharf_bin();
    let script = format!("{w} srun -- sleep 60; echo STEP0=$?; {w} srun -- true; echo DONE");
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "--wrap", &script]));
    wait_for(&c, id, "step 0 to run", || step_busy(&c, id, 0));
    let step = format!("{id}.0");
    let out = c.wharf_as(&bob, &["cancel", &step]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("belongs to another user"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf_as(&alice, &["cancel", &format!("{id}.7")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("has no step 7"), "{}", stderr(&out));
    let out = c.wharf_as(&alice, &["cancel", &format!("{id}.batch")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is not a step"), "{}", stderr(&out));
    let out = c.wharf_as(&alice, &["cancel", &step]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("step {step}: cancelling\n"));
    let job = c.wait_done(id, Duration::from_secs(30));
    let text = std::fs::read_to_string(c.home(&alice).join(format!("wharf-{id}.out"))).unwrap();
    assert_eq!(job["state"], "COMPLETED", "{job}\n{text}");
    assert!(
        text.contains(&format!("step {step} ended CANCELLED: "))
            && text.contains("cancelled by wharf-alice"),
        "{text}"
    );
    assert!(
        text.contains("STEP0=143\n") && text.contains("DONE"),
        "{text}"
    );
    assert_eq!(job["steps"][0]["stop"], "cancelled by wharf-alice", "{job}");
    let out = c.wharf_as(&alice, &["cancel", &step]);
    assert!(
        stderr(&out).contains("has ended (COMPLETED)"),
        "{}",
        stderr(&out)
    );
}

/// A script with `#SBATCH` lines runs once, as sbatch runs it: as rank 0, its `srun` then
/// runs one task per rank (before, every task ran the script, and each srun in it, over
/// again); its other task writes no file of its own. `--every-task` asks for Wharf's way.
#[test]
fn an_sbatch_script_of_several_tasks_runs_once_and_its_srun_once_per_rank() {
    let test = "an_sbatch_script_of_several_tasks_runs_once_and_its_srun_once_per_rank";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let w = wharf_bin();
    let home = c.home(&alice);
    let text = format!(
        "#!/bin/sh\n#SBATCH --ntasks-per-node=2 --cpus-per-task=1\n\
         echo \"BATCH $SLURM_PROCID of $SLURM_NTASKS\"; echo \"NPROC $(nproc)\"; \
         echo \"CPT $SLURM_CPUS_PER_TASK\"\n\
         {w} srun -Q sh -c 'echo \"TASK $SLURM_PROCID\"'\n"
    );
    let script = home.join("two.sh");
    std::fs::write(&script, text).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["submit"];
        args.extend_from_slice(extra);
        args.push("two.sh");
        let out = c.wharf_as(&alice, &args);
        let id = submitted_id(&out);
        let job = c.wait_done(id, Duration::from_secs(30));
        // Rank 1 of a job that runs its command in every task writes a file of its own.
        let text = ["", ".rank1"]
            .map(|rank| std::fs::read_to_string(home.join(format!("wharf-{id}.out{rank}"))))
            .map(Result::unwrap_or_default)
            .concat();
        assert_eq!(job["state"], "COMPLETED", "{job}\n{text}");
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        (id, lines, stderr(&out))
    };
    let (id, lines, warned) = run(&[]);
    // The batch command has both of the job's CPUs, as Slurm's batch step has its node's.
    // ... and the job's -c as SLURM_CPUS_PER_TASK, so `srun -c $SLURM_CPUS_PER_TASK` fits.
    assert_eq!(
        lines,
        ["BATCH 0 of 2", "CPT 1", "NPROC 2", "TASK 0", "TASK 1"]
    );
    assert!(!warned.contains("times over"), "{warned}");
    assert!(!home.join(format!("wharf-{id}.out.rank1")).exists());
    // Every task runs it: each srun in it runs both tasks again.
    let (_, lines, warned) = run(&["--every-task"]);
    assert_eq!(
        lines,
        [
            "BATCH 0 of 2",
            "BATCH 1 of 2",
            "CPT 1",
            "CPT 1",
            "NPROC 1",
            "NPROC 1",
            "TASK 0",
            "TASK 0",
            "TASK 1",
            "TASK 1"
        ]
    );
    assert!(!warned.contains("error"), "{warned}");
}
