//! Pre-pulls: only admins, only known and UP nodes, orders until each node reports its part
//! finished, and nodes that go DOWN fail theirs.

use wharf_api::prepull::{NodePull, NodePullState, PrePullRequest};
use wharf_api::wire::{ErrorKind, PollRequest};
use wharf_api::{JobDefaults, NodeInfo};

use crate::cluster::sched::tests::caller;
use crate::cluster::{Caller, Cluster};
use crate::store::Store;

fn cluster(dir: &tempfile::TempDir) -> Cluster {
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), 60_000, 0).unwrap();
    for name in ["n1", "n2"] {
        c.register(NodeInfo::new(name, name, 4, 16 << 30, vec![]), 0)
            .unwrap();
    }
    c
}

fn admin() -> Caller {
    Caller {
        admin: true,
        ..caller(0, "root")
    }
}

fn req(image: &str, nodes: &[&str]) -> PrePullRequest {
    PrePullRequest {
        image: image.into(),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
    }
}

fn report(c: &mut Cluster, node: &str, parts: Vec<NodePull>, now: u64) {
    c.ingest(
        &PollRequest {
            seq: None,
            node: node.into(),
            jobs: vec![],
            prepulls: parts,
            ..Default::default()
        },
        now,
    )
    .unwrap();
}

fn part(id: u64, state: NodePullState, message: &str) -> NodePull {
    NodePull {
        id,
        node: "forged".into(),
        state,
        progress: Default::default(),
        digest: (state == NodePullState::Done).then(|| "sha256:ab".to_string()),
        cached: false,
        message: message.into(),
    }
}

#[test]
fn only_admins_pull_on_known_up_nodes_and_bad_references_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let e = c
        .start_prepull(&caller(1001, "ann"), &req("ubuntu:24.04", &["n1"]))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e:?}");
    assert!(e.message.contains("only an admin") && e.message.contains("ann"));
    let e = c
        .start_prepull(&admin(), &req("ubuntu:24.04", &["n1", "gpu7", "gpu8"]))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound, "{e:?}");
    assert_eq!(
        e.message,
        "no node \"gpu7\", \"gpu8\" (the nodes are: n1, n2)"
    );
    let e = c
        .start_prepull(&admin(), &req("Ubuntu:24.04", &["n1"]))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput, "{e:?}");
    assert!(e.message.contains("lowercase"), "{e:?}");
    let e = c.start_prepull(&admin(), &req("ubuntu", &[])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput, "{e:?}");
    // n2 falls silent and goes DOWN.
    report(&mut c, "n1", vec![], 100_000);
    c.check_nodes(100_000).unwrap();
    let e = c
        .start_prepull(&admin(), &req("ubuntu", &["n1", "n2"]))
        .unwrap_err();
    assert_eq!(
        e.message,
        "node \"n2\" is DOWN; it cannot pull until its agent is back"
    );
    assert!(c.pull_orders("n1").is_empty(), "nothing was ordered");
}

#[test]
fn each_node_is_ordered_until_it_reports_its_part_finished() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let p = c
        .start_prepull(&admin(), &req("ubuntu:24.04", &["n1", "n2", "n1"]))
        .unwrap();
    assert_eq!(p.image, "docker.io/library/ubuntu:24.04");
    assert_eq!(p.nodes.len(), 2, "a node named twice pulls once");
    assert!(p.nodes.iter().all(|n| n.state == NodePullState::Waiting));
    let orders = c.pull_orders("n1");
    assert_eq!(orders.len(), 1);
    assert_eq!(orders[0].image, p.image);
    // n1's report is its own, whatever node it names.
    let mut pulling = part(p.id, NodePullState::Pulling, "");
    pulling.progress.layers = 3;
    report(&mut c, "n1", vec![pulling], 1_000);
    let now = c.prepull(&admin(), p.id).unwrap();
    assert_eq!(now.nodes[0].node, "n1");
    assert_eq!(now.nodes[0].state, NodePullState::Pulling);
    assert_eq!(now.nodes[0].progress.layers, 3);
    assert!(!now.finished());
    report(
        &mut c,
        "n1",
        vec![part(p.id, NodePullState::Done, "")],
        2_000,
    );
    report(
        &mut c,
        "n2",
        vec![part(p.id, NodePullState::Failed, "MANIFEST_UNKNOWN")],
        2_000,
    );
    assert!(c.pull_orders("n1").is_empty() && c.pull_orders("n2").is_empty());
    // A finished part stays as it ended, whatever comes later.
    report(
        &mut c,
        "n1",
        vec![part(p.id, NodePullState::Pulling, "")],
        3_000,
    );
    let now = c.prepull(&admin(), p.id).unwrap();
    assert!(now.finished());
    assert_eq!(now.nodes[0].digest.as_deref(), Some("sha256:ab"));
    assert_eq!(now.nodes[1].describe(), "failed: MANIFEST_UNKNOWN");
    assert_eq!(
        c.prepull(&caller(1001, "ann"), p.id).unwrap_err().kind,
        ErrorKind::PermissionDenied
    );
    assert_eq!(
        c.prepull(&admin(), 99).unwrap_err().kind,
        ErrorKind::NotFound
    );
}

#[test]
fn a_node_that_goes_down_fails_its_part_and_finished_pulls_make_room() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cluster(&dir);
    let p = c
        .start_prepull(&admin(), &req("ubuntu", &["n1", "n2"]))
        .unwrap();
    report(
        &mut c,
        "n1",
        vec![part(p.id, NodePullState::Done, "")],
        100_000,
    );
    c.check_nodes(100_000).unwrap();
    let now = c.prepull(&admin(), p.id).unwrap();
    assert!(now.finished());
    assert_eq!(now.nodes[1].describe(), "failed: node n2 is DOWN");
    // Full of unfinished pulls: refused; a finished one makes room.
    for _ in 1..super::KEPT {
        c.start_prepull(&admin(), &req("ubuntu", &["n1"])).unwrap();
    }
    let next = c.start_prepull(&admin(), &req("ubuntu", &["n1"])).unwrap();
    assert!(c.prepull(&admin(), p.id).is_err(), "the finished one went");
    let e = c
        .start_prepull(&admin(), &req("ubuntu", &["n1"]))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e:?}");
    assert!(c.prepull(&admin(), next.id).is_ok());
}
