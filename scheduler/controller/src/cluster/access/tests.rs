// Configs are built field by field so each test shows only what it changes.
#![allow(clippy::field_reassign_with_default)]

use wharf_api::wire::ErrorKind;
use wharf_api::{JobRequest, JobState, Owner};

use crate::cluster::sched::tests::{caller, cluster_with, record, submit_job};
use crate::cluster::Cluster;

/// n1 (8 CPUs, GPUs 0, 1, 3 of type h100, no features) and n2 (features ib, nvme).
fn two_nodes(dir: &tempfile::TempDir, config: wharf_core::Config) -> Cluster {
    let mut c = cluster_with(dir, config);
    let mut n2 = c.nodes["n1"].info.clone();
    n2.name = "n2".into();
    n2.gpus.clear();
    n2.features = vec!["ib".into(), "nvme".into()];
    c.register(n2, 0).unwrap();
    c
}

fn asking(set: impl FnOnce(&mut JobRequest)) -> JobRequest {
    let mut r = JobRequest {
        memory: Some(1 << 30),
        ..Default::default()
    };
    set(&mut r);
    r
}

#[test]
fn a_constrained_job_lands_on_the_node_with_the_features() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = two_nodes(&dir, wharf_core::Config::default());
    let ann = caller(1000, "ann");
    let ib = submit_job(
        &mut c,
        &ann,
        asking(|r| r.constraint = Some("ib&nvme".into())),
        1,
    )
    .unwrap();
    let not_n2 = submit_job(&mut c, &ann, asking(|r| r.exclude = Some("n2".into())), 2).unwrap();
    c.schedule(1_000).unwrap();
    assert_eq!(record(&c, ib).first_node(), Some("n2"));
    assert_eq!(record(&c, not_n2).first_node(), Some("n1"));
}

#[test]
fn a_selection_no_node_satisfies_is_refused_at_submit_naming_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    config.partitions = vec![
        wharf_core::Partition::new("cpu", &["n2"]),
        wharf_core::Partition::new("gpu", &["n1"]),
    ];
    let mut c = two_nodes(&dir, config);
    let ann = caller(1000, "ann");
    for (set, want) in [
        (
            asking(|r| r.constraint = Some("bigmem".into())),
            "no node of partition cpu it may use has the features bigmem (features there: ib, nvme)",
        ),
        (
            asking(|r| r.nodelist = Some("n[2-4]".into())),
            "its --nodelist names n[3-4], which are not a node of this cluster",
        ),
        (
            asking(|r| r.nodelist = Some("n1".into())),
            "none of its --nodelist n1 is in partition cpu",
        ),
        (
            asking(|r| {
                r.partition = Some("gpu".into());
                r.constraint = Some("h100".into());
            }),
            "h100 is a GPU type, not a feature",
        ),
    ] {
        let err = submit_job(&mut c, &ann, set, 1).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidInput);
        assert!(
            err.message
                .starts_with("Requested node configuration is not available: ")
                && err.message.contains(want),
            "{}",
            err.message
        );
    }
    assert!(c.jobs.is_empty(), "nothing stored");
}

#[test]
fn an_exclusive_job_holds_and_is_charged_for_the_whole_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = two_nodes(&dir, wharf_core::Config::default());
    let ann = caller(1000, "ann");
    let whole = asking(|r| {
        r.exclusive = Some(true);
        r.nodelist = Some("n1".into());
    });
    let x = submit_job(&mut c, &ann, whole, 1).unwrap();
    let beside = submit_job(&mut c, &ann, asking(|r| r.nodelist = Some("n1".into())), 2).unwrap();
    c.schedule(1_000).unwrap();
    let rec = record(&c, x);
    assert_eq!(rec.state, JobState::Starting);
    assert_eq!(rec.allocs[0].cpu_ids, (0..8).collect::<Vec<_>>());
    assert_eq!(rec.allocs[0].gpu_ids, [0, 1, 3]);
    assert_eq!(
        (rec.resources.cpus, rec.resources.memory, rec.resources.gpus),
        (8, 16 << 30, 3)
    );
    // The node is told the whole node; the job keeps what it asked for, which a requeue
    // goes back to (before, it asked for its first node whole ever after).
    let spec = rec.spec.clone().unwrap();
    assert_eq!(c.launch_spec(&rec, &spec).resources, rec.resources);
    assert_eq!((spec.resources.cpus, spec.resources.gpus), (1, 0));
    let stop = wharf_api::Stop::Requeue {
        by_user: "ann".into(),
    };
    let again = crate::cluster::requeue::stopped(rec.clone(), &stop, vec![]);
    assert_eq!(again.state, JobState::Pending);
    assert_eq!(again.resources, spec.resources);
    let n1 = c.nodes().into_iter().find(|n| n.info.name == "n1").unwrap();
    assert_eq!(n1.allocated, n1.info.capacity());
    let waiting = record(&c, beside);
    assert_eq!(waiting.state, JobState::Pending);
    assert!(
        waiting.reason.unwrap().starts_with("Resources: "),
        "it waits for the node"
    );
}

#[test]
fn a_job_asking_for_no_memory_holds_and_launches_with_its_nodes_whole_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = two_nodes(&dir, wharf_core::Config::default());
    let ann = caller(1000, "ann");
    let all = asking(|r| {
        r.memory = Some(0);
        r.cpus = Some(2);
        r.nodelist = Some("n1".into());
    });
    let x = submit_job(&mut c, &ann, all, 1).unwrap();
    let spec = record(&c, x).spec.unwrap();
    assert!(spec.memory_whole);
    assert_eq!(spec.resources.memory, wharf_api::job::MIN_MEMORY);
    let beside = submit_job(&mut c, &ann, asking(|r| r.nodelist = Some("n1".into())), 2).unwrap();
    c.schedule(1_000).unwrap();
    let rec = record(&c, x);
    assert_eq!(rec.state, JobState::Starting);
    assert_eq!(rec.allocs[0].cpu_ids, [0, 1], "its CPUs, not the node's");
    assert_eq!(
        (rec.resources.cpus, rec.resources.memory, rec.resources.gpus),
        (2, 16 << 30, 0)
    );
    // The node is told to let it use all its memory; a requeue goes back to the request.
    assert_eq!(c.launch_spec(&rec, &spec).resources, rec.resources);
    let stop = wharf_api::Stop::Requeue {
        by_user: "ann".into(),
    };
    let again = crate::cluster::requeue::stopped(rec.clone(), &stop, vec![]);
    assert_eq!(again.resources, spec.resources);
    // Nothing is left on the node for another job's memory.
    let waiting = record(&c, beside);
    assert_eq!(waiting.state, JobState::Pending);
    assert!(
        waiting.reason.unwrap().starts_with("Resources: "),
        "it waits for the node's memory"
    );
}

fn groups_of(owner: &Owner) -> Result<Vec<String>, String> {
    match owner.user.as_str() {
        "ann" => Ok(vec!["ann".into(), "gpuusers".into()]),
        "bob" => Ok(vec!["bob".into()]),
        other => Err(format!("no user {other}")),
    }
}

#[test]
fn allow_accounts_and_allow_groups_refuse_at_submit_with_what_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    let mut gpu = wharf_core::Partition::new("gpu", &["n1"]);
    gpu.allow_groups = vec!["gpuusers".into()];
    let mut paid = wharf_core::Partition::new("paid", &["n2"]);
    paid.allow_accounts = vec!["physics".into()];
    config.partitions = vec![wharf_core::Partition::new("all", &[]), gpu, paid];
    let mut c = two_nodes(&dir, config).with_group_lookup(groups_of);
    let (ann, bob) = (caller(1000, "ann"), caller(1001, "bob"));
    let to = |p: &str| asking(|r| r.partition = Some(p.into()));

    assert!(submit_job(&mut c, &ann, to("gpu"), 1).is_ok());
    let err = submit_job(&mut c, &bob, to("gpu"), 2).unwrap_err();
    assert_eq!(err.kind, ErrorKind::PermissionDenied);
    assert!(
        err.message
            .contains("partition gpu allows members of groups gpuusers only; bob is in bob"),
        "{}",
        err.message
    );
    let mut root = caller(0, "root");
    root.admin = true;
    assert!(
        submit_job(&mut c, &root, to("gpu"), 3).is_ok(),
        "admins pass"
    );
    let err = submit_job(&mut c, &caller(1002, "eve"), to("gpu"), 4).unwrap_err();
    assert!(
        err.message.contains("could not be found: no user eve"),
        "{}",
        err.message
    );

    let err = submit_job(&mut c, &ann, to("paid"), 5).unwrap_err();
    assert!(
        err.message.contains(
            "partition paid allows jobs of accounts physics only, and this job is charged to account \"ann\""
        ),
        "{}",
        err.message
    );
    // Other partitions are open to all.
    assert!(submit_job(&mut c, &bob, to("all"), 6).is_ok());
}

static LOOKUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn counted_groups_of(owner: &Owner) -> Result<Vec<String>, String> {
    LOOKUPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    groups_of(owner)
}

#[test]
fn a_users_groups_are_looked_up_once_for_many_submits_and_a_failed_lookup_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    let mut gpu = wharf_core::Partition::new("gpu", &["n1"]);
    gpu.allow_groups = vec!["gpuusers".into()];
    config.partitions = vec![gpu];
    let mut c = two_nodes(&dir, config).with_group_lookup(counted_groups_of);
    let to_gpu = || asking(|r| r.partition = Some("gpu".into()));
    let looked = || LOOKUPS.load(std::sync::atomic::Ordering::SeqCst);
    // Under the cluster's lock, each lookup holds up every other request: a slow group
    // database (LDAP) must not be asked at every submit.
    for t in 1..=5 {
        assert!(submit_job(&mut c, &caller(1000, "ann"), to_gpu(), t).is_ok());
    }
    assert_eq!(looked(), 1);
    for t in 6..=7 {
        assert!(submit_job(&mut c, &caller(1002, "eve"), to_gpu(), t).is_err());
    }
    assert_eq!(looked(), 3, "a lookup that failed is not kept");
}

#[test]
fn a_job_no_node_of_its_partition_could_hold_is_refused_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    config.partitions = vec![
        wharf_core::Partition::new("cpu", &["n2"]),
        wharf_core::Partition::new("gpu", &["n1"]),
        wharf_core::Partition::new("all", &["n1", "n2"]),
    ];
    let mut c = two_nodes(&dir, config);
    let ann = caller(1000, "ann");
    // n1 in `gpu` has the GPUs, but `cpu` has only n2, which has none: refused, where before
    // it was stored and waited for ever.
    for (set, want) in [
        (
            asking(|r| {
                r.partition = Some("cpu".into());
                r.gpus = Some(1);
            }),
            "no node of its partition has 1 CPUs",
        ),
        (
            asking(|r| {
                r.partition = Some("all".into());
                r.nodes = Some(2);
                r.gpus = Some(1);
            }),
            "it asks for 2 nodes and the partition allows 1",
        ),
        (
            // n1's type, outside the partition asked for.
            asking(|r| {
                r.partition = Some("cpu".into());
                r.gpus = Some(1);
                r.gpu_type = Some("h100".into());
            }),
            "1 h100 GPUs",
        ),
    ] {
        let err = submit_job(&mut c, &ann, set, 1).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidInput);
        assert!(
            err.message.starts_with("this job could never start: ") && err.message.contains(want),
            "{}",
            err.message
        );
    }
    assert!(c.jobs.is_empty(), "nothing stored");
    // What either partition can hold is taken, and so is what a partition could hold once
    // the node it names that has not joined yet does.
    drop(c);
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    config.partitions = vec![
        wharf_core::Partition::new("cpu", &["n2"]),
        wharf_core::Partition::new("gpu", &["n1", "n3"]),
    ];
    let mut c = two_nodes(&dir, config);
    submit_job(
        &mut c,
        &ann,
        asking(|r| {
            r.partition = Some("gpu".into());
            r.nodes = Some(2);
            r.gpus = Some(1);
        }),
        1,
    )
    .unwrap();
    for set in [
        asking(|r| {
            r.partition = Some("gpu".into());
            r.gpus = Some(3);
        }),
        asking(|r| r.partition = Some("cpu".into())),
    ] {
        submit_job(&mut c, &ann, set, 1).unwrap();
    }
}
