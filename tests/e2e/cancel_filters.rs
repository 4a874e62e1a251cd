//! `wharf cancel` with scancel's filters: by state, user and name, the caller's own jobs
//! unless a user is named.

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
