//! `wharf cancel` with scancel's filters: by state, user, name and partition, the caller's
//! own jobs unless a user is named; `wharf queue -p`.

use std::time::Duration;

use crate::harness::*;

#[test]
fn cancel_picks_active_jobs_by_state_user_and_name() {
    if !can_run("cancel_picks_active_jobs_by_state_user_and_name") {
        return;
    }
    let c = Cluster::start();
    let (erin, fred) = (user("wharf-erin"), user("wharf-fred"));
    let held = |who: &User, name: &str| {
        submitted_id(&c.wharf_as(who, &["submit", "--hold", "-J", name, "--wrap", "true"]))
    };
    let (a1, a2, b) = (held(&erin, "a"), held(&erin, "a"), held(&erin, "b"));
    let theirs = held(&fred, "a");
    let state = |id: u64| c.job(id)["state"].as_str().unwrap().to_string();
    // Nothing named, nothing picked: refused, naming what to give.
    let out = c.wharf_as(&erin, &["cancel"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("-t STATE"), "{}", stderr(&out));
    // Pending jobs named `a`: hers only, not fred's.
    let out = c.wharf_as(&erin, &["cancel", "-t", "PD", "-n", "a"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        [state(a1), state(a2), state(b), state(theirs)],
        ["CANCELLED", "CANCELLED", "PENDING", "PENDING"]
    );
    // Another user's jobs are not hers to cancel: refused, and left as they are.
    let out = c.wharf_as(&erin, &["cancel", "-u", &fred.name]);
    assert!(!out.status.success());
    assert_eq!(state(theirs), "PENDING");
    // Filters narrow the ids given.
    let out = c.wharf_as(&erin, &["cancel", &b.to_string(), "-t", "R"]);
    assert!(out.status.success());
    assert!(
        stderr(&out).contains("nothing cancelled"),
        "{}",
        stderr(&out)
    );
    assert_eq!(state(b), "PENDING");
    // An admin cancels a named user's jobs, and narrows ids given to what the filters keep,
    // whoever's they are.
    let out = c.wharf(&["cancel", &b.to_string(), "-t", "R"]);
    assert!(
        stderr(&out).contains("nothing cancelled"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf(&["cancel", "-u", &fred.name]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(state(theirs), "CANCELLED");
    assert_eq!(state(b), "PENDING");
    // An array's running task is cancelled by itself: its pending tasks stay (before, the
    // array's id went to the controller and cancelled every task).
    let array =
        submitted_id(&c.wharf_as(&fred, &["submit", "--array", "0-2%1", "--wrap", "sleep 60"]));
    c.wait_running(array);
    let out = c.wharf_as(&fred, &["cancel", "-t", "R"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Stopped on its node first: CANCELLED once the node says it has ended.
    let done = c.wait_done(array, Duration::from_secs(20));
    assert_eq!(done["state"], "CANCELLED", "{done}");
    for task in [array + 1, array + 2] {
        assert_ne!(state(task), "CANCELLED", "task {task} was not running");
    }
    assert!(c
        .wharf_as(&fred, &["cancel", &array.to_string()])
        .status
        .success());
}

/// `wharf queue -p` and `wharf cancel -p` (squeue's and scancel's): the jobs of the partitions
/// named, a job that names none in the default one; another user sees each job's partition
/// though not its spec; a partition the cluster does not have is refused, naming those it has.
#[test]
fn queue_and_cancel_pick_jobs_by_partition() {
    if !can_run("queue_and_cancel_pick_jobs_by_partition") {
        return;
    }
    let c = Cluster::start_with(
        "[[scheduler.partition]]\nname = \"batch\"\ndefault = true\n\
         [[scheduler.partition]]\nname = \"debug\"\n",
    );
    let (erin, fred) = (user("wharf-pia"), user("wharf-quinn"));
    let held = |who: &User, args: &[&str]| {
        let mut all = vec!["submit", "--hold"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--wrap", "true"]);
        submitted_id(&c.wharf_as(who, &all))
    };
    let batch = held(&erin, &[]);
    let debug = held(&erin, &["-p", "debug"]);
    let fred_debug = held(&fred, &["-p", "debug"]);
    let ended = held(&erin, &["-p", "debug"]);
    assert!(c
        .wharf_as(&erin, &["cancel", &ended.to_string()])
        .status
        .success());
    c.wait_done(ended, Duration::from_secs(20));
    let listed = |who: &User, args: &[&str]| -> Vec<(u64, String)> {
        let mut all = vec!["queue"];
        all.extend_from_slice(args);
        let out = c.wharf_as(who, &all);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        let mut lines = text.lines();
        assert!(
            lines.next().unwrap().starts_with("JOBID  PARTITION  NAME"),
            "{text}"
        );
        lines
            .map(|l| {
                let mut words = l.split_whitespace();
                let id = words.next().unwrap().parse().unwrap();
                (id, words.next().unwrap().to_string())
            })
            .collect()
    };
    let (b, d) = ("batch".to_string(), "debug".to_string());
    // Fred sees erin's jobs' partitions, and picks by them.
    assert_eq!(
        listed(&fred, &[]),
        [
            (batch, b.clone()),
            (debug, d.clone()),
            (fred_debug, d.clone())
        ]
    );
    assert_eq!(
        listed(&fred, &["-p", "debug"]),
        [(debug, d.clone()), (fred_debug, d.clone())]
    );
    assert_eq!(listed(&fred, &["-p", "batch"]), [(batch, b.clone())]);
    assert_eq!(
        listed(&fred, &["-p", "debug", "--all", "-u", &erin.name]),
        [(debug, d.clone()), (ended, d.clone())]
    );
    let out = c.wharf_as(&fred, &["queue", "-p", "gpu"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unknown partition \"gpu\"; this cluster has: batch, debug"),
        "{}",
        stderr(&out)
    );
    // Erin cancels her own jobs in debug, not fred's, nor hers elsewhere.
    let out = c.wharf_as(&erin, &["cancel", "-p", "debug"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let state = |id: u64| c.job(id)["state"].as_str().unwrap().to_string();
    assert_eq!(
        [state(batch), state(debug), state(fred_debug)],
        ["PENDING", "CANCELLED", "PENDING"]
    );
}
