//! EASY backfill: the first blocked job gets a reservation at the earliest time its shape
//! fits; a later job starts early only if it delays nothing of that reservation.

mod common;
use common::*;
use wharf_core::*;

fn easy() -> Config {
    Config::with_policy(Policy::Easy)
}

/// One 4-GPU node, 3 GPUs busy for 60 minutes from t=0.
fn busy_node() -> State {
    State {
        nodes: vec![node("a", 16, 64, 4)],
        running: vec![running(9, "a", vec![0, 1, 2], vec![0, 1, 2], 0, 60)],
        ..State::default()
    }
}

#[test]
fn a_short_job_backfills_before_the_reservation_and_a_long_one_does_not() {
    let mut state = busy_node();
    state.pending = vec![
        job(1, "u", 4, 4, 60, 10),  // needs the whole node: reserved at t=60min
        job(2, "u", 1, 1, 30, 20),  // ends before the reservation: backfills
        job(3, "u", 1, 0, 120, 30), // CPU-only, runs past it but uses what it does not need
        job(4, "u", 1, 1, 120, 40), // would hold a GPU past the reservation's start: waits
    ];
    let now = MIN;
    let plan = schedule(now, &state, &easy());
    assert_eq!(started(&plan), vec![2, 3], "{plan:?}");
    assert_eq!(plan.reservations.len(), 1);
    let r = &plan.reservations[0];
    assert_eq!((r.job, r.start, r.end), (1, 60 * MIN, 120 * MIN));
    let w = waiting(&plan, 1);
    assert_eq!(w.reason, PendingReason::Resources);
    assert_eq!(w.estimated_start, Some(60 * MIN));
    assert_eq!(waiting(&plan, 4).reason, PendingReason::Priority);
    // Not a reservation, but an estimate: after 1's, when its GPUs are free again.
    assert_eq!(waiting(&plan, 4).estimated_start, Some(120 * MIN));
}

#[test]
fn only_one_reservation_is_made() {
    let mut state = busy_node();
    state.pending = vec![job(1, "u", 4, 4, 60, 10), job(2, "u", 4, 4, 60, 20)];
    let plan = schedule(MIN, &state, &easy());
    assert_eq!(plan.reservations.len(), 1);
    assert_eq!(waiting(&plan, 2).reason, PendingReason::Priority);
}

#[test]
fn the_reserved_job_starts_when_its_resources_free_up_and_is_not_starved() {
    // A stream of 1-GPU jobs keeps arriving; the 4-GPU job still starts at its reservation.
    let mut state = busy_node();
    state.pending = vec![job(1, "u", 4, 4, 60, 0)];
    let mut now = MIN;
    for next in 100..110 {
        state.pending.push(job(next, "u", 1, 1, 45, now));
        let plan = schedule(now, &state, &easy());
        apply(&mut state, &plan, now);
        // Jobs end at their time limit.
        now += 10 * MIN;
        state.running.retain(|r| r.start + r.time_limit > now);
        if state.running.iter().any(|r| r.id == 1) {
            break;
        }
    }
    let big = state
        .running
        .iter()
        .find(|r| r.id == 1)
        .expect("4-GPU job started");
    assert_eq!(
        big.start,
        61 * MIN,
        "started at the first pass after its reservation"
    );
}

#[test]
fn multi_node_job_reserves_a_common_start_on_real_shapes() {
    // Two 8-GPU nodes: a holds 8 GPUs until 30 min, b holds 4 until 90 min.
    let state = State {
        nodes: vec![node("a", 32, 64, 8), node("b", 32, 64, 8)],
        running: vec![
            running(8, "a", vec![0], (0..8).collect(), 0, 30),
            running(9, "b", vec![0], (0..4).collect(), 0, 90),
        ],
        pending: vec![{
            let mut j = job(1, "u", 4, 6, 60, 0);
            j.request.nodes = 2;
            j
        }],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &easy());
    let r = &plan.reservations[0];
    // 6 GPUs on each of two nodes: b has 4 free until 90 min, so 90 min, not 30.
    assert_eq!(r.start, 90 * MIN);
    assert_eq!(r.nodes, vec!["a".to_string(), "b".to_string()]);
}
