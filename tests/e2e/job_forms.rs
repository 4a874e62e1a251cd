//! Job forms through the real controller and agent, as real users: holds (the owner's and an
//! admin's), begin times, and the `#WHARF` lines that carry them.

use std::time::{Duration, Instant};

use crate::harness::*;

/// Waits until `id` is pending with a reason starting with `code`, then checks that it stays so
/// across more than one scheduling pass (the loop runs at least once a second), and that
/// `wharf show --json` carries it as a typed value too.
fn stays_pending(c: &Cluster, id: u64, code: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let j = c.job(id);
        let reason = j["reason"].as_str().unwrap_or_default().to_string();
        assert_eq!(j["state"], "PENDING", "{j}");
        if reason.starts_with(code) {
            break;
        }
        assert!(Instant::now() < deadline, "job {id}: reason {reason:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let j = c.job(id);
    assert_eq!(j["state"], "PENDING", "{j}");
    assert!(
        j["reason"].as_str().unwrap_or_default().starts_with(code),
        "{j}"
    );
    // The same reason as a typed value, for clients that match on it (`JobHeldUser` is
    // `{"kind": "job_held_user"}`). The codes this is called with name one kind each, its
    // snake case; `QOS...` codes, `PartitionConfig` and codes shared by kinds do not.
    let kind: String = code
        .chars()
        .enumerate()
        .flat_map(|(i, ch)| {
            let sep = (i > 0 && ch.is_ascii_uppercase()).then_some('_');
            sep.into_iter().chain(ch.to_lowercase())
        })
        .collect();
    assert_eq!(j["pending_reason"]["kind"], kind.as_str(), "{j}");
}

#[test]
fn a_held_job_starts_only_when_released_and_only_an_admin_releases_an_admin_hold() {
    if !can_run("a_held_job_starts_only_when_released_and_only_an_admin_releases_an_admin_hold") {
        return;
    }
    let c = Cluster::start();
    let u = user("whform-hold");
    let other = user("whform-hold2");
    // A job file held by its `#WHARF` line, and one held by the flag.
    let script = c.home(&u).join("held.sh");
    std::fs::write(&script, "#!/bin/sh\n#WHARF --hold --mem 16M\ntrue\n").unwrap();
    let by_file = submitted_id(&c.wharf_as(&u, &["submit", script.to_str().unwrap()]));
    let by_flag =
        submitted_id(&c.wharf_as(&u, &["submit", "-H", "--mem", "16M", "--wrap", "true"]));
    stays_pending(&c, by_file, "JobHeldUser");
    stays_pending(&c, by_flag, "JobHeldUser");
    let shown = stdout(&c.wharf_as(&u, &["show", &by_file.to_string()]));
    assert!(shown.contains("by its owner"), "{shown}");

    // Another user may not release it; its owner may.
    let out = c.wharf_as(&other, &["release", &by_file.to_string()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("belongs to another user"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf_as(&u, &["release", &by_file.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let done = c.wait_done(by_file, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");

    // An admin's hold: the owner can neither release nor lower it.
    let out = c.wharf(&["hold", &by_flag.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    stays_pending(&c, by_flag, "JobHeldAdmin");
    let out = c.wharf_as(&u, &["release", &by_flag.to_string()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("held by an admin"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf_as(&u, &["hold", &by_flag.to_string()]);
    assert!(
        stdout(&out).contains("held by an admin"),
        "{}",
        stdout(&out)
    );
    stays_pending(&c, by_flag, "JobHeldAdmin");
    let out = c.wharf(&["release", &by_flag.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let done = c.wait_done(by_flag, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");

    // Only pending jobs are held.
    let out = c.wharf_as(&u, &["hold", &by_flag.to_string()]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("only pending jobs"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_job_starts_no_earlier_than_its_begin_time() {
    if !can_run("a_job_starts_no_earlier_than_its_begin_time") {
        return;
    }
    let c = Cluster::start();
    let u = user("whform-begin");
    let soon = submitted_id(&c.wharf_as(
        &u,
        &[
            "submit", "--begin", "now+4s", "--mem", "16M", "--wrap", "true",
        ],
    ));
    let script = c.home(&u).join("later.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#WHARF --begin=now+1h --mem 16M\ntrue\n",
    )
    .unwrap();
    let later = submitted_id(&c.wharf_as(&u, &["submit", script.to_str().unwrap()]));
    let j = c.job(soon);
    assert_eq!(j["state"], "PENDING", "{j}");
    let done = c.wait_done(soon, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let (submit, start) = (
        done["submit_time"].as_u64().unwrap(),
        done["start_time"].as_u64().unwrap(),
    );
    assert!(
        start >= submit + 4000,
        "started {} ms after submit",
        start - submit
    );
    stays_pending(&c, later, "BeginTime");
    let j = c.job(later);
    let begin = j["begin_time"].as_u64().unwrap();
    let submitted = j["submit_time"].as_u64().unwrap();
    assert_eq!(begin, submitted + 3_600_000, "{j}");
    assert!(stdout(&c.wharf_as(&u, &["show", &later.to_string()])).contains("Begin time"));
    let out = c.wharf_as(&u, &["submit", "--begin", "yesterday", "--wrap", "true"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--begin"), "{}", stderr(&out));
    // A wall-clock begin is the user's local time: 09:00 in Tokyo is 00:00 UTC.
    let home = c.home(&u);
    let tokyo = |args: &[&str]| {
        let mut all = vec!["TZ=Asia/Tokyo", wharf_bin()];
        all.extend_from_slice(args);
        as_user(&u, &home, "/usr/bin/env", &all, &c.socket)
    };
    let local = submitted_id(&tokyo(&[
        "submit",
        "--begin",
        "2030-01-01T09:00",
        "--wrap",
        "true",
    ]));
    let zoned = submitted_id(&tokyo(&[
        "submit",
        "--begin",
        "2030-01-01T09:00Z",
        "--wrap",
        "true",
    ]));
    assert_eq!(c.job(local)["begin_time"], 1_893_456_000_000u64);
    assert_eq!(c.job(zoned)["begin_time"], 1_893_488_400_000u64);
}

#[test]
fn afterok_starts_after_success_and_a_failed_parent_cancels_the_child_with_the_reason() {
    if !can_run(
        "afterok_starts_after_success_and_a_failed_parent_cancels_the_child_with_the_reason",
    ) {
        return;
    }
    let c = Cluster::start();
    let u = user("whform-dep");
    let other = user("whform-dep2");
    let submit = |args: &[&str]| {
        let mut all = vec!["submit", "--mem", "16M"];
        all.extend_from_slice(args);
        submitted_id(&c.wharf_as(&u, &all))
    };
    let good = submit(&["--wrap", "sleep 3"]);
    let bad = submit(&["--wrap", "sleep 1; exit 3"]);
    let on_good = submit(&["-d", &format!("afterok:{good}"), "--wrap", "true"]);
    let on_bad = submit(&["--dependency", &format!("afterok:{bad}"), "--wrap", "true"]);
    let script = c.home(&u).join("cleanup.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\n#WHARF --dependency=afternotok:{bad} --mem 16M\ntrue\n"),
    )
    .unwrap();
    let cleanup = submitted_id(&c.wharf_as(&u, &["submit", script.to_str().unwrap()]));
    c.wait_running(good);
    let j = c.job(on_good);
    assert_eq!(j["state"], "PENDING", "{j}");
    assert!(
        j["reason"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Dependency"),
        "{j}"
    );

    let gone = c.wait_done(on_bad, Duration::from_secs(30));
    assert_eq!(gone["state"], "CANCELLED", "{gone}");
    let reason = gone["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("DependencyNeverSatisfied")
            && reason.contains(&format!("job {bad} ended FAILED")),
        "{reason}"
    );
    assert!(gone["start_time"].is_null(), "{gone}");
    let ran = c.wait_done(cleanup, Duration::from_secs(30));
    assert_eq!(ran["state"], "COMPLETED", "{ran}");
    let ran = c.wait_done(on_good, Duration::from_secs(30));
    assert_eq!(ran["state"], "COMPLETED", "{ran}");
    let parent = c.job(good);
    assert_eq!(parent["state"], "COMPLETED", "{parent}");
    assert!(
        ran["start_time"].as_u64().unwrap() >= parent["end_time"].as_u64().unwrap(),
        "child started before its parent ended: {ran} / {parent}"
    );

    // Another user may not depend on these jobs, nor anyone on a job that does not exist.
    let out = c.wharf_as(
        &other,
        &[
            "submit",
            "-d",
            &format!("afterany:{good}"),
            "--wrap",
            "true",
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("belongs to another user"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf_as(&u, &["submit", "-d", "afterok:99999", "--wrap", "true"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
    let out = c.wharf_as(&u, &["submit", "-d", "afterok", "--wrap", "true"]);
    assert!(stderr(&out).contains("--dependency"), "{}", stderr(&out));
}

#[test]
fn each_array_task_sees_its_ids_and_writes_its_own_file() {
    if !can_run("each_array_task_sees_its_ids_and_writes_its_own_file") {
        return;
    }
    let c = Cluster::start();
    let u = user("whform-array");
    let script = c.home(&u).join("tasks.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#WHARF --array=0-6:3 --mem 16M -o task-%A_%a.out\necho \"$WHARF_ARRAY_JOB_ID $WHARF_ARRAY_TASK_ID $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID $WHARF_JOB_ID\"\necho \"$SLURM_ARRAY_TASK_COUNT $SLURM_ARRAY_TASK_MIN $SLURM_ARRAY_TASK_MAX $SLURM_ARRAY_TASK_STEP $WHARF_ARRAY_TASK_STEP\"\necho \"$SLURM_JOB_PARTITION $SLURM_JOB_ACCOUNT\"\n",
    )
    .unwrap();
    let out = c.wharf_as(&u, &["submit", script.to_str().unwrap()]);
    assert!(
        stdout(&out).starts_with("Submitted batch job "),
        "{}",
        stdout(&out)
    );
    assert!(
        stderr(&out).contains("an array of 3 tasks"),
        "{}",
        stderr(&out)
    );
    let id = submitted_id(&out);
    let queue = stdout(&c.wharf_as(&u, &["queue", "--all"]));
    assert!(queue.contains(&format!("{id}_3")), "{queue}");
    for (k, task) in [0u64, 3, 6].into_iter().enumerate() {
        let done = c.wait_done(id + k as u64, Duration::from_secs(30));
        assert_eq!(done["state"], "COMPLETED", "{done}");
        let text =
            std::fs::read_to_string(c.home(&u).join(format!("task-{id}_{task}.out"))).unwrap();
        // The ids, the array's shape (0-6:3: 3 tasks from 0 to 6 by 3), and the partition
        // and account it runs under though it named neither (the user's own account here).
        assert_eq!(
            text.trim(),
            format!(
                "{id} {task} {id} {task} {}\n3 0 6 3 3\ndefault {}",
                id + k as u64,
                u.name
            ),
            "task {task}"
        );
    }
    // `wharf show ARRAY_TASK` names the task.
    let shown = stdout(&c.wharf_as(&u, &["show", &format!("{id}_6")]));
    assert!(shown.contains(&format!("array task {id}_6")), "{shown}");
}

/// Submits, as `u`, an array of 4 tasks that sleep, one running at a time; returns its id
/// once its first task runs.
fn sleeping_array_one_at_a_time(c: &Cluster, u: &User) -> u64 {
    let out = c.wharf_as(
        u,
        &[
            "submit",
            "--array",
            "0-3%1",
            "--mem",
            "16M",
            "--wrap",
            "sleep 600",
        ],
    );
    let id = submitted_id(&out);
    c.wait_running(id);
    id
}

#[test]
fn an_array_is_cancelled_whole_or_by_task_and_its_throttle_holds() {
    if !can_run("an_array_is_cancelled_whole_or_by_task_and_its_throttle_holds") {
        return;
    }
    let c = Cluster::start();
    let u = user("whform-arrayc");
    let id = sleeping_array_one_at_a_time(&c, &u);
    stays_pending(&c, id + 1, "JobArrayTaskLimit");
    let out = c.wharf_as(&u, &["cancel", &format!("{id}_2")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(c.job(id + 2)["state"], "CANCELLED");
    assert_eq!(c.job(id + 3)["state"], "PENDING");
    let other = user("whform-arrayc2");
    let out = c.wharf_as(&other, &["cancel", &id.to_string()]);
    assert!(
        stderr(&out).contains("belongs to another user"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf_as(&u, &["cancel", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    for t in [id, id + 1, id + 3] {
        let done = c.wait_done(t, Duration::from_secs(30));
        assert_eq!(done["state"], "CANCELLED", "{done}");
    }
    let out = c.wharf_as(&u, &["submit", "--array", "0-20000", "--wrap", "true"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("max_array_size"), "{}", stderr(&out));
}

#[test]
fn hold_and_release_of_an_array_id_act_on_every_pending_task() {
    if !can_run("hold_and_release_of_an_array_id_act_on_every_pending_task") {
        return;
    }
    let c = Cluster::start();
    let u = user("whform-arrayh");
    let id = sleeping_array_one_at_a_time(&c, &u);
    let out = c.wharf_as(&u, &["hold", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("held (by its owner)"),
        "{}",
        stdout(&out)
    );
    // (A held task over the throttle says JobArrayTaskLimit, not JobHeldUser.)
    for t in id + 1..id + 4 {
        let j = c.job(t);
        assert_eq!(
            (&j["state"], &j["hold"]),
            (&"PENDING".into(), &"user".into()),
            "{j}"
        );
    }
    assert_eq!(c.job(id)["state"], "RUNNING");
    assert!(c.job(id)["hold"].is_null());

    // `ID_TASK` releases one task; the array's id releases the rest.
    let out = c.wharf_as(&u, &["release", &format!("{id}_3")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(c.job(id + 3)["hold"].is_null());
    assert_eq!(c.job(id + 1)["hold"], "user");
    let out = c.wharf_as(&u, &["release", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    for t in id + 1..id + 4 {
        let j = c.job(t);
        assert!(j["hold"].is_null(), "{j}");
    }
    stays_pending(&c, id + 1, "JobArrayTaskLimit");
    let out = c.wharf_as(&u, &["release", &id.to_string()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no held task"), "{}", stderr(&out));

    // A dependency on a task that does not exist, or on no task at all, is refused.
    let out = c.wharf_as(
        &u,
        &["submit", "-d", &format!("afterok:{id}_9"), "--wrap", "true"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(&format!("job {id}_9, which does not exist")),
        "{}",
        stderr(&out)
    );
    let out = c.wharf_as(
        &u,
        &["submit", "-d", &format!("afterok:{id}_x"), "--wrap", "true"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("after the `_` is no task id"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf_as(&u, &["cancel", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn an_owner_may_only_lower_a_pending_jobs_time_and_the_change_is_logged() {
    if !can_run("an_owner_may_only_lower_a_pending_jobs_time_and_the_change_is_logged") {
        return;
    }
    let c = Cluster::start();
    let u = user("whform-upd");
    let id = submitted_id(&c.wharf_as(
        &u,
        &["submit", "-H", "-t", "1h", "--mem", "16M", "--wrap", "true"],
    ));
    let job = id.to_string();
    let out = c.wharf_as(&u, &["update", &job, "--time", "2h"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("only an admin may raise"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf_as(&u, &["update", &job, "--time", "10m", "--nice", "5"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(c.job(id)["time_limit"], 600);
    let out = c.wharf(&["update", &job, "--time", "3h"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(c.job(id)["time_limit"], 10800);
    // Name and dependency, as scontrol's JobName= and Dependency=: a job that would wait on
    // itself is refused, a typo is named before anything is sent, "" clears.
    let out = c.wharf_as(
        &u,
        &[
            "update",
            &job,
            "-J",
            "renamed",
            "-d",
            &format!("afterany:{id}"),
        ],
    );
    assert!(stderr(&out).contains("wait on itself"), "{}", stderr(&out));
    let out = c.wharf_as(&u, &["update", &job, "--dependency", "afterok:x1"]);
    assert!(stderr(&out).contains("--dependency"), "{}", stderr(&out));
    assert_ne!(
        c.job(id)["name"],
        "renamed",
        "a refused update changed the name"
    );
    let other = submitted_id(&c.wharf_as(&u, &["submit", "-H", "--wrap", "true"]));
    let dep = format!("afterany:{other}");
    let out = c.wharf_as(&u, &["update", &job, "-J", "renamed", "-d", &dep]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("(renamed)") && stdout(&out).contains(&dep),
        "{}",
        stdout(&out)
    );
    assert_eq!(c.job(id)["name"], "renamed");
    assert_eq!(c.job(id)["dependency"], dep.as_str());
    let out = c.wharf_as(&u, &["update", &job, "--dependency", ""]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        c.job(id).get("dependency").is_none_or(|d| d.is_null()),
        "{}",
        c.job(id)
    );
    let out = c.wharf_as(&u, &["cancel", &other.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let log = c.log();
    assert!(
        log.contains("job updated") && log.contains("old_time=600"),
        "no audit line in the log:\n{log}"
    );
    let out = c.wharf(&["release", &job]);
    assert!(out.status.success(), "{}", stderr(&out));
    let done = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let out = c.wharf(&["update", &job, "--time", "1h"]);
    assert!(
        stderr(&out).contains("only pending jobs"),
        "{}",
        stderr(&out)
    );
}
