//! Helpers shared by the scenario and property tests.
#![allow(dead_code)]

use wharf_core::*;

pub const GIB: u64 = 1 << 30;
pub const MIN: Time = 60_000;

/// An up node with `cpus` CPUs, `gib` GiB and `gpus` h100s numbered 0..gpus.
pub fn node(name: &str, cpus: u32, gib: u64, gpus: u32) -> Node {
    Node::new(name, cpus, gib * GIB, Node::numbered_gpus(gpus, "h100"))
}

/// A pending one-node job of `user` (its own account) submitted at `submit`.
pub fn job(id: u64, user: &str, cpus: u32, gpus: u32, minutes: u64, submit: Time) -> PendingJob {
    let mut j = PendingJob::new(
        id,
        Assoc::new(user, user),
        Request::per_node(cpus, GIB, gpus),
        submit,
    );
    j.time_limit = Some(minutes * MIN);
    j
}

/// A running job holding `cpus` CPUs and `gpus` GPUs (the lowest ids) on `node`.
pub fn running(
    id: u64,
    node: &str,
    cpu_ids: Vec<u32>,
    gpu_ids: Vec<u32>,
    start: Time,
    minutes: u64,
) -> RunningJob {
    RunningJob {
        id,
        assoc: Assoc::new("other", "other"),
        partition: None,
        qos: None,
        start,
        time_limit: minutes * MIN,
        allocs: vec![Alloc {
            node: node.into(),
            cpu_ids,
            gpu_ids,
            memory: GIB,
        }],
        port: None,
    }
}

pub fn started(plan: &Plan) -> Vec<u64> {
    plan.starts.iter().map(|s| s.job).collect()
}

pub fn waiting(plan: &Plan, job: u64) -> &Waiting {
    plan.waiting
        .iter()
        .find(|w| w.job == job)
        .unwrap_or_else(|| panic!("job {job} is not waiting: {plan:?}"))
}

/// Applies a plan's starts to the state at `now`: started jobs move to running.
pub fn apply(state: &mut State, plan: &Plan, now: Time) {
    for s in &plan.starts {
        let pos = state
            .pending
            .iter()
            .position(|j| j.id == s.job)
            .expect("started job was pending");
        let j = state.pending.remove(pos);
        state.running.push(RunningJob {
            id: j.id,
            assoc: j.assoc,
            partition: j.partition,
            qos: j.qos,
            start: now,
            time_limit: s.time_limit,
            allocs: s.allocs.clone(),
            port: None,
        });
    }
}

/// Policy `policy` with three reservations (kept once their job has waited 20 minutes) and, when `tiers`, three partitions: `default`,
/// `scav` (preempted by requeue) and `high` (tier 1).
pub fn config(policy: Policy, tiers: bool) -> Config {
    let mut c = Config::with_policy(policy);
    c.reservations = 3;
    // Short enough that kept reservations come into play within a test's minutes.
    c.keep_reservations_after = 20 * MIN;
    if tiers {
        let mut scav = Partition::new("scav", &[]);
        scav.preempt_mode = PreemptMode::Requeue;
        let mut high = Partition::new("high", &[]);
        high.priority_tier = 1;
        c.partitions = vec![Partition::new("default", &[]), scav, high];
    }
    c
}
