//! Preemption and requeue on a live one-node cluster: a job of a higher partition tier stops
//! a lower one (TERM, the grace period, KILL), which is requeued with its id, submit time and
//! a restart count and runs again after it, appending to its output; or, in cancel mode, ends
//! PREEMPTED. `wharf requeue` and a bad `preempt_mode` say what is wrong.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::*;

/// `scav` (tier 0) with `mode`, `high` (tier 1), both over every node.
fn tiers(mode: &str) -> String {
    format!(
        "[[scheduler.partition]]\nname = \"scav\"\ndefault = true\npreempt_mode = \"{mode}\"\n\
         [[scheduler.partition]]\nname = \"high\"\npriority_tier = 1\n"
    )
}

/// Polls `job` (as root sees it) until `done` holds, for up to `secs` seconds.
fn wait_for(
    c: &Cluster,
    id: u64,
    secs: u64,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let job = c.job(id);
        if done(&job) {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "job {id}: {what}: {job}\nlog:\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_low_tier_job_is_requeued_for_a_high_tier_one_and_runs_again_after_it() {
    let name = "a_low_tier_job_is_requeued_for_a_high_tier_one_and_runs_again_after_it";
    if !can_run(name) {
        return;
    }
    let c = Cluster::start_with(&tiers("requeue"));
    let u = user("whpre-low");
    let cpus = c.node_cpus().to_string();
    let home = c.home(&u);
    // The first run traps TERM and says so in its output; the second just finishes.
    // The trap is set before the first line is written: the test preempts once it sees it.
    let low_script = "if [ \"$WHARF_RESTART_COUNT\" = 0 ]; then \
          trap 'echo got TERM; sleep 3; exit 0' TERM; fi; \
        echo run $WHARF_RESTART_COUNT $SLURM_RESTART_COUNT; \
        if [ \"$WHARF_RESTART_COUNT\" = 0 ]; then sleep 600 & wait; sleep 5; \
        else echo second run done; fi";
    let low = submitted_id(&c.wharf_as(
        &u,
        &[
            "submit", "--cpus", &cpus, "--mem", "16M", "-t", "10m", "--wrap", low_script,
        ],
    ));
    c.wait_running(low);
    let out = home.join(format!("wharf-{low}.out"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&out).is_ok_and(|t| t.contains("run 0 0")) {
        assert!(
            Instant::now() < deadline,
            "the low job never started its trap"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let submitted = c.job(low)["submit_time"].clone();

    let high = submitted_id(&c.wharf_as(
        &u,
        &[
            "submit",
            "-p",
            "high",
            "--cpus",
            &cpus,
            "--mem",
            "16M",
            "-t",
            "5m",
            "--wrap",
            "sleep 2; echo high",
        ],
    ));
    // The preemptor says in words whom it waits for, while the low job winds down. That can
    // be over within a few milliseconds (the pass runs with the submit, and TERM may end the
    // low job at once), so the requeue having happened also ends the wait; the words
    // themselves are tested in `scheduler/api/src/pending.rs`.
    let waiting = format!("waiting for job {low}, which is being stopped (preempted)");
    let shown = wait_for(&c, high, 20, "never waited for the low job", |j| {
        j["reason"].as_str().unwrap_or_default().contains(&waiting) || c.job(low)["restarts"] == 1
    });
    if shown["reason"]
        .as_str()
        .unwrap_or_default()
        .contains(&waiting)
    {
        assert_eq!(shown["state"], "PENDING", "{shown}");
    }
    // `show` says it too, unless the low job went first (the TERM reaches every process of
    // the job, its trap's children too, so it may go at once).
    let text = stdout(&c.wharf_as(&u, &["show", &high.to_string()]));
    assert!(
        text.contains(&waiting) || !text.contains("State: PENDING"),
        "{text}"
    );

    // The low job saw TERM and is back in the queue, same id and submit time, restarted once.
    let requeued = wait_for(&c, low, 20, "never requeued", |j| j["restarts"] == 1);
    assert_eq!(requeued["submit_time"], submitted, "{requeued}");
    let text = std::fs::read_to_string(&out).unwrap();
    // Exactly one TERM (the shell may add its own "Terminated" for the child it waited on),
    // and the node's word on why, as slurmstepd's.
    assert!(
        text.starts_with("run 0 0\n") && text.matches("got TERM\n").count() == 1,
        "the low job never saw TERM: {text:?}"
    );
    assert!(text.contains("DUE TO PREEMPTION ***\n"), "{text:?}");
    assert_eq!(
        text.matches("got TERM").count(),
        1,
        "TERM came twice: {text:?}"
    );
    assert!(
        ["PENDING", "STARTING", "RUNNING"].contains(&requeued["state"].as_str().unwrap()),
        "{requeued}"
    );
    if requeued["state"] == "PENDING" {
        let text = stdout(&c.wharf_as(&u, &["show", &low.to_string()]));
        assert!(
            text.contains("Requeued") && text.contains("1 time"),
            "{text}"
        );
    }

    let done = c.wait_done(high, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let done = c.wait_done(low, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    assert_eq!(done["restarts"], 1, "{done}");
    assert_eq!(done["submit_time"], submitted, "{done}");
    // It ran again only after the high job: its second start follows the high job's end.
    assert!(done["start_time"].as_u64() >= c.job(high)["end_time"].as_u64());
    // The second run's output follows the first's.
    let text = std::fs::read_to_string(&out).unwrap();
    // (The node's notice of the preemption comes in between, where its fork wrote it.)
    let lines: Vec<&str> = (text.lines())
        .filter(|l| *l != "Terminated" && !l.contains("DUE TO PREEMPTION"))
        .collect();
    assert_eq!(
        lines,
        ["run 0 0", "got TERM", "run 1 1", "second run done"],
        "{text:?}"
    );
}

#[test]
fn in_cancel_mode_the_preempted_job_ends_preempted() {
    if !can_run("in_cancel_mode_the_preempted_job_ends_preempted") {
        return;
    }
    let c = Cluster::start_with(&tiers("cancel"));
    let u = user("whpre-cancel");
    let cpus = c.node_cpus().to_string();
    let submit = |part: &str, script: &str| {
        submitted_id(&c.wharf_as(
            &u,
            &[
                "submit", "-p", part, "--cpus", &cpus, "--mem", "16M", "-t", "10m", "--wrap",
                script,
            ],
        ))
    };
    let low = submit("scav", "sleep 600");
    c.wait_running(low);
    let high = submit("high", "echo high");
    let done = c.wait_done(low, Duration::from_secs(30));
    assert_eq!(done["state"], "PREEMPTED", "{done}");
    assert_eq!(
        done["reason"],
        format!("preempted by job {high}").as_str(),
        "{done}"
    );
    let done = c.wait_done(high, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let queue = stdout(&c.wharf_as(&u, &["queue", "--all"]));
    assert!(queue.contains("PREEMPTED"), "{queue}");
}

#[test]
fn requeue_is_for_running_jobs_of_ones_own_and_says_why_not() {
    if !can_run("requeue_is_for_running_jobs_of_ones_own_and_says_why_not") {
        return;
    }
    let c = Cluster::start();
    let (ann, bob) = (user("whpre-ann"), user("whpre-bob"));
    let cpus = c.node_cpus().to_string();
    let submit = |u: &User, script: &str| {
        submitted_id(&c.wharf_as(
            u,
            &[
                "submit", "--cpus", &cpus, "--mem", "16M", "-t", "10m", "--wrap", script,
            ],
        ))
    };
    let running = submit(&ann, "sleep 600");
    c.wait_running(running);
    let pending = submit(&ann, "true");

    let out = c.wharf_as(&bob, &["requeue", &running.to_string()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("belongs to another user"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf_as(&ann, &["requeue", "987654"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no job 987654"), "{}", stderr(&out));
    let out = c.wharf_as(&ann, &["requeue", &pending.to_string()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!("job {pending} is pending")),
        "{}",
        stderr(&out)
    );
    assert_eq!(c.job(pending)["state"], "PENDING");
    let job = c.job(running);
    assert_eq!(job["state"], "RUNNING", "nothing changed: {job}");
    assert!(job["restarts"].is_null() && job["stop"].is_null(), "{job}");

    // Its owner requeues it: it goes back to the queue and (first in line) runs again.
    let out = c.wharf_as(&ann, &["requeue", &running.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let again = wait_for(&c, running, 30, "never ran again", |j| {
        j["restarts"] == 1 && j["state"] == "RUNNING"
    });
    assert!(again["start_time"].is_u64(), "{again}");
    // acct shows the job once; with --duplicates, its requeued run first.
    let acct = |extra: &[&str]| {
        let id = running.to_string();
        let args = [
            &["acct", "-j", &id, "-n", "-p", "-o", "JobID,State"][..],
            extra,
        ]
        .concat();
        let out = c.wharf_as(&ann, &args);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    assert_eq!(acct(&[]), format!("{running}|RUNNING|\n"));
    assert_eq!(
        acct(&["--duplicates"]),
        format!("{running}|REQUEUED|\n{running}|RUNNING|\n")
    );
    // --no-requeue is refused a requeue, with the reason.
    let fixed = submitted_id(&c.wharf_as(
        &ann,
        &[
            "submit",
            "--no-requeue",
            "--mem",
            "16M",
            "-t",
            "10m",
            "--wrap",
            "sleep 600",
        ],
    ));
    assert_eq!(c.job(fixed)["spec"]["requeue"], false);
    for id in [running, fixed] {
        assert!(c.wharf(&["cancel", &id.to_string()]).status.success());
    }
}

#[test]
fn a_bad_preempt_mode_is_refused_naming_the_key() {
    if !can_run("a_bad_preempt_mode_is_refused_naming_the_key") {
        return;
    }
    let dir = scratch("wharf-preempt-config-");
    let config = dir.path().join("wharf.toml");
    std::fs::write(
        &config,
        "[[scheduler.partition]]\nname = \"scav\"\npreempt_mode = \"suspend\"\n",
    )
    .unwrap();
    let out = Command::new(wharf_bin())
        .args(["controller", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("scheduler.partition \"scav\": preempt_mode \"suspend\""),
        "{err}"
    );
}
