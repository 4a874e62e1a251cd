use wharf_api::forms::parse_begin;
use wharf_api::wire::{ErrorKind, SubmitRequest};
use wharf_api::{Hold, JobDefaults, JobId, JobRequest, JobState, NodeInfo, Owner};

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

fn cluster(dir: &tempfile::TempDir) -> Cluster {
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), u64::MAX / 4, 0).unwrap();
    c.register(
        NodeInfo {
            name: "n1".into(),
            address: "127.0.0.1".into(),
            cpus: 8,
            memory: 16 << 30,
            gpus: vec![],
            version: "test".into(),
        },
        0,
    )
    .unwrap();
    c
}

fn submit(c: &mut Cluster, who: &Caller, mut job: JobRequest, now: u64) -> JobId {
    job.command = Some(vec!["/bin/true".into()]);
    let req = SubmitRequest {
        job,
        cwd: "/tmp".into(),
        client_token: None,
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
    c.hold(&root, b).unwrap();
    c.schedule(10).unwrap();
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
    assert_eq!(c.release(&alice, a).unwrap_err().kind, ErrorKind::Conflict);
    c.schedule(20).unwrap();
    assert_eq!(state(&c, a).0, JobState::Starting);
    assert_eq!(c.hold(&alice, a).unwrap_err().kind, ErrorKind::Conflict);
    assert_eq!(state(&c, b).0, JobState::Pending);

    // Holds are durable: a restarted controller keeps the admin's.
    drop(c);
    let mut c = cluster(&dir);
    assert_eq!(c.jobs[&b].hold, Some(Hold::Admin));
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
