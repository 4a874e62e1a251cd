//! Placement on the node's own ids: CPU ids and GPU ids (with types) exactly as reported.

mod common;
use common::*;
use wharf_core::*;

#[test]
fn gpu_ids_come_from_the_node_never_from_positions() {
    let gpus = vec![
        Gpu::new(0, "h100"),
        Gpu::new(1, "h100"),
        Gpu::new(3, "h100"),
    ];
    let mut n = Node::new("a", 4, 64 * GIB, gpus);
    n.cpu_ids = vec![10, 11, 20, 21];
    let state = State {
        nodes: vec![n],
        pending: vec![
            job(1, "u", 1, 2, 10, 0),
            job(2, "u", 1, 1, 10, 1),
            job(3, "u", 1, 1, 10, 2),
        ],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &Config::default());
    assert_eq!(plan.starts[0].allocs[0].gpu_ids, vec![0, 1]);
    assert_eq!(plan.starts[0].allocs[0].cpu_ids, vec![10]);
    assert_eq!(plan.starts[1].allocs[0].gpu_ids, vec![3], "never GPU 2");
    assert_eq!(plan.starts[1].allocs[0].cpu_ids, vec![11]);
    assert_eq!(started(&plan), vec![1, 2]);
    assert_eq!(waiting(&plan, 3).reason, PendingReason::Resources);
}

#[test]
fn running_jobs_hold_their_ids() {
    let gpus = vec![
        Gpu::new(0, "h100"),
        Gpu::new(1, "h100"),
        Gpu::new(3, "h100"),
    ];
    let state = State {
        nodes: vec![Node::new("a", 4, 64 * GIB, gpus)],
        running: vec![running(9, "a", vec![0, 2], vec![0, 3], 0, 60)],
        pending: vec![job(1, "u", 2, 1, 10, 0)],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &Config::default());
    assert_eq!(plan.starts[0].allocs[0].cpu_ids, vec![1, 3]);
    assert_eq!(plan.starts[0].allocs[0].gpu_ids, vec![1]);
}

#[test]
fn typed_requests_get_only_that_type() {
    let gpus = vec![
        Gpu::new(0, "A100"),
        Gpu::new(1, "a100"),
        Gpu::new(4, "h100"),
        Gpu::new(5, "h100"),
    ];
    let mut h = job(1, "u", 1, 2, 10, 0);
    h.request.gpu_kind = Some("h100".into());
    let mut other = job(2, "u", 1, 1, 10, 1);
    other.request.gpu_kind = Some("h100".into());
    let mut l40 = job(3, "u", 1, 1, 10, 2);
    l40.request.gpu_kind = Some("l40".into());
    let any = job(4, "u", 1, 2, 10, 3);
    let state = State {
        nodes: vec![Node::new("a", 8, 64 * GIB, gpus)],
        pending: vec![h, other, l40, any],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &Config::default());
    let by_job = |id| {
        plan.starts
            .iter()
            .find(|s| s.job == id)
            .map(|s| s.allocs[0].gpu_ids.clone())
    };
    assert_eq!(by_job(1), Some(vec![4, 5]));
    assert_eq!(by_job(4), Some(vec![0, 1]), "an untyped job takes one type");
    assert_eq!(by_job(2), None);
    assert_eq!(waiting(&plan, 3).reason.code(), "BadConstraints");
}

#[test]
fn memory_is_never_over_allocated_and_best_fit_keeps_gpu_nodes_for_gpu_jobs() {
    let mut big = job(1, "u", 1, 0, 10, 0);
    big.request.memory = 48 * GIB;
    let mut big2 = job(2, "u", 1, 0, 10, 1);
    big2.request.memory = 48 * GIB;
    let cpu_only = job(3, "u", 1, 0, 10, 2);
    let state = State {
        nodes: vec![node("cpu", 8, 64, 0), node("gpu", 8, 64, 8)],
        pending: vec![big, big2, cpu_only],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &Config::default());
    let nodes: Vec<&str> = plan
        .starts
        .iter()
        .map(|s| s.allocs[0].node.as_str())
        .collect();
    assert_eq!(nodes, vec!["cpu", "gpu", "cpu"]);
}

#[test]
fn down_and_draining_nodes_take_no_work() {
    let mut down = node("a", 8, 64, 0);
    down.state = NodeState::Down;
    let mut drain = node("b", 8, 64, 0);
    drain.state = NodeState::Drain;
    let state = State {
        nodes: vec![down, drain],
        pending: vec![job(1, "u", 1, 0, 10, 0)],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &Config::default());
    assert!(plan.starts.is_empty());
    assert_eq!(waiting(&plan, 1).reason, PendingReason::ReqNodeNotAvail);
}

#[test]
fn with_no_node_at_all_the_reason_says_so() {
    let state = State {
        pending: vec![job(1, "u", 1, 0, 10, 0)],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &Config::default());
    let reason = &waiting(&plan, 1).reason;
    assert_eq!(reason, &PendingReason::NoNodes);
    assert!(reason.to_string().contains("wharf agent"), "{reason}");
}

#[test]
fn mig_instances_are_gpus_of_their_own_type_and_their_gpu_is_never_given_whole() {
    use wharf_api::node::{mig_unit_id, GpuInfo, MigInfo};
    // GPU 0 whole; GPU 1 split into two 1g.10gb instances and one 3g.40gb, as an agent
    // reports it and the controller turns it into units.
    let mig = |uuid: &str, profile: &str| MigInfo {
        uuid: uuid.into(),
        profile: profile.into(),
        memory: None,
        caps: vec![],
    };
    let h100 = |minor: u32, mig: Vec<MigInfo>| GpuInfo {
        model: Some("NVIDIA H100 80GB HBM3".into()),
        mig,
        ..GpuInfo::minor(minor)
    };
    let reported = [
        h100(0, vec![]),
        h100(
            1,
            vec![
                mig("MIG-a", "1g.10gb"),
                mig("MIG-b", "1g.10gb"),
                mig("MIG-c", "3g.40gb"),
            ],
        ),
    ];
    let gpus: Vec<Gpu> = reported
        .iter()
        .flat_map(GpuInfo::units)
        .map(|u| Gpu::new(u.id, &u.kind))
        .collect();
    let typed = |id, kind: &str, count| {
        let mut j = job(id, "u", 1, count, 10, id);
        j.request.gpu_kind = Some(kind.into());
        j
    };
    let state = State {
        nodes: vec![Node::new("a", 8, 64 * GIB, gpus)],
        pending: vec![
            typed(1, "1g.10gb", 1),
            typed(2, "1g.10gb", 1),
            typed(3, "1g.10gb", 1),
            typed(4, "h100", 2),
            typed(5, "h100", 1),
            typed(6, "3g.40gb", 1),
        ],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &Config::default());
    let by_job = |id| {
        plan.starts
            .iter()
            .find(|s| s.job == id)
            .map(|s| s.allocs[0].gpu_ids.clone())
    };
    assert_eq!(by_job(1), Some(vec![mig_unit_id(1, 0)]));
    assert_eq!(by_job(2), Some(vec![mig_unit_id(1, 1)]));
    assert_eq!(by_job(3), None, "two 1g.10gb instances only");
    assert_eq!(by_job(4), None, "GPU 1 is not an h100 to be given whole");
    assert_eq!(by_job(5), Some(vec![0]));
    assert_eq!(by_job(6), Some(vec![mig_unit_id(1, 2)]));
    assert!(plan
        .starts
        .iter()
        .all(|s| !s.allocs[0].gpu_ids.contains(&1)));
}

#[test]
fn a_gangs_ranks_follow_its_node_list_not_the_best_fit_order() {
    // Best fit takes the fullest nodes first: gpu10 (4 CPUs), gpu9 (6), then gpu2 (8). The
    // ranks must follow the compressed list `gpu[2,9-10]`, numbers compared as numbers.
    let state = State {
        nodes: vec![
            node("gpu2", 8, 64, 0),
            node("gpu9", 6, 64, 0),
            node("gpu10", 4, 64, 0),
        ],
        pending: vec![{
            let mut j = job(1, "u", 4, 0, 10, 0);
            j.request.nodes = 3;
            j
        }],
        ..State::default()
    };
    let plan = schedule(MIN, &state, &Config::default());
    let ranks: Vec<&str> = plan.starts[0]
        .allocs
        .iter()
        .map(|a| a.node.as_str())
        .collect();
    let list = wharf_api::hostlist::compress(&ranks);
    assert_eq!(list, "gpu[2,9-10]");
    let expanded = wharf_api::hostlist::expand(&list, 3).unwrap();
    assert_eq!(ranks, expanded, "rank r runs on the list's node r");
    assert_eq!(ranks, ["gpu2", "gpu9", "gpu10"]);
}

#[test]
fn a_gang_waits_for_a_rendezvous_port_and_starts_once_one_is_free() {
    // Two ports; jobs 10 and 11 hold both on node a. The gang on a and b cannot meet its
    // peers without a MASTER_PORT, so it waits (in words) and is in no start; a one-node
    // job behind it still starts, without a port.
    let holder = |id: u64, port: u16| {
        let mut r = running(id, "a", vec![id as u32 - 10], vec![], 0, 60);
        r.port = Some(port);
        r
    };
    let mut gang = job(1, "u", 1, 0, 10, 0);
    gang.request.nodes = 2;
    let mut state = State {
        nodes: vec![node("a", 8, 64, 0), node("b", 8, 64, 0)],
        pending: vec![gang, job(2, "u", 1, 0, 10, 1)],
        running: vec![holder(10, 29500), holder(11, 29501)],
        ..State::default()
    };
    let config = Config {
        rendezvous_ports: 29500..=29501,
        ..Config::default()
    };
    let plan = schedule(MIN, &state, &config);
    assert_eq!(started(&plan), vec![2]);
    assert_eq!(plan.starts[0].port, None);
    assert_eq!(
        waiting(&plan, 1).reason,
        PendingReason::RendezvousPorts {
            first: 29500,
            last: 29501
        }
    );
    assert_eq!(
        plan.waiting.iter().filter(|w| w.job == 1).count(),
        1,
        "waits once"
    );
    // Job 11 ends: its port is free and the gang starts with it.
    state.running.retain(|r| r.id != 11);
    state.pending.retain(|j| j.id == 1);
    let plan = schedule(2 * MIN, &state, &config);
    assert_eq!(started(&plan), vec![1]);
    assert_eq!(plan.starts[0].port, Some(29501));
}
