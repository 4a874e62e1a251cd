//! A [`Live`] scheduler, told what changed, decides exactly as the pure `schedule` does on
//! the same state, pass after pass, while arrays are submitted, jobs start, end, are
//! withdrawn or preempted, and nodes change; and the state it keeps is the one its caller
//! would have built.

mod common;
use common::*;
use proptest::prelude::*;
use wharf_core::*;

/// One array of alike tasks (one task: a plain job).
#[derive(Debug, Clone)]
struct Array {
    user: usize,
    cpus: u32,
    gpus: u32,
    nodes: u32,
    minutes: u64,
    part: Option<&'static str>,
    after: bool,
    tasks: u64,
}

fn arb_array() -> impl Strategy<Value = Array> {
    (
        (
            0usize..3,
            1u32..6,
            prop_oneof![2 => Just(0u32), 1 => 1u32..3],
        ),
        (prop_oneof![4 => Just(1u32), 1 => Just(2u32)], 1u64..90),
        prop_oneof![Just(None), Just(Some("scav")), Just(Some("high"))],
        prop::bool::weighted(0.1),
        1u64..6,
    )
        .prop_map(
            |((user, cpus, gpus), (nodes, minutes), part, after, tasks)| Array {
                user,
                cpus,
                gpus,
                nodes,
                minutes,
                part,
                after,
                tasks,
            },
        )
}

/// What happens between two passes.
#[derive(Debug, Clone)]
struct Step {
    /// Minutes the clock moves.
    advance: u64,
    /// Running jobs that end: every one whose position modulo 4 equals this (4: none).
    end_every: usize,
    /// Pending jobs withdrawn: every one whose position modulo 5 equals this (5: none).
    withdraw_every: usize,
    /// Arrays submitted.
    submit: Vec<Array>,
    /// A node to drain (by position modulo the node count), if any.
    drain: Option<usize>,
}

fn arb_step() -> impl Strategy<Value = Step> {
    (
        0u64..40,
        0usize..5,
        prop_oneof![3 => Just(5usize), 1 => 0usize..5],
        proptest::collection::vec(arb_array(), 0..4),
        prop_oneof![4 => Just(None), 1 => (0usize..8).prop_map(Some)],
    )
        .prop_map(|(advance, end_every, withdraw_every, submit, drain)| Step {
            advance,
            end_every,
            withdraw_every,
            submit,
            drain,
        })
}

fn arb_node(i: usize) -> impl Strategy<Value = Node> {
    (1u32..12, 4u64..48, 0u32..5)
        .prop_map(move |(cpus, gib, gpus)| node(&format!("n{:02}", (i * 7) % 10), cpus, gib, gpus))
}

/// The tasks of `a`, ids from `*next` on, submitted at `now`.
fn tasks(a: &Array, next: &mut u64, now: Time) -> Vec<PendingJob> {
    (0..a.tasks)
        .map(|_| {
            let mut j = job(
                *next,
                &format!("u{}", a.user),
                a.cpus,
                a.gpus,
                a.minutes,
                now,
            );
            j.request.nodes = a.nodes;
            j.partition = a.part.map(str::to_string);
            if a.after {
                j.after = vec![1, *next];
            }
            *next += 1;
            j
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn a_live_scheduler_decides_as_a_fresh_pass_on_its_state(
        nodes in (1usize..6).prop_flat_map(|n| (0..n).map(arb_node).collect::<Vec<_>>()),
        first in proptest::collection::vec(arb_array(), 0..5),
        steps in proptest::collection::vec(arb_step(), 0..8),
        policy in prop_oneof![Just(Policy::Fcfs), Just(Policy::Easy), Just(Policy::Multifactor)],
        tiers in any::<bool>(),
    ) {
        let mut nodes = nodes;
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        nodes.dedup_by(|a, b| a.name == b.name);
        let config = config(policy, tiers);
        let mut now: Time = 10 * MIN;
        let mut next = 1;
        // The caller's own state, kept as a whole-state caller keeps it.
        let mut state = State { nodes: nodes.clone(), ..State::default() };
        let mut live = Live::new(nodes.into_iter().rev().collect(), config.clone());
        for a in &first {
            for j in tasks(a, &mut next, now) {
                state.pending.push(j.clone());
                live.submit(j);
            }
        }
        for step in std::iter::once(None).chain(steps.into_iter().map(Some)) {
            if let Some(step) = step {
                now += step.advance * MIN;
                // Jobs end; the ones being stopped end first.
                let stopping = std::mem::take(&mut state.stopping);
                let mut k = 0;
                let mut ended = Vec::new();
                state.running.retain(|r| {
                    k += 1;
                    let ends = stopping.contains(&r.id)
                        || (step.end_every != 4 && k % 4 == step.end_every);
                    if ends {
                        ended.push(r.id);
                    }
                    !ends
                });
                state.stopping = stopping;
                for id in ended {
                    state.stopping.remove(&id);
                    live.end(id);
                }
                let mut k = 0;
                let mut withdrawn = Vec::new();
                state.pending.retain(|j| {
                    k += 1;
                    let goes = step.withdraw_every != 5 && k % 5 == step.withdraw_every;
                    if goes {
                        withdrawn.push(j.id);
                    }
                    !goes
                });
                for id in withdrawn {
                    live.withdraw(id);
                }
                for a in &step.submit {
                    for j in tasks(a, &mut next, now) {
                        state.pending.push(j.clone());
                        live.submit(j);
                    }
                }
                if let Some(d) = step.drain {
                    let d = d % state.nodes.len();
                    state.nodes[d].state = NodeState::Drain;
                    live.reset(state.nodes.clone(), config.clone());
                }
            }
            let plan = live.pass(now);
            prop_assert_eq!(&plan, &schedule(now, &state, &config), "at {} over {:?}", now, state);
            prop_assert_eq!(live.state(), &state);
            // Reservations kept from pass to pass, as the controller and the simulator keep
            // them.
            state.keep_reservations(&plan);
            live.keep_reservations(&plan);
            apply(&mut state, &plan, now);
            for s in &plan.starts {
                let r = state.running.iter().find(|r| r.id == s.job).expect("started");
                live.start(r.clone());
            }
            for p in &plan.preemptions {
                state.stopping.insert(p.job);
                live.stop(p.job);
            }
            // A pass with nothing new to do must also agree.
            prop_assert_eq!(live.pass(now), schedule(now, &state, &config));
            prop_assert_eq!(live.state(), &state);
        }
    }
}

/// A job whose time limit ends exactly at the pass's time is late: its resources are expected
/// just after now, as a fresh pass expects them, not at now.
#[test]
fn a_job_at_the_end_of_its_limit_is_late() {
    let config = Config::with_policy(Policy::Easy);
    let mut state = State {
        nodes: vec![node("n1", 4, 8, 0)],
        pending: vec![job(2, "u1", 4, 0, 30, 0)],
        running: vec![running(1, "n1", vec![0, 1, 2, 3], vec![], 0, 10)],
        ..State::default()
    };
    let mut live = Live::new(state.nodes.clone(), config.clone());
    live.start(state.running[0].clone());
    live.submit(state.pending[0].clone());
    for now in [5 * MIN, 10 * MIN, 10 * MIN + 1, 11 * MIN] {
        let plan = live.pass(now);
        assert_eq!(plan, schedule(now, &state, &config), "at {now}");
        assert_eq!(plan.reservations[0].start, (10 * MIN).max(now + 1));
    }
    // The clock going back brings expected ends back with it.
    let plan = live.pass(5 * MIN);
    assert_eq!(plan, schedule(5 * MIN, &state, &config));
    assert_eq!(plan.reservations[0].start, 10 * MIN);
    state.running.clear();
    live.end(1);
    assert_eq!(live.pass(11 * MIN), schedule(11 * MIN, &state, &config));
}
