//! Steps: commands a running job launches inside its own allocation (`wharf step`, Slurm's
//! `srun` inside a job). The batch command is the job itself; each step gets the next id of
//! its job (0, 1, 2, ...), runs on some or all of the job's nodes with `tasks_per_node`
//! tasks on each, every task in a sandbox of its own, and ends as its first failing task
//! (the others are then stopped).
//!
//! Who asks is never a field of these types: the caller's job and uid come from the kernel
//! (the agent reads the connecting process's cgroup and credentials), and the agent forwards
//! them over its authenticated channel.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::job::{ExitInfo, JobId, JobState};
use crate::step_input::StepInput;
use crate::step_output::{OutputChunk, StepOutput};
use crate::wire::LaunchOrder;

/// What `wharf step` asks its node's agent for (one JSON line on the agent's step socket).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRequest {
    /// Run on the job's first N nodes (rank order); `None`: all, or those of `nodelist`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    /// Run on these nodes of the job (a host list such as `gpu[01-02]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodelist: Option<String>,
    /// Tasks on each node; `None`: from `ntasks`, else the job's tasks per node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ntasks_per_node: Option<u32>,
    /// Tasks in all, spread evenly over the step's nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ntasks: Option<u32>,
    /// GPUs each task has to itself (the step holds them, unless `overlap`); `None`: as
    /// `gpus_per_node` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_task: Option<u32>,
    /// GPUs the step holds on each of its nodes (`srun --gpus-per-node`, `--gres=gpu:N`),
    /// ids of the job's that no other running step holds; `None` with no other GPU request:
    /// every task sees all the job's GPUs on its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    /// GPUs the step holds in all (`srun --gpus`), the same number on each of its nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// The GPU type the step's GPU request named (lower case): refused unless it is the
    /// job's, where the job named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Share the job's GPUs with its other steps (`srun --overlap`): the step holds none and
    /// waits for none; its tasks see all the job's (or their `gpus_per_task` share of them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overlap: bool,
    /// CPUs each task has to itself (`srun -c`); `None`: the job's CPUs on a node shared
    /// evenly among the step's tasks there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<u32>,
    /// The job the caller believes it is in (`--jobid`): refused unless it is the job the
    /// caller is really in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobId>,
    /// What each task runs.
    pub argv: Vec<String>,
    /// The step's name (`srun -J`); `None`: its command's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Seconds the step may run (`srun -t`), within what is left of the job's; `None`: the
    /// job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<u64>,
    /// The caller's environment (Wharf's own variables are set anew for each task).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The caller's working directory; `None`: the job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// Wait again for this step of the caller's job, started by an earlier request whose
    /// answer was cut off (the agent restarted): nothing is started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<u32>,
    /// Where the tasks' output goes: to the caller, or to files (a caller from before
    /// streaming sends none: the job's files, beside).
    #[serde(default, skip_serializing_if = "is_default")]
    pub output: StepOutput,
    /// Which tasks get the caller's standard input, sent after the request as
    /// [`crate::step_input::InputLine`]s (a caller from before input forwarding sends none:
    /// every task reads `/dev/null`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub input: StepInput,
    /// The most memory the step's tasks on a node may use together (`srun --mem`,
    /// `--mem-per-cpu`, `--mem-per-gpu`), within the job's there; `None`: the job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<StepMemory>,
}

/// A step's memory as `srun` asks for it inside a job. It is a ceiling for the step's tasks
/// on each of its nodes, within the job's memory there; it reserves nothing against the
/// job's other steps, which share the job's memory as before (the job's limit holds for all
/// of them together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepMemory {
    /// Bytes on each node (`--mem`); 0: all the job's there.
    PerNode(u64),
    /// Bytes for each CPU the step has on a node (`--mem-per-cpu`): its tasks' own
    /// (`-c` times its tasks there), else all the job's CPUs there.
    PerCpu(u64),
    /// Bytes for each GPU the step's tasks see on a node (`--mem-per-gpu`): its own where
    /// it holds some, else all the job's there.
    PerGpu(u64),
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// `POST /v1/agent/steps`: an agent forwards a step request from a process it found inside
/// `job`, running as `uid`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepStart {
    /// The agent's node (the caller's).
    pub node: String,
    /// The job whose cgroup holds the caller.
    pub job: JobId,
    /// The caller's uid, from the socket's peer credentials.
    pub uid: u32,
    /// What it asked for.
    pub request: StepRequest,
    /// How long the controller may hold the answer, ms, while the GPUs the step needs are
    /// held by the job's other steps (an end of one wakes it); 0: answer at once. Either way
    /// a step that still cannot have them is answered `Unavailable`, with why, to ask again.
    #[serde(default, skip_serializing_if = "is_default")]
    pub wait_ms: u64,
}

/// `POST /v1/agent/steps/status` and `/cancel`: one step of one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StepKey {
    /// The job.
    pub job: JobId,
    /// The step's id within it.
    pub step: u32,
}

impl StepKey {
    /// Every step key of `job`, in order: a range of a map keyed by steps.
    pub fn of_job(job: JobId) -> std::ops::RangeInclusive<StepKey> {
        StepKey { job, step: 0 }..=StepKey {
            job,
            step: u32::MAX,
        }
    }
}

/// What one node of a step is doing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepNode {
    /// Node name.
    pub node: String,
    /// When all its tasks had started, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
    /// When its last task ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<u64>,
    /// How its tasks ended (the first that failed, see [`ExitInfo::task`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
    /// The job's GPU ids here that the step holds (see [`StepRecord::gpus_per_node`]): no
    /// other step of the job is given them until its tasks here have ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_ids: Vec<u32>,
    /// The most memory its tasks here may use together, bytes (its [`StepMemory`] worked
    /// out for this node); `None`: all the job's here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
}

/// One step of a job, as the controller records it (in the job's record, so `wharf acct`
/// shows it with the job).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Its id within the job: 0, 1, 2, ... in the order they were asked for.
    pub id: u32,
    /// Its command's name (the first word).
    pub name: String,
    /// Its nodes, in step rank order, and how each is doing.
    pub nodes: Vec<StepNode>,
    /// Tasks on each node.
    pub tasks_per_node: u32,
    /// When it was asked for, ms since the epoch.
    pub submit_time: u64,
    /// When every node's tasks had started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<u64>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<u64>,
    /// How it ended: its first failing task's exit (its `message` names node and rank), else
    /// the first node's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
    /// Why its nodes are being stopped, once one failed or it was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<String>,
    /// What each task runs (private to the job's owner, as the job's command is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    /// The environment it was started with, less Wharf's placement variables (private).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Its working directory (private); `None`: the job's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// GPUs each task has to itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_task: Option<u32>,
    /// GPUs the step holds on each node, named by each node's `gpu_ids`; `None`: it holds
    /// none, and its tasks share the job's GPUs (`--overlap`, or no GPU request).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus_per_node: Option<u32>,
    /// CPUs each task has to itself; `None`: the job's CPUs on a node shared evenly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<u32>,
    /// Seconds it may run: what was left of the job's time limit when it was asked for, or
    /// its own limit where that was less.
    #[serde(default)]
    pub time_limit: u64,
    /// `time_limit` is the step's own (`srun -t`): a change of the job's limit leaves it be
    /// (the job's end still ends it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_time_limit: bool,
    /// Where its tasks' output goes.
    #[serde(default, skip_serializing_if = "is_default")]
    pub output: StepOutput,
    /// Which of its tasks get the caller's standard input.
    #[serde(default, skip_serializing_if = "is_default")]
    pub input: StepInput,
}

impl StepRecord {
    /// Tasks in all.
    pub fn ntasks(&self) -> u32 {
        self.tasks_per_node * self.nodes.len() as u32
    }

    /// Its state in Slurm's words: RUNNING until it ended, then as its exit says.
    pub fn state(&self) -> JobState {
        match &self.exit {
            Some(e) => e.final_state(),
            None => JobState::Running,
        }
    }

    /// The exit status `wharf step` ends with: the exit code, 128 + the signal, 1 for a step
    /// that failed without either (it could not start, it was stopped).
    pub fn exit_status(&self) -> i32 {
        let Some(e) = &self.exit else { return 1 };
        match (e.code, e.signal) {
            (_, Some(sig)) => 128 + sig,
            (Some(code), None) if e.final_state() == JobState::Completed => code,
            (Some(code), None) if code != 0 => code,
            _ => 1,
        }
    }
}

/// The agent's answer to a step request: one JSON line when the step is accepted, another
/// when it ended (or a single line with the error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepReply {
    /// The controller accepted the step and ordered its launch.
    Started(StepRecord),
    /// Output of one of its tasks (only to a caller that asked for it).
    Output(OutputChunk),
    /// Something the caller should know of that is not the tasks' output (output dropped).
    Notice(String),
    /// The step waits for GPUs the job's other steps hold (said once; `Started` follows
    /// when it has them).
    Waiting(String),
    /// The step ended.
    Ended(StepRecord),
    /// It was refused or failed; the words say why.
    Error(String),
}

/// A step's tasks for an agent to start on its node: the job's launch order reshaped for the
/// step (its command, environment, output files, nodes and tasks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepOrder {
    /// The step's id within `order.id`.
    pub step: u32,
    /// What to start, as for a job.
    pub order: LaunchOrder,
    /// Where its tasks' output goes: the streams the caller gets are kept in the task's
    /// directory for the agent to pass on.
    #[serde(default, skip_serializing_if = "is_default")]
    pub output: StepOutput,
    /// Which of the step's tasks take its caller's input (the node's first rank is
    /// `order.rendezvous.node_rank` times its tasks per node).
    #[serde(default, skip_serializing_if = "is_default")]
    pub input: StepInput,
    /// CPUs each task has of `order.cpu_ids` (`-c`; `order.spec`'s CPUs are this times its
    /// tasks per node); `None`: the node's CPUs of the job split evenly among its tasks.
    /// `order.cpu_ids` keeps naming all of the job's, which its cgroup is written with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_task: Option<u32>,
    /// The step's time limit (`order.spec.time_limit`) is its own: a change of the job's
    /// limit does not move it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_time_limit: bool,
    /// The most memory the step's tasks on this node may use together, bytes, split evenly
    /// among them; `None`: the job's (`order.spec`'s memory stays the job's, which its
    /// cgroup is written with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
}

/// A step's tasks for an agent to stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepKill {
    /// Which step.
    pub key: StepKey,
    /// Why.
    pub reason: String,
}

/// What an agent knows of one step's tasks on its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentStep {
    /// Which step.
    pub key: StepKey,
    /// When all its tasks here had started.
    pub start_time: Option<u64>,
    /// Set once all have ended.
    pub exit: Option<ExitInfo>,
    /// When the last ended.
    pub end_time: Option<u64>,
    /// A stop was passed on to them.
    #[serde(default)]
    pub stopping: bool,
    /// Its tasks here (their index on the node) that took input and take no more: they
    /// closed it, got its end or ended. Said at every poll, so that a restarted controller,
    /// whose step input buffer is new, holds nothing back for them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_closed: Vec<u32>,
}

/// The output file task `rank` of step `step` writes where the job's own output file is
/// `job_output`: `JOB_OUTPUT.stepS` for the step's rank 0, `.stepS.rankR` for the others.
/// A step's output never goes into the job's file: ranks on several nodes would write it at
/// once over a shared filesystem, where appends are not atomic.
pub fn step_output(job_output: &str, step: u32) -> String {
    format!("{job_output}.step{step}")
}

/// The variables a task sets for itself that describe its place in a job or step: a step's
/// tasks get their own, so the caller's are not passed on.
pub fn is_placement_variable(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "HOSTNAME",
    ];
    name.starts_with("SLURM_") || name.starts_with("WHARF_") || NAMES.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steps_status_is_its_first_failing_tasks() {
        let mut s = StepRecord {
            tasks_per_node: 2,
            nodes: vec![StepNode::default(), StepNode::default()],
            ..Default::default()
        };
        assert_eq!(s.ntasks(), 4);
        assert_eq!(s.state(), JobState::Running);
        s.exit = Some(ExitInfo {
            code: Some(0),
            ..Default::default()
        });
        assert_eq!((s.state(), s.exit_status()), (JobState::Completed, 0));
        s.exit = Some(ExitInfo {
            code: Some(3),
            ..Default::default()
        });
        assert_eq!((s.state(), s.exit_status()), (JobState::Failed, 3));
        s.exit = Some(ExitInfo {
            signal: Some(9),
            ..Default::default()
        });
        assert_eq!(s.exit_status(), 137);
        s.exit = Some(ExitInfo {
            cancelled: true,
            code: Some(0),
            ..Default::default()
        });
        assert_eq!((s.state(), s.exit_status()), (JobState::Cancelled, 1));
    }

    #[test]
    fn placement_variables_are_wharfs_and_slurms_and_the_rendezvous() {
        for v in ["SLURM_PROCID", "WHARF_JOB_ID", "RANK", "MASTER_PORT"] {
            assert!(is_placement_variable(v), "{v}");
        }
        for v in ["PATH", "HOME", "OMP_NUM_THREADS", "RANKING"] {
            assert!(!is_placement_variable(v), "{v}");
        }
        assert_eq!(step_output("/h/out.txt", 2), "/h/out.txt.step2");
    }
}
