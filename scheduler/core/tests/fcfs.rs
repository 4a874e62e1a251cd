//! FCFS: strict submit order, the first job that cannot start blocks every job behind it.

mod common;
use common::*;
use wharf_core::*;

fn fcfs() -> Config {
    Config::with_policy(Policy::Fcfs)
}

#[test]
fn starts_in_submit_order_with_the_lowest_ids() {
    let state = State {
        nodes: vec![node("a", 4, 8, 2)],
        pending: vec![job(2, "u", 2, 1, 10, 20), job(1, "u", 2, 1, 10, 10)],
        ..State::default()
    };
    let plan = schedule(100, &state, &fcfs());
    assert_eq!(started(&plan), vec![1, 2]);
    assert_eq!(plan.starts[0].allocs[0].cpu_ids, vec![0, 1]);
    assert_eq!(plan.starts[0].allocs[0].gpu_ids, vec![0]);
    assert_eq!(plan.starts[1].allocs[0].cpu_ids, vec![2, 3]);
    assert_eq!(plan.starts[1].allocs[0].gpu_ids, vec![1]);
}

#[test]
fn head_of_line_blocks_a_job_that_would_fit() {
    let state = State {
        nodes: vec![node("a", 4, 8, 0)],
        running: vec![running(9, "a", vec![0, 1], vec![], 0, 60)],
        pending: vec![job(1, "u", 4, 0, 10, 10), job(2, "u", 1, 0, 1, 20)],
        ..State::default()
    };
    let plan = schedule(100, &state, &fcfs());
    assert!(plan.starts.is_empty(), "{plan:?}");
    assert_eq!(waiting(&plan, 1).reason, PendingReason::Resources);
    assert_eq!(waiting(&plan, 2).reason, PendingReason::Priority);
    assert!(plan.reservations.is_empty());
}

#[test]
fn behind_a_blocked_job_a_job_that_can_never_run_still_says_why() {
    let state = State {
        nodes: vec![node("a", 4, 8, 0)],
        running: vec![running(9, "a", vec![0], vec![], 0, 60)],
        pending: vec![job(1, "u", 4, 0, 10, 10), job(2, "u", 64, 0, 1, 20)],
        ..State::default()
    };
    let plan = schedule(100, &state, &fcfs());
    assert_eq!(waiting(&plan, 1).reason, PendingReason::Resources);
    assert_eq!(waiting(&plan, 2).reason.code(), "BadConstraints");
}

#[test]
fn a_job_that_can_never_fit_blocks_nobody() {
    let state = State {
        nodes: vec![node("a", 4, 8, 0)],
        pending: vec![job(1, "u", 64, 0, 10, 10), job(2, "u", 1, 0, 1, 20)],
        ..State::default()
    };
    let plan = schedule(100, &state, &fcfs());
    assert_eq!(started(&plan), vec![2]);
    let w = waiting(&plan, 1);
    assert_eq!(w.reason.code(), "BadConstraints");
    assert!(w.reason.to_string().contains("64 CPUs"), "{}", w.reason);
}
