use super::*;

fn res(cpus: u32, gib: u64, gpus: u32) -> Resources {
    Resources {
        cpus,
        memory: gib << 30,
        gpus,
    }
}

fn job(id: JobId, r: Resources) -> PendingJob {
    PendingJob {
        id,
        resources: r,
        submit_time: id * 10,
        priority: 0,
    }
}

#[test]
fn places_in_order_with_lowest_indices() {
    let view = ClusterView {
        nodes: vec![NodeView::new("a", res(4, 8, 2))],
        pending: vec![
            job(1, res(2, 1, 1)),
            job(2, res(2, 1, 1)),
            job(3, res(1, 1, 0)),
        ],
    };
    let d = schedule(&view, 0);
    assert_eq!(
        d[0],
        Decision::Start {
            job: 1,
            node: "a".into(),
            cpu_ids: vec![0, 1],
            gpu_ids: vec![0]
        }
    );
    assert_eq!(
        d[1],
        Decision::Start {
            job: 2,
            node: "a".into(),
            cpu_ids: vec![2, 3],
            gpu_ids: vec![1]
        }
    );
    assert_eq!(
        d[2],
        Decision::Wait {
            job: 3,
            reason: PendingReason::Resources
        }
    );
}

#[test]
fn head_of_queue_blocks_smaller_jobs() {
    let mut node = NodeView::new("a", res(4, 8, 0));
    node.hold(&[0, 1], &[], 1 << 30);
    let view = ClusterView {
        nodes: vec![node],
        pending: vec![job(1, res(4, 1, 0)), job(2, res(1, 1, 0))],
    };
    let d = schedule(&view, 0);
    assert_eq!(
        d[0],
        Decision::Wait {
            job: 1,
            reason: PendingReason::Resources
        }
    );
    assert_eq!(
        d[1],
        Decision::Wait {
            job: 2,
            reason: PendingReason::Priority { behind: 1 }
        }
    );
}

#[test]
fn too_large_never_blocks() {
    let view = ClusterView {
        nodes: vec![NodeView::new("a", res(4, 8, 0))],
        pending: vec![job(1, res(64, 1, 0)), job(2, res(1, 1, 0))],
    };
    let d = schedule(&view, 0);
    assert!(matches!(
        &d[0],
        Decision::Wait {
            reason: PendingReason::TooLarge { .. },
            ..
        }
    ));
    assert!(d[0].clone() != d[1]);
    assert!(matches!(&d[1], Decision::Start { job: 2, .. }));
    let Decision::Wait { reason, .. } = &d[0] else {
        unreachable!()
    };
    assert!(
        reason.to_string().contains("64 CPUs (largest node has 4)"),
        "{reason}"
    );
}

#[test]
fn no_nodes_and_down_nodes() {
    let mut down = NodeView::new("a", res(4, 8, 0));
    down.up = false;
    let view = ClusterView {
        nodes: vec![down],
        pending: vec![job(1, res(1, 1, 0))],
    };
    assert_eq!(
        schedule(&view, 0),
        vec![Decision::Wait {
            job: 1,
            reason: PendingReason::NoNodes
        }]
    );
}

#[test]
fn best_fit_and_priority_order() {
    let mut busy = NodeView::new("b", res(8, 16, 0));
    busy.hold(&[0, 1, 2, 3, 4, 5], &[], 0);
    let view = ClusterView {
        nodes: vec![NodeView::new("a", res(8, 16, 0)), busy],
        pending: vec![
            job(1, res(2, 1, 0)),
            PendingJob {
                priority: 5,
                ..job(2, res(8, 1, 0))
            },
        ],
    };
    let d = schedule(&view, 0);
    // job 2 has the higher priority and takes the empty node; job 1 fills the busy one.
    assert!(matches!(&d[0], Decision::Start { job: 2, node, .. } if node == "a"));
    assert!(
        matches!(&d[1], Decision::Start { job: 1, node, cpu_ids, .. } if node == "b" && cpu_ids == &vec![6, 7])
    );
}

#[test]
fn deterministic() {
    let nodes: Vec<NodeView> = (0..20)
        .map(|i| NodeView::new(&format!("n{i:02}"), res(8, 32, 4)))
        .collect();
    let pending: Vec<PendingJob> = (0..300)
        .map(|i| job(i, res((i % 8) as u32 + 1, i % 7 + 1, (i % 3) as u32)))
        .collect();
    let view = ClusterView { nodes, pending };
    assert_eq!(schedule(&view, 5), schedule(&view, 5));
}
