//! Steps that hold GPUs of their own (see [`super::gpus`]).

use std::collections::BTreeSet;

use wharf_api::node::GpuInfo;
use wharf_api::step::{StepRecord, StepRequest};
use wharf_api::wire::ErrorKind;
use wharf_api::{JobDefaults, JobId, JobRequest, NodeInfo};

use super::tests::{ask, code, report, started, step_report};
use super::{Busy, StepOutcome};
use crate::cluster::sched::tests::{caller, record, submit_job};
use crate::cluster::Cluster;
use crate::store::Store;

fn load(dir: &tempfile::TempDir) -> Cluster {
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    Cluster::load_with_scheduler(
        store,
        JobDefaults::default(),
        60_000,
        0,
        wharf_core::Config::default(),
    )
    .unwrap()
}

/// Nodes g1..gN with 4 CPUs and GPUs of these minors each, and a running job of uid 1000
/// holding `gpus` GPUs on each.
fn gpu_job(dir: &tempfile::TempDir, n: u32, minors: &[u32], gpus: u32) -> (Cluster, JobId) {
    let mut c = load(dir);
    for i in 1..=n {
        let gpus = minors.iter().map(|&m| GpuInfo::minor(m)).collect();
        let node = NodeInfo::new(&format!("g{i}"), &format!("10.0.0.{i}"), 4, 16 << 30, gpus);
        c.register(node, 0).unwrap();
    }
    let req = JobRequest {
        nodes: Some(n),
        cpus: Some(4),
        gpus: Some(gpus),
        ..Default::default()
    };
    let id = submit_job(&mut c, &caller(1000, "ann"), req, 10).unwrap();
    c.schedule(1_000).unwrap();
    for i in 1..=n {
        report(&mut c, &format!("g{i}"), &[(id, None)], vec![]);
    }
    assert_eq!(record(&c, id).state, wharf_api::JobState::Running);
    (c, id)
}

fn per_node(n: u32) -> StepRequest {
    StepRequest {
        gpus_per_node: Some(n),
        ntasks: Some(1),
        ..Default::default()
    }
}

fn start(c: &mut Cluster, id: JobId, req: StepRequest) -> StepOutcome {
    c.start_step(ask(id, "g1", 1000, req), 2_000).unwrap()
}

fn ids(s: &StepRecord) -> Vec<Vec<u32>> {
    s.nodes.iter().map(|n| n.gpu_ids.clone()).collect()
}

/// The GPU ids of the launch order `node` gets for `step`.
fn launched(c: &Cluster, node: &str, step: u32) -> Vec<u32> {
    let (orders, _) = c.step_orders(node, &BTreeSet::new(), &BTreeSet::new());
    let o = orders.iter().find(|o| o.step == step).expect("no order");
    o.order.gpu_ids.clone()
}

#[test]
fn concurrent_steps_get_distinct_gpus_of_the_jobs_own_and_wait_while_all_are_held() {
    let dir = tempfile::tempdir().unwrap();
    // GPU 2 is not there: the job holds 0, 1 and 3.
    let (mut c, id) = gpu_job(&dir, 1, &[0, 1, 3], 3);
    assert_eq!(record(&c, id).allocs[0].gpu_ids, [0, 1, 3]);
    let a = started(start(&mut c, id, per_node(1)));
    let b = started(start(&mut c, id, per_node(1)));
    let gres_per_task = StepRequest {
        gpus_per_task: Some(1),
        ntasks: Some(1),
        ..Default::default()
    };
    let t = started(start(&mut c, id, gres_per_task));
    assert_eq!(
        (ids(&a), ids(&b), ids(&t)),
        (vec![vec![0]], vec![vec![1]], vec![vec![3]])
    );
    assert_eq!(t.gpus_per_node, Some(1));
    // Each step's tasks are launched with its own GPU alone.
    assert_eq!(
        (
            launched(&c, "g1", 0),
            launched(&c, "g1", 1),
            launched(&c, "g1", 2)
        ),
        (vec![0], vec![1], vec![3])
    );
    // All three held: a fourth waits, told by whom; nothing is recorded for it.
    let busy = Busy {
        node: "g1".into(),
        want: 1,
        has: 3,
        free: 0,
        holders: vec![0, 1, 2],
    };
    assert_eq!(
        start(&mut c, id, per_node(1)),
        StepOutcome::Waits(busy.clone())
    );
    let words = busy.to_string();
    assert!(
        words.contains("held by steps 0, 1, 2") && words.contains("job has 3 on g1"),
        "{words}"
    );
    assert_eq!(record(&c, id).steps.len(), 3);
    // Step 1 ends: its GPU goes to the next.
    report(
        &mut c,
        "g1",
        &[(id, None)],
        vec![step_report(id, 1, code(0, 0))],
    );
    let d = started(start(&mut c, id, per_node(1)));
    assert_eq!((d.id, ids(&d)), (3, vec![vec![1]]));
    // However it ended: a failed one gives its back too.
    report(
        &mut c,
        "g1",
        &[(id, None)],
        vec![step_report(id, 0, code(3, 0))],
    );
    assert_eq!(ids(&started(start(&mut c, id, per_node(1)))), [[0]]);
}

#[test]
fn more_gpus_than_the_job_has_is_refused_and_overlap_or_none_sees_all() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, id) = gpu_job(&dir, 1, &[0, 1, 3], 3);
    let e = c
        .start_step(ask(id, "g1", 1000, per_node(4)), 2_000)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    assert!(
        e.message.contains("4 GPU(s) on node g1 but job 1 has 3"),
        "{}",
        e.message
    );
    // Refused at once even while every GPU is held: it could never start.
    let all = started(start(&mut c, id, per_node(3)));
    assert_eq!(ids(&all), [[0, 1, 3]]);
    let e = c
        .start_step(ask(id, "g1", 1000, per_node(4)), 2_000)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    // --overlap and a step that asks for no GPUs hold none and see all the job's.
    let overlap = StepRequest {
        overlap: true,
        ..per_node(1)
    };
    let o = started(start(&mut c, id, overlap));
    let none = started(start(&mut c, id, StepRequest::default()));
    for s in [&o, &none] {
        assert_eq!((s.gpus_per_node, ids(s)), (None, vec![vec![]]));
        assert_eq!(launched(&c, "g1", s.id), [0, 1, 3]);
    }
    // A type is taken when the job named none; when it named one, only that one.
    let typed = |t: &str| StepRequest {
        gpu_type: Some(t.into()),
        overlap: true,
        ..per_node(1)
    };
    assert!(c
        .start_step(ask(id, "g1", 1000, typed("h100")), 2_000)
        .is_ok());
    c.jobs.edit(id, |j| {
        j.spec.as_mut().unwrap().gpu_type = Some("a100".into())
    });
    let e = c
        .start_step(ask(id, "g1", 1000, typed("h100")), 2_000)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    assert!(e.message.contains("holds a100 GPUs"), "{}", e.message);
    assert!(c
        .start_step(ask(id, "g1", 1000, typed("a100")), 2_000)
        .is_ok());
}

#[test]
fn gpus_in_all_spread_evenly_over_the_steps_nodes_or_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, id) = gpu_job(&dir, 2, &[0, 1], 2);
    let total = |n| StepRequest {
        gpus: Some(n),
        ..Default::default()
    };
    let e = c
        .start_step(ask(id, "g1", 1000, total(3)), 2_000)
        .unwrap_err();
    assert!(
        e.message.contains("does not divide evenly"),
        "{}",
        e.message
    );
    let s = started(start(&mut c, id, total(2)));
    assert_eq!(ids(&s), [[0], [0]]);
    assert_eq!(
        (launched(&c, "g1", 0), launched(&c, "g2", 0)),
        (vec![0], vec![0])
    );
    let both = StepRequest {
        gpus_per_node: Some(2),
        ..total(2)
    };
    let e = c.start_step(ask(id, "g1", 1000, both), 2_000).unwrap_err();
    assert!(e.message.contains("give one of them"), "{}", e.message);
    // The second of each node's goes to the next; a third waits on the first node short.
    assert_eq!(ids(&started(start(&mut c, id, total(2)))), [[1], [1]]);
    let StepOutcome::Waits(busy) = start(&mut c, id, total(2)) else {
        panic!("a third step did not wait")
    };
    assert_eq!((busy.node.as_str(), busy.holders), ("g1", vec![0, 1]));
}

#[test]
fn held_gpus_are_known_again_after_a_restart_and_given_back_when_the_job_ends() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, id) = gpu_job(&dir, 1, &[0, 1], 2);
    started(start(&mut c, id, per_node(2)));
    drop(c);
    let mut c = load(&dir);
    let StepOutcome::Waits(busy) = start(&mut c, id, per_node(1)) else {
        panic!("a restarted controller gave out a held GPU")
    };
    assert_eq!(busy.holders, [0]);
    report(
        &mut c,
        "g1",
        &[(id, None)],
        vec![step_report(id, 0, code(0, 0))],
    );
    assert_eq!(ids(&started(start(&mut c, id, per_node(1)))), [[0]]);
    // The job's end stops the step still running: it holds nothing, as every step has
    // ended in the stored record.
    report(&mut c, "g1", &[(id, Some(0))], vec![]);
    let job = c.store.job(id).unwrap().expect("the ended job's record");
    assert!(job.state.is_terminal(), "{:?}", job.state);
    assert_eq!(job.steps.len(), 2);
    assert!(
        job.steps.iter().all(|s| s.exit.is_some()),
        "{:?}",
        job.steps
    );
    assert!(super::gpus::held(&job, "g1").is_empty());
}

#[test]
fn memory_per_gpu_counts_the_steps_own_and_a_step_too_big_is_refused_before_waiting_for_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, id) = gpu_job(&dir, 1, &[0, 1], 2);
    let with = |memory, r: StepRequest| StepRequest {
        memory: Some(wharf_api::step::StepMemory::PerGpu(memory)),
        ..r
    };
    // The job has the default 1G. One GPU of its own: 256M for it; none of its own: the
    // job's two, 512M.
    let StepOutcome::Started(one) = start(&mut c, id, with(256 << 20, per_node(1))) else {
        panic!("the step waits")
    };
    assert_eq!(one.nodes[0].memory, Some(256 << 20));
    let seen = c
        .start_step(
            ask(id, "g1", 1000, with(256 << 20, StepRequest::default())),
            2_000,
        )
        .map(started)
        .unwrap();
    assert_eq!(seen.nodes[0].memory, Some(512 << 20));
    // Both GPUs are needed while one is held: a step that could fit waits...
    assert!(matches!(
        start(&mut c, id, with(128 << 20, per_node(2))),
        StepOutcome::Waits(_)
    ));
    // ...one that never could (2 × 1G past the job's 1G) is refused now, not once the GPUs
    // are free.
    let e = c
        .start_step(ask(id, "g1", 1000, with(1 << 30, per_node(2))), 2_000)
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput, "{}", e.message);
    assert!(e.message.contains("more than job"), "{}", e.message);
}
