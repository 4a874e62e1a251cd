//! `wharf run` (and `srun` outside a job) stopped by a signal cancels its job, as `srun`
//! does, instead of leaving it running, or queued to start later, with nobody attached.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::harness::*;

/// Starts `wharf ARGS` against `c` in the background, its output kept.
fn client(c: &Cluster, args: &[&str]) -> Child {
    Command::new(wharf_bin())
        .args(args)
        .env("WHARF_SOCKET", &c.socket)
        .current_dir(&c.dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The id of the cluster's only job, once it is in `state`.
fn only_job_in(c: &Cluster, state: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = c.wharf(&["queue", "--json"]);
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if let Some(job) = list["jobs"].as_array().and_then(|j| j.first()) {
            if job["state"] == state {
                return job["id"].as_u64().unwrap();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no job {state}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `sig` to `child` and returns its exit status and stderr, failing if it lives on
/// for more than `limit`.
fn stop(mut child: Child, sig: Signal, limit: Duration) -> (Option<i32>, String) {
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("the client outlived {sig} by {limit:?}: {}", stderr(&out));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), stderr(&out))
}

#[test]
fn an_interrupted_run_cancels_its_running_job() {
    if !can_run("an_interrupted_run_cancels_its_running_job") {
        return;
    }
    let c = Cluster::start();
    let child = client(&c, &["run", "--", "sleep", "100"]);
    let id = only_job_in(&c, "RUNNING");
    let t0 = Instant::now();
    let (code, err) = stop(child, Signal::SIGINT, Duration::from_secs(10));
    let job = c.wait_done(id, Duration::from_secs(5));
    assert_eq!(job["state"], "CANCELLED", "{job}");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains(&format!("cancelling job {id}")), "{err}");
    // The client waited for the end and said it.
    assert!(err.contains(&format!("job {id} CANCELLED")), "{err}");
}

#[test]
fn a_terminated_srun_cancels_its_pending_job_which_never_starts() {
    if !can_run("a_terminated_srun_cancels_its_pending_job_which_never_starts") {
        return;
    }
    let c = Cluster::start();
    // A job that fills the node keeps the next one pending.
    let cpus = c.node_cpus().to_string();
    let blocker = submitted_id(&c.wharf(&["submit", "--cpus", &cpus, "--wrap", "sleep 100"]));
    c.wait_running(blocker);
    // Outside a job, srun runs the command as `wharf run` does.
    let child = Command::new(wharf_bin())
        .args(["srun", "-c", &cpus, "sleep", "100"])
        .env("WHARF_SOCKET", &c.socket)
        .env_remove("WHARF_JOB_ID")
        .env_remove("SLURM_JOB_ID")
        .env_remove("WHARF_STEP_SOCKET")
        .current_dir(&c.dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let id = loop {
        let out = c.wharf(&["queue", "--json"]);
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let pending = list["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|j| j["id"] != blocker && j["state"] == "PENDING");
        if let Some(job) = pending {
            break job["id"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "srun's job never queued: {list}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let (code, err) = stop(child, Signal::SIGTERM, Duration::from_secs(10));
    assert_eq!(c.job(id)["state"], "CANCELLED");
    assert_eq!(code, Some(143), "{err}");
    assert!(err.contains(&format!("cancelling job {id}")), "{err}");
    // With the node free again, the cancelled job still never starts.
    let out = c.wharf(&["cancel", &blocker.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    c.wait_done(blocker, Duration::from_secs(15));
    std::thread::sleep(Duration::from_secs(1));
    let job = c.job(id);
    assert_eq!(job["state"], "CANCELLED", "{job}");
    assert!(job["start_time"].is_null(), "{job}");
}

/// `nohup wharf run ...`: a hangup the client was started ignoring leaves the job alone, as
/// it leaves `srun` (before, the client took SIGHUP anyway and cancelled the job on logout).
#[test]
fn a_run_started_ignoring_hangups_keeps_its_job_through_one() {
    if !can_run("a_run_started_ignoring_hangups_keeps_its_job_through_one") {
        return;
    }
    let c = Cluster::start();
    let child = Command::new("nohup")
        .arg(wharf_bin())
        .args(["run", "--", "sleep", "100"])
        .env("WHARF_SOCKET", &c.socket)
        .current_dir(&c.dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = only_job_in(&c, "RUNNING");
    kill(Pid::from_raw(child.id() as i32), Signal::SIGHUP).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(c.job(id)["state"], "RUNNING");
    // Other signals still cancel it.
    let (code, err) = stop(child, Signal::SIGTERM, Duration::from_secs(10));
    assert_eq!(code, Some(143), "{err}");
    assert_eq!(
        c.wait_done(id, Duration::from_secs(5))["state"],
        "CANCELLED"
    );
}
