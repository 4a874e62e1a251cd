use std::collections::BTreeMap;

use wharf_api::array::parse_array;
use wharf_api::wire::{ErrorKind, SubmitRequest};
use wharf_api::{JobId, JobRequest, JobState};

use crate::cluster::forms::{self, tests::end};
use crate::cluster::sched::tests::caller;
use crate::cluster::{Caller, Cluster};

/// A cluster with node n1 of 8 CPUs, where two of the 4-CPU jobs below run and the rest wait.
fn cluster(dir: &tempfile::TempDir, max_pending: u32) -> Cluster {
    forms::tests::cluster(dir).with_max_pending_per_user(max_pending)
}

fn request(name: &str, token: Option<&str>) -> SubmitRequest {
    SubmitRequest {
        job: JobRequest {
            command: Some(vec!["/bin/true".into()]),
            name: Some(name.into()),
            cpus: Some(4),
            memory: Some(64 << 20),
            ..Default::default()
        },
        cwd: "/tmp".into(),
        client_token: token.map(str::to_string),
        registry_auth: None,
    }
}

/// The counts kept in step equal the counts taken by walking every job.
fn assert_counts(c: &Cluster) {
    let mut pending: BTreeMap<u32, u32> = BTreeMap::new();
    let mut on_n1 = Vec::new();
    for j in c.jobs.values() {
        if j.state == JobState::Pending {
            *pending.entry(j.owner.uid).or_default() += 1;
        }
        if j.state.holds_resources() && j.first_node() == Some("n1") {
            on_n1.push(j.id);
        }
    }
    for uid in [1001, 1002] {
        assert_eq!(
            c.jobs.pending_of(uid),
            pending.get(&uid).copied().unwrap_or(0),
            "pending jobs of uid {uid}"
        );
    }
    let counted: Vec<JobId> = c.jobs.on_node("n1").map(|j| j.id).collect();
    assert_eq!(counted, on_n1, "jobs holding n1");
    for uid in [1001, 1002] {
        let active: Vec<JobId> = c
            .jobs
            .values()
            .filter(|j| j.owner.uid == uid)
            .filter(|j| j.state == JobState::Pending || j.state.holds_resources())
            .map(|j| j.id)
            .collect();
        let counted: Vec<JobId> = c.jobs.active_of(uid).map(|j| j.id).collect();
        assert_eq!(counted, active, "active jobs of uid {uid}");
    }
}

#[test]
fn the_pending_count_follows_submit_start_end_cancel_arrays_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir, 6);
    let (alice, bob) = (caller(1001, "alice"), caller(1002, "bob"));
    let a: Vec<JobId> = (0..3)
        .map(|k| {
            c.submit(&alice, &request(&format!("a{k}"), None), 1)
                .unwrap()
        })
        .collect();
    let mut array = request("arr", Some("arr"));
    array.job.array = Some(parse_array("0-2").unwrap());
    let arr = c.submit(&alice, &array, 1).unwrap();
    assert_eq!(c.jobs.pending_of(1001), 6);
    assert_counts(&c);
    // The seventh is refused with the count; a retry of the array is not counted again.
    let e = c.submit(&alice, &request("a7", None), 1).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable);
    assert!(
        e.message.contains("you have 6 pending jobs") && e.message.contains("max_pending_per_user"),
        "{}",
        e.message
    );
    assert_eq!(c.submit(&alice, &array, 1).unwrap(), arr);
    let b = c.submit(&bob, &request("b0", None), 1).unwrap();
    c.hold(&bob, b).unwrap();
    assert_counts(&c);

    // Two start, one pending job is cancelled: alice may submit two more.
    c.schedule(2).unwrap();
    assert_eq!(c.jobs.pending_of(1001), 4);
    assert_counts(&c);
    c.cancel(&alice, a[2], 3).unwrap();
    assert_eq!(c.jobs.pending_of(1001), 3);
    assert_counts(&c);
    c.submit(&alice, &request("a8", None), 4).unwrap();
    assert_counts(&c);

    // The running ones end and the next two start; cancelling the array ends its tasks.
    end(&mut c, a[0], 0, 10);
    end(&mut c, a[1], 0, 10);
    assert_counts(&c);
    c.schedule(11).unwrap();
    assert_counts(&c);
    c.cancel_array(&alice, arr, 12).unwrap();
    assert_counts(&c);
    assert_eq!(c.jobs.pending_of(1002), 1, "a held job is still pending");
    assert_counts(&c);
    let before: Vec<u32> = [1001, 1002].map(|u| c.jobs.pending_of(u)).to_vec();

    // A restart counts again from the store.
    drop(c);
    let c = cluster(&dir, 6);
    let after: Vec<u32> = [1001, 1002].map(|u| c.jobs.pending_of(u)).to_vec();
    assert_eq!(after, before);
    assert_counts(&c);
}

#[test]
fn a_group_is_stored_together_and_a_bad_submit_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir, 3);
    let (alice, bob) = (caller(1001, "alice"), caller(1002, "bob"));
    let mut huge = request("huge", Some("huge"));
    huge.job.cpus = Some(100);
    let reqs = [
        (&alice, request("one", Some("t1"))),
        (&alice, huge),
        (&alice, request("two", None)),
        // A retry within the group: the same job; the same token from another user: refused.
        (&alice, request("one again", Some("t1"))),
        (&bob, request("bob", Some("t1"))),
        // Alice's pending count includes the group's earlier jobs: 3 are allowed.
        (&alice, request("three", None)),
        (&alice, request("four", None)),
        (&bob, request("bob2", Some("t2"))),
    ];
    let group: Vec<(&Caller, &SubmitRequest)> = reqs.iter().map(|(c, r)| (*c, r)).collect();
    let answers = c.submit_group(&group, 5);
    assert_eq!(answers.len(), reqs.len());
    let ok: Vec<Option<JobId>> = answers.iter().map(|a| a.as_ref().ok().copied()).collect();
    let e = answers[1].as_ref().unwrap_err();
    assert!(e.message.contains("100 CPUs"), "{}", e.message);
    assert_eq!(ok[3], ok[0], "one token, one job");
    let e = answers[4].as_ref().unwrap_err();
    assert!(e.message.contains("already in use"), "{}", e.message);
    let e = answers[6].as_ref().unwrap_err();
    assert!(
        e.message.contains("you have 3 pending jobs"),
        "{}",
        e.message
    );
    let stored: Vec<JobId> = [0, 2, 5, 7].map(|k| ok[k].unwrap()).to_vec();
    let mut sorted = stored.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 4, "four jobs, four ids: {stored:?}");
    assert_counts(&c);

    // Every job the group acknowledged is in the store, and nothing else.
    drop(c);
    let mut c = cluster(&dir, 3);
    let names: Vec<(JobId, String)> = c.jobs.values().map(|j| (j.id, j.name.clone())).collect();
    let want: Vec<(JobId, String)> = stored
        .iter()
        .zip(["one", "two", "three", "bob2"])
        .map(|(id, n)| (*id, n.to_string()))
        .collect();
    assert_eq!(names, want);
    // The tokens hold across the restart.
    let again = c.submit(&alice, &request("x", Some("t1")), 6).unwrap();
    assert_eq!(again, stored[0]);
    let again = c.submit(&bob, &request("y", Some("t2")), 6).unwrap();
    assert_eq!(again, stored[3]);
}

#[test]
fn a_registry_credential_is_kept_apart_given_only_in_launch_orders_and_deleted_at_the_end() {
    use std::os::unix::fs::MetadataExt;
    use wharf_api::wire::RegistryCredential;
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir, 100);
    let alice = caller(1001, "alice");
    let secret = "hunter2-registry-secret";
    let with_cred = |name: &str, image: &str, registry: &str| {
        let mut r = request(name, None);
        r.job.image = Some(image.into());
        r.registry_auth = Some(RegistryCredential {
            registry: registry.into(),
            username: "alice".into(),
            password: secret.into(),
        });
        r
    };
    let image = "127.0.0.1:5000/priv/app:v1";
    let id = c
        .submit(&alice, &with_cred("run", image, "127.0.0.1:5000"), 1)
        .unwrap();
    let file = dir
        .path()
        .join(crate::registry_auth::DIR)
        .join(id.to_string());
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
    let dir_mode = std::fs::metadata(file.parent().unwrap()).unwrap().mode();
    assert_eq!(dir_mode & 0o7777, 0o700);

    // Never in what any caller can read, nor in the database.
    let seen = |c: &Cluster| {
        let list = serde_json::to_string(&c.list(&alice, 100, None, false).unwrap()).unwrap();
        let show = serde_json::to_string(&c.job(&alice, id).unwrap()).unwrap();
        list + &show
    };
    assert!(seen(&c).contains("priv/app"));
    assert!(!seen(&c).contains(secret));
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let f = f.unwrap().path();
        if f.is_file() {
            let bytes = std::fs::read(&f).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            assert!(!text.contains(secret), "{} holds the secret", f.display());
        }
    }

    // The launch order to the job's node carries it.
    c.schedule(2).unwrap();
    let none = std::collections::BTreeSet::new();
    let (launch, _) = c.orders("n1", &none, &none, &none);
    let order = launch.iter().find(|o| o.id == id).unwrap();
    assert_eq!(order.registry_auth.as_ref().unwrap().password, secret);
    assert!(!format!("{order:?}").contains(secret), "Debug hides it");

    // Ended: deleted, and in no order any more.
    end(&mut c, id, 0, 10);
    assert!(!file.exists(), "deleted when the job ended");

    // Cancelled while pending, and every task of an array.
    let pending = c
        .submit(&alice, &with_cred("p", image, "127.0.0.1:5000"), 11)
        .unwrap();
    let mut array = with_cred("arr", image, "127.0.0.1:5000");
    array.job.array = Some(parse_array("0-2").unwrap());
    let arr = c.submit(&alice, &array, 11).unwrap();
    let creds = dir.path().join(crate::registry_auth::DIR);
    assert_eq!(std::fs::read_dir(&creds).unwrap().count(), 4);
    c.cancel(&alice, pending, 12).unwrap();
    assert!(!creds.join(pending.to_string()).exists());
    c.cancel_array(&alice, arr, 12).unwrap();
    assert_eq!(std::fs::read_dir(&creds).unwrap().count(), 0);

    // Only for the registry the job names, and well formed.
    let e = c
        .submit(&alice, &with_cred("x", image, "nvcr.io"), 13)
        .unwrap_err();
    assert!(e.message.contains("only for the registry"), "{}", e.message);
    let e = c
        .submit(&alice, &with_cred("x", "host", "127.0.0.1:5000"), 13)
        .unwrap_err();
    assert!(
        e.message.contains("not a registry reference"),
        "{}",
        e.message
    );
    let mut bad = with_cred("x", image, "127.0.0.1:5000");
    bad.registry_auth.as_mut().unwrap().password = "a\r\nX-Evil: 1".into();
    let e = c.submit(&alice, &bad, 13).unwrap_err();
    assert!(e.message.contains("control character"), "{}", e.message);

    // A leftover of a job that ended while the controller was down goes at the next start.
    let kept = c
        .submit(&alice, &with_cred("k", image, "127.0.0.1:5000"), 14)
        .unwrap();
    std::fs::write(creds.join("999999"), "{}").unwrap();
    drop(c);
    let c = cluster(&dir, 100);
    assert!(creds.join(kept.to_string()).exists());
    assert!(!creds.join("999999").exists());
    drop(c);
}

#[test]
fn submits_and_starts_synced_once_are_stored_and_the_store_stays_durable_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir, 100);
    let ann = caller(1000, "ann");
    let req = request("a", Some("token-a"));
    let id = c
        .durable_once(|c| {
            assert!(!c.store.is_durable().unwrap(), "commits inside do not wait");
            let id = c.submit_group(&[(&ann, &req)], 10)[0].clone().unwrap();
            c.schedule(20).unwrap();
            id
        })
        .unwrap();
    assert!(c.store.is_durable().unwrap());
    // A controller started again from the database has the job as started (on n1).
    drop(c);
    let c = cluster(&dir, 100);
    let job = c.job(&ann, id).unwrap();
    assert_eq!(job.state, JobState::Starting);
    assert_eq!(job.nodelist(), "n1");
    // A panic inside leaves every later commit waiting for the disk again.
    let mut c = c;
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = c.durable_once(|_| panic!("a bug"));
    }));
    assert!(panicked.is_err());
    assert!(c.store.is_durable().unwrap());
}
