use std::collections::BTreeSet;

use wharf_api::step::{AgentStep, StepKey, StepMemory, StepRecord, StepRequest, StepStart};
use wharf_api::step_input::StepInput;
use wharf_api::wire::{AgentJob, ErrorKind, PollRequest};
use wharf_api::{ExitInfo, JobDefaults, JobId, JobRequest, JobState, NodeInfo};

use crate::cluster::sched::tests::{caller, record, submit_job};
use crate::cluster::Cluster;
use crate::store::Store;

/// Nodes `g1`..`gN`, 4 CPUs each.
/// A cluster of `n` nodes g1, g2, ... with 4 CPUs and 16 GiB each.
pub(crate) fn nodes(dir: &tempfile::TempDir, n: u32) -> Cluster {
    let store = Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load_with_scheduler(
        store,
        JobDefaults::default(),
        60_000,
        0,
        wharf_core::Config::default(),
    )
    .unwrap();
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

pub(crate) fn report(
    c: &mut Cluster,
    node: &str,
    jobs: &[(JobId, Option<i32>)],
    steps: Vec<AgentStep>,
) {
    let jobs = jobs
        .iter()
        .map(|&(id, code)| AgentJob {
            id,
            start_time: Some(1_000),
            exit: code.map(|code| ExitInfo {
                code: Some(code),
                ..Default::default()
            }),
            end_time: code.map(|_| 3_000),
            stopping: false,
            ready: false,
            time_limit: None,
        })
        .collect();
    let poll = PollRequest {
        seq: None,
        node: node.into(),
        jobs,
        steps: steps.clone(),
        ..Default::default()
    };
    c.ingest(&poll, 2_000).unwrap();
    c.ingest_steps(node, &steps, 2_000).unwrap();
}

/// A running job of uid 1000 on `n` nodes, 4 CPUs on each.
pub(crate) fn running(c: &mut Cluster, n: u32) -> JobId {
    let id = submit_job(
        c,
        &caller(1000, "ann"),
        JobRequest {
            nodes: Some(n),
            cpus: Some(4),
            ..Default::default()
        },
        10,
    )
    .unwrap();
    c.schedule(1_000).unwrap();
    for i in 1..=n {
        report(c, &format!("g{i}"), &[(id, None)], vec![]);
    }
    assert_eq!(record(c, id).state, JobState::Running);
    id
}

/// Step `request` asked for from `node` by `uid` in `job`, running `/bin/true`.
pub(crate) fn ask(job: JobId, node: &str, uid: u32, request: StepRequest) -> StepStart {
    StepStart {
        node: node.into(),
        job,
        uid,
        wait_ms: 0,
        request: StepRequest {
            argv: vec!["/bin/true".into()],
            env: [
                ("OMP_NUM_THREADS".into(), "4".into()),
                ("RANK".into(), "9".into()),
            ]
            .into(),
            ..request
        },
    }
}

/// The step a start returned; panics for one that waits (for GPUs these tests never hold).
pub(crate) fn started(o: crate::cluster::steps::StepOutcome) -> StepRecord {
    match o {
        crate::cluster::steps::StepOutcome::Started(s) => *s,
        crate::cluster::steps::StepOutcome::Waits(b) => panic!("the step waits for GPUs: {b}"),
    }
}

pub(crate) fn step_report(job: JobId, step: u32, exit: Option<ExitInfo>) -> AgentStep {
    AgentStep {
        key: StepKey { job, step },
        start_time: Some(1_500),
        end_time: exit.as_ref().map(|_| 2_000),
        exit,
        stopping: false,
        input_closed: vec![],
    }
}

pub(crate) fn code(code: i32, task: u32) -> Option<ExitInfo> {
    Some(ExitInfo {
        code: Some(code),
        task: Some(task),
        ..Default::default()
    })
}

#[test]
fn steps_get_their_jobs_next_id_and_run_where_they_ask_within_the_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 3);
    let id = running(&mut c, 3);
    let all = c
        .start_step(ask(id, "g1", 1000, StepRequest::default()), 2_000)
        .map(started)
        .unwrap();
    assert_eq!((all.id, all.nodes.len(), all.tasks_per_node), (0, 3, 1));
    let two = StepRequest {
        nodes: Some(2),
        ntasks_per_node: Some(4),
        ..Default::default()
    };
    let two = c
        .start_step(ask(id, "g2", 1000, two), 2_000)
        .map(started)
        .unwrap();
    assert_eq!((two.id, two.ntasks()), (1, 8));
    let listed = StepRequest {
        nodelist: Some("g3".into()),
        ntasks: Some(2),
        ..Default::default()
    };
    let listed = c
        .start_step(ask(id, "g1", 1000, listed), 2_000)
        .map(started)
        .unwrap();
    assert_eq!(listed.nodes[0].node, "g3");
    assert_eq!(listed.tasks_per_node, 2);
    // Recorded with the job, durably.
    assert_eq!(record(&c, id).steps.len(), 3);
    // g3's orders: steps 0 and 2, ranked within each step; the step's env names the step.
    let (orders, kills) = c.step_orders("g3", &BTreeSet::new(), &BTreeSet::new());
    assert!(kills.is_empty());
    let got: Vec<(u32, u32, usize)> = orders
        .iter()
        .map(|o| {
            (
                o.step,
                o.order.rendezvous.node_rank,
                o.order.rendezvous.nodes.len(),
            )
        })
        .collect();
    assert_eq!(got, [(0, 2, 3), (2, 0, 1)]);
    // The step's place goes with the rendezvous: the agent writes SLURM_STEP_* from it, and
    // keeps SLURM_JOB_NODELIST and the rest the job's.
    let place = orders[1]
        .order
        .rendezvous
        .step
        .as_ref()
        .expect("a step's place");
    assert_eq!(place.id, 2);
    assert_eq!(place.job_nodes, ["g1", "g2", "g3"]);
    assert_eq!(orders[1].order.rendezvous.nodes.len(), 1);
    // Also in the order's environment, for agents from before the step's place: a newer
    // agent's own values replace them.
    assert_eq!(orders[1].order.spec.env["SLURM_STEP_ID"], "2");
    assert_eq!(orders[1].order.spec.env["SLURM_STEP_NODELIST"], "g3");
    // The caller's environment goes on, less the variables that place a task.
    assert_eq!(orders[1].order.spec.env["OMP_NUM_THREADS"], "4");
    assert!(!orders[1].order.spec.env.contains_key("RANK"));
    assert!(orders[1].order.spec.output.ends_with(".step2"));
    assert_eq!(orders[1].order.spec.tasks_per_node, 2);
    // Its two tasks share g3's 4 CPUs: 2 each, told so.
    assert_eq!(orders[1].order.spec.resources.cpus, 4);
    assert_eq!(orders[1].order.spec.cpus_per_task(), 2);
    assert_eq!(orders[1].input, StepInput::None);
    // `-c 1` and `--input all`: one CPU each (of the node's four), all tasks read the input.
    let narrow = StepRequest {
        nodelist: Some("g3".into()),
        ntasks: Some(2),
        cpus_per_task: Some(1),
        input: StepInput::All,
        ..Default::default()
    };
    let narrow = c
        .start_step(ask(id, "g1", 1000, narrow), 2_000)
        .map(started)
        .unwrap();
    assert_eq!(
        (narrow.cpus_per_task, narrow.input),
        (Some(1), StepInput::All)
    );
    let (orders, _) = c.step_orders("g3", &BTreeSet::new(), &BTreeSet::new());
    let o = orders.iter().find(|o| o.step == narrow.id).unwrap();
    assert_eq!(o.order.spec.cpus_per_task(), 1);
    assert_eq!(o.order.cpu_ids.len(), 4, "the node's CPUs to choose from");
    assert_eq!(o.cpus_per_task, Some(1));
    assert_eq!(orders[0].cpus_per_task, None);
    assert_eq!(o.input, StepInput::All);
}

#[test]
fn a_step_of_a_starting_job_goes_to_each_node_once_the_job_started_there() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 2);
    let id = submit_job(
        &mut c,
        &caller(1000, "ann"),
        JobRequest {
            nodes: Some(2),
            cpus: Some(4),
            ..Default::default()
        },
        10,
    )
    .unwrap();
    c.schedule(1_000).unwrap();
    // g1 started (its rank 0 asks for the step); g2 is still pulling the image.
    report(&mut c, "g1", &[(id, None)], vec![]);
    assert_eq!(record(&c, id).state, JobState::Starting);
    c.start_step(ask(id, "g1", 1000, StepRequest::default()), 2_000)
        .map(started)
        .unwrap();
    let none = BTreeSet::new();
    assert_eq!(c.step_orders("g1", &none, &none).0.len(), 1);
    assert!(c.step_orders("g2", &none, &none).0.is_empty());
    report(&mut c, "g2", &[(id, None)], vec![]);
    assert_eq!(c.step_orders("g2", &none, &none).0.len(), 1);
}

#[test]
fn a_step_outside_the_callers_job_or_allocation_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 3);
    let id = running(&mut c, 2);
    let refused = |c: &mut Cluster, s: StepStart| c.start_step(s, 2_000).map(started).unwrap_err();
    let other_user = refused(&mut c, ask(id, "g1", 1001, StepRequest::default()));
    assert_eq!(other_user.kind, ErrorKind::PermissionDenied);
    assert!(
        other_user.message.contains("another user"),
        "{other_user:?}"
    );
    let other_job = StepRequest {
        job: Some(id + 7),
        ..Default::default()
    };
    let e = refused(&mut c, ask(id, "g1", 1000, other_job));
    assert!(e.message.contains(&format!("inside job {id}")), "{e:?}");
    let e = refused(&mut c, ask(id, "g3", 1000, StepRequest::default()));
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    let too_many = StepRequest {
        ntasks_per_node: Some(5),
        ..Default::default()
    };
    let e = refused(&mut c, ask(id, "g1", 1000, too_many));
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    assert!(e.message.contains("4 CPU(s)"), "{e:?}");
    let gpus = StepRequest {
        gpus_per_task: Some(1),
        ..Default::default()
    };
    let e = refused(&mut c, ask(id, "g1", 1000, gpus));
    assert!(e.message.contains("1 GPU(s) on node g1 but job"), "{e:?}");
    assert!(e.message.contains("has 0 there"), "{e:?}");
    let outside = StepRequest {
        nodelist: Some("g3".into()),
        ..Default::default()
    };
    assert!(refused(&mut c, ask(id, "g1", 1000, outside))
        .message
        .contains("not one of"));
    let uneven = StepRequest {
        ntasks: Some(3),
        nodes: Some(2),
        ..Default::default()
    };
    assert!(refused(&mut c, ask(id, "g1", 1000, uneven))
        .message
        .contains("evenly"));
    let wide = StepRequest {
        ntasks_per_node: Some(2),
        cpus_per_task: Some(3),
        ..Default::default()
    };
    let e = refused(&mut c, ask(id, "g1", 1000, wide));
    assert!(e.message.contains("2 task(s) with 3 CPU(s) each"), "{e:?}");
    let input = StepRequest {
        ntasks: Some(2),
        input: StepInput::Task(2),
        ..Default::default()
    };
    let e = refused(&mut c, ask(id, "g1", 1000, input));
    assert!(
        e.message.contains("--input 2: the step has 2 task(s)"),
        "{e:?}"
    );
    // Nothing of these was recorded.
    assert!(record(&c, id).steps.is_empty());
    // Once the job has ended, no more steps.
    report(&mut c, "g1", &[(id, Some(0))], vec![]);
    report(&mut c, "g2", &[(id, Some(0))], vec![]);
    let e = refused(&mut c, ask(id, "g1", 1000, StepRequest::default()));
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(
        e.message.contains("is not running: it ended COMPLETED"),
        "{e:?}"
    );
}

#[test]
fn a_failing_task_stops_the_step_elsewhere_and_decides_its_exit() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 2);
    let id = running(&mut c, 2);
    let req = StepRequest {
        ntasks_per_node: Some(2),
        ..Default::default()
    };
    let step = c
        .start_step(ask(id, "g1", 1000, req), 2_000)
        .map(started)
        .unwrap();
    let key = StepKey { job: id, step: 0 };
    report(&mut c, "g1", &[(id, None)], vec![step_report(id, 0, None)]);
    report(&mut c, "g2", &[(id, None)], vec![step_report(id, 0, None)]);
    let started = c.step(key).unwrap();
    assert!(started.start_time.is_some());
    assert!(started.env.is_empty() && !started.argv.is_empty());
    // Task 1 of g2 (global rank 3) exits 7: g1 is told to stop its tasks.
    let (forget, wake) = c
        .ingest_steps("g2", &[step_report(id, 0, code(7, 1))], 2_500)
        .unwrap();
    assert_eq!(forget, [key]);
    assert_eq!(wake, BTreeSet::from(["g1".to_string()]));
    let (_, kills) = c.step_orders("g1", &BTreeSet::from([key]), &BTreeSet::new());
    assert_eq!(kills.len(), 1);
    assert!(kills[0].reason.contains("task 3"), "{kills:?}");
    let killed = Some(ExitInfo {
        signal: Some(15),
        cancelled: true,
        ..Default::default()
    });
    c.ingest_steps("g1", &[step_report(id, 0, killed)], 2_600)
        .unwrap();
    let ended: StepRecord = c.step(key).unwrap();
    assert_eq!(ended.state(), JobState::Failed);
    assert_eq!(ended.exit_status(), 7);
    let msg = ended.exit.as_ref().unwrap().message.clone().unwrap();
    assert!(msg.starts_with("task 3 on node g2"), "{msg}");
    // The job goes on.
    assert_eq!(record(&c, id).state, JobState::Running);
    let _ = step;
}

#[test]
fn a_step_takes_its_own_time_limit_within_what_the_job_has_left() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 1);
    let id = running(&mut c, 1);
    let left = record(&c, id).time_limit - 1;
    let asked = |t| StepRequest {
        time_limit: Some(t),
        ..Default::default()
    };
    let step = c
        .start_step(ask(id, "g1", 1000, asked(60)), 2_000)
        .map(started)
        .unwrap();
    assert_eq!((step.time_limit, step.own_time_limit), (60, true));
    // The job's order for it says so, for the agent to leave it be when the job's changes.
    let (launch, _) = c.step_orders("g1", &BTreeSet::new(), &BTreeSet::new());
    assert_eq!(launch[0].order.spec.time_limit, 60);
    assert!(launch[0].own_time_limit);
    // More than the job has left is the job's, which its changes move.
    let step = c
        .start_step(ask(id, "g1", 1000, asked(10 * left)), 2_000)
        .map(started)
        .unwrap();
    assert_eq!((step.time_limit, step.own_time_limit), (left, false));
    let step = c
        .start_step(ask(id, "g1", 1000, StepRequest::default()), 2_000)
        .map(started)
        .unwrap();
    assert_eq!((step.time_limit, step.own_time_limit), (left, false));
    let e = c
        .start_step(ask(id, "g1", 1000, asked(0)), 2_000)
        .map(started)
        .unwrap_err();
    assert!(e.message.contains("at least a second"), "{}", e.message);
}

#[test]
fn a_step_takes_the_name_it_is_given_else_its_commands() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 1);
    let id = running(&mut c, 1);
    let named = StepRequest {
        name: Some("prep".into()),
        ..Default::default()
    };
    let step = c
        .start_step(ask(id, "g1", 1000, named), 2_000)
        .map(started)
        .unwrap();
    assert_eq!(step.name, "prep");
    let step = c
        .start_step(ask(id, "g1", 1000, StepRequest::default()), 2_000)
        .map(started);
    assert_eq!(step.unwrap().name, "true");
    for bad in ["", "a\nb", &"x".repeat(wharf_api::job::MAX_NAME + 1)] {
        let req = StepRequest {
            name: Some(bad.to_string()),
            ..Default::default()
        };
        let e = c
            .start_step(ask(id, "g1", 1000, req), 2_000)
            .map(started)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{bad:?}");
        assert!(e.message.contains("printable characters"), "{}", e.message);
    }
}

#[test]
fn the_jobs_end_ends_its_steps_and_steps_stopped_before_they_start_end_there() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 2);
    let id = running(&mut c, 2);
    c.start_step(ask(id, "g1", 1000, StepRequest::default()), 2_000)
        .map(started)
        .unwrap();
    let key = StepKey { job: id, step: 0 };
    // Its caller went away before g2 launched it: g2 never starts it.
    assert_eq!(c.cancel_step(key, "gone").unwrap(), ["g1", "g2"]);
    let (launch, _) = c.step_orders("g2", &BTreeSet::new(), &BTreeSet::new());
    assert!(launch.is_empty());
    report(&mut c, "g2", &[(id, None)], vec![]);
    assert!(c.step(key).unwrap().nodes[1].exit.is_some());
    // A second step, still running when the job ends, ends with it.
    c.start_step(ask(id, "g1", 1000, StepRequest::default()), 2_000)
        .map(started)
        .unwrap();
    // It started on g1 only.
    report(&mut c, "g1", &[(id, None)], vec![step_report(id, 1, None)]);
    report(&mut c, "g1", &[(id, Some(0))], vec![]);
    report(&mut c, "g2", &[(id, Some(0))], vec![]);
    let job = c.job(&caller(1000, "ann"), id).unwrap();
    assert_eq!(job.state, JobState::Completed);
    assert!(
        job.steps.iter().all(|s| s.exit.is_some()),
        "{:?}",
        job.steps
    );
    assert_eq!(job.steps[1].state(), JobState::Cancelled);
    // Stopped by SIGTERM where it ran, as an agent reports it; never started on g2.
    let signals: Vec<Option<i32>> = (job.steps[1].nodes.iter())
        .map(|n| n.exit.as_ref().and_then(|e| e.signal))
        .collect();
    assert_eq!(signals, [Some(15), None]);
    assert_eq!(job.steps[1].exit.as_ref().unwrap().code_signal(), "0:15");
}

#[test]
fn a_steps_output_goes_to_its_caller_or_to_the_files_it_names_per_node() {
    use wharf_api::step_output::StepOutput;
    let dir = tempfile::tempdir().unwrap();
    let mut c = nodes(&dir, 2);
    let id = running(&mut c, 2);
    let asked = |output: StepOutput| StepRequest {
        workdir: Some("/home/ann/run".into()),
        output,
        ..Default::default()
    };
    let streamed = StepOutput {
        stream: true,
        ..Default::default()
    };
    c.start_step(ask(id, "g1", 1000, asked(streamed.clone())), 2_000)
        .map(started)
        .unwrap();
    let files = StepOutput {
        stream: true,
        output: Some("out-%j.%s.%N.%t".into()),
        error: Some("/scratch/err-%s".into()),
    };
    c.start_step(ask(id, "g1", 1000, asked(files.clone())), 2_000)
        .map(started)
        .unwrap();
    let (orders, _) = c.step_orders("g2", &BTreeSet::new(), &BTreeSet::new());
    // Taken by the caller: the agent captures both streams.
    assert_eq!(orders[0].output, streamed);
    assert_eq!(orders[0].output.captured(), (true, true));
    // Files: relative to the caller's directory; %t is the agent's to fill in.
    assert_eq!(orders[1].output.captured(), (false, false));
    let spec = &orders[1].order.spec;
    assert_eq!(spec.output, format!("/home/ann/run/out-{id}.1.g2.%t"));
    assert_eq!(spec.error.as_deref(), Some("/scratch/err-1"));
    assert_eq!(
        spec.rank_output_path(id, 3, &Default::default()),
        format!("/home/ann/run/out-{id}.1.g2.3")
    );
}

/// A running job of uid 1000 on g1 (16G) and g2 (8G), 4 CPUs and the whole memory
/// (`--mem=0`) of each.
fn uneven_gang(dir: &tempfile::TempDir) -> (Cluster, JobId) {
    let mut c = nodes(dir, 1);
    c.register(NodeInfo::new("g2", "10.0.0.2", 4, 8 << 30, vec![]), 0)
        .unwrap();
    let whole = JobRequest {
        nodes: Some(2),
        cpus: Some(4),
        memory: Some(0),
        ..Default::default()
    };
    let id = submit_job(&mut c, &caller(1000, "ann"), whole, 10).unwrap();
    c.schedule(1_000).unwrap();
    for node in ["g1", "g2"] {
        report(&mut c, node, &[(id, None)], vec![]);
    }
    (c, id)
}

/// A step of a gang that holds each node's whole memory (`--mem=0`) is launched on each
/// node with that node's, as the gang's own ranks are (before, every node got the first
/// node's, more than a smaller node has).
#[test]
fn a_steps_tasks_get_their_own_nodes_whole_memory_in_an_uneven_gang() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, id) = uneven_gang(&dir);
    c.start_step(ask(id, "g1", 1000, StepRequest::default()), 2_000)
        .map(started)
        .unwrap();
    for (node, memory) in [("g1", 16u64 << 30), ("g2", 8 << 30)] {
        let (orders, _) = c.step_orders(node, &BTreeSet::new(), &BTreeSet::new());
        assert_eq!(orders.len(), 1, "{node}");
        assert_eq!(orders[0].order.spec.resources.memory, memory, "{node}");
    }
}

#[test]
fn a_steps_memory_is_its_own_ceiling_within_the_jobs_on_each_node() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, id) = uneven_gang(&dir);
    let with = |memory, more: StepRequest| StepRequest {
        memory: Some(memory),
        ..more
    };
    let mut start = |r: StepRequest| c.start_step(ask(id, "g1", 1000, r), 2_000);
    let gib = |n: u64| n << 30;
    // `--mem 6G`: 6G on each node, though the job has 16G on g1 and 8G on g2.
    let six = start(with(StepMemory::PerNode(gib(6)), StepRequest::default()))
        .map(started)
        .unwrap();
    let per_node: Vec<Option<u64>> = six.nodes.iter().map(|n| n.memory).collect();
    assert_eq!(per_node, [Some(gib(6)), Some(gib(6))]);
    // Per CPU: two tasks of one CPU each, 1G a CPU; without -c, every CPU of the job's.
    let each_cpu = StepRequest {
        ntasks_per_node: Some(2),
        cpus_per_task: Some(1),
        ..Default::default()
    };
    let s = start(with(StepMemory::PerCpu(gib(1)), each_cpu))
        .map(started)
        .unwrap();
    assert_eq!(s.nodes[1].memory, Some(gib(2)));
    let s = start(with(StepMemory::PerCpu(gib(1)), StepRequest::default()))
        .map(started)
        .unwrap();
    assert_eq!(s.nodes[1].memory, Some(gib(4)));
    // 0: all the job's on each node, as without it.
    let all = start(with(StepMemory::PerNode(0), StepRequest::default()))
        .map(started)
        .unwrap();
    assert!(all.nodes.iter().all(|n| n.memory.is_none()));
    // Refused, with why, and nothing recorded: more than the job's on g2, per GPU with no
    // GPU, too little for each task.
    let refusals = [
        (
            with(StepMemory::PerNode(gib(12)), StepRequest::default()),
            "more than job",
        ),
        (
            with(StepMemory::PerCpu(gib(3)), StepRequest::default()),
            "8G there",
        ),
        (
            with(StepMemory::PerGpu(gib(1)), StepRequest::default()),
            "no GPU on node g1",
        ),
        (
            with(
                StepMemory::PerNode(4 << 20),
                StepRequest {
                    ntasks_per_node: Some(4),
                    ..Default::default()
                },
            ),
            "too little",
        ),
    ];
    for (r, words) in refusals {
        let e = start(r).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{}", e.message);
        assert!(e.message.contains(words), "{}", e.message);
    }
    assert_eq!(record(&c, id).steps.len(), 4);
    // The orders: the step's memory beside the job's, which the job's cgroup keeps.
    for (node, job_memory) in [("g1", gib(16)), ("g2", gib(8))] {
        let (orders, _) = c.step_orders(node, &BTreeSet::new(), &BTreeSet::new());
        let memory: Vec<Option<u64>> = orders.iter().map(|o| o.memory).collect();
        assert_eq!(
            memory,
            [Some(gib(6)), Some(gib(2)), Some(gib(4)), None],
            "{node}"
        );
        assert!(orders
            .iter()
            .all(|o| o.order.spec.resources.memory == job_memory));
    }
}
