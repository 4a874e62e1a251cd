//! Steps on this node (`wharf step` from inside a job): the step socket that callers reach,
//! their identity, their step's tasks here and the report of them.
//!
//! **Who asks is the kernel's word.** The agent listens on an abstract Unix socket in the
//! node's network namespace (jobs share it), named in every job's `WHARF_STEP_SOCKET`. For
//! each connection it takes the caller's uid and a pidfd from the socket itself
//! (`SO_PEERCRED`, `SO_PEERPIDFD`), reads which cgroup the process is in, and accepts it
//! only if that is a job's sandbox here (`CGROUP_PARENT/wharf-J`, or a leaf under it: a task's
//! `wharf-J.L`, a step task's `wharf-J.sS.L`): only root can move a process into those cgroups. The pidfd is
//! checked to be alive after the read, so the pid cannot have been reused meanwhile. The
//! request itself names no job or user; the agent forwards the job and uid it found to the
//! controller over its authenticated channel, which checks that the uid owns the job.
//!
//! ```text
//!   wharf step ──line──▶ agent: peer cred + cgroup ─POST /v1/agent/steps─▶ controller
//!              ◀─Started─     ◀──── the step (id, nodes) ─────────────────
//!              ◀─Output──      every 200 ms (at once while more waits):
//!                              /v1/agent/steps/output/read until it ended and all is read
//!              ◀─Ended───      (the caller hangs up: /v1/agent/steps/cancel)
//!              ─InputLine─▶    its standard input, after the request, on the same
//!                              connection: /v1/agent/steps/input ([`crate::step_input`])
//! ```
//!
//! A caller from before streaming waits the same way on `/v1/agent/steps/status`. The
//! output itself reaches the controller from every node of the step through
//! [`crate::step_output`]; the input reaches the tasks that take it through
//! [`crate::step_input`].
//!
//! Task L of step S of job J lives in `jobs/J.sS.L` (beside the job's own: the job's report
//! never lists them, [`crate::launch::parse_task_dir_name`] does not read these names), its
//! sandbox `wharf-J.sS.L`, whose cgroup is a leaf of the job's cgroup `wharf-J`, beside the
//! job's tasks' leaves: the job's memory limit holds for the batch command and its steps
//! together.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use wharf_api::step::{
    AgentStep, StepKey, StepOrder, StepRecord, StepReply, StepRequest, StepStart,
};
use wharf_api::JobId;
use wharf_client::{Client, ClientError};
use wharf_runtime::{Backend, JobDir, JobStatus};

use crate::{AgentConfig, TaskReport};

/// Where a job whose root is an image finds `wharf` (the agent's own binary, bound read-only).
/// `/usr/local/bin` is on the `PATH` Wharf gives every job and on every distribution's default
/// one, so a job that sets its own `PATH` most likely keeps it; an image's own file there is
/// hidden for the job. The binary needs glibc 2.34 or later in the image.
pub const STEP_BINARY_PATH: &str = "/usr/local/bin/wharf";

/// The longest step request read from a caller, bytes.
pub const MAX_REQUEST: u64 = 1 << 20;

/// Most step calls of one job that have not sent their request yet, open on this node at
/// once. Each holds a descriptor and a buffer of the agent's, which every job on the node
/// needs: one job's processes must not take them all.
pub const MAX_CALLS_PER_JOB: usize = 64;

/// Longest a caller may take to send its request line: a connection that sends nothing
/// holds a descriptor and a buffer of the agent's.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Step calls open on this node, per job and in all: those still to send their request
/// ([`Calls::waiting`]), and those whose step runs ([`Calls::live`], a task farm's many
/// steps at once), each within its own share of the agent's descriptors.
#[derive(Debug)]
pub struct Calls {
    open: std::sync::Mutex<std::collections::BTreeMap<JobId, usize>>,
    per_job: usize,
    max_total: usize,
}

/// One open call, given back when dropped.
#[derive(Debug)]
pub struct Call<'a> {
    calls: &'a Calls,
    job: JobId,
}

impl Calls {
    /// Room for `per_job` calls of one job and `max_total` in all.
    pub fn new(per_job: usize, max_total: usize) -> Calls {
        Calls {
            open: Default::default(),
            per_job,
            max_total,
        }
    }

    /// The agent's soft descriptor limit (raised to its hard limit at start).
    fn nofile() -> usize {
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(soft, _)| {
                usize::try_from(soft).unwrap_or(usize::MAX)
            })
    }

    /// Calls yet to send their request: an eighth of the agent's descriptors in all, and
    /// an eighth of that, at most [`MAX_CALLS_PER_JOB`], for one job: it takes eight jobs
    /// holding silent calls to fill it.
    pub fn waiting() -> Calls {
        let total = (Self::nofile() / 8).max(64);
        Calls::new(MAX_CALLS_PER_JOB.min(total / 8), total)
    }

    /// Calls whose step runs: three eighths of the agent's descriptors in all, an eighth of
    /// that for one job.
    pub fn live() -> Calls {
        let total = (Self::nofile() / 8 * 3).max(64);
        Calls::new(total / 8, total)
    }

    /// A call of `job`'s, or why there is no room for it.
    pub fn open(&self, job: JobId) -> Result<Call<'_>, String> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = open.values().sum();
        let mine = open.get(&job).copied().unwrap_or(0);
        if mine >= self.per_job {
            return Err(format!(
                "job {job} has {mine} step calls open on this node; the limit is {}: wait \
                 for some to end",
                self.per_job
            ));
        }
        if total >= self.max_total {
            return Err(format!(
                "this node's agent has {total} step calls open, its limit; try again shortly"
            ));
        }
        *open.entry(job).or_insert(0) += 1;
        Ok(Call { calls: self, job })
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        let mut open = self.calls.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.job) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.job);
            }
        }
    }
}

/// How often a waiting caller's step is looked up.
pub(crate) const STATUS_EVERY: Duration = Duration::from_millis(200);

/// The abstract socket name (without its leading NUL) of the step socket of the agent whose
/// state lives in `state_dir`: one per agent, even for several agents in one network
/// namespace.
pub fn socket_name(node: &str, state_dir: &Path) -> String {
    // FNV-1a: stable across runs and builds, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in state_dir.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    let node: String = node
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
        .take(40)
        .collect();
    format!("wharf-step-{node}-{h:016x}")
}

/// The value of `WHARF_STEP_SOCKET` for jobs of this agent: the abstract name with `@`.
pub fn socket_env(cfg: &AgentConfig) -> String {
    format!("@{}", socket_name(&cfg.node_name, &cfg.state_dir))
}

/// The job whose sandbox a process is in, from its `/proc/PID/cgroup` text: the job's
/// cgroup directly under `cgroup_parent` (or a leaf in it: its tasks', its steps'), in the unified
/// hierarchy or the v1 memory hierarchy. `None` for any other process.
pub fn job_of_cgroup(text: &str, cgroup_parent: &str) -> Option<JobId> {
    let parent = cgroup_parent.trim_matches('/');
    let prefix = if parent.is_empty() {
        "/".to_string()
    } else {
        format!("/{parent}/")
    };
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let unified = controllers.is_empty();
        if !unified && !controllers.split(',').any(|c| c == "memory") {
            return None;
        }
        let name = path.strip_prefix(&prefix)?;
        let name = name.split('/').next()?.strip_prefix("wharf-")?;
        let id = name.split('.').next()?;
        let rest = &name[id.len()..];
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(id) {
            return None;
        }
        let well_formed = rest.is_empty()
            || crate::launch::parse_task_dir_name(name).is_some()
            || parse_dir_name(name).is_some();
        well_formed.then(|| id.parse().ok())?
    })
}

/// The directory name of task `local` of step `step` of job `job`.
pub fn dir_name(job: JobId, step: u32, local: u32) -> String {
    format!("{job}.s{step}.{local}")
}

/// A step task's directory found under the agent's `jobs`, its spec written.
#[derive(Debug)]
pub struct FoundTask {
    /// Its directory.
    pub path: std::path::PathBuf,
    /// Its job and step.
    pub key: StepKey,
    /// Its task on this node.
    pub local: u32,
    /// The directory, to read and write its files.
    pub dir: JobDir,
    /// What its shim was asked to run.
    pub spec: wharf_runtime::ContainerSpec,
}

/// Forgets from `known` the step tasks whose directory went, and returns those under `jobs`
/// it does not hold yet whose spec is written (the others are looked at again next time).
pub fn new_tasks<T>(
    jobs: &std::path::Path,
    known: &mut std::collections::BTreeMap<std::path::PathBuf, T>,
) -> Vec<FoundTask> {
    known.retain(|p, _| p.exists());
    let Ok(entries) = std::fs::read_dir(jobs) else {
        return vec![];
    };
    let mut found = vec![];
    for e in entries.flatten() {
        let path = e.path();
        if known.contains_key(&path) {
            continue;
        }
        let Some((job, step, local)) = e.file_name().to_str().and_then(parse_dir_name) else {
            continue;
        };
        let dir = JobDir::new(path.clone());
        let Ok(spec) = dir.read_spec() else { continue };
        found.push(FoundTask {
            path,
            key: StepKey { job, step },
            local,
            dir,
            spec,
        });
    }
    found
}

/// The job, step and task a directory name stands for ([`dir_name`]'s inverse).
pub fn parse_dir_name(name: &str) -> Option<(JobId, u32, u32)> {
    let canonical = |s: &str| -> Option<u64> {
        let n: u64 = s.parse().ok()?;
        (s.bytes().all(|b| b.is_ascii_digit()) && n.to_string() == s).then_some(n)
    };
    let (job, rest) = name.split_once(".s")?;
    let (step, local) = rest.split_once('.')?;
    Some((
        canonical(job)?,
        u32::try_from(canonical(step)?).ok()?,
        u32::try_from(canonical(local)?).ok()?,
    ))
}

/// Task directories of this node's steps, grouped by step, tasks in order.
fn step_dirs(state_dir: &Path) -> std::collections::BTreeMap<StepKey, Vec<(u32, JobDir)>> {
    let mut out: std::collections::BTreeMap<StepKey, Vec<(u32, JobDir)>> = Default::default();
    let Ok(entries) = std::fs::read_dir(state_dir.join("jobs")) else {
        return out;
    };
    for e in entries.flatten() {
        if let Some((job, step, local)) = e.file_name().to_str().and_then(parse_dir_name) {
            out.entry(StepKey { job, step })
                .or_default()
                .push((local, JobDir::new(e.path())));
        }
    }
    for dirs in out.values_mut() {
        dirs.sort_by_key(|(l, _)| *l);
    }
    out
}

/// The directories of this node's tasks of job `job`'s steps: of step `step` only, when
/// given.
pub(crate) fn dirs_of(cfg: &AgentConfig, job: JobId, step: Option<u32>) -> Vec<JobDir> {
    (step_dirs(&cfg.state_dir).into_iter())
        .filter(|(key, _)| key.job == job && step.is_none_or(|s| s == key.step))
        .flat_map(|(_, dirs)| dirs.into_iter().map(|(_, dir)| dir))
        .collect()
}

/// Stops the tasks in `dirs` that still run, recording `reason` (as a kill order does).
fn stop_tasks(launcher: &dyn Backend, dirs: &[(u32, JobDir)], reason: &str) {
    for (_, dir) in dirs {
        stop_task(launcher, dir, reason);
    }
}

/// Stops step task `dir` (once) with `reason`, unless it has ended; whether it was asked to
/// stop now.
pub(crate) fn stop_task(launcher: &dyn Backend, dir: &JobDir, reason: &str) -> bool {
    if dir.stop().exists() || matches!(launcher.status(dir), JobStatus::Exited(_)) {
        return false;
    }
    if JobDir::write_private(&dir.stop(), reason.as_bytes()).is_err() {
        return false;
    }
    if let Err(e) = launcher.cancel(dir) {
        tracing::warn!(dir = %dir.path().display(), error = %e, "cannot stop a step task");
        let _ = std::fs::remove_file(dir.stop());
        return false;
    }
    true
}

/// A task that this agent stopped (its output not taken, its caller gone, a sibling
/// failed) ends with the reason it was stopped for, which its shim never knew: the step's
/// end then says why rather than only its signal.
fn with_stop_reason(mut task: TaskReport, dir: &JobDir) -> TaskReport {
    if let Some(exit) = task.exit.as_mut().filter(|e| e.message.is_none()) {
        exit.message = std::fs::read_to_string(dir.stop())
            .ok()
            .filter(|why| !why.trim().is_empty())
            .map(wharf_api::text::bound_message);
    }
    task
}

/// This node's steps, each once for all its tasks here (as a job's tasks are reported).
/// When one task failed, its siblings here are stopped. The end of the job's batch command
/// on this node does not stop them: the job holds the node until its last rank ends, and
/// the controller orders the step stopped when the job ends.
pub fn report(cfg: &AgentConfig, launcher: &dyn Backend) -> Vec<AgentStep> {
    let mut out = Vec::new();
    for (key, dirs) in step_dirs(&cfg.state_dir) {
        let tasks: Vec<TaskReport> = dirs
            .iter()
            .map(|(local, dir)| {
                with_stop_reason(crate::task_report(launcher, *local, dir, true).0, dir)
            })
            .collect();
        // Ended, a task takes no more input either (its marker may never have been written:
        // one that ended before its input was set up).
        let input_closed: Vec<u32> = (dirs.iter().zip(&tasks))
            .filter(|((_, d), t)| t.exit.is_some() || d.stdin_closed().exists())
            .map(|((local, _), _)| *local)
            .collect();
        // Its end waits for its output: the caller gets all of it before the step's end.
        let held_back = dirs
            .iter()
            .any(|(_, d)| crate::step_output::is_held_back(d));
        if let Some((failed, _)) = crate::siblings_to_stop(&tasks, &cfg.node_name) {
            let reason = format!(
                "task {failed} of step {}.{} on node {} failed; stopping the others",
                key.job, key.step, cfg.node_name
            );
            let others: Vec<(u32, JobDir)> =
                dirs.into_iter().filter(|(l, _)| *l != failed).collect();
            stop_tasks(launcher, &others, &reason);
        }
        let node = crate::node_report(key.job, &tasks);
        let ended = node.exit.is_some();
        let exit = node.exit.filter(|_| !held_back);
        out.push(AgentStep {
            key,
            start_time: node.start_time,
            end_time: node.end_time.filter(|_| exit.is_some()),
            // What its tasks here used, slim (CPU time and memory peak): its job's record
            // carries every step's, and `wharf eff` counts them with the job's.
            exit: exit.map(|mut e| {
                e.usage = e.usage.map(|u| wharf_api::usage::JobUsage {
                    cpu_time_ms: u.cpu_time_ms,
                    memory_peak: u.memory_peak,
                    ..Default::default()
                });
                e.image_digest = None;
                e
            }),
            // Ended, its output still on its way: there is nothing left to stop.
            stopping: node.stopping || (ended && held_back),
            input_closed,
        });
    }
    out
}

/// Starts this node's tasks of a step (each in a sandbox of its own, the last first, like a
/// job's) unless they are here already; a task that cannot start is recorded as ended with
/// the reason, and those after it as never started.
pub fn launch(
    cfg: &AgentConfig,
    launcher: &dyn Backend,
    images: &wharf_images::ImageStore,
    machine: &crate::discover::Machine,
    so: &StepOrder,
) {
    let order = &so.order;
    tracing::info!(
        job = order.id,
        step = so.step,
        tasks = order.spec.tasks_per_node,
        "launching step"
    );
    let mut failed: Option<String> = None;
    for local in (0..order.spec.tasks_per_node.max(1)).rev() {
        let dir = JobDir::new(
            cfg.state_dir
                .join("jobs")
                .join(dir_name(order.id, so.step, local)),
        );
        if dir.path().exists() {
            continue;
        }
        let error = match &failed {
            Some(why) => Some((format!("never started: {why}"), None)),
            None => task_spec(cfg, images, machine, so, local)
                .and_then(|spec| {
                    launcher.launch(&dir, &spec).map_err(crate::launch::LaunchError::from)?;
                    if so.own_time_limit {
                        if let Err(e) = JobDir::write_private(&dir.own_time_limit(), b"1") {
                            // Its limit then follows the job's as a step's without one does.
                            tracing::warn!(job = order.id, step = so.step, error = %e, "cannot mark a step's own time limit");
                        }
                    }
                    Ok(())
                })
                .err()
                .map(|e| {
                    tracing::warn!(job = order.id, step = so.step, task = local, error = %e.message, "step launch failed");
                    failed = Some(format!("task {local} of the step could not start"));
                    (e.message.clone(), Some(e.fault()))
                }),
        };
        if let Some((message, fault)) = error {
            crate::record_not_started(&dir, order.id, message, fault);
        }
    }
}

/// The sandbox of task `local` of step order `so` on this node: a job task's
/// ([`crate::launch::container_spec`]) with the step's own id, streams, CPUs and memory.
fn task_spec(
    cfg: &AgentConfig,
    images: &wharf_images::ImageStore,
    machine: &crate::discover::Machine,
    so: &StepOrder,
    local: u32,
) -> Result<wharf_runtime::ContainerSpec, crate::launch::LaunchError> {
    let order = &so.order;
    let mut spec = crate::launch::container_spec(cfg, images, order, local, machine)?;
    spec.id = format!("wharf-{}", dir_name(order.id, so.step, local));
    // The streams its caller takes go to the task's directory, for
    // [`crate::step_output`] to pass on.
    (spec.capture_stdout, spec.capture_stderr) = so.output.captured();
    // The tasks that take the caller's input read it from a pipe that
    // [`crate::step_input`] writes into; the others read /dev/null.
    let rank = order.rendezvous.node_rank * order.spec.tasks_per_node.max(1) + local;
    spec.capture_stdin = so.input.takes(rank);
    // `-c`: the task's own CPUs of the job's, not an even split of them.
    if let Some(each) = so.cpus_per_task {
        spec.cpuset = crate::launch::step_cpuset(order, local, each, machine);
    }
    // `--mem`: the step's memory here split evenly among its tasks, each its own leaf of
    // the job's cgroup, which keeps the job's limit (from `order.spec`) over them all; the
    // step's is said in `SLURM_MEM_PER_NODE` (MiB), as Slurm's steps are told.
    if let Some(memory) = so.memory {
        spec.memory = Some(memory / u64::from(order.spec.tasks_per_node.max(1)));
        crate::launch::set_env(
            &mut spec.env,
            "SLURM_MEM_PER_NODE",
            &(memory >> 20).to_string(),
        );
    }
    if job_cgroup_is_flat(&cfg.state_dir, order.id) {
        spec.job_cgroup = None;
    }
    Ok(spec)
}

/// Whether job `id`'s first task here was started by an agent from before job cgroups held
/// their tasks' (its spec names none): its cgroup `wharf-J` then holds processes and can take
/// no leaf, so its steps' cgroups stay beside it, as that agent made them.
fn job_cgroup_is_flat(state_dir: &Path, id: JobId) -> bool {
    let dir = state_dir
        .join("jobs")
        .join(crate::launch::task_dir_name(id, 0));
    JobDir::new(dir)
        .read_spec()
        .is_ok_and(|s| s.job_cgroup.is_none())
}

/// Stops this node's tasks of `key`.
pub fn kill(cfg: &AgentConfig, launcher: &dyn Backend, key: StepKey, reason: &str) {
    if let Some(dirs) = step_dirs(&cfg.state_dir).remove(&key) {
        tracing::info!(job = key.job, step = key.step, %reason, "stopping step");
        stop_tasks(launcher, &dirs, reason);
    }
}

/// Stops this node's tasks of every step of `job`.
pub fn kill_job(cfg: &AgentConfig, launcher: &dyn Backend, job: JobId, reason: &str) {
    for (key, dirs) in step_dirs(&cfg.state_dir) {
        if key.job == job {
            stop_tasks(launcher, &dirs, reason);
        }
    }
}

/// Moves the time limits of job `job`'s steps on this node by `delta` seconds (at least 1 s
/// left of each), as the job's own moved: a step's limit is what its job had left when it
/// started, so it ends when the job does, before and after.
pub fn shift_limits(cfg: &AgentConfig, job: JobId, delta: i64) {
    for (key, dirs) in step_dirs(&cfg.state_dir) {
        if key.job != job {
            continue;
        }
        for (_, dir) in dirs {
            // A step's own limit stays: the job's end ends it all the same.
            if dir.own_time_limit().exists() {
                continue;
            }
            let Some(held) = dir.held_time_limit() else {
                continue;
            };
            let moved = (i128::from(held) + i128::from(delta)).clamp(1, i128::from(u64::MAX));
            if let Err(e) = dir.write_time_limit(moved as u64) {
                tracing::warn!(job, step = key.step, error = %e, "cannot record a step's time limit");
            }
        }
    }
}

/// Removes the directories of this node's tasks of `key` (its end here is committed).
pub fn forget(cfg: &AgentConfig, launcher: &dyn Backend, key: StepKey) {
    let dirs = step_dirs(&cfg.state_dir).remove(&key).unwrap_or_default();
    for (_, dir) in dirs.iter().rev() {
        if let Err(e) = launcher.remove(dir) {
            tracing::warn!(job = key.job, step = key.step, error = %e, "cannot remove a step's directory");
        }
    }
}

/// Listens on this agent's step socket for as long as the agent runs; each caller is served
/// on a task of its own.
///
/// Errors: the socket cannot be made (its name taken by another process).
pub fn listen(cfg: &AgentConfig, client: Client) -> io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    let name = socket_name(&cfg.node_name, &cfg.state_dir);
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
    std_listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(std_listener)?;
    let state = Arc::new((
        cfg.cgroup_parent.clone(),
        cfg.node_name.clone(),
        client,
        (Calls::waiting(), Calls::live()),
    ));
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let state = state.clone();
                    tokio::spawn(async move {
                        let (parent, node, client, calls) = &*state;
                        serve(stream, parent, node, client, calls).await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "step socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
    Ok(())
}

/// The caller's job and uid, from the kernel; an error with words for the caller.
fn identify(stream: &tokio::net::UnixStream, cgroup_parent: &str) -> Result<(JobId, u32), String> {
    let cred = stream
        .peer_cred()
        .map_err(|e| format!("cannot read the caller's credentials: {e}"))?;
    let pid = cred
        .pid()
        .filter(|&p| p > 0)
        .ok_or("the caller's process is not visible to the agent")?;
    // A pidfd for the very peer when the kernel gives one (Linux 6.5), else for the pid.
    let pidfd = peer_pidfd(stream)
        .or_else(|_| pidfd_open(pid))
        .map_err(|e| format!("cannot follow the caller's process {pid}: {e}"))?;
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| format!("cannot read the caller's cgroup: {e}"))?;
    // Still alive: the pid was not reused between the connection and the read.
    // SAFETY: a plain system call on a descriptor we own; no pointers but a null siginfo.
    let alive = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    } == 0;
    if !alive {
        return Err("the calling process went away".into());
    }
    let Some(job) = job_of_cgroup(&text, cgroup_parent) else {
        tracing::info!(pid, uid = cred.uid(), cgroup = %text.trim(), "step refused: the caller is in no job");
        return Err(
            "wharf step runs only inside a Wharf job: this process is in no job's \
                    sandbox on this node"
                .into(),
        );
    };
    Ok((job, cred.uid()))
}

/// `SO_PEERPIDFD`: a pidfd for the process that connected (Linux 6.5 and later).
fn peer_pidfd(stream: &tokio::net::UnixStream) -> io::Result<OwnedFd> {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` and `len` are valid for the kernel to write an int into.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 || fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: a plain system call.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

pub(crate) async fn reply<W: tokio::io::AsyncWrite + Unpin>(stream: &mut W, r: &StepReply) {
    let mut line = serde_json::to_vec(r).unwrap_or_default();
    line.push(b'\n');
    let _ = stream.write_all(&line).await;
}

/// How long one ask for a step that waits for GPUs may be held by the controller: between
/// two, the agent sees whether the caller went away.
const GPU_WAIT: Duration = Duration::from_secs(10);

/// Least time between two asks for a step that waits, whatever the controller answers.
const MIN_ASK: Duration = Duration::from_secs(1);

/// Whether the controller answered that the step waits for GPUs its job's other steps hold.
fn waits_for_gpus(e: &ClientError) -> bool {
    matches!(e, ClientError::Api { error, .. } if error.kind == wharf_api::wire::ErrorKind::Unavailable)
}

/// Each job's turn to hold an ask for a waiting step (see [`wait_turn`]).
type Turns = std::sync::Mutex<std::collections::BTreeMap<JobId, Arc<tokio::sync::Mutex<()>>>>;

fn turns() -> &'static Turns {
    static TURNS: std::sync::OnceLock<Turns> = std::sync::OnceLock::new();
    TURNS.get_or_init(Default::default)
}

/// Waits for job `job`'s turn to hold an ask for a step that waits for GPUs, looking each
/// second whether the caller hung up meanwhile (`None`). A job's entry goes once no step of
/// it waits.
async fn wait_turn<R: tokio::io::AsyncRead + Unpin>(
    job: JobId,
    rd: &mut BufReader<R>,
) -> Option<tokio::sync::OwnedMutexGuard<()>> {
    let lock = {
        let mut all = turns().lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|_, l| Arc::strong_count(l) > 1);
        all.entry(job).or_default().clone()
    };
    loop {
        tokio::select! {
            guard = lock.clone().lock_owned() => return Some(guard),
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                if hung_up(rd).await {
                    return None;
                }
            }
        }
    }
}

/// Whether the caller of a step not yet started hung up: it sends nothing more before its
/// step starts, so anything read is its end (or input it sent early, left in the buffer).
async fn hung_up<R: tokio::io::AsyncRead + Unpin>(rd: &mut BufReader<R>) -> bool {
    match tokio::time::timeout(Duration::from_millis(1), rd.fill_buf()).await {
        Ok(Ok(buf)) => buf.is_empty(),
        Ok(Err(_)) => true,
        Err(_) => false,
    }
}

pub(crate) fn api_words(e: &ClientError) -> String {
    match e {
        ClientError::Api { error, .. } => error.error.clone(),
        other => other.to_string(),
    }
}

/// Serves one caller: identify, forward, pass its input on, wait for the step's end (or
/// cancel it when the caller hangs up).
async fn serve(
    mut stream: tokio::net::UnixStream,
    cgroup_parent: &str,
    node: &str,
    client: &Client,
    (waiting, live): &(Calls, Calls),
) {
    let (job, uid) = match identify(&stream, cgroup_parent) {
        Ok(who) => who,
        Err(why) => return reply(&mut stream, &StepReply::Error(why)).await,
    };
    let call = match waiting.open(job) {
        Ok(call) => call,
        Err(why) => return reply(&mut stream, &StepReply::Error(why)).await,
    };
    let (rd, mut wr) = stream.into_split();
    // Kept past the request: the caller's input lines follow it.
    let mut rd = BufReader::new(rd);
    let mut line = Vec::new();
    let read = tokio::time::timeout(
        REQUEST_TIMEOUT,
        (&mut rd).take(MAX_REQUEST + 1).read_until(b'\n', &mut line),
    )
    .await
    .unwrap_or_else(|_| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no request within {}s", REQUEST_TIMEOUT.as_secs()),
        ))
    });
    if let Err(e) = read {
        return reply(
            &mut wr,
            &StepReply::Error(format!("reading the request: {e}")),
        )
        .await;
    }
    if line.len() as u64 > MAX_REQUEST {
        let why = format!("step request over {MAX_REQUEST} bytes");
        return reply(&mut wr, &StepReply::Error(why)).await;
    }
    let request: StepRequest = match serde_json::from_slice(&line) {
        Ok(r) => r,
        Err(e) => {
            let why = format!("bad step request: {e}");
            return reply(&mut wr, &StepReply::Error(why)).await;
        }
    };
    // Sent: it counts among the live calls from now on.
    drop(call);
    let _call = match live.open(job) {
        Ok(call) => call,
        Err(why) => return reply(&mut wr, &StepReply::Error(why)).await,
    };
    let streamed = request.output.stream;
    let key = match request.resume {
        // A caller waiting again (this agent restarted meanwhile): a step of its own job.
        Some(step) => StepKey { job, step },
        None => {
            let mut start = StepStart {
                node: node.to_string(),
                job,
                uid,
                request,
                // The first answer comes at once: a step that waits says so to its caller.
                wait_ms: 0,
            };
            // A 401 made nothing: the node is joining again (see `node_key`), so it is asked
            // again for a while.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            let mut turn: Option<tokio::sync::OwnedMutexGuard<()>> = None;
            let step: StepRecord = loop {
                let asked = tokio::time::Instant::now();
                match client.post("/v1/agent/steps", &start).await {
                    Ok(s) => break s,
                    Err(e) if e.is_unauthorized() && tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    // GPUs it asks for are held by the job's other steps: asked again, the
                    // controller holding the answer until one ends, for as long as the
                    // caller is there.
                    Err(e) if waits_for_gpus(&e) => {
                        if start.wait_ms == 0 {
                            reply(&mut wr, &StepReply::Waiting(api_words(&e))).await;
                            start.wait_ms = GPU_WAIT.as_millis() as u64;
                        } else if let Some(rest) = MIN_ASK.checked_sub(asked.elapsed()) {
                            // Answered without the wait it asked for (a controller that
                            // cannot take steps now answers the same): not asked again at
                            // once, or the two would spin.
                            tokio::time::sleep(rest).await;
                        }
                        drop(turn.take());
                        if hung_up(&mut rd).await {
                            return;
                        }
                        // One held ask per job at a time: a job's waiting steps take turns,
                        // so however many it starts they hold one of the node's connections
                        // to the controller, not one each.
                        match wait_turn(job, &mut rd).await {
                            Some(t) => turn = Some(t),
                            None => return,
                        }
                    }
                    Err(e) => return reply(&mut wr, &StepReply::Error(api_words(&e))).await,
                }
            };
            let key = StepKey { job, step: step.id };
            reply(&mut wr, &StepReply::Started(step)).await;
            key
        }
    };
    let mut caller = crate::step_input::Caller::start(rd, node, key, client);
    if streamed {
        return crate::step_output::pass_on_to_caller(wr, &mut caller, node, key, client).await;
    }
    loop {
        if caller.hung_up_within(STATUS_EVERY, key, client).await {
            return;
        }
        match client
            .post::<_, StepRecord>("/v1/agent/steps/status", &key)
            .await
        {
            Ok(s) if s.exit.is_some() => return reply(&mut wr, &StepReply::Ended(s)).await,
            Ok(_) => {}
            Err(e) if e.agent_retries() => {}
            Err(e) => return reply(&mut wr, &StepReply::Error(api_words(&e))).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_of_the_jobs_limit_moves_its_steps_but_those_with_their_own() {
        let root = tempfile::tempdir().unwrap();
        let cfg = crate::launch::tests::cfg(root.path());
        let jobs = cfg.state_dir.join("jobs");
        let task = |step: u32, limit: u64, own: bool| {
            let dir = JobDir::new(jobs.join(dir_name(7, step, 0)));
            std::fs::create_dir_all(dir.path()).unwrap();
            dir.write_time_limit(limit).unwrap();
            if own {
                JobDir::write_private(&dir.own_time_limit(), b"1").unwrap();
            }
            dir
        };
        let (follows, own) = (task(0, 3_000, false), task(1, 60, true));
        shift_limits(&cfg, 7, 600);
        assert_eq!(follows.held_time_limit(), Some(3_600));
        assert_eq!(own.held_time_limit(), Some(60), "its own limit stays");
        shift_limits(&cfg, 7, -3_000);
        assert_eq!(follows.held_time_limit(), Some(600));
        assert_eq!(own.held_time_limit(), Some(60));
    }

    #[test]
    fn step_calls_are_bounded_per_job_and_in_all_and_given_back_when_they_end() {
        let calls = Calls::new(MAX_CALLS_PER_JOB, 100);
        let mine: Vec<_> = (0..MAX_CALLS_PER_JOB)
            .map(|_| calls.open(1).unwrap())
            .collect();
        let e = calls.open(1).unwrap_err();
        assert!(e.contains("job 1 has 64 step calls open"), "{e}");
        // Another job still gets in, up to the total.
        let theirs: Vec<_> = (0..36).map(|_| calls.open(2).unwrap()).collect();
        let e = calls.open(3).unwrap_err();
        assert!(e.contains("100 step calls open, its limit"), "{e}");
        drop(theirs);
        drop(mine);
        assert!(calls.open.lock().unwrap().is_empty());
        calls.open(1).unwrap();
    }

    #[test]
    fn a_task_the_agent_stopped_ends_with_the_reason_unless_it_has_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let task = JobDir::new(dir.path().to_path_buf());
        let ended = |message: Option<&str>| TaskReport {
            local: 0,
            start_time: Some(1),
            exit: Some(wharf_api::ExitInfo {
                signal: Some(15),
                message: message.map(String::from),
                ..Default::default()
            }),
            end_time: Some(2),
            stopping: true,
            time_limit: None,
        };
        let message = |t: TaskReport| t.exit.and_then(|e| e.message);
        // Not stopped by the agent: as the shim said.
        assert_eq!(message(with_stop_reason(ended(None), &task)), None);
        std::fs::write(task.stop(), "its output could not be passed on").unwrap();
        assert_eq!(
            message(with_stop_reason(ended(None), &task)).as_deref(),
            Some("its output could not be passed on")
        );
        // The task's own words (its shim's) come first.
        assert_eq!(
            message(with_stop_reason(ended(Some("oom")), &task)).as_deref(),
            Some("oom")
        );
        // Running: nothing to say yet.
        let running = TaskReport {
            exit: None,
            ..ended(None)
        };
        assert!(with_stop_reason(running, &task).exit.is_none());
    }

    #[test]
    fn a_process_belongs_to_the_job_whose_sandbox_cgroup_holds_it() {
        let v2 = "0::/wharf/wharf-12\n";
        assert_eq!(job_of_cgroup(v2, "wharf"), Some(12));
        assert_eq!(job_of_cgroup("0::/wharf/wharf-12.3\n", "/wharf/"), Some(12));
        assert_eq!(
            job_of_cgroup("0::/wharf/wharf-12.s4.0/x\n", "wharf"),
            Some(12)
        );
        // The leaves under the job's cgroup: a task's, a step task's.
        for leaf in ["wharf-12", "wharf-12.1", "wharf-12.s4.0"] {
            let text = format!("0::/wharf/wharf-12/{leaf}\n");
            assert_eq!(job_of_cgroup(&text, "wharf"), Some(12), "{text}");
        }
        let v1 = "12:pids:/user.slice\n7:memory:/wharf-e2e-1/wharf-40\n1:name=systemd:/x\n";
        assert_eq!(job_of_cgroup(v1, "wharf-e2e-1"), Some(40));
        // Not under the agent's parent, not the memory hierarchy, or not a job's name.
        for text in [
            "0::/user.slice/wharf/wharf-12\n",
            "0::/other/wharf-12\n",
            "3:pids:/wharf/wharf-12\n",
            "0::/wharf/wharf-x\n",
            "0::/wharf/wharf-12.s\n",
            "0::/wharf/wharf-12.0\n",
            "0::/wharf/wharf-\n",
            "0::/wharf\n",
        ] {
            assert_eq!(job_of_cgroup(text, "wharf"), None, "{text}");
        }
    }

    #[test]
    fn a_job_started_without_a_job_cgroup_keeps_its_steps_beside_it() {
        let state = tempfile::tempdir().unwrap();
        std::fs::create_dir(state.path().join("jobs")).unwrap();
        // No task of the job here: its steps get the job's cgroup like its tasks would.
        assert!(!job_cgroup_is_flat(state.path(), 12));
        let mut spec = wharf_runtime::conformance::template("wharf-12", Path::new("/"), 1, 1);
        let task = JobDir::new(state.path().join("jobs/12"));
        task.create(&spec).unwrap();
        assert!(
            job_cgroup_is_flat(state.path(), 12),
            "an older agent's task"
        );
        spec.job_cgroup = Some(wharf_runtime::JobCgroupSpec {
            name: "wharf-12".into(),
            memory: Some(1 << 30),
            cpuset: vec![],
            pids: None,
        });
        JobDir::write_atomic(&task.spec(), &spec).unwrap();
        assert!(!job_cgroup_is_flat(state.path(), 12));
    }

    #[test]
    fn a_steps_memory_is_split_among_its_tasks_and_the_jobs_cgroup_keeps_the_jobs() {
        let (dev, order) = crate::launch::tests::host_order(9, 1 << 30, 2);
        let cfg = crate::launch::tests::cfg(dev.path());
        let images = wharf_images::ImageStore::open(dev.path().join("images")).unwrap();
        let machine = crate::launch::tests::four_cpus();
        let mut so = StepOrder {
            step: 3,
            order,
            output: Default::default(),
            input: Default::default(),
            cpus_per_task: None,
            own_time_limit: false,
            memory: None,
        };
        let env = |spec: &wharf_runtime::ContainerSpec, var: &str| {
            let var = format!("{var}=");
            let mut found = spec.env.iter().filter_map(|e| e.strip_prefix(&var));
            let value = found.next().map(str::to_string);
            assert!(found.next().is_none(), "{var} set twice");
            value
        };
        // Without its own: each task its part of the job's.
        let task = task_spec(&cfg, &images, &machine, &so, 1).unwrap();
        assert_eq!(task.id, "wharf-9.s3.1");
        assert_eq!(task.memory, Some(1 << 29));
        assert_eq!(env(&task, "SLURM_MEM_PER_NODE").as_deref(), Some("1024"));
        // `--mem 256M`: 128M each, told as the step's 256; the job's cgroup keeps 1G.
        so.memory = Some(256 << 20);
        let task = task_spec(&cfg, &images, &machine, &so, 1).unwrap();
        assert_eq!(task.memory, Some(128 << 20));
        assert_eq!(env(&task, "SLURM_MEM_PER_NODE").as_deref(), Some("256"));
        assert_eq!(task.job_cgroup.and_then(|j| j.memory), Some(1 << 30));
    }

    #[test]
    fn step_directories_are_named_for_job_step_and_task_and_read_back() {
        assert_eq!(dir_name(7, 2, 0), "7.s2.0");
        assert_eq!(parse_dir_name("7.s2.0"), Some((7, 2, 0)));
        assert_eq!(parse_dir_name("7.s12.3"), Some((7, 12, 3)));
        for bad in ["7", "7.1", "7.s2", "7.s02.0", "7.s2.x", "x.s1.0", "7.s-1.0"] {
            assert_eq!(parse_dir_name(bad), None, "{bad}");
        }
        // A job's report never takes a step's directory for one of its tasks.
        assert_eq!(crate::launch::parse_task_dir_name("7.s2.0"), None);
    }

    #[test]
    fn each_agent_has_its_own_socket_name() {
        let a = socket_name("n1", Path::new("/var/lib/wharf"));
        assert!(a.starts_with("wharf-step-n1-"));
        assert_ne!(a, socket_name("n1", Path::new("/var/lib/wharf2")));
        assert_eq!(a, socket_name("n1", Path::new("/var/lib/wharf")));
    }
}
