//! Estimated starts past the reservations (`start_estimates`): once the pass has decided
//! everything, the next waiting jobs are placed where their shapes first fit, in scheduling
//! order, and show that time; nothing is held back for them.
// Configs are built field by field so each test shows only what it changes.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use wharf_core::*;

/// One reservation, no extra ones: every other waiting job's time is an estimate.
fn one_reservation(estimates: usize) -> Config {
    let mut c = Config::default();
    c.reservations = 1;
    c.assoc_reservations = 0;
    c.start_estimates = estimates;
    c
}

/// Node a (8 CPUs) is full until 60 min. One user's jobs, largest first: 1 and 2 take the
/// whole node (60 and 30 min), 3 and 4 half of it.
fn queue_behind_a_full_node() -> State {
    State {
        nodes: vec![node("a", 8, 64, 0)],
        running: vec![running(9, "a", (0..8).collect(), vec![], 0, 60)],
        pending: vec![
            job(1, "u", 8, 0, 60, 0),
            job(2, "u", 8, 0, 30, MIN),
            job(3, "u", 4, 0, 60, 2 * MIN),
            job(4, "u", 4, 0, 90, 3 * MIN),
        ],
        ..State::default()
    }
}

fn estimates(plan: &Plan) -> Vec<(u64, Option<Time>)> {
    (1..=4)
        .map(|j| (j, waiting(plan, j).estimated_start))
        .collect()
}

#[test]
fn waiting_jobs_past_the_reservations_are_placed_one_after_another() {
    let plan = schedule(MIN * 5, &queue_behind_a_full_node(), &one_reservation(32));
    assert_eq!(plan.reservations.len(), 1, "{plan:?}");
    assert_eq!(plan.reservations[0].job, 1);
    // 1 holds the node 60-120 min, 2 comes after it (120-150), then 3 and 4 side by side.
    assert_eq!(
        estimates(&plan),
        vec![
            (1, Some(60 * MIN)),
            (2, Some(120 * MIN)),
            (3, Some(150 * MIN)),
            (4, Some(150 * MIN)),
        ]
    );
    // Only the reservation is one: the others wait for priority, as without estimates.
    assert_eq!(waiting(&plan, 2).reason, PendingReason::Priority);
    let note = cycle::waiting_note(&plan, waiting(&plan, 3), MIN * 5, &Weights::default(), None);
    assert_eq!(note.expected_start, Some(150 * MIN));
    assert!(
        note.reason.ends_with("expected to start in about 02:25:00"),
        "{}",
        note.reason
    );
}

#[test]
fn only_the_first_start_estimates_get_one() {
    let plan = schedule(MIN * 5, &queue_behind_a_full_node(), &one_reservation(2));
    assert_eq!(
        estimates(&plan),
        vec![
            (1, Some(60 * MIN)),
            (2, Some(120 * MIN)),
            (3, Some(150 * MIN)),
            (4, None),
        ]
    );
    let plan = schedule(MIN * 5, &queue_behind_a_full_node(), &one_reservation(0));
    assert_eq!(
        estimates(&plan),
        vec![(1, Some(60 * MIN)), (2, None), (3, None), (4, None)]
    );
}

#[test]
fn jobs_that_wait_for_something_other_than_resources_get_none() {
    let mut state = queue_behind_a_full_node();
    state.pending[1].hold = Some(Hold::User);
    state.pending[2].begin = Some(24 * 60 * MIN);
    let plan = schedule(MIN * 5, &state, &one_reservation(32));
    assert_eq!(waiting(&plan, 2).reason, PendingReason::JobHeldUser);
    assert!(matches!(
        waiting(&plan, 3).reason,
        PendingReason::BeginTime { .. }
    ));
    // The held and the later job take no place: 4 comes right after the reservation.
    assert_eq!(
        estimates(&plan),
        vec![
            (1, Some(60 * MIN)),
            (2, None),
            (3, None),
            (4, Some(120 * MIN))
        ]
    );
}

#[test]
fn an_estimate_is_not_a_reservation() {
    let config = one_reservation(32);
    // Node a (8 CPUs) is full until 30 min; node b (8 CPUs) has 4 free, the rest until 60.
    let mut state = State {
        nodes: vec![node("a", 8, 64, 0), node("b", 8, 64, 0)],
        running: vec![
            running(8, "a", (0..8).collect(), vec![], 0, 30),
            running(9, "b", (0..4).collect(), vec![], 0, 60),
        ],
        pending: vec![job(1, "u", 8, 0, 60, 0), job(2, "u", 8, 0, 60, MIN)],
        ..State::default()
    };
    let plan = schedule(5 * MIN, &state, &config);
    assert_eq!(plan.reservations.len(), 1, "{plan:?}");
    assert_eq!(waiting(&plan, 1).estimated_start, Some(30 * MIN));
    assert_eq!(waiting(&plan, 2).estimated_start, Some(60 * MIN));
    // Only the reservation may be kept.
    let kept: Vec<u64> = kept_reservations(&plan).into_keys().collect();
    assert_eq!(kept, vec![1]);
    state.keep_reservations(&plan);
    // A smaller job of lower priority comes: it fits on b now, away from 1's reservation on
    // a, and starts, though it runs through the place job 2 was expected to take; 2 is
    // expected after 1 on a instead.
    state.pending.push(job(3, "u", 4, 0, 100, 10 * MIN));
    let plan = schedule(10 * MIN, &state, &config);
    assert!(plan.priority(3).unwrap().value < plan.priority(2).unwrap().value);
    assert_eq!(started(&plan), vec![3], "{plan:?}");
    assert_eq!(waiting(&plan, 1).estimated_start, Some(30 * MIN));
    assert_eq!(waiting(&plan, 2).estimated_start, Some(90 * MIN));
}

#[test]
fn under_fcfs_no_job_is_expected_before_the_one_ahead_of_it() {
    // Node a: 4 of 8 CPUs busy until 60 min. FCFS blocks behind job 1 (the whole node), so
    // job 2 cannot start on the free CPUs now, nor before 1.
    let state = State {
        nodes: vec![node("a", 8, 64, 0)],
        running: vec![running(9, "a", (0..4).collect(), vec![], 0, 60)],
        pending: vec![job(1, "u", 8, 0, 60, 0), job(2, "u", 1, 0, 10, MIN)],
        ..State::default()
    };
    let plan = schedule(5 * MIN, &state, &Config::with_policy(Policy::Fcfs));
    assert!(plan.starts.is_empty(), "{plan:?}");
    assert_eq!(waiting(&plan, 1).estimated_start, Some(60 * MIN));
    assert_eq!(waiting(&plan, 2).estimated_start, Some(120 * MIN));
}

#[test]
fn a_large_partition_gets_fewer_estimates() {
    // 10,000 busy one-CPU nodes: each estimate looks at all of them, and a pass looks at no
    // more than 20,000 nodes for estimates, so two of the three waiting jobs get one.
    let names: Vec<String> = (0..10_000).map(|i| format!("n{i:05}")).collect();
    let state = State {
        nodes: names.iter().map(|n| node(n, 1, 4, 0)).collect(),
        running: (names.iter().zip(100..))
            .map(|(n, id)| running(id, n, vec![0], vec![], 0, 60))
            .collect(),
        pending: (1..=4).map(|j| job(j, "u", 1, 0, 60, j * MIN)).collect(),
        ..State::default()
    };
    let plan = schedule(5 * MIN, &state, &one_reservation(32));
    assert_eq!(
        estimates(&plan),
        vec![
            (1, Some(60 * MIN)),
            (2, Some(60 * MIN)),
            (3, Some(60 * MIN)),
            (4, None),
        ]
    );
}
