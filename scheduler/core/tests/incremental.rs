//! A [`Scheduler`] that keeps its view between passes decides exactly as the pure
//! `schedule` does, pass after pass, while jobs start, end, are preempted or run late and
//! nodes change.

mod common;
use common::*;
use proptest::prelude::*;
use wharf_core::*;

/// What happens between two passes.
#[derive(Debug, Clone)]
struct Step {
    /// Minutes the clock moves.
    advance: u64,
    /// Running jobs that end: every one whose position modulo 4 equals this (4: none).
    end_every: usize,
    /// New jobs submitted.
    submit: Vec<PendingJob>,
    /// A node to drain (by position modulo the node count), if any.
    drain: Option<usize>,
}

fn arb_node(i: usize) -> impl Strategy<Value = Node> {
    (1u32..12, 4u64..48, 0u32..5, 0u32..2).prop_map(move |(cpus, gib, gpus, offset)| {
        let mut n = node(&format!("n{i:02}"), cpus, gib, gpus);
        n.cpu_ids = (0..cpus).map(|c| c * 2 + offset).collect();
        n
    })
}

fn arb_job(id: u64) -> impl Strategy<Value = PendingJob> {
    (
        1u32..6,
        prop_oneof![2 => Just(0u32), 1 => 1u32..3],
        prop_oneof![4 => Just(1u32), 1 => Just(2u32)],
        1u64..90,
        0usize..3,
        prop_oneof![Just(None), Just(Some("scav")), Just(Some("high"))],
    )
        .prop_map(move |(cpus, gpus, nodes, minutes, user, part)| {
            let mut j = job(id, &format!("u{user}"), cpus, gpus, minutes, 0);
            j.request.nodes = nodes;
            j.partition = part.map(str::to_string);
            j
        })
}

fn arb_step(first_id: u64) -> impl Strategy<Value = Step> {
    (
        0u64..40,
        0usize..5,
        proptest::collection::vec(0u64..1, 0..4),
        prop_oneof![3 => Just(None), 1 => (0usize..8).prop_map(Some)],
    )
        .prop_flat_map(move |(advance, end_every, n, drain)| {
            let jobs: Vec<_> = (0..n.len() as u64).map(|k| arb_job(first_id + k)).collect();
            (Just(advance), Just(end_every), jobs, Just(drain))
        })
        .prop_map(|(advance, end_every, submit, drain)| Step {
            advance,
            end_every,
            submit,
            drain,
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn a_kept_view_decides_as_a_fresh_one(
        nodes in (1usize..6).prop_flat_map(|n| (0..n).map(arb_node).collect::<Vec<_>>()),
        first in (0usize..20).prop_flat_map(|n| (0..n as u64).map(|i| arb_job(i + 1)).collect::<Vec<_>>()),
        steps in (0u64..8).prop_flat_map(|k| {
            (0..k).map(|s| arb_step(100 + s * 10)).collect::<Vec<_>>()
        }),
        policy in prop_oneof![Just(Policy::Fcfs), Just(Policy::Easy), Just(Policy::Multifactor)],
        tiers in any::<bool>(),
    ) {
        let config = config(policy, tiers);
        let mut state = State { nodes, pending: first, ..State::default() };
        let mut kept = Scheduler::default();
        let mut now: Time = 10 * MIN;
        for step in std::iter::once(None).chain(steps.into_iter().map(Some)) {
            if let Some(step) = step {
                now += step.advance * MIN;
                // Jobs end; the ones being stopped end first.
                let stopping = std::mem::take(&mut state.stopping);
                let mut k = 0;
                state.running.retain(|r| {
                    k += 1;
                    !stopping.contains(&r.id) && (step.end_every == 4 || k % 4 != step.end_every)
                });
                state.pending.extend(step.submit.into_iter().map(|mut j| {
                    j.submit = now;
                    j
                }));
                if let Some(d) = step.drain {
                    let d = d % state.nodes.len();
                    state.nodes[d].state = NodeState::Drain;
                }
            }
            let fresh = schedule(now, &state, &config);
            let plan = kept.schedule(now, &state, &config);
            prop_assert_eq!(&plan, &fresh, "at {} over {:?}", now, state);
            apply(&mut state, &plan, now);
            for p in &plan.preemptions {
                state.stopping.insert(p.job);
            }
            // Waiting jobs' reasons are values; a pass with nothing to do must also agree.
            let again = kept.schedule(now, &state, &config);
            prop_assert_eq!(again, schedule(now, &state, &config));
        }
    }
}
