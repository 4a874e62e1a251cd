//! A job's ranks from launch to the job's end. A node runs the job's tasks there (one, or
//! `tasks_per_node` each in its own sandbox) and reports them as one: started once all have,
//! ended once all have, as the first that failed did (its local index in
//! [`ExitInfo::task`]); its agent stops the others there when one fails. Here a "rank" is
//! such a node's share, by its node's rank; the task ranks in words (`rank 5 on node n2`)
//! are global: node rank times tasks per node plus local index. A one-node job is a gang of
//! one and goes through the same steps.
//!
//! ```text
//!   every rank's node has confirmed its start ─────────────────▶ job RUNNING
//!   a rank ends badly (exit ≠ 0, signal, OOM, time limit)  ──▶ stop RankFailed: kill the rest
//!   a node stops answering                                  ──▶ stop NodeLost: kill the rest
//!   a launch fails by its node's fault (or an outage)       ──▶ stop LaunchFault: kill the
//!       rest; then requeued (NODE_FAIL, or FAILED for an outage, when it may not be)
//!   cancel, preemption, `wharf requeue`                     ──▶ kill every rank
//!   every rank has ended (or its node is lost)              ──▶ the job ends (or is requeued):
//!       COMPLETED when every rank exited 0; otherwise as the deciding rank ended (the one that
//!       failed first, else the one the stop is about), its exit code the job's.
//! ```
//!
//! A gang starts in two phases. Each node first prepares its rank (the order comes with
//! `hold`: image pulled, every task's preflight run: user, devices, RDMA, memlock) and reports
//! it ready; once every node has, the same order goes out again without `hold` and the ranks
//! start. A node whose preflight fails reports its rank ended as any failed launch does, so
//! the ranks still waiting elsewhere are stopped before any ran its command. A one-node job
//! is never held: it costs no extra round trip.
//!
//! ```text
//!   order with hold ─▶ node prepares ─▶ ready ─┐ every node ready ──▶ order without hold
//!                          └─ preflight fails ─┴─▶ stop: kill the prepared ranks (never run)
//! ```
//!
//! A rank ending with status 0 while others still run (a torchrun agent that is done) stops
//! nothing. Until the last rank has ended the job keeps all of its nodes, so that no new job
//! starts beside a rank that is still being stopped.

use std::collections::BTreeSet;

use wharf_api::fault::FaultKind;
use wharf_api::job::MAX_LAUNCH_FAULTS;
use wharf_api::usage::JobUsage;
use wharf_api::wire::{KillOrder, LaunchOrder, Peer, Rendezvous};
use wharf_api::{ExitInfo, JobId, JobRecord, JobState, Stop};

use super::{finish, requeue, Cluster};

/// What a job's change in its ranks came to.
pub(super) struct Settled {
    /// The job's new record.
    pub job: JobRecord,
    /// A run that ended in a requeue, charged to fair share (a job that ends is charged when
    /// it is committed).
    pub charge: Option<JobRecord>,
}

/// Rank `rank` has started at `at` (its agent's word); the job is RUNNING once all have.
pub(super) fn rank_started(mut job: JobRecord, rank: usize, at: u64) -> JobRecord {
    job.allocs[rank].start_time = Some(at);
    if job.state == JobState::Starting && job.allocs.iter().all(|a| a.start_time.is_some()) {
        job.state = JobState::Running;
        job.start_time = job.allocs.iter().filter_map(|a| a.start_time).min();
        job.reason = None;
    }
    job
}

/// Rank `rank`'s node has prepared it and waits for the release; once every rank is ready
/// their nodes are sent the order that starts them (see [`Cluster::orders`]).
pub(super) fn rank_ready(mut job: JobRecord, rank: usize) -> JobRecord {
    job.allocs[rank].ready = true;
    if released(&job) {
        job.reason = Some(format!(
            "starting on {}: every node is ready",
            job.nodelist()
        ));
    } else {
        let ready = job.allocs.iter().filter(|a| a.ready).count();
        job.reason = Some(format!(
            "starting on {}: {ready} of {} nodes ready",
            job.nodelist(),
            job.allocs.len()
        ));
    }
    job
}

/// Whether `job`'s ranks may start: a gang's once every node has prepared its rank (or
/// started it: an agent that predates the barrier launches at once and never says ready);
/// a one-node job at once.
pub(super) fn released(job: &JobRecord) -> bool {
    job.allocs.len() < 2 || job.allocs.iter().all(|a| a.ready || a.start_time.is_some())
}

/// Rank `rank` has ended as `exit` says, at `end`. When it ended badly and nothing stops the
/// job yet, its other ranks are to be stopped: [`Stop::LaunchFault`] when its launch failed
/// through no fault of the job's (the job goes back to the queue, up to
/// [`MAX_LAUNCH_FAULTS`] times, when it allows it), else [`Stop::RankFailed`] for a gang.
pub(super) fn rank_ended(
    mut job: JobRecord,
    rank: usize,
    mut exit: ExitInfo,
    start: Option<u64>,
    end: u64,
) -> JobRecord {
    exit.message = exit.message.map(wharf_api::text::bound_message);
    let failed = exit.final_state() != JobState::Completed;
    // Only a launch can fail by a fault: a rank that ran ended as its job did.
    let fault = exit
        .fault
        .filter(|f| f.kind != FaultKind::Job && start.is_none());
    let alloc = &mut job.allocs[rank];
    alloc.start_time = alloc.start_time.or(start);
    alloc.end_time = Some(end);
    alloc.exit = Some(exit);
    let node = alloc.node.clone();
    let task = alloc.exit.as_ref().and_then(|e| e.task).unwrap_or(0);
    let per_node = job.tasks_per_node();
    let free = job.stop.is_none() && !job.cancel_requested;
    if let (Some(fault), true) = (fault, free) {
        let allowed = job.spec.as_ref().is_none_or(|s| s.requeue);
        let requeue = allowed && job.launch_faults < MAX_LAUNCH_FAULTS;
        job.launch_faults += 1;
        let stop = Stop::LaunchFault {
            node,
            rank: task_rank(rank, per_node, task),
            fault,
            requeue,
        };
        tracing::info!(job = job.id, %stop, requeue, "launch failed through no fault of the job");
        job.reason = Some(if total_tasks(&job) > 1 {
            format!("{stop}; stopping the other ranks")
        } else {
            stop.to_string()
        });
        job.stop = Some(stop);
    } else if failed && total_tasks(&job) > 1 && free {
        let stop = Stop::RankFailed {
            node,
            rank: task_rank(rank, per_node, task),
        };
        tracing::info!(job = job.id, %stop, "stopping the job's other ranks");
        job.reason = Some(format!("{stop}; stopping the other ranks"));
        job.stop = Some(stop);
    } else if rank == 0 && job.allocs.len() > 1 && free && job.runs_once() {
        // Its other nodes run nothing of their own: they held on for the script's steps.
        let stop = Stop::BatchEnded { node };
        tracing::info!(job = job.id, %stop, "stopping the job's other nodes");
        job.reason = Some(format!("{stop}; stopping its other nodes"));
        job.stop = Some(stop);
    }
    job
}

/// The rank on `node` is gone with its node (`why` says how): taken as ended now. When nothing
/// stops the job yet, its other ranks are to be stopped ([`Stop::NodeLost`]), and the job is
/// requeued afterwards when `requeue` and the job allow it, else it ends NODE_FAIL.
pub(super) fn rank_lost(
    mut job: JobRecord,
    rank: usize,
    why: String,
    requeue: bool,
    now: u64,
) -> JobRecord {
    let alloc = &mut job.allocs[rank];
    alloc.end_time = Some(now);
    alloc.exit = Some(ExitInfo {
        message: Some(why.clone()),
        ..ExitInfo::default()
    });
    let node = alloc.node.clone();
    if job.stop.is_none() && !job.cancel_requested {
        let requeue = requeue && job.spec.as_ref().is_none_or(|s| s.requeue);
        job.stop = Some(Stop::NodeLost { node, requeue });
        job.reason = Some(if job.allocs.len() > 1 {
            format!("{why}; stopping the other ranks")
        } else {
            why
        });
    }
    job
}

/// The rank on `node` of a job being stopped was never started there: nothing to stop.
pub(super) fn rank_never_started(mut job: JobRecord, rank: usize, now: u64) -> JobRecord {
    let alloc = &mut job.allocs[rank];
    alloc.end_time = Some(now);
    alloc.exit = Some(ExitInfo {
        cancelled: true,
        message: Some("never started: the job was stopped first".into()),
        ..ExitInfo::default()
    });
    job
}

impl Cluster {
    /// The spec a node launches `job` with: its own, with the whole nodes an exclusive run
    /// holds, naming the partition, account and QoS the job runs under where it gave none (the job's `SLURM_JOB_PARTITION`,
    /// `SLURM_JOB_ACCOUNT` and `SLURM_JOB_QOS`).
    pub(super) fn launch_spec(
        &self,
        job: &JobRecord,
        spec: &wharf_api::JobSpec,
    ) -> wharf_api::JobSpec {
        let mut spec = spec.clone();
        if spec.exclusive || spec.memory_whole {
            // Its run's whole nodes, or their whole memory.
            spec.resources = job.resources;
        }
        if spec.partition.is_none() {
            spec.partition = Some(self.partition_name(job));
        }
        if spec.account.is_none() {
            spec.account = Some(self.assoc(job).account);
        }
        if spec.qos.is_none() {
            spec.qos = wharf_core::cycle::qos(&self.sched, None);
        }
        spec
    }

    /// [`Cluster::launch_spec`] for the node `node` of `job`, holding `alloc` there: a job
    /// that takes whole nodes, or each node's whole memory (`--mem=0`), gets this node's, not
    /// its first node's (the nodes of a gang need not be alike). Its steps' orders start from
    /// it too.
    pub(super) fn node_spec(
        &self,
        job: &JobRecord,
        spec: &wharf_api::JobSpec,
        node: &str,
        alloc: &wharf_api::NodeAlloc,
    ) -> wharf_api::JobSpec {
        let memory = self.node_memory(job, spec, node);
        let mut spec = self.launch_spec(job, spec);
        spec.resources.memory = memory;
        if !self.nodes.contains_key(node) {
            return spec;
        }
        if spec.exclusive {
            spec.resources.cpus = alloc.cpu_ids.len() as u32;
            spec.resources.gpus = alloc.gpu_ids.len() as u32;
        }
        spec
    }

    /// The memory `job` (of `spec`) holds on `node`: what it asked for on each node, or the
    /// node's whole memory for a job that takes whole nodes or asked for `--mem=0` (its
    /// run's, where the node is no longer known).
    pub(super) fn node_memory(
        &self,
        job: &JobRecord,
        spec: &wharf_api::JobSpec,
        node: &str,
    ) -> u64 {
        if !(spec.exclusive || spec.memory_whole) {
            return spec.resources.memory;
        }
        self.nodes
            .get(node)
            .map_or(job.resources.memory, |n| n.info.capacity().memory)
    }

    /// Node `name` as a job's peers reach it: its fabric address when its agent has one.
    pub(super) fn peer(&self, name: &str) -> Peer {
        let info = self.nodes.get(name).map(|n| &n.info);
        Peer {
            name: name.to_string(),
            address: info
                .map(|i| {
                    i.fabric_address
                        .clone()
                        .unwrap_or_else(|| i.address.clone())
                })
                .unwrap_or_else(|| name.to_string()),
        }
    }

    /// Orders for a node given what it holds: launches of the ranks allocated to it that it
    /// does not have (each with the job's whole peer list and its own rank; a gang's with
    /// `hold` until every node has reported its rank ready), the releases of the ranks it
    /// holds `prepared` once every node of their gang is ready, kills for the ranks of jobs
    /// being stopped (cancel, preemption, another rank failed or its node lost) and for jobs
    /// it runs that are not (or no longer) its, except those it already reports `stopping`.
    pub fn orders(
        &self,
        node: &str,
        held: &BTreeSet<JobId>,
        stopping: &BTreeSet<JobId>,
        prepared: &BTreeSet<JobId>,
    ) -> (Vec<LaunchOrder>, Vec<KillOrder>) {
        let mut launch = Vec::new();
        let mut kill = Vec::new();
        for job in self.jobs_on(node) {
            let Some(rank) = job.rank_on(node) else {
                continue;
            };
            let alloc = &job.allocs[rank as usize];
            let stop_asked = job.cancel_requested || job.stop.is_some();
            let fresh = alloc.start_time.is_none() && !alloc.ended();
            let order = |hold: bool| {
                job.spec.as_ref().map(|spec| LaunchOrder {
                    id: job.id,
                    owner: job.owner.clone(),
                    spec: self.node_spec(job, spec, node, alloc),
                    cpu_ids: alloc.cpu_ids.clone(),
                    gpu_ids: alloc.gpu_ids.clone(),
                    restarts: job.restarts,
                    rendezvous: Rendezvous {
                        nodes: job.nodes().map(|n| self.peer(n)).collect(),
                        node_rank: rank,
                        port: job.port,
                        step: None,
                    },
                    registry_auth: self.credentials.get(job.id),
                    hold,
                    stops_holders: job.runs_once(),
                })
            };
            if !held.contains(&job.id) {
                if job.state == JobState::Starting && fresh && !stop_asked {
                    launch.extend(order(!released(job)));
                }
            } else if stopping.contains(&job.id) {
                // Its agent is stopping it already: nothing to repeat.
            } else if alloc.ended() {
                // Taken for ended (its node was lost, then came back): it must not run on.
                kill.push(KillOrder {
                    id: job.id,
                    reason: wharf_api::wire::NOT_ACTIVE_HERE.into(),
                });
            } else if stop_asked {
                let reason = match &job.stop {
                    Some(stop) if !job.cancel_requested => stop.to_string(),
                    _ => "cancelled".into(),
                };
                kill.push(KillOrder { id: job.id, reason });
            } else if prepared.contains(&job.id)
                && job.state == JobState::Starting
                && fresh
                && released(job)
            {
                launch.extend(order(false));
            }
        }
        for id in held.difference(stopping) {
            let mine = self
                .jobs
                .get(id)
                .is_some_and(|j| j.state.holds_resources() && j.rank_on(node).is_some());
            if !mine {
                kill.push(KillOrder {
                    id: *id,
                    reason: wharf_api::wire::NOT_ACTIVE_HERE.into(),
                });
            }
        }
        (launch, kill)
    }

    /// The job once its ranks have changed: as it is while some rank still runs, else ended
    /// (or requeued) as its ranks and its stop say.
    pub(super) fn settle(&self, job: JobRecord, now: u64) -> Settled {
        if job.allocs.is_empty() || !job.allocs.iter().all(|a| a.ended()) {
            return Settled { job, charge: None };
        }
        let rank = deciding_rank(&job);
        let mut exit = job.allocs[rank].exit.clone().unwrap_or_default();
        exit.usage = merged_usage(&job);
        let start = job.allocs.iter().filter_map(|a| a.start_time).min();
        let end = job
            .allocs
            .iter()
            .filter_map(|a| a.end_time)
            .max()
            .unwrap_or(now);
        let stop = job.stop.clone();
        let cancelled = job.cancel_requested;
        // Nodes that may still list this run: a requeued job waits for each to let go.
        let up: Vec<String> = job
            .nodes()
            .filter(|n| self.nodes.get(*n).is_some_and(|e| e.up))
            .map(str::to_string)
            .collect();
        let gang = total_tasks(&job) > 1;
        let node = job.allocs[rank].node.clone();
        let task = task_rank(rank, job.tasks_per_node(), exit.task.unwrap_or(0));
        let mut ended = finish(job, &exit, start, end);
        match stop {
            Some(stop @ Stop::NodeLost { .. }) if !cancelled => {
                if stop.requeues() {
                    return Settled {
                        job: requeue::stopped(ended.clone(), &stop, up),
                        charge: Some(ended),
                    };
                }
                ended.state = JobState::NodeFail;
                ended.reason = exit.message.clone().or_else(|| Some(stop.to_string()));
                ended.stop = Some(stop);
            }
            // Ended by the stop we sent (not on its own first, nor by a cancel).
            Some(stop @ (Stop::Preempt { .. } | Stop::Requeue { .. }))
                if exit.cancelled && !cancelled =>
            {
                let charge = stop.requeues().then(|| ended.clone());
                return Settled {
                    job: requeue::stopped(ended, &stop, up),
                    charge,
                };
            }
            Some(stop @ Stop::LaunchFault { .. }) if !cancelled => {
                let Stop::LaunchFault { fault, .. } = stop else {
                    unreachable!("matched just above")
                };
                if stop.requeues() {
                    return Settled {
                        job: requeue::stopped(ended.clone(), &stop, up),
                        charge: Some(ended),
                    };
                }
                let why_not = if ended.spec.as_ref().is_some_and(|s| !s.requeue) {
                    requeue::NOT_REQUEUEABLE.to_string()
                } else {
                    format!("after {} failed launches", ended.launch_faults)
                };
                if fault.kind == FaultKind::Node {
                    ended.state = JobState::NodeFail;
                } else {
                    ended.state = JobState::Failed;
                }
                let words = exit.message.as_deref().unwrap_or("no reason given");
                ended.reason = Some(format!("{stop}: {words}; not requeued: {why_not}"));
                ended.stop = Some(stop);
            }
            Some(stop @ Stop::RankFailed { .. }) => {
                if gang
                    && matches!(
                        ended.state,
                        JobState::Failed | JobState::OutOfMemory | JobState::Timeout
                    )
                {
                    ended.reason = ended
                        .reason
                        .map(|r| format!("rank {task} on node {node}: {r}"));
                }
                ended.stop = Some(stop);
            }
            // A requeue asked that did not happen (a cancel, or the job's own end, came
            // first): the record keeps no word of one, as its ledger row says none.
            Some(stop) if stop.requeues() => ended.stop = None,
            _ => {}
        }
        Settled {
            job: ended,
            charge: None,
        }
    }
}

/// The global rank of task `local` on the node of rank `node_rank`.
fn task_rank(node_rank: usize, per_node: u32, local: u32) -> u32 {
    (node_rank as u32)
        .saturating_mul(per_node)
        .saturating_add(local)
}

/// Tasks in all: its nodes times the tasks on each.
fn total_tasks(job: &JobRecord) -> u32 {
    (job.allocs.len() as u32).saturating_mul(job.tasks_per_node())
}

/// The rank whose end is the job's: the one its stop names, else the first that failed on
/// its own, else the first that did not complete (one stopped by a cancel or a time limit),
/// else rank 0.
fn deciding_rank(job: &JobRecord) -> usize {
    let named = match &job.stop {
        // Both name a task's rank across the job: its node is that over tasks per node.
        Some(Stop::RankFailed { rank, .. } | Stop::LaunchFault { rank, .. }) => {
            Some((*rank / job.tasks_per_node()) as usize)
        }
        Some(Stop::NodeLost { node, .. }) => job.rank_on(node).map(|r| r as usize),
        Some(Stop::BatchEnded { .. }) => Some(0),
        _ => None,
    };
    let exits: Vec<ExitInfo> = job
        .allocs
        .iter()
        .map(|a| a.exit.clone().unwrap_or_default())
        .collect();
    let bad = |e: &ExitInfo| e.final_state() != JobState::Completed;
    named
        .filter(|&r| r < exits.len())
        .or_else(|| exits.iter().position(|e| bad(e) && !e.cancelled))
        .or_else(|| exits.iter().position(bad))
        .unwrap_or(0)
}

/// What all ranks used together: CPU time and I/O summed, memory the most any one node used
/// (memory is asked for per node), every node's GPUs. `None` when no rank measured anything.
fn merged_usage(job: &JobRecord) -> Option<JobUsage> {
    let usages: Vec<&JobUsage> = job
        .allocs
        .iter()
        .filter_map(|a| a.exit.as_ref()?.usage.as_ref())
        .collect();
    let (first, rest) = usages.split_first()?;
    let mut out = (*first).clone();
    let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    };
    for u in rest {
        out.cpu_time_ms = sum(out.cpu_time_ms, u.cpu_time_ms);
        out.io_read = sum(out.io_read, u.io_read);
        out.io_write = sum(out.io_write, u.io_write);
        out.memory_peak = out.memory_peak.max(u.memory_peak);
        out.memory_avg = out.memory_avg.max(u.memory_avg);
        out.gpus.extend(u.gpus.iter().cloned());
        out.samples = out.samples.min(u.samples);
    }
    Some(out)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod barrier_tests;
