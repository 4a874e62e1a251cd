//! A pass ranks, admits and tries alike jobs (the tasks of an array) once per run of them and
//! lets a task wait at once when its twin just before it waited. That must change no decision:
//! the same queue given task by task in reverse id order (no two neighbours alike, so every
//! job is worked out on its own) gets the same plan, pass after pass.

mod common;
use common::*;
use proptest::prelude::*;
use wharf_core::*;

/// One array: its tasks share everything but their ids.
#[derive(Debug, Clone)]
struct Array {
    user: usize,
    cpus: u32,
    gpus: u32,
    minutes: u64,
    submit: Time,
    part: Option<&'static str>,
    qos: Option<&'static str>,
    hold: bool,
    begin: bool,
    after: bool,
    tasks: usize,
}

fn arb_array() -> impl Strategy<Value = Array> {
    (
        (
            0usize..3,
            1u32..6,
            prop_oneof![Just(0u32), 1u32..4],
            1u64..90,
        ),
        (
            0u64..3,
            prop_oneof![Just(None), Just(Some("scav")), Just(Some("high"))],
            prop_oneof![Just(None), Just(Some("capped"))],
        ),
        (
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.1),
        ),
        1usize..8,
    )
        .prop_map(
            |((user, cpus, gpus, minutes), (submit, part, qos), (hold, begin, after), tasks)| {
                Array {
                    user,
                    cpus,
                    gpus,
                    minutes,
                    submit,
                    part,
                    qos,
                    hold,
                    begin,
                    after,
                    tasks,
                }
            },
        )
}

/// The tasks of `arrays`, with ids dealt out in `deal` order (so arrays' ids interleave),
/// listed array by array, ids ascending within each.
fn tasks(arrays: &[Array], deal: &[usize]) -> Vec<PendingJob> {
    let mut ids: Vec<Vec<u64>> = arrays.iter().map(|_| Vec::new()).collect();
    let mut next = 1u64;
    let mut left: Vec<usize> = arrays.iter().map(|a| a.tasks).collect();
    let mut k = 0;
    while left.iter().any(|&l| l > 0) {
        let a = deal[k % deal.len()] % arrays.len();
        let a = (a..a + arrays.len())
            .map(|i| i % arrays.len())
            .find(|&i| left[i] > 0)
            .unwrap_or(a);
        ids[a].push(next);
        next += 1;
        left[a] -= 1;
        k += 1;
    }
    let mut out = Vec::new();
    for (a, ids) in arrays.iter().zip(ids) {
        for id in ids {
            let mut j = job(
                id,
                &format!("u{}", a.user),
                a.cpus,
                a.gpus,
                a.minutes,
                a.submit * MIN,
            );
            j.partition = a.part.map(str::to_string);
            j.qos = a.qos.map(str::to_string);
            j.hold = a.hold.then_some(Hold::User);
            j.begin = a.begin.then_some(60 * MIN);
            if a.after {
                j.after = vec![1, id];
            }
            out.push(j);
        }
    }
    out
}

fn config(policy: Policy) -> Config {
    let mut c = Config::with_policy(policy);
    c.reservations = 2;
    c.max_job_test = 40;
    // Kept reservations move jobs out of their runs.
    c.keep_reservations_after = 0;
    let mut scav = Partition::new("scav", &[]);
    scav.preempt_mode = PreemptMode::Requeue;
    let mut high = Partition::new("high", &[]);
    high.priority_tier = 1;
    c.partitions = vec![Partition::new("default", &[]), scav, high];
    c.qos = vec![Qos {
        name: "capped".into(),
        priority: 10,
    }];
    c.limits.qos.insert(
        "capped".into(),
        QosLimits {
            max_tres_per_user: TresLimit {
                gpu: Some(2),
                ..TresLimit::default()
            },
            ..QosLimits::default()
        },
    );
    c
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn alike_jobs_are_decided_as_jobs_one_by_one(
        arrays in proptest::collection::vec(arb_array(), 1..7),
        deal in proptest::collection::vec(0usize..7, 1..12),
        gpus in proptest::collection::vec(0u32..5, 1..4),
        policy in prop_oneof![Just(Policy::Fcfs), Just(Policy::Easy), Just(Policy::Multifactor)],
        steps in 1usize..4,
    ) {
        let config = config(policy);
        let nodes = gpus
            .iter()
            .enumerate()
            .map(|(i, &g)| node(&format!("n{i}"), 8, 32, g))
            .collect();
        let mut state = State { nodes, pending: tasks(&arrays, &deal), ..State::default() };
        let mut now: Time = 10 * MIN;
        for _ in 0..steps {
            let mut scattered = state.clone();
            scattered.pending.sort_by_key(|j| std::cmp::Reverse(j.id));
            let plan = schedule(now, &state, &config);
            prop_assert_eq!(&plan, &schedule(now, &scattered, &config), "at {} over {:?}", now, state);
            let mut kept = Scheduler::default();
            prop_assert_eq!(&plan, &kept.schedule(now, &state, &config));
            state.keep_reservations(&plan);
            apply(&mut state, &plan, now);
            for p in &plan.preemptions {
                state.running.retain(|r| r.id != p.job);
            }
            // Half the running jobs end.
            let mut k = 0;
            state.running.retain(|_| {
                k += 1;
                k % 2 == 0
            });
            now += 20 * MIN;
        }
    }
}
