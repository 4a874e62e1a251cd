//! Steps of running jobs (`wharf step`): a request forwarded by the agent of the node where
//! the caller runs, checked against the job's allocation, given the job's next step id and
//! recorded with the job; launch orders to the step's nodes; their reports; the step's end.
//!
//! ```text
//!   asked (the caller's agent found it inside job J as uid U; J RUNNING, owned by U,
//!          the step fits J's allocation) ──▶ recorded, id = J's step count; orders out
//!   asked, but GPUs it needs are held by J's other steps
//!                                        ──▶ waits (nothing recorded; asked again, see
//!                                              [`gpus`])
//!   every node's tasks have started        ──▶ started
//!   a node's tasks end badly               ──▶ stop: the step's other nodes are told to
//!                                              kill theirs
//!   every node's tasks have ended          ──▶ ended, as its first failing task ended
//!   the job ends first                     ──▶ ended CANCELLED ("the job ended")
//! ```
//!
//! The pure parts ([`plan`], [`node_ended`], [`close`]) take the records and return new
//! ones; [`Cluster`]'s methods store them.

use std::collections::{BTreeMap, BTreeSet};

use wharf_api::step::{
    is_placement_variable, step_output, AgentStep, StepKey, StepKill, StepMemory, StepNode,
    StepOrder, StepRecord, StepStart,
};
use wharf_api::wire::{ErrorKind, LaunchOrder, Rendezvous, StepPlace};
use wharf_api::{ExitInfo, JobId, JobRecord, JobState};

use super::{Cluster, Failure};

mod gpus;
mod plan;
pub use gpus::Busy;
pub use plan::{plan, Plan};

/// What a step request comes to, when it is not refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Recorded; its launch orders go out.
    Started(Box<StepRecord>),
    /// The GPUs it asks for are held by the job's other steps: nothing recorded, to be asked
    /// again once one of them ends.
    Waits(Busy),
}

/// The CPUs a step's tasks have on a node where its job holds `alloc`: with
/// `--cpus-per-task`, that many for each of its `tasks` there (within the job's, as its plan
/// checked); else all the job's there, shared evenly.
fn step_cpus(cpus_per_task: Option<u32>, tasks: u32, alloc: &wharf_api::NodeAlloc) -> u32 {
    match cpus_per_task {
        Some(c) => c.saturating_mul(tasks),
        None => alloc.cpu_ids.len() as u32,
    }
}

/// Steps a job may have started, in all: their records travel in the job's record (each
/// without its environment once started everywhere).
pub const MAX_STEPS: usize = 1000;

fn refused(kind: ErrorKind, message: impl Into<String>) -> Failure {
    Failure::new(kind, message)
}

/// The step `node`'s tasks of `step` ended as `exit` says: recorded; the first bad end stops
/// the step's other nodes; once every node has ended, the step has, as its first failing
/// task did.
pub fn node_ended(
    mut step: StepRecord,
    idx: usize,
    exit: ExitInfo,
    start: Option<u64>,
    end: u64,
) -> StepRecord {
    let per_node = step.tasks_per_node;
    let n = &mut step.nodes[idx];
    n.start_time = n.start_time.or(start);
    n.end_time = Some(end);
    let bad = exit.final_state() != JobState::Completed;
    if bad && !exit.cancelled && step.stop.is_none() {
        let rank = idx as u32 * per_node + exit.task.unwrap_or(0);
        step.stop = Some(format!(
            "task {rank} of step {} on node {} failed ({}); stopping the step",
            step.id,
            n.node,
            exit.code_signal()
        ));
    }
    n.exit = Some(exit);
    if step.nodes.iter().all(|n| n.exit.is_some()) {
        settle(&mut step);
    }
    step
}

/// Sets an ended step's exit: the first node that failed on its own (by end time), else the
/// first that did not complete, else node 0; its message names the node and the task.
fn settle(step: &mut StepRecord) {
    let bad = |n: &&StepNode| {
        n.exit
            .as_ref()
            .is_some_and(|e| e.final_state() != JobState::Completed)
    };
    let by_end = |n: &&StepNode| n.end_time;
    let (idx, node) = {
        let deciding = step
            .nodes
            .iter()
            .filter(bad)
            .filter(|n| n.exit.as_ref().is_some_and(|e| !e.cancelled))
            .min_by_key(by_end)
            .or_else(|| step.nodes.iter().filter(bad).min_by_key(by_end))
            .unwrap_or(&step.nodes[0]);
        let idx = step.nodes.iter().position(|n| n.node == deciding.node);
        (idx.unwrap_or(0), deciding.clone())
    };
    let mut exit = node.exit.unwrap_or_default();
    if exit.final_state() != JobState::Completed {
        let rank = idx as u32 * step.tasks_per_node + exit.task.unwrap_or(0);
        let what = exit
            .message
            .take()
            .unwrap_or_else(|| format!("exit {}", exit.code_signal()));
        exit.message = Some(wharf_api::text::bound_message(format!(
            "task {rank} on node {}: {what}",
            node.node
        )));
    }
    // What every node's tasks used: CPU time summed, the highest memory peak (as sacct's
    // TotalCPU and MaxRSS), kept once for the step rather than for each node.
    let taken: Vec<wharf_api::usage::JobUsage> = (step.nodes.iter_mut())
        .filter_map(|n| n.exit.as_mut()?.usage.take())
        .collect();
    exit.usage = wharf_api::usage::JobUsage::sum(None, &taken);
    step.start_time = step
        .nodes
        .iter()
        .map(|n| n.start_time)
        .collect::<Option<Vec<u64>>>()
        .and_then(|s| s.into_iter().max());
    step.end_time = step.nodes.iter().filter_map(|n| n.end_time).max();
    step.exit = Some(exit);
    // Only launch orders need the environment, and it is most of a step's record.
    step.env.clear();
}

/// Ends every step of `job` still going, as stopped by the job's end at `now`.
pub fn close(job: &mut JobRecord, now: u64) {
    for step in job.steps.iter_mut().filter(|s| s.exit.is_none()) {
        for n in step.nodes.iter_mut().filter(|n| n.exit.is_none()) {
            n.end_time = Some(now);
            n.exit = Some(ExitInfo {
                // As the agent reports a step its job's end stopped: by SIGTERM, where it
                // had started.
                signal: n.start_time.map(|_| 15),
                cancelled: true,
                message: Some(format!("job {} ended ({})", job.id, job.state)),
                ..Default::default()
            });
        }
        step.stop
            .get_or_insert_with(|| format!("job {} ended", job.id));
        settle(step);
    }
}

/// The output and error file patterns (absolute) of `step`'s tasks on `node`, which each
/// rank's agent makes its own file of (`%t`, or `.rankR` after it, see
/// [`wharf_api::alloc::rank_path`]): the caller's `--output` and `--error` (relative to its
/// directory), else the job's files with `.stepS` after them, whatever directory the step
/// runs in. A stream the caller takes never reaches its file.
fn output_files(
    spec: &wharf_api::JobSpec,
    job: &JobRecord,
    step: &StepRecord,
    node: &str,
) -> (String, Option<String>) {
    let mine = |pattern: &str| {
        let p = wharf_api::step_output::expand_for_node(pattern, job.id, step.id, node);
        match &step.workdir {
            Some(dir) if !p.starts_with('/') => {
                let dir = wharf_api::pattern::escape(dir.trim_end_matches('/'));
                format!("{dir}/{p}")
            }
            _ => p,
        }
    };
    // The job's names as its own first node's agent makes them, `%n` left for each node's.
    let place = wharf_api::job::FilePlace {
        node_index: None,
        ..job.file_place()
    };
    let o = &step.output;
    match (&o.output, &o.error) {
        (Some(out), err) => (mine(out), err.as_deref().map(mine)),
        (None, err) => (
            step_output(&spec.output_pattern(job.id, &place), step.id),
            err.as_deref().map(mine).or_else(|| {
                spec.error_pattern(job.id, &place)
                    .map(|e| step_output(&e, step.id))
            }),
        ),
    }
}

/// The environment a step's tasks start with: the caller's, less the variables that place a
/// task. Each task gets its own from its agent, the step's (`SLURM_STEP_*`) and the job's
/// (`SLURM_JOB_NODELIST`, ...) among them, from the order's rendezvous, which win over
/// these. The step's are also written here for agents that predate the order's step place.
fn step_env(step: &StepRecord) -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = step
        .env
        .iter()
        .filter(|(k, _)| !is_placement_variable(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let id = step.id.to_string();
    for k in ["SLURM_STEP_ID", "SLURM_STEPID", "WHARF_STEP_ID"] {
        env.insert(k.into(), id.clone());
    }
    env.insert("SLURM_STEP_NUM_NODES".into(), step.nodes.len().to_string());
    env.insert("SLURM_STEP_NUM_TASKS".into(), step.ntasks().to_string());
    let names: Vec<&str> = step.nodes.iter().map(|n| n.node.as_str()).collect();
    env.insert(
        "SLURM_STEP_NODELIST".into(),
        wharf_api::hostlist::compress(&names),
    );
    env
}

impl Cluster {
    /// Records a new step of `req.job`, asked for by `req.uid` from inside that job on
    /// `req.node` (both as the node's agent found them), and returns it; its launch orders
    /// go out with its nodes' next polls. A step whose GPUs are held by the job's other
    /// steps is not recorded: [`StepOutcome::Waits`] says by which. Not idempotent: each
    /// start is a new step.
    ///
    /// Errors: `NotFound`/`Conflict` when the job is not running; `PermissionDenied` when the
    /// caller is not its owner, asked for another job, or the node is not the job's;
    /// `InvalidInput` for a step that does not fit the job's allocation.
    pub fn start_step(&mut self, req: StepStart, now: u64) -> Result<StepOutcome, Failure> {
        let id = req.job;
        let Some(job) = self.jobs.get(&id) else {
            let why = match self.store.job(id)? {
                Some(j) => format!("job {id} is not running: it ended {}", j.state),
                None => format!("no job {id}"),
            };
            return Err(refused(ErrorKind::NotFound, why));
        };
        if job.owner.uid != req.uid {
            return Err(refused(
                ErrorKind::PermissionDenied,
                format!("job {id} belongs to another user; a step runs only in your own job"),
            ));
        }
        if let Some(asked) = req.request.job.filter(|&j| j != id) {
            return Err(refused(
                ErrorKind::PermissionDenied,
                format!(
                    "this process runs inside job {id}, not job {asked}: a step runs only in \
                     the job it is started from"
                ),
            ));
        }
        if job.rank_on(&req.node).is_none() {
            return Err(refused(
                ErrorKind::PermissionDenied,
                format!("node {} holds no part of job {id}", req.node),
            ));
        }
        // STARTING counts as running: the caller runs, so its node has started, and its
        // batch command must not race the other nodes' start reports.
        if !job.state.holds_resources() || job.cancel_requested || job.stop.is_some() {
            let what = if job.state.holds_resources() {
                "being stopped".to_string()
            } else {
                job.state.to_string()
            };
            return Err(refused(
                ErrorKind::Conflict,
                format!("job {id} is not running ({what}); a step needs a running job"),
            ));
        }
        let r = &req.request;
        if r.argv.is_empty() {
            return Err(refused(ErrorKind::InvalidInput, "a step needs a command"));
        }
        let max = wharf_api::job::MAX_NAME;
        if let Some(n) = (r.name.as_ref()).filter(|n| wharf_api::job::check_job_name(n).is_err()) {
            return Err(refused(
                ErrorKind::InvalidInput,
                format!(
                    "step name {:?}: a step's name is 1 to {max} printable characters",
                    wharf_api::text::bound_message(n.clone())
                ),
            ));
        }
        let env_bytes: usize = r.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        if env_bytes > self.defaults.max_env_bytes {
            return Err(refused(
                ErrorKind::InvalidInput,
                format!(
                    "the step's environment is {env_bytes} bytes, over the limit of {}",
                    self.defaults.max_env_bytes
                ),
            ));
        }
        let argv_bytes: usize = r.argv.iter().map(|a| a.len() + 1).sum();
        if argv_bytes > self.defaults.max_command_bytes {
            return Err(refused(
                ErrorKind::InvalidInput,
                format!(
                    "the step's command is {argv_bytes} bytes, over the limit of {}",
                    self.defaults.max_command_bytes
                ),
            ));
        }
        if job.steps.len() >= MAX_STEPS {
            return Err(refused(
                ErrorKind::InvalidInput,
                format!("job {id} has started {MAX_STEPS} steps, the most a job may"),
            ));
        }
        if r.time_limit == Some(0) {
            return Err(refused(
                ErrorKind::InvalidInput,
                "a step's time limit is at least a second; leave -t out for the job's",
            ));
        }
        let plan = plan(job, r)?;
        let own_gpus = gpus::asked(job, r, &plan)?;
        // Before the GPUs: a step refused for its memory is refused at once, not after
        // waiting for GPUs the job's other steps hold.
        let memory = match r.memory {
            Some(asked) => self.step_memory(job, asked, &plan, r.cpus_per_task, own_gpus)?,
            None => vec![None; plan.ranks.len()],
        };
        let gpu_ids = match own_gpus.map(|want| gpus::pick(job, &plan, want)) {
            None => vec![Vec::new(); plan.ranks.len()],
            Some(Ok(ids)) => ids,
            Some(Err(busy)) => return Ok(StepOutcome::Waits(busy)),
        };
        let started = job.start_time.unwrap_or(now);
        let left = (started + job.time_limit * 1000)
            .saturating_sub(now)
            .div_ceil(1000);
        // Its own limit where it asks for less than the job has left (the job's end ends it
        // all the same).
        let own = r.time_limit.filter(|&t| t < left);
        let step = StepRecord {
            id: job.steps.len() as u32,
            name: (r.name.clone())
                .unwrap_or_else(|| r.argv[0].rsplit('/').next().unwrap_or_default().to_string()),
            nodes: plan
                .ranks
                .iter()
                .zip(gpu_ids)
                .zip(memory)
                .map(|((&i, gpu_ids), memory)| StepNode {
                    node: job.allocs[i].node.clone(),
                    gpu_ids,
                    memory,
                    ..Default::default()
                })
                .collect(),
            tasks_per_node: plan.tasks_per_node,
            submit_time: now,
            argv: r.argv.clone(),
            env: r.env.clone(),
            workdir: r.workdir.clone(),
            gpus_per_task: r.gpus_per_task,
            gpus_per_node: own_gpus,
            cpus_per_task: r.cpus_per_task,
            time_limit: own.unwrap_or(left).max(1),
            own_time_limit: own.is_some(),
            output: r.output.clone(),
            input: r.input,
            ..Default::default()
        };
        let mut job = job.clone();
        job.steps.push(step.clone());
        tracing::info!(
            job = id,
            step = step.id,
            nodes = step.nodes.len(),
            tasks = step.ntasks(),
            gpus_per_node = step.gpus_per_node,
            "step started"
        );
        self.commit(vec![job])?;
        Ok(StepOutcome::Started(Box::new(step)))
    }

    /// The most memory a step's tasks may use together on each of its nodes (`plan`'s ranks
    /// of `job`), bytes, as `asked` gives it there: per CPU, those its tasks have there
    /// ([`step_cpus`]); per GPU, those they see (the `own_gpus` it holds on each node, else
    /// the job's there). `None` where that is all the job's. Refused where it is more than
    /// the job's memory there (as Slurm refuses a step's `--mem` past its job's), less than
    /// [`wharf_api::job::MIN_MEMORY`] a task, or per GPU on a node where its tasks see none.
    fn step_memory(
        &self,
        job: &JobRecord,
        asked: StepMemory,
        plan: &Plan,
        cpus_per_task: Option<u32>,
        own_gpus: Option<u32>,
    ) -> Result<Vec<Option<u64>>, Failure> {
        let invalid = |m: String| refused(ErrorKind::InvalidInput, m);
        let fmt = wharf_api::resources::format_memory;
        let Some(spec) = &job.spec else {
            return Ok(vec![None; plan.ranks.len()]);
        };
        let tasks = plan.tasks_per_node.max(1);
        let mut out = Vec::with_capacity(plan.ranks.len());
        for &rank in &plan.ranks {
            let alloc = &job.allocs[rank];
            let node = &alloc.node;
            let (each, count, flag) = match asked {
                StepMemory::PerNode(0) => {
                    out.push(None);
                    continue;
                }
                StepMemory::PerNode(b) => (b, 1, "--mem"),
                StepMemory::PerCpu(b) => {
                    (b, step_cpus(cpus_per_task, tasks, alloc), "--mem-per-cpu")
                }
                StepMemory::PerGpu(b) => {
                    let gpus = own_gpus.unwrap_or(alloc.gpu_ids.len() as u32);
                    if gpus == 0 {
                        return Err(invalid(format!(
                            "--mem-per-gpu: the step's tasks have no GPU on node {node}; give \
                             --mem instead"
                        )));
                    }
                    (b, gpus, "--mem-per-gpu")
                }
            };
            let want = each.saturating_mul(u64::from(count));
            let have = self.node_memory(job, spec, node);
            if want > have {
                return Err(invalid(format!(
                    "{flag} {}: the step would have {} of memory on node {node}, more than \
                     job {}'s {} there; a step runs within its job's memory, so ask for at \
                     most that (or leave {flag} out for all of it)",
                    fmt(each),
                    fmt(want),
                    job.id,
                    fmt(have)
                )));
            }
            if want / u64::from(tasks) < wharf_api::job::MIN_MEMORY {
                return Err(invalid(format!(
                    "{flag} {}: {} for each of the step's {tasks} task(s) on node {node} is too \
                     little; give each at least {}",
                    fmt(each),
                    fmt(want / u64::from(tasks)),
                    fmt(wharf_api::job::MIN_MEMORY)
                )));
            }
            out.push(Some(want));
        }
        Ok(out)
    }

    /// A step as it stands (of a job running or ended).
    ///
    /// Errors: `NotFound` when the job or step does not exist.
    pub fn step(&self, key: StepKey) -> Result<StepRecord, Failure> {
        // Only the step is copied out of a job in memory (its pushes and pulls ask often).
        let found = match self.jobs.get(&key.job) {
            Some(j) => j.steps.iter().find(|s| s.id == key.step).cloned(),
            None => self
                .store
                .job(key.job)?
                .ok_or_else(|| refused(ErrorKind::NotFound, format!("no job {}", key.job)))?
                .steps
                .into_iter()
                .find(|s| s.id == key.step),
        };
        found.ok_or_else(|| {
            refused(
                ErrorKind::NotFound,
                format!("job {} has no step {}", key.job, key.step),
            )
        })
    }

    /// A step as it stands, with where `node` is in it: its index among the step's nodes,
    /// and whether it holds part of the step's job (the node a caller runs on).
    ///
    /// Errors: `NotFound` when the job or step does not exist.
    pub fn step_seen_from(
        &self,
        key: StepKey,
        node: &str,
    ) -> Result<(StepRecord, Option<usize>, bool), Failure> {
        let step = self.step(key)?;
        let holds = match self.jobs.get(&key.job) {
            Some(j) => j.rank_on(node).is_some(),
            None => self
                .store
                .job(key.job)?
                .is_some_and(|j| j.rank_on(node).is_some()),
        };
        let idx = step.nodes.iter().position(|n| n.node == node);
        Ok((step, idx, holds))
    }

    /// Step `key`, asked about by `node`, which must hold part of its job.
    ///
    /// Errors: `PermissionDenied` when it holds none; as [`Cluster::step`].
    pub fn step_held_by(&self, key: StepKey, node: &str) -> Result<StepRecord, Failure> {
        let (step, _, holds) = self.step_seen_from(key, node)?;
        if !holds {
            return Err(refused(
                ErrorKind::PermissionDenied,
                format!("node {node} holds no part of job {}", key.job),
            ));
        }
        Ok(step)
    }

    /// The ranks of each step whose tasks on `node` report their input closed (`reports`):
    /// a task index is its node's first rank plus the index; any past the node's tasks, of a
    /// step the node holds no task of, or of one no longer running, is left out.
    pub fn input_closed_ranks(
        &self,
        node: &str,
        reports: &[AgentStep],
    ) -> Vec<(StepKey, Vec<u32>)> {
        reports
            .iter()
            .filter(|r| !r.input_closed.is_empty())
            .filter_map(|r| {
                let job = self.jobs.get(&r.key.job)?;
                let step = job.steps.iter().find(|s| s.id == r.key.step)?;
                if step.exit.is_some() || step.stop.is_some() {
                    return None;
                }
                let idx = step.nodes.iter().position(|n| n.node == node)?;
                let base = (idx as u32).saturating_mul(step.tasks_per_node);
                let ranks = (r.input_closed.iter())
                    .filter(|&&t| t < step.tasks_per_node)
                    .map(|t| base + t)
                    .collect();
                Some((r.key, ranks))
            })
            .collect()
    }

    /// Where `node`'s push of output for step `key` goes: the step and the node's index
    /// among its nodes (its first rank there is `index * tasks_per_node`), or `None` once the
    /// job or step is no longer known (nobody will read it). Only a node that holds the
    /// step's tasks may pass its output on: any other one must not touch the step's buffer
    /// (turn on its discarding, stop its tasks), whatever job it runs.
    ///
    /// Errors: `PermissionDenied` when `node` is not one of the step's nodes.
    pub fn step_output_from(
        &self,
        key: StepKey,
        node: &str,
    ) -> Result<Option<(StepRecord, usize)>, Failure> {
        let step = match self.step(key) {
            Ok(step) => step,
            Err(e) if e.kind == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        match step.nodes.iter().position(|n| n.node == node) {
            Some(idx) => Ok(Some((step, idx))),
            None => Err(refused(
                ErrorKind::PermissionDenied,
                format!(
                    "node {node} holds no task of step {} of job {}: it may not pass on its output",
                    key.step, key.job
                ),
            )),
        }
    }

    /// Stops a step whose caller went away (`wharf step` was interrupted). Idempotent.
    /// Returns the nodes to wake.
    pub fn cancel_step(&mut self, key: StepKey, why: &str) -> Result<Vec<String>, Failure> {
        let Some(job) = self.jobs.get(&key.job) else {
            return Ok(vec![]);
        };
        let Some(i) = job.steps.iter().position(|s| s.id == key.step) else {
            return Ok(vec![]);
        };
        if job.steps[i].exit.is_some() || job.steps[i].stop.is_some() {
            return Ok(vec![]);
        }
        let mut job = job.clone();
        job.steps[i].stop = Some(why.to_string());
        let nodes = job.steps[i].nodes.iter().map(|n| n.node.clone()).collect();
        self.commit(vec![job])?;
        Ok(nodes)
    }

    /// Active job `id`, `caller`'s to manage, whose steps a command acts on; or why not:
    /// another user's (as not found), ended (its steps with it), or no such job.
    pub(super) fn active_for_steps(
        &self,
        caller: &super::Caller,
        id: JobId,
    ) -> Result<&JobRecord, Failure> {
        let Some(job) = self.jobs.get(&id) else {
            return match self.store.job(id)? {
                Some(j) if !caller.may_manage(&j) => Err(super::not_yours(id)),
                Some(j) => Err(refused(
                    ErrorKind::Conflict,
                    format!("job {id} has ended ({}): its steps with it", j.state),
                )),
                None => Err(refused(ErrorKind::NotFound, format!("no job {id}"))),
            };
        };
        if !caller.may_manage(job) {
            return Err(super::not_yours(id));
        }
        Ok(job)
    }

    /// Cancels step `step` of job `id` for `caller` (its owner or an admin: `wharf cancel
    /// ID.STEP`, as scancel's): its tasks are stopped as a caller's going away stops them, and
    /// its caller, if still there, hears it ended. Returns the step and the nodes to wake.
    ///
    /// Errors: `NotFound` for no such job or step, `PermissionDenied` for another user's
    /// job, `Conflict` for a job that is not running or a step that has already ended.
    pub fn cancel_user_step(
        &mut self,
        caller: &super::Caller,
        id: JobId,
        step: u32,
    ) -> Result<(StepRecord, Vec<String>), Failure> {
        let job = self.active_for_steps(caller, id)?;
        let label = job.label();
        let Some(found) = job.steps.iter().find(|s| s.id == step) else {
            if !job.state.holds_resources() {
                return Err(refused(
                    ErrorKind::Conflict,
                    format!("job {label} is {}: only a running job has steps", job.state),
                ));
            }
            let steps = job.steps.len();
            return Err(refused(
                ErrorKind::NotFound,
                format!("job {label} has no step {step} (it has had {steps})"),
            ));
        };
        if found.exit.is_some() || found.stop.is_some() {
            let how = match &found.exit {
                Some(_) => format!("ended {}", found.state()),
                None => "is already stopping".to_string(),
            };
            return Err(refused(
                ErrorKind::Conflict,
                format!("step {label}.{step} {how}"),
            ));
        }
        let key = StepKey { job: id, step };
        let nodes = self.cancel_step(key, &format!("cancelled by {}", caller.owner.user))?;
        Ok((self.step(key)?, nodes))
    }

    /// Takes in `node`'s report of its steps: starts and ends recorded. Returns the steps
    /// the agent may forget and the other nodes with step tasks to stop now.
    pub fn ingest_steps(
        &mut self,
        node: &str,
        reported: &[AgentStep],
        now: u64,
    ) -> Result<(Vec<StepKey>, BTreeSet<String>), Failure> {
        let mut changed: BTreeMap<JobId, JobRecord> = BTreeMap::new();
        let mut forget = Vec::new();
        let mut wake = BTreeSet::new();
        for s in reported {
            let key = s.key;
            let job = match changed.get(&key.job) {
                Some(j) => Some(j.clone()),
                None => self.jobs.get(&key.job).cloned(),
            };
            let found = job.and_then(|j| {
                let si = j.steps.iter().position(|st| st.id == key.step)?;
                let ni = j.steps[si].nodes.iter().position(|n| n.node == node)?;
                Some((j, si, ni))
            });
            let Some((mut job, si, ni)) = found else {
                // Of a job or step no longer here: the orders' pass kills a live one.
                if s.exit.is_some() {
                    forget.push(key);
                }
                continue;
            };
            let entry = &job.steps[si].nodes[ni];
            match &s.exit {
                Some(_) if entry.exit.is_some() => forget.push(key),
                Some(exit) => {
                    forget.push(key);
                    let step = job.steps[si].clone();
                    let was_stopping = step.stop.is_some();
                    let step = node_ended(
                        step,
                        ni,
                        exit.clone(),
                        s.start_time,
                        s.end_time.unwrap_or(now),
                    );
                    if step.stop.is_some() && !was_stopping {
                        wake.extend(
                            step.nodes
                                .iter()
                                .filter(|n| n.exit.is_none() && n.node != node)
                                .map(|n| n.node.clone()),
                        );
                    }
                    if let Some(e) = &step.exit {
                        tracing::info!(job = key.job, step = key.step, state = %e.final_state(), "step ended");
                    }
                    job.steps[si] = step;
                    changed.insert(job.id, job);
                }
                None => {
                    if let (Some(at), None) = (s.start_time, entry.start_time) {
                        job.steps[si].nodes[ni].start_time = Some(at);
                        let step = &mut job.steps[si];
                        if step.nodes.iter().all(|n| n.start_time.is_some()) {
                            step.start_time = step.nodes.iter().filter_map(|n| n.start_time).max();
                            // Only launch orders need it, and it is most of a record.
                            step.env.clear();
                        }
                        changed.insert(job.id, job);
                    }
                }
            }
        }
        // A stopped step's tasks that never started here never will.
        let reported: BTreeSet<StepKey> = reported.iter().map(|s| s.key).collect();
        let on: Vec<JobRecord> = self.jobs_on(node).cloned().collect();
        for job in on {
            let was_changed = changed.contains_key(&job.id);
            let mut job = changed.remove(&job.id).unwrap_or(job);
            let mut touched = was_changed;
            for si in 0..job.steps.len() {
                let step = &job.steps[si];
                let key = StepKey {
                    job: job.id,
                    step: step.id,
                };
                let Some(ni) = step.nodes.iter().position(|n| n.node == node) else {
                    continue;
                };
                let n = &step.nodes[ni];
                if step.stop.is_none() || n.start_time.is_some() || n.exit.is_some() {
                    continue;
                }
                if reported.contains(&key) {
                    continue;
                }
                let exit = ExitInfo {
                    cancelled: true,
                    message: Some("never started: the step was stopped first".into()),
                    ..Default::default()
                };
                job.steps[si] = node_ended(step.clone(), ni, exit, None, now);
                touched = true;
            }
            if touched {
                changed.insert(job.id, job);
            }
        }
        self.commit(changed.into_values().collect())?;
        Ok((forget, wake))
    }

    /// The step orders for `node`: launches of steps it has not started yet, and kills of
    /// those it runs that are being stopped, or that belong to no running step here. `held`
    /// are the steps it reported still running, `stopping` those it is stopping already.
    pub fn step_orders(
        &self,
        node: &str,
        held: &BTreeSet<StepKey>,
        stopping: &BTreeSet<StepKey>,
    ) -> (Vec<StepOrder>, Vec<StepKill>) {
        let mut launch = Vec::new();
        let mut kill = Vec::new();
        let mut known = BTreeSet::new();
        for job in self.jobs_on(node) {
            let (Some(spec), Some(rank)) = (&job.spec, job.rank_on(node)) else {
                continue;
            };
            let job_stopping =
                job.cancel_requested || job.stop.is_some() || !job.state.holds_resources();
            for step in &job.steps {
                let Some(ni) = step.nodes.iter().position(|n| n.node == node) else {
                    continue;
                };
                let key = StepKey {
                    job: job.id,
                    step: step.id,
                };
                let entry = &step.nodes[ni];
                if entry.exit.is_some() {
                    continue;
                }
                known.insert(key);
                let stop = step
                    .stop
                    .clone()
                    .or_else(|| job_stopping.then(|| format!("job {} is being stopped", job.id)));
                if held.contains(&key) {
                    if let Some(reason) = stop.filter(|_| !stopping.contains(&key)) {
                        kill.push(StepKill {
                            key,
                            reason: reason.clone(),
                        });
                    }
                    continue;
                }
                if stop.is_some() || entry.start_time.is_some() {
                    continue;
                }
                let alloc = &job.allocs[rank as usize];
                // Not before the job has started here: its image may still be on its way.
                if alloc.start_time.is_none() && !alloc.ended() {
                    continue;
                }
                // This node's share of an exclusive or `--mem=0` job, as its batch rank has.
                let mut spec = self.node_spec(job, spec, node, alloc);
                let files = output_files(&spec, job, step, node);
                (spec.output, spec.error) = files;
                spec.argv = step.argv.clone();
                // A step runs its command in each of its tasks, whatever the job's does.
                spec.once = false;
                spec.env = step_env(step);
                if let Some(dir) = &step.workdir {
                    spec.workdir = dir.clone();
                }
                spec.nodes = step.nodes.len() as u32;
                spec.tasks_per_node = step.tasks_per_node;
                spec.gpus_per_task = step.gpus_per_task;
                // Only the GPUs the step holds here, where it holds some: its tasks get them
                // as a job's tasks get the job's (devices, CUDA_VISIBLE_DEVICES, ...).
                let gpu_ids = gpus::visible(step.gpus_per_node, entry, &alloc.gpu_ids);
                spec.resources.gpus = gpu_ids.len() as u32;
                spec.resources.cpus = step_cpus(step.cpus_per_task, step.tasks_per_node, alloc);
                spec.time_limit = step.time_limit;
                launch.push(StepOrder {
                    step: step.id,
                    order: LaunchOrder {
                        id: job.id,
                        owner: job.owner.clone(),
                        spec,
                        cpu_ids: alloc.cpu_ids.clone(),
                        gpu_ids,
                        restarts: 0,
                        rendezvous: Rendezvous {
                            nodes: step.nodes.iter().map(|n| self.peer(&n.node)).collect(),
                            node_rank: ni as u32,
                            port: job.port,
                            step: Some(StepPlace {
                                id: step.id,
                                job_nodes: job.nodes().map(str::to_string).collect(),
                                job_restarts: job.restarts,
                            }),
                        },
                        registry_auth: self.credentials.get(job.id),
                        // A step starts in a job already running on every node.
                        hold: false,
                        stops_holders: false,
                    },
                    output: step.output.clone(),
                    input: step.input,
                    cpus_per_task: step.cpus_per_task,
                    own_time_limit: step.own_time_limit,
                    memory: entry.memory,
                });
            }
        }
        for key in held.difference(stopping) {
            if !known.contains(key) {
                kill.push(StepKill {
                    key: *key,
                    reason: format!("step {}.{} is not running on this node", key.job, key.step),
                });
            }
        }
        (launch, kill)
    }
}

#[cfg(test)]
mod gpu_tests;
#[cfg(test)]
pub(crate) mod tests;
