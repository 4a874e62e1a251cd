//! The multifactor policy: priority order (partition tier first), factors reported per job,
//! several reservations, backfill around all of them.
// Configs are built field by field so each test shows only what it changes.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use wharf_core::*;

#[test]
fn each_factor_is_normalised_and_weighted() {
    let mut config = Config::default();
    config.weights = Weights {
        age: 1000,
        fairshare: 0,
        job_size: 1000,
        width: 1600,
        partition: 0,
        qos: 500,
    };
    config.max_age = 100 * MIN;
    config.qos = vec![
        Qos {
            name: "high".into(),
            priority: 10,
        },
        Qos {
            name: "normal".into(),
            priority: 5,
        },
    ];
    let mut old = job(1, "u", 8, 0, 10, 0);
    old.qos = Some("normal".into());
    old.nice = 100;
    let young = job(2, "u", 4, 0, 10, 150 * MIN);
    let state = State {
        nodes: vec![node("a", 16, 64, 0)],
        running: vec![running(9, "a", (0..16).collect(), vec![], 0, 600)],
        pending: vec![old, young],
        ..State::default()
    };
    let plan = schedule(200 * MIN, &state, &config);
    let p1 = plan.priority(1).unwrap();
    assert_eq!(p1.age, 1.0, "capped at max_age");
    assert_eq!(p1.job_size, 0.5);
    assert_eq!(p1.width, 0.125, "the cube of its share");
    assert_eq!(p1.qos, 0.5);
    assert_eq!(p1.value, 1000 + 500 + 200 + 250 - 100);
    let p2 = plan.priority(2).unwrap();
    assert_eq!(p2.age, 0.5);
    assert_eq!(p2.job_size, 0.25);
    assert_eq!(p2.width, 0.015625);
    assert_eq!(p2.value, 500 + 250 + 25);
    // Favouring small jobs turns the job-size factor round, not the width.
    config.favor_small = true;
    let plan = schedule(200 * MIN, &state, &config);
    let p2 = plan.priority(2).unwrap();
    assert_eq!((p2.job_size, p2.width), (0.75, 0.015625));
}

/// The width term lets a job of the whole partition go ahead of older small jobs that would
/// otherwise fill the partition first.
#[test]
fn width_puts_a_whole_partition_job_ahead_of_older_small_ones() {
    let mut config = Config::default();
    config.max_age = 20 * MIN;
    config.weights = Weights {
        age: 1000,
        fairshare: 0,
        job_size: 0,
        width: 0,
        partition: 0,
        qos: 0,
    };
    let smalls = (1..=4).map(|id| job(id, "u", 4, 0, 10, 0));
    let wide = job(9, "v", 16, 0, 10, 10 * MIN);
    let state = State {
        nodes: vec![node("a", 16, 64, 0)],
        pending: smalls.chain([wide]).collect(),
        ..State::default()
    };
    let plan = schedule(20 * MIN, &state, &config);
    assert_eq!(
        started(&plan),
        vec![1, 2, 3, 4],
        "by age alone the small ones fill it"
    );
    config.weights.width = 2000;
    let plan = schedule(20 * MIN, &state, &config);
    assert_eq!(started(&plan), vec![9]);
    assert_eq!(plan.priority(9).unwrap().value, 500 + 2000);
    assert_eq!(plan.priority(1).unwrap().value, 1000 + 31, "2000 × (1/4)³");
}

#[test]
fn higher_priority_goes_first_and_a_higher_tier_before_any_priority() {
    let mut config = Config::default();
    config.weights.fairshare = 0;
    let mut low = Partition::new("low", &[]);
    low.priority_tier = 1;
    let mut high = Partition::new("high", &[]);
    high.priority_tier = 2;
    config.partitions = vec![low, high];
    config.qos = vec![Qos {
        name: "vip".into(),
        priority: 100,
    }];
    let mut vip = job(1, "u", 4, 0, 10, 0);
    vip.qos = Some("vip".into());
    vip.partition = Some("low".into());
    let mut plain = job(2, "u", 4, 0, 10, 50);
    plain.partition = Some("low".into());
    let mut tiered = job(3, "u", 4, 0, 10, 100);
    tiered.partition = Some("high".into());
    let state = State {
        nodes: vec![node("a", 4, 64, 0)],
        pending: vec![plain, vip, tiered],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &config);
    assert_eq!(started(&plan), vec![3]);
    let order: Vec<u64> = plan.waiting.iter().map(|w| w.job).collect();
    assert_eq!(order, vec![1, 2], "QoS outranks submit time");
}

#[test]
fn several_reservations_and_backfill_around_them() {
    let mut config = Config::default();
    config.reservations = 2;
    config.weights = Weights {
        age: 0,
        fairshare: 0,
        job_size: 0,
        width: 0,
        partition: 0,
        qos: 0,
    };
    // Two 4-GPU nodes, fully busy: a until 30 min, b until 60 min.
    let state = State {
        nodes: vec![node("a", 8, 64, 4), node("b", 8, 64, 4)],
        running: vec![
            running(8, "a", vec![0], (0..4).collect(), 0, 30),
            running(9, "b", vec![0], (0..4).collect(), 0, 60),
        ],
        pending: vec![
            job(1, "u", 1, 4, 60, 10), // reserved on a at 30 min
            job(2, "u", 1, 4, 60, 20), // reserved on b at 60 min
            job(3, "u", 1, 4, 10, 30), // nothing free now: Priority
            job(4, "u", 7, 0, 20, 40), // CPU-only, fits beside both reservations: starts
        ],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &config);
    assert_eq!(started(&plan), vec![4]);
    let res: Vec<(u64, Time, Vec<String>)> = plan
        .reservations
        .iter()
        .map(|r| (r.job, r.start, r.nodes.clone()))
        .collect();
    assert_eq!(
        res,
        vec![
            (1, 30 * MIN, vec!["a".to_string()]),
            (2, 60 * MIN, vec!["b".to_string()])
        ]
    );
    assert_eq!(waiting(&plan, 2).estimated_start, Some(60 * MIN));
    assert_eq!(waiting(&plan, 3).reason, PendingReason::Priority);
}

#[test]
fn max_job_test_bounds_the_jobs_looked_at() {
    let mut config = Config::default();
    config.max_job_test = 2;
    let state = State {
        nodes: vec![node("a", 8, 64, 0)],
        pending: (1..=4).map(|i| job(i, "u", 1, 0, 10, i)).collect(),
        ..State::default()
    };
    let plan = schedule(MIN, &state, &config);
    assert_eq!(plan.starts.len(), 2);
    assert_eq!(plan.waiting.len(), 2);
    assert!(plan
        .waiting
        .iter()
        .all(|w| w.reason == PendingReason::Priority));
}

#[test]
fn a_fixed_priority_replaces_the_computed_one() {
    let mut config = Config::default();
    config.weights.fairshare = 0;
    // Three one-node jobs for a node that holds one: 1 is oldest, so first by age; an
    // admin fixes 3's priority above every computed one and 1's below.
    let mut first = job(1, "u", 4, 0, 10, 0);
    first.priority = Some(1);
    let second = job(2, "u", 4, 0, 10, 50);
    let mut third = job(3, "u", 4, 0, 10, 100);
    third.priority = Some(1_000_000);
    let state = State {
        nodes: vec![node("a", 4, 64, 0)],
        pending: vec![first, second, third],
        ..State::default()
    };
    let now = 7 * 24 * 60 * MIN;
    let plan = schedule(now, &state, &config);
    assert_eq!(started(&plan), vec![3]);
    let order: Vec<u64> = plan.waiting.iter().map(|w| w.job).collect();
    assert_eq!(order, vec![2, 1]);
    let p = plan.priority(3).unwrap();
    assert!(p.fixed && p.value == 1_000_000 && p.age > 0.0, "{p:?}");
    let p = plan.priority(2).unwrap();
    assert!(!p.fixed && p.value > 1, "{p:?}");
}
