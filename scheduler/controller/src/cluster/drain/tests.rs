//! Launch faults: a node fault drains the node and requeues the job (or ends it NODE_FAIL), a
//! job fault fails the job, an outage requeues it; for one-node jobs and gangs.

use std::collections::BTreeSet;

use wharf_api::fault::{FaultCode, LaunchFault};
use wharf_api::wire::{AgentJob, ErrorKind, NodeStateChange, NodeStateRequest, PollRequest};
use wharf_api::{
    ExitInfo, JobDefaults, JobId, JobRecord, JobRequest, JobState, NodeInfo, NodeState, Stop,
};

use crate::cluster::sched::tests::{caller, submit_job};
use crate::cluster::{Caller, Cluster};
use crate::store::Store;

/// Nodes `g1`, `g2`, ... with 4 CPUs and 16 GiB each.
pub(crate) fn nodes(dir: &tempfile::TempDir, n: u32) -> Cluster {
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), 60_000, 0).unwrap();
    for i in 1..=n {
        let name = format!("g{i}");
        c.register(NodeInfo::new(&name, &name, 4, 16 << 30, vec![]), 0)
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

/// The job as its owner sees it, active or ended.
fn job(c: &Cluster, id: JobId) -> JobRecord {
    c.job(&admin(), id).unwrap()
}

fn node_state(c: &Cluster, name: &str) -> (NodeState, Option<String>) {
    let n = c.nodes().into_iter().find(|n| n.info.name == name).unwrap();
    (n.state, n.reason)
}

/// What an agent says of one job it holds.
enum Says {
    /// Running since 1 s.
    Running,
    /// Its launch failed with this code and these words.
    Failed(FaultCode, &'static str),
    /// Ended by a kill order.
    Killed,
}

fn poll(c: &mut Cluster, node: &str, jobs: Vec<(JobId, Says)>, now: u64) -> Vec<JobId> {
    let jobs = jobs
        .into_iter()
        .map(|(id, says)| {
            let (start_time, exit) = match says {
                Says::Running => (Some(1_000), None),
                Says::Failed(code, words) => (
                    None,
                    Some(ExitInfo {
                        message: Some(words.into()),
                        fault: Some(LaunchFault::new(code)),
                        ..Default::default()
                    }),
                ),
                Says::Killed => (
                    Some(1_000),
                    Some(ExitInfo {
                        signal: Some(15),
                        cancelled: true,
                        ..Default::default()
                    }),
                ),
            };
            AgentJob {
                id,
                start_time,
                end_time: exit.as_ref().map(|_| now),
                exit,
                stopping: false,
                ready: false,
                time_limit: None,
            }
        })
        .collect();
    let report = PollRequest {
        seq: None,
        node: node.into(),
        jobs,
        ..Default::default()
    };
    c.ingest(&report, now).unwrap().forget
}

/// Submits a job of `nodes` whole nodes and schedules it; returns it and its nodes.
pub(crate) fn started(
    c: &mut Cluster,
    nodes: u32,
    requeue: bool,
    now: u64,
) -> (JobId, Vec<String>) {
    let req = JobRequest {
        nodes: Some(nodes),
        cpus: Some(4),
        requeue: Some(requeue),
        ..Default::default()
    };
    let id = submit_job(c, &caller(1000, "ann"), req, now).unwrap();
    c.schedule(now + 1).unwrap();
    let j = job(c, id);
    assert_eq!(j.state, JobState::Starting, "{j:?}");
    (id, j.nodes().map(str::to_string).collect())
}

const CGROUP: &str = "creating cgroup /sys/fs/cgroup/wharf/job-1: Permission denied";

#[test]
fn a_node_fault_drains_the_node_and_requeues_the_job_elsewhere_keeping_its_submit_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 2);
    let (id, on) = started(&mut c, 1, true, 10);
    let bad = on[0].clone();
    let submit_time = job(&c, id).submit_time;
    let forget = poll(
        &mut c,
        &bad,
        vec![(id, Says::Failed(FaultCode::Cgroup, CGROUP))],
        2_000,
    );
    assert_eq!(forget, vec![id]);
    let (state, reason) = node_state(&c, &bad);
    assert_eq!(state, NodeState::Drain);
    let reason = reason.unwrap();
    assert!(
        reason.contains(&format!("launch of job {id} failed (cgroup)")) && reason.contains(CGROUP),
        "{reason}"
    );
    let j = job(&c, id);
    assert_eq!(j.state, JobState::Pending, "{j:?}");
    assert_eq!(j.submit_time, submit_time);
    assert_eq!((j.restarts, j.launch_faults), (1, 1));
    assert!(
        j.reason.as_deref().unwrap().contains("node fault: cgroup"),
        "{j:?}"
    );
    // The agent lets go of the failed run; the job then starts on the other node only.
    poll(&mut c, &bad, vec![], 3_000);
    c.schedule(3_001).unwrap();
    let j = job(&c, id);
    assert_eq!(j.state, JobState::Starting, "{j:?}");
    assert!(j.nodes().all(|n| n != bad), "{j:?}");
    // A node restart does not mend it: the drain stays until an admin resumes the node.
    c.register(NodeInfo::new(&bad, &bad, 4, 16 << 30, vec![]), 4_000)
        .unwrap();
    assert_eq!(node_state(&c, &bad).0, NodeState::Drain);
}

#[test]
fn a_drain_outlives_a_controller_restart_and_an_admin_resumes_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 1);
    let (id, _) = started(&mut c, 1, true, 10);
    poll(
        &mut c,
        "g1",
        vec![(
            id,
            Says::Failed(
                FaultCode::Device,
                "GPU 0 was allocated but /dev/nvidia0: missing",
            ),
        )],
        2_000,
    );
    drop(c);
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), 60_000, 5_000).unwrap();
    let (state, reason) = node_state(&c, "g1");
    assert_eq!(state, NodeState::Drain);
    assert!(reason.unwrap().contains("(device)"));
    poll(&mut c, "g1", vec![], 5_100);
    c.schedule(5_200).unwrap();
    assert_eq!(
        job(&c, id).state,
        JobState::Pending,
        "nothing runs on a drained node"
    );

    let resume = NodeStateRequest {
        state: NodeStateChange::Resume,
        reason: None,
    };
    let refused = c
        .set_node_state(&caller(1000, "ann"), "g1", &resume, 5_300)
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::PermissionDenied);
    let node = c.set_node_state(&admin(), "g1", &resume, 5_300).unwrap();
    assert_eq!((node.state, node.reason), (NodeState::Up, None));
    c.schedule(5_400).unwrap();
    assert_eq!(job(&c, id).state, JobState::Starting);

    // An admin's drain needs a reason, and names who drained it.
    let drain = |reason: Option<&str>| NodeStateRequest {
        state: NodeStateChange::Drain,
        reason: reason.map(str::to_string),
    };
    let refused = c
        .set_node_state(&admin(), "g1", &drain(None), 5_500)
        .unwrap_err();
    assert_eq!(refused.kind, ErrorKind::InvalidInput);
    let node = c
        .set_node_state(&admin(), "g1", &drain(Some("bad DIMM")), 5_500)
        .unwrap();
    assert_eq!(node.state, NodeState::Drain);
    assert_eq!(node.reason.as_deref(), Some("bad DIMM [by root]"));
    let missing = c
        .set_node_state(&admin(), "g9", &drain(Some("x")), 5_500)
        .unwrap_err();
    assert_eq!(missing.kind, ErrorKind::NotFound);
}

#[test]
fn a_node_fault_of_a_no_requeue_job_ends_it_node_fail_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 2);
    let (id, on) = started(&mut c, 1, false, 10);
    poll(
        &mut c,
        &on[0],
        vec![(id, Says::Failed(FaultCode::Cgroup, CGROUP))],
        2_000,
    );
    let j = job(&c, id);
    assert_eq!(j.state, JobState::NodeFail, "{j:?}");
    let reason = j.reason.unwrap();
    assert!(
        reason.contains(CGROUP) && reason.contains("--no-requeue"),
        "{reason}"
    );
    assert_eq!(node_state(&c, &on[0]).0, NodeState::Drain);
}

#[test]
fn a_job_fault_fails_the_job_and_leaves_the_node_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 1);
    let (id, _) = started(&mut c, 1, true, 10);
    let words = "starting the container: command not found in the image: nope";
    poll(
        &mut c,
        "g1",
        vec![(id, Says::Failed(FaultCode::Command, words))],
        2_000,
    );
    let j = job(&c, id);
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    assert_eq!(j.reason.as_deref(), Some(words));
    assert_eq!(j.restarts, 0);
    assert_eq!(node_state(&c, "g1"), (NodeState::Up, None));
}

#[test]
fn an_outage_requeues_the_job_without_draining_and_a_job_stops_after_its_last_try() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 1);
    let (id, _) = started(&mut c, 1, true, 10);
    let words = "pulling image r.example/x:1 on node g1: cannot reach the registry";
    let mut now = 1_000;
    for attempt in 1..=wharf_api::job::MAX_LAUNCH_FAULTS + 1 {
        now += 1_000;
        poll(
            &mut c,
            "g1",
            vec![(id, Says::Failed(FaultCode::RegistryUnreachable, words))],
            now,
        );
        assert_eq!(node_state(&c, "g1"), (NodeState::Up, None));
        let j = job(&c, id);
        if attempt <= wharf_api::job::MAX_LAUNCH_FAULTS {
            assert_eq!(j.state, JobState::Pending, "attempt {attempt}: {j:?}");
            poll(&mut c, "g1", vec![], now + 1);
            c.schedule(now + 2).unwrap();
            assert_eq!(job(&c, id).state, JobState::Starting);
        } else {
            assert_eq!(j.state, JobState::Failed, "{j:?}");
            let reason = j.reason.unwrap();
            assert!(
                reason.contains(words) && reason.contains("after 4 failed launches"),
                "{reason}"
            );
        }
    }
}

#[test]
fn a_node_fault_in_a_gang_drains_that_node_and_requeues_the_whole_gang() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 3);
    let (id, on) = started(&mut c, 2, true, 10);
    let (good, bad) = (on[0].clone(), on[1].clone());
    poll(&mut c, &good, vec![(id, Says::Running)], 1_500);
    poll(
        &mut c,
        &bad,
        vec![(id, Says::Failed(FaultCode::Namespaces, "clone3: EPERM"))],
        2_000,
    );
    assert_eq!(node_state(&c, &bad).0, NodeState::Drain);
    assert_eq!(node_state(&c, &good).0, NodeState::Up);
    let j = job(&c, id);
    assert!(
        matches!(&j.stop, Some(Stop::LaunchFault { node, rank: 1, requeue: true, .. }) if *node == bad),
        "{j:?}"
    );
    // The rank that runs is told to stop.
    let (_, kill) = c.orders(
        &good,
        &BTreeSet::from([id]),
        &BTreeSet::new(),
        &BTreeSet::new(),
    );
    assert_eq!(kill.len(), 1, "{kill:?}");
    poll(&mut c, &good, vec![(id, Says::Killed)], 2_500);
    let j = job(&c, id);
    assert_eq!(j.state, JobState::Pending, "{j:?}");
    assert!(j.allocs.is_empty());
    // Let go everywhere: it starts again on two nodes, the drained one not among them.
    poll(&mut c, &good, vec![], 3_000);
    poll(&mut c, &bad, vec![], 3_000);
    c.schedule(3_100).unwrap();
    let j = job(&c, id);
    assert_eq!(j.state, JobState::Starting, "{j:?}");
    assert!(j.nodes().all(|n| n != bad), "{j:?}");
}

#[test]
fn a_job_fault_in_a_gang_fails_the_whole_gang_naming_rank_and_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 2);
    let (id, on) = started(&mut c, 2, true, 10);
    poll(&mut c, &on[0], vec![(id, Says::Running)], 1_500);
    let words = "starting the container: entering the working directory /nope: ENOENT";
    poll(
        &mut c,
        &on[1],
        vec![(id, Says::Failed(FaultCode::Workdir, words))],
        2_000,
    );
    poll(&mut c, &on[0], vec![(id, Says::Killed)], 2_500);
    let j = job(&c, id);
    assert_eq!(j.state, JobState::Failed, "{j:?}");
    assert_eq!(
        j.reason.as_deref(),
        Some(format!("rank 1 on node {}: {words}", on[1]).as_str())
    );
    for n in &on {
        assert_eq!(node_state(&c, n), (NodeState::Up, None));
    }
}

#[test]
fn a_fault_reported_by_an_older_agent_or_after_a_start_drains_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 1);
    let (id, _) = started(&mut c, 1, true, 10);
    // A run that started, then ended with a fault attached, ended as its job did.
    let report = PollRequest {
        seq: None,
        node: "g1".into(),
        jobs: vec![AgentJob {
            id,
            start_time: Some(1_000),
            end_time: Some(2_000),
            exit: Some(ExitInfo {
                code: Some(1),
                fault: Some(LaunchFault::new(FaultCode::Cgroup)),
                ..Default::default()
            }),
            stopping: false,
            ready: false,
            time_limit: None,
        }],
        wait_ms: 0,
        images: vec![],
        pulling: vec![],
        prepulls: vec![],
        steps: vec![],
        signalled: vec![],
    };
    c.ingest(&report, 2_000).unwrap();
    assert_eq!(job(&c, id).state, JobState::Failed);
    assert_eq!(node_state(&c, "g1"), (NodeState::Up, None));
    // An agent without faults sends none: its launch failure fails the job, as before.
    let exit: ExitInfo = serde_json::from_str(
        r#"{"code":null,"signal":null,"oom":false,"timed_out":false,"cancelled":false,"message":"x"}"#,
    )
    .unwrap();
    assert_eq!(exit.fault, None);
}

/// A poll from `node` holding `running` (started) and pulling the images of `pulling`
/// (job, layers done).
pub(crate) fn poll_pulling(
    c: &mut Cluster,
    node: &str,
    running: &[JobId],
    pulling: &[(JobId, u64)],
) {
    let report = PollRequest {
        seq: None,
        node: node.into(),
        jobs: running
            .iter()
            .map(|&id| AgentJob {
                id,
                start_time: Some(1_000),
                exit: None,
                end_time: None,
                stopping: false,
                ready: false,
                time_limit: None,
            })
            .collect(),
        pulling: pulling
            .iter()
            .map(|&(job, done)| wharf_api::PullProgress {
                job,
                node: "forged".into(),
                image: "127.0.0.1:5000/test/app:v1".into(),
                layers_done: done,
                layers: 14,
                bytes_done: done * 600_000_000,
                bytes: 8_400_000_000,
            })
            .collect(),
        ..Default::default()
    };
    c.ingest(&report, 2_000).unwrap();
}

#[test]
fn pull_progress_is_kept_per_node_while_the_job_starts_and_shown_to_its_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 2);
    let (id, on) = started(&mut c, 2, false, 10);
    let pulls = |c: &Cluster| -> Vec<(String, u64)> {
        job(c, id)
            .pulling
            .iter()
            .map(|p| (p.node.clone(), p.layers_done))
            .collect()
    };
    // A job the node does not run here is not taken in.
    poll_pulling(&mut c, &on[0], &[], &[(id, 3), (id + 100, 1)]);
    assert_eq!(pulls(&c), [(on[0].clone(), 3)]);
    let p = job(&c, id).pulling[0].clone();
    assert_eq!(
        p.describe(),
        "pulling 127.0.0.1:5000/test/app:v1: 1.8 of 8.4 GB, 3 of 14 layers"
    );
    // Its owner sees it in the listing too; another user sees neither it nor the image.
    let listed = c.list(&caller(1000, "ann"), 0, None, true).unwrap();
    assert_eq!(listed.iter().find(|j| j.id == id).unwrap().pulling.len(), 1);
    let other = c.job(&caller(1001, "bob"), id).unwrap();
    assert!(other.pulling.is_empty());
    // The next report replaces the node's entry; the other node's comes beside it.
    poll_pulling(&mut c, &on[0], &[], &[(id, 5)]);
    poll_pulling(&mut c, &on[1], &[], &[(id, 1)]);
    assert_eq!(pulls(&c), [(on[0].clone(), 5), (on[1].clone(), 1)]);
    // Never in the job's record itself.
    assert!(c.jobs.get(&id).unwrap().pulling.is_empty());
    // The first node started its rank: its pull is over; the job waits for the other.
    poll_pulling(&mut c, &on[0], &[id], &[]);
    assert_eq!(job(&c, id).state, JobState::Starting);
    assert_eq!(pulls(&c), [(on[1].clone(), 1)]);
    // Once it runs, nothing is left of its pulls, even if a late report names it.
    poll_pulling(&mut c, &on[1], &[id], &[(id, 14)]);
    assert_eq!(job(&c, id).state, JobState::Running);
    assert!(pulls(&c).is_empty());
    assert!(c.pulls.is_empty());
}
