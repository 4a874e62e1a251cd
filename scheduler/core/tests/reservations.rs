//! Which jobs hold reservations under the multifactor policy beyond the first
//! `reservations`: an association's first blocked job, and a reservation kept once its job
//! has waited `keep_reservations_after` (among the first `keep_reservations` made).
// Configs are built field by field so each test shows only what it changes.
#![allow(clippy::field_reassign_with_default)]

mod common;
use common::*;
use wharf_core::*;

/// Fair share alone orders jobs; `hog` has used the cluster, `ann` has not.
fn fair_config() -> Config {
    let mut c = Config::default();
    c.weights = Weights {
        age: 0,
        fairshare: 10_000,
        job_size: 0,
        width: 0,
        partition: 0,
        qos: 0,
    };
    c
}

fn hog_has_used(state: &mut State) {
    state.usage.insert(Assoc::new("hog", "hog"), 1_000_000.0);
}

fn reserved(plan: &Plan) -> Vec<(u64, Time)> {
    plan.reservations.iter().map(|r| (r.job, r.start)).collect()
}

/// hog's big job waits for node a (busy until 60 min); ann, who has used nothing, sends the
/// same shape later.
fn overtaken(keep_after: Time, kept: bool) -> Plan {
    let mut config = fair_config();
    config.reservations = 1;
    config.assoc_reservations = 0;
    config.keep_reservations_after = keep_after;
    let mut state = State {
        nodes: vec![node("a", 8, 64, 0)],
        running: vec![running(9, "a", (0..8).collect(), vec![], 0, 60)],
        pending: vec![job(1, "hog", 8, 0, 60, 0)],
        ..State::default()
    };
    hog_has_used(&mut state);
    let first = schedule(MIN, &state, &config);
    assert_eq!(reserved(&first), vec![(1, 60 * MIN)]);
    if kept {
        state.keep_reservations(&first);
    }
    state.pending.push(job(2, "ann", 8, 0, 60, 15 * MIN));
    schedule(20 * MIN, &state, &config)
}

#[test]
fn a_job_that_waited_long_enough_keeps_its_reservation_against_later_higher_priority_jobs() {
    let plan = overtaken(10 * MIN, true);
    assert!(plan.priority(2).unwrap().value > plan.priority(1).unwrap().value);
    assert_eq!(reserved(&plan), vec![(1, 60 * MIN)], "hog keeps it");
    assert_eq!(waiting(&plan, 2).reason, PendingReason::Priority);
}

#[test]
fn before_that_a_later_job_of_higher_priority_takes_the_reservation_over() {
    // Waited 20 min of the 30 needed: ann's job goes first, as in Slurm.
    assert_eq!(reserved(&overtaken(30 * MIN, true)), vec![(2, 60 * MIN)]);
    // A reservation not kept by the caller is not held either.
    assert_eq!(reserved(&overtaken(10 * MIN, false)), vec![(2, 60 * MIN)]);
}

/// Nodes a and b, 8 CPUs each, busy until 60 and 90 min; `pending` waits for them.
fn two_busy_nodes(pending: Vec<PendingJob>) -> State {
    State {
        nodes: vec![node("a", 8, 64, 0), node("b", 8, 64, 0)],
        running: vec![
            running(8, "a", (0..8).collect(), vec![], 0, 60),
            running(9, "b", (0..8).collect(), vec![], 0, 90),
        ],
        pending,
        ..State::default()
    }
}

/// hog's two big jobs hold the pass's two reservations (node a free at 60 min, b at 90 min)
/// and have waited long enough to keep them; ann, who has used nothing, sends the second's
/// shape later. `keep` is how many of them may be kept.
fn two_kept(keep: usize) -> Plan {
    let mut config = fair_config();
    config.reservations = 2;
    config.assoc_reservations = 0;
    config.keep_reservations_after = 10 * MIN;
    config.keep_reservations = keep;
    let mut state = two_busy_nodes(vec![job(1, "hog", 8, 0, 60, 0), job(2, "hog", 8, 0, 60, 0)]);
    hog_has_used(&mut state);
    let first = schedule(MIN, &state, &config);
    assert_eq!(reserved(&first), vec![(1, 60 * MIN), (2, 90 * MIN)]);
    state.keep_reservations(&first);
    state.pending.push(job(3, "ann", 8, 0, 60, 15 * MIN));
    schedule(20 * MIN, &state, &config)
}

#[test]
fn only_the_first_keep_reservations_are_kept_and_the_rest_go_by_priority() {
    // Every reservation may be kept: hog keeps both, ann waits behind them.
    let all = two_kept(usize::MAX);
    assert_eq!(reserved(&all), vec![(1, 60 * MIN), (2, 90 * MIN)]);
    assert_eq!(waiting(&all, 3).reason, PendingReason::Priority);
    // One (the default): the first holds; fair share puts ann's job ahead of hog's second for
    // the rest.
    assert_eq!(Config::default().keep_reservations, 1);
    let one = two_kept(1);
    assert_eq!(reserved(&one), vec![(1, 60 * MIN), (3, 90 * MIN)]);
    assert!(one.priority(3).unwrap().value > one.priority(2).unwrap().value);
    // None: nothing is kept, and fair share orders all three.
    let none = two_kept(0);
    assert_eq!(reserved(&none), vec![(3, 60 * MIN), (1, 90 * MIN)]);
}

#[test]
fn a_reservation_that_may_not_be_kept_yet_uses_up_no_place() {
    // ann's young job got the first reservation and hog's old one the second; only one may
    // be kept. ann's has not waited long enough, so hog's is the one kept: cat's later job of
    // higher priority does not take it over.
    let mut config = fair_config();
    config.reservations = 2;
    config.assoc_reservations = 0;
    config.keep_reservations_after = 30 * MIN;
    config.keep_reservations = 1;
    let pending = vec![job(1, "hog", 8, 0, 60, 0), job(2, "ann", 8, 0, 60, 9 * MIN)];
    let mut state = two_busy_nodes(pending);
    hog_has_used(&mut state);
    let first = schedule(10 * MIN, &state, &config);
    assert_eq!(reserved(&first), vec![(2, 60 * MIN), (1, 90 * MIN)]);
    state.keep_reservations(&first);
    state.pending.push(job(3, "cat", 8, 0, 60, 20 * MIN));
    let plan = schedule(35 * MIN, &state, &config);
    assert!(plan.priority(3).unwrap().value > plan.priority(1).unwrap().value);
    assert_eq!(reserved(&plan), vec![(1, 60 * MIN), (2, 90 * MIN)]);
    assert_eq!(waiting(&plan, 3).reason, PendingReason::Priority);
}

#[test]
fn kept_reservations_keep_the_order_they_were_made_in() {
    let mut state = State::default();
    let plan = |jobs: &[u64]| Plan {
        reservations: jobs
            .iter()
            .map(|&job| Reservation {
                job,
                start: 0,
                end: 0,
                nodes: vec![],
            })
            .collect(),
        ..Plan::default()
    };
    state.keep_reservations(&plan(&[1, 2]));
    state.keep_reservations(&plan(&[3, 2]));
    let kept: Vec<(u64, u32)> = state.reserved.iter().map(|(&j, k)| (j, k.place)).collect();
    assert_eq!(kept, vec![(2, 1), (3, 0)], "1 got none, so it is dropped");
}

/// ann's big job holds the one reservation of the depth (node a at 60 min); hog's big job
/// (2) is blocked next, and hog's later small, long job (3) fits now on node b, where 4 CPUs
/// are free until the running job ends at 90 min.
fn behind_the_depth(assoc_reservations: usize) -> Plan {
    let mut config = fair_config();
    config.reservations = 1;
    config.assoc_reservations = assoc_reservations;
    let mut state = State {
        nodes: vec![node("a", 8, 64, 0), node("b", 8, 64, 0)],
        running: vec![
            running(8, "a", (0..8).collect(), vec![], 0, 60),
            running(9, "b", (0..4).collect(), vec![], 0, 90),
        ],
        pending: vec![
            job(1, "ann", 8, 0, 60, 0),
            job(2, "hog", 8, 0, 60, 0),
            job(3, "hog", 4, 0, 300, 5 * MIN),
        ],
        ..State::default()
    };
    hog_has_used(&mut state);
    schedule(10 * MIN, &state, &config)
}

#[test]
fn an_associations_first_blocked_job_gets_a_reservation_past_the_depth() {
    let plan = behind_the_depth(1);
    assert_eq!(reserved(&plan), vec![(1, 60 * MIN), (2, 90 * MIN)]);
    assert_eq!(started(&plan), Vec::<u64>::new(), "3 would delay 2 on b");
    assert_eq!(waiting(&plan, 3).reason, PendingReason::Priority);
}

#[test]
fn without_it_the_associations_own_later_job_backfills_ahead_of_its_first() {
    let plan = behind_the_depth(0);
    assert_eq!(reserved(&plan), vec![(1, 60 * MIN)]);
    assert_eq!(started(&plan), vec![3]);
}

#[test]
fn one_extra_reservation_per_association_and_none_under_easy() {
    // hog's second big job gets none: hog already holds one.
    let mut config = fair_config();
    config.reservations = 1;
    config.assoc_reservations = 5;
    let mut state = State {
        nodes: vec![node("a", 8, 64, 0)],
        running: vec![running(9, "a", (0..8).collect(), vec![], 0, 60)],
        pending: vec![
            job(1, "ann", 8, 0, 60, 0),
            job(2, "hog", 8, 0, 60, 0),
            job(3, "hog", 8, 0, 60, MIN),
        ],
        ..State::default()
    };
    hog_has_used(&mut state);
    let plan = schedule(10 * MIN, &state, &config);
    assert_eq!(reserved(&plan), vec![(1, 60 * MIN), (2, 120 * MIN)]);
    config.policy = Policy::Easy;
    let easy = schedule(10 * MIN, &state, &config);
    assert_eq!(easy.reservations.len(), 1);
}

#[test]
fn kept_jobs_go_in_the_order_their_reservations_were_made_after_any_higher_tier() {
    let mut config = fair_config();
    config.reservations = 3;
    config.assoc_reservations = 0;
    config.keep_reservations_after = 0;
    let mut high = Partition::new("high", &[]);
    high.priority_tier = 1;
    config.partitions = vec![Partition::new("low", &[]), high];
    config.default_partition = Some("low".into());
    // One node, busy for an hour; each job wants all of it for an hour.
    let mut state = State {
        nodes: vec![node("a", 8, 64, 0)],
        running: vec![running(9, "a", (0..8).collect(), vec![], 0, 60)],
        pending: vec![job(1, "ann", 8, 0, 60, 0), job(2, "hog", 8, 0, 60, 0)],
        ..State::default()
    };
    hog_has_used(&mut state);
    let first = schedule(MIN, &state, &config);
    assert_eq!(reserved(&first), vec![(1, 60 * MIN), (2, 120 * MIN)]);
    state.keep_reservations(&first);
    // Now hog's job ranks first (ann has used far more since), and a job of the higher
    // tier arrives.
    state.usage.insert(Assoc::new("ann", "ann"), 1e12);
    let mut urgent = job(3, "bob", 8, 0, 60, 2 * MIN);
    urgent.partition = Some("high".into());
    state.pending.push(urgent);
    let plan = schedule(3 * MIN, &state, &config);
    assert!(plan.priority(2).unwrap().value > plan.priority(1).unwrap().value);
    assert_eq!(
        reserved(&plan),
        vec![(3, 60 * MIN), (1, 120 * MIN), (2, 180 * MIN)],
        "the higher tier first, then the kept ones as they were made"
    );
}

#[test]
fn a_kept_job_gets_its_reservation_past_the_depth_and_its_associations_extra() {
    // ann holds two kept reservations; the depth is now 1 and no extras are left.
    let mut config = fair_config();
    config.reservations = 2;
    config.assoc_reservations = 0;
    config.keep_reservations_after = 0;
    config.keep_reservations = usize::MAX;
    let mut state = State {
        nodes: vec![node("a", 8, 64, 0)],
        running: vec![running(9, "a", (0..8).collect(), vec![], 0, 60)],
        pending: vec![job(1, "ann", 8, 0, 60, 0), job(2, "ann", 8, 0, 60, 0)],
        ..State::default()
    };
    let first = schedule(MIN, &state, &config);
    assert_eq!(reserved(&first).len(), 2);
    state.keep_reservations(&first);
    config.reservations = 1;
    let plan = schedule(2 * MIN, &state, &config);
    assert_eq!(reserved(&plan), vec![(1, 60 * MIN), (2, 120 * MIN)]);
}
