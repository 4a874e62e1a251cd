use std::collections::BTreeSet;

use wharf_api::wire::{AgentJob, ErrorKind, PollRequest};
use wharf_api::{ExitInfo, JobDefaults, JobId, JobRequest, JobState, NodeInfo, Stop};

use crate::cluster::sched::tests::{caller, record, submit_job};
use crate::cluster::{Cluster, Ingested};
use crate::store::Store;

/// Node timeout of these clusters, ms.
const TIMEOUT: u64 = 60_000;

/// A cluster of `n` nodes `g1`, `g2`, ... with 4 CPUs and 16 GiB each, no GPUs, scheduling
/// with `config`.
fn gang_cluster(dir: &tempfile::TempDir, n: u32, config: wharf_core::Config) -> Cluster {
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c =
        Cluster::load_with_scheduler(store, JobDefaults::default(), TIMEOUT, 0, config).unwrap();
    for i in 1..=n {
        let name = format!("g{i}");
        c.register(
            NodeInfo::new(&name, &format!("10.0.0.{i}"), 4, 16 << 30, vec![]),
            0,
        )
        .unwrap();
    }
    c
}

fn gang(nodes: u32) -> JobRequest {
    JobRequest {
        nodes: Some(nodes),
        cpus: Some(4),
        ..Default::default()
    }
}

/// What a node's agent says of one job.
#[derive(Clone, Copy)]
enum Rank {
    /// Running since 1 s.
    Running,
    /// Ended with this exit status.
    Exited(i32),
    /// Ended by a kill order.
    Killed,
    /// One of its tasks on the node (this local index) exited with this status.
    TaskExited(u32, i32),
}

/// `node`'s agent reports these jobs (the rest are gone from it); returns what it may forget.
fn poll(c: &mut Cluster, node: &str, jobs: &[(JobId, Rank)], now: u64) -> Vec<JobId> {
    ingest(c, node, jobs, now).forget
}

/// [`poll`], returning all the controller made of it.
fn ingest(c: &mut Cluster, node: &str, jobs: &[(JobId, Rank)], now: u64) -> Ingested {
    let jobs = jobs
        .iter()
        .map(|&(id, r)| {
            let exit = match r {
                Rank::Running => None,
                Rank::Exited(code) => Some(ExitInfo {
                    code: Some(code),
                    ..Default::default()
                }),
                Rank::Killed => Some(ExitInfo {
                    signal: Some(15),
                    cancelled: true,
                    ..Default::default()
                }),
                Rank::TaskExited(task, code) => Some(ExitInfo {
                    code: Some(code),
                    task: Some(task),
                    ..Default::default()
                }),
            };
            AgentJob {
                id,
                start_time: Some(1_000),
                end_time: exit.as_ref().map(|_| now),
                exit,
                stopping: false,
                ready: false,
                time_limit: None,
            }
        })
        .collect();
    let poll = PollRequest {
        seq: None,
        node: node.into(),
        jobs,
        ..Default::default()
    };
    c.ingest(&poll, now).unwrap()
}

/// Submits a `nodes`-node job and brings every rank to running.
fn running(c: &mut Cluster, nodes: u32, req: JobRequest) -> JobId {
    let ann = caller(1000, "ann");
    let id = submit_job(
        c,
        &ann,
        JobRequest {
            nodes: Some(nodes),
            ..req
        },
        10,
    )
    .unwrap();
    c.schedule(1_000).unwrap();
    for i in 1..=nodes {
        poll(c, &format!("g{i}"), &[(id, Rank::Running)], 1_500);
    }
    assert_eq!(record(c, id).state, JobState::Running);
    id
}

fn held(id: JobId) -> BTreeSet<JobId> {
    BTreeSet::from([id])
}

#[test]
fn a_three_node_job_starts_at_once_with_a_rank_per_node_and_one_port() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 3, wharf_core::Config::default());
    let ann = caller(1000, "ann");
    let id = submit_job(&mut c, &ann, gang(3), 10).unwrap();
    let two = submit_job(&mut c, &ann, gang(2), 20).unwrap();
    let woken = c.schedule(1_000).unwrap();
    assert_eq!(
        woken,
        BTreeSet::from(["g1".into(), "g2".into(), "g3".into()])
    );
    let job = record(&c, id);
    assert_eq!(job.state, JobState::Starting);
    assert_eq!(job.nodes().collect::<Vec<_>>(), ["g1", "g2", "g3"]);
    assert_eq!(job.nodelist(), "g[1-3]");
    assert_eq!(job.reason.as_deref(), Some("starting on g[1-3]"));
    assert!(
        job.allocs.iter().all(|a| a.cpu_ids.len() == 4),
        "whole nodes of 4 CPUs"
    );
    // The two-node job waits for two whole nodes, and says so.
    let waits = record(&c, two).reason.unwrap();
    assert!(waits.contains("needs 2 nodes at once"), "{waits}");

    let mut ports = BTreeSet::new();
    for (rank, node) in ["g1", "g2", "g3"].into_iter().enumerate() {
        let (launch, kill) = c.orders(node, &BTreeSet::new(), &BTreeSet::new(), &BTreeSet::new());
        assert!(kill.is_empty());
        assert_eq!(launch.len(), 1, "{node}");
        let r = &launch[0].rendezvous;
        assert_eq!(r.node_rank, rank as u32);
        let peers: Vec<(&str, &str)> = r
            .nodes
            .iter()
            .map(|p| (p.name.as_str(), p.address.as_str()))
            .collect();
        assert_eq!(
            peers,
            [("g1", "10.0.0.1"), ("g2", "10.0.0.2"), ("g3", "10.0.0.3")]
        );
        assert_eq!(launch[0].cpu_ids, job.allocs[rank].cpu_ids);
        ports.insert(r.port.expect("a port"));
    }
    assert_eq!(ports.len(), 1, "every rank is told the same port");

    // RUNNING once every rank has started, not before.
    poll(&mut c, "g1", &[(id, Rank::Running)], 1_500);
    poll(&mut c, "g3", &[(id, Rank::Running)], 1_500);
    assert_eq!(record(&c, id).state, JobState::Starting);
    // A node holding its rank is not sent it again.
    let (launch, _) = c.orders("g1", &held(id), &BTreeSet::new(), &BTreeSet::new());
    assert!(launch.is_empty());
    poll(&mut c, "g2", &[(id, Rank::Running)], 1_600);
    let job = record(&c, id);
    assert_eq!(
        (job.state, job.start_time),
        (JobState::Running, Some(1_000))
    );

    // Every rank exits 0: COMPLETED; rank 0 ending first stops nothing.
    poll(&mut c, "g1", &[(id, Rank::Exited(0))], 5_000);
    let job = record(&c, id);
    assert_eq!((job.state, job.stop.clone()), (JobState::Running, None));
    let (_, kill) = c.orders("g2", &held(id), &BTreeSet::new(), &BTreeSet::new());
    assert!(kill.is_empty(), "{kill:?}");
    poll(&mut c, "g2", &[(id, Rank::Exited(0))], 5_100);
    poll(&mut c, "g3", &[(id, Rank::Exited(0))], 5_200);
    let done = c.store.job(id).unwrap().unwrap();
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.end_time, Some(5_200));
    assert_eq!(done.nodelist(), "g[1-3]", "an ended job keeps its nodes");
    assert!(!c.jobs.contains_key(&id));
}

#[test]
fn one_rank_failing_stops_the_others_and_the_job_fails_naming_node_and_rank() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 3, wharf_core::Config::default());
    let id = running(&mut c, 3, gang(3));
    // Rank 1 exits 3: the others are told to stop, the job is not over yet.
    let seen = ingest(&mut c, "g2", &[(id, Rank::Exited(3))], 3_000);
    assert_eq!(seen.forget, [id]);
    // The other ranks' agents are woken to hear it now.
    assert_eq!(seen.wake, BTreeSet::from(["g1".into(), "g3".into()]));
    let job = record(&c, id);
    assert_eq!(job.state, JobState::Running);
    assert_eq!(
        job.stop,
        Some(Stop::RankFailed {
            node: "g2".into(),
            rank: 1
        })
    );
    for node in ["g1", "g3"] {
        let (launch, kill) = c.orders(node, &held(id), &BTreeSet::new(), &BTreeSet::new());
        assert!(launch.is_empty());
        assert_eq!(kill.len(), 1, "{node}");
        assert_eq!(kill[0].reason, "rank 1 on node g2 failed");
    }
    // The failed rank is not launched again, nor killed.
    let (launch, kill) = c.orders("g2", &BTreeSet::new(), &BTreeSet::new(), &BTreeSet::new());
    assert!(launch.is_empty() && kill.is_empty());
    // Not repeated to a node already stopping it.
    let (_, kill) = c.orders("g1", &held(id), &held(id), &BTreeSet::new());
    assert!(kill.is_empty());

    poll(&mut c, "g1", &[(id, Rank::Killed)], 4_000);
    assert_eq!(record(&c, id).state, JobState::Running, "rank 2 still runs");
    poll(&mut c, "g3", &[(id, Rank::Killed)], 4_100);
    let done = c.store.job(id).unwrap().unwrap();
    assert_eq!(done.state, JobState::Failed);
    assert_eq!(done.exit.as_ref().unwrap().code, Some(3));
    let reason = done.reason.clone().unwrap();
    assert!(reason.contains("rank 1 on node g2"), "{reason}");
    // Others see which rank on which node, and the code, not the agent's words.
    let other = crate::visibility::view(&caller(2000, "bob"), done);
    assert_eq!(
        other.reason.as_deref(),
        Some("rank 1 on node g2 failed: exit 3:0")
    );
}

#[test]
fn a_lost_node_requeues_the_gang_once_its_other_ranks_are_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let id = running(&mut c, 2, gang(2));
    // g1 keeps answering; g2 falls silent.
    poll(&mut c, "g1", &[(id, Rank::Running)], TIMEOUT);
    let wake = c.check_nodes(TIMEOUT + 2_000).unwrap();
    assert_eq!(wake, BTreeSet::from(["g1".into()]));
    let job = record(&c, id);
    assert_eq!(
        job.state,
        JobState::Running,
        "rank 0 is still to be stopped"
    );
    assert_eq!(
        job.stop,
        Some(Stop::NodeLost {
            node: "g2".into(),
            requeue: true
        })
    );
    let (_, kill) = c.orders("g1", &held(id), &BTreeSet::new(), &BTreeSet::new());
    assert_eq!(kill[0].reason, "node g2 stopped responding");
    poll(&mut c, "g1", &[(id, Rank::Killed)], TIMEOUT + 3_000);
    let job = record(&c, id);
    assert_eq!((job.state, job.restarts), (JobState::Pending, 1));
    assert!(job.allocs.is_empty());
    assert_eq!(job.requeued_from, ["g1"], "not g2: it is down");
    let reason = job.reason.unwrap();
    assert!(reason.contains("node g2 stopped responding"), "{reason}");
    // g1 lets go of the last run; g2 comes back still running its rank: it is killed there.
    poll(&mut c, "g1", &[], TIMEOUT + 4_000);
    assert!(record(&c, id).requeued_from.is_empty());
    c.schedule(TIMEOUT + 4_500).unwrap();
    let waits = record(&c, id);
    assert_eq!(waits.state, JobState::Pending, "g2 is down");
    assert!(waits.pending_reason.is_some(), "{:?}", waits.reason);
    poll(&mut c, "g2", &[(id, Rank::Running)], TIMEOUT + 5_000);
    let waits = record(&c, id);
    assert_eq!(
        waits.requeued_from,
        ["g2"],
        "not restarted beside its old run"
    );
    // Its reason is the requeue's now, and the scheduler's typed one went with the words.
    assert!(waits
        .reason
        .as_deref()
        .unwrap()
        .starts_with("Requeued: waiting for node g2"));
    assert_eq!(waits.pending_reason, None);
    c.schedule(TIMEOUT + 5_100).unwrap();
    assert_eq!(record(&c, id).state, JobState::Pending);
    let (launch, kill) = c.orders("g2", &held(id), &BTreeSet::new(), &BTreeSet::new());
    assert!(launch.is_empty());
    assert_eq!(kill[0].reason, "job is not active on this node");
    poll(&mut c, "g2", &[(id, Rank::Killed)], TIMEOUT + 6_000);
    poll(&mut c, "g2", &[], TIMEOUT + 7_000);
    assert!(record(&c, id).requeued_from.is_empty());
    c.schedule(TIMEOUT + 8_000).unwrap();
    assert_eq!(record(&c, id).state, JobState::Starting, "started again");
    // Its run so far counts toward fair share.
    assert!(c.usage.snapshot(TIMEOUT + 5_000).values().any(|u| *u > 0.0));
}

#[test]
fn a_lost_node_ends_a_job_that_may_not_be_requeued_as_node_fail() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let no_requeue = JobRequest {
        requeue: Some(false),
        ..gang(2)
    };
    let id = running(&mut c, 2, no_requeue);
    poll(&mut c, "g2", &[(id, Rank::Running)], TIMEOUT);
    c.check_nodes(TIMEOUT + 2_000).unwrap();
    poll(&mut c, "g2", &[(id, Rank::Killed)], TIMEOUT + 3_000);
    let done = c.store.job(id).unwrap().unwrap();
    assert_eq!(done.state, JobState::NodeFail);
    assert_eq!(done.reason.as_deref(), Some("node g1 stopped responding"));
    let other = crate::visibility::view(&caller(2000, "bob"), done);
    assert_eq!(other.reason.as_deref(), Some("node g1 stopped responding"));
}

/// A node taken for lost that comes back still running a job the controller has moved on
/// from takes no new job until that run is gone: its CPUs are still in use. Before, the node
/// looked free the moment it answered, and the next job started beside the dying run.
#[test]
fn a_node_back_with_a_run_the_controller_moved_on_from_takes_no_job_until_it_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 1, wharf_core::Config::default());
    let no_requeue = JobRequest {
        requeue: Some(false),
        ..gang(1)
    };
    let old = running(&mut c, 1, no_requeue);
    c.check_nodes(TIMEOUT + 2_000).unwrap();
    assert_eq!(c.store.job(old).unwrap().unwrap().state, JobState::NodeFail);
    let next = submit_job(&mut c, &caller(1000, "ann"), gang(1), TIMEOUT + 2_500).unwrap();
    // g1 answers again, its old run still going: it is told to kill it, and holds it.
    poll(&mut c, "g1", &[(old, Rank::Running)], TIMEOUT + 3_000);
    c.schedule(TIMEOUT + 3_100).unwrap();
    assert_eq!(
        record(&c, next).state,
        JobState::Pending,
        "beside the old run"
    );
    // Its reason says why it takes no job.
    let g1 = c.nodes().into_iter().find(|n| n.info.name == "g1").unwrap();
    assert!(
        (g1.reason.as_deref()).is_some_and(|r| r.contains(&format!("of job {old}"))),
        "{:?}",
        g1.reason
    );
    let (launch, kill) = c.orders("g1", &held(old), &BTreeSet::new(), &BTreeSet::new());
    assert!(launch.is_empty());
    assert_eq!(kill.len(), 1);
    // Still going in the next report (its grace period): still held.
    poll(&mut c, "g1", &[(old, Rank::Running)], TIMEOUT + 4_000);
    c.schedule(TIMEOUT + 4_100).unwrap();
    assert_eq!(record(&c, next).state, JobState::Pending);
    // Gone: the node is free.
    poll(&mut c, "g1", &[], TIMEOUT + 5_000);
    c.schedule(TIMEOUT + 5_100).unwrap();
    assert_eq!(record(&c, next).state, JobState::Starting);
}

#[test]
fn both_nodes_lost_at_once_requeue_the_job_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let id = running(&mut c, 2, gang(2));
    c.check_nodes(TIMEOUT + 2_000).unwrap();
    let job = record(&c, id);
    assert_eq!((job.state, job.restarts), (JobState::Pending, 1));
    assert!(job.requeued_from.is_empty(), "no node is up to wait for");
}

#[test]
fn cancel_stops_every_rank_and_a_rank_never_launched_is_not_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let ann = caller(1000, "ann");
    let id = submit_job(&mut c, &ann, gang(2), 10).unwrap();
    c.schedule(1_000).unwrap();
    poll(&mut c, "g1", &[(id, Rank::Running)], 1_500);
    let (_, wake) = c.cancel(&ann, id, 2_000).unwrap();
    assert_eq!(wake, ["g1", "g2"]);
    // g2 never got its launch: it is not sent now, and its rank counts as ended.
    let (launch, _) = c.orders("g2", &BTreeSet::new(), &BTreeSet::new(), &BTreeSet::new());
    assert!(launch.is_empty());
    poll(&mut c, "g2", &[], 2_100);
    assert_eq!(record(&c, id).state, JobState::Starting);
    let (_, kill) = c.orders("g1", &held(id), &BTreeSet::new(), &BTreeSet::new());
    assert_eq!(kill[0].reason, "cancelled");
    poll(&mut c, "g1", &[(id, Rank::Killed)], 2_500);
    let done = c.store.job(id).unwrap().unwrap();
    assert_eq!(done.state, JobState::Cancelled);
}

#[test]
fn a_gang_job_survives_a_controller_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let id = running(&mut c, 2, gang(2));
    let before = record(&c, id);
    drop(c);
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), TIMEOUT, 2_000).unwrap();
    let after = record(&c, id);
    assert_eq!(after, before);
    assert_eq!(c.jobs.on_node("g2").map(|j| j.id).collect::<Vec<_>>(), [id]);
    // The nodes hold it: nothing to launch; then they carry on to the end.
    let (launch, kill) = c.orders("g2", &held(id), &BTreeSet::new(), &BTreeSet::new());
    assert!(launch.is_empty() && kill.is_empty());
    poll(&mut c, "g2", &[(id, Rank::Exited(0))], 3_000);
    poll(&mut c, "g1", &[(id, Rank::Exited(0))], 3_100);
    assert_eq!(c.store.job(id).unwrap().unwrap().state, JobState::Completed);
}

#[test]
fn gang_shapes_are_checked_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = wharf_core::Config::default();
    let mut small = wharf_core::Partition::new("small", &[]);
    small.max_nodes = Some(2);
    let pair = wharf_core::Partition::new("pair", &["g1", "g2"]);
    let all = wharf_core::Partition::new("all", &[]);
    config.partitions = vec![all, small, pair];
    let mut c = gang_cluster(&dir, 3, config);
    let ann = caller(1000, "ann");
    let refused = |c: &mut Cluster, req: JobRequest| {
        let e = submit_job(c, &ann, req, 10).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{}", e.message);
        e.message
    };
    let in_part = |p: &str, n: u32| JobRequest {
        partition: Some(p.into()),
        ..gang(n)
    };
    let m = refused(&mut c, in_part("small", 3));
    assert!(m.contains("over partition small's MaxNodes of 2"), "{m}");
    let m = refused(&mut c, in_part("pair", 3));
    assert!(m.contains("partition pair has 2 nodes"), "{m}");
    let m = refused(&mut c, gang(4));
    assert!(m.contains("partition all has 3 nodes"), "{m}");
    let m = refused(
        &mut c,
        JobRequest {
            ntasks: Some(3),
            ..gang(2)
        },
    );
    assert!(m.contains("`ntasks` = 3 but the job has 2 nodes"), "{m}");
    let m = refused(
        &mut c,
        JobRequest {
            ntasks: Some(3),
            ntasks_per_node: Some(2),
            ..gang(2)
        },
    );
    assert!(
        m.contains("`ntasks` = 3 but the job has 2 nodes with 2 tasks per node, which makes 4"),
        "{m}"
    );
    // Two tasks of 4 CPUs each need 8 CPUs on each node; these have 4.
    let m = refused(
        &mut c,
        JobRequest {
            ntasks_per_node: Some(2),
            ..gang(2)
        },
    );
    assert!(m.contains("8 CPUs (the largest node has 4)"), "{m}");
    let fine = JobRequest {
        ntasks: Some(2),
        ntasks_per_node: Some(1),
        ..in_part("pair", 2)
    };
    let id = submit_job(&mut c, &ann, fine, 10).unwrap();
    c.schedule(1_000).unwrap();
    assert_eq!(record(&c, id).nodelist(), "g[1-2]");
}

#[test]
fn a_preempted_gang_is_stopped_everywhere_and_waits_for_every_node_to_let_go() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::cluster::sched::tests::tiers();
    let mut c = gang_cluster(&dir, 2, config);
    let low = running(
        &mut c,
        2,
        JobRequest {
            partition: Some("scav".into()),
            ..gang(2)
        },
    );
    let ann = caller(1000, "ann");
    let urgent = JobRequest {
        partition: Some("high".into()),
        ..gang(2)
    };
    let high = submit_job(&mut c, &ann, urgent, 2_000).unwrap();
    let woken = c.schedule(3_000).unwrap();
    assert_eq!(woken, BTreeSet::from(["g1".into(), "g2".into()]));
    for node in ["g1", "g2"] {
        let (_, kill) = c.orders(node, &held(low), &BTreeSet::new(), &BTreeSet::new());
        assert_eq!(kill[0].reason, format!("preempted by job {high}"), "{node}");
    }
    poll(&mut c, "g1", &[(low, Rank::Killed)], 4_000);
    assert_eq!(
        record(&c, low).state,
        JobState::Running,
        "g2's rank still runs"
    );
    poll(&mut c, "g2", &[(low, Rank::Killed)], 4_100);
    let requeued = record(&c, low);
    assert_eq!((requeued.state, requeued.restarts), (JobState::Pending, 1));
    assert_eq!(requeued.requeued_from, ["g1", "g2"]);
    // The high job takes both nodes; the low one waits until both have let go.
    c.schedule(5_000).unwrap();
    assert_eq!(record(&c, high).state, JobState::Starting);
    poll(&mut c, "g1", &[(high, Rank::Running)], 5_500);
    assert_eq!(record(&c, low).requeued_from, ["g2"]);
    poll(&mut c, "g2", &[(high, Rank::Running)], 5_600);
    assert!(record(&c, low).requeued_from.is_empty());
    assert_eq!(record(&c, high).state, JobState::Running);
}

/// A two-node gang whose rank on `node` (g1 or g2) ends with `exit` while the other runs:
/// the stop names that rank, the other is killed, and the job as stored is returned.
fn gang_after_a_rank_ended(node: &str, exit: ExitInfo) -> wharf_api::JobRecord {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let id = running(&mut c, 2, gang(2));
    let ended = AgentJob {
        id,
        start_time: Some(1_000),
        exit: Some(exit),
        end_time: Some(3_000),
        stopping: false,
        ready: false,
        time_limit: None,
    };
    let report = PollRequest {
        seq: None,
        node: node.into(),
        jobs: vec![ended],
        ..Default::default()
    };
    c.ingest(&report, 3_000).unwrap();
    let rank = u32::from(node == "g2");
    assert_eq!(
        record(&c, id).stop,
        Some(Stop::RankFailed {
            node: node.into(),
            rank
        })
    );
    let other = if node == "g1" { "g2" } else { "g1" };
    poll(&mut c, other, &[(id, Rank::Killed)], 4_000);
    c.store.job(id).unwrap().unwrap()
}

#[test]
fn a_rank_out_of_memory_ends_the_gang_out_of_memory_naming_it() {
    let oom = ExitInfo {
        signal: Some(9),
        oom: true,
        ..Default::default()
    };
    let done = gang_after_a_rank_ended("g1", oom);
    assert_eq!(done.state, JobState::OutOfMemory);
    let reason = done.reason.unwrap();
    assert!(
        reason.starts_with("rank 0 on node g1: killed by the kernel"),
        "{reason}"
    );
}

#[test]
fn a_rank_past_its_time_limit_ends_the_gang_timeout_naming_it() {
    let late = ExitInfo {
        signal: Some(15),
        timed_out: true,
        ..Default::default()
    };
    let done = gang_after_a_rank_ended("g2", late);
    assert_eq!(done.state, JobState::Timeout);
    let reason = done.reason.unwrap();
    assert!(reason.starts_with("rank 1 on node g2: "), "{reason}");
}

#[test]
fn a_gangs_usage_is_every_nodes() {
    use wharf_api::usage::JobUsage;
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let id = running(&mut c, 2, gang(2));
    for (node, cpu, peak) in [("g1", 4_000, 3 << 20), ("g2", 6_000, 5 << 20)] {
        let ended = AgentJob {
            id,
            start_time: Some(1_000),
            exit: Some(ExitInfo {
                code: Some(0),
                usage: Some(JobUsage {
                    cpu_time_ms: Some(cpu),
                    memory_peak: Some(peak),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            end_time: Some(9_000),
            stopping: false,
            ready: false,
            time_limit: None,
        };
        let report = PollRequest {
            seq: None,
            node: node.into(),
            jobs: vec![ended],
            ..Default::default()
        };
        c.ingest(&report, 9_000).unwrap();
    }
    let done = c.store.job(id).unwrap().unwrap();
    assert_eq!(done.state, JobState::Completed);
    let usage = done.exit.unwrap().usage.unwrap();
    assert_eq!(usage.cpu_time_ms, Some(10_000), "summed");
    assert_eq!(usage.memory_peak, Some(5 << 20), "the most on one node");
    assert_eq!(
        done.allocs[1]
            .exit
            .as_ref()
            .unwrap()
            .usage
            .as_ref()
            .unwrap()
            .cpu_time_ms,
        Some(6_000),
        "each rank's own kept"
    );
}

/// Two tasks of 2 CPUs on each node.
fn two_per_node(nodes: u32) -> JobRequest {
    JobRequest {
        nodes: Some(nodes),
        ntasks_per_node: Some(2),
        cpus: Some(2),
        ..Default::default()
    }
}

#[test]
fn a_node_is_sent_its_tasks_in_one_order_and_the_job_holds_their_cpus_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let ann = caller(1000, "ann");
    let id = submit_job(&mut c, &ann, two_per_node(2), 10).unwrap();
    // A second such job does not fit beside it: each node's 4 CPUs are the first job's.
    let other = submit_job(&mut c, &ann, two_per_node(1), 20).unwrap();
    c.schedule(1_000).unwrap();
    let job = record(&c, id);
    assert_eq!(job.state, JobState::Starting);
    assert_eq!(job.resources.cpus, 4, "per node: 2 tasks of 2 CPUs");
    assert_eq!(job.tasks_per_node(), 2);
    assert_eq!(record(&c, other).state, JobState::Pending);
    for (rank, node) in ["g1", "g2"].into_iter().enumerate() {
        let (launch, _) = c.orders(node, &BTreeSet::new(), &BTreeSet::new(), &BTreeSet::new());
        assert_eq!(launch.len(), 1, "one order per node, whatever its tasks");
        assert_eq!(launch[0].spec.tasks_per_node, 2);
        assert_eq!(launch[0].cpu_ids.len(), 4);
        assert_eq!(launch[0].rendezvous.node_rank, rank as u32);
    }
}

#[test]
fn a_failed_task_stops_every_node_and_the_job_names_its_global_rank() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let id = running(&mut c, 2, two_per_node(2));
    // The second task of the second node (rank 1 * 2 + 1 = 3) exits 7.
    poll(&mut c, "g2", &[(id, Rank::TaskExited(1, 7))], 3_000);
    let job = record(&c, id);
    assert_eq!(
        job.stop,
        Some(Stop::RankFailed {
            node: "g2".into(),
            rank: 3
        })
    );
    let (_, kill) = c.orders("g1", &held(id), &BTreeSet::new(), &BTreeSet::new());
    assert_eq!(kill[0].reason, "rank 3 on node g2 failed");
    poll(&mut c, "g1", &[(id, Rank::Killed)], 4_000);
    let done = c.store.job(id).unwrap().unwrap();
    assert_eq!(done.state, JobState::Failed);
    assert_eq!(done.exit.as_ref().unwrap().code, Some(7));
    let reason = done.reason.clone().unwrap();
    assert!(reason.contains("rank 3 on node g2"), "{reason}");
    let other = crate::visibility::view(&caller(2000, "bob"), done);
    assert_eq!(
        other.reason.as_deref(),
        Some("rank 3 on node g2 failed: exit 7:0")
    );
}

#[test]
fn a_one_node_job_with_two_tasks_fails_naming_the_task_that_failed() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 1, wharf_core::Config::default());
    let id = running(&mut c, 1, two_per_node(1));
    // The node reports once both tasks have ended: task 1 failed, its agent stopped task 0.
    poll(&mut c, "g1", &[(id, Rank::TaskExited(1, 2))], 3_000);
    let done = c.store.job(id).unwrap().unwrap();
    assert_eq!(done.state, JobState::Failed);
    assert_eq!(
        done.stop,
        Some(Stop::RankFailed {
            node: "g1".into(),
            rank: 1
        })
    );
    let reason = done.reason.clone().unwrap();
    assert!(reason.contains("rank 1 on node g1"), "{reason}");
    // Both tasks exiting 0 complete it, one line for the node in the ledger's eyes.
    let id = running(&mut c, 1, two_per_node(1));
    poll(&mut c, "g1", &[(id, Rank::TaskExited(0, 0))], 5_000);
    let done = c.store.job(id).unwrap().unwrap();
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.allocs.len(), 1);
}

/// A launch fault names the task's rank across the job; with two tasks a node, the node it
/// ran on is that rank's node, not the node of that index.
#[test]
fn a_launch_fault_of_a_task_decides_by_the_node_it_ran_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let job = JobRequest {
        ntasks_per_node: Some(2),
        cpus: Some(2),
        ..gang(2)
    };
    let id = submit_job(&mut c, &caller(1000, "ann"), job, 10).unwrap();
    c.schedule(1_000).unwrap();
    let mut rec = record(&c, id);
    assert_eq!(rec.tasks_per_node(), 2);
    // Task 3 (g2's second) could not launch; g1's ranks failed of their own first.
    let failed = ExitInfo {
        code: Some(1),
        ..Default::default()
    };
    rec.allocs[0].exit = Some(failed.clone());
    rec.allocs[1].exit = Some(failed);
    rec.stop = Some(Stop::LaunchFault {
        node: "g2".into(),
        rank: 3,
        fault: wharf_api::fault::FaultCode::Cgroup.into(),
        requeue: false,
    });
    assert_eq!(super::deciding_rank(&rec), 1);
}

/// As `scontrol update TimeLimit=` of a running job: an admin sets it, its owner may only
/// lower it, nothing else of it changes, and its nodes are told until they hold it to it.
#[test]
fn a_running_jobs_time_limit_is_changed_and_its_nodes_are_told() {
    use wharf_api::wire::{LimitOrder, UpdateRequest};
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let id = running(&mut c, 2, gang(2));
    let ann = caller(1000, "ann");
    let mut root = caller(0, "root");
    root.admin = true;
    let time = |t: u64| UpdateRequest {
        time: Some(t),
        ..Default::default()
    };
    let old = record(&c, id).time_limit;
    assert!(
        c.limit_orders("g1", &[(id, old)]).is_empty(),
        "nothing changed"
    );
    // Its owner may not raise it; an admin may.
    let err = c.update(&ann, id, &time(old + 60), 2_000).unwrap_err();
    assert_eq!(err.kind, ErrorKind::PermissionDenied, "{}", err.message);
    assert_eq!(
        c.update(&root, id, &time(old * 2), 2_000)
            .unwrap()
            .time_limit,
        old * 2
    );
    let job = record(&c, id);
    assert_eq!(
        (job.state, job.spec.unwrap().time_limit),
        (JobState::Running, old * 2)
    );
    // Each node is told while it reports the old limit, and no more once it holds the new.
    for node in ["g1", "g2"] {
        assert_eq!(
            c.limit_orders(node, &[(id, old)]),
            [LimitOrder {
                id,
                time_limit: old * 2
            }]
        );
        assert!(c.limit_orders(node, &[(id, old * 2)]).is_empty());
    }
    assert!(
        c.limit_orders("g3", &[(id, old)]).is_empty(),
        "not its node"
    );
    // UNLIMITED never lowers it: past the site's maximum by an admin, it keeps that.
    let past = JobDefaults::default().max_time * 2;
    c.update(&root, id, &time(past), 2_000).unwrap();
    let unlimited = time(wharf_api::UNLIMITED_TIME);
    assert_eq!(
        c.update(&ann, id, &unlimited, 2_000).unwrap().time_limit,
        past
    );
    // Moved by +/- as scontrol's TimeLimit=+N: from the limit it has.
    let by = |d: i64| UpdateRequest {
        time_delta: Some(d),
        ..Default::default()
    };
    assert_eq!(
        c.update(&root, id, &by(600), 2_000).unwrap().time_limit,
        past + 600
    );
    assert_eq!(
        c.update(&ann, id, &by(-600), 2_000).unwrap().time_limit,
        past
    );
    assert_eq!(
        c.update(&ann, id, &by(600), 2_000).unwrap_err().kind,
        ErrorKind::PermissionDenied
    );
    let gone = c.update(&root, id, &by(-(past as i64)), 2_000).unwrap_err();
    assert!(gone.message.contains("leaves none"), "{}", gone.message);
    // Its owner may lower it.
    assert_eq!(c.update(&ann, id, &time(60), 2_000).unwrap().time_limit, 60);
    // Nothing else of a running job changes.
    let nice = UpdateRequest {
        nice: Some(5),
        ..Default::default()
    };
    let err = c.update(&ann, id, &nice, 2_000).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Conflict);
    assert!(
        err.message.contains("only its time limit"),
        "{}",
        err.message
    );
    // Once it is being stopped, neither its limit nor its orders.
    c.cancel(&ann, id, 2_500).unwrap();
    assert_eq!(
        c.update(&root, id, &time(old), 2_600).unwrap_err().kind,
        ErrorKind::Conflict
    );
    assert!(c.limit_orders("g1", &[(id, old)]).is_empty());
}

/// A gang that takes each node's whole memory (`--mem=0`) is launched on each node with
/// that node's memory, not its first node's: the nodes of a gang need not be alike.
#[test]
fn each_node_of_a_whole_memory_gang_is_launched_with_its_own_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    c.register(NodeInfo::new("g2", "10.0.0.2", 4, 8 << 30, vec![]), 0)
        .unwrap();
    let whole = JobRequest {
        memory: Some(0),
        ..gang(2)
    };
    let id = submit_job(&mut c, &caller(1000, "ann"), whole, 10).unwrap();
    c.schedule(1_000).unwrap();
    assert_eq!(record(&c, id).state, JobState::Starting);
    for (node, memory) in [("g1", 16u64 << 30), ("g2", 8 << 30)] {
        let (launch, _) = c.orders(node, &BTreeSet::new(), &BTreeSet::new(), &BTreeSet::new());
        assert_eq!(launch.len(), 1, "{node}");
        assert_eq!(launch[0].spec.resources.memory, memory, "{node}");
    }
}

#[test]
fn a_once_jobs_other_nodes_hold_on_until_its_script_ends_and_the_job_ends_as_it_did() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 3, wharf_core::Config::default());
    let once = |nodes| JobRequest {
        once: Some(true),
        ..gang(nodes)
    };
    // Its orders say the controller stops what holds its other nodes; a plain gang's do not.
    for (req, stops) in [(once(2), true), (gang(2), false)] {
        let dir = tempfile::tempdir().unwrap();
        let mut fresh = gang_cluster(&dir, 2, wharf_core::Config::default());
        submit_job(&mut fresh, &caller(1000, "ann"), req, 10).unwrap();
        fresh.schedule(1_000).unwrap();
        let none = BTreeSet::new();
        let (launch, _) = fresh.orders("g2", &none, &none, &none);
        assert_eq!(launch.len(), 1);
        assert_eq!(launch[0].stops_holders, stops);
    }
    let id = running(&mut c, 2, once(2));
    // The script ends with 0 on g1; g2, which ran nothing of its own, is told to stop.
    let seen = ingest(&mut c, "g1", &[(id, Rank::Exited(0))], 3_000);
    assert_eq!(seen.wake, BTreeSet::from(["g2".into()]));
    let job = record(&c, id);
    assert_eq!(job.state, JobState::Running);
    assert_eq!(job.stop, Some(Stop::BatchEnded { node: "g1".into() }));
    let (_, kill) = c.orders("g2", &held(id), &BTreeSet::new(), &BTreeSet::new());
    assert_eq!(kill[0].reason, "the batch script ended on node g1");
    poll(&mut c, "g2", &[(id, Rank::Killed)], 4_000);
    let done = c.store.job(id).unwrap().unwrap();
    assert_eq!(done.state, JobState::Completed, "{:?}", done.reason);
    assert_eq!(done.exit.as_ref().unwrap().code_signal(), "0:0");
    // A script that fails ends the job as it did.
    let id = running(&mut c, 2, once(2));
    ingest(&mut c, "g1", &[(id, Rank::Exited(3))], 5_000);
    poll(&mut c, "g2", &[(id, Rank::Killed)], 5_500);
    let done = c.store.job(id).unwrap().unwrap();
    assert_eq!(done.state, JobState::Failed);
    assert_eq!(done.exit.as_ref().unwrap().code, Some(3));
    // While the script runs, a silent holding node is the job's loss.
    let id = running(&mut c, 2, once(2));
    poll(&mut c, "g1", &[(id, Rank::Running)], TIMEOUT);
    c.check_nodes(TIMEOUT + 2_000).unwrap();
    let job = record(&c, id);
    assert!(
        matches!(&job.stop, Some(Stop::NodeLost { node, .. }) if node == "g2"),
        "{:?}",
        job.stop
    );
    // Without once, a rank that ends with 0 stops none of the others.
    let dir = tempfile::tempdir().unwrap();
    let mut c = gang_cluster(&dir, 2, wharf_core::Config::default());
    let id = running(&mut c, 2, gang(2));
    ingest(&mut c, "g1", &[(id, Rank::Exited(0))], 3_000);
    assert_eq!(record(&c, id).stop, None);
}
