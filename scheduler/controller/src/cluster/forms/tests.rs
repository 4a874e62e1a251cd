use wharf_api::dependency::parse_dependency;
use wharf_api::forms::parse_begin;
use wharf_api::pending::PendingReason;
use wharf_api::wire::{AgentJob, ErrorKind, PollRequest, SubmitRequest};
use wharf_api::{ExitInfo, Hold, JobDefaults, JobId, JobRequest, JobState, NodeInfo, Owner};

use crate::cluster::{Caller, Cluster};
use crate::store::Store;

fn caller(uid: u32, user: &str, admin: bool) -> Caller {
    Caller {
        owner: Owner {
            uid,
            gid: uid,
            user: user.into(),
        },
        admin,
    }
}

/// A cluster with one node, n1 (8 CPUs, 16 GiB), its store in `dir`.
pub(in crate::cluster) fn cluster(dir: &tempfile::TempDir) -> Cluster {
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), u64::MAX / 4, 0).unwrap();
    c.register(NodeInfo::new("n1", "127.0.0.1", 8, 16 << 30, vec![]), 0)
        .unwrap();
    c
}

fn submit(c: &mut Cluster, who: &Caller, mut job: JobRequest, now: u64) -> JobId {
    job.command = Some(vec!["/bin/true".into()]);
    let req = SubmitRequest {
        job,
        cwd: "/tmp".into(),
        client_token: None,
        registry_auth: None,
    };
    c.submit(who, &req, now).unwrap()
}

fn state(c: &Cluster, id: JobId) -> (JobState, String) {
    let j = &c.jobs[&id];
    (j.state, j.reason.clone().unwrap_or_default())
}

#[test]
fn a_held_job_waits_until_released_and_only_an_admin_releases_an_admin_hold() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let bob = caller(1002, "bob", false);
    let root = caller(0, "root", true);
    let held = JobRequest {
        hold: Some(true),
        ..Default::default()
    };
    let a = submit(&mut c, &alice, held, 1);
    let b = submit(&mut c, &alice, JobRequest::default(), 2);
    let why = |c: &Cluster, id: JobId| c.jobs[&id].pending_reason.clone();
    assert_eq!(
        c.hold(&root, b).unwrap().pending_reason,
        Some(PendingReason::JobHeldAdmin)
    );
    c.schedule(10).unwrap();
    assert_eq!(why(&c, a), Some(PendingReason::JobHeldUser));
    assert_eq!(why(&c, b), Some(PendingReason::JobHeldAdmin));
    let (s, r) = state(&c, a);
    assert_eq!(s, JobState::Pending);
    assert!(r.starts_with("JobHeldUser: held by its owner"), "{r}");
    let (s, r) = state(&c, b);
    assert_eq!(s, JobState::Pending);
    assert!(r.starts_with("JobHeldAdmin"), "{r}");

    // Someone else may neither hold nor release; the owner may not release an admin hold,
    // nor lower it by holding again.
    assert_eq!(
        c.release(&bob, a).unwrap_err().kind,
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        c.hold(&bob, a).unwrap_err().kind,
        ErrorKind::PermissionDenied
    );
    let e = c.release(&alice, b).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(e.message.contains("held by an admin"), "{}", e.message);
    assert_eq!(c.hold(&alice, b).unwrap().hold, Some(Hold::Admin));

    c.release(&alice, a).unwrap();
    assert_eq!(
        why(&c, a),
        None,
        "released: no longer held, and no pass has looked yet"
    );
    assert_eq!(c.release(&alice, a).unwrap_err().kind, ErrorKind::Conflict);
    c.schedule(20).unwrap();
    assert_eq!(state(&c, a).0, JobState::Starting);
    assert_eq!(why(&c, a), None);
    assert_eq!(c.hold(&alice, a).unwrap_err().kind, ErrorKind::Conflict);
    assert_eq!(state(&c, b).0, JobState::Pending);

    // Holds are durable: a restarted controller keeps the admin's.
    drop(c);
    let mut c = cluster(&dir);
    assert_eq!(c.jobs[&b].hold, Some(Hold::Admin));
    assert_eq!(why(&c, b), Some(PendingReason::JobHeldAdmin));
    c.schedule(30).unwrap();
    assert_eq!(state(&c, b).0, JobState::Pending);
    c.release(&root, b).unwrap();
    c.schedule(40).unwrap();
    assert_eq!(state(&c, b).0, JobState::Starting);
}

#[test]
fn a_job_with_a_begin_time_waits_for_it_even_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let later = JobRequest {
        begin: Some(parse_begin("now+1h").unwrap()),
        ..Default::default()
    };
    let id = submit(&mut c, &alice, later, 5_000);
    assert_eq!(c.jobs[&id].begin_time, Some(3_605_000));
    c.schedule(3_604_999).unwrap();
    let (s, r) = state(&c, id);
    assert_eq!(s, JobState::Pending);
    assert!(r.starts_with("BeginTime"), "{r}");
    drop(c);
    let mut c = cluster(&dir);
    c.schedule(3_604_999).unwrap();
    assert_eq!(state(&c, id).0, JobState::Pending);
    c.schedule(3_605_000).unwrap();
    assert_eq!(state(&c, id).0, JobState::Starting);
}

/// A date more than 100 years ahead is refused at submit and at update, as `now+` that far
/// is when parsed; before, `--begin 9999-12-31T00:00Z` was taken.
#[test]
fn a_begin_date_more_than_100_years_ahead_is_refused_at_submit_and_update() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let far = parse_begin("9999-12-31T00:00Z").unwrap();
    let req = SubmitRequest {
        job: JobRequest {
            command: Some(vec!["/bin/true".into()]),
            begin: Some(far),
            ..Default::default()
        },
        cwd: "/tmp".into(),
        client_token: None,
        registry_auth: None,
    };
    let e = c.submit(&alice, &req, 5_000).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    assert!(
        e.message.contains("more than 100 years ahead"),
        "{}",
        e.message
    );
    assert!(c.jobs.is_empty());
    let id = submit(&mut c, &alice, JobRequest::default(), 5_000);
    let later = wharf_api::wire::UpdateRequest {
        begin: Some(far),
        ..Default::default()
    };
    let e = c.update(&alice, id, &later, 6_000).unwrap_err();
    assert!(
        e.message.contains("more than 100 years ahead"),
        "{}",
        e.message
    );
    assert_eq!(c.jobs[&id].begin_time, None);
}

/// The agent of n1 reports job `id` ended with `code`.
pub(in crate::cluster) fn end(c: &mut Cluster, id: JobId, code: i32, now: u64) {
    let report = PollRequest {
        seq: None,
        node: "n1".into(),
        jobs: vec![AgentJob {
            id,
            start_time: Some(now - 1),
            exit: Some(ExitInfo {
                code: Some(code),
                ..Default::default()
            }),
            end_time: Some(now),
            stopping: false,
            ready: false,
            time_limit: None,
        }],
        wait_ms: 0,
        images: vec![],
        pulling: vec![],
        prepulls: vec![],
        steps: vec![],
        signalled: vec![],
    };
    c.ingest(&report, now).unwrap();
}

fn after(text: &str) -> JobRequest {
    JobRequest {
        dependency: Some(parse_dependency(text).unwrap()),
        ..Default::default()
    }
}

#[test]
fn afterok_waits_for_success_and_a_failed_parent_cancels_the_child_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let ok = submit(&mut c, &alice, JobRequest::default(), 1);
    let bad = submit(&mut c, &alice, JobRequest::default(), 1);
    let on_ok = submit(&mut c, &alice, after(&format!("afterok:{ok}")), 2);
    let on_bad = submit(&mut c, &alice, after(&format!("afterok:{bad}")), 2);
    let on_bad_or = submit(
        &mut c,
        &alice,
        after(&format!("afterok:{bad}?afternotok:{bad}")),
        2,
    );
    c.schedule(10).unwrap();
    wait_for_a_dependency(&c, &[on_ok, on_bad, on_bad_or]);
    end(&mut c, ok, 0, 20);
    end(&mut c, bad, 1, 20);
    c.schedule(30).unwrap();
    assert_eq!(state(&c, on_ok).0, JobState::Starting);
    assert_eq!(state(&c, on_bad_or).0, JobState::Starting);
    never_met(&c, &alice, on_bad, &format!("job {bad} ended FAILED"));
}

/// Without `kill_invalid_dependency`: alice's job (`child`, at 11) on `afternotok` of her
/// job `parent` that completed at 10, after the pass at 20 that found it can never be met.
fn a_child_never_met(dir: &tempfile::TempDir) -> (Cluster, Caller, JobId, JobId) {
    let mut c = cluster(dir).with_forms(crate::FormsConfig {
        kill_invalid_dependency: false,
        ..Default::default()
    });
    let alice = caller(1001, "alice", false);
    let parent = submit(&mut c, &alice, JobRequest::default(), 1);
    c.schedule(5).unwrap();
    end(&mut c, parent, 0, 10);
    let child = submit(&mut c, &alice, after(&format!("afternotok:{parent}")), 11);
    c.schedule(20).unwrap();
    (c, alice, parent, child)
}

#[test]
fn without_kill_invalid_dependency_the_child_stays_pending_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, _, _, child) = a_child_never_met(&dir);
    c.schedule(30).unwrap();
    let (s, r) = state(&c, child);
    assert_eq!(s, JobState::Pending);
    assert!(r.starts_with("DependencyNeverSatisfied"), "{r}");
    assert!(r.contains("ended COMPLETED"), "{r}");
}

#[test]
fn a_job_behind_one_whose_dependency_is_never_met_waits_for_it() {
    for kill in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cluster(&dir).with_forms(crate::FormsConfig {
            kill_invalid_dependency: kill,
            ..Default::default()
        });
        let alice = caller(1001, "alice", false);
        let bad = submit(&mut c, &alice, JobRequest::default(), 1);
        c.schedule(5).unwrap();
        end(&mut c, bad, 1, 10);
        let mid = submit(&mut c, &alice, after(&format!("afterok:{bad}")), 11);
        let on_ok = submit(&mut c, &alice, after(&format!("afterok:{mid}")), 12);
        let on_any = submit(&mut c, &alice, after(&format!("afterany:{mid}")), 12);
        c.schedule(20).unwrap();
        // The pass that finds `mid` never met starts nothing that waits for it.
        for id in [on_ok, on_any] {
            let (s, r) = state(&c, id);
            assert_eq!(s, JobState::Pending, "kill {kill}: job {id}: {r}");
            assert!(r.starts_with("Dependency"), "kill {kill}: {r}");
        }
        c.schedule(30).unwrap();
        if kill {
            // Once `mid` is cancelled, what needed it to succeed never can, and what needed
            // it only to end may start.
            never_met(&c, &alice, on_ok, &format!("job {mid} ended CANCELLED"));
            assert_eq!(state(&c, on_any).0, JobState::Starting);
        } else {
            // `mid` stays queued, so both still wait for it.
            assert_eq!(state(&c, mid).0, JobState::Pending);
            for id in [on_ok, on_any] {
                let (s, r) = state(&c, id);
                assert_eq!(s, JobState::Pending, "job {id}: {r}");
                assert!(r.contains(&format!("job {mid}")), "{r}");
            }
        }
    }
}

#[test]
fn singleton_runs_one_job_of_a_name_at_a_time_per_user() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let bob = caller(1002, "bob", false);
    let named = || JobRequest {
        name: Some("train".into()),
        dependency: Some(parse_dependency("singleton").unwrap()),
        ..Default::default()
    };
    let a1 = submit(&mut c, &alice, named(), 1);
    let a2 = submit(&mut c, &alice, named(), 2);
    let b1 = submit(&mut c, &bob, named(), 3);
    c.schedule(10).unwrap();
    assert_eq!(state(&c, a1).0, JobState::Starting);
    assert_eq!(state(&c, b1).0, JobState::Starting);
    let (s, r) = state(&c, a2);
    assert_eq!(s, JobState::Pending);
    assert!(r.contains(&format!("job {a1}")), "{r}");
    end(&mut c, a1, 0, 20);
    c.schedule(30).unwrap();
    assert_eq!(state(&c, a2).0, JobState::Starting);
}

#[test]
fn a_dependency_on_a_missing_or_someone_elses_job_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let bob = caller(1002, "bob", false);
    let root = caller(0, "root", true);
    let theirs = submit(&mut c, &bob, JobRequest::default(), 1);
    let try_submit = |c: &mut Cluster, who: &Caller, text: &str| {
        let mut job = after(text);
        job.command = Some(vec!["/bin/true".into()]);
        let req = SubmitRequest {
            job,
            cwd: "/tmp".into(),
            client_token: None,
            registry_auth: None,
        };
        c.submit(who, &req, 2)
    };
    let e = try_submit(&mut c, &alice, "afterok:999").unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    assert!(
        e.message.contains("job 999, which does not exist"),
        "{}",
        e.message
    );
    let e = try_submit(&mut c, &alice, &format!("afterany:{theirs}")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(
        e.message.contains("belongs to another user"),
        "{}",
        e.message
    );
    assert_eq!(c.jobs.len(), 1, "a refused submit stores nothing");
    try_submit(&mut c, &root, &format!("afterany:{theirs}")).unwrap();
}

#[test]
fn an_owner_may_only_lower_a_pending_jobs_time_and_an_admin_may_change_anything() {
    use wharf_api::wire::UpdateRequest;
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let bob = caller(1002, "bob", false);
    let root = caller(0, "root", true);
    let held = JobRequest {
        hold: Some(true),
        time: Some(3600),
        ..Default::default()
    };
    let id = submit(&mut c, &alice, held, 1);
    let time = |t| UpdateRequest {
        time: Some(t),
        ..Default::default()
    };
    let e = c.update(&alice, id, &time(7200), 1).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(
        e.message.contains("only an admin may raise"),
        "{}",
        e.message
    );
    assert_eq!(
        c.update(&bob, id, &time(60), 1).unwrap_err().kind,
        ErrorKind::PermissionDenied
    );
    let nice = UpdateRequest {
        nice: Some(-5),
        ..Default::default()
    };
    assert_eq!(
        c.update(&alice, id, &nice, 1).unwrap_err().kind,
        ErrorKind::PermissionDenied
    );
    let part = UpdateRequest {
        partition: Some("nosuch".into()),
        ..Default::default()
    };
    assert!(c
        .update(&root, id, &part, 1)
        .unwrap_err()
        .message
        .contains("unknown partition"));
    assert_eq!(
        c.jobs[&id].time_limit, 3600,
        "a refused update changes nothing"
    );
    assert_eq!(c.update(&alice, id, &time(600), 1).unwrap().time_limit, 600);
    assert_eq!(
        c.update(&root, id, &time(7200), 1).unwrap().time_limit,
        7200
    );
    assert_eq!(
        c.update(&root, id, &nice, 1).unwrap().spec.unwrap().nice,
        -5
    );
    // A fixed priority is an admin's to set (`auto`, 0, clears it); the pass shows it so.
    let fixed = |p| UpdateRequest {
        priority: Some(p),
        ..Default::default()
    };
    let e = c.update(&alice, id, &fixed(9_999_999), 1).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(e.message.contains("only an admin"), "{}", e.message);
    assert_eq!(c.jobs[&id].spec.as_ref().unwrap().priority, None);
    let set = c.update(&root, id, &fixed(9_999_999), 1).unwrap();
    assert_eq!(set.spec.unwrap().priority, Some(9_999_999));
    c.schedule(2).unwrap();
    let p = c.jobs[&id].priority.unwrap();
    assert!(p.fixed && p.total == 9_999_999, "{p:?}");
    let cleared = c.update(&root, id, &fixed(0), 3).unwrap();
    assert_eq!(cleared.spec.unwrap().priority, None);
    c.schedule(4).unwrap();
    assert!(!c.jobs[&id].priority.unwrap().fixed);
    // Begin time: `now+1h` counts from the update; `now` clears it.
    let later = UpdateRequest {
        begin: Some(wharf_api::Begin::AfterSubmit(3600)),
        ..Default::default()
    };
    assert_eq!(
        c.update(&alice, id, &later, 10_000).unwrap().begin_time,
        Some(10_000 + 3_600_000)
    );
    let unknown_qos = UpdateRequest {
        qos: Some("nosuch".into()),
        ..Default::default()
    };
    let e = c.update(&alice, id, &unknown_qos, 1).unwrap_err();
    assert!(e.message.contains("nosuch"), "{}", e.message);
    assert_eq!(
        c.jobs[&id].spec.as_ref().unwrap().qos,
        None,
        "refused: unchanged"
    );
    // A QoS that exists but that her association does not allow: refused to her, not to
    // an admin, who may move a job to any.
    c.sched.qos.push(wharf_core::Qos {
        name: "urgent".into(),
        priority: 100,
    });
    let owner = c.jobs[&id].owner.user.clone();
    c.sched.accounts.push(wharf_core::Account {
        name: owner.clone(),
        parent: None,
        shares: 1,
    });
    c.sched.users.push(wharf_core::UserShares {
        user: owner.clone(),
        account: owner,
        shares: 1,
    });
    let urgent = UpdateRequest {
        qos: Some("urgent".into()),
        ..Default::default()
    };
    let e = c.update(&alice, id, &urgent, 1).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(
        e.message.contains("QoS urgent is not allowed"),
        "{}",
        e.message
    );
    assert_eq!(c.jobs[&id].spec.as_ref().unwrap().qos, None);
    // In an account that grants it, she may; moving the job back to an account that does
    // not is refused, so the QoS cannot be carried across.
    let owner = c.jobs[&id].owner.user.clone();
    c.sched.accounts.push(wharf_core::Account {
        name: "grant".into(),
        parent: None,
        shares: 1,
    });
    c.sched.users.push(wharf_core::UserShares {
        user: owner.clone(),
        account: "grant".into(),
        shares: 1,
    });
    c.sched.limits.accounts.insert(
        "grant".into(),
        wharf_core::limits::AssocLimits {
            qos: Some(vec!["urgent".into()]),
            ..Default::default()
        },
    );
    let there = UpdateRequest {
        qos: Some("urgent".into()),
        account: Some("grant".into()),
        ..Default::default()
    };
    c.update(&alice, id, &there, 1).unwrap();
    let back = UpdateRequest {
        account: Some(owner.clone()),
        ..Default::default()
    };
    let e = c.update(&alice, id, &back, 1).unwrap_err();
    assert!(
        e.message.contains("QoS urgent is not allowed for user"),
        "{}",
        e.message
    );
    assert_eq!(
        c.jobs[&id].spec.as_ref().unwrap().account.as_deref(),
        Some("grant")
    );
    // Her nice alone is hers to change whatever QoS the job is in.
    let nicer = UpdateRequest {
        nice: Some(10),
        ..Default::default()
    };
    c.update(&alice, id, &nicer, 1).unwrap();
    c.update(&root, id, &nice, 1).unwrap();
    let moved = c.update(&root, id, &back, 1).unwrap();
    assert_eq!(moved.spec.unwrap().qos.as_deref(), Some("urgent"));
    let now = UpdateRequest {
        begin: Some(wharf_api::Begin::AfterSubmit(0)),
        ..Default::default()
    };
    assert_eq!(c.update(&alice, id, &now, 20_000).unwrap().begin_time, None);
    // Stored: a restart keeps it.
    drop(c);
    let c = cluster(&dir);
    assert_eq!(c.jobs[&id].time_limit, 7200);
    assert_eq!(c.jobs[&id].spec.as_ref().unwrap().nice, -5);
}

/// Each of `jobs` is pending, waiting for a job it depends on.
fn wait_for_a_dependency(c: &Cluster, jobs: &[JobId]) {
    for &job in jobs {
        let (s, r) = state(c, job);
        assert_eq!(s, JobState::Pending, "{r}");
        assert!(r.starts_with("Dependency: waiting for job"), "{r}");
    }
}

/// `id` (`who`'s) was cancelled because its dependency can never be met, the reason saying
/// `ended` (which job ended how).
fn never_met(c: &Cluster, who: &Caller, id: JobId, ended: &str) {
    let gone = c.job(who, id).unwrap();
    assert_eq!(gone.state, JobState::Cancelled);
    let r = gone.reason.unwrap();
    assert!(
        r.starts_with("DependencyNeverSatisfied") && r.contains(ended),
        "{r}"
    );
}

/// An array of `tasks` (`--array`) of `who`'s, submitted at `now`.
fn submit_array(c: &mut Cluster, who: &Caller, tasks: &str, now: u64) -> JobId {
    let job = JobRequest {
        array: Some(wharf_api::array::parse_array(tasks).unwrap()),
        ..Default::default()
    };
    submit(c, who, job, now)
}

#[test]
fn a_dependency_on_an_array_waits_for_every_task_and_one_on_a_task_for_that_task() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let arr = submit_array(&mut c, &alice, "0-2", 1);
    let on_all = submit(&mut c, &alice, after(&format!("afterok:{arr}")), 2);
    let on_any = submit(&mut c, &alice, after(&format!("afterany:{arr}")), 2);
    let on_task = submit(&mut c, &alice, after(&format!("afterok:{arr}_1")), 2);
    let on_fail = submit(&mut c, &alice, after(&format!("afternotok:{arr}")), 2);
    let on_start = submit(&mut c, &alice, after(&format!("after:{arr}")), 2);
    c.schedule(10).unwrap();
    for t in arr..arr + 3 {
        assert_eq!(state(&c, t).0, JobState::Starting);
    }
    wait_for_a_dependency(&c, &[on_all, on_any, on_task, on_fail, on_start]);
    // Tasks 0 and 1 done: the task's child starts; the array's wait for task 2.
    end(&mut c, arr, 0, 20);
    end(&mut c, arr + 1, 0, 20);
    c.schedule(30).unwrap();
    // No task is pending any more: `after` is met.
    assert_eq!(state(&c, on_start).0, JobState::Starting);
    assert_eq!(state(&c, on_task).0, JobState::Starting);
    // Each names the task as the user does and the dependency as they gave it.
    for (child, dep) in [
        (on_all, "afterok"),
        (on_any, "afterany"),
        (on_fail, "afternotok"),
    ] {
        let (s, r) = state(&c, child);
        assert_eq!(s, JobState::Pending);
        let want =
            format!("Dependency: waiting for job {arr}_2, as its --dependency {dep}:{arr} asks");
        assert!(r.starts_with(&want), "{r}");
    }
    end(&mut c, arr + 2, 0, 40);
    c.schedule(50).unwrap();
    assert_eq!(state(&c, on_all).0, JobState::Starting);
    assert_eq!(state(&c, on_any).0, JobState::Starting);
    // Every task COMPLETED: afternotok can never be met.
    never_met(&c, &alice, on_fail, "ended COMPLETED");
}

#[test]
fn afterok_on_an_array_is_never_met_once_all_ended_and_one_failed() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let arr = submit_array(&mut c, &alice, "0-2", 1);
    let on_ok = submit(&mut c, &alice, after(&format!("afterok:{arr}")), 2);
    let on_fail = submit(&mut c, &alice, after(&format!("afternotok:{arr}")), 2);
    let on_task0 = submit(&mut c, &alice, after(&format!("afterok:{arr}_0")), 2);
    let either = submit(
        &mut c,
        &alice,
        after(&format!("afterok:{arr}?afternotok:{arr}")),
        2,
    );
    c.schedule(10).unwrap();
    end(&mut c, arr + 1, 1, 20);
    c.schedule(30).unwrap();
    // As in Slurm, the array's dependents wait for every task to end.
    wait_for_a_dependency(&c, &[on_ok, on_fail, either]);
    end(&mut c, arr, 0, 40);
    end(&mut c, arr + 2, 0, 40);
    c.schedule(50).unwrap();
    assert_eq!(state(&c, on_fail).0, JobState::Starting);
    assert_eq!(state(&c, on_task0).0, JobState::Starting);
    assert_eq!(state(&c, either).0, JobState::Starting);
    // The failed task as the user names it.
    never_met(&c, &alice, on_ok, &format!("job {arr}_1 ended FAILED"));
    // Decided from the store alone after a restart, the same way.
    drop(c);
    let mut c = cluster(&dir);
    let late = submit(&mut c, &alice, after(&format!("afterany:{arr}")), 60);
    let late_ok = submit(&mut c, &alice, after(&format!("afterok:{arr}")), 60);
    c.schedule(70).unwrap();
    assert_eq!(state(&c, late).0, JobState::Starting);
    assert_eq!(c.job(&alice, late_ok).unwrap().state, JobState::Cancelled);
}

#[test]
fn a_dependency_on_a_task_that_does_not_exist_or_is_not_yours_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let bob = caller(1002, "bob", false);
    let arr = submit_array(&mut c, &alice, "0-4:2", 1);
    let plain = submit(&mut c, &alice, JobRequest::default(), 1);
    let mut try_submit = |who: &Caller, text: &str| {
        let mut job = after(text);
        job.command = Some(vec!["/bin/true".into()]);
        let req = SubmitRequest {
            job,
            cwd: "/tmp".into(),
            client_token: None,
            registry_auth: None,
        };
        c.submit(who, &req, 2)
    };
    for (text, says) in [
        (
            format!("afterok:{arr}_1"),
            format!("job {arr}_1, which does not exist"),
        ),
        (
            format!("afterok:{arr}_99999"),
            format!("job {arr}_99999, which does not exist"),
        ),
        (
            format!("afterok:{plain}_0"),
            format!("job {plain}_0, which does not exist"),
        ),
    ] {
        let e = try_submit(&alice, &text).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{text}");
        assert!(e.message.contains(&says), "{text}: {}", e.message);
    }
    let e = try_submit(&bob, &format!("afterok:{arr}_2")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(
        e.message.contains(&format!("job {arr}_2, which belongs")),
        "{}",
        e.message
    );
    try_submit(&alice, &format!("afterok:{arr}_4")).unwrap();
    assert_eq!(c.jobs.len(), 5, "refused submits store nothing");
}

#[test]
fn a_dependency_on_a_task_held_back_by_its_throttle_still_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    // One task at a time: tasks 1 and 2 wait for the throttle, out of the core's queue.
    let arr = submit_array(&mut c, &alice, "0-2%1", 1);
    let on_task = submit(&mut c, &alice, after(&format!("afterok:{arr}_2")), 2);
    let on_start = submit(&mut c, &alice, after(&format!("after:{arr}")), 2);
    c.schedule(10).unwrap();
    assert_eq!(state(&c, arr).0, JobState::Starting);
    assert_eq!(state(&c, arr + 2).0, JobState::Pending);
    // Before, the throttled task was in neither the core's queue nor its running jobs, so
    // both children counted it as gone and started.
    wait_for_a_dependency(&c, &[on_task, on_start]);
}

/// An update of `job`'s name or dependency only.
fn renamed(name: Option<&str>, dependency: Option<&str>) -> wharf_api::wire::UpdateRequest {
    wharf_api::wire::UpdateRequest {
        name: name.map(str::to_string),
        dependency: dependency.map(str::to_string),
        ..Default::default()
    }
}

#[test]
fn an_update_renames_a_pending_job_and_a_bad_name_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let bob = caller(1002, "bob", false);
    let hold = JobRequest {
        hold: Some(true),
        ..Default::default()
    };
    let id = submit(&mut c, &alice, hold, 1);
    let job = c
        .update(&alice, id, &renamed(Some("train-7b"), None), 2)
        .unwrap();
    assert_eq!(job.name, "train-7b");
    assert_eq!(job.spec.as_ref().unwrap().name, "train-7b");
    // Committed: what the store holds has it too.
    assert_eq!(c.store.job(id).unwrap().unwrap().name, "train-7b");
    for bad in ["", "a\x1b[2Jb", &"x".repeat(129)] {
        let e = c
            .update(&alice, id, &renamed(Some(bad), None), 3)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{bad:?}");
        assert!(e.message.contains("printable"), "{}", e.message);
    }
    assert!(c.update(&bob, id, &renamed(Some("mine"), None), 3).is_err());
    assert_eq!(c.jobs[&id].name, "train-7b");
}

#[test]
fn a_renamed_job_waits_as_a_singleton_of_its_new_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let named = |n: &str| JobRequest {
        name: Some(n.into()),
        dependency: Some(parse_dependency("singleton").unwrap()),
        ..Default::default()
    };
    let first = submit(&mut c, &alice, named("train"), 1);
    c.schedule(5).unwrap();
    assert_eq!(state(&c, first).0, JobState::Starting);
    let other = submit(&mut c, &alice, named("eval"), 6);
    c.update(&alice, other, &renamed(Some("train"), None), 7)
        .unwrap();
    c.schedule(10).unwrap();
    let (s, r) = state(&c, other);
    assert_eq!(s, JobState::Pending, "{r}");
    assert!(r.contains(&format!("job {first}")), "{r}");
}

#[test]
fn an_update_sets_changes_and_clears_a_dependency() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let bob = caller(1002, "bob", false);
    let hold = || JobRequest {
        hold: Some(true),
        ..Default::default()
    };
    let parent = submit(&mut c, &alice, hold(), 1);
    let child = submit(&mut c, &alice, JobRequest::default(), 2);
    let dep = format!("afterok:{parent}");
    let job = c
        .update(&alice, child, &renamed(None, Some(&dep)), 3)
        .unwrap();
    assert_eq!(job.dependency.unwrap().to_string(), dep);
    c.schedule(10).unwrap();
    wait_for_a_dependency(&c, &[child]);
    // A dependency that does not parse, or names a missing or another user's job, is refused
    // and the old one stays.
    let theirs = submit(&mut c, &bob, hold(), 11);
    for (text, says) in [
        ("afterok:", "--dependency"),
        ("afterok:999999", "does not exist"),
        (&*format!("afterok:{theirs}"), "another user"),
    ] {
        let e = c
            .update(&alice, child, &renamed(None, Some(text)), 12)
            .unwrap_err();
        assert!(e.message.contains(says), "{text}: {}", e.message);
        assert_eq!(c.jobs[&child].dependency.as_ref().unwrap().to_string(), dep);
    }
    // Cleared: the next pass starts it.
    c.update(&alice, child, &renamed(None, Some("")), 13)
        .unwrap();
    assert_eq!(c.jobs[&child].dependency, None);
    c.schedule(20).unwrap();
    assert_eq!(state(&c, child).0, JobState::Starting);
}

#[test]
fn a_job_whose_dependency_was_never_met_is_freed_by_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, alice, parent, child) = a_child_never_met(&dir);
    assert!(state(&c, child).1.starts_with("DependencyNeverSatisfied"));
    let ok = format!("afterok:{parent}");
    c.update(&alice, child, &renamed(None, Some(&ok)), 21)
        .unwrap();
    assert!(!state(&c, child).1.starts_with("DependencyNeverSatisfied"));
    c.schedule(30).unwrap();
    assert_eq!(state(&c, child).0, JobState::Starting);
}

#[test]
fn a_dependency_that_would_wait_on_itself_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let hold = JobRequest {
        hold: Some(true),
        ..Default::default()
    };
    let a = submit(&mut c, &alice, hold, 1);
    let b = submit(&mut c, &alice, after(&format!("afterok:{a}")), 2);
    let d = submit(&mut c, &alice, after(&format!("afterany:{b}")), 3);
    let arr = submit_array(&mut c, &alice, "0-2", 4);
    let on_arr = submit(&mut c, &alice, after(&format!("after:{arr}")), 5);
    let circles = [
        (a, format!("afterok:{a}")),
        // a <- b <- d: a on d closes the circle, through b.
        (a, format!("afterany:{d}")),
        (a, format!("after:{}?afterok:{d}", on_arr)),
        // An array's task on another task of its array's dependent, and an array on a job
        // that waits on the whole array.
        (arr + 1, format!("afterok:{on_arr}")),
        (arr, format!("afterok:{on_arr}")),
    ];
    for (job, text) in circles {
        let e = c
            .update(&alice, job, &renamed(None, Some(&text)), 10)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{job} on {text}");
        assert!(e.message.contains("wait on itself"), "{}", e.message);
    }
    assert_eq!(c.jobs[&a].dependency, None);
    assert_eq!(c.jobs[&arr].dependency, None);
    // Waiting on a job beside the chain is no circle.
    let free = submit(&mut c, &alice, JobRequest::default(), 11);
    c.update(
        &alice,
        a,
        &renamed(None, Some(&format!("afterok:{free}"))),
        12,
    )
    .unwrap();
}

#[test]
fn a_running_job_waits_on_nothing_so_depending_on_it_makes_no_circle() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let hold = JobRequest {
        hold: Some(true),
        ..Default::default()
    };
    let held = submit(&mut c, &alice, hold, 1);
    let first = submit(&mut c, &alice, JobRequest::default(), 2);
    // Either side will do: `first` starting lets it run while `held` still waits.
    let either = after(&format!("afterok:{held}?after:{first}"));
    let running = submit(&mut c, &alice, either, 3);
    c.schedule(10).unwrap();
    c.schedule(11).unwrap();
    assert_eq!(
        state(&c, running).0,
        JobState::Starting,
        "{:?}",
        state(&c, running)
    );
    let on_running = format!("afterok:{running}");
    let job = c
        .update(&alice, held, &renamed(None, Some(&on_running)), 12)
        .unwrap();
    assert_eq!(job.dependency.unwrap().to_string(), on_running);
}

#[test]
fn a_circle_through_a_singleton_is_refused_whether_made_by_a_dependency_or_a_rename() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let named = |n: &str, singleton: bool| JobRequest {
        name: Some(n.into()),
        hold: Some(true),
        dependency: singleton.then(|| parse_dependency("singleton").unwrap()),
        ..Default::default()
    };
    // `later`, a singleton, waits on `first`, its name's first pending job.
    let first = submit(&mut c, &alice, named("train", false), 1);
    let later = submit(&mut c, &alice, named("train", true), 2);
    let e = c.update(
        &alice,
        first,
        &renamed(None, Some(&format!("afterok:{later}"))),
        3,
    );
    assert!(e.unwrap_err().message.contains("wait on itself"));
    assert_eq!(c.jobs[&first].dependency, None);
    // A job of another name may wait on a singleton; renamed into its name, ahead of it, it
    // would be waited on by it, and the rename is refused.
    let eval = submit(&mut c, &alice, named("eval", false), 4);
    let prep = submit(&mut c, &alice, named("prep", true), 5);
    let on_prep = format!("afterok:{prep}");
    c.update(&alice, eval, &renamed(None, Some(&on_prep)), 6)
        .unwrap();
    let e = c
        .update(&alice, eval, &renamed(Some("prep"), None), 7)
        .unwrap_err();
    assert!(e.message.contains("wait on itself"), "{}", e.message);
    assert!(
        e.message.contains(&format!("through job {prep}")),
        "{}",
        e.message
    );
    assert_eq!(c.jobs[&eval].name, "eval");
    c.update(&alice, eval, &renamed(Some("other"), None), 8)
        .unwrap();
    // Behind the singleton, not ahead of it, the name is free to take.
    let behind = submit(&mut c, &alice, named("x", false), 9);
    c.update(&alice, behind, &renamed(Some("prep"), Some(&on_prep)), 10)
        .unwrap();
}

#[test]
fn an_arrays_rename_is_checked_with_each_tasks_own_dependency() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let alice = caller(1001, "alice", false);
    let arr = submit(
        &mut c,
        &alice,
        JobRequest {
            name: Some("a".into()),
            hold: Some(true),
            array: Some(wharf_api::array::parse_array("0-2").unwrap()),
            ..Default::default()
        },
        1,
    );
    let single = submit(
        &mut c,
        &alice,
        JobRequest {
            name: Some("x".into()),
            hold: Some(true),
            dependency: Some(parse_dependency("singleton").unwrap()),
            ..Default::default()
        },
        2,
    );
    // Only the last task waits on the singleton; under another name that is no circle.
    let on_single = format!("afterok:{single}");
    c.update(&alice, arr + 2, &renamed(None, Some(&on_single)), 3)
        .unwrap();
    // Renamed into its name, the tasks are ahead of it: it waits on them, and the last task
    // on it. The first task has no dependency of its own; the rename is refused all the same.
    let e = c
        .update_array(&alice, arr, &renamed(Some("x"), None), 4)
        .unwrap_err();
    assert!(e.message.contains("wait on itself"), "{}", e.message);
    for t in arr..arr + 3 {
        assert_eq!(c.jobs[&t].name, "a");
    }
    c.update_array(&alice, arr, &renamed(Some("y"), None), 5)
        .unwrap();
}
