//! `wharf cancel --signal SIG` (scancel's `-s`): a running job's processes, or one step's,
//! take a signal and the job goes on; a job that is not running, a signal that is none and
//! another user's job are refused, and nothing changes.

use std::path::Path;
use std::time::Duration;

use crate::harness::*;

/// How many lines of `path` are `line`.
pub(crate) fn count(path: &Path, line: &str) -> usize {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter(|l| *l == line).count()
}

/// Waits (20 s at most) until `path` has `n` lines `line`, failing with job `id` and the log.
pub(crate) fn wait_lines(c: &Cluster, id: u64, path: &Path, line: &str, n: usize) {
    let what = format!("no {n} lines {line:?} in {}", path.display());
    crate::steps::wait_for(c, id, &what, || count(path, line) >= n);
}

#[test]
fn a_signal_reaches_a_running_jobs_processes_and_the_job_goes_on() {
    let test = "a_signal_reaches_a_running_jobs_processes_and_the_job_goes_on";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let (alice, bob) = (user("wharf-alice"), user("wharf-bob"));
    let state = |id: u64| c.job(id)["state"].as_str().unwrap().to_string();
    // The shell runs its trap once the short sleep it waits on returns (the sleep takes the
    // signal too, and ends of it).
    let script = "trap 'echo got-usr1' USR1; echo ready; while :; do sleep 0.2; done";
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "--wrap", script]));
    let out_file = c.home(&alice).join(format!("wharf-{id}.out"));
    c.wait_running(id);
    wait_lines(&c, id, &out_file, "ready", 1);
    let ids = id.to_string();

    // Not a signal: refused by the command itself, and the job runs on untouched.
    for bad in ["FOO", "0", "SIGUSR3"] {
        let out = c.wharf_as(&alice, &["cancel", "--signal", bad, &ids]);
        assert!(!out.status.success(), "{bad}");
        assert!(stderr(&out).contains("is no signal"), "{}", stderr(&out));
    }
    // Another user's job: refused.
    let out = c.wharf_as(&bob, &["cancel", "--signal", "USR1", &ids]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("belongs to another user"),
        "{}",
        stderr(&out)
    );
    // A job that runs its command in every task has no batch script to single out.
    let out = c.wharf_as(&alice, &["cancel", "--signal", "USR1", "-b", &ids]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no batch script"), "{}", stderr(&out));
    // None of them was recorded, so none can reach the job later either.
    let job = c.job(id);
    assert!(
        job.get("signals").is_none(),
        "a refused signal was recorded: {job}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(count(&out_file, "got-usr1"), 0, "a refused signal was sent");
    assert_eq!(state(id), "RUNNING");

    // Its owner's signal reaches it; it goes on running.
    let out = c.wharf_as(&alice, &["cancel", "--signal=USR1", &ids]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("job {id}: sent SIGUSR1\n"));
    wait_lines(&c, id, &out_file, "got-usr1", 1);
    // By number, as scancel (its short flag, called by its name), with JSON.
    let home = c.home(&alice);
    let scancel = slurm_link(&home, "scancel");
    let scancel = scancel.to_str().unwrap();
    let out = as_user(
        &alice,
        &home,
        scancel,
        &["-s", "10", "--json", &ids],
        &c.socket,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer[0]["id"], id, "{answer}");
    assert_eq!(answer[0]["state"], "RUNNING", "{answer}");
    wait_lines(&c, id, &out_file, "got-usr1", 2);
    std::thread::sleep(Duration::from_millis(500));
    let job = c.job(id);
    assert_eq!(job["state"], "RUNNING", "{job}");
    assert_eq!(count(&out_file, "got-usr1"), 2, "a signal came twice");
    assert_eq!(job["signals"].as_array().map(Vec::len), Some(2), "{job}");

    // A pending job has no processes to signal: refused, naming its state, and it stays.
    let held = submitted_id(&c.wharf_as(&alice, &["submit", "--hold", "--wrap", "true"]));
    let out = c.wharf_as(&alice, &["cancel", "-s", "USR1", &held.to_string()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("PENDING"), "{}", stderr(&out));
    let pending = c.job(held);
    assert_eq!(pending["state"], "PENDING", "{pending}");
    assert!(pending.get("signals").is_none(), "{pending}");

    // A cancel without --signal still ends it.
    assert!(c.wharf_as(&alice, &["cancel", &ids]).status.success());
    let done = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(done["state"], "CANCELLED", "{done}");
    // And an ended job takes no signal.
    let out = c.wharf_as(&alice, &["cancel", "-s", "USR1", &ids]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("has already ended"),
        "{}",
        stderr(&out)
    );
    c.wharf(&["cancel", &held.to_string()]);
}

/// A batch job's (`--once`) signal reaches its steps, as scancel's does, or its script alone
/// with -b; `JOB.STEP` one step alone.
#[test]
fn a_signal_reaches_one_step_the_steps_or_the_batch_script_as_asked() {
    let test = "a_signal_reaches_one_step_the_steps_or_the_batch_script_as_asked";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let w = wharf_bin();
    let script = format!(
        "trap 'echo batch-usr1' USR1; \
         {w} srun -- sh -c 'trap \"echo step-usr1\" USR1; echo step-ready; \
         while :; do sleep 0.2; done' & \
         echo batch-ready; while :; do sleep 0.2; done"
    );
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "--once", "--wrap", &script]));
    let out_file = c.home(&alice).join(format!("wharf-{id}.out"));
    c.wait_running(id);
    wait_lines(&c, id, &out_file, "batch-ready", 1);
    wait_lines(&c, id, &out_file, "step-ready", 1);
    let (ids, step) = (id.to_string(), format!("{id}.0"));
    let lines = || {
        (
            count(&out_file, "batch-usr1"),
            count(&out_file, "step-usr1"),
        )
    };

    // One step alone.
    let out = c.wharf_as(&alice, &["cancel", "-s", "USR1", &step]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("step {step}: sent SIGUSR1\n"));
    wait_lines(&c, id, &out_file, "step-usr1", 1);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(lines(), (0, 1));
    // A step has no batch script.
    let out = c.wharf_as(&alice, &["cancel", "-s", "USR1", "-b", &step]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("pick a batch job's script, which no step has"),
        "{}",
        stderr(&out)
    );
    // The batch script alone.
    let out = c.wharf_as(&alice, &["cancel", "-s", "USR1", "-b", &ids]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_lines(&c, id, &out_file, "batch-usr1", 1);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(lines(), (1, 1));
    // The job: its steps, not its script.
    let out = c.wharf_as(&alice, &["cancel", "-s", "SIGUSR1", &ids]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("to its steps"), "{}", stdout(&out));
    wait_lines(&c, id, &out_file, "step-usr1", 2);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(lines(), (1, 2));
    let job = c.job(id);
    assert_eq!(job["state"], "RUNNING", "{job}");
    assert!(job["steps"][0]["exit"].is_null(), "{job}");
    // A step that is not there.
    let out = c.wharf_as(&alice, &["cancel", "-s", "USR1", &format!("{id}.5")]);
    assert!(stderr(&out).contains("has no step 5"), "{}", stderr(&out));

    assert!(c.wharf_as(&alice, &["cancel", &ids]).status.success());
    let done = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(done["state"], "CANCELLED", "{done}");
}
