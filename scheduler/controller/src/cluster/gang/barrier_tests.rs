//! The gang's preflight barrier: every node prepares its rank and says it is ready before any
//! rank starts; one node's failed preflight ends or requeues the whole gang, none of its ranks
//! having run, and a requeued gang says why until it starts again.

use std::collections::BTreeSet;

use wharf_api::fault::{FaultCode, LaunchFault};
use wharf_api::wire::{AgentJob, LaunchOrder, PollRequest};
use wharf_api::{ExitInfo, JobDefaults, JobId, JobRequest, JobState, NodeInfo, NodeState, Stop};

use crate::cluster::sched::tests::{caller, record, submit_job};
use crate::cluster::{Cluster, Ingested};
use crate::store::Store;

/// Nodes `g1`, `g2`, ... with 4 CPUs and 16 GiB each.
fn nodes(dir: &tempfile::TempDir, n: u32) -> Cluster {
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), 60_000, 0).unwrap();
    for i in 1..=n {
        let name = format!("g{i}");
        c.register(NodeInfo::new(&name, &name, 4, 16 << 30, vec![]), 0)
            .unwrap();
    }
    c
}

/// What an agent says of the job.
enum Says {
    /// Prepared, waiting for the release.
    Ready,
    /// Its preflight failed with this code and these words.
    Failed(FaultCode, &'static str),
    /// Nothing: it does not hold the job (or no longer).
    Nothing,
}

fn report(c: &mut Cluster, node: &str, id: JobId, says: Says, now: u64) -> Ingested {
    let job = match says {
        Says::Ready => Some(AgentJob {
            id,
            start_time: None,
            exit: None,
            end_time: None,
            stopping: false,
            ready: true,
            time_limit: None,
        }),
        Says::Failed(code, words) => Some(AgentJob {
            id,
            start_time: None,
            exit: Some(ExitInfo {
                message: Some(words.into()),
                fault: Some(LaunchFault::new(code)),
                ..Default::default()
            }),
            end_time: Some(now),
            stopping: false,
            ready: false,
            time_limit: None,
        }),
        Says::Nothing => None,
    };
    let poll = PollRequest {
        seq: None,
        node: node.into(),
        jobs: job.into_iter().collect(),
        ..Default::default()
    };
    c.ingest(&poll, now).unwrap()
}

/// The launch orders `node` gets, holding `id` prepared when `prepared`.
fn launches(c: &Cluster, node: &str, id: JobId, prepared: bool) -> Vec<LaunchOrder> {
    let set = if prepared {
        BTreeSet::from([id])
    } else {
        BTreeSet::new()
    };
    c.orders(node, &set, &BTreeSet::new(), &set).0
}

/// A three-node gang, scheduled on g1..g3.
fn gang3(c: &mut Cluster, requeue: bool) -> JobId {
    let req = JobRequest {
        nodes: Some(3),
        cpus: Some(4),
        requeue: Some(requeue),
        ..Default::default()
    };
    let id = submit_job(c, &caller(1000, "ann"), req, 10).unwrap();
    c.schedule(100).unwrap();
    assert_eq!(record(c, id).state, JobState::Starting);
    id
}

const NODES: [&str; 3] = ["g1", "g2", "g3"];

#[test]
fn a_gangs_ranks_are_released_only_once_every_node_is_ready() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 3);
    let id = gang3(&mut c, true);
    // First phase: every node is told to prepare, not to start.
    for node in NODES {
        let orders = launches(&c, node, id, false);
        assert_eq!(orders.len(), 1, "{node}");
        assert!(orders[0].hold, "{node}: {:?}", orders[0]);
    }
    report(&mut c, "g1", id, Says::Ready, 200);
    let seen = report(&mut c, "g3", id, Says::Ready, 210);
    assert!(seen.wake.is_empty(), "{:?}", seen.wake);
    let job = record(&c, id);
    assert_eq!(
        job.reason.as_deref(),
        Some("starting on g[1-3]: 2 of 3 nodes ready")
    );
    // Ready nodes wait: no order while one node is still preparing.
    for node in ["g1", "g3"] {
        assert!(launches(&c, node, id, true).is_empty(), "{node}");
    }
    // The last one ready: the others are woken, and every node gets its release.
    let seen = report(&mut c, "g2", id, Says::Ready, 220);
    assert_eq!(seen.wake, BTreeSet::from(["g1".into(), "g3".into()]));
    for node in NODES {
        let orders = launches(&c, node, id, true);
        assert_eq!(orders.len(), 1, "{node}");
        assert!(!orders[0].hold, "{node}");
    }
    assert_eq!(record(&c, id).state, JobState::Starting);
}

#[test]
fn a_one_node_job_is_never_held() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 1);
    let req = JobRequest {
        cpus: Some(1),
        ..Default::default()
    };
    let id = submit_job(&mut c, &caller(1000, "ann"), req, 10).unwrap();
    c.schedule(100).unwrap();
    let orders = launches(&c, "g1", id, false);
    assert_eq!(orders.len(), 1);
    assert!(!orders[0].hold);
}

const RDMA: &str = "the job needs RDMA but node g2 has no RDMA devices";

#[test]
fn a_failed_preflight_requeues_the_gang_unstarted_and_it_says_why_until_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 3);
    let id = gang3(&mut c, true);
    report(&mut c, "g1", id, Says::Ready, 200);
    let seen = report(&mut c, "g2", id, Says::Failed(FaultCode::Rdma, RDMA), 210);
    // The node at fault is drained; the prepared ranks are stopped, never released.
    assert_eq!(
        c.nodes()
            .iter()
            .find(|n| n.info.name == "g2")
            .unwrap()
            .state,
        NodeState::Drain
    );
    assert!(
        seen.wake.contains("g1") && seen.wake.contains("g3"),
        "{:?}",
        seen.wake
    );
    let (launch, kill) = c.orders(
        "g1",
        &BTreeSet::from([id]),
        &BTreeSet::new(),
        &BTreeSet::from([id]),
    );
    assert!(launch.is_empty());
    assert_eq!(kill.len(), 1);
    assert!(
        launches(&c, "g3", id, false).is_empty(),
        "g3 is not asked to prepare any more"
    );
    // Their agents let go: the gang is back in the queue, having started nowhere.
    report(&mut c, "g1", id, Says::Nothing, 300);
    report(&mut c, "g3", id, Says::Nothing, 300);
    report(&mut c, "g2", id, Says::Nothing, 300);
    let job = record(&c, id);
    assert_eq!((job.state, job.restarts), (JobState::Pending, 1), "{job:?}");
    assert!(job.start_time.is_none());
    assert!(
        matches!(&job.requeued_after, Some(Stop::LaunchFault { node, .. }) if node == "g2"),
        "{job:?}"
    );
    assert_eq!(job.requeued_message.as_deref(), Some(RDMA));
    // Two nodes left for three: it waits, and its pending reason says why it was requeued.
    c.schedule(400).unwrap();
    let reason = record(&c, id).reason.unwrap();
    assert!(
        reason.contains("requeued after node g2 failed (node fault: rdma)"),
        "{reason}"
    );
    // Others see the public part, never the node's words.
    let theirs = crate::visibility::view(&caller(2000, "bob"), record(&c, id));
    assert_eq!(theirs.requeued_message, None);
    assert!(theirs.reason.unwrap().contains("requeued after node g2"));
    // Once it starts again (its last nodes have let go, a fourth node came), that is over.
    for node in ["g1", "g3"] {
        report(&mut c, node, id, Says::Nothing, 450);
    }
    c.register(NodeInfo::new("g4", "g4", 4, 16 << 30, vec![]), 500)
        .unwrap();
    c.schedule(600).unwrap();
    let job = record(&c, id);
    assert_eq!(job.state, JobState::Starting, "{job:?}");
    assert_eq!((job.requeued_after, job.requeued_message), (None, None));
}

#[test]
fn a_job_fault_in_one_nodes_preflight_fails_the_gang_naming_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 3);
    let id = gang3(&mut c, true);
    let words = "the job needs 64.0 MiB of locked memory (memlock) but node g3 can give 1.0 MiB";
    report(&mut c, "g1", id, Says::Ready, 200);
    report(&mut c, "g2", id, Says::Ready, 200);
    report(
        &mut c,
        "g3",
        id,
        Says::Failed(FaultCode::Unsupported, words),
        210,
    );
    for node in ["g1", "g2"] {
        let (launch, kill) = c.orders(
            node,
            &BTreeSet::from([id]),
            &BTreeSet::new(),
            &BTreeSet::from([id]),
        );
        assert!(
            launch.is_empty(),
            "{node}: no release after a failed preflight"
        );
        assert_eq!(kill.len(), 1, "{node}");
        report(&mut c, node, id, Says::Nothing, 300);
    }
    let done = c.store.job(id).unwrap().unwrap();
    assert_eq!(done.state, JobState::Failed, "{done:?}");
    assert!(done.start_time.is_none());
    assert_eq!(
        done.reason.as_deref(),
        Some(format!("rank 2 on node g3: {words}").as_str())
    );
    for n in c.nodes() {
        assert_eq!(n.state, NodeState::Up, "{}", n.info.name);
    }
}

#[test]
fn a_node_whose_agent_predates_the_barrier_and_starts_at_once_counts_as_ready() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 3);
    let id = gang3(&mut c, true);
    report(&mut c, "g1", id, Says::Ready, 200);
    report(&mut c, "g2", id, Says::Ready, 200);
    // g3's agent ignored `hold` and started its rank.
    let started = PollRequest {
        seq: None,
        node: "g3".into(),
        jobs: vec![AgentJob {
            id,
            start_time: Some(250),
            exit: None,
            end_time: None,
            stopping: false,
            ready: false,
            time_limit: None,
        }],
        ..Default::default()
    };
    let seen = c.ingest(&started, 250).unwrap();
    assert_eq!(seen.wake, BTreeSet::from(["g1".into(), "g2".into()]));
    for node in ["g1", "g2"] {
        let orders = launches(&c, node, id, true);
        assert_eq!(orders.len(), 1, "{node}");
        assert!(!orders[0].hold);
    }
}
