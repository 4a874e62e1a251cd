use std::time::Instant;

use wharf_api::array::parse_array;
use wharf_api::wire::{ErrorKind, SubmitRequest};
use wharf_api::{JobDefaults, JobId, JobRequest, JobState, NodeInfo, Owner};

use crate::cluster::{Caller, Cluster};
use crate::store::Store;

fn alice() -> Caller {
    Caller {
        owner: Owner {
            uid: 1001,
            gid: 1001,
            user: "alice".into(),
        },
        admin: false,
    }
}

fn cluster(dir: &tempfile::TempDir) -> Cluster {
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), u64::MAX / 4, 0)
        .unwrap()
        .with_max_pending_per_user(20_000);
    c.register(NodeInfo::new("n1", "127.0.0.1", 8, 16 << 30, vec![]), 0)
        .unwrap();
    c
}

fn submit_array(c: &mut Cluster, text: &str) -> Result<JobId, crate::cluster::Failure> {
    let req = SubmitRequest {
        job: JobRequest {
            command: Some(vec!["/bin/true".into()]),
            memory: Some(64 << 20),
            output: Some("out-%A_%a.txt".into()),
            array: Some(parse_array(text).unwrap()),
            ..Default::default()
        },
        cwd: "/tmp".into(),
        client_token: Some(format!("t-{text}")),
        registry_auth: None,
    };
    c.submit(&alice(), &req, 1)
}

#[test]
fn an_array_is_one_record_per_task_with_its_ids_and_paths() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let id = submit_array(&mut c, "0-15:4").unwrap();
    let tasks: Vec<_> = c.jobs.values().cloned().collect();
    assert_eq!(tasks.len(), 4);
    for (k, t) in tasks.iter().enumerate() {
        assert_eq!(t.id, id + k as JobId);
        let a = t.array.unwrap();
        assert_eq!((a.job_id, a.task_id), (id, 4 * k as u32));
        let spec = t.spec.as_ref().unwrap();
        assert_eq!(
            spec.output_path(t.id, &t.file_place()),
            format!("/tmp/out-{id}_{}.txt", 4 * k)
        );
        assert_eq!(c.resolve_task(id, Some(4 * k as u32)).unwrap(), t.id);
    }
    assert_eq!(
        c.resolve_task(id, Some(1)).unwrap_err().kind,
        ErrorKind::NotFound
    );
    // A retried submit returns the same array; a restart keeps every task.
    assert_eq!(submit_array(&mut c, "0-15:4").unwrap(), id);
    drop(c);
    let c = cluster(&dir);
    assert_eq!(c.jobs.len(), 4);
    assert!(c.jobs.values().all(|j| j.array.unwrap().job_id == id));
}

#[test]
fn the_throttle_bounds_running_tasks_and_the_rest_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let id = submit_array(&mut c, "1-6%2").unwrap();
    c.schedule(10).unwrap();
    let states: Vec<JobState> = c.jobs.values().map(|j| j.state).collect();
    assert_eq!(states.iter().filter(|s| s.holds_resources()).count(), 2);
    assert_eq!(c.jobs[&id].state, JobState::Starting);
    assert_eq!(c.jobs[&(id + 1)].state, JobState::Starting);
    let r = c.jobs[&(id + 2)].reason.clone().unwrap();
    assert!(r.starts_with("JobArrayTaskLimit"), "{r}");
    // Cancelling the array cancels every task; pending ones end at once.
    let (_, _) = c.cancel_array(&alice(), id, 20).unwrap().unwrap();
    assert!(c.jobs.values().all(|j| j.cancel_requested));
    assert_eq!(c.jobs.len(), 2);
}

/// The array's id cancels what is left of it, however few: before, with its first task
/// ended and one other left, the cancel fell to the first task alone and was refused as
/// ended, and the last task ran on.
#[test]
fn the_arrays_id_cancels_its_last_task_left() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let id = submit_array(&mut c, "1-3").unwrap();
    for task in [id, id + 1] {
        c.cancel(&alice(), task, 15).unwrap();
    }
    assert_eq!(c.jobs.len(), 1, "one task left");
    let (first, _) = c.cancel_array(&alice(), id, 20).unwrap().unwrap();
    assert_eq!(first.id, id + 2);
    assert!(c.jobs.is_empty() || c.jobs.values().all(|j| j.cancel_requested));
}

/// Tasks that could not start anyway take no place under the throttle: with tasks 0 and 1
/// held, 2 and 3 run, and the held ones say they are held (before, the held pair took both
/// places, so nothing ran, and the tasks behind them blamed the throttle).
#[test]
fn held_tasks_take_no_place_under_the_throttle() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let id = submit_array(&mut c, "0-5%2").unwrap();
    for t in [id, id + 1] {
        c.hold(&alice(), t).unwrap();
    }
    c.schedule(10).unwrap();
    let state = |t: JobId| c.jobs[&t].state;
    let reason = |t: JobId| c.jobs[&t].reason.clone().unwrap_or_default();
    for t in [id, id + 1] {
        assert_eq!(state(t), JobState::Pending);
        assert!(reason(t).starts_with("JobHeldUser"), "{}", reason(t));
    }
    assert_eq!(state(id + 2), JobState::Starting);
    assert_eq!(state(id + 3), JobState::Starting);
    for t in [id + 4, id + 5] {
        assert!(reason(t).starts_with("JobArrayTaskLimit"), "{}", reason(t));
    }
}

/// Each task stores a copy of the job: a job as large as a request may carry, times
/// thousands of tasks, is refused at submit with the sizes, and nothing is stored. Before,
/// one 700 KB job times 10,000 tasks asked for 7 GB of records.
#[test]
fn an_array_whose_copies_of_a_large_job_would_take_gigabytes_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let req = SubmitRequest {
        job: JobRequest {
            command: Some(vec!["/bin/true".into(), "x".repeat(100 << 10)]),
            memory: Some(64 << 20),
            array: Some(parse_array("0-9999").unwrap()),
            ..Default::default()
        },
        cwd: "/tmp".into(),
        client_token: None,
        registry_auth: None,
    };
    let e = c.submit(&alice(), &req, 1).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    assert!(
        e.message.contains("--array of 10000 tasks would store") && e.message.contains("256 MiB"),
        "{}",
        e.message
    );
    assert!(c.jobs.is_empty());
    // The same job in fewer tasks is taken.
    let mut few = req.clone();
    few.job.array = Some(parse_array("0-99").unwrap());
    c.submit(&alice(), &few, 1).unwrap();
    assert_eq!(c.jobs.len(), 100);
}

#[test]
fn an_array_over_max_array_size_is_refused_and_ten_thousand_tasks_are_quick() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let e = submit_array(&mut c, "0-10001").unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    assert!(e.message.contains("max_array_size"), "{}", e.message);
    assert!(c.jobs.is_empty());
    let started = Instant::now();
    let id = submit_array(&mut c, "0-9999").unwrap();
    let took = started.elapsed();
    eprintln!("10,000-task array submit: {took:?}");
    assert_eq!(c.jobs.len(), 10_000);
    assert_eq!(c.jobs.keys().last(), Some(&(id + 9_999)));
    // Unoptimised build on busy cores: one transaction takes well under a second; a commit
    // per task (10,000 fsyncs) takes far longer.
    assert!(took.as_secs() < 10, "{took:?}");
}

#[test]
fn hold_release_update_and_requeue_of_an_array_id_act_on_every_task_they_apply_to() {
    use wharf_api::wire::UpdateRequest;
    use wharf_api::Hold;
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let bob = Caller {
        owner: Owner {
            uid: 1002,
            gid: 1002,
            user: "bob".into(),
        },
        admin: false,
    };
    let root = Caller {
        admin: true,
        ..bob.clone()
    };
    let id = submit_array(&mut c, "0-3%2").unwrap();
    c.schedule(10).unwrap();
    let states = |c: &Cluster| -> Vec<(JobState, Option<Hold>)> {
        (id..id + 4)
            .map(|t| (c.jobs[&t].state, c.jobs[&t].hold))
            .collect()
    };
    let (p, s) = (JobState::Pending, JobState::Starting);
    assert_eq!(states(&c), [(s, None), (s, None), (p, None), (p, None)]);

    // Someone else's array: refused whole, nothing changes.
    let e = c.hold_array(&bob, id).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert_eq!(c.jobs[&(id + 2)].hold, None);

    // Every pending task is held, the running ones are left; a restart keeps the holds.
    let first = c.hold_array(&alice(), id).unwrap().unwrap();
    assert_eq!(first.id, id + 2);
    let u = Some(Hold::User);
    assert_eq!(states(&c), [(s, None), (s, None), (p, u), (p, u)]);
    drop(c);
    let mut c = cluster(&dir);
    assert_eq!(c.jobs[&(id + 3)].hold, u);
    c.release_array(&alice(), id).unwrap().unwrap();
    assert_eq!(states(&c), [(s, None), (s, None), (p, None), (p, None)]);
    let e = c.release_array(&alice(), id).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Conflict);
    assert!(e.message.contains("no held task"), "{}", e.message);

    // An admin's hold on one task: the owner's release of the array changes none.
    c.hold(&root, id + 3).unwrap();
    c.hold(&alice(), id + 2).unwrap();
    let e = c.release_array(&alice(), id).unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert_eq!(c.jobs[&(id + 2)].hold, u);
    c.release_array(&root, id).unwrap().unwrap();
    assert_eq!(states(&c), [(s, None), (s, None), (p, None), (p, None)]);

    // Update changes every pending task, all or none, and a time limit alone the running
    // ones' too (as Slurm's; before, they kept theirs), whose node is woken to hear of it.
    let limit = c.jobs[&id].time_limit;
    let time = |t| UpdateRequest {
        time: Some(t),
        ..Default::default()
    };
    assert_eq!(
        c.update_array(&alice(), id, &time(limit + 1), 20)
            .unwrap_err()
            .kind,
        ErrorKind::PermissionDenied
    );
    c.update_array(&alice(), id, &time(60), 20)
        .unwrap()
        .unwrap();
    let limits: Vec<u64> = (id..id + 4).map(|t| c.jobs[&t].time_limit).collect();
    assert_eq!(limits, [60, 60, 60, 60]);
    assert_eq!(c.array_nodes(id), ["n1"]);
    let nicer = UpdateRequest {
        nice: Some(5),
        ..Default::default()
    };
    c.update_array(&alice(), id, &nicer, 20).unwrap().unwrap();
    let nice: Vec<i32> = (id..id + 4)
        .map(|t| c.jobs[&t].spec.as_ref().unwrap().nice)
        .collect();
    assert_eq!(nice, [0, 0, 5, 5]);

    // Requeue stops every running task; the pending ones stay as they are.
    let (_, wake) = c.requeue_array(&alice(), id).unwrap().unwrap();
    assert_eq!(wake, ["n1"]);
    let stopping: Vec<bool> = (id..id + 4).map(|t| c.jobs[&t].stop.is_some()).collect();
    assert_eq!(stopping, [true, true, false, false]);
    let e = c.requeue_array(&alice(), id).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Conflict);

    // `ID_TASK` keeps naming one task; a plain job is no array.
    c.hold(&alice(), c.resolve_task(id, Some(3)).unwrap())
        .unwrap();
    assert_eq!(c.jobs[&(id + 2)].hold, None);
    assert_eq!(c.jobs[&(id + 3)].hold, u);
    let e = c.hold_array(&alice(), id + 1).unwrap();
    assert!(e.is_none());
}

#[test]
fn an_array_with_no_pending_task_cannot_be_held() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let id = submit_array(&mut c, "0-1").unwrap();
    c.schedule(10).unwrap();
    let e = c.hold_array(&alice(), id).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Conflict);
    assert!(
        e.message
            .contains(&format!("array job {id} has no pending task")),
        "{}",
        e.message
    );
    assert!(c.jobs.values().all(|j| j.hold.is_none()));
}

/// A task is found by its place in an evenly spaced array, and by a search in any other:
/// `find_task` answers for every task of both (dependencies ask it once per named task per
/// pass).
#[test]
fn a_task_is_found_by_its_place_in_an_even_array_and_searched_for_in_another() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let even = submit_array(&mut c, "0-12:4").unwrap();
    for (i, task) in [0, 4, 8, 12].into_iter().enumerate() {
        assert_eq!(c.find_task(even, task).unwrap().0, even + i as JobId);
    }
    assert_eq!(c.find_task(even, 5).unwrap_err().kind, ErrorKind::NotFound);
    let uneven = submit_array(&mut c, "1,2,7").unwrap();
    for (i, task) in [1, 2, 7].into_iter().enumerate() {
        assert_eq!(c.find_task(uneven, task).unwrap().0, uneven + i as JobId);
    }
    assert_eq!(
        c.find_task(uneven, 3).unwrap_err().kind,
        ErrorKind::NotFound
    );
}

/// acct's `-j` takes an array's id for every task and `ID_TASK` for one, both while the
/// tasks wait (from memory) and once they ended (from the ledger). Before, an array's id was
/// its first task's job id alone, and `ID_TASK` was refused as not a job id.
#[test]
fn acct_names_an_arrays_tasks_by_its_id_or_one_by_id_task() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let id = submit_array(&mut c, "0-2").unwrap();
    let acct = |c: &Cluster, jobs: &str| {
        let q = wharf_api::wire::AcctQuery {
            jobs: Some(jobs.into()),
            ..Default::default()
        };
        c.acct(&alice(), &q, 30)
            .map(|rows| rows.iter().map(|j| j.label()).collect::<Vec<_>>())
    };
    let all: Vec<String> = (0..3).map(|t| format!("{id}_{t}")).collect();
    let check = |c: &Cluster| {
        assert_eq!(acct(c, &id.to_string()).unwrap(), all);
        assert_eq!(acct(c, &format!("{id}_1")).unwrap(), [all[1].clone()]);
        assert_eq!(
            acct(c, &format!("{}, {id}_0", id + 2)).unwrap(),
            [all[0].clone(), all[2].clone()]
        );
        assert!(acct(c, &format!("{id}_7")).unwrap().is_empty());
        let bad = acct(c, &format!("{id},{id}_x")).unwrap_err();
        assert_eq!(bad.kind, ErrorKind::InvalidInput);
        assert!(
            bad.message.contains(&format!("\"{id}_x\"")),
            "{}",
            bad.message
        );
    };
    check(&c);
    c.cancel_array(&alice(), id, 20).unwrap().unwrap();
    assert!(c.jobs.is_empty());
    check(&c);
    // An admin who names another user's jobs sees them without --allusers, as root's sacct.
    let mut root = crate::cluster::sched::tests::caller(0, "root");
    root.admin = true;
    let q = wharf_api::wire::AcctQuery {
        jobs: Some(id.to_string()),
        ..Default::default()
    };
    assert_eq!(c.acct(&root, &q, 30).unwrap().len(), 3);
}
