//! Properties over random clusters and queues, for every policy: nothing is over-allocated,
//! ids are the node's own, a job starts at most once and gets what it asked for, and no job
//! started now makes any reservation infeasible anywhere in its window.
// Configs are built field by field so each test shows only what it changes.
#![allow(clippy::field_reassign_with_default)]

mod common;
use std::collections::{BTreeMap, BTreeSet};

use common::*;
use proptest::prelude::*;
use wharf_core::*;

#[derive(Debug, Clone)]
struct Case {
    state: State,
    config: Config,
    now: Time,
}

fn arb_node(i: usize) -> impl Strategy<Value = Node> {
    (
        1u32..16,
        1u64..64,
        proptest::collection::btree_set(0u32..10, 0..6),
        prop_oneof![Just("h100"), Just("a100")],
        prop_oneof![8 => Just(NodeState::Up), 1 => Just(NodeState::Drain), 1 => Just(NodeState::Down)],
        0u32..3,
    )
        .prop_map(move |(cpus, gib, gpu_ids, kind, state, cpu_offset)| {
            let gpus = gpu_ids.into_iter().map(|id| Gpu::new(id, kind)).collect();
            let mut n = Node::new(&format!("n{i}"), cpus, gib * GIB, gpus);
            n.cpu_ids = (0..cpus).map(|c| c * 2 + cpu_offset).collect();
            n.state = state;
            n
        })
}

fn arb_job(id: u64) -> impl Strategy<Value = PendingJob> {
    (
        1u32..10,
        1u64..40,
        prop_oneof![2 => Just(0u32), 1 => 1u32..5],
        prop_oneof![3 => Just(None), 1 => Just(Some("h100")), 1 => Just(Some("a100"))],
        prop_oneof![4 => Just(1u32), 1 => 2u32..4],
        1u64..120,
        0u64..60,
        0usize..4,
    )
        .prop_map(
            move |(cpus, gib, gpus, kind, nodes, minutes, submit, user)| {
                let mut j = job(id, &format!("u{user}"), cpus, gpus, minutes, submit * MIN);
                j.request.memory = gib * GIB;
                j.request.gpu_kind = kind.map(str::to_string);
                j.request.nodes = nodes;
                j
            },
        )
}

/// Running jobs carved out of the nodes' own ids, within their capacity.
fn carve(nodes: &[Node], seeds: &[(u8, u8, u8, u64, u64)]) -> Vec<RunningJob> {
    let mut out = Vec::new();
    let mut used: Vec<(usize, usize, u64)> = vec![(0, 0, 0); nodes.len()];
    for (k, &(n, c, g, start, minutes)) in seeds.iter().enumerate() {
        let i = n as usize % nodes.len();
        let node = &nodes[i];
        let (cu, gu, mu) = used[i];
        let cpus: Vec<u32> = node
            .cpu_ids
            .iter()
            .skip(cu)
            .take(c as usize % 4 + 1)
            .copied()
            .collect();
        let gpus: Vec<u32> = node
            .gpus
            .iter()
            .skip(gu)
            .take(g as usize % 3)
            .map(|g| g.id)
            .collect();
        let mem = GIB.min(node.memory - mu.min(node.memory));
        if cpus.is_empty() || node.state == NodeState::Down {
            continue;
        }
        used[i] = (cu + cpus.len(), gu + gpus.len(), mu + mem);
        out.push(RunningJob {
            id: 1000 + k as u64,
            assoc: Assoc::new("r", "r"),
            partition: None,
            qos: None,
            start: start * MIN,
            time_limit: minutes * MIN,
            allocs: vec![Alloc {
                node: node.name.clone(),
                cpu_ids: cpus,
                gpu_ids: gpus,
                memory: mem,
            }],
            port: None,
        });
    }
    out
}

fn arb_case() -> impl Strategy<Value = Case> {
    let nodes = (1usize..6).prop_flat_map(|n| (0..n).map(arb_node).collect::<Vec<_>>());
    let jobs =
        (0usize..25).prop_flat_map(|n| (0..n as u64).map(|i| arb_job(i + 1)).collect::<Vec<_>>());
    let seeds = proptest::collection::vec(
        (any::<u8>(), any::<u8>(), any::<u8>(), 0u64..60, 1u64..120),
        0..8,
    );
    let policy = prop_oneof![
        Just(Policy::Fcfs),
        Just(Policy::Easy),
        Just(Policy::Multifactor)
    ];
    (nodes, jobs, seeds, policy, 1usize..5, 60u64..120).prop_map(
        |(nodes, pending, seeds, policy, reservations, now)| {
            let running = carve(&nodes, &seeds);
            let mut config = Config::with_policy(policy);
            config.reservations = reservations;
            Case {
                state: State {
                    nodes,
                    running,
                    pending,
                    usage: BTreeMap::new(),
                    ..State::default()
                },
                config,
                now: now * MIN,
            }
        },
    )
}

/// Per node: CPUs, memory and GPUs per type held at `t` by running and started jobs.
fn held_at(
    case: &Case,
    plan: &Plan,
    t: Time,
) -> BTreeMap<String, (usize, u64, BTreeMap<String, usize>)> {
    let now = case.now;
    let kinds: BTreeMap<(&str, u32), &str> = case
        .state
        .nodes
        .iter()
        .flat_map(|n| {
            n.gpus
                .iter()
                .map(move |g| ((n.name.as_str(), g.id), g.kind.as_str()))
        })
        .collect();
    let mut out: BTreeMap<String, (usize, u64, BTreeMap<String, usize>)> = BTreeMap::new();
    let running = case
        .state
        .running
        .iter()
        .map(|r| ((r.start + r.time_limit).max(now + 1), &r.allocs));
    let started = plan.starts.iter().map(|s| (now + s.time_limit, &s.allocs));
    for (end, allocs) in running.chain(started) {
        if end <= t {
            continue;
        }
        for a in allocs {
            let e = out.entry(a.node.clone()).or_default();
            e.0 += a.cpu_ids.len();
            e.1 += a.memory;
            for g in &a.gpu_ids {
                if let Some(k) = kinds.get(&(a.node.as_str(), *g)) {
                    *e.2.entry(k.to_string()).or_default() += 1;
                }
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn plans_are_sound(case in arb_case()) {
        let plan = schedule(case.now, &case.state, &case.config);
        let nodes: BTreeMap<&str, &Node> = case.state.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let pending: BTreeMap<u64, &PendingJob> = case.state.pending.iter().map(|j| (j.id, j)).collect();

        // Every pending job is either started once or waiting once.
        let mut seen = BTreeSet::new();
        for id in plan.starts.iter().map(|s| s.job).chain(plan.waiting.iter().map(|w| w.job)) {
            prop_assert!(seen.insert(id), "job {} decided twice", id);
        }
        prop_assert_eq!(seen, pending.keys().copied().collect::<BTreeSet<_>>());

        // Ids are the node's own and never shared; memory never exceeds the node's.
        let mut cpus: BTreeSet<(String, u32)> = BTreeSet::new();
        let mut gpus: BTreeSet<(String, u32)> = BTreeSet::new();
        let mut memory: BTreeMap<String, u64> = BTreeMap::new();
        let all = case.state.running.iter().flat_map(|r| r.allocs.iter()).map(|a| (a, false))
            .chain(plan.starts.iter().flat_map(|s| s.allocs.iter()).map(|a| (a, true)));
        for (a, new) in all {
            let node = nodes[a.node.as_str()];
            if new {
                prop_assert_eq!(node.state, NodeState::Up);
            }
            for c in &a.cpu_ids {
                prop_assert!(node.cpu_ids.contains(c), "cpu {} not on {}", c, node.name);
                prop_assert!(cpus.insert((a.node.clone(), *c)), "cpu {} of {} twice", c, node.name);
            }
            for g in &a.gpu_ids {
                prop_assert!(node.gpus.iter().any(|x| x.id == *g), "gpu {} not on {}", g, node.name);
                prop_assert!(gpus.insert((a.node.clone(), *g)), "gpu {} of {} twice", g, node.name);
            }
            *memory.entry(a.node.clone()).or_default() += a.memory;
            prop_assert!(memory[&a.node] <= node.memory);
        }

        // A started job gets exactly its shape on distinct nodes.
        for s in &plan.starts {
            let r = &pending[&s.job].request;
            prop_assert_eq!(s.allocs.len(), r.node_count() as usize);
            let distinct: BTreeSet<&str> = s.allocs.iter().map(|a| a.node.as_str()).collect();
            prop_assert_eq!(distinct.len(), s.allocs.len());
            for a in &s.allocs {
                prop_assert_eq!(a.cpu_ids.len(), r.cpus as usize);
                prop_assert_eq!(a.gpu_ids.len(), r.gpus as usize);
                prop_assert_eq!(a.memory, r.memory);
                if let Some(k) = &r.gpu_kind {
                    let node = nodes[a.node.as_str()];
                    for g in &a.gpu_ids {
                        prop_assert!(node.gpus.iter().any(|x| x.id == *g && &x.kind == k));
                    }
                }
            }
        }

        // Reservations: no more than the policy allows (past its depth, one for each
        // association that holds none), and each stays feasible through its window given
        // every running and started job and every other reservation.
        let depth = case.config.reservation_limit();
        prop_assert!(
            plan.reservations.len() <= depth + case.config.assoc_reservation_limit()
        );
        let assoc_of = |id: u64| {
            case.state.pending.iter().find(|j| j.id == id).map(|j| j.assoc.clone())
        };
        for (k, r) in plan.reservations.iter().enumerate().skip(depth) {
            let before: Vec<_> = plan.reservations[..k].iter().map(|b| assoc_of(b.job)).collect();
            prop_assert!(!before.contains(&assoc_of(r.job)), "a second extra one for {:?}", r.job);
        }
        for r in &plan.reservations {
            prop_assert!(r.start >= case.now);
            let w = plan.waiting.iter().find(|w| w.job == r.job).unwrap();
            prop_assert_eq!(w.estimated_start, Some(r.start));
            let mut points: Vec<Time> = vec![r.start];
            points.extend(plan.reservations.iter().map(|o| o.start).filter(|&s| s > r.start && s < r.end));
            for t in points {
                let held = held_at(&case, &plan, t);
                for name in &r.nodes {
                    let node = nodes[name.as_str()];
                    let (mut c, mut m, mut g) = held.get(name).cloned().unwrap_or_default();
                    for o in plan.reservations.iter().filter(|o| o.start <= t && t < o.end && o.nodes.contains(name)) {
                        let req = &pending[&o.job].request;
                        c += req.cpus as usize;
                        m += req.memory;
                        // Nodes here carry one GPU type, so an untyped request takes it.
                        let kind = req.gpu_kind.clone().or_else(|| node.gpus.first().map(|x| x.kind.clone())).unwrap_or_default();
                        *g.entry(kind).or_default() += req.gpus as usize;
                    }
                    prop_assert!(c <= node.cpu_ids.len(), "CPUs of {} over at {}", name, t);
                    prop_assert!(m <= node.memory, "memory of {} over at {}", name, t);
                    for (kind, n) in g {
                        if n == 0 { continue; }
                        let have = node.gpus.iter().filter(|x| x.kind == kind).count();
                        prop_assert!(n <= have, "{} GPUs of {} over at {}", kind, name, t);
                    }
                }
            }
        }

        // FCFS never lets a job pass a blocked one.
        if case.config.policy == Policy::Fcfs {
            let first_blocked = plan.waiting.iter().find(|w| matches!(w.reason, PendingReason::Resources));
            if let Some(b) = first_blocked {
                let b = pending[&b.job];
                for s in &plan.starts {
                    let j = pending[&s.job];
                    prop_assert!((j.submit, j.id) < (b.submit, b.id));
                }
            }
        }
    }

    #[test]
    fn estimates_change_no_decision(case in arb_case(), estimates in 0usize..6) {
        let mut config = case.config.clone();
        config.start_estimates = estimates;
        let plan = schedule(case.now, &case.state, &config);
        config.start_estimates = 0;
        let bare = schedule(case.now, &case.state, &config);
        prop_assert_eq!(&plan.starts, &bare.starts);
        prop_assert_eq!(&plan.reservations, &bare.reservations);
        prop_assert_eq!(&plan.preemptions, &bare.preemptions);
        prop_assert_eq!(&plan.priorities, &bare.priorities);
        prop_assert_eq!(plan.waiting.len(), bare.waiting.len());
        let mut extra = 0;
        for (w, b) in plan.waiting.iter().zip(&bare.waiting) {
            prop_assert_eq!((w.job, &w.reason), (b.job, &b.reason));
            match (b.estimated_start, w.estimated_start) {
                (Some(_), _) => prop_assert_eq!(w.estimated_start, b.estimated_start),
                (None, Some(at)) => {
                    extra += 1;
                    prop_assert!(at >= case.now);
                    prop_assert!(matches!(w.reason, PendingReason::Resources | PendingReason::Priority));
                }
                (None, None) => {}
            }
        }
        prop_assert!(extra <= estimates);
    }

    #[test]
    fn same_input_same_plan(case in arb_case()) {
        let a = schedule(case.now, &case.state, &case.config);
        let b = schedule(case.now, &case.state.clone(), &case.config.clone());
        prop_assert_eq!(&a, &b);
        // Input order does not matter either.
        let mut shuffled = case.state.clone();
        shuffled.nodes.reverse();
        shuffled.pending.reverse();
        shuffled.running.reverse();
        prop_assert_eq!(a, schedule(case.now, &shuffled, &case.config));
    }
}

/// Runs passes forward in time under `case.config`, every job running to its time limit,
/// until `job` starts or `deadline` passes; returns when it started. With `rivals`, before
/// each pass after the first a job like `job` arrives with a higher priority than any other.
fn simulate_until_started(case: &Case, job: u64, deadline: Time, rivals: bool) -> Option<Time> {
    let mut state = case.state.clone();
    let mut now = case.now;
    let like = state.pending.iter().find(|j| j.id == job).cloned();
    for n in 0..500u64 {
        if let (true, true, Some(like)) = (rivals, n > 0, &like) {
            let mut rival = like.clone();
            rival.id = 10_000 + n;
            rival.submit = now;
            rival.nice = -1_000_000;
            state.pending.push(rival);
        }
        let plan = schedule(now, &state, &case.config);
        state.keep_reservations(&plan);
        apply(&mut state, &plan, now);
        if let Some(r) = state.running.iter().find(|r| r.id == job) {
            return Some(r.start);
        }
        // The next event: the earliest expected end still ahead (late jobs end just after now).
        let next = state
            .running
            .iter()
            .map(|r| (r.start + r.time_limit).max(now + 1))
            .min()?;
        if next > deadline {
            return None;
        }
        now = next;
        state
            .running
            .retain(|r| (r.start + r.time_limit).max(now) > now);
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Simulated forward with every job running to its limit, the job holding a reservation
    /// starts no later than the reservation said: nothing started around it delayed it.
    #[test]
    fn a_reservation_is_kept_when_the_plan_is_run_forward(mut case in arb_case()) {
        case.config.policy = Policy::Easy;
        let plan = schedule(case.now, &case.state, &case.config);
        if let Some(r) = plan.reservations.first() {
            let started = simulate_until_started(&case, r.job, r.start, false);
            prop_assert!(
                started.is_some_and(|t| t <= r.start),
                "job {} reserved for {} started {:?}", r.job, r.start, started
            );
        }
    }

    /// Under the multifactor policy, with reservations kept from the first pass on, the first
    /// reserved job starts no later than its reservation said, whatever the priorities do and
    /// however many jobs of higher priority come after it (those behind it are placed after
    /// it in each pass, so theirs may move either way until they are first). So it does when
    /// only the first one or two reservations may be kept.
    #[test]
    fn the_first_kept_reservation_holds_when_the_plan_is_run_forward(
        mut case in arb_case(),
        keep in proptest::sample::select(vec![1usize, 2, usize::MAX]),
    ) {
        case.config.policy = Policy::Multifactor;
        case.config.keep_reservations_after = 0;
        case.config.keep_reservations = keep;
        let plan = schedule(case.now, &case.state, &case.config);
        if let Some(r) = plan.reservations.first() {
            let started = simulate_until_started(&case, r.job, r.start, true);
            prop_assert!(
                started.is_some_and(|t| t <= r.start),
                "job {} reserved for {} started {:?}", r.job, r.start, started
            );
        }
    }
}
