//! Preemption: a waiting job of a higher partition tier, or of a QoS that lists another, stops
//! the fewest, least valuable running jobs that make room for it, and waits for them with a
//! reservation; a property test checks the rules over random clusters.
// Configs are built field by field so each test shows only what it changes.
#![allow(clippy::field_reassign_with_default)]

mod common;
use std::collections::BTreeSet;

use common::*;
use proptest::prelude::*;
use wharf_core::*;

/// `scav` (tier 0, `mode`) and `high` (tier 1, never preempted), both over every node.
fn tiers(mode: PreemptMode) -> Config {
    let mut c = Config::default();
    let mut scav = Partition::new("scav", &[]);
    scav.preempt_mode = mode;
    let mut high = Partition::new("high", &[]);
    high.priority_tier = 1;
    c.partitions = vec![scav, high];
    c
}

fn in_part(mut j: PendingJob, part: &str) -> PendingJob {
    j.partition = Some(part.into());
    j
}

fn run_in(mut r: RunningJob, part: &str) -> RunningJob {
    r.partition = Some(part.into());
    r
}

fn victims(plan: &Plan) -> Vec<(u64, u64, PreemptMode)> {
    plan.preemptions
        .iter()
        .map(|p| (p.job, p.by, p.mode))
        .collect()
}

const NOW: Time = 60 * MIN;

#[test]
fn a_higher_tier_job_preempts_a_lower_tier_one_and_waits_for_it_with_a_reservation() {
    let state = State {
        nodes: vec![node("n1", 8, 64, 0)],
        running: vec![run_in(
            running(10, "n1", (0..8).collect(), vec![], 0, 120),
            "scav",
        )],
        pending: vec![in_part(job(1, "u", 4, 0, 30, NOW), "high")],
        ..State::default()
    };
    let plan = schedule(NOW, &state, &tiers(PreemptMode::Requeue));
    assert_eq!(victims(&plan), vec![(10, 1, PreemptMode::Requeue)]);
    assert!(plan.starts.is_empty());
    let w = waiting(&plan, 1);
    assert_eq!(w.reason, PendingReason::Preempting { victims: vec![10] });
    assert!(w.reason.to_string().contains("job 10"), "{}", w.reason);
    assert_eq!(w.estimated_start, Some(NOW + 1));
    assert_eq!(plan.reservations[0].job, 1);
    assert_eq!(plan.reservations[0].nodes, vec!["n1".to_string()]);
    // The cancel mode is the victim's partition's.
    let plan = schedule(NOW, &state, &tiers(PreemptMode::Cancel));
    assert_eq!(victims(&plan), vec![(10, 1, PreemptMode::Cancel)]);
}

/// Victims are chosen only on nodes the preemptor may use: with `n1` excluded it waits
/// rather than stopping the job there, and an exclusive preemptor stops everything on its
/// node.
#[test]
fn preemption_respects_the_preemptors_node_selection() {
    let state = |select: Selection| State {
        nodes: vec![node("n1", 8, 64, 0), node("n2", 8, 64, 0)],
        running: vec![
            run_in(running(10, "n1", (0..8).collect(), vec![], 0, 120), "scav"),
            run_in(running(11, "n2", (0..4).collect(), vec![], 0, 120), "scav"),
            run_in(running(12, "n2", (4..6).collect(), vec![], 0, 120), "scav"),
        ],
        pending: vec![{
            let mut j = in_part(job(1, "u", 8, 0, 30, NOW), "high");
            j.select = select;
            j
        }],
        ..State::default()
    };
    let mut only_n1 = Selection::default();
    only_n1.nodelist = ["n1".to_string()].into();
    let plan = schedule(NOW, &state(only_n1), &tiers(PreemptMode::Requeue));
    assert_eq!(victims(&plan), vec![(10, 1, PreemptMode::Requeue)]);
    let mut not_n1 = Selection::default();
    not_n1.exclude = ["n1".to_string()].into();
    let plan = schedule(NOW, &state(not_n1), &tiers(PreemptMode::Requeue));
    let mut got: Vec<u64> = victims(&plan).iter().map(|v| v.0).collect();
    got.sort_unstable();
    assert_eq!(got, vec![11, 12], "only n2's jobs may make room");
}

#[test]
fn no_preemption_of_an_equal_tier_or_a_partition_whose_mode_is_off() {
    let state = State {
        nodes: vec![node("n1", 8, 64, 0)],
        running: vec![run_in(
            running(10, "n1", (0..8).collect(), vec![], 0, 120),
            "scav",
        )],
        pending: vec![in_part(job(1, "u", 4, 0, 30, NOW), "scav")],
        ..State::default()
    };
    let plan = schedule(NOW, &state, &tiers(PreemptMode::Requeue));
    assert!(plan.preemptions.is_empty());
    assert_eq!(waiting(&plan, 1).reason, PendingReason::Resources);
    let mut high = state.clone();
    high.pending = vec![in_part(job(1, "u", 4, 0, 30, NOW), "high")];
    let plan = schedule(NOW, &high, &tiers(PreemptMode::Off));
    assert!(plan.preemptions.is_empty());
    assert_eq!(waiting(&plan, 1).reason, PendingReason::Resources);
}

#[test]
fn the_fewest_most_recently_started_victims_that_are_enough() {
    let state = |cpus: u32| State {
        nodes: vec![node("n1", 8, 64, 0)],
        running: vec![
            run_in(running(10, "n1", vec![0, 1], vec![], 0, 120), "scav"),
            run_in(running(11, "n1", vec![2, 3], vec![], 10 * MIN, 120), "scav"),
            run_in(
                running(12, "n1", vec![4, 5, 6, 7], vec![], 5 * MIN, 120),
                "scav",
            ),
        ],
        pending: vec![in_part(job(1, "u", cpus, 0, 30, NOW), "high")],
        ..State::default()
    };
    let config = tiers(PreemptMode::Requeue);
    // Two CPUs: the job started last is enough.
    let plan = schedule(NOW, &state(2), &config);
    assert_eq!(victims(&plan), vec![(11, 1, PreemptMode::Requeue)]);
    // Four: 11 and then 12 are taken in order, and 11 is dropped again: 12 alone is enough.
    let plan = schedule(NOW, &state(4), &config);
    assert_eq!(victims(&plan), vec![(12, 1, PreemptMode::Requeue)]);
    // Six: two jobs, the oldest spared.
    let plan = schedule(NOW, &state(6), &config);
    let mut got: Vec<u64> = plan.preemptions.iter().map(|p| p.job).collect();
    got.sort_unstable();
    assert_eq!(got, vec![11, 12]);
}

#[test]
fn only_jobs_holding_the_gpu_type_asked_for_are_preempted() {
    let gpus = vec![
        Gpu::new(0, "a100"),
        Gpu::new(1, "a100"),
        Gpu::new(2, "h100"),
        Gpu::new(3, "h100"),
    ];
    let mut n1 = Node::new("n1", 8, 64 * GIB, gpus);
    n1.cpu_ids = (0..8).collect();
    let mut want = in_part(job(1, "u", 1, 2, 30, NOW), "high");
    want.request.gpu_kind = Some("h100".into());
    let state = State {
        nodes: vec![n1],
        running: vec![
            // The newer job holds the a100s: recency alone would pick it.
            run_in(running(10, "n1", vec![0], vec![2, 3], 0, 120), "scav"),
            run_in(
                running(11, "n1", vec![1], vec![0, 1], 30 * MIN, 120),
                "scav",
            ),
        ],
        pending: vec![want],
        ..State::default()
    };
    let plan = schedule(NOW, &state, &tiers(PreemptMode::Requeue));
    assert_eq!(victims(&plan), vec![(10, 1, PreemptMode::Requeue)]);
}

#[test]
fn only_the_nodes_needed_and_the_cheapest_node() {
    let state = State {
        nodes: vec![node("n1", 4, 64, 0), node("n2", 4, 64, 0)],
        running: vec![
            run_in(running(10, "n1", (0..4).collect(), vec![], 0, 120), "scav"),
            run_in(running(11, "n2", vec![0, 1], vec![], 0, 120), "scav"),
            run_in(running(12, "n2", vec![2, 3], vec![], 0, 120), "scav"),
        ],
        pending: vec![in_part(job(1, "u", 4, 0, 30, NOW), "high")],
        ..State::default()
    };
    let plan = schedule(NOW, &state, &tiers(PreemptMode::Requeue));
    assert_eq!(victims(&plan), vec![(10, 1, PreemptMode::Requeue)]);
    assert_eq!(plan.reservations[0].nodes, vec!["n1".to_string()]);
}

#[test]
fn a_job_being_stopped_is_waited_for_and_never_chosen_twice() {
    let mut state = State {
        nodes: vec![node("n1", 8, 64, 0)],
        running: vec![
            run_in(running(10, "n1", (0..4).collect(), vec![], 0, 120), "scav"),
            run_in(running(11, "n1", (4..8).collect(), vec![], 0, 120), "scav"),
        ],
        pending: vec![in_part(job(1, "u", 4, 0, 30, NOW), "high")],
        ..State::default()
    };
    state.stopping = BTreeSet::from([10]);
    let plan = schedule(NOW, &state, &tiers(PreemptMode::Requeue));
    assert!(plan.preemptions.is_empty(), "{:?}", plan.preemptions);
    assert_eq!(
        waiting(&plan, 1).reason,
        PendingReason::Preempting { victims: vec![10] }
    );
    // Two preemptors in one pass: the second takes the other job, not the first's.
    state.stopping.clear();
    state
        .pending
        .push(in_part(job(2, "u", 4, 0, 30, NOW + 1), "high"));
    let plan = schedule(NOW, &state, &tiers(PreemptMode::Requeue));
    let got: BTreeSet<u64> = plan.preemptions.iter().map(|p| p.job).collect();
    assert_eq!(got, BTreeSet::from([10, 11]));
    assert_eq!(plan.preemptions.len(), 2);
}

#[test]
fn freed_resources_are_not_backfilled_by_lower_jobs() {
    let state = State {
        nodes: vec![node("n1", 8, 64, 0)],
        running: vec![run_in(
            running(10, "n1", (0..6).collect(), vec![], 0, 120),
            "scav",
        )],
        pending: vec![
            in_part(job(1, "u", 8, 0, 30, NOW), "high"),
            in_part(job(2, "v", 2, 0, 60, NOW), "scav"),
        ],
        ..State::default()
    };
    let plan = schedule(NOW, &state, &tiers(PreemptMode::Requeue));
    assert_eq!(victims(&plan), vec![(10, 1, PreemptMode::Requeue)]);
    assert!(plan.starts.is_empty(), "{:?}", plan.starts);
}

#[test]
fn held_dependent_future_or_limited_jobs_preempt_nothing() {
    let base = State {
        nodes: vec![node("n1", 8, 64, 0)],
        running: vec![run_in(
            running(10, "n1", (0..8).collect(), vec![], 0, 120),
            "scav",
        )],
        ..State::default()
    };
    let mut config = tiers(PreemptMode::Requeue);
    config.limits.qos.insert(
        "small".into(),
        QosLimits {
            max_jobs_per_user: Some(1),
            ..QosLimits::default()
        },
    );
    let mut held = in_part(job(1, "u", 4, 0, 30, NOW), "high");
    held.hold = Some(Hold::User);
    let mut dependent = in_part(job(1, "u", 4, 0, 30, NOW), "high");
    dependent.after = vec![10];
    let mut later = in_part(job(1, "u", 4, 0, 30, NOW), "high");
    later.begin = Some(NOW + MIN);
    let mut limited = in_part(job(1, "u", 4, 0, 30, NOW), "high");
    limited.qos = Some("small".into());
    let mut state_limited = base.clone();
    let mut other = running(11, "n2", vec![0], vec![], 0, 120);
    other.assoc = Assoc::new("u", "u");
    other.qos = Some("small".into());
    state_limited.running.push(other);
    state_limited.nodes.push(node("n2", 1, 64, 0));
    for (job, state) in [
        (held, base.clone()),
        (dependent, base.clone()),
        (later, base.clone()),
        (limited, state_limited),
    ] {
        let mut state = state;
        state.pending = vec![job];
        let plan = schedule(NOW, &state, &config);
        assert!(plan.preemptions.is_empty(), "{:?}", plan.waiting);
    }
}

#[test]
fn a_qos_preempts_only_the_qos_it_lists_with_that_qos_mode() {
    let mut config = Config::default();
    config.qos = vec![
        Qos {
            name: "high".into(),
            priority: 10,
        },
        Qos {
            name: "scav".into(),
            priority: 0,
        },
        Qos {
            name: "normal".into(),
            priority: 1,
        },
    ];
    config.limits.qos.insert(
        "high".into(),
        QosLimits {
            preempt: vec!["scav".into()],
            ..QosLimits::default()
        },
    );
    let with_qos = |mut r: RunningJob, q: &str| {
        r.qos = Some(q.into());
        r
    };
    let mut j = job(1, "u", 4, 0, 30, NOW);
    j.qos = Some("high".into());
    let state = State {
        nodes: vec![node("n1", 4, 64, 0), node("n2", 4, 64, 0)],
        running: vec![
            // The newer job is in a QoS that is not listed.
            with_qos(
                running(10, "n1", (0..4).collect(), vec![], 30 * MIN, 120),
                "normal",
            ),
            with_qos(running(11, "n2", (0..4).collect(), vec![], 0, 120), "scav"),
        ],
        pending: vec![j],
        ..State::default()
    };
    let plan = schedule(NOW, &state, &config);
    assert_eq!(victims(&plan), vec![(11, 1, PreemptMode::Requeue)]);
    config.limits.qos.insert(
        "scav".into(),
        QosLimits {
            preempt_mode: Some(PreemptMode::Cancel),
            ..QosLimits::default()
        },
    );
    let plan = schedule(NOW, &state, &config);
    assert_eq!(victims(&plan), vec![(11, 1, PreemptMode::Cancel)]);
    config.limits.qos.get_mut("scav").unwrap().preempt_mode = Some(PreemptMode::Off);
    assert!(schedule(NOW, &state, &config).preemptions.is_empty());
}

#[test]
fn the_same_state_gives_the_same_preemptions() {
    let state = State {
        nodes: vec![node("n2", 8, 64, 0), node("n1", 8, 64, 0)],
        running: (0..4)
            .map(|k| {
                let n = if k % 2 == 0 { "n1" } else { "n2" };
                let cpus = (k / 2 * 4..k / 2 * 4 + 4).collect();
                run_in(running(10 + k as u64, n, cpus, vec![], 0, 120), "scav")
            })
            .collect(),
        pending: vec![in_part(job(1, "u", 8, 0, 30, NOW), "high")],
        ..State::default()
    };
    let config = tiers(PreemptMode::Requeue);
    let first = schedule(NOW, &state, &config);
    assert_eq!(first.preemptions.len(), 2);
    assert_eq!(first, schedule(NOW, &state, &config));
}

/// A random cluster: one GPU type, running jobs in random partitions of tiers 0 to 2 with
/// random modes, and pending jobs in random partitions.
fn arb_case() -> impl Strategy<Value = (State, Config)> {
    let modes = proptest::collection::vec(
        prop_oneof![
            Just(PreemptMode::Off),
            Just(PreemptMode::Requeue),
            Just(PreemptMode::Cancel)
        ],
        3,
    );
    let seeds =
        proptest::collection::vec((0usize..3, 0usize..3, 1u32..5, 0u32..3, 0u64..50), 0..10);
    let pending =
        proptest::collection::vec((0usize..3, 1u32..9, 0u32..4, 1u64..100, 0u64..3), 1..6);
    let stopping = proptest::collection::btree_set(0u64..10, 0..3);
    (modes, seeds, pending, stopping).prop_map(|(modes, seeds, jobs, stopping)| {
        let mut config = Config::default();
        config.partitions = (0..3)
            .map(|t| {
                let mut p = Partition::new(&format!("t{t}"), &[]);
                p.priority_tier = t as u32;
                p.preempt_mode = modes[t];
                p
            })
            .collect();
        let nodes: Vec<Node> = (0..3).map(|i| node(&format!("n{i}"), 8, 64, 4)).collect();
        let mut used = [(0u32, 0u32); 3];
        let mut jobs_running = Vec::new();
        for (k, (n, part, cpus, gpus, start)) in seeds.into_iter().enumerate() {
            let (c, g) = used[n];
            let cpus = cpus.min(8 - c);
            let gpus = gpus.min(4 - g);
            if cpus == 0 {
                continue;
            }
            used[n] = (c + cpus, g + gpus);
            let mut r = running(
                k as u64,
                &format!("n{n}"),
                (c..c + cpus).collect(),
                (g..g + gpus).collect(),
                start * MIN,
                120,
            );
            r.allocs[0].memory = GIB;
            r.partition = Some(format!("t{part}"));
            jobs_running.push(r);
        }
        let pending = jobs
            .into_iter()
            .enumerate()
            .map(|(k, (part, cpus, gpus, minutes, submit))| {
                in_part(
                    job(100 + k as u64, "u", cpus, gpus, minutes, NOW - submit),
                    &format!("t{part}"),
                )
            })
            .collect();
        let state = State {
            nodes,
            running: jobs_running,
            pending,
            stopping,
            ..State::default()
        };
        (state, config)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// No job preempts one of an equal or higher tier, or of a partition whose mode is off; a
    /// job being stopped is never chosen, nor any job twice; and on every node the running
    /// jobs left, the jobs started now and the preemptors' reservations fit together.
    #[test]
    fn preemption_follows_the_rules_and_frees_enough((state, config) in arb_case()) {
        let plan = schedule(NOW, &state, &config);
        let tier = |part: &Option<String>| -> u32 {
            part.as_deref().and_then(|p| p[1..].parse().ok()).unwrap_or(0)
        };
        let mut seen = BTreeSet::new();
        for p in &plan.preemptions {
            let victim = state.running.iter().find(|r| r.id == p.job).unwrap();
            let by = state.pending.iter().find(|j| j.id == p.by).unwrap();
            prop_assert!(tier(&by.partition) > tier(&victim.partition), "{p:?}");
            let mode = config.partitions[tier(&victim.partition) as usize].preempt_mode;
            prop_assert!(mode != PreemptMode::Off && p.mode == mode, "{p:?}");
            prop_assert!(!state.stopping.contains(&p.job), "{p:?}");
            prop_assert!(seen.insert(p.job), "{p:?} twice");
        }
        let gone: BTreeSet<u64> = plan
            .preemptions
            .iter()
            .map(|p| p.job)
            .chain(state.stopping.iter().copied())
            .collect();
        for n in &state.nodes {
            let (mut cpus, mut gpus) = (0u32, 0u32);
            for r in state.running.iter().filter(|r| !gone.contains(&r.id)) {
                for a in r.allocs.iter().filter(|a| a.node == n.name) {
                    cpus += a.cpu_ids.len() as u32;
                    gpus += a.gpu_ids.len() as u32;
                }
            }
            for a in plan.starts.iter().flat_map(|s| &s.allocs).filter(|a| a.node == n.name) {
                cpus += a.cpu_ids.len() as u32;
                gpus += a.gpu_ids.len() as u32;
            }
            for w in &plan.waiting {
                if let PendingReason::Preempting { victims } = &w.reason {
                    prop_assert!(!victims.is_empty());
                    let res = plan.reservations.iter().find(|r| r.job == w.job).unwrap();
                    if res.nodes.contains(&n.name) {
                        let j = state.pending.iter().find(|j| j.id == w.job).unwrap();
                        cpus += j.request.cpus;
                        gpus += j.request.gpus;
                    }
                }
            }
            prop_assert!(cpus <= 8 && gpus <= 4, "{}: {cpus} CPUs, {gpus} GPUs: {plan:?}", n.name);
        }
    }
}

/// A running job whose partition was removed from the config is not taken for one of the
/// default partition's: it keeps no tier that a preemption could be judged by, and is never
/// preempted by partition tier.
#[test]
fn a_job_of_a_removed_partition_is_not_preempted_as_the_default_partitions() {
    let state = State {
        nodes: vec![node("n1", 8, 64, 0)],
        running: vec![run_in(
            running(10, "n1", (0..8).collect(), vec![], 0, 120),
            "gone",
        )],
        pending: vec![in_part(job(1, "u", 4, 0, 30, NOW), "high")],
        ..State::default()
    };
    // `scav`, the first partition, is the default and preemptible.
    let plan = schedule(NOW, &state, &tiers(PreemptMode::Requeue));
    assert!(victims(&plan).is_empty(), "{:?}", victims(&plan));
}

/// A gang takes an idle node as it is and empties only the nodes it lacks: with n1 idle it
/// stops the one job on n2 (before, idle nodes were no candidates, so it stopped nothing
/// and waited); and a victim spread over two of its nodes is stopped once.
#[test]
fn a_gang_preempts_only_for_the_nodes_it_lacks_and_names_each_victim_once() {
    let mut gang = in_part(job(1, "u", 4, 0, 30, NOW), "high");
    gang.request.nodes = 2;
    let idle = State {
        nodes: vec![
            node("n1", 4, 64, 0),
            node("n2", 4, 64, 0),
            node("n3", 4, 64, 0),
        ],
        running: vec![
            run_in(running(10, "n2", (0..4).collect(), vec![], 0, 120), "scav"),
            run_in(
                running(11, "n3", (0..4).collect(), vec![], 30 * MIN, 120),
                "scav",
            ),
        ],
        pending: vec![gang.clone()],
        ..State::default()
    };
    let plan = schedule(NOW, &idle, &tiers(PreemptMode::Requeue));
    // The most recently started of the two goes.
    assert_eq!(victims(&plan), vec![(11, 1, PreemptMode::Requeue)]);
    let mut nodes = plan.reservations[0].nodes.clone();
    nodes.sort();
    assert_eq!(nodes, vec!["n1".to_string(), "n3".to_string()]);

    let mut wide = run_in(running(10, "n1", (0..4).collect(), vec![], 0, 120), "scav");
    wide.allocs.push(Alloc {
        node: "n2".into(),
        cpu_ids: (0..4).collect(),
        gpu_ids: vec![],
        memory: GIB,
    });
    let spread = State {
        nodes: vec![node("n1", 4, 64, 0), node("n2", 4, 64, 0)],
        running: vec![wide],
        pending: vec![gang],
        ..State::default()
    };
    let plan = schedule(NOW, &spread, &tiers(PreemptMode::Requeue));
    assert_eq!(victims(&plan), vec![(10, 1, PreemptMode::Requeue)]);
}

/// A QoS never preempts its own jobs, nor those of a QoS that could preempt it back
/// directly or through others: such jobs would requeue each other without end. The part of
/// a list outside the cycle still holds.
#[test]
fn a_qos_in_a_preemption_cycle_preempts_nothing_in_it() {
    let mut config = Config::default();
    for (name, preempt) in [
        ("a", vec!["a", "b"]),
        ("b", vec!["c"]),
        ("c", vec!["a", "scav"]),
    ] {
        config.qos.push(Qos {
            name: name.into(),
            priority: 1,
        });
        config.limits.qos.insert(
            name.into(),
            QosLimits {
                preempt: preempt.into_iter().map(String::from).collect(),
                ..QosLimits::default()
            },
        );
    }
    config.qos.push(Qos {
        name: "scav".into(),
        priority: 0,
    });
    let case = |asker: &str, victim: &str| {
        let mut j = job(1, "u", 4, 0, 30, NOW);
        j.qos = Some(asker.into());
        let mut r = running(10, "n1", (0..4).collect(), vec![], 0, 120);
        r.qos = Some(victim.into());
        let state = State {
            nodes: vec![node("n1", 4, 64, 0)],
            running: vec![r],
            pending: vec![j],
            ..State::default()
        };
        victims(&schedule(NOW, &state, &config))
    };
    for (asker, victim) in [("a", "a"), ("a", "b"), ("b", "c"), ("c", "a")] {
        assert_eq!(case(asker, victim), vec![], "{asker} over {victim}");
    }
    assert_eq!(case("c", "scav"), vec![(10, 1, PreemptMode::Requeue)]);
}

/// An exclusive job over a limit on its whole node preempts nothing: before, it stopped the
/// job on the node on its request's count (1 GPU under a cap of 4), could not take the
/// node's 8 on the next pass, and the victim started and was stopped again, pass after pass.
#[test]
fn an_exclusive_job_over_a_limit_on_its_whole_node_preempts_nothing() {
    let mut config = tiers(PreemptMode::Requeue);
    config.qos.push(Qos {
        name: "normal".into(),
        priority: 0,
    });
    config.limits.qos.insert(
        "normal".into(),
        QosLimits {
            max_tres_per_user: TresLimit {
                gpu: Some(4),
                ..TresLimit::default()
            },
            ..QosLimits::default()
        },
    );
    let mut e = in_part(job(1, "u", 1, 1, 30, NOW), "high");
    e.select.exclusive = true;
    e.qos = Some("normal".into());
    let state = State {
        nodes: vec![node("n1", 8, 64, 8)],
        running: vec![run_in(running(10, "n1", vec![0], vec![0], 0, 120), "scav")],
        pending: vec![e],
        ..State::default()
    };
    let plan = schedule(NOW, &state, &config);
    assert!(plan.preemptions.is_empty(), "{:?}", plan.preemptions);
    assert_eq!(waiting(&plan, 1).reason.code(), "QOSMaxGRESPerUser");
}
