//! Node selection: features, node lists, excluded nodes and whole-node jobs, each with the
//! reason a job waits for; and, over random clusters, that no start and no reservation ever
//! lands on a node the job may not use, and that a whole-node job shares its node with nobody.

mod common;
use std::collections::{BTreeMap, BTreeSet};

use common::*;
use proptest::prelude::*;
use wharf_api::features::Constraint;
use wharf_core::*;

fn with_features(mut n: Node, features: &[&str]) -> Node {
    n.features = features.iter().map(|f| f.to_string()).collect();
    n
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|n| n.to_string()).collect()
}

fn cluster() -> Vec<Node> {
    vec![
        with_features(node("n1", 8, 64, 0), &["nvme"]),
        with_features(node("n2", 8, 64, 0), &["ib", "nvme"]),
        with_features(node("n3", 8, 64, 2), &["ib"]),
    ]
}

fn plan_for(jobs: Vec<PendingJob>, running: Vec<RunningJob>) -> Plan {
    let state = State {
        nodes: cluster(),
        pending: jobs,
        running,
        ..State::default()
    };
    schedule(MIN, &state, &Config::default())
}

#[test]
fn a_constraint_picks_the_nodes_with_the_features() {
    let mut j = job(1, "u", 1, 0, 10, 0);
    j.select.constraint = Some(Constraint::parse("ib&nvme").unwrap());
    let mut k = job(2, "u", 1, 0, 10, 0);
    k.select.constraint = Some(Constraint::parse("bigmem|ib").unwrap());
    k.select.exclude = names(&["n2"]);
    let plan = plan_for(vec![j, k], vec![]);
    let on: Vec<&str> = plan
        .starts
        .iter()
        .map(|s| s.allocs[0].node.as_str())
        .collect();
    assert_eq!(on, ["n2", "n3"]);
}

#[test]
fn a_nodelist_is_where_a_one_node_job_may_run() {
    let mut j = job(1, "u", 1, 0, 10, 0);
    j.select.nodelist = names(&["n3", "n1"]);
    let plan = plan_for(vec![j], vec![]);
    // Best fit among the listed nodes: n1 has no GPUs.
    assert_eq!(plan.starts[0].allocs[0].node, "n1");
}

#[test]
fn a_job_no_node_matches_says_what_is_missing() {
    let reason = |sel: Selection| {
        let mut j = job(1, "u", 1, 0, 10, 0);
        j.select = sel;
        let plan = plan_for(vec![j], vec![]);
        let w = waiting(&plan, 1).reason.clone();
        assert!(w.is_stuck(), "{w}");
        assert_eq!(w.code(), "BadConstraints");
        w.to_string()
    };
    let r = reason(Selection {
        constraint: Some(Constraint::parse("bigmem").unwrap()),
        ..Selection::default()
    });
    assert!(
        r.contains("Requested node configuration is not available")
            && r.contains("has the features bigmem (features there: ib, nvme)"),
        "{r}"
    );
    let r = reason(Selection {
        nodelist: names(&["n9", "n1"]),
        ..Selection::default()
    });
    assert!(
        r.contains("its --nodelist names n9, which is not a node"),
        "{r}"
    );
    let r = reason(Selection {
        exclude: names(&["n1", "n2", "n3"]),
        ..Selection::default()
    });
    assert!(r.contains("--exclude leaves no node"), "{r}");
    // A GPU type is not a feature, and the reason says how to ask for one.
    let r = reason(Selection {
        constraint: Some(Constraint::parse("h100").unwrap()),
        ..Selection::default()
    });
    assert!(r.contains("h100 is a GPU type, not a feature"), "{r}");
}

#[test]
fn a_nodelist_outside_the_partition_is_refused_by_name() {
    let config = Config {
        partitions: vec![Partition::new("small", &["n1"])],
        ..Config::default()
    };
    let mut j = job(1, "u", 1, 0, 10, 0);
    j.select.nodelist = names(&["n2", "n3"]);
    let why = select::submit_checks(&config, &cluster(), &j)
        .unmatched
        .unwrap()
        .to_string();
    assert!(
        why.contains("none of its --nodelist n[2-3] is in partition small"),
        "{why}"
    );
    j.select.nodelist = names(&["n1"]);
    assert_eq!(
        select::submit_checks(&config, &cluster(), &j).unmatched,
        None
    );
}

#[test]
fn busy_or_down_listed_nodes_make_the_job_wait_as_slurm_says() {
    // n3 is busy: the job that may use only n3 waits for Resources, with a reservation there.
    let busy = running(100, "n3", (0..8).collect(), vec![], 0, 30);
    let mut j = job(1, "u", 1, 0, 10, 0);
    j.select.nodelist = names(&["n3"]);
    let plan = plan_for(vec![j.clone()], vec![busy]);
    assert_eq!(waiting(&plan, 1).reason, PendingReason::Resources);
    assert_eq!(plan.reservations[0].nodes, ["n3"]);
    // n3 is down: ReqNodeNotAvail, though other nodes are free.
    let mut nodes = cluster();
    nodes[2].state = NodeState::Down;
    let state = State {
        nodes,
        pending: vec![j],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &Config::default());
    assert_eq!(waiting(&plan, 1).reason, PendingReason::ReqNodeNotAvail);
}

#[test]
fn an_exclusive_job_takes_the_whole_node_and_shares_it_with_nobody() {
    let mut x = job(1, "u", 1, 0, 10, 0);
    x.select.exclusive = true;
    x.select.nodelist = names(&["n3"]);
    let mut small = job(2, "u", 1, 0, 10, 1);
    small.select.nodelist = names(&["n3"]);
    let plan = plan_for(vec![x.clone(), small.clone()], vec![]);
    let a = &plan.starts[0].allocs[0];
    assert_eq!((plan.starts[0].job, a.node.as_str()), (1, "n3"));
    assert_eq!(a.cpu_ids, (0..8).collect::<Vec<_>>());
    assert_eq!(a.gpu_ids, [0, 1]);
    assert_eq!(a.memory, 64 * GIB);
    assert_eq!(plan.starts.len(), 1, "{plan:?}");
    assert_eq!(waiting(&plan, 2).reason, PendingReason::Resources);
    // A node with one CPU in use cannot take an exclusive job.
    let one = running(100, "n3", vec![0], vec![], 0, 30);
    let plan = plan_for(vec![x], vec![one]);
    assert!(plan.starts.is_empty());
    assert_eq!(waiting(&plan, 1).reason, PendingReason::Resources);
}

#[derive(Debug, Clone)]
struct Case {
    state: State,
    config: Config,
}

const FEATURES: [&str; 3] = ["ib", "nvme", "big"];

fn arb_node(i: usize) -> impl Strategy<Value = Node> {
    (
        1u32..8,
        1u64..16,
        0u32..3,
        proptest::sample::subsequence(FEATURES.to_vec(), 0..=3),
        prop_oneof![6 => Just(NodeState::Up), 1 => Just(NodeState::Down)],
    )
        .prop_map(move |(cpus, gib, gpus, features, state)| {
            let mut n = with_features(node(&format!("n{i}"), cpus, gib, gpus), &features);
            n.state = state;
            n
        })
}

fn arb_selection(nodes: usize) -> impl Strategy<Value = Selection> {
    let some_nodes = move || {
        proptest::collection::btree_set(0..nodes + 1, 0..3)
            .prop_map(|s| s.into_iter().map(|i| format!("n{i}")).collect())
    };
    (
        prop_oneof![
            2 => Just(None),
            1 => Just(Some("ib")),
            1 => Just(Some("ib&nvme")),
            1 => Just(Some("big|nvme")),
        ],
        some_nodes(),
        some_nodes(),
        prop_oneof![3 => Just(false), 1 => Just(true)],
    )
        .prop_map(|(c, nodelist, exclude, exclusive)| Selection {
            constraint: c.map(|c| Constraint::parse(c).unwrap()),
            nodelist,
            exclude,
            exclusive,
        })
}

fn arb_case() -> impl Strategy<Value = Case> {
    (2usize..6).prop_flat_map(|n| {
        let nodes: Vec<_> = (0..n).map(arb_node).collect();
        let jobs = proptest::collection::vec((1u32..4, 0u32..2, 1u64..60, arb_selection(n)), 1..12);
        let policy = prop_oneof![Just(Policy::Easy), Just(Policy::Multifactor)];
        (nodes, jobs, policy).prop_map(|(nodes, jobs, policy)| {
            let pending = jobs
                .into_iter()
                .enumerate()
                .map(|(k, (cpus, gpus, minutes, select))| {
                    let mut j = job(k as u64 + 1, "u", cpus, gpus, minutes, k as u64);
                    j.select = select;
                    j
                })
                .collect();
            Case {
                state: State {
                    nodes,
                    pending,
                    ..State::default()
                },
                config: Config::with_policy(policy),
            }
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn starts_and_reservations_respect_each_jobs_selection(case in arb_case()) {
        let now = MIN;
        let nodes: BTreeMap<&str, &Node> =
            case.state.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let jobs: BTreeMap<u64, &PendingJob> = case.state.pending.iter().map(|j| (j.id, j)).collect();
        let plan = schedule(now, &case.state, &case.config);
        for s in &plan.starts {
            let sel = &jobs[&s.job].select;
            for a in &s.allocs {
                let node = nodes[a.node.as_str()];
                prop_assert!(sel.allows(node), "job {} started on {}", s.job, a.node);
                if sel.exclusive {
                    prop_assert_eq!(a.cpu_ids.len(), node.cpu_ids.len());
                    prop_assert_eq!(a.gpu_ids.len(), node.gpus.len());
                    prop_assert_eq!(a.memory, node.memory);
                    let others = plan.starts.iter().filter(|o| o.job != s.job)
                        .flat_map(|o| &o.allocs).filter(|o| o.node == a.node).count();
                    prop_assert_eq!(others, 0, "a job beside exclusive job {}", s.job);
                }
            }
        }
        for r in &plan.reservations {
            let sel = &jobs[&r.job].select;
            for name in &r.nodes {
                prop_assert!(sel.allows(nodes[name.as_str()]), "job {} reserved {}", r.job, name);
            }
        }
        for w in &plan.waiting {
            if let PendingReason::NoNodeMatches { .. } = w.reason {
                let sel = &jobs[&w.job].select;
                let unknown = sel.nodelist.iter().any(|n| !nodes.contains_key(n.as_str()));
                let none = !case.state.nodes.iter().any(|n| sel.allows(n));
                prop_assert!(unknown || none, "{}", w.reason);
            }
        }
        // Run forward: every job either starts on allowed nodes or waits; none ever lands on
        // a node beside a running exclusive job.
        let mut state = case.state.clone();
        let mut t = now;
        for _ in 0..30 {
            let plan = schedule(t, &state, &case.config);
            apply(&mut state, &plan, t);
            let exclusive: BTreeSet<&str> = state
                .running
                .iter()
                .filter(|r| jobs.get(&r.id).is_some_and(|j| j.select.exclusive))
                .flat_map(|r| r.allocs.iter().map(|a| a.node.as_str()))
                .collect();
            for node in exclusive {
                let on = state.running.iter().filter(|r| r.allocs.iter().any(|a| a.node == node)).count();
                prop_assert_eq!(on, 1, "node {} shared with an exclusive job", node);
            }
            let Some(next) = state.running.iter().map(|r| (r.start + r.time_limit).max(t + 1)).min() else {
                break;
            };
            t = next;
            state.running.retain(|r| r.start + r.time_limit > t);
        }
    }
}

#[test]
fn a_job_that_asks_for_all_memory_gets_each_nodes_whole_memory_and_only_its_cpus() {
    let mut x = job(1, "u", 2, 0, 10, 0);
    x.request.whole_memory = true;
    x.select.nodelist = names(&["n3"]);
    let mut small = job(2, "u", 1, 0, 10, 1);
    small.select.nodelist = names(&["n3"]);
    let plan = plan_for(vec![x.clone(), small.clone()], vec![]);
    let a = &plan.starts[0].allocs[0];
    assert_eq!((plan.starts[0].job, a.node.as_str()), (1, "n3"));
    assert_eq!(a.memory, 64 * GIB, "the node's whole memory");
    assert_eq!(a.cpu_ids, [0, 1], "only the CPUs it asked for");
    assert!(a.gpu_ids.is_empty());
    // No memory is left on it for another job, however small.
    assert_eq!(plan.starts.len(), 1, "{plan:?}");
    assert_eq!(waiting(&plan, 2).reason, PendingReason::Resources);
    // A node where any memory is in use cannot take it.
    let one = running(100, "n3", vec![7], vec![], 0, 30);
    let plan = plan_for(vec![x], vec![one]);
    assert!(plan.starts.is_empty(), "{plan:?}");
    assert_eq!(waiting(&plan, 1).reason, PendingReason::Resources);
}
