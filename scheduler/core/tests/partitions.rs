//! Partitions: node sets, default partition and time, limits and states, each with its reason.
// Configs are built field by field so each test shows only what it changes.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use wharf_core::*;

fn two_partitions() -> Config {
    let mut c = Config::default();
    let mut gpu = Partition::new("gpu", &["g1", "g2"]);
    gpu.max_time = Some(60 * MIN);
    gpu.default_time = Some(30 * MIN);
    gpu.max_nodes = Some(1);
    let all = Partition::new("all", &["c1", "g1", "g2"]);
    c.partitions = vec![all, gpu];
    c.default_partition = Some("all".into());
    c
}

fn nodes() -> Vec<Node> {
    vec![
        node("c1", 8, 64, 0),
        node("g1", 8, 64, 4),
        node("g2", 8, 64, 4),
    ]
}

#[test]
fn a_job_runs_only_on_its_partitions_nodes_and_gets_its_default_time() {
    let mut j = job(1, "u", 8, 0, 0, 0);
    j.partition = Some("gpu".into());
    j.time_limit = None;
    let state = State {
        nodes: nodes(),
        pending: vec![j, job(2, "u", 8, 0, 10, 1)],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &two_partitions());
    let s = &plan.starts[0];
    assert_eq!(
        (s.job, s.allocs[0].node.as_str(), s.time_limit),
        (1, "g1", 30 * MIN)
    );
    // The default partition includes c1 and the GPU nodes; best fit takes c1 (no GPUs).
    assert_eq!(plan.starts[1].allocs[0].node, "c1");
}

#[test]
fn a_job_without_a_time_gets_at_most_its_partitions_max_time() {
    let mut config = two_partitions();
    config.partitions[1].default_time = None;
    config.partitions[1].max_time = Some(30 * MIN);
    config.default_time = 60 * MIN;
    let mut j = job(1, "u", 8, 0, 0, 0);
    j.partition = Some("gpu".into());
    j.time_limit = None;
    let state = State {
        nodes: nodes(),
        pending: vec![j],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &config);
    assert_eq!(plan.starts.len(), 1, "{:?}", plan.waiting);
    assert_eq!(plan.starts[0].time_limit, 30 * MIN);
}

#[test]
fn limits_and_states_keep_jobs_pending_with_their_reasons() {
    let mut config = two_partitions();
    let mut long = job(1, "u", 1, 0, 120, 0);
    long.partition = Some("gpu".into());
    let mut wide = job(2, "u", 1, 0, 10, 0);
    wide.partition = Some("gpu".into());
    wide.request.nodes = 2;
    let mut nowhere = job(3, "u", 1, 0, 10, 0);
    nowhere.partition = Some("nope".into());
    let state = State {
        nodes: nodes(),
        pending: vec![long, wide, nowhere],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &config);
    assert!(plan.starts.is_empty());
    let r1 = &waiting(&plan, 1).reason;
    assert_eq!(
        r1,
        &PendingReason::PartitionTimeLimit {
            limit: 120 * MIN,
            max: 60 * MIN
        }
    );
    assert!(
        r1.to_string().contains("2h") || r1.to_string().contains("02:00"),
        "{r1}"
    );
    assert_eq!(
        waiting(&plan, 2).reason,
        PendingReason::PartitionNodeLimit { nodes: 2, max: 1 }
    );
    assert_eq!(waiting(&plan, 3).reason.code(), "PartitionConfig");

    config.partitions[1].state = PartitionState::Down;
    let mut j = job(4, "u", 1, 0, 10, 0);
    j.partition = Some("gpu".into());
    let state = State {
        nodes: nodes(),
        pending: vec![j],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &config);
    assert_eq!(
        waiting(&plan, 4).reason,
        PendingReason::PartitionDown {
            partition: "gpu".into()
        }
    );
    config.partitions[1].state = PartitionState::Inactive;
    let plan = schedule(MIN, &state, &config);
    assert_eq!(waiting(&plan, 4).reason.code(), "PartitionInactive");
    config.partitions[1].state = PartitionState::Drain;
    let plan = schedule(MIN, &state, &config);
    assert_eq!(
        started(&plan),
        vec![4],
        "a draining partition still runs its queue"
    );
}

#[test]
fn held_delayed_and_dependent_jobs_wait_with_their_reasons() {
    let mut held = job(1, "u", 1, 0, 10, 0);
    held.hold = Some(Hold::User);
    let mut admin = job(2, "u", 1, 0, 10, 0);
    admin.hold = Some(Hold::Admin);
    let mut later = job(3, "u", 1, 0, 10, 0);
    later.begin = Some(10 * MIN);
    let mut after = job(4, "u", 1, 0, 10, 0);
    after.after = vec![77, 1];
    let mut free = job(5, "u", 1, 0, 10, 0);
    free.after = vec![78];
    let state = State {
        nodes: nodes(),
        pending: vec![held, admin, later, after, free],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &Config::default());
    assert_eq!(
        started(&plan),
        vec![5],
        "a dependency on a job no longer queued is met"
    );
    assert_eq!(waiting(&plan, 1).reason, PendingReason::JobHeldUser);
    assert_eq!(waiting(&plan, 2).reason, PendingReason::JobHeldAdmin);
    assert_eq!(
        waiting(&plan, 3).reason,
        PendingReason::BeginTime { at: 10 * MIN }
    );
    assert_eq!(
        waiting(&plan, 4).reason,
        PendingReason::Dependency { on: 1 }
    );
    for w in &plan.waiting {
        let text = w.reason.to_string();
        assert!(
            text.starts_with(w.reason.code()) && text.len() > 30,
            "{text}"
        );
    }
    let plan = schedule(10 * MIN, &state, &Config::default());
    assert!(started(&plan).contains(&3));
}

#[test]
fn the_default_partition_is_the_one_named_if_it_exists_else_the_first() {
    let mut c = Config::default();
    assert_eq!(c.default_partition_name(), DEFAULT_PARTITION);
    c.partitions = vec![Partition::new("batch", &[]), Partition::new("gpu", &[])];
    assert_eq!(c.default_partition_name(), "batch");
    c.default_partition = Some("gpu".into());
    assert_eq!(c.default_partition_name(), "gpu");
    c.default_partition = Some("gone".into());
    assert_eq!(c.default_partition_name(), "batch");
    // Billing follows the same default; a partition no longer configured is charged the
    // default weights, as fair share charges it.
    c.partitions[1].billing.gpu = 7.0;
    c.default_partition = Some("gpu".into());
    assert_eq!(c.billing_for(None).gpu, 7.0);
    assert_eq!(c.billing_for(Some("batch")).gpu, Billing::default().gpu);
    c.partitions[0].billing.gpu = 3.0;
    assert_eq!(c.billing_for(Some("gone")).gpu, Billing::default().gpu);
    // A cluster with no partitions configured has the one default partition, and says so.
    let bare = Config::default();
    assert!(matches!(
        cycle::partition(&bare, Some(DEFAULT_PARTITION)),
        Ok(None)
    ));
    let refused = cycle::partition(&bare, Some("gpu")).unwrap_err();
    assert!(
        refused.message.ends_with("this cluster has: default"),
        "{}",
        refused.message
    );
}

/// A blocked job holds up only its own partition: under FCFS a job of another partition
/// still starts, and under any policy a job that waits behind nothing in its own partition
/// waits for resources, not priority (before, one blocked job anywhere stopped FCFS
/// everywhere and made every later job "Priority").
#[test]
fn a_blocked_job_holds_up_only_its_own_partition() {
    let mut config = Config::default();
    config.partitions = vec![Partition::new("a", &["n1"]), Partition::new("b", &["n2"])];
    let in_part = |mut j: PendingJob, p: &str| {
        j.partition = Some(p.into());
        j
    };
    let mut busy = running(9, "n1", (0..8).collect(), vec![], 0, 60);
    busy.partition = Some("a".into());
    let mut busy_b = running(8, "n2", (0..4).collect(), vec![], 0, 60);
    busy_b.partition = Some("b".into());
    for policy in [Policy::Fcfs, Policy::Easy, Policy::Multifactor] {
        config.policy = policy;
        let state = State {
            nodes: vec![node("n1", 8, 64, 0), node("n2", 8, 64, 0)],
            running: vec![busy.clone(), busy_b.clone()],
            pending: vec![
                in_part(job(1, "u", 8, 0, 30, 0), "a"),
                in_part(job(2, "u", 8, 0, 30, 1), "b"),
                in_part(job(3, "u", 4, 0, 30, 2), "b"),
            ],
            ..State::default()
        };
        let plan = schedule(MIN, &state, &config);
        assert_eq!(
            waiting(&plan, 1).reason,
            PendingReason::Resources,
            "{policy:?}"
        );
        assert_eq!(
            waiting(&plan, 2).reason,
            PendingReason::Resources,
            "{policy:?}"
        );
        // Behind job 2 in b: FCFS starts nothing there; a backfill policy fills the rest
        // of n2 with job 3, which ends before job 2 could start.
        if policy == Policy::Fcfs {
            assert_eq!(waiting(&plan, 3).reason, PendingReason::Priority);
        } else {
            assert_eq!(started(&plan), vec![3], "{policy:?}");
        }
    }

    // A partition over the same nodes is held up too: FCFS keeps no reservation, so a
    // stream of small jobs there could take n1 from job 1 for ever.
    config.policy = Policy::Fcfs;
    config.partitions = vec![
        Partition::new("a", &["n1"]),
        Partition::new("all", &["n1", "n2"]),
    ];
    let mut half = running(9, "n1", (0..4).collect(), vec![], 0, 60);
    half.partition = Some("a".into());
    let state = State {
        nodes: vec![node("n1", 8, 64, 0), node("n2", 8, 64, 0)],
        running: vec![half, busy_b],
        pending: vec![
            in_part(job(1, "u", 8, 0, 30, 0), "a"),
            in_part(job(2, "u", 4, 0, 30, 1), "all"),
        ],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &config);
    assert!(plan.starts.is_empty(), "{:?}", plan.starts);
    assert_eq!(waiting(&plan, 2).reason, PendingReason::Priority);
}
